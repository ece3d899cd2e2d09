"""The ranks: defaults from ``torch.distributed`` or a process group, the samplers'
collectives (each tagged with its name, so that ranks in different calls fail instead of
pairing), and the per-epoch check that every rank plans the same epoch."""

from __future__ import annotations

import torch.distributed as dist

from adaptiveload.sampler.checks import int_arg


def distributed_defaults(num_replicas, rank, process_group) -> tuple[int, int]:
    """``(num_replicas, rank)``: as given, else from ``process_group`` (which they must agree
    with), else from ``torch.distributed`` when initialized, else ``(1, 0)``."""
    if num_replicas is None or rank is None or process_group is not None:
        initialized = dist.is_available() and dist.is_initialized()
        if process_group is not None and not initialized:
            raise ValueError("process_group given but torch.distributed is not initialized")
        group_size = dist.get_world_size(process_group) if initialized else 1
        group_rank = dist.get_rank(process_group) if initialized else 0
        if process_group is not None:
            for name, given, actual in (
                ("num_replicas", num_replicas, group_size),
                ("rank", rank, group_rank),
            ):
                if given is not None and given != actual:
                    raise ValueError(
                        f"{name}={given!r} disagrees with process_group ({name} {actual} there)"
                    )
        num_replicas = group_size if num_replicas is None else num_replicas
        rank = group_rank if rank is None else rank
    num_replicas = int_arg("num_replicas", num_replicas, 1)
    rank = int_arg("rank", rank, 0)
    if rank >= num_replicas:
        raise ValueError(f"rank must be in [0, {num_replicas}), got {rank!r}")
    return num_replicas, rank


# The sampler's collectives, named as messages name them.
COLLECTIVES = {
    "verify_ranks": "started an epoch (iter(sampler), whose plan check is a collective)",
    "update_cost_model": "called update_cost_model()",
}


def all_gather(call: str, payload, owner: str, process_group=None) -> list:
    """``all_gather_object`` of ``payload`` tagged with the sampler's ``call``: where one rank
    is in another of the sampler's collectives (it skipped ``update_cost_model``, say), every
    rank fails naming what each called, instead of pairing the two calls' payloads."""
    gathered: list = [None] * dist.get_world_size(process_group)
    dist.all_gather_object(gathered, (call, payload), group=process_group)
    calls = [g[0] if isinstance(g, tuple) and len(g) == 2 else repr(g) for g in gathered]
    if any(c != call for c in calls):
        who = "; ".join(f"rank {r} {COLLECTIVES.get(c, c)}" for r, c in enumerate(calls[:8]))
        who += " ..." if len(calls) > 8 else ""
        raise RuntimeError(
            f"{owner}: the ranks are not in the same collective call: {who}. "
            "update_cost_model() is a collective: every rank must call it at the same point "
            "(e.g. at each epoch's end), and every rank must iterate its sampler each epoch"
        )
    return [g[1] for g in gathered]


def verify_same_plan(mine: dict, owner: str) -> None:
    """All ranks must plan the same epoch: ``mine`` (a fingerprint with the epoch and the
    resumed position) against every rank's, one all-gather; ``RuntimeError`` naming each
    setting that differs and its value on each rank."""
    gathered = all_gather("verify_ranks", mine, owner)
    # Over every rank's keys: a setting only some ranks have (max_batch_size) must fail on
    # every rank, not only on those that have it.
    keys = list(mine) + sorted(set().union(*gathered) - set(mine))
    differ = [k for k in keys if any(g.get(k) != mine.get(k) for g in gathered)]
    if not differ:
        return
    what = {
        "data": "the dataset (sequence lengths or group keys)",
        "resume": "the resumed position (load_state_dict of another state)",
    }
    lines = [
        f"  {k} ({what.get(k, 'setting')}): "
        + ", ".join(f"rank {r}: {g.get(k)!r}" for r, g in enumerate(gathered[:8]))
        + (" ..." if len(gathered) > 8 else "")
        for k in differ
    ]
    raise RuntimeError(
        f"{owner}: the ranks would plan different epochs, losing or repeating samples (or "
        "hanging at unequal step counts). Give every rank the same data and settings (a "
        "per-rank seed is a common cause). Differences:\n" + "\n".join(lines)
    )
