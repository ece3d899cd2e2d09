"""Real gloo process groups for the tests: run a function on W spawned ranks and collect what
each returns (a dict, saved with torch.save), or the error and traceback it raised."""

from __future__ import annotations

import datetime
import os
import traceback

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def _entry(rank, world, init_file, out_pattern, fn, args):
    dist.init_process_group(
        "gloo",
        init_method=f"file://{init_file}",
        rank=rank,
        world_size=world,
        timeout=datetime.timedelta(seconds=60),
    )
    result = {}
    try:
        result = fn(rank, world, *args)
    except Exception as e:  # reported to the test
        result = {"error": f"{type(e).__name__}: {e}", "trace": traceback.format_exc()}
    finally:
        torch.save(result, out_pattern.format(rank=rank))
        dist.destroy_process_group()


def run_on_ranks(fn, world, tmp_path, name, *args) -> list[dict]:
    """``fn(rank, world, *args) -> dict`` on `world` gloo ranks (a module-level function, so
    that spawned processes can import it); fails with a rank's traceback if one raised."""
    out = os.path.join(str(tmp_path), f"{name}_{{rank}}.pt")
    init = os.path.join(str(tmp_path), f"init_{name}")
    mp.start_processes(
        _entry, args=(world, init, out, fn, args), nprocs=world, start_method="spawn"
    )
    results = [torch.load(out.format(rank=r), weights_only=False) for r in range(world)]
    for r in results:
        assert "error" not in r, r.get("trace")
    return results


def full_grads(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter's gradient, gathered whole when sharded (FSDP2's DTensor)."""
    out = {}
    for name, p in model.named_parameters():
        g = p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad
        out[name] = g.detach().clone()
    return out
