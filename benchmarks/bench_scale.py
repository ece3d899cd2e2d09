"""How does planning scale with the epoch? Time to the first micro-batch, memory per rank
process, resume state and planning rate, for epochs of N samples (issue 36's baseline; CPU).

The lengths are drawn once from an image and video mix (40% images of 1,560 tokens, clips of
7,800-75,600) and written to a ``.npy`` under --dir; every rank process reads it memory-mapped.
For each N, --procs rank processes of one node start together; each makes
``AdaptiveBatchSampler(lengths, num_replicas=--ranks, rank=r)``, calls ``set_epoch(0)`` and
reports: seconds to its first micro-batch, micro-batches per second while iterating the next
--iterate, its peak resident memory, and the size of ``state_dict`` after them. A second part
times the whole plan of N samples for the ranks against ``numpy.random.permutation(N)`` in the
same process (with --stream, the least of 3 runs of each).

    python benchmarks/bench_scale.py --sizes 1e6,1e7 --procs 2 [--write]
    python benchmarks/bench_scale.py --stream --sizes 1e7,1e8,1e9 --procs 8 [--write]

Without --stream: ``AdaptiveBatchSampler``, which plans the whole epoch in every process (the
node's memory is the processes' peaks summed). With --stream: ``StreamingBatchSampler`` over
int32 lengths, which plans segment by segment; a process's own memory is its anonymous resident
memory (``RssAnon``), and the lengths' pages, read in place, are one copy for the node (the
page cache), so the node's memory is the processes' own summed plus the file once.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import pickle
import resource
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
MAX_TOKENS = 151_200
CLIPS = np.array([7_800, 14_040, 32_760, 75_600])


def lengths_file(directory: str, n: int, dtype=np.int64) -> str:
    """The ``.npy`` of ``n`` lengths (drawn once, seed 0), written where missing."""
    bits = "" if dtype == np.int64 else "32"
    path = os.path.join(directory, f"lengths{bits}_{n}.npy")
    if not os.path.exists(path):
        os.makedirs(directory, exist_ok=True)
        out = np.lib.format.open_memmap(path + ".tmp", mode="w+", dtype=dtype, shape=(n,))
        rng = np.random.default_rng(0)
        for a in range(0, n, 1 << 24):
            b = min(n, a + (1 << 24))
            image = rng.random(b - a) < 0.4
            out[a:b] = np.where(image, 1_560, rng.choice(CLIPS, b - a))
        out.flush()
        del out
        os.replace(path + ".tmp", path)
    return path


def rank_process(path, ranks, rank, k, iterate, queue):
    from adaptiveload import AdaptiveBatchSampler

    lens = np.load(path, mmap_mode="r")
    t0 = time.perf_counter()
    s = AdaptiveBatchSampler(lens, MAX_TOKENS, num_replicas=ranks, rank=rank,
                             micro_batches_per_step=k, drawn_is_trained=True)  # fmt: skip
    s.set_epoch(0)
    it = iter(s)
    next(it)
    first = time.perf_counter() - t0
    t1 = time.perf_counter()
    done = 1
    for _ in range(iterate):
        if next(it, None) is None:
            break
        done += 1
    rate = (done - 1) / max(time.perf_counter() - t1, 1e-9)
    state = len(pickle.dumps(s.state_dict()))
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    queue.put({"rank": rank, "first_s": first, "rate": rate, "peak": peak, "state": state})


def node(path, ranks, procs, k, iterate):
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    ps = [ctx.Process(target=rank_process, args=(path, ranks, r, k, iterate, queue))
          for r in range(procs)]  # fmt: skip
    for p in ps:
        p.start()
    out = [queue.get() for _ in ps]
    for p in ps:
        p.join()
        if p.exitcode:
            raise RuntimeError(f"a rank process failed ({p.exitcode})")
    return out


def status_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(field + ":"))


def stream_process(path, ranks, rank, k, iterate, queue):
    """One rank process of the streaming arm: the table's pass, then ``set_epoch`` to the
    first micro-batch, then the planning rate while iterating (a new segment planned whenever
    the loop reaches it)."""
    from adaptiveload import StreamingBatchSampler

    lens = np.load(path, mmap_mode="r")
    t0 = time.perf_counter()
    # It trains what it draws (no loader): the state's position is the steps drawn.
    s = StreamingBatchSampler(lens, MAX_TOKENS, num_replicas=ranks, rank=rank,
                              micro_batches_per_step=k, drawn_is_trained=True)  # fmt: skip
    build = time.perf_counter() - t0
    t0 = time.perf_counter()
    s.set_epoch(0)
    it = iter(s)
    next(it)
    first = time.perf_counter() - t0
    t1 = time.perf_counter()
    done = samples = 0
    for batch in it:
        done += 1
        samples += len(batch)
        if done >= iterate:
            break
    elapsed = max(time.perf_counter() - t1, 1e-9)
    queue.put({"rank": rank, "build_s": build, "first_s": first, "rate": done / elapsed,
               "sample_rate": samples / elapsed, "anon": status_kib("RssAnon") * 1024,
               "file": status_kib("RssFile") * 1024,
               "state": len(pickle.dumps(s.state_dict()))})  # fmt: skip


def gather(queue, ps) -> list[dict]:
    """Each rank process's result; a process that died fails the run instead of hanging it."""
    import queue as queues

    out = []
    while len(out) < len(ps):
        try:
            out.append(queue.get(timeout=5))
        except queues.Empty:
            dead = [p.exitcode for p in ps if p.exitcode not in (None, 0)]
            if dead:
                raise RuntimeError(f"a rank process failed (exit codes {dead})") from None
    for p in ps:
        p.join()
    return out


