"""Helpers of the sampler suites (test_sampler.py, test_resume.py): a random Wan mix, and the
check that a plan obeys its caps and holds every sample once."""

import collections

import numpy as np
import pytest
import torch
from torch.utils.data import Dataset

WAN_LENS = np.array([1560, 3600, 7800, 14040, 20280, 32400, 32760, 46800, 75600])


def random_mix(n, seed):
    rng = np.random.default_rng(seed)
    return rng.choice(WAN_LENS, size=n, p=[0.3, 0.1, 0.05, 0.05, 0.05, 0.05, 0.2, 0.05, 0.15])


def check_plan(sampler, plan=None, expect_all=True):
    """Every micro-batch obeys both caps and one group; every sample appears once."""
    plan = plan or sampler.plan()
    lens = sampler.seq_lens
    keys = sampler.group_keys if sampler.group_keys is not None else lens
    seen = collections.Counter()
    for m in range(plan.num_micro_batches):
        mb = plan.samples[plan.offsets[m] : plan.offsets[m + 1]]
        assert len(mb) > 0
        assert lens[mb].sum() <= sampler.max_tokens
        assert plan.tokens[m] == lens[mb].sum()
        cost = sampler.cost_model.batch_cost(lens[mb])
        assert cost == pytest.approx(plan.costs[m], rel=1e-9)
        if sampler.max_cost is not None:
            assert cost <= sampler.max_cost * (1 + 1e-12)
        assert len(set(keys[mb].tolist())) == 1, "micro-batch mixes group keys"
        if not plan.padding[m]:
            seen.update(mb.tolist())
    assert all(c == 1 for c in seen.values()), "a sample appears twice"
    if expect_all:
        assert len(seen) + plan.num_dropped_samples + len(plan.skipped) == len(lens)
    return seen


class IndexDataset(Dataset):
    """Each item: its index and its length."""

    def __init__(self, lens):
        self.lens = lens

    def __len__(self):
        return len(self.lens)

    def __getitem__(self, i):
        return torch.tensor([i, self.lens[i]])
