"""The split of Wan (diffusers' ``WanTransformer3DModel``): before each block, the member's
tokens and rotary table; Ulysses self-attention in place of Wan's processor (q/k norms and the
rotary embedding on the shard); cross-attention to the text on head shards where the samples
are short beside the text (each member projects the text's keys and values for its own heads),
else on the shard; after ``proj_out``, the gather."""

from __future__ import annotations

import torch
from torch import nn

from adaptiveload.parallel.groups import layout
from adaptiveload.parallel.token_split import TokenSplit, check_heads, check_unfused_projections


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Wan's rotary embedding on ``(B, S, H, D)``: pairs (even, odd) of the last dim."""
    even, odd = x.unflatten(-1, (-1, 2)).unbind(-1)
    c, s = cos[..., 0::2], sin[..., 1::2]
    return torch.stack((even * c - odd * s, even * s + odd * c), dim=-1).flatten(-2).type_as(x)


def check(model: nn.Module, degree: int) -> None:
    check_unfused_projections(block.attn1 for block in model.blocks)
    check_heads(model.blocks[0].attn1.heads, degree)


class _Processor:
    """Wan's own self-attention processor, or Ulysses in a split forward."""

    def __init__(self, split: TokenSplit, plain):
        self.split, self.plain = split, plain

    # Named arguments, not *args/**kwargs: diffusers' Attention passes a processor only the
    # keyword arguments its __call__ names (it drops the rotary table otherwise).
    def __call__(
        self,
        attn,
        hidden_states,
        encoder_hidden_states=None,
        attention_mask=None,
        rotary_emb=None,
        **kwargs,
    ):
        if self.split.current is None:
            return self.plain(
                attn, hidden_states, encoder_hidden_states, attention_mask, rotary_emb, **kwargs
            )
        if encoder_hidden_states is not None or attention_mask is not None:
            raise NotImplementedError("split_sequence: self-attention without a mask only")
        q = attn.norm_q(attn.to_q(hidden_states)).unflatten(2, (attn.heads, -1))
        k = attn.norm_k(attn.to_k(hidden_states)).unflatten(2, (attn.heads, -1))
        v = attn.to_v(hidden_states).unflatten(2, (attn.heads, -1))
        if rotary_emb is not None:
            q, k = _rotate(q, *rotary_emb), _rotate(k, *rotary_emb)
        out = self.split.attend(q, k, v).flatten(2, 3).type_as(q)
        return attn.to_out[1](attn.to_out[0](out))


#: Cross-attention runs on head shards over Ulysses groups of at least HEAD_SHARDS_FROM_DEGREE
#: ranks (``groups.layout``: the degree itself where it divides the heads)
#: where a sample holds at most HEAD_SHARDS_UP_TO_TOKENS_PER_TEXT_TOKEN tokens per text token
#: (8,192 for Wan's 512), else on the token shard. On head shards each member projects the
#: text for its own heads only, but its queries and output cross the group (2 all-to-alls more)
#: and attention runs over all the sample's tokens: that pays for short samples over many ranks
#: and costs a little for long ones (benchmarks/bench_split_share.py, RESULTS.md). Before the
#: all-to-alls.
HEAD_SHARDS_UP_TO_TOKENS_PER_TEXT_TOKEN = 16
HEAD_SHARDS_FROM_DEGREE = 4


def cross_attention_on_head_shards(seq_len: int, text_len: int, ulysses: int) -> bool:
    """Whether a micro-batch of samples of ``seq_len`` tokens and ``text_len`` text tokens,
    split over a Ulysses degree of ``ulysses`` (``groups.layout(degree, heads)[0]``: the degree
    where it divides the heads), runs its cross-attention on head shards (the table above):
    each member projects the text for ``heads / ulysses`` heads. The replay prices its
    all-to-alls by the same rule."""
    return (
        ulysses >= HEAD_SHARDS_FROM_DEGREE
        and seq_len <= HEAD_SHARDS_UP_TO_TOKENS_PER_TEXT_TOKEN * text_len
    )


class _CrossProcessor:
    """Wan's own cross-attention processor, on the member's token shard, or, in a split
    forward whose samples are short beside the text (``cross_attention_on_head_shards``),
    cross-attention on head shards: the member's queries go to its heads of all the sample's
    tokens, and it projects the text's keys and values for those heads only. On the token shard
    every member projects the whole text for every head, B x 512 text tokens x 2 x hidden^2 per
    block whatever d is, which weighs most where many short samples share a micro-batch.
    Image-to-video (the image's keys and values, and its context length fixed at 512 text
    tokens by diffusers), fused projections and a mask keep the token shard."""

    def __init__(self, split: TokenSplit, plain):
        self.split, self.plain = split, plain

    def __call__(
        self,
        attn,
        hidden_states,
        encoder_hidden_states=None,
        attention_mask=None,
        rotary_emb=None,
        **kwargs,
    ):
        plain = (
            self.split.current is None
            or attention_mask is not None
            or attn.add_k_proj is not None
            or getattr(attn, "fused_projections", False)
            or not isinstance(attn.norm_k, (nn.RMSNorm, nn.Identity))
            or not self.split.heads_for_text(encoder_hidden_states.shape[1], attn.heads)
        )
        if plain:
            return self.plain(
                attn, hidden_states, encoder_hidden_states, attention_mask, rotary_emb, **kwargs
            )
        q = attn.norm_q(attn.to_q(hidden_states)).unflatten(2, (attn.heads, -1))
        k = self.split.own_heads(attn.to_k, encoder_hidden_states, attn.heads)
        if isinstance(attn.norm_k, nn.RMSNorm):
            k = self.split.norm_own_heads(attn.norm_k, k, attn.heads)
        v = self.split.own_heads(attn.to_v, encoder_hidden_states, attn.heads)
        out = self.split.cross_attend(q, [(k, v)]).flatten(2, 3).type_as(q)
        return attn.to_out[1](attn.to_out[0](out))


class _Split(TokenSplit):
    def before_block(self, module, args):
        if self.current is None:
            return None
        hidden, text, temb, rope = args
        f = self.see_tokens(hidden, text, temb)
        if temb.ndim == 4 and temb.shape[1] == f.full:
            raise NotImplementedError("split_sequence: per-token timesteps are not supported")
        if rope is not None:
            rope = (self.share(rope[0]), self.share(rope[1]))
        return self.share_hidden(hidden), text, temb, rope

    def heads_for_text(self, text_len: int, heads: int) -> bool:
        """Whether this forward runs cross-attention over ``text_len`` text tokens on head
        shards (``cross_attention_on_head_shards``, for the Ulysses degree over ``heads``)."""
        f = self.current
        return cross_attention_on_head_shards(f.full, text_len, layout(f.degree, heads)[0])


def install(model: nn.Module) -> TokenSplit:
    split = _Split()
    model.register_forward_pre_hook(split.before_forward, with_kwargs=True)
    for block in model.blocks:
        block.attn1.processor = _Processor(split, block.attn1.processor)
        block.attn2.processor = _CrossProcessor(split, block.attn2.processor)
        block.register_forward_pre_hook(split.before_block)
    model.proj_out.register_forward_hook(split.after_output)
    return split
