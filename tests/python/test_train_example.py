"""examples/train_wan.py in 2 real gloo processes on CPU with a tiny model: it trains,
resuming from its checkpoint yields the same next batches and the same losses, and online
refinement of the cost model plans each epoch with the times measured before it.

Runs that are compared batch for batch pass --no-refine-cost-model: with refinement, the
plans of later epochs depend on measured times."""

import json
import math
import os
import subprocess
import sys

import pytest

pytest.importorskip("diffusers")

from processes import torchrun as launch  # noqa: E402

pytestmark = pytest.mark.distributed  # every test starts processes

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EXAMPLES = os.path.join(ROOT, "examples")


def torchrun(*args, nproc=2, timeout=300):
    """examples/train_wan.py under torchrun with the tests' tiny settings, then ``args``."""
    launch(
        os.path.join(EXAMPLES, "train_wan.py"),
        *("--device", "cpu", "--config", "tiny", "--num-workers", "1", "--no-progress"),
        *("--micro-batches-per-step", "2", "--seed", "5", "--epochs", "4", "--max-tokens", "320"),
        *args,
        nproc=nproc,
        timeout=timeout,
    )


def read_lines(path):
    with open(path) as f:
        return [json.loads(line) for line in f]


def read_log(path):
    """The log's step records."""
    return [r for r in read_lines(path) if "step" in r]


def read_epochs(path):
    """The log's epoch summaries."""
    return [r for r in read_lines(path) if "measured_imbalance" in r]


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    out = tmp_path_factory.mktemp("wan_data")
    subprocess.run(
        [
            sys.executable,
            os.path.join(EXAMPLES, "make_synthetic_latents.py"),
            "--out",
            str(out),
            "--num-samples",
            "60",
            "--scale",
            "0.0625",
            "--channels",
            "4",
            "--text-len",
            "8",
            "--text-dim",
            "32",
        ],
        check=True,
        capture_output=True,
    )
    return str(out)


@pytest.mark.parametrize("sampler", ["adaptive", "equal"])
def test_train_then_resume_reproduces_the_run(dataset, tmp_path, sampler):
    full, first, rest = (str(tmp_path / n) for n in ("full.jsonl", "first.jsonl", "rest.jsonl"))
    common = ("--data", dataset, "--sampler", sampler, "--no-refine-cost-model")
    torchrun(*common, "--max-steps", "5", "--log-file", full)
    ckpt = str(tmp_path / "ckpt")
    torchrun(
        *common,
        "--max-steps",
        "3",
        "--log-file",
        first,
        "--checkpoint-dir",
        ckpt,
    )
    torchrun(
        *common,
        "--max-steps",
        "5",
        "--log-file",
        rest,
        "--checkpoint-dir",
        ckpt,
        "--resume",
    )
    full_log, first_log, rest_log = read_log(full), read_log(first), read_log(rest)
    assert len(full_log) == 5 and len(first_log) == 3 and len(rest_log) == 2
    for a, b in zip(full_log, first_log + rest_log, strict=True):
        assert a["batches"] == b["batches"], (
            f"step {a['global_step']}: different micro-batches after resuming"
        )
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-5), f"step {a['global_step']}"
    for rec in full_log:
        assert len(rec["compute_ms"]) == 2 and all(len(r) == 2 for r in rec["batches"])
        assert 0 <= rec["imbalance"] < 1
    for epoch in {rec["epoch"] for rec in full_log}:
        seen = [
            i
            for rec in full_log
            if rec["epoch"] == epoch
            for rank in rec["batches"]
            for mb in rank
            for i in mb
        ]
        assert len(seen) == len(set(seen)), "a sample was drawn twice within an epoch"


def test_fsdp2_trains_on_cpu(dataset, tmp_path):
    log = str(tmp_path / "fsdp.jsonl")
    torchrun("--data", dataset, "--parallel", "fsdp", "--max-steps", "2", "--log-file", log)
    recs = read_log(log)
    assert len(recs) == 2 and all(r["loss"] > 0 for r in recs)


