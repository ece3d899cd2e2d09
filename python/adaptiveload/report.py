"""How well a plan balances the ranks, from its predicted costs, and how representative its
steps are of the data (``compare.py`` compares AdaptiveLoad with the baselines). A plan is any
``adaptiveload.sampler.Plan``; this module imports no sampler, so that the samplers can report
with it."""

from __future__ import annotations

import dataclasses
from dataclasses import asdict, dataclass

import numpy as np

from adaptiveload.composition import Composition, step_composition


@dataclass
class BalanceReport:
    """Per optimizer step t with rank loads L_t,r (predicted cost of rank r's micro-batches):

    - ``imbalance``: mean over steps of 1 - mean_r(L) / max_r(L), the share of GPU time
      spent waiting at the gradient sync;
    - ``spread``: mean over steps of (max_r(L) - min_r(L)) / max_r(L);
    - ``epoch_time``: sum over steps of max_r(L), the predicted epoch time (cost units);
    - ``ideal_time``: sum over steps of mean_r(L), the same work perfectly balanced
      within each step (the plan's own perfect-balance bound);
    - ``token_utilization``: mean over micro-batches of tokens / max_tokens;
    - ``composition``: how representative the steps are of the epoch's groups, against
      shuffles of the same micro-batches (``adaptiveload.composition.Composition``); None
      unless ``balance_report`` was given the labels and sequence lengths.
    """

    num_steps: int
    num_replicas: int
    micro_batches_per_step: int
    num_micro_batches: int
    imbalance: float
    spread: float
    epoch_time: float
    ideal_time: float
    token_utilization: float
    max_tokens: int
    max_cost: float | None
    over_token_cap: int
    over_cost_cap: int
    num_padded_samples: int
    num_dropped_samples: int
    num_split_micro_batches: int
    num_skipped_samples: int
    composition: Composition | None = None

    @property
    def balance_efficiency(self) -> float:
        """ideal_time / epoch_time: 1.0 means no rank ever waits."""
        return self.ideal_time / self.epoch_time if self.epoch_time else 1.0

    def to_dict(self) -> dict:
        d = asdict(self)
        d["balance_efficiency"] = self.balance_efficiency
        if self.composition is not None:
            d["composition"] = self.composition.to_dict()
        return d

    def __str__(self) -> str:
        text = (
            f"steps={self.num_steps} W={self.num_replicas} K={self.micro_batches_per_step} "
            f"imbalance={self.imbalance:.1%} spread={self.spread:.1%} "
            f"epoch_time={self.epoch_time:.4g} (ideal {self.ideal_time:.4g}) "
            f"token_util={self.token_utilization:.1%}"
        )
        return text if self.composition is None else f"{text}; {self.composition}"


def balance_report(plan, labels=None, seq_lens=None) -> BalanceReport:
    """Summarize ``plan`` (see ``BalanceReport`` for the definitions).

    With ``labels`` (one group label per dataset index: the sampler's ``group_keys``, shapes,
    or image vs video) and ``seq_lens`` (tokens per dataset index), the report also holds the
    steps' composition (``step_composition(plan, labels, seq_lens)``).
    """
    if (labels is None) != (seq_lens is None):
        raise ValueError(
            "labels and seq_lens go together: give both (the report then holds the steps' "
            "composition) or neither"
        )
    if plan.num_steps == 0:
        loads = np.zeros((0, plan.num_replicas))
    else:
        loads = plan.rank_costs()
    mx = loads.max(axis=1) if len(loads) else np.zeros(0)
    mean = loads.mean(axis=1) if len(loads) else np.zeros(0)
    mn = loads.min(axis=1) if len(loads) else np.zeros(0)
    safe = np.where(mx > 0, mx, 1.0)
    cap = plan.max_cost
    return BalanceReport(
        num_steps=plan.num_steps,
        num_replicas=plan.num_replicas,
        micro_batches_per_step=plan.micro_batches_per_step,
        num_micro_batches=plan.num_micro_batches,
        imbalance=float(np.mean(1 - mean / safe)) if len(mx) else 0.0,
        spread=float(np.mean((mx - mn) / safe)) if len(mx) else 0.0,
        epoch_time=float(mx.sum()),
        ideal_time=float(mean.sum()),
        token_utilization=float(np.mean(plan.tokens / plan.max_tokens))
        if len(plan.tokens)
        else 0.0,
        max_tokens=plan.max_tokens,
        max_cost=cap,
        over_token_cap=int(np.sum(plan.tokens > plan.max_tokens)),
        over_cost_cap=int(np.sum(plan.costs > cap * (1 + 1e-12))) if cap is not None else 0,
        num_padded_samples=plan.num_padded_samples,
        num_dropped_samples=plan.num_dropped_samples,
        num_split_micro_batches=plan.num_split_micro_batches,
        num_skipped_samples=len(plan.skipped),
        composition=None if labels is None else step_composition(plan, labels, seq_lens),
    )


