"""Properties of adaptiveload.ops beside accuracy, both norms: every output written,
deterministic backward, empty inputs, NaN and zero rows, input checks, torch.library's opcheck,
forward-mode AD refused, the memory saved for backward, torch.compile, the direct path, and the
nn modules."""

from __future__ import annotations

import pytest
import torch

from op_refs import CUDA, DEVICES, NORMS, make_mod, mod, rand

NORM_NAMES = list(NORMS)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("norm", NORM_NAMES)
def test_every_output_written(device, norm):
    # Two calls with differently poisoned caching allocator blocks must agree bitwise.
    n = NORMS[norm]
    gen = torch.Generator().manual_seed(5)
    x = rand((3, 11, 769), torch.bfloat16, device, gen)
    shift, scale = (make_mod("per_sample", x.shape, torch.float32, device, gen) for _ in range(2))
    outs = []
    for poison in (float("nan"), 12345.0):
        torch.empty(3 * 11 * 769 * 4, device=device).fill_(poison)
        outs.append(n.default(*n.schema_args(x, shift, scale)))
    for a, b in zip(*outs, strict=True):
        assert torch.equal(a, b)
        assert not a.isnan().any()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(
    "norm,mod_kind",
    [(norm, kind) for norm in NORM_NAMES for kind in ("shared", "per_sample", "chunk")]
    + [("layer", "per_token"), ("rms", "ltx_token")],
)
def test_backward_deterministic(device, norm, mod_kind):
    n = NORMS[norm]
    gen = torch.Generator().manual_seed(9)
    shape = (2, 300, n.width) if device == "cuda" else (2, 40, 384)
    x = rand(shape, torch.bfloat16, device, gen).requires_grad_()
    res = rand(shape, torch.bfloat16, device, gen).requires_grad_()
    shift, scale, gate = (
        mod(mod_kind, shape, torch.float32, device, gen, k).detach().requires_grad_()
        for k in range(3)
    )
    dy = rand(shape, torch.bfloat16, device, gen)

    def grads():
        plain = torch.autograd.grad(n.op(x, shift, scale), [x, shift, scale], dy)
        r, y = n.gated(res, x, gate, shift, scale)
        return plain + torch.autograd.grad([r, y], [res, x, gate, shift, scale], [dy, dy])

    first, second = grads(), grads()
    for a, b in zip(first, second, strict=True):
        assert torch.equal(a, b)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("norm", NORM_NAMES)
def test_empty(device, norm):
    n = NORMS[norm]
    for shape in [(0, 64), (2, 0, 64)]:
        x = torch.randn(shape, device=device).requires_grad_()
        shift = torch.randn(64, device=device).requires_grad_()
        scale = torch.randn(64, device=device).requires_grad_()
        y = n.op(x, shift, scale, out_dtype=torch.bfloat16)
        assert y.shape == shape and y.dtype == torch.bfloat16
        dx, dshift, dscale = torch.autograd.grad(y.float().sum(), [x, shift, scale])
        assert dx.shape == shape
        assert torch.equal(dshift, torch.zeros_like(shift))
        assert torch.equal(dscale, torch.zeros_like(scale))
        r, y = n.gated(x, x, shift, shift, scale)
        assert r.shape == shape and y.shape == shape


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("norm", NORM_NAMES)
def test_nan_propagates(device, norm):
    x = torch.randn(4, 1024, device=device, dtype=torch.bfloat16)
    x[1, 7] = float("nan")
    shift = torch.zeros(1024, device=device)
    scale = torch.zeros(1024, device=device)
    y = NORMS[norm].op(x, shift, scale)
    assert y[1].isnan().all()
    assert not y[[0, 2, 3]].isnan().any()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("norm", NORM_NAMES)
