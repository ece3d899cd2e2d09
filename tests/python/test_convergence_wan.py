"""benchmarks/convergence_wan.py: its one-GPU simulation of DDP computes DDP's gradient, every
arm trains every sample once per epoch, and ``--quick`` runs end to end on the CPU."""

import csv
import json
import os
import sys

import numpy as np
import pytest
import torch

pytest.importorskip("diffusers")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
import convergence_wan as cw  # noqa: E402

RANKS, K = 8, 2
COLUMNS = [
    "date", "machine", "command", "arm", "sampler", "normalization", "seed", "epoch", "steps",
    "samples_seen", "tokens_seen", "gpu_ms", "optimizer_ms", "train_loss", "imbalance",
    "mixed_steps", "val_image", "val_clip",
]  # fmt: skip


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny ops: more threads only contend (with each other and with other processes)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def data():
    return cw.TrainSet(cw.SyntheticMix(cw.SETUPS["quick"], torch.device("cpu")), 48)


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


@pytest.mark.parametrize("normalization", cw.NORMALIZATIONS)
def test_accumulated_step_is_ddps_gradient_times_world(data, normalization):
    """Accumulating every rank's micro-batches equals W x DDP's average of the ranks'
    gradients, and one backward over the step's samples concatenated (one batch per shape),
    with the step's normalizer counted here from the samples."""
    model = cw.build_model(cw.SETUPS["quick"], 3, "cpu")
    sampler = cw.make_sampler("default", data.seq_lens, data.shapes, ranks=RANKS, k=K, seed=3)
    sampler.set_epoch(1)
    plan = sampler.plan()

    def shapes_in(step):
        return len(
            {tuple(s) for _, idx in cw.step_micro_batches(plan, step) for s in data.shapes[idx]}
        )

    step = max(range(plan.num_steps), key=shapes_in)
    batches = cw.step_micro_batches(plan, step)
    samples = np.concatenate([idx for _, idx in batches])
    assert len({tuple(s) for s in data.shapes[samples]}) > 1, "a step of one shape proves less"
    elements = 16 * 1 * 2 * 2  # output channels x patch
    normalizer = (
        float(data.seq_lens[samples].sum() * elements)
        if normalization == "tokens"
        else float(len(samples))
    )
    assert cw.step_normalizer(plan, step, normalization, elements) == normalizer

    inputs = [data.inputs(idx, 1, 3) for _, idx in batches]
    model.zero_grad()
    loss, ms = cw.accumulate_step(model, inputs, normalization, normalizer)
    simulated = grads(model)
    assert len(ms) == len(batches) and all(t > 0 for t in ms)

    ddp = [torch.zeros_like(p) for p in model.parameters()]
    for rank in range(RANKS):  # each rank's process: its own micro-batches, DDP averages
        model.zero_grad()
        for (r, _), x in zip(batches, inputs, strict=True):
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
    assert loss == pytest.approx(float(total.detach() / normalizer), rel=1e-5)


@pytest.mark.parametrize("arm", list(cw.ARMS))
def test_every_arm_trains_every_sample_once_per_epoch(data, arm):
    sampler = cw.make_sampler(arm, data.seq_lens, data.shapes, ranks=RANKS, k=K, seed=5)
    for epoch in range(2):
        sampler.set_epoch(epoch)
        plan = sampler.plan()
        trained, repeats = [], []
        for step in range(plan.num_steps):
            batches = cw.step_micro_batches(plan, step)
            # a step is micro-batches [step * W * K, (step + 1) * W * K) of the plan
            first = step * RANKS * K
            assert len(batches) == RANKS * K
            for m, (rank, idx) in enumerate(batches, start=first):
                assert rank == (m - first) // K
                assert len(idx) and (data.shapes[idx] == data.shapes[idx[0]]).all()
                (repeats if plan.padding[m] else trained).append(idx)
            counted = np.concatenate([idx for _, idx in batches])
            assert len(counted) == plan.step_samples()[step]
            assert data.seq_lens[counted].sum() == plan.step_tokens()[step]
        trained = np.concatenate(trained)
        assert np.array_equal(np.sort(trained), np.arange(len(data))), arm
        assert len(repeats) == 0 or np.isin(np.concatenate(repeats), trained).all()
    if arm == "shuffled_b1":
        assert (plan.micro_batch_sizes() == 1).all()


def test_quick_runs_end_to_end(tmp_path, monkeypatch, capsys):
    out = tmp_path / "results"
    monkeypatch.setenv("OUT", str(tmp_path / "out"))
    argv = ["--quick", "--seeds", "0,1", "--device", "cpu", "--out-dir", str(out)]
    assert cw.main(argv) == 0
    assert "target, tokens, image" in capsys.readouterr().out
    with open(out / "convergence_wan.csv", newline="") as f:
        reader = csv.DictReader(f)
        assert reader.fieldnames == COLUMNS
        rows = list(reader)
    setup = cw.SETUPS["quick"]
    runs = {}
    for r in rows:
        runs.setdefault((r["arm"], r["normalization"], int(r["seed"])), []).append(r)
    assert set(runs) == {(a, n, s) for a in cw.ARMS for n in cw.NORMALIZATIONS for s in (0, 1)}
    for key, rs in runs.items():
        assert int(rs[0]["steps"]) == 0 and float(rs[0]["gpu_ms"]) == 0, key
        seen = [int(r["samples_seen"]) for r in rs]
        gpu = [float(r["gpu_ms"]) for r in rs]
        assert seen == sorted(seen) and gpu == sorted(gpu) and gpu[-1] > 0, key
        # every sample once per epoch, plus at most W x K - 1 repeats each
        assert setup.epochs * setup.samples <= seen[-1], key
        assert seen[-1] < setup.epochs * (setup.samples + 8 * setup.micro_batches), key
        for r in rs:
            assert np.isfinite([float(r["val_image"]), float(r["val_clip"])]).all(), key
        # every run of a seed starts from the same weights
        first = runs[("shuffled_b1", "tokens", key[2])][0]
        assert (rs[0]["val_image"], rs[0]["val_clip"]) == (first["val_image"], first["val_clip"])
    assert (out / "convergence_wan.png").stat().st_size > 0
    with open(tmp_path / "out" / "convergence_wan.json") as f:
        summary = json.load(f)
    assert set(summary["targets"]) == set(cw.NORMALIZATIONS)
    assert len(summary["arms"]["tokens/default"]["val_image_end"]) == 2
