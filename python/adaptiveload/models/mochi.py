"""Mochi 1 (diffusers' ``MochiTransformer3DModel``): an asymmetric MMDiT whose blocks attend
over the video's tokens and the prompt's 256 together (no fused patch: its norms are
RMSNorms with a scale-only modulation; balanced and calibrated as it is).

Geometry: a VAE of strides (6, 8, 8), patches of (1, 2, 2), 256 text tokens per sample: a
480x848 163-frame clip is 28 x 30 x 53 + 256 = 44,776 tokens. The model takes 6k+1 frames
(Genmo's reference sampler asserts it; the VAE decodes k+1 latent frames to 6k+1) and heights
and widths that are multiples of 16 (the pipeline's 8 for the VAE, then an even latent:
diffusers' transformer cannot reshape its output back to an odd latent height or width).
"""

from __future__ import annotations

import torch

from adaptiveload.geometry import Geometry
from adaptiveload.models.family import ModelFamily, random_source

TEXT_LEN = 256
GEOMETRY = Geometry(
    "mochi", (6, 8, 8), (1, 2, 2), extra_tokens=TEXT_LEN, frame_step=6, size_step=16
)

CONFIGS: dict[str, dict] = {
    "tiny": dict(
        num_attention_heads=2, attention_head_dim=16, num_layers=1, pooled_projection_dim=16,
        in_channels=4, text_embed_dim=32, time_embed_dim=16,
    ),
    # Mochi 1 preview, 10B (diffusers' defaults).
    "mochi-10B": dict(
        num_attention_heads=24, attention_head_dim=128, num_layers=48, pooled_projection_dim=1536,
        in_channels=12, text_embed_dim=4096, time_embed_dim=256,
    ),
}  # fmt: skip

SHAPES = ((1, 480, 848), (13, 480, 848), (31, 480, 848), (85, 480, 848), (163, 480, 848))


def _build(cfg: dict, device: torch.device):
    from diffusers import MochiTransformer3DModel

    return MochiTransformer3DModel(patch_size=2, **cfg).to(device)


def _batch(model, batch: int, frames: int, height: int, width: int, generator) -> dict:
    cfg = model.config
    randn, device = random_source(model, generator)
    f, h, w = GEOMETRY.latent_shape(frames, height, width)

    return {
        "hidden_states": randn(batch, cfg.in_channels, f, h, w),
        "encoder_hidden_states": randn(batch, TEXT_LEN, cfg.text_embed_dim),
        "timestep": (torch.rand(batch, device=device, generator=generator) * 1000).long(),
        "encoder_attention_mask": torch.ones(batch, TEXT_LEN, device=device, dtype=torch.bool),
    }


FAMILY = ModelFamily(
    name="mochi",
    model_class="MochiTransformer3DModel",
    geometry=GEOMETRY,
    configs=CONFIGS,
    default_config="mochi-10B",
    build_model=_build,
    batch=_batch,
    blocks=lambda model: list(model.transformer_blocks),
    shapes=SHAPES,
)
