"""The parts of examples/train_wan.py that are not its loop: the latent dataset and its
collate, the model (built, fused, wrapped in DDP or FSDP2), the flow-matching loss, the
manual gradient all-reduce, shape warm-up, the per-epoch summary and checkpoint state."""

from __future__ import annotations

import argparse
import csv
import math
import os
from contextlib import nullcontext

import numpy as np
import torch
import torch.distributed as dist
from safetensors.torch import load_file
from torch.utils.data import Dataset

from adaptiveload.metadata import read_metadata
from adaptiveload.models.wan import build_wan
from adaptiveload.sampler import auto_sequence_parallel


class LatentDataset(Dataset):
    """Samples of metadata.csv: ``{"latent", "text", "noise", "u", "index"}``.

    The flow-matching noise and the timestep's normal draw ``u`` are made here, in the
    DataLoader's workers, from a generator seeded by (seed, epoch, sample) only: a resumed
    run, on any number of ranks, draws the same noise for the same sample, and the GPU's
    timed step does no per-sample work. Set ``epoch`` before each epoch's DataLoader is made.
    """

    def __init__(self, root: str, seed: int = 0):
        self.root = root
        self.seed = seed
        self.epoch = 0
        path = os.path.join(root, "metadata.csv")
        meta = read_metadata(path)  # validated: errors name the row and column
        self.shapes, self.seq_lens = meta.shapes, meta.seq_lens
        with open(path, newline="") as f:
            self.rows = list(csv.DictReader(f))

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, i):
        t = load_file(os.path.join(self.root, self.rows[i]["path"]))
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + self.epoch * 7_919 + i)
        noise = torch.randn(t["latent"].shape, generator=g)
        u = torch.randn((), generator=g)
        return {"latent": t["latent"], "text": t["text"], "noise": noise, "u": u, "index": i}


def collate(samples):
    return {
        "latent": torch.stack([s["latent"] for s in samples]),
        "text": torch.stack([s["text"] for s in samples]),
        "noise": torch.stack([s["noise"] for s in samples]),
        "u": torch.stack([s["u"] for s in samples]),
        "index": torch.tensor([s["index"] for s in samples]),
    }


def build_model(args, device, dtype):
    model = build_wan(
        args.config,
        layers=args.layers,
        device=device,
        dtype=dtype,
        fused=args.fused,
        seed=args.seed,
    )
    if args.activation_checkpointing:
        model.enable_gradient_checkpointing()
    return model


def wrap(model, args, device):
    if dist.get_world_size() == 1 and args.parallel == "ddp":
        return model
    if args.parallel == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        return DistributedDataParallel(
            model, device_ids=[device.index] if device.type == "cuda" else None
        )
    from torch.distributed.fsdp import fully_shard

    # Uneven counts: ranks run different numbers of forwards in a step, so the parameters
    # stay gathered through it (one all-gather, at the first forward; one reduce-scatter, at
    # the last backward) instead of pairing a different number of collectives per rank.
    reshard = not args.uneven_counts
    for block in model.blocks:
        fully_shard(block, reshard_after_forward=reshard)
    fully_shard(model, reshard_after_forward=reshard)
    return model


def allreduce_gradients(params, bucket_bytes=64 << 20):
    """Sum gradients over ranks in flat buckets (the loss is already globally normalized)."""
    bucket, size = [], 0
    for p in params:
        if p.grad is None:
            continue
        bucket.append(p.grad)
        size += p.grad.numel() * p.grad.element_size()
        if size >= bucket_bytes:
            _reduce(bucket)
            bucket, size = [], 0
    if bucket:
        _reduce(bucket)


def _reduce(grads):
    by_dtype = {}
    for g in grads:
        by_dtype.setdefault(g.dtype, []).append(g)
    for same in by_dtype.values():
        flat = torch.cat([g.reshape(-1) for g in same])
        dist.all_reduce(flat)
        offset = 0
        for g in same:
            g.copy_(flat[offset : offset + g.numel()].view_as(g))
            offset += g.numel()


