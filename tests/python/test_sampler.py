"""The sampler's Python API: caps, coverage, balance, determinism, resumption, errors."""

import collections
import json
import pickle
import warnings

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils.data import DataLoader

from adaptiveload import (
    AdaptiveBatchSampler,
    CostModel,
    EqualTokenBatchSampler,
    balance_report,
    wan_seq_len,
)
from adaptiveload.demo import demo_metadata
from adaptiveload.report import rescore
from plans import IndexDataset, check_plan, random_mix

# -- sequence lengths and cost models ------------------------------------------------------


def test_wan_seq_len_matches_wan21_token_counts():
    assert wan_seq_len(1, 480, 832) == 1560
    assert wan_seq_len(81, 480, 832) == 32760
    assert wan_seq_len(81, 720, 1280) == 75600
    out = wan_seq_len(np.array([1, 81]), np.array([480, 720]), np.array([832, 1280]))
    np.testing.assert_array_equal(out, [1560, 75600])
    assert wan_seq_len(81, 480, 832, patch_size=(1, 1, 1)) == 21 * 60 * 104


def test_wan_seq_len_rejects_bad_shapes():
    with pytest.raises(ValueError, match="frames"):
        wan_seq_len(0, 480, 832)
    with pytest.raises(ValueError, match="height"):
        wan_seq_len(1, np.array([480.5]), 832)
    with pytest.raises(ValueError, match="smaller than one patch"):
        wan_seq_len(1, 8, 832)


def test_cost_models_evaluate_and_round_trip(tmp_path):
    p = CostModel.power(1.5, coef=2.0)
    assert p.batch_cost([100, 400]) == pytest.approx(2 * (100**1.5 + 400**1.5))
    q = CostModel.polynomial(1.0, 0.5, 0.25)
    assert q.batch_cost([10, 20]) == pytest.approx(1 + 0.5 * 30 + 0.25 * 500)
    for model in (p, q, CostModel.wan21_h200("1.3B", layers=6)):
        path = tmp_path / "cost.json"
        model.to_json(path)
        back = CostModel.from_json(path)
        assert back.to_dict() == model.to_dict()
        assert back.batch_cost([1560, 75600]) == pytest.approx(model.batch_cost([1560, 75600]))


def test_cost_model_layers_evaluate_and_round_trip(tmp_path):
    fit = CostModel.polynomial(1.0, 0.5, 0.0).with_floor(20.0, 1.0)
    m = fit.with_measured({(10, 2): 100.0, (30, 1): 4.0})
    assert m.batch_cost([10, 10]) == 100.0  # measured
    assert m.batch_cost([30]) == 4.0
    assert m.batch_cost([10, 10, 10]) == pytest.approx(23.0)  # floor 20 + 3 > 1 + 15
    assert m.batch_cost([40, 40]) == pytest.approx(41.0)  # fitted work above the floor
    assert m.batch_cost([10, 30]) == pytest.approx(22.0)  # mixed lengths: fitted
    assert m.fitted().batch_cost([10, 10]) == pytest.approx(22.0)
    lens = np.array([10, 10, 30, 10, 30], np.int64)
    got = m.batch_costs(lens, [0, 2, 3, 5])
    assert got.tolist() == pytest.approx([100.0, 4.0, 22.0])
    assert m.batch_costs(lens, [0, 2], fitted_only=True).tolist() == pytest.approx([22.0])
    assert m.measured == {(10, 2): 100.0, (30, 1): 4.0}
    for model in (m, fit):
        path = tmp_path / "layered.json"
        model.to_json(path)
        back = CostModel.from_json(path)
        assert back.to_dict() == model.to_dict()
        assert pickle.loads(pickle.dumps(model)).measured == model.measured
    bad = m.to_dict()
    bad["measured"].append(dict(bad["measured"][0]))
    with pytest.raises(ValueError, match="given twice"):
        CostModel.from_dict(bad)
    bad["measured"] = [{"seq_len": 5, "batch": 1, "cost": -1.0}]
    with pytest.raises(ValueError, match="cost must be finite"):
        CostModel.from_dict(bad)


