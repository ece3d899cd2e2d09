"""Tests of adaptiveload.ops: layer_norm_modulate and gated_residual_layer_norm_modulate (the
RMSNorm ops: test_ops_rms.py; the CUDA-only tests, tuning tables of every op included: test_ops_cuda.py; both share
the references and helpers here).

Accuracy rule (flash-attention style): the op's error against a float64 reference must be at
most ~2x the error of the same formula run by PyTorch eager in the op's low precision, with a
small floor. Every output and every gradient is checked.
"""

from __future__ import annotations

import pytest
import torch

from adaptiveload import ops
from adaptiveload.nn import GatedResidualLayerNormModulate, LayerNormModulate

CUDA = torch.cuda.is_available()
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not CUDA, reason="needs CUDA"))]
cuda_only = pytest.mark.skipif(not CUDA, reason="needs CUDA")

# dtype -> absolute error floor (the 2x-PyTorch rule applies on top).
FLOOR = {torch.float64: 1e-10, torch.float32: 2e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}

EPS = 1e-6


# ---------------------------------------------------------------- reference


def reference(x, shift, scale, weight=None, bias=None, eps=EPS, out_dtype=None):
    """Plain PyTorch adaLN in x's dtype (statistics in fp32, like eager layer_norm)."""
    d = x.shape[-1]
    xn = torch.nn.functional.layer_norm(x.float(), (d,), eps=eps)
    if weight is not None:
        xn = xn * weight.float()
    if bias is not None:
        xn = xn + bias.float()
    xn = xn.to(x.dtype) if x.dtype != torch.float64 else xn.double()
    y = xn * (1 + scale.to(x.dtype)) + shift.to(x.dtype)
    return y.to(out_dtype or x.dtype)


def reference_gated(
    residual, h, gate, shift, scale, weight=None, bias=None, eps=EPS, out_dtype=None
):
    r = residual + gate.to(residual.dtype) * h
    return r, reference(r, shift, scale, weight, bias, eps, out_dtype)


def reference_rms(x, shift, scale, weight=None, eps=EPS, out_dtype=None):
    """Plain PyTorch modulated RMSNorm in x's dtype: the mean of squares in fp32 (fp64 for fp64
    x), as diffusers' RMSNorm computes it, times torch.nn.RMSNorm's optional weight."""
    xf = x if x.dtype == torch.float64 else x.float()
    xn = xf * torch.rsqrt(xf.square().mean(-1, keepdim=True) + eps)
    if weight is not None:
        xn = xn * weight.to(xf.dtype)
    y = xn.to(x.dtype) * (1 + scale.to(x.dtype)) + shift.to(x.dtype)
    return y.to(out_dtype or x.dtype)


def reference_gated_rms(residual, h, gate, shift, scale, weight=None, eps=EPS, out_dtype=None):
    r = residual + gate.to(residual.dtype) * h
    return r, reference_rms(r, shift, scale, weight, eps, out_dtype)


def f64(*ts):
    return [None if t is None else t.detach().double().requires_grad_(t.requires_grad) for t in ts]


def assert_close(name, got, ref64, lowp, dtype):
    """|got - ref64| <= max(2 * |lowp - ref64|, floor) elementwise-max sense."""
    assert got.shape == ref64.shape, f"{name}: shape {got.shape} vs {ref64.shape}"
    assert got.dtype == lowp.dtype, f"{name}: dtype {got.dtype} vs {lowp.dtype}"
    err = (got.double() - ref64).abs().max().item() if got.numel() else 0.0
    torch_err = (lowp.double() - ref64).abs().max().item() if got.numel() else 0.0
    scale = max(1.0, ref64.abs().max().item()) if got.numel() else 1.0
    tol = max(2 * torch_err, FLOOR[dtype] * scale)
    assert err <= tol, f"{name}: error {err:.3g} > tol {tol:.3g} (torch error {torch_err:.3g})"


