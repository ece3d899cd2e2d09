"""The statistics, tables and figure of benchmarks/convergence_wan.py: per run its final
validation loss and the area under its validation curve, per comparison (an order against the
control of its step structure) the paired difference over seeds with a 95% confidence interval
against an equivalence margin, the conflict run's losses, and the targets met or missed."""

from __future__ import annotations

import math

import numpy as np
from scipy import stats

from convergence_arms import CONTROL, NORMALIZATIONS, ORDERS, STRUCTURES
from convergence_data import MODALITIES

MARGIN = 0.02  # equivalence margin: +-2% of the control's mean
MIN_SEEDS = 10
BELOW_PREDICTOR = 0.5  # "well below": at most half the no-structure predictor's loss
FLAT = 0.02  # "flattened": the last tenth of the run lowers the loss by less than 2%
METRICS = ("final", "auc")
INTS = ("seed", "epoch", "steps", "samples_seen", "tokens_seen", "micro_batches")
FLOATS = ("lr", "mixed_steps", "train_loss", "wall_s", "val_image", "val_clip", "grad_cosine")


def typed(rows: list[dict]) -> list[dict]:
    """Rows read back from a CSV, with their numbers as numbers ('' stays '')."""
    out = []
    for r in rows:
        r = dict(r)
        for k in INTS:
            if r.get(k, "") != "":
                r[k] = int(r[k])
        for k in FLOATS:
            if r.get(k, "") != "":
                r[k] = float(r[k])
        out.append(r)
    return out


def by_run(rows) -> dict[tuple, list[dict]]:
    """(structure, order, normalization, seed) -> the run's rows in order."""
    runs = {}
    for r in rows:
        runs.setdefault((r["structure"], r["order"], r["normalization"], r["seed"]), []).append(r)
    return runs


def run_metrics(rs: list[dict]) -> dict:
    """One run's numbers: per modality the final validation loss, the area under the
    validation curve (trapezoid over samples seen, divided by them: the mean loss over the
    run) and the drop over the run's last tenth relative to the final loss."""
    seen = np.array([r["samples_seen"] for r in rs], dtype=float)
    out = {
        "steps": rs[-1]["steps"],
        "samples": rs[-1]["samples_seen"],
        "micro_batches": rs[-1]["micro_batches"],
        "mixed_steps": rs[-1]["mixed_steps"],
        "wall_s": rs[-1]["wall_s"],
        "lr": rs[-1]["lr"],
    }
    for m in MODALITIES:
        val = np.array([r[f"val_{m}"] for r in rs], dtype=float)
        out[f"final_{m}"] = float(val[-1])
        out[f"auc_{m}"] = float(np.trapezoid(val, seen) / seen[-1])
        out[f"last_tenth_drop_{m}"] = float(
            (np.interp(0.9 * seen[-1], seen, val) - val[-1]) / val[-1]
        )
    return out


def paired(arm: list[float], control: list[float]) -> dict:
    """Mean of the per-seed differences arm - control with its 95% confidence interval (t
    distribution over seeds), all also as % of the control's mean, and the verdict against
    +-MARGIN of it: equivalent (the interval inside the margin), worse or better (the interval
    wholly beyond it), inconclusive (the interval crosses the margin)."""
    d = np.asarray(arm, dtype=float) - np.asarray(control, dtype=float)
    n, base = len(d), float(np.mean(control))
    half = float(stats.t.ppf(0.975, n - 1) * d.std(ddof=1) / math.sqrt(n)) if n > 1 else math.inf
    mean = float(d.mean())
    low, high, margin = mean - half, mean + half, MARGIN * base
    if -margin < low and high < margin:
        verdict = "equivalent"
    elif low > margin:
        verdict = "worse"
    elif high < -margin:
        verdict = "better"
    else:
        verdict = "inconclusive"
    pct = 100 / base
    return {
        "n": n,
        "control": base,
        "diff": mean,
        "low": low,
        "high": high,
        "margin": margin,
        "diff_pct": mean * pct,
        "low_pct": low * pct,
        "high_pct": high * pct,
        "verdict": verdict,
        "per_seed": d.tolist(),
    }


