"""The section of benchmarks/RESULTS.md on what the step order does to training
(benchmarks/convergence_wan.py; make_results.py renders it): from the run's summary,
results/h200/convergence_wan.json, every arm, every comparison and every target, met or missed."""

from __future__ import annotations

import json
import os

from results_io import RESULTS, table

SUMMARY = "h200/convergence_wan.json"


def _mean(values) -> float:
    return sum(values) / len(values)


def _mean_sd(values) -> str:
    n, mean = len(values), _mean(values)
    sd = (sum((v - mean) ** 2 for v in values) / (n - 1)) ** 0.5 if n > 1 else 0.0
    return f"{mean:.3f} ± {sd:.3f}"


def _met(ok: bool) -> str:
    return "met" if ok else "**missed**"


def _targets_of(d: dict) -> dict[tuple[str, str], bool]:
    """(kind, about) -> met, as convergence_stats.targets names them."""
    return {(t["kind"], t["about"]): t["met"] for t in d["targets"]}


def arm_rows(d: dict) -> list[list]:
    """One row per arm: its sampler, learning rate, size, losses, and its targets."""
    met, p = _targets_of(d), d["predictor"]
    rows = []
    for key, e in d["arms"].items():
        structure, order, norm = key.split("/")
        cells = [
            structure,
            order,
            norm,
            f"{e['lr'][0]:g}",
            len(e["seeds"]),
            f"{_mean(e['steps']):.0f}",
            f"{_mean(e['mixed_steps']):.0%}",
        ]
        for m in ("image", "clip"):
            final = _mean(e[f"final_{m}"])
            cells += [f"{_mean_sd(e[f'final_{m}'])} ({final / p[m]:.0%})", _mean_sd(e[f"auc_{m}"])]
        cells += [_met(met[("seeds", key)])] + [
            " / ".join(_met(met[(kind, f"{key}/{m}")]) for m in ("image", "clip"))
            for kind in ("below_predictor", "flat")
        ]
        rows.append(cells)
    return rows


def comparison_rows(d: dict) -> list[list]:
    return [
        [
            c["structure"],
            f"{c['order']} − {d['control']}",
            c["normalization"],
            c["modality"],
            c["metric"],
            f"{c['control']:.4f}",
            f"{c['diff_pct']:+.2f}",
            f"[{c['low_pct']:+.2f}, {c['high_pct']:+.2f}]",
            c["verdict"],
            _met(c["verdict"] in ("equivalent", "better")),
        ]
        for c in d["comparisons"]
    ]


def conflict_lines(d: dict) -> list[str]:
    c = d["conflict"]
    if not c.get("branches"):
        return []
    met = _targets_of(d)
    body = []
    for branch, b in c["branches"].items():
        for m in ("image", "clip"):
            target = met.get(("conflict", f"{branch}/{m}"))
            body.append(
                [
                    branch,
                    b["steps"],
                    m,
                    f"{b[m]['before']:.4f}",
                    f"{b[m]['after']:.4f}",
                    f"{b[m]['diff']:+.4f} [{b[m]['low']:+.4f}, {b[m]['high']:+.4f}]",
                    "" if target is None else _met(target),
                ]
            )
    cos = c["grad_cosine"]
    return [
        "",
        f"Conflict (item 4 of issue #34), {len(c['seeds'])} seeds: the b1_k1 control trained for "
        "half its schedule, then three branches of half as many steps again, at the learning "
        "rate of the branch point. At the branch point the gradients of up to 64 training "
        f"images and as many clips have a cosine of {_mean(cos):+.3f} (mean over seeds).",
        "",
    ] + table(
        ["branch", "steps", "validation loss", "before", "after", "change [95%]", "target: rises"],
        body,
    )