def test_sampler_plans_with_measured_kinds():
    # Every sample alike: the fit allows micro-batches of 8, but 8 were measured as far
    # over the cap, so the plan holds micro-batches of at most 7 and reports measured costs.
    lens = np.full(64, 100)
    fit = CostModel.polynomial(0.0, 0.01, 0.0)
    kinds = {(100, 8): 1000.0, (100, 7): 7.0}
    s = AdaptiveBatchSampler(lens, 10_000, max_cost=8.0, cost_model=fit.with_measured(kinds))
    plan = s.plan()
    sizes = np.diff(plan.offsets)
    assert sizes.max() == 7 and sizes.sum() == 64
    assert all(c == 7.0 for c, n in zip(plan.costs, sizes, strict=True) if n == 7)
    assert (
        AdaptiveBatchSampler(lens, 10_000, max_cost=8.0, cost_model=fit).plan().num_micro_batches
        == 8
    )


@pytest.mark.parametrize("k", [1, 4])
@pytest.mark.parametrize("mix_seed", [3, 17])  # fixed: the bounds below are statistical
def test_max_batch_size_one_balances_single_sample_steps(k, mix_seed):
    meta = demo_metadata(4000, "wan-mix", seed=mix_seed)
    common = dict(group_keys=meta.group_keys(), num_replicas=8, rank=0, micro_batches_per_step=k)
    # The tolerance's rule (speed over fidelity): steps of single samples balance only as
    # steps of one shape.
    ours = AdaptiveBatchSampler(
        meta.seq_lens, 151_200, max_batch_size=1, composition="balanced", **common
    )
    base = EqualTokenBatchSampler(
        meta.seq_lens, 151_200, max_batch_size=1, cost_model=ours.cost_model, **common
    )
    for s in (ours, base):
        plan = s.plan()
        assert np.all(np.diff(plan.offsets) == 1)
        drawn = np.concatenate([np.concatenate(list(plan.rank_micro_batches(r))) for r in range(8)])
        assert len(drawn) == len(meta.seq_lens) + plan.num_padded_samples
        assert set(drawn.tolist()) == set(range(len(meta.seq_lens)))
    a, b = balance_report(ours.plan()), balance_report(base.plan())
    assert a.imbalance < 0.05 < 0.3 < b.imbalance
    assert b.epoch_time / a.epoch_time > 1.5
    # Larger caps hold more samples, never more than the cap.
    two = AdaptiveBatchSampler(meta.seq_lens, 151_200, max_batch_size=2, **common).plan()
    assert np.diff(two.offsets).max() == 2


def test_max_batch_size_in_states_and_errors():
    lens = np.full(200, 1560)
    s = AdaptiveBatchSampler(lens, 151_200, num_replicas=2, rank=0, max_batch_size=3)
    state = s.state_dict(micro_batches_done=4)
    again = AdaptiveBatchSampler(lens, 151_200, num_replicas=2, rank=0, max_batch_size=3)
    again.load_state_dict(state)
    assert again.start_micro_batch == 4  # the same plan: replayed
    # Without the cap, the rest of the epoch is re-planned: nothing lost or repeated.
    other = AdaptiveBatchSampler(lens, 151_200, num_replicas=2, rank=0)
    other.load_state_dict(state)
    assert other.start_micro_batch == 0
    rest = [i for r in range(2) for b in other.plan().rank_micro_batches(r) for i in b.tolist()]
    done = np.unpackbits(np.frombuffer(state["consumed"], np.uint8))[:200].astype(bool)
    assert sorted(rest) == sorted(np.flatnonzero(~done).tolist())
    # A state saved without the option loads into a sampler without it as the same plan.
    plain = AdaptiveBatchSampler(lens, 151_200, num_replicas=2, rank=0)
    assert "max_batch_size" not in plain.state_dict(micro_batches_done=0)["fingerprint"]
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="max_batch_size"):
            AdaptiveBatchSampler(lens, 151_200, max_batch_size=bad)


