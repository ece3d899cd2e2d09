"""What does the step order do to training? Validation loss per modality under each sampler.

A balanced plan decides which samples share an optimizer step. A planner that sorts each
window of micro-batches by cost (``mix_tolerance=0``) makes most steps hold images only or clips
only; a model that sees one modality per step can drift from the other. This benchmark trains the real
``diffusers.WanTransformer3DModel`` (scaled down) on a learnable synthetic task in which images
and clips carry different structure, once per sampler arm, and measures validation loss per
modality against samples seen and against replayed GPU time.

- **Task.** Latents are sums of a few smooth 2-D waves with random amplitudes. Which waves is
  set by a pattern id carried in the text embedding (a fixed random embedding per id). Images
  (1 latent frame) and clips (several) have ids and waves of their own, and in clips the waves
  move from frame to frame: the two modalities share only the model. Shapes span 17x in
  tokens; images are 60% of the samples and about 11% of the tokens, like the real mix.
- **Arms** (``ARMS``), each planning the same dataset for 8 ranks x K micro-batches with
  ``max_tokens`` = 2x the longest sample and the run's seed: ``shuffled_b1`` (shuffled samples
  one per micro-batch, DiffSynth-Studio's default), ``equal_token`` (equal-token buckets),
  ``segregated`` (``AdaptiveBatchSampler(mix_tolerance=0.0)``: the cost-sorted planner, whose steps hold
  one or two shapes), ``default`` (``AdaptiveBatchSampler()``, steps
  mixed within the default tolerance) and ``b1_segregated`` (the segregating planner at batch
  size 1: the same step structure as ``shuffled_b1``, so the two differ in order only). The
  adaptive arms plan with the built-in cost model, whose ratios are Wan 14B's on real shapes.
- **DDP on one GPU.** Every rank's micro-batches of a step run forward+backward in turn,
  accumulating the gradient of ``loss_sum / normalizer``, then one AdamW step: DDP's averaged
  gradient times W, as examples/train_wan.py computes it. Normalizer: the step's latent
  elements over all ranks (``tokens``, train_wan's mean over tokens) or its samples over all
  ranks, each sample's loss its own mean (``samples``, DiffSynth's per-sample mean).
- **Flow matching.** ``x_t = (1 - t) x0 + t noise``, target ``noise - x0``, MSE; ``t ~ U(0, 1)``
  and the noise are drawn from (seed, epoch, sample), so every arm sees the same noise for a
  sample.
- **Replayed GPU time.** Each micro-batch's forward+backward is timed (CUDA events, read once
  per step); a step takes its slowest rank's sum, as the gradient all-reduce waits for it (the
  optimizer step is logged apart). Micro-batches this small are mostly bound by the host's
  kernel launches, as the real model's image micro-batches are, so the arms' epochs differ
  mostly in their number of micro-batches.
- **Validation.** A fixed set of images and clips at t in {0.2, 0.5, 0.8}, same noise for every
  run; the loss is each sample's mean squared error, averaged per modality; evaluated at
  ``evals_per_epoch`` points of each epoch by samples seen.

Target (issue #25): at equal samples seen the default arm's validation loss is within the
seed-to-seed spread of ``shuffled_b1``; at equal GPU time it is lower. Note that the arms' steps
differ in size: a ``shuffled_b1`` step holds W x K samples, a packed one several times more,
so at equal samples the packed arms take fewer optimizer steps, all at the same learning rate
(per epoch of the full setup: 64 for shuffled_b1, 13 for equal_token, 21 for the adaptive arms).

    PYTHONPATH=python python benchmarks/convergence_wan.py   # one H200: 5 arms x 2 x 3 seeds
    PYTHONPATH=python python benchmarks/convergence_wan.py --quick --out-dir /tmp/conv   # CPU

Writes ``convergence_wan.csv`` (one row per evaluation) and ``convergence_wan.png`` under
``benchmarks/results/<gpu>/`` (or ``--out-dir``), prints a summary table, and writes the summary
as ``convergence_wan.json`` to $OUT when that is set.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import sys
import time
from dataclasses import asdict, replace
from datetime import datetime, timezone

import numpy as np
import torch

from adaptiveload import AdaptiveBatchSampler, EqualTokenBatchSampler

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from convergence_data import (  # noqa: E402
    MODALITIES,
    PATCH,
    SETUPS,
    Setup,
    SyntheticMix,
    TrainSet,
    ValSet,
    build_model,
    loss_sum,
    tokens_of,
)
from make_results import write_csv  # noqa: E402

# Sampler arms: class and keyword arguments (besides the data, ranks, K, max_tokens and seed).
ARMS: dict[str, tuple[type, dict]] = {
    "shuffled_b1": (EqualTokenBatchSampler, {"max_batch_size": 1}),
    "equal_token": (EqualTokenBatchSampler, {}),
    "segregated": (AdaptiveBatchSampler, {"mix_tolerance": 0.0}),
    "default": (AdaptiveBatchSampler, {}),
    "b1_segregated": (AdaptiveBatchSampler, {"max_batch_size": 1, "mix_tolerance": 0.0}),
}
NORMALIZATIONS = ("tokens", "samples")


def step_normalizer(plan, step: int, normalization: str, elements_per_token: int) -> float:
    """The step's latent elements over all ranks, or its samples over all ranks."""
    if normalization == "tokens":
        return float(plan.step_tokens()[step]) * elements_per_token
    return float(plan.step_samples()[step])


