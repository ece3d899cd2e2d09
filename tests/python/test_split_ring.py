"""Sequence parallelism over degrees the heads do not divide (Ulysses x ring,
``parallel.groups.layout``): the layout of every degree and head count, and, on gloo ranks, a
sample split over more ranks than the model has heads, or over a degree that does not divide
them, gives the loss and every gradient of the sample processed whole by one process (fp32,
relative error <= 1e-5), lengths divisible by the degree and not, for each family."""

from __future__ import annotations

import math

import pytest
import torch
import torch.distributed as dist

from adaptiveload.parallel import ONE_DEVICE, layout, split_sequence
from processes import run_on_ranks
from split_models import FAMILIES, _check, _inputs, _loss, _model, _output, _seed, _trained


def test_layout_of_every_degree_and_head_count():
    """Degree d over H heads: Ulysses over u = gcd(d, H) ranks (the largest that divides both)
    times a ring of d / u."""
    for degree in range(1, 17):
        for heads in range(1, 41):
            ulysses, ring = layout(degree, heads)
            assert ulysses * ring == degree, (degree, heads)
            assert heads % ulysses == 0 and degree % ulysses == 0, (degree, heads)
            assert ulysses == math.gcd(degree, heads), (degree, heads)
    assert layout(8, 12) == (4, 2) and layout(6, 4) == (2, 3) and layout(4, 3) == (1, 4)
    for degree, heads in ((0, 12), (8, 0), (-2, 4)):
        with pytest.raises(ValueError, match=f"degree {degree} over {heads} attention heads"):
            layout(degree, heads)


def _ring_rank(rank, world, family, schedule, seed, head_shards_from):
    """Each micro-batch of ``schedule`` ([(shape name, heads, degree, first rank)]) on the ranks
    of its group, on a model of that many heads; per head count, the losses (by index among
    that head count's micro-batches) and the gradients summed over ranks by hand. Wan's
    cross-attention runs on head shards from ``head_shards_from`` Ulysses ranks."""
    import adaptiveload.parallel.wan as wan

    wan.HEAD_SHARDS_FROM_DEGREE = head_shards_from
    groups = {}
    for _, _, degree, first in schedule:  # new_group is collective: every rank, in order
        if degree > 1 and (degree, first) not in groups:
            groups[degree, first] = dist.new_group(list(range(first, first + degree)))
    heads_of = sorted({entry[1] for entry in schedule})
    dits = {h: _model(family, heads=h) for h in heads_of}
    models = {h: _trained(family, dit) for h, dit in dits.items()}  # named as the reference
    out = {h: {"losses": {}} for h in heads_of}
    for i, (name, heads, degree, first) in enumerate(schedule):
        index = sum(1 for e in schedule[:i] if e[1] == heads)
        if not first <= rank < first + degree:
            continue
        inputs, target = _inputs(family, name, seed + index)
        with split_sequence(dits[heads], groups.get((degree, first)), degree, rank - first):
            loss = _loss(family, models[heads], inputs, target)
        loss.backward()
        out[heads]["losses"][index] = float(loss.detach())
    for h, model in models.items():
        grads = {}
        for n, p in model.named_parameters():
            g = p.grad if p.grad is not None else torch.zeros_like(p)
            dist.all_reduce(g)
            grads[n] = g
        out[h]["grads"] = grads
    return out


def _check_each_head_count(results, family, schedule, seed):
    for heads in sorted({entry[1] for entry in schedule}):
        mine = [entry for entry in schedule if entry[1] == heads]
        _check([r[heads] for r in results], family, mine, seed, heads)


# On 4 ranks: 2 heads over 4 (Ulysses 2 x ring 2; Wan's cross-attention on head shards, then,
# with a text of 2 tokens, on the token shard); 3 heads over 4 (a ring of 4) and over 2 (rings
# of 2, two groups side by side); 2 heads over 2 (Ulysses alone, beside them). 45 tokens: 12,
# 11, 11, 11 over 4, 23 and 22 over 2.
RING = [
    ("odd", 2, 4, 0),
    ("odd-t2", 2, 4, 0),
    ("odd", 3, 4, 0),
    ("odd", 3, 2, 0),
    ("even", 3, 2, 2),
    ("even", 2, 2, 0),
    ("odd", 2, 2, 2),
]


@pytest.mark.distributed
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_split_over_more_ranks_than_heads_equals_whole(tmp_path, family):
    """Degrees above the head count and not dividing it (Ulysses x ring), for each family:
    every loss and the summed gradient equal one process's."""
    if family == "diffsynth":
        pytest.importorskip("diffsynth")
    seed = _seed()
    results = run_on_ranks(_ring_rank, 4, tmp_path, "ring", family, RING, seed, 2)
    _check_each_head_count(results, family, RING, seed)


@pytest.mark.distributed
@pytest.mark.parametrize("family", ["wan", "diffsynth"])
def test_four_heads_over_six_ranks_equals_whole(tmp_path, family):
    """4 heads over 6 ranks (Ulysses 2 x ring 3, a group that is not a power of two): 45 tokens
    (8, 8, 8, 7, 7, 7), cross-attention on head shards and on the token shard."""
    if family == "diffsynth":
        pytest.importorskip("diffsynth")
    schedule = [("odd", 4, 6, 0), ("odd-t2", 4, 6, 0)]
    seed = _seed()
    results = run_on_ranks(_ring_rank, 6, tmp_path, "six", family, schedule, seed, 2)
    _check_each_head_count(results, family, schedule, seed)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_one_device_share_of_a_ring(family):
    """``ONE_DEVICE`` over more ranks than heads (4 heads over 8: Ulysses 4 x ring 2; over 6):
    the output has the whole micro-batch's shape and gradients reach every parameter the whole
    one reaches."""
    dit = _model(family)
    model = _trained(family, dit)
    inputs, _ = _inputs(family, "odd", 3)
    whole = _output(family, model, inputs)
    whole.square().mean().backward()
    reached = {n for n, p in model.named_parameters() if p.grad is not None}
    for degree, member in ((8, 5), (6, 4)):
        model.zero_grad(set_to_none=True)
        with split_sequence(dit, ONE_DEVICE, degree, member):
            out = _output(family, model, inputs)
        assert out.shape == whole.shape
        out.square().mean().backward()
        assert {n for n, p in model.named_parameters() if p.grad is not None} == reached
