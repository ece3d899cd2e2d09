"""The fused ops' sections of benchmarks/RESULTS.md (make_results.py renders them): bandwidth,
host time and tuning of layer_norm_modulate, and rms_norm_modulate at LTX-Video's shapes."""

from __future__ import annotations

from collections import OrderedDict

from results_io import provenance, read, table


def ops_bandwidth() -> list[str]:
    rows = read("h200/layer_norm_modulate.csv")
    if not rows:
        return []
    main = {(r["shape"], r["impl"]): r for r in rows if r["label"].startswith("main")}
    prev = {(r["shape"], r["impl"]): r for r in rows if r["label"].startswith("previous build")}
    cur = [r for r in rows if r["label"] == "this build"]
    out = [
        "## Fused LayerNorm-Modulate: bandwidth",
        "",
        f"{provenance(cur, 'BASELINE=... bash scripts/gpu_check.sh bench host')}. "
        f"Ceiling: a device-to-device copy in the same run ({cur[0]['ceiling_gbs']} GB/s, bytes "
        "read + written); calls graph-timed, two input sets used in turn (docs/ops.md, byte "
        'model). bf16 x and y with fp32 modulation unless "fp32" (fp32 x, bf16 y and dy). '
        '"main": the kernels before the tuning table (commit 1d7d800, measured that morning '
        'beside the first table build); "prev": the build before the host-time changes '
        '(commit 48dea90), measured in the same run as this build; "rows": the tuning-table '
        "rows that ran.",
        "",
    ]
    body = []
    for r in cur:
        if r["impl"] != "ours":
            continue
        key = (r["shape"], r["impl"])
        m, p = main.get(key, {}), prev.get(key, {})
        e = next((x for x in cur if x["shape"] == r["shape"] and x["impl"] == "eager"), {})
        body.append(
            [
                r["shape"],
                r["fwd_ms"],
                r["fwd_pct"],
                p.get("fwd_pct", "-"),
                m.get("fwd_pct", "-"),
                r["bwd_ms"],
                r["bwd_pct"],
                p.get("bwd_pct", "-"),
                m.get("bwd_pct", "-"),
                r["fwd_bwd_ms"],
                e.get("fwd_bwd_ms", "-"),
                r["saved_mib"],
                r.get("rows", "").replace(" ", "<br>") or "-",
            ]
        )
    out += table(
        [
            "shape",
            "fwd ms",
            "fwd % copy",
            "prev",
            "main",
            "bwd ms",
            "bwd % copy",
            "prev",
            "main",
            "fwd+bwd ms",
            "eager fwd+bwd ms",
            "saved MiB",
            "rows",
        ],
        body,
    )
    compile_rows = read("h200/torch_compile.csv")
    if compile_rows:
        out += [
            "",
            f"torch.compile at 2x32760x5120 ({provenance(compile_rows)}; max-autotune as "
            "`max-autotune-no-cudagraphs`; not rerun since: the kernels at D = 5120 are "
            "unchanged):",
            "",
        ]
        out += table(
            ["impl", "fwd ms", "fwd % copy", "bwd ms", "bwd % copy", "fwd+bwd ms"],
            [
                [
                    r["impl"],
                    r["fwd ms"],
                    r["fwd % copy"],
                    r["bwd ms"],
                    r["bwd % copy"],
                    r["fwd+bwd ms"],
                ]
                for r in compile_rows
            ],
        )
    return out + [""]


def host_overhead() -> list[str]:
    rows = read("h200/host_overhead.csv")
    if not rows:
        return []
    by = OrderedDict()
    for r in rows:
        by.setdefault(r["label"], {})[r["impl"]] = r
    out = [
        "## Host time per call",
        "",
        f"{provenance(rows, 'python benchmarks/bench_host_overhead.py')}. A (1, 4, 64) float32 "
        "tensor, inputs that require grad; the median over rounds of the mean of 2,000 "
        "back-to-back calls (the GPU waits on the host). Targets: forward <= 20 us, "
        'forward+backward <= 120 us. "this build" and "previous build" ran in one call, and so '
        "did 4f745fc and fa7ed1f (readers through public paths, and the commit before them); runs "
        "on this machine vary by several us (F.layer_norm alone, forward: 13.5-20.4 us over the "
        "day's runs).",
        "",
    ]
    body = []
    for label, impls in by.items():
        for impl, r in impls.items():
            body.append([label, impl, r["fwd_us"], r["fwd_bwd_us"]])
    return out + table(["build", "impl", "forward us", "forward+backward us"], body) + [""]


