"""Calibration of any model (adaptiveload.timing.StepTimer, calibrate_model) and of every
known family (ModelTimer, ``adaptiveload calibrate --model``), on CPU. Calibrations are timed in
modelled milliseconds (the ``modelled_times`` fixture, or a ``measure`` function): a tiny
model's clock times on a busy CPU come in no order. The clock is tested alone."""

import json

import numpy as np
import pytest
import torch
from torch import nn

from adaptiveload import AdaptiveBatchSampler, CostModel
from adaptiveload.calibrate import calibrate_model, calibrate_plan, grid
from adaptiveload.geometry import Geometry
from adaptiveload.timing import StepTimer


class InHouse(nn.Module):
    """A model AdaptiveLoad does not know: attention over a sample's tokens, then an MLP."""

    def __init__(self, dim=32, blocks=2):
        super().__init__()
        self.blocks = nn.ModuleList(
            nn.TransformerEncoderLayer(dim, 2, 2 * dim, batch_first=True) for _ in range(blocks)
        )

    def forward(self, x, checkpointed=0):
        for i, block in enumerate(self.blocks):
            if i < checkpointed:
                x = torch.utils.checkpoint.checkpoint(block, x, use_reentrant=False)
            else:
                x = block(x)
        return x


GEOMETRY = Geometry("in-house", (4, 16, 16), (1, 1, 1))


def make_step(model, calls):
    """One forward+backward of ``model`` on ``batch`` samples of ``shape``."""

    def step(batch, shape, checkpointed):
        calls.append((batch, shape, checkpointed))
        s = GEOMETRY.seq_len(*shape)
        model(torch.randn(batch, s, 32), checkpointed or 0).square().mean().backward()

    return step


def test_the_clock_measures_something_positive():
    # The clock alone: a positive time, the call run warmup + repeat times; never an order of
    # times (on a busy machine a larger call may take less time than a smaller one).
    from adaptiveload.timing import time_call

    calls = []
    ms = time_call(lambda: calls.append(sum(range(10_000))), torch.device("cpu"), 2, 3)
    assert ms > 0 and len(calls) == 5


def test_step_timer_runs_the_step_warmup_plus_repeat_times():
    calls = []
    timer = StepTimer(make_step(InHouse(), calls), device="cpu", layers=2, warmup=2, repeat=3)
    ms, peak = timer(2, (5, 32, 32), checkpointed=1)
    assert ms > 0 and peak == 0
    assert calls == [(2, (5, 32, 32), 1)] * 5
    with pytest.raises(ValueError, match="has no layers"):
        StepTimer(lambda b, s, c: None, device="cpu")(1, (1, 16, 16), checkpointed=1)
    with pytest.raises(ValueError, match="must be callable"):
        StepTimer("not a function", device="cpu")


def test_calibrate_model_measures_the_grid_and_fits_it(modelled_times):
    calls = []
    shapes = [(1, 64, 64), (9, 64, 64), (17, 64, 64)]
    cal = calibrate_model(
        make_step(InHouse(), calls), shapes, GEOMETRY.seq_len, max_tokens=400, device="cpu",
        warmup=1, repeat=2, meta={"model": "in-house"}, progress=False,
    )  # fmt: skip
    want = grid(400, shapes, GEOMETRY.seq_len)
    assert [(p.batch, p.shape) for p in cal.points] == want
    assert [p.seq_len for p in cal.points] == [GEOMETRY.seq_len(*s) for _, s in want]
    assert {(b, s) for b, s, _ in calls} == set(want)
    assert [p.ms for p in cal.points] == modelled_times  # the modelled times, not the clock's
    for b in {p.batch for p in cal.points}:  # they grow with the tokens
        ms = [p.ms for p in sorted(cal.points, key=lambda p: p.seq_len) if p.batch == b]
        assert ms == sorted(ms) and len(set(ms)) == len(ms), (b, ms)
    assert cal.meta["source"] == "calibrate_model" and cal.meta["model"] == "in-house"
    assert all(p.predicted_ms == pytest.approx(p.ms, rel=0.05) for p in cal.points)
    CostModel.from_dict(cal.to_dict())


