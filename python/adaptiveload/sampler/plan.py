"""The plan of one epoch for all ranks (``Plan``), a run of an epoch's steps planned together
(``Segment``: the whole epoch, or one streamed segment), where a rank stands in its stream
(``place_of``), and one batch of a loader with where it stands in its optimizer step
(``MicroBatch``). The index arithmetic of the plan's arrays is the
C++ planner's (csrc/sampler/plan_layout.h, bound as ``_sampler.PlanLayout``): ``Plan`` holds the
arrays and asks it."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from numbers import Integral
from typing import Any, NamedTuple

import numpy as np

from adaptiveload import _sampler


class MicroBatch(NamedTuple):
    """One batch of a loader, with where it stands in its optimizer step (``micro_batches``)."""

    #: what the loader yielded (the collated samples)
    batch: Any
    #: the optimizer step of the epoch's plan
    step: int
    #: this rank's micro-batch ``index`` of the step, ``0 <= index < count``
    index: int
    #: this rank's micro-batches in the step: K, or any count >= 1 with uneven counts
    count: int
    #: tokens and samples of the step over all ranks: the normalizers of a summed loss
    #: (``loss_scale`` gives the factor under DDP's or FSDP2's averaging)
    step_tokens: int
    step_samples: int
    #: sequence parallelism: the ranks that process this micro-batch together (1: this rank
    #: alone), and this rank's place among them; it holds share ``member`` of ``degree`` of
    #: every sample's tokens (``adaptiveload.parallel.token_share``)
    degree: int = 1
    member: int = 0
    rank: int = 0

    @property
    def last(self) -> bool:
        """The rank's last micro-batch of the step: synchronize gradients and step here."""
        return self.index == self.count - 1

    def loss_scale(self, world_size: int, per: str = "token") -> float:
        """The factor by which to multiply this micro-batch's loss, summed over its tokens
        (``per="token"``) or samples (``per="sample"``), before ``backward()``:
        ``world_size / step_tokens`` (or ``/ step_samples``).

        DDP and FSDP2 average gradients over the ``world_size`` ranks; with this factor that
        average is the gradient of the step's mean loss over all ranks' tokens (samples), as
        one process over the whole step would get, however unevenly the ranks' micro-batches
        are filled. A loop that sums gradients itself (an all-reduce with ``SUM``) divides
        by ``step_tokens`` (``step_samples``) alone. With sequence parallelism each member
        sums the loss of its share of the tokens, so the members' gradients add up to the
        micro-batch's; per sample, each member's loss must likewise be its share of every
        sample's loss, not that loss in full."""
        if isinstance(world_size, bool) or not isinstance(world_size, Integral) or world_size < 1:
            raise ValueError(
                f"world_size must be the number of ranks gradients are averaged over (an int "
                f">= 1), got {world_size!r}"
            )
        if per == "token":
            return int(world_size) / self.step_tokens
        if per == "sample":
            return int(world_size) / self.step_samples
        raise ValueError(f"per must be 'token' or 'sample', got {per!r}")

    @property
    def group_ranks(self) -> range:
        """The ranks that process this micro-batch together, this one among them."""
        first = self.rank - self.member
        return range(first, first + self.degree)


