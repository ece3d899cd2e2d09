"""The split of LTX-Video (diffusers' ``LTXVideoTransformer3DModel``): before each block, the
member's tokens and rotary table; Ulysses self-attention in place of LTX's processor (the q/k
RMSNorms across heads and the rotary embedding on the shard); after ``proj_out``, the gather.
Cross-attention to the text, with its mask, runs on the shard as it is."""

from __future__ import annotations

from torch import nn

from adaptiveload.parallel.token_split import TokenSplit, check_heads, check_unfused_projections

# LTXVideoTransformerBlock.forward's arguments, in order (the model passes them by name, its
# gradient checkpointing by position).
_ARGS = ("hidden_states", "encoder_hidden_states", "temb", "image_rotary_emb")


def check(model: nn.Module, degree: int) -> None:
    check_unfused_projections(block.attn1 for block in model.transformer_blocks)
    check_heads(model.transformer_blocks[0].attn1.heads, degree)


class _Processor:
    """LTX's own self-attention processor, or Ulysses in a split forward."""

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
        image_rotary_emb=None,
    ):
        if self.split.current is None:
            return self.plain(
                attn, hidden_states, encoder_hidden_states, attention_mask, image_rotary_emb
            )
        if encoder_hidden_states is not None or attention_mask is not None:
            raise NotImplementedError("split_sequence: self-attention without a mask only")
        from diffusers.models.transformers.transformer_ltx import apply_rotary_emb

        q = attn.norm_q(attn.to_q(hidden_states))
        k = attn.norm_k(attn.to_k(hidden_states))
        v = attn.to_v(hidden_states)
        if image_rotary_emb is not None:
            q, k = apply_rotary_emb(q, image_rotary_emb), apply_rotary_emb(k, image_rotary_emb)
        q, k, v = (t.unflatten(2, (attn.heads, -1)) for t in (q, k, v))
        out = self.split.attend(q, k, v).flatten(2, 3).to(q.dtype)
        return attn.to_out[1](attn.to_out[0](out))


class _Split(TokenSplit):
    def before_block(self, module, args, kwargs):
        if self.current is None:
            return None
        args, kwargs = list(args), dict(kwargs)
        values = {n: args[i] if i < len(args) else kwargs.get(n) for i, n in enumerate(_ARGS)}
        hidden, temb, rope = values["hidden_states"], values["temb"], values["image_rotary_emb"]
        f = self.see_tokens(hidden, values["encoder_hidden_states"], temb)
        if f.full > 1 and temb.shape[1] == f.full:
            raise NotImplementedError("split_sequence: per-token timesteps are not supported")
        values["hidden_states"] = self.share_hidden(hidden)
        if rope is not None:
            values["image_rotary_emb"] = (self.share(rope[0]), self.share(rope[1]))
        for i, name in enumerate(_ARGS):
            if i < len(args):
                args[i] = values[name]
            elif name in kwargs:
                kwargs[name] = values[name]
        return tuple(args), kwargs


def install(model: nn.Module) -> TokenSplit:
    split = _Split()
    model.register_forward_pre_hook(split.before_forward, with_kwargs=True)
    for block in model.transformer_blocks:
        block.attn1.processor = _Processor(split, block.attn1.processor)
        block.register_forward_pre_hook(split.before_block, with_kwargs=True)
    model.proj_out.register_forward_hook(split.after_output)
    return split
