"""AdaptiveBatchSampler under HuggingFace accelerate, in 2-3 real CPU processes (gloo):
every sample once per epoch, set_epoch through the prepared loader, refusal of the
configurations that cannot be right, and exact resume through save_state / load_state."""

import collections
import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("accelerate")

HERE = os.path.dirname(os.path.abspath(__file__))
NUM_SAMPLES = 457


def launch(scenario, out_dir, nproc):
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc_per_node={nproc}",
        os.path.join(HERE, "accelerate_worker.py"),
        scenario,
        str(out_dir),
    ]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)


def results(scenario, out_dir, nproc):
    done = launch(scenario, out_dir, nproc)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    out = []
    for r in range(nproc):
        with open(out_dir / f"{scenario}_{r}.json") as f:
            out.append(json.load(f))
    return out


@pytest.mark.parametrize("nproc", [2, 3])
@pytest.mark.parametrize("scenario", ["ordinary", "uneven"])
def test_prepared_loader_sees_every_sample_once_per_epoch(tmp_path, scenario, nproc):
    per_rank = results(scenario, tmp_path, nproc)
    orders = []
    for epoch in ("0", "1"):
        seen = collections.Counter(
            i for r in per_rank for batch in r["epochs"][epoch] for i in batch
        )
        assert set(seen) == set(range(NUM_SAMPLES)), f"epoch {epoch}: samples lost"
        # Every rank draws exactly the micro-batches its plan assigns it (the balance).
        for r in per_rank:
            assert r["epochs"][epoch] == r["plan"][epoch]
        orders.append(per_rank[0]["epochs"][epoch])
    assert orders[0] != orders[1], "set_epoch did not reach the sampler"
    # Epoch 1 went through sampler.micro_batches(prepared loader): K per step, in order.
    for r in per_rank:
        n = len(r["plan"]["1"])
        assert r["steps"] == [[m // 2, m % 2, 2, m % 2 == 1] for m in range(n)]
    assert all(r["len"] == len(r["plan"]["0"]) for r in per_rank)


def test_dispatch_batches_is_refused(tmp_path):
    done = launch("dispatch", tmp_path, 2)
    assert done.returncode != 0
    assert "dispatch_batches=True" in done.stdout + done.stderr


def test_split_batches_is_refused(tmp_path):
    done = launch("split", tmp_path, 2)
    assert done.returncode != 0
    assert "split_batches" in done.stdout + done.stderr


@pytest.mark.parametrize("nproc", [2, 3])
def test_save_state_and_load_state_resume_exactly(tmp_path, nproc):
    first = results("save", tmp_path, nproc)
    rest = results("resume", tmp_path, nproc)
    for a, b in zip(first, rest, strict=True):
        assert b["resumed_epoch"] == 1
        assert len(a["epochs"]["1"]) == 5
        assert a["epochs"]["1"] + b["epochs"]["1"] == a["plan"]["1"], "resumed epoch differs"
        assert b["epochs"]["2"] == b["plan"]["2"]