def make_mod(kind, x_shape, dtype, device, gen):
    """Modulation tensor of the given broadcast pattern (fresh random values)."""
    b, d = x_shape[0], x_shape[-1]
    if kind == "shared":
        return 0.5 * torch.randn(d, generator=gen).to(device, dtype)
    if kind == "per_sample":
        return 0.5 * torch.randn(b, 1, d, generator=gen).to(device, dtype)
    if kind == "per_token":
        return 0.5 * torch.randn(*x_shape, generator=gen).to(device, dtype)
    if kind == "chunk":  # Wan: e = (B, 6, D) modulation, chunked along dim 1, read in place
        e = 0.5 * torch.randn(b, 6, d, generator=gen).to(device, dtype)
        return e.chunk(6, dim=1)[2]
    raise ValueError(kind)


def rand(shape, dtype, device, gen, scale=1.0, offset=0.0):
    return (offset + scale * torch.randn(*shape, generator=gen)).to(device, dtype)


def run_and_check(x_shape, dtype, mod_dtype, out_dtype, mod_kind, device, affine=False, seed=0):
    gen = torch.Generator().manual_seed(seed)
    d = x_shape[-1]
    x = rand(x_shape, dtype, device, gen, 2.0, 0.3).requires_grad_()
    shift = make_mod(mod_kind, x_shape, mod_dtype, device, gen).requires_grad_()
    scale = make_mod(mod_kind, x_shape, mod_dtype, device, gen).requires_grad_()
    weight = bias = None
    if affine:
        weight = rand((d,), mod_dtype, device, gen, 0.2, 1.0).requires_grad_()
        bias = rand((d,), mod_dtype, device, gen, 0.2).requires_grad_()
    inputs = [x, shift, scale, weight, bias]
    y = ops.layer_norm_modulate(x, shift, scale, weight=weight, bias=bias, out_dtype=out_dtype)
    dy = rand(x_shape, y.dtype, device, gen)
    got = torch.autograd.grad(y, [t for t in inputs if t is not None], dy)

    lowp_in = [None if t is None else t.detach().clone().requires_grad_() for t in inputs]
    y_lowp = reference(*lowp_in, out_dtype=out_dtype)
    lowp = torch.autograd.grad(y_lowp, [t for t in lowp_in if t is not None], dy)
    ref_in = f64(*inputs)
    y_ref = reference(*ref_in)
    ref = torch.autograd.grad(y_ref, [t for t in ref_in if t is not None], dy.double())

    acc = max([dtype, out_dtype or dtype], key=lambda t: FLOOR[t])
    assert_close("y", y, y_ref, y_lowp, acc)
    names = ["dx", "dshift", "dscale", "dweight", "dbias"]
    for name, g, r, lp in zip(names, got, ref, lowp, strict=False):
        assert_close(name, g, r, lp, acc)
    return y, got


# ---------------------------------------------------------------- accuracy

