"""Calibrate the sampler's cost and memory models on the real GPU.

Two ways, both timing forward+backward of micro-batches of B samples of S tokens of a
randomly initialized Wan 2.1 configuration (``WanTimer``) and fitting with ``adaptiveload.fit``:

- ``calibrate_wan``: a fixed grid of shapes and batch sizes (``wan_grid``); the fitted form only.
- ``calibrate_plan``: plan-aware. Plans the user's own dataset with the sampler, measures the
  micro-batch kinds ``(S, B)`` the plan uses, re-plans with what was measured, measures the new
  kinds, and so on until the plan uses no kind left to measure. The model is exact on the
  measured kinds and falls back to a form fitted to them elsewhere. Resumable: every
  measurement is appended to a JSON-lines file as it is made.

``adaptiveload calibrate`` is the command line of both (``--metadata`` selects the second).

``measure_memory_points`` measures time and peak memory of micro-batch kinds with each number
``n`` of activation-checkpointed blocks (``WanTimer(..., checkpointed=n)``), the points of the
memory model of a checkpointing policy.
"""

from __future__ import annotations

import json
import os
import statistics
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, field

import numpy as np
import torch

from adaptiveload.cost import CostModel
from adaptiveload.fit import Point, fit_cost_model, fit_memory_model, heldout_errors
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


