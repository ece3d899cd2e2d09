"""The CUDA tuning tables of every op (csrc/ops/cuda/tuned_*.cu): each row is the one the op
picks for a problem in its key and computes the right result, with its own and with other
settings; small groups, fp32 streams, explicit rows checked, and the RMSNorm rows the LayerNorm
rows' twins. The row tests need a GPU (the cuda marker); the twin check needs only a CUDA build.
References and the accuracy rule: op_refs.py."""

from __future__ import annotations

import pytest
import torch

from adaptiveload import ops
from op_refs import (
    CUDA,
    DEVICES,
    EPS,
    FLOOR,
    NORMS,
    assert_close,
    f64,
    make_mod,
    rand,
    reference,
    run_and_check,
)

# ---------------------------------------------------------------- the CUDA tuning table
#
# Every row of the tables (csrc/ops/cuda/tuned_*.cu) must be the one the op picks for a problem
# in its key, and must compute the right result; an explicit row (the private *_with_config
# ops) with its settings overridden must too. 37 rows per sample is not a multiple of any team
# or warp count, so teams and warps idle in the last pass.

# Without a GPU the row tests' cases are not made: some 1,400 skipped cases cost seconds.
TABLE = ops._tuning_table() if CUDA else []
DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}


def row_problems(row):
    """Problems in the row's key, (x shape, x dtype, modulation kind, out dtype, affine, gated,
    norm), smallest first: D at the top of the row's range (capped) and at its bottom with 111
    rows, then, for rows without a row-count limit, 40,000 rows (where an earlier row with a
    limit, such as the ring's, shadows it below)."""
    dtype = DTYPES[row["x"]]
    vec = 16 // torch.tensor([], dtype=dtype).element_size()
    if not row["vector"]:
        dims = [770]  # not a multiple of any vector width: the loop kernels
    elif row.get("exact_nvec"):
        dims = [row["exact_nvec"] * vec]
    else:
        top = min(row["d_max"], 6144)
        dims = [max(top - top % vec, row["d_min"]), row["d_min"]]
    rows_max = row.get("rows_max", -1)
    shapes = [(3, 37, d) if rows_max == -1 or rows_max >= 111 else (1, rows_max, d) for d in dims]
    if rows_max == -1:
        shapes.append((1, 40000, dims[-1]))
    gated = row["op"] == "gated"
    affine = row.get("affine", 0) == 1
    if row["direction"] == "forward":
        mod = {"block": "per_sample", "token": "per_token", "any": "per_sample"}[row["mod"]]
        if row["mod16"]:  # modulation of x's own 16-bit type
            mod = "per_token16"
        out = None
    else:
        # The lean kernel's case: plain op, no affine, per-sample modulation; the token
        # kernel's: per-token modulation, no gradient summed over rows; the general rows of the
        # plain op without affine get a per-token scale and a per-sample shift, neither case.
        if row["token"]:
            mod = "per_token"
        elif row["lean"] or gated or affine:
            mod = "per_sample"
        else:
            mod = "token_scale"
        wide = dtype if dtype != torch.float32 else torch.bfloat16
        out = {"any": None, "f32": torch.float32}.get(row["dy"], wide)
    norm = row["norm"]
    return [(shape, dtype, mod, out, affine, gated, norm) for shape in shapes]


def row_problem(row):
    return row_problems(row)[0]


def run_ops(norm, x, h, gate, shift, scale, w, b, out_dtype):
    """The public op of the norm kind ("layer" or "rms"; RMSNorm has no bias): (r, y), r None
    for the plain op."""
    n = NORMS[norm]
    kw = dict(zip(n.affine, (w, b), strict=False), out_dtype=out_dtype)
    if h is None:
        return None, n.op(x, shift, scale, **kw)
    return n.gated(x, h, gate, shift, scale, **kw)


def run_ops_with_config(norm, config, x, h, gate, shift, scale, w, b, out_dtype):
    """An explicit forward row (the private *_with_config ops): (r, y, saved statistics), the
    statistics (mean, rstd) for LayerNorm, (rstd,) for RMSNorm."""
    x, h, gate, shift, scale, w, b = (None if t is None else t.detach() for t in (x, h, gate, shift, scale, w, b))  # fmt: skip
    if norm == "layer":
        r, y, mean, rstd = torch.ops.adaptiveload._layer_norm_modulate_with_config(
            x, h, gate, shift, scale, w, b, EPS, out_dtype, config
        )
        return r, y, (mean, rstd)
    r, y, rstd = torch.ops.adaptiveload._rms_norm_modulate_with_config(
        x, h, gate, shift, scale, w, EPS, out_dtype, config
    )
    return r, y, (rstd,)


