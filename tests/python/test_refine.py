"""Online refinement of the sampler's cost model: record_time, update_cost_model, and the
learned times in sampler states, on one process and in real gloo process groups.

Every test draws fresh lengths and times (the seed is printed, shown on failure) and
compares with a reference: a sampler made with the expected measured kinds from the start,
a sampler that never learns, or the fold computed here from the recorded times."""

import copy
import hashlib
import math
import pickle
import warnings

import numpy as np
import pytest
import torch

from adaptiveload import AdaptiveBatchSampler, CostModel, EqualTokenBatchSampler
from adaptiveload.fit import Point, fit_cost_model
from processes import run_on_ranks

WAN_LENGTHS = [1560, 3600, 14040, 32760, 46800, 75600]
MAX_TOKENS = 151200


def lengths(seed, n=None):
    rng = np.random.default_rng(seed)
    n = n or int(rng.integers(300, 700))
    return rng.choice(WAN_LENGTHS, size=n, p=[0.4, 0.1, 0.1, 0.2, 0.05, 0.15])


DEFAULT = CostModel.default()


def true_ms(seq_len, batch):
    """Times on the default model's scale, but not its shape: long samples cost 1.8x what
    it predicts, the others 0.8x."""
    return DEFAULT.batch_cost([seq_len] * batch) * (1.8 if seq_len > 40000 else 0.8)


def measured(lens, mb, rng, skew=1.0):
    return true_ms(int(lens[mb[0]]), len(mb)) * skew * (1 + 0.05 * rng.random())


def refined(base, learned):
    """The model a sampler with the default max_cost plans with after learning ``learned``:
    with 8 kinds or more, the form fit_cost_model picks, refit to them and rounded to 6
    significant digits; ``base`` otherwise; and the learned kinds measured."""
    if len(learned) >= 8:
        fit = fit_cost_model([Point(b, s, ms, 0) for (s, b), ms in sorted(learned.items())])
        d = fit.to_dict()
        d = {k: float(f"{v:.6g}") if isinstance(v, float) else v for k, v in d.items()}
        if "floor" in d:
            d["floor"] = {k: float(f"{v:.6g}") for k, v in d["floor"].items()}
        d["meta"] = {**base.meta, "refit": fit.meta["form"]}
        base = CostModel.from_dict(d)
    return base.with_measured(learned)


def make(lens, cls=AdaptiveBatchSampler, **kw):
    kw = {"num_replicas": 4, "rank": 0, "micro_batches_per_step": 2, "seed": 3} | kw
    return cls(lens, MAX_TOKENS, **kw)


def plan_arrays(plan):
    return plan.samples.tolist(), plan.offsets.tolist(), plan.costs.tolist()


def kind(lens, mb):
    return int(lens[mb[0]]), len(mb)


