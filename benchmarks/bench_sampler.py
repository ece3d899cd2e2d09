"""How well does each sampler balance ranks, and how fast does it plan? (CPU only)

Simulates epochs of image+video mixes and times every micro-batch with the MEASURED
forward+backward times of a Wan-2.1-14B-shaped block on an H200 (the table in
benchmarks/data/wan_block_cost_h200.json, interpolated; x 40 layers), not with the cost
model the planner used. Compared at the same max_tokens (twice the longest sample), by
adaptiveload.compare.compare_samplers:

- AdaptiveLoad: AdaptiveBatchSampler with its defaults (cost model: the built-in fit);
- equal-token: EqualTokenBatchSampler (same-shape buckets, floor(max_tokens / S) samples,
  ranks draw independently);
- paper rule: dual caps with cost S^1.5 and no cross-rank balancing.

Then plans an epoch of 10 million samples for 1,024 ranks and reports time and memory.

    python benchmarks/bench_sampler.py [--table PATH] [--write]   # --write: results/cpu/*.csv
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import subprocess
import sys
from datetime import date

import numpy as np

from adaptiveload import CostModel, Plan, balance_report
from adaptiveload.compare import COMPARED_SAMPLERS, compare_samplers
from adaptiveload.demo import MIXES, demo_metadata
from adaptiveload.report import rescore

HERE = os.path.dirname(os.path.abspath(__file__))
# The project's block measurements (copied from shared/data/wan_block_cost_h200.json; its
# "what" field says how they were taken), kept here so the benchmark reads only the repo.
DEFAULT_TABLE = os.path.join(HERE, "data", "wan_block_cost_h200.json")
LAYERS = 40


class MeasuredBlockTime:
    """t(S, B): time of a micro-batch of B samples of S tokens, from the measured rows.

    For each measured S, time is linear in B through its B=1 row and its largest-B row
    (a single row: proportional to B). Between measured S, log-log interpolation at the
    same B; beyond them, log-log extrapolation from the two nearest."""

    def __init__(self, path: str, cfg: str = "wan14B", layers: int = LAYERS):
        with open(path) as f:
            rows = [r for r in json.load(f)["rows"] if r["cfg"] == cfg]
        self.layers = layers
        by_s: dict[int, dict[int, float]] = {}
        for r in rows:
            by_s.setdefault(int(r["S"]), {})[int(r["B"])] = float(r["fwdbwd_ms"])
        self.s = np.array(sorted(by_s), dtype=np.float64)
        self.t1 = np.array([by_s[s][1] for s in sorted(by_s)])
        slopes = []
        for s in sorted(by_s):
            bmax = max(by_s[s])
            slopes.append((by_s[s][bmax] - by_s[s][1]) / (bmax - 1) if bmax > 1 else by_s[s][1])
        self.slope = np.array(slopes)

    def _at_measured(self, b: np.ndarray) -> np.ndarray:
        # (num_measured_S, len(b))
        return self.t1[:, None] + (b[None, :] - 1) * self.slope[:, None]

    def __call__(self, seq: np.ndarray, batch: np.ndarray) -> np.ndarray:
        seq = np.asarray(seq, np.float64)
        batch = np.asarray(batch, np.float64)
        grid = np.log(self._at_measured(batch))  # (nS, n)
        ls = np.log(self.s)
        x = np.log(seq)
        j = np.clip(np.searchsorted(ls, x) - 1, 0, len(ls) - 2)
        w = (x - ls[j]) / (ls[j + 1] - ls[j])
        cols = np.arange(len(seq))
        y = grid[j, cols] * (1 - w) + grid[j + 1, cols] * w
        return self.layers * np.exp(y)

    def plan_times(self, plan: Plan, seq_lens: np.ndarray) -> np.ndarray:
        """Measured-table time of every micro-batch of ``plan`` (ms)."""
        sizes = np.diff(plan.offsets)
        mb_of_sample = np.repeat(np.arange(plan.num_micro_batches), sizes)
        per_sample = self(seq_lens[plan.samples], sizes[mb_of_sample]) / sizes[mb_of_sample]
        return np.add.reduceat(per_sample, plan.offsets[:-1]) if len(per_sample) else per_sample


def simulate(plan: Plan, times: np.ndarray) -> dict:
    """The balance report of ``plan`` with its micro-batches timed by ``times`` (ms)."""
    rep = balance_report(dataclasses.replace(plan, costs=times, max_cost=None))
    return {
        "steps": rep.num_steps,
        "imbalance": rep.imbalance,
        "spread": rep.spread,
        "epoch_s": rep.epoch_time / 1000,
        "bound_s": rep.ideal_time / 1000,
    }


def compare(meta, world: int, k: int, table: MeasuredBlockTime, lookahead: int = 16) -> dict:
    lens = meta.seq_lens
    compared = compare_samplers(
        lens,
        int(2 * lens.max()),
        cost_model=CostModel.default(),
        group_keys=meta.group_keys(),
        num_replicas=world,
        micro_batches_per_step=k,
        lookahead_steps=lookahead,
    )
    out = {}
    for name, (sampler, plan, _) in compared.items():
        label = COMPARED_SAMPLERS[name]
        res = simulate(plan, table.plan_times(plan, lens))
        res["padded"] = plan.num_padded_samples
        if label == "AdaptiveLoad":
            # Costs recomputed in Python from the model, independently of the C++ plan.
            check = balance_report(rescore(plan, lens, sampler.cost_model, sampler.max_cost))
            res["over_cap"] = check.over_token_cap + check.over_cost_cap
        out[label] = res
    base = out["equal-token"]["epoch_s"]
    for res in out.values():
        res["speedup"] = base / res["epoch_s"]
    return out


PLAN_SCALE_CODE = """
import resource, sys, time, numpy as np
def rss(): return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
n, world = int(sys.argv[1]), int(sys.argv[2])
rng = np.random.default_rng(0)
lens = rng.choice([1560, 3600, 7800, 14040, 20280, 32400, 32760, 46800, 75600], size=n,
                  p=[.3, .1, .05, .05, .05, .05, .2, .05, .15]).astype(np.int64)
