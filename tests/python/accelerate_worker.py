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

from adaptiveload import AdaptiveBatchSampler, StreamingBatchSampler
from adaptiveload.integrations.accelerate import prepare_data_loader

NUM_SAMPLES = 457
K = 2
# The training scenarios: micro-batches per optimizer step (accelerate's
# gradient_accumulation_steps too), and where train_save stops (inside step 5).
K_TRAIN = 4
SAVE_AT = 22


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


def features(batch):
    """A fixed regression problem on the sample indices, in float64 so that runs compare to
    the last bit."""
    i = batch.to(torch.float64)
    x = torch.stack([torch.sin(i), torch.cos(i), (i % 7) / 7, torch.ones_like(i)], dim=1)
    return x, ((i % 5) / 5).unsqueeze(1)


def train(scenario, out_dir, out):
    """Epoch 0 with gradient accumulation over the plan's steps (K_TRAIN micro-batches):
    uninterrupted (train_full), stopped by save_state after SAVE_AT micro-batches, inside a
    step (train_save), or resumed from that checkpoint by load_state (train_resume, with any
    number of processes). Records each batch with accelerate's sync flag, and the weights."""
    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=K_TRAIN)
    sampler = AdaptiveBatchSampler(lengths(), 151200, micro_batches_per_step=K_TRAIN, seed=7)
    loader = prepare_data_loader(accelerator, loader_of(sampler, 1))
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1, dtype=torch.float64)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    model, optimizer = accelerator.prepare(model, optimizer)
    ckpt = os.path.join(out_dir, "ckpt_train")
    if scenario == "train_resume":
        accelerator.load_state(ckpt)
        out["step_counter"] = accelerator.step
    loader.set_epoch(0)
    out["start"] = sampler.start_micro_batch
    out["plan"] = [b.tolist() for b in sampler.plan().rank_micro_batches(accelerator.process_index)]
    batches, syncs = [], []
    for batch in loader:
        with accelerator.accumulate(model):
            x, y = features(batch)
            loss = torch.nn.functional.mse_loss(model(x), y)
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
        batches.append(batch.tolist())
        syncs.append(bool(accelerator.sync_gradients))
        if scenario == "train_save" and len(batches) == SAVE_AT:
            accelerator.save_state(ckpt)
            break
    out["batches"], out["syncs"] = batches, syncs
    out["weights"] = [p.detach().double().reshape(-1).tolist() for p in model.parameters()]


def train_uneven(out):
    """Uneven counts under accelerate: ``loader.accumulate`` synchronizes at each rank's last
    micro-batch of the plan's step. Records the syncs, the optimizer's steps, the weights, and
    the weights of the same steps computed on one process from the plan (DDP's mean over
    ranks of each rank's summed micro-batch gradients)."""
    accelerator = Accelerator(cpu=True)
    # One sample per micro-batch: a rank of a long clip takes fewer than one of images.
    sampler = AdaptiveBatchSampler(
        lengths(), 151200, micro_batches_per_step=K_TRAIN, seed=7, uneven_counts=True,
        max_batch_size=1,
    )  # fmt: skip
    loader = prepare_data_loader(accelerator, loader_of(sampler, 1))
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1, dtype=torch.float64)
    init = [p.detach().clone() for p in model.parameters()]
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    model, optimizer = accelerator.prepare(model, optimizer)
    steps = 0
    original_step = optimizer.optimizer.step

    def counted_step(*args, **kwargs):
        nonlocal steps
        steps += 1
        return original_step(*args, **kwargs)

    optimizer.optimizer.step = counted_step
    loader.set_epoch(0)
    batches, syncs, where = [], [], []
    for batch in loader:
        with loader.accumulate(model):
            x, y = features(batch)
            accelerator.backward(torch.nn.functional.mse_loss(model(x), y, reduction="sum"))
        if loader.step_ends():
            optimizer.step()
            optimizer.zero_grad()
        mb = loader.micro_batch
        batches.append(batch.tolist())
        syncs.append(loader.step_ends())
        where.append([mb.step, mb.index, mb.count])
    out.update(batches=batches, syncs=syncs, where=where, optimizer_steps=steps)
    out["weights"] = [p.detach().reshape(-1).tolist() for p in model.parameters()]
    out["state_steps"] = loader.state_dict().get("steps_done")
    # The same steps on one process, from the plan.
    plan, W = sampler.plan(), accelerator.num_processes
    ref = torch.nn.Linear(4, 1, dtype=torch.float64)
    with torch.no_grad():
        for p, q in zip(ref.parameters(), init, strict=True):
            p.copy_(q)
    for t in range(plan.num_steps):
        ref.zero_grad()
        for r in range(W):
            for k in range(plan.micro_batches_in_step(t, r)):
                m = plan.micro_batch_id(t, r, k)
                ids = plan.samples[plan.offsets[m] : plan.offsets[m + 1]]
                x, y = features(torch.as_tensor(ids))
                torch.nn.functional.mse_loss(ref(x), y, reduction="sum").backward()
        with torch.no_grad():
            for p in ref.parameters():
                p -= 0.05 * p.grad / W
    out["reference"] = [p.detach().reshape(-1).tolist() for p in ref.parameters()]
    out["plan_steps"], out["padded"] = plan.num_steps, plan.num_padded_samples
    out["counts"] = [plan.micro_batches_in_step(t, accelerator.process_index)
                     for t in range(plan.num_steps)]  # fmt: skip