def run_backward_with_config(norm, config, dr, dy, saved, h, gate, shift, scale, w, b, stats):
    """An explicit backward row: the gradients of (x, h, gate, shift, scale, w, b) that exist,
    in that order."""
    gated, affine = h is not None, w is not None
    saved, h, gate, shift, scale, w, b = (None if t is None else t.detach() for t in (saved, h, gate, shift, scale, w, b))  # fmt: skip
    if norm == "layer":
        mask = [True, gated, gated, True, True, affine, affine]
        g = torch.ops.adaptiveload._layer_norm_modulate_backward_with_config(
            dr, dy, saved, h, gate, shift, scale, w, b, *stats, mask, config
        )
    else:
        mask = [True, gated, gated, True, True, affine]
        g = torch.ops.adaptiveload._rms_norm_modulate_backward_with_config(
            dr, dy, saved, h, gate, shift, scale, w, *stats, mask, config
        )
    dx, dh, dgate, dshift, dscale, *dwb = g
    got = [dx] + ([dh, dgate] if gated else []) + [dshift, dscale]
    return got + (dwb if affine else [])


def selected_rows(problem):
    """The rows the table picks for a problem (forward, backward), from one cheap run."""
    shape, dtype, mod, out, affine, gated, norm = problem
    _, x, h, gate, shift, scale, w, b = make_problem(shape, dtype, mod, affine, gated, 0, norm)
    leaves = [t for t in (x, h, gate, shift, scale, w, b) if t is not None]
    r, y = run_ops(norm, x, h, gate, shift, scale, w, b, out)
    outs = [y] if r is None else [r, y]
    torch.autograd.grad(outs, leaves, [torch.ones_like(t) for t in outs])
    torch.cuda.synchronize()
    return ops._last_configs()


def make_problem(shape, dtype, mod_kind, affine, gated, seed, norm="layer"):
    gen = torch.Generator().manual_seed(seed)
    d = shape[-1]
    x = rand(shape, dtype, "cuda", gen, 2.0, 0.3).requires_grad_()
    h = rand(shape, dtype, "cuda", gen).requires_grad_() if gated else None
    # token_scale: a per-token scale beside a per-sample shift (and gate); per_token16: per-token
    # modulation of x's own dtype (fp32 otherwise).
    mod_dtype = dtype if mod_kind == "per_token16" else torch.float32
    mod_kind = "per_token" if mod_kind == "per_token16" else mod_kind
    scale_kind = "per_token" if mod_kind == "token_scale" else mod_kind
    mod_kind = "per_sample" if mod_kind == "token_scale" else mod_kind
    gate = make_mod(mod_kind, shape, mod_dtype, "cuda", gen).requires_grad_() if gated else None
    shift = make_mod(mod_kind, shape, mod_dtype, "cuda", gen).requires_grad_()
    scale = make_mod(scale_kind, shape, mod_dtype, "cuda", gen).requires_grad_()
    w = b = None
    if affine:
        w = rand((d,), torch.float32, "cuda", gen, 0.2, 1.0).requires_grad_()
        if norm == "layer":  # RMSNorm has no bias
            b = rand((d,), torch.float32, "cuda", gen, 0.2).requires_grad_()
    return gen, x, h, gate, shift, scale, w, b


