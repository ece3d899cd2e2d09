"""The statistics and tables of benchmarks/fidelity.py: per comparison (an arm against its
control, in one setup) the paired difference of the primary measure over seeds with its 90% and
95% t intervals, the verdict against +-MARGIN, which comparisons still need seeds, and the
printed table and the markdown fragment for RESULTS.md."""

from __future__ import annotations

import math

import numpy as np
from scipy import stats

from fidelity_arms import ARMS, SETUPS, control_of

#: The primary measure, named before any run: the final held-out validation loss (mean squared
#: error per latent element over new patterns and every validation timestep), averaged over
#: the two modalities; compared as the paired difference arm - control, in % of the control.
PRIMARY = "val_mean"
PRIMARY_TEXT = (
    "final held-out validation loss (MSE per latent element over new patterns at every "
    "validation timestep), mean of images and clips; paired difference arm - control per seed, "
    "% of the control's mean"
)
SECONDARY = ("val_image", "val_clip")
MARGIN = 0.02  # equivalence margin: +-2% of the control's mean
LEVELS = (0.90, 0.95)
VERDICT_LEVEL = 0.95


def interval(d: np.ndarray, level: float) -> float:
    """Half-width of the two-sided t interval of the mean of ``d`` (inf below 2 values)."""
    n = len(d)
    if n < 2:
        return math.inf
    return float(stats.t.ppf(0.5 + level / 2, n - 1) * d.std(ddof=1) / math.sqrt(n))


def verdict(low: float, high: float, margin: float) -> str:
    """equivalent (the interval inside +-margin), worse or better (wholly beyond it),
    inconclusive (across it)."""
    if -margin < low and high < margin:
        return "equivalent"
    if low > margin:
        return "worse"
    if high < -margin:
        return "better"
    return "inconclusive"


def paired(arm, control) -> dict:
    """Mean of the per-seed differences arm - control, its 90% and 95% intervals and verdicts
    against +-MARGIN of the control's mean, all also in % of that mean."""
    d = np.asarray(arm, dtype=float) - np.asarray(control, dtype=float)
    base, mean = float(np.mean(control)), float(d.mean())
    out = {"n": len(d), "control": base, "diff": mean, "diff_pct": 100 * mean / base}
    for level in LEVELS:
        half = interval(d, level)
        tag = f"{round(100 * level)}"
        low, high = mean - half, mean + half
        out[f"low{tag}_pct"] = 100 * low / base
        out[f"high{tag}_pct"] = 100 * high / base
        out[f"verdict{tag}"] = verdict(low, high, MARGIN * base)
    out["verdict"] = out[f"verdict{round(100 * VERDICT_LEVEL)}"]
    out["per_seed"] = d.tolist()
    return out


def final_rows(rows) -> dict[tuple, dict]:
    """(setup, run, seed) -> the run's last row."""
    out = {}
    for r in rows:
        key = (r["setup"], r["run"], int(r["seed"]))
        if key not in out or int(r["steps"]) > int(out[key]["steps"]):
            out[key] = r
    return out


def comparisons(rows, setups=SETUPS, arms=ARMS) -> list[dict]:
    """Every arm against its control in every setup, on the primary and secondary measures,
    over the seeds that finished both runs."""
    final = final_rows(rows)
    out = []
    for setup in setups:
        for arm in arms:
            control = control_of(arm)
            seeds = sorted(
                s
                for (su, r, s) in final
                if su == setup and r == arm and (setup, control, s) in final
            )
            if not seeds:
                continue
            entry = {"setup": setup, "arm": arm, "control": control, "seeds": seeds}
            for m in (PRIMARY, *SECONDARY):
                a = [float(final[(setup, arm, s)][m]) for s in seeds]
                c = [float(final[(setup, control, s)][m]) for s in seeds]
                entry[m] = paired(a, c)
            out.append(entry)
    return out


def undecided(comps, max_seeds: int) -> list[tuple[str, str]]:
    """(setup, arm) of the comparisons whose primary verdict is inconclusive and that have
    fewer than ``max_seeds`` seeds: the next round adds seeds to these."""
    return [
        (c["setup"], c["arm"])
        for c in comps
        if c[PRIMARY]["verdict"] == "inconclusive" and len(c["seeds"]) < max_seeds
    ]


