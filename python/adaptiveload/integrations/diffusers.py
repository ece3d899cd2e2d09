"""Route diffusers' Wan 2.1 transformer blocks through AdaptiveLoad's fused ops.

``apply_fused_ops(model)`` rebinds ``forward`` of every ``WanTransformerBlock`` so that

- ``norm1`` + modulation          -> ``layer_norm_modulate``
- gated residual + ``norm2``      -> ``gated_residual_layer_norm_modulate`` (affine, no modulation)
- residual add + ``norm3`` + mod. -> ``gated_residual_layer_norm_modulate`` (gate 1)

keeping diffusers' numerics: statistics and modulation in fp32, the stream in its own
dtype (bf16 in training). Weights are untouched, so state dicts, checkpoints, FSDP and
gradient checkpointing see the same model. ``remove_fused_ops(model)`` undoes it. The
model's final ``norm_out`` (one per model, inline in the model's forward) is left as is.

Each block's ``forward`` becomes a ``functools.partial`` of a module-level function bound
to the block (not a bound method, which pickles as a lookup by name that fails on load),
so a patched model survives ``torch.save``/``torch.load`` and ``copy.deepcopy``.

``set_checkpointed_blocks`` and ``checkpointed_blocks`` (activation checkpointing of the first
``n`` blocks, any family) live in ``adaptiveload.models.checkpointing``; they are importable from
here too.
"""

from __future__ import annotations

import torch
from torch import nn

from adaptiveload.integrations._patch import all_patched, patch_forwards, unpatch_forwards

# Block checkpointing serves every family (adaptiveload.models.checkpointing); its names stay
# importable from here, and models pickled with its function under this module's name still load.
from adaptiveload.models.checkpointing import (
    _checkpoint_marked_block,  # noqa: F401
    checkpointed_blocks,
    set_checkpointed_blocks,
)


def _modulation(block: nn.Module, temb: torch.Tensor):
    if temb.ndim == 4:  # (B, S, 6, D): per-token modulation (Wan 2.2 TI2V)
        parts = (block.scale_shift_table.unsqueeze(0) + temb.float()).chunk(6, dim=2)
        return tuple(p.squeeze(2) for p in parts)
    # (B, 6, D): per-sample modulation (Wan 2.1); chunks are strided views, read in place.
    return (block.scale_shift_table + temb.float()).chunk(6, dim=1)


def _fused_block_forward(
    self: nn.Module,
    hidden_states: torch.Tensor,
    encoder_hidden_states: torch.Tensor,
    temb: torch.Tensor,
    rotary_emb: torch.Tensor,
) -> torch.Tensor:
    # Imported here, so that checkpointing alone does not need the op library (adaptiveload._C).
    from adaptiveload.ops import gated_residual_layer_norm_modulate, layer_norm_modulate

    shift_msa, scale_msa, gate_msa, c_shift_msa, c_scale_msa, c_gate_msa = _modulation(self, temb)
    dtype = hidden_states.dtype
    dim = hidden_states.shape[-1]

    # 1. Self-attention.
    norm_hidden_states = layer_norm_modulate(
        hidden_states, shift_msa, scale_msa, eps=self.norm1.eps, out_dtype=dtype
    )
    attn_output = self.attn1(norm_hidden_states, None, None, rotary_emb)

    # 2. Cross-attention: the gated residual and norm2 in one pass.
    if isinstance(self.norm2, nn.Identity):
        hidden_states = (hidden_states.float() + attn_output * gate_msa).type_as(hidden_states)
        norm_hidden_states = hidden_states
    else:
        zero = hidden_states.new_zeros(dim, dtype=torch.float32)
        hidden_states, norm_hidden_states = gated_residual_layer_norm_modulate(
            hidden_states,
            attn_output,
            gate_msa,
            zero,
            zero,
            weight=self.norm2.weight,
            bias=self.norm2.bias,
            eps=self.norm2.eps,
            out_dtype=dtype,
        )
    attn_output = self.attn2(norm_hidden_states, encoder_hidden_states, None, None)

    # 3. Feed-forward: the residual add and the modulated norm3 in one pass.
    one = hidden_states.new_ones(dim, dtype=torch.float32)
    hidden_states, norm_hidden_states = gated_residual_layer_norm_modulate(
        hidden_states,
        attn_output,
        one,
        c_shift_msa,
        c_scale_msa,
        eps=self.norm3.eps,
        out_dtype=dtype,
    )
    ff_output = self.ffn(norm_hidden_states)
    return (hidden_states.float() + ff_output.float() * c_gate_msa).type_as(hidden_states)


def _wan_blocks(model: nn.Module):
    try:
        from diffusers.models.transformers.transformer_wan import WanTransformerBlock
    except ImportError as e:  # pragma: no cover - exercised only without diffusers
        raise ImportError(
            "apply_fused_ops needs diffusers (pip install 'adaptiveload[wan]')"
        ) from e
    return [m for m in model.modules() if isinstance(m, WanTransformerBlock)]


def apply_fused_ops(model: nn.Module) -> nn.Module:
    """Patch every ``WanTransformerBlock`` of ``model`` in place; returns ``model``.
    Raises ``ValueError`` if the model has no Wan blocks. Applying twice is a no-op."""
    blocks = _wan_blocks(model)
    if not blocks:
        raise ValueError(f"apply_fused_ops: {type(model).__name__} has no WanTransformerBlock")
    patch_forwards(blocks, _fused_block_forward)
    return model


def remove_fused_ops(model: nn.Module) -> nn.Module:
    """Undo ``apply_fused_ops``: the blocks run diffusers' own forward again."""
    unpatch_forwards(_wan_blocks(model))
    return model


def is_fused(model: nn.Module) -> bool:
    return all_patched(_wan_blocks(model))


__all__ = [
    "apply_fused_ops",
    "checkpointed_blocks",
    "is_fused",
    "remove_fused_ops",
    "set_checkpointed_blocks",
]
