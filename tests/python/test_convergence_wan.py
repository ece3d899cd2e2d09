"""benchmarks/convergence_wan.py: the arms differ in order only (the control holds the default
plan's micro-batches in as many steps, only dealt differently), its one-device simulation of
DDP computes DDP's gradient, its statistics give the verdicts they claim, and ``--quick`` runs
end to end on the CPU, in this process and in worker processes alike."""

import csv
import json
import os
import sys
from collections import Counter

import numpy as np
import pytest
import torch

pytest.importorskip("diffusers")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
import convergence_arms as ca  # noqa: E402
import convergence_stats as cs  # noqa: E402
import convergence_wan as cw  # noqa: E402
from convergence_data import SETUPS, SyntheticMix, TrainSet  # noqa: E402

RANKS = 8
COLUMNS = [*cw.META, *cw.RUN_COLUMNS]


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny ops: more threads only contend (with each other and with other processes)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def data():
    """Enough samples for several steps per epoch in every structure, and a multiple of
    W x K, so that batch size 1 needs no padding repeats."""
    return TrainSet(SyntheticMix(SETUPS["quick"], torch.device("cpu")), 128)


def grads(model):
    return [p.grad.clone() for p in model.parameters()]


def reference_loss(model, inputs, normalization):
    """The step's loss term of one batch, written out here apart from the benchmark's."""
    pred = model(
        hidden_states=inputs.x_t,
        timestep=inputs.timestep,
        encoder_hidden_states=inputs.text,
        return_dict=False,
    )[0]
    err = (pred - inputs.target) ** 2
    if normalization == "tokens":
        return err.sum()
    return sum(e.mean() for e in err)  # each sample's mean, summed


@pytest.mark.parametrize("normalization", ca.NORMALIZATIONS)
def test_accumulated_step_is_ddps_gradient_times_world(data, normalization):
    """Accumulating every rank's micro-batches equals W x DDP's average of the ranks'
    gradients, and one backward over the step's samples concatenated (one batch per shape),
    with the step's normalizer counted here from the samples."""
    model = ca.build_model(SETUPS["quick"], 3, "cpu")
    steps = ca.ArmPlans("packed_k4", "default", data, RANKS, 3).epoch(1)
    step = max(steps, key=lambda s: len({tuple(data.shapes[i]) for _, idx, _ in s for i in idx}))
    samples = np.concatenate([idx for _, idx, _ in step])
    assert len({tuple(s) for s in data.shapes[samples]}) > 1, "a step of one shape proves less"
    elements = 16 * 1 * 2 * 2  # output channels x patch
    normalizer = (
        float(data.seq_lens[samples].sum() * elements)
        if normalization == "tokens"
        else float(len(samples))
    )
    assert ca.step_normalizer(step, data, normalization, elements) == normalizer

    inputs = [data.inputs(idx, 1, 3) for _, idx, _ in step]
    model.zero_grad()
    loss = ca.accumulate_step(model, inputs, normalization, normalizer)
    simulated = grads(model)

    ddp = [torch.zeros_like(p) for p in model.parameters()]
    for rank in range(RANKS):  # each rank's process: its own micro-batches, DDP averages
        model.zero_grad()
        for (r, _, _), x in zip(step, inputs, strict=True):
            if r == rank:
                (reference_loss(model, x, normalization) / normalizer).backward()
        for d, p in zip(ddp, model.parameters(), strict=True):
            d += p.grad / RANKS
    for s, d in zip(simulated, ddp, strict=True):
        torch.testing.assert_close(s, RANKS * d, rtol=1e-5, atol=1e-6)

    model.zero_grad()
    total = 0.0
    for shape in {tuple(s) for s in data.shapes[samples]}:
        same = samples[(data.shapes[samples] == shape).all(axis=1)]
        total = total + reference_loss(model, data.inputs(same, 1, 3), normalization)
    (total / normalizer).backward()
    for s, c in zip(simulated, grads(model), strict=True):
        torch.testing.assert_close(s, c, rtol=1e-5, atol=1e-6)
    assert float(loss) == pytest.approx(float(total.detach() / normalizer), rel=1e-5)


def as_sets(steps):
    return [sorted((tuple(int(i) for i in idx), pad) for _, idx, pad in step) for step in steps]


