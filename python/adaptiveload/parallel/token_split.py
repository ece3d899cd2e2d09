"""``TokenSplit``: the state a model's split hooks share (one module per family in this
package), and which forward of the model each hook call belongs to.

Every forward of a model with a split installed gets a ``SplitForward`` when it starts (the
family's entry hook): the config of the ``split_sequence`` block it starts in, or None
outside any block (the model as it is). Block hooks read ``TokenSplit.current``: the running
forward's, or, inside a backward that recomputes checkpointed blocks, the forward being
recomputed's. The output of every forward passes through ``_Recompute``, whose backward
(the first step of that forward's backward, before any of its blocks is recomputed) names
the forward whose blocks are recomputed next, and the first block's share passes through
``_BlocksDone``, whose backward ends it. So a backward after the block recomputes the shares
of a split forward, while a forward started after the block runs whole. Not covered: a
reentrant checkpoint around the whole model whose backward runs after the block (it
recomputes the forward before the output's backward can name it).
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from adaptiveload.parallel.collectives import (
    cross_attention,
    gather_tokens,
    sum_over_peers,
    ulysses_attention,
)
from adaptiveload.parallel.groups import layout, share_sizes, token_share
from adaptiveload.parallel.members import Membership, check_same_micro_batch


@dataclass
class SplitConfig:
    """One ``split_sequence`` block: its group, degree and member, what the members must
    agree on (``membership``: None for ``ONE_DEVICE``), and a refusal of the model kept for
    the members' exchange (so that every member raises it)."""

    group: object
    degree: int
    member: int
    membership: Membership | None = None
    refused: Exception | None = None


@dataclass
class SplitForward:
    """One forward of the model in a ``split_sequence`` block: its config, and the cut of the
    sample's tokens, set at the first block (``full`` = 0 until then)."""

    config: SplitConfig
    entry: object = None  # a weak reference to the forward's first input
    full: int = 0
    sizes: list[int] = field(default_factory=list)
    cut: slice = field(default_factory=lambda: slice(None))

    @property
    def group(self):
        return self.config.group

    @property
    def degree(self) -> int:
        return self.config.degree

    @property
    def member(self) -> int:
        return self.config.member


class _Recompute(torch.autograd.Function):
    """Identity on a forward's output; its backward tells the split which forward the blocks
    recomputed from now on (activation checkpointing) belong to."""

    @staticmethod
    def forward(ctx, out, split, record):
        ctx.split, ctx.record = split, record
        return out.view_as(out)

    @staticmethod
    def backward(ctx, grad):
        ctx.split.recomputing(ctx.record)
        return grad, None, None


class _BlocksDone(torch.autograd.Function):
    """Identity on the first block's share of a forward (with a leaf that needs a gradient, so
    that its backward runs even where the hidden states need none); its backward, after the
    last recompute of that forward's blocks, ends the recompute."""

    @staticmethod
    def forward(ctx, share, anchor, split, record):
        ctx.split, ctx.record = split, record
        return share.view_as(share)

    @staticmethod
    def backward(ctx, grad):
        ctx.split.recomputed(ctx.record)
        return (grad if ctx.needs_input_grad[0] else None), None, None, None


_NOT_RECOMPUTING = object()


