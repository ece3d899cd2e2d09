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
    """Per dataset index, the id of its group among the ``_DRAWN_GROUPS`` with the most tokens
    (the others share the last id), and the groups' names."""
    _, first, ids = np.unique(labels, return_index=True, return_inverse=True)
    ids = ids.reshape(-1)
    tokens = np.bincount(ids, weights=meta.seq_lens.astype(np.float64))
    top = np.argsort(-tokens, kind="stable")[:_DRAWN_GROUPS]
    drawn = np.full(len(first), len(top), dtype=np.int64)
    drawn[top] = np.arange(len(top))
    if meta.shapes is not None:
        names = ["x".join(str(v) for v in meta.shapes[first[g]]) for g in top]
    else:
        names = [f"S={meta.seq_lens[first[g]]}" for g in top]
    if len(top) < len(first):
        names.append("other")
    return drawn[ids], names


def step_token_shares(plan, groups: np.ndarray, seq_lens: np.ndarray, num_groups: int):
    """Tokens of each group in each step, shape (num_steps, num_groups)."""
    entries = step_entries(plan, plan.num_steps)
    cell = step_of_entries(plan, plan.num_steps) * num_groups + groups[entries]
    tokens = np.bincount(
        cell, weights=seq_lens[entries].astype(np.float64), minlength=plan.num_steps * num_groups
    )
    return tokens.reshape(plan.num_steps, num_groups)


def draw_plans(
    reports: dict, path: str, steps: int, groups, seq_lens, mixed: tuple[str, ...]
) -> None:
    """Per-rank load of each of the first ``steps`` steps for every sampler, then, for the
    samplers ``mixed`` names, each step's token share per group beside the epoch's (``groups``:
    ``figure_groups``)."""
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
            f"{name}: imbalance {rep.imbalance:.1%}, predicted epoch time {rep.epoch_time:.4g}"
        )
        ax.set_ylabel("rank load")
        ax.legend(loc="upper right", fontsize=8)
    colors = [plt.get_cmap("tab10")(i) for i in range(_DRAWN_GROUPS)] + ["0.6"]
    for ax, name in zip(axes[len(reports) :], mixed, strict=True):
        plan, rep = reports[name]
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
    last = axes[-1]
    ticks = [t for t in last.get_xticks() if 0 <= t < shown]
    last.set_xticks([*ticks, shown + 1], [f"{t:g}" for t in ticks] + ["epoch"])
    last.set_xlim(-1, shown + 2)
    last.set_xlabel("optimizer step")
    if mixed:
        handles, labels = axes[len(reports)].get_legend_handles_labels()
        fig.legend(handles, labels, loc="lower center", ncol=min(len(names), 5), fontsize=8)
        legend_inches = 0.2 + 0.22 * -(-len(names) // 5)  # a row per 5 groups
        fig.tight_layout(rect=(0, legend_inches / fig.get_figheight(), 1, 1))
    else:
        fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
