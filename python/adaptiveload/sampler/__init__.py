"""Batch samplers for ``torch.utils.data.DataLoader(batch_sampler=...)``.

``AdaptiveBatchSampler`` plans each epoch for all ranks at once in C++ (the same plan on
every rank, no communication) and yields this rank's micro-batches. Micro-batches
``[t*K, (t+1)*K)`` of every rank form optimizer step ``t``.

Nothing here may lose or repeat a sample silently. Every sampler is one pass machinery with a
plan source; the package's modules are the mechanisms that carry that:

- ``plan.py``: the epoch's plan (``Plan``), a run of its steps planned together (``Segment``),
  and a loader's batch in its step (``MicroBatch``).
- ``checks.py``: every argument checked, with the bounds that keep a plan's sums in int64;
  ``defaults.py``: the tuned defaults, one table each; ``columns.py``: lengths files.
- ``ranks.py``: rank defaults, the tagged collectives, and the per-epoch check that every
  rank plans the same epoch (ranks agree or fail).
- ``readers.py``: who draws the batches, known only through public paths: accelerate's
  prepared loaders (its ``GradientState``), whose ``BatchSamplerShard`` is served a stream it
  shards correctly or refused; any other reader is invisible, so a position-less
  ``state_dict()`` needs ``micro_batches(loader)``'s count or ``drawn_is_trained=True``.
- ``cursor.py``: ``Cursor``, one rank's place in an epoch (where the next pass starts, what the
  pass under way handed out and received, who reads it), changed only by its named
  transitions; ``iteration.py``: a rank's stream against its plan (the batches a pass hands
  out, ``steps``, ``micro_batches``).
- ``resume.py``: the saved state's format and the checks of every field; a state of the same
  plan replays exactly, of other settings re-plans what was not consumed, of another dataset
  is refused.
- ``sources.py``: what a plan source answers, and ``WholeEpoch`` (the epoch at once);
  ``segments.py``: ``Streamed`` (segments as the loop reaches them).
- ``base.py``: ``BatchSampler``, the pass machinery that composes them; ``planned.py``:
  ``PlannedBatchSampler`` (whole epochs, memory policies, online refinement through
  ``refine.py``); ``samplers.py``: the two planned samplers; ``stream.py``:
  ``StreamingBatchSampler`` (epochs of 100M to billions of samples; a state of a few hundred
  bytes).
"""

from adaptiveload.sampler.base import BatchSampler
from adaptiveload.sampler.checks import auto_sequence_parallel
from adaptiveload.sampler.plan import MicroBatch, Plan, Segment
from adaptiveload.sampler.planned import PlannedBatchSampler
from adaptiveload.sampler.samplers import (
    MIX_TOLERANCE,
    AdaptiveBatchSampler,
    EqualTokenBatchSampler,
)
from adaptiveload.sampler.stream import StreamingBatchSampler

__all__ = [
    "BatchSampler",
    "Segment",
    "MIX_TOLERANCE",
    "AdaptiveBatchSampler",
    "EqualTokenBatchSampler",
    "MicroBatch",
    "Plan",
    "PlannedBatchSampler",
    "StreamingBatchSampler",
    "auto_sequence_parallel",
]
