"""Measuring the all-to-all bandwidth sequence parallelism pays for (``adaptiveload calibrate
--comm``).

A split micro-batch's Ulysses attention sends, per layer, four all-to-alls of each rank's
tokens (``cost.ulysses_comm_per_token``). The planner prices them at a bandwidth:
``cost.H200_ALL_TO_ALL_BYTES_PER_S`` until this module measures the machine at hand.
``all_to_all_bytes_per_s`` times ``all_to_all_single`` over a process group (the bytes a rank
sends to the others per second, the slowest rank's); ``measure_comm`` starts one process per
device (NCCL on GPUs, gloo on CPU processes), measures every degree ``2, 4, ..`` up to them on
the groups of ranks ``[0, d)``, and returns the figures; ``with_comm`` stores them in a cost
model's ``meta``, where ``cost.sequence_parallel_comm_of`` (the sampler's default) reads them.
"""

from __future__ import annotations

import os
import socket
import tempfile
import time

import torch
import torch.distributed as dist

from adaptiveload.cost import CostModel, ulysses_comm_per_token

#: Bytes each rank holds per all-to-all timed: a 1.3B share of about 10k tokens (10,240 x
#: 1,536 x 2 bytes is 31 MiB); large enough that the per-call latency is a small part.
MESSAGE_BYTES = 32 * 2**20


def all_to_all_bytes_per_s(
    group=None,
    *,
    message_bytes: int = MESSAGE_BYTES,
    device: torch.device | str = "cpu",
    warmup: int = 3,
    repeat: int = 10,
) -> float:
    """Bytes per second a rank of ``group`` sends to the other ranks in ``all_to_all_single``
    of ``message_bytes`` per rank ((d - 1) / d of them leave it), the slowest rank's median
    call. Every rank of ``group`` calls it."""
    d = dist.get_world_size(group)
    if d < 2:
        raise ValueError(f"all_to_all_bytes_per_s: the group has {d} rank; it needs >= 2")
    n = max(d, message_bytes // 2 // d * d)  # bf16 elements, divisible by d
    x = torch.ones(n, dtype=torch.bfloat16, device=device)
    out = torch.empty_like(x)
    sync = torch.cuda.synchronize if x.is_cuda else (lambda: None)
    times = []
    for i in range(warmup + repeat):
        dist.barrier(group=group)
        sync()
        t0 = time.perf_counter()
        dist.all_to_all_single(out, x, group=group)
        sync()
        if i >= warmup:
            times.append(time.perf_counter() - t0)
    t = torch.tensor([sorted(times)[len(times) // 2]], dtype=torch.float64)
    t = t.to(device) if x.is_cuda else t
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
    return 2.0 * n * (d - 1) / d / float(t.item())


def _worker(rank: int, world: int, port: int, backend: str, message_bytes: int, out: str):
    device = torch.device("cuda", rank) if backend == "nccl" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(
        backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world
    )
    try:
        rates = {}
        d = 2
        while d <= world:
            group = dist.new_group(list(range(d)))
            if rank < d:
                rates[d] = all_to_all_bytes_per_s(group, message_bytes=message_bytes, device=device)
            dist.barrier()
            d *= 2
        if rank == 0:
            with open(out, "w") as f:
                f.write(repr(rates))
    finally:
        dist.destroy_process_group()


def measure_comm(
    ranks: int | None = None, *, backend: str | None = None, message_bytes: int = MESSAGE_BYTES
) -> dict[int, float]:
    """``{d: bytes per second}`` a rank sends in an all-to-all over ``d`` ranks, for d = 2,
    4, .. up to ``ranks`` processes started here (default: every CUDA device; ``backend``
    default: NCCL on CUDA devices, gloo otherwise)."""
    import ast

    import torch.multiprocessing as mp

    cuda = torch.cuda.device_count()
    backend = backend or ("nccl" if cuda >= 2 else "gloo")
    ranks = ranks if ranks is not None else cuda
    if ranks < 2:
        raise ValueError(
            f"calibrate --comm needs at least 2 ranks, found {ranks} "
            f"({cuda} CUDA device{'s' if cuda != 1 else ''}); on one GPU the planner uses "
            f"the H200 figure (cost.H200_ALL_TO_ALL_BYTES_PER_S)"
        )
    if backend == "nccl" and ranks > cuda:
        raise ValueError(f"calibrate --comm: {ranks} NCCL ranks need {ranks} GPUs, found {cuda}")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "rates")
        mp.spawn(_worker, args=(ranks, port, backend, message_bytes, out), nprocs=ranks)
        with open(out) as f:
            return ast.literal_eval(f.read())


def with_comm(
    model: CostModel, rates: dict[int, float], hidden: int, layers: int, heads: int | None = None
) -> CostModel:
    """``model`` with the measured all-to-all rates in its ``meta``: ``all_to_all_bytes_per_s``
    (per degree) and ``sequence_parallel_comm``, the cost per token of a split micro-batch
    at the largest degree's rate (``ulysses_comm_per_token``), in ms; the sampler's default
    ``sequence_parallel_comm`` then reads it. ``heads``: the model's attention heads, stored
    too, for the ring's factor at degrees they do not divide
    (``cost.sequence_parallel_comm_scale_of``)."""
    if model.unit != "ms":
        raise ValueError(f"with_comm: the cost model must be in ms, got {model.unit!r}")
    rate = rates[max(rates)]
    meta = dict(model.meta)
    meta["all_to_all_bytes_per_s"] = {str(d): float(r) for d, r in sorted(rates.items())}
    meta["sequence_parallel_comm"] = ulysses_comm_per_token(hidden, layers, bytes_per_s=rate)
    if heads is not None:
        meta["heads"] = int(heads)
    out = CostModel.from_dict(model.to_dict())
    out.meta = meta
    return out
