"""Sequence parallelism chosen per micro-batch: the ranks of a micro-batch's group each run the
model on their share of its tokens (Ulysses attention: all-to-alls turn token shards into head
shards around each self-attention), and the gradients they add up are those of the micro-batch
processed whole on one rank.

The sampler (``sequence_parallel=D``) gives each micro-batch a degree d and a group of d ranks
(``MicroBatch.degree``, ``.member``, ``.group_ranks``). Here:

- ``SequenceParallelGroups``: the process groups of every aligned group of d ranks, made once
  by every rank (``torch.distributed.new_group`` is collective), and the group of a micro-batch.
- ``token_share``: the tokens of one sample a member holds (the planner's cut, planner.h: the
  sample in d contiguous pieces, the first ``S % d`` one token longer).
- ``split_sequence(model, group, degree, member)``: a context in which ``model``'s forward runs on this
  member's share, with Ulysses self-attention over ``group``, and gathers the output so that the
  loop computes its loss on the whole micro-batch as usual. The gather's backward keeps this
  member's own tokens' gradient only, so the members' gradients sum (DDP's all-reduce) to the
  gradient of the whole micro-batch, each sample once. Wan (diffusers' WanTransformer3DModel).

Why not diffusers' ``ContextParallelConfig``: it fixes one mesh per model
(``enable_parallelism``), while the degree and the group change from one micro-batch to the
next here; the all-to-alls below take any group, and lengths not divisible by d.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn


def share_sizes(seq_len: int, degree: int) -> list[int]:
    """Tokens of each of ``degree`` members of one sample of ``seq_len`` tokens."""
    return [seq_len // degree + (1 if j < seq_len % degree else 0) for j in range(degree)]


def token_share(seq_len: int, degree: int, member: int) -> slice:
    """The tokens ``[start, stop)`` of one sample of ``seq_len`` tokens that member ``member``
    of ``degree`` holds."""
    if not 0 <= member < degree:
        raise ValueError(f"member must be in [0, {degree}), got {member}")
    sizes = share_sizes(seq_len, degree)
    start = sum(sizes[:member])
    return slice(start, start + sizes[member])


class SequenceParallelGroups:
    """The process groups of sequence parallelism: for every degree d in 2, 4, ...,
    ``max_degree``, the groups of ranks ``[g * d, (g + 1) * d)``. Every rank must make it, at the
    same point (``new_group`` is collective), with the sampler's ``sequence_parallel``."""

    def __init__(self, max_degree: int, *, backend: str | None = None):
        if not (dist.is_available() and dist.is_initialized()):
            raise RuntimeError("SequenceParallelGroups needs torch.distributed initialized")
        world = dist.get_world_size()
        if max_degree < 1 or max_degree & (max_degree - 1) or world % max_degree:
            raise ValueError(
                f"max_degree must be a power of two that divides the world size {world}, got "
                f"{max_degree}"
            )
        self.max_degree = max_degree
        self._groups: dict[tuple[int, int], object] = {}
        d = 2
        while d <= max_degree:
            for first in range(0, world, d):
                ranks = list(range(first, first + d))
                self._groups[(d, first)] = dist.new_group(ranks, backend=backend)
            d *= 2

    def group(self, rank: int, degree: int):
        """The group of ``degree`` ranks that holds ``rank`` (None for degree 1)."""
        if degree == 1:
            return None
        key = (degree, rank - rank % degree)
        if key not in self._groups:
            raise ValueError(f"no group of degree {degree} (max_degree {self.max_degree})")
        return self._groups[key]

    def of(self, mb) -> object:
        """The group of a ``MicroBatch`` (None where it runs on one rank)."""
        return self.group(mb.rank, mb.degree)


class _OneDevice:
    """The group of ``split_sequence`` that times one member's share on one device: the
    exchanges are replaced by local copies of the same shapes (no collective), so the member's
    compute (its layers on its tokens, attention on all tokens for its heads) is exactly a real
    member's, and the numbers are not the model's."""

    def __repr__(self) -> str:
        return "ONE_DEVICE"


#: ``split_sequence(model, ONE_DEVICE, d, 0)``: member 0's share of compute, on one device
#: (calibration and the replay, benchmarks/replay_sp.py)
ONE_DEVICE = _OneDevice()


