"""Does the balanced plan train as well as a shuffle? The fidelity benchmark of issue #54.

The real ``diffusers.WanTransformer3DModel`` (scaled down with the data: fidelity_data.py)
trains on a synthetic image+video mix whose token counts span 52x, at every setup teams run:
packed micro-batches or one sample each, K = 4 or 1, at 8 or 64 ranks (fidelity_arms.py). Per
setup the arms are ``ARMS``, one table of sampler keywords: ``default`` (none: the library's
defaults), ``segregated`` (``composition="balanced", mix_tolerance=0.0``), and the remedies
(``mix_tolerance`` 0.1 and 1.0, ``uneven_counts``, ``sequence_parallel=4``). Each is compared
with its order-only control: its own plan's micro-batches dealt to steps of the same sizes by
a uniform permutation (the default's, unless the arm packs its own).

- **Primary measure**, named before the run (``fidelity_stats.PRIMARY``): the final held-out
  validation loss, mean of images and clips, as the paired difference arm - control per seed
  in % of the control's mean; 90% and 95% t intervals; the verdict at 95% against +-2%:
  equivalent, worse, better or inconclusive. Target: every default arm equivalent.
- **Training.** Every run takes ``Size.steps`` AdamW steps, its learning rate a function of
  the step alone (warm-up, cosine), so it is the same at every step for every arm of a setup
  whatever its steps per epoch; epochs follow one another as the steps need. Every rank's
  micro-batches of a step make one gradient (DDP's average times W, loss summed over tokens
  over the step's tokens), computed batched by shape: micro-batch boundaries do not enter it.
  A micro-batch that sequence parallelism splits trains as the whole one. bf16 autocast on a
  GPU. Two runs of a seed whose every step trains the same samples are run once.
- **Seeds.** A seed draws its own training data, validation patterns (never trained on),
  initial weights, noise and plans. Seeds run in rounds: ``--min-seeds`` first, then
  ``--seed-batch`` more for the comparisons still inconclusive, up to ``--max-seeds``;
  ``--time-budget`` starts no run after that many seconds (results so far are summarized).
  Adding seeds until decided slightly inflates the error rates: it looks at the data several
  times, so the nominal 95% intervals cover a little less than 95% and a verdict (equivalent,
  worse, better) is wrong somewhat more often than 5% of the time. No correction is made.

    PYTHONPATH=python python benchmarks/fidelity.py --device cuda --time-budget 1380
    PYTHONPATH=python python benchmarks/fidelity.py --quick --out-dir /tmp/fidelity  # CI

``--workers N`` trains N runs at once, each in a process of its own (spawned; each rebuilds
its seed's data from the seed): the same rows as one process (tests/python/test_fidelity.py),
sooner where the runs are launch-bound, as this small model's are on a GPU.

Writes ``fidelity.csv`` (a row per evaluation, as runs finish), ``fidelity.json`` (setup,
wiring, comparisons, targets) and ``fidelity.md`` (the RESULTS.md fragment) under
``--out-dir`` (default ``benchmarks/results/<gpu>/``).

**In slices** (measured on an H100 with ``--workers 8``: about 3.5 minutes a seed, seeds 0-1 of
every setup in 418 s; the rule's 4 to 12 seeds take 14 to 42 minutes; the device runs 10
minutes a call):
``--seeds A-B`` runs those seeds only, every setup and arm, no rounds, and writes its rows
and ``fidelity_slice.json`` (the configuration and its digest). ``--summarize-only DIR ...``
merges slices, refusing any of another configuration (sizes, setups, arms, device kind,
margin, seed rule), writes the summary, and prints the comparisons that still need seeds and
the next slice, ``next: --seeds 2-3``, until every comparison is decided or has the stated
maximum of seeds. A seed that a time budget cut short is named again; run it again (the merge
takes each run from the first slice that has it). A slice's record is rewritten as each run
finishes, so one killed before its end (the device call's limit) merges the runs it finished.
On the device, one call per slice:

    FIDELITY_ARGS="--seeds 0-1" bash scripts/gpu_check.sh fidelity   # $OUT/fidelity: slice 0
    PYTHONPATH=python python benchmarks/fidelity.py --summarize-only slice0 --out-dir /tmp/f
    FIDELITY_ARGS="--seeds 2-3" bash scripts/gpu_check.sh fidelity   # as "next:" says; ...
    PYTHONPATH=python python benchmarks/fidelity.py --summarize-only slice0 slice1 ...

with the slices' folders copied back from each call's $OUT/fidelity; the last merge goes to
``benchmarks/results/<gpu>/`` (its default). Once the first seeds are in, most comparisons
are decided and a slice need not train every run again: ``--seeds A-B --pending DIR ...``
trains only the comparisons the merge of those slices leaves pending (each arm with its
control, for the seeds it lacks), and ``--continue DIR ...`` runs such slices round after round
(``seeds4-5``, ``seeds6-7``, ... under ``--out-dir``) until every comparison is decided or has
the maximum of seeds, or the time budget ends. The merge takes each run from the first slice
that has it. ``--workers 8`` fits an 80 GB H100; 14 ran it out of memory. Slices follow one
run's stopping rule and inflate its error rates just as slightly: adding seeds while
inconclusive is sequential testing.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import sys
import time
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from datetime import datetime, timezone

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import fidelity_slices as fsl  # noqa: E402
import fidelity_stats as fs  # noqa: E402
from fidelity_arms import (  # noqa: E402
    ARMS,
    SETUPS,
    check_wiring,
    describe,
    fingerprint,
    run_steps,
    runs_of,
    train_job,
    train_run,
)
from fidelity_data import SIZES, TOKEN_SCALE, SeedData  # noqa: E402


def parse_list(text: str) -> list[str]:
    return [v for v in text.split(",") if v]


def machine_key() -> str:
    if not torch.cuda.is_available():
        return "cpu"
    name = torch.cuda.get_device_name(0).lower().replace("nvidia", "").split()
    return name[0] if name else "gpu"


def data_facts(data: SeedData) -> dict:
    """What the tests check of a seed's data: validation patterns apart from training ones."""
    train = {m: p.params() for m, p in data.patterns.items()}
    shared = sum(
        int((np.abs(train[m][:, None] - p.params()[None]).max(-1) == 0).any())
        for m, p in data.val_patterns.items()
    )
    return {"val_patterns_trained": shared, "x0_sum": float(sum(x.sum() for x in data.x0.values()))}