def test_builtin_profile_reflects_quadratic_attention():
    m = CostModel.wan21_h200("14B")
    per_token_long = m.sample_cost(75600) / 75600
    per_token_image = m.sample_cost(1560) / 1560
    # The measured block costs 3.7x more per token at 75,600 tokens than at 1,560.
    assert 3.0 < per_token_long / per_token_image < 4.5


def test_cost_model_errors(tmp_path):
    with pytest.raises(ValueError, match="p must be"):
        CostModel.power(0.2)
    with pytest.raises(ValueError, match="c1"):
        CostModel.polynomial(0, -1, 1)
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"kind": "polynomial", "c0": 1}))
    with pytest.raises(ValueError, match="missing field 'c1'"):
        CostModel.from_json(bad)
    bad.write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        CostModel.from_json(bad)
    with pytest.raises(ValueError, match="size"):
        CostModel.wan21_h200("7B")


# -- plans ----------------------------------------------------------------------------------


@pytest.mark.parametrize("world,k", [(1, 1), (2, 1), (8, 1), (8, 4), (64, 2)])
@pytest.mark.parametrize("drop_last", [False, True])
def test_plan_obeys_caps_and_covers_every_sample_once(world, k, drop_last):
    lens = random_mix(3000, seed=world * 10 + k)
    s = AdaptiveBatchSampler(
        lens, 151200, num_replicas=world, rank=0, micro_batches_per_step=k, drop_last=drop_last
    )
    plan = s.plan()
    seen = check_plan(s)
    assert plan.num_micro_batches == plan.num_steps * world * k
    if not drop_last:
        assert len(seen) == len(lens)
    assert balance_report(plan).over_cost_cap == 0


@settings(max_examples=60, deadline=None)
@given(
    lens=st.lists(st.integers(1, 5000), min_size=1, max_size=300),
    cap_factor=st.floats(1.0, 8.0),
    world=st.integers(1, 9),
    k=st.integers(1, 4),
    drop_last=st.booleans(),
    seed=st.integers(0, 2**32),
    p=st.floats(1.0, 2.0),
)
def test_property_caps_and_exact_coverage(lens, cap_factor, world, k, drop_last, seed, p):
    lens = np.array(lens)
    max_tokens = int(lens.max() * cap_factor)
    s = AdaptiveBatchSampler(
        lens,
        max_tokens,
        cost_model=CostModel.power(p),
        num_replicas=world,
        rank=0,
        micro_batches_per_step=k,
        seed=seed,
        drop_last=drop_last,
    )
    plan = s.plan()
    seen = check_plan(s)
    if not drop_last:
        assert len(seen) == len(lens)
        # Repeats only when every micro-batch is a single sample and still too few.
        assert plan.num_padded_samples < world * k
    # Every rank yields the same number of micro-batches, and together the plan.
    per_rank = [
        list(
            AdaptiveBatchSampler(
                lens,
                max_tokens,
                cost_model=CostModel.power(p),
                num_replicas=world,
                rank=r,
                micro_batches_per_step=k,
                seed=seed,
                drop_last=drop_last,
            )
        )
        for r in range(world)
    ]
    assert len({len(b) for b in per_rank}) == 1
    assert len(per_rank[0]) == len(s)


