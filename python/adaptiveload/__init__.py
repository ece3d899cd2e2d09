"""AdaptiveLoad: load-balanced batch sampling and fused adaLN kernels for video DiT training.

Importing the package never touches a GPU, and loads only the sampler: the op library
(``adaptiveload._C``) loads on first access to the ops (``layer_norm_modulate``,
``gated_residual_layer_norm_modulate``, ``rms_norm_modulate``,
``gated_residual_rms_norm_modulate``, ``adaptiveload.ops``, ``adaptiveload.nn``), so the sampler
works even where the op build does not.
"""

from importlib import import_module

from adaptiveload._version import __version__
from adaptiveload.cost import CostModel
from adaptiveload.memory import CheckpointPolicy, MemoryModel
from adaptiveload.report import BalanceReport, balance_report
from adaptiveload.sampler import (
    AdaptiveBatchSampler,
    EqualTokenBatchSampler,
    MicroBatch,
    Plan,
    StreamingBatchSampler,
)
from adaptiveload.wan import wan_seq_len

# name -> module that defines it, imported on first access (PEP 562).
_LAZY = {
    "layer_norm_modulate": "adaptiveload.ops",
    "gated_residual_layer_norm_modulate": "adaptiveload.ops",
    "rms_norm_modulate": "adaptiveload.ops",
    "gated_residual_rms_norm_modulate": "adaptiveload.ops",
    "nn": "adaptiveload.nn",
    "ops": "adaptiveload.ops",
}


def __getattr__(name: str):
    if name in _LAZY:
        module = import_module(_LAZY[name])
        value = module if _LAZY[name].endswith("." + name) else getattr(module, name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'adaptiveload' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_LAZY))


__all__ = [
    "__version__",
    "AdaptiveBatchSampler",
    "BalanceReport",
    "CheckpointPolicy",
    "CostModel",
    "EqualTokenBatchSampler",
    "MemoryModel",
    "MicroBatch",
    "Plan",
    "StreamingBatchSampler",
    "balance_report",
    "gated_residual_layer_norm_modulate",
    "gated_residual_rms_norm_modulate",
    "layer_norm_modulate",
    "nn",
    "rms_norm_modulate",
    "wan_seq_len",
]