def test_uneven_counts_resume_exactly_and_agree_under_ddp_and_fsdp2(dataset, tmp_path):
    # One sample per micro-batch and one-step lookahead: some steps give a rank 1 and the
    # other 3 of their 4 micro-batches (epoch 0, steps 12 and 13). The first run stops after
    # step 12, so the resume starts right after an uneven step.
    full, first, rest, fsdp = (
        str(tmp_path / n) for n in ("full.jsonl", "first.jsonl", "rest.jsonl", "fsdp.jsonl")
    )
    common = ("--data", dataset, "--no-refine-cost-model", "--uneven-counts",
              "--max-batch-size", "1", "--lookahead-steps", "1")  # fmt: skip
    ckpt = str(tmp_path / "ckpt")
    torchrun(*common, "--max-steps", "22", "--log-file", full)
    torchrun(*common, "--max-steps", "13", "--log-file", first, "--checkpoint-dir", ckpt)
    torchrun(*common, "--max-steps", "22", "--log-file", rest, "--checkpoint-dir", ckpt,
             "--resume")  # fmt: skip
    torchrun(*common, "--max-steps", "14", "--log-file", fsdp, "--parallel", "fsdp")
    full_log = read_log(full)
    counts = [[len(rank) for rank in rec["batches"]] for rec in full_log]
    assert all(sum(c) == 4 and min(c) >= 1 for c in counts)
    assert [1, 3] in counts[:13], f"the test needs an uneven step before the resume: {counts}"
    resumed = read_log(first) + read_log(rest)
    assert len(resumed) == len(full_log) == 22
    for a, b in zip(full_log, resumed, strict=True):
        assert a["batches"] == b["batches"], f"step {a['global_step']}: other micro-batches"
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-5), f"step {a['global_step']}"
    # Under FSDP2 (parameters gathered through the step) the same steps give the same losses:
    # each rank synchronized once per step, after its own count of micro-batches.
    for a, b in zip(full_log[:14], read_log(fsdp), strict=True):
        assert a["batches"] == b["batches"]
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-5), f"fsdp step {a['global_step']}"
    epoch0 = [i for rec in full_log if rec["epoch"] == 0 for r in rec["batches"]
              for mb in r for i in mb]  # fmt: skip
    assert sorted(epoch0) == list(range(60)), "epoch 0 did not draw every sample once"


@pytest.mark.parametrize("parallel", ["ddp", "fsdp"])
def test_warm_shapes_changes_nothing_but_the_clock(dataset, tmp_path, parallel):
    # --warm-shapes runs every new micro-batch shape once before the epoch, on random inputs,
    # and clears the gradients: the run's batches and losses are those of a run without it,
    # and FSDP's collectives stay matched although the ranks have different shape counts.
    plain, warm = str(tmp_path / "plain.jsonl"), str(tmp_path / "warm.jsonl")
    common = ("--data", dataset, "--parallel", parallel, "--max-steps", "3")
    common += ("--no-refine-cost-model",)
    torchrun(*common, "--log-file", plain)
    torchrun(*common, "--log-file", warm, "--warm-shapes")
    plain_log, warm_log = read_log(plain), read_lines(warm)
    marks = [r for r in warm_log if "warm_shapes" in r]
    steps = [r for r in warm_log if "step" in r]
    assert marks[0]["epoch"] == 0 and marks[0]["warm_shapes"] >= 1  # then one per epoch begun
    assert [m["epoch"] for m in marks] == sorted({r["epoch"] for r in steps})
    assert len(steps) == len(plain_log) == 3
    for a, b in zip(plain_log, steps, strict=True):
        assert a["batches"] == b["batches"]
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-6), f"step {a['global_step']}"


# -- online refinement of the cost model --------------------------------------------------------

W, K = 2, 2  # ranks and micro-batches per step of torchrun()


