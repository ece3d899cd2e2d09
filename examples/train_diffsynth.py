"""DiffSynth-Studio's Wan training step with AdaptiveLoad's sampler and fused ops.

    torchrun --nproc_per_node 2 examples/train_diffsynth.py --steps-per-save 3 --output /tmp/run
    accelerate launch examples/train_diffsynth.py --config wan2.1-1.3B --latents 480p --layers 6

The loop is that of ``diffsynth.diffusion.runner.launch_training_task`` (accelerate, one
sample per micro-batch, ``accelerator.accumulate``, ``optimizer.step()`` on every micro-batch,
which accelerate skips until the step's last); the loss is DiffSynth's own ``FlowMatchSFTLoss``
over ``model_fn_wan_video`` on cached inputs (``input_latents``, ``context``), as its trainer
reads them after its data-process task. Here the cache is random latents of Wan's shapes.

AdaptiveLoad's changes to that trainer:

- the DataLoader's ``batch_sampler`` is ``AdaptiveBatchSampler(..., max_batch_size=1,
  micro_batches_per_step=K)`` with K = ``gradient_accumulation_steps``: each optimizer step's
  W x K samples are spread so that every process has about the same work;
- ``apply_fused_ops(dit)``: the blocks' adaLN steps run as AdaptiveLoad's fused ops;
- ``prepare_data_loader`` registers the loader for checkpointing: ``accelerator.save_state``
  and ``load_state`` hold the sampler's epoch and position, so ``--resume`` continues with the
  batches an uninterrupted run would have drawn.

Each process appends one JSON line per optimizer step to OUTPUT/log_RANK.jsonl: the samples
of its K micro-batches, their tokens and losses, and its seconds.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import numpy as np
import torch
from accelerate import Accelerator
from diffsynth.diffusion.flow_match import FlowMatchScheduler
from diffsynth.diffusion.loss import FlowMatchSFTLoss
from diffsynth.models.wan_video_dit import WanModel
from diffsynth.pipelines.wan_video import model_fn_wan_video
from torch.utils.data import DataLoader, Dataset

from adaptiveload import AdaptiveBatchSampler
from adaptiveload.integrations.accelerate import prepare_data_loader
from adaptiveload.integrations.diffsynth import apply_fused_ops
from adaptiveload.wan import PATCH, TEXT_LEN

# DiffSynth's WanModel arguments (text-to-video, 16 latent channels). The tiny one keeps a
# head size of 12, which DiffSynth's 3-axis RoPE splits evenly (as 128).
CONFIGS = {
    "tiny": dict(dim=24, num_heads=2, ffn_dim=48, text_dim=32, freq_dim=32, num_layers=2),
    "wan2.1-1.3B": dict(
        dim=1536, num_heads=12, ffn_dim=8960, text_dim=4096, freq_dim=256, num_layers=30
    ),
    "wan2.1-14B": dict(
        dim=5120, num_heads=40, ffn_dim=13824, text_dim=4096, freq_dim=256, num_layers=40
    ),
}
CHANNELS = 16

# Latent (frames, height, width) of the synthetic samples and how often each occurs.
LATENTS = {
    "tiny": ([(1, 8, 8), (1, 8, 12), (3, 8, 8), (5, 8, 12), (9, 8, 8)], 8),
    # 480 x 832 pixels: an image, 17-, 33- and 81-frame clips (the VAE's 4 x 8 x 8 stride).
    "480p": ([(1, 60, 104), (5, 60, 104), (9, 60, 104), (21, 60, 104)], TEXT_LEN),
}
MIX = [0.4, 0.2, 0.2, 0.1, 0.1]


class CachedLatents(Dataset):
    """Random stand-ins for DiffSynth's cached inputs: ``input_latents`` (1, C, F, H, W) and
    ``context`` (1, L, text_dim), drawn from (seed, sample) only, so every run sees the same."""

    def __init__(self, num_samples, latents, config, seed=0):
        shapes, self.text_len = LATENTS[latents]
        mix = np.array(MIX[: len(shapes)]) / sum(MIX[: len(shapes)])
        draw = np.random.default_rng(seed).choice(len(shapes), size=num_samples, p=mix)
        self.shapes = [shapes[k] for k in draw]
        self.seq_lens = [f * (h // PATCH[1]) * (w // PATCH[2]) for f, h, w in self.shapes]
        self.text_dim, self.seed = CONFIGS[config]["text_dim"], seed

    def __len__(self):
        return len(self.shapes)

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + i)
        return {
            "input_latents": torch.randn(1, CHANNELS, *self.shapes[i], generator=g),
            "context": torch.randn(1, self.text_len, self.text_dim, generator=g),
            "index": i,
        }


def first(samples):
    return samples[0]  # DiffSynth's collate_fn: batches of one sample, passed as they are


class WanTrainingModule(torch.nn.Module):
    """The part of DiffSynth's ``WanTrainingModule`` that trains on cached inputs: it is the
    ``pipe`` that ``FlowMatchSFTLoss`` reads (scheduler, dtype, device, ``model_fn``)."""

    in_iteration_models = ("dit",)

    def __init__(self, dit, dtype, gradient_checkpointing=False):
        super().__init__()
        self.dit, self.torch_dtype = dit, dtype
        self.scheduler = FlowMatchScheduler("Wan")
        self.scheduler.set_timesteps(1000, training=True)
        self.model_fn = model_fn_wan_video
        self.checkpointing = gradient_checkpointing  # DiffSynth's, per block

    @property
    def device(self):
        return self.dit.patch_embedding.weight.device

    def forward(self, data):
        keys = ("input_latents", "context")
        inputs = {k: data[k].to(self.device, self.torch_dtype) for k in keys}
        return FlowMatchSFTLoss(self, **inputs, use_gradient_checkpointing=self.checkpointing)


def build_dit(config, layers=None, seed=0):
    c = dict(CONFIGS[config])
    c["num_layers"] = layers or c["num_layers"]
    torch.manual_seed(seed)
    return WanModel(
        **c, in_dim=CHANNELS, out_dim=CHANNELS, eps=1e-6, patch_size=PATCH, has_image_input=False
    )


def make_sampler(data, args, num_replicas, rank):
    return AdaptiveBatchSampler(
        data.seq_lens,
        max(data.seq_lens),  # one sample per micro-batch: room for the longest
        group_keys=data.shapes,
        max_batch_size=1,
        micro_batches_per_step=args.gradient_accumulation_steps,
        num_replicas=num_replicas,
        rank=rank,
        seed=args.seed,
    )


class Progress:
    """Optimizer steps done, saved with the checkpoint (accelerate's counter restarts per epoch)."""

    steps = 0

    def state_dict(self):
        return {"steps": self.steps}

    def load_state_dict(self, state):
        self.steps = state["steps"]


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", default="tiny", choices=sorted(CONFIGS))
    ap.add_argument("--layers", type=int, default=None, help="override the number of blocks")
    ap.add_argument("--latents", default="tiny", choices=sorted(LATENTS))
    ap.add_argument("--num-samples", type=int, default=24)
    ap.add_argument("--gradient-accumulation-steps", type=int, default=2)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--max-steps", type=int, default=None, help="stop after this many steps")
    ap.add_argument("--learning-rate", type=float, default=1e-4)
    ap.add_argument("--fused", action=argparse.BooleanOptionalAction, default=True)
    ap.add_argument("--gradient-checkpointing", action="store_true")
    ap.add_argument("--num-workers", type=int, default=0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--output", default="./train_diffsynth_out")
    ap.add_argument("--steps-per-save", type=int, default=0, help="0: only at the end")
    ap.add_argument("--resume", default=None, help="a folder save_state wrote: OUTPUT/step-N")
    return ap.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    k = args.gradient_accumulation_steps
    accelerator = Accelerator(gradient_accumulation_steps=k, cpu=not torch.cuda.is_available())
    dtype = torch.bfloat16 if accelerator.device.type == "cuda" else torch.float32
    data = CachedLatents(args.num_samples, args.latents, args.config, args.seed)
    sampler = make_sampler(data, args, accelerator.num_processes, accelerator.process_index)
    loader = prepare_data_loader(
        accelerator,
        DataLoader(data, batch_sampler=sampler, collate_fn=first, num_workers=args.num_workers),
    )
    dit = build_dit(args.config, args.layers, args.seed).to(accelerator.device, dtype)
    if args.fused:
        apply_fused_ops(dit)
    model = WanTrainingModule(dit, dtype, args.gradient_checkpointing)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.learning_rate, weight_decay=1e-2)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)  # loader unchanged
    progress = Progress()
    accelerator.register_for_checkpointing(progress)
    if args.resume:
        accelerator.load_state(args.resume)  # model, optimizer, RNG, sampler position, steps
    saved = progress.steps  # the step last saved or loaded

    os.makedirs(args.output, exist_ok=True)
    log = open(os.path.join(args.output, f"log_{accelerator.process_index}.jsonl"), "a")

    def more():
        return args.max_steps is None or progress.steps < args.max_steps

    for epoch in range(loader.epoch, args.epochs if more() else 0):
        loader.set_epoch(epoch)  # the resumed epoch keeps its position
        record, start = {"samples": [], "tokens": [], "losses": []}, time.perf_counter()
        for data_item in loader:
            index = int(data_item["index"])
            # DiffSynth's loss draws its timestep and noise from the global generator: seed it
            # from (seed, epoch, sample), so that a resumed run draws what this run would have.
            torch.manual_seed(args.seed * 1_000_003 + epoch * 7_919 + index)
            with accelerator.accumulate(model):
                loss = model(data_item)  # the mean over one sample's elements
                # accelerate divides by K and DDP averages over W: the gradient of the mean
                # over the step's W x K samples, as MicroBatch.loss_scale(W, per="sample").
                accelerator.backward(loss)
                optimizer.step()  # accelerate steps only when gradients are synchronized
                optimizer.zero_grad()
            record["samples"].append(index)
            record["tokens"].append(data.seq_lens[index])
            record["losses"].append(loss.item())
            if not accelerator.sync_gradients:
                continue
            progress.steps += 1
            seconds = time.perf_counter() - start
            mine = torch.tensor([[seconds, sum(record["tokens"])]], device=accelerator.device)
            ranks = accelerator.gather(mine)  # (W, 2): every rank's seconds and tokens
            line = {"step": progress.steps, "epoch": epoch, **record, "seconds": seconds}
            print(json.dumps(line), file=log, flush=True)
            if accelerator.is_main_process:
                print(
                    f"step {progress.steps} epoch {epoch} loss {np.mean(record['losses']):.4f} "
                    f"tokens per rank {ranks[:, 1].int().tolist()} "
                    f"time max/mean {(ranks[:, 0].max() / ranks[:, 0].mean()).item():.2f}",
                    flush=True,
                )
            if args.steps_per_save and progress.steps % args.steps_per_save == 0:
                accelerator.save_state(os.path.join(args.output, f"step-{progress.steps}"))
                saved = progress.steps
            if not more():
                break
            record, start = {"samples": [], "tokens": [], "losses": []}, time.perf_counter()
        if not more():
            break
    if progress.steps != saved:
        accelerator.save_state(os.path.join(args.output, f"step-{progress.steps}"))
    accelerator.end_training()
    if torch.distributed.is_initialized():
        # A rank sometimes never exited (twice in a row on the CI machine): at
        # interpreter exit DDP's reducer destroyed the gloo process group, joining its worker
        # thread while holding the GIL, while that thread, freeing the tensors of an all-gather
        # it had run, waited for the GIL. A barrier waits without the GIL, so the worker
        # threads finish such frees first; its own work holds no tensor.
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
