"""Memory of a micro-batch with activation checkpointing, and the policy that spends the
headroom under a memory budget on speed.

``MemoryModel`` predicts the peak memory of a training step on one micro-batch of ``B``
samples holding ``T`` tokens when the first ``n`` of the model's ``L`` blocks are
checkpointed::

    peak(B, T, n) = m0 + B * (mb + mbk*max(L - n, 1))
                       + T * (mt + ma*max(L - n, 1) + mc*n + [n > 0]*mr)      (bytes)

(``m0`` weights and gradients; ``mb`` per sample; ``mbk`` per sample per block that keeps its
activations, its text context in cross-attention; ``mt`` per token whatever the policy;
``ma`` per token per block that keeps its activations, ``max(L - n, 1)`` of them because with
every block checkpointed one block's activations are rebuilt in its backward; ``mc`` per token
per checkpointed block, its saved input; ``mr`` what recomputation adds besides). ``fit.fit_checkpoint_memory_model`` fits it to measured peaks.

The policy of a micro-batch is the fewest ``n`` with ``peak * (1 + margin) <= budget``;
``margin`` is fitted from the worst under-prediction on measured points. A micro-batch with
``n`` checkpointed blocks takes ``1 - recompute_share * (L - n) / L`` of the time of one with
all ``L``. The sampler plans with it (``AdaptiveBatchSampler(memory_model=...,
memory_budget_gib=...)``): packing obeys the budget, costs include the policy, and the
plan records ``n`` per micro-batch. ``CheckpointPolicy`` is what a training loop asks, per
micro-batch, with the fallback to full checkpointing after an out-of-memory error.
"""

from __future__ import annotations

import json
import math
import os
import warnings

import numpy as np

from adaptiveload import _sampler

GIB = 2**30
_COEFS = ("m0", "mb", "mbk", "mt", "ma", "mc", "mr")


def _lens(seq_lens) -> np.ndarray:
    a = np.asarray(seq_lens, dtype=np.int64).reshape(-1)
    if a.size == 0 or (a < 1).any():
        raise ValueError(
            f"seq_lens must be a non-empty list of token counts >= 1, got {seq_lens!r}"
        )
    return a