def test_batch_sizes_follow_both_caps():
    lens = np.array([1560] * 500 + [75600] * 20 + [32760] * 40)
    s = AdaptiveBatchSampler(lens, 151200, num_replicas=1, rank=0, shuffle=False)
    sizes = collections.defaultdict(set)
    plan = s.plan()
    for m in range(plan.num_micro_batches):
        mb = plan.samples[plan.offsets[m] : plan.offsets[m + 1]]
        sizes[int(lens[mb[0]])].add(len(mb))
    f = s.cost_model.sample_cost
    for seq, got in sizes.items():
        b_mem = 151200 // seq
        b_comp = int((s.max_cost - s.cost_model.overhead) // f(seq))
        assert max(got) == max(1, min(b_mem, b_comp)), seq


def test_balanced_plan_beats_equal_token_buckets():
    lens = random_mix(20000, seed=1)
    ours = AdaptiveBatchSampler(lens, 151200, num_replicas=8, rank=0, composition="balanced")
    ours = balance_report(ours.plan())
    base = balance_report(EqualTokenBatchSampler(lens, 151200, num_replicas=8, rank=0).plan())
    assert ours.imbalance < 0.03
    assert base.imbalance > 0.2
    assert base.epoch_time / ours.epoch_time > 1.3


def test_equal_token_batch_size_is_floor_of_cap():
    lens = np.array([1560] * 300 + [32760] * 30)
    s = EqualTokenBatchSampler(lens, 151200, num_replicas=1, rank=0, shuffle=False)
    plan = s.plan()
    sizes = {int(lens[plan.samples[plan.offsets[m]]]): set() for m in range(plan.num_micro_batches)}
    for m in range(plan.num_micro_batches):
        mb = plan.samples[plan.offsets[m] : plan.offsets[m + 1]]
        sizes[int(lens[mb[0]])].add(len(mb))
    assert max(sizes[1560]) == 96 and max(sizes[32760]) == 4
    check_plan(s)


def test_group_keys_are_never_mixed():
    meta = demo_metadata(3000, "wan-mix", seed=2)
    s = AdaptiveBatchSampler(
        meta.seq_lens, 151200, group_keys=[tuple(x) for x in meta.shapes], num_replicas=4, rank=0
    )
    check_plan(s)
    s2 = AdaptiveBatchSampler(
        meta.seq_lens, 151200, group_keys=meta.group_keys(), num_replicas=4, rank=0
    )
    check_plan(s2)
    s3 = AdaptiveBatchSampler(meta.seq_lens, 151200, group_keys=meta.shapes, num_replicas=4, rank=0)
    check_plan(s3)
    np.testing.assert_array_equal(s3.plan().samples, s2.plan().samples)
    with pytest.raises(ValueError, match=r"one key per sample \(3000\), got 2"):
        AdaptiveBatchSampler(
            meta.seq_lens, 151200, group_keys=meta.shapes[:2], num_replicas=4, rank=0
        )


def test_deterministic_per_epoch_without_global_rng():
    lens = random_mix(2000, seed=3)
    a = AdaptiveBatchSampler(lens, 151200, num_replicas=4, rank=1, seed=5)
    first = list(a)
    np.random.seed(123)  # noqa: NPY002 - the global RNG must not matter
    torch.manual_seed(123)
    b = AdaptiveBatchSampler(lens, 151200, num_replicas=4, rank=1, seed=5)
    assert list(b) == first
    b.set_epoch(1)
    assert list(b) != first
    b.set_epoch(0)
    assert list(b) == first
    c = AdaptiveBatchSampler(lens, 151200, num_replicas=4, rank=1, seed=6)
    assert list(c) != first


def test_no_shuffle_is_still_complete():
    lens = random_mix(500, seed=4)
    s = AdaptiveBatchSampler(lens, 151200, num_replicas=2, rank=0, shuffle=False)
    assert len(check_plan(s)) == 500


@pytest.mark.parametrize("num_workers", [0, 2])
def test_dataloader_drop_in(num_workers):
    lens = random_mix(600, seed=5)
    ranks = []
    for r in range(2):
        s = AdaptiveBatchSampler(lens, 151200, num_replicas=2, rank=r, micro_batches_per_step=2)
        expected = [b.tolist() for b in s.plan().rank_micro_batches(r)]
        loader = DataLoader(IndexDataset(lens), batch_sampler=s, num_workers=num_workers)
        batches = [b[:, 0].tolist() for b in loader]
        assert batches == expected
        assert len(loader) == len(s)
        ranks.append(batches)
    flat = [i for rank in ranks for b in rank for i in b]
    assert sorted(flat) == list(range(600))


# -- bad input ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "lens,match",
    [
        ([10, -3, 5], r"seq_lens\[1\] = -3"),
        ([10, 0, 5], r"seq_lens\[1\] = 0"),
        ([10.0, float("nan")], r"seq_lens\[1\] = nan"),
        ([10.0, 2.5], r"seq_lens\[1\] = 2.5"),
        (["a", "b"], r"seq_lens\[0\] = .a. is not an integer"),
        ([[1, 2]], "1-D"),
    ],
)
def test_bad_seq_lens_name_the_problem(lens, match):
    with pytest.raises(ValueError, match=match):
        AdaptiveBatchSampler(lens, 100, num_replicas=1, rank=0)


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(max_tokens=0), "max_tokens"),
        (dict(max_tokens=-5), "max_tokens"),
        (dict(max_cost=0.0), "max_cost"),
        (dict(max_cost=float("inf")), "max_cost"),
        (dict(num_replicas=0, rank=0), "num_replicas"),
        (dict(num_replicas=2, rank=2), "rank"),
        (dict(micro_batches_per_step=0), "micro_batches_per_step"),
        (dict(lookahead_steps=0), "lookahead_steps"),
        (dict(group_keys=[1, 2]), r"group_keys must have one key per sample \(3\), got 2"),
        (dict(on_oversize="ignore"), "on_oversize"),
    ],
)
def test_bad_arguments_name_the_problem(kwargs, match):
    args = dict(seq_lens=[10, 20, 30], max_tokens=100, num_replicas=1, rank=0) | kwargs
    with pytest.raises(ValueError, match=match):
        AdaptiveBatchSampler(**args)