def whole_stream(path, ranks, k, repeat=3):
    """Seconds to plan the whole epoch segment by segment (the report path), and numpy's
    permutation of as many samples: the least of ``repeat`` runs of each, alternated (this
    machine's times vary by up to 2x from run to run, the permutation's most)."""
    from adaptiveload import StreamingBatchSampler
    from adaptiveload.sampler.stream import default_workers

    lens = np.load(path, mmap_mode="r")
    s = StreamingBatchSampler(lens, MAX_TOKENS, num_replicas=ranks, rank=0,
                              micro_batches_per_step=k)  # fmt: skip
    plan_s = perm_s = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        steps = sum(seg.plan.num_steps for seg in s.segments(workers=default_workers()))
        plan_s = min(plan_s, time.perf_counter() - t0)
        t0 = time.perf_counter()
        np.random.default_rng(0).permutation(len(lens))
        perm_s = min(perm_s, time.perf_counter() - t0)
    return plan_s, perm_s, steps


def stream_main(args, sizes) -> int:
    rows = []
    print(f"{'samples':>13} {'build s':>8} {'first s':>8} {'mb/s':>8} {'samples/s':>10} "
          f"{'own/proc':>9} {'node':>8} {'state':>7} {'plan s':>7} {'perm s':>7} {'ratio':>6}")  # fmt: skip
    for n in sizes:
        path = lengths_file(args.dir, n, np.int32)
        ctx = mp.get_context("spawn")
        queue = ctx.Queue()
        ps = [ctx.Process(target=stream_process, args=(path, args.ranks, r, args.k, args.iterate,
                                                       queue)) for r in range(args.procs)]  # fmt: skip
        for p in ps:
            p.start()
        per = gather(queue, ps)
        whole = whole_stream(path, args.ranks, args.k) if n <= args.whole_max else None
        row = {
            "samples": n,
            "build_s": max(r["build_s"] for r in per),
            "first_s": max(r["first_s"] for r in per),
            "rate": min(r["rate"] for r in per),
            "sample_rate": min(r["sample_rate"] for r in per),
            "own_gib": max(r["anon"] for r in per) / 2**30,
            "node_gib": (sum(r["anon"] for r in per) + os.path.getsize(path)) / 2**30,
            "state_b": max(r["state"] for r in per),
            "plan_s": whole[0] if whole else float("nan"),
            "perm_s": whole[1] if whole else float("nan"),
        }
        rows.append(row)
        print(f"{n:>13,} {row['build_s']:>8.2f} {row['first_s']:>8.2f} {row['rate']:>8.0f} "
              f"{row['sample_rate']:>10.0f} {row['own_gib']:>8.2f}G {row['node_gib']:>7.2f}G "
              f"{row['state_b']:>6}B {row['plan_s']:>7.2f} {row['perm_s']:>7.3f} "
              f"{row['plan_s'] / row['perm_s']:>5.1f}x", flush=True)  # fmt: skip
    if args.write:
        sys.path.insert(0, HERE)
        from make_results import write_results
        from results_io import cpu_meta

        head = ["samples", "table pass (s)", "set_epoch to first micro-batch (s)",
                "micro-batches/s while iterating", "samples/s while iterating",
                "own memory per process (GiB)",
                f"node of {args.procs} processes, lengths once (GiB)", "resume state (bytes)",
                f"whole plan, {args.ranks} ranks (s)", "numpy permutation (s)",
                "plan / permutation"]  # fmt: skip
        out = [[f"{r['samples']:,}", f"{r['build_s']:.2f}", f"{r['first_s']:.2f}",
                f"{r['rate']:.0f}", f"{r['sample_rate']:.0f}", f"{r['own_gib']:.3f}",
                f"{r['node_gib']:.2f}", f"{r['state_b']}",
                "-" if r["plan_s"] != r["plan_s"] else f"{r['plan_s']:.2f}",
                "-" if r["perm_s"] != r["perm_s"] else f"{r['perm_s']:.3f}",
                "-" if r["plan_s"] != r["plan_s"] else f"{r['plan_s'] / r['perm_s']:.1f}x"]
               for r in rows]  # fmt: skip
        meta = cpu_meta(
            f"python benchmarks/bench_scale.py --stream --sizes {args.sizes} --procs "
            f"{args.procs} --ranks {args.ranks} --k {args.k} --write"
        )
        print("wrote", write_results("cpu/scale_stream.csv", head, out, meta))
    return 0


