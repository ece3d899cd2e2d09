"""Resume state: what a sampler saves and how a saved state is checked and continued.

One plan fingerprint (``fingerprint``) holds everything that shapes a plan: sampler kind, a
digest of the lengths and group keys, caps, cost model, lookahead, balance, drop_last, seed,
ranks, K. A state of the same plan replays exactly; a state of other settings re-plans the
samples not yet consumed; a state of another dataset is refused. Nothing here keeps state:
the sampler passes what each step needs and commits the result only when it is whole."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from adaptiveload.cost import sequence_parallel_comm_terms, sequence_parallel_held_bytes_of
from adaptiveload.sampler.checks import Options, int_arg
from adaptiveload.sampler.plan import Plan, place_of

STATE_VERSION = 2
_KEYS = ("fingerprint", "epoch", "excluded", "micro_batches_done", "consumed", "num_consumed")
# Settings added after the first states: a saved fingerprint may lack them.
_OPTIONAL = {
    "max_batch_size",
    "memory_model",
    "memory_budget_gib",
    "uneven_counts",
    "mix_tolerance",
    "composition",
    "halves_in_place",
    "halves_spread",
    "sequence_parallel",
    "sequence_parallel_comm",
    "sequence_parallel_comm_scale",
    "sequence_parallel_held_bytes",
}
# Of those, the keys that mark a rule of the planner, not a setting: what a user cannot set back.
_RULES = {
    "halves_in_place",
    "halves_spread",
    "sequence_parallel_comm_scale",
    "sequence_parallel_held_bytes",
}


def fingerprint(kind: str, options: Options, num_samples: int, data: str, cost_model, max_cost):
    """Everything that shapes a plan, except the epoch and the position in it."""
    o = options
    representative = o.balance and o.composition == "representative"
    cost = cost_model.to_dict()
    cost.pop("meta", None)
    _, ring = sequence_parallel_comm_terms(
        cost_model, o.sequence_parallel_comm, o.sequence_parallel
    )
    held = []
    if o.memory_model is not None:
        held = sequence_parallel_held_bytes_of(o.cost_model, o.sequence_parallel)
    return {
        "sampler": kind,
        "num_samples": num_samples,
        "data": data,
        "max_tokens": o.max_tokens,
        "max_cost": max_cost,
        "cost_model": cost,
        "num_replicas": o.num_replicas,
        "micro_batches_per_step": o.micro_batches_per_step,
        "shuffle": o.shuffle,
        "seed": o.seed,
        "drop_last": o.drop_last,
        "balance": o.balance,
        "lookahead_steps": o.lookahead_steps,
        "on_oversize": o.on_oversize,
        # Only when set, so that states saved before the options still match.
        **({"max_batch_size": o.max_batch_size} if o.max_batch_size else {}),
        **({"uneven_counts": True} if o.uneven_counts else {}),
        # The tolerance where it shapes the plan; the representative rule (from 2026-12-07)
        # by name, so that states saved before, without it, re-plan what they did not consume.
        **({"mix_tolerance": o.mix_tolerance} if o.balance and not representative else {}),
        **({"composition": "representative"} if representative else {}),
        # Without balancing, a halved micro-batch's halves take its place (they were appended
        # once): states saved before, without the key, re-plan what they did not consume.
        **({"halves_in_place": True} if not o.balance else {}),
        # The micro-batches halved are spread over the epoch and their halves take their place,
        # balanced or not (the earliest were halved once, appended where balanced): states saved
        # before, without the key, re-plan what they did not consume.
        **({"halves_spread": True} if not o.drop_last else {}),
        **(
            {
                "sequence_parallel": o.sequence_parallel,
                "sequence_parallel_comm": o.sequence_parallel_comm,
            }
            if o.sequence_parallel > 1
            else {}
        ),
        # The ring's factor on the communication of degrees the model's heads do not divide
        # (from 2026-12-07): states saved before, without it, re-plan what they did not consume.
        **(
            {"sequence_parallel_comm_scale": ring}
            if o.sequence_parallel > 1 and any(g != 1.0 for g in ring)
            else {}
        ),
        **(
            {
                "memory_model": o.memory_model.to_dict() | {"meta": {}},
                "memory_budget_gib": o.memory_budget_gib,
            }
            if o.memory_model is not None
            else {}
        ),
        # What a ring member holds beyond its share, in the memory policy (from 2026-12-07):
        # states saved before, without it, re-plan what they did not consume.
        **({"sequence_parallel_held_bytes": held} if held else {}),
    }


def pack(flags: np.ndarray) -> bytes:
    return np.packbits(flags).tobytes()


def count_field(state: dict, key: str) -> int:
    v = state[key]
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise ValueError(f"sampler state: {key!r} must be an integer >= 0, got {v!r}")
    return v


def _unpack(state: dict, key: str, n: int) -> np.ndarray:
    raw = state[key]
    if not isinstance(raw, bytes | bytearray):
        raise ValueError(f"sampler state: {key!r} must be bytes, got {type(raw).__name__}")
    if len(raw) != (n + 7) // 8:
        raise ValueError(
            f"sampler state: {key!r} has {len(raw)} bytes, {(n + 7) // 8} expected for {n} samples"
        )
    bits = np.unpackbits(np.frombuffer(bytes(raw), dtype=np.uint8))
    if bits[n:].any():
        raise ValueError(f"sampler state: {key!r} has bits set past sample {n - 1}")
    return bits[:n].astype(bool)


def make_state(mine: dict, epoch: int, excluded, position: int, consumed_in_plan) -> dict:
    """The state of a sampler at micro-batch ``position`` of epoch ``epoch``'s plan:
    ``excluded`` (samples left out of the plan, None for none) and the plan's samples up to
    there are consumed."""
    n = len(consumed_in_plan)
    excluded = np.zeros(n, dtype=bool) if excluded is None else excluded
    consumed = excluded | consumed_in_plan
    return {
        "version": STATE_VERSION,
        "fingerprint": mine,
        "epoch": epoch,
        "excluded": pack(excluded),
        "micro_batches_done": int(position),
        "consumed": pack(consumed),
        "num_consumed": int(consumed.sum()),
    }


def with_steps(state: dict, steps: int | None, in_step: int, rank: int) -> dict:
    """``state`` with the position by steps that uneven counts take: ``'steps_done'``, and
    ``'in_step'`` where this rank is inside a step (its own place there)."""
    if steps is not None:
        state["steps_done"] = steps
    if in_step:
        state["in_step"] = {"rank": rank, "micro_batches": in_step}
    return state


def check_keys(state, mine: dict, keys=_KEYS) -> None:
    """A state must be a dict of this version with every key of ``keys``, saved by a sampler
    of the same plan source as the one of fingerprint ``mine``."""
    if not isinstance(state, dict):
        raise ValueError(f"sampler state must be a dict, got {type(state).__name__}")
    saved = state.get("fingerprint")
    streamed = {mine["sampler"], saved.get("sampler") if isinstance(saved, dict) else None}
    if "StreamingBatchSampler" in streamed and len(streamed) == 2:
        raise ValueError(
            f"sampler state of {saved.get('sampler') if isinstance(saved, dict) else None!r}: "
            f"a {mine['sampler']} resumes only states of its own plan source (a whole epoch's "
            "plan, or a streamed one); resume with the sampler that saved it"
        )
    if state.get("version") != STATE_VERSION:
        raise ValueError(
            f"unsupported sampler state version {state.get('version')!r} (this AdaptiveLoad "
            f"reads version {STATE_VERSION}; version 1 states carry no plan fingerprint and "
            "cannot be checked against the dataset)"
        )
    for key in keys:
        if key not in state:
            raise ValueError(f"sampler state: missing {key!r}")


@dataclass
class Saved:
    """A state's position, checked against this sampler's data."""

    fingerprint: dict
    epoch: int
    position: int
    excluded: np.ndarray
    consumed: np.ndarray
    steps: int  # -1 where the state has no 'steps_done'
    in_step: tuple[int, int] | None = None  # (rank, its micro-batches done in step `steps`)


def read_state(state: dict, mine: dict, data: str, n: int) -> Saved:
    """The position of ``state`` (``check_keys`` passed), refused when it is for another
    dataset (``data``: this sampler's digest, ``n`` samples) or not well formed."""
    saved = state["fingerprint"]
    if not isinstance(saved, dict):
        raise ValueError("sampler state: 'fingerprint' must be a dict")
    missing = sorted(set(mine) - set(saved) - _OPTIONAL)
    if missing:
        raise ValueError(f"sampler state: fingerprint lacks {missing}")
    if saved["sampler"] not in ("AdaptiveBatchSampler", "EqualTokenBatchSampler"):
        raise ValueError(f"sampler state: unknown sampler {saved['sampler']!r}")
    for key in ("num_replicas", "micro_batches_per_step", "lookahead_steps", "max_tokens"):
        v = saved[key]
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"sampler state: fingerprint {key!r} = {v!r} is not valid")
    if saved["num_samples"] != n or saved["data"] != data:
        raise ValueError(
            f"sampler state is for another dataset ({saved['num_samples']} samples, digest "
            f"{saved['data']}); this sampler has {n} samples, digest {data}: "
            "its sequence lengths or group keys differ"
        )
    epoch = count_field(state, "epoch")
    position = count_field(state, "micro_batches_done")
    excluded = _unpack(state, "excluded", n)
    consumed = _unpack(state, "consumed", n)
    if (excluded & ~consumed).any():
        raise ValueError("sampler state: 'excluded' holds samples that 'consumed' does not")
    if state["num_consumed"] != int(consumed.sum()):
        raise ValueError(
            f"sampler state: 'num_consumed' = {state['num_consumed']!r} but 'consumed' "
            f"holds {int(consumed.sum())} samples"
        )
    steps = count_field(state, "steps_done") if "steps_done" in state else -1
    return Saved(saved, epoch, position, excluded, consumed, steps, in_step_of(state, steps))


