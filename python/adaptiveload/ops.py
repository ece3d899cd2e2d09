"""Fused adaLN ops: LayerNorm or RMSNorm followed by the (1 + scale), shift modulation of DiT
blocks (Wan 2.1's LayerNorm, LTX-Video's RMSNorm), plain or fused with the gated residual update.

The kernels and their autograd (C++, double backward included) live in ``adaptiveload._C``
(``csrc/ops``), which importing this module loads; ``import adaptiveload`` alone does not (the
package's ``layer_norm_modulate`` attributes import it on first access). This module registers
the ops' fake (meta) implementations for ``torch.compile`` and exposes the public functions.
See ``docs/ops.md`` for the math, the supported broadcast patterns and the kernels.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from adaptiveload import _C  # loads the TORCH_LIBRARY registrations


class _Variant(NamedTuple):
    """One op of the family, a row of csrc/ops/variants.h: its name, its norm (``"layer"``:
    LayerNorm, weight and bias, saves mean and rstd; ``"rms"``: RMSNorm, weight only, saves rstd)
    and whether it is gated (``r = residual + gate * h`` first, then the norm of ``r``; returns
    ``(r, y)``)."""

    name: str
    norm: str
    gated: bool


# The ops, as the C++ declares them (one row each): each gets its fake kernels from its row
# (below), and has its public function here.
_VARIANTS = tuple(_Variant(*row) for row in _C._variants())

__all__ = [v.name for v in _VARIANTS]

# Outside torch.compile the public functions call _C's direct callers of the same ops (see
# csrc/ops/module.cpp: no boxed argument conversion); torch.compile traces the torch.ops.
_OPS = {v.name: getattr(torch.ops.adaptiveload, v.name).default for v in _VARIANTS}
_is_compiling = torch.compiler.is_compiling
_has_torch_function = torch.overrides.has_torch_function


def _plain(*tensors) -> bool:
    """The direct path applies: not compiling, plain tensors, no ``__torch_function__``
    override (a subclass or an active mode, which ``has_torch_function`` both report)."""
    if _is_compiling():
        return False
    for t in tensors:
        if t.__class__ is not torch.Tensor:
            return False
    return not _has_torch_function(tensors)


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
    if _plain(x, shift, scale):
        return _C.layer_norm_modulate(x, shift, scale, weight, bias, eps, out_dtype)
    return _OPS["layer_norm_modulate"](x, shift, scale, weight, bias, eps, out_dtype)[0]


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
    if _plain(residual, h, gate, shift, scale):
        return _C.gated_residual_layer_norm_modulate(
            residual, h, gate, shift, scale, weight, bias, eps, out_dtype
        )
    op = _OPS["gated_residual_layer_norm_modulate"]
    r, y, _, _ = op(residual, h, gate, shift, scale, weight, bias, eps, out_dtype)
    return r, y


def rms_norm_modulate(
    x: torch.Tensor,
    shift: torch.Tensor,
    scale: torch.Tensor,
    *,
    weight: torch.Tensor | None = None,
    eps: float = 1e-6,
    out_dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """``y = x * rstd * weight * (1 + scale) + shift``, ``rstd = 1 / sqrt(mean(x^2) + eps)``.

    RMSNorm (``torch.nn.RMSNorm``; without ``weight``, the norm of LTX-Video's blocks in
    diffusers) followed by the adaLN modulation. The mean of squares is over the last dim ``D``,
    in fp32 (fp64 for fp64 CPU input).

    Args:
        x: ``(..., D)``, contiguous; bfloat16, float16 or float32 (float64 on CPU).
        shift, scale: float32 or ``x.dtype``, last dim ``D``, broadcastable to ``x``: shared
            ``(D,)``, per sample ``(B, 1, D)``, per token ``x.shape``, or strided views such as
            LTX-Video's ``ada_values.unbind(dim=2)[k]`` of a ``(B, S, 6, D)`` tensor (read in
            place, no copy).
        weight: optional ``(D,)`` elementwise-affine weight (float32 or ``x.dtype``); no bias.
        eps: added to the mean of squares.
        out_dtype: dtype of ``y``; defaults to ``x.dtype``.

    Returns:
        ``y`` with ``x``'s shape. Backward saves only ``x`` plus 4 bytes per row (rstd).
    """
    if _plain(x, shift, scale):
        return _C.rms_norm_modulate(x, shift, scale, weight, eps, out_dtype)
    return _OPS["rms_norm_modulate"](x, shift, scale, weight, eps, out_dtype)[0]


def gated_residual_rms_norm_modulate(
    residual: torch.Tensor,
    h: torch.Tensor,
    gate: torch.Tensor,
    shift: torch.Tensor,
    scale: torch.Tensor,
    *,
    weight: torch.Tensor | None = None,
    eps: float = 1e-6,
    out_dtype: torch.dtype | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``r = residual + gate * h``; ``y = rms_norm_modulate(r, shift, scale, ...)``.

    A block's gated residual update fused with the next modulated RMSNorm (in LTX-Video, the
    FFN's ``hidden_states + ff_output * gate_mlp`` and the next block's ``norm1``): one pass
    reads ``residual`` and ``h`` and writes ``r`` and ``y``.

    Args:
        residual, h: ``(..., D)`` of one dtype; ``residual`` contiguous.
        gate, shift, scale: broadcast to ``residual`` like ``shift`` of :func:`rms_norm_modulate`.
        weight, eps, out_dtype: as in :func:`rms_norm_modulate`.

    Returns:
        ``(r, y)``: ``r`` in ``residual``'s dtype (the next residual stream), ``y`` in
        ``out_dtype``. ``r`` is rounded to its dtype before it is normalized.
    """
    if _plain(residual, h, gate, shift, scale):
        return _C.gated_residual_rms_norm_modulate(
            residual, h, gate, shift, scale, weight, eps, out_dtype
        )
    op = _OPS["gated_residual_rms_norm_modulate"]
    r, y, _ = op(residual, h, gate, shift, scale, weight, eps, out_dtype)
    return r, y


