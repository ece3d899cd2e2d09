"""``Streamed``: the plan source of ``StreamingBatchSampler`` (stream.py), segments planned as
the loop reaches them (sources.py says what a plan source answers).

The epoch's order is a keyed permutation of the dataset (computed per position, never stored),
cut into segments of at least ``segment_samples`` positions; each segment is planned when the
loop reaches it, exactly as ``AdaptiveBatchSampler`` plans an epoch. A segment ends where its
micro-batches fill whole windows, so where segment ``j + 1`` starts depends only on where ``j``
started (csrc/sampler/stream.h). A cursor's token is where the pass starts: a segment (its
index, first position and steps before it) and, after a resume under other settings, what that
segment had left (``prelude``), planned under the new settings."""

from __future__ import annotations

import hashlib
import json
import threading
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from adaptiveload import _sampler
from adaptiveload.cost import CostModel
from adaptiveload.sampler import resume
from adaptiveload.sampler.checks import int_arg
from adaptiveload.sampler.plan import Plan, Segment

# Keys of a segment's micro-batch shuffle: segment j is keyed j, what a resume under other
# settings re-plans of segment j is keyed PRELUDE + j.
PRELUDE = 1 << 62
STATE_KEYS = ("fingerprint", "epoch", "micro_batches_done", "steps_done", "segment", "check")


def plan_options(fp: dict, epoch: int):
    """The C++ planner's options of a streamed fingerprint ``fp`` (the sampler's, or a saved
    state's) for ``epoch``."""
    p = _sampler.PlanOptions()
    p.max_tokens, p.max_batch_size = fp["max_tokens"], fp["max_batch_size"]
    p.max_cost = fp["max_cost"]
    p.num_replicas, p.micro_batches_per_step = fp["num_replicas"], fp["micro_batches_per_step"]
    p.shuffle, p.seed, p.epoch, p.drop_last = fp["shuffle"], fp["seed"], epoch, fp["drop_last"]
    p.lookahead_steps, p.uneven_counts = fp["lookahead_steps"], fp["uneven_counts"]
    p.mix_tolerance, p.skip_oversize = fp["mix_tolerance"], fp["on_oversize"] == "skip"
    # States saved before the key planned by the tolerance's rule.
    p.representative = fp.get("composition", "balanced") == "representative"
    return p


def state_check(state: dict) -> str:
    """A digest of a streamed state's fields: a position is only taken from a state whose
    fields are those a sampler wrote (the segment a position names cannot be checked without
    cutting the epoch up to it)."""
    body = {k: v for k, v in state.items() if k != "check"}
    text = json.dumps(body, sort_keys=True, default=repr)
    return hashlib.blake2b(text.encode(), digest_size=8).hexdigest()


@dataclass
class Start:
    """Where a streamed pass starts: segment ``index`` at position ``begin`` of the permutation,
    ``steps_before`` steps into the epoch, and what a resume under other settings re-plans
    first (``prelude``). ``left``: whether a resumed position has micro-batches left;
    ``first``: its segment, planned when the state was checked."""

    index: int = 0
    begin: int = 0
    steps_before: int = 0
    prelude: dict | None = None
    left: bool = True
    first: Segment | None = None


