"""SkyReels-V2 (diffusers' ``SkyReelsV2Transformer3DModel``): Wan's architecture and geometry
(VAE strides (4, 8, 8), patches of (1, 2, 2), text by cross-attention), its own block class
(no fused patch yet: balanced and calibrated as it is).
"""

from __future__ import annotations

import torch

from adaptiveload.geometry import Geometry
from adaptiveload.models.family import ModelFamily, random_source
from adaptiveload.wan import PATCH, SHAPES, TEXT_LEN, VAE_STRIDE

GEOMETRY = Geometry("skyreels-v2", VAE_STRIDE, PATCH)

CONFIGS: dict[str, dict] = {
    "tiny": dict(
        num_attention_heads=2, attention_head_dim=16, in_channels=4, out_channels=4,
        text_dim=32, freq_dim=32, ffn_dim=64, num_layers=2,
    ),
    # SkyReels-V2 1.3B and 14B (T2V).
    "skyreels-v2-1.3B": dict(
        num_attention_heads=12, attention_head_dim=128, in_channels=16, out_channels=16,
        text_dim=4096, freq_dim=256, ffn_dim=8960, num_layers=30,
    ),
    "skyreels-v2-14B": dict(
        num_attention_heads=40, attention_head_dim=128, in_channels=16, out_channels=16,
        text_dim=4096, freq_dim=256, ffn_dim=13824, num_layers=40,
    ),
}  # fmt: skip


def _build(cfg: dict, device: torch.device):
    from diffusers import SkyReelsV2Transformer3DModel

    return SkyReelsV2Transformer3DModel(patch_size=PATCH, **cfg).to(device)


def _batch(model, batch: int, frames: int, height: int, width: int, generator) -> dict:
    cfg = model.config
    randn, device = random_source(model, generator)
    f, h, w = GEOMETRY.latent_shape(frames, height, width)

    return {
        "hidden_states": randn(batch, cfg.in_channels, f, h, w),
        "timestep": torch.rand(batch, device=device, generator=generator) * 1000,
        "encoder_hidden_states": randn(batch, TEXT_LEN, cfg.text_dim),
    }


FAMILY = ModelFamily(
    name="skyreels-v2",
    model_class="SkyReelsV2Transformer3DModel",
    geometry=GEOMETRY,
    configs=CONFIGS,
    default_config="skyreels-v2-1.3B",
    build_model=_build,
    batch=_batch,
    blocks=lambda model: list(model.blocks),
    shapes=tuple(SHAPES),
)
