"""Memory headroom into speed: the checkpointing policy, measured on one GPU for W ranks.

The question: at one memory budget, how much faster is an epoch when each micro-batch
checkpoints only the blocks its memory needs, instead of all of them?

1. Memory calibration: peak memory and time of micro-batch kinds of the mix with n = 0, L/2,
   L - 1 and L of the model's L blocks checkpointed (``measure_memory_points``); the memory model
   is fitted to them (``fit_checkpoint_memory_model``: its error, margin and recompute share
   are reported).
2. Plans at the budget, W ranks, K micro-batches per rank per step:

       equal-token, full ckpt   EqualTokenBatchSampler, max_tokens = the most at which a
                                 micro-batch of any shape fits the budget at full
                                 checkpointing; every block checkpointed
       balanced, full ckpt      AdaptiveBatchSampler at that max_tokens, plan-aware calibrated;
                                 every block checkpointed
       policy                   AdaptiveBatchSampler(memory_model, memory_budget_gib),
                                 plan-aware calibrated; each micro-batch with its plan's n
       policy plan, full ckpt   the policy's plan, every block checkpointed

3. Scoring: every distinct (S, B, n) kind the plans use is timed fresh, twice in two orders,
   with its peak memory; each step is its slowest rank's measured time.

Full depth does not fit one GPU's time budget, so the model has ``--layers`` blocks of the
``--full-layers`` of the real one, and the budget is emulated: the fitted fixed memory of the
short model (weights, gradients) plus ``--activation-budget-gib`` (the activation memory the
full model has, e.g. ~100 GiB of an H200's 141 GB after the 1.3B model's weights, gradients and
Adam state) times layers / full-layers. Per-token memory outside the blocks (embedding, head,
loss) is not scaled, which makes the emulated budget tighter than the real one.

    python benchmarks/replay_memory.py --out out/replay_memory          # CUDA + diffusers
    python benchmarks/replay_memory.py --fake --out /tmp/replay_memory  # synthetic GPU, any machine

Writes replay_memory.json, .csv and the fitted memory.json under --out; --write also stores the CSV as
benchmarks/results/<gpu>/replay_memory.csv and rewrites RESULTS.md.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from datetime import date

import numpy as np

from adaptiveload import AdaptiveBatchSampler, CostModel, EqualTokenBatchSampler
from adaptiveload.calibrate import calibrate_memory, calibrate_plan
from adaptiveload.memory import GIB
from adaptiveload.report import balance_report
from adaptiveload.wan import wan_seq_len

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from make_results import write_csv, write_results  # noqa: E402
from replay_wan import MIXES, Timings, held_out_metadata  # noqa: E402

ARMS = ["equal-token, full ckpt", "balanced, full ckpt", "policy plan, full ckpt", "policy"]


class FakeGPU:
    """A synthetic GPU for dry runs: time and memory with checkpointing of n of L blocks."""

    def __init__(self, layers, seed=0):
        self.layers = layers
        self.rng = np.random.default_rng(seed)
        self.meta = {"device": "fake", "config": "fake", "layers": layers}

    def __call__(self, batch, shape, checkpointed=None):
        n = self.layers if checkpointed is None else checkpointed
        s = wan_seq_len(*shape)
        t = batch * s
        work = batch * (0.5 + 1.6e-3 * s + 1.4e-7 * s * s) * self.layers / 3
        ms = max(9.0, 1.5 + work) * (1 - 0.25 * (self.layers - n) / self.layers)
        kept = max(self.layers - n, 1)
        peak = 2e9 + batch * (4e5 + 1.5e7 * kept) + t * (2e4 + 1.36e5 * kept + 3e3 * n)
        noise = 1 + 0.004 * self.rng.standard_normal()
        return ms * noise, int(peak * (1 + 0.002 * self.rng.standard_normal()))


def full_ckpt_max_tokens(memory, seq_lens, budget):
    """The largest max_tokens at which a micro-batch of any of these lengths, filled to it,
    fits the budget with every block checkpointed (the baselines' memory cap)."""
    lo, hi = 0, memory.max_tokens(budget)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        ok = all(
            memory.checkpointed_blocks([int(s)] * (mid // int(s)), budget) >= 0
            for s in seq_lens
            if mid >= s
        )
        lo, hi = (mid, hi) if ok else (lo, mid)
    return lo


def plan_slots(plan, lens, shapes, n_of):
    """(S, B, n) per micro-batch (first sample's length; micro-batches never mix shapes)."""
    sizes = np.diff(plan.offsets)
    first = plan.samples[plan.offsets[:-1]]
    return [
        (int(lens[i]), int(b), int(n_of(m)), tuple(int(v) for v in shapes[i]))
        for m, (i, b) in enumerate(zip(first, sizes, strict=True))
    ]


def score_timings(timer, kinds, seed=0):
    """Fresh (ms, peak) of every (S, B, n) kind, twice: ascending, then shuffled."""
    t0 = time.perf_counter()
    order = sorted(kinds)
    first = {k: timer(k[1], kinds[k], checkpointed=k[2]) for k in order}
    shuffled = list(order)
    random.Random(seed).shuffle(shuffled)
    second = {k: timer(k[1], kinds[k], checkpointed=k[2]) for k in shuffled}
    ms = {k: (first[k][0] + second[k][0]) / 2 for k in order}
    peak = {k: max(first[k][1], second[k][1]) for k in order}
    spread = {k: abs(first[k][0] - second[k][0]) / ms[k] for k in order}
    return ms, peak, spread, time.perf_counter() - t0


def score(plan, slots, ms, peak, budget):
    t = np.array([ms[s[:3]] for s in slots])
    loads = plan.rank_sums(t)
    mx, mean = loads.max(axis=1), loads.mean(axis=1)
    util = np.array([peak[s[:3]] for s in slots], float) / budget
    return {
        "steps": plan.num_steps,
        "micro_batches": plan.num_micro_batches,
        "epoch_s": float(mx.sum()) / 1000,
        "imbalance": float(np.mean(1 - mean / mx)),
        "predicted_imbalance": balance_report(plan).imbalance,
        "peak_over_budget_mean": float(util.mean()),
        "peak_over_budget_p10": float(np.percentile(util, 10)),
        "peak_over_budget_min": float(util.min()),
        "peak_over_budget_max": float(util.max()),
        "over_budget": int((util > 1).sum()),
        "blocks_checkpointed_mean": float(np.mean([s[2] for s in slots])),
    }


def parse_ints(text):
    return [int(v) for v in text.split(",") if v]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--samples", type=int, default=100_000)
    ap.add_argument("--mix", default="held-out", choices=sorted(MIXES))
    ap.add_argument("--config", default="wan2.1-1.3B")
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--full-layers", type=int, default=30)
    ap.add_argument("--activation-budget-gib", type=float, default=100.0)
    ap.add_argument("--worlds", type=parse_ints, default=[8])
    ap.add_argument("--ks", type=parse_ints, default=[1, 4])
    ap.add_argument("--epoch", type=int, default=2, help="the scored epoch")
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--fake", action="store_true", help="a synthetic GPU (dry run, any machine)")
    ap.add_argument("--out", default="out/replay_memory")
    ap.add_argument("--write", action="store_true", help="store the CSV under benchmarks/results")
    args = ap.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    meta = held_out_metadata(args.samples, mix=args.mix)
    lens = meta.seq_lens
    layers = args.layers
    if args.fake:
        timer = FakeGPU(layers)
    else:
        import torch

        from adaptiveload.calibrate import WanTimer

        timer = WanTimer(
            args.config, layers=layers, dtype=torch.bfloat16, fused=True,
            warmup=args.warmup, repeat=args.repeat, activation_checkpointing=True,
        )  # fmt: skip

    # 1. The memory model.
    t0 = time.perf_counter()
    memory, rows = calibrate_memory(
        timer, meta.shapes, 2 * int(lens.max()),
        points_file=os.path.join(args.out, "memory_points.jsonl"), log=None,
    )  # fmt: skip
    fit_rows = [r for r in rows if not r["oom"]]
    mem_s = time.perf_counter() - t0
    memory.save(os.path.join(args.out, "memory.json"))
    budget_gib = memory.coefficients()["m0"] / GIB + args.activation_budget_gib * (
        layers / args.full_layers
    )
    budget = budget_gib * GIB
    full_tokens = full_ckpt_max_tokens(memory, np.unique(lens), budget)
    print(
        f"memory model from {len(fit_rows)} points ({len(rows) - len(fit_rows)} out of memory) "
        f"in {mem_s:.0f} s: {memory!r}\n  {memory.meta}\n  emulated budget {budget_gib:.2f} GiB; "
        f"max tokens at full checkpointing {full_tokens}",
        flush=True,
    )

    # 2. Plans, with plan-aware calibrated cost models (full checkpointing, as the sampler
    # expects them).
    prior = CostModel.wan21_h200("1.3B", layers=layers)
    common = dict(group_keys=meta.group_keys(), rank=0, on_oversize="skip")
    plans, kinds, cal_info = {}, {}, {}
    full = timer.layers
    # Fully checkpointed timings (the timers' default n), shared by the calibrations.
    own = Timings(timer)
    for w in args.worlds:
        for k in args.ks:

            def balanced(model, w=w, k=k):
                return AdaptiveBatchSampler(
                    lens, full_tokens, cost_model=model, num_replicas=w,
                    micro_batches_per_step=k, **common,
                )  # fmt: skip

            def policy(model, w=w, k=k):
                return AdaptiveBatchSampler(
                    lens, None, cost_model=model, num_replicas=w, micro_batches_per_step=k,
                    memory_model=memory, memory_budget_gib=budget_gib, **common,
                )  # fmt: skip

            samplers = {
                "equal-token, full ckpt": EqualTokenBatchSampler(
                    lens,
                    full_tokens,
                    cost_model=prior,
                    num_replicas=w,
                    micro_batches_per_step=k,
                    **common,
                ),  # fmt: skip
            }
            for arm, make in (("balanced, full ckpt", balanced), ("policy", policy)):
                t0 = time.perf_counter()
                cal = calibrate_plan(make, prior, meta.shapes, own, progress=False)
                cal_info[f"{arm} W={w} K={k}"] = {
                    "kinds": cal.meta["kinds_measured"],
                    "rounds": len(cal.meta["rounds"]),
                    "seconds": round(time.perf_counter() - t0, 1),
                }
                samplers[arm] = make(cal.cost_model)
            for arm, s in samplers.items():
                s.set_epoch(args.epoch)
                plan = s.plan()
                n_of = (
                    (lambda m, p=plan: p.checkpointed[m]) if arm == "policy" else (lambda m: full)
                )
                slots = plan_slots(plan, lens, meta.shapes, n_of)
                plans[(w, k, arm)] = (plan, slots)
                if arm == "policy":
                    at_full = [(s_, b, full, sh) for s_, b, _, sh in slots]
                    plans[(w, k, "policy plan, full ckpt")] = (plan, at_full)
                    slots = slots + at_full
                for s_, b, n, sh in slots:
                    kinds[(s_, b, n)] = sh
    print(f"calibrations: {cal_info}", flush=True)

    # 3. Scoring.
    print(f"scoring {len(kinds)} distinct (S, B, n) kinds, twice", flush=True)
    ms, peak, spread, secs = score_timings(timer, kinds)
    noise = np.array(list(spread.values()))
    print(f"scored in {secs:.0f} s; spread median {np.median(noise):.2%}", flush=True)
    out_rows = []
    for (w, k, arm), (plan, slots) in plans.items():
        out_rows.append({"ranks": w, "K": k, "arm": arm, **score(plan, slots, ms, peak, budget)})
    for r in out_rows:

        def base(name, r=r):
            return next(
                x["epoch_s"]
                for x in out_rows
                if (x["ranks"], x["K"], x["arm"]) == (r["ranks"], r["K"], name)
            )

        r["speedup_vs_equal_token"] = base("equal-token, full ckpt") / r["epoch_s"]
        r["speedup_vs_same_plan_full_ckpt"] = base("policy plan, full ckpt") / r["epoch_s"]
    # Memory model error on the policy's kinds (fresh peaks).
    pol = {(s, b, n) for (w, k, a), (_, sl) in plans.items() if a == "policy" for s, b, n, _ in sl}
    err = np.array(
        [(memory.peak_bytes([s] * b, n) - peak[(s, b, n)]) / peak[(s, b, n)] for s, b, n in pol]
    )
    mem_err = {
        "kinds": len(pol),
        "median_abs": float(np.median(np.abs(err))) if len(err) else None,
        "under_max": float(max(0.0, -err.min())) if len(err) else None,
    }
    print(f"memory model on the policy's kinds (fresh peaks): {mem_err}")

    head = f"{'W':>3} {'K':>2} {'arm':<24} {'epoch s':>8} {'vs eq-tok':>9} {'vs full':>8} {'imbal':>6} {'peak/budget mean':>16} {'p10':>5} {'max':>5} {'over':>4} {'n mean':>6}"
    print("\n" + head)
    for r in out_rows:
        print(
            f"{r['ranks']:>3} {r['K']:>2} {r['arm']:<24} {r['epoch_s']:>8.1f} "
            f"{r['speedup_vs_equal_token']:>8.2f}x {r['speedup_vs_same_plan_full_ckpt']:>7.2f}x "
            f"{r['imbalance']:>6.1%} {r['peak_over_budget_mean']:>16.1%} "
            f"{r['peak_over_budget_p10']:>5.0%} {r['peak_over_budget_max']:>5.0%} "
            f"{r['over_budget']:>4} {r['blocks_checkpointed_mean']:>6.2f}"
        )
    setup = {
        "mix": args.mix, "samples": len(lens), "layers": layers, "full_layers": args.full_layers,
        "activation_budget_gib": args.activation_budget_gib, "budget_gib": budget_gib,
        "max_tokens_full_ckpt": full_tokens, **timer.meta,
    }  # fmt: skip
    result = {
        "setup": setup,
        "memory_model": memory.to_dict(),
        "memory_points": rows,
        "memory_error_on_policy_kinds": mem_err,
        "calibration": cal_info,
        "noise": {"median": float(np.median(noise)), "p90": float(np.percentile(noise, 90))},
        "kinds": [[s, b, n, ms[(s, b, n)], peak[(s, b, n)]] for s, b, n in sorted(ms)],
        "rows": out_rows,
    }
    with open(os.path.join(args.out, "replay_memory.json"), "w") as f:
        json.dump(result, f, indent=1, default=str)
    write_csv(os.path.join(args.out, "replay_memory.csv"), out_rows)
    if args.write:
        write(out_rows, setup, result)
    return 0


def write(rows, setup, result):
    head = ["ranks", "K", "arm", "epoch (s)", "speedup vs equal-token", "speedup vs same plan full ckpt",
            "measured imbalance", "peak/budget mean", "peak/budget p10", "peak/budget max",
            "micro-batches over budget", "blocks checkpointed (mean)"]  # fmt: skip
    out = [[r["ranks"], r["K"], r["arm"], f"{r['epoch_s']:.1f}", f"{r['speedup_vs_equal_token']:.2f}x",
            f"{r['speedup_vs_same_plan_full_ckpt']:.2f}x", f"{r['imbalance']:.1%}",
            f"{r['peak_over_budget_mean']:.1%}", f"{r['peak_over_budget_p10']:.1%}",
            f"{r['peak_over_budget_max']:.1%}", r["over_budget"],
            f"{r['blocks_checkpointed_mean']:.2f} of {setup['layers']}"] for r in rows]  # fmt: skip
    gpu = "fake" if setup.get("device") == "fake" else "h200"
    m = result["memory_model"]
    e = result["memory_error_on_policy_kinds"]
    meta = {
        "date": str(date.today()),
        "machine": setup.get("device", ""),
        "command": "python benchmarks/replay_memory.py --write",
        "setup": f"{setup['mix']} mix, {setup['samples']} samples, {setup['layers']} of "
        f"{setup['full_layers']} blocks, emulated budget {setup['budget_gib']:.2f} GiB "
        f"({setup['activation_budget_gib']:g} GiB of activations at full depth, scaled), memory "
        f"model margin {m['margin']:.1%}, recompute share {m['recompute_share']:.1%}, error on the "
        f"policy's kinds median {e['median_abs']:.1%}, worst under-prediction {e['under_max']:.1%}",
    }
    print("wrote", write_results(f"{gpu}/replay_memory.csv", head, out, meta))


if __name__ == "__main__":
    sys.exit(main())
