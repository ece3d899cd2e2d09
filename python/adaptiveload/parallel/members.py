"""The members' agreement: at the first block of each split forward, the members of the group
exchange a few numbers (one all-gather of ``FINGERPRINT`` float64 values each) and all of them
refuse, with the same error, a split that would run wrong: a member number that is not the
rank's place in the group, a degree that is not the group's size, a model refused on one of
them, or members running different micro-batches (the shape and a checksum of the hidden
states, of the text and of the timestep embedding, as the first block receives them). The
exchange has the same size whatever the inputs, so that members with different inputs meet in
it and raise, rather than meeting in attention's all-to-alls with different sizes."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.distributed as dist

# The inputs of the first block the members compare, in order, and what they are.
INPUTS = ("hidden states", "text", "timestep embedding")
_HEAD = 5  # degree, member, place in the group, group size, model accepted
_SHAPE = 5  # per input: ndim (-1: None), 3 leading dims, the product of the others
# Frequencies of the fixed weight sequences cos(f * i) the per-row sums (over i, the rows) and
# the per-column sums (over i, the last dimension) are projected on: two other inputs agree
# within RTOL on one projection about once in 60, on all eight almost never. The column sums
# see an input of few rows (a timestep embedding) change within its rows.
_FREQUENCIES = (0.7549, 1.3247, 2.2370, 2.9155)
_SUMS = 1 + 2 * len(_FREQUENCIES)  # per input: L2 norm, projections of its row and column sums
#: Values each member sends: the exchange is FINGERPRINT * 8 bytes per member per forward.
FINGERPRINT = _HEAD + (_SHAPE + _SUMS) * len(INPUTS)
#: Checksums of the same inputs agree to float rounding (kernels that are not bitwise
#: reproducible across ranks: bf16 sums differ by a few 1e-3 of the norm); those of other
#: samples, timesteps or texts differ by the order of the norm itself.
RTOL = 2e-2


@dataclass
class Membership:
    """What a member knows of its group when it enters ``split_sequence``."""

    place: int  # torch.distributed.get_rank(group)
    size: int  # torch.distributed.get_world_size(group)


def membership(group) -> Membership:
    place = dist.get_rank(group)
    if place < 0:
        raise ValueError(
            f"split_sequence: this rank ({dist.get_rank()}) is not in the group it was given: "
            "pass the group of the micro-batch's ranks (SequenceParallelGroups.of(mb))"
        )
    return Membership(place, dist.get_world_size(group))


def _shape_of(t: torch.Tensor | None) -> list[int]:
    if t is None:
        return [-1] + [0] * (_SHAPE - 1)
    leading = list(t.shape[:3]) + [0] * (3 - min(t.ndim, 3))
    return [t.ndim, *leading, math.prod(t.shape[3:])]


def _sums_of(t: torch.Tensor | None, device) -> torch.Tensor:
    """The L2 norm of ``t`` and its per-row and per-column sums projected on fixed sequences in
    [-1, 1] (which see a change of any row or column, and of their order), on ``t``'s
    device."""
    if t is None:
        return torch.zeros(_SUMS, dtype=torch.float64, device=device)
    t = t.detach()
    if not t.is_floating_point():
        t = t.float()
    # float32 sums, or float64 for float64 inputs (the norm refuses to narrow).
    acc = torch.float64 if t.dtype == torch.float64 else torch.float32
    rows = t.reshape(-1, t.shape[-1]) if t.ndim else t.reshape(1, 1)
    projections = []
    for sums in (rows.sum(-1, dtype=acc), rows.sum(0, dtype=acc)):
        i = torch.arange(sums.numel(), device=t.device, dtype=acc)
        projections += [(sums * torch.cos(i * f)).sum() for f in _FREQUENCIES]
    norm = torch.linalg.vector_norm(t, dtype=acc)
    return torch.stack([norm, *projections]).to(device, torch.float64)


def _fingerprint(config, inputs, device) -> torch.Tensor:
    mine = config.membership
    head = [config.degree, config.member, mine.place, mine.size, int(config.refused is None)]
    shapes = [v for t in inputs for v in _shape_of(t)]
    static = torch.tensor(head + shapes, dtype=torch.float64, device=device)
    return torch.cat([static, *(_sums_of(t, device) for t in inputs)])


def _verdict(rows: torch.Tensor) -> tuple[type, str] | None:
    """The error every member raises from the gathered fingerprints (``(size, FINGERPRINT)``,
    row j: the member at place j), or None."""
    size = rows.shape[0]
    for j in range(size):
        degree, member, place, _, accepted = (int(v) for v in rows[j, :_HEAD].tolist())
        if member != place:
            return ValueError, (
                f"member {place} of the group passed member={member}: pass each rank's place "
                "in the group (torch.distributed.get_rank(group); MicroBatch.member)"
            )
        if degree != size:
            return ValueError, (
                f"the group of {size} ranks is not the degree: member {place} passed "
                f"degree={degree} (pass the micro-batch's group of MicroBatch.degree ranks)"
            )
        if not accepted:
            return ValueError, f"member {place} refused the model (see its error)"
    differ = []
    sums_at = _HEAD + _SHAPE * len(INPUTS)
    for i, name in enumerate(INPUTS):
        shapes = [
            _shape(c) for c in rows[:, _HEAD + i * _SHAPE : _HEAD + (i + 1) * _SHAPE].tolist()
        ]
        if len(set(shapes)) > 1:
            per = ", ".join(f"{s} on member {j}" for j, s in enumerate(shapes))
            differ.append(f"{name} of shape {per}")
            continue
        sums = rows[:, sums_at + i * _SUMS : sums_at + (i + 1) * _SUMS]
        scale = sums[:, 0].abs().max() * RTOL + 1e-30
        if (sums - sums[0]).abs().max() > scale:
            differ.append(f"{name} (their checksums differ)")
    if differ:
        return RuntimeError, (
            "the members run different micro-batches: " + "; ".join(differ) + ". Every member "
            "of a group must run the same micro-batch (the same samples, timesteps and noise: "
            "draw them from a generator seeded alike on the group's ranks)"
        )
    return None


def _shape(col: list[float]) -> tuple | None:
    ndim = int(col[0])
    if ndim < 0:
        return None
    dims = [int(v) for v in col[1 : 1 + min(ndim, 3)]]
    return tuple(dims + ([int(col[4])] if ndim > 3 else []))


def check_same_micro_batch(config, hidden, text, temb) -> None:
    """The exchange at the first block of a split forward (every member calls it, with the
    inputs of its first block, at the first block of each forward): raises, on every member,
    what the members disagree on. ``config``: the block's ``SplitConfig``."""
    with torch.no_grad():
        fp = _fingerprint(config, (hidden, text, temb), hidden.device)
        rows = [torch.empty_like(fp) for _ in range(config.membership.size)]
        dist.all_gather(rows, fp, group=config.group)
        verdict = _verdict(torch.stack(rows).cpu())
    if config.refused is not None:
        raise config.refused
    if verdict is not None:
        kind, message = verdict
        raise kind(f"split_sequence: {message}")
