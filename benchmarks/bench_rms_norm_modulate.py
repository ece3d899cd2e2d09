"""How close does the fused RMSNorm adaLN op get to the copy bandwidth at LTX-Video's shapes?

Measures, in one run: a device-to-device copy (the ceiling), the eager formula of diffusers'
LTX-Video blocks, torch.compile of it (default, and for the bf16 per-token shapes max-autotune
without Inductor's CUDA graphs; the faster is reported as "best compile"), Liger-Kernel's
LigerModulatedRMSNorm where it is importable, and adaptiveload's rms_norm_modulate, for forward,
backward and forward+backward; plus the gated-residual op against the add and our op.

Shapes: hidden size 2048 (LTX-Video 2B), 10k-40k tokens, a bf16 stream. The modulation is per
token, as LTX-Video's blocks make it: views of ada_values of shape (B, S, 6, D) taken with
``unbind(dim=2)``, read in place by our op (stride 6 * D between tokens); the other
implementations get the same views. Gradients are taken with respect to x and the two views.

Byte model (per element of x): forward reads x, shift and scale and writes y; backward reads x,
dy and scale and writes dx and dscale, and dshift unless it is dy itself (per-token shift of
dy's dtype: autograd can pass dy on unchanged; the backward never reads shift). bf16
modulation: forward 8 bytes, backward 10; fp32 modulation: forward 12, backward 18. Per-sample
modulation adds B * D elements (negligible): forward 4, backward 6.

    python benchmarks/bench_rms_norm_modulate.py [--quick] [--no-compile] [--csv FILE] [--label L]

Needs a CUDA GPU. Timing and the copy ceiling are bench_layer_norm_modulate.py's: calls captured
back to back in a CUDA graph, the replay timed with events.
"""

from __future__ import annotations

import argparse
import datetime
import sys

import torch

import bench_layer_norm_modulate as blm

EPS = 1e-6  # LTX-Video's norm_eps
DIM = 2048


def eager(x, shift, scale, out_dtype):
    """diffusers' LTX-Video block: RMSNorm(x) without affine, then the modulation."""
    variance = x.float().pow(2).mean(-1, keepdim=True)
    xn = (x * torch.rsqrt(variance + EPS)).to(x.dtype)
    return (xn * (1 + scale) + shift).to(out_dtype)


def ours(x, shift, scale, out_dtype):
    from adaptiveload import ops

    return ops.rms_norm_modulate(x, shift, scale, eps=EPS, out_dtype=out_dtype)


def liger_impl():
    """Liger-Kernel's fused modulated RMSNorm (no affine), or None where it is not installed."""
    try:
        from liger_kernel.transformers import LigerModulatedRMSNorm
    except Exception as e:  # noqa: BLE001 - any import failure means "not available"
        print(f"Liger-Kernel: not measured ({type(e).__name__}: {str(e)[:80]})")
        return None
    # in_place=False: in place, its backward writes dx over dy, which the timing loop reuses.
    norm = LigerModulatedRMSNorm(DIM, eps=EPS, elementwise_affine=False, in_place=False)

    def liger(x, shift, scale, out_dtype):
        return norm(x, scale, shift).to(out_dtype)

    return liger


class Case:
    """Inputs for one shape; several copies rotate so that nothing is served from L2."""

    def __init__(self, b, s, mod, mod_dtype, copies):
        self.name = f"{b}x{s}x{DIM} bf16 {mod} {'fp32' if mod_dtype == torch.float32 else 'bf16'}"
        self.out_dtype = torch.bfloat16
        self.sets = []
        for _ in range(copies):
            x = torch.randn(b, s, DIM, device="cuda", dtype=torch.bfloat16, requires_grad=True)
            rows = s if mod == "per_token" else 1
            ada = 0.3 * torch.randn(b, rows, 6, DIM, device="cuda", dtype=mod_dtype)
            ada.requires_grad_()
            shift, scale, _gate, *_ = ada.unbind(dim=2)  # LTX: shift_msa, scale_msa, gate_msa
            dy = torch.randn(b, s, DIM, device="cuda", dtype=self.out_dtype)
            self.sets.append((x, shift, scale, dy))
        x, shift, scale, dy = self.sets[0]
        mod_bytes = shift.numel() * shift.element_size() if mod == "per_token" else 0
        self.fwd_bytes = blm.nbytes(x) + blm.nbytes(dy) + 2 * mod_bytes
        # dshift is dy itself when the shift is per token and of dy's dtype: nothing to write.
        self.dshift_is_dy = mod == "per_token" and mod_dtype == self.out_dtype
        self.bwd_bytes = (
            2 * blm.nbytes(x) + blm.nbytes(dy) + (2 if self.dshift_is_dy else 3) * mod_bytes
        )