def in_step_of(state: dict, steps: int) -> tuple[int, int] | None:
    """A state's ``'in_step'`` (uneven counts, taken inside a step) as ``(rank, done)``."""
    if "in_step" not in state:
        return None
    v = state["in_step"]
    if not isinstance(v, dict) or set(v) != {"rank", "micro_batches"} or steps < 0:
        raise ValueError(
            "sampler state: 'in_step' must be {'rank': r, 'micro_batches': j} beside "
            f"'steps_done', got {v!r}"
        )
    rank, done = count_field(v, "rank"), count_field(v, "micro_batches")
    if done < 1:
        raise ValueError(f"sampler state: 'in_step' micro_batches must be >= 1, got {done}")
    return rank, done


def continue_at(
    saved: Saved, mine: dict, plan_for: Callable, rank: int, k: int, uneven: bool
) -> tuple[np.ndarray | None, int, Plan | None]:
    """Where this sampler continues a saved state: ``(excluded, start, plan)``, the samples
    left out of epoch ``saved.epoch``'s plan, the micro-batch of this rank's stream to start
    at, and that plan (None: not made yet). ``plan_for(excluded)`` makes the epoch's plan.

    The same plan (``saved.fingerprint == mine``) replays from the saved position (with
    uneven counts from the saved step, at this rank's place in it); other settings plan the
    samples not yet consumed."""
    excluded = saved.excluded if saved.excluded.any() else None
    if saved.in_step is not None:
        check_in_step(saved.in_step, saved.steps, saved.fingerprint, mine, rank)
    if saved.fingerprint != mine:
        return (saved.consumed if saved.consumed.any() else None), 0, None
    plan = plan_for(excluded)
    n = len(saved.consumed)
    if uneven:
        steps = saved.steps
        done = 0 if saved.in_step is None else saved.in_step[1]
        problem = None
        if steps < 0 or saved.position != steps * k:
            problem = "'steps_done' is missing or disagrees with 'micro_batches_done'"
        elif steps > plan.num_steps or (done and steps == plan.num_steps):
            problem = f"'steps_done' = {steps} is past the end of its plan"
        elif done and done >= plan.micro_batches_in_step(steps, rank):
            problem = f"'in_step' = {done} is not inside rank {rank}'s step {steps}"
        elif not np.array_equal(saved.excluded | plan.consumed_steps(steps, n), saved.consumed):
            problem = f"'consumed' does not match the samples of its plan up to step {steps}"
        if problem:
            raise ValueError(f"sampler state: {problem}: the state is corrupt")
        return excluded, int(plan.rank_step_starts(rank)[steps]) + done, plan
    if saved.position > plan.micro_batches_per_rank:
        raise ValueError(
            f"sampler state: 'micro_batches_done' = {saved.position} is past the end of its "
            f"plan ({plan.micro_batches_per_rank} micro-batches per rank)"
        )
    if not np.array_equal(saved.excluded | plan.consumed(saved.position, n), saved.consumed):
        raise ValueError(
            "sampler state: 'consumed' does not match the samples of its plan up to "
            f"micro-batch {saved.position}: the state is corrupt"
        )
    return excluded, saved.position, plan


