"""End to end: does AdaptiveLoad make Wan 2.1 training faster on real GPUs?

Trains the Wan-2.1-1.3B configuration (``--layers`` blocks) with examples/train_wan.py on
the same synthetic latent data, one epoch per arm, for four arms:

    baseline     EqualTokenBatchSampler, diffusers' own adaLN
    sampler      AdaptiveBatchSampler (calibrated cost model), diffusers' adaLN
    fused        EqualTokenBatchSampler, AdaLoad's fused adaLN ops
    both         AdaptiveBatchSampler + fused ops

and reports, per arm: measured imbalance (per step, 1 - mean/max of the ranks' compute
times), epoch time and the speedup it gives over the baseline, samples/s and tokens/s over
the epoch, peak memory against the budget, OOMs, and how well the calibrated cost model
predicted each micro-batch's time (steps after the warm-up).

    python benchmarks/e2e_wan.py --gpus 2 --layers 6 --calibrate

Needs CUDA and diffusers. Writes JSON logs and a figure under --out.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from datetime import date

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
ARMS = {
    "baseline": ["--sampler", "equal", "--no-fused"],
    "sampler": ["--sampler", "adaptive", "--no-fused"],
    "fused": ["--sampler", "equal", "--fused"],
    "both": ["--sampler", "adaptive", "--fused"],
}


def run(cmd, log_path, env=None, timeout=None):
    t0 = time.perf_counter()
    with open(log_path, "w") as log:
        done = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, timeout=timeout)
    return done.returncode, time.perf_counter() - t0


def read_jsonl(path):
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def summarize(records, warmup, seq_lens, cost_model, budget_bytes):
    steady = records[warmup:]
    if not steady:
        return None
    step_s = np.array([r["step_ms"] for r in steady]) / 1000
    compute = [np.array(r["compute_ms"]) for r in steady]
    imbalance = np.array([1 - c.mean() / c.max() for c in compute])
    peak = max(max(r["peak_bytes"]) for r in records)
    epoch_s = float(np.sum([r["step_ms"] for r in records]) / 1000)
    out = {
        "steps": len(records),
        "steady_steps": len(steady),
        # Whole-epoch rates: every arm trains the same samples, so these (and the speedup, from
        # epoch time) do not depend on which steps a warm-up cut would leave out.
        "samples_per_s": sum(r["samples"] for r in records) / epoch_s,
        "tokens_per_s": sum(r["tokens"] for r in records) / epoch_s,
        "steady_samples_per_s": sum(r["samples"] for r in steady) / step_s.sum(),
        "imbalance": float(imbalance.mean()),
        "spread": float(np.mean([(c.max() - c.min()) / c.max() for c in compute])),
        "peak_gib": peak / 2**30,
        "peak_over_budget": peak / budget_bytes if budget_bytes else None,
        "mean_peak_util": float(np.mean([np.mean(r["peak_bytes"]) for r in steady]) / budget_bytes)
        if budget_bytes
        else None,
        "epoch_s": epoch_s,
    }
    if cost_model is not None:
        # One micro-batch per rank per step: its compute time is the micro-batch's time.
        # Against the step's compute time (host view, inputs' copies included) and against the
        # model's forward + backward alone (CUDA events), which is what calibration measures.
        for key, field in (("pred", "compute_ms"), ("pred_model", "model_ms")):
            errors = []
            for r in steady:
                if field not in r:
                    continue
                for rank, mbs in enumerate(r["batches"]):
                    if len(mbs) == 1 and r[field][rank] > 0:
                        pred = cost_model.batch_cost(seq_lens[np.array(mbs[0])])
                        errors.append((pred - r[field][rank]) / r[field][rank])
            e = np.array(errors)
            out[f"{key}_median_err"] = float(np.median(np.abs(e))) if len(e) else None
            out[f"{key}_p90_err"] = float(np.percentile(np.abs(e), 90)) if len(e) else None
            out[f"{key}_median_signed"] = float(np.median(e)) if len(e) else None
    return out


def figure(logs, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [n for n in logs if logs[n]]
    fig, axes = plt.subplots(
        len(names), 1, figsize=(10, 2.4 * len(names)), sharey=True, squeeze=False
    )
    for ax, name in zip(axes[:, 0], names, strict=True):
        recs = logs[name]
        c = np.array([r["compute_ms"] for r in recs])
        for rank in range(c.shape[1]):
            ax.plot(c[:, rank], ".-", lw=0.6, ms=3, label=f"rank {rank}")
        ax.set_title(f"{name}: per-rank compute time per step (ms)")
        ax.legend(fontsize=7, loc="upper right")
    axes[-1, 0].set_xlabel("optimizer step")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gpus", type=int, nargs="+", default=[2])
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--config", default="wan2.1-1.3B")
    ap.add_argument("--samples", type=int, default=240)
    ap.add_argument("--mix", default="joint-pretrain")
    ap.add_argument("--data", default="/tmp/adaptiveload_e2e_data")
    ap.add_argument("--out", default=os.path.join(os.environ.get("OUT", "/tmp"), "e2e"))
    ap.add_argument("--memory-budget", type=float, default=100.0, help="GiB per GPU for max_tokens")
    ap.add_argument(
        "--max-tokens", type=int, default=None, help="default: suggested by calibration"
    )
    ap.add_argument("--calibrate", action="store_true", help="calibrate the cost model first")
    ap.add_argument("--cost-model", default=None, help="calibrated JSON (skips --calibrate)")
    ap.add_argument("--arms", nargs="+", default=list(ARMS))
    ap.add_argument("--warmup-steps", type=int, default=2)
    ap.add_argument("--activation-checkpointing", action="store_true")
    ap.add_argument(
        "--cold-shapes",
        action="store_true",
        help="time each arm's first run of every micro-batch shape too (by default each arm "
        "runs its shapes once, untimed, before its epoch: train_wan.py --warm-shapes)",
    )
    args = ap.parse_args()

    import torch

    if not torch.cuda.is_available():
        raise SystemExit("e2e_wan.py needs CUDA GPUs")
    sys.path.insert(0, os.path.join(ROOT, "python"))
    from adaptiveload import CostModel
    from adaptiveload.metadata import read_metadata

    os.makedirs(args.out, exist_ok=True)
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join(
            [os.path.join(ROOT, "python"), os.environ.get("PYTHONPATH", "")]
        ),
    )
    if not os.path.exists(os.path.join(args.data, "metadata.csv")):
        rc, secs = run(
            [
                sys.executable,
                os.path.join(ROOT, "examples", "make_synthetic_latents.py"),
                "--out",
                args.data,
                "--num-samples",
                str(args.samples),
                "--mix",
                args.mix,
            ],
            os.path.join(args.out, "data.log"),
            env,
        )
        print(f"data: {args.samples} samples in {secs:.0f} s (rc {rc})", flush=True)
    meta = read_metadata(os.path.join(args.data, "metadata.csv"))
    seq_lens = meta.seq_lens

    cost_path = args.cost_model
    if cost_path is None and args.calibrate:
        cost_path = os.path.join(args.out, "cost_model.json")
        cmd = [
            sys.executable,
            "-m",
            "adaptiveload",
            "calibrate",
            "--config",
            args.config,
            "--layers",
            str(args.layers),
            "--max-tokens",
            str(int(2 * seq_lens.max())),
            "--memory-budget",
            str(args.memory_budget),
            "--out",
            cost_path,
            "--no-progress",
            "--repeat",
            "3",
            "--warmup",
            "1",
        ]
        if args.activation_checkpointing:
            cmd.append("--activation-checkpointing")
        rc, secs = run(cmd, os.path.join(args.out, "calibrate.log"), env)
        print(f"calibration: rc {rc} in {secs:.0f} s", flush=True)
        print(open(os.path.join(args.out, "calibrate.log")).read()[-2500:], flush=True)
    cost = CostModel.from_json(cost_path) if cost_path else None
    budget = args.memory_budget * 2**30
    max_tokens = args.max_tokens
    if max_tokens is None and cost_path:
        with open(cost_path) as f:
            cal = json.load(f)
        mem = cal.get("memory", {})
        if mem.get("m1_bytes_per_token"):
            max_tokens = int((budget - mem["m0_bytes"]) / mem["m1_bytes_per_token"])
    max_tokens = max_tokens or int(2 * seq_lens.max())
    max_tokens = max(max_tokens, int(seq_lens.max()))
    print(f"max_tokens = {max_tokens}", flush=True)

    results, logs = {}, {}
    for gpus in args.gpus:
        for arm in args.arms:
            name = f"{arm} ({gpus} GPU{'s' if gpus > 1 else ''})"
            log = os.path.join(args.out, f"{arm}_{gpus}gpu.jsonl")
            if os.path.exists(log):
                os.remove(log)
            cmd = [
                sys.executable,
                "-m",
                "torch.distributed.run",
                "--standalone",
                f"--nproc_per_node={gpus}",
                os.path.join(ROOT, "examples", "train_wan.py"),
                "--data",
                args.data,
                "--config",
                args.config,
                "--layers",
                str(args.layers),
                "--max-tokens",
                str(max_tokens),
                "--log-file",
                log,
                "--no-progress",
                "--num-workers",
                "4",
                *ARMS[arm],
            ]
            if cost_path:
                cmd += ["--cost-model", cost_path]
            if args.activation_checkpointing:
                cmd.append("--activation-checkpointing")
            if not args.cold_shapes:
                cmd.append("--warm-shapes")
            rc, secs = run(cmd, os.path.join(args.out, f"{arm}_{gpus}gpu.log"), env)
            lines_in = read_jsonl(log)
            recs = [r for r in lines_in if "step" in r]
            warm = [r for r in lines_in if "warm_shapes" in r]
            oom = "OutOfMemoryError" in open(os.path.join(args.out, f"{arm}_{gpus}gpu.log")).read()
            res = summarize(recs, args.warmup_steps, seq_lens, cost, budget) or {}
            res.update(rc=rc, wall_s=secs, oom=oom)
            if warm:
                res.update(
                    warm_shapes=sum(r["warm_shapes"] for r in warm),
                    warm_s=sum(r["warm_s"] for r in warm),
                )
            results[name] = res
            logs[name] = recs
            print(
                name,
                json.dumps(
                    {k: (round(v, 4) if isinstance(v, float) else v) for k, v in res.items()}
                ),
                flush=True,
            )
    figure(logs, os.path.join(args.out, "e2e_wan.png"))

    lines = [
        f"Wan-2.1-1.3B configuration, {args.layers} of 30 blocks, bf16, eager diffusers; {len(seq_lens)} "
        f"samples of the '{args.mix}' mix (synthetic latents, 512 text tokens); one epoch per arm; "
        f"max_tokens = {max_tokens}; memory budget {args.memory_budget:g} GiB per GPU; first "
        f"{args.warmup_steps} steps left out of imbalance and prediction error. {torch.cuda.get_device_name()}, torch "
        f"{torch.__version__}, {date.today()}. "
        + (
            "Each arm first ran each of its distinct micro-batch shapes once, untimed "
            "(train_wan.py --warm-shapes). "
            if not args.cold_shapes
            else "First runs of each micro-batch shape are timed (--cold-shapes). "
        )
        + f"Command: `python benchmarks/e2e_wan.py {' '.join(sys.argv[1:])}`.",
        "",
        "| arm | imbalance | samples/s | tokens/s | speedup | epoch (s) | peak GiB | peak / budget "
        "| mean peak / budget | OOM | cost-model error median / p90 (step; model only) "
        "| shapes warmed (s) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for gpus in args.gpus:
        base = results.get(f"baseline ({gpus} GPU{'s' if gpus > 1 else ''})", {}).get("epoch_s")
        for name, r in results.items():
            if (
                not name.endswith(f"({gpus} GPU{'s' if gpus > 1 else ''})")
                or "samples_per_s" not in r
            ):
                continue
            err = "; ".join(
                f"{r[k + '_median_err']:.1%} / {r[k + '_p90_err']:.1%}"
                for k in ("pred", "pred_model")
                if r.get(k + "_median_err") is not None
            )
            speedup = f"{base / r['epoch_s']:.2f}x" if base else "-"
            lines.append(
                f"| {name} | {r['imbalance']:.1%} | {r['samples_per_s']:.2f} | {r['tokens_per_s']:.0f} | "
                f"{speedup} | {r['epoch_s']:.1f} | {r['peak_gib']:.1f} | "
                f"{r['peak_over_budget']:.0%} | {r['mean_peak_util']:.0%} | "
                f"{'yes' if r['oom'] else 'no'} | {err or '-'} | "
                + (f"{r['warm_shapes']} ({r['warm_s']:.1f}) |" if "warm_s" in r else "- |")
            )
    text = "\n".join(lines)
    print(text)
    with open(os.path.join(args.out, "e2e_results.md"), "w") as f:
        f.write(text + "\n")
    with open(os.path.join(args.out, "e2e_results.json"), "w") as f:
        json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
