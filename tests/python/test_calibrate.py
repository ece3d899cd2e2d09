"""Cost and memory model fitting, and `adaptiveload calibrate` on a tiny model on CPU."""

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


def test_calibrate_cli_on_cpu_tiny_model(tmp_path, capsys):
    pytest.importorskip("diffusers")
    from adaptiveload.cli import main

    out = tmp_path / "cost.json"
    # Large enough shapes that time clearly grows with tokens even on a busy CPU.
    args = "calibrate --config tiny --device cpu --dtype fp32 --no-fused --max-tokens 6000"
    args += (
        " --shapes 1x32x48,17x128x192,33x128x192 --text-len 8 --repeat 3 --warmup 1 --no-progress"
    )
    rc = main([*args.split(), "--out", str(out)])
    assert rc == 0
    text = capsys.readouterr().out
    assert "fit error: median" in text and "cost model: CostModel.polynomial" in text
    d = json.loads(out.read_text())
    assert d["kind"] == "polynomial" and len(d["points"]) >= 8
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


def test_plan_aware_calibrate_cli_on_cpu_tiny_model(tmp_path, capsys):
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
    assert (tmp_path / "cost.points.jsonl").exists()
    # Run again: every kind is read back.
    assert main([*args.split(), "--out", str(out)]) == 0
    again = json.loads(out.read_text())["meta"]
    assert again["kinds_resumed"] == again["kinds_measured"] == d["meta"]["kinds_measured"]
