"""AdaptiveLoad: load-balanced batch sampling and fused adaLN kernels for video DiT training.

Importing the package never touches a GPU.
"""

from adaptiveload import nn
from adaptiveload._version import __version__
from adaptiveload.cost import CostModel
from adaptiveload.ops import gated_residual_layer_norm_modulate, layer_norm_modulate
from adaptiveload.report import BalanceReport, balance_report
from adaptiveload.sampler import AdaptiveBatchSampler, EqualTokenBatchSampler, Plan
from adaptiveload.seqlen import wan_seq_len

__all__ = [
    "__version__",
    "AdaptiveBatchSampler",
    "BalanceReport",
    "CostModel",
    "EqualTokenBatchSampler",
    "Plan",
    "balance_report",
    "gated_residual_layer_norm_modulate",
    "layer_norm_modulate",
    "nn",
    "wan_seq_len",
]
