"""Batch samplers for ``torch.utils.data.DataLoader(batch_sampler=...)``.

``AdaptiveBatchSampler`` plans each epoch for all ranks at once in C++ (the same plan on
every rank, no communication) and yields this rank's micro-batches. Micro-batches
``[t*K, (t+1)*K)`` of every rank form optimizer step ``t``.

Nothing here may lose or repeat a sample silently. Three mechanisms carry that:

- **One plan fingerprint** (``_fingerprint``): everything that shapes a plan (sampler kind,
  a digest of the lengths and group keys, caps, cost model, lookahead, balance, drop_last,
  seed, ranks, K). A saved state carries it; a state of the same plan replays exactly, a
  state of other settings re-plans the samples not yet consumed, a state of another dataset
  is refused.
- **Ranks agree or fail** (``_verify_ranks``): with ``torch.distributed`` initialized, the
  ranks compare their fingerprints once per epoch, when the epoch's first pass starts.
- **Who draws the batches** (``_Consumer``): the sampler knows whether a DataLoader with
  workers, or accelerate, reads ahead of training, so that a position it cannot know is
  refused instead of guessed, and accelerate's sharding of batch samplers is served a
  stream it shards correctly.

Online refinement (``record_time``, ``update_cost_model``) replaces predicted costs by the
times training measured, per ``(seq_len, batch)`` kind, without breaking any of the three:
the ranks fold the same records in the same order, a new cost model takes effect only at
the next epoch, and a state carries the learned times.
"""

from __future__ import annotations

import hashlib
import math
import numbers
import operator
import sys
import warnings
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np
from torch.utils.data import Sampler

from adaptiveload import _sampler
from adaptiveload.cost import CostModel
from adaptiveload.memory import GIB, CheckpointPolicy, MemoryModel

_STATE_VERSION = 2
# A compute cap that never binds (equal-token buckets have none).
_NO_COST_CAP = 1e300
# Bounds that keep every sum of a plan within int64 (as the C++ core checks them,
# planner.h): tokens of one sample, max_tokens and all samples' tokens together, and
# micro-batches per step (num_replicas * micro_batches_per_step).
_MAX_LEN = 2**40 - 1
_MAX_TOKENS = 2**62
_MAX_STEP_MICRO_BATCHES = 2**20
# The default mix_tolerance: the predicted imbalance a window's steps may take on to mix the
# data's groups (docs/sampler.md, "Representative steps").
MIX_TOLERANCE = 0.02
# Online refinement: the most recent times kept per (seq_len, batch) kind, and the largest
# kind a cost model holds (as the C++ core checks them).
_LEARN_WINDOW = 32
_MAX_KIND_LEN, _MAX_KIND_BATCH = 2**40 - 1, 2**24 - 1


class MicroBatch(NamedTuple):
    """One batch of a loader, with where it stands in its optimizer step (``micro_batches``)."""

    #: what the loader yielded (the collated samples)
    batch: Any
    #: the optimizer step of the epoch's plan
    step: int
    #: this rank's micro-batch ``index`` of the step, ``0 <= index < count``
    index: int
    #: this rank's micro-batches in the step: K, or any count >= 1 with uneven counts
    count: int
    #: tokens and samples of the step over all ranks: the normalizers of a summed loss
    step_tokens: int
    step_samples: int

    @property
    def last(self) -> bool:
        """The rank's last micro-batch of the step: synchronize gradients and step here."""
        return self.index == self.count - 1


