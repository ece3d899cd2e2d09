"""Batch samplers for ``torch.utils.data.DataLoader(batch_sampler=...)``.

``AdaptiveBatchSampler`` plans each epoch for all ranks at once in C++ (the same plan on
every rank, no communication) and yields this rank's micro-batches. Micro-batches
``[t*K, (t+1)*K)`` of every rank form optimizer step ``t``.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np
from torch.utils.data import Sampler

from adaptiveload import _sampler
from adaptiveload.cost import CostModel

_STATE_VERSION = 1
# A compute cap that never binds (equal-token buckets have none).
_NO_COST_CAP = 1e300


@dataclass
class Plan:
    """One epoch for all ranks. Micro-batch ``m = (step * W + rank) * K + k`` holds
    ``samples[offsets[m]:offsets[m+1]]``; ``costs[m]`` is its predicted cost and
    ``tokens[m]`` its token count."""

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

    @property
    def num_micro_batches(self) -> int:
        return len(self.offsets) - 1

    def micro_batch(self, step: int, rank: int, k: int = 0) -> np.ndarray:
        m = (step * self.num_replicas + rank) * self.micro_batches_per_step + k
        return self.samples[self.offsets[m] : self.offsets[m + 1]]

    def rank_micro_batches(self, rank: int) -> Iterator[np.ndarray]:
        """This rank's micro-batches in order, step after step."""
        w, k = self.num_replicas, self.micro_batches_per_step
        for t in range(self.num_steps):
            base = (t * w + rank) * k
            for m in range(base, base + k):
                yield self.samples[self.offsets[m] : self.offsets[m + 1]]

    def _per_slot(self, values: np.ndarray) -> np.ndarray:
        return values.reshape(self.num_steps, self.num_replicas, self.micro_batches_per_step)

    def rank_costs(self) -> np.ndarray:
        """Predicted cost of each rank in each step, shape (num_steps, W)."""
        return self._per_slot(self.costs).sum(axis=2)

    def micro_batch_sizes(self) -> np.ndarray:
        return np.diff(self.offsets)


def _as_seq_lens(seq_lens) -> np.ndarray:
    try:
        import torch

        if isinstance(seq_lens, torch.Tensor):
            seq_lens = seq_lens.detach().cpu().numpy()
    except ImportError:  # pragma: no cover
        pass
    a = np.asarray(seq_lens)
    if a.ndim != 1:
        raise ValueError(
            f"seq_lens must be 1-D (one length per dataset index), got shape {a.shape}"
        )
    if a.dtype.kind == "b" or a.dtype.kind not in "iuf":
        raise ValueError(f"seq_lens must hold integers, got dtype {a.dtype}")
    if a.dtype.kind == "f":
        bad = ~np.isfinite(a) | (a != np.floor(np.where(np.isfinite(a), a, 0)))
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise ValueError(f"seq_lens[{i}] = {a[i].item()!r} is not an integer token count")
    if a.size and a.min() < 1:
        i = int(np.flatnonzero(a < 1)[0])
        raise ValueError(f"seq_lens[{i}] = {a[i].item()!r}: token counts must be >= 1")
    return np.ascontiguousarray(a, dtype=np.int64)


def _as_group_ids(group_keys, n: int) -> np.ndarray | None:
    """Dense int64 ids from keys: a 1-D integer array as is, the rows of a 2-D array
    (e.g. (frames, height, width) per sample), or any sequence of hashable keys."""
    if group_keys is None:
        return None
    if (
        isinstance(group_keys, np.ndarray)
        and group_keys.ndim == 1
        and group_keys.dtype.kind in "iu"
    ):
        keys = group_keys.astype(np.int64)
    elif isinstance(group_keys, np.ndarray) and group_keys.ndim == 2:
        if len(group_keys) != n:
            raise ValueError(f"group_keys has {len(group_keys)} rows but seq_lens has {n}")
        keys = np.unique(group_keys, axis=0, return_inverse=True)[1].reshape(-1).astype(np.int64)
    else:
        if len(group_keys) != n:
            raise ValueError(f"group_keys has {len(group_keys)} entries but seq_lens has {n}")
        ids: dict = {}
        keys = np.fromiter(
            (
                ids.setdefault(tuple(k) if isinstance(k, list | np.ndarray) else k, len(ids))
                for k in group_keys
            ),
            dtype=np.int64,
            count=n,
        )
    if len(keys) != n:
        raise ValueError(f"group_keys has {len(keys)} entries but seq_lens has {n}")
    return np.ascontiguousarray(keys)


