"""Runs the fused adaLN op once per shape, forward and backward, for Nsight Compute.

The warm-up runs outside the profiled range, so that `ncu --profile-from-start off` sees one
launch of each kernel per shape (bf16 stream, per-sample modulation):

    ncu --profile-from-start off --clock-control none --section SpeedOfLight \\
        --section WarpStateStats python benchmarks/profile_layer_norm_modulate.py

`bash scripts/gpu_check.sh profile` runs it with the sections docs/ops.md reads.
"""

from __future__ import annotations

import argparse
import os

import torch

from adaptiveload import ops


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dims", type=int, nargs="+", default=[1536, 5120])
    parser.add_argument("--tokens", type=int, default=32760)
    parser.add_argument(
        "--fwd-env",
        nargs="+",
        default=[],
        metavar="NAME=V[,NAME=V]",
        help="also profile the forward alone under these knob settings, one launch each "
        "(e.g. ADAPTIVELOAD_FWD_RING=0 ADAPTIVELOAD_FWD_BULK=1: the register kernel and the "
        "ring with bulk copies)",
    )
    parser.add_argument(
        "--copy",
        action="store_true",
        help="also profile an elementwise kernel that copies x (out = x * 1: a copy_ of the "
        "same dtype is a driver memcpy, which ncu does not count as a kernel); widen ncu's -k "
        "filter to see it (scripts/gpu_check.sh does)",
    )
    args = parser.parse_args()
    for d in args.dims:
        profile_dim(d, args)


def profiled_once(f) -> None:
    """Runs f once outside and once inside the profiled range."""
    for profiled in (False, True):
        if profiled:
            torch.cuda.synchronize()
            torch.cuda.cudart().cudaProfilerStart()
        f()
        if profiled:
            torch.cuda.synchronize()
            torch.cuda.cudart().cudaProfilerStop()


def profile_dim(d: int, args: argparse.Namespace) -> None:
    x = torch.randn(1, args.tokens, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    shift, scale = (torch.randn(1, 1, d, device="cuda", requires_grad=True) for _ in range(2))
    dy = torch.randn(1, args.tokens, d, device="cuda", dtype=torch.bfloat16)
    profiled_once(lambda: ops.layer_norm_modulate(x, shift, scale).backward(dy))
    print(f"D={d}: ran", tuple(x.shape))
    for setting in args.fwd_env:
        env = dict(kv.split("=", 1) for kv in setting.split(","))
        os.environ.update(env)
        with torch.no_grad():
            profiled_once(lambda: ops.layer_norm_modulate(x, shift, scale))
        for k in env:
            os.environ.pop(k)
        print(f"D={d}: forward with {setting}")
    if args.copy:
        out = torch.empty_like(x)
        with torch.no_grad():
            profiled_once(lambda: torch.mul(x, 1.0, out=out))
        print(f"D={d}: copy of x")


if __name__ == "__main__":
    main()