@pytest.mark.parametrize("structure", list(ca.STRUCTURES))
def test_control_holds_the_default_plans_micro_batches_dealt_otherwise(data, structure):
    """Same micro-batches (as a multiset, each sample once), same number of steps of W x K,
    K per rank; only which step each micro-batch lands in differs, and it does differ."""
    max_batch_size, k = ca.STRUCTURES[structure]
    for seed in (0, 5):
        for epoch in (0, 3):
            default = ca.ArmPlans(structure, "default", data, RANKS, seed).epoch(epoch)
            control = ca.ArmPlans(structure, ca.CONTROL, data, RANKS, seed).epoch(epoch)
            assert len(control) == len(default) > 1
            assert ca.micro_batch_multiset(control) == ca.micro_batch_multiset(default)
            for step in control:
                assert Counter(r for r, _, _ in step) == {r: k for r in range(RANKS)}
            trained = np.concatenate([idx for s in control for _, idx, pad in s if not pad])
            assert np.array_equal(np.sort(trained), np.arange(len(data)))
            assert as_sets(control) != as_sets(default), "the control is not shuffled"
            if max_batch_size == 1:
                assert all(len(idx) == 1 for s in control for _, idx, _ in s)


@pytest.mark.parametrize("order", ca.ORDERS)
@pytest.mark.parametrize("structure", list(ca.STRUCTURES))
def test_every_arm_trains_every_sample_once_per_epoch(data, structure, order):
    max_batch_size, k = ca.STRUCTURES[structure]
    arm = ca.ArmPlans(structure, order, data, RANKS, 5)
    for epoch in range(2):
        steps = arm.epoch(epoch)
        trained = [idx for s in steps for _, idx, pad in s if not pad]
        assert np.array_equal(np.sort(np.concatenate(trained)), np.arange(len(data)))
        for step in steps:
            assert len(step) == RANKS * k
            for _, idx, _ in step:
                assert (data.shapes[idx] == data.shapes[idx[0]]).all()
                assert max_batch_size is None or len(idx) == max_batch_size


def test_the_wiring_check_passes_and_can_fail(data, monkeypatch):
    found = ca.check_wiring(data, RANKS, 2)
    assert set(found) == set(ca.STRUCTURES)
    for facts in found.values():
        assert facts["steps"][ca.CONTROL] == facts["steps"]["default"]
    # segregated steps hold both modalities less often than the shuffled control's
    assert np.mean(found["b1_k1"]["mixed_steps"]["segregated"]) < np.mean(
        found["b1_k1"]["mixed_steps"][ca.CONTROL]
    )

    def lose_one(steps, k, rng):  # a shuffle that repeats one micro-batch in place of another
        out = [list(s) for s in steps]
        out[0][0] = out[-1][-1]
        return out

    monkeypatch.setattr(ca, "shuffled_steps", lose_one)
    with pytest.raises(RuntimeError, match="lost or changed"):
        ca.ArmPlans("b1_k1", ca.CONTROL, data, RANKS, 2).epoch(0)
    monkeypatch.undo()

    planned = ca.ArmPlans.epoch

    def one_step_short(self, epoch):  # a control that skips the last step
        steps = planned(self, epoch)
        return steps[:-1] if self.order == ca.CONTROL else steps

    monkeypatch.setattr(ca.ArmPlans, "epoch", one_step_short)
    with pytest.raises(RuntimeError, match="not every sample once"):
        ca.check_wiring(data, RANKS, 2)


@pytest.mark.parametrize(
    ("diffs", "verdict"),
    [
        ([0.001, -0.001, 0.002, 0.0, -0.002], "equivalent"),
        ([0.05, 0.06, 0.055, 0.052, 0.058], "worse"),
        ([-0.05, -0.06, -0.055, -0.052, -0.058], "better"),
        ([0.05, -0.05, 0.0, 0.04, -0.03], "inconclusive"),
        ([0.015, 0.025, 0.02, 0.018, 0.022], "inconclusive"),  # straddles +2% of 1.0
    ],
)
def test_paired_verdicts(diffs, verdict):
    control = [1.0, 1.1, 0.9, 1.0, 1.0]
    arm = [c + d for c, d in zip(control, diffs, strict=True)]
    r = cs.paired(arm, control)
    assert r["verdict"] == verdict
    assert r["n"] == 5 and r["margin"] == pytest.approx(0.02)
    assert r["diff"] == pytest.approx(np.mean(diffs))
    half = 2.776445 * np.std(diffs, ddof=1) / np.sqrt(5)  # t(0.975, 4)
    assert r["high"] - r["diff"] == pytest.approx(half, rel=1e-5)


def test_run_metrics():
    rows = [
        {
            "samples_seen": s,
            "steps": s // 10,
            "micro_batches": s,
            "mixed_steps": 0.5,
            "wall_s": 1.0,
            "lr": 1e-3,
            "val_image": v,
            "val_clip": 2 * v,
        }
        for s, v in ((0, 2.0), (100, 1.0), (200, 1.0))
    ]
    m = cs.run_metrics(rows)
    assert m["final_image"] == 1.0 and m["final_clip"] == 2.0
    assert m["auc_image"] == pytest.approx((1.5 * 100 + 1.0 * 100) / 200)
    assert m["last_tenth_drop_image"] == 0.0


