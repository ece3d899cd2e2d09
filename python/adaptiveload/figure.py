"""The ``plan`` command's figure: per-rank load of the first steps for each sampler, and the
token share of each shape group per step beside the epoch's (matplotlib, imported only
when a figure is drawn)."""

from __future__ import annotations

import numpy as np

from adaptiveload.composition import step_entries, step_of_entries
from adaptiveload.metadata import Metadata

# Groups drawn by name in the figure's composition panels; the rest are drawn as "other".
_DRAWN_GROUPS = 9


def figure_groups(meta: Metadata, labels: np.ndarray) -> tuple[np.ndarray, list[str]]:
    """Per dataset index, the id of its group among the ``_DRAWN_GROUPS`` largest (the others
    share the last id, "other"), and the groups' names with their shares of the epoch's
    samples and tokens. A group's size is the larger of its two shares, so that a group of
    many short samples (images) is named as well as one of few long ones."""
    _, first, ids, counts = np.unique(
        labels, return_index=True, return_inverse=True, return_counts=True
    )
    ids = ids.reshape(-1)
    tokens = np.bincount(ids, weights=meta.seq_lens.astype(np.float64), minlength=len(first))
    samples, tokens = counts / counts.sum(), tokens / tokens.sum()
    top = np.argsort(-np.maximum(samples, tokens), kind="stable")[:_DRAWN_GROUPS]
    drawn = np.full(len(first), len(top), dtype=np.int64)
    drawn[top] = np.arange(len(top))
    if meta.shapes is not None:
        names = ["x".join(str(v) for v in meta.shapes[first[g]]) for g in top]
    else:
        names = [f"S={meta.seq_lens[first[g]]}" for g in top]
    names = [
        f"{name}: {samples[g]:.0%} of samples, {tokens[g]:.0%} of tokens"
        for name, g in zip(names, top, strict=True)
    ]
    if len(top) < len(first):
        rest = np.ones(len(first), dtype=bool)
        rest[top] = False
        names.append(
            f"other ({int(rest.sum())} groups): {samples[rest].sum():.0%} of samples, "
            f"{tokens[rest].sum():.0%} of tokens"
        )
    return drawn[ids], names


def cost_label(unit: str) -> str:
    """The figure's name of the cost model's unit: milliseconds predicted, or the unit."""
    if unit == "ms":
        return "predicted ms"
    return f"predicted cost, {unit}" if unit else "predicted cost"


def _duration(value: float, unit: str) -> str:
    """A predicted time in its unit, and in hours, minutes or seconds where it is ms."""
    text = f"{value:.4g} {unit}".rstrip()
    if unit != "ms":
        return text
    seconds = value / 1e3
    for size, name in ((3600, "h"), (60, "min"), (1, "s")):
        if seconds >= size:
            return f"{text} ({seconds / size:.3g} {name})"
    return text


def step_token_shares(plan, groups: np.ndarray, seq_lens: np.ndarray, num_groups: int):
    """Tokens of each group in each step, shape (num_steps, num_groups)."""
    entries = step_entries(plan, plan.num_steps)
    cell = step_of_entries(plan, plan.num_steps) * num_groups + groups[entries]
    tokens = np.bincount(
        cell, weights=seq_lens[entries].astype(np.float64), minlength=plan.num_steps * num_groups
    )
    return tokens.reshape(plan.num_steps, num_groups)


def draw_plans(
    reports: dict,
    path: str,
    steps: int,
    groups,
    seq_lens,
    mixed: tuple[str, ...],
    unit: str = "",
) -> None:
    """``plan_figure``, written to ``path`` as a PNG."""
    import matplotlib.pyplot as plt

    fig = plan_figure(reports, steps, groups, seq_lens, mixed, unit)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plan_figure(reports: dict, steps: int, groups, seq_lens, mixed: tuple[str, ...], unit=""):
    """Per-rank load of each of the first ``steps`` steps for every sampler, in the cost
    model's ``unit``, then, for the samplers ``mixed`` names, each step's token share per
    group beside the epoch's (``groups``: ``figure_groups``). Returns the figure."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ids, names = groups
    rows = len(reports) + len(mixed)
    fig, axes = plt.subplots(rows, 1, figsize=(11, 2.6 * rows), sharex=True)
    axes = np.atleast_1d(axes)
    for ax in axes[1 : len(reports)]:
        ax.sharey(axes[0])
    shown = max(min(steps, plan.num_steps) for plan, _ in reports.values())
    for ax, (name, (plan, rep)) in zip(axes, reports.items(), strict=False):
        loads = plan.rank_costs()[:steps]
        for r in range(loads.shape[1]):
            ax.plot(np.arange(len(loads)), loads[:, r], ".", ms=3, alpha=0.6)
        ax.plot(
            np.arange(len(loads)), loads.max(axis=1), "-", color="k", lw=1, label="slowest rank"
        )
        ax.set_title(
            f"{name}: imbalance {rep.imbalance:.1%}, predicted epoch time "
            f"{_duration(rep.epoch_time, unit)}"
        )
        ax.set_ylabel(f"rank load\n({cost_label(unit)})")
        ax.legend(loc="upper right", fontsize=8)
    colors = [plt.get_cmap("tab10")(i) for i in range(_DRAWN_GROUPS)] + ["0.6"]
    for ax, name in zip(axes[len(reports) :], mixed, strict=True):
        _draw_shares(ax, name, reports[name], ids, names, seq_lens, steps, shown, colors)
    last = axes[-1]
    ticks = [t for t in last.get_xticks() if 0 <= t < shown]
    last.set_xticks([*ticks, shown + 1], [f"{t:g}" for t in ticks] + ["epoch"])
    last.set_xlim(-1, shown + 2)
    last.set_xlabel("optimizer step")
    if mixed:
        handles, labels = axes[len(reports)].get_legend_handles_labels()
        columns = 2 if len(names) > 3 else len(names)
        fig.legend(handles, labels, loc="lower center", ncol=columns, fontsize=8)
        legend_inches = 0.2 + 0.2 * -(-len(names) // columns)
        fig.tight_layout(rect=(0, legend_inches / fig.get_figheight(), 1, 1))
    else:
        fig.tight_layout()
    return fig


def _draw_shares(ax, name, plan_report, ids, names, seq_lens, steps, shown, colors) -> None:
    """One sampler's token share per group in each of its first steps, then the epoch's."""
    plan, rep = plan_report
    tokens = step_token_shares(plan, ids, seq_lens, len(names))
    # The first steps, then (after a gap) the epoch's mix: a representative step looks
    # like the last bar.
    bars = np.vstack([tokens[:steps], tokens.sum(axis=0)])
    bars /= np.maximum(bars.sum(axis=1, keepdims=True), 1e-300)
    x = np.r_[np.arange(len(bars) - 1), shown + 1]
    bottom = np.zeros(len(bars))
    for g, group in enumerate(names):
        ax.bar(x, bars[:, g], bottom=bottom, width=0.9, color=colors[g], label=group)
        bottom += bars[:, g]
    ax.set_title(
        f"{name}: token share per group, {rep.composition.tokens_ratio:.2f}x a shuffle's "
        "distance from the epoch's mix"
    )
    ax.set_ylabel("token share")
    ax.set_ylim(0, 1)