def test_oversize_sample_is_skipped_with_one_warning():
    lens = [100, 100, 5000, 100]
    s = AdaptiveBatchSampler(lens, 1000, num_replicas=1, rank=0, on_oversize="skip")
    with pytest.warns(UserWarning, match="skipped 1 sample"):
        plan = s.plan()
    assert plan.skipped.tolist() == [2]
    assert balance_report(plan).num_skipped_samples == 1
    assert sorted(i for b in s for i in b) == [0, 1, 3]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        s.plan()  # warned once


@pytest.mark.parametrize("streaming", [False, True])
def test_default_compute_cap_ignores_samples_over_the_token_cap(streaming):
    """Groups that each hold a sample over max_tokens (skipped): the default compute cap is the
    one of the same data without those samples (it was infinite, and planning failed on it);
    every other sample is planned once."""
    from adaptiveload import StreamingBatchSampler

    rng = np.random.default_rng()
    n = int(rng.integers(2000, 6000))
    lens = rng.choice([300, 1560, 7800, 32760], n)
    groups = rng.integers(0, 4, n)
    over = rng.choice(n, 8, replace=False)
    groups[over[:4]] = np.arange(4)  # every group holds one
    lens[over] = 400_000
    fits = np.setdiff1d(np.arange(n), over)

    def make(seq_lens, group_ids, rank=0):
        if streaming:
            return StreamingBatchSampler(seq_lens, 151_200, group_ids=group_ids, num_replicas=4,
                                         rank=rank, on_oversize="skip", segment_samples=1000)  # fmt: skip
        return AdaptiveBatchSampler(seq_lens, 151_200, group_keys=group_ids, num_replicas=4,
                                    rank=rank, on_oversize="skip")  # fmt: skip

    def cap(s):
        return s.max_cost if streaming else s.plan().max_cost

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        s = make(lens, groups)
        reference = make(lens[fits], groups[fits])
        assert np.isfinite(cap(s)) and cap(s) == cap(reference)
        planned = [i for r in range(4) for b in make(lens, groups, r) for i in b]
    assert sorted(planned) == fits.tolist()


def test_distributed_defaults_without_process_group():
    s = AdaptiveBatchSampler([10, 20], 100)
    assert (s.num_replicas, s.rank) == (1, 0)


# -- reports ----------------------------------------------------------------------------------


