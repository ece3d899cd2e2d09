"""Rebinding ``forward`` of model blocks, shared by the diffusers and DiffSynth integrations.

A patched block's ``forward`` is a ``functools.partial`` of a module-level function bound to
the block (not a bound method, which pickles as a lookup by name that fails on load), so a
patched model survives ``torch.save``/``torch.load`` and ``copy.deepcopy``; a mark attribute
says the block is patched. Removing the instance attribute gives the class's forward back.
"""

from __future__ import annotations

import functools

from torch import nn

MARK = "_adaptiveload_fused"


def patch_forwards(blocks: list[nn.Module], forward) -> None:
    """``block.forward = partial(forward, block)`` for each block not yet patched."""
    for block in blocks:
        if not getattr(block, MARK, False):
            block.forward = functools.partial(forward, block)
            setattr(block, MARK, True)


def unpatch_forwards(blocks: list[nn.Module]) -> None:
    """Undo ``patch_forwards``: the blocks run their class's forward again."""
    for block in blocks:
        if getattr(block, MARK, False):
            del block.forward
            delattr(block, MARK)


def all_patched(blocks: list[nn.Module]) -> bool:
    """Whether there are blocks and every one is patched."""
    return bool(blocks) and all(getattr(b, MARK, False) for b in blocks)