def time_call(
    fn: Callable[[], None], device: torch.device, warmup: int = 2, repeat: int = 5
) -> float:
    """Median milliseconds of ``fn()`` (CUDA events on a GPU, a synchronized clock elsewhere)."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeat):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        else:
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1000)
    return statistics.median(times)


def wan_grid(max_tokens: int, shapes=SHAPES) -> list[tuple[int, tuple[int, int, int]]]:
    """(batch, shape) pairs: each shape at batch 1, 2, a quarter, half and all of max_tokens."""
    grid = []
    for shape in shapes:
        s = wan_seq_len(*shape)
        full = max_tokens // s
        if full < 1:
            continue
        for b in sorted({1, 2, max(1, full // 4), max(1, full // 2), full}):
            if b <= full:
                grid.append((b, shape))
    return grid


class WanTimer:
    """Times forward+backward of one micro-batch of a randomly initialized Wan model:
    ``timer(batch, shape, checkpointed=None) -> (ms, peak_bytes)``, the median of ``repeat``
    timed calls after ``warmup`` untimed ones (the first call of a shape also builds its
    kernels' plans).

    ``checkpointed``: how many of the ``layers`` blocks run under activation checkpointing in
    this call (the first ones, ``set_checkpointed_blocks``); ``None`` is the constructor's
    choice, all blocks with ``activation_checkpointing`` and none without.

    ``peak_bytes``: ``torch.cuda.max_memory_allocated`` over the timed calls (0 off CUDA),
    which holds the weights, their gradients (allocated before the timed calls, as they are
    in every micro-batch of an optimizer step but the first), the inputs, and the micro-batch's
    activations and workspace at their highest; no optimizer state. The previous call's
    gradients are freed before a call, and its own after it.
    """

    def __init__(
        self,
        config: str = "wan2.1-1.3B",
        *,
        layers: int | None = None,
        device="cuda",
        dtype: torch.dtype = torch.bfloat16,
        fused: bool = True,
        text_len: int = TEXT_LEN,
        warmup: int = 2,
        repeat: int = 5,
        activation_checkpointing: bool = False,
    ):
        from adaptiveload.integrations.diffusers import set_checkpointed_blocks
        from adaptiveload.models.wan import build_wan

        self.device = torch.device(device)
        self.model = build_wan(config, layers=layers, device=self.device, dtype=dtype, fused=fused)
        self.layers = len(self.model.blocks)
        self.checkpointed = self.layers if activation_checkpointing else 0
        set_checkpointed_blocks(self.model, self.checkpointed)
        self.text_len, self.warmup, self.repeat = text_len, warmup, repeat
        self.meta = {
            "config": config,
            "layers": layers,
            "dtype": str(dtype),
            "fused": fused,
            "activation_checkpointing": activation_checkpointing,
            "text_len": text_len,
            "device": torch.cuda.get_device_name(self.device)
            if self.device.type == "cuda"
            else "cpu",
        }

    def __call__(self, batch: int, shape, checkpointed: int | None = None) -> tuple[float, int]:
        from adaptiveload.integrations.diffusers import set_checkpointed_blocks
        from adaptiveload.models.wan import random_batch

        set_checkpointed_blocks(
            self.model, self.checkpointed if checkpointed is None else checkpointed
        )
        self.model.zero_grad(set_to_none=True)
        inputs = random_batch(self.model, batch, *shape, text_len=self.text_len)

        def step():
            out = self.model(**inputs, return_dict=False)[0]
            out.float().square().mean().backward()

        cuda = self.device.type == "cuda"
        try:
            for _ in range(self.warmup):
                step()
            for p in self.model.parameters():
                if p.requires_grad and p.grad is None:
                    p.grad = torch.zeros_like(p)
            if cuda:
                torch.cuda.empty_cache()
                torch.cuda.reset_peak_memory_stats(self.device)
            ms = time_call(step, self.device, warmup=0, repeat=self.repeat)
            peak = torch.cuda.max_memory_allocated(self.device) if cuda else 0
        finally:
            self.model.zero_grad(set_to_none=True)
        return ms, int(peak)


def calibrate_wan(
    config: str = "wan2.1-1.3B",
    *,
    layers: int | None = None,
    device="cuda",
    dtype: torch.dtype = torch.bfloat16,
    fused: bool = True,
    max_tokens: int = 151_200,
    shapes=SHAPES,
    text_len: int = TEXT_LEN,
    warmup: int = 2,
    repeat: int = 5,
    activation_checkpointing: bool = False,
    progress: bool = True,
) -> Calibration:
    """Profile forward+backward of a randomly initialized Wan model over ``wan_grid`` and fit."""
    timer = WanTimer(
        config,
        layers=layers,
        device=device,
        dtype=dtype,
        fused=fused,
        text_len=text_len,
        warmup=warmup,
        repeat=repeat,
        activation_checkpointing=activation_checkpointing,
    )
    grid = wan_grid(max_tokens, shapes)
    bar = _progress(len(grid), progress)
    points = []
    for b, shape in grid:
        ms, peak = timer(b, shape)
        points.append(Point(b, wan_seq_len(*shape), ms, peak, tuple(shape)))
        bar(f"B={b} S={points[-1].seq_len}: {ms:.1f} ms")
    cost = fit_cost_model(points)
    m0, m1 = fit_memory_model(points) if timer.device.type == "cuda" else (0.0, 1.0)
    cost.meta = {"source": "calibrate_wan", **cost.meta, **timer.meta}
    return Calibration(cost, m0, m1, points, dict(cost.meta))


def kinds_of_plan(plan, seq_lens, shapes) -> dict[tuple[int, int], tuple[int, ...]]:
    """The micro-batch kinds ``(S, B) -> shape`` of ``plan``, by increasing ``(S, B)``
    (micro-batches of mixed lengths have no kind and are left out)."""
    kinds: dict[tuple[int, int], tuple[int, ...]] = {}
    sizes = np.diff(plan.offsets)
    for m in np.flatnonzero(sizes > 0):
        batch = plan.samples[plan.offsets[m] : plan.offsets[m + 1]]
        s = int(seq_lens[batch[0]])
        if np.all(seq_lens[batch] == s):
            kinds.setdefault((s, int(sizes[m])), tuple(int(v) for v in shapes[batch[0]]))
    return dict(sorted(kinds.items()))


def plan_kinds(sampler, shapes, epochs=(0,)) -> dict[tuple[int, int], tuple[int, ...]]:
    """The micro-batch kinds ``(S, B) -> shape`` that ``sampler``'s plans of ``epochs`` use
    (``kinds_of_plan`` of each)."""
    kinds: dict[tuple[int, int], tuple[int, ...]] = {}
    for epoch in epochs:
        sampler.set_epoch(epoch)
        for kind, shape in kinds_of_plan(sampler.plan(), sampler.seq_lens, shapes).items():
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
    (``plan_kinds``, ``shapes[i]`` the pixel shape of sample ``i``),
    ``measure(B, shape) -> (ms, peak_bytes)`` measures the ones not yet measured, and the
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
            kinds = plan_kinds(make_sampler(model), shapes, epochs)
            done = {(p.seq_len, p.batch) for p in points}
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
    if len(points) >= 8:
        e = np.abs(heldout_errors(points, cost.meta.get("form", "additive")))
        meta["fallback_heldout_median"] = float(np.median(e))
        meta["fallback_heldout_p90"] = float(np.percentile(e, 90))
    predicted = cost.uniform_costs(
        [p.seq_len for p in points], [p.batch for p in points], fitted_only=True
    )
    for p, ms in zip(points, predicted, strict=True):
        p.predicted_ms = float(ms)
    cost.meta = {**cost.meta, **meta}
    cuda = any(p.peak_bytes for p in points)
    m0, m1 = fit_memory_model(points) if cuda and len(points) >= 2 else (0.0, 1.0)
    return Calibration(cost, m0, m1, points, meta)


def _measure_kinds(new, kinds: dict, measure, points: list, out, bar) -> float:
    """Measure each kind ``(S, B)`` of ``new`` (``kinds[(S, B)]``: its pixel shape), append
    its point to ``points`` (and to ``out``, JSON lines, as measured); the seconds spent."""
    seconds = 0.0
    for s, b in new:
        t0 = time.perf_counter()
        ms, peak = measure(b, kinds[(s, b)])
        seconds += time.perf_counter() - t0
        p = Point(b, s, float(ms), int(peak), kinds[(s, b)])
        points.append(p)
        if out is not None:
            out.write(json.dumps(asdict(p)) + "\n")
            out.flush()
        bar(f"B={b} S={s}: {ms:.1f} ms")
    return seconds


def _model_of(points: list[Point], prior: CostModel) -> CostModel:
    """The fitted form on ``points`` (``prior``'s until there are 8) with every point as a
    measured kind."""
    fitted = fit_cost_model(points) if len(points) >= 8 else prior.fitted()
    model = fitted.with_measured({(p.seq_len, p.batch): p.ms for p in points})
    model.meta = dict(fitted.meta)
    return model


def measure_memory_points(
    timer: WanTimer,
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

    ``peak_bytes`` as ``WanTimer`` accounts it (weights, gradients, inputs, activations; 0 off
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
            row = {"seq_len": s, "batch": b, "tokens": s * b, "checkpointed": n,
                   "layers": layers, "shape": shape}  # fmt: skip
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


def memory_kinds(shapes, max_tokens: int):
    """The kinds a memory model is fitted on, as two maps ``(S, B) -> shape`` over the distinct
    pixel shapes: each shape alone and as 2 samples (``few``: measured at four ``n``), and as
    many samples as hold about 32k and 96k tokens (``many``: measured at ``n = 0`` and ``L``;
    per-sample memory, the text context of cross-attention in every block, is what sets
    micro-batches of many images apart). Kinds over ``max_tokens`` are left out."""
    few, many = {}, {}
    for shape in sorted({tuple(int(v) for v in s) for s in shapes}):
        s = wan_seq_len(*shape)
        for b in (1, 2):
            if b * s <= max_tokens:
                few[(s, b)] = shape
        for tokens in (32768, 98304):
            b = tokens // s
            if b > 2 and b * s <= max_tokens:
                many[(s, b)] = shape
    return few, many


def calibrate_memory(timer: WanTimer, shapes, max_tokens: int, *, points_file=None, log=print):
    """Measure ``memory_kinds(shapes, max_tokens)`` (``measure_memory_points``; resumable
    through ``points_file``) and fit the memory model with checkpointing
    (``fit.fit_checkpoint_memory_model``): a ``MemoryModel`` whose ``meta`` holds the fit's
    errors, the rows and the points that ran out of memory (left out of the fit)."""
    from adaptiveload.fit import fit_checkpoint_memory_model

    layers = timer.layers
    few, many = memory_kinds(shapes, max_tokens)
    rows = measure_memory_points(
        timer, few, checkpointed=sorted({0, layers // 2, max(layers - 1, 0), layers}),
        points_file=points_file, log=log,
    ) + measure_memory_points(
        timer, many, checkpointed=(0, layers), points_file=points_file, log=log
    )  # fmt: skip
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
