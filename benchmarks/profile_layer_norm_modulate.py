"""Runs the fused adaLN op once per shape, forward and backward, for Nsight Compute.

The warm-up runs outside the profiled range, so that `ncu --profile-from-start off` sees one
launch of each kernel per shape (bf16 stream, per-sample modulation):

    ncu --profile-from-start off --clock-control none --section SpeedOfLight \\
        --section WarpStateStats python benchmarks/profile_layer_norm_modulate.py

`bash scripts/gpu_check.sh profile` runs it with the sections docs/ops.md reads.
"""

from __future__ import annotations

import argparse

import torch

from adaptiveload import ops


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dims", type=int, nargs="+", default=[1536, 5120])
    parser.add_argument("--tokens", type=int, default=32760)
    parser.add_argument(
        "--fwd-config",
        nargs="+",
        default=[],
        metavar="ROW[;name=value...]",
        help="also profile the forward alone under these tuning-table rows, one launch each "
        "(e.g. 'fwd.bf16.plain.block.warp6x2x1' 'fwd.bf16.plain.block.ring6x2.full;stages=3'; "
        "adaptiveload.ops._tuning_table() lists the rows)",
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
    run = torch.ops.adaptiveload._layer_norm_modulate_with_config
    for config in args.fwd_config:
        with torch.no_grad():
            profiled_once(
                lambda c=config: run(x, None, None, shift, scale, None, None, 1e-6, None, c)
            )
        print(f"D={d}: forward with {config}")
    if args.copy:
        out = torch.empty_like(x)
        with torch.no_grad():
            profiled_once(lambda: torch.mul(x, 1.0, out=out))
        print(f"D={d}: copy of x")


if __name__ == "__main__":
    main()
