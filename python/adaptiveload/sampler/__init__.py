"""Batch samplers for ``torch.utils.data.DataLoader(batch_sampler=...)``.

``AdaptiveBatchSampler`` plans each epoch for all ranks at once in C++ (the same plan on
every rank, no communication) and yields this rank's micro-batches. Micro-batches
``[t*K, (t+1)*K)`` of every rank form optimizer step ``t``.

Nothing here may lose or repeat a sample silently. The package's modules are the
mechanisms that carry that:

- ``plan.py``: the epoch's plan (``Plan``) and a loader's batch in its step
  (``MicroBatch``).
- ``checks.py``: every argument checked, with the bounds that keep a plan's sums in int64.
- ``ranks.py``: rank defaults, the tagged collectives, and the per-epoch check that every
  rank plans the same epoch (ranks agree or fail).
- ``readers.py``: who draws the batches, known only through public paths: accelerate's
  prepared loaders (its ``GradientState``), whose ``BatchSamplerShard`` is served a stream it
  shards correctly; any other reader is invisible, so a position-less ``state_dict()`` needs
  ``micro_batches(loader)``'s count or ``drawn_is_trained=True``, and is refused otherwise.
- ``resume.py``: the plan fingerprint and the saved state: a state of the same plan replays
  exactly, of other settings re-plans the samples not yet consumed, of another dataset is
  refused.
- ``refine.py``: online refinement (``record_time``, ``update_cost_model``): measured times
  per ``(seq_len, batch)`` kind replace predicted costs from the next epoch on, folded alike
  on every rank and carried by the state.
- ``iteration.py``: a rank's stream against its plan (the batches a pass hands out,
  ``micro_batches``, state positions).
- ``cursor.py``: ``Cursor``, one rank's place in an epoch (its plan, where the next pass
  starts, what the pass under way handed out and trained, who reads it), changed only by its
  named transitions, and its part of a state (``state_dict``, ``load_state_dict``).
- ``base.py``: ``PlannedBatchSampler``, which composes them, its settings read from one
  ``Options``; ``samplers.py``: the two samplers.
- ``stream.py``: ``StreamingBatchSampler``, whose epoch plan streams segment by segment
  (epochs of 100M to billions of samples; a state of a few hundred bytes).
"""

from adaptiveload.sampler.base import PlannedBatchSampler
from adaptiveload.sampler.plan import MicroBatch, Plan
from adaptiveload.sampler.samplers import (
    MIX_TOLERANCE,
    AdaptiveBatchSampler,
    EqualTokenBatchSampler,
)
from adaptiveload.sampler.stream import StreamingBatchSampler

__all__ = [
    "MIX_TOLERANCE",
    "AdaptiveBatchSampler",
    "EqualTokenBatchSampler",
    "MicroBatch",
    "Plan",
    "PlannedBatchSampler",
    "StreamingBatchSampler",
]
