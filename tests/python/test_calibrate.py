"""Cost and memory model fitting, and `adaptiveload calibrate` on a tiny model on CPU, timed in
modelled milliseconds (the ``modelled_times`` fixture, or a ``measure`` function), never by the
clock: on a busy CPU a tiny model's times come in no order and a fit of them fails."""

import json

import numpy as np
import pytest

from adaptiveload import AdaptiveBatchSampler, CostModel
from adaptiveload.calibrate import (
    Calibration,
    Point,
    calibrate_plan,
    fit_cost_model,
    fit_memory_model,
    plan_kinds,
    wan_grid,
)
from adaptiveload.wan import wan_seq_len


def synthetic_points(c0, cs, c1, c2, m0, m1, noise, seed):
    rng = np.random.default_rng(seed)
    pts = []
    for s in (1560, 3600, 7800, 14040, 32760, 75600):
        for b in (1, 2, max(1, 151200 // s // 2), max(1, 151200 // s)):
            t = (c0 + b * (cs + c1 * s + c2 * s * s)) * (1 + noise * rng.standard_normal())
            pts.append(Point(b, s, float(t), int(m0 + m1 * b * s)))
    return pts


def test_fit_recovers_known_coefficients():
    truth = dict(c0=20.0, cs=1.1, c1=1.9e-3, c2=1.7e-7)
    pts = synthetic_points(**truth, m0=1e9, m1=4e5, noise=0.0, seed=0)
    model = fit_cost_model(pts)
    d = model.to_dict()
    for key, got in (("c0", d["c0"]), ("cs", d["per_sample"]), ("c1", d["c1"]), ("c2", d["c2"])):
        assert got == pytest.approx(truth[key], rel=1e-6), key
    assert all(abs(p.rel_error) < 1e-9 for p in pts)
    m0, m1 = fit_memory_model(pts)
    assert m0 == pytest.approx(1e9, rel=1e-6) and m1 == pytest.approx(4e5, rel=1e-6)


def test_fit_with_noise_and_summary(tmp_path):
    pts = synthetic_points(20.0, 1.1, 1.9e-3, 1.7e-7, 1e9, 4e5, noise=0.02, seed=1)
    cal = Calibration(fit_cost_model(pts), *fit_memory_model(pts), pts, {"config": "synthetic"})
    summary = cal.summary()
    assert summary["median_abs_rel_error"] < 0.03
    assert cal.suggest_max_tokens(1e9 + 4e5 * 100_000) == pytest.approx(100_000, rel=0.02)
    with pytest.raises(ValueError, match="below the fixed part"):
        cal.suggest_max_tokens(0.5e9)
    path = tmp_path / "cal.json"
    cal.to_json(path)
    loaded = CostModel.from_json(path)
    assert loaded.batch_cost([32760] * 4) == pytest.approx(cal.cost_model.batch_cost([32760] * 4))
    assert json.loads(path.read_text())["memory"]["m1_bytes_per_token"] == pytest.approx(
        cal.memory_m1
    )


def test_fit_rejects_too_few_or_flat_points():
    with pytest.raises(ValueError, match="at least 4"):
        fit_cost_model([Point(1, 10, 1.0, 0)] * 3)
    with pytest.raises(ValueError, match="must be > 0"):
        fit_cost_model([Point(1, 10 * i, 0.0, 0) for i in range(1, 6)])


def test_grid_includes_large_batches_of_short_samples():
    grid = wan_grid(151200)
    images = [b for b, shape in grid if shape == (1, 480, 832)]
    assert max(images) == 96 and 1 in images
    assert all(b * s <= 151200 for b, s in ((b, 1560) for b in images))


def test_calibrate_cli_on_cpu_tiny_model(tmp_path, capsys, modelled_times):
    pytest.importorskip("diffusers")
    from adaptiveload.cli import main

    out = tmp_path / "cost.json"
    args = "calibrate --config tiny --device cpu --dtype fp32 --no-fused --max-tokens 1500"
    args += " --shapes 1x32x48,17x64x96,33x64x96 --text-len 8 --repeat 1 --warmup 1 --no-progress"
    rc = main([*args.split(), "--out", str(out)])
    assert rc == 0
    text = capsys.readouterr().out
    assert "fit error: median" in text and "cost model: CostModel.polynomial" in text
    d = json.loads(out.read_text())
    assert d["kind"] == "polynomial" and len(d["points"]) >= 8
    assert [p["ms"] for p in d["points"]] == modelled_times
    CostModel.from_json(out)


# -- plan-aware calibration -------------------------------------------------------------------


def true_ms(batch, seq_len):
    """A GPU whose time is not of any fitted form: a launch floor, and large batches of short
    samples running faster per sample than small ones."""
    work = batch * (0.4 + 2e-3 * seq_len + 1.5e-7 * seq_len**2) * (1 - 0.15 * (batch > 8))
    return max(12.0, 1.0 + work)


def plan_setup(n=3000, seed=3):
    from adaptiveload.demo import demo_metadata

    meta = demo_metadata(n, "wan-mix", seed=seed)
    max_tokens = int(2 * meta.seq_lens.max())

    def make_sampler(model):
        return AdaptiveBatchSampler(
            meta.seq_lens, max_tokens, cost_model=model, group_keys=meta.group_keys(),
            num_replicas=8, rank=0, micro_batches_per_step=1,
        )  # fmt: skip

    calls = []

    def measure(batch, shape):
        calls.append((batch, tuple(shape)))
        return true_ms(batch, wan_seq_len(*shape)), 1000 * batch

    return meta, make_sampler, measure, calls


def test_plan_aware_calibration_measures_every_kind_its_plan_uses(tmp_path):
    meta, make_sampler, measure, calls = plan_setup()
    prior = CostModel.wan21_h200("1.3B", layers=3)
    points = tmp_path / "points.jsonl"
    cal = calibrate_plan(make_sampler, prior, meta.shapes, measure, points_file=points,
                         header={"gpu": "fake"}, progress=False)  # fmt: skip
    assert cal.meta["converged"] and len(cal.meta["rounds"]) >= 2
    assert len(calls) == len(set(calls)) == cal.meta["kinds_measured"]  # nothing measured twice
    # The final plan uses measured kinds only, and its predicted costs are the true ones.
    sampler = make_sampler(cal.cost_model)
    plan = sampler.plan()
    lens = meta.seq_lens[plan.samples]
    truth = [
        true_ms(b, int(s))
        for b, s in zip(np.diff(plan.offsets), lens[plan.offsets[:-1]], strict=True)
    ]
    assert np.allclose(plan.costs, truth, rtol=1e-12)
    assert set(plan_kinds(sampler, meta.shapes)) <= set(cal.cost_model.measured)
    assert "fallback_heldout_p90" in cal.meta and cal.meta["form"] in ("additive", "floor")
    # Saved and loaded, the model plans the same epoch.
    path = tmp_path / "cost.json"
    cal.to_json(path)
    again = make_sampler(CostModel.from_json(path)).plan()
    assert np.array_equal(again.samples, plan.samples)

    # Resumed from the points file: nothing is measured again.
    calls.clear()
    resumed = calibrate_plan(make_sampler, prior, meta.shapes, measure, points_file=points,
                             header={"gpu": "fake"}, progress=False)  # fmt: skip
    assert calls == [] and resumed.meta["kinds_resumed"] == cal.meta["kinds_measured"]
    assert resumed.cost_model.to_dict()["measured"] == cal.cost_model.to_dict()["measured"]


def test_plan_aware_calibration_measures_the_shares_of_split_micro_batches(tmp_path):
    """With sequence parallelism the plan's split micro-batches are measured as one rank's
    share ``(S, B, d)`` (``measure(..., degree=d)``), kept as measured shares beside the whole
    kinds, left out of the fitted form, and resumed from the points file."""
    from adaptiveload.demo import demo_metadata

    meta = demo_metadata(3000, "wan-mix", seed=5)
    max_tokens = int(2 * meta.seq_lens.max())

    def make_sampler(model):
        return AdaptiveBatchSampler(
            meta.seq_lens, max_tokens, cost_model=model, group_keys=meta.group_keys(),
            num_replicas=8, rank=0, micro_batches_per_step=1, max_batch_size=1,
            uneven_counts=True, sequence_parallel=4,
        )  # fmt: skip

    calls = []

    def measure(batch, shape, degree=1):
        calls.append((batch, tuple(shape), degree))
        return true_ms(batch, wan_seq_len(*shape) / degree) + 2.0 * (degree > 1), 1000 * batch

    prior = CostModel.wan21_h200("1.3B", layers=3)
    points = tmp_path / "points.jsonl"
    cal = calibrate_plan(make_sampler, prior, meta.shapes, measure, points_file=points,
                         header={"gpu": "fake"}, progress=False)  # fmt: skip
    assert cal.meta["converged"]
    shares = cal.cost_model.measured_shares
    assert shares and {d for _, _, d in calls} > {1}
    for (s, b, d), ms in shares.items():
        shape = next(sh for bb, sh, dd in calls if dd == d and bb == b and wan_seq_len(*sh) == s)
        assert ms == measure(b, shape, d)[0]
    kinds = plan_kinds(make_sampler(cal.cost_model), meta.shapes)
    assert set(kinds) <= set(cal.cost_model.measured) | set(shares)
    assert all(p.predicted_ms is None for p in cal.points if p.degree > 1)
    calls.clear()
    resumed = calibrate_plan(make_sampler, prior, meta.shapes, measure, points_file=points,
                             header={"gpu": "fake"}, progress=False)  # fmt: skip
    assert calls == [] and resumed.cost_model.measured_shares == shares


@pytest.mark.parametrize("seed", [0, 1])
def test_plan_aware_calibration_measures_what_a_share_is_weighed_against(seed):
    """The planner mixes a window with sequence parallelism only where its steps lose at most
    mix_tolerance of their rank time to waiting and to what splitting adds, weighed against
    each micro-batch split no more than it must. A plan that splits every micro-batch never runs
    them whole, so calibration measures those too. Priced by the prior instead (the built-in
    profile, 1.1-1.7x this GPU's whole micro-batches), splitting looked free: every micro-batch
    was split and the plan lost 3.4% at a tolerance of 3%."""
    from adaptiveload.demo import demo_metadata

    meta = demo_metadata(20_000, seed=seed)
    lens = meta.seq_lens
    max_tokens = int(2 * lens.max())
    tolerance, comm = 0.03, 2.34e-4  # ms per token sent (Wan 2.1-14B, 1 block, 350 GB/s)

    def make_sampler(model):
        return AdaptiveBatchSampler(
            lens, max_tokens, cost_model=model, group_keys=meta.group_keys(), num_replicas=8,
            rank=0, micro_batches_per_step=1, uneven_counts=True, sequence_parallel=8,
            sequence_parallel_comm=comm, mix_tolerance=tolerance,
        )  # fmt: skip

    def share_ms(batch, seq_len, degree):  # a floor, a launch every share pays, all-to-alls
        work = batch * (0.5 + 1.6e-3 * seq_len + 1.4e-7 * seq_len**2)
        return max(9.0, 1.5 + work / degree) + comm * batch * seq_len * (degree - 1) / degree**2

    def measure(batch, shape, degree=1):
        return share_ms(batch, wan_seq_len(*shape), degree), 0

    prior = CostModel.wan21_h200("14B", layers=1)
    cal = calibrate_plan(make_sampler, prior, meta.shapes, measure, progress=False)
    # What the prior says of the model survives the fit (its heads price a ring where the
    # degree exceeds them; none at 8 over 40).
    described = {k: cal.cost_model.meta.get(k) for k in ("hidden", "heads", "layers")}
    assert described == {"hidden": 5120, "heads": 40, "layers": 1}
    sampler = make_sampler(cal.cost_model)
    sampler.set_epoch(0)
    plan = sampler.plan()
    sizes, degrees = np.diff(plan.offsets), plan.degrees
    assert degrees is not None and (degrees > 1).any()
    first = lens[plan.samples[plan.offsets[:-1]]]
    measured = set(cal.cost_model.measured)
    for s, b, d in zip(first, sizes, degrees, strict=True):
        if d > 1 and b * s <= max_tokens:
            assert (int(s), int(b)) in measured, f"({s}, {b}) split {d} ways, never measured whole"
    # What the plan loses, timed as the GPU would run it: each rank's listings in order, a
    # split micro-batch starting when its last member is free; against each micro-batch whole.
    share = np.array([share_ms(b, s, d) for s, b, d in zip(first, sizes, degrees, strict=True)])
    whole = np.array([share_ms(b, s, 1) for s, b in zip(first, sizes, strict=True)])
    rank_time = 8 * plan.replay(share)[0].sum()
    lost = 1 - (whole / degrees).sum() / rank_time
    assert lost <= tolerance, f"the plan loses {lost:.1%} at mix_tolerance {tolerance}"


def test_plan_aware_calibration_resumes_an_interrupted_run(tmp_path):
    meta, make_sampler, measure, calls = plan_setup(seed=4)
    prior = CostModel.wan21_h200("1.3B", layers=3)
    points = tmp_path / "points.jsonl"

    def interrupted(batch, shape):
        if len(calls) == 5:
            raise KeyboardInterrupt
        return measure(batch, shape)

    with pytest.raises(KeyboardInterrupt):
        calibrate_plan(make_sampler, prior, meta.shapes, interrupted, points_file=points,
                       progress=False)  # fmt: skip
    with open(points, "a") as f:
        f.write('{"batch": 3, "seq')  # a line cut short by the kill
    first = list(calls)
    calls.clear()
    cal = calibrate_plan(make_sampler, prior, meta.shapes, measure, points_file=points,
                         progress=False)  # fmt: skip
    assert cal.meta["kinds_resumed"] == 5
    assert not set(calls) & set(first)
    # The cut line was dropped, not run into the next point: a third run reads every point.
    calls.clear()
    again = calibrate_plan(make_sampler, prior, meta.shapes, measure, points_file=points,
                           progress=False)  # fmt: skip
    assert calls == [] and again.meta["kinds_resumed"] == cal.meta["kinds_measured"]
    with pytest.raises(ValueError, match="another setup; differences: gpu"):
        calibrate_plan(make_sampler, prior, meta.shapes, measure, points_file=points,
                       header={"gpu": "other"}, progress=False)  # fmt: skip


def test_plan_aware_calibrate_cli_on_cpu_tiny_model(tmp_path, capsys, modelled_times):
    pytest.importorskip("diffusers")
    from adaptiveload.cli import main

    data = tmp_path / "data.csv"
    rows = ["num_frames,height,width"] + ["1,32,48"] * 40 + ["5,64,96"] * 12 + ["9,64,96"] * 6
    data.write_text("\n".join(rows) + "\n")
    out = tmp_path / "cost.json"
    args = f"calibrate --metadata {data} --config tiny --device cpu --dtype fp32 --no-fused"
    args += " --num-replicas 2 --text-len 8 --repeat 1 --warmup 1 --no-progress"
    assert main([*args.split(), "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "plan-aware:" in text and "converged" in text
    d = json.loads(out.read_text())
    assert d["measured"] and d["meta"]["source"] == "calibrate_plan"
    rows = (tmp_path / "cost.points.jsonl").read_text().splitlines()[1:]
    assert [json.loads(r)["ms"] for r in rows] == modelled_times
    # Run again: every kind is read back.
    assert main([*args.split(), "--out", str(out)]) == 0
    assert len(modelled_times) == len(rows)  # nothing measured again
    again = json.loads(out.read_text())["meta"]
    assert again["kinds_resumed"] == again["kinds_measured"] == d["meta"]["kinds_measured"]
    # With sequence parallelism: the clips over --max-tokens are split, their shares measured
    # (one member's share of the tiny Wan on the CPU) and kept as measured shares.
    sp = tmp_path / "cost_sp.json"
    assert main([*args.split(), "--sequence-parallel", "2", "--max-tokens", "40",
                 "--out", str(sp)]) == 0  # fmt: skip
    model = CostModel.from_json(sp)
    assert model.measured_shares and {d for _, _, d in model.measured_shares} == {2}
    assert " 2 " in capsys.readouterr().out


@pytest.mark.parametrize("family, max_tokens", [("ltx-video", 6), ("hunyuanvideo", 300)])
def test_plan_aware_calibrate_cli_measures_split_shares_of_other_families(
    tmp_path, family, max_tokens, modelled_times
):
    """``calibrate --sequence-parallel`` on a family other than Wan: the clips (8 and 304
    tokens) exceed ``max_tokens`` and must split; one member's share of them is run
    (``split_sequence`` with ``ONE_DEVICE``) and kept as a measured share of degree 2."""
    pytest.importorskip("diffusers")
    from adaptiveload.cli import main

    data = tmp_path / "data.csv"
    rows = ["num_frames,height,width"] + ["1,64,64"] * 40 + ["9,64,64"] * 12
    data.write_text("\n".join(rows) + "\n")
    out = tmp_path / "cost.json"
    args = f"calibrate --metadata {data} --model {family}/tiny --device cpu --dtype fp32"
    args += " --no-fused --num-replicas 2 --text-len 8 --repeat 1 --warmup 1 --no-progress"
    args += f" --sequence-parallel 2 --max-tokens {max_tokens}"
    assert main([*args.split(), "--out", str(out)]) == 0
    model = CostModel.from_json(out)
    assert model.measured_shares and {d for _, _, d in model.measured_shares} == {2}
    assert set(model.measured_shares.values()) <= set(modelled_times)


# -- time and peak memory per (S, B, checkpointed blocks) ------------------------------------


def tiny_timer(**kw):
    import torch

    from adaptiveload.calibrate import WanTimer

    args = dict(layers=2, device="cpu", dtype=torch.float32, fused=False, text_len=8)
    return WanTimer("tiny", **{**args, "warmup": 1, "repeat": 1, **kw})


def count_block_forwards(model):
    calls = [0]

    def hook(module, args):
        calls[0] += 1

    for block in model.blocks:
        block.register_forward_pre_hook(hook)
    return calls


def test_timer_checkpoints_the_blocks_it_is_asked_to():
    pytest.importorskip("diffusers")
    timer = tiny_timer(activation_checkpointing=True, warmup=1, repeat=2)
    calls = count_block_forwards(timer.model)
    steps = timer.warmup + timer.repeat
    # Each step runs every block once, and the checkpointed ones again in backward.
    for checkpointed, forwards in ((None, 2 + 2), (0, 2), (1, 2 + 1), (None, 2 + 2)):
        calls[0] = 0
        ms, peak = timer(1, (1, 32, 48), checkpointed=checkpointed)
        assert ms > 0 and peak == 0
        assert calls[0] == steps * forwards, checkpointed
        assert all(p.grad is None for p in timer.model.parameters())


def test_memory_points_rows_and_resume(tmp_path):
    pytest.importorskip("diffusers")
    from adaptiveload.calibrate import measure_memory_points

    timer = tiny_timer()
    calls = count_block_forwards(timer.model)
    kinds = {(np.int64(wan_seq_len(*s)), b): s for b, s in ((3, (1, 32, 48)), (2, (5, 32, 48)))}
    points = tmp_path / "memory.jsonl"
    lines = []
    rows = measure_memory_points(timer, kinds, points_file=points, log=lines.append)
    assert [(r["seq_len"], r["batch"], r["checkpointed"]) for r in rows] == [
        (s, b, n) for s, b in sorted(kinds) for n in (0, 1, 2)
    ]
    for r in rows:
        assert r["tokens"] == r["seq_len"] * r["batch"] and r["layers"] == 2
        assert tuple(r["shape"]) == kinds[(r["seq_len"], r["batch"])]
        assert r["ms"] > 0 and r["peak_bytes"] == 0 and r["oom"] is False
    assert len(lines) == 6 and "n=2/2" in lines[2]
    # Per kind: n = 0, 1, 2 ran 2, 3, 4 block forwards per step, two steps each.
    assert calls[0] == 2 * 2 * (2 + 3 + 4)
    text = points.read_text().splitlines()
    assert json.loads(text[0])["header"]["measure"] == "memory_points" and len(text) == 7

    # Resumed after a kill that cut a line short: only points not in the file are measured.
    with open(points, "a") as f:
        f.write('{"seq_len": 40, "ba')
    calls[0] = 0
    more = {**kinds, (wan_seq_len(9, 32, 48), 1): (9, 32, 48)}
    again = measure_memory_points(timer, more, checkpointed=[2, 0], points_file=points, log=None)
    assert [r for r in again if r["seq_len"] != wan_seq_len(9, 32, 48)] == [
        r for r in rows if r["checkpointed"] != 1
    ]
    assert calls[0] == 2 * (2 + 4)  # the new kind at n = 0 and 2
    assert len(points.read_text().splitlines()) == 9

    with pytest.raises(ValueError, match="another setup; differences: fused"):
        measure_memory_points(tiny_timer(fused=True), kinds, points_file=points, log=None)
    with pytest.raises(ValueError, match=r"checkpointed \[3\] outside \[0, L\], L = 2"):
        measure_memory_points(timer, kinds, checkpointed=[0, 3], log=None)


def test_memory_points_record_out_of_memory_and_go_on(tmp_path):
    import torch

    from adaptiveload.calibrate import measure_memory_points

    class FakeTimer:
        layers = 2
        meta = {"config": "fake"}

        def __init__(self):
            self.calls = []

        def __call__(self, batch, shape, checkpointed):
            self.calls.append((batch, checkpointed))
            if batch * (3 - checkpointed) > 6:
                raise torch.OutOfMemoryError("CUDA out of memory")
            return 10.0 * batch, 1000 * batch * (3 - checkpointed)

    timer = FakeTimer()
    kinds = {(100, 1): (1, 32, 48), (100, 4): (1, 32, 48)}
    points = tmp_path / "memory.jsonl"
    rows = measure_memory_points(timer, kinds, points_file=points, log=None)
    assert [(r["batch"], r["checkpointed"], r["oom"]) for r in rows] == [
        (1, 0, False), (1, 1, False), (1, 2, False), (4, 0, True), (4, 1, True), (4, 2, False),
    ]  # fmt: skip
    assert all(r["ms"] is None and r["peak_bytes"] is None for r in rows if r["oom"])
    assert rows[-1]["peak_bytes"] == 4000
    timer.calls.clear()
    assert measure_memory_points(timer, kinds, points_file=points, log=None) == rows
    assert timer.calls == []


# -- memory model with checkpointing -----------------------------------------------------------


class FakeMemoryTimer:
    """Time and peak memory of a micro-batch with n of L blocks checkpointed, from a known
    memory model (with 0.3% noise) and a recompute share of 25%."""

    def __init__(self, truth, seed):
        self.truth, self.layers = truth, truth.num_blocks
        self.meta = {"device": "fake", "config": "fake"}
        self.rng = np.random.default_rng(seed)
        self.calls = []

    def __call__(self, batch, shape, checkpointed=None):
        n = self.layers if checkpointed is None else checkpointed
        self.calls.append((batch, tuple(shape), n))
        s = wan_seq_len(*shape)
        ms = batch * (1 + 1e-3 * s) * (1 - 0.25 * (self.layers - n) / self.layers)
        peak = self.truth.peak_bytes([s] * batch, n) * (1 + 0.003 * self.rng.standard_normal())
        return ms, int(peak)


def test_calibrate_memory_fits_the_policy_model_and_resumes(tmp_path, seed):
    from adaptiveload import MemoryModel
    from adaptiveload.calibrate import calibrate_memory, memory_kinds

    truth = MemoryModel(5, m0=2e9, mb=1e6, mbk=3e6, mt=2e4, ma=1e5, mr=1e4)
    shapes = [(1, 480, 832), (1, 624, 624), (17, 480, 832), (49, 480, 832), (81, 480, 832)]
    timer = FakeMemoryTimer(truth, seed)
    path = tmp_path / "mem.points.jsonl"
    model, rows = calibrate_memory(timer, shapes, 160_000, points_file=path, log=None)
    few, many = memory_kinds(shapes, 160_000)
    assert len(rows) == 4 * len(few) + 2 * len(many) and len(timer.calls) == len(rows)
    assert any(b > 2 for _, b in many), "large batches of images measured"
    assert model.recompute_share == pytest.approx(0.25, abs=0.01)
    for r in rows:  # never under the measured peak beyond the margin
        pred = model.peak_bytes([r["seq_len"]] * r["batch"], r["checkpointed"])
        assert r["peak_bytes"] <= pred * (1 + model.margin)
    for s, b, n in ((1560, 40, 2), (32760, 3, 1), (8000, 1, 4)):
        assert model.peak_bytes([s] * b, n) == pytest.approx(truth.peak_bytes([s] * b, n), rel=0.02)
    # Resume: nothing measured again.
    again = FakeMemoryTimer(truth, seed)
    model2, rows2 = calibrate_memory(again, shapes, 160_000, points_file=path, log=None)
    assert again.calls == [] and rows2 == rows and model2 == model


def test_calibrate_cli_memory_model_needs_cuda(tmp_path, capsys, modelled_times):
    pytest.importorskip("diffusers")
    from adaptiveload.cli import main

    args = "calibrate --config tiny --device cpu --dtype fp32 --no-fused --max-tokens 3000"
    args += " --shapes 1x32x48,17x64x96 --text-len 8 --repeat 1 --warmup 0 --no-progress"
    mem = tmp_path / "mem.json"
    rc = main([*args.split(), "--out", str(tmp_path / "c.json"), "--memory-model", str(mem)])
    assert rc == 0
    assert "measured on CUDA only" in capsys.readouterr().out and not mem.exists()
    assert modelled_times  # the cost model was fitted to modelled times


@pytest.mark.distributed
def test_calibrate_comm_measures_all_to_all_and_the_sampler_uses_it(tmp_path, capsys):
    """``calibrate --comm`` over 4 gloo CPU processes: a rate per degree (2, 4), stored in the
    cost model with the cost per token the sampler then plans split micro-batches with; one
    rank is refused with a message saying why."""
    from adaptiveload.cli import main
    from adaptiveload.comm import measure_comm
    from adaptiveload.cost import sequence_parallel_comm_of, ulysses_comm_per_token

    out = tmp_path / "cost.json"
    CostModel.wan21_h200("1.3B", layers=3).to_json(out)
    args = f"calibrate --comm --comm-ranks 4 --device cpu --layers 3 --out {out}".split()
    assert main(args) == 0
    text = capsys.readouterr().out
    assert "all-to-all over 2 ranks" in text and "all-to-all over 4 ranks" in text
    model = CostModel.from_json(out)
    rates = {int(d): r for d, r in model.meta["all_to_all_bytes_per_s"].items()}
    assert set(rates) == {2, 4} and all(r > 0 for r in rates.values())
    comm = sequence_parallel_comm_of(model)
    assert comm == pytest.approx(ulysses_comm_per_token(1536, 3, bytes_per_s=rates[4]))
    assert model.measured == {} and model.meta["source"] == "wan21_h200:1.3B"
    assert model.meta["heads"] == 12  # for the ring's factor at degrees beyond the heads
    lens = np.array([1560] * 60 + [32760] * 8)
    plans = [
        AdaptiveBatchSampler(lens, 80000, cost_model=model, num_replicas=4, rank=0,
                             uneven_counts=True, sequence_parallel=4, **kw).plan()
        for kw in ({}, {"sequence_parallel_comm": comm}, {"sequence_parallel_comm": 0.0})
    ]  # fmt: skip
    assert np.array_equal(plans[0].costs, plans[1].costs)  # the default is the measured one
    assert not np.array_equal(plans[0].costs, plans[2].costs)
    with pytest.raises(ValueError, match="needs at least 2 ranks"):
        measure_comm(1)


def test_timer_at_a_degree_runs_one_members_share_then_the_whole_again():
    """``ModelTimer(..., degree=d)`` times one member's share: every block sees 1/d of the
    tokens; the next call at degree 1 times the whole micro-batch again."""
    pytest.importorskip("diffusers")
    timer = tiny_timer(activation_checkpointing=True)
    seen = []
    for block in timer.model.blocks:
        block.register_forward_hook(lambda m, a, out: seen.append(out.shape[1]))
    for degree, tokens in ((1, 72), (2, 36), (1, 72)):
        seen.clear()
        ms, _ = timer(1, (9, 64, 96), degree=degree)
        assert ms > 0 and set(seen) == {tokens}, (degree, seen)


def test_a_fit_keeps_what_prices_sequence_parallel_communication():
    """Plan-aware calibration refits the form from its points; the model's architecture and
    the machine's measured all-to-all rates (``cost.DESCRIBES_MODEL``) come from the prior
    whatever the fit, so a calibrated Wan 2.1-1.3B still prices the ring at degree 8 (1.43x)
    and the measured bandwidth rather than the flat fraction."""
    from adaptiveload.calibrate import _model_of
    from adaptiveload.cost import sequence_parallel_comm_of, sequence_parallel_comm_scale_of
    from adaptiveload.fit import Point

    prior = CostModel.wan21_h200("1.3B", layers=3)
    prior.meta |= {"sequence_parallel_comm": 1.25e-4, "all_to_all_bytes_per_s": {"8": 2e11}}
    rng = np.random.default_rng()
    lens = [1560, 3600, 14040, 32760, 75600]
    points = [
        Point(b, s, float(prior.uniform_costs(np.array([s]), np.array([b]))[0])
              * rng.uniform(0.9, 1.1), 0, (1, 1, 1))
        for s in lens for b in (1, 2)
    ]  # fmt: skip
    model = _model_of(points, prior)
    assert model.meta["form"]  # refit: 10 whole points
    for k in ("hidden", "heads", "layers", "sequence_parallel_comm", "all_to_all_bytes_per_s"):
        assert model.meta[k] == prior.meta[k], k
    assert sequence_parallel_comm_of(model) == 1.25e-4
    assert sequence_parallel_comm_scale_of(model, 8)[3] == pytest.approx(1.4286, abs=1e-4)