from adaptiveload import AdaptiveBatchSampler
base = rss()
t0 = time.perf_counter()
s = AdaptiveBatchSampler(lens, 151200, num_replicas=world, rank=0, micro_batches_per_step=1)
t1 = time.perf_counter()
plan = s.plan()
t2 = time.perf_counter()
print(t1 - t0, t2 - t1, (rss() - base) / n, plan.num_steps)
"""


def plan_scale(n: int, world: int) -> dict:
    # A fresh process, pinned to one core, so peak RSS and time belong to this plan alone.
    cmd = [sys.executable, "-c", PLAN_SCALE_CODE, str(n), str(world)]
    if hasattr(os, "sched_setaffinity"):
        cmd = ["taskset", "-c", "0"] + cmd
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout.split()
    build, plan, bytes_per_sample, steps = float(out[0]), float(out[1]), float(out[2]), int(out[3])
    return {
        "samples": n,
        "ranks": world,
        "build_s": build,
        "plan_s": plan,
        "bytes_per_sample": bytes_per_sample,
        "steps": steps,
    }


def render(results: dict, lookahead: dict, scale: dict, samples: int) -> str:
    lines = [
        f"Simulated with the measured Wan-2.1-14B block table on an H200 x {LAYERS} layers; "
        f"{samples:,} samples per mix; max_tokens = 2 x the longest sample; "
        f"{date.today()}, {platform.processor() or platform.machine()}, "
        "command: `python benchmarks/bench_sampler.py --write`.",
        "",
        "| mix | W | K | sampler | imbalance | spread | epoch (s) | speedup vs equal-token | vs own bound | over cap | repeated |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for (mix, world, k), res in results.items():
        for name, r in res.items():
            lines.append(
                f"| {mix} | {world} | {k} | {name} | {r['imbalance']:.1%} | {r['spread']:.1%} | {r['epoch_s']:.0f} | "
                f"{r['speedup']:.2f}x | +{r['epoch_s'] / r['bound_s'] - 1:.1%} | {r.get('over_cap', '-')} | {r['padded']} |"
            )
    lines += [
        "",
        "Lookahead window (joint-pretrain, W = 8): how far the order departs from a plain shuffle against balance.",
        "",
        "| lookahead_steps | K | imbalance | speedup vs equal-token |",
        "|---|---|---|---|",
    ]
    for (la, k), r in lookahead.items():
        lines.append(f"| {la} | {k} | {r['imbalance']:.1%} | {r['speedup']:.2f}x |")
    lines += [
        "",
        "Planning cost (one core, fresh process):",
        "",
        "| samples | ranks | steps | build table (s) | plan epoch (s) | peak memory per sample (bytes) |",
        "|---|---|---|---|---|---|",
        f"| {scale['samples']:,} | {scale['ranks']} | {scale['steps']:,} | {scale['build_s']:.2f} | {scale['plan_s']:.2f} | {scale['bytes_per_sample']:.0f} |",
    ]
    return "\n".join(lines)


def write_csvs(results: dict, lookahead: dict, scale: dict) -> None:
    """benchmarks/results/cpu/{sampler_balance,sampler_lookahead,planning_cost}.csv, then
    RESULTS.md (benchmarks/make_results.py)."""
    from make_results import write_results

    meta = {
        "date": str(date.today()),
        "machine": f"{platform.processor() or platform.machine()}, one core",
        "command": "python benchmarks/bench_sampler.py --write",
    }
    head = ["mix", "W", "K", "sampler", "imbalance", "spread", "epoch (s)"]
    head += ["speedup vs equal-token", "vs own bound", "over cap", "repeated"]
    rows = [
        [mix, world, k, name, f"{r['imbalance']:.1%}", f"{r['spread']:.1%}", f"{r['epoch_s']:.0f}",
         f"{r['speedup']:.2f}x", f"+{r['epoch_s'] / r['bound_s'] - 1:.1%}", r.get("over_cap", "-"),
         r["padded"]]
        for (mix, world, k), res in results.items()
        for name, r in res.items()
    ]  # fmt: skip
    write_results("cpu/sampler_balance.csv", head, rows, meta)
    rows = [
        [la, k, f"{r['imbalance']:.1%}", f"{r['speedup']:.2f}x"] for (la, k), r in lookahead.items()
    ]
    write_results(
        "cpu/sampler_lookahead.csv",
        ["lookahead_steps", "K", "imbalance", "speedup vs equal-token"],
        rows,
        meta,
    )
    head = ["samples", "ranks", "steps", "build table (s)", "plan epoch (s)"]
    head.append("peak memory per sample (bytes)")
    row = [f"{scale['samples']:,}", scale["ranks"], f"{scale['steps']:,}", f"{scale['build_s']:.2f}",
           f"{scale['plan_s']:.2f}", f"{scale['bytes_per_sample']:.0f}"]  # fmt: skip
    write_results("cpu/planning_cost.csv", head, [row], meta)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--table",
        default=DEFAULT_TABLE,
        help="measured block times, JSON (default: benchmarks/data/wan_block_cost_h200.json)",
    )
    ap.add_argument("--samples", type=int, default=50_000)
    ap.add_argument("--scale-samples", type=int, default=10_000_000)
    ap.add_argument(
        "--write", action="store_true", help="write benchmarks/results/cpu/*.csv and RESULTS.md"
    )
    args = ap.parse_args()
    table = MeasuredBlockTime(args.table)

    results = {}
    for mix in MIXES:
        meta = demo_metadata(args.samples, mix, seed=1)
        for world in (2, 8, 64):
            for k in (1, 4):
                results[(mix, world, k)] = res = compare(meta, world, k, table)
                print(
                    mix,
                    world,
                    k,
                    {n: f"{r['imbalance']:.3f}/{r['speedup']:.2f}x" for n, r in res.items()},
                    flush=True,
                )
    lookahead = {}
    meta = demo_metadata(args.samples, "joint-pretrain", seed=1)
    for la in (1, 4, 16, 64):
        for k in (1, 4):
            lookahead[(la, k)] = compare(meta, 8, k, table, lookahead=la)["AdaptiveLoad"]
    scale = plan_scale(args.scale_samples, 1024)
    print(scale)
    text = render(results, lookahead, scale, args.samples)
    print(text)
    if args.write:
        write_csvs(results, lookahead, scale)


if __name__ == "__main__":
    main()
