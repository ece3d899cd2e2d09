"""nn.Module wrappers of the fused adaLN ops in :mod:`adaptiveload.ops`."""

from __future__ import annotations

import torch
from torch import nn

from adaptiveload import ops

__all__ = [
    "LayerNormModulate",
    "GatedResidualLayerNormModulate",
    "RMSNormModulate",
    "GatedResidualRMSNormModulate",
]


class LayerNormModulate(nn.Module):
    """``LayerNorm(x) * (1 + scale) + shift`` over the last dim ``dim``.

    Drop-in for the ``norm(x) * (1 + scale) + shift`` of a DiT block (Wan 2.1's modulated norms
    have no affine parameters: ``elementwise_affine=False``, the default).

    Args:
        dim: size ``D`` of the normalized last dim.
        eps: added to the variance.
        elementwise_affine: learn a ``(D,)`` weight (ones) and bias (zeros), in float32.
        out_dtype: dtype of the output; ``None`` keeps the input's dtype.
    """

    def __init__(
        self,
        dim: int,
        eps: float = 1e-6,
        elementwise_affine: bool = False,
        out_dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        self.dim = dim
        self.eps = eps
        self.out_dtype = out_dtype
        if elementwise_affine:
            self.weight = nn.Parameter(torch.ones(dim))
            self.bias = nn.Parameter(torch.zeros(dim))
        else:
            self.register_parameter("weight", None)
            self.register_parameter("bias", None)

    def forward(self, x: torch.Tensor, shift: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
        return ops.layer_norm_modulate(
            x,
            shift,
            scale,
            weight=self.weight,
            bias=self.bias,
            eps=self.eps,
            out_dtype=self.out_dtype,
        )

    def extra_repr(self) -> str:
        return (
            f"{self.dim}, eps={self.eps}, elementwise_affine={self.weight is not None}, "
            f"out_dtype={self.out_dtype}"
        )


class GatedResidualLayerNormModulate(LayerNormModulate):
    """``r = residual + gate * h``; returns ``(r, LayerNormModulate(r))`` in one pass."""

    def forward(  # type: ignore[override]
        self,
        residual: torch.Tensor,
        h: torch.Tensor,
        gate: torch.Tensor,
        shift: torch.Tensor,
        scale: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return ops.gated_residual_layer_norm_modulate(
            residual,
            h,
            gate,
            shift,
            scale,
            weight=self.weight,
            bias=self.bias,
            eps=self.eps,
            out_dtype=self.out_dtype,
        )


class RMSNormModulate(nn.Module):
    """``RMSNorm(x) * (1 + scale) + shift`` over the last dim ``dim``.

    Drop-in for the ``norm(x) * (1 + scale) + shift`` of an LTX-Video block (whose RMSNorm has no
    affine weight: ``elementwise_affine=False``, the default, and ``eps=1e-6``).

    Args:
        dim: size ``D`` of the normalized last dim.
        eps: added to the mean of squares.
        elementwise_affine: learn a ``(D,)`` weight (ones) in float32, as ``torch.nn.RMSNorm``.
        out_dtype: dtype of the output; ``None`` keeps the input's dtype.
    """

    def __init__(
        self,
        dim: int,
        eps: float = 1e-6,
        elementwise_affine: bool = False,
        out_dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        self.dim = dim
        self.eps = eps
        self.out_dtype = out_dtype
        if elementwise_affine:
            self.weight = nn.Parameter(torch.ones(dim))
        else:
            self.register_parameter("weight", None)

    def forward(self, x: torch.Tensor, shift: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
        return ops.rms_norm_modulate(
            x, shift, scale, weight=self.weight, eps=self.eps, out_dtype=self.out_dtype
        )

    def extra_repr(self) -> str:
        return (
            f"{self.dim}, eps={self.eps}, elementwise_affine={self.weight is not None}, "
            f"out_dtype={self.out_dtype}"
        )


class GatedResidualRMSNormModulate(RMSNormModulate):
    """``r = residual + gate * h``; returns ``(r, RMSNormModulate(r))`` in one pass."""

    def forward(  # type: ignore[override]
        self,
        residual: torch.Tensor,
        h: torch.Tensor,
        gate: torch.Tensor,
        shift: torch.Tensor,
        scale: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return ops.gated_residual_rms_norm_modulate(
            residual,
            h,
            gate,
            shift,
            scale,
            weight=self.weight,
            eps=self.eps,
            out_dtype=self.out_dtype,
        )
