"""Does the step order change what the model learns? Paired controls per step structure.

A balanced plan decides which micro-batches share an optimizer step. This benchmark trains the
real ``diffusers.WanTransformer3DModel`` (scaled down) on a synthetic image+video task in which
the two modalities pull the parameters apart, and compares each order with a control that
differs from it in the order only (issue #34).

Superseded by benchmarks/fidelity.py (issue #54: real mixes' token spread, the learning rate
by optimizer step, fresh data per seed, every setup teams run), whose table decides whether
the defaults train as a shuffle does; this one stays as the record of why they changed.

- **Task** (convergence_data.py). Latents are sums of smooth 2-D waves with random amplitudes;
  which waves is set by a pattern id whose text embedding the model reads. Images (1 latent
  frame) and clips (3-5 frames, waves moving) of pattern i share its text but not its waves,
  so one text asks for different latents per modality (before issue #34 each modality had
  text of its own). The conflict run shows the pull in the benchmark's output: from the b1_k1
  control trained halfway, training on clips only raises the image validation loss, images
  only the clip loss, while the mix lowers both. Shapes span 7.5x in tokens; about 60% of the
  samples are images.
- **Step structures** (``STRUCTURES``): 8 simulated ranks x K = 4 or 1 micro-batches per step,
  packed up to the longest sample's tokens (the longest clips alone) or one sample per
  micro-batch (``max_batch_size=1``, DiffSynth-Studio's trainer).
- **Orders**, within each structure: ``default`` (``AdaptiveBatchSampler()``), ``segregated``
  (``mix_tolerance=0``: the planner's steps of similar cost, most of one modality) and the
  control ``shuffled``: the default plan's own micro-batches, dealt to the same number of steps
  (K per rank) by a uniform permutation. At batch size 1 the control is a uniform shuffle of
  the samples, W x K per step: DiffSynth's default. The run checks that the control holds
  exactly the default plan's micro-batches in as many steps, and reports whether the
  segregated plan holds them too (it does here: the planner packs, then orders).
- **DDP on one device.** Every rank's micro-batches of a step run forward+backward in turn,
  accumulating the gradient of ``loss_sum / normalizer``, then one AdamW step: DDP's averaged
  gradient times W. Normalizer: the step's latent elements over all ranks (``tokens``) or its
  samples (``samples``, each sample's loss its own mean). Flow matching, ``t ~ U(0, 1)``; t and
  the noise of a sample are drawn from (seed, epoch, sample).
- **Pairs.** One seed fixes the data, the initial weights, the validation set, every sample's
  noise, and the plans; arm and control of one seed differ in the order only. Per structure
  one schedule (epochs, AdamW peak learning rate with warm-up and cosine decay by samples
  seen), the same for its three orders.
- **Statistics** (convergence_stats.py): per run the final validation loss and the area under
  the validation curve per modality; per comparison the paired difference over seeds with a
  95% t interval against +-2% of the control's loss: equivalent, worse, better or
  inconclusive. Axes are samples seen and optimizer steps (equal within a structure); there is
  no time axis: this model's step time is not a real model's.

    # the full run (10 seeds), in slices that fit a 10-minute call; then the summary of all
    PYTHONPATH=python python benchmarks/convergence_wan.py --seeds 0-4 --out-dir /tmp/c0
    PYTHONPATH=python python benchmarks/convergence_wan.py --seeds 5-9 --out-dir /tmp/c1
    PYTHONPATH=python python benchmarks/convergence_wan.py --summarize-only /tmp/c0 /tmp/c1
    PYTHONPATH=python python benchmarks/convergence_wan.py --quick --out-dir /tmp/conv  # CI

Each run writes ``convergence_wan.csv`` (one row per evaluation), ``convergence_conflict.csv``,
``convergence_wan.json`` (the summary), ``convergence_wan.png`` (validation losses) and
``convergence_wan_diff.png`` (paired differences along the run) under ``--out-dir`` (default
``benchmarks/results/<gpu>/``), rows as runs finish; ``--time-budget`` starts no run after
that many seconds, leaving whole seeds (runs go seed by seed).

Where it runs: the full setup is 1.14 million micro-batch forward+backward passes over 10
seeds (24 runs of 3,600-5,400 per seed, and the conflict run), each of 16-120 tokens. On the
CPU a pass costs its Python and dispatch overhead and little compute; on a GPU it is bound by
the same overhead plus the kernel launches, and processes sharing one GPU queue behind each
other. So runs go to ``--workers`` CPU processes (default: one per core, one thread each),
which scale with the cores; ``--device cuda`` puts every worker on the GPU instead.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import re
import sys
import time
from dataclasses import asdict, replace
from datetime import datetime, timezone

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from convergence_arms import (  # noqa: E402
    CONTROL,
    NORMALIZATIONS,
    ORDERS,
    STRUCTURES,
    Context,
    check_wiring,
    conflict_run,
    describe,
    train_run,
)
from convergence_data import SETUPS, SyntheticMix, TrainSet, ValSet  # noqa: E402
from convergence_stats import difference_figure, figure, print_summary, summarize, typed  # noqa: E402

META = ("date", "machine", "device", "torch", "diffusers", "command")
RUN_COLUMNS = (
    "structure",
    "order",
    "normalization",
    "seed",
    "lr",
    "epoch",
    "steps",
    "samples_seen",
    "tokens_seen",
    "micro_batches",
    "mixed_steps",
    "train_loss",
    "wall_s",
    "val_image",
    "val_clip",
)
CONFLICT_COLUMNS = ("seed", "branch", "steps", "grad_cosine", "val_image", "val_clip")
RUNS_CSV, CONFLICT_CSV = "convergence_wan.csv", "convergence_conflict.csv"


def make_context(setup_name: str, overrides: dict, device: str, ranks: int) -> Context:
    setup = replace(SETUPS[setup_name], **overrides)
    mix = SyntheticMix(setup, torch.device(device))
    return Context(setup, TrainSet(mix, setup.samples), ValSet(mix), torch.device(device), ranks)


def run_job(job: tuple, ctx: Context):
    kind, *args = job
    return conflict_run(args[-1], ctx) if kind == "conflict" else train_run(*args, ctx)


_WORKER: dict = {}


def _init_worker(context_args) -> None:
    torch.set_num_threads(1)  # tiny operations: more threads only contend
    _WORKER["ctx"] = make_context(*context_args)


def _run_in_worker(job_and_deadline):
    job, deadline = job_and_deadline
    if time.time() > deadline:
        return job, None
    t0 = time.perf_counter()
    return job, (run_job(job, _WORKER["ctx"]), time.perf_counter() - t0)


def run_jobs(jobs, context_args, workers: int, deadline: float):
    """Yields (job, (rows, seconds)) as runs finish, (job, None) for a run not started before
    the deadline: in this process, or in ``workers`` spawned ones (one run each at a time)."""
    if workers <= 1:
        ctx = make_context(*context_args)
        for job in jobs:
            if time.time() > deadline:
                yield job, None
                continue
            t0 = time.perf_counter()
            yield job, (run_job(job, ctx), time.perf_counter() - t0)
        return
    pool = torch.multiprocessing.get_context("spawn").Pool(
        workers, initializer=_init_worker, initargs=(context_args,)
    )
    try:
        yield from pool.imap_unordered(_run_in_worker, [(j, deadline) for j in jobs])
    finally:
        pool.terminate()
        pool.join()


def make_jobs(seeds, structures, normalizations, conflict: bool) -> list[tuple]:
    """Seed by seed, so that a run cut off by its time budget leaves whole seeds; within a
    seed the longest runs first (K = 4, then the conflict run, then K = 1), so that the last
    runs to finish are short."""
    jobs = []
    for seed in seeds:
        for k in (4, 1):
            jobs += [
                ("train", s, o, n, seed)
                for s in structures
                if STRUCTURES[s][1] == k
                for o in ORDERS
                for n in normalizations
            ]
            if k == 4 and conflict:
                jobs.append(("conflict", seed))
    return jobs


# -- files ------------------------------------------------------------------------------------


class CsvAppender:
    """A CSV written row by row as runs finish, so that a run cut off keeps what it did."""

    def __init__(self, path: str, columns, meta: dict):
        self.path, self.columns, self.meta = path, list(META) + list(columns), meta
        with open(path, "w", newline="") as f:
            csv.writer(f).writerow(self.columns)

    def add(self, rows) -> None:
        with open(self.path, "a", newline="") as f:
            w = csv.DictWriter(f, fieldnames=self.columns, restval="", extrasaction="ignore")
            w.writerows(self.meta | r for r in rows)


def read_csv(path: str) -> list[dict]:
    if not os.path.exists(path):
        return []
    with open(path, newline="") as f:
        return typed(list(csv.DictReader(f)))


def machine_name() -> str:
    """The GPU of this machine (the device runs may go to its CPU cores), or ``cpu``."""
    return torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"


def machine_key(name: str) -> str:
    """The results folder of a machine: ``cpu``, or the GPU's model (``h200``)."""
    name = name.lower().replace("nvidia", "").strip()
    return "cpu" if name == "cpu" else (re.split(r"[^a-z0-9]+", name)[0] or "gpu")


