"""AdaptiveBatchSampler under HuggingFace accelerate, in 2-3 real CPU processes (gloo):
every sample once per epoch, set_epoch through the prepared loader, refusal of the
configurations that cannot be right, and exact resume through save_state / load_state."""

import collections
import json
import os

import pytest

pytest.importorskip("accelerate")

from processes import torchrun  # noqa: E402

pytestmark = pytest.mark.distributed  # every test starts processes

HERE = os.path.dirname(os.path.abspath(__file__))
NUM_SAMPLES = 457


def launch(scenario, out_dir, nproc):
    worker = os.path.join(HERE, "accelerate_worker.py")
    return torchrun(worker, scenario, out_dir, nproc=nproc, check=False)


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
        # Saved inside step 2 (5 of K = 2): the state resumes at the step's start, so its
        # first micro-batch, whose gradients the checkpoint lacks, is trained again.
        assert a["epochs"]["1"][:4] + b["epochs"]["1"] == a["plan"]["1"], "resumed epoch differs"
        assert b["epochs"]["2"] == b["plan"]["2"]


def test_save_after_a_resume_inside_a_step_keeps_the_resumed_position(tmp_path):
    # The step the sampler was resumed inside is not complete: the state is the resumed
    # position itself (micro-batch 21), not that step's start, which is before it.
    (r,) = results("midstep_save", tmp_path, 1)
    assert "error" not in r, r.get("error")
    assert r["saved_at"] == 21


def test_readers_accelerate_did_not_prepare_are_refused_or_declared(tmp_path):
    per_rank = results("readers", tmp_path, 2)
    for r in per_rank:
        assert r["passthrough"], "accelerator.prepare wrapped prepare_data_loader's loader"
        assert "not by a loader accelerate prepared" in r["refused"]
        assert "accelerate_sharding = False" in r["refused"]
        assert "but accelerate's BatchSamplerShard draws it" in r["refused_sharded"]
        assert r["len_sharded"] == 2 * r["len_own"] == 2 * len(r["plan"]["0"])
        assert r["epochs"]["0"] == r["plan"]["0"]
    flat = [i for r in per_rank for b in r["epochs"]["0"] for i in b]
    assert set(flat) == set(range(NUM_SAMPLES)), "samples lost"


def test_uneven_counts_with_accelerates_accumulation_counter_are_refused(tmp_path):
    done = launch("uneven_counts", tmp_path, 1)
    assert done.returncode != 0
    out = done.stdout + done.stderr
    assert "gradient_accumulation_steps = 2, but with uneven_counts=True" in out
    assert "loader.accumulate(model)" in out


def test_uneven_counts_train_the_plans_steps_under_accelerate(tmp_path):
    """2 processes, uneven counts: loader.accumulate synchronizes at each rank's last
    micro-batch of every plan step, the optimizer steps once per plan step, every sample is
    trained once, and the weights are those of the plan's steps computed on one process."""
    per_rank = results("train_uneven", tmp_path, 2)
    seen = collections.Counter(i for r in per_rank for b in r["batches"] for i in b)
    # Every sample, once but for the plan's reported padding (repeats filling the last step).
    assert set(seen) == set(range(NUM_SAMPLES))
    assert sum(seen.values()) == NUM_SAMPLES + per_rank[0]["padded"]
    for r in per_rank:
        expected = [[t, k, c] for t, c in enumerate(r["counts"]) for k in range(c)]
        assert r["where"] == expected
        assert r["syncs"] == [k == c - 1 for _, k, c in expected]
        assert r["optimizer_steps"] == r["plan_steps"] == r["state_steps"]
        for got, ref in zip(r["weights"], r["reference"], strict=True):
            assert got == pytest.approx(ref, rel=1e-9, abs=1e-12)
    assert per_rank[0]["counts"] != per_rank[1]["counts"]  # the counts are uneven


def _syncs_at_step_ends(run, k):
    """accelerate synchronized at exactly the plan's step ends (every k-th micro-batch of the
    rank's stream from a step boundary, and the epoch's last)."""
    n = len(run["batches"])
    return run["syncs"] == [(j + 1) % k == 0 or j == n - 1 for j in range(n)]


def test_save_inside_a_step_resumes_to_the_uninterrupted_weights(tmp_path):
    k, save_at = 4, 22
    full = results("train_full", tmp_path, 2)
    saved = results("train_save", tmp_path, 2)
    resumed = results("train_resume", tmp_path, 2)
    for f, s, r in zip(full, saved, resumed, strict=True):
        assert _syncs_at_step_ends(f, k)
        # The step inside which the state was saved is trained again, whole.
        assert r["start"] == save_at - save_at % k
        assert r["step_counter"] % k == 0
        assert s["batches"][: r["start"]] + r["batches"] == f["batches"]
        assert _syncs_at_step_ends(r, k)
        assert r["weights"] == f["weights"], "resumed training differs from an uninterrupted run"


def test_resume_on_another_process_count_syncs_at_the_plan_step_ends(tmp_path):
    k, save_at = 4, 22
    saved = results("train_save", tmp_path, 2)
    (resumed,) = results("train_resume", tmp_path, 1)
    # The other count re-plans the samples the state did not consume, from a step boundary.
    assert resumed["start"] == 0
    assert resumed["step_counter"] % k == 0
    assert _syncs_at_step_ends(resumed, k)
    kept = [i for s in saved for b in s["batches"][: save_at - save_at % k] for i in b]
    again = [i for b in resumed["batches"] for i in b]
    seen = collections.Counter(kept + again)
    assert set(seen) == set(range(NUM_SAMPLES))
    repeats = sum(c - 1 for c in seen.values())
    assert repeats == resumed_padding(resumed), "a sample repeated beyond the plan's padding"


def resumed_padding(run):
    """Samples the resumed plan repeats to fill its last step (its reported padding)."""
    flat = [i for b in run["plan"] for i in b]
    return len(flat) - len(set(flat))


def test_streaming_is_refused_under_accelerates_sharding_and_exact_with_the_helper(tmp_path):
    per_rank = results("streaming", tmp_path, 2)
    for r in per_rank:
        assert "already this rank's" in r["refused"] and "prepare_data_loader" in r["refused"]
        assert r["epochs"]["0"] == r["plan"]["0"]  # this rank's stream, whole
        assert r["state"] == sum(1 for _ in r["plan"]["0"])
    seen = collections.Counter(i for r in per_rank for b in r["epochs"]["0"] for i in b)
    assert set(seen) == set(range(NUM_SAMPLES)), "samples lost"
