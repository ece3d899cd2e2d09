"""Write a synthetic latent dataset in the layout examples/train_wan.py reads.

One safetensors file per sample with ``latent`` (C, F', H', W') and ``text``
(text_len, text_dim) tensors, and ``metadata.csv`` with ``path,num_frames,height,width``
in pixels (the token count follows from wan_seq_len). Shapes are drawn from one of
AdaptiveLoad's demo mixes; ``--scale`` shrinks height and width for tiny CPU runs.

    python examples/make_synthetic_latents.py --out /tmp/wan_data --num-samples 400
"""

from __future__ import annotations

import argparse
import csv
import os

import numpy as np
import torch
from safetensors.torch import save_file

from adaptiveload.demo import MIXES, demo_metadata
from adaptiveload.wan import CONFIGS, PATCH, TEXT_LEN, VAE_STRIDE, latent_shape

WAN = CONFIGS["wan2.1-1.3B"]
# Height and width stay multiples of the pixels per token (VAE stride x patch, 16).
PIXELS_H, PIXELS_W = VAE_STRIDE[1] * PATCH[1], VAE_STRIDE[2] * PATCH[2]


def make_dataset(
    out: str,
    num_samples: int,
    mix: str = "joint-pretrain",
    scale: float = 1.0,
    channels: int = WAN["in_channels"],
    text_len: int = TEXT_LEN,
    text_dim: int = WAN["text_dim"],
    seed: int = 0,
    dtype: torch.dtype = torch.bfloat16,
) -> str:
    """Create the dataset under ``out``; returns the metadata path."""
    os.makedirs(out, exist_ok=True)
    meta = demo_metadata(num_samples, mix, seed=seed)
    gen = torch.Generator().manual_seed(seed)
    path = os.path.join(out, "metadata.csv")
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["path", "num_frames", "height", "width"])
        for i, (frames, height, width) in enumerate(meta.shapes.tolist()):
            h = max(PIXELS_H, int(round(height * scale / PIXELS_H)) * PIXELS_H)
            w = max(PIXELS_W, int(round(width * scale / PIXELS_W)) * PIXELS_W)
            name = f"{i:06d}.safetensors"
            save_file(
                {
                    "latent": torch.randn(latent_shape(frames, h, w, channels), generator=gen).to(
                        dtype
                    ),
                    "text": torch.randn(text_len, text_dim, generator=gen).to(dtype),
                },
                os.path.join(out, name),
            )
            writer.writerow([name, frames, h, w])
    return path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--num-samples", type=int, default=400)
    ap.add_argument("--mix", default="joint-pretrain", choices=sorted(MIXES))
    ap.add_argument("--scale", type=float, default=1.0, help="spatial scale of the pixel sizes")
    ap.add_argument("--channels", type=int, default=WAN["in_channels"])
    ap.add_argument("--text-len", type=int, default=TEXT_LEN)
    ap.add_argument("--text-dim", type=int, default=WAN["text_dim"])
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    path = make_dataset(
        args.out,
        args.num_samples,
        args.mix,
        args.scale,
        args.channels,
        args.text_len,
        args.text_dim,
        args.seed,
    )
    lens = np.loadtxt(path, delimiter=",", skiprows=1, usecols=(1, 2, 3), dtype=np.int64, ndmin=2)
    print(f"wrote {args.num_samples} samples to {args.out} ({len(np.unique(lens, axis=0))} shapes)")


if __name__ == "__main__":
    main()
