"""A rank's stream against its plan, kept on the sampler's ``Cursor`` (cursor.py): the
micro-batches a pass hands out (``rank_stream``, or ``all_ranks_stream`` for accelerate's
shard), ``micro_batches`` (each batch of a loader with its step, checked against the plan) and
``position_of`` (the position a state is taken at)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import numpy as np

from adaptiveload.sampler.checks import int_arg
from adaptiveload.sampler.plan import MicroBatch, Plan

if TYPE_CHECKING:  # cursor.py imports this module
    from adaptiveload.sampler.cursor import Cursor


def rank_stream(cursor: Cursor, plan: Plan) -> Iterator[list[int]]:
    """The rank's micro-batches of ``plan`` from the cursor's start; the pass is done when
    the last is handed out."""
    rank = cursor.options.rank
    end = plan.num_rank_micro_batches(rank)
    if cursor.start >= end:
        cursor.finish()
    for batch in plan.rank_micro_batches(rank, cursor.start):
        cursor.handed(end)
        yield batch.tolist()


def all_ranks_stream(cursor: Cursor, plan: Plan) -> Iterator[list[int]]:
    """accelerate's ``BatchSamplerShard`` keeps batch ``j`` of its source on process
    ``j % num_processes``: every rank's micro-batches interleaved, from the cursor's start, so
    that each process keeps exactly its own."""
    k = plan.micro_batches_per_step
    for i in range(cursor.start, plan.micro_batches_per_rank):
        for r in range(cursor.options.num_replicas):
            yield plan.micro_batch(i // k, r, i % k).tolist()
        cursor.handed()
    cursor.finish()


def micro_batches(cursor: Cursor, loader) -> Iterator[MicroBatch]:
    """``sampler.micro_batches(loader)`` once the loader is known to draw from the sampler
    (readers.check_source): see there. The cursor counts the batches received."""
    end = object()
    it = iter(loader)
    first = next(it, end)  # starts the sampler's pass (a resume, or the epoch again)
    plan, rank = cursor.plan(), cursor.options.rank
    tokens, samples = plan.step_tokens(), plan.step_samples()
    first_step, done = place_of(plan, rank, cursor.start)
    received = 0
    for step in range(first_step, plan.num_steps):
        count = plan.micro_batches_in_step(step, rank)
        for k in range(done if step == first_step else 0, count):
            batch, first = (first, end) if first is not end else (next(it, end), end)
            if batch is end:
                raise RuntimeError(
                    f"micro_batches: the loader ended in step {step} after {k} of rank "
                    f"{rank}'s {count} micro-batches there: it did not yield every batch of "
                    "this sampler's pass"
                )
            received += 1
            cursor.received(received)  # the pass began at the first batch
            m = plan.micro_batch_id(step, rank, k)
            split = plan.degrees is not None
            degree, member = (plan.degrees[m], plan.members[m]) if split else (1, 0)
            yield MicroBatch(
                batch, step, k, count, int(tokens[step]), int(samples[step]), int(degree),
                int(member), rank,
            )  # fmt: skip
    if first is not end or next(it, end) is not end:
        raise RuntimeError(
            f"micro_batches: the loader yielded more batches than this rank's plan holds "
            f"({plan.num_rank_micro_batches(rank)} for rank {rank}): it does not draw from "
            "this sampler alone"
        )


def place_of(plan: Plan, rank: int, position: int) -> tuple[int, int]:
    """Where ``position`` of ``rank``'s stream is: ``(step, micro-batches of it done)``; the
    end of the stream is ``(num_steps, 0)``."""
    starts = plan.rank_step_starts(rank)
    step = int(np.searchsorted(starts, position, side="right")) - 1
    step = min(step, plan.num_steps)
    return step, int(position - starts[step])


def _before_start(name: str, value, start_step: int, start: int | None) -> ValueError:
    at = f"step {start_step}" + ("" if start is None else f", micro-batch {start}")
    return ValueError(
        f"{name}={value!r} is before the resumed position ({at}): count steps from the "
        "epoch's start, as start_step does"
    )


def _position_by_steps(plan: Plan, rank: int, start: int, drawn: int, steps_done, mbd):
    """``position_of`` with uneven counts: positions go by steps, and a known position inside
    a step is this rank's own (``in_step``)."""
    if mbd is not None:
        raise ValueError(
            "state_dict: with uneven_counts the ranks' micro-batch counts differ, so "
            "positions go by steps: pass steps_done"
        )
    start_step, start_done = place_of(plan, rank, start)
    if steps_done is not None:
        steps, in_step = int_arg("steps_done", steps_done, 0), 0
        if steps < start_step or (steps == start_step and start_done):
            # A resume inside step `start_step` cannot save that step's start: the state
            # would train again what the resumed position left behind.
            raise _before_start("steps_done", steps, start_step, start if start_done else None)
        if steps > plan.num_steps:
            raise ValueError(
                f"steps_done must be in [0, {plan.num_steps}] for this plan, got {steps}"
            )
    else:
        steps, in_step = place_of(plan, rank, drawn)
    return steps * plan.micro_batches_per_step, steps, in_step


def position_of(
    plan: Plan, rank: int, start: int, drawn: int, steps_done, mbd, uneven: bool
) -> tuple[int, int | None, int]:
    """The position of a state: ``(micro-batches done, steps done, this rank's micro-batches
    done inside the next step)``, the last two only with uneven counts (else None and 0).
    ``start``: where this pass began in the rank's stream; ``drawn``: where it is (the
    position without ``steps_done`` or ``mbd``, micro_batches_done)."""
    if uneven:
        return _position_by_steps(plan, rank, start, drawn, steps_done, mbd)
    end, k = plan.micro_batches_per_rank, plan.micro_batches_per_step
    if steps_done is not None and mbd is not None:
        raise ValueError("state_dict: pass steps_done or micro_batches_done, not both")
    if steps_done is not None:
        position = int_arg("steps_done", steps_done, 0) * k
        name, value, unit = "steps_done", steps_done, k
    elif mbd is not None:
        position = int_arg("micro_batches_done", mbd, 0)
        name, value, unit = "micro_batches_done", mbd, 1
    else:
        position, name, value, unit = drawn, "position", drawn, 1
    if position < start:
        raise _before_start(name, value, start // k, start)
    if position > end:
        raise ValueError(f"{name} must be in [0, {end // unit}] for this plan, got {value!r}")
    return position, None, 0
