"""What the op suites share (test_ops.py, test_ops_properties.py, test_ops_tables.py,
test_ops_cuda.py): the plain-PyTorch references of the four ops, the accuracy rule and its
tolerance floors, random inputs of every modulation layout, and one ``Norm`` per norm kind
(its ops, references and registered names), so that a test of a property runs over both.

Accuracy rule (flash-attention style): the op's error against a float64 reference must be at
most ~2x the error of the same formula run by PyTorch eager in the op's low precision, with a
small floor. Every output and every gradient is checked.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import pytest
import torch

from adaptiveload import ops
from adaptiveload.nn import (
    GatedResidualLayerNormModulate,
    GatedResidualRMSNormModulate,
    LayerNormModulate,
    RMSNormModulate,
)

CUDA = torch.cuda.is_available()
# The cuda marker skips without a GPU (conftest.py); `-m cuda` selects these cases.
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)]

# dtype -> absolute error floor (the 2x-PyTorch rule applies on top).
FLOOR = {torch.float64: 1e-10, torch.float32: 2e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}

EPS = 1e-6

# Modulation layouts: make_mod's, and LTX-Video's ada_values views (mod).
MOD_KINDS = ["shared", "per_sample", "per_token", "chunk", "ltx_token", "ltx_sample"]


# ---------------------------------------------------------------- references


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


# ---------------------------------------------------------------- the two norm kinds


@dataclass(frozen=True)
class Norm:
    """One norm kind's ops, references and registered names. ``affine``: the keyword names of
    its optional (D,) parameters (RMSNorm has no bias); ``stats``: fp32 statistics saved per
    row; ``tag``: what its tuning-table row ids add after the dtype; ``width``: the hidden size
    of the model family it serves (Wan 2.1 1.3B, LTX-Video 2B), for tests at a real width."""

    name: str
    op: Callable
    gated: Callable
    ref: Callable
    ref_gated: Callable
    module: type
    gated_module: type
    affine: tuple[str, ...]
    stats: int
    tag: str
    width: int

    @property
    def default(self):
        """The registered plain op: ``(x, shift, scale, *affine, eps, out_dtype)``."""
        return getattr(torch.ops.adaptiveload, f"{self.name}_norm_modulate").default

    @property
    def gated_default(self):
        """The registered fused op: ``(residual, h, gate, shift, scale, *affine, eps,
        out_dtype)``."""
        return getattr(torch.ops.adaptiveload, f"gated_residual_{self.name}_norm_modulate").default

    @property
    def backward_with_config(self):
        """The private explicit-row backward: ``(dr, dy, saved, h, gate, shift, scale,
        *affine, *stats, mask, config)``."""
        return getattr(torch.ops.adaptiveload, f"_{self.name}_norm_modulate_backward_with_config")

    def schema_args(self, *lead, weight=None, bias=None, eps=EPS, out_dtype=None):
        """Positional arguments of the registered ops after the tensors ``lead``."""
        affine = {"weight": weight, "bias": bias}
        return (*lead, *(affine[a] for a in self.affine), eps, out_dtype)

    def affine_params(self, d, dtype, device, gen, spread):
        """Random (D,) parameters of the norm: weight ``1 + spread * N``, bias ``spread * N``."""
        params = {"weight": (spread, 1.0), "bias": (spread, 0.0)}
        return [rand((d,), dtype, device, gen, *params[a]) for a in self.affine]


NORMS = {
    "layer": Norm(
        "layer",
        ops.layer_norm_modulate,
        ops.gated_residual_layer_norm_modulate,
        reference,
        reference_gated,
        LayerNormModulate,
        GatedResidualLayerNormModulate,
        ("weight", "bias"),
        stats=2,
        tag="",
        width=1536,
    ),
    "rms": Norm(
        "rms",
        ops.rms_norm_modulate,
        ops.gated_residual_rms_norm_modulate,
        reference_rms,
        reference_gated_rms,
        RMSNormModulate,
        GatedResidualRMSNormModulate,
        ("weight",),
        stats=1,
        tag=".rms",
        width=2048,
    ),
}


def per_norm(layer, rms):
    """Parameters ``(norm, *case)`` of a test over both norms whose cases differ by norm: each
    case (a value or a tuple) of each norm's list."""

    def rows(norm, cases):
        return [(norm, *(c if isinstance(c, tuple) else (c,))) for c in cases]

    return rows("layer", layer) + rows("rms", rms)


# ---------------------------------------------------------------- inputs and the accuracy rule


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


def rand(shape, dtype, device, gen, scale=1.0, offset=0.0):
    return (offset + scale * torch.randn(*shape, generator=gen)).to(device, dtype)


def run_and_check(
    norm, x_shape, dtype, mod_dtype, out_dtype, mod_kind, device, affine=False, seed=0
):
    """The plain op of ``norm`` on fresh inputs, its output and every gradient against the
    float64 reference by the accuracy rule."""
    n = NORMS[norm]
    gen = torch.Generator().manual_seed(seed)
    x = rand(x_shape, dtype, device, gen, 2.0, 0.3).requires_grad_()
    shift = mod(mod_kind, x_shape, mod_dtype, device, gen, 0).requires_grad_()
    scale = mod(mod_kind, x_shape, mod_dtype, device, gen, 1).requires_grad_()
    params = n.affine_params(x_shape[-1], mod_dtype, device, gen, 0.2) if affine else []
    inputs = [x, shift, scale, *(p.requires_grad_() for p in params)]
    kwargs = dict(zip(n.affine, inputs[3:], strict=False))
    y = n.op(x, shift, scale, **kwargs, out_dtype=out_dtype)
    dy = rand(x_shape, y.dtype, device, gen)
    got = torch.autograd.grad(y, inputs, dy)

    lowp_in = [t.detach().clone().requires_grad_() for t in inputs]
    y_lowp = n.ref(*lowp_in, out_dtype=out_dtype)
    lowp = torch.autograd.grad(y_lowp, lowp_in, dy)
    ref_in = f64(*inputs)
    y_ref = n.ref(*ref_in)
    ref = torch.autograd.grad(y_ref, ref_in, dy.double())

    acc = max([dtype, out_dtype or dtype], key=lambda t: FLOOR[t])
    assert_close("y", y, y_ref, y_lowp, acc)
    names = ["dx", "dshift", "dscale", "dweight", "dbias"]
    for name, g, r, lp in zip(names, got, ref, lowp, strict=False):
        assert_close(name, g, r, lp, acc)
    return y, got
