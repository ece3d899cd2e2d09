"""``StreamingBatchSampler``: plans that stream, for epochs of 100M to billions of samples.

The epoch's order is a keyed permutation of the dataset (computed per position, never stored),
cut into segments of at least ``segment_samples`` positions; each segment is planned when the
loop reaches it, exactly as ``AdaptiveBatchSampler`` plans an epoch (grouped, packed under both
caps, micro-batches shuffled, windows of ``lookahead_steps`` steps balanced and mixed). A
segment ends where its micro-batches fill whole windows, so where segment ``j + 1`` starts
depends only on where ``j`` started (csrc/sampler/stream.h). What a process holds: the lengths
and group ids as given (a memory-mapped ``.npy`` is read in place, and its pages are shared by
every rank process of the node), a few numbers per distinct length and per group, and one
segment's plan. A saved state is a few hundred bytes: the settings, the epoch, the segment and
the step.

Resume: a state of the same settings continues at its step exactly. A state of other settings
(another world size, say) re-plans what its segment had left, under the new settings, and goes
on from that segment's end; samples consumed before are known from the position alone. Not
supported here (``AdaptiveBatchSampler`` has them): memory policies, refinement, accelerate's
sharded loaders; ``len()``, which would need the whole epoch planned.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Iterator
from dataclasses import asdict, dataclass

import numpy as np
import torch.distributed as dist

from adaptiveload import _sampler
from adaptiveload.cost import CostModel
from adaptiveload.sampler.checks import bool_arg, int_arg
from adaptiveload.sampler.plan import MicroBatch, Plan
from adaptiveload.sampler.ranks import distributed_defaults, verify_same_plan
from adaptiveload.sampler.samplers import MIX_TOLERANCE

STATE_KIND = "adaptiveload.streaming"
STATE_VERSION = 1
# Keys of a segment's micro-batch shuffle: segment j is keyed j, what a resume under other
# settings re-plans of segment j is keyed PRELUDE + j.
PRELUDE = 1 << 62
# The default least segment: the larger of 2^20 samples and 4 * lookahead_steps * W * K (as
# many samples as 4 windows hold micro-batches, so that a segment holds a few windows).
MIN_SEGMENT = 1 << 20


def default_workers() -> int:
    """Threads for planning a whole epoch's segments (reports): one per core, at most 8."""
    return max(1, min(8, os.cpu_count() or 1))


@dataclass(frozen=True)
class Settings:
    """Everything that shapes a streamed plan, except the epoch and the position in it."""

    max_tokens: int
    max_cost: float
    cost_model: dict
    num_replicas: int
    micro_batches_per_step: int
    shuffle: bool
    seed: int
    drop_last: bool
    lookahead_steps: int
    mix_tolerance: float
    uneven_counts: bool
    max_batch_size: int
    skip_oversize: bool
    segment_samples: int

    def plan_options(self, epoch: int):
        p = _sampler.PlanOptions()
        p.max_tokens, p.max_batch_size, p.max_cost = (
            self.max_tokens,
            self.max_batch_size,
            self.max_cost,
        )
        p.num_replicas, p.micro_batches_per_step = self.num_replicas, self.micro_batches_per_step
        p.shuffle, p.seed, p.epoch, p.drop_last = self.shuffle, self.seed, epoch, self.drop_last
        p.lookahead_steps, p.uneven_counts = self.lookahead_steps, self.uneven_counts
        p.mix_tolerance, p.skip_oversize = self.mix_tolerance, self.skip_oversize
        return p


@dataclass
class Segment:
    """One planned segment: positions [begin, end) of the epoch's permutation, its steps
    ``[steps_before, steps_before + plan.num_steps)`` of the epoch."""

    index: int
    begin: int
    end: int
    steps_before: int
    plan: Plan
    #: what a resume under other settings re-plans of an earlier segment, which this one
    #: begins with (None: none)
    prelude: dict | None = None
    _totals: tuple | None = None

    def step_totals(self) -> tuple[np.ndarray, np.ndarray]:
        """Tokens and samples of each of its steps over all ranks (computed once)."""
        if self._totals is None:
            self._totals = (self.plan.step_tokens(), self.plan.step_samples())
        return self._totals


