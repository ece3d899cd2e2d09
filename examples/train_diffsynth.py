"""DiffSynth-Studio's Wan training with AdaptiveLoad's sampler, sequence parallelism and fused ops.

    torchrun --nproc_per_node 2 examples/train_diffsynth.py --steps-per-save 3 --output /tmp/run
    accelerate launch examples/train_diffsynth.py --config wan2.1-1.3B --latents 480p --layers 6

The training is ``adaptiveload.integrations.diffsynth_runner.launch_training_task``, which
takes the arguments of DiffSynth's ``diffsynth.diffusion.runner.launch_training_task`` and the
samples' latent shapes: a DiffSynth training script changes its import and passes
``seq_lens=``. The model is DiffSynth's ``WanModel`` in a training module whose loss is
DiffSynth's own ``FlowMatchSFTLoss`` over ``model_fn_wan_video`` on cached inputs
(``input_latents``, ``context``), as its trainer reads them after its data-process task. Here
the cache is random latents of Wan's shapes.

What the function changes in DiffSynth's trainer (its docstring says more): each optimizer
step's samples (one per micro-batch, K = ``--gradient-accumulation-steps`` per process where
the work allows) are spread so that every process has about the same work; with several
processes some micro-batches run split over a group of processes (``--sequence-parallel``);
the blocks' adaLN steps run as AdaptiveLoad's fused ops (``--fused``).

The model logger is DiffSynth's ``ModelLogger``, extended: each process appends one JSON line
per optimizer step to OUTPUT/log_RANK.jsonl (the samples of its micro-batches, their tokens,
losses and sequence-parallel degrees, and its seconds), and ``accelerator.save_state`` writes
OUTPUT/step-N every ``--steps-per-save`` steps and at the end (model, optimizer, RNG, the
sampler's position), from which ``--resume`` continues with the batches an uninterrupted run
would have drawn.
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
from diffsynth.diffusion.logger import ModelLogger
from diffsynth.diffusion.loss import FlowMatchSFTLoss
from diffsynth.diffusion.training_module import DiffusionTrainingModule
from diffsynth.models.wan_video_dit import WanModel
from diffsynth.pipelines.wan_video import model_fn_wan_video
from torch.utils.data import Dataset

from adaptiveload.integrations.diffsynth_runner import (
    launch_training_task,
    make_batch_sampler,
    sequence_degree,
)
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

    load_from_cache = False  # what DiffSynth's trainer asks: items are the module's input

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


class WanTrainingModule(DiffusionTrainingModule):
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
    """The sampler ``launch_training_task`` makes on process ``rank`` of ``num_replicas``."""
    return make_batch_sampler(
        data.seq_lens,
        group_keys=data.shapes,
        micro_batches_per_step=args.gradient_accumulation_steps,
        num_replicas=num_replicas,
        rank=rank,
        seed=args.seed,
        sequence_parallel=sequence_degree(sequence_parallel(args), num_replicas),
    )


def sequence_parallel(args):
    return {"auto": "auto", "off": False}.get(args.sequence_parallel, args.sequence_parallel)


class StepLog(ModelLogger):
    """DiffSynth's model logger (its saves of the trainable weights per epoch, its loggers),
    plus one JSON line per optimizer step and process, and ``accelerator.save_state`` every
    ``steps_per_save`` steps and at the end."""

    def __init__(self, output, data, steps_per_save, rank):
        super().__init__(output)
        os.makedirs(output, exist_ok=True)
        self.log = open(os.path.join(output, f"log_{rank}.jsonl"), "a")
        self.data, self.steps_per_save, self.unsaved = data, steps_per_save, False
        self.new_record()

    def new_record(self):
        self.record = {"samples": [], "tokens": [], "losses": [], "degrees": []}
        self.start = time.perf_counter()

    def on_step_end(self, accelerator, model, save_steps=None, **kw):
        super().on_step_end(accelerator, model, save_steps, loss=kw["loss"])
        mb = kw["micro_batch"]
        self.record["samples"].append(kw["sample"])
        self.record["tokens"].append(self.data.seq_lens[kw["sample"]])
        self.record["losses"].append(kw["loss"].item())
        self.record["degrees"].append(1 if mb is None else mb.degree)
        if not kw["step_end"]:
            return
        step, seconds = kw["step"], time.perf_counter() - self.start
        mine = torch.tensor([[seconds, sum(self.record["tokens"])]], device=accelerator.device)
        ranks = accelerator.gather(mine)  # (W, 2): every rank's seconds and tokens
        line = {"step": step, "epoch": kw["epoch"], **self.record, "seconds": seconds}
        print(json.dumps(line), file=self.log, flush=True)
        if accelerator.is_main_process:
            print(
                f"step {step} epoch {kw['epoch']} loss {np.mean(self.record['losses']):.4f} "
                f"tokens per rank {ranks[:, 1].int().tolist()} "
                f"time max/mean {(ranks[:, 0].max() / ranks[:, 0].mean()).item():.2f}",
                flush=True,
            )
        self.step, self.unsaved = step, True
        if self.steps_per_save and step % self.steps_per_save == 0:
            self.save_state(accelerator)
        self.new_record()

    def save_state(self, accelerator):
        accelerator.save_state(os.path.join(self.output_path, f"step-{self.step}"))
        self.unsaved = False

    def on_training_end(self, accelerator, model, save_steps=None):
        if self.unsaved:
            self.save_state(accelerator)
        super().on_training_end(accelerator, model, save_steps)


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
    ap.add_argument(
        "--sequence-parallel", default="auto", help="auto, off, or the largest degree (1, 2, 4...)"
    )
    return ap.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    accelerator = Accelerator(
        gradient_accumulation_steps=args.gradient_accumulation_steps,
        cpu=not torch.cuda.is_available(),
    )
    dtype = torch.bfloat16 if accelerator.device.type == "cuda" else torch.float32
    data = CachedLatents(args.num_samples, args.latents, args.config, args.seed)
    dit = build_dit(args.config, args.layers, args.seed).to(accelerator.device, dtype)
    model = WanTrainingModule(dit, dtype, args.gradient_checkpointing)
    logger = StepLog(args.output, data, args.steps_per_save, accelerator.process_index)
    launch_training_task(
        accelerator,
        data,
        model,
        logger,
        learning_rate=args.learning_rate,
        num_workers=args.num_workers,
        num_epochs=args.epochs,
        seq_lens=data.shapes,  # the latent shapes: tokens and group keys
        seed=args.seed,
        sequence_parallel=sequence_parallel(args),
        fused_ops=args.fused,
        resume_from=args.resume,
        max_steps=args.max_steps,
    )
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