def parse_list(text: str) -> list[str]:
    return [v for v in text.split(",") if v]


def parse_seeds(text: str) -> list[int]:
    """``0-4``, ``0,3,7`` or a mix: ``0-2,9``."""
    seeds = []
    for part in parse_list(text):
        low, _, high = part.partition("-")
        seeds += list(range(int(low), int(high or low) + 1))
    return sorted(set(seeds))


def write_summary(rows, conflict_rows, ctx: Context, out_dir: str, info: dict) -> dict:
    """Summary of the rows (every seed in them): printed, as JSON, and the figure."""
    predictor = ctx.val.no_structure_loss(ctx.data.power())
    seeds = sorted({r["seed"] for r in rows})
    summary = summarize(rows, conflict_rows, predictor, seeds)
    print_summary(summary)
    info = info | {
        "setup": asdict(ctx.setup),
        "ranks": ctx.ranks,
        "seeds": seeds,
        "samplers": {f"{s}/{o}": describe(s, o) for s in STRUCTURES for o in ORDERS},
        "control": CONTROL,
        "commands": sorted({r["command"] for r in rows if r.get("command")}),
    }
    with open(os.path.join(out_dir, "convergence_wan.json"), "w") as f:
        json.dump(info | summary, f, indent=1)
    figure(rows, predictor, os.path.join(out_dir, "convergence_wan.png"))
    difference_figure(rows, os.path.join(out_dir, "convergence_wan_diff.png"))
    print(f"wrote {out_dir}/convergence_wan.json, .png and _diff.png")
    return summary


