"""Tests of adaptiveload.ops' RMSNorm ops: rms_norm_modulate and
gated_residual_rms_norm_modulate.

The accuracy rule, helpers and tolerance table are test_ops.py's (the LayerNorm ops): the op's
error against a float64 reference at most ~2x the error of the same formula run by PyTorch eager
in the op's low precision, with a small floor; every output and every gradient is checked. The
CUDA tuning-table tests of test_ops_cuda.py cover the RMS rows too (each row chosen for a problem of
its key and right, with other settings, on small groups).
"""

from __future__ import annotations

import pytest
import torch

from adaptiveload import ops
from adaptiveload.nn import GatedResidualRMSNormModulate, RMSNormModulate
from test_ops import (
    CUDA,
    DEVICES,
    EPS,
    FLOOR,
    assert_close,
    cuda_only,
    f64,
    make_mod,
    rand,
    reference,
    reference_gated_rms,
    reference_rms,
)

MOD_KINDS = ["shared", "per_sample", "per_token", "chunk", "ltx_token", "ltx_sample"]


def mod(kind, x_shape, dtype, device, gen, k=0):
    """Modulation of a broadcast pattern; "ltx_token" and "ltx_sample" are LTX-Video's views
    ada_values.unbind(dim=2)[k] of a (B, S, 6, D) or (B, 1, 6, D) tensor, read in place."""
    if kind in ("ltx_token", "ltx_sample"):
        b, d = x_shape[0], x_shape[-1]
        rows = x_shape[1] if kind == "ltx_token" else 1
        lead = (b, rows, *x_shape[2:-1]) if len(x_shape) > 2 else (b,)
        ada = 0.5 * torch.randn(*lead, 6, d, generator=gen).to(device, dtype)
        return ada.unbind(dim=-2)[k]
    return make_mod(kind, x_shape, dtype, device, gen)


def run_and_check(x_shape, dtype, mod_dtype, out_dtype, mod_kind, device, affine=False, seed=0):
    gen = torch.Generator().manual_seed(seed)
    d = x_shape[-1]
    x = rand(x_shape, dtype, device, gen, 2.0, 0.3).requires_grad_()
    shift = mod(mod_kind, x_shape, mod_dtype, device, gen, 0).requires_grad_()
    scale = mod(mod_kind, x_shape, mod_dtype, device, gen, 1).requires_grad_()
    weight = rand((d,), mod_dtype, device, gen, 0.2, 1.0).requires_grad_() if affine else None
    inputs = [x, shift, scale, weight]
    leaves = [t for t in inputs if t is not None]
    y = ops.rms_norm_modulate(x, shift, scale, weight=weight, out_dtype=out_dtype)
    dy = rand(x_shape, y.dtype, device, gen)
    got = torch.autograd.grad(y, leaves, dy)

    lowp_in = [None if t is None else t.detach().clone().requires_grad_() for t in inputs]
    y_lowp = reference_rms(*lowp_in, out_dtype=out_dtype)
    lowp = torch.autograd.grad(y_lowp, [t for t in lowp_in if t is not None], dy)
    ref_in = f64(*inputs)
    y_ref = reference_rms(*ref_in)
    ref = torch.autograd.grad(y_ref, [t for t in ref_in if t is not None], dy.double())

    acc = max([dtype, out_dtype or dtype], key=lambda t: FLOOR[t])
    assert_close("y", y, y_ref, y_lowp, acc)
    for name, g, r, lp in zip(["dx", "dshift", "dscale", "dweight"], got, ref, lowp, strict=False):
        assert_close(name, g, r, lp, acc)
    return y, got


# ---------------------------------------------------------------- accuracy