def _distributed_defaults(num_replicas, rank) -> tuple[int, int]:
    if num_replicas is None or rank is None:
        import torch.distributed as dist

        initialized = dist.is_available() and dist.is_initialized()
        if num_replicas is None:
            num_replicas = dist.get_world_size() if initialized else 1
        if rank is None:
            rank = dist.get_rank() if initialized else 0
    if not isinstance(num_replicas, int | np.integer) or num_replicas < 1:
        raise ValueError(f"num_replicas must be an integer >= 1, got {num_replicas!r}")
    if not isinstance(rank, int | np.integer) or not 0 <= rank < num_replicas:
        raise ValueError(f"rank must be in [0, {num_replicas}), got {rank!r}")
    return int(num_replicas), int(rank)


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
        micro_batches_per_step: int,
        shuffle: bool,
        seed: int,
        drop_last: bool,
        balance: bool,
        lookahead_steps: int,
        on_oversize: str,
    ):
        self.seq_lens = _as_seq_lens(seq_lens)
        n = len(self.seq_lens)
        if (
            isinstance(max_tokens, bool)
            or not isinstance(max_tokens, int | np.integer)
            or max_tokens <= 0
        ):
            raise ValueError(f"max_tokens must be a positive integer, got {max_tokens!r}")
        if max_cost is not None and not (
            isinstance(max_cost, int | float) and math.isfinite(max_cost) and max_cost > 0
        ):
            raise ValueError(f"max_cost must be a finite number > 0 or None, got {max_cost!r}")
        if not isinstance(micro_batches_per_step, int | np.integer) or micro_batches_per_step < 1:
            raise ValueError(
                f"micro_batches_per_step must be an integer >= 1, got {micro_batches_per_step!r}"
            )
        if not isinstance(lookahead_steps, int | np.integer) or lookahead_steps < 1:
            raise ValueError(f"lookahead_steps must be an integer >= 1, got {lookahead_steps!r}")
        if on_oversize not in ("error", "skip"):
            raise ValueError(f"on_oversize must be 'error' or 'skip', got {on_oversize!r}")
        if not isinstance(seed, int | np.integer) or seed < 0:
            raise ValueError(f"seed must be a non-negative integer, got {seed!r}")

        self.cost_model = cost_model if cost_model is not None else CostModel.default()
        self.group_keys = _as_group_ids(group_keys, n)
        self._table = _sampler.SampleTable(self.seq_lens, self.group_keys, self.cost_model._core)
        self.max_tokens = int(max_tokens)
        self.num_replicas, self.rank = _distributed_defaults(num_replicas, rank)
        self.micro_batches_per_step = int(micro_batches_per_step)
        self.shuffle = bool(shuffle)
        self.seed = int(seed)
        self.drop_last = bool(drop_last)
        self.balance = bool(balance)
        self.lookahead_steps = int(lookahead_steps)
        self.on_oversize = on_oversize
        self._max_cost = max_cost
        self.epoch = 0
        self._consumed: np.ndarray | None = None  # samples of this epoch left out of the plan
        self._start_step = 0  # steps of the plan done before a resume
        self._plan: Plan | None = None
        self._yielded = 0
        self._warned_skips = False

    # -- planning -----------------------------------------------------------------------
    def plan(self) -> Plan:
        """The whole current epoch for all ranks (cached until ``set_epoch`` or a resume)."""
        if self._plan is None:
            exclude = None if self._consumed is None else self._consumed.view(np.uint8)
            raw = _sampler.plan_epoch(
                self._table,
                self.max_tokens,
                float(self._effective_max_cost()),
                self.num_replicas,
                self.micro_batches_per_step,
                self.shuffle,
                self.seed,
                self.epoch,
                self.drop_last,
                self.balance,
                self.lookahead_steps,
                self.on_oversize == "skip",
                exclude,
            )
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

    def _effective_max_cost(self) -> float:
        raise NotImplementedError

    def _reported_max_cost(self) -> float | None:
        return self._effective_max_cost()

    # -- Sampler protocol ---------------------------------------------------------------
    @property
    def start_step(self) -> int:
        """Steps of the current plan done before a resume; iteration starts here."""
        return self._start_step

    def __iter__(self) -> Iterator[list[int]]:
        plan = self.plan()
        self._yielded = 0
        k = self.micro_batches_per_step
        for i, batch in enumerate(plan.rank_micro_batches(self.rank)):
            if i >= self._start_step * k:
                self._yielded += 1
                yield batch.tolist()

    def __len__(self) -> int:
        plan = self.plan()
        return (plan.num_steps - self._start_step) * plan.micro_batches_per_step

    def set_epoch(self, epoch: int) -> None:
        """Reshuffle deterministically from (seed, epoch). Setting the epoch a resumed
        state is in keeps the resumed position."""
        if not isinstance(epoch, int | np.integer) or epoch < 0:
            raise ValueError(f"epoch must be a non-negative integer, got {epoch!r}")
        if int(epoch) != self.epoch:
            self.epoch = int(epoch)
            self._consumed = None
            self._start_step = 0
            self._plan = None
            self._yielded = 0

    # -- resumption ---------------------------------------------------------------------
    def state_dict(self, steps_done: int | None = None) -> dict:
        """The position in the epoch: the samples already consumed, and the step of the
        current plan reached (so that a resume on the same ranks replays the plan).

        ``steps_done``: optimizer steps of the current plan completed, counted from the
        plan's first step (``start_step`` after a resume). Pass the training loop's own
        count: a DataLoader with workers draws batches ahead of training, so the
        sampler's own count (the default) can run ahead. Identical on every rank.
        """
        plan = self.plan()
        if steps_done is None:
            steps_done = self._start_step + self._yielded // self.micro_batches_per_step
        if not 0 <= steps_done <= plan.num_steps:
            raise ValueError(f"steps_done must be in [0, {plan.num_steps}], got {steps_done}")
        n = len(self.seq_lens)
        before = np.zeros(n, dtype=bool) if self._consumed is None else self._consumed
        consumed = before.copy()
        end = steps_done * self.num_replicas * self.micro_batches_per_step
        real = np.repeat(plan.padding[:end] == 0, np.diff(plan.offsets[: end + 1]))
        consumed[plan.samples[: plan.offsets[end]][real]] = True
        return {
            "version": _STATE_VERSION,
            "sampler": type(self).__name__,
            "epoch": self.epoch,
            "seed": self.seed,
            "num_samples": n,
            "consumed": np.packbits(consumed).tobytes(),
            "num_consumed": int(consumed.sum()),
            # To replay the same plan on the same ranks:
            "num_replicas": self.num_replicas,
            "micro_batches_per_step": self.micro_batches_per_step,
            "plan_excluded": np.packbits(before).tobytes(),
            "steps_done": int(steps_done),
        }

    def load_state_dict(self, state: dict) -> None:
        """Continue the epoch of ``state``. On the same number of ranks and micro-batches
        per step, the interrupted plan continues exactly; otherwise the samples it
        consumed are left out and the rest is planned for this sampler's ranks."""
        if state.get("version") != _STATE_VERSION:
            raise ValueError(f"unsupported sampler state version {state.get('version')!r}")
        n = len(self.seq_lens)
        if state["num_samples"] != n:
            raise ValueError(
                f"sampler state is for {state['num_samples']} samples, this dataset has {n}"
            )

        def unpack(key):
            return np.unpackbits(np.frombuffer(state[key], dtype=np.uint8), count=n).astype(bool)

        self.epoch = int(state["epoch"])
        self.seed = int(state["seed"])
        same_layout = (state["num_replicas"], state["micro_batches_per_step"]) == (
            self.num_replicas,
            self.micro_batches_per_step,
        )
        consumed = unpack("plan_excluded" if same_layout else "consumed")
        self._consumed = consumed if consumed.any() else None
        self._start_step = int(state["steps_done"]) if same_layout else 0
        self._plan = None
        self._yielded = 0


