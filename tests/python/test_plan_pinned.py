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
        lens,
        160_000,
        num_replicas=8,
        rank=0,
        micro_batches_per_step=4,
        seed=3,
        composition="balanced",
    ),
    "adaptive_mixed": lambda lens: AdaptiveBatchSampler(
        lens,
        160_000,
        num_replicas=2,
        rank=0,
        micro_batches_per_step=4,
        lookahead_steps=16,
        composition="balanced",
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
        lens,
        100_000,
        num_replicas=4,
        rank=0,
        seed=9,
        drop_last=True,
        lookahead_steps=8,
        composition="balanced",
    ),
    "adaptive_bs1": lambda lens: AdaptiveBatchSampler(
        lens,
        160_000,
        num_replicas=8,
        rank=0,
        micro_batches_per_step=4,
        max_batch_size=1,
        composition="balanced",
    ),
    "adaptive_uneven": lambda lens: AdaptiveBatchSampler(
        lens,
        160_000,
        num_replicas=8,
        rank=0,
        micro_batches_per_step=4,
        uneven_counts=True,
        composition="balanced",
    ),
    "adaptive_groups": lambda lens: AdaptiveBatchSampler(
        lens,
        160_000,
        num_replicas=4,
        rank=0,
        micro_batches_per_step=2,
        group_keys=[(int(s) % 7, int(s) > 20000) for s in lens],
        composition="balanced",
    ),
    "adaptive_memory": lambda lens: AdaptiveBatchSampler(
        lens,
        None,
        num_replicas=4,
        rank=0,
        micro_batches_per_step=2,
        memory_model=memory(),
        memory_budget_gib=60.0,
        composition="balanced",
    ),
    "adaptive_unbalanced": lambda lens: AdaptiveBatchSampler(
        lens, 160_000, num_replicas=4, rank=0, balance=False, shuffle=False
    ),
    # The default rule since 2026-12-07: steps as representative as a shuffle.
    "representative_k1": lambda lens: AdaptiveBatchSampler(
        lens, 100_000, num_replicas=4, rank=0, seed=9, lookahead_steps=8
    ),
    "representative_k4": lambda lens: AdaptiveBatchSampler(
        lens, 160_000, num_replicas=8, rank=0, micro_batches_per_step=4, seed=3
    ),
    "representative_bs1": lambda lens: AdaptiveBatchSampler(
        lens, 160_000, num_replicas=8, rank=0, micro_batches_per_step=4, max_batch_size=1
    ),
    "representative_uneven": lambda lens: AdaptiveBatchSampler(
        lens, 160_000, num_replicas=8, rank=0, micro_batches_per_step=4, uneven_counts=True
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
# Every case that halves re-recorded when the halved micro-batches were spread over the epoch,
# each half in its micro-batch's place, balanced or not (equal-size micro-batches halved
# instead of the earliest: the same samples and micro-batch sizes, the halves elsewhere; the
# plans after a resume hold what the changed first half left).
# When composition="representative" became the default (2026-12-07), the cases that planned
# with the default rule were given composition="balanced" and kept their digests (the rule of
# the tolerance plans as before, bit for bit); the representative_* cases were recorded then.
PINNED = {
    "adaptive_bs1": [
        "c3f5d7f90b03d796704ed674",
        "d610b0ac998337f98c7d35a9",
        "c0f2ee269ee1de4668acb274",
    ],
    "adaptive_groups": [
        "2c782329415cfbb51db8dcd3",
        "0b5fbe12383db53b36f0d6c9",
        "f8de7bffb6ec84a638f54802",
    ],
    "adaptive_k1_drop": [
        "69cda55eac799113b86249d0",
        "a53c2f28d91e9b8af8d768fc",
        "1fb41a3d40b3df5523a3b5fe",
    ],
    "adaptive_k4": [
        "942773959127afcf3eb3c2fe",
        "89697a2e1cdb1d9fe66b2c6e",
        "c0aaadaedb20e068a7e74634",
    ],
    "adaptive_memory": [
        "a0ce58d4f3f60537ff83463a",
        "250e076d679743e2ff473da7",
        "068e843eb311ee7b5936ea54",
    ],
    "adaptive_mix0": [
        "b34bc5912938bcbd06363104",
        "e847fcb9605e1eacce4a65a0",
        "65264531f4d50b2e4dec10ac",
    ],
    "adaptive_mixed": [
        "5ad3023529b86a3b5050d2a1",
        "3e55ba4c05f7cc02ca34f6f1",
        "b9656d5eb5d55d1086b56bc6",
    ],
    "adaptive_unbalanced": [
        "6d14ad33068567fe17b644f3",
        "6d14ad33068567fe17b644f3",
        "519d3da47348c63b914a8b5c",
    ],
    "adaptive_uneven": [
        "a8b9936521008087890c4715",
        "4fdcdce2064f2589c4af4719",
        "2e40ce770cc3acddafa729cc",
    ],
    "representative_bs1": [
        "831f1e4fe98226e417709f3b",
        "4100e43ac5d8dbad5b1b6e52",
        "334f69d75ef4e83bf8fb0cf8",
    ],
    "representative_k1": [
        "a2a9f2cfa3b489bb70799a05",
        "f47d381daca81c728a1d1fda",
        "c934cb4e675169ae3c548c19",
    ],
    "representative_k4": [
        "d5d7f643de7c856dec6e054b",
        "95d55821e3e8d62ada9b0413",
        "c3254687dd4d0b166b99b3a0",
    ],
    "representative_uneven": [
        "07dbaf34082bf9f60deffc53",
        "df51a7f15cf6e1f2f67a4707",
        "0648cade396d22fbda53d2e2",
    ],
    "equal_token": [
        "71b37c1088cc184a344d7f24",
        "d8413babeab65a9e57cba834",
        "c8d96dc3293d3cee2486829d",
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