def flow_matching_loss(model, batch, device, dtype, normalizer, marks=None):
    """Sum of squared velocity errors over the micro-batch, divided by ``normalizer``.

    ``marks``: a list to which a CUDA event is appended once the inputs are on the GPU, so
    that the caller can split the step's time into input preparation and model.
    """
    latent = batch["latent"].to(device=device, dtype=torch.float32, non_blocking=True)
    noise = batch["noise"].to(device=device, dtype=torch.float32, non_blocking=True)
    u = batch["u"].to(device=device, dtype=torch.float32, non_blocking=True)
    text = batch["text"].to(device=device, dtype=dtype, non_blocking=True)
    t = torch.sigmoid(u)  # logit-normal timesteps
    tb = t.view(-1, 1, 1, 1, 1)
    x_t = ((1 - tb) * latent + tb * noise).to(dtype)
    target = noise - latent
    if marks is not None:
        marks.append(torch.cuda.Event(enable_timing=True))
        marks[-1].record()
    pred = model(
        hidden_states=x_t, timestep=t * 1000, encoder_hidden_states=text, return_dict=False
    )[0]
    return ((pred.float() - target) ** 2).sum() / normalizer


def warm_shapes(model, plan, rank, shapes, text_len, device, seen):
    """Runs forward+backward once, on random inputs, for each micro-batch shape of this rank's
    plan that the model has not run yet (``seen``: (batch, frames, height, width) tuples), and
    returns how many it ran.

    PyTorch's default attention on Hopper (cuDNN) builds an execution plan the first time it
    meets a shape: about 0.2 s each, measured on the H200 (benchmarks/bench_cold_shapes.py).
    A long run pays that once per shape; a short timed epoch with a cost-capped sampler, whose
    micro-batch sizes vary, would pay it on most image steps. Every rank runs the same number
    of passes (padded with its smallest shape), so that FSDP's collectives stay matched; DDP
    runs them without gradient sync. Gradients are cleared afterwards.
    """
    from adaptiveload.models.wan import random_batch

    inner = model.module if hasattr(model, "module") else model
    mine = []  # this rank's distinct shapes, in plan order
    for idx in plan.rank_micro_batches(rank):
        key = (len(idx), *(int(v) for v in shapes[idx[0]]))
        if key not in mine:
            mine.append(key)
    todo = [k for k in mine if k not in seen]
    count = torch.tensor([len(todo)], device=device)
    dist.all_reduce(count, op=dist.ReduceOp.MAX)
    if count.item() == 0:
        return 0
    smallest = min(mine, key=lambda k: k[0] * math.prod(k[1:]))
    runs = todo + [smallest] * (int(count.item()) - len(todo))
    sync = model.no_sync() if hasattr(model, "no_sync") else nullcontext()
    with sync:
        for b, f, h, w in runs:
            inputs = random_batch(inner, b, f, h, w, text_len=text_len)
            model(**inputs, return_dict=False)[0].float().square().mean().backward()
    for p in model.parameters():
        p.grad = None
    seen.update(todo)
    return len(todo)


def epoch_summary(epoch, imbalances, errors, refined, composition=None):
    """The epoch's line of the log: mean measured imbalance over its steps, the composition
    of the epoch's plan (``Composition.to_dict()``), and the median and 90th percentile of
    |predicted / measured - 1| over its micro-batches, the prediction being the cost the
    sampler planned the micro-batch with."""
    out = {
        "epoch": epoch,
        "steps": len(imbalances),
        "measured_imbalance": float(np.mean(imbalances)),
        "cost_error_median": float(np.median(errors)) if errors else None,
        "cost_error_p90": float(np.percentile(errors, 90)) if errors else None,
    }
    if composition is not None:
        out["composition"] = composition.to_dict()
    if refined is not None:
        out["refined"] = refined
    return out


def checkpoint_state(model, optimizer):
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

    opts = StateDictOptions(full_state_dict=True, cpu_offload=True)
    return get_state_dict(model, optimizer, options=opts)


def load_checkpoint_state(model, optimizer, model_sd, optim_sd):
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_state_dict

    opts = StateDictOptions(full_state_dict=True, cpu_offload=True, broadcast_from_rank0=False)
    set_state_dict(
        model, optimizer, model_state_dict=model_sd, optim_state_dict=optim_sd, options=opts
    )


def sequence_parallel_arg(text: str):
    """``--sequence-parallel``'s type: 'auto' or a degree >= 1."""
    if text == "auto":
        return text
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"must be 'auto' or an int >= 1, got {text!r}")
    return int(text)


def sequence_parallel_degree(arg, world: int) -> int:
    """``--sequence-parallel``: the number given, or for 'auto' the sampler's own choice (the
    largest power of two <= 8, one node's GPUs, dividing the world size; any head count runs,
    as Ulysses x ring)."""
    return auto_sequence_parallel(world) if arg == "auto" else int(arg)