# ---- fake (meta) implementations: shapes and dtypes only ----


def _require(ok, message) -> None:
    """``RuntimeError`` with ``message()`` unless ``ok`` (shapes here are the inputs', so a
    symbolic comparison only adds the guard torch.compile would take anyway)."""
    if not ok:
        raise RuntimeError(message())


def _check_common(op: str, x: torch.Tensor, mods: dict, weight, bias) -> None:
    _require(x.dtype in _FLOATS, lambda: f"{op}: unsupported dtype {x.dtype}")
    _require(x.dim() >= 1, lambda: f"{op}: input must have a last dim D")
    d = x.shape[-1]
    for name, t in mods.items():
        _require(
            t.dim() >= 1 and t.dim() <= x.dim() and t.shape[-1] == d,
            lambda name=name, t=t: f"{op}: {name} must have last dim D={d}, got {tuple(t.shape)}",
        )
        _require(
            t.dtype in (torch.float32, x.dtype),
            lambda name=name, t=t: f"{op}: {name} must be float32 or {x.dtype}, got {t.dtype}",
        )
    for name, t in (("weight", weight), ("bias", bias)):
        if t is not None:
            _require(
                t.dim() == 1 and t.shape[0] == d,
                lambda name=name, t=t: f"{op}: {name} must have shape ({d},)",
            )


def _stats_dtype(x: torch.Tensor) -> torch.dtype:
    return torch.float64 if x.dtype == torch.float64 else torch.float32


def _grad_like(t, needed, fallback):
    """A gradient of t's shape when needed, else the (0,) placeholder the kernels return."""
    return t.new_empty(t.shape) if needed and t is not None else fallback.new_empty((0,))


