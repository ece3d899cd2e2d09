"""Do streamed plans balance and mix as well as whole-epoch plans? (issue 36's check of the
change the streaming sampler makes to plans; CPU, predicted.)

The held-out mix of benchmarks/replay_wan.py (shapes outside every calibration grid), planned
by ``AdaptiveBatchSampler`` (the whole epoch) and by ``StreamingBatchSampler`` with small
segments (--segment, so that an epoch holds many), with the plan-aware cost model of Wan
2.1-1.3B on the H200. For each: the predicted imbalance (mean over steps of 1 - mean/max rank
cost), the composition distance of steps against a shuffle of the same micro-batches (tokens,
as a ratio: < 1 is more representative than a shuffle) and the share of steps without an image.

    python benchmarks/compare_stream.py [--samples 200000] [--segment 20000] [--write]
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)


def measures(plans, labels, lens):
    from adaptiveload.composition import step_composition

    steps = imb = tv = shuffle_tv = missing = 0.0
    for p in plans:
        if p.num_steps == 0:
            continue
        rc = p.rank_costs()
        imb += float((1 - rc.mean(axis=1) / rc.max(axis=1)).sum())
        c = step_composition(p, labels, lens)
        tv += c.tv_tokens * p.num_steps
        shuffle_tv += c.shuffle_tv_tokens * p.num_steps
        missing += c.missing * p.num_steps
        steps += p.num_steps
    return {"steps": int(steps), "imbalance": imb / steps, "tv_ratio": tv / shuffle_tv,
            "no_image": missing / steps}  # fmt: skip


def main(argv=None) -> int:
    from adaptiveload import AdaptiveBatchSampler, CostModel, StreamingBatchSampler
    from replay_wan import held_out_metadata

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--samples", type=int, default=200_000)
    ap.add_argument("--segment", type=int, default=20_000)
    ap.add_argument("--write", action="store_true")
    args = ap.parse_args(argv)
    meta = held_out_metadata(args.samples)
    lens = np.asarray(meta.seq_lens, np.int64)
    image = np.asarray(meta.shapes)[:, 0] == 1
    cost = CostModel.from_json(os.path.join(HERE, "data", "wan1.3b_30layers_h200_plan_aware.json"))
    rows = []
    for w, k in ((8, 1), (8, 4), (64, 1), (64, 4)):
        kw = {"num_replicas": w, "rank": 0, "micro_batches_per_step": k, "cost_model": cost}
        whole = AdaptiveBatchSampler(lens, 151_200, **kw).plan()
        stream = StreamingBatchSampler(lens, 151_200, segment_samples=args.segment, **kw)
        segs = [s.plan for s in stream.segments()]
        a, b = measures([whole], image, lens), measures(segs, image, lens)
        rows.append((w, k, a, b, len(segs)))
        print(f"W={w:>2} K={k}  whole: imbalance {a['imbalance']:.2%}, TV {a['tv_ratio']:.2f}x, "
              f"no image {a['no_image']:.1%} | streamed ({len(segs)} segments): "
              f"{b['imbalance']:.2%}, {b['tv_ratio']:.2f}x, {b['no_image']:.1%}")  # fmt: skip
    if args.write:
        from make_results import write_results
        from results_io import cpu_meta

        head = ["ranks", "K", "segments", "imbalance, whole", "imbalance, streamed",
                "composition vs shuffle, whole", "composition vs shuffle, streamed",
                "steps without an image, whole", "steps without an image, streamed"]  # fmt: skip
        out = [[w, k, n, f"{a['imbalance']:.2%}", f"{b['imbalance']:.2%}",
                f"{a['tv_ratio']:.2f}x", f"{b['tv_ratio']:.2f}x", f"{a['no_image']:.1%}",
                f"{b['no_image']:.1%}"] for w, k, a, b, n in rows]  # fmt: skip
        meta_row = cpu_meta(
            f"python benchmarks/compare_stream.py --samples {args.samples} "
            f"--segment {args.segment} --write"
        )
        print("wrote", write_results("cpu/stream_vs_whole.csv", head, out, meta_row))
    return 0


if __name__ == "__main__":
    sys.exit(main())
