"""The tests' other processes, launched one way: a function on W spawned gloo ranks
(``run_on_ranks``), or a script under torchrun (``torchrun``)."""

from __future__ import annotations

import datetime
import os
import shutil
import subprocess
import sys
import tempfile
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


def run_on_ranks(fn, world, tmp_path, name, *args, errors_allowed=False) -> list[dict]:
    """``fn(rank, world, *args) -> dict`` on `world` gloo ranks (a module-level function, so
    that spawned processes can import it). Fails with a rank's traceback if one raised, unless
    ``errors_allowed``: then that rank's result is ``{"error": ..., "trace": ...}``."""
    out = os.path.join(str(tmp_path), f"{name}_{{rank}}.pt")
    init = os.path.join(str(tmp_path), f"init_{name}")
    mp.start_processes(
        _entry, args=(world, init, out, fn, args), nprocs=world, start_method="spawn"
    )
    results = [torch.load(out.format(rank=r), weights_only=False) for r in range(world)]
    if not errors_allowed:
        for r in results:
            assert "error" not in r, r.get("trace")
    return results


def _path_args(args) -> list[str]:
    """The arguments (or ``--flag=value`` values) that name files or folders."""
    out = []
    for a in (str(a) for a in args):
        value = a.split("=", 1)[1] if a.startswith("--") and "=" in a else a
        if os.sep in value and os.path.isdir(os.path.dirname(value.rstrip(os.sep)) or os.sep):
            out.append(value)
    return out


def _snapshot(paths, into) -> list[tuple[str, str | None]]:
    """Copies of ``paths`` as they are now (None: absent), to put back with ``_restore``."""
    saved = []
    for i, path in enumerate(paths):
        if not os.path.exists(path):
            saved.append((path, None))
            continue
        copy = os.path.join(into, str(i))
        (shutil.copytree if os.path.isdir(path) else shutil.copy2)(path, copy)
        saved.append((path, copy))
    return saved


def _restore(saved) -> None:
    for path, copy in saved:
        if os.path.isdir(path):
            shutil.rmtree(path)
        elif os.path.exists(path):
            os.remove(path)
        if copy is not None:
            (shutil.copytree if os.path.isdir(copy) else shutil.copy2)(copy, path)


# What libstdc++ prints when a process ends with a joinable thread (a C++ teardown abort).
TEARDOWN_ABORT = "terminate called without an active exception"


def torchrun(script, *args, nproc=2, timeout=300, check=True) -> subprocess.CompletedProcess:
    """``python -m torch.distributed.run --standalone --nproc_per_node=nproc script *args``, one
    thread per process; with ``check``, fails with the end of its output unless it exits 0.

    A run that outlasts ``timeout`` is run once more from the same files (every path among the
    arguments put back as it was): on the 2-core CI machine about one gloo run in a hundred
    stalls for no reason in its own code. A run that stalls twice fails with what it printed.
    So is a run whose process aborted in C++ teardown (``TEARDOWN_ABORT`` in its output; seen
    once in a fresh-clone CI run, after every line of the run was printed); a second abort
    fails.
    """
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc_per_node={nproc}",
        script,
        *[str(a) for a in args],
    ]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    with tempfile.TemporaryDirectory() as backup:
        saved = _snapshot(_path_args(args), backup)
        for attempt in (1, 2):
            try:
                done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
            except subprocess.TimeoutExpired as e:  # what it printed says where it stopped
                if attempt == 1:
                    print(f"{script} stalled past {timeout} s: running it once more", flush=True)
                    _restore(saved)
                    continue
                out = _text(e.stdout)
                err = _text(e.stderr)
                raise AssertionError(
                    f"{script} did not finish in {timeout} s, twice:\n{out[-3000:]}\n{err[-3000:]}"
                ) from None
            if (
                attempt == 1
                and done.returncode != 0
                and TEARDOWN_ABORT in done.stderr + done.stdout
            ):
                print(f"{script} aborted in teardown: running it once more", flush=True)
                _restore(saved)
                continue
            break
    if check:
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done


def _text(data) -> str:
    return data.decode(errors="replace") if isinstance(data, bytes) else (data or "")


def full_grads(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter's gradient, gathered whole when sharded (FSDP2's DTensor)."""
    out = {}
    for name, p in model.named_parameters():
        g = p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad
        out[name] = g.detach().clone()
    return out
