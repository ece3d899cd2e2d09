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


if __name__ == "__main__":
    main()
