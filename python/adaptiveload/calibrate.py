"""Calibrate the sampler's cost and memory models on the real GPU.

Every way times forward+backward of micro-batches of B samples of one shape with a timer
(``adaptiveload.timing``: ``StepTimer`` for any model given a function that runs one
forward+backward, ``ModelTimer`` for a random model of a family ``adaptiveload.models``
knows, ``WanTimer`` for Wan) and fits with ``adaptiveload.fit``:

- ``calibrate_grid`` (``calibrate_model`` for any model, ``calibrate_family``,
  ``calibrate_wan``): a fixed grid of shapes and batch sizes (``grid``); the fitted form only.
- ``calibrate_plan``: plan-aware. Plans the user's own dataset with the sampler, measures the
  micro-batch kinds ``(S, B)`` the plan uses (and with sequence parallelism the shares
  ``(S, B, d)`` its split micro-batches give one rank), re-plans with what was measured,
  measures the new kinds, and so on until the plan uses no kind left to measure. The model is exact on the
  measured kinds and falls back to a form fitted to them elsewhere. Resumable: every
  measurement is appended to a JSON-lines file as it is made.

``adaptiveload calibrate`` is the command line of both (``--metadata`` selects the second,
``--model FAMILY/CONFIG`` the model).

``measure_memory_points`` measures time and peak memory of micro-batch kinds with each number
``n`` of activation-checkpointed blocks (``timer(..., checkpointed=n)``), the points of the
memory model of a checkpointing policy.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, field

import numpy as np
import torch

from adaptiveload.cost import DESCRIBES_MODEL, CostModel
from adaptiveload.fit import Point, fit_cost_model, fit_memory_model, heldout_errors
from adaptiveload.timing import ModelTimer, StepTimer, WanTimer, time_call  # noqa: F401
from adaptiveload.wan import SHAPES, TEXT_LEN, wan_seq_len


@dataclass
class Calibration:
    cost_model: CostModel
    memory_m0: float  # bytes
    memory_m1: float  # bytes per token
    points: list[Point] = field(default_factory=list)
    meta: dict = field(default_factory=dict)

    def errors(self) -> np.ndarray:
        return np.array([abs(p.rel_error) for p in self.points if p.rel_error is not None])

    def summary(self) -> dict:
        e = self.errors()
        return {
            "median_abs_rel_error": float(np.median(e)) if len(e) else None,
            "p90_abs_rel_error": float(np.percentile(e, 90)) if len(e) else None,
            "max_abs_rel_error": float(e.max()) if len(e) else None,
        }

    def suggest_max_tokens(self, memory_budget_bytes: float) -> int:
        """Largest token count per micro-batch whose predicted peak fits the budget."""
        if memory_budget_bytes <= self.memory_m0:
            raise ValueError(
                f"memory budget {memory_budget_bytes / 2**30:.1f} GiB is below the fixed part "
                f"{self.memory_m0 / 2**30:.1f} GiB of the memory model"
            )
        return int((memory_budget_bytes - self.memory_m0) / self.memory_m1)

    def to_dict(self) -> dict:
        d = self.cost_model.to_dict()
        d["meta"] = {**self.meta, **self.summary()}
        d["memory"] = {"m0_bytes": self.memory_m0, "m1_bytes_per_token": self.memory_m1}
        d["points"] = [asdict(p) for p in self.points]
        return d

    def to_json(self, path: str | os.PathLike) -> None:
        with open(path, "w") as f:
            json.dump(self.to_dict(), f, indent=2)
            f.write("\n")


def grid(max_tokens: int, shapes, seq_len=wan_seq_len) -> list[tuple[int, tuple[int, int, int]]]:
    """(batch, shape) pairs: each shape at batch 1, 2, a quarter, half and all of max_tokens
    (``seq_len``: tokens of a shape, the family's geometry)."""
    pairs = []
    for shape in shapes:
        s = int(seq_len(*shape))
        full = max_tokens // s
        if full < 1:
            continue
        for b in sorted({1, 2, max(1, full // 4), max(1, full // 2), full}):
            if b <= full:
                pairs.append((b, tuple(shape)))
    return pairs


def wan_grid(max_tokens: int, shapes=SHAPES) -> list[tuple[int, tuple[int, int, int]]]:
    """``grid`` of Wan 2.1 shapes."""
    return grid(max_tokens, shapes, wan_seq_len)


def calibrate_grid(
    timer, shapes, seq_len, *, max_tokens: int, progress: bool = True, source: str = "calibrate"
) -> Calibration:
    """Time ``timer`` (a ``StepTimer``: any model) over ``grid(max_tokens, shapes, seq_len)``
    and fit the cost model and the memory model (peaks on CUDA only)."""
    pairs = grid(max_tokens, shapes, seq_len)
    if not pairs:
        raise ValueError(f"calibrate: no shape fits max_tokens = {max_tokens}")
    bar = _progress(len(pairs), progress)
    points = []
    for b, shape in pairs:
        ms, peak = timer(b, shape)
        points.append(Point(b, int(seq_len(*shape)), ms, peak, tuple(shape)))
        bar(f"B={b} S={points[-1].seq_len}: {ms:.1f} ms")
    cost = fit_cost_model(points)
    m0, m1 = fit_memory_model(points) if timer.device.type == "cuda" else (0.0, 1.0)
    cost.meta = {
        "source": source,
        **cost.meta,
        **timer.meta,
        **getattr(timer, "architecture", {}),
    }
    return Calibration(cost, m0, m1, points, dict(cost.meta))


def calibrate_model(
    step: Callable[[int, tuple, int | None], object],
    shapes,
    seq_len: Callable,
    *,
    max_tokens: int,
    device="cuda",
    layers: int | None = None,
    warmup: int = 2,
    repeat: int = 5,
    meta: dict | None = None,
    progress: bool = True,
) -> Calibration:
    """Calibrate any model: ``step(batch, shape, checkpointed)`` runs one forward+backward of
    ``batch`` samples of pixel shape ``shape`` (``checkpointed``: blocks under activation
    checkpointing, or None), ``seq_len(frames, height, width)`` counts a sample's tokens.
    Timed over ``grid(max_tokens, shapes, seq_len)``; returns the fitted ``Calibration``.

    For plan-aware calibration give ``StepTimer(step, ...)`` to ``calibrate_plan`` as its
    ``measure``; for the memory model of a checkpointing policy, ``StepTimer(step,
    layers=L)`` to ``calibrate_memory``."""
    timer = StepTimer(step, device=device, layers=layers, warmup=warmup, repeat=repeat, meta=meta)
    return calibrate_grid(
        timer, shapes, seq_len, max_tokens=max_tokens, progress=progress, source="calibrate_model"
    )


def calibrate_family(
    family,
    config: str | None = None,
    *,
    max_tokens: int = 151_200,
    shapes=None,
    progress: bool = True,
    **timer_args,
) -> Calibration:
    """Calibrate a randomly initialized model of a known family (``adaptiveload.models``) over
    ``grid`` of ``shapes`` (default the family's); ``timer_args`` go to ``ModelTimer``."""
    timer = ModelTimer(family, config, **timer_args)
    f = timer.family
    return calibrate_grid(
        timer,
        f.shapes if shapes is None else shapes,
        f.seq_len,
        max_tokens=max_tokens,
        progress=progress,
        source=f"calibrate_{f.name}",
    )


def calibrate_wan(
    config: str = "wan2.1-1.3B",
    *,
    max_tokens: int = 151_200,
    shapes=SHAPES,
    text_len: int = TEXT_LEN,
    progress: bool = True,
    **timer_args,
) -> Calibration:
    """Profile forward+backward of a randomly initialized Wan model over ``wan_grid`` and fit
    (``timer_args``: layers, device, dtype, fused, warmup, repeat, activation_checkpointing)."""
    timer = WanTimer(config, text_len=text_len, **timer_args)
    return calibrate_grid(
        timer, shapes, wan_seq_len, max_tokens=max_tokens, progress=progress, source="calibrate_wan"
    )


def kinds_of_plan(
    plan, seq_lens, shapes, *, references: bool = False
) -> dict[tuple[int, ...], tuple[int, ...]]:
    """The micro-batch kinds ``(S, B) -> shape`` of ``plan``, by increasing ``(S, B)``
    (micro-batches of mixed lengths have no kind and are left out); a micro-batch split over
    ``d > 1`` ranks (sequence parallelism) is the share ``(S, B, d)``.

    ``references``: with each share, also the same micro-batch split no more than it must (at
    the fewest ranks whose shares fit ``plan.max_tokens``: ``(S, B)`` where it fits one). The
    planner weighs what splitting adds against it (``mix_tolerance``), so a calibration that
    measured only the shares would price it by the fitted form, and mix where splitting costs
    more than the tolerance allows."""
    kinds: dict[tuple[int, ...], tuple[int, ...]] = {}
    sizes = np.diff(plan.offsets)
    degrees = plan.degrees
    for m in np.flatnonzero(sizes > 0):
        batch = plan.samples[plan.offsets[m] : plan.offsets[m + 1]]
        s = int(seq_lens[batch[0]])
        if np.all(seq_lens[batch] == s):
            b = int(sizes[m])
            d = 1 if degrees is None else int(degrees[m])
            shape = tuple(int(v) for v in shapes[batch[0]])
            kinds.setdefault((s, b) + ((d,) if d > 1 else ()), shape)
            if references and d > 1:
                least = 1  # member 0 holds ceil(S / d) tokens of each sample (share_tokens)
                while least < d and b * -(-s // least) > plan.max_tokens:
                    least *= 2
                kinds.setdefault((s, b) + ((least,) if least > 1 else ()), shape)
    return dict(sorted(kinds.items()))


def plan_kinds(
    sampler, shapes, epochs=(0,), *, references: bool = False
) -> dict[tuple[int, ...], tuple[int, ...]]:
    """The micro-batch kinds ``(S, B) -> shape`` that ``sampler``'s plans of ``epochs`` use
    (``kinds_of_plan`` of each, with ``references``)."""
    kinds: dict[tuple[int, ...], tuple[int, ...]] = {}
    for epoch in epochs:
        sampler.set_epoch(epoch)
        plan = sampler.plan()
        for kind, shape in kinds_of_plan(
            plan, sampler.seq_lens, shapes, references=references
        ).items():
            kinds.setdefault(kind, shape)
    return dict(sorted(kinds.items()))


def _drop_cut_line(path) -> None:
    """Cuts a file back to its last complete line (a line cut short by an interruption would
    otherwise run into the next one appended)."""
    if not os.path.exists(path):
        return
    with open(path, "rb+") as f:
        data = f.read()
        if data and not data.endswith(b"\n"):
            f.truncate(data.rfind(b"\n") + 1)


def _read_rows(path: str, header: dict, parse: Callable[[dict], object]) -> list:
    """The rows of a points file left by an interrupted measurement (a ``{"header": ...}``
    line, then one JSON object per measurement), each through ``parse``, after checking that
    it measured the same setup."""
    rows = []
    with open(path) as f:
        lines = [line for line in f if line.strip()]
    if not lines:
        return rows
    try:
        saved = json.loads(lines[0])["header"]
    except (json.JSONDecodeError, KeyError, TypeError):
        raise ValueError(f"{path}: not a calibration file (first line has no 'header')") from None
    differ = [k for k in header if saved.get(k) != header[k]]
    if differ:
        raise ValueError(
            f"{path} measured another setup; differences: "
            + ", ".join(f"{k}: file {saved.get(k)!r}, now {header[k]!r}" for k in differ)
            + " (use another --points file, or delete this one to start over)"
        )
    for n, line in enumerate(lines[1:], start=2):
        try:
            rows.append(parse(json.loads(line)))
        except (json.JSONDecodeError, KeyError, TypeError, ValueError):
            if n == len(lines):
                break  # a line cut short by the interruption
            raise ValueError(f"{path}:{n}: not a calibration point") from None
    return rows


def _resume(points_file, header: dict, parse: Callable[[dict], object]):
    """``(rows, out)``: the rows already in ``points_file`` (``_read_rows``) and the file open
    to append more, its header written if it is new; ``([], None)`` without a file."""
    if points_file is None:
        return [], None
    rows = []
    if os.path.exists(points_file):
        rows = _read_rows(os.fspath(points_file), header, parse)
    _drop_cut_line(points_file)
    out = open(points_file, "a")
    if os.path.getsize(points_file) == 0:
        out.write(json.dumps({"header": header}) + "\n")
        out.flush()
    return rows, out


def _point_of_row(d: dict) -> Point:
    return Point(
        int(d["batch"]),
        int(d["seq_len"]),
        float(d["ms"]),
        int(d["peak_bytes"]),
        tuple(d["shape"]) if d.get("shape") else None,
        degree=int(d.get("degree", 1)),
    )


def calibrate_plan(
    make_sampler: Callable[[CostModel], object],
    prior: CostModel,
    shapes,
    measure: Callable[[int, tuple], tuple[float, int]],
    *,
    epochs=(0,),
    points_file: str | os.PathLike | None = None,
    header: dict | None = None,
    max_rounds: int = 10,
    progress: bool = True,
) -> Calibration:
    """Plan-aware calibration: measure what ``sampler``'s own plans use.

    Round after round: ``make_sampler(model)`` (the user's sampler settings with this cost
    model) plans ``epochs``, the kinds ``(S, B)`` the plans use are collected
    (``plan_kinds``, ``shapes[i]`` the pixel shape of sample ``i``; with each share, the
    micro-batch it splits, which the planner weighs the share against),
    ``measure(B, shape) -> (ms, peak_bytes)`` measures the ones not yet measured
    (``measure(B, shape, degree=d)`` one rank's share of a micro-batch split ``d`` ways, where
    the sampler plans with sequence parallelism), and the
    model is refit; it stops when a round finds nothing new (or after ``max_rounds``,
    reported in ``meta``). Each round's model is ``fitted.with_measured(every measured kind)``,
    ``fitted`` being ``fit_cost_model``'s choice of form on the measured points (``prior``
    until there are 8). Leave the sampler's ``max_cost`` to its default (it follows the model)
    or give it in the model's unit.

    ``points_file``: JSON lines, one per measurement, appended as measured; a file left by an
    interrupted call with the same ``header`` is read back and its kinds are not measured
    again. ``meta`` reports rounds, kinds per round, time spent measuring, and the fallback's
    held-out error (k-fold over the measured kinds).
    """
    header = dict(header or {})
    points, out = _resume(points_file, header, _point_of_row)
    rounds: list[dict] = []
    t_measure = 0.0
    resumed = len(points)
    try:
        for r in range(max_rounds):
            model = _model_of(points, prior)
            kinds = plan_kinds(make_sampler(model), shapes, epochs, references=True)
            done = {p.kind for p in points}
            new = [k for k in kinds if k not in done]
            rounds.append({"round": r, "kinds_used": len(kinds), "kinds_new": len(new)})
            if not new:
                break
            bar = _progress(len(new), progress, f"round {r}")
            t_measure += _measure_kinds(new, kinds, measure, points, out, bar)
        model = _model_of(points, prior)
    finally:
        if out is not None:
            out.close()
    converged = rounds[-1]["kinds_new"] == 0
    cost = model
    meta = {
        "source": "calibrate_plan",
        **header,
        "rounds": rounds,
        "converged": converged,
        "kinds_measured": len(points),
        "kinds_resumed": resumed,
        "measure_seconds": round(t_measure, 1),
        "form": cost.meta.get("form"),
    }
    whole = [p for p in points if p.degree == 1]
    if len(whole) >= 8:
        e = np.abs(heldout_errors(whole, cost.meta.get("form", "additive")))
        meta["fallback_heldout_median"] = float(np.median(e))
        meta["fallback_heldout_p90"] = float(np.percentile(e, 90))
    predicted = cost.uniform_costs(
        [p.seq_len for p in whole], [p.batch for p in whole], fitted_only=True
    )
    for p, ms in zip(whole, predicted, strict=True):
        p.predicted_ms = float(ms)
    cost.meta = {**cost.meta, **meta}
    cuda = any(p.peak_bytes for p in whole)
    m0, m1 = fit_memory_model(whole) if cuda and len(whole) >= 2 else (0.0, 1.0)
    return Calibration(cost, m0, m1, points, meta)


def _measure_kinds(new, kinds: dict, measure, points: list, out, bar) -> float:
    """Measure each kind ``(S, B)`` or share ``(S, B, d)`` of ``new`` (``kinds[kind]``: its
    pixel shape), append its point to ``points`` (and to ``out``, JSON lines, as measured);
    the seconds spent."""
    seconds = 0.0
    for kind in new:
        s, b, d = (*kind, 1)[:3]
        t0 = time.perf_counter()
        ms, peak = measure(b, kinds[kind], degree=d) if d > 1 else measure(b, kinds[kind])
        seconds += time.perf_counter() - t0
        p = Point(b, s, float(ms), int(peak), kinds[kind], degree=d)
        points.append(p)
        if out is not None:
            out.write(json.dumps(asdict(p)) + "\n")
            out.flush()
        bar(f"B={b} S={s}" + (f" d={d}" if d > 1 else "") + f": {ms:.1f} ms")
    return seconds


def _model_of(points: list[Point], prior: CostModel) -> CostModel:
    """The fitted form on the whole micro-batches of ``points`` (``prior``'s until there are
    8, and ``prior``'s split_kept: whole micro-batches do not show it) with every point as a
    measured kind (a share as a measured share), and what ``prior``'s meta says of the model
    and the machine (``cost.DESCRIBES_MODEL``: its heads and all-to-all rates still price
    sequence parallelism's communication)."""
    whole = [p for p in points if p.degree == 1]
    fitted = fit_cost_model(whole) if len(whole) >= 8 else prior.fitted()
    if fitted.split_kept == (0.0, 0.0):
        fitted = fitted.with_split_kept(*prior.split_kept)
    model = fitted.with_measured({p.kind: p.ms for p in points})
    kept = {k: prior.meta[k] for k in DESCRIBES_MODEL if k in prior.meta}
    model.meta = {**kept, **fitted.meta}
    return model


def measure_memory_points(
    timer: StepTimer,
    kinds: Mapping[tuple[int, int], tuple[int, ...]],
    checkpointed: Iterable[int] | None = None,
    *,
    points_file: str | os.PathLike | None = None,
    log: Callable[[str], None] | None = print,
) -> list[dict]:
    """Time and peak memory of each micro-batch kind ``(S, B) -> shape`` of ``kinds`` (as
    ``kinds_of_plan`` returns them) with each ``n`` of ``checkpointed`` blocks (default every
    ``n`` in ``0..L``, ``L = timer.layers``): ``timer(B, shape, checkpointed=n)``.

    Returns one row per ``(S, B, n)``, by increasing ``(S, B)`` then ``n``::

        {"seq_len": S, "batch": B, "tokens": S * B, "checkpointed": n, "layers": L,
         "shape": [frames, height, width], "ms": float, "peak_bytes": int, "oom": false}

    ``peak_bytes`` as the timer accounts it (weights, gradients, inputs, activations; 0 off
    CUDA). A micro-batch that runs out of GPU memory is a row with ``"oom": true`` and
    ``ms``/``peak_bytes`` null, and the others go on.

    ``points_file``: JSON lines, a header (``timer.meta`` with ``L``) then each row as it is
    measured; the rows of a file left by an interrupted call with the same header are read back
    and not measured again. ``log`` (``None`` for silence) gets a line per point.
    """
    layers = timer.layers
    counts = range(layers + 1) if checkpointed is None else sorted({int(n) for n in checkpointed})
    bad = [n for n in counts if not 0 <= n <= layers]
    if bad:
        raise ValueError(f"measure_memory_points: checkpointed {bad} outside [0, L], L = {layers}")
    log = log or (lambda msg: None)
    # The constructor's default n does not change what a row measures.
    meta = {k: v for k, v in timer.meta.items() if k != "activation_checkpointing"}
    header = {"measure": "memory_points", **meta, "layers": layers}
    resumed, out = _resume(points_file, header, _memory_row)
    done = {(r["seq_len"], r["batch"], r["checkpointed"]): r for r in resumed}
    grid = [(int(s), int(b), n) for s, b in sorted(kinds) for n in counts]
    if resumed:
        log(f"{sum(k in done for k in grid)} of {len(grid)} points read back from {points_file}")
    rows = []
    try:
        for i, (s, b, n) in enumerate(grid):
            if (s, b, n) in done:
                rows.append(done[(s, b, n)])
                continue
            shape = [int(v) for v in kinds[(s, b)]]
            row = {
                "seq_len": s,
                "batch": b,
                "tokens": s * b,
                "checkpointed": n,
                "layers": layers,
                "shape": shape,
            }
            try:
                ms, peak = timer(b, tuple(shape), checkpointed=n)
                row.update(ms=float(ms), peak_bytes=int(peak), oom=False)
                msg = f"{ms:.1f} ms, peak {peak / 2**30:.2f} GiB"
            except torch.OutOfMemoryError:
                row.update(ms=None, peak_bytes=None, oom=True)
                msg = "out of memory"
            if row["oom"] and torch.cuda.is_initialized():
                torch.cuda.empty_cache()
            rows.append(row)
            if out is not None:
                out.write(json.dumps(row) + "\n")
                out.flush()
            log(f"[{i + 1}/{len(grid)}] S={s} B={b} n={n}/{layers}: {msg}")
    finally:
        if out is not None:
            out.close()
    return rows


def memory_kinds(shapes, max_tokens: int, seq_len=wan_seq_len):
    """The kinds a memory model is fitted on, as two maps ``(S, B) -> shape`` over the distinct
    pixel shapes: each shape alone and as 2 samples (``few``: measured at four ``n``), and as
    many samples as hold about 32k and 96k tokens (``many``: measured at ``n = 0`` and ``L``;
    per-sample memory, the text context of cross-attention in every block, is what sets
    micro-batches of many images apart). Kinds over ``max_tokens`` are left out."""
    few, many = {}, {}
    for shape in sorted({tuple(int(v) for v in s) for s in shapes}):
        s = int(seq_len(*shape))
        for b in (1, 2):
            if b * s <= max_tokens:
                few[(s, b)] = shape
        for tokens in (32768, 98304):
            b = tokens // s
            if b > 2 and b * s <= max_tokens:
                many[(s, b)] = shape
    return few, many


def calibrate_memory(
    timer: StepTimer, shapes, max_tokens: int, *, points_file=None, log=print, seq_len=None
):
    """Measure ``memory_kinds(shapes, max_tokens, seq_len)`` (``measure_memory_points``; resumable
    through ``points_file``) and fit the memory model with checkpointing
    (``fit.fit_checkpoint_memory_model``): a ``MemoryModel`` whose ``meta`` holds the fit's
    errors, the rows and the points that ran out of memory (left out of the fit)."""
    from adaptiveload.fit import fit_checkpoint_memory_model

    layers = timer.layers
    few, many = memory_kinds(shapes, max_tokens, wan_seq_len if seq_len is None else seq_len)
    rows = measure_memory_points(
        timer,
        few,
        checkpointed=sorted({0, layers // 2, max(layers - 1, 0), layers}),
        points_file=points_file,
        log=log,
    ) + measure_memory_points(
        timer, many, checkpointed=(0, layers), points_file=points_file, log=log
    )
    fit_rows = [r for r in rows if not r["oom"]]
    model = fit_checkpoint_memory_model(fit_rows, layers)
    model.meta |= {"out_of_memory": len(rows) - len(fit_rows), **timer.meta}
    return model, rows


def _memory_row(d: dict) -> dict:
    """A row of ``measure_memory_points``'s file, checked."""
    row = dict(d)
    for k in ("seq_len", "batch", "tokens", "checkpointed", "layers"):
        row[k] = int(d[k])
    row["oom"] = bool(d["oom"])
    row["ms"] = None if row["oom"] else float(d["ms"])
    row["peak_bytes"] = None if row["oom"] else int(d["peak_bytes"])
    return row


def _progress(total: int, enabled: bool, desc: str = "calibrating"):
    """A progress bar of ``total`` points (tqdm, a dependency of the ``wan`` extra that this
    module belongs to), or nothing when not ``enabled``."""
    from tqdm import tqdm

    bar = tqdm(total=total, desc=desc, unit="point", disable=not enabled)

    def update(msg):
        bar.set_postfix_str(msg)
        bar.update(1)
        if bar.n == total:
            bar.close()

    return update