def step_micro_batches(plan, step: int) -> list[tuple[int, np.ndarray]]:
    """(rank, sample indices) of every micro-batch of the step, rank by rank."""
    return [
        (rank, plan.micro_batch(step, rank, k))
        for rank in range(plan.num_replicas)
        for k in range(plan.micro_batches_in_step(step, rank))
    ]


def accumulate_step(model, micro_batches, normalization: str, normalizer: float):
    """Forward+backward of each micro-batch, accumulating the gradient of
    ``loss_sum / normalizer`` (DDP's averaged gradient times W). Returns the step's loss and
    each micro-batch's forward+backward time in ms: CUDA events read once, at the end (one
    synchronize per step), or wall time on the CPU, whose work is synchronous."""
    cuda = next(model.parameters()).is_cuda
    marks, wall = [], []
    total = 0.0
    for inputs in micro_batches:
        if cuda:
            marks.append(torch.cuda.Event(enable_timing=True))
            marks[-1].record()
        else:
            t0 = time.perf_counter()
        loss = loss_sum(model, inputs, normalization) / normalizer
        loss.backward()
        if cuda:
            marks.append(torch.cuda.Event(enable_timing=True))
            marks[-1].record()
        else:
            wall.append((time.perf_counter() - t0) * 1000)
        total = total + loss.detach()
    if cuda:
        torch.cuda.synchronize()
        wall = [marks[i].elapsed_time(marks[i + 1]) for i in range(0, len(marks), 2)]
    return float(total), wall


# -- one run ----------------------------------------------------------------------------------


def arm_kwargs(arm: str) -> dict:
    return dict(ARMS[arm][1])


def describe(arm: str) -> str:
    cls = ARMS[arm][0]
    return f"{cls.__name__}({', '.join(f'{n}={v!r}' for n, v in arm_kwargs(arm).items())})"


def make_sampler(arm: str, seq_lens, shapes, *, ranks: int, k: int, seed: int):
    cls, kwargs = ARMS[arm][0], arm_kwargs(arm)
    return cls(
        seq_lens,
        int(2 * seq_lens.max()),
        group_keys=shapes,
        num_replicas=ranks,
        rank=0,  # every rank's batches come from plan()
        micro_batches_per_step=k,
        seed=seed,
        **kwargs,
    )


