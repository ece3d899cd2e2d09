"""The memory model with activation checkpointing, its fit, and the sampler's memory policy.

Every test draws fresh lengths (the seed is printed, shown on failure) and compares with a
reference computed here: the fewest blocks by trying every count, the peak formula written
out, the cost model times the time factor."""

import json
import pickle
import warnings

import numpy as np
import pytest

from adaptiveload import AdaptiveBatchSampler, CheckpointPolicy, CostModel, MemoryModel
from adaptiveload.fit import MEMORY_SLACK, fit_checkpoint_memory_model
from adaptiveload.memory import GIB

WAN_LENGTHS = [1560, 3600, 14040, 32760, 46800, 75600]
L = 30


def wan_memory(margin=0.05, share=0.25):
    return MemoryModel(
        L, m0=20e9, mb=1e6, mbk=2e5, mt=1e4, ma=1.3e5, mr=1.3e5, margin=margin,
        recompute_share=share,
    )  # fmt: skip


def peak_formula(m: MemoryModel, lens, n):
    c = m.coefficients()
    t = sum(lens)
    return (
        c["m0"]
        + (c["mb"] + c["mbk"] * max(m.num_blocks - n, 1)) * len(lens)
        + t * (c["mt"] + c["ma"] * max(m.num_blocks - n, 1) + c["mc"] * n + (c["mr"] if n else 0.0))
    )


def fewest(m: MemoryModel, lens, budget):
    for n in range(m.num_blocks + 1):
        if peak_formula(m, lens, n) * (1 + m.margin) <= budget:
            return n
    return -1


def lengths(seed, n=None):
    rng = np.random.default_rng(seed)
    n = n or int(rng.integers(400, 900))
    return rng.choice(WAN_LENGTHS, size=n, p=[0.4, 0.1, 0.1, 0.2, 0.05, 0.15])


def test_peak_and_policy_match_the_formula(seed):
    rng = np.random.default_rng(seed)
    m = wan_memory()
    for _ in range(200):
        lens = list(rng.choice(WAN_LENGTHS, size=int(rng.integers(1, 8))))
        n = int(rng.integers(0, L + 1))
        assert m.peak_bytes(lens, n) == pytest.approx(peak_formula(m, lens, n), rel=1e-12)
        budget = float(rng.uniform(20, 140)) * GIB
        assert m.checkpointed_blocks(lens, budget) == fewest(m, lens, budget)
    assert m.time_factor(0) == pytest.approx(0.75)
    assert m.time_factor(L) == 1.0


def test_max_tokens_is_the_largest_that_fits():
    m = wan_memory()
    budget = 60 * GIB
    t = m.max_tokens(budget)
    assert m.checkpointed_blocks([t], budget) >= 0
    assert m.checkpointed_blocks([t + 1], budget) == -1


def test_bad_models_and_arguments_are_refused():
    with pytest.raises(ValueError, match="ma"):
        MemoryModel(L, m0=1e9, ma=-1.0)
    with pytest.raises(ValueError, match="num_blocks"):
        MemoryModel(0, m0=1e9, ma=1.0)
    with pytest.raises(ValueError, match="recompute_share"):
        MemoryModel(L, m0=1e9, ma=1.0, recompute_share=1.0)
    m = wan_memory()
    with pytest.raises(ValueError, match=r"checkpointed must be in \[0, 30\]"):
        m.peak_bytes([1000], 31)
    with pytest.raises(ValueError, match="seq_lens"):
        m.peak_bytes([], 0)
    with pytest.raises(ValueError, match="unknown fields"):
        MemoryModel.from_dict(m.to_dict() | {"bogus": 1})


def test_save_load_round_trip(tmp_path):
    m = wan_memory()
    m.meta["note"] = "x"
    path = tmp_path / "mem.json"
    m.save(path)
    assert MemoryModel.load(path) == m
    # A calibration file holds it under "memory_model".
    path.write_text(json.dumps({"memory_model": m.to_dict(), "other": 1}))
    assert MemoryModel.load(path) == m
    assert pickle.loads(pickle.dumps(m)) == m


