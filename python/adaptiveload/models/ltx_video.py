"""LTX-Video (diffusers' ``LTXVideoTransformer3DModel``): a DiT of unaffine RMSNorms with
adaLN modulation per sample or per token (``ada_values`` of shape (B, T, 6, D)), text by
cross-attention.

Geometry: a VAE of strides (8, 32, 32) and patches of (1, 1, 1), so a 480x832 121-frame clip
is 16 x 15 x 26 = 6,240 tokens. Fused ops: ``integrations/ltx_video.py``.
"""

from __future__ import annotations

import torch

from adaptiveload.geometry import Geometry
from adaptiveload.models.family import ModelFamily, random_source

# T5 prompt tokens (the pipeline's max_sequence_length), by cross-attention.
TEXT_LEN = 128
GEOMETRY = Geometry("ltx-video", (8, 32, 32), (1, 1, 1))
# The frame rate the pipeline's rope scale assumes.
FRAME_RATE = 25

CONFIGS: dict[str, dict] = {
    "tiny": dict(
        in_channels=8, out_channels=8, num_attention_heads=2, attention_head_dim=16,
        cross_attention_dim=32, num_layers=2, caption_channels=32,
    ),
    # LTX-Video 0.9 (2B, diffusers' defaults) and 0.9.7/0.9.8 13B.
    "ltx-video-2B": dict(
        in_channels=128, out_channels=128, num_attention_heads=32, attention_head_dim=64,
        cross_attention_dim=2048, num_layers=28, caption_channels=4096,
    ),
    "ltx-video-13B": dict(
        in_channels=128, out_channels=128, num_attention_heads=32, attention_head_dim=128,
        cross_attention_dim=4096, num_layers=48, caption_channels=4096,
    ),
}  # fmt: skip

SHAPES = (
    (1, 512, 768),
    (1, 704, 1216),
    (49, 512, 768),
    (97, 512, 768),
    (121, 704, 1216),
    (257, 512, 768),
)


def _build(cfg: dict, device: torch.device):
    from diffusers import LTXVideoTransformer3DModel

    return LTXVideoTransformer3DModel(**cfg).to(device)


def _batch(model, batch: int, frames: int, height: int, width: int, generator) -> dict:
    cfg = model.config
    randn, device = random_source(model, generator)
    f, h, w = GEOMETRY.latent_shape(frames, height, width)
    vt, vh, vw = GEOMETRY.vae_stride
    return {
        # Latents packed as tokens (patch 1): (B, F' H' W', C).
        "hidden_states": randn(batch, f * h * w, cfg.in_channels),
        "encoder_hidden_states": randn(batch, TEXT_LEN, cfg.caption_channels),
        "timestep": torch.rand(batch, device=device, generator=generator) * 1000,
        "encoder_attention_mask": torch.ones(batch, TEXT_LEN, device=device, dtype=torch.int64),
        "num_frames": f,
        "height": h,
        "width": w,
        "rope_interpolation_scale": (vt / FRAME_RATE, vh, vw),
    }


def _blocks(model) -> list:
    return list(model.transformer_blocks)


FAMILY = ModelFamily(
    name="ltx-video",
    model_class="LTXVideoTransformer3DModel",
    geometry=GEOMETRY,
    configs=CONFIGS,
    default_config="ltx-video-2B",
    build_model=_build,
    batch=_batch,
    blocks=_blocks,
    shapes=SHAPES,
    patch="adaptiveload.integrations.ltx_video",
)