def check_problem(
    shape, dtype, mod_kind, out_dtype, affine, gated, norm="layer", fwd=None, bwd=None, seed=0
):
    """Runs the ops of the norm kind (or the explicit rows fwd / bwd) on fresh inputs and checks
    every output and gradient against the float64 reference; returns the rows that ran."""
    gen, x, h, gate, shift, scale, w, b = make_problem(
        shape, dtype, mod_kind, affine, gated, seed, norm
    )
    leaves = [t for t in (x, h, gate, shift, scale, w, b) if t is not None]
    if fwd is None:
        r, y = run_ops(norm, x, h, gate, shift, scale, w, b, out_dtype)
    else:
        r, y, stats = run_ops_with_config(norm, fwd, x, h, gate, shift, scale, w, b, out_dtype)
    dy = rand(shape, y.dtype, "cuda", gen)
    dr = rand(shape, dtype, "cuda", gen) if gated else None
    outs, grads_out = ([r, y], [dr, dy]) if gated else ([y], [dy])
    if fwd is None and bwd is None:
        got = torch.autograd.grad(outs, leaves, grads_out)
    else:
        if fwd is None:  # the table's forward, an explicit backward
            config = ops._last_configs()[0]
            r, y, stats = run_ops_with_config(
                norm, config, x, h, gate, shift, scale, w, b, out_dtype
            )
        saved = r if gated else x
        got = run_backward_with_config(
            norm, bwd or "", dr, dy, saved, h, gate, shift, scale, w, b, stats
        )
    ran = ops._last_configs()
    lowp_in = [t.detach().clone().requires_grad_() for t in leaves]
    ref_in = f64(*leaves)
    plain_ref, gated_ref = NORMS[norm].ref, NORMS[norm].ref_gated
    n_affine = len(NORMS[norm].affine)

    def ref_fn(ins):
        lead, wb = (ins[:5], ins[5:]) if gated else (ins[:3], ins[3:])
        wb = wb + [None] * (n_affine - len(wb))
        if gated:
            return list(gated_ref(*lead, *wb, out_dtype=out_dtype))
        return [plain_ref(*lead, *wb, out_dtype=out_dtype)]

    lowp_out, ref_out = ref_fn(lowp_in), ref_fn(ref_in)
    lowp = torch.autograd.grad(lowp_out, lowp_in, grads_out)
    ref = torch.autograd.grad(ref_out, ref_in, [t.double() for t in grads_out])
    acc = max([dtype, out_dtype or dtype], key=lambda t: FLOOR[t])
    assert_close("y", y, ref_out[-1], lowp_out[-1], acc)
    if gated:
        assert_close("r", r, ref_out[0], lowp_out[0], dtype)
    for i, (gv, rf, lp) in enumerate(zip(got, ref, lowp, strict=True)):
        assert_close(f"grad {i}", gv, rf, lp, acc)
    return ran


def _arch():
    major, minor = torch.cuda.get_device_capability()
    return major * 10 + minor


@pytest.mark.cuda
@pytest.mark.parametrize("row", TABLE, ids=[r["id"] for r in TABLE])
def test_table_row_is_chosen_for_its_problem_and_right(row):
    if row["arch_min"] > _arch():
        pytest.skip(f"row for sm_{row['arch_min']} and newer")
    slot = 0 if row["direction"] == "forward" else 1
    # The first problem (smallest first) for which the table picks this row.
    problem = next((p for p in row_problems(row) if selected_rows(p)[slot] == row["id"]), None)
    assert problem, f"no problem of the row's key selects {row['id']}: a shadowed row"
    ran = check_problem(*problem, seed=len(row["id"]))
    assert ran[slot] == row["id"]


def settings_cases():
    """Each warp and ring row (bf16 and fp32 x) and each bf16 vector backward row under other
    settings: block sizes down to one row slot, y store widths, ring depths, team counts and
    both row orders."""
    cases = []
    for row in TABLE:
        kernel = row["kernel"]
        if row["x"] == "f16":
            continue
        if row["direction"] == "forward" and kernel.startswith("warp<"):
            wpr = int(kernel.split(",")[3])
            three = 3 * wpr if 3 * wpr <= 8 else wpr
            for warps, y_words, order in ((8, 0, 0), (wpr, 1, 1), (three, 1, 0)):
                cases.append((row, f";warps={warps};y_words={y_words};interleave={order}"))
        elif row["direction"] == "forward" and kernel.startswith("ring<"):
            for warps, stages in ((1, 1), (3, 2), (5, 3), (8, 3)):
                cases.append((row, f";warps={warps};stages={stages};y_words={stages % 2}"))
        elif row["direction"] == "backward" and row["vector"] and row["x"] == "bf16":
            for teams, stages in ((1, 1), (2, 3), (4, 2)):
                cases.append((row, f";teams={teams};stages={stages};interleave={teams % 2}"))
    return cases


SETTINGS = settings_cases()


