"""Argument checks of the samplers: token counts, group keys, integers, flags and numbers,
each refused with a message naming the argument; and the bounds that keep every sum of a
plan within int64 (as the C++ core checks them, planner.h)."""

from __future__ import annotations

import math
import numbers
import operator
from dataclasses import dataclass

import numpy as np

from adaptiveload.cost import CostModel
from adaptiveload.keys import to_numpy
from adaptiveload.memory import GIB, MemoryModel
from adaptiveload.sampler.defaults import COMPOSITIONS, SEQUENCE_PARALLEL_AUTO_MAX

# Tokens of one sample, max_tokens and all samples' tokens together, and micro-batches per
# step (num_replicas * micro_batches_per_step).
MAX_LEN = 2**40 - 1
MAX_TOKENS = 2**62
MAX_STEP_MICRO_BATCHES = 2**20
# Seeds are the planner's 64-bit keys.
MAX_SEED = 2**64 - 1


def as_seq_lens(seq_lens) -> np.ndarray:
    a = to_numpy(seq_lens, "seq_lens")
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
            if int(v) > MAX_LEN:
                raise ValueError(
                    f"seq_lens[{i}] = {int(v)} is larger than any supported token count (2^40 - 1)"
                )
        a = np.array([int(v) for v in a], dtype=np.int64)
    if a.dtype.kind == "b" or a.dtype.kind not in "iuf":
        raise ValueError(f"seq_lens must hold integers, got dtype {a.dtype}")
    if a.dtype.kind in "iu" and a.size and a.max() > MAX_LEN:
        i = int(np.flatnonzero(a > MAX_LEN)[0])
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
    if a.dtype.kind == "f" and a.size and a.max() > MAX_LEN:
        i = int(np.flatnonzero(a > MAX_LEN)[0])
        raise ValueError(
            f"seq_lens[{i}] = {a[i].item()!r} is larger than any supported token count (2^40 - 1)"
        )
    a = np.ascontiguousarray(a, dtype=np.int64)
    if a.sum(dtype=np.float64) > MAX_TOKENS:  # each <= 2^40, so a float sum is exact enough
        raise ValueError(
            f"seq_lens hold {a.sum(dtype=np.float64):.4g} tokens in all, more than the 2^62 a "
            "plan's int64 sums hold"
        )
    return a


def int_arg(name: str, value, low: int, high: int | None = None) -> int:
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


def bool_arg(name: str, value) -> bool:
    if not isinstance(value, bool | np.bool_):
        raise ValueError(f"{name} must be True or False, got {value!r}")
    return bool(value)


def positive_number(value) -> bool:
    """Whether ``value`` is a finite real number > 0 (not a bool)."""
    return (
        isinstance(value, numbers.Real)
        and not isinstance(value, bool | np.bool_)
        and math.isfinite(value)
        and value > 0
    )


@dataclass(frozen=True)
class Options:
    """A sampler's settings, checked: everything that shapes its plans except the data, and
    how it runs them (``verify_ranks``, ``drawn_is_trained``). The one source of each: the
    sampler's attributes of the same names read these, except ``max_cost`` and ``cost_model``,
    there the cap and the cost model in use (``base_cost_model`` is this one)."""

    max_tokens: int
    #: the compute cap as given (None: the sampler's default)
    max_cost: float | None
    cost_model: CostModel
    num_replicas: int
    rank: int
    micro_batches_per_step: int
    shuffle: bool
    seed: int
    drop_last: bool
    balance: bool
    lookahead_steps: int
    on_oversize: str
    verify_ranks: bool
    max_batch_size: int | None
    memory_model: MemoryModel | None
    memory_budget_gib: float | None
    uneven_counts: bool
    mix_tolerance: float
    drawn_is_trained: bool
    #: the largest sequence-parallel degree (1: off); docs/sampler.md, "Sequence parallelism
    #: per micro-batch"
    sequence_parallel: int = 1
    #: cost of sending one token through a split micro-batch's all-to-alls, in the cost model's
    #: unit (None: ``cost.sequence_parallel_comm_of`` the cost model, else a flat
    #: SEQUENCE_PARALLEL_COMM_FRACTION of the split compute)
    sequence_parallel_comm: float | None = None
    #: streamed plans only: the least positions of a segment (None: not streamed, or the
    #: streaming sampler's default)
    segment_samples: int | None = None
    #: "representative" (steps as representative as a shuffle) or "balanced" (mix_tolerance's
    #: rule); sampler/defaults.py
    composition: str = "representative"


def _memory_options(memory_model, memory_budget_gib, max_tokens) -> tuple:
    """``(memory_model, memory_budget_gib, max_tokens)``: a memory model and its budget go
    together, and with them ``max_tokens`` may be None (the most tokens one sample fits at
    full checkpointing, which no micro-batch the budget admits exceeds)."""
    if (memory_model is None) != (memory_budget_gib is None):
        raise ValueError(
            "memory_model and memory_budget_gib go together: give both (the policy "
            "checkpoints blocks per micro-batch) or neither"
        )
    if memory_model is not None and not isinstance(memory_model, MemoryModel):
        raise ValueError(f"memory_model must be an adaptiveload.MemoryModel, got {memory_model!r}")
    if memory_budget_gib is None:
        if max_tokens is None:
            raise ValueError("max_tokens is required unless a memory_model and budget are given")
        return None, None, max_tokens
    if not positive_number(memory_budget_gib):
        raise ValueError(
            f"memory_budget_gib must be a finite number > 0, got {memory_budget_gib!r}"
        )
    budget = float(memory_budget_gib)
    if max_tokens is None:
        max_tokens = max(1, memory_model.max_tokens(budget * GIB))
    return memory_model, budget, max_tokens


