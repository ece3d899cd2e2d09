"""The video DiT families AdaptiveLoad knows (``ModelFamily``, one module each): geometry,
configurations, random models and batches, fused-op patches.

``family_of("hunyuanvideo")`` finds one; ``resolve("ltx-video/ltx-video-2B")`` a family and
one of its configurations (``--model`` on the command line). Modules load diffusers only
when a model is built. ``adaptiveload.models.checkpointing`` checkpoints the first ``n`` blocks
of a model of any family."""

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


# Families by the name of their diffusers model class.
_BY_CLASS: dict[str, ModelFamily] = {f.model_class: f for f in FAMILIES.values()}


def _family_of_class(kind: type) -> ModelFamily | None:
    """The family whose model class ``kind`` is or derives from (FSDP2's ``fully_shard``
    swaps a module's class for a subclass of it), by class name: diffusers is imported only
    where a model is built."""
    for base in kind.__mro__:
        if base.__name__ in _BY_CLASS:
            return _BY_CLASS[base.__name__]
    return None


def family_for(model) -> tuple[ModelFamily, object]:
    """The family of ``model`` and its diffusers model: ``model`` itself, inside a wrapper's
    ``module`` (DDP), or its one submodule of a known class; ``ValueError`` otherwise."""
    for candidate in (model, getattr(model, "module", None)):
        family = _family_of_class(type(candidate))
        if family is not None:
            return family, candidate
    found = [m for m in model.modules() if _family_of_class(type(m)) is not None]
    if len(found) != 1:
        names = ", ".join(sorted(_BY_CLASS))
        raise ValueError(
            f"{type(model).__name__} holds {len(found)} video transformers of a known family "
            f"({names}), expected one"
        )
    return _family_of_class(type(found[0])), found[0]


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
