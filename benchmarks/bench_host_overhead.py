"""How much host time does one call of the fused op cost?

With a tiny tensor the GPU finishes each kernel before the host has launched the next, so the
time per call is the host's: Python, the dispatcher, autograd, argument checks, allocations
and kernel launches. Measured for our op, for eager ``layer_norm(x) * (1 + scale) + shift``
and for ``F.layer_norm`` alone, as

- forward: inputs that require grad (a training forward, which records the autograd graph);
- forward+backward: forward, then ``torch.autograd.grad`` of all inputs.

Each is the median over rounds of the mean of many back-to-back calls, synchronized at the
end of each round (no per-call sync). Targets (issue 17): forward <= 20 us, forward+backward
<= 120 us on the GPU machine.

    python benchmarks/bench_host_overhead.py [--device cuda] [--csv FILE] [--label NAME]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch

EPS = 1e-6


def cases(device):
    x = torch.randn(1, 4, 64, device=device, requires_grad=True)
    shift = torch.randn(1, 1, 64, device=device, requires_grad=True)
    scale = torch.randn(1, 1, 64, device=device, requires_grad=True)
    dy = torch.randn(1, 4, 64, device=device)
    from adaptiveload import ops

    impls = {
        "ours": lambda: ops.layer_norm_modulate(x, shift, scale),
        "eager": lambda: torch.nn.functional.layer_norm(x, (64,), eps=EPS) * (1 + scale) + shift,
        "F.layer_norm": lambda: torch.nn.functional.layer_norm(x, (64,), eps=EPS),
    }
    inputs = {"ours": (x, shift, scale), "eager": (x, shift, scale), "F.layer_norm": (x,)}
    return impls, inputs, dy


def per_call_us(fn, sync, calls=2000, rounds=7):
    for _ in range(200):
        fn()
    sync()
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        sync()
        times.append((time.perf_counter() - t0) / calls * 1e6)
    return statistics.median(times)


def profile(fn, ins, dy, sync, calls=500):
    """torch.profiler's CPU view of our op's forward, then forward+backward."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as prof

    for name, step in (
        ("forward", fn),
        ("forward+backward", lambda: torch.autograd.grad(fn(), ins, dy)),
    ):
        for _ in range(50):
            step()
        sync()
        with prof(activities=[ProfilerActivity.CPU]) as p:
            for _ in range(calls):
                step()
            sync()
        print(f"\n{name}, {calls} calls (times are totals over the calls):")
        print(
            p.key_averages().table(
                sort_by="self_cpu_time_total", row_limit=18, max_name_column_width=60
            )
        )


def breakdown(device, sync):
    """Our op's host time in layers: the Python function, the op called directly, without
    autograd, and the backward op alone."""
    from adaptiveload import ops

    x = torch.randn(1, 4, 64, device=device, requires_grad=True)
    shift = torch.randn(1, 1, 64, device=device, requires_grad=True)
    scale = torch.randn(1, 1, 64, device=device, requires_grad=True)
    dy = torch.randn(1, 4, 64, device=device)
    op = torch.ops.adaptiveload.layer_norm_modulate.default
    bwd = torch.ops.adaptiveload._layer_norm_modulate_backward.default
    xd, sd, cd = x.detach(), shift.detach(), scale.detach()
    _, mean, rstd = op(xd, sd, cd, None, None, EPS, None)
    mask = [True, True, True, False, False]
    steps = {
        "ops.layer_norm_modulate, grad": lambda: ops.layer_norm_modulate(x, shift, scale),
        "op overload, grad": lambda: op(x, shift, scale, None, None, EPS, None),
        "op overload, no grad": lambda: op(xd, sd, cd, None, None, EPS, None),
        "backward op alone": lambda: bwd(dy, xd, sd, cd, None, None, mean, rstd, mask),
        "F.layer_norm, grad": lambda: torch.nn.functional.layer_norm(x, (64,), eps=EPS),
        "F.layer_norm, no grad": lambda: torch.nn.functional.layer_norm(xd, (64,), eps=EPS),
        "torch.empty_like": lambda: torch.empty_like(xd),
    }
    print("\nbreakdown (us per call):")
    for name, fn in steps.items():
        print(f"  {name:<32} {per_call_us(fn, sync, calls=3000):7.2f}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--csv", help="append the results to this CSV file")
    parser.add_argument("--label", default="", help="a name for this build in the CSV")
    parser.add_argument(
        "--profile", action="store_true", help="also print where our op's host time goes"
    )
    parser.add_argument("--breakdown", action="store_true", help="also time the op in layers")
    args = parser.parse_args()
    device = torch.device(args.device)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    impls, inputs, dy = cases(device)
    rows = []
    for name, fn in impls.items():
        ins = inputs[name]

        def fwd_bwd(fn=fn, ins=ins):
            torch.autograd.grad(fn(), ins, dy)

        rows.append(
            {
                "label": args.label,
                "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
                "impl": name,
                "fwd_us": per_call_us(fn, sync),
                "fwd_bwd_us": per_call_us(fwd_bwd, sync),
            }
        )
    print(f"host time per call ({rows[0]['device']}, torch {torch.__version__} {args.label}):")
    for r in rows:
        print(
            f"  {r['impl']:<13} forward {r['fwd_us']:7.1f} us   forward+backward {r['fwd_bwd_us']:7.1f} us"
        )
    if args.breakdown:
        breakdown(device, sync)
    if args.profile:
        profile(impls["ours"], inputs["ours"], dy, sync)
    if args.csv:
        from make_results import append_csv

        append_csv(args.csv, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