@dataclass
class Plan:
    """One epoch for all ranks. Micro-batch ``m = (step * W + rank) * K + k`` holds
    ``samples[offsets[m]:offsets[m+1]]``; ``costs[m]`` is its predicted cost and
    ``tokens[m]`` its token count.

    With uneven counts (``rank_offsets`` set), rank ``r`` takes any number >= 1 of step
    ``t``'s ``W * K`` micro-batches: ``m = rank_offsets[t * W + r] + k`` for
    ``k < micro_batches_in_step(t, r)``. Either way step ``t`` is micro-batches
    ``[t * W * K, (t + 1) * W * K)``, except with sequence parallelism (``degrees``), which
    lists a micro-batch of degree d once in each of its d ranks' lists: there step ``t`` is
    ``[step_begin(t), step_begin(t + 1))``."""

    num_replicas: int
    micro_batches_per_step: int
    num_steps: int
    samples: np.ndarray
    offsets: np.ndarray
    costs: np.ndarray
    tokens: np.ndarray
    padding: np.ndarray
    max_tokens: int
    max_cost: float | None
    num_padded_samples: int = 0
    num_dropped_samples: int = 0
    num_split_micro_batches: int = 0
    skipped: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    #: blocks checkpointed per micro-batch, with a memory policy (None without one)
    checkpointed: np.ndarray | None = None
    #: uneven counts only: ``num_steps * W + 1`` micro-batch ids, those of (step t, rank r)
    #: from ``rank_offsets[t * W + r]`` to ``rank_offsets[t * W + r + 1]``
    rank_offsets: np.ndarray | None = None
    #: balanced plans only: per window of ``lookahead_steps`` steps, the cost strata its steps
    #: were mixed from (1: the whole window mixed; its step count: steps of similar cost)
    window_strata: np.ndarray | None = None
    #: sequence parallelism only: per listed micro-batch, its degree d and this listing's place
    #: in its group of d ranks. A micro-batch of degree d is listed once per member rank, with
    #: that member's share of its tokens and cost; member 0's listing stands for it
    degrees: np.ndarray | None = None
    members: np.ndarray | None = None

    def __post_init__(self) -> None:
        self._layout = _sampler.PlanLayout(
            self.num_replicas, self.micro_batches_per_step, self.num_steps, self.rank_offsets
        )

    @property
    def uneven_counts(self) -> bool:
        return self.rank_offsets is not None

    @property
    def num_micro_batches(self) -> int:
        return len(self.offsets) - 1

    @property
    def micro_batches_per_rank(self) -> int:
        """``num_steps * K``: each rank's micro-batches, or their average with uneven counts
        (``num_rank_micro_batches(rank)`` gives a rank's own)."""
        return self.num_steps * self.micro_batches_per_step

    def micro_batches_in_step(self, step: int, rank: int) -> int:
        """Micro-batches of ``rank`` in ``step``: K, or any count >= 1 with uneven counts."""
        return self._layout.micro_batches_in_step(step, rank)

    def rank_step_starts(self, rank: int) -> np.ndarray:
        """``num_steps + 1`` positions in ``rank``'s stream: its micro-batches before each
        step, and in all."""
        return self._layout.rank_step_starts(rank)

    def num_rank_micro_batches(self, rank: int) -> int:
        return int(self.rank_step_starts(rank)[-1])

    def micro_batch_id(self, step: int, rank: int, k: int = 0) -> int:
        """Index ``m`` (into ``costs``, ``tokens``, ``offsets``) of ``rank``'s ``k``-th
        micro-batch of ``step``."""
        return self._layout.micro_batch_id(step, rank, k)

    def micro_batch(self, step: int, rank: int, k: int = 0) -> np.ndarray:
        m = self.micro_batch_id(step, rank, k)
        return self.samples[self.offsets[m] : self.offsets[m + 1]]

    def rank_micro_batches(self, rank: int, start: int = 0) -> Iterator[np.ndarray]:
        """This rank's micro-batches in order, step after step, from the ``start``-th."""
        starts = self.rank_step_starts(rank)
        step = int(np.searchsorted(starts, start, side="right")) - 1
        for t in range(max(step, 0), self.num_steps):
            for k in range(max(start - int(starts[t]), 0), int(starts[t + 1] - starts[t])):
                yield self.micro_batch(t, rank, k)

    def rank_sums(self, values: np.ndarray) -> np.ndarray:
        """Sums of ``values`` (one per micro-batch) per step and rank, shape (num_steps, W), in
        either layout (``rank_sums(np.ones(num_micro_batches))``: the counts); int64 values
        give int64 sums, any other float64."""
        values = np.asarray(values)
        dtype = np.int64 if values.dtype == np.int64 else np.float64
        return self._layout.rank_sums(np.ascontiguousarray(values, dtype=dtype))

    def rank_costs(self) -> np.ndarray:
        """Predicted cost of each rank in each step, shape (num_steps, W)."""
        return self.rank_sums(self.costs)

    def replay(self, times) -> tuple[np.ndarray, np.ndarray]:
        """Step times when each rank runs its listings in plan order, ``times[m]`` each, and a
        split micro-batch starts when its last member is free (its members' listings in one
        group, none of them before); returns (makespans, busy rank time per step)."""
        W = self.num_replicas
        spans, busy = np.zeros(self.num_steps), np.zeros(self.num_steps)
        for t in range(self.num_steps):
            lists = [
                [self.micro_batch_id(t, r, k) for k in range(self.micro_batches_in_step(t, r))]
                for r in range(W)
            ]
            clock, at = [0.0] * W, [0] * W
            while any(at[r] < len(lists[r]) for r in range(W)):
                moved = False
                for r in range(W):
                    if at[r] >= len(lists[r]):
                        continue
                    m = lists[r][at[r]]
                    d = 1 if self.degrees is None else int(self.degrees[m])
                    if d == 1:
                        clock[r] += times[m]
                        busy[t] += times[m]
                        at[r] += 1
                        moved = True
                        continue
                    first = r - int(self.members[m])
                    members = range(first, first + d)
                    ids = [lists[q][at[q]] if at[q] < len(lists[q]) else -1 for q in members]
                    mine = self.samples[self.offsets[m] : self.offsets[m + 1]]
                    same = all(
                        i >= 0
                        and self.members[i] == q - first
                        and np.array_equal(
                            self.samples[self.offsets[i] : self.offsets[i + 1]], mine
                        )
                        for i, q in zip(ids, members, strict=True)
                    )
                    if not same or r != first:
                        continue
                    start = max(clock[q] for q in members)
                    share = max(times[i] for i in ids)
                    for q, i in zip(members, ids, strict=True):
                        clock[q] = start + share
                        busy[t] += times[i]
                        at[q] += 1
                    moved = True
                if not moved:
                    raise RuntimeError(
                        f"step {t}: the ranks' lists deadlock (a group out of order)"
                    )
            spans[t] = max(clock)
        return spans, busy

    def step_tokens(self) -> np.ndarray:
        """Tokens of each step over all ranks, shape (num_steps,): the normalizer of a loss
        summed over tokens, the same on every rank."""
        return self.rank_sums(self.tokens).sum(axis=1)

    def step_samples(self) -> np.ndarray:
        """Samples of each step over all ranks (padding repeats included; a split sample
        once), shape (num_steps,)."""
        sizes = self.micro_batch_sizes()
        if self.members is not None:
            sizes = np.where(self.members == 0, sizes, 0)
        return self.rank_sums(sizes).sum(axis=1)

    def step_begin(self, step: int) -> int:
        """First id of ``step``'s micro-batches (``num_steps``: the number of ids): ``step *
        W * K``, except with sequence parallelism, which lists a micro-batch per member."""
        return self._layout.step_begin(step)

    def step_micro_batches(self, steps: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """``(ids, step)``: the micro-batches of the first ``steps`` steps (default all), each
        once (member 0's listing of a split one), and the step of each."""
        steps = self.num_steps if steps is None else steps
        end = self.step_begin(steps)
        ids = np.arange(end, dtype=np.int64)
        if self.rank_offsets is None:
            step = ids // (self.num_replicas * self.micro_batches_per_step)
        else:  # step t starts at its rank 0's first id
            starts = self.rank_offsets[: steps * self.num_replicas + 1 : self.num_replicas]
            step = np.repeat(np.arange(steps, dtype=np.int64), np.diff(starts))
        if self.members is not None:
            lead = self.members[:end] == 0
            ids, step = ids[lead], step[lead]
        return ids, step

    def micro_batch_sizes(self) -> np.ndarray:
        return np.diff(self.offsets)

    def consumed(self, micro_batches_done: int, n: int) -> np.ndarray:
        """Samples of the first ``micro_batches_done`` micro-batches of every rank (padding
        repeats excluded), as ``n`` flags."""
        return self._sample_flags(self._layout.first_of_every_rank(micro_batches_done), n)

    def consumed_steps(self, steps_done: int, n: int) -> np.ndarray:
        """Samples of the first ``steps_done`` steps of all ranks (padding repeats excluded),
        as ``n`` flags: micro-batches ``[0, step_begin(steps_done))``, in any layout."""
        end = self.step_begin(steps_done)
        return self._sample_flags(np.arange(end, dtype=np.int64), n)

    def _sample_flags(self, ids: np.ndarray, n: int) -> np.ndarray:
        """``n`` flags, set for the samples of micro-batches ``ids`` (padding repeats
        excluded)."""
        return _sampler.mark_samples(ids, self.offsets, self.samples, self.padding, n)


@dataclass
class Segment:
    """Steps ``[steps_before, steps_before + plan.num_steps)`` of an epoch, planned together: the
    whole epoch's plan (a planned sampler's only segment), or positions ``[begin, end)`` of a
    streamed epoch's permutation."""

    plan: Plan
    steps_before: int = 0
    index: int = 0
    begin: int = 0
    end: int = 0
    #: the epoch's last segment
    last: bool = True
    #: streamed only: what a resume under other settings re-planned of an earlier segment,
    #: which this one begins with (None: none)
    prelude: dict | None = None
    _totals: tuple | None = field(default=None, repr=False)

    @property
    def steps_end(self) -> int:
        return self.steps_before + self.plan.num_steps

    def step_totals(self) -> tuple[np.ndarray, np.ndarray]:
        """Tokens and samples of each of its steps over all ranks (computed once)."""
        if self._totals is None:
            self._totals = (self.plan.step_tokens(), self.plan.step_samples())
        return self._totals


def place_of(plan: Plan, rank: int, position: int) -> tuple[int, int]:
    """Where ``position`` of ``rank``'s stream of ``plan`` is: ``(step, micro-batches of it
    done)``; the end of the stream is ``(num_steps, 0)``."""
    starts = plan.rank_step_starts(rank)
    step = int(np.searchsorted(starts, position, side="right")) - 1
    step = min(step, plan.num_steps)
    return step, int(position - starts[step])
