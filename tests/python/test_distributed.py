"""Real torch.distributed processes (gloo) drawing from AdaptiveBatchSampler via DataLoader:
disjoint coverage, equal lengths, identical plans, and resumption on another world size."""

import hashlib
import os

import numpy as np
import pytest
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, Dataset

from adaptiveload import AdaptiveBatchSampler
from processes import run_on_ranks

pytestmark = pytest.mark.distributed  # every test starts gloo ranks

NUM_SAMPLES = 1500
STEPS_BEFORE_STOP = 6
K = 2


def lengths():
    rng = np.random.default_rng(42)
    return rng.choice(
        [1560, 3600, 14040, 32760, 46800, 75600],
        size=NUM_SAMPLES,
        p=[0.4, 0.1, 0.1, 0.2, 0.05, 0.15],
    )


class IndexDataset(Dataset):
    def __len__(self):
        return NUM_SAMPLES

    def __getitem__(self, i):
        return i


def plan_digest(sampler):
    plan = sampler.plan()
    h = hashlib.sha256()
    for a in (plan.samples, plan.offsets, plan.costs):
        h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest()


def resume_phase(rank, world, out_dir, phase):
    # num_replicas and rank come from the process group.
    sampler = AdaptiveBatchSampler(lengths(), 151200, micro_batches_per_step=K, seed=17)
    assert (sampler.num_replicas, sampler.rank) == (world, rank)
    if phase == "resume":
        sampler.load_state_dict(torch.load(os.path.join(out_dir, "sampler.pt"), weights_only=False))
    sampler.set_epoch(2)
    loader = DataLoader(IndexDataset(), batch_sampler=sampler, num_workers=1, collate_fn=list)
    batches = []
    for batch in loader:
        batches.append(batch)
        if phase == "first" and len(batches) == STEPS_BEFORE_STOP * K:
            break
    info = {"batches": batches, "len": len(sampler), "digest": plan_digest(sampler)}
    gathered = [None] * world
    dist.all_gather_object(gathered, info)
    if phase == "first":
        # The training loop knows how many optimizer steps it finished.
        state = sampler.state_dict(steps_done=STEPS_BEFORE_STOP)
        states = [None] * world
        dist.all_gather_object(states, state)
        assert all(s == states[0] for s in states), "ranks disagree on the sampler state"
        if rank == 0:
            torch.save(state, os.path.join(out_dir, "sampler.pt"))
    return {"gathered": gathered}


def run(world, tmp_path, phase):
    """Every rank's batches and plan, as rank 0 gathered them."""
    return run_on_ranks(resume_phase, world, tmp_path, phase, str(tmp_path), phase)[0]["gathered"]


def test_two_gloo_ranks_then_resume_on_three(tmp_path):
    first = run(2, tmp_path, "first")
    assert len({g["digest"] for g in first}) == 1, "ranks planned different epochs"
    assert len({g["len"] for g in first}) == 1, "ranks would yield different numbers of batches"
    assert all(len(g["batches"]) == STEPS_BEFORE_STOP * K for g in first)
    done = [i for g in first for b in g["batches"] for i in b]
    assert len(done) == len(set(done)), "ranks drew overlapping samples"

    rest = run(3, tmp_path, "resume")
    assert len({g["digest"] for g in rest}) == 1
    lens = {len(g["batches"]) for g in rest}
    assert len(lens) == 1 and lens == {rest[0]["len"]}
    later = [i for g in rest for b in g["batches"] for i in b]
    assert not set(done) & set(later), "a consumed sample came back after resuming"
    # With padding, a few samples may repeat, but none is lost.
    assert set(done) | set(later) == set(range(NUM_SAMPLES))
    assert len(later) - len(set(later)) < 3 * K


# -- ranks agree or fail, sequence-parallel groups, StatefulDataLoader --------------------------


def run_scenario(world, tmp_path, scenario):
    """Each rank's result of ``SCENARIOS[scenario]``, or the error it raised (the test decides)."""
    fn = SCENARIOS[scenario]
    return run_on_ranks(fn, world, tmp_path, scenario, str(tmp_path), errors_allowed=True)


def per_rank_seed(rank, world, out_dir):
    s = AdaptiveBatchSampler(lengths(), 151200, micro_batches_per_step=K, seed=100 + rank)
    return {"batches": list(s)}


def one_rank_other_data(rank, world, out_dir):
    lens = lengths()
    if rank == world - 1:
        lens = lens.copy()
        lens[7] = 3600 if lens[7] != 3600 else 1560
    s = AdaptiveBatchSampler(lens, 151200, micro_batches_per_step=K, seed=1)
    loader = DataLoader(IndexDataset(), batch_sampler=s, num_workers=1, collate_fn=list)
    return {"batches": list(loader)}


