"""Cost and memory model fitting, and `adaptiveload calibrate` on a tiny model on CPU."""

import json

import numpy as np
import pytest

from adaptiveload import CostModel
from adaptiveload.calibrate import Calibration, Point, fit_cost_model, fit_memory_model, wan_grid


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
