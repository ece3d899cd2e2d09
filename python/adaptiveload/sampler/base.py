"""``BatchSampler``: the pass machinery every AdaptiveLoad batch sampler shares, whatever its
plan source. It composes the mechanisms of this package: checked ``Options`` (checks.py), the one
source of its settings; its place in the epoch, a ``Cursor`` (cursor.py) over its plan source
(sources.py), with the per-epoch rank check (ranks.py); iteration (iteration.py) and who draws
it (readers.py); resume (resume.py) and the ``set_epoch`` guard. What differs between samplers is
where a plan comes from: ``PlannedBatchSampler`` (planned.py) plans the whole epoch at once,
``StreamingBatchSampler`` (stream.py) plans segments as the loop reaches them."""

from __future__ import annotations

import warnings
from collections.abc import Iterator

import torch.distributed as dist
from torch.utils.data import Sampler

from adaptiveload.sampler.checks import int_arg
from adaptiveload.sampler.cursor import DONE, Cursor
from adaptiveload.sampler.iteration import all_ranks_stream, micro_batches, rank_steps, rank_stream
from adaptiveload.sampler.plan import MicroBatch
from adaptiveload.sampler.readers import (
    accelerate_processes,
    check_shard,
    check_source,
    check_unsharded,
    reader_of,
)


class Setting:
    """A sampler's attribute that reads the field of its ``options`` of the same name, the
    one source of that setting (fixed when the sampler is made)."""

    def __set_name__(self, owner, name: str) -> None:
        self.name = name

    def __get__(self, sampler, owner=None):
        return self if sampler is None else getattr(sampler.options, self.name)

    def __set__(self, sampler, value) -> None:
        raise AttributeError(
            f"{self.name} is a setting of the sampler's options, fixed when it is made: make "
            "a new sampler to change it"
        )