def arm_table(runs, seeds) -> dict:
    """Per arm (structure/order/normalization) its metrics, one value per completed seed."""
    arms = {}
    rank = {k: i for i, k in enumerate([*STRUCTURES, *ORDERS, *NORMALIZATIONS])}
    for (structure, order, norm, seed), rs in sorted(
        runs.items(), key=lambda kv: (rank[kv[0][0]], rank[kv[0][1]], rank[kv[0][2]], kv[0][3])
    ):
        if seed not in seeds:
            continue
        entry = arms.setdefault(f"{structure}/{order}/{norm}", {"seeds": []})
        entry["seeds"].append(seed)
        for k, v in run_metrics(rs).items():
            entry.setdefault(k, []).append(v)
    return arms


def comparisons(runs, seeds) -> list[dict]:
    """Every order against its structure's control, per normalization, modality and metric,
    over the seeds that completed both runs."""
    out = []
    for structure in STRUCTURES:
        for order in (o for o in ORDERS if o != CONTROL):
            for norm in NORMALIZATIONS:
                both = [
                    s
                    for s in seeds
                    if (structure, order, norm, s) in runs and (structure, CONTROL, norm, s) in runs
                ]
                if not both:
                    continue
                arm = [run_metrics(runs[(structure, order, norm, s)]) for s in both]
                ctl = [run_metrics(runs[(structure, CONTROL, norm, s)]) for s in both]
                for m in MODALITIES:
                    for metric in METRICS:
                        key = f"{metric}_{m}"
                        out.append(
                            {
                                "structure": structure,
                                "order": order,
                                "normalization": norm,
                                "modality": m,
                                "metric": metric,
                                "seeds": both,
                            }
                            | paired([a[key] for a in arm], [c[key] for c in ctl])
                        )
    return out


def conflict_summary(rows) -> dict:
    """Per branch of the conflict run, the change of each modality's validation loss from
    the branch point to the branch's end (mean over seeds, 95% interval), and the gradient
    cosine at the branch point."""
    seeds = sorted({r["seed"] for r in rows})
    start = {r["seed"]: r for r in rows if r["branch"] == "start"}
    out = {
        "seeds": seeds,
        "grad_cosine": [start[s]["grad_cosine"] for s in seeds if s in start],
        "branches": {},
    }
    for branch in ("clips only", "images only", "mixed"):
        ends = {}
        for r in rows:
            if r["branch"] == branch:
                ends[r["seed"]] = r  # the last row of the branch
        done = [s for s in seeds if s in ends and s in start]
        if not done:
            continue
        entry = {"steps": ends[done[0]]["steps"] - start[done[0]]["steps"]}
        for m in MODALITIES:
            before = [start[s][f"val_{m}"] for s in done]
            after = [ends[s][f"val_{m}"] for s in done]
            entry[m] = {"before": float(np.mean(before)), "after": float(np.mean(after))} | {
                k: v for k, v in paired(after, before).items() if k in ("diff", "low", "high")
            }
        out["branches"][branch] = entry
    return out


def targets(arms, comps, conflict, predictor) -> list[dict]:
    """Every target of issue #34, met or missed: per arm its seeds, and per modality its final
    loss against the no-structure predictor and its flatness; the conflict; per comparison
    its verdict. Each names its ``kind`` and what it is about (``about``), for the tables."""
    out = []

    def add(kind, about, text, value, met):
        out.append({"kind": kind, "about": about, "target": text, "value": value, "met": bool(met)})

    for key, e in arms.items():
        add(
            "seeds",
            key,
            f"{key}: at least {MIN_SEEDS} seeds",
            f"{len(e['seeds'])} seeds",
            len(e["seeds"]) >= MIN_SEEDS,
        )
        for m in MODALITIES:
            ratio = float(np.mean(e[f"final_{m}"])) / predictor[m]
            add(
                "below_predictor",
                f"{key}/{m}",
                f"{key}: {m} final loss at most "
                f"{BELOW_PREDICTOR:.0%} of the no-structure predictor's",
                f"{ratio:.0%}",
                ratio <= BELOW_PREDICTOR,
            )
            drop = float(np.mean(e[f"last_tenth_drop_{m}"]))
            add(
                "flat",
                f"{key}/{m}",
                f"{key}: {m} loss flat (the last tenth of the run lowers "
                f"it by less than {FLAT:.0%})",
                f"{drop:.1%}",
                drop < FLAT,
            )
    for branch, m in (("clips only", "image"), ("images only", "clip")):
        b = conflict.get("branches", {}).get(branch)
        if b:
            add(
                "conflict",
                f"{branch}/{m}",
                f"conflict: training on {branch} raises the {m} "
                "validation loss (95% interval above 0)",
                f"{b[m]['before']:.3f} -> {b[m]['after']:.3f}",
                b[m]["low"] > 0,
            )
    for c in comps:
        about = "/".join(
            c[k] for k in ("structure", "order", "normalization", "modality", "metric")
        )
        add(
            "comparison",
            about,
            f"{c['structure']} {c['order']} vs {CONTROL}, "
            f"{c['normalization']}, {c['modality']} {c['metric']}: equivalent within "
            f"+-{MARGIN:.0%} or better",
            f"{c['diff_pct']:+.2f}% [{c['low_pct']:+.2f}, {c['high_pct']:+.2f}]",
            c["verdict"] in ("equivalent", "better"),
        )
    return out


