"""StreamingBatchSampler: plans that stream segment by segment. Coverage, caps, determinism,
the plan equal to its segments, resume (same settings exactly, other settings without a sample
lost or repeated), a state of constant size, memory-mapped lengths shared by processes (measured),
rank agreement on real gloo processes, and DataLoaders."""

from __future__ import annotations

import multiprocessing as mp
import os
import pickle
import warnings

import numpy as np
import pytest
from torch.utils.data import DataLoader

from adaptiveload import StreamingBatchSampler
from processes import run_on_ranks

LENGTHS = [1560, 3600, 14040, 32760, 46800, 75600]


def lengths(n: int, seed: int = 0, dtype=np.int32) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return rng.choice(LENGTHS, size=n, p=[0.4, 0.1, 0.1, 0.2, 0.05, 0.15]).astype(dtype)


def sampler(lens, rank=0, **kw) -> StreamingBatchSampler:
    kw = {"num_replicas": 4, "segment_samples": 700, "seed": 5, "lookahead_steps": 8, **kw}
    return StreamingBatchSampler(lens, 151_200, rank=rank, **kw)


def every_rank(lens, world=4, **kw) -> list[list[list[int]]]:
    return [list(sampler(lens, rank=r, num_replicas=world, **kw)) for r in range(world)]


@pytest.mark.parametrize("uneven", [False, True])
@pytest.mark.parametrize("k", [1, 3])
def test_every_sample_once_within_the_caps(uneven, k):
    rng = np.random.default_rng()
    lens = lengths(int(rng.integers(5000, 7000)), seed=int(rng.integers(1 << 30)))
    s = sampler(lens, micro_batches_per_step=k, uneven_counts=uneven)
    plans = list(s.segments())
    assert len(plans) >= 3  # it streams (5,000 samples or more, segments of about 700-1,500)
    for seg in plans[:-1]:
        assert seg.plan.num_padded_samples == 0 and seg.plan.num_split_micro_batches == 0
        assert seg.plan.num_steps % 8 == 0  # whole windows of lookahead_steps
    seen = np.zeros(len(lens), np.int64)
    for seg in plans:
        p = seg.plan
        for m in range(p.num_micro_batches):
            idx = p.samples[p.offsets[m] : p.offsets[m + 1]]
            assert lens[idx].sum() <= 151_200
            assert len(set(lens[idx])) == 1  # the key is the length
            assert p.costs[m] <= s.max_cost * (1 + 1e-12)
            if not p.padding[m]:
                np.add.at(seen, idx, 1)
    assert (seen == 1).all(), np.flatnonzero(seen != 1)[:10]
    # The ranks' streams are the segments' plans, rank by rank.
    streams = every_rank(lens, micro_batches_per_step=k, uneven_counts=uneven)
    for r, stream in enumerate(streams):
        want = [
            seg.plan.micro_batch(t, r, j).tolist()
            for seg in plans
            for t in range(seg.plan.num_steps)
            for j in range(seg.plan.micro_batches_in_step(t, r))
        ]
        assert stream == want
    # Deterministic, and the epoch and the seed change it.
    assert every_rank(lens, micro_batches_per_step=k, uneven_counts=uneven) == streams
    other = sampler(lens, micro_batches_per_step=k, uneven_counts=uneven)
    other.set_epoch(1)
    assert list(other) != streams[0]


def test_memory_mapped_lengths_are_read_in_place(tmp_path):
    path = tmp_path / "lens.npy"
    np.save(path, lengths(5000))
    lens = np.load(path, mmap_mode="r")
    s = sampler(lens)
    assert isinstance(s.seq_lens, np.memmap) and np.shares_memory(s.seq_lens, lens)
    by_path = sampler(str(path))
    assert isinstance(by_path.seq_lens, np.memmap)
    assert list(by_path) == list(sampler(np.asarray(lens, np.int64)))


def _resident(path: str, n: int, queue, barrier) -> None:
    def anon_kb() -> int:
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("RssAnon"))

    before = anon_kb()
    s = StreamingBatchSampler(np.load(path, mmap_mode="r"), 151_200, num_replicas=8, rank=0,
                              segment_samples=20_000)  # fmt: skip
    next(iter(s))
    grown = anon_kb() - before
    barrier.wait()  # both processes hold the map now
    rss = pss = 0
    with open("/proc/self/smaps") as f:
        inside = False
        for line in f:
            if line[0] in "0123456789abcdef" and "-" in line.split()[0]:
                inside = line.rstrip().endswith(os.path.basename(path))
            elif inside and line.startswith("Rss:"):
                rss += int(line.split()[1])
            elif inside and line.startswith("Pss:"):
                pss += int(line.split()[1])
    barrier.wait()
    queue.put((grown, rss, pss))


