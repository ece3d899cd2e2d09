"""examples/train_diffsynth.py in 2 real gloo processes on CPU with a tiny DiffSynth WanModel:
it trains, each process draws exactly the micro-batches its sampler's plan gives it (about K
per step, every sample once per epoch, a split micro-batch once), and a run resumed from a
checkpoint inside an epoch draws the batches, and computes the losses and weights, of the
uninterrupted run."""

import collections
import importlib.util
import json
import math
import os

import pytest
import torch

pytest.importorskip("diffsynth.models.wan_video_dit")
pytest.importorskip("accelerate")

pytestmark = pytest.mark.distributed  # every test starts processes

from safetensors.torch import load_file  # noqa: E402

from processes import torchrun as launch  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EXAMPLE = os.path.join(ROOT, "examples", "train_diffsynth.py")
NPROC, K, SAMPLES, EPOCHS = 2, 2, 24, 2
SAVE_EVERY = 4  # step 4: inside epoch 0, so the resumed run also crosses into epoch 1


def torchrun(*args):
    """examples/train_diffsynth.py under torchrun with the tests' settings, then ``args``."""
    done = launch(
        EXAMPLE,
        f"--num-samples={SAMPLES}",
        f"--gradient-accumulation-steps={K}",
        f"--epochs={EPOCHS}",
        "--seed=3",
        *args,
        nproc=NPROC,
        timeout=600,  # a fresh machine once stalled past 300 s after its first save_state
    )
    return done.stdout


def read_logs(out):
    logs = []
    for rank in range(NPROC):
        with open(os.path.join(out, f"log_{rank}.jsonl")) as f:
            logs.append([json.loads(line) for line in f])
    return logs


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The uninterrupted run (saving every SAVE_EVERY steps) and a run resumed from its
    checkpoint of step SAVE_EVERY."""
    full = tmp_path_factory.mktemp("full")
    stdout = torchrun(f"--output={full}", f"--steps-per-save={SAVE_EVERY}")
    resumed = tmp_path_factory.mktemp("resumed")
    torchrun(f"--output={resumed}", f"--resume={full / f'step-{SAVE_EVERY}'}")
    return {"full": full, "resumed": resumed, "stdout": stdout}


def load_example():
    spec = importlib.util.spec_from_file_location("train_diffsynth", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def plans():
    """Each epoch's sampler on each rank, as the example makes them."""
    example = load_example()
    args = example.parse_args([f"--gradient-accumulation-steps={K}", "--seed=3"])
    data = example.CachedLatents(SAMPLES, args.latents, args.config, args.seed)
    out = {}
    for epoch in range(EPOCHS):
        for rank in range(NPROC):
            sampler = example.make_sampler(data, args, NPROC, rank)
            sampler.set_epoch(epoch)
            out[epoch, rank] = sampler
    return data, out


def test_it_trains(runs):
    _, samplers = plans()
    steps = sum(samplers[e, 0].plan().num_steps for e in range(EPOCHS))
    logs = read_logs(runs["full"])
    for log in logs:
        assert [r["step"] for r in log] == list(range(1, steps + 1))
        assert all(len(r["samples"]) == len(r["losses"]) == len(r["degrees"]) for r in log)
        assert all(math.isfinite(x) and x > 0 for r in log for x in r["losses"])
    assert f"step {steps} epoch 1 loss" in runs["stdout"]
    first = load_file(runs["full"] / f"step-{SAVE_EVERY}" / "model.safetensors")
    last = load_file(runs["full"] / f"step-{steps}" / "model.safetensors")
    assert first.keys() == last.keys() and any("blocks.1.norm3" in k for k in last)
    assert all(torch.isfinite(v).all() for v in last.values())
    assert not all(torch.equal(first[k], last[k]) for k in last), "the weights did not change"


def test_each_rank_draws_its_plan_and_every_sample_once_per_epoch(runs):
    data, samplers = plans()
    logs = read_logs(runs["full"])
    for epoch in range(EPOCHS):
        seen = collections.Counter()
        for rank, log in enumerate(logs):
            drawn = [r for r in log if r["epoch"] == epoch]
            planned = [b.tolist() for b in samplers[epoch, rank].plan().rank_micro_batches(rank)]
            assert all(len(b) == 1 for b in planned)  # max_batch_size=1
            assert [s for r in drawn for s in r["samples"]] == [b[0] for b in planned]
            for r in drawn:
                assert r["tokens"] == [data.seq_lens[s] for s in r["samples"]]
                # A micro-batch split over d processes is in each one's log: it counts 1/d.
                seen.update({s: 1 / d for s, d in zip(r["samples"], r["degrees"], strict=True)})
        assert sorted(seen) == list(range(SAMPLES)), f"epoch {epoch}"
        assert all(c == pytest.approx(1) for c in seen.values()), f"epoch {epoch}"


def test_resume_reproduces_the_uninterrupted_run(runs):
    full, resumed = read_logs(runs["full"]), read_logs(runs["resumed"])
    for a, b in zip(full, resumed, strict=True):
        assert [r["step"] for r in b] == [r["step"] for r in a[SAVE_EVERY:]]
        assert [r["epoch"] for r in b] == [r["epoch"] for r in a[SAVE_EVERY:]]
        assert [r["samples"] for r in b] == [r["samples"] for r in a[SAVE_EVERY:]]
        for ra, rb in zip(a[SAVE_EVERY:], b, strict=True):
            assert rb["losses"] == pytest.approx(ra["losses"], rel=1e-5)
    end = f"step-{len(full[0])}"
    weights = load_file(runs["full"] / end / "model.safetensors")
    weights_resumed = load_file(runs["resumed"] / end / "model.safetensors")
    for name, value in weights.items():
        torch.testing.assert_close(weights_resumed[name], value, rtol=1e-5, atol=1e-6)
