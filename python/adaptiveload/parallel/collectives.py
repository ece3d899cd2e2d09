"""The exchanges of Ulysses attention, with autograd, over any process group and lengths not
divisible by the degree: token shards to head shards and back (all-to-all, its own adjoint),
the members' token shards joined (the output of a split micro-batch), the members' head
shards joined (the replicated text of joint attention; adjoint: a reduce-scatter), and a sum
over the members (a norm across heads of head shards; adjoint: the same sum). With
``ONE_DEVICE`` each is a local copy of the same shape, so that one member's compute is timed
alone."""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F

from adaptiveload.parallel.groups import ONE_DEVICE


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
    the gradient, so that each token's gradient is counted once over the group (every member
    computes the same loss on the joined output, so their gradients of it are equal)."""

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


class _GatherHeads(torch.autograd.Function):
    """``(B, T, H / d, D)`` head shards of the d members joined to ``(B, T, H, D)``. The
    members use the joined tensor differently (each only through its own heads of the next
    attention), so the backward sums the members' gradients of each shard and hands each member
    its own: a reduce-scatter, made of an all-to-all and a sum (gloo has no reduce-scatter)."""

    @staticmethod
    def forward(ctx, x, group, degree: int):
        ctx.group, ctx.degree = group, degree
        parts = [torch.empty_like(x) for _ in range(degree)]
        dist.all_gather(parts, x.contiguous(), group=group)
        return torch.cat(parts, dim=2)

    @staticmethod
    def backward(ctx, grad):
        b, t, h, dh = grad.shape
        d = ctx.degree
        send = grad.reshape(b, t, d, h // d, dh).permute(2, 0, 1, 3, 4).contiguous()
        got = torch.empty_like(send)
        dist.all_to_all_single(got, send, group=ctx.group)
        return got.sum(0), None, None


class _SumOver(torch.autograd.Function):
    """The sum of the members' ``x`` on every member. Each member uses the sum its own way, so
    the gradient of a member's ``x`` is the sum of the members' gradients of the sum."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        out = x.clone()
        dist.all_reduce(out, group=group)
        return out

    @staticmethod
    def backward(ctx, grad):
        grad = grad.clone()
        dist.all_reduce(grad, group=ctx.group)
        return grad, None


def sum_over(x: torch.Tensor, group, degree: int) -> torch.Tensor:
    """The sum over the group's members of each member's ``x`` (``ONE_DEVICE``: ``degree``
    times this member's)."""
    if group is ONE_DEVICE:
        return x * degree
    return _SumOver.apply(x, group)


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


def own_heads(x: torch.Tensor, degree: int, member: int) -> torch.Tensor:
    """This member's ``H / d`` heads of a replicated ``(B, T, H, D)`` tensor."""
    h = x.shape[2] // degree
    return x[:, :, member * h : (member + 1) * h]


def gather_heads(x: torch.Tensor, group, degree: int) -> torch.Tensor:
    """The members' ``(B, T, H / d, D)`` head shards joined to ``(B, T, H, D)``."""
    if group is ONE_DEVICE:
        return x.repeat(1, 1, degree, 1)
    return _GatherHeads.apply(x, group, degree)


def gather_tokens(x: torch.Tensor, group, sizes: list[int], member: int) -> torch.Tensor:
    """The members' ``(B, s_member, ...)`` token shards joined to ``(B, S, ...)``."""
    if group is ONE_DEVICE:
        return x.repeat(1, -(-sum(sizes) // x.shape[1]), *([1] * (x.ndim - 2)))[:, : sum(sizes)]
    return _GatherTokens.apply(x, group, sizes, member)


def ulysses_attention(q, k, v, group, sizes: list[int], member: int, text=None, mask=None):
    """Attention of a member's token shards ``q, k, v`` (``(B, s_member, H, D)``) over all the
    sample's tokens, for ``H / d`` heads, returned as the member's shard ``(B, s_member, H, D)``.
    ``text``: ``(q, k, v)`` of tokens every member holds whole (``(B, T, H, D)``, joint
    attention), appended after the sample's tokens; then returns ``(shard, text output)``, the
    text output with all heads. ``mask``: a boolean or additive mask over the keys of the whole
    sequence (``(B, 1, 1, S + T)``), as the model builds it."""
    degree = len(sizes)
    q, k, v = (seq_to_heads(t, group, sizes, member) for t in (q, k, v))
    full = q.shape[1]
    if text is not None:
        tq, tk, tv = (own_heads(t, degree, member) for t in text)
        q, k, v = torch.cat([q, tq], 1), torch.cat([k, tk], 1), torch.cat([v, tv], 1)
    out = F.scaled_dot_product_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_mask=mask
    ).transpose(1, 2)
    shard = heads_to_seq(out[:, :full], group, sizes, member)
    if text is None:
        return shard
    return shard, gather_heads(out[:, full:], group, degree)


def cross_attention(q, pairs, group, sizes: list[int], member: int):
    """Attention of a member's query shard ``q`` (``(B, s_member, H, D)``) over keys and values
    that every member projects for its own ``H / d`` heads only (``pairs``: ``[(k, v)]``, each
    ``(B, T, H / d, D)``, their outputs added, as Wan adds the text's and the image's): the
    queries go to head shards of all the sample's tokens and the output comes back, two
    exchanges in place of projecting the keys and values of a whole text on every member."""
    q = seq_to_heads(q, group, sizes, member).transpose(1, 2)
    out = None
    for k, v in pairs:
        o = F.scaled_dot_product_attention(q, k.transpose(1, 2), v.transpose(1, 2))
        out = o if out is None else out + o
    return heads_to_seq(out.transpose(1, 2), group, sizes, member)
