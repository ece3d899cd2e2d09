"""Sequence parallelism over degrees the model's heads do not divide (Ulysses x ring), as the
planner prices it: the ring's communication factor on each share, and in a memory policy the
keys and values a ring member keeps beyond its share. Planning in general:
test_sequence_parallel.py; training through the ring: test_split_ring.py."""

from __future__ import annotations

import numpy as np
import pytest

from adaptiveload import AdaptiveBatchSampler


def make(lens, W=8, **kw):
    kw.setdefault("sequence_parallel", W)
    return AdaptiveBatchSampler(
        lens, kw.pop("max_tokens", 80000), num_replicas=W, rank=0, uneven_counts=True, **kw
    )


def test_ring_beyond_the_heads_is_priced_in_the_plan():
    """A degree the model's heads do not divide runs Ulysses x ring, whose members receive
    ``ring_comm_factor`` times Ulysses' bytes; the planner charges each share that factor on
    its communication (Wan 2.1-1.3B, 12 heads over 8 ranks: 1.43x) and nothing more. Clips that
    only fit split 8 ways give both plans the same micro-batches and degrees, so their costs
    differ by exactly the ring's extra bytes."""
    from adaptiveload.cost import (
        CostModel,
        sequence_parallel_comm_of,
        sequence_parallel_comm_scale_of,
    )
    from adaptiveload.parallel.groups import ring_comm_factor
    from adaptiveload.sampler.resume import fingerprint

    small = CostModel.wan21_h200("1.3B")
    assert small.meta["heads"] == 12 and CostModel.wan21_h200("14B").meta["heads"] == 40
    g = sequence_parallel_comm_scale_of(small, 8)
    assert g[:3] == [1.0, 1.0, 1.0] and g[3] == pytest.approx(ring_comm_factor(8, 12))
    assert g[3] == pytest.approx(1.43, abs=0.005)
    assert sequence_parallel_comm_scale_of(CostModel.wan21_h200("14B"), 8) == [1.0] * 4
    assert sequence_parallel_comm_scale_of(CostModel.power(2.0), 8) == []

    divides = CostModel.from_dict(small.to_dict())
    divides.meta = {**small.meta, "heads": 16}  # 8 divides 16: Ulysses alone
    rng = np.random.default_rng()
    lens = rng.integers(60000, 75601, size=int(rng.integers(24, 48)))
    seed = int(rng.integers(1 << 30))
    plans = [make(lens, max_tokens=10000, cost_model=m, seed=seed).plan() for m in (small, divides)]
    ring, ulysses = plans
    assert (ring.degrees == 8).all() and np.array_equal(ring.degrees, ulysses.degrees)
    assert np.array_equal(ring.samples, ulysses.samples)
    comm = sequence_parallel_comm_of(small)
    whole = np.add.reduceat(lens[ring.samples], ring.offsets[:-1])
    extra = comm * (g[3] - 1.0) * whole * 7 / 64
    np.testing.assert_allclose(ring.costs - ulysses.costs, extra, rtol=1e-9)
    # States saved before the factor was priced re-plan what they did not consume.
    s = make(lens, max_tokens=10000, cost_model=small)
    key = "sequence_parallel_comm_scale"
    assert fingerprint("x", s.options, len(lens), "d", small, 1.0)[key] == g
    assert key not in fingerprint("x", s.options, len(lens), "d", divides, 1.0)


