"""AdaptiveLoad against the baselines the CLI and the benchmarks report: one epoch planned by
``AdaptiveBatchSampler``, equal-token buckets and the paper's rule, each with its balance
report."""

from __future__ import annotations

from typing import NamedTuple

from adaptiveload.cost import CostModel
from adaptiveload.report import BalanceReport, balance_report, rescore
from adaptiveload.sampler import AdaptiveBatchSampler, EqualTokenBatchSampler, Plan

# The samplers compare_samplers builds, in its order: name -> short label for tables.
COMPARED_SAMPLERS = {
    "AdaptiveLoad": "AdaptiveLoad",
    "equal-token buckets": "equal-token",
    "paper rule (S^1.5, no balancing)": "paper rule",
}


class Compared(NamedTuple):
    """One sampler of ``compare_samplers``, its plan and the plan's balance report (with the
    plan's composition)."""

    sampler: AdaptiveBatchSampler | EqualTokenBatchSampler
    plan: Plan
    report: BalanceReport


def compare_samplers(
    seq_lens,
    max_tokens: int,
    *,
    cost_model: CostModel,
    group_keys=None,
    num_replicas: int,
    micro_batches_per_step: int = 1,
    seed: int = 0,
    epoch: int = 0,
    max_cost: float | None = None,
    lookahead_steps: int = 64,
    max_batch_size: int | None = None,
    mix_tolerance: float | None = None,
    sequence_parallel: int = 1,
    uneven_counts: bool = False,
    composition: str | None = None,
) -> dict[str, Compared]:
    """Plan one epoch (rank 0's view; plans are the same on every rank) with three samplers
    at the same ``max_tokens``, all costed with ``cost_model``:

    - "AdaptiveLoad": ``AdaptiveBatchSampler`` with ``cost_model``, ``max_cost``,
      ``lookahead_steps``, ``composition`` and ``mix_tolerance`` (None: the defaults), and with
      ``sequence_parallel`` > 1 micro-batches split over up to that many ranks
      (``uneven_counts=True``, as sequence parallelism needs), and ``uneven_counts``;
    - "equal-token buckets": ``EqualTokenBatchSampler`` (``floor(max_tokens / S)`` samples
      per micro-batch, ranks draw independently);
    - "paper rule (S^1.5, no balancing)": ``AdaptiveBatchSampler`` with
      ``CostModel.power(1.5)``, its default cap and ``balance=False``, the plan then
      rescored with ``cost_model`` (its report has no cost cap).

    ``max_batch_size`` caps the samples per micro-batch of all three (1: the batch-size-1
    pipelines, whose default the equal-token sampler then is: shuffled samples, one each).

    Each report holds its plan's composition, with ``group_keys`` as the groups (the sequence
    lengths without keys).

    Returns ``{name: Compared(sampler, plan, report)}`` in that order (``COMPARED_SAMPLERS``
    gives each name a short label).
    """
    common = dict(
        group_keys=group_keys,
        num_replicas=num_replicas,
        rank=0,
        micro_batches_per_step=micro_batches_per_step,
        seed=seed,
        max_batch_size=max_batch_size,
    )
    ours = AdaptiveBatchSampler(
        seq_lens,
        max_tokens,
        max_cost=max_cost,
        cost_model=cost_model,
        lookahead_steps=lookahead_steps,
        mix_tolerance=mix_tolerance,
        composition=composition,
        uneven_counts=uneven_counts or sequence_parallel > 1,
        **(dict(sequence_parallel=sequence_parallel) if sequence_parallel > 1 else {}),
        **common,
    )
    equal = EqualTokenBatchSampler(seq_lens, max_tokens, cost_model=cost_model, **common)
    paper = AdaptiveBatchSampler(
        seq_lens, max_tokens, cost_model=CostModel.power(1.5), balance=False, **common
    )
    # The samplers' own keys: dense ids, or None when the sequence length is the key.
    labels = ours.group_keys if ours.group_keys is not None else ours.seq_lens
    out = {}
    for name, sampler in zip(COMPARED_SAMPLERS, (ours, equal, paper), strict=True):
        sampler.set_epoch(epoch)
        plan = sampler.plan()
        if sampler is paper:
            plan = rescore(plan, sampler.seq_lens, cost_model)
        out[name] = Compared(sampler, plan, balance_report(plan, labels, sampler.seq_lens))
    return out