class TokenSplit:
    """What a model's split hooks share: the config of the ``split_sequence`` block in force
    (``active``), the forward that runs (``running``), the forward whose blocks a backward
    recomputes, and the methods the families' hooks call on ``current``. A copy of the model
    (``copy.deepcopy``, ``torch.save``) carries a split of its own with none of these."""

    def __init__(self):
        self.active: SplitConfig | None = None
        self.running: SplitForward | None = None
        self.replayed = _NOT_RECOMPUTING

    def __getstate__(self):
        return {}

    def __setstate__(self, state):
        self.__init__()

    @property
    def current(self) -> SplitForward | None:
        """The forward the hooks serve now; None: the model as it is."""
        return self.running if self.replayed is _NOT_RECOMPUTING else self.replayed

    def recomputing(self, record: SplitForward | None) -> None:
        """A backward starts: the blocks it recomputes belong to ``record``'s forward."""
        self.replayed = record

    def recomputed(self, record: SplitForward | None) -> None:
        """``record``'s backward is past its blocks."""
        if self.replayed is record:
            self.replayed = _NOT_RECOMPUTING

    def before_forward(self, module, args, kwargs):
        """The family's entry hook: a forward starts, split as the block in force says, or
        whole outside any block. A checkpoint around the whole model, recomputing a forward in
        its backward (the same first input), keeps the forward it recomputes."""
        first = next((t for t in (*args, *kwargs.values()) if torch.is_tensor(t)), None)
        replayed = self.replayed
        if replayed is not _NOT_RECOMPUTING:
            if replayed is not None and replayed.entry is not None and replayed.entry() is first:
                return None
            self.replayed = _NOT_RECOMPUTING
        if self.active is None:
            self.running = None
        else:
            entry = None if first is None else weakref.ref(first)
            self.running = SplitForward(self.active, entry)
        return None

    def see_tokens(self, hidden, text, temb) -> SplitForward:
        """A block's inputs (hidden states ``(B, n, C)``, text, timestep embedding): the first
        block of a forward checks that the members run the same micro-batch and sets the cut."""
        f = self.current
        if f.full == 0:
            config = f.config
            if config.membership is not None:
                check_same_micro_batch(config, hidden, text, temb)
            elif config.refused is not None:
                raise config.refused
            f.full = hidden.shape[1]
            f.sizes = share_sizes(f.full, f.degree)
            f.cut = token_share(f.full, f.degree, f.member)
        return f

    def share(self, t: torch.Tensor | None, dim: int = 1, contiguous: bool = False):
        """This member's tokens of ``t`` along ``dim`` where it holds the whole sample's (else
        ``t`` as it is: already a share, or not per token). ``contiguous`` for hidden states,
        which fused kernels read as rows back to back."""
        f = self.current
        if t is None or t.ndim <= dim or t.shape[dim] != f.full:
            return t
        t = t.narrow(dim, f.cut.start, f.cut.stop - f.cut.start)
        return t.contiguous() if contiguous else t

    def share_hidden(self, hidden: torch.Tensor) -> torch.Tensor:
        """This member's tokens of a block's hidden states. The first block's (the whole
        sample's) pass through ``_BlocksDone``, whose backward ends the recompute of this
        forward's blocks."""
        f = self.current
        if hidden.shape[1] != f.full:
            return hidden
        share = self.share(hidden, contiguous=True)
        if not torch.is_grad_enabled():
            return share
        anchor = torch.zeros((), device=hidden.device, requires_grad=True)
        return _BlocksDone.apply(share, anchor, self, f)

    def attend(self, q, k, v, text=None, mask=None):
        """Ulysses (x ring) attention of this member's ``(B, s, H, D)`` shards
        (``collectives``)."""
        f = self.current
        return ulysses_attention(q, k, v, f.group, f.sizes, f.member, text=text, mask=mask)

    def own_heads(self, linear: nn.Linear, x: torch.Tensor, heads: int) -> torch.Tensor:
        """``linear(x)`` for this member's ``heads / u`` heads only, ``(B, T, heads / u, D)``
        (``u``: the Ulysses degree, ``groups.layout``; shard ``member % u``): the rows of the
        weight (and bias) of those heads. For an ``x`` every member holds whole (the text), so
        that each projects 1/u of it."""
        f = self.current
        u, _ = layout(f.degree, heads)
        rows = linear.weight.shape[0] // u
        shard = f.member % u
        cut = slice(shard * rows, (shard + 1) * rows)
        bias = None if linear.bias is None else linear.bias[cut]
        return F.linear(x, linear.weight[cut], bias).unflatten(-1, (heads // u, -1))

    def norm_own_heads(self, norm: nn.Module, x: torch.Tensor, heads: int) -> torch.Tensor:
        """An RMS norm across all ``heads`` (``norm``: its ``eps`` and ``weight`` over
        ``H * D``, as Wan's ``rms_norm_across_heads``) applied to this member's head shard
        ``x`` (``(B, T, H / u, D)``): the squares are summed over its Ulysses peers."""
        f = self.current
        u, _ = layout(f.degree, heads)
        xf = x.float()
        squares = xf.square().sum((-2, -1), keepdim=True)
        squares = sum_over_peers(squares, f.group, f.degree, f.member, u)
        eps = norm.eps if norm.eps is not None else torch.finfo(x.dtype).eps
        y = (xf * torch.rsqrt(squares / (x.shape[-2] * x.shape[-1] * u) + eps)).type_as(x)
        if getattr(norm, "weight", None) is None:
            return y
        return y * norm.weight.view(u, *x.shape[-2:])[f.member % u]

    def cross_attend(self, q: torch.Tensor, pairs) -> torch.Tensor:
        """Attention of this member's query shard ``q`` (``(B, s, H, D)``) over keys and values
        of this member's ``H / u`` heads (``pairs``: ``[(k, v)]``,
        ``collectives.cross_attention``)."""
        f = self.current
        return cross_attention(q, pairs, f.group, f.sizes, f.member)

    def after_output(self, module, args, out):
        """Forward hook of the model's output projection: the gather, while the forward is
        split, and the mark that lets this forward's backward recompute its blocks as they
        ran. The hooks are methods of the split (not closures), so that a copy of the model
        carries its own split with it."""
        f = self.current
        if f is not None:
            out = gather_tokens(out, f.group, f.sizes, f.member)
        if torch.is_grad_enabled() and out.requires_grad:
            out = _Recompute.apply(out, self, f)
        return out


def check_heads(heads: int, degree: int) -> None:
    """Any degree runs over any head count (``groups.layout``: Ulysses x ring); refused: a
    degree or a head count below 1."""
    layout(degree, heads)


def check_unfused_projections(attentions) -> None:
    """diffusers' ``fuse_qkv_projections`` replaces to_q/to_k/to_v: the splits call them."""
    if any(getattr(a, "fused_projections", False) for a in attentions):
        raise NotImplementedError(
            "split_sequence: fused q/k/v projections (fuse_qkv_projections) are not "
            "supported; unfuse them"
        )