def metadata_read(directory: str, n: int, shards: int = 10) -> tuple[float, float]:
    """Seconds to read ``n`` rows of (num_frames, height, width) from ``shards`` Parquet shards
    with ``read_metadata`` (token counts and group keys included), and its peak memory (GiB)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from adaptiveload.metadata import read_metadata

    folder = os.path.join(directory, f"metadata_{n}")
    if not os.path.isdir(folder):
        os.makedirs(folder + ".tmp", exist_ok=True)
        rng = np.random.default_rng(0)
        shapes = np.array([[1, 480, 832], [1, 720, 1280], [21, 480, 832], [81, 480, 832],
                           [41, 720, 1280]])  # fmt: skip
        for i in range(shards):
            rows = shapes[rng.choice(len(shapes), n // shards, p=[0.3, 0.1, 0.3, 0.2, 0.1])]
            table = pa.table({"num_frames": rows[:, 0], "height": rows[:, 1], "width": rows[:, 2]})
            pq.write_table(table, os.path.join(folder + ".tmp", f"part-{i:04d}.parquet"))
        os.replace(folder + ".tmp", folder)
    t0 = time.perf_counter()
    m = read_metadata(folder)
    m.group_keys()
    return time.perf_counter() - t0, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def whole_plan(path, ranks, k):
    """Seconds to plan the whole epoch for ``ranks``, and numpy.random.permutation(N)'s."""
    from adaptiveload import AdaptiveBatchSampler

    lens = np.load(path, mmap_mode="r")
    t0 = time.perf_counter()
    s = AdaptiveBatchSampler(lens, MAX_TOKENS, num_replicas=ranks, rank=0,
                             micro_batches_per_step=k)  # fmt: skip
    s.set_epoch(0)
    s.plan()
    plan_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    np.random.default_rng(0).permutation(len(lens))
    return plan_s, time.perf_counter() - t0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="1e6,1e7", help="epochs' sample counts")
    ap.add_argument("--ranks", type=int, default=1024, help="num_replicas")
    ap.add_argument("--procs", type=int, default=2, help="rank processes started together")
    ap.add_argument("--k", type=int, default=4, help="micro_batches_per_step")
    ap.add_argument("--iterate", type=int, default=2000, help="micro-batches timed after the first")
    ap.add_argument("--dir", default="/tmp/adaptiveload_scale", help="where the lengths go")
    ap.add_argument("--write", action="store_true", help="store results/cpu/scale*.csv")
    ap.add_argument("--stream", action="store_true", help="StreamingBatchSampler (int32 lengths)")
    ap.add_argument("--whole-max", type=float, default=1e8,
                    help="--stream: plan the whole epoch for sizes up to this")  # fmt: skip
    ap.add_argument("--metadata", help="time read_metadata of this many Parquet rows instead")
    args = ap.parse_args(argv)
    sizes = [int(float(v)) for v in args.sizes.split(",")]
    if args.metadata:
        n = int(float(args.metadata))
        seconds, peak = metadata_read(args.dir, n)
        print(
            f"read_metadata: {n:,} rows in 10 Parquet shards, {seconds:.1f} s, peak {peak:.1f} GiB"
        )
        return 0
    if args.stream:
        return stream_main(args, sizes)
    rows = []
    print(f"{'samples':>13} {'first s':>8} {'mb/s':>8} {'peak/proc':>10} {'node':>9} "
          f"{'state':>10} {'plan s':>7} {'perm s':>7} {'ratio':>6}")  # fmt: skip
    for n in sizes:
        path = lengths_file(args.dir, n)
        per = node(path, args.ranks, args.procs, args.k, args.iterate)
        plan_s, perm_s = whole_plan(path, args.ranks, args.k)
        row = {
            "samples": n,
            "first_s": max(r["first_s"] for r in per),
            "rate": min(r["rate"] for r in per),
            "peak_gib": max(r["peak"] for r in per) / 2**30,
            "node_gib": sum(r["peak"] for r in per) / 2**30,
            "state_kib": max(r["state"] for r in per) / 2**10,
            "plan_s": plan_s,
            "perm_s": perm_s,
        }
        rows.append(row)
        print(f"{n:>13,} {row['first_s']:>8.2f} {row['rate']:>8.0f} {row['peak_gib']:>9.2f}G "
              f"{row['node_gib']:>8.2f}G {row['state_kib']:>8.1f}KB {plan_s:>7.2f} "
              f"{perm_s:>7.3f} {plan_s / perm_s:>5.1f}x", flush=True)  # fmt: skip
    if args.write:
        sys.path.insert(0, HERE)
        from make_results import write_results
        from results_io import cpu_meta

        head = ["samples", "first micro-batch (s)", "micro-batches/s while iterating",
                "peak memory per process (GiB)", f"node of {args.procs} processes (GiB)",
                "resume state (KiB)", f"whole plan, {args.ranks} ranks (s)",
                "numpy permutation (s)", "plan / permutation"]  # fmt: skip
        out = [[f"{r['samples']:,}", f"{r['first_s']:.2f}", f"{r['rate']:.0f}",
                f"{r['peak_gib']:.2f}", f"{r['node_gib']:.2f}", f"{r['state_kib']:.1f}",
                f"{r['plan_s']:.2f}", f"{r['perm_s']:.3f}", f"{r['plan_s'] / r['perm_s']:.1f}x"]
               for r in rows]  # fmt: skip
        meta = cpu_meta(
            f"python benchmarks/bench_scale.py --sizes {args.sizes} --procs "
            f"{args.procs} --ranks {args.ranks} --k {args.k} --write"
        )
        print("wrote", write_results("cpu/scale.csv", head, out, meta))
    return 0


if __name__ == "__main__":
    sys.exit(main())