def reference_sampler(dataset, rank, learned):
    """The sampler train_wan.py makes on ``rank``, planning with the learned kinds: with its
    default ``--sequence-parallel auto`` (degree 2 over the W = 2 ranks), so uneven counts.
    Without them the reference planned even counts, and matched the example only where the
    measured times left both plans alike (the test failed now and then)."""
    from adaptiveload import AdaptiveBatchSampler, CostModel
    from adaptiveload.metadata import read_metadata
    from adaptiveload.sampler import auto_sequence_parallel

    meta = read_metadata(os.path.join(dataset, "metadata.csv"))
    return AdaptiveBatchSampler(
        meta.seq_lens,
        320,
        cost_model=CostModel.default().with_measured(learned),
        group_keys=meta.shapes,
        num_replicas=W,
        rank=rank,
        micro_batches_per_step=K,
        seed=5,
        uneven_counts=True,
        sequence_parallel=auto_sequence_parallel(W),
    )


def fold(history, steps, seq_lens):
    """The times of ``steps`` (log records of one update), folded as update_cost_model does:
    rank after rank, each in the order it trained; the most recent 32 per kind."""
    for rank in range(W):
        for rec in steps:
            for idx, ms in zip(rec["batches"][rank], rec["micro_batch_ms"][rank], strict=True):
                assert len({seq_lens[i] for i in idx}) == 1
                kind = (int(seq_lens[idx[0]]), len(idx))
                history[kind] = (history.get(kind, []) + [ms])[-32:]
    return history