@pytest.mark.distributed
@pytest.mark.skipif(not os.path.exists("/proc/self/smaps"), reason="needs Linux /proc")
def test_processes_share_one_copy_of_the_lengths(tmp_path):
    n = 8_000_000  # 32 MB of int32
    path = str(tmp_path / "shared_lens.npy")
    np.save(path, lengths(n, dtype=np.int32))
    ctx = mp.get_context("spawn")
    queue, barrier = ctx.Queue(), ctx.Barrier(2)
    procs = [ctx.Process(target=_resident, args=(path, n, queue, barrier)) for _ in range(2)]
    for p in procs:
        p.start()
    results = [queue.get(timeout=300) for _ in procs]
    for p in procs:
        p.join(timeout=60)
    size_kb = n * 4 // 1024
    for grown, rss, pss in results:
        # Each process read every length (the table's pass), from the file's pages: resident,
        # shared (Pss about half of Rss with two processes), and not copied into its own memory.
        assert rss > 0.9 * size_kb, (rss, size_kb)
        assert pss < 0.7 * rss, (pss, rss)
        assert grown < 0.25 * size_kb, (grown, size_kb)


def test_state_is_small_and_constant():
    sizes = []
    for n in (4_000, 40_000):
        s = sampler(lengths(n), segment_samples=1000, drawn_is_trained=True)
        it = iter(s)
        for _ in range(30):
            next(it)
        state = s.state_dict()
        sizes.append(len(pickle.dumps(state)))
    assert max(sizes) <= 4096, sizes
    assert abs(sizes[0] - sizes[1]) < 64, sizes


def _take_steps(s: StreamingBatchSampler, steps: int) -> list[list[int]]:
    out = []
    for batch in s:
        out.append(batch)
        if s._cursor.position >= (steps, 0):
            break
    return out


@pytest.mark.parametrize("uneven", [False, True])
def test_resume_with_the_same_settings_is_exact(uneven):
    lens = lengths(5000, seed=3)
    kw = {"micro_batches_per_step": 2, "uneven_counts": uneven, "drawn_is_trained": True}
    whole = every_rank(lens, **kw)
    for stop in (1, 7, 19):  # inside the first segment, across segments
        for r in range(4):
            s = sampler(lens, rank=r, **kw)
            head = _take_steps(s, stop)
            state = s.state_dict()
            assert state["steps_done"] == stop
            t = sampler(lens, rank=r, **kw)
            t.load_state_dict(pickle.loads(pickle.dumps(state)))
            t.set_epoch(0)  # the resumed epoch: the position waits for its pass
            assert head + list(t) == whole[r], (stop, r)


def test_resume_on_another_world_size_loses_and_repeats_nothing():
    lens = lengths(6000, seed=4)
    n = len(lens)
    old = [sampler(lens, rank=r, num_replicas=4, drawn_is_trained=True) for r in range(4)]
    stop = 9  # inside the second segment
    consumed = np.zeros(n, np.int64)
    states = []
    for s in old:
        for batch in _take_steps(s, stop):
            np.add.at(consumed, batch, 1)
        states.append(s.state_dict())
    assert all(st == states[0] for st in states)  # the same on every rank
    new = [sampler(lens, rank=r, num_replicas=2) for r in range(2)]
    streams = []
    for s in new:
        s.load_state_dict(states[0])
        streams.append(list(s))
    for stream in streams:
        for batch in stream:
            np.add.at(consumed, batch, 1)
    # Padding repeats only in the last segment, which a test would see as 2s: none here.
    assert (consumed >= 1).all(), np.flatnonzero(consumed == 0)[:10]
    extra = np.flatnonzero(consumed > 1)
    last = list(new[0].segments())[-1].plan
    assert len(extra) <= last.num_padded_samples
    # Saved inside what was re-planned, with the new settings: exact again.
    s = sampler(lens, rank=1, num_replicas=2, drawn_is_trained=True)
    s.load_state_dict(states[0])
    head = _take_steps(s, states[0]["steps_done"] + 2)
    inner = s.state_dict()
    assert "prelude" in inner["segment"]
    t = sampler(lens, rank=1, num_replicas=2)
    t.load_state_dict(inner)
    assert head + list(t) == streams[1]
    # ... and with yet other settings: refused, naming why.
    u = sampler(lens, rank=0, num_replicas=3)
    with pytest.raises(ValueError, match="settings changed again"):
        u.load_state_dict(inner)


