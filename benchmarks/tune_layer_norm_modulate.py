"""Which kernel configuration is fastest at each shape, and does the tuning table pick it?

For each shape (per-sample modulation, the plain op), times every row of the CUDA tuning
table that can run it (the private *_with_config ops; rows of other shapes included, each also
with other settings: warps per block, ring slots, y store width, backward teams and ring
depth), graph-timed as benchmarks/bench_layer_norm_modulate.py does, and prints the best
configuration beside the table's own choice. Where the best beats the table's choice by more
than --margin points of copy bandwidth, it prints a candidate table line for that shape. One
configuration timed twice differs by up to 1-1.5 points between runs (benchmarks/RESULTS.md):
a candidate within that is noise; rerun before editing the table.

    python benchmarks/tune_layer_norm_modulate.py [--quick] [--csv FILE] [--margin 1.0]

--rms-token: the RMSNorm rows instead, at LTX-Video's shapes (bench_rms_norm_modulate.py's
cases: hidden size 2048, per-token bf16 modulation read in place from ada_values views); the
backward as autograd asks for it there (dx and dscale: dshift is dy itself).
"""

from __future__ import annotations

import argparse
import itertools
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_layer_norm_modulate import Case, bench, copy_ceiling_gbs  # noqa: E402

EPS = 1e-6
FWD_SETTINGS = {
    "warp": [";warps=8;y_words=1", ";warps=8;y_words=0", ";warps=4;y_words=1"],
    "ring": [";warps=8;stages=2", ";warps=8;stages=3", ";warps=7;stages=2", ";warps=4;stages=2"],
    "block": [""],
    "loop": [""],
}
BWD_SETTINGS = [
    "",
    ";teams=1;stages=2",
    ";teams=2;stages=2",
    ";teams=3;stages=2",
    ";teams=2;stages=1",
]


def fwd_candidates(table, x):
    for row in table:
        if row["direction"] == "forward" and row["x"] == x and row["op"] != "gated":
            kind = row["kernel"].split("<")[0]
            for s in FWD_SETTINGS[kind]:
                yield row["id"] + s


def bwd_candidates(table, x, dy):
    for row in table:
        if (
            row["direction"] == "backward"
            and row["x"] == x
            and row["dy"] in (dy, "any")
            and row["op"] != "gated"
            and row.get("affine", 0) != 1
        ):
            for s in BWD_SETTINGS if row["vector"] and not row["token"] else [""]:
                yield row["id"] + s


def timed(run, sets):
    """Graph-timed ms of one ``run`` over input sets used in turn; a first plain call raises
    RuntimeError for a row that cannot run this shape."""
    with torch.no_grad():
        run(*sets[0])
        return bench(run, sets)


def time_forward(case, config):
    def run(x, shift, scale, dy):
        torch.ops.adaptiveload._layer_norm_modulate_with_config(
            x, None, None, shift, scale, None, None, EPS, case.out_dtype, config
        )

    return timed(run, case.sets)


def time_backward(case, config):
    saved = []
    with torch.no_grad():
        for x, shift, scale, dy in case.sets:
            _, mean, rstd = torch.ops.adaptiveload.layer_norm_modulate.default(
                x, shift, scale, None, None, EPS, case.out_dtype
            )
            saved.append((x.detach(), shift.detach(), scale.detach(), dy, mean, rstd))
    mask = [True, False, False, True, True, False, False]

    def run(x, shift, scale, dy, mean, rstd):
        torch.ops.adaptiveload._layer_norm_modulate_backward_with_config(
            None, dy, x, None, None, shift, scale, None, None, mean, rstd, mask, config
        )

    return timed(run, saved)


def time_forward_rms(case, config):
    def run(x, shift, scale, dy):
        torch.ops.adaptiveload._rms_norm_modulate_with_config(
            x, None, None, shift, scale, None, EPS, case.out_dtype, config
        )

    return timed(run, case.sets)


