"""Uneven micro-batch counts per rank (AdaptiveBatchSampler(uneven_counts=True)): balance
against the even plan, resumption by steps, and real gloo ranks whose gradients, synchronized
once per step, equal one process's over the same samples."""

import pickle

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from adaptiveload import AdaptiveBatchSampler, EqualTokenBatchSampler
from adaptiveload.cost import CostModel
from processes import full_grads, run_on_ranks

WAN_LENGTHS = [1560, 3600, 14040, 32760, 46800, 75600]


def wan_mix(n, seed=0):
    rng = np.random.default_rng(seed)
    return rng.choice(WAN_LENGTHS, size=n, p=[0.4, 0.1, 0.1, 0.2, 0.05, 0.15])


def make(lens, rank=0, **kw):
    args = dict(num_replicas=4, rank=rank, micro_batches_per_step=4, seed=3, verify_ranks=False)
    return AdaptiveBatchSampler(lens, 2 * 75600, **(args | kw))


def slowest_over_mean(plan):
    loads = plan.rank_costs()
    return float(loads.max(axis=1).sum() / loads.mean(axis=1).sum())


class IndexDataset(Dataset):
    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return int(i)


def expected_stream(plan, rank, start=0):
    """(step, index, count) of each micro-batch of ``rank`` from step ``start``."""
    return [
        (t, k, c)
        for t in range(start, plan.num_steps)
        for c in [plan.micro_batches_in_step(t, rank)]
        for k in range(c)
    ]


@pytest.mark.parametrize("max_batch_size", [None, 1])
@pytest.mark.parametrize("lookahead_steps", [1, 8, 64])
def test_balance_at_least_as_good_as_even_counts(max_batch_size, lookahead_steps):
    lens = wan_mix(3000)
    # Steps of similar cost (mix_tolerance=0) are formed alike with or without uneven counts;
    # mixed steps are chosen per window by each assignment's own imbalance, so may differ.
    kw = dict(max_batch_size=max_batch_size, lookahead_steps=lookahead_steps, mix_tolerance=0.0)
    even, uneven = make(lens, **kw).plan(), make(lens, uneven_counts=True, **kw).plan()
    assert uneven.num_steps == even.num_steps
    # Same steps, same micro-batches: no step's slowest rank is slower.
    assert (uneven.rank_costs().max(axis=1) <= even.rank_costs().max(axis=1) * (1 + 1e-12)).all()
    assert np.array_equal(uneven.step_tokens(), even.step_tokens())
    counts = np.diff(uneven.rank_offsets).reshape(uneven.num_steps, 4)
    assert (counts >= 1).all() and (counts.sum(axis=1) == 16).all()
    if max_batch_size == 1 and lookahead_steps <= 8:
        # Single samples of very different costs: counts other than K pay off.
        assert slowest_over_mean(uneven) < slowest_over_mean(even) - 0.01
        assert (counts != 4).any()


def test_every_sample_once_and_each_rank_draws_its_counts():
    lens = wan_mix(2000, seed=1)
    samplers = [make(lens, rank=r, uneven_counts=True, max_batch_size=1) for r in range(4)]
    plan = samplers[0].plan()
    seen = np.zeros(len(lens), int)
    for r, s in enumerate(samplers):
        batches = list(s)
        counts = [c for _, c in s.steps()]
        assert counts == [plan.micro_batches_in_step(t, r) for t in range(plan.num_steps)]
        assert len(batches) == sum(counts) == len(s) == plan.num_rank_micro_batches(r)
        for b in batches:
            seen[b] += 1
    assert plan.num_padded_samples == 0 and (seen == 1).all()


def test_flag_off_plans_and_fingerprint_are_unchanged():
    lens = wan_mix(500)
    s = make(lens)
    assert s.plan().rank_offsets is None and "uneven_counts" not in s._fingerprint()
    assert make(lens, uneven_counts=True)._fingerprint()["uneven_counts"] is True
    with pytest.raises(ValueError, match="needs balance"):
        make(lens, uneven_counts=True, balance=False)
    with pytest.raises(ValueError, match="uneven_counts must be True or False"):
        make(lens, uneven_counts=1)