def plan_work(work, size, device, wiring) -> list[dict]:
    """The training jobs of ``work`` ({seed: {setup: [runs]}}), in order: each run's steps
    planned here (the first seed's plans checked), and a run whose every step trains the same
    samples as an earlier run of its seed and setup marked ``same_as`` it (trained once)."""
    jobs = []
    for seed, seed_work in work.items():
        data = SeedData(size, seed, device)
        wiring.setdefault("data", {})[seed] = data_facts(data)
        for setup, runs in seed_work.items():
            cache, first_of = {}, {}
            if wiring.setdefault("plans_seed", seed) == seed:  # the first seed's plans, checked
                wiring.setdefault("plans", {})[setup] = check_wiring(setup, runs, data, cache=cache)
            for run in runs:
                steps = run_steps(setup, run, data, size, cache)
                job = {"seed": seed, "setup": setup, "run": run, "steps": steps}
                job["same_as"] = first_of.setdefault(fingerprint(steps), job)
                jobs.append(job)
    return jobs


def run_jobs(
    jobs, size, device, deadline, workers, csv_path, on_done=lambda lrs: None
) -> tuple[list, dict, bool]:
    """Trains ``jobs`` (``plan_work``) in this process or in ``workers`` spawned processes (on
    a GPU each holds its own context: the runs are launch-bound, so several keep it busier);
    no job starts after ``deadline``. Rows are written as runs finish, and ``on_done`` is
    called with the traces so far. Returns (rows, learning-rate traces {seed: {setup: {run:
    lrs}}}, whether the deadline cut the jobs)."""
    rows, lrs = [], {}

    def finish(job, result, same_as: str) -> None:
        new = [r | {"run": job["run"], "same_as": same_as} for r in result.rows]
        fsl.add_rows(csv_path, new)
        rows.extend(new)
        last = new[-1]
        print(
            f"  seed {job['seed']} {job['setup']} {job['run']}: val {last['val_mean']:.4f} "
            f"(image {last['val_image']:.4f}, clip {last['val_clip']:.4f}), mixed steps "
            f"{last['mixed_steps']:.0%}, {last['wall_s']:.1f} s"
            + (f" (= {same_as})" if same_as else ""),
            flush=True,
        )

    def done(job, result) -> None:
        lrs.setdefault(job["seed"], {}).setdefault(job["setup"], {})[job["run"]] = result.lrs
        finish(job, result, "")
        for twin in jobs:  # runs that train the same steps as this one
            if twin is not job and twin["same_as"] is job:
                finish(twin, result, job["run"])
        on_done(lrs)

    queue = [j for j in jobs if j["same_as"] is j]
    if workers <= 1:
        data = {}
        while queue:
            if time.time() > deadline:
                return rows, lrs, True
            job = queue.pop(0)
            if job["seed"] not in data:
                data = {job["seed"]: SeedData(size, job["seed"], device)}
            done(job, train_run(job["setup"], job["run"], job["steps"], data[job["seed"]], size))
        return rows, lrs, False
    threads = 1 if device == "cpu" else torch.get_num_threads()
    pool = ProcessPoolExecutor(
        workers, mp_context=mp.get_context("spawn"), initializer=torch.set_num_threads,
        initargs=(threads,),
    )  # fmt: skip
    with pool:
        pending = {}
        while queue or pending:
            while queue and len(pending) < workers and time.time() <= deadline:
                job = queue.pop(0)
                args = (job["setup"], job["run"], job["steps"], size, job["seed"], device)
                pending[pool.submit(train_job, *args)] = job
            if not pending:
                break
            finished, _ = wait(pending, return_when=FIRST_COMPLETED)
            for future in finished:
                done(pending.pop(future), future.result())
    return rows, lrs, bool(queue)


