"""Balance against representative steps, replayed on one GPU: the frontier of mix_tolerance.

For W ranks, K micro-batches per rank per step and packed or batch-size-1 micro-batches, one
plan-aware cost model is calibrated (the kinds of its plans, timed on the real model: Wan 2.1,
``--layers`` blocks, bf16, fused ops, activation checkpointing); then AdaptiveBatchSampler
plans the held-out mix's epoch at each ``--tolerances`` value of ``mix_tolerance`` (0: steps
of similar cost, the planner before 2026-12; 1: every window fully mixed), beside
equal-token buckets. Packing does not depend on the tolerance, so every arm uses the same
micro-batch kinds; each is timed afresh twice, and each step is rebuilt as its slowest rank's
measured time. Each arm reports measured imbalance and speedup over equal-token buckets, and
how representative its steps are (``adaptiveload.composition.step_composition`` by shape,
and steps without an image).

    python benchmarks/replay_mix.py --out out/mix                 # CUDA + diffusers
    python benchmarks/replay_mix.py --fake --samples 20000 --out /tmp/mix   # any machine

Writes mix.json, mix.csv and mix.png under --out; --write also stores the CSV as
benchmarks/results/<gpu>/replay_mix.csv and rewrites RESULTS.md.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from datetime import date

import numpy as np

from adaptiveload import AdaptiveBatchSampler, CostModel, EqualTokenBatchSampler
from adaptiveload.calibrate import calibrate_plan, plan_kinds
from adaptiveload.composition import step_composition

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from replay_wan import FakeGPU, Timings, held_out_metadata, parse_ints, score, score_timings  # noqa: E402

TOLERANCES = "0,0.005,0.01,0.02,0.05,0.1,1"


def adaptive(meta, max_tokens, w, k, b, model, tol):
    return AdaptiveBatchSampler(
        meta.seq_lens, max_tokens, cost_model=model, group_keys=meta.group_keys(),
        num_replicas=w, rank=0, micro_batches_per_step=k, max_batch_size=b,
        on_oversize="skip", **({} if tol is None else {"mix_tolerance": tol}),
    )  # fmt: skip


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--samples", type=int, default=100_000, help="of the held-out mix")
    ap.add_argument("--config", default="wan2.1-1.3B")
    ap.add_argument("--layers", type=int, default=3)
    ap.add_argument("--worlds", type=parse_ints, default=[8])
    ap.add_argument("--ks", type=parse_ints, default=[1, 4])
    ap.add_argument("--batch-sizes", default="packed,1", help="packed and/or max_batch_size values")
    ap.add_argument("--tolerances", default=TOLERANCES)
    ap.add_argument("--epoch", type=int, default=2, help="the scored epoch")
    ap.add_argument("--fake", action="store_true", help="a synthetic GPU (dry run, any machine)")
    ap.add_argument("--unfused", action="store_true", help="diffusers' own adaLN (no op library)")
    ap.add_argument("--out", default="out/mix")
    ap.add_argument("--write", action="store_true", help="store the CSV under benchmarks/results")
    args = ap.parse_args(argv)
    tolerances = [float(t) for t in args.tolerances.split(",")]
    batch_sizes = [None if b == "packed" else int(b) for b in args.batch_sizes.split(",")]
    os.makedirs(args.out, exist_ok=True)

    meta = held_out_metadata(args.samples)
    image = (meta.shapes[:, 0] == 1).astype(np.int64)
    max_tokens = int(2 * meta.seq_lens.max())
    if args.fake:
        timer = FakeGPU()
    else:
        import torch

        from adaptiveload.calibrate import WanTimer

        timer = WanTimer(
            args.config, layers=args.layers, dtype=torch.bfloat16, fused=not args.unfused,
            warmup=1, repeat=2, activation_checkpointing=True,
        )  # fmt: skip
    setup = {"data": "held-out", "samples": len(meta.seq_lens), "max_tokens": max_tokens,
             "layers": args.layers, **timer.meta}  # fmt: skip
    print("setup:", json.dumps(setup), flush=True)

    builtin = CostModel.wan21_h200("1.3B", layers=args.layers)
    samplers, kinds = {}, {}
    t0 = time.perf_counter()
    for w in args.worlds:
        for k in args.ks:
            for b in batch_sizes:
                own = Timings(timer)
                cal = calibrate_plan(
                    lambda m, w=w, k=k, b=b: adaptive(meta, max_tokens, w, k, b, m, 0.02),
                    builtin, meta.shapes, own, epochs=(0,), progress=False,
                )  # fmt: skip
                arms = {
                    "equal-token": EqualTokenBatchSampler(
                        meta.seq_lens,
                        max_tokens,
                        cost_model=cal.cost_model,
                        group_keys=meta.group_keys(),
                        num_replicas=w,
                        rank=0,
                        micro_batches_per_step=k,
                        max_batch_size=b,
                    )  # fmt: skip
                }
                # The library's defaults (composition="representative"), then the tolerance's
                # rule (composition="balanced") at each tolerance.
                arms["default"] = adaptive(meta, max_tokens, w, k, b, cal.cost_model, None)
                for tol in tolerances:
                    arms[f"tol {tol:g}"] = adaptive(meta, max_tokens, w, k, b, cal.cost_model, tol)
                for arm, s in arms.items():
                    s.set_epoch(args.epoch)
                    samplers[(w, k, b, arm)] = s
                    kinds.update(plan_kinds(s, meta.shapes, (args.epoch,)))
    print(f"calibrated in {time.perf_counter() - t0:.0f} s; scoring {len(kinds)} kinds", flush=True)
    ms, spread, secs = score_timings(timer, kinds)
    noise = np.array(list(spread.values()))
    print(f"scored in {secs:.0f} s; spread median {np.median(noise):.2%}", flush=True)

    rows = []
    for (w, k, b, arm), s in samplers.items():
        plan = s.plan()
        shape = step_composition(plan, meta.group_keys(), meta.seq_lens)
        modality = step_composition(plan, image, meta.seq_lens)
        r = {"ranks": w, "K": k, "batch": b or "packed", "arm": arm,
             **score(plan, meta.seq_lens, ms, s.cost_model),
             "tv_tokens_ratio": shape.tokens_ratio, "tv_samples_ratio": shape.samples_ratio,
             "missing": shape.missing, "shuffle_missing": shape.shuffle_missing,
             "no_image": modality.missing, "shuffle_no_image": modality.shuffle_missing,
             "groups_per_step": shape.groups_per_step,
             "strata_median": float(np.median(plan.window_strata))
             if plan.window_strata is not None else None}  # fmt: skip
        rows.append(r)
    for r in rows:
        same = [
            x for x in rows if (x["ranks"], x["K"], x["batch"]) == (r["ranks"], r["K"], r["batch"])
        ]
        base = next(x for x in same if x["arm"] == "equal-token")
        today = next((x for x in same if x["arm"] == "tol 0"), None)
        r["speedup"] = base["epoch_s"] / r["epoch_s"]
        r["vs_tol0"] = today["epoch_s"] / r["epoch_s"] if today else None

    head = f"{'W':>3} {'K':>2} {'batch':>6} {'arm':<12} {'speedup':>8} {'vs tol0':>8} {'imbal':>6} {'pred':>6} {'TV tok':>7} {'TV smp':>7} {'no img':>7} {'shuf':>5}"
    print("\n" + head)
    for r in rows:
        v = f"{r['vs_tol0']:.3f}x" if r["vs_tol0"] else "-"
        print(
            f"{r['ranks']:>3} {r['K']:>2} {r['batch']!s:>6} {r['arm']:<12} {r['speedup']:>7.2f}x {v:>8} "
            f"{r['imbalance']:>6.1%} {r['predicted_imbalance']:>6.1%} {r['tv_tokens_ratio']:>6.2f}x "
            f"{r['tv_samples_ratio']:>6.2f}x {r['no_image']:>7.0%} {r['shuffle_no_image']:>5.0%}"
        )  # fmt: skip
    result = {"setup": setup, "noise_median": float(np.median(noise)), "rows": rows}
    with open(os.path.join(args.out, "mix.json"), "w") as f:
        json.dump(result, f, indent=1, default=str)
    from make_results import write_csv

    write_csv(os.path.join(args.out, "mix.csv"), rows)
    figure(rows, os.path.join(args.out, "mix.png"))
    if args.write:
        write(rows, setup)
    return 0


def figure(rows, path):
    """Speedup over equal-token against composition distance (vs a shuffle), one line per
    setting, one point per tolerance."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("no matplotlib: figure skipped", file=sys.stderr)
        return
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    settings = sorted({(r["ranks"], r["K"], str(r["batch"])) for r in rows})
    for w, k, b in settings:
        sel = [r for r in rows if (r["ranks"], r["K"], str(r["batch"])) == (w, k, b)]
        pts = [r for r in sel if r["arm"] != "equal-token"]
        label = f"W={w} K={k} {'packed' if b == 'packed' else 'batch ' + b}"
        x = [r["tv_tokens_ratio"] for r in pts]
        axes[0].plot(x, [r["speedup"] for r in pts], "o-", label=label)
        axes[1].plot(x, [r["imbalance"] * 100 for r in pts], "o-", label=label)
        for r in pts:
            axes[0].annotate(r["arm"].split()[1], (r["tv_tokens_ratio"], r["speedup"]), fontsize=6)
    for ax, title in zip(axes, ("speedup vs equal-token", "measured imbalance (%)"), strict=True):
        ax.axvline(1.0, color="grey", lw=0.8, ls="--")
        ax.set_xlabel("composition distance / a shuffle's (tokens, by shape)")
        ax.set_title(title)
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def write(rows, setup):
    from make_results import write_results

    head = ["ranks", "K", "micro-batches", "arm", "speedup vs equal-token", "vs tolerance 0",
            "measured imbalance", "predicted imbalance", "composition vs shuffle (tokens)",
            "composition vs shuffle (samples)", "steps without an image", "shuffle's"]  # fmt: skip
    out = [[r["ranks"], r["K"], r["batch"], r["arm"], f"{r['speedup']:.2f}x",
            f"{r['vs_tol0']:.3f}x" if r["vs_tol0"] else "-", f"{r['imbalance']:.1%}",
            f"{r['predicted_imbalance']:.1%}", f"{r['tv_tokens_ratio']:.2f}x",
            f"{r['tv_samples_ratio']:.2f}x", f"{r['no_image']:.0%}", f"{r['shuffle_no_image']:.0%}"]
           for r in rows]  # fmt: skip
    gpu = "fake" if setup.get("device") == "fake" else "h200"
    meta = {
        "date": str(date.today()),
        "machine": setup.get("device", ""),
        "command": "python benchmarks/replay_mix.py --write",
        "setup": f"held-out mix, {setup['samples']} samples, max_tokens {setup['max_tokens']}, "
        f"{setup['layers']} blocks, plan-aware cost model per setting",
    }
    print("wrote", write_results(f"{gpu}/replay_mix.csv", head, out, meta))


if __name__ == "__main__":
    sys.exit(main())
