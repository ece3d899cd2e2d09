"""Activation checkpointing of the first ``n`` blocks of a model of any family, chosen per
micro-batch (the memory policy of docs/memory.md).

``set_checkpointed_blocks(model, n)`` marks the first ``n`` of the model's blocks (the family's
``blocks``, in order) to run under ``torch.utils.checkpoint`` in training; ``checkpointed_blocks``
reads ``n`` back. It works through diffusers' own block loop and its public
``enable_gradient_checkpointing``, so it serves every family of ``adaptiveload.models`` and
needs no fused patch (nor the op library).
"""

from __future__ import annotations

import operator

import torch
import torch.utils.checkpoint
from torch import nn

from adaptiveload.models import family_for

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
    its single-stream ones), ``LTXVideoTransformer3DModel``, ...), or a module holding one. Call
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
    root, blocks = _checkpointed_model(model)
    if n is None:
        if _PRIOR in root.__dict__:
            # diffusers' public switches: its own checkpointing of every block, or none.
            if root.__dict__.pop(_PRIOR):
                root.enable_gradient_checkpointing()
            else:
                root.disable_gradient_checkpointing()
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
    if _PRIOR not in root.__dict__ or not root.gradient_checkpointing:
        root.__dict__.setdefault(_PRIOR, bool(root.gradient_checkpointing))
        root.enable_gradient_checkpointing(_checkpoint_marked_block)
    # Plain attributes, set without nn.Module.__setattr__'s parameter/buffer/module checks.
    for i, block in enumerate(blocks):
        block.__dict__[_CHECKPOINT_MARK] = i < count
    return model


def checkpointed_blocks(model: nn.Module) -> int:
    """How many blocks run under activation checkpointing in training: the ``n`` of the last
    ``set_checkpointed_blocks``, or, without one, ``L`` or ``0`` as diffusers'
    ``gradient_checkpointing`` says."""
    root, blocks = _checkpointed_model(model)
    if not root.gradient_checkpointing:
        return 0
    if _PRIOR not in root.__dict__:
        return len(blocks)
    return sum(bool(getattr(b, _CHECKPOINT_MARK, False)) for b in blocks)


__all__ = ["checkpointed_blocks", "set_checkpointed_blocks"]