def merged_traces(traces: dict, more: dict) -> dict:
    """Learning-rate traces {seed: {setup: {run: lrs}}} of both."""
    out = {seed: {setup: dict(runs) for setup, runs in by.items()} for seed, by in traces.items()}
    for seed, by_setup in more.items():
        for setup, runs in by_setup.items():
            out.setdefault(seed, {}).setdefault(setup, {}).update(runs)
    return out


def run_rounds(
    args,
    seeds,
    size,
    deadline,
    csv_path,
    wiring,
    max_seeds,
    on_done=lambda traces: None,
    work=None,
) -> tuple:
    """The runs of ``work`` ({seed: {setup: [runs]}}; default: every setup and arm of
    ``seeds``); without ``--seeds``, then rounds of ``--seed-batch`` more seeds for the
    comparisons still inconclusive, up to ``max_seeds``. ``on_done`` is called with every
    trace so far as each run finishes. Returns (rows, learning-rate traces per seed, whether
    the time budget cut them)."""
    rows, lr_traces, cut = [], {}, False
    if work is None:
        work = {s: {setup: runs_of(args.arms) for setup in args.setups} for s in seeds}
    while work and not cut:
        for seed, seed_work in work.items():
            print(f"seed {seed}: {sum(len(r) for r in seed_work.values())} runs", flush=True)
        jobs = plan_work(work, size, args.device, wiring)

        def run_done(lrs, before=lr_traces):
            on_done(merged_traces(before, lrs))

        new, lrs, cut = run_jobs(
            jobs, size, args.device, deadline, args.workers, csv_path, run_done
        )
        rows += new
        lr_traces = merged_traces(lr_traces, lrs)
        if cut:
            print("time budget reached: no more runs", flush=True)
            break
        if args.seeds is not None:  # a slice: its seeds only, no rounds
            break
        todo = fs.undecided(fs.comparisons(rows, args.setups, args.arms), max_seeds)
        more = list(range(len(seeds), min(len(seeds) + args.seed_batch, max_seeds)))
        work = {}
        for seed in more if todo else []:
            seeds.append(seed)
            work[seed] = {}
            for setup, arm in todo:
                work[seed][setup] = list(
                    dict.fromkeys([*work[seed].get(setup, []), *runs_of([arm])])
                )
    return rows, lr_traces, cut


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="tiny model and data (CPU, seconds)")
    ap.add_argument("--setups", type=parse_list, default=list(SETUPS))
    ap.add_argument("--arms", type=parse_list, default=list(ARMS))
    ap.add_argument("--min-seeds", type=int, default=None, help="first round (4; quick 2)")
    ap.add_argument("--seed-batch", type=int, default=2, help="seeds added per later round")
    ap.add_argument("--max-seeds", type=int, default=None, help="stated maximum (12; quick 2)")
    ap.add_argument(
        "--seeds", type=fsl.parse_seeds, default=None, help="a slice: these seeds only (0-1)"
    )
    ap.add_argument(
        "--summarize-only", nargs="+", metavar="DIR", help="merge these slices' --out-dir folders"
    )
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--time-budget", type=float, default=None, help="seconds; no run after")
    ap.add_argument(
        "--workers", type=int, default=1, help="runs trained at once, each in its own process"
    )
    ap.add_argument(
        "--pending",
        nargs="+",
        metavar="DIR",
        help="with --seeds: only the comparisons these slices leave pending",
    )
    ap.add_argument(
        "--continue",
        dest="continue_from",
        nargs="+",
        metavar="DIR",
        help="slices of the pending comparisons, round after round, until decided",
    )
    ap.add_argument("--out-dir", default=None, help="default: benchmarks/results/<gpu>")
    args = ap.parse_args(argv)
    if args.summarize_only:
        return fsl.summarize_only(args.summarize_only, args.out_dir)
    for chosen, known in ((args.setups, SETUPS), (args.arms, ARMS)):
        if not chosen or any(v not in known for v in chosen):
            ap.error(f"choose from {', '.join(known)}")
    size = SIZES["quick" if args.quick else "full"]
    min_seeds = args.min_seeds or (2 if args.quick else 4)
    max_seeds = max(args.max_seeds or (2 if args.quick else 12), min_seeds)
    if args.seeds is not None and args.seeds[-1] >= max_seeds:
        ap.error(f"--seeds beyond the stated maximum of {max_seeds} seeds (0-{max_seeds - 1})")
    if args.pending and args.seeds is None:
        ap.error("--pending runs a slice: name its --seeds (or --continue)")
    if args.continue_from and (args.seeds is not None or args.pending):
        ap.error("--continue chooses each slice's seeds and runs itself: no --seeds, --pending")
    cfg = fsl.config(
        size, args.setups, args.arms, args.device, min_seeds, max_seeds, args.seed_batch
    )
    command = " ".join(["python benchmarks/fidelity.py", *(argv or sys.argv[1:])])
    if args.continue_from:
        return continue_slices(args, cfg, size, max_seeds)
    return run(args, cfg, size, min_seeds, max_seeds, command)


