"""Where does the host time of one forward+backward of the fused op go?

torch.profiler over many calls on tiny tensors (the GPU waits on the host), for our op and for
``F.layer_norm``: the ops and autograd nodes the host runs per call, by self CPU time. It
answers what bench_host_overhead.py cannot: which part of the ~170 us is ours.

    python benchmarks/profile_host.py [--device cuda] [--calls 200]
"""

from __future__ import annotations

import argparse
import time

import torch
from torch.profiler import ProfilerActivity, profile


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--calls", type=int, default=200)
    args = ap.parse_args(argv)
    dev = torch.device(args.device)
    from adaptiveload import ops

    x = torch.randn(1, 4, 64, device=dev, requires_grad=True)
    shift = torch.randn(1, 1, 64, device=dev, requires_grad=True)
    scale = torch.randn(1, 1, 64, device=dev, requires_grad=True)
    dy = torch.randn(1, 4, 64, device=dev)
    cases = {
        "ours grad(x, shift, scale)": (
            lambda: ops.layer_norm_modulate(x, shift, scale),
            (x, shift, scale),
        ),
        "ours grad(x)": (lambda: ops.layer_norm_modulate(x, shift, scale), (x,)),
        "F.layer_norm grad(x)": (
            lambda: torch.nn.functional.layer_norm(x, (64,), eps=1e-6),
            (x,),
        ),
        "eager grad(x, shift, scale)": (
            lambda: torch.nn.functional.layer_norm(x, (64,), eps=1e-6) * (1 + scale) + shift,
            (x, shift, scale),
        ),
    }

    def sync():
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)

    for name, (fwd, inputs) in cases.items():

        def call(fwd=fwd, inputs=inputs):
            y = fwd()
            torch.autograd.grad(y, inputs, dy)

        def backward_only(fwd=fwd, inputs=inputs):
            y = fwd()
            y.backward(dy)

        for fn, label in ((call, "autograd.grad"), (backward_only, "backward()")):
            for _ in range(50):
                fn()
            sync()
            t0 = time.perf_counter()
            for _ in range(args.calls):
                fn()
            sync()
            us = (time.perf_counter() - t0) / args.calls * 1e6
            print(f"{name:<32} {label:<14} {us:7.1f} us/call")
        acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if dev.type == "cuda" else [])
        with profile(activities=acts) as prof:
            for _ in range(args.calls):
                call()
            sync()
        print(f"\n--- {name}: per call, by self CPU time")
        rows = sorted(prof.key_averages(), key=lambda e: e.self_cpu_time_total, reverse=True)
        for e in rows[:18]:
            print(
                f"  {e.key[:60]:<60} calls/iter {e.count / args.calls:5.1f}  "
                f"self {e.self_cpu_time_total / args.calls:7.2f} us  "
                f"total {e.cpu_time_total / args.calls:7.2f} us"
            )
        print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