def test_zero_rows_stay_finite(device, norm):
    # A row of zeros: rstd = 1 / sqrt(eps), y = shift (the normalized row is zero: nothing to
    # blow up).
    x = torch.zeros(3, 256, device=device, dtype=torch.bfloat16, requires_grad=True)
    shift = torch.randn(256, device=device)
    scale = torch.randn(256, device=device)
    y = NORMS[norm].op(x, shift, scale, out_dtype=torch.float32)
    torch.testing.assert_close(y, shift.expand(3, 256))
    (dx,) = torch.autograd.grad(y.sum(), x)
    assert dx.isfinite().all()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("norm", NORM_NAMES)
def test_errors(device, norm):
    n = NORMS[norm]
    x = torch.randn(2, 3, 64, device=device)
    m = torch.randn(64, device=device)
    f = n.op
    with pytest.raises(RuntimeError, match=f"{norm}_norm_modulate: shift must have last dim D=64"):
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
        n.gated(x, x[:1], m, m, m)
    with pytest.raises(RuntimeError, match="gate must have last dim D=64"):
        n.gated(x, x, m[:8], m, m)
    if CUDA:
        other = "cpu" if device == "cuda" else "cuda"
        with pytest.raises(RuntimeError, match="shift is on"):
            f(x, m.to(other), m)


@pytest.mark.parametrize("norm", NORM_NAMES)
def test_backward_fakes_match_the_kernels(norm):
    # The fake (meta) backward gives what the kernels give for every output, masked-off ones
    # included: a (0,) placeholder of its input's dtype (an fp32 weight's under bf16 x), x's
    # for an absent weight. torch.compile traces through the fakes.
    ops = torch.ops.adaptiveload
    gen = torch.Generator().manual_seed(int(torch.randint(1 << 30, ())))
    x = torch.randn(2, 3, 16, generator=gen).bfloat16()
    shift, gate = (
        torch.randn(2, 1, 16, generator=gen),
        torch.randn(2, 1, 16, generator=gen).bfloat16(),
    )
    scale = torch.randn(2, 3, 16, generator=gen).bfloat16()
    h, dy, dr = (torch.randn(2, 3, 16, generator=gen).bfloat16() for _ in range(3))
    rms = norm == "rms"
    for w in (torch.randn(16, generator=gen), None):
        b = None if rms or w is None else torch.randn(16, generator=gen)
        if rms:
            y, rstd = ops.rms_norm_modulate(x, shift, scale, w, 1e-6, None)
            r, _, grstd = ops.gated_residual_rms_norm_modulate(
                x, h, gate, shift, scale, w, 1e-6, None
            )
            plain = (ops._rms_norm_modulate_backward.default, (dy, x, shift, scale, w, rstd))
            gated_bw = ops._gated_residual_rms_norm_modulate_backward.default
            gated = (gated_bw, (dr, dy, r, h, gate, shift, scale, w, grstd))
        else:
            y, mean, rstd = ops.layer_norm_modulate(x, shift, scale, w, b, 1e-6, None)
            r, _, gmean, grstd = ops.gated_residual_layer_norm_modulate(
                x, h, gate, shift, scale, w, b, 1e-6, None
            )
            plain = (
                ops._layer_norm_modulate_backward.default,
                (dy, x, shift, scale, w, b, mean, rstd),
            )
            gated_bw = ops._gated_residual_layer_norm_modulate_backward.default
            gated = (gated_bw, (dr, dy, r, h, gate, shift, scale, w, b, gmean, grstd))
        for op, args in (plain, gated):
            k = len(op._schema.returns)
            for mask in [[True] * k, [False] * k] + [[i != j for i in range(k)] for j in range(k)]:
                torch.library.opcheck(op, (*args, mask), test_utils="test_faketensor")