def test_fit_recovers_the_model_and_bounds_the_points(seed):
    rng = np.random.default_rng(seed)
    true = MemoryModel(6, m0=3e9, mb=2e6, mbk=1.5e6, mt=2e4, ma=1.3e5, mr=1.2e5)
    rows = []
    for s in (1560, 6240, 32760, 75600):
        for b in (1, 2, 3, 40):
            for n in (0, 2, 6):
                noise = 1 + rng.normal(0, 0.004)
                ms = 10.0 * b * (1 - 0.3 * (6 - n) / 6) * (1 + rng.normal(0, 0.002))
                rows.append(
                    {
                        "seq_len": s,
                        "batch": b,
                        "checkpointed": n,
                        "peak_bytes": true.peak_bytes([s] * b, n) * noise,
                        "ms": ms,
                    }
                )
    m = fit_checkpoint_memory_model(rows, 6)
    assert m.meta["error_median"] < 0.01
    assert m.recompute_share == pytest.approx(0.3, abs=0.01)
    assert m.margin >= MEMORY_SLACK
    for r in rows:  # never under-predicts a measured point beyond the margin
        pred = m.peak_bytes([r["seq_len"]] * r["batch"], r["checkpointed"])
        assert r["peak_bytes"] <= pred * (1 + m.margin)
    # Predictions at unmeasured points within 2% of the truth.
    for s, b, n in ((14040, 2, 3), (46800, 1, 1), (3600, 3, 5), (1560, 20, 2)):
        assert m.peak_bytes([s] * b, n) == pytest.approx(true.peak_bytes([s] * b, n), rel=0.02)


def test_fit_refuses_bad_rows():
    with pytest.raises(ValueError, match=">= 3 rows"):
        fit_checkpoint_memory_model([], 4)
    rows = [{"seq_len": 10, "batch": 1, "checkpointed": 0, "peak_bytes": 0}] * 3
    with pytest.raises(ValueError, match="peak_bytes > 0"):
        fit_checkpoint_memory_model(rows, 4)


def make(lens, budget, model=None, **kw):
    return AdaptiveBatchSampler(
        lens,
        kw.pop("max_tokens", None),
        cost_model=CostModel.wan21_h200("1.3B"),
        num_replicas=kw.pop("num_replicas", 8),
        memory_model=model or wan_memory(),
        memory_budget_gib=budget,
        **kw,
    )


@pytest.mark.parametrize("k", [1, 4])
def test_plan_obeys_budget_with_fewest_blocks_and_costs_include_policy(seed, k):
    lens = lengths(seed)
    budget = float(np.random.default_rng(seed).uniform(50, 120))
    s = make(lens, budget, micro_batches_per_step=k)
    plan = s.plan()
    m = s.memory_model
    base = CostModel.wan21_h200("1.3B")
    seen = np.zeros(len(lens), int)
    assert plan.checkpointed is not None and len(plan.checkpointed) == plan.num_micro_batches
    for mb in range(plan.num_micro_batches):
        idx = plan.samples[plan.offsets[mb] : plan.offsets[mb + 1]]
        if not plan.padding[mb]:
            seen[idx] += 1
        n = int(plan.checkpointed[mb])
        assert n == fewest(m, lens[idx], budget * GIB)
        assert peak_formula(m, lens[idx], n) * (1 + m.margin) <= budget * GIB
        assert plan.costs[mb] == pytest.approx(
            base.batch_cost(lens[idx]) * (1 - 0.25 * (L - n) / L), rel=1e-9
        )
        assert s.checkpointed_blocks(idx) == n
        assert s.memory_policy().blocks_for(lens[idx]) == n
    assert (seen == 1).all(), "every sample exactly once"


def test_budget_too_small_for_a_sample_is_refused_naming_the_budget(seed):
    lens = lengths(seed)
    m = wan_memory()
    too_small = (m.peak_bytes([75600], L) * (1 + m.margin)) / GIB * 0.99
    with pytest.raises(ValueError, match="memory budget"):
        make(lens, too_small, max_tokens=10**6)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        s = make(lens, too_small, max_tokens=10**6, on_oversize="skip")
        skipped = set(s.plan().skipped.tolist())
    assert skipped == set(np.flatnonzero(lens == 75600).tolist())


