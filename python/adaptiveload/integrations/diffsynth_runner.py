"""DiffSynth-Studio's trainer with AdaptiveLoad: ``launch_training_task`` as
``diffsynth.diffusion.runner.launch_training_task`` (DiffSynth-Studio 2.1.12), so that a
training script changes one import and gives the samples' lengths::

    from adaptiveload.integrations.diffsynth_runner import launch_training_task
    launch_training_task(accelerator, dataset, model, model_logger, args=args,
                         seq_lens=latent_shapes)

DiffSynth's function makes its DataLoader inside (``shuffle=True``), so it cannot be given a
batch sampler: the loop is written once here, with DiffSynth's own pieces (its optimizer
choice, ``ConstantLR`` scheduler, ``save_training_args``, quantized-weight DDP exclusion, CPU
offload manager, DeepSpeed checkpointing set-up) and its semantics: accelerate, one sample per
micro-batch, ``model(data)`` (or ``model({}, inputs=data)`` for cached datasets) as the loss,
``model_logger.on_step_end`` after every micro-batch, ``on_epoch_end`` without ``save_steps``
and ``on_training_end``. What AdaptiveLoad changes:

- the batches: ``AdaptiveBatchSampler(max_batch_size=1, micro_batches_per_step=K,
  uneven_counts=True)`` with K = the accelerator's ``gradient_accumulation_steps``: each
  optimizer step's samples are spread so that every process has about the same work (a
  process given a long clip takes fewer micro-batches); gradients are synchronized at each
  process's last micro-batch of the step (``AdaptiveDataLoader.accumulate``), and each loss
  is scaled so that the step's gradient is that of the mean over its samples, as DiffSynth's
  (``MicroBatch.loss_scale(W, per="sample")``: 1 / K where every process takes K);
- sequence parallelism per micro-batch (``sequence_parallel="auto"``, where there are several
  processes): the sampler gives some micro-batches to a group of d processes, which run the
  DiT on 1/d of the tokens each (``adaptiveload.parallel.split_sequence``); such a
  micro-batch is trained once;
- the loss's timestep and noise (drawn by DiffSynth from the global generator) are drawn after
  ``torch.manual_seed`` of (seed, epoch, sample): the members of a split micro-batch draw the
  same, and a resumed run draws what the uninterrupted one would have;
- ``apply_fused_ops`` on the model's DiffSynth ``DiTBlock`` s (``fused_ops=True``);
- resume: ``resume_from`` (a folder ``accelerator.save_state`` wrote) restores the model, the
  optimizer, the sampler's position and the count of optimizer steps.

Arguments (keyword only, after DiffSynth's):

- ``seq_lens``: per sample, its tokens or its latent shape (``(C, F, H, W)`` or
  ``(F, H, W)``), or a callable of the index giving one; default ``dataset.seq_lens``.
- ``micro_batches_per_step``: K; default the accelerator's ``gradient_accumulation_steps``
  (set to 1 during the call: the sampler's steps decide when gradients synchronize).
- ``seed``: the sampler's order and the loss's draws (``torch.manual_seed`` of
  (seed, epoch, sample) before each micro-batch).
- ``sequence_parallel``: ``"auto"`` (the largest power of two <= 8 dividing the number of
  processes), a degree, or False for none.
- ``fused_ops``: ``apply_fused_ops`` on the model's DiffSynth blocks, if it has any.
- ``resume_from``: a folder of ``accelerator.save_state`` to resume from.
- ``max_steps``: stop after this many optimizer steps (counted over resumes).
- ``sampler_options``: more ``AdaptiveBatchSampler`` arguments (``cost_model``...).

``model_logger.on_step_end`` gets, beside DiffSynth's ``loss``, where it takes ``**kwargs``:
``sample`` (the index), ``epoch``, ``step`` (optimizer steps done), ``step_end`` (this
micro-batch ended one on this process) and ``micro_batch`` (its ``MicroBatch``). Objects
registered with ``accelerator.register_for_checkpointing`` before the call are restored by
``resume_from`` too.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Callable, Sequence

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from adaptiveload import AdaptiveBatchSampler
from adaptiveload.integrations.accelerate import prepare_data_loader
from adaptiveload.integrations.diffsynth import apply_fused_ops, is_fused
from adaptiveload.parallel import SequenceParallelGroups, split_sequence

__all__ = ["launch_training_task", "make_batch_sampler", "sample_lengths", "sequence_degree"]

_INSTALL = "pip install diffsynth (tested with diffsynth==2.1.12)"


class _Indexed(Dataset):
    """The dataset's items with their indices: ``(i, dataset[i])``."""

    def __init__(self, dataset):
        self.dataset = dataset

    def __len__(self):
        return len(self.dataset)

    def __getitem__(self, i):
        return i, self.dataset[i]


