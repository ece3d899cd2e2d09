"""One process of the accelerate tests (started by torchrun from test_accelerate.py).

    python -m torch.distributed.run --nproc_per_node N accelerate_worker.py SCENARIO OUT_DIR

Writes OUT_DIR/SCENARIO_RANK.json: per epoch, the micro-batches this process drew, and
what its sampler's plan assigns to it.
"""

import json
import os
import sys

import numpy as np
import torch
from accelerate import Accelerator
from accelerate.utils import DataLoaderConfiguration
from torch.utils.data import DataLoader, Dataset

from adaptiveload import AdaptiveBatchSampler
from adaptiveload.integrations.accelerate import prepare_data_loader

NUM_SAMPLES = 457
K = 2


class IndexDataset(Dataset):
    def __len__(self):
        return NUM_SAMPLES

    def __getitem__(self, i):
        return torch.tensor(i)


def lengths():
    rng = np.random.default_rng(3)
    return rng.choice(
        [1560, 3600, 14040, 32760, 75600], size=NUM_SAMPLES, p=[0.5, 0.1, 0.1, 0.2, 0.1]
    )


def make_sampler():
    return AdaptiveBatchSampler(lengths(), 151200, micro_batches_per_step=K, seed=7)


def loader_of(sampler, workers):
    return DataLoader(IndexDataset(), batch_sampler=sampler, num_workers=workers)


def main(scenario, out_dir):
    config = {
        "ordinary": DataLoaderConfiguration(),
        "uneven": DataLoaderConfiguration(even_batches=False),
        "dispatch": DataLoaderConfiguration(dispatch_batches=True),
        "split": DataLoaderConfiguration(split_batches=True),
    }.get(scenario, DataLoaderConfiguration())
    accelerator = Accelerator(cpu=True, dataloader_config=config)
    sampler = make_sampler()
    out = {"rank": accelerator.process_index, "epochs": {}, "plan": {}}

    if scenario in ("ordinary", "uneven", "dispatch", "split"):
        model = torch.nn.Linear(1, 1)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        model, optimizer, loader = accelerator.prepare(model, optimizer, loader_of(sampler, 1))
        out["len"] = len(loader)
        for epoch in range(2):
            loader.set_epoch(epoch)
            if epoch == 0:
                out["epochs"][epoch] = [b.tolist() for b in loader]
            else:  # through micro_batches: the same batches, each with its step
                mbs = list(sampler.micro_batches(loader))
                out["epochs"][epoch] = [mb.batch.tolist() for mb in mbs]
                out["steps"] = [[mb.step, mb.index, mb.count, mb.last] for mb in mbs]
            out["plan"][epoch] = [
                b.tolist() for b in sampler.plan().rank_micro_batches(accelerator.process_index)
            ]
    elif scenario in ("save", "resume"):
        # Epoch 1, stopped after 5 micro-batches (inside step 3 with K = 2), then resumed
        # by new processes through accelerator.save_state / load_state.
        loader = prepare_data_loader(accelerator, loader_of(sampler, 2))
        model = torch.nn.Linear(1, 1)
        model = accelerator.prepare(model)
        ckpt = os.path.join(out_dir, "ckpt")
        if scenario == "save":
            loader.set_epoch(1)
            got = []
            for b in loader:
                got.append(b.tolist())
                if len(got) == 5:
                    accelerator.save_state(ckpt)
                    break
            out["epochs"][1] = got
            # What an uninterrupted epoch 1 gives this rank.
            out["plan"][1] = [
                b.tolist() for b in sampler.plan().rank_micro_batches(accelerator.process_index)
            ]
        else:
            accelerator.load_state(ckpt)
            out["resumed_epoch"] = loader.epoch
            for epoch in range(loader.epoch, 3):
                loader.set_epoch(epoch)
                out["epochs"][epoch] = [b.tolist() for b in loader]
                out["plan"][epoch] = [
                    b.tolist()
                    for b in make_sampler_for(epoch)
                    .plan()
                    .rank_micro_batches(accelerator.process_index)
                ]
    with open(os.path.join(out_dir, f"{scenario}_{accelerator.process_index}.json"), "w") as f:
        json.dump(out, f)


def make_sampler_for(epoch):
    s = make_sampler()
    s.set_epoch(epoch)
    return s


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
