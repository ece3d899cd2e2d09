"""``StreamingBatchSampler``: plans that stream, for epochs of 100M to billions of samples.

The same pass machinery as the planned samplers (base.py: options and their checks, the cursor,
the rank check, iteration, ``micro_batches``, resume and the ``set_epoch`` guard); its plan
source (segments.py) plans the epoch segment by segment as the loop reaches them. What a process
holds: the lengths and group ids as given (a memory-mapped ``.npy`` is read in place, and its
pages are shared by every rank process of the node), a few numbers per distinct length and per
group, and the segments the loop may still ask for. A saved state is a few hundred bytes: the
settings, the epoch, the segment and the step.

Resume: a state of the same settings continues at its position exactly. A state of other
settings (another world size, say) re-plans what its segment had left, under the new settings,
and goes on from that segment's end. Not supported here (``AdaptiveBatchSampler`` has them):
memory policies, refinement, sequence parallelism, accelerate's sharded loaders (use
``adaptiveload.integrations.accelerate.prepare_data_loader``); ``len()``, which would need the
whole epoch planned.

The lengths file: a memory map reads the file as it is now, so a file rewritten in place would
change the data under the sampler. Its size and modification time are checked before each
segment is planned (the change is refused, naming the file), and the planner checks every
length it reads against those it was built from; write a new file and rename it over the old
path instead (docs/sampler.md, "Plans that stream").
"""

from __future__ import annotations

import dataclasses
import os
import warnings
from collections.abc import Iterator

from adaptiveload import _sampler
from adaptiveload.cost import CostModel
from adaptiveload.report import balance_report, merge_reports
from adaptiveload.sampler.base import BatchSampler
from adaptiveload.sampler.checks import bool_arg, check_options, int_arg
from adaptiveload.sampler.columns import FileIdentity, load_column
from adaptiveload.sampler.defaults import MIN_SEGMENT, resolve_composition
from adaptiveload.sampler.plan import Segment
from adaptiveload.sampler.ranks import distributed_defaults
from adaptiveload.sampler.segments import Start, Streamed

# Arguments of the constructor that are not settings of its options.
IMPLICIT = {"self", "seq_lens", "group_ids", "process_group", "__class__"}


def default_workers() -> int:
    """Threads for planning a whole epoch's segments (reports): one per core, at most 8."""
    return max(1, min(8, os.cpu_count() or 1))


