"""What one member's share of a split micro-batch costs, against the whole (#35).

A micro-batch split d ways ideally costs each member 1/d of the whole. Work done per sample
rather than per token does not shrink: with cross-attention on the token shard, every member
projects the whole text (512 tokens per sample) to keys and values for every head.
``parallel.wan`` runs cross-attention on head shards (each member projects the text for its own
heads; its queries and output cross the group) where samples are short beside the text and the
group is large enough (``HEAD_SHARDS_UP_TO_TOKENS_PER_TEXT_TOKEN``, ``HEAD_SHARDS_FROM_DEGREE``,
set from these numbers). This times, on one GPU, one member's share (``parallel.ONE_DEVICE``)
both ways, Wan 2.1 with ``--layers`` blocks, bf16, the project's fused adaLN where built,
activation checkpointing; the all-to-alls are not timed (the replay models them).

    python benchmarks/bench_split_share.py --out out/share [--write]

Columns: S (tokens per sample), B (samples), d, whole ms, share ms with cross-attention on the
token shard and on head shards, and each share times d over the whole (1.00: no overhead).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from datetime import date

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

# (pixel shape (frames, height, width), samples): packed images, packed short clips, long clips.
KINDS = [
    ((1, 480, 832), 96),
    ((1, 720, 1280), 42),
    ((81, 480, 832), 4),
    ((49, 720, 1280), 2),
    ((81, 720, 1280), 1),
]
DEGREES = (2, 4, 8)


def token_shard_cross_attention(model, on: bool) -> None:
    """Swap each block's cross-attention between head shards for every length (off) and Wan's
    own processor on the token shard (on)."""
    from adaptiveload.parallel import wan
    from adaptiveload.parallel.wan import _CrossProcessor

    # Head shards whatever the length: the rule (parallel.wan) is what this measures.
    wan.HEAD_SHARDS_UP_TO_TOKENS_PER_TEXT_TOKEN = 2**40
    wan.HEAD_SHARDS_FROM_DEGREE = 2
    for block in model.blocks:
        p = block.attn2.processor
        if on and isinstance(p, _CrossProcessor):
            block.attn2._adaptiveload_heads = p
            block.attn2.processor = p.plain
        elif not on and hasattr(block.attn2, "_adaptiveload_heads"):
            block.attn2.processor = block.attn2._adaptiveload_heads


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", default="wan2.1-14B")
    ap.add_argument("--layers", type=int, default=1)
    ap.add_argument("--out", default="out/share")
    ap.add_argument("--write", action="store_true", help="store the CSV under benchmarks/results")
    args = ap.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    from adaptiveload.timing import WanTimer
    from adaptiveload.wan import wan_seq_len

    try:
        import adaptiveload._C  # noqa: F401

        fused = True
    except ImportError:
        fused = False
    timer = WanTimer(args.config, layers=args.layers, dtype=torch.bfloat16, fused=fused,
                     warmup=1, repeat=3, activation_checkpointing=True)  # fmt: skip
    rows = []
    t0 = time.perf_counter()
    for shape, b in KINDS:
        s = int(wan_seq_len(*shape))
        whole = timer(b, shape)[0]
        for d in DEGREES:
            timer(b, shape, degree=d)  # installs the split the first time
            token_shard_cross_attention(timer.model, True)
            token = timer(b, shape, degree=d)[0]
            token_shard_cross_attention(timer.model, False)
            heads = timer(b, shape, degree=d)[0]
            row = [s, b, d, round(whole, 2), round(token, 2), round(heads, 2),
                   round(token * d / whole, 3), round(heads * d / whole, 3)]  # fmt: skip
            rows.append(row)
            print(*row, flush=True)
    print(f"{time.perf_counter() - t0:.0f} s", flush=True)
    head = ["S", "B", "d", "whole ms", "share ms, token shard", "share ms, head shards",
            "share x d / whole, token shard", "share x d / whole, head shards"]  # fmt: skip
    from make_results import write_csv

    meta = {"date": str(date.today()), "machine": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
            "command": "python benchmarks/bench_split_share.py --write",
            "setup": f"{args.config}, {args.layers} block(s), {timer.meta['dtype']}, "
                     f"{'fused' if fused else 'diffusers'} adaLN, activation checkpointing, "
                     f"text {timer.text_len} tokens"}  # fmt: skip
    table = [dict(zip(list(meta) + head, list(meta.values()) + r, strict=True)) for r in rows]
    write_csv(os.path.join(args.out, "split_share.csv"), table)
    if args.write:
        from make_results import main as rewrite

        write_csv(os.path.join(HERE, "results", "h200", "split_share.csv"), table)
        rewrite()
    return 0


if __name__ == "__main__":
    sys.exit(main())
