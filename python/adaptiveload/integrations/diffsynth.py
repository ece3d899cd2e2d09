"""Route DiffSynth-Studio's Wan transformer blocks through AdaptiveLoad's fused ops.

DiffSynth-Studio keeps the official Wan structure (``diffsynth.models.wan_video_dit``): each
``DiTBlock`` runs, with ``e = modulation + t_mod`` chunked into six,

    x = x + gate_msa * self_attn(modulate(norm1(x), shift_msa, scale_msa))
    x = x + cross_attn(norm3(x), context)                 # norm3 affine, no modulation
    x = x + gate_mlp * ffn(modulate(norm2(x), shift_mlp, scale_mlp))

``apply_fused_ops(model)`` rebinds ``forward`` of every such block so that

- ``norm1`` + modulation                -> ``layer_norm_modulate``
- gated residual + ``norm3`` (affine)   -> ``gated_residual_layer_norm_modulate``, shift = scale = 0
- ungated residual + ``norm2`` + mod.   -> ``gated_residual_layer_norm_modulate``, gate = 1

and leaves the last gated residual to the block's own ``GateModule``. Each fused step is the
reference's computation with the intermediate roundings removed: statistics and modulation in
fp32, results rounded once to the stream's dtype. ``modulation + t_mod`` is formed as
DiffSynth forms it (in ``t_mod``'s dtype), so the shift, scale and gate values are the
reference's. Weights are untouched: state dicts, checkpoints, FSDP and gradient checkpointing
see the same model. ``remove_fused_ops(model)`` undoes it.

Not fused: the model's ``Head`` (one norm per model) and subclasses of ``DiTBlock`` that
define their own ``forward`` (VACE, S2V, MoT blocks), which keep DiffSynth's code.

Each block's ``forward`` becomes a ``functools.partial`` of a module-level function bound to
the block, so a patched model survives ``torch.save``/``torch.load`` and ``copy.deepcopy``.
"""

from __future__ import annotations

import torch
from torch import nn

from adaptiveload.integrations._patch import all_patched, patch_forwards, unpatch_forwards
from adaptiveload.ops import gated_residual_layer_norm_modulate, layer_norm_modulate

__all__ = ["apply_fused_ops", "remove_fused_ops", "is_fused"]

_INSTALL = "pip install diffsynth (tested with diffsynth==2.1.12)"


def _modulation(block: nn.Module, t_mod: torch.Tensor, x: torch.Tensor):
    """The six (shift, scale, gate) tensors of ``block`` as DiffSynth computes them."""
    e = block.modulation.to(dtype=t_mod.dtype, device=t_mod.device) + t_mod
    if e.dtype not in (torch.float32, x.dtype):
        e = e.float()  # what type promotion does in the reference; the ops take fp32 or x's dtype
    if t_mod.ndim == 4:  # (B, S, 6, D): per-token modulation (Wan 2.2 TI2V, seperated_timestep)
        return tuple(p.squeeze(2) for p in e.chunk(6, dim=2))
    # (B, 6, D): per sample; the chunks are (B, 1, D) strided views, read in place.
    return e.chunk(6, dim=1)


def _fused_block_forward(
    self: nn.Module,
    x: torch.Tensor,
    context: torch.Tensor,
    t_mod: torch.Tensor,
    freqs: torch.Tensor,
) -> torch.Tensor:
    shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp = _modulation(self, t_mod, x)
    x = x.contiguous()
    dtype = x.dtype
    dim = x.shape[-1]

    # 1. Self-attention: norm1 and its modulation in one pass.
    input_x = layer_norm_modulate(
        x,
        shift_msa,
        scale_msa,
        weight=self.norm1.weight,
        bias=self.norm1.bias,
        eps=self.norm1.eps,
        out_dtype=dtype,
    )
    attn_out = self.self_attn(input_x, freqs)

    # 2. Cross-attention: the gated residual and norm3 (affine, not modulated) in one pass.
    zero = x.new_zeros(dim, dtype=torch.float32)
    x, norm_x = gated_residual_layer_norm_modulate(
        x,
        attn_out,
        gate_msa,
        zero,
        zero,
        weight=self.norm3.weight,
        bias=self.norm3.bias,
        eps=self.norm3.eps,
        out_dtype=dtype,
    )
    cross_out = self.cross_attn(norm_x, context)

    # 3. Feed-forward: the ungated residual (gate 1, exact) and the modulated norm2 in one pass.
    one = x.new_ones(dim, dtype=torch.float32)
    x, input_x = gated_residual_layer_norm_modulate(
        x,
        cross_out,
        one,
        shift_mlp,
        scale_mlp,
        weight=self.norm2.weight,
        bias=self.norm2.bias,
        eps=self.norm2.eps,
        out_dtype=dtype,
    )
    return self.gate(x, gate_mlp, self.ffn(input_x))


def _dit_blocks(model: nn.Module) -> list[nn.Module]:
    """The blocks of ``model`` that run ``DiTBlock.forward`` itself."""
    try:
        from diffsynth.models.wan_video_dit import DiTBlock
    except ImportError as e:
        raise ImportError(
            f"adaptiveload.integrations.diffsynth needs DiffSynth-Studio: {_INSTALL}"
        ) from e
    # Subclasses with a forward of their own (VACE, S2V, MoT) would lose it if patched.
    return [
        m
        for m in model.modules()
        if isinstance(m, DiTBlock) and type(m).forward is DiTBlock.forward
    ]


def apply_fused_ops(model: nn.Module) -> nn.Module:
    """Patch every DiffSynth ``DiTBlock`` of ``model`` (a ``WanModel`` or any module holding
    its blocks) in place; returns ``model``. Raises ``ValueError`` if there is none.
    Applying twice is a no-op."""
    blocks = _dit_blocks(model)
    if not blocks:
        raise ValueError(
            f"apply_fused_ops: {type(model).__name__} has no DiffSynth DiTBlock "
            "(diffsynth.models.wan_video_dit) running DiTBlock.forward"
        )
    patch_forwards(blocks, _fused_block_forward)
    return model


def remove_fused_ops(model: nn.Module) -> nn.Module:
    """Undo ``apply_fused_ops``: the blocks run DiffSynth's own forward again."""
    unpatch_forwards(_dit_blocks(model))
    return model


def is_fused(model: nn.Module) -> bool:
    """Whether ``model`` has DiffSynth blocks and all of them are patched."""
    return all_patched(_dit_blocks(model))