def merge_reports(reports: list[BalanceReport]) -> BalanceReport:
    """One report of consecutive plans, such as a streamed epoch's segments
    (``StreamingBatchSampler.balance_report``): means over steps weighted by steps, over
    micro-batches by micro-batches; times and counts summed. Each plan's composition is against
    shuffles of its own micro-batches; merged, weighted by steps (the median groups per step
    too, as a mean of medians)."""
    if not reports:
        raise ValueError("merge_reports needs at least one report")
    first = reports[0]
    steps = np.array([r.num_steps for r in reports], dtype=np.float64)
    mbs = np.array([r.num_micro_batches for r in reports], dtype=np.float64)

    def mean(values, weights) -> float:
        return float(np.dot(values, weights) / weights.sum()) if weights.sum() else 0.0

    composition = None
    if all(r.composition is not None for r in reports):
        comps = [r.composition for r in reports]
        fields = [
            "tv_tokens",
            "tv_samples",
            "shuffle_tv_tokens",
            "shuffle_tv_samples",
            "missing",
            "shuffle_missing",
            "groups_per_step",
            "shuffle_groups_per_step",
        ]
        composition = dataclasses.replace(
            comps[0],
            num_steps=int(steps.sum()),
            num_groups=max(c.num_groups for c in comps),
            **{f: mean([getattr(c, f) for c in comps], steps) for f in fields},
        )
    return BalanceReport(
        num_steps=int(steps.sum()),
        num_replicas=first.num_replicas,
        micro_batches_per_step=first.micro_batches_per_step,
        num_micro_batches=int(mbs.sum()),
        imbalance=mean([r.imbalance for r in reports], steps),
        spread=mean([r.spread for r in reports], steps),
        epoch_time=sum(r.epoch_time for r in reports),
        ideal_time=sum(r.ideal_time for r in reports),
        token_utilization=mean([r.token_utilization for r in reports], mbs),
        max_tokens=first.max_tokens,
        max_cost=first.max_cost,
        **{
            k: sum(getattr(r, k) for r in reports)
            for k in (
                "over_token_cap",
                "over_cost_cap",
                "num_padded_samples",
                "num_dropped_samples",
                "num_split_micro_batches",
                "num_skipped_samples",
            )
        },
        composition=composition,
    )


def rescore(plan, seq_lens, cost_model, max_cost: float | None = None):
    """The same plan with each micro-batch's cost predicted by another ``cost_model``
    (to compare plans made with different models under one yardstick)."""
    costs = cost_model.batch_costs(np.asarray(seq_lens)[plan.samples], plan.offsets)
    return dataclasses.replace(plan, costs=costs, max_cost=max_cost)


# -- the lines `adaptiveload plan` prints --------------------------------------------------


def print_reports(reports: dict, no_image: dict) -> None:
    """The balance and composition table, one row per sampler (``no_image``: the share of
    steps without an image per sampler, or empty when unknown)."""
    base = reports["equal-token buckets"][1].epoch_time
    print(
        f"\n{'sampler':<34} {'steps':>6} {'imbalance':>10} {'spread':>8} {'epoch time':>12} {'speedup':>8} {'token use':>10}"
        f" {'mix vs shuffle':>15} {'missing (shuffle)':>18}"
        + (f" {'no image':>9}" if no_image else "")
    )
    for name, (_, rep) in reports.items():
        comp = rep.composition
        print(
            f"{name:<34} {rep.num_steps:>6} {rep.imbalance:>10.1%} {rep.spread:>8.1%} "
            f"{rep.epoch_time:>12.5g} {base / rep.epoch_time:>7.2f}x {rep.token_utilization:>10.1%} "
            f"{f'{comp.tokens_ratio:.2f}/{comp.samples_ratio:.2f}x':>15} "
            f"{f'{comp.missing:.0%} ({comp.shuffle_missing:.0%})':>18}"
            + (f" {no_image[name]:>9.0%}" if no_image else "")
        )
    print(
        "mix vs shuffle: distance of each step's share of tokens/samples per group from the "
        "epoch's, over a shuffle's of the same micro-batches (1.00x: as representative as a "
        f"shuffle); missing: steps without a group holding over {comp.min_share:.0%} of the epoch"
        + ("; no image: steps without an image (num_frames 1)" if no_image else "")
    )