def _column(values, name: str) -> np.ndarray:
    """A 1-D int32/int64 array as it is (a memory map stays one), anything else as int64."""
    if isinstance(values, str | os.PathLike):
        values = np.load(values, mmap_mode="r")
    a = values if isinstance(values, np.ndarray) else np.asarray(values)
    if a.ndim != 1:
        raise ValueError(f"{name} must be 1-D (one value per dataset index), got shape {a.shape}")
    if a.dtype in (np.int32, np.int64) and a.dtype.isnative and a.flags.c_contiguous:
        return a
    if a.dtype.kind not in "iu" or a.dtype == np.uint64:
        raise ValueError(f"{name} must hold integers (int32 or int64), got dtype {a.dtype}")
    return np.ascontiguousarray(a, dtype=np.int64)


class StreamingBatchSampler:
    """A batch sampler whose epoch plan streams, segment by segment.

    Args:
        seq_lens: token counts, one per dataset index: an int32 or int64 array (a
            ``np.load(path, mmap_mode="r")`` map is read in place, never copied) or the path
            of such a ``.npy``.
        max_tokens, max_cost, cost_model, num_replicas, rank, process_group,
        micro_batches_per_step, shuffle, seed, drop_last, lookahead_steps, mix_tolerance,
        uneven_counts, max_batch_size, on_oversize, verify_ranks: as ``AdaptiveBatchSampler``'s
            (only the epoch's last segment is fitted to whole steps: halved, padded or dropped).
        group_ids: dense int32/int64 group ids, one per index, in ``[0, G)`` with every id used
            (``Metadata.group_keys`` gives them), or their ``.npy`` path; default: the length.
        segment_samples: the least positions of a segment (default: the larger of ``2^20``
            and ``4 * lookahead_steps * W * K``). Larger segments take longer to plan before
            their first micro-batch.
        drawn_is_trained: the loop trains every batch this sampler hands out before a state is
            taken (no DataLoader workers drawing ahead), so that ``state_dict()`` may take the
            steps drawn whole as the position. Otherwise a position comes from
            ``micro_batches(loader)``'s count or ``state_dict(steps_done=...)``, and is refused
            without either.
    """

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
        mix_tolerance: float = MIX_TOLERANCE,
        uneven_counts: bool = False,
        max_batch_size: int | None = None,
        on_oversize: str = "error",
        segment_samples: int | None = None,
        verify_ranks: bool = True,
        drawn_is_trained: bool = False,
    ):
        name = type(self).__name__
        self.seq_lens = _column(seq_lens, "seq_lens")
        self.group_ids = None if group_ids is None else _column(group_ids, "group_ids")
        self.cost_model = CostModel.default() if cost_model is None else cost_model
        if not isinstance(self.cost_model, CostModel):
            raise TypeError(f"cost_model must be a CostModel, got {type(cost_model).__name__}")
        self.num_replicas, self.rank = distributed_defaults(num_replicas, rank, process_group)
        self.process_group = process_group
        if on_oversize not in ("error", "skip"):
            raise ValueError(f"on_oversize must be 'error' or 'skip', got {on_oversize!r}")
        if not (isinstance(mix_tolerance, int | float) and 0.0 <= mix_tolerance <= 1.0):
            raise ValueError(f"mix_tolerance must be a number in [0, 1], got {mix_tolerance!r}")
        max_tokens = int_arg("max_tokens", max_tokens, 1, 2**62)
        k = int_arg("micro_batches_per_step", micro_batches_per_step, 1)
        lookahead = int_arg("lookahead_steps", lookahead_steps, 1)
        least = max(MIN_SEGMENT, 4 * lookahead * self.num_replicas * k)
        segment_samples = least if segment_samples is None else segment_samples
        self._table = _sampler.StreamTable(self.seq_lens, self.group_ids, self.cost_model.native)
        if max_cost is None:
            max_cost = self._table.default_max_cost(max_tokens, max_batch_size or 0)
        elif not (isinstance(max_cost, int | float) and 0 < max_cost < float("inf")):
            raise ValueError(f"max_cost must be a finite number > 0, got {max_cost!r}")
        cost = self.cost_model.to_dict()
        cost.pop("meta", None)
        self.settings = Settings(
            max_tokens=max_tokens,
            max_cost=float(max_cost),
            cost_model=cost,
            num_replicas=self.num_replicas,
            micro_batches_per_step=k,
            shuffle=bool_arg("shuffle", shuffle),
            seed=int_arg("seed", seed, 0, 2**64 - 1),
            drop_last=bool_arg("drop_last", drop_last),
            lookahead_steps=lookahead,
            mix_tolerance=float(mix_tolerance),
            uneven_counts=bool_arg("uneven_counts", uneven_counts),
            max_batch_size=int_arg("max_batch_size", max_batch_size or 0, 0),
            skip_oversize=on_oversize == "skip",
            segment_samples=int_arg("segment_samples", segment_samples, 1),
        )
        self.verify_ranks = bool_arg("verify_ranks", verify_ranks)
        self.drawn_is_trained = bool_arg("drawn_is_trained", drawn_is_trained)
        self._name = name
        self._oversize(on_oversize)
        self.epoch = 0
        self._start = (0, 0, 0, 0)  # segment, begin, steps before it, steps done in the epoch
        self._prelude: dict | None = None
        self._done = 0  # global steps this rank drew whole, in the pass under way
        self._trained: int | None = None  # steps micro_batches() received whole
        self._recent: list[Segment] = []
        self._pass_start = 0  # the step the pass under way started at
        self._counting = False  # micro_batches(loader) is counting the batches received
        self._resumed = False  # a loaded position waits for its pass
        self._verified = None

    def _oversize(self, on_oversize: str) -> None:
        """Samples over a cap alone: refused now (not in the middle of the epoch), or skipped
        with a warning."""
        count, first = self._table.oversize(self.settings.max_tokens, self.settings.max_cost)
        if count and on_oversize == "error":
            o = self.settings
            raise ValueError(
                f"{self._name}: {count} sample(s) exceed a cap on their own, the first at "
                f"index {first} with {int(self.seq_lens[first])} tokens, over max_tokens = "
                f"{o.max_tokens} or max_cost = {o.max_cost:.6g}: raise the cap, or leave such "
                "samples out with on_oversize='skip'"
            )
        if count:
            warnings.warn(
                f"{self._name}: skipping {count} sample(s) that alone exceed a cap (first: index "
                f"{first}, {int(self.seq_lens[first])} tokens)",
                stacklevel=3,
            )

    # -- the epoch's description ------------------------------------------------------------
    def __len__(self) -> int:
        raise TypeError(
            f"{self._name} has no len(): a streamed epoch's micro-batch count is known only "
            "once it is planned (iterate, or plan the whole epoch with segments())"
        )

    def set_epoch(self, epoch: int) -> None:
        """Epoch ``epoch`` from its start, unless it is the epoch of a resumed position that
        waits for its pass."""
        epoch = int_arg("epoch", epoch, 0)
        if self._resumed and epoch == self.epoch:
            return
        self.epoch, self._start, self._prelude, self._resumed = epoch, (0, 0, 0, 0), None, False
        self._forget_pass()

    def _forget_pass(self) -> None:
        """No pass under way: what the last one planned, drew and trained is gone."""
        self._recent, self._done, self._trained = [], 0, None

    def _data(self) -> str:
        return f"{len(self.seq_lens)}:{self._table.digest:016x}"

    def _fingerprint(self) -> dict:
        return {"sampler": self._name, "data": self._data(), **asdict(self.settings)}

    def _segment_at(
        self, settings: Settings, epoch: int, index: int, begin: int, steps_before: int
    ) -> Segment:
        o = settings.plan_options(epoch)
        end, raw = _sampler.plan_segment(self._table, o, begin, settings.segment_samples, index)
        return Segment(index, begin, end, steps_before, self._plan(settings, raw))

    def _plan(self, settings: Settings, raw: dict) -> Plan:
        raw = {k: (int(v) if isinstance(v, int) else v) for k, v in raw.items()}
        return Plan(max_tokens=settings.max_tokens, max_cost=settings.max_cost, **raw)

    def segments(self, epoch: int | None = None, workers: int = 1) -> Iterator[Segment]:
        """Every segment of ``epoch`` (default the current) from its start, in order: the whole
        epoch, a segment at a time (reports, tests). ``workers`` > 1 plans up to that many
        segments at once on threads while the next one is cut (the planner releases the GIL;
        the same segments, at most ``2 * workers + 1`` held at a time)."""
        epoch = self.epoch if epoch is None else epoch
        workers = int_arg("workers", workers, 1)
        if workers == 1:
            yield from self._segments_from(self.settings, epoch, (0, 0, 0, 0), None)
        else:
            yield from self._segments_on_threads(self.settings, epoch, workers)

    def balance_report(
        self, labels=None, seq_lens=None, epoch: int | None = None, workers: int | None = None
    ):
        """The whole epoch's ``BalanceReport`` (``adaptiveload.report``), planned segment by
        segment and merged (``merge_reports``): the ``plan`` command's figures at any size.
        ``labels`` and ``seq_lens`` as ``balance_report``'s (then with the composition).
        ``workers``: threads planning segments (None: one per core, at most 8)."""
        # adaptiveload.report imports the sampler package: imported here, where it is used.
        from adaptiveload.report import balance_report, merge_reports

        workers = default_workers() if workers is None else workers
        return merge_reports(
            [balance_report(seg.plan, labels, seq_lens) for seg in self.segments(epoch, workers)]
        )

    def _segments_on_threads(self, settings, epoch, workers) -> Iterator[Segment]:
        """``segments`` with a pool: this thread cuts segment after segment (``cut_segment``;
        where each ends depends on where it begins), the pool plans each as cut (``plan_cut``
        with the segment's index as key, what ``plan_segment`` does). The cutting is the
        epoch's one serial part, so the pool plans on ``workers - 1`` threads at a time while
        this thread cuts, on all ``workers`` while it waits for a plan or once it has cut the
        last segment; up to ``2 * workers`` cut segments wait for a planner, so that the
        cutting runs ahead."""
        import threading
        from collections import deque
        from concurrent.futures import ThreadPoolExecutor

        o = settings.plan_options(epoch)
        n = len(self.seq_lens)
        turn = threading.Condition()
        running, limit = 0, workers - 1

        def plan(index, cut):
            nonlocal running
            with turn:
                turn.wait_for(lambda: running < limit)
                running += 1
            try:
                return self._plan(settings, _sampler.plan_cut(self._table, o, cut, index))
            finally:
                with turn:
                    running -= 1
                    turn.notify_all()

        def planners(count):
            nonlocal limit
            with turn:
                limit = count
                turn.notify_all()

        with ThreadPoolExecutor(workers) as pool:
            pending = deque()
            index, begin, steps_before = 0, 0, 0

            def ready(cutting=False):
                nonlocal steps_before
                i, b, e, future = pending.popleft()
                if cutting:
                    planners(workers)  # this thread waits: its core plans meanwhile
                plan_ = future.result()
                if cutting:
                    planners(workers - 1)
                seg = Segment(i, b, e, steps_before, plan_)
                steps_before += seg.plan.num_steps
                return seg

            try:
                while begin < n:
                    cut = _sampler.cut_segment(self._table, o, begin, settings.segment_samples)
                    end = cut.end
                    pending.append((index, begin, end, pool.submit(plan, index, cut)))
                    index, begin = index + 1, end
                    if len(pending) > 2 * workers:
                        yield ready(cutting=True)
            finally:
                planners(workers)
            while pending:
                yield ready()

    def _segments_from(self, settings, epoch, start, prelude) -> Iterator[Segment]:
        index, begin, steps_before, _ = start
        n = len(self.seq_lens)
        if prelude is not None:
            seg = self._prelude_segment(settings, epoch, prelude)
            if seg is None:
                return
            yield seg
            index, begin, steps_before = index + 1, seg.end, seg.steps_before + seg.plan.num_steps
        while begin < n:
            seg = self._segment_at(settings, epoch, index, begin, steps_before)
            yield seg
            index, begin, steps_before = index + 1, seg.end, steps_before + seg.plan.num_steps

    # -- resume under other settings --------------------------------------------------------
    def _prelude_segment(self, settings: Settings, epoch: int, prelude: dict) -> Segment | None:
        """What segment ``prelude['segment']`` of the saved settings had left after its first
        ``prelude['steps']`` steps, followed by the positions from that segment's end, planned
        under ``settings`` as one segment (so the rest is fitted to steps only at the epoch's
        end); None where nothing is left."""
        old = Settings(**prelude["settings"])
        j, begin, before = prelude["segment"], prelude["begin"], prelude["steps_before"]
        o = old.plan_options(epoch)
        end, samples, skipped = _sampler.next_segment(self._table, o, begin, old.segment_samples)
        plan = self._plan(old, _sampler.plan_samples(self._table, o, samples, j))
        # The samples of its first steps, padding repeats aside (a few bits of the segment,
        # never one flag per sample of the dataset).
        ids = plan.step_begin(prelude["steps"] - before)
        sizes = plan.micro_batch_sizes()[:ids]
        taken = plan.samples[: int(plan.offsets[ids])][~np.repeat(plan.padding[:ids] != 0, sizes)]
        everything = np.concatenate([samples, skipped])
        left = everything[~np.isin(everything, taken)]
        if end >= len(self.seq_lens) and len(left) == 0:
            return None
        o = settings.plan_options(epoch)
        end, raw = _sampler.plan_segment(
            self._table, o, end, settings.segment_samples, PRELUDE + j, left
        )
        return Segment(j, begin, end, prelude["steps"], self._plan(settings, raw), prelude=prelude)

    # -- iteration --------------------------------------------------------------------------
    def __iter__(self) -> Iterator[list[int]]:
        self._check_ranks()
        self._resumed = False
        start, prelude = self._start, self._prelude
        self._forget_pass()
        self._pass_start = self._done = start[3]
        if self._counting:  # micro_batches(loader) counts what the loop receives
            self._trained = start[3]
        first = True
        for seg in self._segments_from(self.settings, self.epoch, start, prelude):
            self._keep(seg)
            plan, r = seg.plan, self.rank
            skip = start[3] - seg.steps_before if first else 0
            first = False
            for t in range(max(skip, 0), plan.num_steps):
                self._done = seg.steps_before + t
                count = plan.micro_batches_in_step(t, r)
                for k in range(count):
                    if k == count - 1:
                        self._done = seg.steps_before + t + 1
                    yield plan.micro_batch(t, r, k).tolist()
        # The epoch is done: the next pass starts it again.
        self._start, self._prelude = (0, 0, 0, 0), None

    def _keep(self, seg: Segment) -> None:
        """Keeps the segments a state or ``micro_batches`` may still ask for: from the one of the
        step last trained (or drawn) on, and the last two at least."""
        self._recent.append(seg)
        floor = self._trained if self._trained is not None else self._done
        while len(self._recent) > 2:
            first = self._recent[0]
            if first.steps_before + first.plan.num_steps >= floor:
                break
            self._recent.pop(0)

    def micro_batches(self, loader) -> Iterator[MicroBatch]:
        """Each batch of ``loader`` (a DataLoader over this sampler) with its step: the
        sampler then saves the steps the loop received whole, not those its workers drew."""
        end = object()
        self._counting = True  # before the loader's workers start drawing
        try:
            yield from self._counted(iter(loader), end)
        finally:
            self._counting = False

    def _counted(self, it, end) -> Iterator[MicroBatch]:
        batch = next(it, end)  # starts the sampler's pass
        step = self._pass_start
        while batch is not end:
            seg = self._find_segment(step)
            plan, r, t = seg.plan, self.rank, step - seg.steps_before
            count = plan.micro_batches_in_step(t, r)
            tokens, samples = (int(v[t]) for v in seg.step_totals())
            for k in range(count):
                if batch is end:
                    raise RuntimeError(
                        f"micro_batches: the loader ended inside step {step} after {k} of "
                        f"rank {r}'s {count} micro-batches"
                    )
                if k == count - 1:
                    self._trained = step + 1  # received whole: the loop steps on it
                yield MicroBatch(batch, step, k, count, tokens, samples, rank=r)
                batch = next(it, end)
            step += 1

    def _find_segment(self, step: int) -> Segment:
        for seg in reversed(self._recent):
            if seg.steps_before <= step < seg.steps_before + seg.plan.num_steps:
                return seg
        raise RuntimeError(f"micro_batches: step {step} is not in a segment the sampler planned")

    def _check_ranks(self) -> None:
        if not self.verify_ranks or not (dist.is_available() and dist.is_initialized()):
            return
        if dist.get_world_size() < 2:
            return
        mine = self._fingerprint() | {
            "epoch": self.epoch,
            "resume": repr((self._start, self._prelude)),
        }
        key = repr(sorted(mine.items()))
        if key != self._verified:
            verify_same_plan(mine, self._name)
            self._verified = key

    # -- state --------------------------------------------------------------------------------
    def state_dict(self, steps_done: int | None = None) -> dict:
        """The position to resume from, a few hundred bytes: the settings, the epoch, and the
        step (``steps_done``, the epoch's optimizer steps completed; default: the steps
        ``micro_batches`` received whole, else those this rank drew whole)."""
        if steps_done is None:
            steps_done = self._known_position()
        steps_done = int_arg("steps_done", steps_done, 0)
        seg = self._locate(steps_done)
        state = {
            "kind": STATE_KIND,
            "version": STATE_VERSION,
            "data": self._data(),
            "settings": asdict(self.settings),
            "epoch": self.epoch,
            "segment": seg.index,
            "begin": seg.begin,
            "steps_before": seg.steps_before,
            "steps_done": steps_done,
        }
        if seg.prelude is not None:
            state["prelude"] = seg.prelude
        return state

    def _known_position(self) -> int:
        """The steps done of a ``state_dict()`` without ``steps_done``: before a pass, where it
        starts; in one, the steps ``micro_batches`` received whole, or (declared
        ``drawn_is_trained``) those drawn whole; else refused."""
        if not self._recent:
            return self._start[3]
        if self._trained is not None:
            return self._trained
        if self.drawn_is_trained:
            return self._done
        raise ValueError(
            f"{self._name}: the position is unknown: DataLoader workers draw batches ahead of "
            "the loop, so what the sampler handed out is not what was trained. Iterate with "
            "micro_batches(loader) (its count is the position), pass state_dict(steps_done=...), "
            "or declare drawn_is_trained=True where the loop trains every batch drawn"
        )

    def _locate(self, steps_done: int) -> Segment:
        """The segment holding step ``steps_done`` (or ending at it) of the pass under way."""
        for seg in reversed(self._recent):
            if seg.steps_before <= steps_done <= seg.steps_before + seg.plan.num_steps:
                if (
                    steps_done == seg.steps_before + seg.plan.num_steps
                    and seg is not self._recent[-1]
                ):
                    continue
                return seg
        index, begin, before, done = self._start
        if steps_done == done:
            return Segment(index, begin, begin, before, None, prelude=self._prelude)  # type: ignore[arg-type]
        raise ValueError(
            f"steps_done = {steps_done} is not in the segments this pass planned (steps "
            f"{self._recent[0].steps_before if self._recent else done} on)"
        )

    def load_state_dict(self, state: dict) -> None:
        """Continue at a saved position: exactly, for the same settings; for other settings,
        with what the saved segment had left re-planned under these. Refused for another
        dataset, and for a state saved inside such a re-planned remainder under yet other
        settings (resume it with the settings it was saved with first)."""
        if not isinstance(state, dict) or state.get("kind") != STATE_KIND:
            raise ValueError(f"{self._name}: not a state of a StreamingBatchSampler")
        if state.get("version") != STATE_VERSION:
            raise ValueError(f"{self._name}: state version {state.get('version')!r} unknown")
        if state["data"] != self._data():
            raise ValueError(
                f"{self._name}: the state was saved over other data ({state['data']}, here "
                f"{self._data()}: samples:digest); resuming would lose or repeat samples"
            )
        saved = dict(state["settings"])
        epoch, j, begin = int(state["epoch"]), int(state["segment"]), int(state["begin"])
        before, done = int(state["steps_before"]), int(state["steps_done"])
        prelude = state.get("prelude")
        if (saved["seed"], saved["shuffle"]) != (self.settings.seed, self.settings.shuffle):
            raise ValueError(
                f"{self._name}: seed and shuffle make the epoch's order; the state was saved with "
                f"seed={saved['seed']}, shuffle={saved['shuffle']} (here {self.settings.seed}, "
                f"{self.settings.shuffle}), and another order would lose and repeat samples. "
                "Resume with those, and change them at an epoch's start"
            )
        if saved == asdict(self.settings):
            start = (j, begin, before, done)
        elif prelude is not None:
            raise ValueError(
                f"{self._name}: the state was saved inside what a resume under other settings "
                "re-planned, and the settings changed again; resume with the settings it was "
                f"saved with ({saved}) until the next segment, then change them"
            )
        else:
            prelude = {"settings": saved, "segment": j, "begin": begin, "steps_before": before,
                       "steps": done}  # fmt: skip
            start = (j, begin, before, done)
        self.epoch, self._start, self._prelude = epoch, start, prelude
        self._resumed, self._verified = True, None
        self._forget_pass()
