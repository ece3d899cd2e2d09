"""Timing one micro-batch of forward+backward, for calibration.

- ``StepTimer``: any model. Give it a function that runs one forward+backward of ``B``
  samples of one shape (an in-house model, a custom loss, an FSDP-wrapped model); it times
  it and reads the GPU's peak memory. This is the entry point for models AdaptiveLoad does
  not know: ``calibrate_model``, ``calibrate_plan`` and ``calibrate_memory`` take it.
- ``ModelTimer``: a randomly initialized model of a known family (``adaptiveload.models``),
  built at any depth; ``WanTimer`` is the Wan one.

A timer is ``timer(batch, shape, checkpointed=None) -> (ms, peak_bytes)``: the median of
``repeat`` timed calls after ``warmup`` untimed ones (the first call of a shape also builds
its kernels' plans). ``checkpointed``: how many of the model's ``layers`` blocks run under
activation checkpointing in this call (for the memory model); ``None`` is the timer's own
choice.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch

from adaptiveload.cost import architecture_of


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


def _device_name(device: torch.device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"


class StepTimer:
    """Times ``step(batch, shape, checkpointed)``, one forward+backward of ``batch`` samples
    of ``shape`` (the ``(frames, height, width)`` of the metadata) with ``checkpointed``
    blocks under activation checkpointing (``None``: the step's own choice).

    Args:
        step: the function; whatever it returns is ignored.
        device: where it runs (CUDA: timed with events, peak memory read).
        layers: the model's blocks, ``L``; needed only to calibrate a memory model (which
            asks for each ``checkpointed`` in ``0..L``).
        warmup, repeat: untimed and timed calls per measurement.
        meta: what describes the setup (model, dtype, ...), written with every calibration and
            compared when a points file is resumed.

    ``peak_bytes``: ``torch.cuda.max_memory_allocated`` over the timed calls (0 off CUDA):
    what the step allocates at its highest, plus what is allocated before it (weights).
    """

    def __init__(
        self,
        step: Callable[[int, tuple, int | None], object],
        *,
        device="cuda",
        layers: int | None = None,
        warmup: int = 2,
        repeat: int = 5,
        meta: dict | None = None,
    ):
        if not callable(step):
            raise ValueError(f"StepTimer: step must be callable, got {step!r}")
        self.step = step
        self.device = torch.device(device)
        self.layers = layers
        self.warmup, self.repeat = warmup, repeat
        self.meta = {**(meta or {}), "device": _device_name(self.device)}

    def __call__(self, batch: int, shape, checkpointed: int | None = None) -> tuple[float, int]:
        if checkpointed is not None and self.layers is None:
            raise ValueError(
                "StepTimer: checkpointed blocks were asked for, but the timer has no layers "
                "(give StepTimer(..., layers=L), the blocks the step can checkpoint)"
            )
        shape = tuple(int(v) for v in shape)

        def run():
            self.step(batch, shape, checkpointed)

        cuda = self.device.type == "cuda"
        try:
            for _ in range(self.warmup):
                run()
            self._before_timed()
            if cuda:
                torch.cuda.empty_cache()
                torch.cuda.reset_peak_memory_stats(self.device)
            ms = time_call(run, self.device, warmup=0, repeat=self.repeat)
            peak = torch.cuda.max_memory_allocated(self.device) if cuda else 0
        finally:
            self._after()
        return ms, int(peak)

    def _before_timed(self) -> None:
        """Called after the warm-up calls, before the timed ones."""

    def _after(self) -> None:
        """Called after a measurement, also when it failed."""


class ModelTimer(StepTimer):
    """Times forward+backward of one micro-batch of a randomly initialized model of a known
    family (``family``: its name or ``ModelFamily``; ``config``: one of its configurations,
    ``layers`` blocks per stack when given), in ``dtype``, with its fused ops when it has a
    patch and ``fused``. The loss is the mean square of the output.

    ``peak_bytes`` holds the weights, their gradients (allocated before the timed calls, as
    they are in every micro-batch of an optimizer step but the first), the inputs, and the
    micro-batch's activations and workspace at their highest; no optimizer state. The
    previous call's gradients are freed before a call, and its own after it.

    ``activation_checkpointing``: every block checkpointed when ``checkpointed`` is None
    (else none).
    """

    def __init__(
        self,
        family,
        config: str | None = None,
        *,
        layers: int | None = None,
        device="cuda",
        dtype: torch.dtype = torch.bfloat16,
        fused: bool = True,
        warmup: int = 2,
        repeat: int = 5,
        activation_checkpointing: bool = False,
    ):
        from adaptiveload.models import family_of
        from adaptiveload.models.checkpointing import set_checkpointed_blocks

        self.family = family_of(family) if isinstance(family, str) else family
        config = self.family.default_config if config is None else config
        fused = fused and self.family.patch is not None
        device = torch.device(device)
        self.model = self.family.build(
            config, layers=layers, device=device, dtype=dtype, fused=fused
        )
        blocks = len(self.family.blocks(self.model))
        # Beside ``meta`` (whose keys the points files keep): what a fitted cost model records
        # of the model, for the sampler's communication terms (cost.DESCRIBES_MODEL).
        self.architecture = architecture_of(self.family.configs[config], blocks)
        self.default_checkpointed = blocks if activation_checkpointing else 0
        set_checkpointed_blocks(self.model, self.default_checkpointed)
        meta = {
            "config": config,
            "layers": layers,
            "dtype": str(dtype),
            "fused": fused,
            "activation_checkpointing": activation_checkpointing,
        }
        if self.family.name != "wan":  # Wan's points files predate families
            meta = {"family": self.family.name, **meta}
        super().__init__(
            self._step, device=device, layers=blocks, warmup=warmup, repeat=repeat, meta=meta
        )

    def inputs(self, batch: int, shape) -> dict:
        return self.family.random_batch(self.model, batch, *shape)

    def _step(self, batch: int, shape, checkpointed: int | None) -> None:
        out = self.model(**self._inputs, return_dict=False)[0]
        out.float().square().mean().backward()

    def __call__(
        self, batch: int, shape, checkpointed: int | None = None, *, degree: int = 1
    ) -> tuple[float, int]:
        """``degree`` > 1: one rank's share of the micro-batch split ``degree`` ways
        (sequence parallelism), timed alone: its layers on its tokens, attention over all of
        them for its heads (``parallel.split_sequence`` with ``parallel.ONE_DEVICE``; the
        all-to-alls are not timed)."""
        from contextlib import nullcontext

        from adaptiveload.models.checkpointing import set_checkpointed_blocks
        from adaptiveload.parallel import ONE_DEVICE, split_sequence

        set_checkpointed_blocks(
            self.model, self.default_checkpointed if checkpointed is None else checkpointed
        )
        self.model.zero_grad(set_to_none=True)
        self._inputs = self.inputs(batch, tuple(shape))
        # A split ends with its block: forwards after it run whole.
        split = split_sequence(self.model, ONE_DEVICE, degree, 0) if degree > 1 else nullcontext()
        try:
            with split:
                return super().__call__(batch, shape, checkpointed)
        finally:
            self._inputs = None

    def _before_timed(self) -> None:
        for p in self.model.parameters():
            if p.requires_grad and p.grad is None:
                p.grad = torch.zeros_like(p)

    def _after(self) -> None:
        self.model.zero_grad(set_to_none=True)

    @property
    def checkpointed(self) -> int:
        return self.default_checkpointed


class WanTimer(ModelTimer):
    """``ModelTimer`` of Wan (diffusers' ``WanTransformer3DModel``), with its text length."""

    def __init__(self, config: str = "wan2.1-1.3B", *, text_len: int | None = None, **kwargs):
        from adaptiveload.wan import TEXT_LEN

        super().__init__("wan", config, **kwargs)
        self.text_len = TEXT_LEN if text_len is None else text_len
        self.meta = {**self.meta, "text_len": self.text_len}
        # The same keys, in the order Wan's points files were written with.
        order = (
            "config",
            "layers",
            "dtype",
            "fused",
            "activation_checkpointing",
            "text_len",
            "device",
        )
        self.meta = {k: self.meta[k] for k in order}

    def inputs(self, batch: int, shape) -> dict:
        from adaptiveload.models.wan import random_batch

        return random_batch(self.model, batch, *shape, text_len=self.text_len)
