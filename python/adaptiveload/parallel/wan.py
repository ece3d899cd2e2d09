"""The split of Wan (diffusers' ``WanTransformer3DModel``): before each block, the member's
tokens and rotary table; Ulysses self-attention in place of Wan's processor (q/k norms and the
rotary embedding on the shard); after ``proj_out``, the gather. Cross-attention to the text
runs on the shard as it is."""

from __future__ import annotations

import torch
from torch import nn

from adaptiveload.parallel.split import TokenSplit, check_heads, check_unfused_projections


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Wan's rotary embedding on ``(B, S, H, D)``: pairs (even, odd) of the last dim."""
    even, odd = x.unflatten(-1, (-1, 2)).unbind(-1)
    c, s = cos[..., 0::2], sin[..., 1::2]
    return torch.stack((even * c - odd * s, even * s + odd * c), dim=-1).flatten(-2).type_as(x)


def check(model: nn.Module, degree: int) -> None:
    check_unfused_projections(block.attn1 for block in model.blocks)
    check_heads(model.blocks[0].attn1.heads, degree)


class _Processor:
    """Wan's own self-attention processor, or Ulysses while a split is in force."""

    def __init__(self, split: TokenSplit, plain):
        self.split, self.plain = split, plain

    # Named arguments, not *args/**kwargs: diffusers' Attention passes a processor only the
    # keyword arguments its __call__ names (it drops the rotary table otherwise).
    def __call__(self, attn, hidden_states, encoder_hidden_states=None, attention_mask=None,
                 rotary_emb=None, **kwargs):  # fmt: skip
        if self.split.current is None:
            return self.plain(attn, hidden_states, encoder_hidden_states, attention_mask,
                              rotary_emb, **kwargs)  # fmt: skip
        if encoder_hidden_states is not None or attention_mask is not None:
            raise NotImplementedError("split_sequence: self-attention without a mask only")
        q = attn.norm_q(attn.to_q(hidden_states)).unflatten(2, (attn.heads, -1))
        k = attn.norm_k(attn.to_k(hidden_states)).unflatten(2, (attn.heads, -1))
        v = attn.to_v(hidden_states).unflatten(2, (attn.heads, -1))
        if rotary_emb is not None:
            q, k = _rotate(q, *rotary_emb), _rotate(k, *rotary_emb)
        out = self.split.attend(q, k, v).flatten(2, 3).type_as(q)
        return attn.to_out[1](attn.to_out[0](out))


class _Split(TokenSplit):
    def before_block(self, module, args):
        if self.current is None:
            return None
        hidden, text, temb, rope = args
        self.see_tokens(hidden.shape[1])
        if temb.ndim == 4 and temb.shape[1] == self.full:
            raise NotImplementedError("split_sequence: per-token timesteps are not supported")
        if rope is not None:
            rope = (self.share(rope[0]), self.share(rope[1]))
        return self.share(hidden, contiguous=True), text, temb, rope


def install(model: nn.Module) -> TokenSplit:
    split = _Split()
    for block in model.blocks:
        block.attn1.processor = _Processor(split, block.attn1.processor)
        block.register_forward_pre_hook(split.before_block)
    model.proj_out.register_forward_hook(split.after_output)
    return split