def summarize_only(dirs, out_dir: str | None, ranks: int) -> int:
    """Merges the CSVs of several slices (e.g. ``--seeds 0-4`` and ``--seeds 5-9``) and writes
    their summary; the setup is the full one unless every slice ran ``--quick``."""
    rows = [r for d in dirs for r in read_csv(os.path.join(d, RUNS_CSV))]
    conflict_rows = [r for d in dirs for r in read_csv(os.path.join(d, CONFLICT_CSV))]
    if not rows:
        print(f"no {RUNS_CSV} under {', '.join(dirs)}", file=sys.stderr)
        return 1
    quick = all("--quick" in r["command"] for r in rows)
    ctx = make_context("quick" if quick else "full", {}, "cpu", ranks)
    out_dir = out_dir or os.path.join(HERE, "results", machine_key(rows[0]["machine"]))
    os.makedirs(out_dir, exist_ok=True)
    for name, part, columns in (
        (RUNS_CSV, rows, RUN_COLUMNS),
        (CONFLICT_CSV, conflict_rows, CONFLICT_COLUMNS),
    ):
        if part:
            with open(os.path.join(out_dir, name), "w", newline="") as f:
                w = csv.DictWriter(f, fieldnames=list(META) + list(columns), extrasaction="ignore")
                w.writeheader()
                w.writerows(part)
    first = rows[0]
    info = {
        "date": ", ".join(sorted({r["date"] for r in rows})),
        "machine": first["machine"],
        "device": first["device"],
        "torch": first.get("torch", ""),
        "diffusers": first.get("diffusers", ""),
        "wiring": check_wiring(ctx.data, ranks, min(r["seed"] for r in rows)),
    }
    write_summary(rows, conflict_rows, ctx, out_dir, info)
    print(f"merged {len(dirs)} folders into {out_dir}")
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="tiny model and data (CPU, seconds)")
    ap.add_argument("--seeds", type=parse_seeds, default=None, help="e.g. 0-4 (0-9; quick 0-1)")
    ap.add_argument(
        "--structures", type=parse_list, default=list(STRUCTURES), help=f"of {','.join(STRUCTURES)}"
    )
    ap.add_argument("--normalizations", type=parse_list, default=list(NORMALIZATIONS))
    ap.add_argument("--no-conflict", action="store_true", help="skip the conflict runs")
    ap.add_argument("--ranks", type=int, default=8, help="data-parallel ranks simulated")
    ap.add_argument(
        "--workers",
        type=int,
        default=None,
        help="processes running runs (default: 1 with --quick, else the CPU cores this may use)",
    )
    ap.add_argument("--device", default="cpu", help="cpu (default) or cuda: see the docstring")
    ap.add_argument(
        "--time-budget",
        type=float,
        default=None,
        help="seconds from the start after which no run starts (runs in flight finish)",
    )
    ap.add_argument("--out-dir", default=None, help="default: benchmarks/results/<gpu>")
    ap.add_argument(
        "--summarize-only",
        nargs="+",
        metavar="DIR",
        default=None,
        help="merge the CSVs of these --out-dir folders and summarize them",
    )
    args = ap.parse_args(argv)
    if args.summarize_only:
        return summarize_only(args.summarize_only, args.out_dir, args.ranks)
    for chosen, known in ((args.structures, STRUCTURES), (args.normalizations, NORMALIZATIONS)):
        if not chosen or any(v not in known for v in chosen):
            ap.error(f"choose from {', '.join(known)}")
    seeds = args.seeds if args.seeds is not None else ([0, 1] if args.quick else list(range(10)))
    workers = args.workers or (1 if args.quick else len(os.sched_getaffinity(0)))
    setup_name = "quick" if args.quick else "full"

    import diffusers

    t_start, started = time.perf_counter(), time.time()
    machine = machine_name()
    print(
        f"machine {machine}, runs on {args.device} x {workers} workers, torch "
        f"{torch.__version__}, diffusers {diffusers.__version__}"
    )
    torch.set_num_threads(1)
    ctx = make_context(setup_name, {}, "cpu", args.ranks)
    setup, data = ctx.setup, ctx.data
    images = data.is_image()
    print(
        f"data: {len(data)} samples ({images.mean():.0%} images, "
        f"{data.seq_lens[images].sum() / data.seq_lens.sum():.0%} of the tokens), "
        f"{data.seq_lens.min()}-{data.seq_lens.max()} tokens; {args.ranks} ranks; model "
        f"{setup.model}"
    )
    for s in args.structures:
        sch = setup.schedules[s]
        print(
            f"  {s}: {sch.epochs} epochs, AdamW peak lr {sch.lr:g} (warm-up {setup.warmup:.0%},"
            f" cosine to {setup.final_lr:g}x), every order; {describe(s, 'default')}"
        )
    wiring = check_wiring(data, args.ranks, seeds[0])
    for s, facts in wiring.items():
        print(
            f"  wiring {s}: control = the default plan's micro-batches in as many steps "
            f"({facts['steps'][CONTROL]} per epoch); segregated holds them too: "
            f"{facts['segregated_same_micro_batches']}; mixed steps "
            + ", ".join(f"{o} {np.mean(v):.0%}" for o, v in facts["mixed_steps"].items())
        )

    out_dir = args.out_dir or os.path.join(HERE, "results", machine_key(machine))
    os.makedirs(out_dir, exist_ok=True)
    meta = {
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": machine,
        "device": args.device,
        "torch": torch.__version__,
        "diffusers": diffusers.__version__,
        "command": " ".join(["python benchmarks/convergence_wan.py", *(argv or sys.argv[1:])]),
    }
    runs_csv = CsvAppender(os.path.join(out_dir, RUNS_CSV), RUN_COLUMNS, meta)
    conflict_csv = CsvAppender(os.path.join(out_dir, CONFLICT_CSV), CONFLICT_COLUMNS, meta)
    jobs = make_jobs(seeds, args.structures, args.normalizations, not args.no_conflict)
    deadline = started + (args.time_budget if args.time_budget is not None else 1e9)
    rows, conflict_rows, skipped, passes = [], [], 0, 0
    context_args = (setup_name, {}, args.device, args.ranks)
    for done, (job, result) in enumerate(run_jobs(jobs, context_args, workers, deadline), 1):
        if result is None:
            skipped += 1
            continue
        run, seconds = result
        if job[0] == "conflict":
            conflict_rows += [meta | r for r in run]
            conflict_csv.add(run)
            text = f"conflict, seed {job[1]}"
        else:
            rows += [meta | r for r in run]
            runs_csv.add(run)
            passes += run[-1]["micro_batches"]
            text = (
                f"seed {job[4]} {job[1]}/{job[2]}/{job[3]}: {run[-1]['steps']} steps, val "
                f"image {run[-1]['val_image']:.4f} clip {run[-1]['val_clip']:.4f}"
            )
        elapsed = time.perf_counter() - t_start
        print(
            f"[{done}/{len(jobs)}] {text}; {seconds:.1f} s; {elapsed:.0f} s in, "
            f"{passes / elapsed:.0f} micro-batches/s",
            flush=True,
        )
    if skipped:
        print(f"time budget: {skipped} of {len(jobs)} runs not started", flush=True)
    if not rows:
        return 1
    info = {
        "date": meta["date"],
        "machine": machine,
        "device": args.device,
        "workers": workers,
        "torch": torch.__version__,
        "diffusers": diffusers.__version__,
        "wiring": wiring,
        "runs_skipped": skipped,
        "wall_s": time.perf_counter() - t_start,
    }
    write_summary(rows, conflict_rows, ctx, out_dir, info)
    print(f"wrote {out_dir}/{RUNS_CSV}, {CONFLICT_CSV}; {time.perf_counter() - t_start:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