def degrees_line(plan, D: int) -> str:
    """How AdaptiveLoad's plan splits its micro-batches (each counted once, not per member)."""
    degrees = plan.degrees[plan.members == 0]
    split, n = np.unique(degrees[degrees > 1], return_counts=True)
    counts = ", ".join(f"{c} over {d} ranks" for d, c in zip(split, n, strict=True))
    return (
        f"sequence parallelism (up to {D} ranks per micro-batch): {np.mean(degrees > 1):.0%} of "
        f"{len(degrees)} micro-batches split" + (f" ({counts})" if counts else "")
    )


def halved_line(plan) -> str:
    """What a plan's halved micro-batches are, in one sentence ('' when it halves none)."""
    if not plan.num_split_micro_batches:
        return ""
    W, K = plan.num_replicas, plan.micro_batches_per_step
    return (
        f"Halved micro-batches: at the epoch's end the micro-batches of most samples were cut "
        f"in two, each half a micro-batch of its own, so that the epoch fills whole steps of "
        f"{W} ranks x {K} micro-batch(es); no sample is lost or repeated."
    )


def uneven_line(plan) -> str:
    """How many steps of a plan of uneven counts give the ranks other than K each."""
    W, K = plan.num_replicas, plan.micro_batches_per_step
    counts = np.diff(plan.rank_offsets).reshape(plan.num_steps, W)
    uneven = int(np.sum((counts != K).any(axis=1)))
    return (
        f"uneven counts: in {uneven} of {plan.num_steps} steps the ranks take other than "
        f"{K} micro-batch(es) each (each rank 1 to {int(counts.max())}; the step's {W * K} "
        "micro-batches unchanged)"
    )


# A plan's steps count as representative within these of a shuffle of its micro-batches.
REPRESENTATIVE_RATIO, REPRESENTATIVE_MISSING = 1.10, 0.03


def representative(comp) -> bool:
    """Whether steps of this composition are as representative as a shuffle's: by tokens and
    by samples within REPRESENTATIVE_RATIO of a shuffle's distance, and missing a group no more
    often than a shuffle's steps, give or take REPRESENTATIVE_MISSING."""
    return (
        comp.tokens_ratio <= REPRESENTATIVE_RATIO
        and comp.samples_ratio <= REPRESENTATIVE_RATIO
        and comp.missing <= comp.shuffle_missing + REPRESENTATIVE_MISSING
    )


def steps_line(comp, no_image: float | None, sampler) -> str:
    """One line: are this plan's steps as representative as a shuffle, or segregated, and
    where segregated, by which choice (``sampler``: its composition and mix_tolerance)?"""
    figures = (
        f"{comp.tokens_ratio:.2f}x a shuffle's distance from the epoch's mix, "
        f"{comp.missing:.0%} of steps miss a group against a shuffle's {comp.shuffle_missing:.0%}"
        + ("" if no_image is None else f", {no_image:.0%} of steps hold no image")
    )
    if representative(comp):
        return f"Steps: as representative as a shuffle ({figures})."
    if sampler.composition == "balanced":
        return (
            f"Steps: segregated, by choice ({figures}): --composition balanced (speed over "
            f"fidelity) mixes them only as far as --mix-tolerance {sampler.mix_tolerance:g} "
            "allows, so each optimizer step learns from one or two shapes instead of the data's "
            'mix. What that does to training: docs/sampler.md, "Representative steps".'
        )
    return (
        f"Steps: less representative than a shuffle ({figures}): the window's micro-batches "
        "allow no closer mix (a few groups per window, or steps of one micro-batch); see "
        'docs/sampler.md, "Representative steps".'
    )
