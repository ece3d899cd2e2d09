"""Wan 2.1 and 2.2 (diffusers' ``WanTransformer3DModel``): text by cross-attention, so no extra
tokens in the video's sequence. Fused ops: ``integrations/diffusers.py``.

The configurations and the geometry (``PATCH``, ``VAE_STRIDE``, ``TEXT_LEN``) are defined in
``adaptiveload.wan`` (numpy only); ``build_wan`` and ``random_batch`` are ``FAMILY.build`` and
``FAMILY.random_batch`` with Wan's defaults (and the text length as an argument).
"""

from __future__ import annotations

import torch

from adaptiveload.geometry import Geometry
from adaptiveload.models.family import ModelFamily, random_source
from adaptiveload.wan import CONFIGS, PATCH, SHAPES, TEXT_LEN, VAE_STRIDE, latent_shape

GEOMETRY = Geometry("wan", VAE_STRIDE, PATCH)

# Modules diffusers keeps in fp32 when the rest of the model is bf16.
_FP32_KEYS = ("scale_shift_table", "norm1", "norm2", "norm3", "time_embedder", "rope")


def _build(cfg: dict, device: torch.device):
    from diffusers import WanTransformer3DModel

    return WanTransformer3DModel(patch_size=PATCH, **cfg).to(device)


def random_batch(
    model,
    batch: int,
    frames: int,
    height: int,
    width: int,
    *,
    text_len: int = TEXT_LEN,
    generator: torch.Generator | None = None,
):
    """Inputs of one forward pass: noisy latents, timesteps and text embeddings, random, in the
    dtype of the model's patch embedding (its first parameter, the modulation table, stays
    fp32)."""
    cfg = model.config
    randn, device = random_source(model, generator, model.patch_embedding.weight.dtype)
    f, h, w = GEOMETRY.latent_shape(frames, height, width)
    return {
        "hidden_states": randn(batch, cfg.in_channels, f, h, w),
        "timestep": torch.rand(batch, device=device, generator=generator) * 1000,
        "encoder_hidden_states": randn(batch, text_len, cfg.text_dim),
    }


def _batch(model, batch: int, frames: int, height: int, width: int, generator) -> dict:
    return random_batch(model, batch, frames, height, width, generator=generator)


FAMILY = ModelFamily(
    name="wan",
    model_class="WanTransformer3DModel",
    geometry=GEOMETRY,
    configs=CONFIGS,
    default_config="wan2.1-1.3B",
    build_model=_build,
    batch=_batch,
    blocks=lambda model: list(model.blocks),
    shapes=tuple(SHAPES),
    patch="adaptiveload.integrations.diffusers",
    fp32_keys=_FP32_KEYS,
)


def build_wan(
    config: str = "wan2.1-1.3B",
    *,
    layers: int | None = None,
    device="cpu",
    dtype: torch.dtype = torch.float32,
    fused: bool = False,
    seed: int = 0,
):
    """``FAMILY.build``: a randomly initialized ``WanTransformer3DModel`` (same weights for the
    same seed), parameters in ``dtype`` except the norms and modulation tables (fp32, as
    diffusers), with the fused ops when ``fused``."""
    return FAMILY.build(config, layers=layers, device=device, dtype=dtype, fused=fused, seed=seed)


__all__ = [
    "CONFIGS",
    "FAMILY",
    "PATCH",
    "TEXT_LEN",
    "VAE_STRIDE",
    "build_wan",
    "latent_shape",
    "random_batch",
]
