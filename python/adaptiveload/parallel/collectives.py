"""The exchanges of sequence parallelism, with autograd, over any process group and lengths
not divisible by the degree, all made of one all-to-all (its own adjoint) over the micro-batch's
group, with zero counts for the members a member does not exchange with (so no process group
beyond the micro-batch's is needed): token shards to head shards of the Ulysses peers' block
and back; keys and values to head shards of the whole sample (Ulysses and the ring's
all-gather in one; adjoint: each member's gradient summed from the members that used it); the
pieces of a replicated text's attention output joined (joint attention; adjoint: a
reduce-scatter); a sum over the Ulysses peers (a norm across heads of head shards; adjoint: the
same sum). Plus the members' token shards joined (the output of a split micro-batch: an
all-gather). The layout of the members is ``groups.layout``. With ``ONE_DEVICE`` each is a
local copy of the same shape, so that one member's compute is timed alone."""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F

from adaptiveload.parallel.groups import ONE_DEVICE, layout, share_sizes, token_share


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


def _ranks(degree: int, member: int, ulysses: int, everyone: bool) -> range:
    """This member's Ulysses peers (the ``ulysses`` members whose tokens form its block), or,
    ``everyone``, the whole group."""
    first = member - member % ulysses
    return range(degree) if everyone else range(first, first + ulysses)


def _counts(degree: int, ranks: range, count) -> list[int]:
    """Per member of the group: ``count(p)`` for the members ``p`` of ``ranks``, else 0 (an
    all-to-all over the whole group that exchanges with ``ranks`` only)."""
    return [count(p) if p in ranks else 0 for p in range(degree)]


def sum_over_peers(x: torch.Tensor, group, degree: int, member: int, ulysses: int):
    """The sum of ``x`` (``(B, ...)``) over this member's Ulysses peers, who hold the other
    heads of its tokens (``ONE_DEVICE``: ``ulysses`` times this member's). Each peer uses the
    sum its own way, so the gradient of a peer's ``x`` is the sum of the peers' gradients of the
    sum: the backward of the exchange and of the sum."""
    if ulysses == 1:
        return x
    if group is ONE_DEVICE:
        return x * ulysses
    peers = _ranks(degree, member, ulysses, everyone=False)
    counts = _counts(degree, peers, lambda p: x.shape[0])
    send = x.expand(ulysses, *x.shape).reshape(ulysses * x.shape[0], *x.shape[1:])
    return _AllToAll.apply(send, group, counts, counts).unflatten(0, (ulysses, -1)).sum(0)