def continue_slices(args, cfg: dict, size, max_seeds: int) -> int:
    """``--continue DIR ...``: the next seeds' slice of the comparisons still pending over the
    slices in DIR ... (``--pending``), merged with them, then the next, until every comparison
    is decided or has the maximum of seeds, or the time budget ends. Each slice goes to its own
    folder under ``--out-dir`` (``seeds4-5``, ...), to merge with ``--summarize-only``."""
    started = time.time()
    budget = args.time_budget if args.time_budget is not None else 1e9
    out_root = args.out_dir or os.path.join(HERE, "results", machine_key(), "fidelity_slices")
    dirs = list(args.continue_from)
    while True:
        try:
            nxt = fsl.next_seeds(fsl.pending_of(dirs, cfg), cfg)
        except fsl.Refused as e:
            print(f"REFUSED: {e}", file=sys.stderr)
            return 2
        left = budget - (time.time() - started)
        if not nxt:
            print("decided: every comparison decided or at the maximum of seeds", flush=True)
            return 0
        if left <= 0:
            print(f"time budget reached; next: --seeds {fsl.format_seeds(nxt)}", flush=True)
            return 0
        base = out = os.path.join(out_root, f"seeds{fsl.format_seeds(nxt)}")
        for again in range(2, 100):  # a folder of these seeds kept from an earlier call
            if not os.path.exists(out):
                break
            out = f"{base}.{again}"
        sub = argparse.Namespace(**vars(args))
        sub.seeds, sub.pending, sub.out_dir, sub.time_budget = nxt, list(dirs), out, left
        command = (
            f"python benchmarks/fidelity.py --seeds {fsl.format_seeds(nxt)} --pending "
            f"{' '.join(dirs)} --workers {args.workers} (--continue)"
        )
        rc = run(sub, cfg, size, cfg["seeds"]["min"], max_seeds, command)
        if rc != 0:
            return rc
        dirs.append(out)
        with open(os.path.join(out, fsl.SLICE_JSON)) as f:
            if json.load(f)["time_budget_cut"]:
                print(f"time budget reached after {out}", flush=True)
                return 0