def test_balance_report_definitions():
    lens = random_mix(800, seed=9)
    s = AdaptiveBatchSampler(lens, 151200, num_replicas=4, rank=0, micro_batches_per_step=2)
    plan = s.plan()
    rep = balance_report(plan)
    loads = np.zeros((plan.num_steps, 4))
    for t in range(plan.num_steps):
        for r in range(4):
            for k in range(2):
                loads[t, r] += s.cost_model.batch_cost(lens[plan.micro_batch(t, r, k)])
    mx, mean, mn = loads.max(1), loads.mean(1), loads.min(1)
    assert rep.imbalance == pytest.approx(np.mean(1 - mean / mx))
    assert rep.spread == pytest.approx(np.mean((mx - mn) / mx))
    assert rep.epoch_time == pytest.approx(mx.sum())
    assert rep.ideal_time == pytest.approx(mean.sum())
    assert rep.token_utilization == pytest.approx(np.mean(plan.tokens / 151200))
    again = rescore(plan, lens, s.cost_model, s.max_cost)
    np.testing.assert_allclose(again.costs, plan.costs, rtol=1e-12)


# -- inputs in any container plan alike ---------------------------------------------------------


def plan_of(lens, keys=None, **kw):
    args = dict(num_replicas=4, rank=0, micro_batches_per_step=2, seed=3) | kw
    return AdaptiveBatchSampler(lens, 151200, group_keys=keys, **args).plan()


def same_plan(a, b):
    np.testing.assert_array_equal(a.samples, b.samples)
    np.testing.assert_array_equal(a.offsets, b.offsets)


def test_group_keys_as_tensors_lists_or_arrays_plan_alike():
    meta = demo_metadata(2000, "wan-mix", seed=4)
    ref = plan_of(meta.seq_lens, meta.shapes)
    assert np.diff(ref.offsets).max() > 1  # real multi-sample batches
    for keys in (
        torch.from_numpy(meta.shapes),  # n x 3 tensor
        torch.from_numpy(meta.shapes).to(torch.int32),
        torch.from_numpy(meta.shapes).float(),
        [tuple(int(v) for v in s) for s in meta.shapes],  # list of tuples
        [list(s) for s in meta.shapes],
        meta.shapes.astype(np.int16),
    ):
        same_plan(plan_of(meta.seq_lens, keys), ref)
    ids = meta.group_keys()
    ref1 = plan_of(meta.seq_lens, ids)
    for keys in (torch.from_numpy(ids), torch.from_numpy(ids).to(torch.int8), ids.tolist()):
        same_plan(plan_of(meta.seq_lens, keys), ref1)


def object_array(items):
    out = np.empty(len(items), dtype=object)
    for i, item in enumerate(items):
        out[i] = item
    return out


def assert_unmixed(plan, keys):
    for m in range(len(plan.offsets) - 1):
        mb = plan.samples[plan.offsets[m] : plan.offsets[m + 1]]
        assert len({repr(keys[i]) for i in mb}) == 1, [keys[i] for i in mb]


@pytest.mark.parametrize(
    "a,b", [(1, "1"), (81, "81"), (1.5, "1.5"), (np.int64(1), "1"), (True, "True")]
)
def test_keys_of_different_types_are_different_groups_in_any_container(a, b):
    # numpy makes a list of 1 and '1' an array of strings, where the two keys are one.
    lens = np.full(400, 1560)
    keys = [a, b] * 200
    ref = plan_of(lens, object_array(keys))
    assert_unmixed(ref, keys)
    for container in (keys, tuple(keys)):
        same_plan(plan_of(lens, container), ref)
    # Rows of mixed-type fields: (1, 480) and ('1', 480) are two keys.
    rows = [(a, 480), (b, 480)] * 200
    ref = plan_of(lens, object_array(rows))
    assert_unmixed(ref, rows)
    same_plan(plan_of(lens, rows), ref)


def test_a_list_of_ints_numbers_its_keys_as_an_int_array():
    lens = np.full(300, 1560)
    keys = [int(k) for k in np.random.default_rng(0).integers(0, 50, size=300) * 7]
    same_plan(plan_of(lens, keys), plan_of(lens, np.array(keys)))
    same_plan(plan_of(lens, [str(k) for k in keys]), plan_of(lens, np.array(keys).astype(str)))