@dataclass
class Plan:
    """One epoch for all ranks. Micro-batch ``m = (step * W + rank) * K + k`` holds
    ``samples[offsets[m]:offsets[m+1]]``; ``costs[m]`` is its predicted cost and
    ``tokens[m]`` its token count.

    With uneven counts (``rank_offsets`` set), rank ``r`` takes any number >= 1 of step
    ``t``'s ``W * K`` micro-batches: ``m = rank_offsets[t * W + r] + k`` for
    ``k < micro_batches_in_step(t, r)``. Either way step ``t`` is micro-batches
    ``[t * W * K, (t + 1) * W * K)``."""

    num_replicas: int
    micro_batches_per_step: int
    num_steps: int
    samples: np.ndarray
    offsets: np.ndarray
    costs: np.ndarray
    tokens: np.ndarray
    padding: np.ndarray
    max_tokens: int
    max_cost: float | None
    num_padded_samples: int = 0
    num_dropped_samples: int = 0
    num_split_micro_batches: int = 0
    skipped: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    #: blocks checkpointed per micro-batch, with a memory policy (None without one)
    checkpointed: np.ndarray | None = None
    #: uneven counts only: ``num_steps * W + 1`` micro-batch ids, those of (step t, rank r)
    #: from ``rank_offsets[t * W + r]`` to ``rank_offsets[t * W + r + 1]``
    rank_offsets: np.ndarray | None = None
    #: balanced plans only: per window of ``lookahead_steps`` steps, the cost strata its steps
    #: were mixed from (1: the whole window mixed; its step count: steps of similar cost)
    window_strata: np.ndarray | None = None

    @property
    def uneven_counts(self) -> bool:
        return self.rank_offsets is not None

    @property
    def num_micro_batches(self) -> int:
        return len(self.offsets) - 1

    @property
    def micro_batches_per_rank(self) -> int:
        """``num_steps * K``: each rank's micro-batches, or their average with uneven counts
        (``num_rank_micro_batches(rank)`` gives a rank's own)."""
        return self.num_steps * self.micro_batches_per_step

    def micro_batches_in_step(self, step: int, rank: int) -> int:
        """Micro-batches of ``rank`` in ``step``: K, or any count >= 1 with uneven counts."""
        if self.rank_offsets is None:
            return self.micro_batches_per_step
        t = step * self.num_replicas + rank
        return int(self.rank_offsets[t + 1] - self.rank_offsets[t])

    def rank_step_starts(self, rank: int) -> np.ndarray:
        """``num_steps + 1`` positions in ``rank``'s stream: its micro-batches before each
        step, and in all."""
        if self.rank_offsets is None:
            return np.arange(self.num_steps + 1, dtype=np.int64) * self.micro_batches_per_step
        w = self.num_replicas
        counts = self.rank_offsets[rank + 1 :: w] - self.rank_offsets[rank:-1:w]
        return np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)

    def num_rank_micro_batches(self, rank: int) -> int:
        return int(self.rank_step_starts(rank)[-1])

    def micro_batch_id(self, step: int, rank: int, k: int = 0) -> int:
        """Index ``m`` (into ``costs``, ``tokens``, ``offsets``) of ``rank``'s ``k``-th
        micro-batch of ``step``."""
        t = step * self.num_replicas + rank
        if self.rank_offsets is None:
            return t * self.micro_batches_per_step + k
        return int(self.rank_offsets[t]) + k

    def micro_batch(self, step: int, rank: int, k: int = 0) -> np.ndarray:
        m = self.micro_batch_id(step, rank, k)
        return self.samples[self.offsets[m] : self.offsets[m + 1]]

    def rank_micro_batches(self, rank: int, start: int = 0) -> Iterator[np.ndarray]:
        """This rank's micro-batches in order, step after step, from the ``start``-th."""
        starts = self.rank_step_starts(rank)
        step = int(np.searchsorted(starts, start, side="right")) - 1
        for t in range(max(step, 0), self.num_steps):
            for k in range(max(start - int(starts[t]), 0), int(starts[t + 1] - starts[t])):
                yield self.micro_batch(t, rank, k)

    def rank_sums(self, values: np.ndarray) -> np.ndarray:
        """Sums of ``values`` (one per micro-batch) per step and rank, shape (num_steps, W), in
        either layout (``rank_sums(np.ones(num_micro_batches))``: the counts)."""
        if self.rank_offsets is None:
            return values.reshape(
                self.num_steps, self.num_replicas, self.micro_batches_per_step
            ).sum(axis=2)
        sums = np.add.reduceat(values, self.rank_offsets[:-1]) if len(values) else values
        return sums.reshape(self.num_steps, self.num_replicas)

    def rank_costs(self) -> np.ndarray:
        """Predicted cost of each rank in each step, shape (num_steps, W)."""
        return self.rank_sums(self.costs)

    def step_tokens(self) -> np.ndarray:
        """Tokens of each step over all ranks, shape (num_steps,): the normalizer of a loss
        summed over tokens, the same on every rank."""
        return self.rank_sums(self.tokens).sum(axis=1)

    def step_samples(self) -> np.ndarray:
        """Samples of each step over all ranks (padding repeats included), shape (num_steps,)."""
        return self.rank_sums(self.micro_batch_sizes()).sum(axis=1)

    def micro_batch_sizes(self) -> np.ndarray:
        return np.diff(self.offsets)

    def consumed(self, micro_batches_done: int, n: int) -> np.ndarray:
        """Samples of the first ``micro_batches_done`` micro-batches of every rank (padding
        repeats excluded), as ``n`` flags."""
        if micro_batches_done <= 0:
            return np.zeros(n, dtype=bool)
        w, k = self.num_replicas, self.micro_batches_per_step
        i = np.arange(micro_batches_done, dtype=np.int64)
        ranks = np.arange(w, dtype=np.int64)
        slots = (((i // k)[:, None] * w + ranks[None, :]) * k + (i % k)[:, None]).ravel()
        return self._sample_flags(slots, n)

    def consumed_steps(self, steps_done: int, n: int) -> np.ndarray:
        """Samples of the first ``steps_done`` steps of all ranks (padding repeats excluded),
        as ``n`` flags: micro-batches ``[0, steps_done * W * K)``, in either layout."""
        end = steps_done * self.num_replicas * self.micro_batches_per_step
        return self._sample_flags(np.arange(end, dtype=np.int64), n)

    def _sample_flags(self, slots: np.ndarray, n: int) -> np.ndarray:
        """``n`` flags, set for the samples of micro-batches ``slots`` (padding repeats
        excluded)."""
        out = np.zeros(n, dtype=bool)
        slots = slots[self.padding[slots] == 0]
        sizes = self.offsets[slots + 1] - self.offsets[slots]
        within = np.arange(sizes.sum()) - np.repeat(np.cumsum(sizes) - sizes, sizes)
        out[self.samples[np.repeat(self.offsets[slots], sizes) + within]] = True
        return out


# -- argument checks --------------------------------------------------------------------------


def _to_numpy(values, name: str) -> np.ndarray:
    """A numpy array of a list, array or tensor of any dtype and device (bf16 and fp16
    tensors as float64, which holds them exactly)."""
    try:
        import torch

        if isinstance(values, torch.Tensor):
            t = values.detach().cpu()
            if t.dtype in (torch.bfloat16, torch.float16):
                t = t.double()
            return t.numpy()
    except ImportError:  # pragma: no cover
        pass
    if isinstance(values, np.ndarray):
        return values
    if isinstance(values, str | bytes) or not hasattr(values, "__len__"):
        raise ValueError(f"{name} must be a sequence, array or tensor, got {type(values).__name__}")
    try:
        return np.asarray(values)
    except ValueError:  # ragged nested lists
        return np.asarray(list(values), dtype=object)


def _as_seq_lens(seq_lens) -> np.ndarray:
    a = _to_numpy(seq_lens, "seq_lens")
    if a.dtype.kind in "US" and not isinstance(seq_lens, np.ndarray):
        a = np.asarray(list(seq_lens), dtype=object)  # report the first non-number as given
    if a.ndim != 1:
        raise ValueError(
            f"seq_lens must be 1-D (one length per dataset index), got shape {a.shape}"
        )
    if a.dtype.kind == "O":
        for i, v in enumerate(a):
            if isinstance(v, bool) or not isinstance(v, numbers.Real):
                raise ValueError(f"seq_lens[{i}] = {v!r} is not an integer token count")
            if not (isinstance(v, numbers.Integral) or float(v).is_integer()):
                raise ValueError(f"seq_lens[{i}] = {v!r} is not an integer token count")
            if int(v) > _MAX_LEN:
                raise ValueError(
                    f"seq_lens[{i}] = {int(v)} is larger than any supported token count (2^40 - 1)"
                )
        a = np.array([int(v) for v in a], dtype=np.int64)
    if a.dtype.kind == "b" or a.dtype.kind not in "iuf":
        raise ValueError(f"seq_lens must hold integers, got dtype {a.dtype}")
    if a.dtype.kind in "iu" and a.size and a.max() > _MAX_LEN:
        i = int(np.flatnonzero(a > _MAX_LEN)[0])
        raise ValueError(
            f"seq_lens[{i}] = {int(a[i])} is larger than any supported token count (2^40 - 1)"
        )
    if a.dtype.kind == "f":
        bad = ~np.isfinite(a) | (a != np.floor(np.where(np.isfinite(a), a, 0))) | (a > 2**53)
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise ValueError(f"seq_lens[{i}] = {a[i].item()!r} is not an integer token count")
    if a.size and a.min() < 1:
        i = int(np.flatnonzero(a < 1)[0])
        raise ValueError(f"seq_lens[{i}] = {a[i].item()!r}: token counts must be >= 1")
    if a.dtype.kind == "f" and a.size and a.max() > _MAX_LEN:
        i = int(np.flatnonzero(a > _MAX_LEN)[0])
        raise ValueError(
            f"seq_lens[{i}] = {a[i].item()!r} is larger than any supported token count (2^40 - 1)"
        )
    a = np.ascontiguousarray(a, dtype=np.int64)
    if a.sum(dtype=np.float64) > _MAX_TOKENS:  # each <= 2^40, so a float sum is exact enough
        raise ValueError(
            f"seq_lens hold {a.sum(dtype=np.float64):.4g} tokens in all, more than the 2^62 a "
            "plan's int64 sums hold"
        )
    return a


def _as_group_ids(group_keys, seq_lens: np.ndarray) -> np.ndarray:
    """Dense int64 ids, numbered in sorted key order, so that the same keys plan alike in
    any container: a 1-D array, tensor or list of keys, or an ``(n, k)`` array, tensor or
    list of tuples (e.g. ``(frames, height, width)``)."""
    n = len(seq_lens)
    a = _to_numpy(group_keys, "group_keys")
    if a.ndim == 0 or len(a) != n:
        got = "a scalar" if a.ndim == 0 else f"{len(a)} entries"
        raise ValueError(f"group_keys must have one key per sample ({n}), got {got}")
    if a.ndim > 2:
        raise ValueError(f"group_keys must be 1-D or (n, k), got shape {a.shape}")
    if a.dtype.kind in "biufUS":
        ids = np.unique(a, axis=0 if a.ndim == 2 else None, return_inverse=True)[1]
        return np.ascontiguousarray(ids.reshape(-1), dtype=np.int64)
    # Arbitrary hashable keys: sorted when they sort, else numbered by first appearance.
    keys = [tuple(k) if isinstance(k, list | np.ndarray) else k for k in a]
    try:
        order = {k: i for i, k in enumerate(sorted(set(keys)))}
    except TypeError:
        order = {}
        for k in keys:
            order.setdefault(k, len(order))
    return np.fromiter((order[k] for k in keys), dtype=np.int64, count=n)


def _int_arg(name: str, value, low: int, high: int | None = None) -> int:
    what = f"an integer >= {low}" if high is None else f"an integer in [{low}, {high}]"
    if isinstance(value, bool | np.bool_):
        raise ValueError(f"{name} must be {what}, got {value!r}")
    try:
        v = operator.index(value)
    except TypeError:
        raise ValueError(f"{name} must be {what}, got {value!r}") from None
    if v < low or (high is not None and v > high):
        raise ValueError(f"{name} must be {what}, got {value!r}")
    return int(v)


def _bool_arg(name: str, value) -> bool:
    if not isinstance(value, bool | np.bool_):
        raise ValueError(f"{name} must be True or False, got {value!r}")
    return bool(value)


def _distributed_defaults(num_replicas, rank, process_group) -> tuple[int, int]:
    if num_replicas is None or rank is None or process_group is not None:
        import torch.distributed as dist

        initialized = dist.is_available() and dist.is_initialized()
        if process_group is not None and not initialized:
            raise ValueError("process_group given but torch.distributed is not initialized")
        group_size = dist.get_world_size(process_group) if initialized else 1
        group_rank = dist.get_rank(process_group) if initialized else 0
        if process_group is not None:
            for name, given, actual in (
                ("num_replicas", num_replicas, group_size),
                ("rank", rank, group_rank),
            ):
                if given is not None and given != actual:
                    raise ValueError(
                        f"{name}={given!r} disagrees with process_group ({name} {actual} there)"
                    )
        num_replicas = group_size if num_replicas is None else num_replicas
        rank = group_rank if rank is None else rank
    num_replicas = _int_arg("num_replicas", num_replicas, 1)
    rank = _int_arg("rank", rank, 0)
    if rank >= num_replicas:
        raise ValueError(f"rank must be in [0, {num_replicas}), got {rank!r}")
    return num_replicas, rank


def _pack(flags: np.ndarray) -> bytes:
    return np.packbits(flags).tobytes()


def _state_count(state: dict, key: str) -> int:
    v = state[key]
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise ValueError(f"sampler state: {key!r} must be an integer >= 0, got {v!r}")
    return v


def _unpack(state: dict, key: str, n: int) -> np.ndarray:
    raw = state[key]
    if not isinstance(raw, bytes | bytearray):
        raise ValueError(f"sampler state: {key!r} must be bytes, got {type(raw).__name__}")
    if len(raw) != (n + 7) // 8:
        raise ValueError(
            f"sampler state: {key!r} has {len(raw)} bytes, {(n + 7) // 8} expected for {n} samples"
        )
    bits = np.unpackbits(np.frombuffer(bytes(raw), dtype=np.uint8))
    if bits[n:].any():
        raise ValueError(f"sampler state: {key!r} has bits set past sample {n - 1}")
    return bits[:n].astype(bool)


def _positive_ms(value) -> bool:
    return (
        isinstance(value, numbers.Real)
        and not isinstance(value, bool | np.bool_)
        and math.isfinite(value)
        and value > 0
    )


def _state_kind(entry, what: str) -> tuple[int, int]:
    s, b = entry[0], entry[1]
    for name, v, top in (("seq_len", s, _MAX_KIND_LEN), ("batch", b, _MAX_KIND_BATCH)):
        if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= top:
            raise ValueError(f"sampler state: {what}: {name} = {v!r} is not valid")
    return s, b


# Measured kinds from which online refinement also refits the fitted form.
_REFIT_MIN_KINDS = 8


def _refit(kinds: dict, base: CostModel) -> CostModel:
    """``fit_cost_model`` on measured kinds ``{(seq_len, batch): ms}``, coefficients rounded
    to 6 significant digits; ``base`` if they cannot be fitted."""
    from adaptiveload.fit import Point, fit_cost_model

    try:
        fitted = fit_cost_model([Point(b, s, ms, 0) for (s, b), ms in kinds.items()])
    except ValueError:
        return base
    d = fitted.to_dict()
    for key in ("c0", "c1", "c2", "per_sample"):
        d[key] = float(f"{d[key]:.6g}")
    if "floor" in d:
        d["floor"] = {k: float(f"{v:.6g}") for k, v in d["floor"].items()}
    d["meta"] = {**base.meta, "refit": fitted.meta.get("form")}
    return CostModel.from_dict(d, source="refit")


def _unpack_learned(state: dict) -> tuple[dict, dict]:
    """The learned times of a state: ``(active, history)``, both keyed by ``(seq_len,
    batch)``; a state without ``'learned_costs'`` learned nothing."""
    learned = state.get("learned_costs")
    if learned is None:
        return {}, {}
    if not isinstance(learned, dict) or set(learned) != {"active", "history"}:
        raise ValueError(
            "sampler state: 'learned_costs' must be a dict with keys 'active' and 'history'"
        )
    out = []
    for key, times_of in (("active", lambda e: [e[2]]), ("history", lambda e: e[2])):
        entries = learned[key]
        if not isinstance(entries, list):
            raise ValueError(f"sampler state: 'learned_costs'[{key!r}] must be a list")
        kinds = {}
        for entry in entries:
            what = f"'learned_costs'[{key!r}] entry {entry!r}"
            if not isinstance(entry, list | tuple) or len(entry) != 3:
                raise ValueError(f"sampler state: {what} is not [seq_len, batch, ms]")
            kind = _state_kind(entry, what)
            times = times_of(entry)
            if (
                not isinstance(times, list | tuple)
                or not 1 <= len(times) <= _LEARN_WINDOW
                or not all(_positive_ms(t) for t in times)
            ):
                raise ValueError(f"sampler state: {what}: times must be finite numbers > 0")
            if kind in kinds:
                raise ValueError(f"sampler state: {what}: kind given twice")
            kinds[kind] = float(times[0]) if key == "active" else [float(t) for t in times]
        out.append(kinds)
    return out[0], out[1]


def _lower_median(times) -> float:
    """The median of ``times``, the lower middle value for an even count: of two records, a
    cold first run (always the slower) does not count."""
    ordered = sorted(times)
    return ordered[(len(ordered) - 1) // 2]


# -- collectives ------------------------------------------------------------------------------

# The sampler's collectives, named as messages name them.
_COLLECTIVES = {
    "verify_ranks": "started an epoch (iter(sampler), whose plan check is a collective)",
    "update_cost_model": "called update_cost_model()",
}


def _all_gather(call: str, payload, owner: str, process_group=None) -> list:
    """``all_gather_object`` of ``payload`` tagged with the sampler's ``call``: where one rank
    is in another of the sampler's collectives (it skipped ``update_cost_model``, say), every
    rank fails naming what each called, instead of pairing the two calls' payloads."""
    import torch.distributed as dist

    gathered: list = [None] * dist.get_world_size(process_group)
    dist.all_gather_object(gathered, (call, payload), group=process_group)
    calls = [g[0] if isinstance(g, tuple) and len(g) == 2 else repr(g) for g in gathered]
    if any(c != call for c in calls):
        who = "; ".join(f"rank {r} {_COLLECTIVES.get(c, c)}" for r, c in enumerate(calls[:8]))
        who += " ..." if len(calls) > 8 else ""
        raise RuntimeError(
            f"{owner}: the ranks are not in the same collective call: {who}. "
            "update_cost_model() is a collective: every rank must call it at the same point "
            "(e.g. at each epoch's end), and every rank must iterate its sampler each epoch"
        )
    return [g[1] for g in gathered]


# -- who draws the batches ---------------------------------------------------------------------


def _is_accelerate(obj, qualname: str) -> bool:
    """Whether ``obj`` is an instance of accelerate's class ``qualname``."""
    kind = type(obj)
    return kind.__module__.startswith("accelerate.") and kind.__qualname__ == qualname


@dataclass
class _Consumer:
    """Who called ``iter(sampler)``: a name for messages, whether it reads batches ahead of
    the training loop, and accelerate's ``BatchSamplerShard`` when that is the caller."""

    name: str
    reads_ahead: bool
    shard: object | None = None

    @staticmethod
    def of(frame) -> _Consumer:
        caller = frame.f_locals.get("self") if frame is not None else None
        if _is_accelerate(caller, "BatchSamplerShard"):
            return _Consumer("accelerate's BatchSamplerShard", True, caller)
        # accelerate wrappers further up the stack (device placement reads one batch ahead;
        # the dispatcher iterates on process 0 only and splits batches evenly).
        up = frame
        for _ in range(12):
            if up is None:
                break
            obj = up.f_locals.get("self")
            if _is_accelerate(obj, "DataLoaderDispatcher"):
                raise RuntimeError(
                    "AdaptiveBatchSampler under accelerate with dispatch_batches=True: accelerate "
                    "would iterate it on process 0 only and split those batches evenly across "
                    "processes, losing the other ranks' samples. Use "
                    "adaptiveload.integrations.accelerate.prepare_data_loader(accelerator, loader) "
                    "(or DataLoaderConfiguration(dispatch_batches=False))."
                )
            if type(obj).__module__.startswith("accelerate."):
                return _Consumer("an accelerate DataLoader (it reads one batch ahead)", True)
            up = up.f_back
        workers = getattr(caller, "_num_workers", None)
        module = type(caller).__module__
        if workers is not None and module.startswith(("torch.utils.data", "torchdata.")):
            if workers > 0:
                prefetch = getattr(caller, "_prefetch_factor", 2) or 2
                return _Consumer(
                    f"a DataLoader with {workers} workers (it prefetches up to "
                    f"{prefetch * workers} batches)",
                    True,
                )
            return _Consumer("a DataLoader without workers", False)
        return _Consumer("direct iteration", False)


def _called_by_torchdata(frame) -> bool:
    """torchdata's StatefulDataLoader snapshots ``state_dict()`` exactly when the sampler
    has handed out as many batches as the loader will have yielded at that snapshot."""
    name = frame.f_globals.get("__name__", "") if frame is not None else ""
    return name.startswith("torchdata.stateful_dataloader")


# -- the samplers -----------------------------------------------------------------------------


class _PlannedBatchSampler(Sampler[list[int]]):
    """Common machinery: validation, per-epoch planning, iteration and resumption."""

    def __init__(
        self,
        seq_lens,
        max_tokens: int,
        *,
        max_cost: float | None,
        cost_model: CostModel | None,
        group_keys,
        num_replicas: int | None,
        rank: int | None,
        process_group,
        micro_batches_per_step: int,
        shuffle: bool,
        seed: int,
        drop_last: bool,
        balance: bool,
        lookahead_steps: int,
        on_oversize: str,
        verify_ranks: bool,
        max_batch_size: int | None = None,
        memory_model: MemoryModel | None = None,
        memory_budget_gib: float | None = None,
        uneven_counts: bool = False,
        mix_tolerance: float = 0.0,
    ):
        self.seq_lens = _as_seq_lens(seq_lens)
        if (memory_model is None) != (memory_budget_gib is None):
            raise ValueError(
                "memory_model and memory_budget_gib go together: give both (the policy "
                "checkpoints blocks per micro-batch) or neither"
            )
        if memory_model is not None and not isinstance(memory_model, MemoryModel):
            raise ValueError(
                f"memory_model must be an adaptiveload.MemoryModel, got {memory_model!r}"
            )
        self.memory_model = memory_model
        self.memory_budget_gib = None
        if memory_budget_gib is not None:
            if not (
                isinstance(memory_budget_gib, numbers.Real)
                and not isinstance(memory_budget_gib, bool)
                and math.isfinite(memory_budget_gib)
                and memory_budget_gib > 0
            ):
                raise ValueError(
                    f"memory_budget_gib must be a finite number > 0, got {memory_budget_gib!r}"
                )
            self.memory_budget_gib = float(memory_budget_gib)
            if max_tokens is None:
                # Memory is the budget's: the most tokens one sample may hold at full
                # checkpointing, which no micro-batch the budget admits exceeds.
                max_tokens = max(1, memory_model.max_tokens(self.memory_budget_gib * GIB))
        elif max_tokens is None:
            raise ValueError("max_tokens is required unless a memory_model and budget are given")
        self.max_tokens = _int_arg("max_tokens", max_tokens, 1, _MAX_TOKENS)
        self.max_batch_size = (
            None if max_batch_size is None else _int_arg("max_batch_size", max_batch_size, 1)
        )
        if max_cost is not None and not (
            isinstance(max_cost, numbers.Real)
            and not isinstance(max_cost, bool)
            and math.isfinite(max_cost)
            and max_cost > 0
        ):
            raise ValueError(f"max_cost must be a finite number > 0 or None, got {max_cost!r}")
        if cost_model is not None and not isinstance(cost_model, CostModel):
            raise ValueError(
                f"cost_model must be an adaptiveload.CostModel or None, got {cost_model!r}"
            )
        if on_oversize not in ("error", "skip"):
            raise ValueError(f"on_oversize must be 'error' or 'skip', got {on_oversize!r}")
        self.micro_batches_per_step = _int_arg("micro_batches_per_step", micro_batches_per_step, 1)
        self.lookahead_steps = _int_arg("lookahead_steps", lookahead_steps, 1)
        self.seed = _int_arg("seed", seed, 0)
        self.shuffle = _bool_arg("shuffle", shuffle)
        self.drop_last = _bool_arg("drop_last", drop_last)
        self.balance = _bool_arg("balance", balance)
        self.uneven_counts = _bool_arg("uneven_counts", uneven_counts)
        if self.uneven_counts and not self.balance:
            raise ValueError(
                "uneven_counts=True needs balance=True: without balancing every rank takes K "
                "micro-batches per step"
            )
        self.verify_ranks = _bool_arg("verify_ranks", verify_ranks)
        if not (
            isinstance(mix_tolerance, numbers.Real)
            and not isinstance(mix_tolerance, bool)
            and 0.0 <= mix_tolerance <= 1.0
        ):
            raise ValueError(f"mix_tolerance must be a number in [0, 1], got {mix_tolerance!r}")
        self.mix_tolerance = float(mix_tolerance)
        self.on_oversize = on_oversize
        self._base_cost_model = cost_model if cost_model is not None else CostModel.default()
        self.cost_model = self._base_cost_model  # the current epoch's: base + learned kinds
        self.num_replicas, self.rank = _distributed_defaults(num_replicas, rank, process_group)
        if self.num_replicas * self.micro_batches_per_step > _MAX_STEP_MICRO_BATCHES:
            raise ValueError(
                f"num_replicas * micro_batches_per_step must be <= 2^20 (micro-batches per "
                f"optimizer step), got {self.num_replicas} * {self.micro_batches_per_step}"
            )
        # None: the sequence length is the key (the C++ table numbers lengths in sorted order,
        # as these ids are numbered).
        self._group_ids = None if group_keys is None else _as_group_ids(group_keys, self.seq_lens)
        self.group_keys = self._group_ids
        self._max_cost_arg = None if max_cost is None else float(max_cost)
        h = hashlib.blake2b(digest_size=16)
        h.update(self.seq_lens.tobytes())
        h.update(b"by length" if self._group_ids is None else self._group_ids.tobytes())
        self._data_digest = h.hexdigest()
        self._build_table()
        self._refuse_oversize()

        self.epoch = 0
        self._excluded: np.ndarray | None = None  # samples left out of this epoch's plan
        self._start = 0  # micro-batch of this rank's stream where the next pass starts
        self._plan: Plan | None = None
        self._pass = "ready"  # "ready" (no pass begun), "running" or "done"
        self._position = 0  # micro-batches handed out, counted from the plan's start
        self._consumer = _Consumer("direct iteration", False)
        self._resume_pending = False
        self._verified: tuple | None = None
        self._warned_skips = False
        self._warned_repeat = -1
        # Online refinement, per (seq_len, batch) kind: this rank's records since the last
        # update ([count, the most recent ms]); the most recent ms of all ranks, folded; their
        # medians for the next epoch; the medians the current epoch plans with.
        self._records: dict[tuple[int, int], list] = {}
        self._learned_history: dict[tuple[int, int], list[float]] = {}
        self._learned_pending: dict[tuple[int, int], float] = {}
        self._learned_active: dict[tuple[int, int], float] = {}
        self._warned_scale = False
        self._warned_held: set[tuple[int, int]] = set()

    # -- construction helpers, also used after unpickling ---------------------------------
    def _build_table(self) -> None:
        """The C++ sample table of ``self.cost_model``, and the compute cap it gives."""
        if self.memory_model is None:
            self._table = _sampler.SampleTable(
                self.seq_lens, self._group_ids, self.cost_model._core
            )
        else:
            self._table = _sampler.SampleTable(
                self.seq_lens,
                self._group_ids,
                self.cost_model._core,
                self.memory_model._core,
                self.memory_budget_gib * GIB,
            )
        self._max_cost = self._compute_max_cost()

    def _compute_max_cost(self) -> float:
        raise NotImplementedError

    def _refuse_oversize(self) -> None:
        if self.on_oversize != "error":
            return
        over = self._table.oversize_samples(self.max_tokens, self._max_cost)
        if len(over) == 0:
            return
        i = int(over[0])
        cost = float(self._table.batch_cost(np.array([i], np.int64)))
        cap = f"max_tokens = {self.max_tokens}"
        if (
            self.memory_model is not None
            and self._table.checkpointed_blocks(np.array([i], np.int64)) < 0
        ):
            peak = self.memory_model.peak_bytes([self.seq_lens[i]], self.memory_model.num_blocks)
            margin = self.memory_model.margin
            cap = (
                f"the memory budget of {self.memory_budget_gib:g} GiB (predicted peak with every "
                f"block checkpointed {peak / GIB:.2f} GiB, {peak * (1 + margin) / GIB:.2f} GiB "
                f"with the margin of {margin:g})"
            )
        elif self.seq_lens[i] <= self.max_tokens:
            cap = f"max_cost = {self._max_cost:.6g} (its predicted cost {cost:.6g})"
        raise ValueError(
            f"{type(self).__name__}: {len(over)} sample(s) exceed a cap on their own, the first "
            f"at index {i} with {int(self.seq_lens[i])} tokens, over {cap}: raise the cap, or "
            f"leave such samples out with on_oversize='skip'"
        )

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        del state["_table"]
        state["_plan"] = None
        state["_consumer"] = _Consumer("direct iteration", False)
        return state

    def __setstate__(self, state: dict) -> None:
        state.setdefault("uneven_counts", False)  # pickled before the options
        state.setdefault("mix_tolerance", 0.0)
        self.__dict__.update(state)
        self._build_table()

    # -- planning -----------------------------------------------------------------------
    def _fingerprint(self) -> dict:
        """Everything that shapes a plan, except the epoch and the position in it."""
        cost = self.cost_model.to_dict()
        cost.pop("meta", None)
        return {
            "sampler": type(self).__name__,
            "num_samples": len(self.seq_lens),
            "data": self._data_digest,
            "max_tokens": self.max_tokens,
            "max_cost": self._max_cost,
            "cost_model": cost,
            "num_replicas": self.num_replicas,
            "micro_batches_per_step": self.micro_batches_per_step,
            "shuffle": self.shuffle,
            "seed": self.seed,
            "drop_last": self.drop_last,
            "balance": self.balance,
            "lookahead_steps": self.lookahead_steps,
            "on_oversize": self.on_oversize,
            # Only when set, so that states saved before the options still match.
            **({"max_batch_size": self.max_batch_size} if self.max_batch_size else {}),
            **({"uneven_counts": True} if self.uneven_counts else {}),
            **({"mix_tolerance": self.mix_tolerance} if self.balance else {}),
            **(
                {
                    "memory_model": self.memory_model.to_dict() | {"meta": {}},
                    "memory_budget_gib": self.memory_budget_gib,
                }
                if self.memory_model is not None
                else {}
            ),
        }

    def _plan_epoch(self, excluded: np.ndarray | None) -> dict:
        return _sampler.plan_epoch(
            self._table,
            self.max_tokens,
            float(self._max_cost),
            self.num_replicas,
            self.micro_batches_per_step,
            self.shuffle,
            self.seed,
            self.epoch,
            self.drop_last,
            self.balance,
            self.lookahead_steps,
            self.on_oversize == "skip",
            None if excluded is None else excluded.view(np.uint8),
            self.max_batch_size or 0,
            self.uneven_counts,
            self.mix_tolerance,
        )

    def plan(self) -> Plan:
        """The whole current epoch for all ranks (cached until ``set_epoch`` or a resume)."""
        if self._plan is None:
            raw = self._plan_epoch(self._excluded)
            self._plan = Plan(
                max_tokens=self.max_tokens,
                max_cost=self._reported_max_cost(),
                **{k: (int(v) if isinstance(v, int) else v) for k, v in raw.items()},
            )
            if len(self._plan.skipped) and not self._warned_skips:
                self._warned_skips = True
                warnings.warn(
                    f"{type(self).__name__}: skipped {len(self._plan.skipped)} sample(s) that alone "
                    f"exceed a cap (first: index {int(self._plan.skipped[0])}, "
                    f"{int(self.seq_lens[self._plan.skipped[0]])} tokens)",
                    stacklevel=2,
                )
        return self._plan

    def _reported_max_cost(self) -> float | None:
        return self._max_cost

    def _verify_ranks(self) -> None:
        """All ranks must plan the same epoch: compare fingerprints (one all-gather per epoch)."""
        if not self.verify_ranks:
            return
        import torch.distributed as dist

        if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() < 2:
            return
        resume = "none"
        if self._excluded is not None or self._start:
            h = hashlib.blake2b(self._excluded.tobytes() if self._excluded is not None else b"")
            # With uneven counts the ranks' stream positions differ; their step does not.
            at = f"step {self.start_step}" if self.uneven_counts else self._start
            resume = f"{h.hexdigest()[:16]}@{at}"
        mine = self._fingerprint() | {"epoch": self.epoch, "resume": resume}
        key = tuple(sorted((k, repr(v)) for k, v in mine.items()))
        if self._verified == key:
            return
        gathered = _all_gather("verify_ranks", mine, type(self).__name__)
        # Over every rank's keys: a setting only some ranks have (max_batch_size) must fail
        # on every rank, not only on those that have it.
        keys = list(mine) + sorted(set().union(*gathered) - set(mine))
        differ = [k for k in keys if any(g.get(k) != mine.get(k) for g in gathered)]
        if differ:
            what = {
                "data": "the dataset (sequence lengths or group keys)",
                "resume": "the resumed position (load_state_dict of another state)",
            }
            lines = [
                f"  {k} ({what.get(k, 'setting')}): "
                + ", ".join(f"rank {r}: {g.get(k)!r}" for r, g in enumerate(gathered[:8]))
                + (" ..." if len(gathered) > 8 else "")
                for k in differ
            ]
            raise RuntimeError(
                f"{type(self).__name__}: the ranks would plan different epochs, losing or "
                "repeating samples (or hanging at unequal step counts). Give every rank the same "
                "data and settings (a per-rank seed is a common cause). Differences:\n"
                + "\n".join(lines)
            )
        self._verified = key

    # -- memory policy ------------------------------------------------------------------
    def checkpointed_blocks(self, indices) -> int:
        """Blocks to run with activation checkpointing for this micro-batch (the plan's
        choice; needs a memory model). Depends only on the samples' count and tokens, so
        ``memory_policy().blocks_for(seq_lens)`` gives the same where only lengths are known.
        Samples that do not fit the budget even with every block checkpointed (no plan holds
        them together) raise ``ValueError``."""
        if self.memory_model is None:
            raise ValueError("checkpointed_blocks needs a sampler made with memory_model")
        idx = _to_numpy(indices, "indices")
        if idx.ndim != 1 or idx.size == 0 or idx.dtype.kind not in "iu":
            raise ValueError(f"indices must be a non-empty 1-D list of integers, got {indices!r}")
        n = len(self.seq_lens)
        if idx.min() < 0 or idx.max() >= n:
            raise ValueError(f"indices must be in [0, {n}), got {indices!r}")
        blocks = int(self._table.checkpointed_blocks(idx.astype(np.int64)))
        if blocks < 0:
            lens = self.seq_lens[idx]
            peak = self.memory_model.peak_bytes(lens, self.memory_model.num_blocks)
            raise ValueError(
                f"checkpointed_blocks: these {idx.size} sample(s) ({int(lens.sum())} tokens) do "
                f"not fit the memory budget of {self.memory_budget_gib:g} GiB even with every "
                f"block checkpointed (predicted peak {peak / GIB:.3g} GiB, "
                f"{peak * (1 + self.memory_model.margin) / GIB:.3g} GiB with the margin): no "
                "plan holds such a micro-batch"
            )
        return blocks

    def memory_policy(self, log=None, reserved_gib: float = 0.0) -> CheckpointPolicy:
        """A ``CheckpointPolicy`` for the training loop: the plan's choice per micro-batch, the
        fallback to full checkpointing after an out-of-memory error, peaks against the budget
        (plus ``reserved_gib``, memory the model's calibration does not hold, such as the
        optimizer state the budget was reduced by)."""
        if self.memory_model is None:
            raise ValueError("memory_policy needs a sampler made with memory_model")
        return CheckpointPolicy(
            self.memory_model, self.memory_budget_gib, reserved_gib=reserved_gib, log=log
        )

    # -- online refinement --------------------------------------------------------------
    @property
    def base_cost_model(self) -> CostModel:
        """The cost model this sampler was made with; ``cost_model`` is it with the learned
        kinds of the current epoch."""
        return self._base_cost_model

    def record_time(self, indices, ms: float) -> bool:
        """Record the measured forward+backward time of one micro-batch this rank trained.

        Args:
            indices: the micro-batch as the sampler yielded it (list, array or tensor of
                dataset indices).
            ms: its time in milliseconds, a finite number > 0.

        Returns True when recorded: its kind is ``(seq_len, batch)`` when all its samples
        have ``seq_len`` tokens; a micro-batch of mixed lengths has no kind and is not
        recorded (False). No communication: ``update_cost_model`` folds the records.
        """
        if not _positive_ms(ms):
            raise ValueError(
                f"record_time: ms must be a finite number > 0 (milliseconds), got {ms!r}"
            )
        idx = _to_numpy(indices, "indices")
        n = len(self.seq_lens)
        if idx.ndim != 1 or idx.size == 0 or idx.dtype.kind not in "iu":
            raise ValueError(
                "record_time: indices must be a non-empty 1-D sequence of integer dataset "
                f"indices, got {indices!r}"
            )
        if idx.min() < 0 or idx.max() >= n:
            raise ValueError(f"record_time: indices must be in [0, {n}), got {indices!r}")
        lens = self.seq_lens[idx]
        seq_len = int(lens[0])
        if (lens != seq_len).any() or seq_len > _MAX_KIND_LEN or idx.size > _MAX_KIND_BATCH:
            return False
        if self.memory_model is not None:
            # The cost model describes fully checkpointed micro-batches; this one ran with the
            # policy's blocks, so it is recorded as what it would have taken with all of them.
            n = int(self._table.checkpointed_blocks(idx.astype(np.int64)))
            if n >= 0:
                ms = float(ms) / self.memory_model.time_factor(n)
        record = self._records.get((seq_len, idx.size))
        if record is None:
            record = self._records[(seq_len, idx.size)] = [0, deque(maxlen=_LEARN_WINDOW)]
        record[0] += 1
        record[1].append(float(ms))
        return True

    def update_cost_model(self, process_group=None) -> dict:
        """Fold the times recorded since the last update into the cost model of the next
        epoch.

        A collective when ``torch.distributed`` is initialized with more than one process:
        every rank must call it, at the same point (e.g. at each epoch's end), or the others
        wait for it (until the process group's timeout). The ranks' records are all-gathered
        (one ``all_gather_object`` on ``process_group``, default the whole job, which every
        rank that plans with this sampler's settings must be in) and folded in rank order,
        so every rank learns the same times. Per ``(seq_len, batch)`` kind the most recent
        32 times are kept; the kind's cost is their median (see ``_lower_median``).

        The new model is the base cost model whose measured kinds are updated by the learned
        ones. It takes effect at the next ``set_epoch`` to another epoch: the current
        epoch's plan never changes. A learned single-sample kind above a given ``max_cost``
        is held back (with a warning), so that refinement never changes which samples an
        epoch holds.

        Returns ``{"records": records folded (all ranks), "kinds": kinds learned, "new_kinds":
        kinds learned for the first time, "measured_over_fitted": median over the learned
        kinds of learned / fitted cost (None without kinds)}``.
        """
        import torch.distributed as dist

        initialized = dist.is_available() and dist.is_initialized()
        if process_group is not None and not initialized:
            raise ValueError(
                "update_cost_model: process_group given but torch.distributed is not initialized"
            )
        mine = {kind: (count, list(times)) for kind, (count, times) in self._records.items()}
        gathered = [mine]
        if initialized and dist.get_world_size(process_group) > 1:
            gathered = _all_gather(
                "update_cost_model", mine, f"{type(self).__name__}.update_cost_model", process_group
            )
        self._records = {}
        folded = 0
        for records in gathered:
            for kind in sorted(records):
                count, times = records[kind]
                folded += count
                history = self._learned_history.get(kind, []) + times
                self._learned_history[kind] = history[-_LEARN_WINDOW:]
        before = set(self._learned_pending)
        self._learned_pending = {
            kind: _lower_median(times) for kind, times in sorted(self._learned_history.items())
        }
        _, held = self._refined_model(self._learned_pending)
        if any(kind not in self._warned_held for kind, _ in held):
            self._warned_held.update(kind for kind, _ in held)
            (s, _), cost = held[0]
            warnings.warn(
                f"{type(self).__name__}: {len(held)} learned single-sample kind(s) exceed "
                f"max_cost = {self._max_cost_arg:.6g}, the first {s} tokens at {cost:.6g} ms: "
                "they keep their predicted cost, so that no sample leaves the plan (raise "
                "max_cost to plan with them)",
                stacklevel=2,
            )
        ratio = self._measured_over_fitted()
        refits = "refit" in self._refined_model(self._learned_pending)[0].meta
        if ratio is not None and not 0.5 <= ratio <= 2 and not refits and not self._warned_scale:
            self._warned_scale = True
            warnings.warn(
                f"{type(self).__name__}: the measured times are {ratio:.3g}x what the base cost "
                "model predicts, so kinds not measured yet are costed on another scale than "
                "the measured ones: give a cost model calibrated on this setup, in ms",
                stacklevel=2,
            )
        return {
            "records": folded,
            "kinds": len(self._learned_pending),
            "new_kinds": len(set(self._learned_pending) - before),
            "measured_over_fitted": ratio,
        }

    def _measured_over_fitted(self) -> float | None:
        if not self._learned_pending:
            return None
        kinds = list(self._learned_pending)
        fitted = self._base_cost_model.uniform_costs(
            [s for s, _ in kinds], [b for _, b in kinds], fitted_only=True
        )
        learned = np.array(list(self._learned_pending.values()))
        return float(_lower_median((learned / fitted).tolist()))

    def _refined_model(self, learned: dict) -> tuple[CostModel, list]:
        """The base cost model with its measured kinds updated by ``learned``, and the
        learned kinds held back: those that would make a sample break ``max_cost`` alone.

        With ``max_cost`` left to its default (the cap follows the model) and at least
        ``_REFIT_MIN_KINDS`` measured kinds, the fitted form is refit to them as well
        (``fit_cost_model``, form chosen by held-out error), so that kinds not measured yet
        are costed on the measured scale; its coefficients are rounded to 6 significant
        digits, so that ranks whose floating point differs in the last bits still plan
        alike."""
        if not learned:
            return self._base_cost_model, []
        cap = self._max_cost_arg
        kinds, held = self._base_cost_model.measured, []
        for kind, cost in learned.items():
            if cap is not None and kind[1] == 1 and cost > cap:
                held.append((kind, cost))
            else:
                kinds[kind] = cost
        kinds = dict(sorted(kinds.items()))
        base = self._base_cost_model
        if cap is None and len(kinds) >= _REFIT_MIN_KINDS:
            base = _refit(kinds, base)
        return base.with_measured(kinds), held

    def _use_learned(self, active: dict) -> None:
        """Plan with the base cost model and the learned kinds ``active``."""
        model, _ = self._refined_model(active)
        self._learned_active = dict(active)
        if model.to_dict() != self.cost_model.to_dict():
            self.cost_model = model
            self._build_table()

    # -- Sampler protocol ---------------------------------------------------------------
    @property
    def start_step(self) -> int:
        """The optimizer step of the current plan at which iteration starts (non-zero after a
        resume that replays the interrupted plan)."""
        if self.uneven_counts:
            return self._step_at(self._start)
        return self._start // self.micro_batches_per_step

    def _step_at(self, position: int) -> int:
        """The step of this rank's stream that begins at micro-batch ``position`` (uneven
        counts; positions there are always at a step's start)."""
        starts = self.plan().rank_step_starts(self.rank)
        return int(np.searchsorted(starts, position, side="left"))

    def micro_batches_in_step(self, step: int) -> int:
        """Micro-batches this rank draws in ``step`` of the current plan: K, or with
        ``uneven_counts`` any count >= 1. Every rank knows its own from the plan, without
        communication; the loop synchronizes gradients at the last of them."""
        plan = self.plan()
        step = _int_arg("step", step, 0)
        if step >= plan.num_steps:
            raise ValueError(f"step must be in [0, {plan.num_steps}) for this plan, got {step}")
        return plan.micro_batches_in_step(step, self.rank)

    def steps(self) -> Iterator[tuple[int, int]]:
        """``(step, micro-batches of this rank in it)`` for the steps of the current pass, from
        ``start_step``: the batches the loader yields, step by step (docs/sampler.md,
        "Uneven micro-batch counts per rank")."""
        plan = self.plan()
        for step in range(self.start_step, plan.num_steps):
            yield step, plan.micro_batches_in_step(step, self.rank)

    def micro_batches(self, loader) -> Iterator[MicroBatch]:
        """Each batch of ``loader`` (a DataLoader over this sampler, or what accelerate made
        of one) as a ``MicroBatch``: the batch with its step, its place in the step, this
        rank's count there, and the step's token and sample counts over all ranks.
        ``mb.last`` is where this rank synchronizes gradients and steps the optimizer.

        The stream is checked against the plan: a loader that draws from another batch
        sampler is refused, and one that ends early or yields more batches than this rank's
        plan raises ``RuntimeError`` instead of shifting every later step boundary."""
        source = getattr(loader, "batch_sampler", None)
        ours = (
            source,
            getattr(source, "batch_sampler", None),
            getattr(loader, "adaptive_sampler", None),
        )
        if source is not None and not any(s is self for s in ours):
            raise ValueError(
                f"micro_batches(loader): the loader's batch_sampler is not this sampler "
                f"({type(source).__name__}); its batches would not follow this plan's steps"
            )
        end = object()
        it = iter(loader)
        first = next(it, end)  # starts the sampler's pass (a resume, or the epoch again)
        plan = self.plan()
        tokens, samples = plan.step_tokens(), plan.step_samples()
        for step in range(self.start_step, plan.num_steps):
            count = plan.micro_batches_in_step(step, self.rank)
            for k in range(count):
                batch, first = (first, end) if first is not end else (next(it, end), end)
                if batch is end:
                    raise RuntimeError(
                        f"micro_batches: the loader ended in step {step} after {k} of rank "
                        f"{self.rank}'s {count} micro-batches there: it did not yield every "
                        "batch of this sampler's pass"
                    )
                yield MicroBatch(batch, step, k, count, int(tokens[step]), int(samples[step]))
        if first is not end or next(it, end) is not end:
            raise RuntimeError(
                f"micro_batches: the loader yielded more batches than this rank's plan holds "
                f"({plan.num_rank_micro_batches(self.rank)} for rank {self.rank}): it does not "
                "draw from this sampler alone"
            )

    @property
    def start_micro_batch(self) -> int:
        """The micro-batch of this rank's stream at which iteration starts."""
        return self._start

    @property
    def sampler(self) -> _PlannedBatchSampler:
        """This sampler, for wrappers that forward ``set_epoch`` to
        ``batch_sampler.sampler`` (accelerate's prepared DataLoader does)."""
        return self

    def __iter__(self) -> Iterator[list[int]]:
        consumer = _Consumer.of(sys._getframe(1))
        if self._pass == "done":
            # A new pass over the same epoch: the whole epoch again, as any sampler does.
            if self._warned_repeat != self.epoch:
                self._warned_repeat = self.epoch
                warnings.warn(
                    f"{type(self).__name__}: iterating epoch {self.epoch} again without set_epoch(): "
                    "the same samples in the same order (call set_epoch(epoch) before each epoch)",
                    stacklevel=2,
                )
            self._excluded, self._start, self._plan = None, 0, None
        plan = self.plan()
        self._verify_ranks()
        self._consumer = consumer
        self._resume_pending = False
        self._pass = "running"
        self._position = self._start
        if consumer.shard is not None:
            if self.uneven_counts:
                raise RuntimeError(
                    f"{type(self).__name__}(uneven_counts=True) under accelerate's "
                    "BatchSamplerShard: it deals batch j to process j % num_processes, so ranks "
                    "must take equal counts. Iterate the sampler per rank (a plain DataLoader)."
                )
            return self._iter_all_ranks(plan, consumer.shard)
        return self._iter_rank(plan)

    def _iter_rank(self, plan: Plan) -> Iterator[list[int]]:
        end = plan.num_rank_micro_batches(self.rank)
        if self._start >= end:
            self._pass = "done"
        for batch in plan.rank_micro_batches(self.rank, self._start):
            self._position += 1
            if self._position == end:
                self._pass = "done"
            yield batch.tolist()

    def _iter_all_ranks(self, plan: Plan, shard) -> Iterator[list[int]]:
        """accelerate's ``BatchSamplerShard`` keeps batch ``j`` of its source on process
        ``j % num_processes``: yield every rank's micro-batches interleaved so that each
        process keeps exactly its own."""
        if getattr(shard, "split_batches", False) or (
            shard.num_processes,
            shard.process_index,
        ) != (self.num_replicas, self.rank):
            raise RuntimeError(
                f"{type(self).__name__} (rank {self.rank} of {self.num_replicas}) is sharded by "
                f"accelerate as process {shard.process_index} of {shard.num_processes}"
                f"{' with split_batches' if shard.split_batches else ''}: the two must agree. "
                "Use adaptiveload.integrations.accelerate.prepare_data_loader(accelerator, loader)."
            )
        k = plan.micro_batches_per_step
        for i in range(self._start, plan.micro_batches_per_rank):
            for r in range(self.num_replicas):
                yield plan.micro_batch(i // k, r, i % k).tolist()
            self._position += 1
        self._pass = "done"

    def __len__(self) -> int:
        """Micro-batches of the current pass (from ``start_micro_batch`` to the plan's end)."""
        remaining = self.plan().num_rank_micro_batches(self.rank) - self._start
        if _is_accelerate(sys._getframe(1).f_locals.get("self"), "BatchSamplerShard"):
            return remaining * self.num_replicas  # see _iter_all_ranks
        return remaining

    def set_epoch(self, epoch: int) -> None:
        """Reshuffle deterministically from (seed, epoch). Setting the epoch a resumed state
        is in keeps the resumed position; another epoch before that position's batches were
        drawn is refused (it would skip them). Another epoch plans with the times learned by
        ``update_cost_model`` so far."""
        epoch = _int_arg("epoch", epoch, 0)
        if epoch == self.epoch:
            return
        if self._resume_pending:
            plan = self.plan()
            left = plan.num_rank_micro_batches(self.rank) - self._start
            if left > 0:
                raise ValueError(
                    f"set_epoch({epoch}): this sampler was resumed at epoch {self.epoch}, step "
                    f"{self.start_step}, with {left} micro-batches of that epoch left; moving to "
                    f"epoch {epoch} would skip them. Call set_epoch({self.epoch}) to continue the "
                    "resumed epoch (with accelerate: prepared_loader.set_epoch), or make a new "
                    "sampler to start over."
                )
        self.epoch = epoch
        self._excluded, self._start, self._plan = None, 0, None
        self._pass, self._position, self._resume_pending = "ready", 0, False
        if self._learned_pending != self._learned_active:
            self._use_learned(self._learned_pending)

    # -- resumption ---------------------------------------------------------------------
    def state_dict(
        self, steps_done: int | None = None, *, micro_batches_done: int | None = None
    ) -> dict:
        """The position in the current epoch, identical on every rank.

        Args:
            steps_done: optimizer steps of the current epoch's plan that training has
                completed, in the numbering of ``start_step`` and ``plan()`` (after a resume
                that replays the plan, steps before ``start_step`` count as done). Pass your
                loop's own count.
            micro_batches_done: the same in micro-batches of this rank's stream, for a
                position inside a step (``steps_done * K + k``).

        Without either: the micro-batches this sampler has handed out. That is exact only
        when nothing reads ahead of training: direct iteration, a DataLoader without
        workers, or torchdata's ``StatefulDataLoader`` (which calls this at the right
        moment). With DataLoader workers or accelerate it is refused (``ValueError``),
        because prefetched batches would be counted as trained.

        With times learned by ``update_cost_model``, the state holds them under
        ``'learned_costs'``: ``{"active": [[seq_len, batch, ms], ...]`` (the current epoch's),
        ``"history": [[seq_len, batch, [ms, ...]], ...]}`` (the most recent times per kind,
        which give the next epoch's).

        With ``uneven_counts`` positions go by steps, since the ranks' micro-batch counts
        differ: ``micro_batches_done`` is refused, and without arguments the sampler must
        have handed out exactly this rank's micro-batches of whole steps. The state then
        holds ``'steps_done'`` (and ``'micro_batches_done' = steps_done * K``).
        """
        if self.uneven_counts:
            return self._state_by_steps(steps_done, micro_batches_done)
        plan = self.plan()
        end = plan.micro_batches_per_rank
        k = self.micro_batches_per_step
        if steps_done is not None and micro_batches_done is not None:
            raise ValueError("state_dict: pass steps_done or micro_batches_done, not both")
        if steps_done is not None:
            position = _int_arg("steps_done", steps_done, 0) * k
            name, value, unit = "steps_done", steps_done, k
        elif micro_batches_done is not None:
            position = _int_arg("micro_batches_done", micro_batches_done, 0)
            name, value, unit = "micro_batches_done", micro_batches_done, 1
        else:
            self._refuse_read_ahead(
                sys._getframe(1),
                ", so the batches it has handed out "
                f"({self._position - self._start} this pass) include some training has not "
                "used. Pass the steps your loop completed: state_dict(steps_done=N); or use "
                "torchdata's StatefulDataLoader, or "
                "adaptiveload.integrations.accelerate.prepare_data_loader with accelerate.",
            )
            position = self._position if self._pass != "ready" else self._start
            name, value, unit = "position", position, 1
        if not self._start <= position <= end:
            if position < self._start:
                raise ValueError(
                    f"{name}={value!r} is before the resumed position (step {self.start_step}, "
                    f"micro-batch {self._start}): count steps from the epoch's start, as "
                    "start_step does"
                )
            raise ValueError(f"{name} must be in [0, {end // unit}] for this plan, got {value!r}")
        return self._state(position, plan.consumed(position, len(self.seq_lens)))

    def _refuse_read_ahead(self, caller, advice: str) -> None:
        """A position-less ``state_dict()`` is refused while a consumer that reads ahead of
        training (a DataLoader with workers) is drawing, unless torchdata asks (``caller``:
        the frame that called ``state_dict``)."""
        if (
            self._pass == "running"
            and self._consumer.reads_ahead
            and not _called_by_torchdata(caller)
        ):
            raise ValueError(
                f"state_dict(): this sampler is drawn by {self._consumer.name}, which reads "
                f"ahead of training{advice}"
            )

    def _state_by_steps(self, steps_done: int | None, micro_batches_done: int | None) -> dict:
        plan = self.plan()
        if micro_batches_done is not None:
            raise ValueError(
                "state_dict: with uneven_counts the ranks' micro-batch counts differ, so "
                "positions go by steps: pass steps_done"
            )
        if steps_done is not None:
            steps = _int_arg("steps_done", steps_done, 0)
        else:
            self._refuse_read_ahead(
                sys._getframe(2), ". Pass the steps your loop completed: state_dict(steps_done=N)."
            )
            position = self._position if self._pass != "ready" else self._start
            starts = plan.rank_step_starts(self.rank)
            steps = int(np.searchsorted(starts, position, side="left"))
            if steps > plan.num_steps or starts[steps] != position:
                raise ValueError(
                    f"state_dict(): this rank has drawn {position} micro-batches, inside step "
                    f"{steps - 1}; with uneven_counts a state is taken between steps: pass "
                    "steps_done"
                )
        if not self.start_step <= steps <= plan.num_steps:
            if steps < self.start_step:
                raise ValueError(
                    f"steps_done={steps} is before the resumed position (step "
                    f"{self.start_step}): count steps from the epoch's start, as start_step does"
                )
            raise ValueError(
                f"steps_done must be in [0, {plan.num_steps}] for this plan, got {steps}"
            )
        state = self._state(
            steps * self.micro_batches_per_step, plan.consumed_steps(steps, len(self.seq_lens))
        )
        state["steps_done"] = steps
        return state

    def _state(self, position: int, consumed_in_plan: np.ndarray) -> dict:
        n = len(self.seq_lens)
        excluded = np.zeros(n, dtype=bool) if self._excluded is None else self._excluded
        consumed = excluded | consumed_in_plan
        state = {
            "version": _STATE_VERSION,
            "fingerprint": self._fingerprint(),
            "epoch": self.epoch,
            "excluded": _pack(excluded),
            "micro_batches_done": int(position),
            "consumed": _pack(consumed),
            "num_consumed": int(consumed.sum()),
        }
        if self._learned_history:
            # Folded by every rank alike; records not yet folded are this rank's and stay out.
            state["learned_costs"] = {
                "active": [[s, b, ms] for (s, b), ms in sorted(self._learned_active.items())],
                "history": [[s, b, list(t)] for (s, b), t in sorted(self._learned_history.items())],
            }
        return state

    def load_state_dict(self, state: dict) -> None:
        """Continue the epoch of ``state``.

        - The same plan (equal fingerprint): replays it from the saved position, exactly.
        - Other settings (caps, cost model, lookahead, ranks, K, seed, sampler kind): the
          samples the state consumed are left out and the rest of the epoch is planned with
          this sampler's settings; nothing is lost or repeated.
        - Another dataset (other lengths or group keys): refused with ``ValueError``.

        The state's learned times (``update_cost_model``) are restored first: those of its
        epoch, so that a sampler made anew with the same base cost model replays the plan,
        and those for the next epoch. A state without them (key ``'learned_costs'``, as
        before online refinement) learned nothing. Records not folded by an update when the
        state was made are not in it, and those of this sampler are dropped.
        """
        if not isinstance(state, dict):
            raise ValueError(f"sampler state must be a dict, got {type(state).__name__}")
        if state.get("version") != _STATE_VERSION:
            raise ValueError(
                f"unsupported sampler state version {state.get('version')!r} (this AdaptiveLoad "
                f"reads version {_STATE_VERSION}; version 1 states carry no plan fingerprint and "
                "cannot be checked against the dataset)"
            )
        for key in (
            "fingerprint",
            "epoch",
            "excluded",
            "micro_batches_done",
            "consumed",
            "num_consumed",
        ):
            if key not in state:
                raise ValueError(f"sampler state: missing {key!r}")
        # The learned times first: the fingerprint holds the cost model they make.
        active, history = _unpack_learned(state)
        learning = (
            self.cost_model,
            self._table,
            self._max_cost,
            self._learned_active,
            self._learned_history,
            self._learned_pending,
        )
        self._learned_history = history
        self._learned_pending = {k: _lower_median(t) for k, t in sorted(history.items())}
        self._use_learned(active)
        try:
            self._load_position(state)
        except Exception:  # the sampler stays as it was
            (
                self.cost_model,
                self._table,
                self._max_cost,
                self._learned_active,
                self._learned_history,
                self._learned_pending,
            ) = learning
            raise
        self._records = {}

    def _load_position(self, state: dict) -> None:
        saved = state["fingerprint"]
        if not isinstance(saved, dict):
            raise ValueError("sampler state: 'fingerprint' must be a dict")
        mine = self._fingerprint()
        missing = sorted(
            set(mine)
            - set(saved)
            - {
                "max_batch_size",
                "memory_model",
                "memory_budget_gib",
                "uneven_counts",
                "mix_tolerance",
            }
        )
        if missing:
            raise ValueError(f"sampler state: fingerprint lacks {missing}")
        if saved["sampler"] not in ("AdaptiveBatchSampler", "EqualTokenBatchSampler"):
            raise ValueError(f"sampler state: unknown sampler {saved['sampler']!r}")
        for key in ("num_replicas", "micro_batches_per_step", "lookahead_steps", "max_tokens"):
            v = saved[key]
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"sampler state: fingerprint {key!r} = {v!r} is not valid")
        n = len(self.seq_lens)
        if saved["num_samples"] != n or saved["data"] != self._data_digest:
            raise ValueError(
                f"sampler state is for another dataset ({saved['num_samples']} samples, digest "
                f"{saved['data']}); this sampler has {n} samples, digest {self._data_digest}: "
                "its sequence lengths or group keys differ"
            )
        epoch = _state_count(state, "epoch")
        position = _state_count(state, "micro_batches_done")
        excluded = _unpack(state, "excluded", n)
        consumed = _unpack(state, "consumed", n)
        if (excluded & ~consumed).any():
            raise ValueError("sampler state: 'excluded' holds samples that 'consumed' does not")
        if state["num_consumed"] != int(consumed.sum()):
            raise ValueError(
                f"sampler state: 'num_consumed' = {state['num_consumed']!r} but 'consumed' "
                f"holds {int(consumed.sum())} samples"
            )

        previous = (self.epoch, self._excluded, self._start, self._plan)
        self.epoch = epoch
        if saved == mine and self.uneven_counts:
            # The same plan: replay it from the saved step, at this rank's place in it.
            steps = _state_count(state, "steps_done") if "steps_done" in state else -1
            self._excluded = excluded if excluded.any() else None
            self._start, self._plan = 0, None
            plan = self.plan()
            problem = None
            if steps < 0 or position != steps * self.micro_batches_per_step:
                problem = "'steps_done' is missing or disagrees with 'micro_batches_done'"
            elif steps > plan.num_steps:
                problem = f"'steps_done' = {steps} is past the end of its plan"
            elif not np.array_equal(excluded | plan.consumed_steps(steps, n), consumed):
                problem = f"'consumed' does not match the samples of its plan up to step {steps}"
            if problem:
                self.epoch, self._excluded, self._start, self._plan = previous
                raise ValueError(f"sampler state: {problem}: the state is corrupt")
            self._start = int(plan.rank_step_starts(self.rank)[steps])
        elif saved == mine:
            # The same plan: replay it from the saved position.
            self._excluded = excluded if excluded.any() else None
            self._start, self._plan = 0, None
            plan = self.plan()
            if position > plan.micro_batches_per_rank:
                self.epoch, self._excluded, self._start, self._plan = previous
                raise ValueError(
                    f"sampler state: 'micro_batches_done' = {position} is past the end of its "
                    f"plan ({plan.micro_batches_per_rank} micro-batches per rank)"
                )
            if not np.array_equal(excluded | plan.consumed(position, n), consumed):
                self.epoch, self._excluded, self._start, self._plan = previous
                raise ValueError(
                    "sampler state: 'consumed' does not match the samples of its plan up to "
                    f"micro-batch {position}: the state is corrupt"
                )
            self._start = position
        else:
            # Other settings: plan the samples not yet consumed.
            self._excluded = consumed if consumed.any() else None
            self._start, self._plan = 0, None
        self._pass, self._position = "ready", self._start
        self._resume_pending = True
        self._verified = None


class AdaptiveBatchSampler(_PlannedBatchSampler):
    """Dual-constraint, rank-balanced batch sampler.

    Each micro-batch obeys ``sum_i S_i <= max_tokens`` (memory, M_mem) and
    ``cost_model(batch) <= max_cost`` (compute, M_comp) and never mixes ``group_keys``.
    Each optimizer step's ``W x K`` micro-batches come from a window of
    ``lookahead_steps`` steps, mixed so that each step holds the window's groups in
    proportion as far as the predicted imbalance stays within ``mix_tolerance`` (else steps of
    similar cost), and are assigned to ranks (K each) by longest-processing-time first.

    Args:
        seq_lens: 1-D integer token counts, one per dataset index (list, numpy array or
            tensor of any dtype).
        max_tokens: memory cap, tokens per micro-batch.
        max_cost: compute cap in the cost model's unit. Default (None):
            ``max(cost of the heaviest sample alone, min over groups of the cost of a
            micro-batch of that group filled to max_tokens)``: every sample fits, the
            cheapest group is never cut below what memory allows, and heavier groups are
            cut to about that cost, which is what lets steps balance.
        cost_model: a ``CostModel``; default ``CostModel.default()`` (Wan 2.1 14B, H200).
        group_keys: optional per-sample keys (e.g. ``(frames, h, w)`` rows, tuples or ints,
            in a list, array or tensor); a micro-batch never mixes keys. Default: the
            sequence length.
        num_replicas, rank: data-parallel ranks and this rank. Default: from
            ``process_group`` (the data-parallel group; every rank of a sequence-parallel
            group then draws the same batches), else from ``torch.distributed`` when
            initialized, else 1, 0.
        micro_batches_per_step: K, micro-batches per rank per optimizer step.
        shuffle, seed: deterministic shuffling from ``(seed, epoch)``; no global RNG. The
            seed must be the same on every rank.
        drop_last: drop the micro-batches that do not fill the last step (reported in the
            plan) instead of halving the largest micro-batches to fill it (and repeating
            samples only if nothing can be halved).
        lookahead_steps: how far the order departs from a plain shuffle: micro-batches are
            regrouped within windows of this many optimizer steps. 1 keeps the shuffled
            step order; larger windows balance better.
        mix_tolerance: the predicted imbalance (mean over a window's steps of 1 - mean/max
            rank cost) that steps may take on to stay representative of the data: each
            window's steps are drawn from the fewest cost strata (1: the whole window, every
            step a proportional draw of its groups) that keep it within this; none does:
            steps of similar cost. 0 gives the best balance, with steps that often hold one
            or two shapes (the planner before 2026-12); 1 mixes every window whatever the
            balance. ``plan().window_strata`` and ``step_composition`` report where each
            plan landed. Default ``MIX_TOLERANCE`` (0.02): docs/sampler.md, "Representative
            steps".
        balance: False gives the paper's form: dual caps, no cross-rank balancing.
        max_batch_size: at most this many samples per micro-batch (None: no limit beyond the
            caps). ``max_batch_size=1`` is the batch-size-1 pipeline (DiffSynth-Studio's
            trainer, one sample per micro-batch): steps of ``W x K`` single samples, still
            balanced across ranks.
        memory_model, memory_budget_gib: a ``MemoryModel`` and the budget (GiB) each
            micro-batch's predicted peak must stay within: micro-batches are packed under the
            budget, each checkpoints the fewest blocks that keep it there
            (``plan().checkpointed``, ``checkpointed_blocks(indices)``, ``memory_policy()``),
            and its cost is the cost model's (fully checkpointed) times the time it saves.
            A micro-batch of two or more samples grows only while it needs no
            recomputation (only a sample alone checkpoints), the default ``max_cost`` is
            then one that never binds sooner (the heaviest group's micro-batch filled that
            way), and a sample over ``max_cost`` runs alone.
            ``max_tokens`` may then be None (the most tokens one sample fits at full
            checkpointing). docs/sampler.md, "Memory budget and checkpointing per micro-batch".
        on_oversize: 'error' (default) refuses, when the sampler is made, samples that alone
            break a cap; 'skip' leaves them out with a warning (``plan().skipped``).
        verify_ranks: with ``torch.distributed`` initialized, all ranks compare their plan
            fingerprints at the start of each epoch and raise ``RuntimeError`` naming what
            differs. Every process of the job must then iterate its sampler each epoch.
        uneven_counts: for loops that synchronize gradients once per optimizer step (DDP
            with ``no_sync`` or a manual all-reduce): each step's ``W x K`` micro-batches go
            to ranks in any count >= 1 each (K is the average), so that a rank of several
            cheap micro-batches and one of a single expensive one finish together. The loop
            learns its counts from ``steps()`` / ``micro_batches_in_step(step)``; states go by
            steps. FSDP2 only with parameters kept unsharded within a step
            (``reshard_after_forward=False``), since its all-gathers run per forward:
            docs/sampler.md, "Uneven micro-batch counts per rank".

    ``record_time`` and ``update_cost_model`` refine the cost model with measured times,
    epoch after epoch (docs/sampler.md, "Online refinement").
    """

    def __init__(
        self,
        seq_lens,
        max_tokens: int | None,
        max_cost: float | None = None,
        cost_model: CostModel | None = None,
        group_keys=None,
        num_replicas: int | None = None,
        rank: int | None = None,
        micro_batches_per_step: int = 1,
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = False,
        *,
        lookahead_steps: int = 64,
        balance: bool = True,
        on_oversize: str = "error",
        process_group=None,
        verify_ranks: bool = True,
        max_batch_size: int | None = None,
        memory_model: MemoryModel | None = None,
        memory_budget_gib: float | None = None,
        uneven_counts: bool = False,
        mix_tolerance: float = MIX_TOLERANCE,
    ):
        super().__init__(
            seq_lens,
            max_tokens,
            max_cost=max_cost,
            cost_model=cost_model,
            group_keys=group_keys,
            num_replicas=num_replicas,
            rank=rank,
            process_group=process_group,
            micro_batches_per_step=micro_batches_per_step,
            shuffle=shuffle,
            seed=seed,
            drop_last=drop_last,
            balance=balance,
            lookahead_steps=lookahead_steps,
            on_oversize=on_oversize,
            verify_ranks=verify_ranks,
            max_batch_size=max_batch_size,
            memory_model=memory_model,
            memory_budget_gib=memory_budget_gib,
            uneven_counts=uneven_counts,
            mix_tolerance=mix_tolerance,
        )

    @property
    def max_cost(self) -> float:
        """The compute cap M_comp in use (the default is computed from the data)."""
        return self._max_cost

    def _compute_max_cost(self) -> float:
        if self._max_cost_arg is not None:
            return self._max_cost_arg
        return float(self._table.default_max_cost(self.max_tokens, self.max_batch_size or 0))


class EqualTokenBatchSampler(_PlannedBatchSampler):
    """The baseline video teams use today: same-key buckets, ``floor(max_tokens / S)``
    samples per micro-batch, micro-batches in random order dealt to ranks round-robin
    (each rank draws independently of the others' cost). Same interface as
    ``AdaptiveBatchSampler``; ``cost_model`` only predicts costs for reports. With
    ``max_batch_size=1`` it is the batch-size-1 pipeline's default: shuffled samples, one per
    micro-batch, dealt to ranks in order."""

    def __init__(
        self,
        seq_lens,
        max_tokens: int,
        group_keys=None,
        num_replicas: int | None = None,
        rank: int | None = None,
        micro_batches_per_step: int = 1,
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = False,
        *,
        cost_model: CostModel | None = None,
        on_oversize: str = "error",
        process_group=None,
        verify_ranks: bool = True,
        max_batch_size: int | None = None,
    ):
        super().__init__(
            seq_lens,
            max_tokens,
            max_cost=None,
            cost_model=cost_model,
            group_keys=group_keys,
            num_replicas=num_replicas,
            rank=rank,
            process_group=process_group,
            micro_batches_per_step=micro_batches_per_step,
            shuffle=shuffle,
            seed=seed,
            drop_last=drop_last,
            balance=False,
            lookahead_steps=1,
            on_oversize=on_oversize,
            verify_ranks=verify_ranks,
            max_batch_size=max_batch_size,
        )

    @property
    def max_cost(self) -> None:
        return None

    def _compute_max_cost(self) -> float:
        return _NO_COST_CAP

    def _reported_max_cost(self) -> None:
        return None


__all__: Sequence[str] = ["AdaptiveBatchSampler", "EqualTokenBatchSampler", "Plan"]
