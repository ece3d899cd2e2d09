"""The samplers' tuned defaults, one table each: what a user gets without choosing. The figures
behind each value are in benchmarks/RESULTS.md and docs/sampler.md ("Representative steps",
"When it pays"); a value changes only with a measurement there."""

from __future__ import annotations

# The default mix_tolerance: the predicted imbalance a window's steps may take on to mix the
# data's groups.
MIX_TOLERANCE = 0.02
# The default mix_tolerance by (sequence parallelism, one sample per micro-batch, K = 1), for
# setups whose steps cannot be both representative and within MIX_TOLERANCE. With sequence
# parallelism the tolerance bounds the rank time lost to waiting and to what splitting adds (a
# share costs more than 1/d of the whole: per-sample work, launch floor, all-to-alls), so steps
# that mix by splitting need more of it; a step of W single samples mixes images and clips only
# where split clips even it out, which needs the most.
MIX_TOLERANCE_BY_SETUP = {
    (True, True, True): 0.10,
    (True, True, False): 0.05,
    (True, False, True): 0.05,
    (True, False, False): 0.05,
}


def default_mix_tolerance(sequence_parallel, max_batch_size, micro_batches_per_step) -> float:
    """The default ``mix_tolerance`` of a setup: ``MIX_TOLERANCE_BY_SETUP``'s where it has the
    setup, else ``MIX_TOLERANCE``."""
    key = (
        isinstance(sequence_parallel, int) and sequence_parallel > 1,
        max_batch_size == 1,
        micro_batches_per_step == 1,
    )
    return MIX_TOLERANCE_BY_SETUP.get(key, MIX_TOLERANCE)


# The least positions of a streamed segment: the larger of this and 4 * lookahead_steps * W * K
# (as many samples as 4 windows hold micro-batches, so that a segment holds a few windows).
MIN_SEGMENT = 1 << 20
