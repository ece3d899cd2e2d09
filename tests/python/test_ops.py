"""Accuracy of adaptiveload.ops, both norms (layer_norm_modulate and
gated_residual_layer_norm_modulate; rms_norm_modulate and gated_residual_rms_norm_modulate):
every output and every gradient against the float64 reference by the accuracy rule of
op_refs.py, over hidden sizes, dtypes, modulation layouts (LTX-Video's views for the RMSNorm
ops), affine parameters, subsets of gradients, and second-order gradients. The properties
beside accuracy: test_ops_properties.py; the tuning tables: test_ops_tables.py."""

from __future__ import annotations

from itertools import product

import pytest
import torch

from adaptiveload import ops
from op_refs import (
    DEVICES,
    MOD_KINDS,
    NORMS,
    assert_close,
    f64,
    mod,
    per_norm,
    rand,
    run_and_check,
)

NORM_NAMES = list(NORMS)
BF16, F16, F32 = torch.bfloat16, torch.float16, torch.float32

D_SMALL = [8, 768, 769, 1000]
# LTX-Video: 2048 (2B), 4096 (13B, LTX-2); Wan: 1536 (1.3B), 5120 (14B).
HIDDEN_SIZES = per_norm(
    layer=D_SMALL + [1536, 3072, 5120, 5125, 8192],
    rms=D_SMALL + [1536, 2048, 3072, 4096, 5125, 8192],
)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("norm,d", HIDDEN_SIZES)
@pytest.mark.parametrize("dtype", [BF16, F32])
def test_hidden_sizes(device, norm, d, dtype):
    rows = 64 if d <= 1000 else 8
    run_and_check(norm, (2, rows // 2, d), dtype, F32, None, "per_sample", device)
    if norm == "rms":  # LTX-Video's per-token modulation in the stream's dtype
        run_and_check(norm, (2, rows // 2, d), dtype, dtype, None, "ltx_token", device, seed=1)


# (x dtype, modulation dtype, out dtype)
DTYPES = [
    (BF16, F32, None),  # diffusers: bf16 stream, fp32 modulation
    (BF16, BF16, None),  # LTX-Video in bf16
    (F16, F16, None),
    (F32, F32, BF16),  # fp32 stream (Wan, autocast), bf16 out
    (F32, F32, None),
    (BF16, F32, F32),
    (F32, F32, F16),  # dy fp16 under fp32 x: widened
    (F16, F32, BF16),  # dy of another 16-bit type
]
DTYPE_CASES = per_norm(
    layer=[(k, *c) for k, c in product(MOD_KINDS[:4], [*DTYPES, (BF16, F32, F16)])],
    rms=[(k, *c) for k, c in product(MOD_KINDS, DTYPES)],
)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("norm,mod_kind,dtype,mod_dtype,out_dtype", DTYPE_CASES)
def test_dtypes_and_broadcast(device, norm, mod_kind, dtype, mod_dtype, out_dtype):
    run_and_check(norm, (3, 17, 256), dtype, mod_dtype, out_dtype, mod_kind, device)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("norm", NORM_NAMES)
@pytest.mark.parametrize("shape", [(1, 1, 768), (1, 1, 769), (5, 768), (2, 3, 4, 512)])
def test_odd_shapes_affine(device, norm, shape):
    run_and_check(norm, shape, BF16, F32, None, "shared", device, affine=True)
    if norm == "layer":
        run_and_check(norm, shape, F32, F32, None, "shared", device, affine=True)
        return
    run_and_check(norm, shape, F32, F32, None, "per_token", device, affine=True)
    per_sample = "per_sample" if len(shape) == 3 else "ltx_token"
    run_and_check(norm, shape, BF16, BF16, None, per_sample, device, affine=True)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("norm", NORM_NAMES)
def test_mixed_broadcast_patterns(device, norm):
    # shift per token, scale per sample, modulation of shape (1, S, D) shared over the batch.
    n = NORMS[norm]
    gen = torch.Generator().manual_seed(3)
    x = rand((2, 5, 64), F32, device, gen).requires_grad_()
    shift = rand((2, 5, 64), F32, device, gen).requires_grad_()
    scale = rand((1, 5, 64), F32, device, gen).requires_grad_()
    y = n.op(x, shift, scale)
    dy = torch.randn_like(y)
    got = torch.autograd.grad(y, [x, shift, scale], dy)
    ref_in = f64(x, shift, scale)
    y_ref = n.ref(*ref_in)
    ref = torch.autograd.grad(y_ref, ref_in, dy.double())
    torch.testing.assert_close(y.double(), y_ref.detach(), atol=1e-5, rtol=1e-5)
    for g, r in zip(got, ref, strict=True):
        torch.testing.assert_close(g.double(), r, atol=1e-4, rtol=1e-4)


GATED_CASES = per_norm(
    layer=list(product([8, 769, 1536, 5120], ["per_sample", "per_token", "chunk"])),
    rms=list(product([8, 769, 2048, 5120], ["per_sample", "per_token", "ltx_token"])),
)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("norm,d,mod_kind", GATED_CASES)
@pytest.mark.parametrize("dtype", [BF16, F32])
def test_gated_residual(device, norm, d, mod_kind, dtype):
    n = NORMS[norm]
    gen = torch.Generator().manual_seed(d)
    shape = (2, 6, d)
    residual = rand(shape, dtype, device, gen, 2.0, 0.1).requires_grad_()
    h = rand(shape, dtype, device, gen).requires_grad_()
    # gate from one ada_values, shift and scale from the next block's (as LTX-Video chains them)
    gate, shift, scale = (
        mod(mod_kind, shape, F32, device, gen, k).requires_grad_() for k in (5, 0, 1)
    )
    inputs = [residual, h, gate, shift, scale]
    r, y = n.gated(*inputs)
    dr, dy = rand(shape, dtype, device, gen), rand(shape, dtype, device, gen)
    got = torch.autograd.grad([r, y], inputs, [dr, dy])
    (r_ref, y_ref, ref), (r_lp, y_lp, lowp), (ref_in, lowp_in) = gated_references(n, inputs, dr, dy)

    assert_close("r", r, r_ref, r_lp, dtype)
    assert_close("y", y, y_ref, y_lp, dtype)
    names = ["dresidual", "dh", "dgate", "dshift", "dscale"]
    for name, g, rf, lp in zip(names, got, ref, lowp, strict=True):
        assert_close(name, g, rf, lp, dtype)

    # Only y used: the dr path is zeros.
    got_y = torch.autograd.grad(n.gated(*inputs)[1], inputs, dy)
    ref_y = torch.autograd.grad(n.ref_gated(*ref_in)[1], ref_in, dy.double())
    lowp_y = torch.autograd.grad(n.ref_gated(*lowp_in)[1], lowp_in, dy)
    for name, g, rf, lp in zip(names, got_y, ref_y, lowp_y, strict=True):
        assert_close(name + "(dy only)", g, rf, lp, dtype)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("norm,dtype", per_norm(layer=[F32], rms=[BF16, F32]))
def test_gated_residual_affine(device, norm, dtype):
    n = NORMS[norm]
    gen = torch.Generator().manual_seed(11)
    shape = (2, 7, 96)
    t = [rand(shape, dtype, device, gen).requires_grad_() for _ in range(2)]
    m = [rand((2, 1, 96), F32, device, gen).requires_grad_() for _ in range(3)]
    params = [p.requires_grad_() for p in n.affine_params(96, F32, device, gen, 0.1)]
    inputs = [*t, *m, *params]
    r, y = n.gated(*t, *m, **dict(zip(n.affine, params, strict=True)))
    dr, dy = torch.randn_like(r), torch.randn_like(y)
    got = torch.autograd.grad([r, y], inputs, [dr, dy])
    (r_ref, y_ref, ref), (r_lp, y_lp, lowp), _ = gated_references(n, inputs, dr, dy)
    assert_close("r", r, r_ref, r_lp, dtype)
    assert_close("y", y, y_ref, y_lp, dtype)
    names = ["dresidual", "dh", "dgate", "dshift", "dscale", "dweight", "dbias"]
    for name, g, rf, lp in zip(names, got, ref, lowp, strict=False):
        assert_close(name, g, rf, lp, dtype)
        if dtype == F32:  # and within a fixed tolerance of the float64 reference
            torch.testing.assert_close(g.double(), rf, atol=2e-4, rtol=2e-4)


@pytest.mark.parametrize("device", DEVICES)
def test_matches_torch_and_diffusers_rms_norm(device):
    # The op's norm is torch.nn.RMSNorm's (with elementwise_affine) and diffusers' RMSNorm
    # as LTX-Video's blocks use it (no affine, eps 1e-6), then the modulation.
    gen = torch.Generator().manual_seed(13)
    x = rand((2, 9, 320), F32, device, gen, 2.0, 0.3)
    shift, scale = (mod("ltx_token", x.shape, F32, device, gen, k) for k in (0, 1))
    w = rand((320,), F32, device, gen, 0.2, 1.0)
    norm = torch.nn.functional.rms_norm(x, (320,), w, eps=1e-5)
    y = ops.rms_norm_modulate(x, shift, scale, weight=w, eps=1e-5)
    torch.testing.assert_close(y, norm * (1 + scale) + shift, atol=1e-5, rtol=1e-5)
    normalization = pytest.importorskip("diffusers.models.normalization")
    ltx_norm = normalization.RMSNorm(320, eps=1e-6, elementwise_affine=False).to(device)
    xb = x.bfloat16()
    want = ltx_norm(xb).float() * (1 + scale) + shift
    got = ops.rms_norm_modulate(xb, shift, scale, out_dtype=F32)
    # diffusers rounds the normalized x to bf16 before modulating; the op does not.
    torch.testing.assert_close(got, want, atol=2e-2, rtol=1e-2)


# Which gradients are asked for changes how the backward groups rows (dshift and dscale may
# each be summed per sample, over everything, or not at all) and, on CUDA, which kernel runs
# (the lean one for the plain op without affine and per-sample or shared scale).
SUBSET_CASES = per_norm(
    layer=list(
        product(
            [("per_sample", "per_sample"), ("shared", "per_sample"), ("per_sample", "shared")],
            ["x", "shift", "scale", "x,scale", "shift,scale"],
        )
    ),
    rms=list(
        product(
            [("per_sample", "per_sample"), ("shared", "per_sample"), ("ltx_sample", "ltx_sample")],
            ["x", "shift", "scale", "x,scale", "x,shift,scale"],
        )
    ),
)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("norm,kinds,wanted", SUBSET_CASES)
def test_backward_subsets_of_gradients(device, norm, kinds, wanted):
    n = NORMS[norm]
    shift_kind, scale_kind = kinds
    gen = torch.Generator().manual_seed(len(wanted) + 7 * len(shift_kind))
    shape = (3, 41, n.width)
    x = rand(shape, BF16, device, gen, 2.0, 0.3)
    shift = mod(shift_kind, shape, F32, device, gen, 0)
    scale = mod(scale_kind, shape, F32, device, gen, 1)
    names = wanted.split(",")
    inputs = {"x": x, "shift": shift, "scale": scale}
    for name in names:
        inputs[name].requires_grad_()
    y = n.op(inputs["x"], inputs["shift"], inputs["scale"])
    dy = rand(shape, BF16, device, gen)
    got = [torch.autograd.grad(y, [inputs[k] for k in names], dy)]
    if device == "cuda":
        # The table takes the lean kernel here; the general kernel must agree.
        assert ops._last_configs()[1].startswith(f"bwd.bf16{n.tag}.dy16.lean")
        stats = n.default(*n.schema_args(x, shift, scale))[1:]
        order = ("x", "h", "gate", "shift", "scale", *n.affine)  # the backward's outputs
        mask = [k in names for k in order]
        g = n.backward_with_config(
            None, dy, x, None, None, shift, scale, *[None] * len(n.affine), *stats, mask,
            f"bwd.bf16{n.tag}.dy16.plain.vec2",
        )  # fmt: skip
        got.append([g[order.index(k)] for k in names])
    ref, lowp = reference_grads(n, inputs, names, dy)
    for grads in got:
        for name, g, r, lp in zip(names, grads, ref, lowp, strict=True):
            assert_close("d" + name, g, r, lp, BF16)


# A per-token shift of dy's dtype has dy itself as its gradient: the backward neither computes
# nor writes it (autograd passes dy on), whichever other gradients are asked for.
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("norm", NORM_NAMES)
@pytest.mark.parametrize("wanted", ["shift", "x,shift", "shift,scale", "x,shift,scale"])
def test_per_token_shift_gradient_is_dy(device, norm, wanted):
    n = NORMS[norm]
    gen = torch.Generator().manual_seed(len(wanted) + 11 * len(norm))
    shape = (2, 37, 2048)
    x = rand(shape, BF16, device, gen, 2.0, 0.3)
    shift = mod("ltx_token", shape, BF16, device, gen, 0)
    scale = mod("ltx_token", shape, BF16, device, gen, 1)
    names = wanted.split(",")
    inputs = {"x": x, "shift": shift, "scale": scale}
    for name in names:
        inputs[name].requires_grad_()
    y = n.op(inputs["x"], inputs["shift"], inputs["scale"])
    dy = rand(shape, BF16, device, gen)
    got = torch.autograd.grad(y, [inputs[k] for k in names], dy)
    assert torch.equal(got[names.index("shift")], dy)
    if device == "cuda" and names != ["shift"]:
        assert ops._last_configs()[1] == f"bwd.bf16{n.tag}.dy16.token2"
    ref, lowp = reference_grads(n, inputs, names, dy)
    for name, g, r, lp in zip(names, got, ref, lowp, strict=True):
        assert_close("d" + name, g, r, lp, BF16)


# ---------------------------------------------------------------- float64 and second order


@pytest.mark.parametrize("norm", NORM_NAMES)
def test_gradcheck_float64(norm):
    n = NORMS[norm]
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(2, 3, 7, generator=gen, dtype=torch.float64, requires_grad=True)
    shift = torch.randn(2, 1, 7, generator=gen, dtype=torch.float64, requires_grad=True)
    scale = torch.randn(2, 3, 7, generator=gen, dtype=torch.float64, requires_grad=True)
    params = [torch.randn(7, generator=gen, dtype=torch.float64, requires_grad=True)
              for _ in n.affine]  # fmt: skip
    assert torch.autograd.gradcheck(
        lambda *a: n.op(*a[:3], **dict(zip(n.affine, a[3:], strict=True))),
        (x, shift, scale, *params),
    )
    res = torch.randn(2, 3, 7, generator=gen, dtype=torch.float64, requires_grad=True)
    gate = torch.randn(7, generator=gen, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(
        lambda *a: n.gated(*a[:5], **dict(zip(n.affine, a[5:], strict=True))),
        (res, x, gate, shift, scale, *params),
    )


@pytest.mark.parametrize(
    "norm,pattern",
    per_norm(
        layer=["per_sample", "shared", "per_token", "chunk"],
        rms=["per_sample", "shared", "per_token", "ltx_token"],
    ),
)
@pytest.mark.parametrize("affine", [False, True])
def test_gradgradcheck_float64(norm, pattern, affine):
    # Double backward (gradient penalties, Hessian-vector products): second-order gradients
    # through both ops must be right, never zeros.
    n = NORMS[norm]
    gen = torch.Generator().manual_seed(2)
    shape = (2, 3, 7)
    x = torch.randn(*shape, generator=gen, dtype=torch.float64).requires_grad_()
    shift, scale, gate = (
        mod(pattern, shape, torch.float64, "cpu", gen, k).detach().requires_grad_()
        for k in range(3)
    )
    res = torch.randn(*shape, generator=gen, dtype=torch.float64).requires_grad_()
    extra = []
    if affine:
        extra = [torch.randn(7, generator=gen, dtype=torch.float64).requires_grad_()
                 for _ in n.affine]  # fmt: skip

    def plain(x, shift, scale, *params):
        return n.op(x, shift, scale, **dict(zip(n.affine, params, strict=False)))

    def gated(res, h, gate, shift, scale, *params):
        kw = dict(zip(n.affine, params, strict=False))
        return n.gated(res, h, gate, shift, scale, **kw)

    assert torch.autograd.gradgradcheck(plain, (x, shift, scale, *extra))
    assert torch.autograd.gradgradcheck(gated, (res, x, gate, shift, scale, *extra))


@pytest.mark.parametrize("norm", NORM_NAMES)
@pytest.mark.parametrize("weighted", [False, True])
def test_double_backward_matches_eager_and_is_not_zero(norm, weighted):
    n = NORMS[norm]
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(2, 5, 16, generator=gen).requires_grad_()
    shift = torch.randn(2, 1, 16, generator=gen).requires_grad_()
    scale = torch.randn(2, 1, 16, generator=gen).requires_grad_()
    leaves = [x, shift, scale]
    if weighted:
        leaves.append((1 + 0.1 * torch.randn(16, generator=gen)).requires_grad_())

    def penalty(fn):
        y = fn(*leaves)
        (gx,) = torch.autograd.grad(y.square().sum(), x, create_graph=True)
        return torch.autograd.grad(gx.square().sum(), leaves)

    ours = penalty(lambda x, sh, sc, *w: n.op(x, sh, sc, weight=w[0] if w else None))
    eager = penalty(n.ref)
    for g, r in zip(ours, eager, strict=True):
        assert r.abs().max() > 0
        torch.testing.assert_close(g, r, atol=1e-4, rtol=1e-4)


def gated_references(n, inputs, dr, dy):
    """The plain-PyTorch gated reference of norm ``n`` on ``inputs`` (residual, h, gate, shift,
    scale, then any affine parameters) with output gradients ``dr``, ``dy``: ``(r, y, grads)``
    in float64 and in the inputs' own precision (the accuracy rule's yardstick), and the two
    copies of the inputs they ran on."""
    lowp_in = [v.detach().clone().requires_grad_() for v in inputs]
    r_lp, y_lp = n.ref_gated(*lowp_in)
    lowp = torch.autograd.grad([r_lp, y_lp], lowp_in, [dr, dy])
    ref_in = f64(*inputs)
    r_ref, y_ref = n.ref_gated(*ref_in)
    ref = torch.autograd.grad([r_ref, y_ref], ref_in, [dr.double(), dy.double()])
    return (r_ref, y_ref, ref), (r_lp, y_lp, lowp), (ref_in, lowp_in)


def reference_grads(n, inputs, names, dy):
    """The gradients of ``names`` by the plain-PyTorch reference of norm ``n`` (x, shift,
    scale): in float64, and in the inputs' own precision (the accuracy rule's yardstick)."""
    lowp_in = {k: v.detach().clone().requires_grad_(v.requires_grad) for k, v in inputs.items()}
    lowp = torch.autograd.grad(
        n.ref(lowp_in["x"], lowp_in["shift"], lowp_in["scale"]), [lowp_in[k] for k in names], dy
    )
    ref_in = dict(zip(inputs, f64(*inputs.values()), strict=True))
    ref = torch.autograd.grad(
        n.ref(ref_in["x"], ref_in["shift"], ref_in["scale"]),
        [ref_in[k] for k in names],
        dy.double(),
    )
    return ref, lowp
