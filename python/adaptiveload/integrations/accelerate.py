"""HuggingFace accelerate with AdaptiveLoad's batch samplers.

Two ways, both exact (every sample once per epoch, repeats only from the plan's reported
padding):

- **The ordinary pattern**: ``accelerator.prepare(model, optimizer, DataLoader(ds,
  batch_sampler=sampler))``. accelerate wraps any batch sampler in its ``BatchSamplerShard``,
  which keeps every N-th batch on each process. Under an ``Accelerator`` of N > 1 processes
  the sampler's stream therefore holds every rank's micro-batches interleaved (its ``len``
  counts them all), so that each process keeps exactly its own; the sampler checks, through
  accelerate's public ``GradientState().active_dataloader``, that this shard is what draws
  it, and refuses other readers. ``prepared_loader.set_epoch(e)`` reaches the sampler.
  ``dispatch_batches=True`` is refused (it would split process 0's batches evenly). The
  prepared loader reads a batch ahead, so ``sampler.state_dict()`` needs a position: pass
  ``steps_done``, iterate ``sampler.micro_batches(prepared_loader)``, or use the helper below.
- **``prepare_data_loader(accelerator, loader)``**: an :class:`AdaptiveDataLoader`, a loader
  accelerate's public ``prepare_data_loader`` made without sharding (device placement, RNG
  synchronization, ``set_epoch`` and the end-of-loader flag of gradient accumulation as
  accelerate's own), registered for checkpointing, so that ``accelerator.save_state`` and
  ``load_state`` save and restore the sampler's epoch and position exactly, also with
  DataLoader workers. It is not a ``DataLoader``, so ``accelerator.prepare`` returns it
  unchanged.

Saves go by optimizer steps of the plan (``micro_batches_per_step`` micro-batches each): the
state is taken at the last step the loop completed. A ``save_state`` inside a step leaves
that step's micro-batches unconsumed, since the gradients they accumulated are not in the
checkpoint: after the resume they are trained again, whole, in their step. ``load_state``
then moves accelerate's step counter back to that step's start (it saved the count inside the
step), so that accelerate synchronizes gradients at the plan's step ends; after a resume with
another number of processes the re-planned epoch starts at a step boundary the same way.
With ``uneven_counts=True`` (and so with sequence parallelism) ranks take different counts of
micro-batches per step, while ``accelerator.accumulate`` synchronizes every
``gradient_accumulation_steps`` batches by its own counter. The loader's own
``loader.accumulate(model)`` takes its place (gradients synchronize at each rank's last
micro-batch of the plan's step, ``loader.step_ends()``, where the loop steps the optimizer),
and ``loader.micro_batch`` is the batch's ``MicroBatch`` (step, place, ``loss_scale``). Saves
go by the plan's steps as above.
"""

from __future__ import annotations

import contextlib
import warnings
import weakref

from accelerate.data_loader import DataLoaderDispatcher, DataLoaderShard
from accelerate.data_loader import prepare_data_loader as _accelerate_prepare
from torch.utils.data import DataLoader

from adaptiveload.sampler import BatchSampler

__all__ = ["AdaptiveDataLoader", "prepare_data_loader"]