def read_rows(path):
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        return reader.fieldnames, list(reader)


@pytest.mark.slow
def test_quick_runs_end_to_end(tmp_path, capsys):
    out = tmp_path / "results"
    assert cw.main(["--quick", "--seeds", "0-1", "--out-dir", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "wiring b1_k1: control = the default plan's micro-batches" in printed
    assert "no-structure predictor" in printed and "paired differences" in printed
    columns, rows = read_rows(out / cw.RUNS_CSV)
    assert columns == COLUMNS
    setup = SETUPS["quick"]
    runs = {}
    for r in rows:
        runs.setdefault(
            (r["structure"], r["order"], r["normalization"], int(r["seed"])), []
        ).append(r)
    assert set(runs) == {
        (s, o, n, seed)
        for s in ca.STRUCTURES
        for o in ca.ORDERS
        for n in ca.NORMALIZATIONS
        for seed in (0, 1)
    }
    for (structure, _, _, seed), rs in runs.items():
        assert int(rs[0]["steps"]) == 0
        seen = [int(r["samples_seen"]) for r in rs]
        assert seen == sorted(seen) and seen[-1] == setup.schedules[structure].epochs * 32
        # every run of a seed starts from the same weights; arm and control take as many steps
        first = runs[(structure, ca.CONTROL, "tokens", seed)]
        assert (rs[0]["val_image"], rs[0]["val_clip"]) == (
            first[0]["val_image"],
            first[0]["val_clip"],
        )
        assert rs[-1]["steps"] == first[-1]["steps"]
        assert float(rs[-1]["lr"]) == setup.schedules[structure].lr
    _, conflict = read_rows(out / cw.CONFLICT_CSV)
    assert {r["branch"] for r in conflict} == {"start", "clips only", "images only", "mixed"}
    assert (out / "convergence_wan.png").stat().st_size > 0
    assert (out / "convergence_wan_diff.png").stat().st_size > 0
    with open(out / "convergence_wan.json") as f:
        summary = json.load(f)
    assert len(summary["comparisons"]) == 4 * 2 * 2 * 2 * 2  # structures x orders x ...
    assert {c["seeds"] == [0, 1] for c in summary["comparisons"]} == {True}
    kinds = Counter(t["kind"] for t in summary["targets"])
    assert kinds == {
        "seeds": 24,
        "below_predictor": 48,
        "flat": 48,
        "conflict": 2,
        "comparison": 64,
    }
    assert set(summary["predictor"]) == {"image", "clip"}


@pytest.mark.distributed
def test_worker_processes_and_slices_give_the_same_numbers(tmp_path, capsys):
    """Two spawned workers give the rows this process gives (each run is deterministic), and
    slices merged by --summarize-only give the summary of one run over all their seeds."""
    args = ["--quick", "--structures", "b1_k1", "--no-conflict"]
    both, one, two, merged = (str(tmp_path / n) for n in ("both", "one", "two", "merged"))
    assert cw.main([*args, "--seeds", "0-1", "--out-dir", both]) == 0
    assert cw.main([*args, "--seeds", "0", "--out-dir", one, "--workers", "2"]) == 0
    assert cw.main([*args, "--seeds", "1", "--out-dir", two]) == 0
    assert cw.main(["--summarize-only", one, two, "--out-dir", merged]) == 0
    capsys.readouterr()

    def numbers(folder):
        _, rows = read_rows(os.path.join(folder, cw.RUNS_CSV))
        keep = ("structure", "order", "normalization", "seed", "steps", "val_image", "val_clip")
        return sorted(tuple(r[k] for k in keep) for r in rows)

    assert numbers(merged) == numbers(both)
    with (
        open(os.path.join(both, "convergence_wan.json")) as f,
        open(os.path.join(merged, "convergence_wan.json")) as g,
    ):
        assert json.load(f)["comparisons"] == json.load(g)["comparisons"]


def test_no_run_starts_after_the_time_budget(tmp_path, capsys):
    argv = ["--quick", "--structures", "b1_k1", "--time-budget", "0", "--out-dir", str(tmp_path)]
    assert cw.main(argv) == 1
    # 2 seeds x (3 orders x 2 normalizations + the conflict run)
    assert "time budget: 14 of 14 runs not started" in capsys.readouterr().out
    _, rows = read_rows(tmp_path / cw.RUNS_CSV)
    assert rows == []