class Streamed:
    """Segments as the loop reaches them.

    Args:
        table: the C++ ``StreamTable`` of the sampler's lengths and groups.
        mine: the sampler's fingerprint (its settings, the data's digest and count).
        check_data: called before each segment is planned: raises where the data changed.
        make_table: ``CostModel -> StreamTable`` of the same data.
    """

    def __init__(self, table, mine: dict, check_data: Callable[[], None], make_table):
        self.table = table
        self.make_table = make_table
        self.mine = mine
        self.check_data = check_data
        self.num_samples = mine["num_samples"]

    # -- planning ---------------------------------------------------------------------------
    def _plan(self, fp: dict, raw: dict) -> Plan:
        raw = {k: (int(v) if isinstance(v, int) else v) for k, v in raw.items()}
        return Plan(max_tokens=fp["max_tokens"], max_cost=fp["max_cost"], **raw)

    def _segment(self, epoch: int, index: int, begin: int, steps_before: int) -> Segment:
        self.check_data()
        o = plan_options(self.mine, epoch)
        end, raw = _sampler.plan_segment(self.table, o, begin, self.mine["segment_samples"], index)
        plan = self._plan(self.mine, raw)
        return Segment(plan, steps_before, index, begin, end, end >= self.num_samples)

    def from_start(self, epoch: int, start: Start) -> Iterator[Segment]:
        """The epoch's segments from ``start``, one at a time."""
        index, begin, steps_before = start.index, start.begin, start.steps_before
        if start.first is not None:
            seg = start.first
        elif start.prelude is not None:
            seg = self._prelude_segment(epoch, start.prelude)
        else:
            seg = None
        if seg is not None:
            yield seg
            index, begin, steps_before = seg.index + 1, seg.end, seg.steps_end
        elif start.prelude is not None:
            return  # nothing left of the epoch
        while begin < self.num_samples:
            seg = self._segment(epoch, index, begin, steps_before)
            yield seg
            index, begin, steps_before = index + 1, seg.end, seg.steps_end

    def _prelude_segment(self, epoch: int, prelude: dict) -> Segment | None:
        """What segment ``prelude['segment']`` of the saved settings had left after its first
        ``prelude['steps']`` steps (and ``prelude['micro_batches']`` of every rank in the next),
        followed by the positions from that segment's end, planned under these settings as one
        segment (so the rest is fitted to steps only at the epoch's end); None where nothing is
        left."""
        self.check_data()
        old = prelude["settings"]
        table = self.table
        if old["cost_model"] != self.mine["cost_model"]:
            # The saved segment as it was planned: under the cost model it was saved with.
            table = self.make_table(CostModel.from_dict(old["cost_model"]))
        j, begin, before = prelude["segment"], prelude["begin"], prelude["steps_before"]
        o = plan_options(old, epoch)
        end, samples, skipped = _sampler.next_segment(table, o, begin, old["segment_samples"])
        plan = self._plan(old, _sampler.plan_samples(table, o, samples, j))
        # The samples of its first steps and of every rank's first micro-batches in the next,
        # padding repeats aside (a few bits of the segment, never a flag per sample of the
        # dataset).
        t, done = prelude["steps"] - before, prelude["micro_batches"]
        flags = np.zeros(plan.num_micro_batches, dtype=bool)
        flags[: plan.step_begin(t)] = True
        for r in range(plan.num_replicas):
            for k in range(done):
                flags[plan.micro_batch_id(t, r, k)] = True
        taken = plan.samples[np.repeat(flags & (plan.padding == 0), plan.micro_batch_sizes())]
        everything = np.concatenate([samples, skipped])
        left = everything[~np.isin(everything, taken)]
        if end >= self.num_samples and len(left) == 0:
            return None
        o = plan_options(self.mine, epoch)
        end, raw = _sampler.plan_segment(
            self.table, o, end, self.mine["segment_samples"], PRELUDE + j, left
        )
        plan = self._plan(self.mine, raw)
        steps = prelude["steps"]
        return Segment(plan, steps, j, begin, end, end >= self.num_samples, prelude)

    def on_threads(self, epoch: int, workers: int) -> Iterator[Segment]:
        """The epoch's segments from its start, planned by a pool: this thread cuts segment
        after segment (``cut_segment``; where each ends depends on where it begins), the pool
        plans each as cut (``plan_cut`` with the segment's index as key, what ``plan_segment``
        does). The cutting is the epoch's one serial part, so the pool plans on ``workers - 1``
        threads at a time while this thread cuts, on all ``workers`` while it waits for a plan
        or once it has cut the last segment; up to ``2 * workers`` cut segments wait for a
        planner, so that the cutting runs ahead."""
        o = plan_options(self.mine, epoch)
        n, least = self.num_samples, self.mine["segment_samples"]
        turn = threading.Condition()
        running, limit = 0, workers - 1

        def plan(index, cut):
            nonlocal running
            with turn:
                turn.wait_for(lambda: running < limit)
                running += 1
            try:
                return self._plan(self.mine, _sampler.plan_cut(self.table, o, cut, index))
            finally:
                with turn:
                    running -= 1
                    turn.notify_all()

        def planners(count):
            nonlocal limit
            with turn:
                limit = count
                turn.notify_all()

        self.check_data()
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
                seg = Segment(plan_, steps_before, i, b, e, e >= n)
                steps_before = seg.steps_end
                return seg

            try:
                while begin < n:
                    cut = _sampler.cut_segment(self.table, o, begin, least)
                    pending.append((index, begin, cut.end, pool.submit(plan, index, cut)))
                    index, begin = index + 1, cut.end
                    if len(pending) > 2 * workers:
                        yield ready(cutting=True)
            finally:
                planners(workers)
            while pending:
                yield ready()

    # -- the plan source (sources.py) -------------------------------------------------------
    def whole_plan(self, cursor) -> Plan:
        raise TypeError(
            f"{cursor.owner} plans its epoch segment by segment, so it has no whole plan: "
            "iterate it, or plan the whole epoch with segments()"
        )

    def left(self, cursor) -> int:
        raise TypeError(
            f"{cursor.owner} has no len(): a streamed epoch's micro-batch count is known only "
            "once it is planned (iterate, or plan the whole epoch with segments())"
        )

    def segments(self, cursor) -> Iterator[Segment]:
        yield from self.from_start(cursor.epoch, cursor.token or Start())

    def segment_at(self, cursor, step: int) -> Segment | None:
        last = cursor.kept[-1] if cursor.kept else None
        if last is not None and last.last and step >= last.steps_end:
            return None
        raise RuntimeError(
            f"{cursor.owner}: step {step} is not in a segment this pass planned: the loader "
            "does not draw from this sampler's pass"
        )

    def remaining(self, cursor) -> bool:
        return cursor.token is None or cursor.token.left

    def resume_key(self, cursor) -> str:
        t = cursor.token
        if t is None and cursor.start == (0, 0):
            return "none"
        t = t or Start()
        return repr((t.index, t.begin, t.steps_before, t.prelude, cursor.start))

    # -- state ------------------------------------------------------------------------------
    def _place(self, cursor, drawn, steps_done, mbd) -> tuple[int, int]:
        """The place of a state: ``steps_done`` or ``mbd`` (micro_batches_done) where given,
        else ``drawn``; never before where the pass started."""
        o = cursor.options
        k = o.micro_batches_per_step
        if steps_done is not None and mbd is not None:
            raise ValueError("state_dict: pass steps_done or micro_batches_done, not both")
        if steps_done is not None:
            place, name, value = (int_arg("steps_done", steps_done, 0), 0), "steps_done", steps_done
        elif mbd is not None:
            if o.uneven_counts:
                raise ValueError(
                    "state_dict: with uneven_counts the ranks' micro-batch counts differ, so "
                    "positions go by steps: pass steps_done"
                )
            place = divmod(int_arg("micro_batches_done", mbd, 0), k)
            name, value = "micro_batches_done", mbd
        else:
            return drawn
        if place < cursor.start:
            start, done = cursor.start
            raise resume.before_start(name, value, start, start * k + done if done else None)
        return place

    def _holder(self, cursor, place) -> Start:
        """The segment of the pass that holds ``place`` (a step's end is the next segment's
        start, where one was planned)."""
        step, done = place
        for seg in reversed(cursor.kept):
            if seg.steps_before <= step < seg.steps_end or (
                step == seg.steps_end and not done and seg is cursor.kept[-1]
            ):
                return Start(seg.index, seg.begin, seg.steps_before, seg.prelude)
        if place == cursor.start:
            return cursor.token or Start()
        first = cursor.kept[0].steps_before if cursor.kept else cursor.start[0]
        raise ValueError(
            f"state_dict: step {step} is not in the segments this pass planned (steps {first} "
            "on): take the state where the loop is"
        )

    def state(self, cursor, mine: dict, drawn, steps_done, mbd) -> dict:
        o = cursor.options
        place = self._place(cursor, drawn, steps_done, mbd)
        holder = self._holder(cursor, place)
        steps, done = place
        segment = {
            "index": holder.index,
            "begin": holder.begin,
            "steps_before": holder.steps_before,
        }
        if holder.prelude is not None:
            segment["prelude"] = holder.prelude
        k = o.micro_batches_per_step
        state = {
            "version": resume.STATE_VERSION,
            "fingerprint": mine,
            "epoch": cursor.epoch,
            "micro_batches_done": steps * k + (0 if o.uneven_counts else done),
            "steps_done": steps,
            "segment": segment,
        }
        resume.with_steps(state, None, done if o.uneven_counts else 0, o.rank)
        state["check"] = state_check(state)
        return state

    def load(self, cursor, state: dict, mine: dict):
        """``(epoch, token, start, None)`` of a streamed ``state``, every field checked, and
        the segment it resumes planned (its steps must hold the position)."""
        resume.check_keys(state, mine, STATE_KEYS)
        saved = state["fingerprint"]
        if not isinstance(saved, dict):
            raise ValueError("sampler state: 'fingerprint' must be a dict")
        # States saved before composition was a setting (2026-12-07) planned by the tolerance's
        # rule: they replay under composition="balanced" and re-plan their rest under another.
        saved = {"composition": "balanced", **saved}
        if (saved.get("num_samples"), saved.get("data")) != (mine["num_samples"], mine["data"]):
            raise ValueError(
                f"sampler state is for other data ({saved.get('num_samples')} samples, digest "
                f"{saved.get('data')}; here {mine['num_samples']}, {mine['data']}): resuming "
                "would lose or repeat samples"
            )
        missing = sorted(set(mine) - set(saved))
        if missing:
            raise ValueError(f"sampler state: fingerprint lacks {missing}")
        if state["check"] != state_check(state):
            raise ValueError(
                "sampler state: its fields are not those the sampler saved (its 'check' does "
                "not match): the state is corrupt or was edited"
            )
        epoch, steps = resume.count_field(state, "epoch"), resume.count_field(state, "steps_done")
        start = self._checked_segment(state["segment"], steps)
        in_step = resume.in_step_of(state, steps)
        k, uneven = saved["micro_batches_per_step"], saved["uneven_counts"]
        if not isinstance(uneven, bool) or isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise ValueError("sampler state: the fingerprint's K or uneven_counts is not valid")
        done = resume.count_field(state, "micro_batches_done") - steps * k
        if uneven and done == 0 and in_step is not None:
            done = in_step[1]
        elif done < 0 or done >= k or uneven and done or in_step is not None and not uneven:
            raise ValueError(
                "sampler state: 'micro_batches_done' or 'in_step' disagrees with 'steps_done': "
                "the state is corrupt"
            )
        if (saved["seed"], saved["shuffle"]) != (mine["seed"], mine["shuffle"]):
            raise ValueError(
                f"{cursor.owner}: seed and shuffle make the epoch's order; the state was saved "
                f"with seed={saved['seed']}, shuffle={saved['shuffle']} (here {mine['seed']}, "
                f"{mine['shuffle']}), and another order would lose and repeat samples. Resume "
                "with those, and change them at an epoch's start"
            )
        if in_step is not None:
            resume.check_in_step(in_step, steps, saved, mine, cursor.options.rank)
        if saved == mine:
            return (
                epoch,
                self._replay(epoch, start, steps, done, cursor.options.rank),
                (steps, done),
                None,
            )
        if start.prelude is not None:
            raise ValueError(
                f"{cursor.owner}: the state was saved inside what a resume under other settings "
                "re-planned, and the settings changed again; resume with the settings it was "
                "saved with until the next segment, then change them"
            )
        start.prelude = {
            "settings": saved,
            "segment": start.index,
            "begin": start.begin,
            "steps_before": start.steps_before,
            "steps": steps,
            "micro_batches": done,
        }
        start.first = self._prelude_segment(epoch, start.prelude)
        start.left = start.first is not None
        return epoch, start, (steps, 0), None

    def _checked_segment(self, segment, steps: int) -> Start:
        """The ``'segment'`` of a state as a ``Start``, each field checked."""
        keys = {"index", "begin", "steps_before"}
        if not isinstance(segment, dict) or not keys <= set(segment) <= keys | {"prelude"}:
            raise ValueError(
                "sampler state: 'segment' must be {'index', 'begin', 'steps_before'[, "
                f"'prelude']}}, got {segment!r}"
            )
        index = resume.count_field(segment, "index")
        begin = resume.count_field(segment, "begin")
        before = resume.count_field(segment, "steps_before")
        if begin >= self.num_samples or before > steps:
            raise ValueError(
                f"sampler state: segment at position {begin} with {before} steps before it does "
                f"not hold step {steps} of {self.num_samples} samples: the state is corrupt"
            )
        prelude = segment.get("prelude")
        if prelude is not None:
            prelude = resume.checked_prelude(prelude, self.mine)
        return Start(index, begin, before, prelude)

    def _replay(self, epoch: int, start: Start, steps: int, done: int, rank: int) -> Start:
        """``start`` with its segment planned: the saved position must be in it."""
        seg = next(self.from_start(epoch, start), None)
        inside = seg is not None and steps <= seg.steps_end
        if inside and done:
            t = steps - seg.steps_before
            inside = t < seg.plan.num_steps and done < seg.plan.micro_batches_in_step(t, rank)
        if not inside:
            raise ValueError(
                f"sampler state: step {steps} (micro-batch {done} in it) is not in the segment "
                "it names: the state is corrupt"
            )
        start.first, start.left = seg, not (seg.last and steps == seg.steps_end)
        return start