class AdaptiveDataLoader:
    """An AdaptiveLoad batch sampler's loader for accelerate: accelerate's unsharded loader
    (``self.loader``, a ``DataLoaderShard``) that counts the micro-batches it has handed to
    the training loop. Its ``state_dict`` is the sampler's state at that count (what
    ``accelerator.save_state`` stores); its ``load_state_dict`` restores the sampler's epoch
    and position. Other attributes are the inner loader's."""

    def __init__(self, loader, accelerator=None):
        self.loader = loader
        self._handed = 0
        self._pass_key = None
        self._accelerator = None if accelerator is None else weakref.ref(accelerator)
        self._warned_inside_step = False
        #: the ``MicroBatch`` of the batch last handed (uneven counts; None otherwise)
        self.micro_batch = None
        loader.iteration = self.adaptive_sampler.epoch

    @property
    def adaptive_sampler(self) -> BatchSampler:
        return self.loader.batch_sampler

    @property
    def epoch(self) -> int:
        """The sampler's epoch (restored by ``accelerator.load_state``)."""
        return self.adaptive_sampler.epoch

    def __getattr__(self, name):
        """The inner loader's attributes (``batch_sampler``, ``set_epoch``, ``device``...)."""
        if name == "loader":  # not set yet (unpickling): no recursion
            raise AttributeError(name)
        return getattr(self.loader, name)

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self):
        sampler = self.adaptive_sampler
        self._handed, self._pass_key, self.micro_batch = 0, None, None
        if sampler.uneven_counts:
            # The plan's steps label each batch: where this rank synchronizes.
            for mb in sampler.micro_batches(self.loader):
                if self._pass_key is None:
                    self._pass_key = (sampler.epoch, sampler.start_step)
                self._handed += 1
                self.micro_batch = mb
                yield mb.batch
            return
        for batch in self.loader:
            if self._pass_key is None:
                self._pass_key = (sampler.epoch, sampler.start_micro_batch)
            self._handed += 1
            yield batch

    def step_ends(self) -> bool:
        """Whether the batch last handed is this rank's last micro-batch of its optimizer step
        in the plan (K per step, or this rank's count there with uneven counts)."""
        if self.micro_batch is not None:
            return self.micro_batch.last
        k = self.adaptive_sampler.micro_batches_per_step
        return (self.adaptive_sampler.start_micro_batch + self._handed) % k == 0

    @contextlib.contextmanager
    def accumulate(self, *models):
        """``accelerator.accumulate(*models)`` by the plan's steps: the models run under
        ``accelerator.no_sync`` but at this rank's last micro-batch of each step
        (``step_ends()``), where gradients synchronize and the loop steps the optimizer::

            with loader.accumulate(model):
                accelerator.backward(loss)
            if loader.step_ends():
                optimizer.step(); scheduler.step(); optimizer.zero_grad()

        Needed with ``uneven_counts=True``, whose ranks take different counts per step (the
        Accelerator then has ``gradient_accumulation_steps=1``, so ``accelerator.sync_gradients``
        stays True: read ``step_ends()``)."""
        accelerator = None if self._accelerator is None else self._accelerator()
        if accelerator is None:
            raise ValueError("AdaptiveDataLoader.accumulate: the loader has no accelerator")
        with contextlib.ExitStack() as stack:
            if not self.step_ends():
                for model in models:
                    stack.enter_context(accelerator.no_sync(model))
            yield

    def state_dict(self) -> dict:
        """The sampler's state at the last optimizer step of its plan that this loader's
        batches completed: micro-batches of a step not yet complete stay unconsumed."""
        sampler = self.adaptive_sampler
        if sampler.uneven_counts:
            return self._uneven_state()
        k = sampler.micro_batches_per_step
        start = sampler.start_micro_batch
        if self._pass_key != (sampler.epoch, start):
            return sampler.state_dict(micro_batches_done=start)
        handed = start + self._handed
        # A pass resumed inside a step cannot go back before its start: the state of a step
        # begun there and not complete is the resumed position itself.
        done = max(handed - handed % k, start)
        if done != handed and not self._warned_inside_step:
            self._warned_inside_step = True
            where = "that step's start" if done % k == 0 else "the position resumed inside it"
            warnings.warn(
                f"save_state inside optimizer step {handed // k} of the plan ({handed % k} of its "
                f"{k} micro-batches drawn): the state resumes at {where}, so the micro-batches "
                "drawn since are trained again after a resume (the gradients they accumulated "
                "are not in the checkpoint). Save after a step's last micro-batch "
                "(accelerator.sync_gradients) to resume without repeating them.",
                stacklevel=2,
            )
        return sampler.state_dict(micro_batches_done=done)

    def _uneven_state(self) -> dict:
        """With uneven counts positions go by steps: the steps this rank's handed batches
        completed (a save inside a step resumes at its start, as above)."""
        sampler, mb = self.adaptive_sampler, self.micro_batch
        if mb is None or self._pass_key != (sampler.epoch, sampler.start_step):
            return sampler.state_dict(steps_done=sampler.start_step)
        if not mb.last and not self._warned_inside_step:
            self._warned_inside_step = True
            warnings.warn(
                f"save_state inside optimizer step {mb.step} of the plan ({mb.index + 1} of this "
                f"rank's {mb.count} micro-batches drawn): the state resumes at that step's start, "
                "so they are trained again after a resume. Save when accelerator.sync_gradients.",
                stacklevel=3,
            )
        return sampler.state_dict(steps_done=mb.step + 1 if mb.last else mb.step)

    def load_state_dict(self, state: dict) -> None:
        sampler = self.adaptive_sampler
        sampler.load_state_dict(state)
        self.loader.iteration = sampler.epoch
        self._handed, self._pass_key = 0, None
        self._align_step_counter()

    def _align_step_counter(self) -> None:
        """accelerate restores its step counter (``accelerator.step``, which it counts in
        batches and synchronizes gradients at its multiples of ``gradient_accumulation_steps``)
        before the loader: moved back to the resumed step's start, it agrees with the plan."""
        accelerator = None if self._accelerator is None else self._accelerator()
        if accelerator is None:
            return
        every = accelerator.gradient_accumulation_steps
        inside = accelerator.step % every
        if inside:
            accelerator.step -= inside


