"""Simulated epochs at 2 and 8 ranks with the cost model calibrated on the H200.

The cost model in benchmarks/data/wan1.3b_4layers_h200_calibrated.json was fitted by
`adaptiveload calibrate` to forward+backward times of the Wan-2.1-1.3B configuration (4
blocks, fused ops, bf16) measured on an H200. Here it is both the planner's model and the
yardstick: every plan's micro-batches are timed with it. The 2-rank rows can be held against
the measured 2-GPU run (benchmarks/RESULTS.md, "Wan 2.1 end to end"); the 8-rank rows stand
in for the 8-GPU run until such a machine is lent.

    python benchmarks/sim_calibrated.py [--write]
"""

from __future__ import annotations

import argparse
import os
from datetime import date

from adaptiveload import AdaptiveBatchSampler, CostModel, EqualTokenBatchSampler, balance_report
from adaptiveload.demo import demo_metadata
from adaptiveload.report import rescore

HERE = os.path.dirname(os.path.abspath(__file__))
MODEL = os.path.join(HERE, "data", "wan1.3b_4layers_h200_calibrated.json")


def simulate(samples: int, world: int, k: int, cost: CostModel) -> dict:
    meta = demo_metadata(samples, "joint-pretrain", seed=1)
    lens, keys = meta.seq_lens, meta.group_keys()
    common = dict(group_keys=keys, num_replicas=world, rank=0, micro_batches_per_step=k, seed=0)
    max_tokens = int(2 * lens.max())
    plans = {
        "AdaptiveLoad": AdaptiveBatchSampler(lens, max_tokens, cost_model=cost, **common).plan(),
        "equal-token": EqualTokenBatchSampler(lens, max_tokens, cost_model=cost, **common).plan(),
        "paper rule": rescore(
            AdaptiveBatchSampler(
                lens, max_tokens, cost_model=CostModel.power(1.5), balance=False, **common
            ).plan(),
            lens,
            cost,
        ),
    }
    return {name: balance_report(p) for name, p in plans.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=MODEL)
    ap.add_argument("--samples", type=int, default=50_000)
    ap.add_argument("--write", action="store_true", help="update benchmarks/RESULTS.md")
    args = ap.parse_args()
    cost = CostModel.from_json(args.model)
    lines = [
        f"Cost model `{os.path.relpath(args.model, os.path.dirname(HERE))}` ({cost!r}); "
        f"{args.samples:,} samples of the joint-pretrain mix; max_tokens = 2 x the longest sample; "
        f"{date.today()}; command: `python benchmarks/sim_calibrated.py --write`.",
        "",
        "| ranks | K | sampler | imbalance | epoch (s) | speedup vs equal-token |",
        "|---|---|---|---|---|---|",
    ]
    for world in (2, 8):
        for k in (1, 4):
            reps = simulate(args.samples, world, k, cost)
            base = reps["equal-token"].epoch_time
            for name, r in reps.items():
                lines.append(
                    f"| {world} | {k} | {name} | {r.imbalance:.1%} | {r.epoch_time / 1000:.0f} | "
                    f"{base / r.epoch_time:.2f}x |"
                )
    text = "\n".join(lines)
    print(text)
    if args.write:
        import bench_sampler

        bench_sampler.write_section(
            text, "sim-calibrated", "8 ranks with the H200-calibrated cost model"
        )


if __name__ == "__main__":
    main()
