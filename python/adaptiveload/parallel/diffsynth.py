"""The split of DiffSynth-Studio's Wan (``diffsynth.models.wan_video_dit.WanModel``, run by
``WanModel.forward`` or by the pipeline's ``model_fn_wan_video``): before each ``DiTBlock``,
the member's tokens and rotary table; in each self-attention, the attention of q, k and v
(normed and rotated on the shard by DiffSynth's own code) becomes Ulysses attention; after the
``head``, the gather. Cross-attention to the text runs as in diffusers' Wan
(``parallel.wan``): on head shards where the samples are short beside the text, each member
projecting the text's keys and values for its own heads, else (and for image-to-video) on the
token shard. DiffSynth's own
sequence parallelism (``use_unified_sequence_parallel``, xDiT's fixed group) stays off."""

from __future__ import annotations

import functools

from torch import nn

from adaptiveload.parallel.groups import layout
from adaptiveload.parallel.token_split import TokenSplit, check_heads
from adaptiveload.parallel.wan import cross_attention_on_head_shards


def _blocks(model: nn.Module) -> list:
    return [b for b in model.blocks if hasattr(b, "self_attn")]


def check(model: nn.Module, degree: int) -> None:
    blocks = _blocks(model)
    if len(blocks) != len(model.blocks):
        raise NotImplementedError("split_sequence: DiffSynth blocks without self_attn")
    check_heads(blocks[0].self_attn.num_heads, degree)


def _attention(module: nn.Module, split: TokenSplit, q, k, v):
    """DiffSynth's ``AttentionModule.forward`` (``(B, s, H * D)`` in and out), or Ulysses
    in a split forward."""
    if split.current is None:
        return type(module).forward(module, q, k, v)
    q, k, v = (t.unflatten(2, (module.num_heads, -1)) for t in (q, k, v))
    return split.attend(q, k, v).flatten(2, 3).type_as(q)


def _cross_attention(module: nn.Module, split: TokenSplit, x, y):
    """DiffSynth's ``CrossAttention.forward``, or, in a split forward, on head shards."""
    heads = module.num_heads
    if (
        split.current is None
        or module.has_image_input
        or not split.heads_for_text(y.shape[1], heads)
    ):
        return type(module).forward(module, x, y)
    q = module.norm_q(module.q(x)).unflatten(2, (heads, -1))
    k = split.norm_own_heads(module.norm_k, split.own_heads(module.k, y, heads), heads)
    v = split.own_heads(module.v, y, heads)
    return module.o(split.cross_attend(q, [(k, v)]).flatten(2, 3).type_as(q))


class _Split(TokenSplit):
    def before_block(self, module, args):
        if self.current is None:
            return None
        x, context, t_mod, freqs, *rest = args
        self.see_tokens(x, context, t_mod)
        if t_mod.ndim == 4:
            raise NotImplementedError("split_sequence: per-token timesteps are not supported")
        return (self.share_hidden(x), context, t_mod, self.share(freqs, dim=0), *rest)

    def heads_for_text(self, text_len: int, heads: int) -> bool:
        """Whether this forward runs cross-attention on head shards (``parallel.wan``)."""
        f = self.current
        return cross_attention_on_head_shards(f.full, text_len, layout(f.degree, heads)[0])


def install(model: nn.Module) -> TokenSplit:
    split = _Split()
    # model_fn_wan_video runs the DiT's parts, not its forward: a forward starts at patchify.
    model.patch_embedding.register_forward_pre_hook(split.before_forward, with_kwargs=True)
    for block in _blocks(model):
        attn = block.self_attn.attn
        # An instance attribute, as the fused-op patch binds forwards: survives deepcopy.
        attn.forward = functools.partial(_attention, attn, split)
        cross = block.cross_attn
        cross.forward = functools.partial(_cross_attention, cross, split)
        block.register_forward_pre_hook(split.before_block)
    model.head.register_forward_hook(split.after_output)
    return split
