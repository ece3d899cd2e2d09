"""``split_sequence``: a model's forward on one member's share of each sample's tokens, for the
families that have a split (one module each in this package, which it imports by name:
the families import ``token_split``, never this module)."""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from contextlib import contextmanager

from torch import nn

from adaptiveload.parallel.groups import ONE_DEVICE
from adaptiveload.parallel.members import membership
from adaptiveload.parallel.token_split import SplitConfig

#: model class name -> (module of its split, the module its class must come from). The class
#: is looked up in the model's ancestry: FSDP2's fully_shard gives a model a subclass
#: (FSDPWanTransformer3DModel).
SPLITS = {
    "WanTransformer3DModel": ("adaptiveload.parallel.wan", "diffusers"),
    "LTXVideoTransformer3DModel": ("adaptiveload.parallel.ltx_video", "diffusers"),
    "HunyuanVideoTransformer3DModel": ("adaptiveload.parallel.hunyuan_video", "diffusers"),
    "WanModel": ("adaptiveload.parallel.diffsynth", "diffsynth"),
}

_ATTRIBUTE = "_adaptiveload_split"


def _family(model: nn.Module):
    """The split module of ``model``'s family, or None."""
    for cls in type(model).__mro__:
        entry = SPLITS.get(cls.__name__)
        if entry and cls.__module__.split(".")[0] == entry[1]:
            return importlib.import_module(entry[0])
    return None


@contextmanager
def split_sequence(model: nn.Module, group, degree: int, member: int) -> Iterator[None]:
    """Within the context, each forward of ``model`` runs on member ``member`` of ``degree``'s
    share of each sample's tokens, with Ulysses self-attention over ``group`` (times a ring
    where ``degree`` does not divide the heads: ``groups.layout``), and returns the whole
    micro-batch's output (gathered): compute the loss on it as without sequence parallelism.
    Degree 1: the model as it is.

    Lifetime: the context decides how the forwards that start in it run. A forward started
    after the context runs the whole model; a backward after it (of a forward started in it)
    recomputes checkpointed blocks on the shares, as the forward ran them (the backward of a
    forward started outside runs whole).

    Every member of the group must run the same micro-batch at the same point: at the first
    block of each forward the members exchange ``members.FINGERPRINT`` numbers, and every
    member raises where ``member`` is not this rank's place in ``group``
    (``torch.distributed.get_rank(group)``), where the group's size is not ``degree``, or where
    the members' inputs differ (shapes, or checksums of the hidden states, the text and the
    timestep embedding). Families: Wan (diffusers' ``WanTransformer3DModel`` and
    DiffSynth-Studio's ``WanModel``), LTX-Video and HunyuanVideo (diffusers); one sequence
    length per micro-batch, timesteps per sample; the first call installs hooks on the model."""
    inner = getattr(model, "module", model)  # DDP
    family = _family(inner)
    if family is None:
        if degree == 1:
            yield
            return
        names = ", ".join(f"{module}'s {name}" for name, (_, module) in SPLITS.items())
        raise NotImplementedError(
            f"split_sequence supports {names}, got {type(inner).__name__}: plan with "
            "sequence_parallel=1 for this model"
        )
    config = None if degree == 1 else _config(inner, family, group, degree, member)
    split = inner.__dict__.get(_ATTRIBUTE)
    if split is None:
        split = inner.__dict__[_ATTRIBUTE] = family.install(inner)
    before, split.active = split.active, config
    try:
        yield
    finally:
        split.active = before


def _config(model: nn.Module, family, group, degree: int, member: int) -> SplitConfig:
    """The config of a split block. With a process group, a refusal of the model waits for the
    members' exchange at the first block, so that every member raises, none waits alone."""
    if group is None:
        raise ValueError(f"split_sequence: degree {degree} needs its process group")
    if group is ONE_DEVICE:
        family.check(model, degree)
        return SplitConfig(group, degree, member)
    config = SplitConfig(group, degree, member, membership(group))
    try:
        family.check(model, degree)
    except (ValueError, NotImplementedError) as e:
        config.refused = e
    return config


def is_split_installed(model: nn.Module) -> bool:
    """Whether ``split_sequence`` has installed its hooks on ``model``."""
    return _ATTRIBUTE in getattr(model, "module", model).__dict__