def test_other_data_and_bad_input_are_refused():
    lens = lengths(3000)
    state = sampler(lens).state_dict()
    changed = lens.copy()
    changed[100] += 1
    with pytest.raises(ValueError, match="other data"):
        sampler(changed).load_state_dict(state)
    with pytest.raises(ValueError, match="integers"):
        StreamingBatchSampler(lens.astype(np.float32), 151_200)
    bad = lens.copy()
    bad[7] = 0
    with pytest.raises(ValueError, match=r"seq_lens\[7\] = 0"):
        StreamingBatchSampler(bad, 151_200)
    over = lens.copy()
    over[11] = 400_000
    with pytest.raises(ValueError, match="index 11 with 400000 tokens"):
        StreamingBatchSampler(over, 151_200)
    with pytest.warns(UserWarning, match="skipping 1"):
        s = StreamingBatchSampler(over, 151_200, on_oversize="skip", segment_samples=500)
    assert 11 not in {i for b in s for i in b}
    with pytest.raises(TypeError, match="no len"):
        len(s)


def test_group_ids_from_a_file(tmp_path):
    lens = lengths(4000)
    groups = (np.arange(4000) % 3).astype(np.int32)
    np.save(tmp_path / "g.npy", groups)
    s = sampler(lens, group_ids=str(tmp_path / "g.npy"))
    for batch in s:
        assert len(set(groups[batch])) == 1


class _Index:
    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return i


@pytest.mark.parametrize("workers", [0, 2])
def test_data_loader_and_micro_batches(workers):
    lens = lengths(3000)
    s = sampler(lens, rank=1, micro_batches_per_step=2)
    loader = DataLoader(_Index(len(lens)), batch_sampler=s, num_workers=workers,
                        collate_fn=lambda b: b)  # fmt: skip
    seen = []
    for mb in s.micro_batches(loader):
        seen.append((mb.step, mb.index, mb.count, mb.batch))
        if mb.step == 5 and mb.last:
            state = s.state_dict()  # the steps received whole, not what workers drew ahead
            break
    assert state["steps_done"] == 6
    assert [x[3] for x in seen] == list(sampler(lens, rank=1, micro_batches_per_step=2))[
        : len(seen)
    ]
    assert all(c == 2 for _, _, c, _ in seen)


def _agree(rank, world, seed_of_rank):
    s = StreamingBatchSampler(lengths(2000), 151_200, seed=seed_of_rank[rank],
                              segment_samples=500)  # fmt: skip
    return {"first": next(iter(s))}


@pytest.mark.distributed
def test_ranks_agree_or_fail_on_gloo(tmp_path):
    ok = run_on_ranks(_agree, 2, tmp_path, "agree", [3, 3])
    assert ok[0]["first"] != ok[1]["first"]
    bad = run_on_ranks(_agree, 2, tmp_path, "differ", [3, 4], errors_allowed=True)
    for r in bad:
        assert "seed" in r["error"] and "different epochs" in r["error"]


def test_balance_report_streams_the_whole_epoch():
    from adaptiveload.report import balance_report, merge_reports

    lens = lengths(4000, seed=9)
    s = sampler(lens, micro_batches_per_step=2)
    rep = s.balance_report(lens, lens)
    plans = [seg.plan for seg in s.segments()]
    loads = np.concatenate([p.rank_costs() for p in plans])  # every step of the epoch
    assert rep.num_steps == len(loads) > 0
    assert rep.imbalance == pytest.approx(np.mean(1 - loads.mean(1) / loads.max(1)))
    assert rep.epoch_time == pytest.approx(loads.max(1).sum())
    assert rep.num_micro_batches == sum(p.num_micro_batches for p in plans)
    tokens = np.concatenate([p.tokens for p in plans])
    assert rep.token_utilization == pytest.approx(np.mean(tokens / 151_200))
    one = balance_report(plans[0], lens, lens)
    assert merge_reports([one]) == one
    with pytest.raises(ValueError, match="at least one"):
        merge_reports([])


