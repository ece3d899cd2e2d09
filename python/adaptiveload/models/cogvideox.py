"""CogVideoX (diffusers' ``CogVideoXTransformer3DModel``): an MMDiT whose blocks attend over
the video's tokens and the prompt's 226 together (``CogVideoXLayerNormZero``, LayerNorm with
affine; no fused patch: balanced and calibrated as it is).

Geometry: a VAE of strides (4, 8, 8), patches of (1, 2, 2), 226 text tokens per sample: a
480x720 49-frame clip is 13 x 30 x 45 + 226 = 17,776 tokens.
"""

from __future__ import annotations

import torch

from adaptiveload.geometry import Geometry
from adaptiveload.models.family import ModelFamily, random_source

TEXT_LEN = 226
GEOMETRY = Geometry("cogvideox", (4, 8, 8), (1, 2, 2), extra_tokens=TEXT_LEN)

CONFIGS: dict[str, dict] = {
    "tiny": dict(
        num_attention_heads=2, attention_head_dim=16, in_channels=4, out_channels=4,
        time_embed_dim=32, text_embed_dim=32, num_layers=1,
    ),
    # CogVideoX-2B and -5B (T2V).
    "cogvideox-2B": dict(
        num_attention_heads=30, attention_head_dim=64, in_channels=16, out_channels=16,
        time_embed_dim=512, text_embed_dim=4096, num_layers=30,
    ),
    "cogvideox-5B": dict(
        num_attention_heads=48, attention_head_dim=64, in_channels=16, out_channels=16,
        time_embed_dim=512, text_embed_dim=4096, num_layers=42,
        use_rotary_positional_embeddings=True,
    ),
}  # fmt: skip

SHAPES = ((1, 480, 720), (9, 480, 720), (25, 480, 720), (49, 480, 720), (49, 768, 1360))


def _build(cfg: dict, device: torch.device):
    from diffusers import CogVideoXTransformer3DModel

    return CogVideoXTransformer3DModel(**cfg).to(device)


def _batch(model, batch: int, frames: int, height: int, width: int, generator) -> dict:
    cfg = model.config
    randn, device = random_source(model, generator)
    f, h, w = GEOMETRY.latent_shape(frames, height, width)

    return {
        "hidden_states": randn(batch, f, cfg.in_channels, h, w),  # (B, F', C, H', W')
        "encoder_hidden_states": randn(batch, TEXT_LEN, cfg.text_embed_dim),
        "timestep": (torch.rand(batch, device=device, generator=generator) * 1000).long(),
    }


FAMILY = ModelFamily(
    name="cogvideox",
    model_class="CogVideoXTransformer3DModel",
    geometry=GEOMETRY,
    configs=CONFIGS,
    default_config="cogvideox-5B",
    build_model=_build,
    batch=_batch,
    blocks=lambda model: list(model.transformer_blocks),
    shapes=SHAPES,
)
