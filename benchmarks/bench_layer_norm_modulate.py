"""How close do the fused adaLN kernels get to the copy bandwidth of this GPU?

Measures, in one run and at Wan 2.1 shapes: a device-to-device copy (the ceiling), eager
PyTorch, torch.compile (default, and max-autotune without Inductor's CUDA graphs) and
adaptiveload's op, for forward, backward and forward+backward; plus the fused gated-residual
op against add + our op.

Byte model (bf16 stream): forward reads x and writes y (4 bytes/element), backward reads x and
dy and writes dx (6 bytes/element). Per-token modulation adds, forward, the reads of shift
and scale; backward, the read of scale and the writes of dshift and dscale (shift itself is
never read by the backward). Per-sample modulation is negligible. fp32 stream: fp32 x, bf16
y/dy, fp32 dx.

    python benchmarks/bench_layer_norm_modulate.py [--quick] [--no-compile] [--csv FILE] [--label L]

Writes one CSV row per shape and implementation (with, for ours, the tuning-table rows that
ran); benchmarks/make_results.py turns the CSVs into RESULTS.md. The tuning sweep is
benchmarks/tune_layer_norm_modulate.py.
"""

from __future__ import annotations

import argparse
import datetime
import sys

import torch

EPS = 1e-6


def reference(x, shift, scale, out_dtype):
    y = torch.nn.functional.layer_norm(x, x.shape[-1:], eps=EPS) * (1 + scale) + shift
    return y.to(out_dtype)


def ours(x, shift, scale, out_dtype):
    from adaptiveload import ops

    return ops.layer_norm_modulate(x, shift, scale, out_dtype=out_dtype)


def nbytes(*ts):
    return sum(t.numel() * t.element_size() for t in ts)


class Case:
    """Inputs for one shape; several copies rotate so that nothing is served from L2."""

    def __init__(self, b, s, d, stream, mod, copies):
        x_dtype = torch.bfloat16 if stream == "bf16" else torch.float32
        self.name = f"{b}x{s}x{d} {stream} {mod}"
        self.out_dtype = torch.bfloat16
        mod_shape = (b, 1, d) if mod == "per_sample" else (b, s, d)
        self.sets = []
        for _ in range(copies):
            x = torch.randn(b, s, d, device="cuda", dtype=x_dtype, requires_grad=True)
            shift = torch.randn(mod_shape, device="cuda", requires_grad=True)
            scale = torch.randn(mod_shape, device="cuda", requires_grad=True)
            dy = torch.randn(b, s, d, device="cuda", dtype=self.out_dtype)
            self.sets.append((x, shift, scale, dy))
        x, shift, scale, dy = self.sets[0]
        mod_bytes = 0 if mod == "per_sample" else nbytes(shift)  # one per-token operand
        self.fwd_bytes = nbytes(x) + nbytes(dy) + 2 * mod_bytes  # reads shift and scale
        # reads scale, writes dshift and dscale
        self.bwd_bytes = 2 * nbytes(x) + nbytes(dy) + 3 * mod_bytes


USE_GRAPHS = True


def bench(fn, sets, calls=10, replays=15):
    """Median GPU time of one call of fn, in ms, over input sets used in turn.

    By default the calls are captured back to back in a CUDA graph and the graph is timed:
    the GPU time of the kernels with no gaps for the host's launch overhead, which in training
    overlaps the GPU's work (autograd's host cost per backward call is larger than the GPU time
    of the smaller shapes here). With --no-graphs, or where capture fails, triton's do_bench.
    """
    import statistics

    import triton.testing

    i = [0]

    def step():
        fn(*sets[i[0] % len(sets)])
        i[0] += 1

    if USE_GRAPHS:
        try:
            stream = torch.cuda.current_stream()
            for _ in range(3):
                step()
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, stream=stream):
                for _ in range(calls):
                    step()
            graph.replay()
            torch.cuda.synchronize()
            times = []
            for _ in range(replays):
                start, end = (
                    torch.cuda.Event(enable_timing=True),
                    torch.cuda.Event(enable_timing=True),
                )
                start.record()
                graph.replay()
                end.record()
                end.synchronize()
                times.append(start.elapsed_time(end) / calls)
            del graph
            return statistics.median(times)
        except Exception as e:  # noqa: BLE001 - fall back to host-timed runs
            print(f"  (CUDA graph capture failed: {type(e).__name__}: {str(e)[:60]}; do_bench)")
            torch.cuda.synchronize()
    return triton.testing.do_bench(step, warmup=10, rep=60, return_mode="median")