class AdaptiveBatchSampler(_PlannedBatchSampler):
    """Dual-constraint, rank-balanced batch sampler.

    Each micro-batch obeys ``sum_i S_i <= max_tokens`` (memory, M_mem) and
    ``cost_model(batch) <= max_cost`` (compute, M_comp) and never mixes ``group_keys``.
    Each optimizer step's ``W x K`` micro-batches come from a window of
    ``lookahead_steps`` steps sorted by cost, so one step holds micro-batches of similar
    cost, and are assigned to ranks (K each) by longest-processing-time first.

    Args:
        seq_lens: 1-D integer token counts, one per dataset index.
        max_tokens: memory cap, tokens per micro-batch.
        max_cost: compute cap in the cost model's unit. Default (None):
            ``max(cost of the heaviest sample alone, min over groups of the cost of a
            micro-batch of that group filled to max_tokens)``: every sample fits, the
            cheapest group is never cut below what memory allows, and heavier groups are
            cut to about that cost, which is what lets steps balance.
        cost_model: a ``CostModel``; default ``CostModel.default()`` (Wan 2.1 14B, H200).
        group_keys: optional per-sample keys (e.g. ``(frames, h, w)`` tuples or ints); a
            micro-batch never mixes keys. Default: the sequence length.
        num_replicas, rank: default from ``torch.distributed`` when initialized, else 1, 0.
        micro_batches_per_step: K, micro-batches per rank per optimizer step.
        shuffle, seed: deterministic shuffling from ``(seed, epoch)``; no global RNG.
        drop_last: drop the micro-batches that do not fill the last step (reported in the
            plan) instead of halving the largest micro-batches to fill it (and repeating
            samples only if nothing can be halved).
        lookahead_steps: how far the order departs from a plain shuffle: micro-batches are
            regrouped within windows of this many optimizer steps. 1 keeps the shuffled
            step order; larger windows balance better.
        balance: False gives the paper's form: dual caps, no cross-rank balancing.
        on_oversize: 'error' (default) raises on a sample that alone breaks a cap; 'skip'
            leaves such samples out with a warning (``plan().skipped`` lists them).
    """

    def __init__(
        self,
        seq_lens,
        max_tokens: int,
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
        lookahead_steps: int = 16,
        balance: bool = True,
        on_oversize: str = "error",
    ):
        super().__init__(
            seq_lens,
            max_tokens,
            max_cost=max_cost,
            cost_model=cost_model,
            group_keys=group_keys,
            num_replicas=num_replicas,
            rank=rank,
            micro_batches_per_step=micro_batches_per_step,
            shuffle=shuffle,
            seed=seed,
            drop_last=drop_last,
            balance=balance,
            lookahead_steps=lookahead_steps,
            on_oversize=on_oversize,
        )

    @property
    def max_cost(self) -> float:
        """The compute cap M_comp in use (the default is computed from the data)."""
        return self._effective_max_cost()

    def _effective_max_cost(self) -> float:
        if self._max_cost is None:
            self._max_cost = float(self._table.default_max_cost(self.max_tokens))
        return float(self._max_cost)


class EqualTokenBatchSampler(_PlannedBatchSampler):
    """The baseline video teams use today: same-key buckets, ``floor(max_tokens / S)``
    samples per micro-batch, micro-batches in random order dealt to ranks round-robin
    (each rank draws independently of the others' cost). Same interface as
    ``AdaptiveBatchSampler``; ``cost_model`` only predicts costs for reports."""

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
    ):
        super().__init__(
            seq_lens,
            max_tokens,
            max_cost=None,
            cost_model=cost_model,
            group_keys=group_keys,
            num_replicas=num_replicas,
            rank=rank,
            micro_batches_per_step=micro_batches_per_step,
            shuffle=shuffle,
            seed=seed,
            drop_last=drop_last,
            balance=False,
            lookahead_steps=1,
            on_oversize=on_oversize,
        )

    @property
    def max_cost(self) -> None:
        return None

    def _effective_max_cost(self) -> float:
        return _NO_COST_CAP

    def _reported_max_cost(self) -> None:
        return None


__all__: Sequence[str] = ["AdaptiveBatchSampler", "EqualTokenBatchSampler", "Plan"]
