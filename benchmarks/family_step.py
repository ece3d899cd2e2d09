"""What do the fused ops take and save in a training step of each model family?

For each ``--model FAMILY/CONFIG`` (adaptiveload.models), a randomly initialized model at
``--layers`` blocks per stack, bf16, one sample of ``--shape FRAMESxHEIGHTxWIDTH`` pixels:
forward and backward of the whole model (loss: the mean square of its output), timed with
CUDA events, with diffusers' blocks and with ``apply_fused_ops``; and the fused kernels' own
GPU time as a share of the fused step (torch.profiler, one step).

    python benchmarks/family_step.py [--csv FILE] [--write]
    python benchmarks/family_step.py --model ltx-video/ltx-video-2B --shape 121x704x1216
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from datetime import date

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
# (model, pixel shape, layers per stack): a real training shape of each family.
DEFAULTS = [
    ("hunyuanvideo/hunyuanvideo-13B", (65, 480, 832), 2),
    ("ltx-video/ltx-video-2B", (121, 704, 1216), 4),
    ("wan/wan2.1-1.3B", (81, 480, 832), 4),
]


def step(model, inputs):
    out = model(**inputs, return_dict=False)[0]
    out.float().square().mean().backward()


def time_steps(model, inputs, warmup: int, steps: int) -> float:
    for _ in range(warmup):
        step(model, inputs)
        model.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    times = []
    for _ in range(steps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        step(model, inputs)
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
        model.zero_grad(set_to_none=True)
    return statistics.median(times)


def fused_kernel_share(model, inputs) -> float:
    """GPU time of our kernels / all kernels in one fused step (diffsynth_step.kernel_share)."""
    sys.path.insert(0, HERE)
    from diffsynth_step import kernel_share

    share = kernel_share(lambda: step(model, inputs))
    model.zero_grad(set_to_none=True)
    return share


def measure(spec: str, shape, layers: int, warmup: int, steps: int) -> dict:
    from adaptiveload.models import resolve

    family, config = resolve(spec)
    model = family.build(config, layers=layers, device="cuda", dtype=torch.bfloat16)
    model.enable_gradient_checkpointing()
    inputs = family.random_batch(model, 1, *shape, generator=torch.Generator("cuda").manual_seed(0))
    base = time_steps(model, inputs, warmup, steps)
    family.apply_fused_ops(model)
    fused = time_steps(model, inputs, warmup, steps)
    share = fused_kernel_share(model, inputs)
    row = {
        "model": f"{spec}, {layers} blocks per stack, bf16, checkpointed",
        "shape": "x".join(map(str, shape)),
        "tokens": family.seq_len(*shape),
        "diffusers_step_ms": round(base, 2),
        "fused_step_ms": round(fused, 2),
        "saved_share": round((base - fused) / base, 4),
        "speedup": round(base / fused, 4),
        "fused_kernels_share_of_step": round(share, 4),
    }
    print(
        f"{row['model']}, {row['shape']} ({row['tokens']} tokens): diffusers {base:.2f} ms, "
        f"fused {fused:.2f} ms: {base / fused:.3f}x, {(base - fused) / base:.1%} saved; our "
        f"kernels take {share:.1%} of the fused step's GPU time",
        flush=True,
    )
    del model
    torch.cuda.empty_cache()
    return row


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=None, help="FAMILY/CONFIG (default: every DEFAULTS row)")
    ap.add_argument("--shape", default=None, help="FRAMESxHEIGHTxWIDTH pixels, with --model")
    ap.add_argument("--layers", type=int, default=None, help="blocks per stack, with --model")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--csv", help="append the result rows to this CSV")
    ap.add_argument("--write", action="store_true", help="store the CSV under benchmarks/results")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("family_step.py needs a CUDA GPU", file=sys.stderr)
        return 1
    runs = DEFAULTS
    if args.model:
        shape = tuple(int(v) for v in args.shape.split("x")) if args.shape else (49, 480, 832)
        runs = [(args.model, shape, args.layers or 2)]
    rows = [measure(spec, shape, layers, args.warmup, args.steps) for spec, shape, layers in runs]
    sys.path.insert(0, HERE)
    from make_results import append_csv, write_results

    if args.csv:
        append_csv(args.csv, rows)
    if args.write:
        meta = {"date": str(date.today()), "machine": torch.cuda.get_device_name(),
                "command": "python benchmarks/family_step.py --write"}  # fmt: skip
        out = write_results("h200/family_step.csv", list(rows[0]), [r.values() for r in rows], meta)
        print("wrote", out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
