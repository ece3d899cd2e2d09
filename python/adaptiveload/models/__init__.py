"""The video DiT families AdaptiveLoad knows (``ModelFamily``, one module each): geometry,
configurations, random models and batches, fused-op patches.

``family_of("hunyuanvideo")`` finds one; ``resolve("ltx-video/ltx-video-2B")`` a family and
one of its configurations (``--model`` on the command line). Modules load diffusers only
when a model is built."""

from __future__ import annotations

from adaptiveload.models.cogvideox import FAMILY as COGVIDEOX
from adaptiveload.models.family import ModelFamily
from adaptiveload.models.hunyuan_video import FAMILY as HUNYUAN_VIDEO
from adaptiveload.models.ltx_video import FAMILY as LTX_VIDEO
from adaptiveload.models.mochi import FAMILY as MOCHI
from adaptiveload.models.skyreels_v2 import FAMILY as SKYREELS_V2
from adaptiveload.models.wan import FAMILY as WAN

FAMILIES: dict[str, ModelFamily] = {
    f.name: f for f in (WAN, HUNYUAN_VIDEO, LTX_VIDEO, COGVIDEOX, MOCHI, SKYREELS_V2)
}


def family_of(name: str) -> ModelFamily:
    if name not in FAMILIES:
        raise ValueError(f"unknown model family {name!r}; choose from {sorted(FAMILIES)}")
    return FAMILIES[name]


def family_for(model) -> tuple[ModelFamily, object]:
    """The family of ``model`` and its diffusers model: ``model`` itself, inside a wrapper's
    ``module`` (DDP), or its one submodule of a known class; ``ValueError`` otherwise."""
    by_class = {f.model_class: f for f in FAMILIES.values()}
    for candidate in (model, getattr(model, "module", None)):
        if type(candidate).__name__ in by_class:
            return by_class[type(candidate).__name__], candidate
    found = [m for m in model.modules() if type(m).__name__ in by_class]
    if len(found) != 1:
        raise ValueError(
            f"{type(model).__name__} holds {len(found)} video transformers of a known family "
            f"({', '.join(sorted(by_class))}), expected one"
        )
    return by_class[type(found[0]).__name__], found[0]


def resolve(spec: str) -> tuple[ModelFamily, str]:
    """``"family/config"`` (or ``"family"``: its default configuration) as the family and the
    configuration's name; ``ValueError`` naming what is unknown."""
    name, _, config = spec.partition("/")
    family = family_of(name)
    config = config or family.default_config
    if config not in family.configs:
        raise ValueError(
            f"unknown {family.name} config {config!r} in --model {spec!r}; choose from "
            f"{sorted(family.configs)}"
        )
    return family, config


__all__ = ["FAMILIES", "ModelFamily", "family_for", "family_of", "resolve"]