D_SMALL = [8, 768, 769, 1000]
D_LARGE = [1536, 3072, 5120, 5125, 8192]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("d", D_SMALL + D_LARGE)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_hidden_sizes(device, d, dtype):
    rows = 64 if d <= 1000 else 8
    run_and_check((2, rows // 2, d), dtype, torch.float32, None, "per_sample", device)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("mod_kind", ["shared", "per_sample", "per_token", "chunk"])
@pytest.mark.parametrize(
    "dtype,mod_dtype,out_dtype",
    [
        (torch.bfloat16, torch.float32, None),  # diffusers: bf16 stream, fp32 modulation
        (torch.bfloat16, torch.bfloat16, None),
        (torch.float16, torch.float16, None),
        (torch.float32, torch.float32, torch.bfloat16),  # fp32 stream, bf16 out (Wan)
        (torch.float32, torch.float32, None),
        (torch.bfloat16, torch.float32, torch.float32),
        (torch.float32, torch.float32, torch.float16),  # dy fp16 under fp32 x: widened
        (torch.bfloat16, torch.float32, torch.float16),  # dy of another 16-bit type
        (torch.float16, torch.float32, torch.bfloat16),
    ],
)
def test_dtypes_and_broadcast(device, mod_kind, dtype, mod_dtype, out_dtype):
    run_and_check((3, 17, 256), dtype, mod_dtype, out_dtype, mod_kind, device)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shape", [(1, 1, 768), (1, 1, 769), (5, 768), (2, 3, 4, 512)])
def test_odd_shapes_affine(device, shape):
    run_and_check(shape, torch.bfloat16, torch.float32, None, "shared", device, affine=True)
    run_and_check(shape, torch.float32, torch.float32, None, "shared", device, affine=True)


@pytest.mark.parametrize("device", DEVICES)
def test_mixed_broadcast_patterns(device):
    # shift per token, scale per sample, modulation of shape (1, S, D) shared over the batch.
    gen = torch.Generator().manual_seed(3)
    x = rand((2, 5, 64), torch.float32, device, gen).requires_grad_()
    shift = rand((2, 5, 64), torch.float32, device, gen).requires_grad_()
    scale = rand((1, 5, 64), torch.float32, device, gen).requires_grad_()
    y = ops.layer_norm_modulate(x, shift, scale)
    dy = torch.randn_like(y)
    got = torch.autograd.grad(y, [x, shift, scale], dy)
    ref_in = f64(x, shift, scale)
    ref = torch.autograd.grad(reference(*ref_in), ref_in, dy.double())
    torch.testing.assert_close(y.double(), reference(*ref_in).detach(), atol=1e-5, rtol=1e-5)
    for g, r in zip(got, ref, strict=True):
        torch.testing.assert_close(g.double(), r, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("d", [8, 769, 1536, 5120])
@pytest.mark.parametrize("mod_kind", ["per_sample", "per_token", "chunk"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_gated_residual(device, d, mod_kind, dtype):
    gen = torch.Generator().manual_seed(d)
    shape = (2, 6, d)
    residual = rand(shape, dtype, device, gen, 2.0, 0.1).requires_grad_()
    h = rand(shape, dtype, device, gen).requires_grad_()
    mods = [
        make_mod(mod_kind, shape, torch.float32, device, gen).requires_grad_() for _ in range(3)
    ]
    gate, shift, scale = mods
    inputs = [residual, h, gate, shift, scale]
    r, y = ops.gated_residual_layer_norm_modulate(*inputs)
    dr, dy = rand(shape, dtype, device, gen), rand(shape, dtype, device, gen)
    got = torch.autograd.grad([r, y], inputs, [dr, dy])

    lowp_in = [t.detach().clone().requires_grad_() for t in inputs]
    r_lp, y_lp = reference_gated(*lowp_in)
    lowp = torch.autograd.grad([r_lp, y_lp], lowp_in, [dr, dy])
    ref_in = f64(*inputs)
    r_ref, y_ref = reference_gated(*ref_in)
    ref = torch.autograd.grad([r_ref, y_ref], ref_in, [dr.double(), dy.double()])

    assert_close("r", r, r_ref, r_lp, dtype)
    assert_close("y", y, y_ref, y_lp, dtype)
    names = ["dresidual", "dh", "dgate", "dshift", "dscale"]
    for name, g, rf, lp in zip(names, got, ref, lowp, strict=True):
        assert_close(name, g, rf, lp, dtype)

    # Only y used: the dr path is zeros.
    got_y = torch.autograd.grad(ops.gated_residual_layer_norm_modulate(*inputs)[1], inputs, dy)
    ref_y = torch.autograd.grad(reference_gated(*ref_in)[1], ref_in, dy.double())
    lowp_y = torch.autograd.grad(reference_gated(*lowp_in)[1], lowp_in, dy)
    for name, g, rf, lp in zip(names, got_y, ref_y, lowp_y, strict=True):
        assert_close(name + "(dy only)", g, rf, lp, dtype)


@pytest.mark.parametrize("device", DEVICES)
def test_gated_residual_affine(device):
    gen = torch.Generator().manual_seed(11)
    shape = (2, 7, 96)
    t = [rand(shape, torch.float32, device, gen).requires_grad_() for _ in range(2)]
    m = [rand((2, 1, 96), torch.float32, device, gen).requires_grad_() for _ in range(3)]
    w = rand((96,), torch.float32, device, gen, 0.1, 1.0).requires_grad_()
    b = rand((96,), torch.float32, device, gen, 0.1).requires_grad_()
    r, y = ops.gated_residual_layer_norm_modulate(*t, *m, weight=w, bias=b)
    dr, dy = torch.randn_like(r), torch.randn_like(y)
    got = torch.autograd.grad([r, y], [*t, *m, w, b], [dr, dy])
    ref_in = f64(*t, *m, w, b)
    r_ref, y_ref = reference_gated(*ref_in[:5], weight=ref_in[5], bias=ref_in[6])
    ref = torch.autograd.grad([r_ref, y_ref], ref_in, [dr.double(), dy.double()])
    for g, rf in zip(got, ref, strict=True):
        torch.testing.assert_close(g.double(), rf, atol=2e-4, rtol=2e-4)


def test_gradcheck_float64():
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(2, 3, 7, generator=gen, dtype=torch.float64, requires_grad=True)
    shift = torch.randn(2, 1, 7, generator=gen, dtype=torch.float64, requires_grad=True)
    scale = torch.randn(2, 3, 7, generator=gen, dtype=torch.float64, requires_grad=True)
    w = torch.randn(7, generator=gen, dtype=torch.float64, requires_grad=True)
    b = torch.randn(7, generator=gen, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(
        lambda *a: ops.layer_norm_modulate(a[0], a[1], a[2], weight=a[3], bias=a[4]),
        (x, shift, scale, w, b),
    )
    res = torch.randn(2, 3, 7, generator=gen, dtype=torch.float64, requires_grad=True)
    gate = torch.randn(7, generator=gen, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(
        lambda *a: ops.gated_residual_layer_norm_modulate(*a[:5], weight=a[5], bias=a[6]),
        (res, x, gate, shift, scale, w, b),
    )


@pytest.mark.parametrize("pattern", ["per_sample", "shared", "per_token", "chunk"])
@pytest.mark.parametrize("affine", [False, True])
def test_gradgradcheck_float64(pattern, affine):
    # Double backward (gradient penalties, Hessian-vector products): second-order gradients
    # through both ops must be right, never zeros.
    gen = torch.Generator().manual_seed(2)
    shape = (2, 3, 7)
    x = torch.randn(*shape, generator=gen, dtype=torch.float64).requires_grad_()
    shift = make_mod(pattern, shape, torch.float64, "cpu", gen).detach().requires_grad_()
    scale = make_mod(pattern, shape, torch.float64, "cpu", gen).detach().requires_grad_()
    gate = make_mod(pattern, shape, torch.float64, "cpu", gen).detach().requires_grad_()
    res = torch.randn(*shape, generator=gen, dtype=torch.float64).requires_grad_()
    w = b = None
    if affine:
        w = torch.randn(7, generator=gen, dtype=torch.float64).requires_grad_()
        b = torch.randn(7, generator=gen, dtype=torch.float64).requires_grad_()
    extra = [t for t in (w, b) if t is not None]

    def lnm(x, shift, scale, *wb):
        return ops.layer_norm_modulate(
            x, shift, scale, **dict(zip(("weight", "bias"), wb, strict=False))
        )

    def gated(res, h, gate, shift, scale, *wb):
        kw = dict(zip(("weight", "bias"), wb, strict=False))
        return ops.gated_residual_layer_norm_modulate(res, h, gate, shift, scale, **kw)

    assert torch.autograd.gradgradcheck(lnm, (x, shift, scale, *extra))
    assert torch.autograd.gradgradcheck(gated, (res, x, gate, shift, scale, *extra))


def test_double_backward_matches_eager_and_is_not_zero():
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(2, 5, 16, generator=gen).requires_grad_()
    shift = torch.randn(2, 1, 16, generator=gen).requires_grad_()
    scale = torch.randn(2, 1, 16, generator=gen).requires_grad_()

    def penalty(fn):
        y = fn(x, shift, scale)
        (gx,) = torch.autograd.grad(y.square().sum(), x, create_graph=True)
        return torch.autograd.grad(gx.square().sum(), [x, shift, scale])

    ours = penalty(lambda *a: ops.layer_norm_modulate(*a))
    eager = penalty(lambda *a: reference(*a))
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
            torch.ops.adaptiveload.layer_norm_modulate.default(
                x, shift, scale, None, None, EPS, None
            )
        )
    for a, b in zip(*outs, strict=True):
        assert torch.equal(a, b)
        assert not a.isnan().any()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("mod_kind", ["shared", "per_sample", "chunk", "per_token"])
def test_backward_deterministic(device, mod_kind):
    gen = torch.Generator().manual_seed(9)
    shape = (2, 300, 1536) if device == "cuda" else (2, 40, 384)
    x = rand(shape, torch.bfloat16, device, gen).requires_grad_()
    shift, scale = (
        make_mod(mod_kind, shape, torch.float32, device, gen).requires_grad_() for _ in range(2)
    )
    dy = rand(shape, torch.bfloat16, device, gen)

    def grads():
        return torch.autograd.grad(ops.layer_norm_modulate(x, shift, scale), [x, shift, scale], dy)

    first, second = grads(), grads()
    for a, b in zip(first, second, strict=True):
        assert torch.equal(a, b)


@pytest.mark.parametrize("device", DEVICES)
def test_empty(device):
    for shape in [(0, 64), (2, 0, 64)]:
        x = torch.randn(shape, device=device).requires_grad_()
        shift = torch.randn(64, device=device).requires_grad_()
        scale = torch.randn(64, device=device).requires_grad_()
        y = ops.layer_norm_modulate(x, shift, scale, out_dtype=torch.bfloat16)
        assert y.shape == shape and y.dtype == torch.bfloat16
        dx, dshift, dscale = torch.autograd.grad(y.float().sum(), [x, shift, scale])
        assert dx.shape == shape
        assert torch.equal(dshift, torch.zeros_like(shift))
        assert torch.equal(dscale, torch.zeros_like(scale))
        r, y = ops.gated_residual_layer_norm_modulate(x, x, shift, shift, scale)
        assert r.shape == shape and y.shape == shape


@pytest.mark.parametrize("device", DEVICES)
def test_nan_propagates(device):
    x = torch.randn(4, 1024, device=device, dtype=torch.bfloat16)
    x[1, 7] = float("nan")
    shift = torch.zeros(1024, device=device)
    scale = torch.zeros(1024, device=device)
    y = ops.layer_norm_modulate(x, shift, scale)
    assert y[1].isnan().all()
    assert not y[[0, 2, 3]].isnan().any()


@pytest.mark.parametrize("device", DEVICES)
def test_errors(device):
    x = torch.randn(2, 3, 64, device=device)
    m = torch.randn(64, device=device)
    f = ops.layer_norm_modulate
    with pytest.raises(RuntimeError, match="shift must have last dim D=64"):
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
        ops.gated_residual_layer_norm_modulate(x, x[:1], m, m, m)
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
    torch.library.opcheck(
        torch.ops.adaptiveload.layer_norm_modulate.default,
        (x, shift, scale, w, None, EPS, torch.bfloat16),
    )
    torch.library.opcheck(
        torch.ops.adaptiveload.layer_norm_modulate.default, (x, shift, scale, None, None, EPS, None)
    )
    h = torch.randn(2, 5, 48, generator=gen, requires_grad=True)
    torch.library.opcheck(
        torch.ops.adaptiveload.gated_residual_layer_norm_modulate.default,
        (x, h, shift, shift, scale, None, None, EPS, None),
    )


def test_forward_ad_is_refused():
    # No forward-mode formula: a dual input must raise, never give a zero or missing tangent.
    import torch.autograd.forward_ad as fwad

    gen = torch.Generator().manual_seed(12)
    x, h = (rand((2, 3, 16), torch.float32, "cpu", gen) for _ in range(2))
    m = make_mod("per_sample", x.shape, torch.float32, "cpu", gen)
    with fwad.dual_level():
        xd = fwad.make_dual(x, torch.randn_like(x))
        with pytest.raises(RuntimeError, match="layer_norm_modulate: forward-mode AD"):
            ops.layer_norm_modulate(xd, m, m)
        md = fwad.make_dual(m, torch.randn_like(m))
        with pytest.raises(RuntimeError, match="gated_residual_layer_norm_modulate: forward-mode"):
            ops.gated_residual_layer_norm_modulate(x, h, md, m, m)


def test_saved_memory_is_x_plus_stats():
    x = torch.randn(4, 8, 64, requires_grad=True)
    shift = torch.randn(4, 1, 64, requires_grad=True)
    saved = []

    def pack(t):
        saved.append(t)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        ops.layer_norm_modulate(x, shift, shift)
    new = [t for t in saved if t.data_ptr() not in (x.data_ptr(), shift.data_ptr())]
    assert sum(t.numel() * t.element_size() for t in new) == 8 * 4 * 8


COMPILE_CASES = [
    ("cpu", "aot_eager"),  # tracing, fake kernels and autograd registration, in seconds
    pytest.param("cpu", "inductor", marks=pytest.mark.slow),  # ~40 s of C++ codegen on 2 cores
    pytest.param("cuda", "inductor", marks=cuda_only),
]


@pytest.mark.parametrize("device,backend", COMPILE_CASES)
def test_torch_compile_fullgraph(device, backend):
    torch._dynamo.reset()
    gen = torch.Generator().manual_seed(4)
    x = rand((2, 6, 32), torch.float32, device, gen).requires_grad_()
    shift = rand((2, 1, 32), torch.float32, device, gen).requires_grad_()
    scale = rand((1, 1, 32), torch.float32, device, gen).requires_grad_()  # batch-shared

    def f(x, shift, scale):
        r, y = ops.gated_residual_layer_norm_modulate(x, x * 2, scale, shift, scale)
        return ops.layer_norm_modulate(y, shift, scale).sum() + r.sum()

    compiled = torch.compile(f, fullgraph=True, backend=backend)
    got = torch.autograd.grad(compiled(x, shift, scale), [x, shift, scale])
    ref = torch.autograd.grad(f(x, shift, scale), [x, shift, scale])
    for g, r in zip(got, ref, strict=True):
        torch.testing.assert_close(g, r)


def test_direct_path_is_the_op_and_yields_to_modes_and_subclasses():
    # The public functions call _C's direct callers outside torch.compile; they must give what
    # torch.ops gives, and step aside for __torch_function__ modes and tensor subclasses.
    gen = torch.Generator().manual_seed(9)
    x = rand((2, 5, 32), torch.float32, "cpu", gen).requires_grad_()
    shift, scale = (make_mod("per_sample", x.shape, torch.float32, "cpu", gen) for _ in range(2))
    y = ops.layer_norm_modulate(x, shift, scale)
    y_op = torch.ops.adaptiveload.layer_norm_modulate.default(
        x, shift, scale, None, None, EPS, None
    )[0]
    assert torch.equal(y, y_op) and y.grad_fn is not None
    (g,) = torch.autograd.grad(y.sum(), x)
    (g_op,) = torch.autograd.grad(y_op.sum(), x)
    assert torch.equal(g, g_op)

    seen = []

    class Spy(torch.overrides.TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            seen.append(str(func))
            return func(*args, **(kwargs or {}))

    with Spy():
        ops.layer_norm_modulate(x, shift, scale)
        ops.gated_residual_layer_norm_modulate(x, x, shift, shift, scale)
    assert any("layer_norm_modulate" in f for f in seen)
    assert any("gated_residual" in f for f in seen)

    class Sub(torch.Tensor):
        pass

    ys = ops.layer_norm_modulate(x.detach().as_subclass(Sub), shift, scale)
    torch.testing.assert_close(ys.as_subclass(torch.Tensor), y.detach())


def test_modules():
    m = LayerNormModulate(32, elementwise_affine=True, out_dtype=torch.bfloat16)
    x = torch.randn(2, 3, 32)
    shift, scale = torch.randn(2, 1, 32), torch.randn(2, 1, 32)
    y = m(x, shift, scale)
    assert y.dtype == torch.bfloat16
    torch.testing.assert_close(y.float(), reference(x, shift, scale).float(), atol=2e-2, rtol=2e-2)
    r, y2 = GatedResidualLayerNormModulate(32)(x, x, shift, shift, scale)
    torch.testing.assert_close(r, x + shift * x)