# -- collectives with autograd ----------------------------------------------------------------
class _AllToAll(torch.autograd.Function):
    """``all_to_all_single`` along dim 0 with split sizes; backward: the reverse exchange."""

    @staticmethod
    def forward(ctx, x, group, send: list[int], receive: list[int]):
        ctx.group, ctx.send, ctx.receive = group, send, receive
        out = x.new_empty((sum(receive), *x.shape[1:]))
        dist.all_to_all_single(out, x.contiguous(), receive, send, group=group)
        return out

    @staticmethod
    def backward(ctx, grad):
        out = grad.new_empty((sum(ctx.send), *grad.shape[1:]))
        dist.all_to_all_single(out, grad.contiguous(), ctx.send, ctx.receive, group=ctx.group)
        return out, None, None, None


class _GatherTokens(torch.autograd.Function):
    """The members' token shards (dim 1) joined in order; backward: this member's own part of
    the gradient, so that each token's gradient is counted once over the group."""

    @staticmethod
    def forward(ctx, x, group, sizes: list[int], member: int):
        ctx.start, ctx.stop = sum(sizes[:member]), sum(sizes[: member + 1])
        width = max(sizes)
        pad = list(x.shape)
        pad[1] = width
        padded = x.new_zeros(pad)
        padded[:, : x.shape[1]] = x
        parts = [torch.empty_like(padded) for _ in sizes]
        dist.all_gather(parts, padded.contiguous(), group=group)
        return torch.cat([p[:, :n] for p, n in zip(parts, sizes, strict=True)], dim=1)

    @staticmethod
    def backward(ctx, grad):
        return grad[:, ctx.start : ctx.stop].contiguous(), None, None, None