def check_in_step(in_step, steps: int, saved: dict, mine: dict, rank: int) -> None:
    """A state taken inside a step with uneven counts (``in_step``: ``(rank, its micro-batches
    done there)``) holds one rank's place there, not the other ranks': it resumes the same plan
    (saved fingerprint ``saved`` equal to ``mine``) on that rank only."""
    owner, done = in_step
    at = (
        f"sampler state taken by rank {owner} inside step {steps} with uneven_counts "
        f"({done} of its micro-batches there done)"
    )
    if saved != mine:
        changed = sorted(k for k in set(mine) | set(saved) if mine.get(k) != saved.get(k))
        if set(changed) <= _RULES:
            raise ValueError(
                f"{at}: it holds only that rank's place in the step, so it resumes the same "
                f"plan, and this version of AdaptiveLoad plans it by other rules than the one "
                f"that saved it ({', '.join(changed)}; no setting brings those back). Resume "
                "from a state taken at a step's end (mb.last), which re-plans the samples not "
                "yet consumed, or with the version that saved it."
            )
        raise ValueError(
            f"{at}: it holds only that rank's place in the step, so it resumes the same plan "
            f"and not one of other settings (changed: {', '.join(changed)}). Resume with the "
            "settings it was saved with, or from a state taken at a step's end (mb.last)."
        )
    if owner != rank:
        raise ValueError(
            f"{at}, loaded by rank {rank}: each rank is at its own place inside a step, so load "
            "each rank's own state (save one per rank), or save at a step's end (mb.last)."
        )


