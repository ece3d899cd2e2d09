"""Who splits a sample and where: each member's tokens (the planner's cut, planner.h: a sample
in d contiguous pieces, the first ``S % d`` one token longer), the layout of a degree over a
model's heads (Ulysses x ring), the process groups of every aligned group of d ranks, and
``ONE_DEVICE``, the stand-in group that times one member's share on one device."""

from __future__ import annotations

import math

import torch.distributed as dist


def layout(degree: int, heads: int) -> tuple[int, int]:
    """``(u, r)``: sequence parallelism of ``degree`` ranks over a model of ``heads`` attention
    heads runs Ulysses over ``u = gcd(degree, heads)`` ranks (the largest number that divides
    both: each of them attends for ``heads / u`` heads) times a ring of ``r = degree / u``.
    Member m of the group is head shard ``m % u`` of token block ``m // u``: the Ulysses peers
    ``m - m % u .. m - m % u + u - 1`` hold one contiguous block of the sample's tokens between
    them, and the ``r`` members of one head shard hold the whole sample's tokens. ``r = 1``
    (degrees that divide the heads): Ulysses alone, as before. Refused (ValueError): a degree
    or a head count below 1."""
    if degree < 1 or heads < 1:
        raise ValueError(
            f"split_sequence: no layout of degree {degree} over {heads} attention heads: "
            "both must be at least 1"
        )
    ulysses = math.gcd(degree, heads)
    return ulysses, degree // ulysses


def peer_comm_factor(degree: int, heads: int) -> float:
    """What a member of a micro-batch split over ``degree`` ranks receives of an exchange that
    travels among its Ulysses peers only (the queries, the output, the text's head-shard
    cross-attention), over what it receives under plain Ulysses at that degree: with a ring
    (``layout``: u x r) ``(u - 1) / (u**2 r)`` of the tokens against ``(d - 1) / d**2``; 1 where
    the degree divides the heads, 0 with no Ulysses part (u = 1)."""
    u, r = layout(degree, heads)
    d = degree
    if d == 1:
        return 1.0
    return (u - 1) / (u * u * r) / ((d - 1) / (d * d))


def ring_comm_factor(degree: int, heads: int) -> float:
    """What a member of a micro-batch split over ``degree`` ranks receives per block, over what
    it receives under plain Ulysses at that degree (which ``cost.ulysses_comm_per_token``
    prices: 4 exchanges of ``(d - 1) / d**2`` of the tokens' hidden values). 1 where the degree
    divides the heads. With a ring (``layout``: u x r) the queries and the output travel among
    the u Ulysses peers only (``peer_comm_factor`` each), while the keys and values arrive
    whole per head shard, ``(d - 1) / (u d)`` each, r times Ulysses': at 8 ranks over 12 heads
    (4 x 2) 1.43x, with no Ulysses part (u = 1) d / 2."""
    if degree == 1:
        return 1.0
    _, r = layout(degree, heads)
    return (2 * peer_comm_factor(degree, heads) + 2 * r) / 4


def ring_held_fraction(degree: int, heads: int) -> float:
    """The keys and values a member of a micro-batch split over ``degree`` ranks holds beyond
    its share, per token of the whole samples, in units of one token's keys and values over all
    heads: with a ring (``layout``: u x r) it holds them for all the tokens and ``1 / u`` of the
    heads, where its share (and plain Ulysses) is ``1 / d`` of both: ``(r - 1) / d``. 0 where the
    degree divides the heads; 1/8 at 8 ranks over 12 heads (4 x 2)."""
    _, r = layout(degree, heads)
    return (r - 1) / degree


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