def agreeing_ranks(rank, world, out_dir):
    s = AdaptiveBatchSampler(lengths(), 151200, micro_batches_per_step=K, seed=1)
    out = []
    for epoch in range(2):
        s.set_epoch(epoch)
        out.append(list(s))
    return {"batches": out}


def sequence_parallel(rank, world, out_dir):
    # 4 processes, sequence-parallel pairs (0, 1) and (2, 3): the data-parallel groups are
    # the ranks holding distinct data, {0, 2} and {1, 3}.
    groups = [dist.new_group([0, 2]), dist.new_group([1, 3])]
    dp = groups[rank % 2]
    by_group = AdaptiveBatchSampler(lengths(), 151200, micro_batches_per_step=K, process_group=dp)
    explicit = AdaptiveBatchSampler(
        lengths(), 151200, micro_batches_per_step=K, num_replicas=2, rank=rank // 2
    )
    return {
        "replicas": (by_group.num_replicas, by_group.rank),
        "batches": list(by_group),
        "explicit": list(explicit),
    }


def stateful_dataloader(rank, world, out_dir):
    from torchdata.stateful_dataloader import StatefulDataLoader

    def loader(sampler):
        return StatefulDataLoader(
            IndexDataset(), batch_sampler=sampler, num_workers=2, collate_fn=list
        )

    def sampler():
        # StatefulDataLoader takes the sampler's state at its own draw count.
        s = AdaptiveBatchSampler(
            lengths(), 151200, micro_batches_per_step=K, seed=5, drawn_is_trained=True
        )
        s.set_epoch(1)
        return s

    whole = list(loader(sampler()))
    out = {}
    for stop in (6 * K, 6 * K + 1):  # a step boundary, and inside a step
        first = loader(sampler())
        it = iter(first)
        got = [next(it) for _ in range(stop)]
        state = first.state_dict()
        del it
        second = loader(sampler())
        second.load_state_dict(state)
        out[stop] = got + list(second)
    return {"whole": whole, "resumed": out}


def one_rank_caps_batch_size(rank, world, out_dir):
    # A setting only one rank has (max_batch_size is in the fingerprint only when set).
    cap = 2 if rank == 1 else None
    s = AdaptiveBatchSampler(
        lengths(), 151200, micro_batches_per_step=K, seed=1, max_batch_size=cap
    )
    return {"batches": list(s)}


SCENARIOS = {
    "one_rank_caps_batch_size": one_rank_caps_batch_size,
    "per_rank_seed": per_rank_seed,
    "one_rank_other_data": one_rank_other_data,
    "agreeing_ranks": agreeing_ranks,
    "sequence_parallel": sequence_parallel,
    "stateful_dataloader": stateful_dataloader,
}


def test_a_per_rank_seed_fails_on_every_rank(tmp_path):
    results = run_scenario(3, tmp_path, "per_rank_seed")
    for r in results:
        assert "RuntimeError" in r.get("error", ""), r
        assert "seed" in r["error"] and "rank 2: 102" in r["error"]


def test_a_setting_only_one_rank_has_fails_on_every_rank(tmp_path):
    results = run_scenario(2, tmp_path, "one_rank_caps_batch_size")
    for r in results:
        assert "RuntimeError" in r.get("error", ""), r
        assert "max_batch_size" in r["error"] and "rank 1: 2" in r["error"]


def test_one_rank_with_other_metadata_fails_on_every_rank(tmp_path):
    results = run_scenario(2, tmp_path, "one_rank_other_data")
    for r in results:
        assert "RuntimeError" in r.get("error", ""), r
        assert "the dataset (sequence lengths or group keys)" in r["error"]


def test_agreeing_ranks_plan_each_epoch_once(tmp_path):
    results = run_scenario(2, tmp_path, "agreeing_ranks")
    assert all("error" not in r for r in results), results
    for epoch in range(2):
        flat = [i for r in results for b in r["batches"][epoch] for i in b]
        assert sorted(flat) == list(range(NUM_SAMPLES))


def test_sequence_parallel_group_ranks_draw_the_same_batches(tmp_path):
    results = run_scenario(4, tmp_path, "sequence_parallel")
    assert all("error" not in r for r in results), results
    assert [r["replicas"] for r in results] == [(2, 0), (2, 0), (2, 1), (2, 1)]
    for r in results:
        assert r["batches"] == r["explicit"]
    assert results[0]["batches"] == results[1]["batches"]
    assert results[2]["batches"] == results[3]["batches"]
    flat = [i for r in (results[0], results[2]) for b in r["batches"] for i in b]
    assert sorted(flat) == list(range(NUM_SAMPLES))


def test_stateful_dataloader_resumes_exactly_with_workers(tmp_path):
    pytest.importorskip("torchdata")
    results = run_scenario(2, tmp_path, "stateful_dataloader")
    assert all("error" not in r for r in results), results
    for r in results:
        for stop, batches in r["resumed"].items():
            assert batches == r["whole"], f"resumed after {stop} micro-batches differs"
