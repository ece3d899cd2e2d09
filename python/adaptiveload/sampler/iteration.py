"""A rank's stream against its plan, kept on the sampler's ``Cursor`` (cursor.py), for either
plan source: the micro-batches a pass hands out (``rank_stream``, or ``all_ranks_stream`` for
accelerate's shard), the steps of a pass (``rank_steps``) and ``micro_batches`` (each batch of a
loader with its step, checked against the plan)."""

from __future__ import annotations

from collections.abc import Iterator

from adaptiveload.sampler.cursor import Cursor
from adaptiveload.sampler.plan import MicroBatch


def _after(step: int, k: int, count: int) -> tuple[int, int]:
    """The place after micro-batch ``k`` of a step of ``count``: a step done is the next's start."""
    return (step + 1, 0) if k + 1 == count else (step, k + 1)


def rank_stream(cursor: Cursor) -> Iterator[list[int]]:
    """The rank's micro-batches from the cursor's start, segment after segment; the pass is
    done when the last is handed out."""
    rank = cursor.options.rank
    first, done = cursor.start
    for seg in cursor.segments():
        plan = seg.plan
        for t in range(max(first - seg.steps_before, 0), plan.num_steps):
            step = seg.steps_before + t
            count = plan.micro_batches_in_step(t, rank)
            for k in range(done if step == first else 0, count):
                last = seg.last and t == plan.num_steps - 1 and k == count - 1
                cursor.handed(_after(step, k, count), last)
                yield plan.micro_batch(t, rank, k).tolist()
    cursor.finish()


def all_ranks_stream(cursor: Cursor) -> Iterator[list[int]]:
    """accelerate's ``BatchSamplerShard`` keeps batch ``j`` of its source on process
    ``j % num_processes``: every rank's micro-batches interleaved, from the cursor's start, so
    that each process keeps exactly its own (a whole-epoch plan of K per rank and step)."""
    plan = cursor.plan()
    k = plan.micro_batches_per_step
    first, done = cursor.start
    for i in range(first * k + done, plan.micro_batches_per_rank):
        for r in range(cursor.options.num_replicas):
            yield plan.micro_batch(i // k, r, i % k).tolist()
        cursor.handed(_after(i // k, i % k, k))
    cursor.finish()


def rank_steps(cursor: Cursor, segments) -> Iterator[tuple[int, int]]:
    """``(step, micro-batches of the rank in it)`` of ``segments`` from the cursor's start
    (after a resume inside a step, the first count is what is left of it)."""
    rank = cursor.options.rank
    first, done = cursor.start
    for seg in segments:
        for t in range(max(first - seg.steps_before, 0), seg.plan.num_steps):
            step = seg.steps_before + t
            count = seg.plan.micro_batches_in_step(t, rank)
            yield step, count - (done if step == first else 0)


def micro_batches(cursor: Cursor, loader) -> Iterator[MicroBatch]:
    """``sampler.micro_batches(loader)`` once the loader is known to draw from the sampler
    (readers.check_source): see there. The cursor counts the batches received."""
    end = object()
    cursor.counting = True  # before the loader's workers start drawing
    try:
        it = iter(loader)
        batch = next(it, end)  # starts the sampler's pass (a resume, or the epoch again)
    finally:
        cursor.counting = False
    rank = cursor.options.rank
    step, k = cursor.start
    while batch is not end:
        seg = cursor.segment_of(step)
        if seg is None:
            raise RuntimeError(
                f"micro_batches: the loader yielded more batches than this rank's plan holds "
                f"(rank {rank}): it does not draw from this sampler alone"
            )
        plan, t = seg.plan, step - seg.steps_before
        count = plan.micro_batches_in_step(t, rank)
        tokens, samples = seg.step_totals()
        m = plan.micro_batch_id(t, rank, k)
        split = plan.degrees is not None
        degree, member = (int(plan.degrees[m]), int(plan.members[m])) if split else (1, 0)
        place = _after(step, k, count)
        cursor.received(place)
        yield MicroBatch(
            batch, step, k, count, int(tokens[t]), int(samples[t]), degree, member, rank
        )
        step, k = place
        batch = next(it, end)
    if k or cursor.segment_of(step) is not None:
        raise RuntimeError(
            f"micro_batches: the loader ended in step {step} after {k} of rank {rank}'s "
            "micro-batches there: it did not yield every batch of this sampler's pass"
        )