class StreamingBatchSampler(BatchSampler):
    """A batch sampler whose epoch plan streams, segment by segment.

    Args:
        seq_lens: token counts, one per dataset index: an int32 or int64 array (a
            ``np.load(path, mmap_mode="r")`` map is read in place, never copied) or the path
            of such a ``.npy``.
        max_tokens, max_cost, cost_model, num_replicas, rank, process_group,
        micro_batches_per_step, shuffle, seed, drop_last, lookahead_steps, mix_tolerance,
        composition, uneven_counts, max_batch_size, on_oversize, verify_ranks, drawn_is_trained: as
            ``AdaptiveBatchSampler``'s, checked alike (only the epoch's last segment is fitted
            to whole steps: halved, padded or dropped).
        group_ids: dense int32/int64 group ids, one per index, in ``[0, G)`` with every id used
            (``Metadata.group_keys`` gives them), or their ``.npy`` path; default: the length.
        segment_samples: the least positions of a segment (default: the larger of ``2^20``
            and ``4 * lookahead_steps * W * K``). Larger segments take longer to plan before
            their first micro-batch.
    """

    deals_all_ranks = False

    def __init__(
        self,
        seq_lens,
        max_tokens: int,
        *,
        max_cost: float | None = None,
        cost_model: CostModel | None = None,
        group_ids=None,
        num_replicas: int | None = None,
        rank: int | None = None,
        process_group=None,
        micro_batches_per_step: int = 1,
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = False,
        lookahead_steps: int = 64,
        mix_tolerance: float | None = None,
        uneven_counts: bool = False,
        max_batch_size: int | None = None,
        on_oversize: str = "error",
        segment_samples: int | None = None,
        verify_ranks: bool = True,
        drawn_is_trained: bool = False,
        composition: str | None = None,
    ):
        settings = {k: v for k, v in locals().items() if k not in IMPLICIT}
        name = type(self).__name__
        self._files = [
            (f, what)
            for f, what in (
                (FileIdentity.of(seq_lens), "lengths file"),
                (FileIdentity.of(group_ids), "group ids file"),
            )
            if f is not None
        ]
        self.seq_lens = load_column(seq_lens, "seq_lens")
        self.group_ids = None if group_ids is None else load_column(group_ids, "group_ids")
        settings["drawn_is_trained"] = bool_arg("drawn_is_trained", drawn_is_trained)
        settings["num_replicas"], settings["rank"] = distributed_defaults(
            num_replicas, rank, process_group
        )
        settings["composition"], settings["mix_tolerance"] = resolve_composition(
            composition, mix_tolerance, 1, max_batch_size, micro_batches_per_step
        )
        options = check_options(balance=True, memory_model=None, memory_budget_gib=None, **settings)
        # The least positions of a segment, resolved: a setting of every streamed plan.
        least = 4 * options.lookahead_steps * options.num_replicas
        least = max(MIN_SEGMENT, least * options.micro_batches_per_step)
        if options.segment_samples is None:
            options = dataclasses.replace(options, segment_samples=least)
        self.options = options
        o = self.options
        self._table = self._make_table(o.cost_model)
        self._max_cost = o.max_cost
        if o.max_cost is None:
            self._max_cost = self._table.default_max_cost(o.max_tokens, o.max_batch_size or 0)
        self._refuse_oversize(name)
        self._mine = self._make_fingerprint()
        self._start_cursor(Streamed(self._table, self._mine, self._check_files, self._make_table))

    def _make_table(self, cost_model: CostModel):
        return _sampler.StreamTable(self.seq_lens, self.group_ids, cost_model.native)

    @property
    def max_cost(self) -> float:
        """The compute cap M_comp in use (the default is computed from the data)."""
        return self._max_cost

    def _refuse_oversize(self, name: str) -> None:
        """Samples over a cap alone: refused now (not in the middle of the epoch), or skipped
        with a warning."""
        o = self.options
        count, first = self._table.oversize(o.max_tokens, self._max_cost)
        if count and o.on_oversize == "error":
            raise ValueError(
                f"{name}: {count} sample(s) exceed a cap on their own, the first at index "
                f"{first} with {int(self.seq_lens[first])} tokens, over max_tokens = "
                f"{o.max_tokens} or max_cost = {self._max_cost:.6g}: raise the cap, or leave "
                "such samples out with on_oversize='skip'"
            )
        if count:
            warnings.warn(
                f"{name}: skipping {count} sample(s) that alone exceed a cap (first: index "
                f"{first}, {int(self.seq_lens[first])} tokens)",
                stacklevel=3,
            )

    def _check_files(self) -> None:
        for f, what in self._files:
            f.check(type(self).__name__, what)

    def _before_pass(self) -> None:
        self._check_files()

    def _make_fingerprint(self) -> dict:
        o = self.options
        cost = o.cost_model.to_dict()
        cost.pop("meta", None)
        return {
            "sampler": type(self).__name__,
            "num_samples": len(self.seq_lens),
            "data": f"{self._table.digest:016x}",
            "max_tokens": o.max_tokens,
            "max_cost": float(self._max_cost),
            "cost_model": cost,
            "num_replicas": o.num_replicas,
            "micro_batches_per_step": o.micro_batches_per_step,
            "shuffle": o.shuffle,
            "seed": o.seed,
            "drop_last": o.drop_last,
            "lookahead_steps": o.lookahead_steps,
            "mix_tolerance": o.mix_tolerance,
            "composition": o.composition,
            "uneven_counts": o.uneven_counts,
            "max_batch_size": o.max_batch_size or 0,
            "on_oversize": o.on_oversize,
            "segment_samples": o.segment_samples,
        }

    def _fingerprint(self) -> dict:
        return self._mine

    # -- the whole epoch, a segment at a time -----------------------------------------------
    def segments(self, epoch: int | None = None, workers: int = 1) -> Iterator[Segment]:
        """Every segment of ``epoch`` (default the current) from its start, in order: the whole
        epoch, a segment at a time (reports, tests). ``workers`` > 1 plans up to that many
        segments at once on threads while the next one is cut (the planner releases the GIL;
        the same segments, at most ``2 * workers + 1`` held at a time)."""
        epoch = self.epoch if epoch is None else int_arg("epoch", epoch, 0)
        workers = int_arg("workers", workers, 1)
        source = self._cursor.source
        if workers == 1:
            yield from source.from_start(epoch, Start())
        else:
            yield from source.on_threads(epoch, workers)

    def balance_report(
        self, labels=None, seq_lens=None, epoch: int | None = None, workers: int | None = None
    ):
        """The whole epoch's ``BalanceReport`` (``adaptiveload.report``), planned segment by
        segment and merged (``merge_reports``): the ``plan`` command's figures at any size.
        ``labels`` and ``seq_lens`` as ``balance_report``'s (then with the composition).
        ``workers``: threads planning segments (None: one per core, at most 8)."""
        workers = default_workers() if workers is None else workers
        return merge_reports(
            [balance_report(seg.plan, labels, seq_lens) for seg in self.segments(epoch, workers)]
        )