def seq_to_heads(x: torch.Tensor, group, sizes: list[int], member: int, everyone=False):
    """``(B, s_member, H, D)`` token shards to ``(B, n, H / u, D)`` head shards (``u``, the
    Ulysses degree of ``groups.layout``): this member's heads (shard ``member % u``) of the
    tokens of its Ulysses peers (``n``: their contiguous block), or, ``everyone``, of all the
    sample's tokens (``n = S``: the keys and values, the Ulysses all-to-all and the ring's
    all-gather in one exchange; each member sends its head shard ``p % u`` to every member p)."""
    b, s, h, dh = x.shape
    d = len(sizes)
    u, _ = layout(d, h)
    ranks = _ranks(d, member, u, everyone)
    if len(ranks) == 1:  # Ulysses of 1: the member's own tokens, all heads
        return x
    n = sum(sizes[p] for p in ranks)
    if group is ONE_DEVICE:  # this member's tokens stand in for every member's
        return x[:, :, : h // u].repeat(1, -(-n // s), 1, 1)[:, :n]
    shards = x.reshape(b, s, u, h // u, dh).permute(2, 1, 0, 3, 4)
    send = shards.repeat(len(ranks) // u, 1, 1, 1, 1).reshape(len(ranks) * s, b, h // u, dh)
    receive = _counts(d, ranks, sizes.__getitem__)
    out = _AllToAll.apply(send, group, _counts(d, ranks, lambda p: s), receive)
    return out.permute(1, 0, 2, 3)


def heads_to_seq(x: torch.Tensor, group, sizes: list[int], member: int, ulysses: int):
    """``(B, n, H / u, D)`` head shards of the Ulysses peers' block back to ``(B, s_member, H,
    D)`` token shards."""
    b, _, hu, dh = x.shape
    d, s, u = len(sizes), sizes[member], ulysses
    if u == 1:
        return x
    if group is ONE_DEVICE:
        return x[:, :s].repeat(1, 1, u, 1)
    peers = _ranks(d, member, u, everyone=False)
    send, receive = _counts(d, peers, sizes.__getitem__), _counts(d, peers, lambda p: s)
    out = _AllToAll.apply(x.permute(1, 0, 2, 3), group, send, receive)
    return out.reshape(u, s, b, hu, dh).permute(2, 1, 0, 3, 4).reshape(b, s, u * hu, dh)


def own_heads(x: torch.Tensor, ulysses: int, member: int) -> torch.Tensor:
    """This member's ``H / u`` heads (shard ``member % u``) of a replicated ``(B, T, H, D)``."""
    h = x.shape[2] // ulysses
    shard = member % ulysses
    return x[:, :, shard * h : (shard + 1) * h]


def join_text(x: torch.Tensor, group, degree: int, member: int, ulysses: int, text_len: int):
    """The members' ``(B, T_j, H / u, D)`` pieces of a text's attention output (member m: its
    heads of text piece ``m // u``, ``groups.share_sizes(T, r)``) joined to ``(B, T, H, D)``
    on every member. The members use the joined text differently (each only through its own
    heads of the next attention), so the backward of the exchange hands each member the sum
    of the members' gradients of its piece: a reduce-scatter."""
    b, piece, hu, dh = x.shape
    u, r = ulysses, degree // ulysses
    if group is ONE_DEVICE:
        return F.pad(x, (0, 0, 0, 0, 0, text_len - piece)).repeat(1, 1, u, 1)
    pieces = share_sizes(text_len, r)
    receive = [pieces[p // u] for p in range(degree)]
    send = x.permute(1, 0, 2, 3).repeat(degree, 1, 1, 1)
    out = _AllToAll.apply(send, group, [piece] * degree, receive)
    blocks = out.split([n * u for n in pieces])  # block j: the u head shards of piece j
    joined = [
        t.reshape(u, n, b, hu, dh).permute(1, 2, 0, 3, 4).reshape(n, b, u * hu, dh)
        for t, n in zip(blocks, pieces, strict=True)
    ]
    return torch.cat(joined).permute(1, 0, 2, 3)


def gather_tokens(x: torch.Tensor, group, sizes: list[int], member: int) -> torch.Tensor:
    """The members' ``(B, s_member, ...)`` token shards joined to ``(B, S, ...)``."""
    if group is ONE_DEVICE:
        return x.repeat(1, -(-sum(sizes) // x.shape[1]), *([1] * (x.ndim - 2)))[:, : sum(sizes)]
    return _GatherTokens.apply(x, group, sizes, member)


def ulysses_attention(q, k, v, group, sizes: list[int], member: int, text=None, mask=None):
    """Attention of a member's token shards ``q, k, v`` (``(B, s_member, H, D)``) over all the
    sample's tokens, returned as the member's shard ``(B, s_member, H, D)``. Over ``u x r``
    members (``groups.layout``): the queries go to this member's ``H / u`` heads of its Ulysses
    peers' block of tokens, the keys and values to those heads of all the sample's tokens (the
    ring's all-gather: each member holds the whole sample's keys and values for ``H / u``
    heads); ``r = 1`` is Ulysses alone. ``text``: ``(q, k, v)`` of tokens every member holds
    whole (``(B, T, H, D)``, joint attention), appended after the sample's keys (all ``T``) and
    queries (this member's piece of them, ``share_sizes(T, r)[member // u]``); then returns
    ``(shard, text output)``, the text output joined (``join_text``). ``mask``: a boolean or
    additive mask over the keys of the whole sequence (``(B, 1, 1, S + T)``)."""
    degree = len(sizes)
    u, r = layout(degree, q.shape[2])
    q = seq_to_heads(q, group, sizes, member)
    k, v = (seq_to_heads(t, group, sizes, member, everyone=True) for t in (k, v))
    block = q.shape[1]
    if text is not None:
        text_len = text[0].shape[1]
        tq, tk, tv = (own_heads(t, u, member) for t in text)
        tq = tq[:, token_share(text_len, r, member // u)]
        q, k, v = torch.cat([q, tq], 1), torch.cat([k, tk], 1), torch.cat([v, tv], 1)
    out = F.scaled_dot_product_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_mask=mask
    ).transpose(1, 2)
    shard = heads_to_seq(out[:, :block], group, sizes, member, u)
    if text is None:
        return shard
    return shard, join_text(out[:, block:], group, degree, member, u, text_len)


def cross_attention(q, pairs, group, sizes: list[int], member: int):
    """Attention of a member's query shard ``q`` (``(B, s_member, H, D)``) over keys and values
    that every member projects for its own ``H / u`` heads only (``pairs``: ``[(k, v)]``, each
    ``(B, T, H / u, D)``, their outputs added, as Wan adds the text's and the image's): the
    queries go to head shards of the Ulysses peers' block and the output comes back, two
    exchanges in place of projecting the keys and values of a whole text on every member."""
    u, _ = layout(len(sizes), q.shape[2])
    q = seq_to_heads(q, group, sizes, member).transpose(1, 2)
    out = None
    for k, v in pairs:
        o = F.scaled_dot_product_attention(q, k.transpose(1, 2), v.transpose(1, 2))
        out = o if out is None else out + o
    return heads_to_seq(out.transpose(1, 2), group, sizes, member, u)