@pytest.mark.parametrize("norm", NORM_NAMES)
def test_opcheck(norm):
    n = NORMS[norm]
    gen = torch.Generator().manual_seed(2)
    x = torch.randn(2, 5, 48, generator=gen, requires_grad=True)
    shift = torch.randn(2, 1, 48, generator=gen, requires_grad=True)
    scale = torch.randn(48, generator=gen, requires_grad=True)
    w = torch.randn(48, generator=gen, requires_grad=True)
    ada = torch.randn(2, 5, 6, 48, generator=gen, requires_grad=True)
    op, args = n.default, n.schema_args
    torch.library.opcheck(op, args(x, shift, scale, weight=w, out_dtype=torch.bfloat16))
    torch.library.opcheck(op, args(x, shift, scale))
    torch.library.opcheck(op, args(x, ada[:, :, 0], ada[:, :, 1]))  # LTX-Video's views
    h = torch.randn(2, 5, 48, generator=gen, requires_grad=True)
    gated = n.gated_default
    torch.library.opcheck(gated, args(x, h, shift, shift, scale))
    torch.library.opcheck(gated, args(x, h, ada[:, :, 2], ada[:, :, 0], ada[:, :, 1], weight=w))


@pytest.mark.parametrize("norm", NORM_NAMES)
def test_forward_ad_is_refused(norm):
    # No forward-mode formula: a dual input must raise, never give a zero or missing tangent.
    import torch.autograd.forward_ad as fwad

    n = NORMS[norm]
    gen = torch.Generator().manual_seed(12)
    x, h = (rand((2, 3, 16), torch.float32, "cpu", gen) for _ in range(2))
    m = make_mod("per_sample", x.shape, torch.float32, "cpu", gen)
    with fwad.dual_level():
        xd = fwad.make_dual(x, torch.randn_like(x))
        with pytest.raises(RuntimeError, match=f"{norm}_norm_modulate: forward-mode AD"):
            n.op(xd, m, m)
        md = fwad.make_dual(m, torch.randn_like(m))
        with pytest.raises(
            RuntimeError, match=f"gated_residual_{norm}_norm_modulate: forward-mode"
        ):
            n.gated(x, h, md, m, m)


@pytest.mark.parametrize("norm", NORM_NAMES)
def test_saved_memory_is_x_plus_stats(norm):
    # LayerNorm saves mean and rstd per row, RMSNorm rstd: 4 bytes each.
    n = NORMS[norm]
    x = torch.randn(4, 8, 64, requires_grad=True)
    shift = torch.randn(4, 1, 64, requires_grad=True)
    saved = []

    def pack(t):
        saved.append(t)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        n.op(x, shift, shift)
    new = [t for t in saved if t.data_ptr() not in (x.data_ptr(), shift.data_ptr())]
    assert sum(t.numel() * t.element_size() for t in new) == n.stats * 4 * 4 * 8


def batch_shared_program(n, device, gen):
    """The fused op then the plain op, with a batch-shared scale."""
    x = rand((2, 6, 32), torch.float32, device, gen).requires_grad_()
    shift = rand((2, 1, 32), torch.float32, device, gen).requires_grad_()
    scale = rand((1, 1, 32), torch.float32, device, gen).requires_grad_()  # batch-shared

    def f(x, shift, scale):
        r, y = n.gated(x, x * 2, scale, shift, scale)
        return n.op(y, shift, scale).sum() + r.sum()

    return f, (x, shift, scale)


def ada_program(n, device, gen):
    """The fused op then the plain op with a weight, modulated by LTX-Video's ada views."""
    x = rand((2, 6, 32), torch.float32, device, gen).requires_grad_()
    ada = rand((2, 6, 6, 32), torch.float32, device, gen, 0.3).requires_grad_()
    w = rand((32,), torch.float32, device, gen, 0.1, 1.0).requires_grad_()

    def f(x, ada, w):
        shift, scale, gate, shift2, scale2, _ = ada.unbind(dim=2)
        r, y = n.gated(x, x * 2, gate, shift, scale)
        return n.op(y, shift2, scale2, weight=w).sum() + r.sum()

    return f, (x, ada, w)