D_SMALL = [8, 768, 769, 1000]
D_LARGE = [1536, 2048, 3072, 4096, 5125, 8192]  # LTX-Video: 2048 (2B), 4096 (13B, LTX-2)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("d", D_SMALL + D_LARGE)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_hidden_sizes(device, d, dtype):
    rows = 64 if d <= 1000 else 8
    run_and_check((2, rows // 2, d), dtype, torch.float32, None, "per_sample", device)
    run_and_check((2, rows // 2, d), dtype, dtype, None, "ltx_token", device, seed=1)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("mod_kind", MOD_KINDS)
@pytest.mark.parametrize(
    "dtype,mod_dtype,out_dtype",
    [
        (torch.bfloat16, torch.float32, None),  # bf16 stream, fp32 modulation
        (torch.bfloat16, torch.bfloat16, None),  # LTX-Video in bf16
        (torch.float16, torch.float16, None),
        (torch.float32, torch.float32, torch.bfloat16),  # fp32 stream (autocast), bf16 out
        (torch.float32, torch.float32, None),
        (torch.bfloat16, torch.float32, torch.float32),
        (torch.float32, torch.float32, torch.float16),  # dy fp16 under fp32 x: widened
        (torch.float16, torch.float32, torch.bfloat16),  # dy of another 16-bit type
    ],
)
def test_dtypes_and_broadcast(device, mod_kind, dtype, mod_dtype, out_dtype):
    run_and_check((3, 17, 256), dtype, mod_dtype, out_dtype, mod_kind, device)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shape", [(1, 1, 768), (1, 1, 769), (5, 768), (2, 3, 4, 512)])
def test_odd_shapes_affine(device, shape):
    run_and_check(shape, torch.bfloat16, torch.float32, None, "shared", device, affine=True)
    run_and_check(shape, torch.float32, torch.float32, None, "per_token", device, affine=True)
    per_sample = "per_sample" if len(shape) == 3 else "ltx_token"
    run_and_check(shape, torch.bfloat16, torch.bfloat16, None, per_sample, device, affine=True)


@pytest.mark.parametrize("device", DEVICES)
def test_mixed_broadcast_patterns(device):
    # shift per token, scale per sample, modulation of shape (1, S, D) shared over the batch.
    gen = torch.Generator().manual_seed(3)
    x = rand((2, 5, 64), torch.float32, device, gen).requires_grad_()
    shift = rand((2, 5, 64), torch.float32, device, gen).requires_grad_()
    scale = rand((1, 5, 64), torch.float32, device, gen).requires_grad_()
    y = ops.rms_norm_modulate(x, shift, scale)
    dy = torch.randn_like(y)
    got = torch.autograd.grad(y, [x, shift, scale], dy)
    ref_in = f64(x, shift, scale)
    y_ref = reference_rms(*ref_in)
    ref = torch.autograd.grad(y_ref, ref_in, dy.double())
    torch.testing.assert_close(y.double(), y_ref.detach(), atol=1e-5, rtol=1e-5)
    for g, r in zip(got, ref, strict=True):
        torch.testing.assert_close(g.double(), r, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("d", [8, 769, 2048, 5120])
@pytest.mark.parametrize("mod_kind", ["per_sample", "per_token", "ltx_token"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_gated_residual(device, d, mod_kind, dtype):
    gen = torch.Generator().manual_seed(d)
    shape = (2, 6, d)
    residual = rand(shape, dtype, device, gen, 2.0, 0.1).requires_grad_()
    h = rand(shape, dtype, device, gen).requires_grad_()
    # gate from one ada_values, shift and scale from the next block's (as LTX-Video chains them)
    gate = mod(mod_kind, shape, torch.float32, device, gen, 5).requires_grad_()
    shift = mod(mod_kind, shape, torch.float32, device, gen, 0).requires_grad_()
    scale = mod(mod_kind, shape, torch.float32, device, gen, 1).requires_grad_()
    inputs = [residual, h, gate, shift, scale]
    r, y = ops.gated_residual_rms_norm_modulate(*inputs)
    dr, dy = rand(shape, dtype, device, gen), rand(shape, dtype, device, gen)
    got = torch.autograd.grad([r, y], inputs, [dr, dy])

    lowp_in = [t.detach().clone().requires_grad_() for t in inputs]
    r_lp, y_lp = reference_gated_rms(*lowp_in)
    lowp = torch.autograd.grad([r_lp, y_lp], lowp_in, [dr, dy])
    ref_in = f64(*inputs)
    r_ref, y_ref = reference_gated_rms(*ref_in)
    ref = torch.autograd.grad([r_ref, y_ref], ref_in, [dr.double(), dy.double()])

    assert_close("r", r, r_ref, r_lp, dtype)
    assert_close("y", y, y_ref, y_lp, dtype)
    names = ["dresidual", "dh", "dgate", "dshift", "dscale"]
    for name, g, rf, lp in zip(names, got, ref, lowp, strict=True):
        assert_close(name, g, rf, lp, dtype)

    # Only y used: the dr path is zeros.
    got_y = torch.autograd.grad(ops.gated_residual_rms_norm_modulate(*inputs)[1], inputs, dy)
    ref_y = torch.autograd.grad(reference_gated_rms(*ref_in)[1], ref_in, dy.double())
    lowp_y = torch.autograd.grad(reference_gated_rms(*lowp_in)[1], lowp_in, dy)
    for name, g, rf, lp in zip(names, got_y, ref_y, lowp_y, strict=True):
        assert_close(name + "(dy only)", g, rf, lp, dtype)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_gated_residual_affine(device, dtype):
    gen = torch.Generator().manual_seed(11)
    shape = (2, 7, 96)
    t = [rand(shape, dtype, device, gen).requires_grad_() for _ in range(2)]
    m = [rand((2, 1, 96), torch.float32, device, gen).requires_grad_() for _ in range(3)]
    w = rand((96,), torch.float32, device, gen, 0.1, 1.0).requires_grad_()
    inputs = [*t, *m, w]
    r, y = ops.gated_residual_rms_norm_modulate(*t, *m, weight=w)
    dr, dy = torch.randn_like(r), torch.randn_like(y)
    got = torch.autograd.grad([r, y], inputs, [dr, dy])
    lowp_in = [v.detach().clone().requires_grad_() for v in inputs]
    r_lp, y_lp = reference_gated_rms(*lowp_in[:5], weight=lowp_in[5])
    lowp = torch.autograd.grad([r_lp, y_lp], lowp_in, [dr, dy])
    ref_in = f64(*inputs)
    r_ref, y_ref = reference_gated_rms(*ref_in[:5], weight=ref_in[5])
    ref = torch.autograd.grad([r_ref, y_ref], ref_in, [dr.double(), dy.double()])
    assert_close("r", r, r_ref, r_lp, dtype)
    assert_close("y", y, y_ref, y_lp, dtype)
    names = ["dresidual", "dh", "dgate", "dshift", "dscale", "dweight"]
    for name, g, rf, lp in zip(names, got, ref, lowp, strict=True):
        assert_close(name, g, rf, lp, dtype)


@pytest.mark.parametrize("device", DEVICES)
def test_matches_torch_and_diffusers_rms_norm(device):
    # The op's norm is torch.nn.RMSNorm's (with elementwise_affine) and diffusers' RMSNorm
    # as LTX-Video's blocks use it (no affine, eps 1e-6), then the modulation.
    gen = torch.Generator().manual_seed(13)
    x = rand((2, 9, 320), torch.float32, device, gen, 2.0, 0.3)
    shift, scale = (mod("ltx_token", x.shape, torch.float32, device, gen, k) for k in (0, 1))
    w = rand((320,), torch.float32, device, gen, 0.2, 1.0)
    norm = torch.nn.functional.rms_norm(x, (320,), w, eps=1e-5)
    y = ops.rms_norm_modulate(x, shift, scale, weight=w, eps=1e-5)
    torch.testing.assert_close(y, norm * (1 + scale) + shift, atol=1e-5, rtol=1e-5)
    normalization = pytest.importorskip("diffusers.models.normalization")
    ltx_norm = normalization.RMSNorm(320, eps=1e-6, elementwise_affine=False).to(device)
    xb = x.bfloat16()
    want = ltx_norm(xb).float() * (1 + scale) + shift
    got = ops.rms_norm_modulate(xb, shift, scale, out_dtype=torch.float32)
    # diffusers rounds the normalized x to bf16 before modulating; the op does not.
    torch.testing.assert_close(got, want, atol=2e-2, rtol=1e-2)


def test_gradcheck_float64():
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(2, 3, 7, generator=gen, dtype=torch.float64, requires_grad=True)
    shift = torch.randn(2, 1, 7, generator=gen, dtype=torch.float64, requires_grad=True)
    scale = torch.randn(2, 3, 7, generator=gen, dtype=torch.float64, requires_grad=True)
    w = torch.randn(7, generator=gen, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(
        lambda *a: ops.rms_norm_modulate(a[0], a[1], a[2], weight=a[3]), (x, shift, scale, w)
    )
    res = torch.randn(2, 3, 7, generator=gen, dtype=torch.float64, requires_grad=True)
    gate = torch.randn(7, generator=gen, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(
        lambda *a: ops.gated_residual_rms_norm_modulate(*a[:5], weight=a[5]),
        (res, x, gate, shift, scale, w),
    )


@pytest.mark.parametrize("pattern", ["per_sample", "shared", "per_token", "ltx_token"])
@pytest.mark.parametrize("affine", [False, True])
def test_gradgradcheck_float64(pattern, affine):
    # Double backward (gradient penalties, Hessian-vector products) through both ops.
    gen = torch.Generator().manual_seed(2)
    shape = (2, 3, 7)
    x = torch.randn(*shape, generator=gen, dtype=torch.float64).requires_grad_()
    shift = mod(pattern, shape, torch.float64, "cpu", gen, 0).detach().requires_grad_()
    scale = mod(pattern, shape, torch.float64, "cpu", gen, 1).detach().requires_grad_()
    gate = mod(pattern, shape, torch.float64, "cpu", gen, 2).detach().requires_grad_()
    res = torch.randn(*shape, generator=gen, dtype=torch.float64).requires_grad_()
    extra = [torch.randn(7, generator=gen, dtype=torch.float64).requires_grad_()] if affine else []

    def rms(x, shift, scale, *w):
        return ops.rms_norm_modulate(x, shift, scale, weight=w[0] if w else None)

    def gated(res, h, gate, shift, scale, *w):
        return ops.gated_residual_rms_norm_modulate(
            res, h, gate, shift, scale, weight=w[0] if w else None
        )

    assert torch.autograd.gradgradcheck(rms, (x, shift, scale, *extra))
    assert torch.autograd.gradgradcheck(gated, (res, x, gate, shift, scale, *extra))


def test_double_backward_matches_eager_and_is_not_zero():
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(2, 5, 16, generator=gen).requires_grad_()
    shift = torch.randn(2, 1, 16, generator=gen).requires_grad_()
    scale = torch.randn(2, 1, 16, generator=gen).requires_grad_()
    w = (1 + 0.1 * torch.randn(16, generator=gen)).requires_grad_()

    def penalty(fn):
        y = fn(x, shift, scale, w)
        (gx,) = torch.autograd.grad(y.square().sum(), x, create_graph=True)
        return torch.autograd.grad(gx.square().sum(), [x, shift, scale, w])

    ours = penalty(lambda x, sh, sc, w: ops.rms_norm_modulate(x, sh, sc, weight=w))
    eager = penalty(reference_rms)
    for g, r in zip(ours, eager, strict=True):
        assert r.abs().max() > 0
        torch.testing.assert_close(g, r, atol=1e-4, rtol=1e-4)


# ---------------------------------------------------------------- properties


@pytest.mark.parametrize("device", DEVICES)
def test_every_output_written(device):
    # Two calls with differently poisoned caching allocator blocks must agree bitwise.
    gen = torch.Generator().manual_seed(5)
    x = rand((3, 11, 769), torch.bfloat16, device, gen)
    shift, scale = (make_mod("per_sample", x.shape, torch.float32, device, gen) for _ in range(2))
    outs = []
    for poison in (float("nan"), 12345.0):
        torch.empty(3 * 11 * 769 * 4, device=device).fill_(poison)
        outs.append(
            torch.ops.adaptiveload.rms_norm_modulate.default(x, shift, scale, None, EPS, None)
        )
    for a, b in zip(*outs, strict=True):
        assert torch.equal(a, b)
        assert not a.isnan().any()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("mod_kind", ["shared", "per_sample", "chunk", "ltx_token"])
def test_backward_deterministic(device, mod_kind):
    gen = torch.Generator().manual_seed(9)
    shape = (2, 300, 2048) if device == "cuda" else (2, 40, 384)
    x = rand(shape, torch.bfloat16, device, gen).requires_grad_()
    res = rand(shape, torch.bfloat16, device, gen).requires_grad_()
    shift, scale, gate = (
        mod(mod_kind, shape, torch.float32, device, gen, k).detach().requires_grad_()
        for k in range(3)
    )
    dy = rand(shape, torch.bfloat16, device, gen)

    def grads():
        plain = torch.autograd.grad(ops.rms_norm_modulate(x, shift, scale), [x, shift, scale], dy)
        r, y = ops.gated_residual_rms_norm_modulate(res, x, gate, shift, scale)
        return plain + torch.autograd.grad([r, y], [res, x, gate, shift, scale], [dy, dy])

    first, second = grads(), grads()
    for a, b in zip(first, second, strict=True):
        assert torch.equal(a, b)


@pytest.mark.parametrize("device", DEVICES)
def test_empty(device):
    for shape in [(0, 64), (2, 0, 64)]:
        x = torch.randn(shape, device=device).requires_grad_()
        shift = torch.randn(64, device=device).requires_grad_()
        scale = torch.randn(64, device=device).requires_grad_()
        y = ops.rms_norm_modulate(x, shift, scale, out_dtype=torch.bfloat16)
        assert y.shape == shape and y.dtype == torch.bfloat16
        dx, dshift, dscale = torch.autograd.grad(y.float().sum(), [x, shift, scale])
        assert dx.shape == shape
        assert torch.equal(dshift, torch.zeros_like(shift))
        assert torch.equal(dscale, torch.zeros_like(scale))
        r, y = ops.gated_residual_rms_norm_modulate(x, x, shift, shift, scale)
        assert r.shape == shape and y.shape == shape


@pytest.mark.parametrize("device", DEVICES)
def test_nan_propagates(device):
    x = torch.randn(4, 1024, device=device, dtype=torch.bfloat16)
    x[1, 7] = float("nan")
    shift = torch.zeros(1024, device=device)
    scale = torch.zeros(1024, device=device)
    y = ops.rms_norm_modulate(x, shift, scale)
    assert y[1].isnan().all()
    assert not y[[0, 2, 3]].isnan().any()


@pytest.mark.parametrize("device", DEVICES)
def test_zero_rows_stay_finite(device):
    # A row of zeros: rstd = 1 / sqrt(eps), y = shift (no mean to subtract, nothing to blow up).
    x = torch.zeros(3, 256, device=device, dtype=torch.bfloat16, requires_grad=True)
    shift = torch.randn(256, device=device)
    scale = torch.randn(256, device=device)
    y = ops.rms_norm_modulate(x, shift, scale, out_dtype=torch.float32)
    torch.testing.assert_close(y, shift.expand(3, 256))
    (dx,) = torch.autograd.grad(y.sum(), x)
    assert dx.isfinite().all()


@pytest.mark.parametrize("device", DEVICES)
def test_errors(device):
    x = torch.randn(2, 3, 64, device=device)
    m = torch.randn(64, device=device)
    f = ops.rms_norm_modulate
    with pytest.raises(RuntimeError, match="rms_norm_modulate: shift must have last dim D=64"):
        f(x, torch.randn(32, device=device), m)
    with pytest.raises(RuntimeError, match="scale of shape .* is not broadcastable"):
        f(x, m, torch.randn(4, 1, 64, device=device))
    with pytest.raises(RuntimeError, match="x must be contiguous"):
        f(torch.randn(2, 64, 3, device=device).transpose(1, 2), m, m)
    with pytest.raises(RuntimeError, match="x must be bfloat16, float16 or float32"):
        f(x.to(torch.int32), m, m)
    with pytest.raises(RuntimeError, match="shift must be float32 or"):
        f(x.half(), m.double(), m.half())
    with pytest.raises(RuntimeError, match=r"weight must have shape \(64,\)"):
        f(x, m, m, weight=torch.ones(63, device=device))
    with pytest.raises(RuntimeError, match="h must have residual's shape"):
        ops.gated_residual_rms_norm_modulate(x, x[:1], m, m, m)
    with pytest.raises(RuntimeError, match="gate must have last dim D=64"):
        ops.gated_residual_rms_norm_modulate(x, x, m[:8], m, m)
    if CUDA:
        other = "cpu" if device == "cuda" else "cuda"
        with pytest.raises(RuntimeError, match="shift is on"):
            f(x, m.to(other), m)


def test_opcheck():
    gen = torch.Generator().manual_seed(2)
    x = torch.randn(2, 5, 48, generator=gen, requires_grad=True)
    shift = torch.randn(2, 1, 48, generator=gen, requires_grad=True)
    scale = torch.randn(48, generator=gen, requires_grad=True)
    w = torch.randn(48, generator=gen, requires_grad=True)
    ada = torch.randn(2, 5, 6, 48, generator=gen, requires_grad=True)
    op = torch.ops.adaptiveload.rms_norm_modulate.default
    torch.library.opcheck(op, (x, shift, scale, w, EPS, torch.bfloat16))
    torch.library.opcheck(op, (x, shift, scale, None, EPS, None))
    torch.library.opcheck(op, (x, ada[:, :, 0], ada[:, :, 1], None, EPS, None))
    h = torch.randn(2, 5, 48, generator=gen, requires_grad=True)
    gated = torch.ops.adaptiveload.gated_residual_rms_norm_modulate.default
    torch.library.opcheck(gated, (x, h, shift, shift, scale, None, EPS, None))
    torch.library.opcheck(gated, (x, h, ada[:, :, 2], ada[:, :, 0], ada[:, :, 1], w, EPS, None))


def test_forward_ad_is_refused():
    import torch.autograd.forward_ad as fwad

    gen = torch.Generator().manual_seed(12)
    x, h = (rand((2, 3, 16), torch.float32, "cpu", gen) for _ in range(2))
    m = make_mod("per_sample", x.shape, torch.float32, "cpu", gen)
    with fwad.dual_level():
        xd = fwad.make_dual(x, torch.randn_like(x))
        with pytest.raises(RuntimeError, match="rms_norm_modulate: forward-mode AD"):
            ops.rms_norm_modulate(xd, m, m)
        md = fwad.make_dual(m, torch.randn_like(m))
        with pytest.raises(RuntimeError, match="gated_residual_rms_norm_modulate: forward-mode"):
            ops.gated_residual_rms_norm_modulate(x, h, md, m, m)


def test_saved_memory_is_x_plus_rstd():
    x = torch.randn(4, 8, 64, requires_grad=True)
    shift = torch.randn(4, 1, 64, requires_grad=True)
    saved = []

    def pack(t):
        saved.append(t)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        ops.rms_norm_modulate(x, shift, shift)
    new = [t for t in saved if t.data_ptr() not in (x.data_ptr(), shift.data_ptr())]
    assert sum(t.numel() * t.element_size() for t in new) == 4 * 4 * 8  # rstd: 4 bytes a row


COMPILE_CASES = [
    ("cpu", "aot_eager"),
    pytest.param("cpu", "inductor", marks=pytest.mark.slow),
    pytest.param("cuda", "inductor", marks=cuda_only),
]


@pytest.mark.parametrize("device,backend", COMPILE_CASES)
def test_torch_compile_fullgraph(device, backend):
    torch._dynamo.reset()
    gen = torch.Generator().manual_seed(4)
    x = rand((2, 6, 32), torch.float32, device, gen).requires_grad_()
    ada = rand((2, 6, 6, 32), torch.float32, device, gen, 0.3).requires_grad_()
    w = rand((32,), torch.float32, device, gen, 0.1, 1.0).requires_grad_()

    def f(x, ada, w):
        shift, scale, gate, shift2, scale2, _ = ada.unbind(dim=2)
        r, y = ops.gated_residual_rms_norm_modulate(x, x * 2, gate, shift, scale)
        return ops.rms_norm_modulate(y, shift2, scale2, weight=w).sum() + r.sum()

    compiled = torch.compile(f, fullgraph=True, backend=backend)
    got = torch.autograd.grad(compiled(x, ada, w), [x, ada, w])
    ref = torch.autograd.grad(f(x, ada, w), [x, ada, w])
    for g, r in zip(got, ref, strict=True):
        torch.testing.assert_close(g, r)


def test_direct_path_is_the_op_and_yields_to_modes():
    gen = torch.Generator().manual_seed(9)
    x = rand((2, 5, 32), torch.float32, "cpu", gen).requires_grad_()
    shift, scale = (make_mod("per_sample", x.shape, torch.float32, "cpu", gen) for _ in range(2))
    y = ops.rms_norm_modulate(x, shift, scale)
    y_op = torch.ops.adaptiveload.rms_norm_modulate.default(x, shift, scale, None, EPS, None)[0]
    assert torch.equal(y, y_op) and y.grad_fn is not None
    assert y.grad_fn.name() == "RmsNormModulateBackward"
    r, y2 = ops.gated_residual_rms_norm_modulate(x, x, shift, shift, scale)
    assert y2.grad_fn.name() == "GatedResidualRmsNormModulateBackward"
    (g,) = torch.autograd.grad(y.sum(), x)
    (g_op,) = torch.autograd.grad(y_op.sum(), x)
    assert torch.equal(g, g_op)

    seen = []

    class Spy(torch.overrides.TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            seen.append(str(func))
            return func(*args, **(kwargs or {}))

    with Spy():
        ops.rms_norm_modulate(x, shift, scale)
        ops.gated_residual_rms_norm_modulate(x, x, shift, shift, scale)
    assert any("rms_norm_modulate" in f for f in seen)
    assert any("gated_residual_rms" in f for f in seen)


def test_modules():
    m = RMSNormModulate(32, elementwise_affine=True, out_dtype=torch.bfloat16)
    assert m.weight.shape == (32,) and m.weight.dtype == torch.float32
    assert "elementwise_affine=True" in repr(m)
    x = torch.randn(2, 3, 32)
    shift, scale = torch.randn(2, 1, 32), torch.randn(2, 1, 32)
    y = m(x, shift, scale)
    assert y.dtype == torch.bfloat16
    want = reference_rms(x, shift, scale, m.weight.detach(), eps=1e-6)
    torch.testing.assert_close(y.float(), want, atol=2e-2, rtol=2e-2)
    r, y2 = GatedResidualRMSNormModulate(32)(x, x, shift, shift, scale)
    torch.testing.assert_close(r, x + shift * x)
    torch.testing.assert_close(y2, reference_rms(r, shift, scale))


# Which gradients are asked for changes how the backward groups rows and, on CUDA, which kernel
# runs (the lean one for the plain op without weight and per-sample or shared scale).
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(
    "shift_kind,scale_kind",
    [("per_sample", "per_sample"), ("shared", "per_sample"), ("ltx_sample", "ltx_sample")],
)
@pytest.mark.parametrize("wanted", ["x", "shift", "scale", "x,scale", "x,shift,scale"])
def test_backward_subsets_of_gradients(device, shift_kind, scale_kind, wanted):
    gen = torch.Generator().manual_seed(len(wanted) + 7 * len(shift_kind))
    shape = (3, 41, 2048)
    x = rand(shape, torch.bfloat16, device, gen, 2.0, 0.3)
    shift = mod(shift_kind, shape, torch.float32, device, gen, 0)
    scale = mod(scale_kind, shape, torch.float32, device, gen, 1)
    names = wanted.split(",")
    inputs = {"x": x, "shift": shift, "scale": scale}
    for name in names:
        inputs[name].requires_grad_()
    y = ops.rms_norm_modulate(inputs["x"], inputs["shift"], inputs["scale"])
    dy = rand(shape, torch.bfloat16, device, gen)
    got = [torch.autograd.grad(y, [inputs[n] for n in names], dy)]
    if device == "cuda":
        # The table takes the lean kernel here; the general kernel must agree.
        assert ops._last_configs()[1].startswith("bwd.bf16.rms.dy16.lean")
        _, rstd = torch.ops.adaptiveload.rms_norm_modulate.default(x, shift, scale, None, EPS, None)
        mask = [n in names for n in ("x", "", "", "shift", "scale", "")]
        g = torch.ops.adaptiveload._rms_norm_modulate_backward_with_config(
            None, dy, x, None, None, shift, scale, None, rstd, mask, "bwd.bf16.rms.dy16.plain.vec2"
        )
        index = {"x": 0, "shift": 3, "scale": 4}
        got.append([g[index[n]] for n in names])
    lowp_in = {k: v.detach().clone().requires_grad_(v.requires_grad) for k, v in inputs.items()}
    lowp = torch.autograd.grad(
        reference_rms(lowp_in["x"], lowp_in["shift"], lowp_in["scale"]),
        [lowp_in[n] for n in names],
        dy,
    )
    ref_in = dict(zip(inputs, f64(*inputs.values()), strict=True))
    ref = torch.autograd.grad(
        reference_rms(ref_in["x"], ref_in["shift"], ref_in["scale"]),
        [ref_in[n] for n in names],
        dy.double(),
    )
    for grads in got:
        for name, g, r, lp in zip(names, grads, ref, lowp, strict=True):
            assert_close("d" + name, g, r, lp, torch.bfloat16)


# A per-token shift of dy's dtype has dy itself as its gradient: the backward neither computes
# nor writes it (autograd passes dy on), whichever other gradients are asked for. Both norms.
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("norm", ["layer", "rms"])
@pytest.mark.parametrize("wanted", ["shift", "x,shift", "shift,scale", "x,shift,scale"])
def test_per_token_shift_gradient_is_dy(device, norm, wanted):
    gen = torch.Generator().manual_seed(len(wanted) + 11 * len(norm))
    shape = (2, 37, 2048)
    x = rand(shape, torch.bfloat16, device, gen, 2.0, 0.3)
    shift = mod("ltx_token", shape, torch.bfloat16, device, gen, 0)
    scale = mod("ltx_token", shape, torch.bfloat16, device, gen, 1)
    names = wanted.split(",")
    inputs = {"x": x, "shift": shift, "scale": scale}
    for name in names:
        inputs[name].requires_grad_()
    op, ref_fn = (
        (ops.layer_norm_modulate, reference)
        if norm == "layer"
        else (ops.rms_norm_modulate, reference_rms)
    )
    y = op(inputs["x"], inputs["shift"], inputs["scale"])
    dy = rand(shape, torch.bfloat16, device, gen)
    got = torch.autograd.grad(y, [inputs[n] for n in names], dy)
    assert torch.equal(got[names.index("shift")], dy)
    if device == "cuda" and names != ["shift"]:
        dt = "bf16.rms" if norm == "rms" else "bf16"
        assert ops._last_configs()[1] == f"bwd.{dt}.dy16.token2"
    lowp_in = {k: v.detach().clone().requires_grad_(v.requires_grad) for k, v in inputs.items()}
    lowp = torch.autograd.grad(
        ref_fn(lowp_in["x"], lowp_in["shift"], lowp_in["scale"]), [lowp_in[n] for n in names], dy
    )
    ref_in = dict(zip(inputs, f64(*inputs.values()), strict=True))
    ref = torch.autograd.grad(
        ref_fn(ref_in["x"], ref_in["shift"], ref_in["scale"]),
        [ref_in[n] for n in names],
        dy.double(),
    )
    for name, g, r, lp in zip(names, got, ref, lowp, strict=True):
        assert_close("d" + name, g, r, lp, torch.bfloat16)