def summarize(rows, conflict_rows, predictor, seeds) -> dict:
    runs = by_run(rows)
    arms = arm_table(runs, seeds)
    comps = comparisons(runs, seeds)
    conflict = conflict_summary([r for r in conflict_rows if r["seed"] in seeds])
    return {
        "predictor": predictor,
        "arms": arms,
        "comparisons": comps,
        "conflict": conflict,
        "targets": targets(arms, comps, conflict, predictor),
    }


# -- printing and the figure ------------------------------------------------------------------


def mean_sd(values) -> str:
    v = np.asarray(values, dtype=float)
    return f"{v.mean():.4f} +- {v.std(ddof=1) if len(v) > 1 else 0.0:.4f}"


def print_summary(summary: dict) -> None:
    p = summary["predictor"]
    print(
        "\nno-structure predictor (every latent element independent of the others and of "
        "the text; the best linear guess from x_t and t): "
        + ", ".join(f"{m} {p[m]:.4f}" for m in MODALITIES)
    )
    print(
        f"\n{'arm':<32} {'lr':>7} {'seeds':>5} {'steps':>5} {'mixed':>5}  "
        f"{'final image':>17} {'final clip':>17} {'AUC image':>17} {'AUC clip':>17}"
    )
    for key, e in summary["arms"].items():
        print(
            f"{key:<32} {e['lr'][0]:>7.0e} {len(e['seeds']):>5} {np.mean(e['steps']):>5.0f} "
            f"{np.mean(e['mixed_steps']):>5.0%}  {mean_sd(e['final_image']):>17} "
            f"{mean_sd(e['final_clip']):>17} {mean_sd(e['auc_image']):>17} "
            f"{mean_sd(e['auc_clip']):>17}"
        )
    print(
        "(mean +- sd over seeds; steps: optimizer steps per run; mixed: steps holding images "
        "and clips; AUC: mean validation loss over the run, by samples seen)"
    )
    print(
        f"\npaired differences, arm - {CONTROL} of the same seed (% of {CONTROL}'s mean; "
        f"95% interval; margin +-{MARGIN:.0%})"
    )
    print(
        f"{'structure':<10} {'order':<11} {'norm':<8} {'modality':<6} {'metric':<6} "
        f"{'control':>8} {'diff %':>8} {'95% interval %':>18}  verdict"
    )
    for c in summary["comparisons"]:
        print(
            f"{c['structure']:<10} {c['order']:<11} {c['normalization']:<8} {c['modality']:<6} "
            f"{c['metric']:<6} {c['control']:>8.4f} {c['diff_pct']:>+8.2f} "
            f"[{c['low_pct']:>+7.2f}, {c['high_pct']:>+7.2f}]  {c['verdict']}"
        )
    conflict = summary["conflict"]
    if conflict.get("branches"):
        cos = conflict["grad_cosine"]
        print(
            f"\nconflict (b1_k1 control trained halfway, then each branch; {len(cos)} seeds): "
            f"gradient cosine images vs clips at the branch point {np.mean(cos):+.3f}"
        )
        for branch, b in conflict["branches"].items():
            print(
                f"  {branch:<12} {b['steps']:>4} steps: "
                + "; ".join(
                    f"{m} {b[m]['before']:.4f} -> {b[m]['after']:.4f} "
                    f"({b[m]['diff']:+.4f} [{b[m]['low']:+.4f}, {b[m]['high']:+.4f}])"
                    for m in MODALITIES
                )
            )
    missed = [t for t in summary["targets"] if not t["met"]]
    print(f"\ntargets: {len(summary['targets']) - len(missed)} of {len(summary['targets'])} met")
    for t in missed:
        print(f"  missed: {t['target']}: {t['value']}")