@pytest.mark.parametrize(
    "dtype", [torch.int64, torch.int32, torch.int16, torch.bfloat16, torch.float16, torch.float32]
)
def test_seq_lens_as_tensors_of_any_dtype_plan_like_numpy(dtype):
    # Values every dtype holds exactly (bf16 has 8 significant bits).
    lens = np.random.default_rng(5).choice([64, 128, 256, 512, 1024, 2048], size=500)
    ref = AdaptiveBatchSampler(lens, 4096, num_replicas=2, rank=0).plan()
    got = AdaptiveBatchSampler(torch.from_numpy(lens).to(dtype), 4096, num_replicas=2, rank=0)
    same_plan(got.plan(), ref)
    assert got.seq_lens.dtype == np.int64


def test_lengths_past_int64_get_clear_errors():
    with pytest.raises(ValueError, match=r"seq_lens\[1\] = 18446744073709551615"):
        AdaptiveBatchSampler(np.array([5, 2**64 - 1], dtype=np.uint64), 100)
    with pytest.raises(ValueError, match=r"seq_lens\[0\] = 36893488147419103232"):
        AdaptiveBatchSampler([2**65, 3], 100)
    with pytest.raises(ValueError, match=r"seq_lens\[1\] = 'x'"):
        AdaptiveBatchSampler([3, "x"], 100)
    with pytest.raises(ValueError, match="seq_lens must hold integers"):
        AdaptiveBatchSampler(torch.tensor([True, False]), 100)


def test_oversize_sample_is_refused_when_the_sampler_is_made():
    with pytest.raises(ValueError, match=r"1 sample\(s\) exceed.*index 2.*5000 tokens.*max_tokens"):
        AdaptiveBatchSampler([100, 100, 5000, 100], 1000, num_replicas=1, rank=0)
    with pytest.raises(ValueError, match=r"max_cost"):
        AdaptiveBatchSampler(
            [10, 10, 40], 1000, max_cost=30.0, cost_model=CostModel.power(1.0), num_replicas=1
        )
    with pytest.raises(ValueError, match=r"index 1"):
        EqualTokenBatchSampler([100, 2000], 1000, num_replicas=1, rank=0)


@pytest.mark.parametrize("cls", [AdaptiveBatchSampler, EqualTokenBatchSampler])
def test_sampler_and_cost_model_pickle_and_deepcopy(cls):
    import copy
    import pickle

    lens = random_mix(900, seed=11)
    s = cls(lens, 151200, num_replicas=3, rank=1, micro_batches_per_step=2, seed=4)
    s.set_epoch(2)
    clones = (pickle.loads(pickle.dumps(s)), copy.deepcopy(s))
    expected = list(s)
    for clone in clones:
        assert clone.epoch == 2
        assert list(clone) == expected
    for model in (CostModel.power(1.7, coef=3.0), CostModel.wan21_h200("1.3B", layers=4)):
        back = pickle.loads(pickle.dumps(model))
        assert back.to_dict() == model.to_dict()
        assert copy.deepcopy(model).batch_cost([1560, 75600]) == model.batch_cost([1560, 75600])


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(shuffle="no"), "shuffle"),
        (dict(drop_last=1), "drop_last"),
        (dict(seed=True), "seed"),
        (dict(seed=-1), "seed"),
        (dict(seed=1.5), "seed"),
        (dict(max_tokens=True), "max_tokens"),
        (dict(max_tokens=1000.0), "max_tokens"),
        (dict(micro_batches_per_step=2.0), "micro_batches_per_step"),
        (dict(num_replicas=True, rank=0), "num_replicas"),
        (dict(balance="yes"), "balance"),
        (dict(cost_model="wan21"), "cost_model"),
        (dict(group_keys=np.zeros((3, 2, 2))), "group_keys"),
        (dict(group_keys=5), "group_keys"),
    ],
)
def test_more_bad_arguments_name_the_argument(kwargs, match):
    args = dict(seq_lens=[10, 20, 30], max_tokens=100, num_replicas=1, rank=0) | kwargs
    with pytest.raises(ValueError, match=match):
        AdaptiveBatchSampler(**args)