class BatchSampler(Sampler[list[int]]):
    """The machinery of a pass: iteration, ``micro_batches``, ``steps``, ``set_epoch``, the rank
    check and resume. A subclass sets ``options`` and calls ``_start_cursor(source)``; it gives
    ``_fingerprint()`` (everything that shapes its plans) and may hook ``_before_pass`` and
    ``_on_new_epoch``."""

    max_tokens = Setting()
    num_replicas = Setting()
    rank = Setting()
    micro_batches_per_step = Setting()
    shuffle = Setting()
    seed = Setting()
    drop_last = Setting()
    balance = Setting()
    lookahead_steps = Setting()
    on_oversize = Setting()
    verify_ranks = Setting()
    max_batch_size = Setting()
    uneven_counts = Setting()
    mix_tolerance = Setting()
    composition = Setting()
    drawn_is_trained = Setting()
    segment_samples = Setting()

    #: whether accelerate's ``BatchSamplerShard`` may deal this sampler's stream (every rank's
    #: micro-batches interleaved, which needs the whole epoch's plan)
    deals_all_ranks = True

    def _start_cursor(self, source) -> None:
        # None: an Accelerator of several processes deals this sampler's batches through its
        # BatchSamplerShard; False: each rank draws its own (prepare_data_loader sets it).
        self.accelerate_sharding: bool | None = None
        self._cursor = Cursor(type(self).__name__, self.options, source)
        self._warned_repeat = -1

    def _fingerprint(self) -> dict:
        raise NotImplementedError

    def _before_pass(self) -> None:
        """Checks before a pass starts (the plan, the data)."""

    def _on_new_epoch(self) -> None:
        """After ``set_epoch`` moved to another epoch."""

    @property
    def epoch(self) -> int:
        """The current epoch (``set_epoch``, or a resumed state's)."""
        return self._cursor.epoch

    @property
    def start_step(self) -> int:
        """The optimizer step of the current epoch at which iteration starts (non-zero after a
        resume)."""
        return self._cursor.start[0]

    @property
    def start_micro_batch(self) -> int:
        """The micro-batch of this rank's stream at which iteration starts."""
        step, done = self._cursor.start
        if self.deals_all_ranks:
            return int(self.plan().rank_step_starts(self.rank)[step]) + done
        if self.uneven_counts:
            raise TypeError(
                f"{type(self).__name__}(uneven_counts=True) has no start_micro_batch: its "
                "streamed positions go by steps (start_step)"
            )
        return step * self.micro_batches_per_step + done

    @property
    def sampler(self) -> BatchSampler:
        """This sampler, for wrappers that forward ``set_epoch`` to
        ``batch_sampler.sampler`` (accelerate's prepared DataLoader does)."""
        return self

    # -- iteration (cursor.py, iteration.py, readers.py) -----------------------------------
    def steps(self) -> Iterator[tuple[int, int]]:
        """``(step, micro-batches of this rank in it)`` for the steps of the current pass, from
        ``start_step``: the batches the loader yields, step by step (docs/sampler.md,
        "Uneven micro-batch counts per rank"). After a resume inside a step, the first count is
        what is left of that step."""
        cursor = self._cursor
        yield from rank_steps(cursor, cursor.source.segments(cursor))

    def micro_batches(self, loader) -> Iterator[MicroBatch]:
        """Each batch of ``loader`` (a DataLoader over this sampler, or what accelerate made
        of one) as a ``MicroBatch``: the batch with its step, its place in the step, this
        rank's count there, and the step's token and sample counts over all ranks.
        ``mb.last`` is where this rank synchronizes gradients and steps the optimizer.

        The stream is checked against the plan: a loader that draws from another batch
        sampler is refused, and one that ends early or yields more batches than this rank's
        plan raises ``RuntimeError`` instead of shifting every later step boundary. A
        ``state_dict()`` without a position taken in this loop counts the micro-batches it
        has yielded, whatever the loader read ahead."""
        check_source(loader, self)
        yield from micro_batches(self._cursor, loader)

    def __iter__(self) -> Iterator[list[int]]:
        cursor = self._cursor
        reader = reader_of(self)
        if self.deals_all_ranks:
            check_unsharded(cursor, reader, self.accelerate_sharding)
        if cursor.stage == DONE:
            # A new pass over the same epoch: the whole epoch again, as any sampler does.
            if self._warned_repeat != self.epoch:
                self._warned_repeat = self.epoch
                warnings.warn(
                    f"{type(self).__name__}: iterating epoch {self.epoch} again without "
                    "set_epoch(): the same samples in the same order (call set_epoch(epoch) "
                    "before each epoch)",
                    stacklevel=2,
                )
            cursor.again()
        if reader.shard is not None:
            self._check_dealt(reader.shard)
        self._before_pass()
        self._verify_ranks()
        cursor.begin(reader)
        if reader.shard is None:
            return rank_stream(cursor)
        return all_ranks_stream(cursor)

    def _check_dealt(self, shard) -> None:
        """accelerate's ``BatchSamplerShard`` keeps every N-th batch of this sampler on each
        process: only a stream of every rank's micro-batches, equal counts each, survives it."""
        name = type(self).__name__
        if not self.deals_all_ranks:
            raise RuntimeError(
                f"{name} under accelerate's BatchSamplerShard (accelerator.prepare of a "
                "DataLoader over it): the shard keeps every N-th batch on each process, but "
                "this sampler's stream is already this rank's, so the processes would train a "
                "fraction of the epoch. Prepare the loader with adaptiveload.integrations."
                "accelerate.prepare_data_loader(accelerator, loader), which keeps it unsharded "
                "(docs/integrations.md)."
            )
        if self.uneven_counts:
            raise RuntimeError(
                f"{name}(uneven_counts=True) under accelerate's BatchSamplerShard: it deals "
                "batch j to process j % num_processes, so ranks must take equal counts. "
                "Iterate the sampler per rank (a plain DataLoader)."
            )
        check_shard(self._cursor, shard)

    def __len__(self) -> int:
        """Micro-batches of the current pass (from ``start_micro_batch`` to the plan's end):
        this rank's, or under an ``Accelerator`` of several processes every rank's, which
        accelerate's ``BatchSamplerShard`` deals out (unless ``accelerate_sharding`` is
        False)."""
        remaining = self._cursor.source.left(self._cursor)
        if self.accelerate_sharding is not False and accelerate_processes() > 1:
            return remaining * self.num_replicas  # see iteration.all_ranks_stream
        return remaining

    def _verify_ranks(self) -> None:
        """All ranks must plan the same epoch: compare fingerprints (one all-gather per epoch)."""
        if not self.verify_ranks:
            return
        if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() < 2:
            return
        self._cursor.check_ranks(self._fingerprint())

    def set_epoch(self, epoch: int) -> None:
        """Reshuffle deterministically from (seed, epoch). Setting the epoch a resumed state
        is in keeps the resumed position; another epoch before that position's batches were
        drawn is refused (it would skip them)."""
        epoch = int_arg("epoch", epoch, 0)
        if epoch == self.epoch:
            return
        cursor = self._cursor
        if cursor.resume_pending and cursor.source.remaining(cursor):
            raise ValueError(
                f"set_epoch({epoch}): this sampler was resumed at epoch {self.epoch}, step "
                f"{self.start_step}, with micro-batches of that epoch left; moving to epoch "
                f"{epoch} would skip them. Call set_epoch({self.epoch}) to continue the "
                "resumed epoch (with accelerate: prepared_loader.set_epoch), or make a new "
                "sampler to start over."
            )
        cursor.new_epoch(epoch)
        self._on_new_epoch()

    # -- resumption (cursor.py, sources.py, resume.py) -------------------------------------
    def state_dict(
        self, steps_done: int | None = None, *, micro_batches_done: int | None = None
    ) -> dict:
        """The position in the current epoch, identical on every rank.

        Args:
            steps_done: optimizer steps of the current epoch that training has completed, in
                the numbering of ``start_step`` (after a resume, steps before ``start_step``
                count as done). Pass your loop's own count.
            micro_batches_done: the same in micro-batches of this rank's stream, for a
                position inside a step (``steps_done * K + k``).

        Without either, the position is one the sampler knows to be exact: the start of a
        pass not yet begun; inside ``micro_batches(loader)``, the micro-batches that loop
        has received; with ``drawn_is_trained=True`` (nothing reads ahead of training:
        direct iteration, a DataLoader without workers, or torchdata's
        ``StatefulDataLoader``, which calls this at its own draw count), the micro-batches
        this sampler has handed out. Otherwise it is refused (``ValueError``): DataLoader
        workers and accelerate read ahead, and prefetched batches would count as trained.

        With ``uneven_counts`` positions go by steps, since the ranks' micro-batch counts
        differ: ``micro_batches_done`` is refused, and the state holds ``'steps_done'`` (and
        ``'micro_batches_done' = steps_done * K``). A position without arguments inside a
        step (StatefulDataLoader's draws, a save inside ``micro_batches``) also holds
        ``'in_step': {"rank": r, "micro_batches": j}``, this rank's micro-batches done in
        step ``steps_done``: each rank is at its own place there, so such a state resumes the
        same plan on rank ``r`` only.
        """
        return self._cursor.state_dict(self._fingerprint(), steps_done, micro_batches_done)

    def load_state_dict(self, state: dict) -> None:
        """Continue the epoch of ``state``.

        - The same plan (equal fingerprint): replays it from the saved position, exactly.
        - Other settings (caps, cost model, lookahead, ranks, K, sampler kind): the samples
          the state consumed are left out and the rest of the epoch is planned with this
          sampler's settings; nothing is lost or repeated.
        - Another dataset (other lengths or group keys), or a state that is not well formed:
          refused with ``ValueError``, the sampler unchanged.
        """
        self._cursor.load_state_dict(state, self._fingerprint())
