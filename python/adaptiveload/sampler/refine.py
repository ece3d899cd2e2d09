"""Online refinement of the cost model: measured times per ``(seq_len, batch)`` kind replace
predicted costs, epoch after epoch, without breaking what keeps samples from being lost.

``Refinement`` owns the records and the learned times: a rank's records since the last
update, the most recent times of all ranks folded in rank order (the same on every rank),
their medians for the next epoch, and the medians the current epoch plans with; and its part of
a sampler's state (``state_dict``, ``load_state_dict``). The sampler asks it for the current
epoch's cost model (``active_model``) and rebuilds its table with it."""

from __future__ import annotations

import warnings
from collections import deque

import numpy as np

from adaptiveload.cost import CostModel
from adaptiveload.fit import Point, fit_cost_model
from adaptiveload.sampler.checks import positive_number
from adaptiveload.sampler.ranks import all_gather

# The most recent times kept per (seq_len, batch) kind, and the largest kind a cost model
# holds (as the C++ core checks them).
LEARN_WINDOW = 32
MAX_KIND_LEN, MAX_KIND_BATCH = 2**40 - 1, 2**24 - 1
# Measured kinds from which refinement also refits the fitted form.
REFIT_MIN_KINDS = 8

Kind = tuple[int, int]


def lower_median(times) -> float:
    """The median of ``times``, the lower middle value for an even count: of two records, a
    cold first run (always the slower) does not count."""
    ordered = sorted(times)
    return ordered[(len(ordered) - 1) // 2]


def refit(kinds: dict, base: CostModel) -> CostModel:
    """``fit_cost_model`` on measured kinds ``{(seq_len, batch): ms}``, coefficients rounded
    to 6 significant digits; ``base`` if they cannot be fitted."""
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


def _state_kind(entry, what: str) -> Kind:
    s, b = entry[0], entry[1]
    for name, v, top in (("seq_len", s, MAX_KIND_LEN), ("batch", b, MAX_KIND_BATCH)):
        if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= top:
            raise ValueError(f"sampler state: {what}: {name} = {v!r} is not valid")
    return s, b


def _unpack_entries(entries, key: str) -> dict:
    """``{kind: ms}`` (``active``) or ``{kind: [ms, ...]}`` (``history``) of a state's list."""
    if not isinstance(entries, list):
        raise ValueError(f"sampler state: 'learned_costs'[{key!r}] must be a list")
    kinds = {}
    for entry in entries:
        what = f"'learned_costs'[{key!r}] entry {entry!r}"
        if not isinstance(entry, list | tuple) or len(entry) != 3:
            raise ValueError(f"sampler state: {what} is not [seq_len, batch, ms]")
        kind = _state_kind(entry, what)
        times = [entry[2]] if key == "active" else entry[2]
        if (
            not isinstance(times, list | tuple)
            or not 1 <= len(times) <= LEARN_WINDOW
            or not all(positive_number(t) for t in times)
        ):
            raise ValueError(f"sampler state: {what}: times must be finite numbers > 0")
        if kind in kinds:
            raise ValueError(f"sampler state: {what}: kind given twice")
        kinds[kind] = float(times[0]) if key == "active" else [float(t) for t in times]
    return kinds


def unpack_learned(learned: dict | None) -> tuple[dict, dict]:
    """The learned times of a state's ``'learned_costs'``: ``(active, history)``, both keyed
    by ``(seq_len, batch)``; a state without that entry (None) learned nothing."""
    if learned is None:
        return {}, {}
    if not isinstance(learned, dict) or set(learned) != {"active", "history"}:
        raise ValueError(
            "sampler state: 'learned_costs' must be a dict with keys 'active' and 'history'"
        )
    return _unpack_entries(learned["active"], "active"), _unpack_entries(
        learned["history"], "history"
    )


class Refinement:
    """The learned times of one sampler.

    Args:
        base: the cost model the sampler was made with.
        max_cost: the compute cap as given (None: the sampler's default follows the model,
            and the fitted form may be refit to the measured kinds).
        owner: the sampler's name, for messages.
    """

    def __init__(self, base: CostModel, max_cost: float | None, owner: str):
        self.base = base
        self.max_cost = max_cost
        self.owner = owner
        #: this rank's records since the last update: kind -> [count, recent ms]
        self.records: dict[Kind, list] = {}
        #: the most recent ms of all ranks, folded
        self.history: dict[Kind, list[float]] = {}
        #: their medians, for the next epoch
        self.pending: dict[Kind, float] = {}
        #: the medians the current epoch plans with
        self.active: dict[Kind, float] = {}
        self._warned_scale = False
        self._warned_held: set[Kind] = set()

    def record(self, kind: Kind, ms: float) -> None:
        record = self.records.get(kind)
        if record is None:
            record = self.records[kind] = [0, deque(maxlen=LEARN_WINDOW)]
        record[0] += 1
        record[1].append(float(ms))

    def model(self, learned: dict) -> tuple[CostModel, list]:
        """The base cost model with its measured kinds updated by ``learned``, and the
        learned kinds held back: those that would make a sample break ``max_cost`` alone.

        With ``max_cost`` left to its default (the cap follows the model) and at least
        ``REFIT_MIN_KINDS`` measured kinds, the fitted form is refit to them as well
        (``fit_cost_model``, form chosen by held-out error), so that kinds not measured yet
        are costed on the measured scale; its coefficients are rounded to 6 significant
        digits, so that ranks whose floating point differs in the last bits still plan
        alike."""
        if not learned:
            return self.base, []
        cap = self.max_cost
        kinds, held = self.base.measured, []
        for kind, cost in learned.items():
            if cap is not None and kind[1] == 1 and cost > cap:
                held.append((kind, cost))
            else:
                kinds[kind] = cost
        kinds = dict(sorted(kinds.items()))
        base = self.base
        if cap is None and len(kinds) >= REFIT_MIN_KINDS:
            base = refit(kinds, base)
        return base.with_measured({**kinds, **self.base.measured_shares}), held

    def measured_over_fitted(self) -> float | None:
        if not self.pending:
            return None
        kinds = list(self.pending)
        fitted = self.base.uniform_costs(
            [s for s, _ in kinds], [b for _, b in kinds], fitted_only=True
        )
        learned = np.array(list(self.pending.values()))
        return float(lower_median((learned / fitted).tolist()))

    def update(self, process_group, distributed: bool) -> dict:
        """Fold the records of every rank (one tagged all-gather when ``distributed``) into
        the times of the next epoch; the report of ``update_cost_model``."""
        mine = {kind: (count, list(times)) for kind, (count, times) in self.records.items()}
        gathered = [mine]
        if distributed:
            gathered = all_gather(
                "update_cost_model", mine, f"{self.owner}.update_cost_model", process_group
            )
        self.records = {}
        folded = 0
        for records in gathered:
            for kind in sorted(records):
                count, times = records[kind]
                folded += count
                history = self.history.get(kind, []) + times
                self.history[kind] = history[-LEARN_WINDOW:]
        before = set(self.pending)
        self.pending = {kind: lower_median(t) for kind, t in sorted(self.history.items())}
        model, held = self.model(self.pending)
        ratio = self.measured_over_fitted()
        self._warn(held, ratio, "refit" in model.meta)
        return {
            "records": folded,
            "kinds": len(self.pending),
            "new_kinds": len(set(self.pending) - before),
            "measured_over_fitted": ratio,
        }

    def _warn(self, held: list, ratio: float | None, refits: bool) -> None:
        """Warnings of an update, each once: learned kinds held back by ``max_cost``, and
        measured times on another scale than the base model's (``ratio``, with no refit to
        follow)."""
        if any(kind not in self._warned_held for kind, _ in held):
            self._warned_held.update(kind for kind, _ in held)
            (s, _), cost = held[0]
            warnings.warn(
                f"{self.owner}: {len(held)} learned single-sample kind(s) exceed "
                f"max_cost = {self.max_cost:.6g}, the first {s} tokens at {cost:.6g} ms: "
                "they keep their predicted cost, so that no sample leaves the plan (raise "
                "max_cost to plan with them)",
                stacklevel=4,
            )
        if ratio is not None and not 0.5 <= ratio <= 2 and not refits and not self._warned_scale:
            self._warned_scale = True
            warnings.warn(
                f"{self.owner}: the measured times are {ratio:.3g}x what the base cost "
                "model predicts, so kinds not measured yet are costed on another scale than "
                "the measured ones: give a cost model calibrated on this setup, in ms",
                stacklevel=4,
            )

    def active_model(self) -> CostModel:
        """The cost model the current epoch plans with: the base one with ``active``."""
        return self.model(self.active)[0]

    def next_epoch(self) -> bool:
        """Another epoch plans with the times learned so far; whether they changed."""
        if self.pending == self.active:
            return False
        self.active = dict(self.pending)
        return True

    def state_dict(self) -> dict | None:
        """The ``'learned_costs'`` entry of a state (None when nothing was learned). Folded by
        every rank alike; records not yet folded are this rank's and stay out."""
        if not self.history:
            return None
        return {
            "active": [[s, b, ms] for (s, b), ms in sorted(self.active.items())],
            "history": [[s, b, list(t)] for (s, b), t in sorted(self.history.items())],
        }

    def load_state_dict(self, learned: dict | None) -> None:
        """The learned times of a state's ``'learned_costs'`` (None: nothing learned): those
        its epoch plans with, and those for the next epoch. This rank's records not folded
        yet are dropped."""
        active, history = unpack_learned(learned)
        self.history = history
        self.pending = {k: lower_median(t) for k, t in sorted(history.items())}
        self.active = active
        self.records = {}

    def snapshot(self) -> tuple:
        return self.active, self.history, self.pending, self.records

    def restore(self, snapshot: tuple) -> None:
        self.active, self.history, self.pending, self.records = snapshot