def test_resume_mid_epoch_replays_the_rest_exactly():
    lens = wan_mix(1500, seed=2)
    kw = dict(uneven_counts=True, max_batch_size=1, lookahead_steps=4)
    for rank in range(4):
        s = make(lens, rank=rank, **kw)
        s.set_epoch(1)
        full = list(s)
        stop = 5
        drawn = sum(s.micro_batches_in_step(t) for t in range(stop))
        # Between steps the sampler's own count is a step boundary; inside one it is this
        # rank's own place in the step (test_resume_labels.py).
        s2 = make(lens, rank=rank, drawn_is_trained=True, **kw)
        s2.set_epoch(1)
        it = iter(s2)
        for _ in range(drawn):
            next(it)
        state = s2.state_dict()
        assert state == s.state_dict(steps_done=stop) and state["steps_done"] == stop
        next(it)
        if s2.micro_batches_in_step(stop) > 1:
            inside = s2.state_dict()
            assert inside["steps_done"] == stop
            assert inside["in_step"] == {"rank": rank, "micro_batches": 1}
            mid = make(lens, rank=rank, **kw)
            mid.load_state_dict(inside)
            mid.set_epoch(1)
            assert [list(b) for b in mid] == full[drawn + 1 :]
        with pytest.raises(ValueError, match="pass steps_done"):
            s2.state_dict(micro_batches_done=3)
        resumed = make(lens, rank=rank, **kw)
        resumed.load_state_dict(pickle.loads(pickle.dumps(state)))
        resumed.set_epoch(1)
        assert resumed.start_step == stop
        assert [list(b) for b in resumed] == full[drawn:]
        # Through micro_batches(loader): the same batches, from the resumed step's start.
        again = make(lens, rank=rank, **kw)
        again.load_state_dict(state)
        again.set_epoch(1)
        loader = DataLoader(IndexDataset(len(lens)), batch_sampler=again, collate_fn=list)
        got = list(again.micro_batches(loader))
        assert [(m.step, m.index, m.count) for m in got] == expected_stream(s.plan(), rank, stop)
        assert [m.batch for m in got] == full[drawn:]
        # The same state continued by an even-count sampler: the rest, each sample once.
        other = make(lens, rank=rank, max_batch_size=1, lookahead_steps=4)
        other.load_state_dict(state)
        left = {i for b in other for i in b}
        done = {i for b in full[:drawn] for i in b}
        assert not left & done


def test_state_of_even_sampler_continues_under_uneven_counts():
    lens = wan_mix(800, seed=4)
    even = make(lens, max_batch_size=1)
    state = even.state_dict(steps_done=3)
    consumed = {
        i
        for r in range(4)
        for t in range(3)
        for k in range(4)
        for i in even.plan().micro_batch(t, r, k)
    }
    samplers = [make(lens, rank=r, uneven_counts=True, max_batch_size=1) for r in range(4)]
    rest = []
    for s in samplers:
        s.load_state_dict(state)
        rest += [i for b in s for i in b]
    assert not consumed & set(rest) and len(set(rest)) == len(rest) == len(lens) - len(consumed)


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("kind", ["uneven", "even", "equal-token"])
def test_micro_batches_tell_the_loop_where_each_step_ends(num_workers, kind):
    lens = wan_mix(400, seed=6)
    uneven_seen = False
    for rank in range(4):
        if kind == "equal-token":
            s = EqualTokenBatchSampler(
                lens, 2 * 75600, num_replicas=4, rank=rank, micro_batches_per_step=4,
                seed=3, verify_ranks=False,
            )  # fmt: skip
        else:
            s = make(lens, rank=rank, uneven_counts=kind == "uneven", max_batch_size=1,
                     lookahead_steps=2)  # fmt: skip
        plan = s.plan()
        loader = DataLoader(
            IndexDataset(len(lens)), batch_sampler=s, num_workers=num_workers, collate_fn=list
        )
        got = list(s.micro_batches(loader))
        want = expected_stream(plan, rank)
        assert [(m.step, m.index, m.count) for m in got] == want
        assert [m.last for m in got] == [k == c - 1 for _, k, c in want]
        step_tokens, step_samples = plan.step_tokens(), plan.step_samples()
        for m in got:
            assert m.batch == plan.micro_batch(m.step, rank, m.index).tolist()
            assert m.step_tokens == int(step_tokens[m.step])
            assert m.step_samples == int(step_samples[m.step])
        uneven_seen |= any(c != 4 for _, _, c in want)
    assert uneven_seen == (kind == "uneven")