def forward_only(impl, out_dtype):
    """A step that runs impl's forward without autograd, over one input set."""

    def fwd(x, shift, scale, dy):
        with torch.no_grad():
            impl(x, shift, scale, out_dtype)

    return fwd


def autograd_graphs(impl, case, out_dtype):
    """(y, dy, inputs) per input set, for timing the backward alone with backward_only."""
    return [(impl(x, sh, sc, out_dtype), dy, (x, sh, sc)) for x, sh, sc, dy in case.sets]


# autograd.grad, not .backward: accumulating into .grad would add a pass over x.
def backward_only(y, dy, inputs):
    torch.autograd.grad(y, inputs, dy, retain_graph=True)


def measure(impl, case, out_dtype):
    """(fwd ms, bwd ms, fwd+bwd ms, peak bytes, saved bytes) of one implementation."""

    def fwd_bwd(x, shift, scale, dy):
        y = impl(x, shift, scale, out_dtype)
        torch.autograd.grad(y, (x, shift, scale), dy)

    t_fwd = bench(forward_only(impl, out_dtype), case.sets)
    graphs = autograd_graphs(impl, case, out_dtype)
    t_bwd = bench(backward_only, graphs)
    del graphs
    t_all = bench(fwd_bwd, case.sets)

    x, shift, scale, dy = case.sets[0]
    saved = []

    def pack(t):
        saved.append(t)
        return t

    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        y = impl(x, shift, scale, out_dtype)
    torch.autograd.grad(y, (x, shift, scale), dy)
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - base
    inputs = {t.data_ptr() for t in (x, shift, scale)}
    # Saved-for-backward memory beyond the inputs themselves (x is an input).
    saved_bytes_new = sum(nbytes(t) for t in saved if t.data_ptr() not in inputs)
    del y
    saved.clear()
    return t_fwd, t_bwd, t_all, peak, saved_bytes_new


def tables_rows_of(case):
    """The tuning-table rows (forward, backward) our op runs for this case, where the build
    reports them."""
    from adaptiveload import ops

    if not hasattr(ops, "_last_configs"):
        return ""
    x, shift, scale, dy = case.sets[0]
    y = ours(x, shift, scale, case.out_dtype)
    torch.autograd.grad(y, (x, shift, scale), dy)
    return " ".join(ops._last_configs())


def copy_ceiling_gbs():
    n = 1 << 29  # 1 GiB of bf16 per buffer, far beyond L2
    src = torch.empty(n, device="cuda", dtype=torch.bfloat16)
    dst = torch.empty_like(src)
    import triton.testing

    ms = triton.testing.do_bench(lambda: dst.copy_(src), warmup=10, rep=100, return_mode="median")
    return 2 * n * 2 / ms / 1e6


def same_size_copy_ms(nbytes):
    """Graph-timed device-to-device copy that moves nbytes (half read, half written), like
    the forward of a shape: the ceiling at that size, launch and tail costs included."""
    n = int(nbytes) // 4  # bf16 elements per buffer
    sets = [
        (
            torch.empty(n, device="cuda", dtype=torch.bfloat16),
            torch.empty(n, device="cuda", dtype=torch.bfloat16),
        )
        for _ in range(2)
    ]
    ms = bench(lambda src, dst: dst.copy_(src), sets)
    del sets
    return ms


def bench_fused_residual(rows):
    """Fused r = residual + gate * h; y = LN-mod(r) versus add + our op, bf16, D=5120."""
    from adaptiveload import ops

    b, s, d = 1, 32760, 5120
    sets = []
    for _ in range(2):
        t = [torch.randn(b, s, d, device="cuda", dtype=torch.bfloat16) for _ in range(2)]
        m = [torch.randn(b, 1, d, device="cuda") for _ in range(3)]
        sets.append((*t, *m))

    def fused(res, h, gate, shift, scale):
        ops.gated_residual_layer_norm_modulate(res, h, gate, shift, scale)

    def separate(res, h, gate, shift, scale):
        # What a Wan block does without the fused op (diffusers' numerics).
        r = (res.float() + gate * h).to(res.dtype)
        ops.layer_norm_modulate(r, shift, scale)

    with torch.no_grad():
        t_fused = bench(fused, sets)
        t_sep = bench(separate, sets)
    elem = b * s * d
    # Bytes: fused reads residual and h, writes r and y (8 per element); the best unfused
    # pair (one add kernel, then our op) would move 10.
    rows.append(("fused residual fwd, 1x32760x5120 bf16", t_fused, 8 * elem, t_sep, 10 * elem))


