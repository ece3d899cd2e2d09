"""Calibrate the sampler's cost and memory models on the real GPU.

``calibrate_wan`` times forward+backward of micro-batches of B samples of S tokens and
reads their peak memory; ``fit_cost_model`` fits ``time = c0 + B * (cs + c1*S + c2*S^2)``
(ms) by non-negative least squares on relative error, ``fit_memory_model`` fits
``peak = m0 + m1 * B * S`` (bytes). ``calibrate_wan`` does all of it for a Wan 2.1
configuration; ``adaptiveload calibrate`` is its command line.
"""

from __future__ import annotations

import json
import os
import statistics
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field

import numpy as np
import torch

from adaptiveload.cost import CostModel
from adaptiveload.seqlen import wan_seq_len

# (frames, height, width) in pixels: images, 480p and 720p clips up to 81 frames.
WAN_SHAPES = [
    (1, 480, 832),
    (1, 720, 1280),
    (17, 480, 832),
    (33, 480, 832),
    (49, 480, 832),
    (81, 480, 832),
    (49, 720, 1280),
    (81, 720, 1280),
]


@dataclass
class Point:
    batch: int
    seq_len: int
    ms: float
    peak_bytes: int
    shape: tuple[int, int, int] | None = None
    predicted_ms: float | None = None

    @property
    def rel_error(self) -> float | None:
        return None if self.predicted_ms is None else (self.predicted_ms - self.ms) / self.ms


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


def _nonneg_lstsq(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Least squares with x >= 0 (active set on the few columns we have)."""
    cols = list(range(a.shape[1]))
    while True:
        x = np.zeros(a.shape[1])
        if cols:
            x[cols] = np.linalg.lstsq(a[:, cols], b, rcond=None)[0]
        neg = [c for c in cols if x[c] < 0]
        if not neg:
            return x
        cols.remove(min(neg, key=lambda c: x[c]))


def fit_cost_model(points: Iterable[Point]) -> CostModel:
    """``time = c0 + B*(cs + c1*S + c2*S^2)``, non-negative coefficients, relative-error fit.
    ``cs`` is work per sample that does not grow with S (e.g. the text conditioning)."""
    pts = list(points)
    if len(pts) < 4:
        raise ValueError(f"need at least 4 calibration points, got {len(pts)}")
    b = np.array([p.batch for p in pts], float)
    s = np.array([p.seq_len for p in pts], float)
    t = np.array([p.ms for p in pts], float)
    if np.any(t <= 0):
        raise ValueError("calibration times must be > 0")
    a = np.stack([np.ones_like(s), b, b * s, b * s * s], axis=1) / t[:, None]
    c0, cs, c1, c2 = _nonneg_lstsq(a, np.ones_like(t))
    if c1 + c2 <= 0:
        raise ValueError("calibration points do not grow with tokens; cannot fit a cost model")
    model = CostModel.polynomial(c0, c1, c2, per_sample=cs, unit="ms")
    for p in pts:
        p.predicted_ms = model.batch_cost([p.seq_len] * p.batch)
    return model


def fit_memory_model(points: Iterable[Point]) -> tuple[float, float]:
    """``peak = m0 + m1 * tokens`` in bytes (ordinary least squares, m1 > 0)."""
    pts = list(points)
    tokens = np.array([p.batch * p.seq_len for p in pts], float)
    peak = np.array([p.peak_bytes for p in pts], float)
    m0, m1 = _nonneg_lstsq(np.stack([np.ones_like(tokens), tokens], axis=1), peak)
    return float(m0), float(m1)


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


def wan_grid(max_tokens: int, shapes=WAN_SHAPES) -> list[tuple[int, tuple[int, int, int]]]:
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


def calibrate_wan(
    config: str = "wan2.1-1.3B",
    *,
    layers: int | None = None,
    device="cuda",
    dtype: torch.dtype = torch.bfloat16,
    fused: bool = True,
    max_tokens: int = 151_200,
    shapes=WAN_SHAPES,
    text_len: int = 512,
    warmup: int = 2,
    repeat: int = 5,
    activation_checkpointing: bool = False,
    progress: bool = True,
) -> Calibration:
    """Profile forward+backward of a randomly initialized Wan model over ``wan_grid`` and fit."""
    from adaptiveload.models.wan import build_wan, random_batch

    device = torch.device(device)
    model = build_wan(config, layers=layers, device=device, dtype=dtype, fused=fused)
    if activation_checkpointing:
        model.enable_gradient_checkpointing()
    grid = wan_grid(max_tokens, shapes)
    bar = _progress(len(grid), progress)
    points = []
    for b, shape in grid:
        inputs = random_batch(model, b, *shape, text_len=text_len)

        def step(inputs=inputs):
            out = model(**inputs, return_dict=False)[0]
            out.float().square().mean().backward()

        if device.type == "cuda":
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(device)
        ms = time_call(step, device, warmup, repeat)
        peak = torch.cuda.max_memory_allocated(device) if device.type == "cuda" else 0
        model.zero_grad(set_to_none=True)
        points.append(Point(b, wan_seq_len(*shape), ms, int(peak), tuple(shape)))
        bar(f"B={b} S={points[-1].seq_len}: {ms:.1f} ms")
        del inputs
    cost = fit_cost_model(points)
    m0, m1 = fit_memory_model(points) if device.type == "cuda" else (0.0, 1.0)
    cost.meta = {
        "source": "calibrate_wan",
        "config": config,
        "layers": layers,
        "dtype": str(dtype),
        "fused": fused,
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
    }
    return Calibration(cost, m0, m1, points, dict(cost.meta))


def _progress(total: int, enabled: bool):
    try:
        from tqdm import tqdm
    except ImportError:
        tqdm = None
    if enabled and tqdm is not None:
        bar = tqdm(total=total, desc="calibrating", unit="point")

        def update(msg):
            bar.set_postfix_str(msg)
            bar.update(1)
            if bar.n == total:
                bar.close()

        return update
    count = [0]

    def update(msg):
        count[0] += 1
        if enabled:
            print(f"[{count[0]}/{total}] {msg}", flush=True)

    return update