def held_lengths(seq_lens, degree: int = 1) -> np.ndarray:
    """The tokens of each sample one rank holds: all of them, or, split over ``degree`` ranks
    (sequence parallelism), its largest share (the planner's cut: the first ``S % d`` shares
    one token longer). A rank's memory is that of a micro-batch of these lengths."""
    lens = _lens(seq_lens)
    if isinstance(degree, bool) or not isinstance(degree, (int, np.integer)) or degree < 1:
        raise ValueError(f"degree must be an integer >= 1, got {degree!r}")
    return -(-lens // int(degree))


def held_bytes(held_per_token, seq_lens, degree: int = 1) -> float:
    """What a member of a micro-batch of these samples split over ``degree`` ranks holds per
    kept block beyond its share (``MemoryModel``'s ``held``): ``held_per_token`` at the degree
    (a list per degree 1, 2, 4, ..: ``cost.sequence_parallel_held_bytes_of``, the ring's keys
    and values) times the samples' tokens; 0 unsplit or where the list stops."""
    level = int(degree).bit_length() - 1
    if degree <= 1 or level >= len(held_per_token):
        return 0.0
    return float(held_per_token[level]) * float(_lens(seq_lens).sum())


# The most blocks a model may have (MemoryModel::kMaxBlocks in the C++ core): far above any
# DiT's, so a count past it is a mistake.
_MAX_BLOCKS = 10000


def _held_arg(held) -> float:
    if isinstance(held, bool) or not isinstance(held, (int, float)) or not 0 <= held < math.inf:
        raise ValueError(f"held must be a finite number of bytes >= 0, got {held!r}")
    return float(held)


class MemoryModel:
    """Peak memory of a micro-batch as a function of its samples and of how many of the
    model's ``num_blocks`` blocks run with activation checkpointing (see the module doc)."""

    def __init__(
        self,
        num_blocks: int,
        *,
        m0: float,
        ma: float,
        mb: float = 0.0,
        mbk: float = 0.0,
        mt: float = 0.0,
        mc: float = 0.0,
        mr: float = 0.0,
        margin: float = 0.0,
        recompute_share: float = 0.0,
        meta: dict | None = None,
    ):
        if (
            isinstance(num_blocks, bool | np.bool_)
            or not isinstance(num_blocks, int | np.integer)
            or not 1 <= num_blocks <= _MAX_BLOCKS
        ):
            raise ValueError(
                f"MemoryModel: num_blocks must be an integer in [1, {_MAX_BLOCKS}] (the model's "
                f"transformer blocks), got {num_blocks!r}"
            )
        self._core = _sampler.MemoryModel(
            num_blocks=int(num_blocks),
            m0=float(m0),
            mb=float(mb),
            mbk=float(mbk),
            mt=float(mt),
            ma=float(ma),
            mc=float(mc),
            mr=float(mr),
            margin=float(margin),
            recompute_share=float(recompute_share),
        )
        self.meta = dict(meta or {})

    native = property(
        lambda self: self._core, doc="The C++ model the planner's sample table reads."
    )
    num_blocks = property(lambda self: self._core.num_blocks)
    margin = property(lambda self: self._core.margin)
    recompute_share = property(lambda self: self._core.recompute_share)

    def coefficients(self) -> dict:
        return {k: getattr(self._core, k) for k in _COEFS}

    def peak_bytes(self, seq_lens, checkpointed: int, held: float = 0.0) -> float:
        """Predicted peak of a micro-batch of these samples with ``checkpointed`` blocks, plus
        ``held`` bytes per kept block (``held_bytes``: a ring member's keys and values)."""
        lens = _lens(seq_lens)
        n = self._blocks_arg(checkpointed)
        return self._core.peak(len(lens), int(lens.sum()), n, _held_arg(held))

    def checkpointed_blocks(self, seq_lens, budget_bytes: float, held: float = 0.0) -> int:
        """The fewest checkpointed blocks that keep this micro-batch (and ``held`` bytes per
        kept block) within the budget, with the margin; -1 when even all of them do not (such
        a micro-batch is never planned)."""
        lens = _lens(seq_lens)
        return self._core.checkpointed_blocks(
            len(lens), int(lens.sum()), float(budget_bytes), _held_arg(held)
        )

    def share_peak_bytes(
        self, seq_lens, degree: int, checkpointed: int, held_per_token=()
    ) -> float:
        """``peak_bytes`` of one member's share of a micro-batch of these samples split over
        ``degree`` ranks: its ``held_lengths`` and, per kept block, ``held_bytes`` (the ring's
        keys and values; ``held_per_token`` per degree 1, 2, 4, ..). ``degree`` 1: the whole."""
        ring = held_bytes(held_per_token, seq_lens, degree)
        return self.peak_bytes(held_lengths(seq_lens, degree), checkpointed, ring)

    def share_blocks(self, seq_lens, degree: int, budget_bytes: float, held_per_token=()) -> int:
        """``checkpointed_blocks`` of one member's share, as ``share_peak_bytes`` counts it:
        the planner's choice for a listing of that degree (``MemoryPolicy::share_blocks``)."""
        ring = held_bytes(held_per_token, seq_lens, degree)
        return self.checkpointed_blocks(held_lengths(seq_lens, degree), budget_bytes, ring)

    def max_tokens(self, budget_bytes: float, batch: int = 1) -> int:
        """The most tokens ``batch`` samples may hold and still fit with every block
        checkpointed (0 if none)."""
        lo, hi = 0, 1
        while self._core.checkpointed_blocks(batch, hi, budget_bytes) >= 0:
            lo, hi = hi, hi * 2
            if hi > 2**50:
                return lo
        while hi - lo > 1:
            mid = (lo + hi) // 2
            ok = self._core.checkpointed_blocks(batch, mid, budget_bytes) >= 0
            lo, hi = (mid, hi) if ok else (lo, mid)
        return lo

    def time_factor(self, checkpointed: int) -> float:
        return self._core.time_factor(self._blocks_arg(checkpointed))

    def _blocks_arg(self, n) -> int:
        if isinstance(n, bool) or not isinstance(n, (int, np.integer)):
            raise ValueError(f"checkpointed must be an int, got {n!r}")
        if not 0 <= n <= self.num_blocks:
            raise ValueError(f"checkpointed must be in [0, {self.num_blocks}], got {n}")
        return int(n)

    # -- files ----------------------------------------------------------------------------
    def to_dict(self) -> dict:
        return {
            "num_blocks": self.num_blocks,
            **self.coefficients(),
            "margin": self.margin,
            "recompute_share": self.recompute_share,
            "meta": self.meta,
        }

    @classmethod
    def from_dict(cls, d: dict) -> MemoryModel:
        if not isinstance(d, dict):
            raise ValueError(f"memory model: expected a dict, got {type(d).__name__}")
        missing = [k for k in ("num_blocks", "m0", "ma") if k not in d]
        if missing:
            raise ValueError(f"memory model: missing {missing}")
        unknown = sorted(set(d) - {"num_blocks", *_COEFS, "margin", "recompute_share", "meta"})
        if unknown:
            raise ValueError(f"memory model: unknown fields {unknown}")
        return cls(
            d["num_blocks"],
            **{k: d[k] for k in (*_COEFS, "margin", "recompute_share") if k in d},
            meta=d.get("meta"),
        )

    def save(self, path: str | os.PathLike) -> None:
        with open(path, "w") as f:
            json.dump(self.to_dict(), f, indent=2)
            f.write("\n")

    @classmethod
    def load(cls, path: str | os.PathLike) -> MemoryModel:
        with open(path) as f:
            d = json.load(f)
        # A calibration file holds the memory model under "memory_model".
        return cls.from_dict(d.get("memory_model", d) if isinstance(d, dict) else d)

    def __getstate__(self) -> dict:
        return self.to_dict()

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(MemoryModel.from_dict(state).__dict__)

    def __eq__(self, other) -> bool:
        return isinstance(other, MemoryModel) and self.to_dict() == other.to_dict()

    def __repr__(self) -> str:
        return repr(self._core)


class CheckpointPolicy:
    """What a training loop asks per micro-batch: how many blocks to checkpoint.

    ``blocks_for(seq_lens)`` is the planner's choice (the same function of the micro-batch's
    sample count and tokens), except for kinds ``(B, T)`` that ran out of memory once
    (``on_oom``): those run with every block checkpointed for the rest of the run.
    ``check_peak`` compares a measured peak with the budget and the prediction and logs
    micro-batches over the budget. ``report()`` sums it up.

    ``reserved_gib``: memory the training process holds that the memory model does not (the
    optimizer state: calibration times forward+backward only). Micro-batches are planned
    within ``budget_gib``; measured peaks are compared with ``budget_gib + reserved_gib`` and
    with the prediction plus ``reserved_gib``. ``held_per_token``: per degree 1, 2, 4, .. what
    a member of a split micro-batch holds beyond its share (``held_bytes``; the sampler's
    ``memory_policy()`` passes the planner's).
    """

    def __init__(
        self,
        model: MemoryModel,
        budget_gib: float,
        *,
        reserved_gib: float = 0.0,
        log=None,
        held_per_token=(),
    ):
        if not (
            isinstance(budget_gib, (int, float)) and math.isfinite(budget_gib) and budget_gib > 0
        ):
            raise ValueError(f"budget_gib must be a finite number > 0, got {budget_gib!r}")
        self.model = model
        self.budget_gib = float(budget_gib)
        self.budget_bytes = self.budget_gib * GIB
        if not (isinstance(reserved_gib, (int, float)) and 0 <= reserved_gib < math.inf):
            raise ValueError(f"reserved_gib must be a finite number >= 0, got {reserved_gib!r}")
        self.reserved_bytes = float(reserved_gib) * GIB
        self.held_per_token = [float(_held_arg(h)) for h in held_per_token]
        self.log = log if log is not None else (lambda msg: warnings.warn(msg, stacklevel=3))
        self.fallbacks: dict[tuple[int, int], int] = {}  # kind -> OOMs seen
        self.over_budget: list[dict] = []
        self.peaks: list[dict] = []

    @staticmethod
    def kind(seq_lens, degree: int = 1) -> tuple[int, int]:
        """(samples, tokens) a rank holds of the micro-batch (its share at ``degree`` > 1)."""
        lens = held_lengths(seq_lens, degree)
        return len(lens), int(lens.sum())

    def planned_blocks(self, seq_lens, degree: int = 1) -> int:
        """The plan's choice for this micro-batch, or with ``degree`` > 1 for one rank's share
        of it (no fallback); -1 if it does not fit."""
        return self.model.share_blocks(seq_lens, degree, self.budget_bytes, self.held_per_token)

    def blocks_for(self, seq_lens, degree: int = 1) -> int:
        """Blocks to checkpoint for this micro-batch (``degree``: the plan's, ``mb.degree``)."""
        if self.kind(seq_lens, degree) in self.fallbacks:
            return self.model.num_blocks
        n = self.planned_blocks(seq_lens, degree)
        if n < 0:
            batch, tokens = self.kind(seq_lens, degree)
            held = f" (this rank's share of {degree})" if degree > 1 else ""
            raise ValueError(
                f"a micro-batch of {batch} sample(s), {tokens} tokens{held} does not fit the "
                f"memory budget of {self.budget_gib:g} GiB even with every block checkpointed "
                "(was it planned with this budget?)"
            )
        return n

    def on_oom(self, seq_lens, degree: int = 1) -> bool:
        """Record an out-of-memory error of this micro-batch. Returns True when it should be
        retried with every block checkpointed (its kind was not yet on full checkpointing);
        False when it ran out of memory with full checkpointing already (re-raise).

        Not for a split micro-batch (``degree`` > 1): its members must checkpoint the same
        blocks (a checkpointed block re-runs its all-to-alls in the backward), and a fallback
        recorded by the one member that ran out of memory would part them. Raises
        ``ValueError``; re-raise the out-of-memory error instead."""
        if degree != 1:
            raise ValueError(
                f"on_oom: a micro-batch split over {degree} ranks cannot fall back alone (its "
                "members must checkpoint the same blocks); re-raise the out-of-memory error"
            )
        k = self.kind(seq_lens)
        first = k not in self.fallbacks
        self.fallbacks[k] = self.fallbacks.get(k, 0) + 1
        if first:
            self.log(
                f"out of memory on a micro-batch of {k[0]} sample(s), {k[1]} tokens, planned with "
                f"{self.planned_blocks(seq_lens)} checkpointed blocks: this kind runs with all "
                f"{self.model.num_blocks} checkpointed for the rest of the run"
            )
        return first

    def check_peak(self, seq_lens, checkpointed: int, peak_bytes: float, degree: int = 1) -> bool:
        """Compare a measured peak (of a rank's share at ``degree``) with the prediction; True
        when within the budget."""
        predicted = (
            self.model.share_peak_bytes(seq_lens, degree, checkpointed, self.held_per_token)
            + self.reserved_bytes
        )
        batch, tokens = self.kind(seq_lens, degree)
        row = {
            "batch": batch,
            "tokens": tokens,
            "checkpointed": int(checkpointed),
            "peak_bytes": float(peak_bytes),
            "predicted_bytes": predicted,
        }
        self.peaks.append(row)
        limit = self.budget_bytes + self.reserved_bytes
        ok = peak_bytes <= limit
        if not ok:
            self.over_budget.append(row)
            self.log(
                f"micro-batch of {row['batch']} sample(s), {row['tokens']} tokens, "
                f"{checkpointed} checkpointed blocks: measured peak {peak_bytes / GIB:.2f} GiB "
                f"over the budget of {limit / GIB:.2f} GiB (predicted {predicted / GIB:.2f} GiB)"
            )
        return ok

    def report(self) -> dict:
        peaks = np.array([r["peak_bytes"] for r in self.peaks], float)
        pred = np.array([r["predicted_bytes"] for r in self.peaks], float)
        out = {
            "micro_batches": len(self.peaks),
            "over_budget": len(self.over_budget),
            "oom_fallback_kinds": len(self.fallbacks),
        }
        if len(peaks):
            util = peaks / (self.budget_bytes + self.reserved_bytes)
            err = (pred - peaks) / peaks
            out |= {
                "peak_over_budget_mean": float(util.mean()),
                "peak_over_budget_p10": float(np.percentile(util, 10)),
                "peak_over_budget_max": float(util.max()),
                "prediction_error_median": float(np.median(np.abs(err))),
                "prediction_under_max": float(max(0.0, -err.min())),
            }
        return out


__all__ = ["GIB", "CheckpointPolicy", "MemoryModel", "held_bytes", "held_lengths"]