def test_micro_batches_refuse_a_loader_that_is_not_this_samplers_stream():
    lens = wan_mix(300, seed=8)
    s = make(lens, rank=1, uneven_counts=True, max_batch_size=1, lookahead_steps=2)
    other = make(lens, rank=2, uneven_counts=True, max_batch_size=1, lookahead_steps=2)
    with pytest.raises(ValueError, match="batch_sampler is not this sampler"):
        next(s.micro_batches(DataLoader(IndexDataset(len(lens)), batch_sampler=other)))
    batches = [b.tolist() for b in s.plan().rank_micro_batches(1)]
    n = s.plan().num_steps
    last = s.plan().micro_batches_in_step(n - 1, 1)
    with pytest.raises(RuntimeError, match=f"ended in step {n - 1} after {last - 1} of"):
        list(s.micro_batches(batches[:-1]))
    with pytest.raises(RuntimeError, match="more batches than this rank's plan"):
        list(s.micro_batches(batches + [batches[0]]))


# -- gradients over real gloo ranks -----------------------------------------------------------

WORLD, K, FEATURES, STEPS = 2, 3, 4, 4
TINY_LENGTHS = [3, 7, 20, 45, 60, 100]


def tiny_lengths():
    rng = np.random.default_rng(5)
    return rng.choice(TINY_LENGTHS, size=120, p=[0.4, 0.1, 0.1, 0.2, 0.05, 0.15])


def tiny_sampler(rank):
    return AdaptiveBatchSampler(
        tiny_lengths(),
        200,
        cost_model=CostModel.power(2.0),
        num_replicas=WORLD,
        rank=rank,
        micro_batches_per_step=K,
        max_batch_size=1,
        lookahead_steps=1,
        seed=9,
        uneven_counts=True,
        verify_ranks=False,
    )


class TokenDataset(Dataset):
    """Sample i: seq_len rows of features and a target per token, from seed i."""

    def __init__(self):
        self.lens = tiny_lengths()

    def __len__(self):
        return len(self.lens)

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(int(i))
        s = int(self.lens[i])
        return torch.randn(s, FEATURES, generator=g), torch.randn(s, 1, generator=g)


def collate(items):
    return torch.cat([x for x, _ in items]), torch.cat([y for _, y in items])


def token_loss(model, x, y):
    return ((model(x) - y) ** 2).sum()


def tiny_model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(FEATURES, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))


def grad_worker(rank, world, wrap):
    import contextlib

    sampler = tiny_sampler(rank)
    plan = sampler.plan()
    model = tiny_model()
    if wrap == "ddp":
        wrapped = torch.nn.parallel.DistributedDataParallel(model)
    else:
        from torch.distributed.fsdp import fully_shard

        wrapped = fully_shard(model, reshard_after_forward=False)
    loader = DataLoader(TokenDataset(), batch_sampler=sampler, num_workers=2, collate_fn=collate)
    grads, counts = [], []
    for mb in sampler.micro_batches(loader):  # each batch says where its step ends
        if mb.step == STEPS:
            break
        x, y = mb.batch
        if wrap == "ddp":
            sync = contextlib.nullcontext() if mb.last else wrapped.no_sync()
        else:
            wrapped.set_requires_gradient_sync(mb.last)
            wrapped.set_reshard_after_backward(mb.last)
            sync = contextlib.nullcontext()
        # world / step_tokens: DDP and FSDP2 average over ranks.
        with sync:
            (token_loss(wrapped, x, y) * mb.loss_scale(world)).backward()
        if mb.last:
            grads.append(full_grads(model))
            counts.append(mb.count)
            model.zero_grad(set_to_none=True)
    assert counts == [plan.micro_batches_in_step(t, rank) for t in range(STEPS)]
    return {"grads": grads}


@pytest.mark.distributed
@pytest.mark.parametrize("wrap", ["ddp", "fsdp2"])
def test_step_gradients_over_uneven_ranks_match_one_process(tmp_path, wrap):
    plan = tiny_sampler(0).plan()
    counts = np.diff(plan.rank_offsets).reshape(plan.num_steps, WORLD)[:STEPS]
    assert (counts[:, 0] != counts[:, 1]).any(), "the test needs steps of unequal counts"
    results = run_on_ranks(grad_worker, WORLD, tmp_path, wrap, wrap)
    data, ref = TokenDataset(), tiny_model()
    for step in range(STEPS):
        ref.zero_grad(set_to_none=True)
        ids = [
            i
            for r in range(WORLD)
            for k in range(plan.micro_batches_in_step(step, r))
            for i in plan.micro_batch(step, r, k)
        ]
        x, y = collate([data[i] for i in ids])
        (token_loss(ref, x, y) / float(plan.step_tokens()[step])).backward()
        for name, p in ref.named_parameters():
            for r in range(WORLD):
                torch.testing.assert_close(
                    results[r]["grads"][step][name],
                    p.grad,
                    rtol=1e-5,
                    atol=1e-6,
                    msg=f"{wrap} rank {r} step {step} {name}",
                )