def lower_median(times):
    return sorted(times)[(len(times) - 1) // 2]


class Fold:
    """The reference: the most recent 32 times per kind, in the order given."""

    def __init__(self):
        self.history = {}

    def add(self, k, ms):
        self.history[k] = (self.history.get(k, []) + [ms])[-32:]

    def medians(self):
        return {k: lower_median(t) for k, t in self.history.items()}


def record_epoch(sampler, lens, rng, fold, *, ranks=None):
    """Records every micro-batch of the current plan (as if the ranks' records were
    gathered), in the order update_cost_model folds them: rank after rank."""
    plan = sampler.plan()
    count = 0
    for r in range(plan.num_replicas) if ranks is None else ranks:
        for mb in plan.rank_micro_batches(r):
            ms = measured(lens, mb, rng)
            assert sampler.record_time(mb.tolist(), ms)
            fold.add(kind(lens, mb), ms)
            count += 1
    return count


def covers_once(plan, n):
    drawn = np.concatenate([np.concatenate(list(plan.rank_micro_batches(r))) for r in range(4)])
    assert set(drawn.tolist()) == set(range(n)), "a sample is missing from the epoch"
    assert len(drawn) == n + plan.num_padded_samples, "a sample repeats within the epoch"


# -- one process ------------------------------------------------------------------------------


def test_update_changes_the_next_epoch_and_not_the_current(seed):
    lens = lengths(seed)
    rng = np.random.default_rng(seed + 1)
    s, never = make(lens), make(lens)
    it = iter(s)
    first = [next(it) for _ in range(5)]
    fold = Fold()
    records = record_epoch(s, lens, rng, fold)
    summary = s.update_cost_model()
    expected = fold.medians()
    fitted = np.array([CostModel.default().fitted().batch_cost([sl] * b) for sl, b in expected])
    ratio = lower_median((np.array(list(expected.values())) / fitted).tolist())
    assert summary == {
        "records": records,
        "kinds": len(expected),
        "new_kinds": len(expected),
        "measured_over_fitted": pytest.approx(ratio),
    }
    # The current epoch goes on with its plan.
    assert first + list(it) == list(never)
    assert plan_arrays(s.plan()) == plan_arrays(never.plan())
    assert s.cost_model.to_dict() == never.cost_model.to_dict()
    # The next plans with the learned kinds, as a sampler given them from the start does.
    s.set_epoch(1)
    never.set_epoch(1)
    given = make(lens, cost_model=refined(CostModel.default(), expected))
    given.set_epoch(1)
    assert s.cost_model.measured == expected
    assert s.cost_model.to_dict() == given.cost_model.to_dict()
    assert s.max_cost == given.max_cost
    assert plan_arrays(s.plan()) == plan_arrays(given.plan())
    assert plan_arrays(s.plan()) != plan_arrays(never.plan())
    plan = s.plan()
    for m in range(plan.num_micro_batches):
        mb = plan.samples[plan.offsets[m] : plan.offsets[m + 1]]
        if kind(lens, mb) in expected:
            assert plan.costs[m] == expected[kind(lens, mb)]
    assert list(s) == list(given)
    covers_once(plan, len(lens))


@pytest.mark.parametrize("drop_last", [False, True])
def test_every_sample_once_per_epoch_across_updates(seed, drop_last):
    lens = lengths(seed)
    rng = np.random.default_rng(seed + 1)
    s, never = make(lens, drop_last=drop_last), make(lens, drop_last=drop_last)
    fold, changed = Fold(), False
    for epoch in range(4):
        s.set_epoch(epoch)
        never.set_epoch(epoch)
        plan = s.plan()
        mine = []
        for i, mb in enumerate(s):
            mine.append(mb)
            if i == len(s) // 2:  # an update mid-epoch changes nothing of this epoch
                record_epoch(s, lens, rng, fold, ranks=[1, 3])
                s.update_cost_model()
        assert plan_arrays(s.plan()) == plan_arrays(plan)
        assert mine == [mb.tolist() for mb in plan.rank_micro_batches(0)]
        if drop_last:
            drawn = [i for r in range(4) for mb in plan.rank_micro_batches(r) for i in mb]
            assert len(drawn) == len(set(drawn)) == len(lens) - plan.num_dropped_samples
        else:
            covers_once(plan, len(lens))
        record_epoch(s, lens, rng, fold, ranks=[0, 2])
        s.update_cost_model()
        changed |= plan_arrays(plan) != plan_arrays(never.plan())
    s.set_epoch(4)
    assert s.cost_model.measured == fold.medians()
    assert changed


def test_the_most_recent_32_times_per_kind_and_their_lower_median(seed):
    rng = np.random.default_rng(seed)
    lens = np.full(100, 3600)
    s = make(lens)
    times = rng.uniform(1000, 2000, size=45).tolist()
    for t in times[:40]:
        s.record_time(rng.choice(100, size=3).tolist(), t)
    assert s.update_cost_model()["records"] == 40
    for t in times[40:]:
        s.record_time(rng.choice(100, size=3).tolist(), t)
    summary = s.update_cost_model()
    assert (summary["records"], summary["kinds"], summary["new_kinds"]) == (5, 1, 0)
    s.set_epoch(1)
    recent = times[-32:]
    assert s.cost_model.measured == {(3600, 3): sorted(recent)[15]}
    # Of two records, the faster (a cold first run is the slower one).
    s = make(lens)
    s.record_time([0], 1500.0)
    s.record_time([1], 600.0)
    s.update_cost_model()
    s.set_epoch(1)
    assert s.cost_model.measured == {(3600, 1): 600.0}


def test_mixed_length_micro_batches_are_not_recorded(seed):
    lens = lengths(seed)
    rng = np.random.default_rng(seed + 1)
    # One group key for all: micro-batches mix lengths.
    s = make(lens, group_keys=np.zeros(len(lens), np.int64))
    plan = s.plan()
    uniform = 0
    for m in range(plan.num_micro_batches):
        mb = plan.samples[plan.offsets[m] : plan.offsets[m + 1]]
        one_length = len(set(lens[mb].tolist())) == 1
        ms = DEFAULT.batch_cost(lens[mb]) * (1 + 0.1 * rng.random())
        assert s.record_time(mb, ms) is one_length
        uniform += one_length
    assert uniform < plan.num_micro_batches
    assert s.update_cost_model()["records"] == uniform
    a, b = (int(i) for i in np.flatnonzero(lens == lens[0])[:2])
    other = int(np.flatnonzero(lens != lens[0])[0])
    assert s.record_time([a, other], DEFAULT.batch_cost(lens[[a, other]])) is False
    assert s.record_time(torch.tensor([a, b]), DEFAULT.batch_cost(lens[[a, b]])) is True
    assert s.update_cost_model()["records"] == 1


def test_bad_input_is_rejected():
    lens = np.array([1560, 1560, 3600])
    s = make(lens)
    for ms in (0, -1.0, math.nan, math.inf, "3", True, None, [1.0], torch.tensor(2.0)):
        with pytest.raises(ValueError, match="ms must be a finite number > 0"):
            s.record_time([0], ms)
    for idx in ([], [[0, 1]], [3], [-1], [0.5], "ab", 7):
        with pytest.raises(ValueError, match="indices"):
            s.record_time(idx, 1.0)
    with pytest.raises(ValueError, match="process_group given but torch.distributed"):
        s.update_cost_model(process_group=object())
    assert s.update_cost_model()["records"] == 0


def test_state_round_trip_mid_epoch_after_refinement_replays_exactly(seed):
    lens = lengths(seed)
    rng = np.random.default_rng(seed + 1)
    s = make(lens, rank=1)
    fold = Fold()
    record_epoch(s, lens, rng, fold)
    s.update_cost_model()
    s.set_epoch(1)
    active = fold.medians()
    it = iter(s)
    done = [next(it) for _ in range(3)]
    record_epoch(s, lens, rng, fold, ranks=[2, 3])
    s.update_cost_model()
    pending = fold.medians()
    s.record_time(done[0], 1.0)  # not folded: not in the state
    state = s.state_dict(micro_batches_done=3)
    assert state["learned_costs"] == {
        "active": [[sl, b, ms] for (sl, b), ms in sorted(active.items())],
        "history": [[sl, b, t] for (sl, b), t in sorted(fold.history.items())],
    }
    for fresh in (make(lens, rank=1), pickle.loads(pickle.dumps(make(lens, rank=1)))):
        fresh.load_state_dict(copy.deepcopy(state))
        assert fresh.cost_model.to_dict() == s.cost_model.to_dict()
        assert fresh.start_micro_batch == 3
        assert plan_arrays(fresh.plan()) == plan_arrays(s.plan())
        assert fresh.state_dict(micro_batches_done=3) == state
    rest = list(it)
    assert done + rest == [mb.tolist() for mb in s.plan().rank_micro_batches(1)]
    assert list(fresh) == rest
    # The next epoch plans with the pending times, on both.
    for sampler in (s, fresh):
        sampler.set_epoch(2)
        assert sampler.cost_model.measured == pending
    assert pending != active
    assert plan_arrays(fresh.plan()) == plan_arrays(s.plan())
    assert fresh.state_dict() == s.state_dict()
    # Unfolded records do not survive a load: the fresh sampler folds nothing.
    assert fresh.update_cost_model()["records"] == 0


def test_a_state_without_learned_costs_learned_nothing(seed):
    lens = lengths(seed)
    rng = np.random.default_rng(seed + 1)
    plain = make(lens)
    plain.set_epoch(1)
    it = iter(plain)
    done = [next(it) for _ in range(4)]
    state = plain.state_dict(micro_batches_done=4)
    assert "learned_costs" not in state  # states of samplers that learn nothing are as before
    learner = make(lens)
    record_epoch(learner, lens, rng, Fold())
    learner.update_cost_model()
    learner.set_epoch(3)
    assert learner.cost_model.measured
    learner.load_state_dict(state)
    assert learner.cost_model.to_dict() == plain.cost_model.to_dict()
    assert list(learner) == list(it)
    learner.set_epoch(2)
    assert learner.cost_model.measured == {}
    # A refined state without its learned times: other settings, so the rest is re-planned.
    s = make(lens)
    record_epoch(s, lens, rng, Fold())
    s.update_cost_model()
    s.set_epoch(1)
    it = iter(s)
    done = [next(it) for _ in range(4)]
    state = s.state_dict(micro_batches_done=4)
    del state["learned_costs"]
    fresh = make(lens, rank=0)
    fresh.load_state_dict(state)
    assert fresh.cost_model.measured == {}
    plan = fresh.plan()
    later = [i for r in range(4) for mb in plan.rank_micro_batches(r) for i in mb]
    consumed = {
        int(i)
        for r in range(4)
        for t, mb in enumerate(s.plan().rank_micro_batches(r))
        if t < 4
        for i in mb
    }
    assert {i for mb in done for i in mb} <= consumed
    assert not consumed & set(later)
    assert consumed | set(later) == set(range(len(lens)))


def test_malformed_learned_costs_are_refused(seed):
    lens = lengths(seed)
    rng = np.random.default_rng(seed + 1)
    s = make(lens)
    record_epoch(s, lens, rng, Fold())
    s.update_cost_model()
    s.set_epoch(1)
    good = s.state_dict()
    target = make(lens)
    before = (target.cost_model.to_dict(), plan_arrays(target.plan()), target.max_cost)
    k = good["learned_costs"]["history"][0]
    for bad in (
        [],
        {"active": []},
        {"active": [], "history": [], "other": 1},
        {"active": [[1560, 1]], "history": []},
        {"active": [[0, 1, 5.0]], "history": []},
        {"active": [[1560, True, 5.0]], "history": []},
        {"active": [[1560, 1, -5.0]], "history": []},
        {"active": [[1560, 1, math.nan]], "history": []},
        {"active": [], "history": [[1560, 1, [1.0] * 33]]},
        {"active": [], "history": [[1560, 1, []]]},
        {"active": [], "history": [[1560, 1, 3.0]]},
        {"active": [], "history": [k, k]},
        {"active": "x", "history": []},
    ):
        state = dict(good, learned_costs=bad)
        with pytest.raises(ValueError, match="learned_costs"):
            target.load_state_dict(state)
        assert (target.cost_model.to_dict(), plan_arrays(target.plan()), target.max_cost) == before
    # A state of another dataset leaves the learned times of the sampler as they were.
    other = make(np.concatenate([lens, [1560]]))
    with pytest.raises(ValueError, match="another dataset"):
        other.load_state_dict(good)
    assert other.cost_model.measured == {}
    target.load_state_dict(good)
    assert target.cost_model.to_dict() == s.cost_model.to_dict()


def test_a_learned_single_sample_kind_above_max_cost_is_held_back(seed):
    lens = lengths(seed)
    s = make(lens, max_cost=45000.0)  # above any sample's predicted cost
    longest = int(np.flatnonzero(lens == 75600)[0])
    shortest = np.flatnonzero(lens == 1560)[:4].tolist()
    for _ in range(3):
        s.record_time([longest], 50000.0)
        s.record_time(shortest, 900.0)
    with pytest.warns(UserWarning, match="exceed max_cost = 45000"):
        s.update_cost_model()
    s.set_epoch(1)
    assert s.cost_model.measured == {(1560, 4): 900.0}
    assert s.max_cost == 45000.0
    covers_once(s.plan(), len(lens))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once per kind
        s.record_time([longest], 60000.0)
        s.update_cost_model()


def test_equal_token_sampler_learns_its_costs_only(seed):
    lens = lengths(seed)
    rng = np.random.default_rng(seed + 1)
    s, never = make(lens, EqualTokenBatchSampler), make(lens, EqualTokenBatchSampler)
    fold = Fold()
    record_epoch(s, lens, rng, fold)
    s.update_cost_model()
    s.set_epoch(1)
    never.set_epoch(1)
    a, b = s.plan(), never.plan()
    assert a.samples.tolist() == b.samples.tolist() and a.offsets.tolist() == b.offsets.tolist()
    learned = fold.medians()
    for m in range(a.num_micro_batches):
        mb = a.samples[a.offsets[m] : a.offsets[m + 1]]
        assert a.costs[m] == learned.get(kind(lens, mb), b.costs[m])


def test_a_base_model_on_another_scale_is_named(seed):
    lens = lengths(seed)
    power = CostModel.power(1.5)  # token^1.5: nothing like milliseconds
    # A max_cost given in the base model's unit: no refit, so the scales differ: a warning.
    cap = 2 * power.batch_cost([int(lens.max())])
    s = make(lens, cost_model=power, max_cost=cap)
    record_epoch(s, lens, np.random.default_rng(seed), Fold())
    with pytest.warns(UserWarning, match="calibrated on this setup"):
        assert s.update_cost_model()["measured_over_fitted"] < 0.5


def test_default_cap_refits_the_fitted_form_to_the_measured_scale(seed):
    lens = lengths(seed)
    rng = np.random.default_rng(seed + 7)
    s = make(lens, cost_model=CostModel.power(1.5))
    fold = Fold()
    record_epoch(s, lens, rng, fold)
    learned = fold.medians()
    assert len(learned) >= 8, "the test needs enough kinds to refit"
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the refit puts every kind on one scale: no warning
        s.update_cost_model()
    s.set_epoch(1)
    want = refined(CostModel.power(1.5), learned)
    assert s.cost_model.to_dict() == want.to_dict()
    assert s.cost_model.to_dict()["kind"] == "polynomial"
    # An unmeasured kind is now costed in ms, near what the true times say.
    sl, b = max(learned, key=lambda k: k[0])
    other = (sl, b + 1) if (sl, b + 1) not in learned else (sl, b + 2)
    assert s.cost_model.batch_cost([other[0]] * other[1]) == pytest.approx(true_ms(*other), rel=0.5)


# -- real gloo process groups -----------------------------------------------------------------

EPOCHS = 3


def plan_digest(plan):
    h = hashlib.sha256()
    for a in (plan.samples, plan.offsets, plan.costs):
        h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest()


def refining_ranks(rank, world, seed):
    """Each rank trains its micro-batches, with times of its own (a slower GPU per rank),
    records them, and updates at each epoch's end."""
    lens = lengths(seed, 900)
    rng = np.random.default_rng([seed, rank])
    s = AdaptiveBatchSampler(lens, MAX_TOKENS, micro_batches_per_step=2, seed=seed % 1000)
    epochs = []
    for epoch in range(EPOCHS):
        s.set_epoch(epoch)
        records, batches = [], []
        for mb in s:
            ms = measured(lens, mb, rng, skew=1 + 0.3 * rank)
            assert s.record_time(mb, ms)
            records.append((kind(lens, mb), ms))
            batches.append(mb)
        summary = s.update_cost_model()
        epochs.append(
            {
                "digest": plan_digest(s.plan()),
                "cost_model": s.cost_model.to_dict(),
                "summary": summary,
                "records": records,
                "batches": batches,
                "padded": s.plan().num_padded_samples,
            }
        )
    s.set_epoch(EPOCHS)
    return {"epochs": epochs, "final": s.cost_model.to_dict(), "state": s.state_dict()}


@pytest.mark.distributed
@pytest.mark.parametrize("world", [2, 3])
def test_ranks_with_their_own_times_plan_alike(tmp_path, seed, world):
    results = run_on_ranks(refining_ranks, world, tmp_path, "refine", seed)
    lens = lengths(seed, 900)
    never = AdaptiveBatchSampler(
        lens, MAX_TOKENS, num_replicas=world, rank=0, micro_batches_per_step=2, seed=seed % 1000
    )
    fold = Fold()
    for epoch in range(EPOCHS):
        mine = [r["epochs"][epoch] for r in results]
        for key in ("digest", "cost_model", "summary"):
            assert all(m[key] == mine[0][key] for m in mine), (
                f"epoch {epoch}: ranks differ in {key}"
            )
        # The epoch's cost model is the fold of the earlier epochs' times, in rank order.
        got = {
            (k["seq_len"], k["batch"]): k["cost"] for k in mine[0]["cost_model"].get("measured", [])
        }
        assert got == fold.medians(), f"epoch {epoch}"
        for m in mine:
            for k, ms in m["records"]:
                fold.add(k, ms)
        assert mine[0]["summary"]["records"] == sum(len(m["records"]) for m in mine)
        drawn = [i for m in mine for mb in m["batches"] for i in mb]
        assert set(drawn) == set(range(len(lens))) and len(drawn) == len(lens) + mine[0]["padded"]
        never.set_epoch(epoch)
        assert (mine[0]["digest"] == plan_digest(never.plan())) == (epoch == 0)
    final = {(k["seq_len"], k["batch"]): k["cost"] for k in results[0]["final"]["measured"]}
    assert final == fold.medians()
    assert all(r["final"] == results[0]["final"] for r in results)
    assert all(r["state"] == results[0]["state"] for r in results), "ranks' states differ"


def skipping_update(rank, world):
    """Rank 0 updates its cost model, the others go straight on to the next epoch."""
    s = AdaptiveBatchSampler(lengths(5, 300), MAX_TOKENS, micro_batches_per_step=2, seed=5)
    for mb in s:
        s.record_time(mb, 1.0)
    try:
        if rank == 0:
            s.update_cost_model()
        s.set_epoch(1)
        list(s)
    except RuntimeError as e:
        return {"raised": str(e)}
    return {"raised": None}


@pytest.mark.distributed
def test_a_rank_that_skips_update_cost_model_fails_every_rank_naming_the_call(tmp_path):
    results = run_on_ranks(skipping_update, 2, tmp_path, "skip")
    for r in results:
        assert r["raised"] is not None, "a rank went on past the mismatched collective"
        assert "not in the same collective call" in r["raised"]
        assert "rank 0 called update_cost_model()" in r["raised"]
        assert "rank 1 started an epoch" in r["raised"]
