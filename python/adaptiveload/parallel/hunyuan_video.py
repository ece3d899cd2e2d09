"""The split of HunyuanVideo (diffusers' ``HunyuanVideoTransformer3DModel``): joint attention of
the video's tokens and the text's. Each member holds its share of the video tokens and the whole
text (the text stream is computed alike by every member). In every dual- and single-stream
block, Ulysses attention takes the video shards to head shards, appends the member's heads of
the text, attends over the whole sequence with the model's mask, returns the video part to
token shards and joins the text's heads (its gradient summed over the members, who each used
it only through their own heads). Before each block: the member's tokens and rotary table;
after ``proj_out``: the gather."""

from __future__ import annotations

from torch import nn

from adaptiveload.parallel.token_split import TokenSplit, check_heads, check_unfused_projections


def check(model: nn.Module, degree: int) -> None:
    if getattr(model.config, "image_condition_type", None) == "token_replace":
        raise NotImplementedError(
            "split_sequence: HunyuanVideo's token-replace blocks (image to video) are not supported"
        )
    blocks = list(model.transformer_blocks) + list(model.single_transformer_blocks)
    check_unfused_projections(block.attn for block in blocks)
    check_heads(blocks[0].attn.heads, degree)


class _Processor:
    """HunyuanVideo's own attention processor, or Ulysses in a split forward."""

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
        if encoder_hidden_states is None:
            raise NotImplementedError("split_sequence: HunyuanVideo attention without text")
        from diffusers.models.embeddings import apply_rotary_emb

        def heads(t):
            return t.unflatten(2, (attn.heads, -1))

        def normed(norm, t):
            return t if norm is None else norm(t)

        h, enc = hidden_states, encoder_hidden_states
        q = normed(attn.norm_q, heads(attn.to_q(h)))
        k = normed(attn.norm_k, heads(attn.to_k(h)))
        v = heads(attn.to_v(h))
        if image_rotary_emb is not None:
            q = apply_rotary_emb(q, image_rotary_emb, sequence_dim=1)
            k = apply_rotary_emb(k, image_rotary_emb, sequence_dim=1)
        if attn.add_q_proj is None:  # single stream: the text through the same projections
            tq = normed(attn.norm_q, heads(attn.to_q(enc)))
            tk = normed(attn.norm_k, heads(attn.to_k(enc)))
            tv = heads(attn.to_v(enc))
        else:
            tq = normed(attn.norm_added_q, heads(attn.add_q_proj(enc)))
            tk = normed(attn.norm_added_k, heads(attn.add_k_proj(enc)))
            tv = heads(attn.add_v_proj(enc))
        shard, text = self.split.attend(q, k, v, text=(tq, tk, tv), mask=attention_mask)
        shard, text = shard.flatten(2, 3).to(q.dtype), text.flatten(2, 3).to(q.dtype)
        if getattr(attn, "to_out", None) is not None:
            shard = attn.to_out[1](attn.to_out[0](shard))
        if getattr(attn, "to_add_out", None) is not None:
            text = attn.to_add_out(text)
        return shard, text


class _Split(TokenSplit):
    def before_block(self, module, args):
        if self.current is None:
            return None
        hidden, text, temb, mask, rope, *rest = args
        self.see_tokens(hidden, text, temb)
        if rope is not None:
            rope = (self.share(rope[0], dim=0), self.share(rope[1], dim=0))
        return (self.share_hidden(hidden), text, temb, mask, rope, *rest)


def install(model: nn.Module) -> TokenSplit:
    split = _Split()
    model.register_forward_pre_hook(split.before_forward, with_kwargs=True)
    for block in list(model.transformer_blocks) + list(model.single_transformer_blocks):
        block.attn.processor = _Processor(split, block.attn.processor)
        block.register_forward_pre_hook(split.before_block)
    model.proj_out.register_forward_hook(split.after_output)
    return split
