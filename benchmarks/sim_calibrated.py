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

from adaptiveload import CostModel
from adaptiveload.compare import COMPARED_SAMPLERS, compare_samplers
from adaptiveload.demo import demo_metadata

HERE = os.path.dirname(os.path.abspath(__file__))
MODEL = os.path.join(HERE, "data", "wan1.3b_4layers_h200_calibrated.json")


def simulate(samples: int, world: int, k: int, cost: CostModel) -> dict:
    meta = demo_metadata(samples, "joint-pretrain", seed=1)
    compared = compare_samplers(
        meta.seq_lens,
        int(2 * meta.seq_lens.max()),
        cost_model=cost,
        group_keys=meta.group_keys(),
        num_replicas=world,
        micro_batches_per_step=k,
    )
    return {COMPARED_SAMPLERS[name]: c.report for name, c in compared.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=MODEL)
    ap.add_argument("--samples", type=int, default=50_000)
    ap.add_argument(
        "--write", action="store_true", help="write benchmarks/results/cpu/*.csv and RESULTS.md"
    )
    args = ap.parse_args()
    cost = CostModel.from_json(args.model)
    lines = [
        f"Cost model `{os.path.relpath(args.model, os.path.dirname(HERE))}` ({cost!r}); "
        f"{args.samples:,} samples of the joint-pretrain mix; max_tokens = 2 x the longest sample.",
        "",
        "| ranks | K | sampler | imbalance | epoch (s) | speedup vs equal-token |",
        "|---|---|---|---|---|---|",
    ]
    rows = []
    for world in (2, 8):
        for k in (1, 4):
            reps = simulate(args.samples, world, k, cost)
            base = reps["equal-token"].epoch_time
            for name, r in reps.items():
                rows.append(
                    [world, k, name, f"{r.imbalance:.1%}", f"{r.epoch_time / 1000:.0f}",
                     f"{base / r.epoch_time:.2f}x"]
                )  # fmt: skip
                lines.append("| " + " | ".join(str(c) for c in rows[-1]) + " |")
    print("\n".join(lines))
    if args.write:
        from make_results import write_results

        head = ["ranks", "K", "sampler", "imbalance", "epoch (s)", "speedup vs equal-token"]
        meta = {"date": str(date.today()), "machine": "x86_64"}
        meta["command"] = "python benchmarks/sim_calibrated.py --write"
        write_results("cpu/sim_calibrated.csv", head, rows, meta)


if __name__ == "__main__":
    main()
