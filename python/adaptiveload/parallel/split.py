"""``split_sequence``: a model's forward on one member's share of each sample's tokens, for the
families that have a split (one module each in this package), and ``TokenSplit``, the state
their hooks share."""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from contextlib import contextmanager

import torch
import torch.nn.functional as F
from torch import nn

from adaptiveload.parallel.collectives import (
    cross_attention,
    gather_tokens,
    sum_over,
    ulysses_attention,
)
from adaptiveload.parallel.groups import share_sizes, token_share

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


class TokenSplit:
    """What a model's split hooks share: ``current``, the micro-batch's (group, degree, member)
    or None (the model as it is), and the cut of the sample's tokens, set at the first block of
    each forward. It stays until the next ``split_sequence``, so that a backward that recomputes
    checkpointed blocks sees it."""

    def __init__(self):
        self.current: tuple | None = None
        self.full = 0
        self.sizes: list[int] = []
        self.cut = slice(None)

    def start(self, group, degree: int, member: int) -> None:
        self.current = None if degree == 1 else (group, degree, member)
        self.full = 0

    def see_tokens(self, n: int) -> None:
        """A block's hidden states hold ``n`` tokens: the first block of a forward sets the cut."""
        if self.full == 0:
            self.full = n
            self.sizes = share_sizes(n, self.current[1])
            self.cut = token_share(n, self.current[1], self.current[2])

    def share(self, t: torch.Tensor | None, dim: int = 1, contiguous: bool = False):
        """This member's tokens of ``t`` along ``dim`` where it holds the whole sample's (else
        ``t`` as it is: already a share, or not per token). ``contiguous`` for hidden states,
        which fused kernels read as rows back to back."""
        if t is None or t.ndim <= dim or t.shape[dim] != self.full:
            return t
        t = t.narrow(dim, self.cut.start, self.cut.stop - self.cut.start)
        return t.contiguous() if contiguous else t

    def attend(self, q, k, v, text=None, mask=None):
        """Ulysses attention of this member's ``(B, s, H, D)`` shards (``collectives``)."""
        group, _, member = self.current
        return ulysses_attention(q, k, v, group, self.sizes, member, text=text, mask=mask)

    def own_heads(self, linear: nn.Linear, x: torch.Tensor, heads: int) -> torch.Tensor:
        """``linear(x)`` for this member's ``heads / d`` heads only, ``(B, T, heads / d, D)``:
        the rows of the weight (and bias) of those heads. For an ``x`` every member holds
        whole (the text), so that each projects 1/d of it."""
        _, degree, member = self.current
        rows = linear.weight.shape[0] // degree
        cut = slice(member * rows, (member + 1) * rows)
        bias = None if linear.bias is None else linear.bias[cut]
        return F.linear(x, linear.weight[cut], bias).unflatten(-1, (heads // degree, -1))

    def norm_own_heads(self, norm: nn.Module, x: torch.Tensor) -> torch.Tensor:
        """An RMS norm across all heads (``norm``: its ``eps`` and ``weight`` over ``H * D``, as
        Wan's ``rms_norm_across_heads``) applied to this member's head shard ``x``
        (``(B, T, H / d, D)``): the squares are summed over the members."""
        group, degree, member = self.current
        xf = x.float()
        squares = sum_over(xf.square().sum((-2, -1), keepdim=True), group, degree)
        eps = norm.eps if norm.eps is not None else torch.finfo(x.dtype).eps
        y = (xf * torch.rsqrt(squares / (x.shape[-2] * x.shape[-1] * degree) + eps)).type_as(x)
        if getattr(norm, "weight", None) is None:
            return y
        return y * norm.weight.view(degree, *x.shape[-2:])[member]

    def heads_for_text(self, text_len: int) -> bool:
        """Whether this split runs Wan's cross-attention over ``text_len`` text tokens on head
        shards (``parallel.wan.cross_attention_on_head_shards``)."""
        from adaptiveload.parallel.wan import cross_attention_on_head_shards

        return cross_attention_on_head_shards(self.full, text_len, self.current[1])

    def cross_attend(self, q: torch.Tensor, pairs) -> torch.Tensor:
        """Attention of this member's query shard ``q`` (``(B, s, H, D)``) over keys and values
        of this member's heads (``pairs``: ``[(k, v)]``, ``collectives.cross_attention``)."""
        group, _, member = self.current
        return cross_attention(q, pairs, group, self.sizes, member)

    def gather(self, out: torch.Tensor) -> torch.Tensor:
        """The whole micro-batch's output from the members' shards (tokens along dim 1)."""
        group, _, member = self.current
        return gather_tokens(out, group, self.sizes, member)

    def after_output(self, module, args, out):
        """Forward hook of the model's output projection: the gather, while a split is in
        force. The hooks are methods of the split (not closures), so that a copy of the model
        (``copy.deepcopy``, ``torch.save``) carries its own split with it."""
        return None if self.current is None else self.gather(out)


def check_heads(heads: int, degree: int) -> None:
    if heads % degree:
        raise ValueError(
            f"split_sequence: degree {degree} does not divide the model's {heads} attention "
            "heads: lower the sampler's sequence_parallel"
        )


def check_unfused_projections(attentions) -> None:
    """diffusers' ``fuse_qkv_projections`` replaces to_q/to_k/to_v: the splits call them."""
    if any(getattr(a, "fused_projections", False) for a in attentions):
        raise NotImplementedError(
            "split_sequence: fused q/k/v projections (fuse_qkv_projections) are not "
            "supported; unfuse them"
        )


def _family(model: nn.Module):
    """The split module of ``model``'s family, or None."""
    for cls in type(model).__mro__:
        entry = SPLITS.get(cls.__name__)
        if entry and cls.__module__.split(".")[0] == entry[1]:
            return importlib.import_module(entry[0])
    return None


@contextmanager
def split_sequence(model: nn.Module, group, degree: int, member: int) -> Iterator[None]:
    """Within the context, ``model``'s forward runs on member ``member`` of ``degree``'s share of
    each sample's tokens, with Ulysses self-attention over ``group``, and returns the whole
    micro-batch's output (gathered): compute the loss on it as without sequence parallelism.
    Every member of the group must run the same micro-batch at the same point. Degree 1: the
    model as it is.

    The split stays in force after the context, until the next ``split_sequence`` on the model,
    so that a backward that recomputes checkpointed blocks sees it: run each micro-batch's
    forward in its own context. Families: Wan (diffusers' ``WanTransformer3DModel`` and
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
    if degree > 1:
        family.check(inner, degree)
        if group is None:
            raise ValueError(f"split_sequence: degree {degree} needs its process group")
    split = inner.__dict__.get(_ATTRIBUTE)
    if split is None:
        split = inner.__dict__[_ATTRIBUTE] = family.install(inner)
    split.start(group, degree, member)
    yield


def is_split_installed(model: nn.Module) -> bool:
    """Whether ``split_sequence`` has installed its hooks on ``model``."""
    return _ATTRIBUTE in getattr(model, "module", model).__dict__