def main(scenario, out_dir):
    run(scenario, out_dir)
    # Leave the process group before the interpreter's exit: gloo's worker threads outliving
    # it aborted a rank now and then ("terminate called without an active exception").
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


def run(scenario, out_dir):
    config = {
        "ordinary": DataLoaderConfiguration(),
        "uneven": DataLoaderConfiguration(even_batches=False),
        "dispatch": DataLoaderConfiguration(dispatch_batches=True),
        "split": DataLoaderConfiguration(split_batches=True),
    }.get(scenario, DataLoaderConfiguration())
    if scenario.startswith("train"):
        out = {"rank": int(os.environ["RANK"])}
        if scenario == "train_uneven":
            train_uneven(out)
        else:
            train(scenario, out_dir, out)
        with open(os.path.join(out_dir, f"{scenario}_{out['rank']}.json"), "w") as f:
            json.dump(out, f)
        return
    accelerator = Accelerator(cpu=True, dataloader_config=config)
    sampler = make_sampler()
    out = {"rank": accelerator.process_index, "epochs": {}, "plan": {}}

    if scenario == "uneven_counts":
        uneven = AdaptiveBatchSampler(
            lengths(), 151200, micro_batches_per_step=K, seed=7, uneven_counts=True
        )
        accelerator = Accelerator(cpu=True, gradient_accumulation_steps=K)
        prepare_data_loader(accelerator, loader_of(uneven, 0))  # raises
    elif scenario in ("ordinary", "uneven", "dispatch", "split"):
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
    elif scenario == "midstep_save":
        # A sampler resumed inside step 5 (micro-batch 21 of K_TRAIN = 4), prepared, one
        # micro-batch drawn (step 5 not complete), then saved and resumed again.
        first = AdaptiveBatchSampler(lengths(), 151200, micro_batches_per_step=K_TRAIN, seed=7)
        resumed = AdaptiveBatchSampler(lengths(), 151200, micro_batches_per_step=K_TRAIN, seed=7)
        resumed.load_state_dict(first.state_dict(micro_batches_done=21))
        loader = prepare_data_loader(accelerator, loader_of(resumed, 0))
        loader.set_epoch(0)
        for b in loader:
            out["drawn"] = b.tolist()
            break
        try:
            out["saved_at"] = loader.state_dict()["micro_batches_done"]
        except ValueError as e:
            out["error"] = str(e)
    elif scenario == "streaming":
        # accelerate's own sharding of a per-rank stream is refused; prepare_data_loader's
        # unsharded loader draws this rank's micro-batches, segment after segment.
        def streaming():
            return StreamingBatchSampler(
                lengths(),
                151200,
                micro_batches_per_step=K,
                seed=7,
                segment_samples=100,
                lookahead_steps=2,
            )

        try:
            next(iter(accelerator.prepare(loader_of(streaming(), 0))))
        except RuntimeError as e:
            out["refused"] = str(e)
        helper = prepare_data_loader(accelerator, loader_of(streaming(), 0))
        helper.set_epoch(0)
        out["epochs"][0] = [b.tolist() for b in helper]
        out["plan"][0] = list(streaming())
        out["state"] = helper.state_dict()["micro_batches_done"]
    elif scenario == "readers":
        # The helper's loader passes accelerator.prepare unchanged; a DataLoader accelerate
        # did not prepare is refused under several processes, unless each rank draws its own.
        helper = prepare_data_loader(accelerator, loader_of(make_sampler(), 0))
        out["passthrough"] = accelerator.prepare(helper) is helper
        plain = make_sampler()
        out["len_sharded"] = len(plain)
        try:
            next(iter(loader_of(plain, 0)))
        except RuntimeError as e:
            out["refused"] = str(e)
        plain.accelerate_sharding = False
        out["len_own"] = len(plain)
        out["epochs"][0] = [b.tolist() for b in loader_of(plain, 0)]
        out["plan"][0] = [
            b.tolist() for b in plain.plan().rank_micro_batches(accelerator.process_index)
        ]
        # Declared per rank, then sharded by accelerate after all: refused. Last, since the
        # refused loader stays accelerate's active one (its iteration never ended).
        try:
            next(iter(accelerator.prepare(loader_of(plain, 0))))
        except RuntimeError as e:
            out["refused_sharded"] = str(e)
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