@pytest.mark.cuda
@pytest.mark.parametrize("row,settings", SETTINGS, ids=[r["id"] + s for r, s in SETTINGS])
def test_table_row_with_other_settings_is_right(row, settings):
    if row["arch_min"] > _arch():
        pytest.skip(f"row for sm_{row['arch_min']} and newer")
    problem = row_problem(row)
    config = row["id"] + settings
    if row["direction"] == "forward":
        fwd_ran, _ = check_problem(*problem, fwd=config, seed=3)
        assert fwd_ran == row["id"]
    else:
        _, bwd_ran = check_problem(*problem, bwd=config, seed=4)
        assert bwd_ran == row["id"]


@pytest.mark.cuda
def test_explicit_configurations_are_checked():
    x = torch.randn(2, 8, 1536, device="cuda", dtype=torch.bfloat16)
    m = torch.randn(2, 1, 1536, device="cuda")
    run = torch.ops.adaptiveload._layer_norm_modulate_with_config
    with pytest.raises(RuntimeError, match="no tuning-table row 'fwd.bf16.nope'"):
        run(x, None, None, m, m, None, None, EPS, None, "fwd.bf16.nope")
    with pytest.raises(RuntimeError, match="cannot run D = 1536"):
        run(x, None, None, m, m, None, None, EPS, None, "fwd.bf16.plain.block.warp4x2x1")
    with pytest.raises(RuntimeError, match="unknown forward setting 'teams'"):
        run(x, None, None, m, m, None, None, EPS, None, "fwd.bf16.plain.block.warp6x2x1;teams=2")
    x5 = torch.randn(2, 8, 5120, device="cuda")
    m5 = torch.randn(2, 1, 5120, device="cuda")
    with pytest.raises(RuntimeError, match="multiple of 4"):
        run(x5, None, None, m5, m5, None, None, EPS, None, "fwd.f32.plain.block.warp10x1x4;warps=6")


# Groups of at most 16 rows (kDirectMaxRows in csrc/ops/cuda/configs.h) that share one row of
# every summed gradient get one block each, which writes the fp32 gradients itself; 17 rows,
# or a 16-bit gradient, take the partial buffer and its second stage. Every backward row, both
# ways: (x shape without D, modulation kind).
SMALL_GROUPS = [((3, 5), "per_sample"), ((2, 16), "chunk"), ((1, 7), "shared"), ((2, 17), "chunk")]
BWD_ROWS = [r for r in TABLE if r["direction"] == "backward"]


@pytest.mark.cuda
@pytest.mark.parametrize("lead,mod", SMALL_GROUPS, ids=[f"{m}{s}" for s, m in SMALL_GROUPS])
@pytest.mark.parametrize("row", BWD_ROWS, ids=[r["id"] for r in BWD_ROWS])
def test_backward_rows_on_small_groups(row, lead, mod):
    if row["arch_min"] > _arch():
        pytest.skip(f"row for sm_{row['arch_min']} and newer")
    shape, dtype, _, out, affine, gated, norm = row_problem(row)
    if row["lean"] and affine:
        pytest.skip("the lean kernel has no affine case")
    if row["token"]:
        pytest.skip("the token kernel sums no gradient over rows")
    _, bwd_ran = check_problem(
        (*lead, shape[-1]), dtype, mod, out, affine, gated, norm, bwd=row["id"]
    )
    assert bwd_ran == row["id"]


