"""Plan sources: where a sampler's plans come from. The pass machinery (cursor.py,
iteration.py, base.py) is one; a sampler's source answers what differs:

- ``segments(cursor)``: the epoch's segments from the cursor's token (``plan.Segment``), and
  ``segment_at(cursor, step)``: the one holding a step where the cursor did not keep it;
- ``whole_plan(cursor)``: the whole epoch's plan, where the source has one;
- ``resume_key(cursor)``: where the cursor resumes, for the ranks' agreement;
- ``remaining(cursor)``: whether a resumed position has micro-batches left;
- ``state(cursor, mine, drawn, steps_done, mbd)`` and ``load(cursor, state, mine)``: the
  source's part of a saved state (resume.py holds the format both share).

``WholeEpoch`` plans the epoch at once (``AdaptiveBatchSampler``, ``EqualTokenBatchSampler``);
``stream.Streamed`` plans segments as the loop reaches them (``StreamingBatchSampler``)."""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator

from adaptiveload.sampler import resume
from adaptiveload.sampler.plan import Plan, Segment, place_of


def stream_position(plan: Plan, rank: int, place: tuple[int, int]) -> int:
    """The micro-batch of ``rank``'s stream of ``plan`` at ``place``."""
    return int(plan.rank_step_starts(rank)[place[0]]) + place[1]


class WholeEpoch:
    """The epoch's plan at once, as one segment. A cursor's token is the samples a resume
    under other settings left out of the plan (a flag per sample), or None.

    Args:
        make_plan: ``(epoch, excluded) -> Plan``, the epoch's plan without the samples
            ``excluded`` (None: none).
        data: the digest of the sampler's lengths and group keys; ``num_samples``: their count.
    """

    def __init__(self, make_plan: Callable[..., Plan], data: str, num_samples: int):
        self.make_plan = make_plan
        self.data = data
        self.num_samples = num_samples

    def whole_plan(self, cursor) -> Plan:
        return self.make_plan(cursor.epoch, cursor.token)

    def segments(self, cursor) -> Iterator[Segment]:
        yield Segment(cursor.plan(), end=self.num_samples)

    def segment_at(self, cursor, step: int) -> Segment | None:
        seg = Segment(cursor.plan(), end=self.num_samples)
        return seg if step < seg.steps_end else None

    def left(self, cursor) -> int:
        """The rank's micro-batches from the cursor's start to the plan's end."""
        plan, rank = cursor.plan(), cursor.options.rank
        return plan.num_rank_micro_batches(rank) - stream_position(plan, rank, cursor.start)

    def remaining(self, cursor) -> bool:
        return self.left(cursor) > 0

    def resume_key(self, cursor) -> str:
        if cursor.token is None and cursor.start == (0, 0):
            return "none"
        excluded = cursor.token
        h = hashlib.blake2b(excluded.tobytes() if excluded is not None else b"")
        # With uneven counts the ranks' stream positions differ; their step does not.
        o = cursor.options
        where = (
            f"step {cursor.start[0]}"
            if o.uneven_counts
            else stream_position(cursor.plan(), o.rank, cursor.start)
        )
        return f"{h.hexdigest()[:16]}@{where}"

    def state(self, cursor, mine: dict, drawn, steps_done, mbd) -> dict:
        plan, o = cursor.plan(), cursor.options
        start = stream_position(plan, o.rank, cursor.start)
        drawn = stream_position(plan, o.rank, drawn)
        position, steps, in_step = resume.position_of(
            plan, o.rank, start, drawn, steps_done, mbd, o.uneven_counts
        )
        n = self.num_samples
        if steps is None:
            consumed = plan.consumed(position, n)
        else:
            consumed = plan.consumed_steps(steps, n)
        state = resume.make_state(mine, cursor.epoch, cursor.token, position, consumed)
        return resume.with_steps(state, steps, in_step, o.rank)

    def load(self, cursor, state: dict, mine: dict):
        """``(epoch, token, start, plan)`` of ``state``; ``plan`` None where not made yet."""
        o = cursor.options
        resume.check_keys(state, mine)
        saved = resume.read_state(state, mine, self.data, self.num_samples)
        excluded, start, plan = resume.continue_at(
            saved,
            mine,
            lambda ex: self.make_plan(saved.epoch, ex),
            o.rank,
            o.micro_batches_per_step,
            o.uneven_counts,
        )
        place = (0, 0) if plan is None else place_of(plan, o.rank, start)
        return saved.epoch, excluded, place, plan