def test_ring_members_keys_and_values_are_in_the_memory_policy():
    """A member of a micro-batch split over a degree the heads do not divide also holds the
    whole samples' keys and values of its head shard for the backward (Wan 2.1-1.3B over 8:
    768 bytes per token per kept block). The plan, ``checkpointed_blocks`` and the policy a
    training loop asks all count it: a budget that holds the longest clip's share with 10
    checkpointed blocks under Ulysses' accounting needs more with the ring's, and one that holds
    it only at its lowest peak under Ulysses' refuses it with the ring."""
    from adaptiveload import MemoryModel
    from adaptiveload.cost import CostModel, sequence_parallel_held_bytes_of
    from adaptiveload.memory import GIB, held_bytes, held_lengths
    from adaptiveload.sampler.resume import fingerprint

    small = CostModel.wan21_h200("1.3B")
    held = sequence_parallel_held_bytes_of(small, 8)
    assert held == [0.0, 0.0, 0.0, pytest.approx(2 * 1536 * 2 / 8)]
    assert sequence_parallel_held_bytes_of(CostModel.wan21_h200("14B"), 8) == []
    assert sequence_parallel_held_bytes_of(CostModel.power(2.0), 8) == []
    divides = CostModel.from_dict(small.to_dict())
    divides.meta = {**small.meta, "heads": 16}  # 8 divides 16: Ulysses alone

    memory = MemoryModel(30, m0=20e9, mb=1e6, mbk=2e5, mt=1e4, ma=1.3e5, mc=2e3, mr=1.3e5,
                         margin=0.05, recompute_share=0.25)  # fmt: skip
    rng = np.random.default_rng()
    lens = rng.integers(60000, 75601, size=int(rng.integers(24, 48)))
    longest = held_lengths([lens.max()], 8)
    seed = int(rng.integers(1 << 30))

    def sampler(cost_model, budget_bytes):
        return make(lens, max_tokens=10000, cost_model=cost_model, seed=seed,
                    memory_model=memory, memory_budget_gib=budget_bytes / GIB)  # fmt: skip

    budget = memory.peak_bytes(longest, 10) * (1 + memory.margin) * (1 + 1e-9)
    ring, ulysses = sampler(small, budget), sampler(divides, budget)
    p, q = ring.plan(), ulysses.plan()
    assert (p.degrees == 8).all() and np.array_equal(p.samples, q.samples)
    policy = ring.memory_policy()
    for m in range(len(p.costs)):
        idx = p.samples[p.offsets[m] : p.offsets[m + 1]]
        share, extra = held_lengths(lens[idx], 8), held_bytes(held, lens[idx], 8)
        n = int(p.checkpointed[m])
        assert extra == pytest.approx(held[3] * lens[idx].sum())
        assert (
            n == memory.checkpointed_blocks(share, budget, extra) == policy.blocks_for(lens[idx], 8)
        )
        assert n == ring.checkpointed_blocks(idx, 8)
        assert memory.peak_bytes(share, n, extra) * (1 + memory.margin) <= budget
        assert int(q.checkpointed[m]) == memory.checkpointed_blocks(share, budget) <= n
    top = int(np.argmax([lens[p.samples[p.offsets[m]]] for m in range(len(p.costs))]))
    assert int(q.checkpointed[top]) == 10 < int(p.checkpointed[top])
    measured = memory.peak_bytes(longest, 12)
    policy.check_peak([lens.max()], 12, measured, 8)  # 18 blocks keep their activations
    assert policy.peaks[-1]["predicted_bytes"] == pytest.approx(
        measured + 18 * held[3] * lens.max()
    )

    # (29 blocks peak lowest: one block keeps its activations either way, mc > 0)
    tight = memory.peak_bytes(longest, 29) * (1 + memory.margin) * (1 + 1e-6)
    assert sampler(divides, tight).plan().checkpointed.max() == 29
    with pytest.raises(ValueError, match="memory budget"):
        sampler(small, tight)
    # States saved before the ring's memory was counted re-plan what they did not consume.
    key = "sequence_parallel_held_bytes"
    assert fingerprint("x", ring.options, len(lens), "d", small, 1.0)[key] == held
    assert key not in fingerprint("x", ulysses.options, len(lens), "d", divides, 1.0)
    plain = make(lens, max_tokens=10000, cost_model=small)
    assert key not in fingerprint("x", plain.options, len(lens), "d", small, 1.0)