def test_memory_arguments_go_together():
    lens = [1560] * 10
    with pytest.raises(ValueError, match="go together"):
        AdaptiveBatchSampler(lens, 10000, memory_model=wan_memory())
    with pytest.raises(ValueError, match="go together"):
        AdaptiveBatchSampler(lens, 10000, memory_budget_gib=40)
    with pytest.raises(ValueError, match="max_tokens is required"):
        AdaptiveBatchSampler(lens, None)
    with pytest.raises(ValueError, match="memory_budget_gib"):
        AdaptiveBatchSampler(lens, None, memory_model=wan_memory(), memory_budget_gib=-1)
    with pytest.raises(ValueError, match="needs a sampler made with memory_model"):
        AdaptiveBatchSampler(lens, 10000).checkpointed_blocks([0])


def test_resume_with_same_and_other_budget_loses_nothing(seed):
    lens = lengths(seed)
    s = make(lens, 80.0, micro_batches_per_step=2, num_replicas=2, rank=0, drawn_is_trained=True)
    it = iter(s)
    taken = [next(it) for _ in range(5)]
    state = s.state_dict()
    same = make(lens, 80.0, micro_batches_per_step=2, num_replicas=2, rank=0)
    same.load_state_dict(state)
    assert list(same) == list(it), "same settings replay the rest exactly"
    # Other budget: the rest of the epoch is re-planned, every remaining sample once per rank pair.
    rest = {}
    for r in range(2):
        other = make(lens, 60.0, micro_batches_per_step=2, num_replicas=2, rank=r)
        other.load_state_dict(state)
        rest[r] = [i for b in other for i in b]
    ref = make(lens, 80.0, micro_batches_per_step=2, num_replicas=2, rank=1)
    done1 = [i for b in list(iter(ref))[:5] for i in b]
    done0 = [i for b in taken for i in b]
    allseen = np.bincount(done0 + done1 + rest[0] + rest[1], minlength=len(lens))
    assert (allseen >= 1).all()
    plan = s.plan()
    pad = int(plan.num_padded_samples)
    assert allseen.sum() - len(lens) <= pad + 2 * 8, "no sample repeated beyond padding"


def test_sampler_with_memory_pickles_and_replays(seed):
    lens = lengths(seed)
    s = make(lens, 70.0)
    copy = pickle.loads(pickle.dumps(s))
    assert list(copy) == list(s)
    assert (copy.plan().checkpointed == s.plan().checkpointed).all()


def test_record_time_converts_to_full_checkpointing(seed):
    lens = np.array([1560] * 400)
    s = make(lens, 60.0, num_replicas=1)
    b = next(iter(s))
    n = s.checkpointed_blocks(b)
    assert s.record_time(b, 10.0)
    (rec,) = s._refinement.records.values()
    assert rec[1][-1] == pytest.approx(10.0 / (1 - 0.25 * (L - n) / L))


def test_checkpoint_policy_falls_back_after_oom_and_logs_over_budget():
    logs = []
    p = CheckpointPolicy(wan_memory(), 60.0, log=logs.append)
    lens = [32760]
    n = p.blocks_for(lens)
    assert 0 <= n < L
    assert p.on_oom(lens) is True
    assert p.blocks_for(lens) == L
    assert p.on_oom(lens) is False  # out of memory again at full checkpointing: re-raise
    assert p.blocks_for([32760 // 2]) < L  # other kinds keep their policy
    assert p.check_peak(lens, L, 10 * GIB)
    assert not p.check_peak(lens, n, 70 * GIB)
    r = p.report()
    assert r["over_budget"] == 1 and r["oom_fallback_kinds"] == 1 and r["micro_batches"] == 2
    assert any("out of memory" in m for m in logs) and any("over the budget" in m for m in logs)
    with pytest.raises(ValueError, match="does not fit"):
        p.blocks_for([10**7])
    with pytest.raises(ValueError, match="budget_gib"):
        CheckpointPolicy(wan_memory(), 0)
    # Reserved memory (optimizer state) is added to the budget and the prediction.
    q = CheckpointPolicy(wan_memory(), 60.0, reserved_gib=5.0, log=logs.append)
    assert q.blocks_for(lens) == n
    assert q.check_peak(lens, n, 64 * GIB)
    assert not q.check_peak(lens, n, 66 * GIB)
    assert q.peaks[0]["predicted_bytes"] == pytest.approx(
        wan_memory().peak_bytes(lens, n) + 5 * GIB
    )