def prepare_data_loader(
    accelerator, dataloader: DataLoader, *, device_placement: bool | None = None
):
    """Prepare ``dataloader`` (whose ``batch_sampler`` is an AdaptiveLoad sampler) for
    ``accelerator`` without sharding it again, and register it for checkpointing.

    Returns an :class:`AdaptiveDataLoader`. Call it before ``accelerator.load_state`` (which
    then restores the sampler's epoch and position) and iterate as usual::

        loader = prepare_data_loader(accelerator, DataLoader(ds, batch_sampler=sampler))
        model, optimizer = accelerator.prepare(model, optimizer)
        accelerator.load_state(ckpt)            # when resuming
        for epoch in range(loader.epoch, num_epochs):
            loader.set_epoch(epoch)             # the resumed epoch keeps its position
            for batch in loader: ...
    """
    if isinstance(dataloader, (AdaptiveDataLoader, DataLoaderShard, DataLoaderDispatcher)):
        raise ValueError("prepare_data_loader: this DataLoader was already prepared by accelerate")
    sampler = dataloader.batch_sampler
    if not isinstance(sampler, BatchSampler):
        raise ValueError(
            "prepare_data_loader: dataloader.batch_sampler must be an AdaptiveLoad batch sampler "
            "(AdaptiveBatchSampler, EqualTokenBatchSampler, StreamingBatchSampler), got "
            f"{type(sampler).__name__}"
        )
    steps = getattr(accelerator, "gradient_accumulation_steps", 1)
    if sampler.uneven_counts and steps != 1:
        raise ValueError(
            f"prepare_data_loader: accelerator.gradient_accumulation_steps = {steps}, but with "
            "uneven_counts=True the ranks take different counts of micro-batches per step: "
            "make the Accelerator with gradient_accumulation_steps=1 and use "
            "`with loader.accumulate(model):` (it synchronizes at each rank's last "
            "micro-batch of the plan's step)"
        )
    if steps not in (1, sampler.micro_batches_per_step):
        warnings.warn(
            f"accelerator.gradient_accumulation_steps = {steps} but the sampler balances "
            f"{sampler.micro_batches_per_step} micro-batch(es) per step: give the sampler "
            f"micro_batches_per_step={steps} so that each synchronized step is balanced",
            stacklevel=2,
        )
    if device_placement is None:
        device_placement = accelerator.device_placement
    sampler.accelerate_sharding = False  # every process draws its own rank's micro-batches
    # accelerate's own preparation, for one process: no BatchSamplerShard.
    inner = _accelerate_prepare(
        dataloader,
        accelerator.device if device_placement else None,
        num_processes=1,
        process_index=0,
        put_on_device=device_placement,
        rng_types=list(accelerator.rng_types),
        non_blocking=accelerator.non_blocking,
    )
    loader = AdaptiveDataLoader(inner, accelerator)
    accelerator.register_for_checkpointing(loader)
    return loader
