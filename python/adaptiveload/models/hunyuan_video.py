"""HunyuanVideo (diffusers' ``HunyuanVideoTransformer3DModel``): an MMDiT whose dual-stream
blocks and single-stream blocks attend over the video's tokens and the prompt's together.

Geometry: the VAE of Wan's strides (4, 8, 8), patches of (1, 2, 2), and the prompt's 256
text tokens in every sample's attention (the pipeline's ``max_sequence_length``), so a
480x832 81-frame clip is 32,760 + 256 tokens. Fused ops: ``integrations/hunyuan_video.py``.
"""

from __future__ import annotations

import torch

from adaptiveload.geometry import Geometry
from adaptiveload.models.family import ModelFamily, model_dtype, random_source

TEXT_LEN = 256
GEOMETRY = Geometry("hunyuanvideo", (4, 8, 8), (1, 2, 2), extra_tokens=TEXT_LEN)

CONFIGS: dict[str, dict] = {
    "tiny": dict(
        in_channels=4, out_channels=4, num_attention_heads=2, attention_head_dim=16,
        num_layers=1, num_single_layers=1, num_refiner_layers=1, mlp_ratio=2.0,
        text_embed_dim=32, pooled_projection_dim=16, rope_axes_dim=(4, 6, 6),
    ),
    # HunyuanVideo 1.0 T2V, 13B (diffusers' defaults).
    "hunyuanvideo-13B": dict(
        in_channels=16, out_channels=16, num_attention_heads=24, attention_head_dim=128,
        num_layers=20, num_single_layers=40, num_refiner_layers=2, mlp_ratio=4.0,
        text_embed_dim=4096, pooled_projection_dim=768, rope_axes_dim=(16, 56, 56),
    ),
}  # fmt: skip

SHAPES = (
    (1, 480, 832),
    (1, 720, 1280),
    (33, 480, 832),
    (65, 480, 832),
    (129, 480, 832),
    (65, 720, 1280),
)


def _build(cfg: dict, device: torch.device):
    from diffusers import HunyuanVideoTransformer3DModel

    return HunyuanVideoTransformer3DModel(patch_size=2, patch_size_t=1, **cfg).to(device)


def _batch(model, batch: int, frames: int, height: int, width: int, generator) -> dict:
    cfg = model.config
    randn, device = random_source(model, generator)
    f, h, w = GEOMETRY.latent_shape(frames, height, width)

    return {
        "hidden_states": randn(batch, cfg.in_channels, f, h, w),
        "timestep": torch.rand(batch, device=device, generator=generator) * 1000,
        "encoder_hidden_states": randn(batch, TEXT_LEN, cfg.text_embed_dim),
        "encoder_attention_mask": torch.ones(batch, TEXT_LEN, device=device, dtype=torch.int64),
        "pooled_projections": randn(batch, cfg.pooled_projection_dim),
        "guidance": torch.full((batch,), 6000.0, device=device, dtype=model_dtype(model)),
    }


def _blocks(model) -> list:
    return [*model.transformer_blocks, *model.single_transformer_blocks]


FAMILY = ModelFamily(
    name="hunyuanvideo",
    model_class="HunyuanVideoTransformer3DModel",
    geometry=GEOMETRY,
    configs=CONFIGS,
    default_config="hunyuanvideo-13B",
    build_model=_build,
    batch=_batch,
    blocks=_blocks,
    shapes=SHAPES,
    patch="adaptiveload.integrations.hunyuan_video",
    depth_keys=("num_layers", "num_single_layers"),
)