@pytest.mark.parametrize("skip,workers", [(False, 2), (False, 3), (True, 3)])
def test_segments_planned_by_workers_equal_one_by_one(skip, workers):
    """``segments(workers=...)`` plans segments on threads while the next one is cut (one
    thread fewer while cutting): the same segments (bounds, steps, every array of every plan,
    skipped samples) as one by one."""
    rng = np.random.default_rng()
    lens = lengths(int(rng.integers(3000, 9000)), seed=int(rng.integers(1000)))
    kw = dict(micro_batches_per_step=int(rng.choice([1, 2])), seed=int(rng.integers(100)))
    if skip:
        lens[rng.choice(len(lens), 5, replace=False)] = 400_000
        kw.update(on_oversize="skip", group_ids=rng.integers(0, 3, len(lens)))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        s = sampler(lens, **kw)
    one = list(s.segments())
    many = list(s.segments(workers=workers))
    assert len(one) == len(many) > 2
    for a, b in zip(one, many, strict=True):
        assert (a.index, a.begin, a.end, a.steps_before) == (
            b.index,
            b.begin,
            b.end,
            b.steps_before,
        )
        for name in ("samples", "offsets", "costs", "tokens", "padding", "skipped"):
            np.testing.assert_array_equal(getattr(a.plan, name), getattr(b.plan, name))
        assert a.plan.num_steps == b.plan.num_steps
    if skip:
        assert sum(len(seg.plan.skipped) for seg in many) == 5
    assert s.balance_report(lens, lens) == s.balance_report(lens, lens, workers=1)


def test_a_cut_segment_is_planned_once():
    """``cut_segment`` / ``plan_cut`` (the threads' path) plan what ``plan_segment`` plans, and
    a cut planned twice is refused, not planned empty."""
    from adaptiveload import _sampler
    from adaptiveload.sampler.segments import plan_options

    lens = lengths(5000, seed=3)
    s = sampler(lens)
    o = plan_options(s._fingerprint(), 0)
    cut = _sampler.cut_segment(s._table, o, 0, s.segment_samples)
    end, whole = _sampler.plan_segment(s._table, o, 0, s.segment_samples, 0)
    assert (cut.begin, cut.end) == (0, end)
    planned = _sampler.plan_cut(s._table, o, cut, 0)
    for name in ("samples", "offsets", "costs", "tokens", "skipped"):
        np.testing.assert_array_equal(planned[name], whole[name])
    with pytest.raises(ValueError, match="planned already"):
        _sampler.plan_cut(s._table, o, cut, 0)


def test_plan_command_streams(capsys):
    from adaptiveload.cli import main

    assert main(["plan", "--demo", "--demo-samples", "3000", "--stream",
                 "--segment-samples", "500", "--figure", "none"]) == 0  # fmt: skip
    out = capsys.readouterr().out
    assert "streamed:" in out and "segments of at least 500 samples" in out


@pytest.mark.parametrize("least", [1, 4, 15, 17])
def test_segments_shorter_than_the_read_ahead_cover_once(least):
    lens = lengths(700, seed=least)
    s = sampler(lens, num_replicas=1, lookahead_steps=1, segment_samples=least)
    seen = np.zeros(len(lens), np.int64)
    for batch in s:
        np.add.at(seen, batch, 1)
    last = list(s.segments())[-1].plan
    assert (seen >= 1).all() and (seen > 1).sum() <= last.num_padded_samples


@pytest.mark.parametrize("change", [{"seed": 6}, {"shuffle": False}])
def test_resume_with_another_order_is_refused(change):
    lens = lengths(3000)
    s = sampler(lens)
    _take_steps(s, 3)
    state = s.state_dict(steps_done=3)
    with pytest.raises(ValueError, match="seed and shuffle"):
        sampler(lens, **change).load_state_dict(state)


def test_state_at_an_epochs_start_is_that_epochs():
    lens = lengths(3000)
    s = sampler(lens)
    list(s)  # epoch 0, whole
    s.set_epoch(1)
    state = s.state_dict()  # before the loader draws a batch of epoch 1
    assert (state["epoch"], state["segment"]["index"], state["steps_done"]) == (1, 0, 0)
    t = sampler(lens)
    t.load_state_dict(state)
    u = sampler(lens)
    u.set_epoch(1)
    assert list(t) == list(u)