def tuning_sweep() -> list[str]:
    rows = read("h200/tune.csv")
    if not rows:
        return []
    by = OrderedDict()
    for r in rows:
        by.setdefault((r["shape"], r["direction"]), []).append(r)
    body = []
    for (shape, direction), rs in by.items():
        best = max(rs, key=lambda r: float(r["pct"]))
        body.append([shape, direction, best["config"], f"{float(best['pct']):.1f}", len(rs)])
    return (
        [
            "## Tuning sweep",
            "",
            f"{provenance(rows, 'python benchmarks/tune_layer_norm_modulate.py --quick')}. Every "
            "table row that can run the shape, with other settings; the best configuration "
            "per shape. The table's own choice was the best or within 1.5 points (the spread "
            "of one configuration timed twice in this run) at every shape.",
            "",
        ]
        + table(["shape", "direction", "best configuration", "% copy", "configurations"], body)
        + [""]
    )


def rms_bandwidth() -> list[str]:
    rows = read("h200/rms_norm_modulate.csv")
    if not rows:
        return []
    body = [
        [r["shape"], r["impl"], f"{float(r['fwd_ms']) * 1000:.0f}", f"{float(r['fwd_pct']):.1f}",
         f"{float(r['bwd_ms']) * 1000:.0f}", f"{float(r['bwd_pct']):.1f}",
         f"{float(r['fwd_bwd_ms']) * 1000:.0f}"]
        for r in rows
    ]  # fmt: skip
    return (
        [
            "## rms_norm_modulate at LTX-Video's shapes",
            "",
            f"benchmarks/bench_rms_norm_modulate.py: {provenance(rows)}. Hidden "
            "size 2048, per-token modulation read in place from `ada_values` (B, S, 6, D) views, "
            "per-sample modulation; % of the copy bandwidth measured in the same run "
            f"({float(rows[0]['ceiling_gbs']):.0f} GB/s) for the bytes each implementation must "
            "move at least (a per-token shift of dy's dtype has dy as its gradient: nothing to "
            "write; above 100%: it moved fewer than that model assumes). compile: "
            "torch.compile's default mode of the eager formula; max-autotune: "
            "`max-autotune-no-cudagraphs` (bf16 per-token shapes); liger: Liger-Kernel's "
            "LigerModulatedRMSNorm. This run's backward launched a block per row; the token "
            "kernel now takes rows in turn with a GPU-filling grid, which the sweep below "
            "measured 4-5 points faster at 24k-41k rows.",
            "",
        ]
        + table(
            ["shape", "impl", "fwd us", "fwd % copy", "bwd us", "bwd % copy", "fwd+bwd us"], body
        )
        + [""]
    )


def rms_tuning() -> list[str]:
    rows = read("h200/tune_rms.csv")
    if not rows:
        return []
    shapes = list(dict.fromkeys(r["shape"] for r in rows))
    pct = {(r["direction"], r["config"], r["shape"]): float(r["pct"]) for r in rows}
    configs = [
        (d, c) for d, c in dict.fromkeys((r["direction"], r["config"]) for r in rows)
        if "loop" not in c and (";" not in c or c.endswith("teams=1;stages=2"))
    ]  # fmt: skip
    body = [
        [d, c] + [f"{pct[(d, c, s)]:.1f}" if (d, c, s) in pct else "-" for s in shapes]
        for d, c in configs
    ]
    return (
        [
            "## rms_norm_modulate: which kernel at LTX-Video's shapes",
            "",
            f"benchmarks/tune_layer_norm_modulate.py --rms-token: {provenance(rows)}. % of copy "
            "bandwidth of every RMSNorm row that can run each shape (run explicitly, "
            "graph-timed); the backward as autograd asks for it (dx and dscale; dshift too for "
            "fp32 modulation). Candidates measured here and not kept: the scale16 backward rows "
            "(scale as raw 16-bit words) and token1/token4 (256 and 64 threads a row); the "
            "table keeps token16.block1 forward and token2 backward.",
            "",
        ]
        + table(["direction", "row"] + shapes, body)
        + [""]
    )
