"""Route diffusers' HunyuanVideo blocks through AdaptiveLoad's fused ops.

``apply_fused_ops(model)`` rebinds ``forward`` of every dual-stream block
(``HunyuanVideoTransformerBlock``, and HunyuanVideo 1.5's ``HunyuanVideo15TransformerBlock``,
whose structure is the same) and single-stream block
(``HunyuanVideoSingleTransformerBlock``), for the video and the text stream alike:

- ``norm1`` / ``norm1_context`` (``AdaLayerNormZero``: LayerNorm without affine, then
  ``x * (1 + scale) + shift``)                            -> ``layer_norm_modulate``
- gated attention residual + ``norm2`` + modulation      -> ``gated_residual_layer_norm_modulate``
- the single-stream block's ``AdaLayerNormZeroSingle``   -> ``layer_norm_modulate``

Statistics and modulation run in fp32, the stream stays in its dtype. Weights are
untouched (state dicts, checkpoints, FSDP see the same model); ``remove_fused_ops`` undoes
it. The token-replace blocks (image-to-video) and the text refiner keep diffusers' forward.
"""

from __future__ import annotations

import torch
from torch import nn

from adaptiveload.integrations._patch import all_patched, patch_forwards, unpatch_forwards


def _chunks(norm: nn.Module, temb: torch.Tensor, n: int):
    """An ``AdaLayerNormZero(-Single)``'s modulation: its linear on ``silu(temb)``, in ``n``
    chunks of shape (B, 1, D) (strided views, read in place by the ops)."""
    return tuple(c[:, None] for c in norm.linear(norm.silu(temb)).chunk(n, dim=1))


def _fused_dual_forward(
    self: nn.Module,
    hidden_states: torch.Tensor,
    encoder_hidden_states: torch.Tensor,
    temb: torch.Tensor,
    attention_mask: torch.Tensor | None = None,
    freqs_cis=None,
    *args,
    **kwargs,
):
    from adaptiveload.ops import gated_residual_layer_norm_modulate, layer_norm_modulate

    shift, scale, gate, shift_ff, scale_ff, gate_ff = _chunks(self.norm1, temb, 6)
    c_shift, c_scale, c_gate, c_shift_ff, c_scale_ff, c_gate_ff = _chunks(
        self.norm1_context, temb, 6
    )
    # The model's first block gets the patch embedding's transposed view: the ops read rows.
    x, c = hidden_states.contiguous(), encoder_hidden_states.contiguous()
    # 1. Both streams normalized and modulated, then joint attention.
    x_norm = layer_norm_modulate(x, shift, scale, eps=self.norm1.norm.eps, out_dtype=x.dtype)
    c_norm = layer_norm_modulate(
        c, c_shift, c_scale, eps=self.norm1_context.norm.eps, out_dtype=c.dtype
    )
    x_attn, c_attn = self.attn(
        hidden_states=x_norm,
        encoder_hidden_states=c_norm,
        attention_mask=attention_mask,
        image_rotary_emb=freqs_cis,
    )
    # 2. The gated residual and the feed-forward's modulated norm, one pass per stream.
    x, x_norm = gated_residual_layer_norm_modulate(
        x, x_attn, gate, shift_ff, scale_ff, eps=self.norm2.eps, out_dtype=x.dtype
    )
    c, c_norm = gated_residual_layer_norm_modulate(
        c, c_attn, c_gate, c_shift_ff, c_scale_ff, eps=self.norm2_context.eps, out_dtype=c.dtype
    )
    # 3. Feed-forward and its gated residual.
    x = x + gate_ff * self.ff(x_norm)
    c = c + c_gate_ff * self.ff_context(c_norm)
    return x, c


def _fused_single_forward(
    self: nn.Module,
    hidden_states: torch.Tensor,
    encoder_hidden_states: torch.Tensor,
    temb: torch.Tensor,
    attention_mask: torch.Tensor | None = None,
    image_rotary_emb=None,
    *args,
    **kwargs,
):
    from adaptiveload.ops import layer_norm_modulate

    text = encoder_hidden_states.shape[1]
    joint = torch.cat([hidden_states, encoder_hidden_states], dim=1)
    shift, scale, gate = _chunks(self.norm, temb, 3)
    normed = layer_norm_modulate(joint, shift, scale, eps=self.norm.norm.eps, out_dtype=joint.dtype)
    mlp = self.act_mlp(self.proj_mlp(normed))
    x_attn, c_attn = self.attn(
        hidden_states=normed[:, :-text],
        encoder_hidden_states=normed[:, -text:],
        attention_mask=attention_mask,
        image_rotary_emb=image_rotary_emb,
    )
    out = self.proj_out(torch.cat([torch.cat([x_attn, c_attn], dim=1), mlp], dim=2))
    joint = joint + gate * out
    return joint[:, :-text], joint[:, -text:]


def _dual_classes() -> tuple:
    """HunyuanVideo 1.0's dual-stream block and 1.5's (the same structure and attribute names),
    where this diffusers has it."""
    from diffusers.models.transformers.transformer_hunyuan_video import (
        HunyuanVideoTransformerBlock,
    )

    classes = [HunyuanVideoTransformerBlock]
    try:
        from diffusers.models.transformers.transformer_hunyuan_video15 import (
            HunyuanVideo15TransformerBlock,
        )

        classes.append(HunyuanVideo15TransformerBlock)
    except ImportError:  # a diffusers before HunyuanVideo 1.5
        pass
    return tuple(classes)


def _blocks(model: nn.Module) -> tuple[list, list]:
    try:
        from diffusers.models.transformers.transformer_hunyuan_video import (
            HunyuanVideoSingleTransformerBlock,
        )
    except ImportError as e:  # pragma: no cover - exercised only without diffusers
        raise ImportError("apply_fused_ops needs diffusers (pip install diffusers)") from e
    dual_classes = _dual_classes()
    # isinstance: FSDP2's fully_shard swaps a block's class for a subclass of it. (The
    # token-replace blocks, whose forwards take other arguments, are classes of their own.)
    dual = [m for m in model.modules() if isinstance(m, dual_classes)]
    single = [m for m in model.modules() if isinstance(m, HunyuanVideoSingleTransformerBlock)]
    return dual, single


def apply_fused_ops(model: nn.Module) -> nn.Module:
    """Patch every HunyuanVideo dual- and single-stream block of ``model`` in place; returns
    ``model``. ``ValueError`` if it has none; applying twice is a no-op."""
    dual, single = _blocks(model)
    if not dual and not single:
        raise ValueError(f"apply_fused_ops: {type(model).__name__} has no HunyuanVideo block")
    patch_forwards(dual, _fused_dual_forward)
    patch_forwards(single, _fused_single_forward)
    return model


def remove_fused_ops(model: nn.Module) -> nn.Module:
    """Undo ``apply_fused_ops``: the blocks run diffusers' own forward again."""
    dual, single = _blocks(model)
    unpatch_forwards(dual + single)
    return model


def is_fused(model: nn.Module) -> bool:
    dual, single = _blocks(model)
    return all_patched(dual + single)