def seq_to_heads(x: torch.Tensor, group, sizes: list[int], member: int) -> torch.Tensor:
    """``(B, s_member, H, D)`` token shards to ``(B, S, H / d, D)`` head shards."""
    b, s, h, dh = x.shape
    d = len(sizes)
    if h % d:
        raise ValueError(
            f"sequence parallelism over {d} ranks needs heads divisible by {d}, got {h}"
        )
    if group is ONE_DEVICE:  # this member's tokens stand in for every member's
        reps = -(-sum(sizes) // s)
        return x[:, :, : h // d].repeat(1, reps, 1, 1)[:, : sum(sizes)]
    send = x.reshape(b, s, d, h // d, dh).permute(2, 1, 0, 3, 4).reshape(d * s, b, h // d, dh)
    out = _AllToAll.apply(send, group, [s] * d, list(sizes))
    return out.permute(1, 0, 2, 3)


def heads_to_seq(x: torch.Tensor, group, sizes: list[int], member: int) -> torch.Tensor:
    """``(B, S, H / d, D)`` head shards back to ``(B, s_member, H, D)`` token shards."""
    b, _, hd, dh = x.shape
    d, s = len(sizes), sizes[member]
    if group is ONE_DEVICE:
        return x[:, :s].repeat(1, 1, d, 1)
    out = _AllToAll.apply(x.permute(1, 0, 2, 3), group, list(sizes), [s] * d)
    return out.reshape(d, s, b, hd, dh).permute(2, 1, 0, 3, 4).reshape(b, s, d * hd, dh)


# -- Wan (diffusers) ------------------------------------------------------------------------
def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Wan's rotary embedding on ``(B, S, H, D)``: pairs (even, odd) of the last dim."""
    even, odd = x.unflatten(-1, (-1, 2)).unbind(-1)
    c, s = cos[..., 0::2], sin[..., 1::2]
    return torch.stack((even * c - odd * s, even * s + odd * c), dim=-1).flatten(-2).type_as(x)


def _ulysses_self_attention(attn, hidden_states, group, sizes: list[int], member: int,
                            encoder_hidden_states=None, attention_mask=None,
                            rotary_emb=None):  # fmt: skip
    """Wan's self-attention on a member's token shard: projections, q/k norms and rotary
    embedding on the shard, attention over all tokens for H / d heads."""
    if encoder_hidden_states is not None or attention_mask is not None:
        raise NotImplementedError("split_sequence: self-attention without a mask only")
    q = attn.norm_q(attn.to_q(hidden_states)).unflatten(2, (attn.heads, -1))
    k = attn.norm_k(attn.to_k(hidden_states)).unflatten(2, (attn.heads, -1))
    v = attn.to_v(hidden_states).unflatten(2, (attn.heads, -1))
    if rotary_emb is not None:
        q, k = _rotate(q, *rotary_emb), _rotate(k, *rotary_emb)
    q, k, v = (seq_to_heads(t, group, sizes, member) for t in (q, k, v))
    out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
    out = heads_to_seq(out.transpose(1, 2), group, sizes, member)
    out = out.flatten(2, 3).type_as(q)
    return attn.to_out[1](attn.to_out[0](out))


def _check_wan(model: nn.Module, degree: int) -> None:
    for block in model.blocks:
        if getattr(block.attn1, "fused_projections", False):
            raise NotImplementedError(
                "split_sequence: fused q/k/v projections (fuse_qkv_projections) are not "
                "supported; unfuse them"
            )
    heads = model.blocks[0].attn1.heads
    if heads % degree:
        raise ValueError(
            f"split_sequence: degree {degree} does not divide the model's {heads} attention "
            "heads: lower the sampler's sequence_parallel"
        )


class _WanSplit:
    """Hooks installed once on a Wan model: before each block, the member's share of the tokens
    and of the rotary table; Ulysses self-attention; after proj_out, the gather. ``current`` is
    the micro-batch's (group, degree, member), or None (the model as it is). It stays until the
    next ``split_sequence``, so that a backward that recomputes checkpointed blocks sees it."""

    def __init__(self, model: nn.Module):
        self.current: tuple | None = None
        self.full = 0
        self.sizes: list[int] = []
        self.cut = slice(None)
        self.plain = [block.attn1.processor for block in model.blocks]
        for block, plain in zip(model.blocks, self.plain, strict=True):
            block.attn1.processor = _SwitchedSelfAttention(self, plain)
            block.register_forward_pre_hook(self.before_block)
        model.proj_out.register_forward_hook(self.after_proj_out)

    def before_block(self, module, args):
        if self.current is None:
            return None
        hidden, text, temb, rope = args
        if self.full == 0:  # the first block of this micro-batch's forward
            self.full = hidden.shape[1]
            self.sizes = share_sizes(self.full, self.current[1])
            self.cut = token_share(self.full, self.current[1], self.current[2])
        if temb.ndim == 4 and temb.shape[1] == self.full:
            raise NotImplementedError("split_sequence: per-token timesteps are not supported")
        if hidden.shape[1] == self.full:  # contiguous: fused kernels take rows back to back
            hidden = hidden[:, self.cut].contiguous()
        if rope is not None and rope[0].shape[1] == self.full:
            rope = (rope[0][:, self.cut], rope[1][:, self.cut])
        return hidden, text, temb, rope

    def after_proj_out(self, module, args, out):
        if self.current is None:
            return None
        group, _, member = self.current
        if group is ONE_DEVICE:
            return out.repeat(1, -(-self.full // out.shape[1]), 1)[:, : self.full]
        return _GatherTokens.apply(out, group, self.sizes, member)


class _SwitchedSelfAttention:
    """Wan's own self-attention processor, or Ulysses while a split is in force."""

    def __init__(self, split: _WanSplit, plain):
        self.split, self.plain = split, plain

    def __call__(self, attn, hidden_states, *args, **kwargs):
        if self.split.current is None:
            return self.plain(attn, hidden_states, *args, **kwargs)
        group, _, member = self.split.current
        return _ulysses_self_attention(
            attn, hidden_states, group, self.split.sizes, member, *args, **kwargs
        )


@contextmanager
def split_sequence(model: nn.Module, group, degree: int, member: int) -> Iterator[None]:
    """Within the context, ``model``'s forward runs on member ``member`` of ``degree``'s share of
    each sample's tokens, with Ulysses self-attention over ``group``, and returns the whole
    micro-batch's output (gathered): compute the loss on it as without sequence parallelism.
    Every member of the group must run the same micro-batch at the same point. Degree 1: the
    model as it is.

    The split stays in force after the context, until the next ``split_sequence`` on the model,
    so that a backward that recomputes checkpointed blocks sees it: run each micro-batch's
    forward in its own context. Wan (diffusers' ``WanTransformer3DModel``), one sequence length
    per micro-batch, timesteps per sample; the first call installs hooks on the model."""
    inner = getattr(model, "module", model)  # DDP
    # FSDP2's fully_shard gives the model a subclass (FSDPWanTransformer3DModel): look at the
    # ancestry, by name (diffusers is optional here).
    if "WanTransformer3DModel" not in {c.__name__ for c in type(inner).__mro__}:
        if degree == 1:
            yield
            return
        raise NotImplementedError(
            f"split_sequence supports Wan (diffusers' WanTransformer3DModel) so far, got "
            f"{type(inner).__name__}: plan with sequence_parallel=1 for this model"
        )
    if degree > 1:
        _check_wan(inner, degree)
        if group is None:
            raise ValueError(f"split_sequence: degree {degree} needs its process group")
    split = inner.__dict__.get("_adaptiveload_split")
    if split is None:
        split = inner.__dict__["_adaptiveload_split"] = _WanSplit(inner)
    split.current = None if degree == 1 else (group, degree, member)
    split.full = 0
    yield
