"""Fused adaLN ops: LayerNorm followed by the (1 + scale), shift modulation of DiT blocks.

The kernels live in ``adaptiveload._C`` (``csrc/ops``); this module registers their fake
(meta) implementations and autograd formulas and exposes the public functions. See
``docs/ops.md`` for the math, the supported broadcast patterns and the kernel design.
"""

from __future__ import annotations

import torch

from adaptiveload import _C  # noqa: F401  (loads the TORCH_LIBRARY registrations)

__all__ = ["layer_norm_modulate", "gated_residual_layer_norm_modulate"]

_FLOATS = (torch.bfloat16, torch.float16, torch.float32, torch.float64)


def layer_norm_modulate(
    x: torch.Tensor,
    shift: torch.Tensor,
    scale: torch.Tensor,
    *,
    weight: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    eps: float = 1e-6,
    out_dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """``y = ((x - mean) * rstd * weight + bias) * (1 + scale) + shift``.

    Statistics are over the last dim ``D`` in fp32 (fp64 for fp64 CPU input), with the biased
    variance: ``rstd = 1 / sqrt(var + eps)``, as ``torch.nn.functional.layer_norm``.

    Args:
        x: ``(..., D)``, contiguous; bfloat16, float16 or float32 (float64 on CPU).
        shift, scale: float32 or ``x.dtype``, last dim ``D``, broadcastable to ``x``: shared
            ``(D,)``, per sample ``(B, 1, D)``, per token ``x.shape``, or strided views such as
            ``e.chunk(6, dim=1)[k]`` of a ``(B, 6, D)`` tensor (read in place, no copy).
        weight, bias: optional ``(D,)`` affine parameters (float32 or ``x.dtype``).
        eps: added to the variance.
        out_dtype: dtype of ``y``; defaults to ``x.dtype``.

    Returns:
        ``y`` with ``x``'s shape. Backward saves only ``x`` plus 8 bytes per row (mean, rstd).
    """
    y, _, _ = torch.ops.adaptiveload.layer_norm_modulate.default(
        x, shift, scale, weight, bias, eps, out_dtype
    )
    return y


def gated_residual_layer_norm_modulate(
    residual: torch.Tensor,
    h: torch.Tensor,
    gate: torch.Tensor,
    shift: torch.Tensor,
    scale: torch.Tensor,
    *,
    weight: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    eps: float = 1e-6,
    out_dtype: torch.dtype | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``r = residual + gate * h``; ``y = layer_norm_modulate(r, shift, scale, ...)``.

    The residual update after attention or the FFN of a DiT block fused with the next modulated
    norm: one pass reads ``residual`` and ``h`` and writes ``r`` and ``y``.

    Args:
        residual, h: ``(..., D)`` of one dtype; ``residual`` contiguous.
        gate, shift, scale: broadcast to ``residual`` like ``shift`` of
            :func:`layer_norm_modulate`.
        weight, bias, eps, out_dtype: as in :func:`layer_norm_modulate`.

    Returns:
        ``(r, y)``: ``r`` in ``residual``'s dtype (the next residual stream), ``y`` in
        ``out_dtype``. ``r`` is rounded to its dtype before it is normalized.
    """
    r, y, _, _ = torch.ops.adaptiveload.gated_residual_layer_norm_modulate.default(
        residual, h, gate, shift, scale, weight, bias, eps, out_dtype
    )
    return r, y


# ---- fake (meta) implementations: shapes and dtypes only ----


def _check_common(op: str, x: torch.Tensor, mods: dict, weight, bias) -> None:
    torch._check(x.dtype in _FLOATS, lambda: f"{op}: unsupported dtype {x.dtype}")
    torch._check(x.dim() >= 1, lambda: f"{op}: input must have a last dim D")
    d = x.shape[-1]
    for name, t in mods.items():
        torch._check(
            t.dim() >= 1 and t.dim() <= x.dim() and t.shape[-1] == d,
            lambda name=name, t=t: f"{op}: {name} must have last dim D={d}, got {tuple(t.shape)}",
        )
        torch._check(
            t.dtype in (torch.float32, x.dtype),
            lambda name=name, t=t: f"{op}: {name} must be float32 or {x.dtype}, got {t.dtype}",
        )
    for name, t in (("weight", weight), ("bias", bias)):
        if t is not None:
            torch._check(
                t.dim() == 1 and t.shape[0] == d,
                lambda name=name, t=t: f"{op}: {name} must have shape ({d},)",
            )


def _stats_dtype(x: torch.Tensor) -> torch.dtype:
    return torch.float64 if x.dtype == torch.float64 else torch.float32


def _grad_like(t, needed, fallback):
    """A gradient of t's shape when needed, else the (0,) placeholder the kernels return."""
    return t.new_empty(t.shape) if needed and t is not None else fallback.new_empty((0,))


@torch.library.register_fake("adaptiveload::layer_norm_modulate")
def _layer_norm_modulate_fake(x, shift, scale, weight, bias, eps, out_dtype):
    _check_common("layer_norm_modulate", x, {"shift": shift, "scale": scale}, weight, bias)
    y = x.new_empty(x.shape, dtype=out_dtype or x.dtype)
    mean = x.new_empty(x.shape[:-1], dtype=_stats_dtype(x))
    return y, mean, torch.empty_like(mean)


@torch.library.register_fake("adaptiveload::_layer_norm_modulate_backward")
def _layer_norm_modulate_backward_fake(dy, x, shift, scale, weight, bias, mean, rstd, mask):
    torch._check(dy.shape == x.shape, lambda: "_layer_norm_modulate_backward: dy must match x")

    return (
        _grad_like(x, mask[0], x),
        _grad_like(shift, mask[1], shift),
        _grad_like(scale, mask[2], scale),
        _grad_like(weight, mask[3], x),
        _grad_like(bias, mask[4], x),
    )


@torch.library.register_fake("adaptiveload::gated_residual_layer_norm_modulate")
def _gated_fake(residual, h, gate, shift, scale, weight, bias, eps, out_dtype):
    op = "gated_residual_layer_norm_modulate"
    _check_common(op, residual, {"gate": gate, "shift": shift, "scale": scale}, weight, bias)
    torch._check(h.shape == residual.shape, lambda: f"{op}: h must have residual's shape")
    torch._check(h.dtype == residual.dtype, lambda: f"{op}: h must have residual's dtype")
    r = residual.new_empty(residual.shape)
    y = residual.new_empty(residual.shape, dtype=out_dtype or residual.dtype)
    mean = residual.new_empty(residual.shape[:-1], dtype=_stats_dtype(residual))
    return r, y, mean, torch.empty_like(mean)


@torch.library.register_fake("adaptiveload::_gated_residual_layer_norm_modulate_backward")
def _gated_backward_fake(dr, dy, r, h, gate, shift, scale, weight, bias, mean, rstd, mask):
    return (
        _grad_like(r, mask[0], r),
        _grad_like(h, mask[1], h),
        _grad_like(gate, mask[2], gate),
        _grad_like(shift, mask[3], shift),
        _grad_like(scale, mask[4], scale),
        _grad_like(weight, mask[5], r),
        _grad_like(bias, mask[6], r),
    )


# ---- autograd ----
#
# The fused backward kernels compute first-order gradients only. When a backward runs with
# create_graph=True (double backward: gradient penalties, Hessian-vector products), the
# gradients are formed instead by the same formulas in plain PyTorch ops (_backward_graph),
# which autograd can differentiate; grad mode is on inside a backward exactly in that case.


def _backward_graph(x, shift, scale, weight, bias, dy, eps, mask):
    """(dx, dshift, dscale, dweight, dbias) of ``layer_norm_modulate`` in plain PyTorch ops,
    so that autograd can differentiate them again; None where ``mask`` is False. Statistics
    in fp32 (fp64 for fp64 input), gradients returned in their inputs' dtypes."""
    acc = torch.float64 if x.dtype == torch.float64 else torch.float32
    xf, g_out = x.to(acc), dy.to(acc)
    mean = xf.mean(-1, keepdim=True)
    xc = xf - mean
    rstd = torch.rsqrt(xc.square().mean(-1, keepdim=True) + eps)
    xhat = xc * rstd
    w = None if weight is None else weight.to(acc)
    z = xhat if w is None else xhat * w
    if bias is not None:
        z = z + bias.to(acc)
    g_z = g_out * (1 + scale.to(acc))  # d/dz
    g_xhat = g_z if w is None else g_z * w
    rows = tuple(range(x.dim() - 1))
    grads = [None] * 5
    if mask[0]:
        dx = rstd * (
            g_xhat - g_xhat.mean(-1, keepdim=True) - xhat * (g_xhat * xhat).mean(-1, keepdim=True)
        )
        grads[0] = dx.to(x.dtype)
    if mask[1]:
        grads[1] = g_out.sum_to_size(shift.shape).to(shift.dtype)
    if mask[2]:
        grads[2] = (g_out * z).sum_to_size(scale.shape).to(scale.dtype)
    if mask[3]:
        grads[3] = (g_z * xhat).sum(rows).to(weight.dtype)
    if mask[4]:
        grads[4] = g_z.sum(rows).to(bias.dtype)
    return grads


def _lnm_setup_context(ctx, inputs, output):
    x, shift, scale, weight, bias, eps, out_dtype = inputs
    _y, mean, rstd = output
    ctx.eps, ctx.out_dtype = eps, out_dtype
    # Only x, the (small or caller-owned) modulation and 8 bytes per row are kept.
    ctx.save_for_backward(x, shift, scale, weight, bias, mean, rstd)
    ctx.mark_non_differentiable(mean, rstd)


def _lnm_backward(ctx, dy, _dmean, _drstd):
    x, shift, scale, weight, bias, mean, rstd = ctx.saved_tensors
    need = ctx.needs_input_grad
    mask = [
        need[0],
        need[1],
        need[2],
        weight is not None and need[3],
        bias is not None and need[4],
    ]
    if not any(mask):
        return None, None, None, None, None, None, None
    if torch.is_grad_enabled():  # create_graph=True
        return *_backward_graph(x, shift, scale, weight, bias, dy, ctx.eps, mask), None, None
    grads = torch.ops.adaptiveload._layer_norm_modulate_backward.default(
        dy, x, shift, scale, weight, bias, mean, rstd, mask
    )
    out = [g if m else None for g, m in zip(grads, mask, strict=True)]
    return *out, None, None


torch.library.register_autograd(
    "adaptiveload::layer_norm_modulate", _lnm_backward, setup_context=_lnm_setup_context
)


def _gated_setup_context(ctx, inputs, output):
    _residual, h, gate, shift, scale, weight, bias, eps, out_dtype = inputs
    r, _y, mean, rstd = output
    ctx.eps, ctx.out_dtype = eps, out_dtype
    # r (an output, the next residual stream) replaces residual; h is needed for dgate.
    ctx.save_for_backward(r, h, gate, shift, scale, weight, bias, mean, rstd)
    ctx.mark_non_differentiable(mean, rstd)


def _gated_backward(ctx, dr, dy, _dmean, _drstd):
    r, h, gate, shift, scale, weight, bias, mean, rstd = ctx.saved_tensors
    need = ctx.needs_input_grad
    mask = [
        need[0],
        need[1],
        need[2],
        need[3],
        need[4],
        weight is not None and need[5],
        bias is not None and need[6],
    ]
    if not any(mask):
        return (None,) * 9
    if torch.is_grad_enabled():  # create_graph=True
        return (
            *_gated_double_backward(ctx, dr, dy, r, h, gate, shift, scale, weight, bias),
            None,
            None,
        )
    grads = torch.ops.adaptiveload._gated_residual_layer_norm_modulate_backward.default(
        dr, dy, r, h, gate, shift, scale, weight, bias, mean, rstd, mask
    )
    out = [g if m else None for g, m in zip(grads, mask, strict=True)]
    return *out, None, None


def _gated_double_backward(ctx, dr, dy, r, h, gate, shift, scale, weight, bias):
    """Differentiable gradients of the gated op, in terms of its saved output r (whose own
    dependence on residual, h and gate autograd follows through this op's node)."""
    need = ctx.needs_input_grad
    mask = [any(need[:3]), need[3], need[4], weight is not None and need[5]]
    mask.append(bias is not None and need[6])
    d_r, *d_mods = _backward_graph(r, shift, scale, weight, bias, dy, ctx.eps, mask)
    dr_total = dr if d_r is None else dr + d_r  # r = residual + gate * h
    d_h = (dr_total * gate).to(h.dtype) if need[1] else None
    d_gate = (dr_total * h).sum_to_size(gate.shape).to(gate.dtype) if need[2] else None
    return (dr_total if need[0] else None), d_h, d_gate, *d_mods


torch.library.register_autograd(
    "adaptiveload::gated_residual_layer_norm_modulate",
    _gated_backward,
    setup_context=_gated_setup_context,
)