def rows_of(case):
    from adaptiveload import ops

    x, shift, scale, dy = case.sets[0]
    y = ours(x, shift, scale, case.out_dtype)
    torch.autograd.grad(y, (x, shift, scale), dy)
    return " ".join(ops._last_configs())


def bench_gated(rows):
    """Fused r = residual + gate * h; y = RMS-mod(r) versus the add, then our op (bf16, per
    token, LTX-Video's FFN residual followed by the next block's norm1), forward only."""
    from adaptiveload import ops

    b, s = 1, 24576
    sets = []
    for _ in range(2):
        res, h = (torch.randn(b, s, DIM, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        ada = 0.3 * torch.randn(b, s, 6, DIM, device="cuda", dtype=torch.bfloat16)
        shift, scale, gate = ada.unbind(dim=2)[:3]
        sets.append((res, h, gate, shift, scale))

    def fused(res, h, gate, shift, scale):
        ops.gated_residual_rms_norm_modulate(res, h, gate, shift, scale, eps=EPS)

    def separate(res, h, gate, shift, scale):
        r = res + h * gate
        ops.rms_norm_modulate(r, shift, scale, eps=EPS)

    with torch.no_grad():
        t_fused = blm.bench(fused, sets)
        t_sep = blm.bench(separate, sets)
    elem = b * s * DIM
    # Fused: reads residual, h, gate, shift and scale and writes r and y, 2 bytes each. The best
    # unfused pair (one add kernel, then our op) would move 16: the add reads residual, h and
    # gate and writes r, the op reads r, shift and scale and writes y.
    rows.append((f"gated fwd, {b}x{s}x{DIM} bf16 per_token", t_fused, 14 * elem, t_sep, 16 * elem))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="one shape per modulation")
    parser.add_argument("--no-compile", action="store_true", help="skip torch.compile")
    parser.add_argument("--no-autotune", action="store_true", help="skip max-autotune")
    parser.add_argument("--csv", help="append one row per shape and implementation to this CSV")
    parser.add_argument("--label", default="", help="a name for this build in the CSV")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("bench_rms_norm_modulate.py needs a CUDA GPU; none found.", file=sys.stderr)
        return 1

    import triton

    versions = f"torch {torch.__version__} | triton {triton.__version__}"
    try:
        from importlib.metadata import version

        import liger_kernel  # noqa: F401

        versions += f" | liger-kernel {version('liger-kernel')}"
    except Exception:  # noqa: BLE001
        versions += " | liger-kernel not installed"
    print(f"GPU: {torch.cuda.get_device_name()} | {versions} | {datetime.date.today().isoformat()}")
    ceiling = blm.copy_ceiling_gbs()
    print(f"device-to-device copy: {ceiling:.0f} GB/s (bytes read + written)")

    tokens = [24576] if args.quick else [10240, 24576, 40960]
    shapes = [(1, s, "per_token", torch.bfloat16) for s in tokens]
    shapes += [(1, 24576, "per_token", torch.float32), (2, 20480, "per_sample", torch.bfloat16)]

    impls = [("eager", eager)]
    if not args.no_compile:
        impls.append(("compile", "default"))
        if not args.no_autotune:
            impls.append(("max-autotune", "max-autotune-no-cudagraphs"))
    liger = liger_impl()
    if liger is not None:
        impls.append(("liger", liger))
    impls.append(("ours", ours))

    csv_rows, summary = [], []
    for b, s, mod, mod_dtype in shapes:
        case = Case(b, s, mod, mod_dtype, copies=2)
        results = {}
        for name, impl in impls:
            if isinstance(impl, str):
                # max-autotune is slow to compile: the bf16 per-token shapes only (LTX-Video's).
                if impl.startswith("max-autotune") and (
                    mod != "per_token" or mod_dtype != torch.bfloat16
                ):
                    continue
                torch._dynamo.reset()
                impl = torch.compile(eager, mode=None if impl == "default" else impl)
            try:
                results[name] = blm.measure(impl, case, case.out_dtype)
            except Exception as e:  # noqa: BLE001 - a failing baseline is reported, not fatal
                print(f"  {case.name} {name}: failed ({type(e).__name__}: {str(e)[:80]})")
                continue
            f, bw, a, peak, saved = results[name]
            fwd_gbs, bwd_gbs = case.fwd_bytes / f / 1e6, case.bwd_bytes / bw / 1e6
            csv_rows.append(
                {
                    "label": args.label,
                    "gpu": torch.cuda.get_device_name(),
                    "torch": torch.__version__,
                    "date": datetime.date.today().isoformat(),
                    "ceiling_gbs": round(ceiling, 1),
                    "shape": case.name,
                    "impl": name,
                    "fwd_ms": f,
                    "fwd_gbs": fwd_gbs,
                    "fwd_pct": 100 * fwd_gbs / ceiling,
                    "bwd_ms": bw,
                    "bwd_gbs": bwd_gbs,
                    "bwd_pct": 100 * bwd_gbs / ceiling,
                    "fwd_bwd_ms": a,
                    "peak_mib": peak / 2**20,
                    "saved_mib": saved / 2**20,
                    "rows": rows_of(case) if name == "ours" else "",
                }
            )
            print(
                f"{case.name:<34} {name:<13} fwd {f:7.3f} ms {fwd_gbs:6.0f} GB/s "
                f"{100 * fwd_gbs / ceiling:5.1f}% | bwd {bw:7.3f} ms {bwd_gbs:6.0f} GB/s "
                f"{100 * bwd_gbs / ceiling:5.1f}% | fwd+bwd {a:7.3f} ms | peak {peak / 2**20:7.0f} "
                f"MiB saved {saved / 2**20:6.0f} MiB"
            )
        if "ours" in results:
            compiled = [results[k] for k in ("compile", "max-autotune") if k in results]
            best = min(compiled, key=lambda r: r[2]) if compiled else None
            summary.append((case.name, results["ours"], results.get("eager"), best,
                            results.get("liger")))  # fmt: skip
        del case
        torch.cuda.empty_cache()

    print("\nours against the others (time ratio, > 1: ours faster), fwd / bwd / fwd+bwd:")
    for name, o, e, c, lg in summary:
        cells = []
        for label, r in (("eager", e), ("best compile", c), ("liger", lg)):
            if r is None:
                cells.append(f"{label} -")
            else:
                cells.append(f"{label} {r[0] / o[0]:.2f} / {r[1] / o[1]:.2f} / {r[2] / o[2]:.2f}")
        print(f"  {name:<34} " + " | ".join(cells))

    gated_rows = []
    bench_gated(gated_rows)
    for name, tf, bf, ts, bs in gated_rows:
        print(
            f"{name}: fused {tf:.3f} ms ({bf / tf / 1e6:.0f} GB/s, {100 * bf / tf / 1e6 / ceiling:.1f}%"
            f" of copy), add + op {ts:.3f} ms; speedup {ts / tf:.2f}x (byte ratio {bs / bf:.2f}x)"
        )

    if args.csv:
        from make_results import append_csv

        append_csv(args.csv, csv_rows)
        print(f"wrote {args.csv}")
    return 0


if __name__ == "__main__":
    if torch.cuda.is_available():
        # Everything on one side stream: autograd waits on the stream its leaves were made on,
        # and a CUDA graph cannot capture work that touches the legacy default stream.
        with torch.cuda.stream(torch.cuda.Stream()):
            sys.exit(main())
    sys.exit(main())