def medians(history):
    return {kind: sorted(t)[(len(t) - 1) // 2] for kind, t in history.items()}


def epoch_batches(log, epoch, rank):
    return [mb for rec in log if rec["epoch"] == epoch for mb in rec["batches"][rank]]


def test_refinement_plans_each_epoch_with_the_times_measured_before(dataset, tmp_path):
    from adaptiveload.metadata import read_metadata

    seq_lens = read_metadata(os.path.join(dataset, "metadata.csv")).seq_lens
    log, ckpt = str(tmp_path / "log.jsonl"), str(tmp_path / "ckpt")
    torchrun("--data", dataset, "--epochs", "2", "--log-file", log, "--checkpoint-dir", ckpt)
    steps, epochs = read_log(log), read_epochs(log)
    assert [e["epoch"] for e in epochs] == [0, 1]
    for e in epochs:
        mine = [r for r in steps if r["epoch"] == e["epoch"]]
        assert e["steps"] == len(mine)
        assert e["measured_imbalance"] == pytest.approx(
            sum(r["imbalance"] for r in mine) / len(mine)
        )
        assert 0 <= e["cost_error_median"] <= e["cost_error_p90"]
        # The composition of the epoch's plan (all of its steps ran here).
        assert e["composition"]["num_steps"] == len(mine)
        assert 0 <= e["composition"]["missing"] <= 1 and e["composition"]["tokens_ratio"] >= 0
        assert e["refined"]["records"] == len(mine) * W * K  # one length per micro-batch
    # The learned times are those of the log, folded in rank order, epoch after epoch.
    after_first = fold({}, [r for r in steps if r["epoch"] == 0], seq_lens)
    active = medians(after_first)
    history = fold(
        {k: list(v) for k, v in after_first.items()},
        [r for r in steps if r["epoch"] == 1],
        seq_lens,
    )
    assert epochs[0]["refined"]["kinds"] == len(active)
    assert epochs[1]["refined"]["kinds"] == len(history)
    import torch

    learned = torch.load(os.path.join(ckpt, "last.pt"), weights_only=False)["sampler"][
        "learned_costs"
    ]
    assert learned["active"] == [[s, b, ms] for (s, b), ms in sorted(active.items())]
    assert learned["history"] == [[s, b, t] for (s, b), t in sorted(history.items())]
    # Epoch 0 planned with the base model, epoch 1 with the times of epoch 0.
    for rank in range(W):
        for epoch, kinds in ((0, {}), (1, active)):
            ref = reference_sampler(dataset, rank, kinds)
            ref.set_epoch(epoch)
            assert epoch_batches(steps, epoch, rank) == list(ref), (epoch, rank)


def test_resuming_a_refined_run_replays_the_interrupted_epoch(dataset, tmp_path):
    import shutil

    import torch

    first, rest, ckpt = (str(tmp_path / n) for n in ("first.jsonl", "rest.jsonl", "ckpt"))
    common = ("--data", dataset, "--epochs", "2", "--checkpoint-dir", ckpt)
    torchrun(*common, "--max-steps", "3", "--log-file", first)  # 2 steps of epoch 0, 1 of 1
    shutil.copy(os.path.join(ckpt, "last.pt"), str(tmp_path / "interrupted.pt"))
    torchrun(*common, "--resume", "--log-file", rest)
    state = torch.load(str(tmp_path / "interrupted.pt"), weights_only=False)["sampler"]
    active = {(s, b): ms for s, b, ms in state["learned_costs"]["active"]}
    assert active  # epoch 1 plans with the times of epoch 0
    # Rank 0's state after epoch 1's first step (uneven counts: its own count there).
    assert (state["epoch"], state["steps_done"]) == (1, 1)
    ref = reference_sampler(dataset, 0, active)
    ref.set_epoch(1)
    assert state["micro_batches_done"] == ref.plan().micro_batches_in_step(0, 0)
    first_log, rest_log = read_log(first), read_log(rest)
    assert {r["epoch"] for r in rest_log} == {1}
    drawn, padded = {}, 0  # a split micro-batch is listed by each of its members: once here
    for rank in range(W):
        ref = reference_sampler(dataset, rank, active)
        ref.set_epoch(1)
        got = epoch_batches(first_log, 1, rank) + epoch_batches(rest_log, 1, rank)
        assert got == list(ref), f"rank {rank}: the resumed epoch is not the interrupted plan"
        drawn |= {tuple(mb): mb for mb in got}
        padded = ref.plan().num_padded_samples
    drawn = [i for mb in drawn.values() for i in mb]
    assert set(drawn) == set(range(60)), "a sample was lost across the resume"
    assert len(drawn) == 60 + padded, "a sample was repeated across the resume"


# -- resubmission by a job scheduler ------------------------------------------------------------


def ckpt_summary(path):
    import torch

    ck = torch.load(path, weights_only=False, map_location="cpu")
    s = ck["sampler"]
    return ck["epoch"], ck["global_step"], s["epoch"], s["micro_batches_done"], s["num_consumed"]


def test_resubmitting_a_finished_run_trains_nothing_and_keeps_the_checkpoint(dataset, tmp_path):
    ckpt, log = str(tmp_path / "ckpt"), str(tmp_path / "log.jsonl")
    common = ("--data", dataset, "--checkpoint-dir", ckpt, "--log-file", log)
    torchrun(*common, "--max-steps", "3")
    before = ckpt_summary(os.path.join(ckpt, "last.pt"))
    assert before[1] == 3
    for _ in range(2):  # the scheduler resubmits, twice
        torchrun(*common, "--max-steps", "3", "--resume")
        assert len(read_log(log)) == 3, "a resubmitted run that had reached --max-steps trained"
        assert ckpt_summary(os.path.join(ckpt, "last.pt")) == before


def test_resuming_after_the_last_epoch_does_not_train_it_again(dataset, tmp_path):
    ckpt, log = str(tmp_path / "ckpt"), str(tmp_path / "log.jsonl")
    common = ("--data", dataset, "--checkpoint-dir", ckpt, "--log-file", log, "--epochs", "1")
    torchrun(*common)
    steps = len(read_log(log))
    before = ckpt_summary(os.path.join(ckpt, "last.pt"))
    assert before[0] == 0 and before[1] == steps and before[4] == 60  # epoch 0 fully consumed
    for _ in range(2):
        torchrun(*common, "--resume")
        assert len(read_log(log)) == steps, "the finished epoch was trained again"
        assert ckpt_summary(os.path.join(ckpt, "last.pt")) == before


def test_checkpoint_load_errors_name_the_file(dataset, tmp_path):
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "last.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(AssertionError, match=str(ckpt / "last.pt")):
        torchrun("--data", dataset, "--checkpoint-dir", str(ckpt), "--resume", "--max-steps", "1")


def test_a_missing_peer_fails_within_the_timeout(dataset):
    # Rank 0 of 2 alone: it waits for its peer at the first rendezvous, then gives up after
    # --timeout seconds instead of torch's default 30 minutes.
    import socket
    import time

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(
        os.environ,
        RANK="0",
        LOCAL_RANK="0",
        WORLD_SIZE="2",
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        OMP_NUM_THREADS="1",
    )
    cmd = [sys.executable, os.path.join(EXAMPLES, "train_wan.py"), "--device", "cpu", "--config"]
    cmd += ["tiny", "--data", dataset, "--timeout", "5", "--no-progress"]
    t0 = time.monotonic()
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=240, env=env)
    assert done.returncode != 0
    assert "Timed out" in done.stderr, done.stderr[-2000:]
    assert time.monotonic() - t0 < 120


def test_memory_budget_checkpoints_per_micro_batch_and_covers_every_sample(dataset, tmp_path):
    """--memory-model/--memory-budget under DDP: the run trains, every sample once per epoch,
    and the policy's choice of blocks varies between micro-batches of the plan."""
    from adaptiveload import MemoryModel
    from adaptiveload.metadata import read_metadata

    meta = read_metadata(os.path.join(dataset, "metadata.csv"))
    # 2 blocks; 1 GiB fixed; per-token memory such that the longest samples need checkpointing.
    longest = int(meta.seq_lens.max())
    per_block = 2**30 / (4 * longest)
    model = MemoryModel(2, m0=2**30, ma=per_block, mr=per_block / 2, recompute_share=0.25)
    path = str(tmp_path / "memory.json")
    model.save(path)
    log = str(tmp_path / "mem.jsonl")
    # The budget leaves room for the optimizer state (8 bytes per parameter, tiny here).
    budget = (model.peak_bytes([longest], 1) * 1.01) / 2**30 + 0.01
    torchrun(
        "--data", dataset, "--memory-model", path, "--memory-budget", f"{budget:.4f}",
        "--log-file", log, "--epochs", "1", "--sequence-parallel", "1",
    )  # fmt: skip
    records = read_log(log)
    lines = read_lines(log)
    assert any("memory" in r for r in lines), "the run reports its memory summary"
    epoch0 = [i for rec in records if rec["epoch"] == 0 for rank in rec["batches"]
              for mb in rank for i in mb]  # fmt: skip
    assert len(epoch0) == len(set(epoch0)), "a sample was drawn twice within an epoch"
    # The same plan as the sampler alone, with varying checkpointed blocks.
    from adaptiveload import AdaptiveBatchSampler

    s = AdaptiveBatchSampler(
        meta.seq_lens, 320, group_keys=meta.shapes, num_replicas=2, rank=0,
        micro_batches_per_step=2, seed=5, memory_model=model,
        memory_budget_gib=budget - 8 * _tiny_params() / 2**30,
    )  # fmt: skip
    plan = s.plan()
    assert len(records) == plan.num_steps
    first = [
        [plan.micro_batch(t, r, k).tolist() for k in range(2)]
        for t in range(plan.num_steps)
        for r in range(2)
    ]
    logged = [rank for rec in records for rank in rec["batches"]]
    assert logged == first
    assert sorted(epoch0) == list(range(len(meta.seq_lens)))
    assert len(set(plan.checkpointed.tolist())) > 1, "the budget should vary the policy"


def _tiny_params():
    from adaptiveload.models.wan import build_wan

    return sum(p.numel() for p in build_wan("tiny").parameters())


def test_out_of_memory_reruns_the_step_fully_checkpointed_without_counting_twice(
    dataset, tmp_path, monkeypatch
):
    """An out-of-memory error in the middle of a step (injected into the second micro-batch's
    forward): the step's partial gradients are cleared, the step re-runs with that kind fully
    checkpointed, and every later loss equals that of a run without the error (checkpointing
    does not change the math), so no gradient was counted twice or lost."""
    import importlib.util

    import torch

    from adaptiveload import MemoryModel
    from adaptiveload.metadata import read_metadata

    spec = importlib.util.spec_from_file_location(
        "train_wan", os.path.join(EXAMPLES, "train_wan.py")
    )
    train_wan = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(train_wan)

    meta = read_metadata(os.path.join(dataset, "metadata.csv"))
    longest = int(meta.seq_lens.max())
    model = MemoryModel(2, m0=2**30, ma=2**30 / (4 * longest), recompute_share=0.25)
    path = str(tmp_path / "memory.json")
    model.save(path)
    budget = model.peak_bytes([longest], 1) * 1.01 / 2**30 + 0.01
    argv = [
        "--data", dataset, "--device", "cpu", "--config", "tiny", "--num-workers", "0",
        "--no-progress", "--micro-batches-per-step", "2", "--seed", "5", "--max-tokens", "320",
        "--memory-model", path, "--memory-budget", f"{budget:.4f}", "--max-steps", "4",
        "--no-refine-cost-model",
    ]  # fmt: skip
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    clean = str(tmp_path / "clean.jsonl")
    train_wan.main([*argv, "--log-file", clean])

    real = train_wan.flow_matching_loss
    calls = {"n": 0}

    def failing(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 4:  # step 1, second micro-batch
            raise torch.OutOfMemoryError("injected")
        return real(*args, **kwargs)

    monkeypatch.setattr(train_wan, "flow_matching_loss", failing)
    faulty = str(tmp_path / "faulty.jsonl")
    train_wan.main([*argv, "--log-file", faulty])
    a, b = read_log(clean), read_log(faulty)
    assert [r["batches"] for r in a] == [r["batches"] for r in b]
    for x, y in zip(a, b, strict=True):
        assert x["loss"] == pytest.approx(y["loss"], rel=1e-6, abs=1e-9), x["global_step"]
    mem = [r["memory"] for r in read_lines(faulty) if "memory" in r][0]
    assert mem["oom_retries"] == 1 and mem["oom_fallback_kinds"] == 1
    # 8 micro-batches, the failed call, and the re-run of the step's first micro-batch.
    assert calls["n"] == 4 * 2 + 2, "the failed step ran again from its first micro-batch"


def test_sequence_parallel_auto_trains_clips_longer_than_one_gpu_holds(dataset, tmp_path):
    """--sequence-parallel auto on 2 ranks (the tiny model's 2 heads: D = 2): the two clips of
    315 tokens exceed --max-tokens 200 and train split over both ranks; each sample of an
    epoch trains once (a split micro-batch is listed by both members), losses are finite, the
    run resumes exactly from its checkpoint, and FSDP2 gives DDP's losses."""
    full, first, rest = (str(tmp_path / n) for n in ("full.jsonl", "first.jsonl", "rest.jsonl"))
    common = ("--data", dataset, "--no-refine-cost-model", "--sequence-parallel", "auto",
              "--max-batch-size", "1", "--max-tokens", "200", "--epochs", "1")  # fmt: skip
    ckpt = str(tmp_path / "ckpt")
    torchrun(*common, "--log-file", full)
    log = read_log(full)
    split, trained = set(), []
    for rec in log:
        for batches, degrees in zip(rec["batches"], rec["degrees"], strict=True):
            for mb, d in zip(batches, degrees, strict=True):
                if d == 1:
                    trained += mb
                else:
                    split.add(tuple(mb))
    trained += [i for mb in split for i in mb]
    assert sorted(trained) == list(range(60)), "a sample trained twice or not at all"
    lens = {i: n for i, n in enumerate(_seq_lens(dataset))}
    assert {lens[i] for mb in split for i in mb} >= {315}, "the long clips did not run split"
    assert all(math.isfinite(rec["loss"]) for rec in log)
    half = len(log) // 2
    torchrun(*common, "--max-steps", str(half), "--log-file", first, "--checkpoint-dir", ckpt)
    torchrun(*common, "--log-file", rest, "--checkpoint-dir", ckpt, "--resume")
    resumed = read_log(first) + read_log(rest)
    assert [r["batches"] for r in resumed] == [r["batches"] for r in log]
    for a, b in zip(log, resumed, strict=True):
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-5), f"step {a['global_step']}"
    # Under FSDP2 the same steps give the same losses (parameters gathered through the step).
    fsdp = str(tmp_path / "fsdp.jsonl")
    torchrun(*common, "--max-steps", str(half), "--log-file", fsdp, "--parallel", "fsdp")
    for a, b in zip(log[:half], read_log(fsdp), strict=True):
        assert a["batches"] == b["batches"]
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-5), f"fsdp step {a['global_step']}"