def train_run(arm, normalization, seed, data: TrainSet, val: ValSet, model, setup: Setup, ranks):
    """Trains ``model`` for the setup's epochs under one arm's plans; returns one row per
    evaluation (before training, ``evals_per_epoch`` times per epoch, and at the end)."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=setup.lr, weight_decay=0.0)
    sampler = make_sampler(arm, data.seq_lens, data.shapes, ranks=ranks,
                           k=setup.micro_batches, seed=seed)  # fmt: skip
    elements = setup.model["out_channels"] * math.prod(PATCH)
    every = len(data) / setup.evals_per_epoch
    state = dict(step=0, samples=0, tokens=0, gpu_ms=0.0, optimizer_ms=0.0)
    losses, imbalances, mixed, rows = [], [], [], []
    cuda = next(model.parameters()).is_cuda

    def log(epoch):
        row = {
            "arm": arm,
            "sampler": describe(arm),
            "normalization": normalization,
            "seed": seed,
            "epoch": epoch,
            "steps": state["step"],
            "samples_seen": state["samples"],
            "tokens_seen": state["tokens"],
            "gpu_ms": round(state["gpu_ms"], 3),
            "optimizer_ms": round(state["optimizer_ms"], 3),
            "train_loss": float(np.mean(losses)) if losses else "",
            "imbalance": float(np.mean(imbalances)) if imbalances else "",
            "mixed_steps": float(np.mean(mixed)) if mixed else "",
        }
        rows.append(row | {f"val_{m}": v for m, v in val.loss(model).items()})
        losses.clear()

    log(0)
    next_eval = every
    for epoch in range(setup.epochs):
        sampler.set_epoch(epoch)
        plan = sampler.plan()
        for step in range(plan.num_steps):
            batches = step_micro_batches(plan, step)
            inputs = [data.inputs(idx, epoch, seed) for _, idx in batches]
            norm = step_normalizer(plan, step, normalization, elements)
            loss, ms = accumulate_step(model, inputs, normalization, norm)
            rank_ms = np.zeros(plan.num_replicas)  # each rank's forward+backward in the step
            np.add.at(rank_ms, [r for r, _ in batches], ms)
            t0 = time.perf_counter()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            if cuda:
                torch.cuda.synchronize()
            state["optimizer_ms"] += (time.perf_counter() - t0) * 1000
            state["gpu_ms"] += rank_ms.max()  # the all-reduce waits for the slowest rank
            state["step"] += 1
            state["samples"] += int(plan.step_samples()[step])
            state["tokens"] += int(plan.step_tokens()[step])
            losses.append(loss)
            imbalances.append(1 - rank_ms.mean() / rank_ms.max())
            mixed.append(len({data.shapes[idx[0], 0] == 1 for _, idx in batches}) == 2)
            last = epoch == setup.epochs - 1 and step == plan.num_steps - 1
            if state["samples"] >= next_eval or last:
                log(epoch)
                next_eval = (math.floor(state["samples"] / every) + 1) * every
    return rows


def warm_up(model, data: TrainSet):
    """One forward+backward per shape, alone and at its largest micro-batch, so that the first
    run's timings do not pay for first calls (allocator, kernel selection)."""
    max_tokens = int(2 * data.seq_lens.max())
    for shape in data.x0:
        members = np.flatnonzero((data.shapes == shape).all(axis=1))
        for b in (1, max_tokens // tokens_of(shape)):
            inputs = data.inputs(members[: min(b, len(members))], 0, 0)
            loss_sum(model, inputs, "tokens").backward()
    model.zero_grad(set_to_none=True)


# -- summary, figure, output ------------------------------------------------------------------


def value_at(rows, x: str, at: float, y: str) -> float:
    """``y`` of one run's rows at ``x == at``, linear between evaluations."""
    return float(np.interp(at, [r[x] for r in rows], [r[y] for r in rows]))


def summarize(rows, setup: Setup, arms, normalizations, seeds) -> dict:
    """Per normalization and arm, one value per seed: validation loss at the end (equal samples
    seen: the fewest any arm saw, every sample once per epoch plus the arm's padding repeats)
    and at the GPU time the fastest arm took (equal GPU time), epoch GPU time, steps per epoch
    measured imbalance and the share of steps holding both modalities."""
    runs = {}
    for r in rows:
        runs.setdefault((r["normalization"], r["arm"], r["seed"]), []).append(r)
    out = {"arms": {}, "targets": {}}
    for norm in normalizations:
        end = {
            x: {s: min(runs[(norm, a, s)][-1][x] for a in arms) for s in seeds}
            for x in ("samples_seen", "gpu_ms")
        }
        for arm in arms:
            per_seed = [runs[(norm, arm, s)] for s in seeds]
            entry = {
                "epoch_gpu_s": [rs[-1]["gpu_ms"] / 1000 / setup.epochs for rs in per_seed],
                "steps_per_epoch": [rs[-1]["steps"] / setup.epochs for rs in per_seed],
                "imbalance": [rs[-1]["imbalance"] for rs in per_seed],
                "mixed_steps": [rs[-1]["mixed_steps"] for rs in per_seed],
                "equal_samples": [end["samples_seen"][s] for s in seeds],
                "equal_gpu_ms": [end["gpu_ms"][s] for s in seeds],
            }
            for m in MODALITIES:
                for name, x in (("end", "samples_seen"), ("at_gpu", "gpu_ms")):
                    entry[f"val_{m}_{name}"] = [
                        value_at(rs, x, end[x][s], f"val_{m}")
                        for rs, s in zip(per_seed, seeds, strict=True)
                    ]
            out["arms"][f"{norm}/{arm}"] = entry
        if "default" in arms and "shuffled_b1" in arms:
            new, base = out["arms"][f"{norm}/default"], out["arms"][f"{norm}/shuffled_b1"]
            out["targets"][norm] = {
                m: {
                    "default_end": float(np.mean(new[f"val_{m}_end"])),
                    "shuffled_b1_end_range": [min(base[f"val_{m}_end"]), max(base[f"val_{m}_end"])],
                    # within the seed spread, or below it
                    "equal_samples": bool(
                        np.mean(new[f"val_{m}_end"]) <= max(base[f"val_{m}_end"])
                    ),
                    "default_at_gpu": float(np.mean(new[f"val_{m}_at_gpu"])),
                    "shuffled_b1_at_gpu": float(np.mean(base[f"val_{m}_at_gpu"])),
                    "equal_gpu_time": bool(
                        np.mean(new[f"val_{m}_at_gpu"]) < np.mean(base[f"val_{m}_at_gpu"])
                    ),
                }
                for m in MODALITIES
            }
    return out


def spread(values) -> str:
    v = np.asarray(values, dtype=float)
    return f"{v.mean():.4f} +- {v.std(ddof=1) if len(v) > 1 else 0.0:.4f}"


def print_summary(summary: dict) -> None:
    head = (f"{'normalization/arm':<22} {'steps/ep':>8} {'mixed':>6} {'epoch GPU s':>11} "
            f"{'imbal':>6}  {'val image, end':>17}  {'val clip, end':>17}  "
            f"{'val image, eq. GPU':>18}  {'val clip, eq. GPU':>17}")  # fmt: skip
    print("\n" + head)
    for name, e in summary["arms"].items():
        print(
            f"{name:<22} {np.mean(e['steps_per_epoch']):>8.1f} {np.mean(e['mixed_steps']):>6.0%} "
            f"{np.mean(e['epoch_gpu_s']):>11.2f} {np.mean(e['imbalance']):>6.1%}  "
            f"{spread(e['val_image_end']):>17}  {spread(e['val_clip_end']):>17}  "
            f"{spread(e['val_image_at_gpu']):>18}  {spread(e['val_clip_at_gpu']):>17}"
        )
    print(
        "(mean +- standard deviation over seeds; mixed: steps holding images and clips; "
        "eq. GPU: at the GPU time of the fastest arm)"
    )
    for norm, t in summary["targets"].items():
        for m, r in t.items():
            low, high = r["shuffled_b1_end_range"]
            print(
                f"target, {norm}, {m}: equal samples, default {r['default_end']:.4f} within "
                f"shuffled_b1's seeds [{low:.4f}, {high:.4f}] or below: "
                f"{'yes' if r['equal_samples'] else 'NO'}; equal GPU time, default "
                f"{r['default_at_gpu']:.4f} below shuffled_b1 {r['shuffled_b1_at_gpu']:.4f}: "
                f"{'yes' if r['equal_gpu_time'] else 'NO'}"
            )


def figure(rows, arms, normalizations, path: str) -> None:
    """Validation loss per modality against samples seen and GPU time: one row of panels per
    normalization, one line per arm (mean over seeds), the band from the lowest to the highest
    seed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("no matplotlib: figure skipped", file=sys.stderr)
        return
    axes_x = (("samples_seen", "samples seen", 1.0), ("gpu_ms", "replayed GPU time (s)", 1e-3))
    fig, axes = plt.subplots(len(normalizations), 4, figsize=(16, 3.6 * len(normalizations)),
                             squeeze=False)  # fmt: skip
    for i, norm in enumerate(normalizations):
        for j, ((x, xlabel, scale), m) in enumerate((ax, m) for ax in axes_x for m in MODALITIES):
            ax = axes[i][j]
            for arm in arms:
                runs = {}
                for r in rows:
                    if (r["normalization"], r["arm"]) == (norm, arm):
                        runs.setdefault(r["seed"], []).append(r)
                end = min(rs[-1][x] for rs in runs.values())
                grid = np.linspace(0, end, 64)
                ys = np.array(
                    [[value_at(rs, x, g, f"val_{m}") for g in grid] for rs in runs.values()]
                )
                (line,) = ax.plot(grid * scale, ys.mean(0), label=arm)
                ax.fill_between(
                    grid * scale, ys.min(0), ys.max(0), color=line.get_color(), alpha=0.2
                )
            ax.set_xlabel(xlabel)
            ax.set_title(f"{m} validation loss ({norm} normalization)", fontsize=9)
            ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def machine_key(device) -> str:
    """The results folder of this machine: ``cpu``, or the GPU's model (``h200``)."""
    if device.type != "cuda":
        return "cpu"
    name = torch.cuda.get_device_name(device).lower().replace("nvidia", "").strip()
    return re.split(r"[^a-z0-9]+", name)[0] or "gpu"


def parse_list(text: str) -> list[str]:
    return [v for v in text.split(",") if v]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="tiny model and data (CPU, seconds)")
    ap.add_argument("--arms", type=parse_list, default=list(ARMS), help=f"of {','.join(ARMS)}")
    ap.add_argument("--normalizations", type=parse_list, default=list(NORMALIZATIONS))
    ap.add_argument("--seeds", type=lambda s: [int(v) for v in parse_list(s)], default=[0, 1, 2])
    ap.add_argument("--ranks", type=int, default=8, help="data-parallel ranks simulated")
    ap.add_argument("--micro-batches", type=int, default=None, help="K per rank per step (4)")
    ap.add_argument("--samples", type=int, default=None, help="training samples (setup's)")
    ap.add_argument("--epochs", type=int, default=None, help="(setup's)")
    ap.add_argument("--lr", type=float, default=None, help="AdamW learning rate (setup's)")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--out-dir", default=None, help="default: benchmarks/results/<gpu>")
    args = ap.parse_args(argv)
    for name, known in ((args.arms, ARMS), (args.normalizations, NORMALIZATIONS)):
        unknown = [v for v in name if v not in known]
        if unknown or not name:
            ap.error(f"unknown or no choice {unknown}; choose from {', '.join(known)}")
    if not args.seeds:
        ap.error("--seeds: at least one")
    setup = SETUPS["quick" if args.quick else "full"]
    overrides = {"samples": args.samples, "epochs": args.epochs, "lr": args.lr,
                 "micro_batches": args.micro_batches}  # fmt: skip
    setup = replace(setup, **{k: v for k, v in overrides.items() if v is not None})
    device = torch.device(args.device)

    import diffusers

    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    print(f"device {gpu}, torch {torch.__version__}, diffusers {diffusers.__version__}")

    t_start = time.perf_counter()
    mix = SyntheticMix(setup, device)
    data, val = TrainSet(mix, setup.samples), ValSet(mix)
    image_tokens = data.seq_lens[data.shapes[:, 0] == 1].sum() / data.seq_lens.sum()
    print(
        f"data: {len(data)} samples ({np.mean(data.shapes[:, 0] == 1):.0%} images, "
        f"{image_tokens:.0%} of the tokens), {data.seq_lens.min()}-{data.seq_lens.max()} tokens; "
        f"{args.ranks} ranks x {setup.micro_batches} micro-batches per step, max_tokens "
        f"{2 * data.seq_lens.max()}, {setup.epochs} epochs, lr {setup.lr}"
    )
    initial = {}
    for seed in args.seeds:
        model = build_model(setup, seed, device)
        initial[seed] = {k: v.detach().clone() for k, v in model.state_dict().items()}
    warm_up(model, data)
    print(f"data, models and warm-up: {time.perf_counter() - t_start:.1f} s", flush=True)

    rows, walls = [], {}  # walls: seconds per run, by arm (the time left is estimated by arm)
    todo = [(s, n, a) for s in args.seeds for n in args.normalizations for a in args.arms]
    for done, (seed, norm, arm) in enumerate(todo, start=1):
        t0 = time.perf_counter()
        model.load_state_dict(initial[seed])
        run = train_run(arm, norm, seed, data, val, model, setup, args.ranks)
        rows += run
        walls.setdefault(arm, []).append(time.perf_counter() - t0)
        mean = np.mean([w for ws in walls.values() for w in ws])
        left = sum(np.mean(walls.get(a, [mean])) for _, _, a in todo[done:])
        last = run[-1]
        print(
            f"[{done}/{len(todo)}] seed {seed} {norm:<7} {arm:<12} {last['steps']:>4} steps, "
            f"GPU {last['gpu_ms'] / 1000:6.2f} s, val image {last['val_image']:.4f} clip "
            f"{last['val_clip']:.4f}; {walls[arm][-1]:5.1f} s wall, about {left:.0f} s left",
            flush=True,
        )

    summary = summarize(rows, setup, args.arms, args.normalizations, args.seeds)
    print_summary(summary)
    out_dir = args.out_dir or os.path.join(HERE, "results", machine_key(device))
    os.makedirs(out_dir, exist_ok=True)
    meta = {
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": gpu,
        "command": " ".join(["python benchmarks/convergence_wan.py", *(argv or sys.argv[1:])]),
    }
    write_csv(os.path.join(out_dir, "convergence_wan.csv"), [meta | r for r in rows])
    figure(rows, args.arms, args.normalizations, os.path.join(out_dir, "convergence_wan.png"))
    print(f"wrote {out_dir}/convergence_wan.csv and .png; {time.perf_counter() - t_start:.0f} s")
    if os.environ.get("OUT"):
        info = meta | {"torch": torch.__version__, "diffusers": diffusers.__version__,
                       "setup": asdict(setup),
                       "samplers": {arm: describe(arm) for arm in args.arms},
                       "ranks": args.ranks,
                       "seeds": args.seeds, "wall_s": time.perf_counter() - t_start}  # fmt: skip
        os.makedirs(os.environ["OUT"], exist_ok=True)
        with open(os.path.join(os.environ["OUT"], "convergence_wan.json"), "w") as f:
            json.dump(info | summary, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
