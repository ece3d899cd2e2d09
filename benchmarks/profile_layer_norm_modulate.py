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
        "--fwd-ring",
        nargs="+",
        default=None,
        help="also profile the forward alone under these ADAPTIVELOAD_FWD_RING values "
        "(e.g. 0 2: the register and the ring kernel side by side)",
    )
    args = parser.parse_args()
    for d in args.dims:
        x = torch.randn(1, args.tokens, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        shift, scale = (torch.randn(1, 1, d, device="cuda", requires_grad=True) for _ in range(2))
        dy = torch.randn(1, args.tokens, d, device="cuda", dtype=torch.bfloat16)
        for profiled in (False, True):
            if profiled:
                torch.cuda.synchronize()
                torch.cuda.cudart().cudaProfilerStart()
            y = ops.layer_norm_modulate(x, shift, scale)
            y.backward(dy)
            if profiled:
                torch.cuda.synchronize()
                torch.cuda.cudart().cudaProfilerStop()
        print(f"D={d}: ran", tuple(x.shape))
        for ring in args.fwd_ring or []:
            os.environ["ADAPTIVELOAD_FWD_RING"] = ring
            for profiled in (False, True):
                if profiled:
                    torch.cuda.synchronize()
                    torch.cuda.cudart().cudaProfilerStart()
                with torch.no_grad():
                    ops.layer_norm_modulate(x, shift, scale)
                if profiled:
                    torch.cuda.synchronize()
                    torch.cuda.cudart().cudaProfilerStop()
            os.environ.pop("ADAPTIVELOAD_FWD_RING")
            print(f"D={d}: forward with ADAPTIVELOAD_FWD_RING={ring}")


if __name__ == "__main__":
    main()
