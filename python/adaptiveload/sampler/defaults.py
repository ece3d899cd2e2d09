"""The samplers' tuned defaults, one table each: what a user gets without choosing. The figures
behind each value are in benchmarks/RESULTS.md and docs/sampler.md ("Representative steps",
"When it pays"); a value changes only with a measurement there."""

from __future__ import annotations

# How each window's micro-batches form its steps, by default: "representative" (steps at least
# as representative of the data as a shuffle of the same micro-batches, balanced as well as that
# allows) or "balanced" (the tolerance's rule below: steps mix only as far as mix_tolerance
# allows, else they hold one or two shapes: speed over fidelity). docs/sampler.md,
# "Representative steps", says what each does to training.
COMPOSITION = "representative"
COMPOSITIONS = ("representative", "balanced")

# The default mix_tolerance of composition="balanced": the predicted imbalance a window's
# steps may take on to mix the data's groups.
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
        sequence_parallel == "auto" or isinstance(sequence_parallel, int) and sequence_parallel > 1,
        max_batch_size == 1,
        micro_batches_per_step == 1,
    )
    return MIX_TOLERANCE_BY_SETUP.get(key, MIX_TOLERANCE)


def resolve_composition(
    composition, mix_tolerance, sequence_parallel, max_batch_size, micro_batches_per_step
) -> tuple:
    """``(composition, mix_tolerance)`` as a sampler takes them: a ``mix_tolerance`` given alone
    asks for the tolerance's rule ("balanced"); neither: ``COMPOSITION``; the tolerance
    defaults to the setup's (``default_mix_tolerance``), used by "balanced" only."""
    if composition is None:
        composition = COMPOSITION if mix_tolerance is None else "balanced"
    if composition not in COMPOSITIONS:
        raise ValueError(
            f"composition must be one of {', '.join(map(repr, COMPOSITIONS))}, got {composition!r}"
        )
    if composition == "representative" and mix_tolerance is not None:
        raise ValueError(
            f"mix_tolerance={mix_tolerance!r} applies to composition='balanced' (steps mix only as "
            "far as the tolerance allows); composition='representative' keeps every step as "
            "representative as a shuffle: give one or the other"
        )
    if mix_tolerance is None:
        mix_tolerance = default_mix_tolerance(
            sequence_parallel, max_batch_size, micro_batches_per_step
        )
    return composition, mix_tolerance


# sequence_parallel="auto": the largest degree it takes (a power of two dividing the ranks),
# one node's GPUs: a split micro-batch's all-to-alls stay on the node's NVLink.
SEQUENCE_PARALLEL_AUTO_MAX = 8


# The least positions of a streamed segment: the larger of this and 4 * lookahead_steps * W * K
# (as many samples as 4 windows hold micro-batches, so that a segment holds a few windows).
MIN_SEGMENT = 1 << 20