def convergence() -> list[str]:
    path = os.path.join(RESULTS, SUMMARY)
    if not os.path.exists(path):
        return []
    with open(path) as f:
        d = json.load(f)
    setup, p = d["setup"], d["predictor"]
    schedules = "; ".join(
        f"{s}: {v['epochs']} epochs, peak lr {v['lr']:g}" for s, v in setup["schedules"].items()
    )
    met = sum(t["met"] for t in d["targets"])
    model = setup["model"]
    return (
        [
            "## What the step order does to training",
            "",
            "Superseded by the fidelity benchmark above (real mixes' token spread, the learning "
            "rate by optimizer step, fresh data per seed, every setup): kept for the record of "
            "why the defaults changed on 2026-12-07; the defaults it measured are not today's.",
            "",
            f"benchmarks/convergence_wan.py: {d['machine']} ({d['device']} workers); torch "
            f"{d['torch']}; {d['date']}; "
            + ", ".join(f"`{c}`" for c in d["commands"])
            + f", then `--summarize-only`. The real WanTransformer3DModel ({model['num_layers']} "
            f"block, {model['num_attention_heads']} heads of {model['attention_head_dim']}, "
            f"fp32) on a synthetic task whose images and clips share their text but not their "
            f"waves, {setup['samples']} samples; {d['ranks']} ranks x K micro-batches per step "
            "accumulated as DDP does, AdamW with warm-up and cosine decay by samples seen "
            f"({schedules}); seeds {d['seeds'][0]}-{d['seeds'][-1]}. Structures: packed "
            "(max_tokens the longest sample) or b1 (`max_batch_size=1`), K = 4 or 1. Orders: "
            "default (`AdaptiveBatchSampler()`), segregated (`mix_tolerance=0.0`), and the "
            f"control `{d['control']}`: the default plan's own micro-batches dealt to as many "
            "steps by a uniform permutation (at batch size 1: a uniform shuffle of the samples, "
            "DiffSynth-Studio's default). Each order is compared with its structure's control "
            "seed by seed: same data, initial weights, noise and micro-batches. Final: the validation loss at the end; AUC: its mean over the "
            "run by samples seen. Verdict: the 95% t interval of the paired difference inside "
            "±2% of the control's loss (equivalent), wholly beyond it (worse, better), or "
            "across it (inconclusive).",
            "",
            "No-structure predictor (every latent element independent of the others and of the "
            f"text; the best linear guess from x_t and t): image {p['image']:.4f}, clip "
            f"{p['clip']:.4f}. Targets: {met} of {len(d['targets'])} met.",
            "",
        ]
        + table(
            [
                "structure",
                "order",
                "normalization",
                "lr",
                "seeds",
                "steps",
                "mixed",
                "final image (% of predictor)",
                "AUC image",
                "final clip (% of predictor)",
                "AUC clip",
                "≥ 10 seeds",
                "≤ 50% of predictor (image / clip)",
                "flat (image / clip)",
            ],
            arm_rows(d),
        )
        + ["", "Paired differences, arm − control of the same seed, % of the control's mean:", ""]
        + table(
            [
                "structure",
                "comparison",
                "normalization",
                "modality",
                "metric",
                "control",
                "diff %",
                "95% interval %",
                "verdict",
                "target: equivalent or better",
            ],
            comparison_rows(d),
        )
        + conflict_lines(d)
        + [
            "",
            "Validation loss per structure, modality and normalization (mean over seeds, band: "
            "their range; dashed: the no-structure predictor):",
            "",
            "![convergence](results/h200/convergence_wan.png)",
            "",
            "The paired difference to the control along the run (mean over seeds, band: 95% "
            "interval; dashed: the ±2% margin):",
            "",
            "![paired differences](results/h200/convergence_wan_diff.png)",
            "",
        ]
    )


def fidelity() -> list[str]:
    """benchmarks/fidelity.py's own fragment (fidelity.md, every arm and verdict): the H200's
    where it ran there, else the H100's."""
    for gpu in ("h200", "h100"):
        path = os.path.join(RESULTS, gpu, "fidelity.md")
        if os.path.exists(path):
            with open(path) as f:
                body = f.read().strip().splitlines()
            with open(os.path.join(RESULTS, gpu, "fidelity.json")) as f:
                summary = json.load(f)
            progress, seeds = summary["progress"], summary["seeds"]
            state = []
            if progress["next_seeds"]:
                nxt = progress["next_seeds"]
                undecided = [t for t in summary["targets"] if t["status"] == "undecided"]
                pending = [f"{p['setup']} {p['arm']}" for p in progress["pending"]]
                head = (
                    f"**Not finished**: seeds {seeds[0]}-{seeds[-1]} so far (the stopping rule "
                    f"asks at least {summary['config']['seeds']['min']})"
                    if undecided
                    else f"**Targets decided** with seeds {seeds[0]}-{seeds[-1]}; the "
                    "arms that are not defaults are still being decided"
                )
                state = [
                    f"{head}: {len(pending)} comparisons still need seeds "
                    f"({', '.join(pending)}; next seeds {nxt[0]}-{nxt[-1]}). Next: "
                    f'`FIDELITY_ARGS="--continue benchmarks/results/{gpu}/fidelity_slices/*" '
                    "bash scripts/gpu_check.sh fidelity` (those comparisons alone, round after "
                    "round), then `benchmarks/fidelity.py --summarize-only` over "
                    f"results/{gpu}/fidelity_slices/* and the new slices.",
                    "",
                ]
            return ["## Fidelity: does the default train as a shuffle does?", "", *state, *body, ""]
    return []