def test_plan_aware_calibration_of_any_model_measures_what_the_plan_uses():
    rng = np.random.default_rng(4)
    shapes = np.array([(1, 64, 64), (9, 64, 64), (17, 64, 64)])[rng.integers(0, 3, 300)]
    lens = GEOMETRY.seq_len(shapes[:, 0], shapes[:, 1], shapes[:, 2])

    def make_sampler(model):
        return AdaptiveBatchSampler(lens, 600, cost_model=model, num_replicas=2, rank=0)

    # The times are the modelled ones, not the clock's: on a busy CPU the clock's noise can
    # change the refit plan round after round, and whether it settles in ten rounds is then
    # luck (StepTimer's own test above runs the clock).
    calls = []

    def measure(batch, shape):
        calls.append((batch, tuple(int(x) for x in shape)))
        s = GEOMETRY.seq_len(*shape)
        return 1.0 + 2e-2 * batch * s + 2e-5 * batch * s * s, 0

    cal = calibrate_plan(make_sampler, CostModel.default(), shapes, measure, progress=False)
    kinds = {(p.seq_len, p.batch) for p in cal.points}
    assert cal.meta["converged"] and len(kinds) == len(cal.points)
    # Each kind was measured once, with one of its samples' shapes.
    assert sorted(calls) == sorted((p.batch, tuple(p.shape)) for p in cal.points)
    assert all(GEOMETRY.seq_len(*p.shape) == p.seq_len for p in cal.points)
    # Every kind of the final plan was measured.
    plan = make_sampler(cal.cost_model).plan()
    sizes = np.diff(plan.offsets)
    first = lens[plan.samples[plan.offsets[:-1]]]
    assert set(zip(first.tolist(), sizes.tolist(), strict=True)) <= kinds


@pytest.mark.parametrize("family", ["hunyuanvideo", "ltx-video", "cogvideox", "skyreels-v2"])
def test_model_timer_checkpoints_the_blocks_it_is_asked_to(family):
    pytest.importorskip("diffusers")
    from adaptiveload.timing import ModelTimer

    timer = ModelTimer(family, "tiny", layers=1, device="cpu", dtype=torch.float32,
                       warmup=1, repeat=1)  # fmt: skip
    blocks = timer.family.blocks(timer.model)
    assert timer.layers == len(blocks) == (2 if family == "hunyuanvideo" else 1)
    calls = [0]
    for block in blocks:
        block.register_forward_pre_hook(lambda m, a: calls.__setitem__(0, calls[0] + 1))
    shape = (17, 128, 192) if family == "ltx-video" else (9, 64, 96)
    for checkpointed, forwards in ((0, len(blocks)), (1, len(blocks) + 1)):
        calls[0] = 0
        ms, _ = timer(1, shape, checkpointed=checkpointed)
        assert ms > 0 and calls[0] == 2 * forwards  # warmup + repeat
    # What a fitted cost model records of the model: its attention heads and hidden size.
    cfg = timer.family.configs["tiny"]
    heads, hidden = (
        cfg["num_attention_heads"],
        cfg["num_attention_heads"] * cfg["attention_head_dim"],
    )
    assert timer.architecture == {"layers": len(blocks), "hidden": hidden, "heads": heads}
    # A family without a fused patch is timed as diffusers runs it.
    assert timer.meta["family"] == family and timer.meta["fused"] is (
        timer.family.patch is not None
    )


@pytest.mark.slow
@pytest.mark.parametrize("family", ["hunyuanvideo", "ltx-video"])
def test_calibrate_cli_with_model(family, tmp_path, capsys, modelled_times):
    pytest.importorskip("diffusers")
    from adaptiveload.cli import main
    from adaptiveload.models import family_of

    out = tmp_path / "cost.json"
    shapes = (
        "1x128x192,17x256x384,33x256x384"
        if family == "hunyuanvideo"
        else "1x256x384,65x256x384,129x512x768"
    )
    args = f"calibrate --model {family}/tiny --device cpu --dtype fp32 --max-tokens 8000"
    args += f" --shapes {shapes} --repeat 2 --warmup 1 --no-progress"
    assert main([*args.split(), "--out", str(out)]) == 0
    assert "fit error: median" in capsys.readouterr().out
    d = json.loads(out.read_text())
    assert d["meta"]["family"] == family and d["meta"]["source"] == f"calibrate_{family}"
    assert d["meta"]["heads"] == family_of(family).configs["tiny"]["num_attention_heads"]
    geometry = family_of(family).geometry
    assert {p["seq_len"] for p in d["points"]} == {
        geometry.seq_len(*map(int, s.split("x"))) for s in shapes.split(",")
    }
    assert [p["ms"] for p in d["points"]] == modelled_times


def test_model_flag_names_what_is_unknown(capsys):
    from adaptiveload.cli import main

    assert main(["calibrate", "--model", "ltx-video/huge", "--device", "cpu"]) == 2
    assert "unknown ltx-video config 'huge'" in capsys.readouterr().err
