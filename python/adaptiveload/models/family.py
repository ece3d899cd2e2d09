"""What AdaptiveLoad knows of one family of video DiTs, in one place (``ModelFamily``): its
token geometry, its configurations, how to build one with random weights at any depth on any
device, a random training batch of a given shape, and its fused-op patch if it has one.

Each family lives in its own module of this package: wan.py, hunyuan_video.py and
ltx_video.py (with a fused-op patch each), cogvideox.py, mochi.py and skyreels_v2.py (without);
``adaptiveload.models.family_of`` finds one by name. A family without a fused patch still gets
geometry, calibration and balancing."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import nn

from adaptiveload.geometry import Geometry


@dataclass(frozen=True)
class ModelFamily:
    """One family of video DiTs.

    Attributes:
        name: the family's name (``--model NAME/CONFIG`` on the command line).
        model_class: the name of its diffusers model class.
        geometry: tokens per sample from (frames, height, width).
        configs: keyword arguments of the diffusers model class, per configuration name;
            ``"tiny"`` is a model of a few thousand parameters for CPU tests.
        default_config: the configuration calibration uses when none is named.
        build_model: ``(config_kwargs, device) -> model`` with random weights.
        batch: ``(model, batch, frames, height, width, generator) -> kwargs`` of one forward.
        blocks: ``model -> list`` of its transformer blocks (their count is the depth).
        shapes: (frames, height, width) in pixels that calibration profiles by default.
        patch: the module of its fused-op patch (``apply_fused_ops``, ``remove_fused_ops``,
            ``is_fused``), or None.
        fp32_keys: parameter name parts kept in fp32 when the model is built in 16 bits.
    """

    name: str
    model_class: str
    geometry: Geometry
    configs: dict[str, dict]
    default_config: str
    build_model: Callable[[dict, torch.device], nn.Module]
    batch: Callable
    blocks: Callable[[nn.Module], list]
    shapes: tuple[tuple[int, int, int], ...]
    patch: str | None = None
    fp32_keys: tuple[str, ...] = field(default=())
    depth_keys: tuple[str, ...] = ("num_layers",)

    def seq_len(self, frames, height, width):
        return self.geometry.seq_len(frames, height, width)

    def build(
        self,
        config: str | None = None,
        *,
        layers: int | None = None,
        device="cpu",
        dtype: torch.dtype = torch.float32,
        fused: bool = False,
        seed: int = 0,
    ) -> nn.Module:
        """A randomly initialized model of ``config`` (same weights for the same seed), at
        ``layers`` blocks per stack when given, parameters in ``dtype`` except the norms and
        modulation tables (fp32, as diffusers keeps them); patched when ``fused``."""
        config = self.default_config if config is None else config
        if config not in self.configs:
            raise ValueError(
                f"unknown {self.name} config {config!r}; choose from {sorted(self.configs)}"
            )
        cfg = dict(self.configs[config])
        if layers is not None:
            if isinstance(layers, bool) or not isinstance(layers, int) or layers < 1:
                raise ValueError(f"layers must be an integer >= 1, got {layers!r}")
            for key in self.depth_keys:
                cfg[key] = layers
        torch.manual_seed(seed)
        model = self.build_model(cfg, torch.device(device))
        for name, p in model.named_parameters():
            if not any(k in name for k in self.fp32_keys):
                p.data = p.data.to(dtype)
        if fused:
            self.apply_fused_ops(model)
        return model

    def random_batch(
        self,
        model,
        batch: int,
        frames: int,
        height: int,
        width: int,
        *,
        generator: torch.Generator | None = None,
    ) -> dict:
        """Keyword arguments of one forward pass on ``batch`` samples of one shape: noisy
        latents, timesteps and text conditioning, random, in the model's dtype."""
        return self.batch(model, batch, frames, height, width, generator)

    def _patch(self):
        if self.patch is None:
            raise ValueError(
                f"{self.name} has no fused-op patch: it is balanced and calibrated as it is"
            )
        return importlib.import_module(self.patch)

    def apply_fused_ops(self, model: nn.Module) -> nn.Module:
        return self._patch().apply_fused_ops(model)

    def remove_fused_ops(self, model: nn.Module) -> nn.Module:
        return self._patch().remove_fused_ops(model)

    def is_fused(self, model: nn.Module) -> bool:
        return self.patch is not None and self._patch().is_fused(model)


def model_dtype(model: nn.Module) -> torch.dtype:
    """The dtype of the model's input projection (the stream's dtype)."""
    for p in model.parameters():
        if p.dtype in (torch.bfloat16, torch.float16):
            return p.dtype
    return next(model.parameters()).dtype


def random_source(
    model: nn.Module, generator: torch.Generator | None, dtype: torch.dtype | None = None
):
    """``(randn, device)``: ``randn(*shape)`` draws from ``generator`` on the model's device, in
    ``dtype`` (by default the model's, ``model_dtype``) -- what a family's random batch is made
    of."""
    device = next(model.parameters()).device
    dtype = model_dtype(model) if dtype is None else dtype

    def randn(*shape):
        return torch.randn(*shape, device=device, generator=generator).to(dtype)

    return randn, device