def _forward_fake(op, x, h, gate, shift, scale, weight, bias, out_dtype, rms):
    """Every forward op's outputs: (r,) for the gated ops (``h`` given), y, then mean
    (LayerNorm only) and rstd."""
    mods = (
        {"shift": shift, "scale": scale}
        if h is None
        else {"gate": gate, "shift": shift, "scale": scale}
    )
    _check_common(op, x, mods, weight, bias)
    r = ()
    if h is not None:
        _require(h.shape == x.shape, lambda: f"{op}: h must have residual's shape")
        _require(h.dtype == x.dtype, lambda: f"{op}: h must have residual's dtype")
        r = (x.new_empty(x.shape),)
    y = x.new_empty(x.shape, dtype=out_dtype or x.dtype)
    stats = tuple(x.new_empty(x.shape[:-1], dtype=_stats_dtype(x)) for _ in range(1 if rms else 2))
    return (*r, y, *stats)


def _backward_fake(grads, mask, x):
    """Every backward op's gradients, one per input in output-mask order: a masked-off one, as
    the kernels give it, is a (0,) tensor of its input's dtype, x's for an absent weight or bias."""
    return tuple(_grad_like(t, m, x if t is None else t) for t, m in zip(grads, mask, strict=True))


def _inputs(v: _Variant, backward: bool) -> tuple[str, ...]:
    """The differentiable inputs of ``v``'s op, in its backward's gradient order, by their names
    in the op's schema or in its backward's (where a gated op's residual is r)."""
    x = ("r" if backward else "residual", "h", "gate") if v.gated else ("x",)
    return (*x, "shift", "scale", "weight", *(() if v.norm == "rms" else ("bias",)))


def _arg_names(v: _Variant, backward: bool) -> tuple[str, ...]:
    """The argument names of ``v``'s op or of its backward (as csrc/ops/signatures.h builds
    the schemas)."""
    if not backward:
        return (*_inputs(v, False), "eps", "out_dtype")
    stats = ("rstd",) if v.norm == "rms" else ("mean", "rstd")
    dr = ("dr",) if v.gated else ()
    return (*dr, "dy", *_inputs(v, True), *stats, "output_mask")


def _register_fakes(v: _Variant) -> None:
    """The fake kernels of ``v``'s op and of its backward."""
    rms, backward = v.norm == "rms", f"_{v.name}_backward"
    fwd_names, bwd_names, grad_names = _arg_names(v, False), _arg_names(v, True), _inputs(v, True)

    def forward_fake(*args):
        a = dict(zip(fwd_names, args, strict=True))
        x, h, gate, bias = a[fwd_names[0]], a.get("h"), a.get("gate"), a.get("bias")
        mods = (a["shift"], a["scale"], a["weight"])
        return _forward_fake(v.name, x, h, gate, *mods, bias, a["out_dtype"], rms=rms)

    def backward_fake(*args):
        a = dict(zip(bwd_names, args, strict=True))
        x = a[grad_names[0]]
        _require(a["dy"].shape == x.shape, lambda: f"{backward}: dy must match {grad_names[0]}")
        return _backward_fake(tuple(a.get(n) for n in grad_names), a["output_mask"], x)

    torch.library.register_fake(f"adaptiveload::{v.name}")(forward_fake)
    torch.library.register_fake(f"adaptiveload::{backward}")(backward_fake)


for _v in _VARIANTS:
    _register_fakes(_v)


# ---- the CUDA tuning tables (private; CUDA builds only) ----


def _tuning_table() -> list[dict]:
    """Every row of the CUDA tuning tables (csrc/ops/cuda/tuned_*.cu), in table order, as a
    dict of its fields; empty for a build without CUDA."""
    return list(_C._tuning_table()) if hasattr(_C, "_tuning_table") else []


def _last_configs() -> tuple[str, str]:
    """Ids of the forward and backward table rows this thread ran last ('' if none)."""
    fwd, _, bwd = torch.ops.adaptiveload._last_configs().partition(" ")
    return fwd, bwd