# (norm, program, device, backend): each norm's own program on every backend, the other one
# traced (aot_eager) too.
COMPILE_CASES = [
    (norm, program, "cpu", "aot_eager")
    for norm in NORM_NAMES
    for program in ("batch_shared", "ada")
] + [
    case
    for norm, program in (("layer", "batch_shared"), ("rms", "ada"))
    for case in (
        pytest.param(norm, program, "cpu", "inductor", marks=pytest.mark.slow),  # ~40 s C++
        pytest.param(norm, program, "cuda", "inductor", marks=pytest.mark.cuda),
    )
]


@pytest.mark.parametrize("norm,program,device,backend", COMPILE_CASES)
def test_torch_compile_fullgraph(norm, program, device, backend):
    torch._dynamo.reset()
    gen = torch.Generator().manual_seed(4)
    build = batch_shared_program if program == "batch_shared" else ada_program
    f, inputs = build(NORMS[norm], device, gen)
    compiled = torch.compile(f, fullgraph=True, backend=backend)
    got = torch.autograd.grad(compiled(*inputs), inputs)
    ref = torch.autograd.grad(f(*inputs), inputs)
    for g, r in zip(got, ref, strict=True):
        torch.testing.assert_close(g, r)


@pytest.mark.parametrize("norm", NORM_NAMES)
def test_direct_path_is_the_op_and_yields_to_modes_and_subclasses(norm):
    # The public functions call _C's direct callers outside torch.compile; they must give what
    # torch.ops gives, and step aside for __torch_function__ modes and tensor subclasses.
    n = NORMS[norm]
    gen = torch.Generator().manual_seed(9)
    x = rand((2, 5, 32), torch.float32, "cpu", gen).requires_grad_()
    shift, scale = (make_mod("per_sample", x.shape, torch.float32, "cpu", gen) for _ in range(2))
    y = n.op(x, shift, scale)
    y_op = n.default(*n.schema_args(x, shift, scale))[0]
    assert torch.equal(y, y_op) and y.grad_fn is not None
    backward = {"layer": "LayerNormModulateBackward", "rms": "RmsNormModulateBackward"}[norm]
    assert y.grad_fn.name() == backward
    r, y2 = n.gated(x, x, shift, shift, scale)
    assert y2.grad_fn.name() == "GatedResidual" + backward
    (g,) = torch.autograd.grad(y.sum(), x)
    (g_op,) = torch.autograd.grad(y_op.sum(), x)
    assert torch.equal(g, g_op)

    seen = []

    class Spy(torch.overrides.TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            seen.append(str(func))
            return func(*args, **(kwargs or {}))

    with Spy():
        n.op(x, shift, scale)
        n.gated(x, x, shift, shift, scale)
    assert any(f"{norm}_norm_modulate" in f for f in seen)
    assert any(f"gated_residual_{norm}" in f for f in seen)

    class Sub(torch.Tensor):
        pass

    ys = n.op(x.detach().as_subclass(Sub), shift, scale)
    torch.testing.assert_close(ys.as_subclass(torch.Tensor), y.detach())


@pytest.mark.parametrize("norm", NORM_NAMES)
def test_modules(norm):
    n = NORMS[norm]
    m = n.module(32, elementwise_affine=True, out_dtype=torch.bfloat16)
    assert m.weight.shape == (32,) and m.weight.dtype == torch.float32
    assert "elementwise_affine=True" in repr(m)
    x = torch.randn(2, 3, 32)
    shift, scale = torch.randn(2, 1, 32), torch.randn(2, 1, 32)
    y = m(x, shift, scale)
    assert y.dtype == torch.bfloat16
    params = [getattr(m, a).detach() for a in n.affine]  # weight 1 (and bias 0) as made
    want = n.ref(x, shift, scale, *params, eps=1e-6)
    torch.testing.assert_close(y.float(), want.float(), atol=2e-2, rtol=2e-2)
    r, y2 = n.gated_module(32)(x, x, shift, shift, scale)
    torch.testing.assert_close(r, x + shift * x)
    torch.testing.assert_close(y2, n.ref(r, shift, scale))