def _first(samples):
    return samples[0]  # DiffSynth's collate_fn: one sample per batch, as it is


class _Steps:
    """Optimizer steps done, saved by ``accelerator.save_state`` (for ``max_steps``)."""

    done = 0

    def state_dict(self):
        return {"steps": self.done}

    def load_state_dict(self, state):
        self.done = state["steps"]


def sample_lengths(seq_lens, num_samples: int, patch=(1, 2, 2)):
    """``(tokens, group_keys)`` of ``num_samples`` samples from ``seq_lens``: token counts, or
    latent shapes (``(..., F, H, W)``: ``F/pt * H/ph * W/pw`` tokens, grouped by shape), or a
    callable of the index giving either."""
    if callable(seq_lens):
        seq_lens = [seq_lens(i) for i in range(num_samples)]
    seq_lens = list(seq_lens)
    if len(seq_lens) != num_samples:
        raise ValueError(f"seq_lens has {len(seq_lens)} entries for {num_samples} samples")
    if all(np.ndim(s) == 0 for s in seq_lens):
        return [int(s) for s in seq_lens], None
    shapes = [tuple(int(x) for x in s)[-3:] for s in seq_lens]
    if any(len(s) != 3 for s in shapes):
        raise ValueError("seq_lens: give token counts or latent shapes (..., frames, h, w)")
    tokens = [(f // patch[0]) * (h // patch[1]) * (w // patch[2]) for f, h, w in shapes]
    return tokens, shapes


def sequence_degree(sequence_parallel, world: int) -> int:
    """The largest sequence-parallel degree: ``"auto"`` the largest power of two <= 8 that
    divides ``world``; False or None: 1; else the number given."""
    if sequence_parallel in (None, False):
        return 1
    if sequence_parallel == "auto":
        d = 1
        while 2 * d <= 8 and world % (2 * d) == 0:
            d *= 2
        return d
    return int(sequence_parallel)


def make_batch_sampler(
    seq_lens: Sequence[int],
    *,
    micro_batches_per_step: int,
    num_replicas: int,
    rank: int,
    seed: int = 0,
    sequence_parallel: int = 1,
    group_keys=None,
    **options,
) -> AdaptiveBatchSampler:
    """The sampler of ``launch_training_task``: one sample per micro-batch (room for the
    longest), K per step, uneven counts; ``options``: more ``AdaptiveBatchSampler``
    arguments."""
    return AdaptiveBatchSampler(
        seq_lens,
        options.pop("max_tokens", max(seq_lens)),
        group_keys=group_keys,
        max_batch_size=1,
        micro_batches_per_step=micro_batches_per_step,
        num_replicas=num_replicas,
        rank=rank,
        seed=seed,
        uneven_counts=True,
        sequence_parallel=sequence_parallel,
        **options,
    )


def _dits(model) -> list:
    """The DiffSynth ``WanModel`` s of ``model`` (what a split runs on)."""
    from diffsynth.models.wan_video_dit import WanModel

    return [m for m in model.modules() if isinstance(m, WanModel)]


def _logger_call(model_logger) -> Callable:
    """``model_logger.on_step_end``, given AdaptiveLoad's keywords only where it takes
    ``**kwargs`` (DiffSynth's ``ModelLogger`` does)."""
    params = inspect.signature(model_logger.on_step_end).parameters.values()
    takes_all = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params)

    def call(accelerator, model, save_steps, loss, **extra):
        kwargs = {"loss": loss, **(extra if takes_all else {})}
        model_logger.on_step_end(accelerator, model, save_steps, **kwargs)

    return call


def launch_training_task(
    accelerator,
    dataset,
    model,
    model_logger,
    learning_rate: float = 1e-5,
    weight_decay: float = 1e-2,
    num_workers: int = 1,
    save_steps: int | None = None,
    num_epochs: int = 1,
    enable_model_cpu_offload: bool = False,
    enable_optimizer_cpu_offload: bool = False,
    cpu_offload_split_threshold: int | None = None,
    customized_optimizer: str | None = None,
    args=None,
    *,
    seq_lens=None,
    micro_batches_per_step: int | None = None,
    seed: int = 0,
    sequence_parallel="auto",
    fused_ops: bool = True,
    resume_from: str | None = None,
    max_steps: int | None = None,
    sampler_options: dict | None = None,
    **kwargs,
):
    """DiffSynth-Studio's ``launch_training_task`` (same arguments, ``args`` overriding them as
    there) with AdaptiveLoad's sampler, sequence parallelism and fused ops. The keyword-only
    arguments are AdaptiveLoad's: the module's docstring, "Arguments"."""
    try:
        from diffsynth.diffusion import runner
    except ImportError as e:
        raise ImportError(f"launch_training_task needs DiffSynth-Studio: {_INSTALL}") from e
    if args is not None:  # DiffSynth's command line overrides the arguments, as there
        learning_rate, weight_decay = args.learning_rate, args.weight_decay
        num_workers, save_steps, num_epochs = (
            args.dataset_num_workers, args.save_steps, args.num_epochs
        )  # fmt: skip
        offloads = (args.enable_model_cpu_offload, args.enable_optimizer_cpu_offload)
        enable_model_cpu_offload, enable_optimizer_cpu_offload = offloads
        cpu_offload_split_threshold = args.cpu_offload_split_threshold
        customized_optimizer = args.customized_optimizer
    if accelerator.is_main_process:
        runner.save_training_args(args)
    optimizer_class = runner.get_optimizer_class(customized_optimizer)
    optimizer = optimizer_class(
        model.trainable_modules(), lr=learning_rate, weight_decay=weight_decay
    )
    scheduler = torch.optim.lr_scheduler.ConstantLR(optimizer)
    if fused_ops and _dits(model) and not is_fused(model):
        apply_fused_ops(model)
    k = micro_batches_per_step or accelerator.gradient_accumulation_steps
    degree = sequence_degree(sequence_parallel, accelerator.num_processes)
    accumulation = accelerator.gradient_accumulation_steps
    accelerator.gradient_accumulation_steps = 1  # the plan's steps decide (loader.accumulate)
    try:
        loader = _adaptive_loader(
            accelerator, dataset, seq_lens, k, seed, degree, num_workers, sampler_options
        )
        offloads = (enable_model_cpu_offload, enable_optimizer_cpu_offload)
        model, optimizer, scheduler, offload = _prepare(
            accelerator, model, optimizer, scheduler, offloads, cpu_offload_split_threshold
        )
        steps = _Steps()
        accelerator.register_for_checkpointing(steps)
        if resume_from is not None:
            accelerator.load_state(resume_from)
        runner.initialize_deepspeed_gradient_checkpointing(accelerator)
        run = _Run(accelerator, model, (optimizer, scheduler, offload), loader, steps, degree)
        run.train(dataset, model_logger, save_steps, num_epochs, seed, max_steps)
    finally:
        accelerator.gradient_accumulation_steps = accumulation


def _adaptive_loader(accelerator, dataset, seq_lens, k, seed, degree, num_workers, options):
    """The sampler of ``dataset`` and its loader, prepared for ``accelerator``."""
    tokens, keys = sample_lengths(
        getattr(dataset, "seq_lens", None) if seq_lens is None else seq_lens, len(dataset)
    )
    sampler = make_batch_sampler(
        tokens,
        group_keys=keys,
        micro_batches_per_step=k,
        num_replicas=accelerator.num_processes,
        rank=accelerator.process_index,
        seed=seed,
        sequence_parallel=degree,
        **(options or {}),
    )
    indexed = _Indexed(dataset)
    return prepare_data_loader(
        accelerator,
        DataLoader(indexed, batch_sampler=sampler, collate_fn=_first, num_workers=num_workers),
    )


def _prepare(accelerator, model, optimizer, scheduler, offloads, split_threshold):
    """DiffSynth's preparation: with model CPU offload, its manager and the model unprepared;
    else the model on the device, quantized weights kept out of DDP, all prepared."""
    from diffsynth.diffusion import runner

    if offloads[0]:
        optimizer, scheduler = accelerator.prepare(optimizer, scheduler)
        model.pipe.device = accelerator.device
        offload = runner.OffloadTrainingManager(
            model, accelerator.device, offloads[1], split_threshold
        )
        return model, optimizer, scheduler, offload
    model.to(device=accelerator.device)
    runner.exclude_quantized_params_from_ddp_sync(accelerator, model)
    model, optimizer, scheduler = accelerator.prepare(model, optimizer, scheduler)
    return model, optimizer, scheduler, None


class _Run:
    """The loop of ``launch_training_task`` over prepared parts."""

    def __init__(self, accelerator, model, stepping, loader, steps, degree):
        self.accelerator, self.model, self.loader, self.steps = accelerator, model, loader, steps
        self.optimizer, self.scheduler, self.offload = stepping
        self.dits = _dits(accelerator.unwrap_model(model))
        # Every process makes the groups (new_group is collective), here, in the same order.
        self.groups = SequenceParallelGroups(degree) if degree > 1 else None

    def train(self, dataset, model_logger, save_steps, num_epochs, seed, max_steps):
        from tqdm import tqdm

        on_step_end = _logger_call(model_logger)
        cached = getattr(dataset, "load_from_cache", False)
        acc, loader = self.accelerator, self.loader
        stop = max_steps is not None and self.steps.done >= max_steps
        for epoch in range(loader.epoch, 0 if stop else num_epochs):
            loader.set_epoch(epoch)  # a resumed epoch keeps its position
            for index, data in tqdm(loader):
                torch.manual_seed(seed * 1_000_003 + epoch * 7_919 + int(index))
                mb = loader.micro_batch
                with loader.accumulate(self.model), self._split(mb):
                    loss = self.model({}, inputs=data) if cached else self.model(data)
                    acc.backward(loss * self._loss_scale(mb))
                    if self.offload is not None:
                        self.offload.after_backward()
                end = loader.step_ends()
                if end:  # this process's last micro-batch of the plan's step
                    self.optimizer.step()
                    self.scheduler.step()
                    self.optimizer.zero_grad()
                self.steps.done += int(end)
                stop = end and max_steps is not None and self.steps.done >= max_steps
                on_step_end(
                    acc, self.model, save_steps, loss, sample=int(index), epoch=epoch,
                    step=self.steps.done, step_end=end, micro_batch=mb,
                )  # fmt: skip
                if stop:
                    break
            if stop:
                break
            if save_steps is None:
                model_logger.on_epoch_end(acc, self.model, epoch)
        model_logger.on_training_end(acc, self.model, save_steps)

    def _loss_scale(self, mb) -> float:
        """DiffSynth's loss is a sample's mean: the step's gradient is the mean over its
        samples (accelerate's 1 / K where each process takes K)."""
        if mb is None:
            return 1.0 / self.loader.adaptive_sampler.micro_batches_per_step
        return mb.loss_scale(self.accelerator.num_processes, per="sample")

    def _split(self, mb):
        """This process's share of a split micro-batch, on every DiT of the model."""
        stack = contextlib.ExitStack()
        if self.groups is not None and mb is not None and mb.degree > 1:
            group = self.groups.of(mb)
            for dit in self.dits:
                stack.enter_context(split_sequence(dit, group, mb.degree, mb.member))
        return stack