def time_backward_rms(case, config):
    saved = []
    with torch.no_grad():
        for x, shift, scale, dy in case.sets:
            _, rstd = torch.ops.adaptiveload.rms_norm_modulate.default(
                x, shift, scale, None, EPS, case.out_dtype
            )
            saved.append((x.detach(), shift.detach(), scale.detach(), dy, rstd))
    # dx, dscale, and dshift unless it is dy itself (then autograd does not ask for it)
    mask = [True, False, False, not case.dshift_is_dy, True, False]

    def run(x, shift, scale, dy, rstd):
        torch.ops.adaptiveload._rms_norm_modulate_backward_with_config(
            None, dy, x, None, None, shift, scale, None, rstd, mask, config
        )

    return timed(run, saved)


def table_rows(case, norm="layer"):
    """The rows the table picks for this case (forward, backward)."""
    from adaptiveload import ops

    op = ops.rms_norm_modulate if norm == "rms" else ops.layer_norm_modulate
    x, shift, scale, dy = case.sets[0]
    y = op(x, shift, scale, out_dtype=case.out_dtype)
    torch.autograd.grad(y, (x, shift, scale), dy)
    return ops._last_configs()


def cases(args):
    """(case, x dtype name) per shape, built one at a time."""
    if args.rms_token:
        from bench_rms_norm_modulate import Case as RmsCase

        for s in [24576] if args.quick else [10240, 24576, 40960]:
            yield RmsCase(1, s, "per_token", torch.bfloat16, copies=2), "bf16"
        yield RmsCase(1, 24576, "per_token", torch.float32, copies=2), "bf16"
        return
    dims = [1536, 5120] if args.quick else [1536, 3072, 5120]
    streams = ["bf16"] if args.quick else ["bf16", "fp32"]
    for stream, d, s in itertools.product(streams, dims, [32760, 75600]):
        yield Case(1, s, d, stream, "per_sample", copies=2), "bf16" if stream == "bf16" else "f32"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--csv", help="append every timing to this CSV")
    parser.add_argument("--margin", type=float, default=1.0, help="points of copy bandwidth")
    parser.add_argument("--rms-token", action="store_true", help="RMSNorm rows, LTX-Video shapes")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("tune_layer_norm_modulate.py needs a CUDA GPU", file=sys.stderr)
        return 1
    from adaptiveload import ops

    ceiling = copy_ceiling_gbs()
    print(f"GPU {torch.cuda.get_device_name()}, copy ceiling {ceiling:.0f} GB/s")
    norm = "rms" if args.rms_token else "layer"
    table = [row for row in ops._tuning_table() if row["norm"] == norm]
    fwd_timer, bwd_timer = (
        (time_forward_rms, time_backward_rms) if args.rms_token else (time_forward, time_backward)
    )
    records, proposals = [], []
    for case, x_name in cases(args):
        picked_fwd, picked_bwd = table_rows(case, norm)
        for direction in ("forward", "backward"):
            results = {}
            if direction == "forward":
                configs, timer, nbytes = fwd_candidates(table, x_name), fwd_timer, case.fwd_bytes
            else:
                configs = bwd_candidates(table, x_name, "bf16")
                timer, nbytes = bwd_timer, case.bwd_bytes
            for config in configs:
                try:
                    ms = timer(case, config)
                except RuntimeError:  # a row that cannot run this shape
                    continue
                results[config] = 100 * nbytes / ms / 1e6 / ceiling
                records.append(
                    {"shape": case.name, "direction": direction, "config": config,
                     "ms": ms, "pct": results[config]}
                )  # fmt: skip
            picked = picked_fwd if direction == "forward" else picked_bwd
            best = max(results, key=results.get)
            mine = results.get(picked, float("nan"))
            print(
                f"{case.name:<28} {direction:<8} table {picked} {mine:5.1f}% | "
                f"best {best} {results[best]:5.1f}%"
            )
            if results[best] > mine + args.margin:
                proposals.append((case.name, direction, best, results[best], picked, mine))
        del case
        torch.cuda.empty_cache()
    print()
    if not proposals:
        print(f"The table's choice is within {args.margin} points of the best at every shape.")
    for name, direction, best, pct, picked, mine in proposals:
        print(
            f"candidate row for {name} ({direction}): {best} at {pct:.1f}% "
            f"(table: {picked} at {mine:.1f}%)"
        )
    if args.csv:
        from make_results import append_csv

        append_csv(args.csv, records)
    return 0


if __name__ == "__main__":
    if torch.cuda.is_available():
        with torch.cuda.stream(torch.cuda.Stream()):
            sys.exit(main())
    sys.exit(main())
