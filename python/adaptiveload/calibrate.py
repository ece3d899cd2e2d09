"""Calibrate the sampler's cost and memory models on the real GPU.

``calibrate_wan`` times forward+backward of micro-batches of B samples of S tokens of a
randomly initialized Wan 2.1 configuration, reads their peak memory, and fits
``time = c0 + B * (cs + c1*S + c2*S^2)`` (ms) and ``peak = m0 + m1 * B * S`` (bytes) with
``adaptiveload.fit``; ``adaptiveload calibrate`` is its command line.
"""

from __future__ import annotations

import json
import os
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import numpy as np
import torch

from adaptiveload.cost import CostModel
from adaptiveload.fit import Point, fit_cost_model, fit_memory_model
from adaptiveload.wan import SHAPES, TEXT_LEN, wan_seq_len

# The pixel shapes profiled by default (adaptiveload.wan.SHAPES), under the name callers use.
WAN_SHAPES = SHAPES


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