def checked_prelude(prelude, mine: dict) -> dict:
    """A streamed state's ``'prelude'`` (what a resume under other settings re-planned), each
    field checked: the settings it was saved with, the segment and the position in it."""
    keys = {"settings", "segment", "begin", "steps_before", "steps", "micro_batches"}
    if not isinstance(prelude, dict) or set(prelude) != keys:
        raise ValueError(f"sampler state: 'prelude' must hold {sorted(keys)}, got {prelude!r}")
    settings = prelude["settings"]
    if not isinstance(settings, dict) or set(settings) != set(mine):
        raise ValueError("sampler state: the settings of 'prelude' are not a streamed sampler's")
    for key in sorted(keys - {"settings"}):
        count_field(prelude, key)
    return prelude


def before_start(name: str, value, start_step: int, start: int | None) -> ValueError:
    at = f"step {start_step}" + ("" if start is None else f", micro-batch {start}")
    return ValueError(
        f"{name}={value!r} is before the resumed position ({at}): count steps from the "
        "epoch's start, as start_step does"
    )


def _position_by_steps(plan: Plan, rank: int, start: int, drawn: int, steps_done, mbd):
    """``position_of`` with uneven counts: positions go by steps, and a known position inside
    a step is this rank's own (``in_step``)."""
    if mbd is not None:
        raise ValueError(
            "state_dict: with uneven_counts the ranks' micro-batch counts differ, so "
            "positions go by steps: pass steps_done"
        )
    start_step, start_done = place_of(plan, rank, start)
    if steps_done is not None:
        steps, in_step = int_arg("steps_done", steps_done, 0), 0
        if steps < start_step or (steps == start_step and start_done):
            # A resume inside step `start_step` cannot save that step's start: the state
            # would train again what the resumed position left behind.
            raise before_start("steps_done", steps, start_step, start if start_done else None)
        if steps > plan.num_steps:
            raise ValueError(
                f"steps_done must be in [0, {plan.num_steps}] for this plan, got {steps}"
            )
    else:
        steps, in_step = place_of(plan, rank, drawn)
    return steps * plan.micro_batches_per_step, steps, in_step


def position_of(
    plan: Plan, rank: int, start: int, drawn: int, steps_done, mbd, uneven: bool
) -> tuple[int, int | None, int]:
    """The position of a state: ``(micro-batches done, steps done, this rank's micro-batches
    done inside the next step)``, the last two only with uneven counts (else None and 0).
    ``start``: where this pass began in the rank's stream; ``drawn``: where it is (the
    position without ``steps_done`` or ``mbd``, micro_batches_done)."""
    if uneven:
        return _position_by_steps(plan, rank, start, drawn, steps_done, mbd)
    end, k = plan.micro_batches_per_rank, plan.micro_batches_per_step
    if steps_done is not None and mbd is not None:
        raise ValueError("state_dict: pass steps_done or micro_batches_done, not both")
    if steps_done is not None:
        position = int_arg("steps_done", steps_done, 0) * k
        name, value, unit = "steps_done", steps_done, k
    elif mbd is not None:
        position = int_arg("micro_batches_done", mbd, 0)
        name, value, unit = "micro_batches_done", mbd, 1
    else:
        position, name, value, unit = drawn, "position", drawn, 1
    if position < start:
        raise before_start(name, value, start // k, start)
    if position > end:
        raise ValueError(f"{name} must be in [0, {end // unit}] for this plan, got {value!r}")
    return position, None, 0