def run(args, cfg: dict, size, min_seeds: int, max_seeds: int, command: str) -> int:
    """One run (rounds of seeds, summarized) or one slice (``--seeds``, its rows and record)."""
    started = time.time()
    deadline = started + (args.time_budget if args.time_budget is not None else 1e9)

    torch.set_num_threads(1 if args.device == "cpu" else torch.get_num_threads())
    machine = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"
    versions = fsl.provenance()
    seeds = args.seeds if args.seeds is not None else list(range(min_seeds))
    work = None
    if args.pending:
        try:
            work = fsl.pending_work(args.pending, cfg, seeds)
        except fsl.Refused as e:
            print(f"REFUSED: {e}", file=sys.stderr)
            return 2
        if not work:
            print(f"nothing pending lacks seeds {fsl.format_seeds(seeds)}: no run", flush=True)
            return 0
    print(
        f"machine {machine}, runs on {args.device}; torch {versions['torch']}, diffusers "
        f"{versions['diffusers']}\nPRIMARY MEASURE (named before the run): {fs.PRIMARY_TEXT}"
        f"; 90% and 95% t intervals, verdict at 95% against +-{fs.MARGIN:.0%}\n"
        f"model {size.model}; {size.samples} samples per seed from {size.patterns} patterns "
        f"per modality, shapes {[s for s, _ in size.mix]} (1 token = {TOKEN_SCALE} of Wan "
        f"2.1's); {size.steps} steps per run, AdamW peak lr {size.lr:g} by step; validation "
        f"{size.val_per_shape} new patterns per shape x {size.val_timesteps} timesteps; "
        f"seeds {min_seeds} then +{args.seed_batch} while inconclusive, at most {max_seeds}"
        + (f"; this slice: seeds {fsl.format_seeds(seeds)}" if args.seeds is not None else "")
        + f"; config {fsl.digest(cfg)}"
    )
    for setup in args.setups:
        for run in runs_of(args.arms):
            print(f"  {setup} {run}: {describe(setup, run)}")

    out_dir = args.out_dir or os.path.join(HERE, "results", machine_key())
    os.makedirs(out_dir, exist_ok=True)
    csv_path = os.path.join(out_dir, fsl.ROWS_CSV)
    fsl.start_rows(csv_path)
    wiring = {}

    def info_of(lr_traces: dict, cut: bool) -> dict:
        wiring["lr_same_across_runs"] = {
            f"{seed}/{setup}": len({tuple(v) for v in runs.values()}) == 1
            for seed, by_setup in lr_traces.items()
            for setup, runs in by_setup.items()
        }
        return {
            "machine": machine,
            "device": args.device,
            **versions,
            "commands": [command],
            "time_budget_cut": cut,
            "wall_s": round(time.time() - started, 1),
            "wiring": wiring,
        }

    def write_slice(info: dict) -> None:
        fsl.write_slice(
            out_dir,
            {
                "config": cfg,
                "digest": fsl.digest(cfg),
                "seeds": seeds,
                "machine_key": machine_key(),
                "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
                "command": info.pop("commands")[0],
                "provenance": versions,
            }
            | info,
        )

    def run_done(traces: dict) -> None:
        # A slice's record is written as each run finishes, as if cut there, so that a slice
        # killed before its end (the device call's limit) still merges the runs it finished.
        if args.seeds is not None:
            write_slice(info_of(traces, True))

    rows, lr_traces, cut = run_rounds(
        args, list(seeds), size, deadline, csv_path, wiring, max_seeds, run_done, work
    )
    info = info_of(lr_traces, cut)
    if args.seeds is None:
        fsl.write_summary(out_dir, rows, cfg, info)
        print(f"wrote {out_dir}/fidelity.csv, .json, .md; {info['wall_s']:.0f} s")
        return 0 if rows else 1
    write_slice(info)
    fs.print_table(fs.comparisons(rows, args.setups, args.arms))
    print(
        f"this slice only (seeds {fsl.format_seeds(seeds)}): wrote {csv_path} and "
        f"{fsl.SLICE_JSON}; {info['wall_s']:.0f} s. Merge the slices' folders with "
        "--summarize-only DIR [DIR ...]"
    )
    return 0 if rows else 1


if __name__ == "__main__":
    sys.exit(main())
