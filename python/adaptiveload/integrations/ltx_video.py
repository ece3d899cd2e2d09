"""Route diffusers' LTX-Video blocks (``LTXVideoTransformerBlock``) through AdaptiveLoad's
fused RMSNorm ops.

``apply_fused_ops(model)`` rebinds each block's ``forward`` so that

- ``norm1`` (RMSNorm) + modulation                      -> ``rms_norm_modulate``
- cross-attention residual + ``norm2`` + modulation     -> ``gated_residual_rms_norm_modulate``

with the modulation per sample or per token (``ada_values`` of shape (B, T, 6, D), whose
``unbind(dim=2)`` views the ops read in place). Statistics and modulation run in fp32, the
stream stays in its dtype. Weights are untouched; ``remove_fused_ops`` undoes it.
"""

from __future__ import annotations

import torch
from torch import nn

from adaptiveload.integrations._patch import all_patched, patch_forwards, unpatch_forwards


def _fused_block_forward(
    self: nn.Module,
    hidden_states: torch.Tensor,
    encoder_hidden_states: torch.Tensor,
    temb: torch.Tensor,
    image_rotary_emb=None,
    encoder_attention_mask: torch.Tensor | None = None,
) -> torch.Tensor:
    from adaptiveload.ops import gated_residual_rms_norm_modulate, rms_norm_modulate

    x = hidden_states.contiguous()  # the ops read rows
    table = self.scale_shift_table
    ada = table[None, None].to(temb.device) + temb.reshape(
        x.size(0), temb.size(1), table.size(0), -1
    )
    shift, scale, gate, shift_ff, scale_ff, gate_ff = ada.unbind(dim=2)
    # 1. Self-attention on the modulated RMSNorm.
    x_norm = rms_norm_modulate(
        x, shift, scale, weight=self.norm1.weight, eps=self.norm1.eps, out_dtype=x.dtype
    )
    x = (
        x
        + self.attn1(
            hidden_states=x_norm, encoder_hidden_states=None, image_rotary_emb=image_rotary_emb
        )
        * gate
    )
    # 2. Cross-attention; its residual and the feed-forward's modulated norm in one pass.
    c_attn = self.attn2(
        x,
        encoder_hidden_states=encoder_hidden_states,
        image_rotary_emb=None,
        attention_mask=encoder_attention_mask,
    )
    one = x.new_ones(x.shape[-1], dtype=torch.float32)
    x, x_norm = gated_residual_rms_norm_modulate(
        x,
        c_attn,
        one,
        shift_ff,
        scale_ff,
        weight=self.norm2.weight,
        eps=self.norm2.eps,
        out_dtype=x.dtype,
    )
    return x + self.ff(x_norm) * gate_ff


def _blocks(model: nn.Module) -> list:
    try:
        from diffusers.models.transformers.transformer_ltx import LTXVideoTransformerBlock
    except ImportError as e:  # pragma: no cover - exercised only without diffusers
        raise ImportError("apply_fused_ops needs diffusers (pip install diffusers)") from e
    # isinstance: FSDP2's fully_shard swaps a block's class for a subclass of it.
    return [m for m in model.modules() if isinstance(m, LTXVideoTransformerBlock)]


def apply_fused_ops(model: nn.Module) -> nn.Module:
    """Patch every ``LTXVideoTransformerBlock`` of ``model`` in place; returns ``model``.
    ``ValueError`` if it has none; applying twice is a no-op."""
    blocks = _blocks(model)
    if not blocks:
        raise ValueError(f"apply_fused_ops: {type(model).__name__} has no LTXVideoTransformerBlock")
    patch_forwards(blocks, _fused_block_forward)
    return model


def remove_fused_ops(model: nn.Module) -> nn.Module:
    """Undo ``apply_fused_ops``: the blocks run diffusers' own forward again."""
    unpatch_forwards(_blocks(model))
    return model


def is_fused(model: nn.Module) -> bool:
    return all_patched(_blocks(model))