def targets(comps, max_seeds: int) -> list[dict]:
    """The target of issue #54: every default arm equivalent to its control (95% interval
    inside +-MARGIN) on the primary measure, per setup: ``met``; ``missed`` (worse, better, or
    inconclusive at ``max_seeds``); or ``undecided`` (inconclusive with fewer seeds: the
    stopping rule adds seeds)."""
    out = []
    for c in comps:
        if c["arm"] != "default":
            continue
        verdict = c[PRIMARY]["verdict"]
        status = "met" if verdict == "equivalent" else "missed"
        if verdict == "inconclusive" and len(c["seeds"]) < max_seeds:
            status = "undecided"
        out.append(
            {
                "setup": c["setup"],
                "target": f"{c['setup']} default equivalent to {c['control']} within +-{MARGIN:.0%}",
                "value": _cell(c[PRIMARY]),
                "seeds": len(c["seeds"]),
                "status": status,
                "met": status == "met",
            }
        )
    return out


def _cell(p: dict) -> str:
    return (
        f"{p['diff_pct']:+.2f}% [{p['low95_pct']:+.2f}, {p['high95_pct']:+.2f}] "
        f"(90%: [{p['low90_pct']:+.2f}, {p['high90_pct']:+.2f}])"
    )


def print_table(comps) -> None:
    print(f"\nprimary measure: {PRIMARY_TEXT}; margin +-{MARGIN:.0%}; verdict at 95%")
    print(
        f"{'setup':<14} {'arm':<14} {'control':<17} {'n':>3} {'diff %':>8} "
        f"{'95% interval':>18} {'90% interval':>18}  verdict (95% / 90%)"
    )
    for c in comps:
        p = c[PRIMARY]
        print(
            f"{c['setup']:<14} {c['arm']:<14} {c['control']:<17} {p['n']:>3} "
            f"{p['diff_pct']:>+8.2f} [{p['low95_pct']:>+7.2f}, {p['high95_pct']:>+7.2f}] "
            f"[{p['low90_pct']:>+7.2f}, {p['high90_pct']:>+7.2f}]  "
            f"{p['verdict95']} / {p['verdict90']}"
        )


def markdown(comps, header: str, max_seeds: int) -> str:
    """The RESULTS.md fragment: every comparison, every verdict, misses included."""
    lines = [
        header,
        "",
        f"Primary measure (named before the run): {PRIMARY_TEXT}. Verdict: the 95% t "
        f"interval inside +-{MARGIN:.0%} (equivalent), wholly beyond it (worse, better), or "
        "across it (inconclusive).",
        "",
        "| setup | arm | control | seeds | primary: diff % [95%] (90%) | verdict 95% | "
        "verdict 90% | image diff % [95%] | clip diff % [95%] |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for c in comps:
        p = c[PRIMARY]
        lines.append(
            f"| {c['setup']} | {c['arm']} | {c['control']} | {p['n']} | {_cell(p)} | "
            f"{p['verdict95']} | {p['verdict90']} | "
            + " | ".join(
                f"{c[m]['diff_pct']:+.2f} [{c[m]['low95_pct']:+.2f}, {c[m]['high95_pct']:+.2f}]"
                for m in SECONDARY
            )
            + " |"
        )
    goals = targets(comps, max_seeds)
    count = {k: sum(t["status"] == k for t in goals) for k in ("met", "missed", "undecided")}
    lines += [
        "",
        f"Targets (every default arm equivalent): {count['met']} met, {count['missed']} missed, "
        f"{count['undecided']} undecided (inconclusive with fewer than the stated maximum of "
        f"{max_seeds} seeds) of {len(goals)}.",
    ]
    lines += [
        f"- {t['status']}: {t['target']}: {t['value']}, {t['seeds']} seed(s)"
        for t in goals
        if t["status"] != "met"
    ]
    return "\n".join(lines) + "\n"
