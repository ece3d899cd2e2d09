"""Plans pinned bit for bit: a digest of every array of the plan (samples, offsets, costs,
tokens, padding, skipped, checkpointed blocks, uneven offsets, window strata) for fixed
seeds and settings, recorded before the sampler became a package (adaptiveload/sampler/).

A refactor that changes no behaviour keeps every digest. A change that means to plan
differently updates them here, in its own commit, saying why: a user's resumed run replays
its plan only while the plan for the same settings stays the same."""

import hashlib

import numpy as np
import pytest

from adaptiveload import AdaptiveBatchSampler, EqualTokenBatchSampler, MemoryModel

SHAPES = np.array([1560, 3600, 14040, 32760, 46800, 75600])


def dataset(n=2000, seed=11):
    rng = np.random.default_rng(seed)
    lens = rng.choice(SHAPES, size=n, p=[0.3, 0.1, 0.25, 0.15, 0.1, 0.1])
    return lens


def memory():
    return MemoryModel(30, m0=20e9, mb=1e6, mbk=2e5, mt=1e4, ma=1.3e5, mr=1.3e5)


CASES = {
    "adaptive_k4": lambda lens: AdaptiveBatchSampler(
        lens, 160_000, num_replicas=8, rank=0, micro_batches_per_step=4, seed=3
    ),
    "adaptive_mixed": lambda lens: AdaptiveBatchSampler(
        lens, 160_000, num_replicas=2, rank=0, micro_batches_per_step=4, lookahead_steps=16
    ),
    "adaptive_mix0": lambda lens: AdaptiveBatchSampler(
        lens,
        160_000,
        num_replicas=2,
        rank=0,
        micro_batches_per_step=4,
        lookahead_steps=16,
        mix_tolerance=0,
    ),
    "adaptive_k1_drop": lambda lens: AdaptiveBatchSampler(
        lens, 100_000, num_replicas=4, rank=0, seed=9, drop_last=True, lookahead_steps=8
    ),
    "adaptive_bs1": lambda lens: AdaptiveBatchSampler(
        lens, 160_000, num_replicas=8, rank=0, micro_batches_per_step=4, max_batch_size=1
    ),
    "adaptive_uneven": lambda lens: AdaptiveBatchSampler(
        lens, 160_000, num_replicas=8, rank=0, micro_batches_per_step=4, uneven_counts=True
    ),
    "adaptive_groups": lambda lens: AdaptiveBatchSampler(
        lens,
        160_000,
        num_replicas=4,
        rank=0,
        micro_batches_per_step=2,
        group_keys=[(int(s) % 7, int(s) > 20000) for s in lens],
    ),
    "adaptive_memory": lambda lens: AdaptiveBatchSampler(
        lens,
        None,
        num_replicas=4,
        rank=0,
        micro_batches_per_step=2,
        memory_model=memory(),
        memory_budget_gib=60.0,
    ),
    "adaptive_unbalanced": lambda lens: AdaptiveBatchSampler(
        lens, 160_000, num_replicas=4, rank=0, balance=False, shuffle=False
    ),
    "equal_token": lambda lens: EqualTokenBatchSampler(
        lens, 160_000, num_replicas=8, rank=0, micro_batches_per_step=4, seed=3
    ),
    "equal_token_bs1": lambda lens: EqualTokenBatchSampler(
        lens, 160_000, num_replicas=8, rank=0, micro_batches_per_step=4, max_batch_size=1
    ),
}