def curves(runs, structure: str, order: str, norm: str, m: str, grid=None):
    """The seeds' validation curves of one arm on a grid of optimizer steps: (grid, {seed:
    losses}); the grid is 64 points up to the fewest steps of its runs unless given."""
    rs = {k[3]: v for k, v in runs.items() if k[:3] == (structure, order, norm)}
    if not rs:
        return None, {}
    if grid is None:
        grid = np.linspace(0, min(r[-1]["steps"] for r in rs.values()), 64)
    return grid, {
        seed: np.interp(grid, [x["steps"] for x in r], [x[f"val_{m}"] for x in r])
        for seed, r in rs.items()
    }


def _panels(rows):
    """The figure's grid: a row per structure, a column per (modality, normalization), only
    those the rows hold."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    structures = [s for s in STRUCTURES if any(r["structure"] == s for r in rows)]
    norms = [n for n in NORMALIZATIONS if any(r["normalization"] == n for r in rows)]
    columns = [(m, n) for m in MODALITIES for n in norms]
    fig, axes = plt.subplots(
        len(structures),
        len(columns),
        squeeze=False,
        figsize=(4 * len(columns), 2.8 * len(structures)),
    )
    return (
        plt,
        fig,
        [
            (ax, s, m, n)
            for i, s in enumerate(structures)
            for ax, (m, n) in zip(axes[i], columns, strict=True)
        ],
    )


def figure(rows, predictor, path: str) -> None:
    """Validation loss against optimizer steps: a row of panels per structure, a column per
    (modality, normalization), a line per order (mean over seeds) with the band of the seeds'
    range, the no-structure predictor dashed; the loss axis from just below the lowest mean to
    just above the predictor (the first steps, above it, are cut)."""
    runs = by_run(rows)
    plt, fig, panels = _panels(rows)
    for ax, structure, m, norm in panels:
        low = np.inf
        for order in ORDERS:
            grid, ys = curves(runs, structure, order, norm, m)
            if not ys:
                continue
            ys = np.array(list(ys.values()))
            (line,) = ax.plot(grid, ys.mean(0), label=order, lw=1.2)
            ax.fill_between(grid, ys.min(0), ys.max(0), color=line.get_color(), alpha=0.2)
            low = min(low, ys.min())
        ax.axhline(predictor[m], color="gray", ls="--", lw=0.8, label="no-structure predictor")
        ax.set_ylim(0.95 * low, 1.1 * predictor[m])
        _label(ax, structure, m, norm)
    _save(plt, fig, panels, path)


def difference_figure(rows, path: str) -> None:
    """The paired difference along the run: per order, the mean over seeds of (order -
    control) / control's mean, in %, with its 95% t band, and the +-MARGIN lines."""
    runs = by_run(rows)
    plt, fig, panels = _panels(rows)
    for ax, structure, m, norm in panels:
        grid, control = curves(runs, structure, CONTROL, norm, m)
        for order in (o for o in ORDERS if o != CONTROL):
            _, arm = curves(runs, structure, order, norm, m, grid)
            seeds = sorted(set(arm) & set(control))
            if not seeds:
                continue
            base = np.mean([control[s] for s in seeds], axis=0)
            d = np.array([100 * (arm[s] - control[s]) / base for s in seeds])
            mean = d.mean(0)
            (line,) = ax.plot(grid, mean, label=f"{order} - {CONTROL}", lw=1.2)
            if len(seeds) > 1:
                half = stats.t.ppf(0.975, len(seeds) - 1) * d.std(0, ddof=1) / math.sqrt(len(seeds))
                ax.fill_between(grid, mean - half, mean + half, color=line.get_color(), alpha=0.2)
        for y in (-100 * MARGIN, 0, 100 * MARGIN):
            ax.axhline(y, color="gray", ls="--" if y else "-", lw=0.8)
        ax.set_ylim(-8, 8)
        _label(ax, structure, m, norm)
        ax.set_ylabel("paired difference, %", fontsize=8)
    _save(plt, fig, panels, path)


def _label(ax, structure: str, m: str, norm: str) -> None:
    """A panel's title, step axis and grid."""
    ax.set_title(f"{structure}: {m}, {norm} normalization", fontsize=9)
    ax.set_xlabel("optimizer steps", fontsize=8)
    ax.grid(alpha=0.3)


def _save(plt, fig, panels, path: str) -> None:
    panels[0][0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