def auto_sequence_parallel(num_replicas: int) -> int:
    """``sequence_parallel="auto"``: the largest power of two dividing ``num_replicas`` and at
    most ``SEQUENCE_PARALLEL_AUTO_MAX`` (one node's GPUs, whose all-to-alls stay on NVLink).
    The model's head count does not bound it (degrees above it run as Ulysses x ring,
    ``parallel.layout``); a sample too long for that many shares is refused by the planner,
    naming it."""
    d = 1
    while 2 * d <= SEQUENCE_PARALLEL_AUTO_MAX and num_replicas % (2 * d) == 0:
        d *= 2
    return d


def _check_sequence_parallel(flags: dict, out: dict, num_replicas: int) -> None:
    """``sequence_parallel`` (a power of two dividing ``num_replicas``, or "auto"; it needs
    uneven counts) and ``sequence_parallel_comm`` (None or a number >= 0), into ``out``."""
    d = flags.pop("sequence_parallel", 1)
    if d == "auto":
        if not out["uneven_counts"]:
            raise ValueError(
                "sequence_parallel='auto' needs uneven_counts=True: a rank's count of "
                "micro-batches in a step depends on the groups it joins"
            )
        d = auto_sequence_parallel(num_replicas)
    d = int_arg("sequence_parallel", d, 1)
    comm = flags.pop("sequence_parallel_comm", None)
    if d & (d - 1) or num_replicas % d:
        raise ValueError(
            f"sequence_parallel must be a power of two that divides num_replicas = "
            f"{num_replicas}, got {d}"
        )
    if comm is not None and not (
        isinstance(comm, numbers.Real) and not isinstance(comm, bool) and 0.0 <= comm < math.inf
    ):
        raise ValueError(
            f"sequence_parallel_comm must be a finite number >= 0 or None, got {comm!r}"
        )
    if d > 1 and not out["uneven_counts"]:
        raise ValueError(
            f"sequence_parallel={d} needs uneven_counts=True: a rank's count of micro-batches in "
            "a step depends on the groups it joins"
        )
    out["sequence_parallel"] = d
    out["sequence_parallel_comm"] = None if comm is None else float(comm)


def check_options(max_tokens, *, max_cost, cost_model, num_replicas, rank, **flags) -> Options:
    """The checked ``Options`` of a sampler's arguments (``flags``: the remaining keyword
    arguments of ``Options``; ``num_replicas`` and ``rank`` as ``distributed_defaults``
    resolved them, ``drawn_is_trained`` as the sampler checked it, before those)."""
    memory_model, budget, max_tokens = _memory_options(
        flags.pop("memory_model"), flags.pop("memory_budget_gib"), max_tokens
    )
    batch = flags.pop("max_batch_size")
    out = {
        "max_tokens": int_arg("max_tokens", max_tokens, 1, MAX_TOKENS),
        "max_batch_size": None if batch is None else int_arg("max_batch_size", batch, 1),
    }
    if max_cost is not None and not positive_number(max_cost):
        raise ValueError(f"max_cost must be a finite number > 0 or None, got {max_cost!r}")
    if cost_model is not None and not isinstance(cost_model, CostModel):
        raise ValueError(
            f"cost_model must be an adaptiveload.CostModel or None, got {cost_model!r}"
        )
    if flags["on_oversize"] not in ("error", "skip"):
        raise ValueError(f"on_oversize must be 'error' or 'skip', got {flags['on_oversize']!r}")
    for name in ("micro_batches_per_step", "lookahead_steps"):
        out[name] = int_arg(name, flags.pop(name), 1)
    out["seed"] = int_arg("seed", flags.pop("seed"), 0, MAX_SEED)
    for name in ("shuffle", "drop_last", "balance", "uneven_counts", "verify_ranks"):
        out[name] = bool_arg(name, flags.pop(name))
    if out["uneven_counts"] and not out["balance"]:
        raise ValueError(
            "uneven_counts=True needs balance=True: without balancing every rank takes K "
            "micro-batches per step"
        )
    mix = flags.pop("mix_tolerance")
    if not (isinstance(mix, numbers.Real) and not isinstance(mix, bool) and 0.0 <= mix <= 1.0):
        raise ValueError(f"mix_tolerance must be a number in [0, 1], got {mix!r}")
    if flags.get("composition", COMPOSITIONS[0]) not in COMPOSITIONS:
        raise ValueError(
            f"composition must be one of {', '.join(map(repr, COMPOSITIONS))}, got "
            f"{flags['composition']!r}"
        )
    _check_sequence_parallel(flags, out, num_replicas)
    segment = flags.pop("segment_samples", None)
    out["segment_samples"] = None if segment is None else int_arg("segment_samples", segment, 1)
    if num_replicas * out["micro_batches_per_step"] > MAX_STEP_MICRO_BATCHES:
        raise ValueError(
            f"num_replicas * micro_batches_per_step must be <= 2^20 (micro-batches per "
            f"optimizer step), got {num_replicas} * {out['micro_batches_per_step']}"
        )
    return Options(
        max_cost=None if max_cost is None else float(max_cost),
        cost_model=cost_model if cost_model is not None else CostModel.default(),
        num_replicas=num_replicas,
        rank=rank,
        memory_model=memory_model,
        memory_budget_gib=budget,
        mix_tolerance=float(mix),
        **out,
        **flags,
    )
