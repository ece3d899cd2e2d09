"""Fast and faithful: the predicted frontier of each setup teams run, default against the
alternatives (issue #54's targets).

For the held-out mix of benchmarks/replay_wan.py (shapes outside every calibration grid), the
built-in Wan-2.1-1.3B profile (``CostModel.wan21_h200("1.3B")``), 8 and 64 ranks, packed
micro-batches or one sample each, K = 1 or 4, with and without sequence parallelism over 4
ranks (the most Ulysses gives a 12-head model without a ring) and over 8 (Ulysses 4 x ring 2,
its communication priced at ``ring_comm_factor``): each arm's plan against the
baseline it replaces (equal-token buckets; at batch size 1 shuffled single samples), its
predicted imbalance and how representative its steps are (``step_composition`` by shape over a
shuffle's of the same micro-batches, and steps without an image beside a shuffle's). Arms:
the default (composition="representative"), composition="balanced" at the setup's tolerance
(speed over fidelity), at 0 (steps of similar cost) and at 1 (every window dealt round-robin).

    PYTHONPATH=python python benchmarks/frontier.py            # prints the table
    PYTHONPATH=python python benchmarks/frontier.py --write    # and stores it in RESULTS.md

Predicted times are the cost model's; benchmarks/replay_sp.py and replay_mix.py replay plans
on a GPU.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from datetime import date

import numpy as np

from adaptiveload import CostModel
from adaptiveload.compare import compare_samplers
from adaptiveload.composition import step_composition
from adaptiveload.report import representative

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from replay_wan import held_out_metadata  # noqa: E402

SETUPS = {  # name: (max_batch_size, K, sequence_parallel)
    "packed K=1": (None, 1, 1),
    "packed K=4": (None, 4, 1),
    "batch 1 K=1": (1, 1, 1),
    "batch 1 K=4": (1, 4, 1),
    "batch 1 K=1 sp4": (1, 1, 4),
    "batch 1 K=4 sp4": (1, 4, 4),
    "batch 1 K=1 sp8": (1, 1, 8),
    "batch 1 K=4 sp8": (1, 4, 8),
}
ARMS = {  # name: sampler keywords
    "default": {},
    "balanced": {"composition": "balanced"},
    "balanced, tolerance 0": {"composition": "balanced", "mix_tolerance": 0.0},
    "balanced, tolerance 1": {"composition": "balanced", "mix_tolerance": 1.0},
}
# Issue #54's targets for the default at 8 ranks: speed over the baseline (None: faithful only).
TARGETS = {
    "packed K=1": 1.30,
    "packed K=4": 1.25,
    "batch 1 K=1": None,
    "batch 1 K=4": None,
    "batch 1 K=1 sp4": 2.5,
    "batch 1 K=4 sp4": 2.0,
    "batch 1 K=1 sp8": None,
    "batch 1 K=4 sp8": None,
}


def row(meta, image, max_tokens, cost, world, setup, arm) -> list:
    b, k, sp = SETUPS[setup]
    out = compare_samplers(
        meta.seq_lens, max_tokens, cost_model=cost, group_keys=meta.group_keys(),
        num_replicas=world, micro_batches_per_step=k, max_batch_size=b, sequence_parallel=sp,
        **ARMS[arm],
    )  # fmt: skip
    ours, base = out["AdaptiveLoad"], out["equal-token buckets"]
    comp = ours.report.composition
    img = step_composition(ours.plan, image, meta.seq_lens)
    target = TARGETS[setup] if arm == "default" and world == 8 else None
    speed = base.report.epoch_time / ours.report.epoch_time
    met = "" if arm != "default" else ("yes" if representative(comp) else "no")
    if target is not None:
        met += ", speed yes" if speed >= target else ", speed no"
    return [
        world, setup, arm, f"{speed:.2f}x", f"{ours.report.imbalance:.1%}",
        f"{comp.tokens_ratio:.2f}x", f"{comp.samples_ratio:.2f}x",
        f"{img.missing:.0%} ({img.shuffle_missing:.0%})",
        "yes" if representative(comp) else "no",
        "" if target is None else f">= {target:.2f}x", met,
    ]  # fmt: skip


HEAD = [
    "ranks", "structure", "arm", "speed vs baseline", "predicted imbalance", "distance (tokens)",
    "distance (samples)", "steps missing a modality (shuffle)", "representative",
    "target (default, 8 ranks)", "met",
]  # fmt: skip


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--samples", type=int, default=20_000)
    ap.add_argument("--worlds", default="8,64")
    ap.add_argument("--write", action="store_true", help="store under benchmarks/results/cpu")
    args = ap.parse_args(argv)
    meta = held_out_metadata(args.samples)
    image = (meta.shapes[:, 0] == 1).astype(np.int64)
    max_tokens = int(2 * meta.seq_lens.max())
    cost = CostModel.wan21_h200("1.3B")
    rows, t0 = [], time.perf_counter()
    for world in (int(w) for w in args.worlds.split(",")):
        for setup in SETUPS:
            for arm in ARMS:
                rows.append(row(meta, image, max_tokens, cost, world, setup, arm))
                print(" | ".join(str(v) for v in rows[-1]), flush=True)
    print(f"{time.perf_counter() - t0:.0f} s")
    if args.write:
        from make_results import write_results

        meta_cols = {
            "date": date.today().isoformat(),
            "machine": "cpu (predicted)",
            "command": f"benchmarks/frontier.py --samples {args.samples}",
        }
        write_results("cpu/frontier.csv", HEAD, rows, meta_cols)
    return 0


if __name__ == "__main__":
    sys.exit(main())
