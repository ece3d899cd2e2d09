"""The split of DiffSynth-Studio's Wan (``diffsynth.models.wan_video_dit.WanModel``, run by
``WanModel.forward`` or by the pipeline's ``model_fn_wan_video``): before each ``DiTBlock``,
the member's tokens and rotary table; in each self-attention, the attention of q, k and v
(normed and rotated on the shard by DiffSynth's own code) becomes Ulysses attention; after the
``head``, the gather. Cross-attention to the text runs on the shard as it is. DiffSynth's own
sequence parallelism (``use_unified_sequence_parallel``, xDiT's fixed group) stays off."""

from __future__ import annotations

import functools

from torch import nn

from adaptiveload.parallel.split import TokenSplit, check_heads


def _blocks(model: nn.Module) -> list:
    return [b for b in model.blocks if hasattr(b, "self_attn")]


def check(model: nn.Module, degree: int) -> None:
    blocks = _blocks(model)
    if len(blocks) != len(model.blocks):
        raise NotImplementedError("split_sequence: DiffSynth blocks without self_attn")
    check_heads(blocks[0].self_attn.num_heads, degree)


def _attention(module: nn.Module, split: TokenSplit, q, k, v):
    """DiffSynth's ``AttentionModule.forward`` (``(B, s, H * D)`` in and out), or Ulysses
    while a split is in force."""
    if split.current is None:
        return type(module).forward(module, q, k, v)
    q, k, v = (t.unflatten(2, (module.num_heads, -1)) for t in (q, k, v))
    return split.attend(q, k, v).flatten(2, 3).type_as(q)


def install(model: nn.Module) -> TokenSplit:
    split = TokenSplit()

    def before_block(module, args):
        if split.current is None:
            return None
        x, context, t_mod, freqs, *rest = args
        split.see_tokens(x.shape[1])
        if t_mod.ndim == 4:
            raise NotImplementedError("split_sequence: per-token timesteps are not supported")
        return (split.share(x, contiguous=True), context, t_mod, split.share(freqs, dim=0), *rest)

    def after_head(module, args, out):
        return None if split.current is None else split.gather(out)

    for block in _blocks(model):
        attn = block.self_attn.attn
        # An instance attribute, as the fused-op patch binds forwards: survives deepcopy.
        attn.forward = functools.partial(_attention, attn, split)
        block.register_forward_pre_hook(before_block)
    model.head.register_forward_hook(after_head)
    return split