def test_sequence_parallel_with_a_memory_budget_splits_clips_one_gpu_cannot_hold(dataset, tmp_path):
    """--sequence-parallel auto with --memory-model/--memory-budget on 2 ranks: the clips of
    315 tokens do not fit the budget on one rank even fully checkpointed (the sampler alone
    refuses them without splitting), their halves do; the run trains every sample once, the
    long clips split, and each share is planned with the blocks its tokens need."""
    from adaptiveload import AdaptiveBatchSampler, MemoryModel

    lens = _seq_lens(dataset)
    per_token = 2**30 / (1.5 * 315)  # fully checkpointed: 1 GiB over m0 for 315 tokens
    model = MemoryModel(2, m0=2**30, ma=per_token, mr=per_token / 2, recompute_share=0.25)
    path = str(tmp_path / "memory.json")
    model.save(path)
    plan_gib = 1.75  # m0 + 0.75 GiB: 236 tokens fully checkpointed
    budget = plan_gib + 8 * _tiny_params() / 2**30  # the example keeps the optimizer's share
    log = str(tmp_path / "log.jsonl")
    torchrun(
        "--data", dataset, "--no-refine-cost-model", "--sequence-parallel", "auto",
        "--max-batch-size", "1", "--max-tokens", "200", "--epochs", "1", "--memory-model",
        path, "--memory-budget", f"{budget:.6f}", "--log-file", log,
    )  # fmt: skip
    split, trained = set(), []
    for rec in read_log(log):
        for batches, degrees in zip(rec["batches"], rec["degrees"], strict=True):
            for mb, d in zip(batches, degrees, strict=True):
                (split.add(tuple(mb)) if d > 1 else trained.extend(mb))
    trained += [i for mb in split for i in mb]
    assert sorted(trained) == list(range(len(lens))), "a sample trained twice or not at all"
    assert {int(lens[i]) for mb in split for i in mb} >= {315}, "the long clips did not split"
    kw = dict(max_batch_size=1, num_replicas=2, rank=0, memory_model=model,
              memory_budget_gib=plan_gib, uneven_counts=True)  # fmt: skip
    with pytest.raises(ValueError, match="memory budget"):
        AdaptiveBatchSampler(lens, 200, **kw)
    p = AdaptiveBatchSampler(lens, 200, sequence_parallel=2, **kw).plan()
    long = [
        m
        for m in range(len(p.costs))
        if lens[p.samples[p.offsets[m] : p.offsets[m + 1]]].max() == 315
    ]
    assert model.checkpointed_blocks([315], plan_gib * 2**30) == -1  # whole: does not fit
    for m in long:
        held = model.checkpointed_blocks([158], plan_gib * 2**30)  # its larger half does
        assert int(p.degrees[m]) == 2 and int(p.checkpointed[m]) == held >= 0


def _seq_lens(dataset):
    from adaptiveload.metadata import read_metadata
    from adaptiveload.wan import wan_seq_len

    return read_metadata(os.path.join(dataset, "metadata.csv"), wan_seq_len).seq_lens