def vs_compile(ratio):
    if ratio != ratio:  # NaN: torch.compile was not run (--no-compile) or failed
        return "torch.compile not measured"
    return f"{ratio:.2f}x vs best torch.compile"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="a reduced set of shapes")
    parser.add_argument("--no-autotune", action="store_true", help="skip max-autotune")
    parser.add_argument("--no-compile", action="store_true", help="skip torch.compile")
    parser.add_argument("--out", help="write a markdown table to this file")
    parser.add_argument("--csv", help="append one row per shape and implementation to this CSV")
    parser.add_argument("--label", default="", help="a name for this build in the CSV")
    parser.add_argument(
        "--no-graphs", action="store_true", help="time with do_bench (host launch gaps included)"
    )
    args = parser.parse_args()
    global USE_GRAPHS
    USE_GRAPHS = not args.no_graphs
    if not torch.cuda.is_available():
        print("bench_layer_norm_modulate.py needs a CUDA GPU; none found.", file=sys.stderr)
        return 1

    header = (
        f"GPU: {torch.cuda.get_device_name()} | torch {torch.__version__} | "
        f"{datetime.date.today().isoformat()}"
    )
    print(header)
    ceiling = copy_ceiling_gbs()
    print(f"device-to-device copy: {ceiling:.0f} GB/s (bytes read + written)")
    csv_rows = []

    dims = [1536, 5120] if args.quick else [1536, 3072, 5120]
    tokens = [32760] if args.quick else [32760, 75600]
    shapes = [(1, s, d, "bf16", "per_sample") for d in dims for s in tokens]
    if not args.quick:
        shapes += [(1, 32760, d, "bf16", "per_token") for d in dims]
        shapes += [(1, 32760, d, "fp32", "per_sample") for d in dims]
    shapes.append((2, 32760, 5120, "bf16", "per_sample"))

    impls = [("eager", reference)]
    if not args.no_compile:
        impls.append(("compile", "default"))
        if not args.no_autotune:
            # Without Inductor's own CUDA graphs, which clash with the benchmark's capture and
            # would only remove launch gaps that the capture already removes.
            impls.append(("max-autotune", "max-autotune-no-cudagraphs"))
    impls.append(("ours", ours))

    table = []
    speedups = []
    same_size = []
    for b, s, d, stream, mod in shapes:
        case = Case(b, s, d, stream, mod, copies=2)
        results = {}
        for name, impl in impls:
            if isinstance(impl, str):
                # max-autotune is slow to compile: only the per-sample bf16 shapes (with
                # --quick, only the 2 x 32760 x 5120 one that the fwd+bwd target names).
                if impl.startswith("max-autotune") and (
                    stream != "bf16" or mod != "per_sample" or (args.quick and b != 2)
                ):
                    continue
                torch._dynamo.reset()
                impl = torch.compile(reference, mode=None if impl == "default" else impl)
            try:
                results[name] = measure(impl, case, case.out_dtype)
            except Exception as e:  # torch.compile's backward fails for some shapes
                print(f"  {case.name} {name}: failed ({type(e).__name__}: {str(e)[:80]})")
                continue
            f, bw, a, peak, saved = results[name]
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
                    "fwd_pct": 100 * case.fwd_bytes / f / 1e6 / ceiling,
                    "bwd_ms": bw,
                    "bwd_pct": 100 * case.bwd_bytes / bw / 1e6 / ceiling,
                    "fwd_bwd_ms": a,
                    "peak_mib": peak / 2**20,
                    "saved_mib": saved / 2**20,
                    "rows": tables_rows_of(case) if name == "ours" else "",
                }
            )
            row = (
                case.name,
                name,
                f,
                case.fwd_bytes / f / 1e6,
                100 * case.fwd_bytes / f / 1e6 / ceiling,
                bw,
                case.bwd_bytes / bw / 1e6,
                100 * case.bwd_bytes / bw / 1e6 / ceiling,
                a,
                peak / 2**20,
                saved / 2**20,
            )
            table.append(row)
            print(
                f"{row[0]:<32} {row[1]:<13} fwd {row[2]:7.3f} ms {row[3]:6.0f} GB/s {row[4]:5.1f}% | "
                f"bwd {row[5]:7.3f} ms {row[6]:6.0f} GB/s {row[7]:5.1f}% | fwd+bwd {row[8]:7.3f} ms"
                f" | peak {row[9]:7.0f} MiB saved {row[10]:6.0f} MiB"
            )
        if "ours" in results:
            cms = same_size_copy_ms(case.fwd_bytes)
            same_size.append(
                (
                    case.name,
                    cms,
                    100 * case.fwd_bytes / cms / 1e6 / ceiling,
                    100 * cms / results["ours"][0],
                )
            )
        if (b, s, d) == (2, 32760, 5120) and "ours" in results:
            ours_all = results["ours"][2]
            compiled = [results[k][2] for k in ("compile", "max-autotune") if k in results]
            speedups.append(
                (
                    case.name,
                    results["eager"][2] / ours_all,
                    min(compiled) / ours_all if compiled else float("nan"),
                )
            )
        del case
        torch.cuda.empty_cache()

    fused_rows = []
    bench_fused_residual(fused_rows)
    for name, tf, bf, ts, bs in fused_rows:
        print(
            f"{name}: fused {tf:.3f} ms ({bf / tf / 1e6:.0f} GB/s), "
            f"add + op {ts:.3f} ms; speedup {ts / tf:.2f}x (byte ratio {bs / bf:.2f}x)"
        )
    for name, ve, vc in speedups:
        print(f"fwd+bwd speedup at {name}: {ve:.1f}x vs eager, {vs_compile(vc)}")
    for name, cms, cpct, ours_pct in same_size:
        print(
            f"{name:<32} copy of the forward's bytes {cms:.3f} ms ({cpct:.1f}% of the ceiling);"
            f" our forward {ours_pct:.1f}% of it"
        )

    if args.csv:
        from make_results import append_csv

        append_csv(args.csv, csv_rows)
        print(f"wrote {args.csv}")
    if args.out:
        lines = [
            f"{header}; copy ceiling {ceiling:.0f} GB/s",
            "",
            "| shape | impl | fwd ms | fwd GB/s | fwd % copy | bwd ms | bwd GB/s | bwd % copy "
            "| fwd+bwd ms | peak MiB | saved MiB |",
            "|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for r in table:
            lines.append(
                f"| {r[0]} | {r[1]} | {r[2]:.3f} | {r[3]:.0f} | {r[4]:.1f} | {r[5]:.3f} | "
                f"{r[6]:.0f} | {r[7]:.1f} | {r[8]:.3f} | {r[9]:.0f} | {r[10]:.0f} |"
            )
        lines.append("")
        for name, tf, bf, ts, bs in fused_rows:
            lines.append(
                f"- {name}: fused {tf:.3f} ms vs add + op {ts:.3f} ms "
                f"({ts / tf:.2f}x; bytes {bs / bf:.2f}x)"
            )
        for name, ve, vc in speedups:
            lines.append(f"- fwd+bwd at {name}: {ve:.1f}x vs eager, {vs_compile(vc)}")
        lines += [
            "",
            "Forward against a copy of the same bytes (graph-timed the same way):",
            "",
            "| shape | copy ms | copy % of ceiling | our fwd % of that copy |",
            "|---|---|---|---|",
        ]
        for name, cms, cpct, ours_pct in same_size:
            lines.append(f"| {name} | {cms:.3f} | {cpct:.1f} | {ours_pct:.1f} |")
        with open(args.out, "w") as f:
            f.write("\n".join(lines) + "\n")
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    if torch.cuda.is_available():
        # Everything on one side stream: autograd waits on the stream its leaves were made on,
        # and a CUDA graph cannot capture work that touches the legacy default stream.
        with torch.cuda.stream(torch.cuda.Stream()):
            sys.exit(main())
    sys.exit(main())