def test_a_position_without_a_trained_count_is_refused():
    lens = lengths(3000)
    s = sampler(lens, micro_batches_per_step=2)
    loader = DataLoader(_Index(len(lens)), batch_sampler=s, num_workers=2, collate_fn=lambda b: b)
    it = iter(loader)
    for _ in range(5):
        next(it)
    with pytest.raises(ValueError, match="drawn_is_trained"):
        s.state_dict()  # its workers drew ahead of the loop
    assert s.state_dict(steps_done=2)["steps_done"] == 2
    d = sampler(lens, micro_batches_per_step=2, drawn_is_trained=True)
    it = iter(d)
    for _ in range(5):
        next(it)
    assert d.state_dict()["steps_done"] == 2  # declared: the whole steps drawn were trained
    m = sampler(lens, micro_batches_per_step=2)
    loop = m.micro_batches(DataLoader(_Index(len(lens)), batch_sampler=m, collate_fn=lambda b: b))
    next(loop)
    assert m.state_dict()["steps_done"] == 0  # one micro-batch of step 0 received


def test_group_ids_of_zeros_are_other_data():
    lens = lengths(3000)
    state = sampler(lens).state_dict()
    with pytest.raises(ValueError, match="other data"):
        sampler(lens, group_ids=np.zeros(len(lens), np.int32)).load_state_dict(state)


@pytest.mark.parametrize("drop_last", [False, True])
def test_what_a_resume_replans_is_not_fitted_mid_epoch(drop_last):
    lens = lengths(6000, seed=8)
    old = [sampler(lens, rank=r, num_replicas=4, drop_last=drop_last, drawn_is_trained=True)
           for r in range(4)]  # fmt: skip
    seen = np.zeros(len(lens), np.int64)
    for s in old:
        for batch in _take_steps(s, 9):
            np.add.at(seen, batch, 1)
    state = old[0].state_dict()
    for w in (3, 5, 7):
        trained = seen.copy()
        new = [sampler(lens, rank=r, num_replicas=w, drop_last=drop_last) for r in range(w)]
        for s in new:
            s.load_state_dict(state)
            for batch in s:
                np.add.at(trained, batch, 1)
        plans = sampler(lens, num_replicas=w, drop_last=drop_last)
        plans.load_state_dict(state)  # the resumed epoch's segments, planned again
        cursor = plans._cursor
        segs = list(cursor.source.from_start(0, cursor.token))
        assert segs[0].prelude is not None and len(segs) > 2
        for seg in segs[:-1]:  # only the epoch's last segment is fitted to steps
            p = seg.plan
            assert p.num_dropped_samples == p.num_padded_samples == p.num_split_micro_batches == 0
        last = segs[-1].plan
        assert (trained == 0).sum() == last.num_dropped_samples, w
        assert (trained > 1).sum() <= last.num_padded_samples, w


def test_deep_prefetch_over_small_segments():
    lens = lengths(3000)
    s = sampler(lens, num_replicas=1, lookahead_steps=1, segment_samples=16)
    loader = DataLoader(_Index(len(lens)), batch_sampler=s, num_workers=2, prefetch_factor=32,
                        collate_fn=lambda b: b)  # fmt: skip
    steps = [mb.step for mb in s.micro_batches(loader)]
    assert steps == list(range(len(steps))) and len(steps) > 100


def test_a_lengths_file_rewritten_in_place_is_refused_before_the_next_pass(tmp_path):
    path = tmp_path / "lengths.npy"
    lens = lengths(3000, seed=6)
    np.save(path, lens)
    s = sampler(np.load(path, mmap_mode="r"))
    first = list(s)
    swapped = lens.copy()
    swapped[[0, 1]] = swapped[[1, 0]] if swapped[0] != swapped[1] else (1560, 3600)
    np.save(path, swapped)  # what re-running a preprocessing job does
    os.utime(path, ns=(1, 1))  # a modification time of its own, whatever the clock's grain
    s.set_epoch(1)
    with pytest.raises(ValueError, match=r"lengths\.npy changed since the sampler was made"):
        next(iter(s))
    assert first  # the epoch before the change ran whole
    # Replaced by a rename, the mapped data is the old file's: the sampler goes on with it.
    t = sampler(np.load(path, mmap_mode="r"))
    new = tmp_path / "new.npy"
    np.save(new, lens)
    os.replace(new, path)
    with pytest.warns(UserWarning, match="names another file"):
        assert sum(len(b) for b in t) > 0