@pytest.mark.cuda
@pytest.mark.parametrize(
    "rows,mod_dtype,second_stage",
    [(16, torch.float32, False), (17, torch.float32, True), (16, torch.bfloat16, True)],
)
def test_small_groups_launch_one_kernel(rows, mod_dtype, second_stage):
    x = torch.randn(2, rows, 256, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    shift, scale = (
        torch.randn(2, 1, 256, device="cuda", dtype=mod_dtype, requires_grad=True) for _ in range(2)
    )
    y = ops.layer_norm_modulate(x, shift, scale)
    dy = torch.randn_like(y)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        got = torch.autograd.grad(y, (x, shift, scale), dy)
        torch.cuda.synchronize()
    names = [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    assert any("bwd" in n for n in names), names
    assert any("reduce_partials" in n for n in names) == second_stage, names
    ref_in = f64(x, shift, scale)
    ref = torch.autograd.grad(reference(*ref_in), ref_in, dy.double())
    lowp_in = [t.detach().clone().requires_grad_() for t in (x, shift, scale)]
    lowp = torch.autograd.grad(reference(*lowp_in), lowp_in, dy)
    for name, g, r, lp in zip(("dx", "dshift", "dscale"), got, ref, lowp, strict=True):
        assert_close(name, g, r, lp, torch.bfloat16)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("d", [12, 1540])
@pytest.mark.parametrize("settings", ["", ";teams=1;stages=1", ";teams=4;stages=2"])
def test_fp32_stream_rows_not_a_multiple_of_8(device, d, settings):
    # fp32 x with bf16 y (the Wan case): an x row plus a bf16 dy row is 6 * D bytes, not a
    # multiple of 16 when D % 8 == 4; the backward's shared-memory row slots must stay aligned,
    # with every team count and ring depth.
    if device == "cpu":
        if settings:
            pytest.skip("settings of the CUDA kernels")
        run_and_check(
            "layer", (3, 21, d), torch.float32, torch.float32, torch.bfloat16, "per_sample", device
        )
        return
    check_problem((3, 21, d), torch.float32, "per_sample", torch.bfloat16, False, False)
    row = ops._last_configs()[1]
    check_problem(
        (3, 21, d), torch.float32, "per_sample", torch.bfloat16, False, False, bwd=row + settings
    )


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("d", [3072, 3080])
def test_fp32_stream_at_the_default_shared_memory_limit(device, d):
    # fp32 x, bf16 dy, D = 3072: the backward's staged scale and two ring slots take exactly
    # 48 KB of dynamic shared memory, which with the kernel's static bytes is over the default
    # per-block limit; the launch must opt in to more (it failed with "invalid argument").
    run_and_check(
        "layer", (2, 40, d), torch.float32, torch.float32, torch.bfloat16, "per_sample", device
    )


# ---------------------------------------------------------------- the norm kinds' rows


@pytest.mark.cuda
def test_explicit_configurations_check_the_norm():
    x = torch.randn(2, 8, 1536, device="cuda", dtype=torch.bfloat16)
    m = torch.randn(2, 1, 1536, device="cuda")
    rms_fwd = torch.ops.adaptiveload._rms_norm_modulate_with_config
    ln_fwd = torch.ops.adaptiveload._layer_norm_modulate_with_config
    with pytest.raises(RuntimeError, match="compiled for layer, not rms"):
        rms_fwd(x, None, None, m, m, None, EPS, None, "fwd.bf16.plain.block.warp6x2x1")
    with pytest.raises(RuntimeError, match="compiled for rms, not layer"):
        ln_fwd(x, None, None, m, m, None, None, EPS, None, "fwd.bf16.rms.plain.block.warp6x2x1")
    _, y, rstd = rms_fwd(x, None, None, m, m, None, EPS, None, "fwd.bf16.rms.plain.block.warp6x2x1")
    mask = [True, False, False, True, True, False]
    with pytest.raises(RuntimeError, match="compiled for layer, not rms"):
        torch.ops.adaptiveload._rms_norm_modulate_backward_with_config(
            None, y, x, None, None, m, m, None, rstd, mask, "bwd.bf16.dy16.lean2"
        )


# CUDA builds register the tables whether or not a GPU is present.
HAS_TABLES = bool(ops._tuning_table())


@pytest.mark.skipif(not HAS_TABLES, reason="a CPU-only build has no CUDA tuning tables")
def test_every_layer_norm_row_has_an_rms_twin():
    # The RMSNorm rows repeat the LayerNorm rows' keys, kernels and settings (docs/ops.md), so
    # an RMSNorm problem runs the kernel its LayerNorm twin would.
    rows = ops._tuning_table()
    layer = [r for r in rows if r["norm"] == "layer"]
    rms = {r["id"]: r for r in rows if r["norm"] == "rms"}
    assert layer and len(rms) == len(layer)
    for row in layer:
        direction, dtype, rest = row["id"].split(".", 2)
        twin = rms[f"{direction}.{dtype}.rms.{rest}"]
        assert twin["kernel"] == row["kernel"][:-1] + ",rms>"
        same = {k: v for k, v in row.items() if k not in ("id", "norm", "kernel")}
        assert {k: v for k, v in twin.items() if k not in ("id", "norm", "kernel")} == same
