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

``set_checkpointed_blocks(model, n)`` chooses, per micro-batch, how many blocks run under
activation checkpointing: the first ``n`` of the model's blocks, in training only (any family of
``adaptiveload.models``).
"""

from __future__ import annotations

import operator

import torch
import torch.utils.checkpoint
from torch import nn

from adaptiveload.integrations._patch import all_patched, patch_forwards, unpatch_forwards


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


# -- activation checkpointing of the first n blocks ----------------------------------------------

_CHECKPOINT_MARK = "_adaptiveload_checkpointed"
_PRIOR = "_adaptiveload_prior_checkpointing"


def _checkpoint_marked_block(block: nn.Module, *args):
    """The model's checkpointing function (``enable_gradient_checkpointing``'s argument):
    diffusers calls it for every block when grad is enabled and ``gradient_checkpointing`` is
    set; it checkpoints the marked ones."""
    if getattr(block, _CHECKPOINT_MARK, False):
        return torch.utils.checkpoint.checkpoint(block, *args, use_reentrant=False)
    return block(*args)


def _checkpointed_model(model: nn.Module) -> tuple[nn.Module, list]:
    """The diffusers video transformer of ``model`` (itself, in a DDP wrapper's ``module``,
    or its one submodule of a known family) and its blocks in order."""
    try:
        import diffusers  # noqa: F401
    except ImportError as e:  # pragma: no cover - exercised only without diffusers
        raise ImportError("set_checkpointed_blocks needs diffusers (pip install diffusers)") from e
    from adaptiveload.models import family_for

    try:
        family, root = family_for(model)
    except ValueError as e:
        raise ValueError(f"set_checkpointed_blocks: {e}") from None
    return root, family.blocks(root)


def set_checkpointed_blocks(model: nn.Module, n: int | None) -> nn.Module:
    """From now on the first ``n`` blocks of the model run under activation
    checkpointing (``torch.utils.checkpoint``, non-reentrant) when grad is enabled, the
    other ``L - n`` without; ``n = 0`` checkpoints none, ``n = L`` all. Returns ``model``.

    ``model`` is a diffusers video transformer of a family ``adaptiveload.models`` knows
    (``WanTransformer3DModel``, ``HunyuanVideoTransformer3DModel`` (its dual-stream blocks, then
    its single-stream ones), ``LTXVideoTransformer3DModel``), or a module holding one. Call
    it before each micro-batch's forward with that micro-batch's ``n``; a call sets ``L``
    flags and wraps nothing. The model keeps diffusers' block loop: the first call gives
    diffusers' public ``enable_gradient_checkpointing`` a function that checkpoints the marked
    blocks, so state dicts, FSDP2 (``fully_shard`` per block) and ``apply_fused_ops`` are
    unaffected, and the model survives ``torch.save``/``torch.load`` and deepcopy. The policy
    owns the model's checkpointing until ``n = None``: calling ``enable_gradient_checkpointing``
    meanwhile replaces it (every block checkpointed).

    ``n = None`` removes the policy and restores the model's setting before the first call
    through diffusers' public switches: its checkpointing of every block (diffusers' default
    function: a custom one the model had cannot be read back) or none. Raises ``ValueError``
    for ``n`` outside ``[0, L]``.
    """
    wan, blocks = _checkpointed_model(model)
    if n is None:
        if _PRIOR in wan.__dict__:
            # diffusers' public switches: its own checkpointing of every block, or none.
            if wan.__dict__.pop(_PRIOR):
                wan.enable_gradient_checkpointing()
            else:
                wan.disable_gradient_checkpointing()
        for block in blocks:
            block.__dict__.pop(_CHECKPOINT_MARK, None)
        return model
    try:
        count = None if isinstance(n, bool) else operator.index(n)
    except TypeError:
        count = None
    if count is None or not 0 <= count <= len(blocks):
        raise ValueError(
            f"set_checkpointed_blocks: n = {n!r} must be an integer in [0, L], L = {len(blocks)}"
        )
    if _PRIOR not in wan.__dict__ or not wan.gradient_checkpointing:
        wan.__dict__.setdefault(_PRIOR, bool(wan.gradient_checkpointing))
        wan.enable_gradient_checkpointing(_checkpoint_marked_block)
    # Plain attributes, set without nn.Module.__setattr__'s parameter/buffer/module checks.
    for i, block in enumerate(blocks):
        block.__dict__[_CHECKPOINT_MARK] = i < count
    return model


def checkpointed_blocks(model: nn.Module) -> int:
    """How many blocks run under activation checkpointing in training: the ``n`` of the last
    ``set_checkpointed_blocks``, or, without one, ``L`` or ``0`` as diffusers'
    ``gradient_checkpointing`` says."""
    wan, blocks = _checkpointed_model(model)
    if not wan.gradient_checkpointing:
        return 0
    if _PRIOR not in wan.__dict__:
        return len(blocks)
    return sum(bool(getattr(b, _CHECKPOINT_MARK, False)) for b in blocks)
