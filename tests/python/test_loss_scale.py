"""MicroBatch.loss_scale: a loss summed over a micro-batch's tokens or samples, times the
factor, gives under DDP's averaging over real gloo ranks the gradient of the step's mean loss
over all ranks, as one process over the whole step computes it."""

import contextlib

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from adaptiveload import AdaptiveBatchSampler
from adaptiveload.cost import CostModel
from adaptiveload.sampler.plan import MicroBatch
from processes import full_grads, run_on_ranks

WORLD, K, FEATURES, STEPS = 2, 2, 3, 3


def lengths():
    rng = np.random.default_rng(11)
    return rng.choice([2, 5, 9, 30, 64], size=90, p=[0.35, 0.2, 0.15, 0.2, 0.1])


def sampler_of(rank):
    return AdaptiveBatchSampler(
        lengths(),
        128,
        cost_model=CostModel.power(2.0),
        num_replicas=WORLD,
        rank=rank,
        micro_batches_per_step=K,
        seed=4,
        verify_ranks=False,
    )


class Tokens(Dataset):
    """Sample i: seq_len rows of features and a target per token, from seed i."""

    def __init__(self):
        self.lens = lengths()

    def __len__(self):
        return len(self.lens)

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(int(i) + 100)
        s = int(self.lens[i])
        return torch.randn(s, FEATURES, generator=g), torch.randn(s, 1, generator=g)


def keep(items):
    return items


def summed_loss(model, items, per):
    """Squared error summed over the tokens, or over the samples of each one's mean."""
    losses = [((model(x) - y) ** 2).sum() for x, y in items]
    if per == "sample":
        losses = [loss / len(x) for loss, (x, _) in zip(losses, items, strict=True)]
    return torch.stack(losses).sum()


def model_of():
    torch.manual_seed(1)
    return torch.nn.Sequential(torch.nn.Linear(FEATURES, 6), torch.nn.Tanh(), torch.nn.Linear(6, 1))


def ddp_worker(rank, world, per):
    sampler = sampler_of(rank)
    model = model_of()
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    loader = DataLoader(Tokens(), batch_sampler=sampler, collate_fn=keep)
    grads = []
    for mb in sampler.micro_batches(loader):
        if mb.step == STEPS:
            break
        with contextlib.nullcontext() if mb.last else ddp.no_sync():
            (summed_loss(ddp, mb.batch, per) * mb.loss_scale(world, per=per)).backward()
        if mb.last:
            grads.append(full_grads(model))
            model.zero_grad(set_to_none=True)
    return {"grads": grads}


@pytest.mark.distributed
@pytest.mark.parametrize("per", ["token", "sample"])
def test_ddp_gradients_with_loss_scale_equal_one_process_over_the_step(tmp_path, per):
    plan = sampler_of(0).plan()
    sizes = plan.micro_batch_sizes()[: STEPS * WORLD * K]
    assert len(set(sizes.tolist())) > 1, "the test needs micro-batches of unequal sizes"
    results = run_on_ranks(ddp_worker, WORLD, tmp_path, per, per)
    data, ref = Tokens(), model_of()
    for step in range(STEPS):
        ref.zero_grad(set_to_none=True)
        ids = [i for r in range(WORLD) for k in range(K) for i in plan.micro_batch(step, r, k)]
        total = plan.step_tokens()[step] if per == "token" else plan.step_samples()[step]
        assert total == (sum(len(data[i][0]) for i in ids) if per == "token" else len(ids))
        (summed_loss(ref, [data[i] for i in ids], per) / float(total)).backward()
        for name, p in ref.named_parameters():
            for r in range(WORLD):
                torch.testing.assert_close(
                    results[r]["grads"][step][name],
                    p.grad,
                    rtol=1e-5,
                    atol=1e-6,
                    msg=f"per {per} rank {r} step {step} {name}",
                )


def test_loss_scale_is_world_size_over_the_steps_total():
    mb = MicroBatch(batch=None, step=0, index=0, count=2, step_tokens=640, step_samples=5)
    assert mb.loss_scale(4) == 4 / 640
    assert mb.loss_scale(np.int64(8), per="token") == 8 / 640
    assert mb.loss_scale(1, per="sample") == 1 / 5
    for world in (0, -2, 2.0, True, "2"):
        with pytest.raises(ValueError, match="world_size must be the number of ranks"):
            mb.loss_scale(world)
    with pytest.raises(ValueError, match="per must be 'token' or 'sample', got 'tokens'"):
        mb.loss_scale(2, per="tokens")
