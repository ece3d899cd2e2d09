"""AdaptiveLoad: load-balanced batch sampling and fused adaLN kernels for video DiT training.

Importing the package never touches a GPU.
"""

from adaptiveload._version import __version__
from adaptiveload.cost import CostModel
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
    "wan_seq_len",
]