# Recorded at 82bf7d1 (sampler.py as one module), epochs 0 and 1 of each case, then the
# plan of the samples left after a resume with other settings (the same case, K + 1).
# adaptive_unbalanced and equal_token re-recorded at 7877f06: without balancing, a halved
# micro-batch's halves take its place instead of filling the last step (the same
# micro-batches, in another order).
PINNED = {
    "adaptive_bs1": [
        "c3f5d7f90b03d796704ed674",
        "d610b0ac998337f98c7d35a9",
        "c0f2ee269ee1de4668acb274",
    ],
    "adaptive_groups": [
        "a372d6b44c112bced1b6eff2",
        "1bbd1f5474ed815a8a8ab462",
        "60fc34714660fc4756a899c6",
    ],
    "adaptive_k1_drop": [
        "69cda55eac799113b86249d0",
        "a53c2f28d91e9b8af8d768fc",
        "1fb41a3d40b3df5523a3b5fe",
    ],
    "adaptive_k4": [
        "8787148d3827e9b49b0a9f6a",
        "a1022a3b7a736cb660809b09",
        "3c3cbf3f531c99cf6677264c",
    ],
    "adaptive_memory": [
        "b6ea84cdded07761e4bd5d23",
        "8e91c8f62ce53797e06757e9",
        "2918f19657dd7635f216d18a",
    ],
    "adaptive_mix0": [
        "a1880385fb76dfbc5fafaf17",
        "32c54c1c72e573a2e16f5807",
        "13867c5107c7bfacd4b76839",
    ],
    "adaptive_mixed": [
        "97407bab1654d7656444d018",
        "9113620a2c15061a4e1e5b32",
        "521b490a42a286bf8dec73c5",
    ],
    "adaptive_unbalanced": [
        "a74a4bbdc50bcbb276608e84",
        "a74a4bbdc50bcbb276608e84",
        "519d3da47348c63b914a8b5c",
    ],
    "adaptive_uneven": [
        "ea027bf584a5442180e1fc14",
        "5720a0ebba5eebc599c26737",
        "83036a6f131e5cbcbc8ded7c",
    ],
    "equal_token": [
        "8ecabd0bf03c4c6b39d0770c",
        "c0ebd2c7bddd21e9ee0ce2a8",
        "0903dd9f5ef5b63ffdaf598a",
    ],
    "equal_token_bs1": [
        "7ee95cd326517647194214b5",
        "46c52304407128c7d49a9a1f",
        "7c26e341be9f252f6612ecb1",
    ],
}


def digest(plan) -> str:
    h = hashlib.blake2b(digest_size=12)
    for name in ("samples", "offsets", "costs", "tokens", "padding", "skipped"):
        h.update(name.encode())
        h.update(np.ascontiguousarray(getattr(plan, name)).tobytes())
    for name in ("checkpointed", "rank_offsets", "window_strata"):
        a = getattr(plan, name)
        h.update(name.encode() + (b"-" if a is None else np.ascontiguousarray(a).tobytes()))
    h.update(repr((plan.num_steps, plan.num_padded_samples, plan.num_dropped_samples)).encode())
    h.update(repr((plan.num_split_micro_batches, plan.max_tokens, plan.max_cost)).encode())
    return h.hexdigest()


def digests(case: str) -> list[str]:
    lens = dataset()
    s = CASES[case](lens)
    out = [digest(s.plan())]
    s.set_epoch(1)
    out.append(digest(s.plan()))
    # Resume with other settings halfway through epoch 1: the rest of the epoch re-planned.
    half = s.plan().num_steps // 2
    state = s.state_dict(steps_done=half)
    state["fingerprint"] = dict(state["fingerprint"], seed=state["fingerprint"]["seed"] + 1)
    fresh = CASES[case](lens)
    fresh.load_state_dict(state)
    out.append(digest(fresh.plan()))
    return out


@pytest.mark.parametrize("case", sorted(CASES))
def test_plans_are_pinned(case):
    assert digests(case) == PINNED[case]


if __name__ == "__main__":  # prints the table above, to update it on purpose
    for case in sorted(CASES):
        print(f"    {case!r}: {digests(case)!r},")


# The plan's index arithmetic is the C++ planner's (_sampler.PlanLayout): out-of-range steps,
# ranks and micro-batches are refused, never wrapped as numpy's negative indices would be.
@pytest.mark.parametrize("uneven", [False, True])
def test_plan_index_arithmetic_refuses_what_is_out_of_range(uneven):
    s = AdaptiveBatchSampler(
        dataset(), 160_000, num_replicas=4, rank=0, micro_batches_per_step=2, uneven_counts=uneven
    )
    plan = s.plan()
    t = plan.num_steps - 1
    last = plan.micro_batches_in_step(t, 3) - 1
    assert plan.micro_batch_id(t, 3, last) < plan.num_micro_batches
    for step, rank, k in [
        (-1, 0, 0),
        (plan.num_steps, 0, 0),
        (0, 4, 0),
        (0, -1, 0),
        (t, 3, last + 1),
    ]:
        with pytest.raises(IndexError, match="out of range"):
            plan.micro_batch_id(step, rank, k)
    with pytest.raises(IndexError, match="rank 4 out of range"):
        plan.rank_step_starts(4)
    with pytest.raises(ValueError, match="one value per micro-batch"):
        plan.rank_sums(np.ones(plan.num_micro_batches - 1))
    counts = plan.rank_sums(np.ones(plan.num_micro_batches, dtype=np.int64))
    assert counts.dtype == np.int64 and counts.sum() == plan.num_micro_batches
