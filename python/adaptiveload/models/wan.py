"""Wan 2.1 transformers (diffusers' WanTransformer3DModel) and batches of their inputs.

Building needs diffusers (``pip install 'adaptiveload[wan]'``); no weights are
downloaded: models are randomly initialized from ``CONFIGS``. The configurations and the
geometry (``PATCH``, ``VAE_STRIDE``, ``TEXT_LEN``) are defined in ``adaptiveload.wan``.
"""

from __future__ import annotations

import torch

from adaptiveload.geometry import Geometry
from adaptiveload.models.family import ModelFamily
from adaptiveload.wan import CONFIGS, PATCH, SHAPES, TEXT_LEN, VAE_STRIDE, latent_shape

# Text enters by cross-attention: no extra tokens in the video's sequence.
GEOMETRY = Geometry("wan", VAE_STRIDE, PATCH)

# Modules diffusers keeps in fp32 when the rest of the model is bf16.
_FP32_KEYS = ("scale_shift_table", "norm1", "norm2", "norm3", "time_embedder", "rope")


def build_wan(
    config: str = "wan2.1-1.3B",
    *,
    layers: int | None = None,
    device="cpu",
    dtype: torch.dtype = torch.float32,
    fused: bool = False,
    seed: int = 0,
):
    """A randomly initialized ``WanTransformer3DModel`` (same weights for the same seed),
    parameters in ``dtype`` except the norms and modulation tables (fp32, as diffusers)."""
    from diffusers import WanTransformer3DModel

    if config not in CONFIGS:
        raise ValueError(f"unknown Wan config {config!r}; choose from {sorted(CONFIGS)}")
    cfg = dict(CONFIGS[config])
    if layers is not None:
        if layers < 1:
            raise ValueError(f"layers must be >= 1, got {layers}")
        cfg["num_layers"] = layers
    torch.manual_seed(seed)
    model = WanTransformer3DModel(patch_size=PATCH, **cfg).to(device)
    for name, p in model.named_parameters():
        if not any(k in name for k in _FP32_KEYS):
            p.data = p.data.to(dtype)
    if fused:
        from adaptiveload.integrations.diffusers import apply_fused_ops

        apply_fused_ops(model)
    return model


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
    """Inputs of one forward pass: noisy latents, timesteps and text embeddings."""
    cfg = model.config
    p = next(model.parameters())
    shape = (batch, *latent_shape(frames, height, width, cfg.in_channels))
    dtype = model.patch_embedding.weight.dtype
    return {
        "hidden_states": torch.randn(shape, device=p.device, generator=generator).to(dtype),
        "timestep": torch.rand(batch, device=p.device, generator=generator) * 1000,
        "encoder_hidden_states": torch.randn(
            batch, text_len, cfg.text_dim, device=p.device, generator=generator
        ).to(dtype),
    }


def _build(cfg: dict, device: torch.device):
    from diffusers import WanTransformer3DModel

    return WanTransformer3DModel(patch_size=PATCH, **cfg).to(device)


def _batch(model, batch: int, frames: int, height: int, width: int, generator) -> dict:
    return random_batch(model, batch, frames, height, width, generator=generator)


# Wan 2.1 and 2.2 in diffusers (``build_wan`` builds the same models).
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
