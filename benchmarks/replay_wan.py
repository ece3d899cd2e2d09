"""One GPU standing in for a cluster: the measured balance of each sampler's epoch plan.

For W ranks and K micro-batches per rank per step, each sampler arm plans one epoch of a
dataset; every distinct micro-batch kind (B samples of one pixel shape) that any arm's plan
uses is timed, forward+backward, on the real model (Wan 2.1, ``--layers`` blocks, bf16, fused
ops, activation checkpointing); each step is then rebuilt as its slowest rank's measured time.
The arms, all at the same ``max_tokens``:

    equal-token   EqualTokenBatchSampler (floor(max_tokens / S) samples per micro-batch)
    paper rule    B x S^1.5 compute cap, no cross-rank balancing
    built-in      AdaptiveBatchSampler, the built-in H200 profile
    grid          ... with `adaptiveload calibrate` (fixed grid of shapes) on this GPU
    plan-aware    ... with `adaptiveload calibrate --metadata` (the kinds its own plans use)
    refined       ... the built-in profile refined online over --refine-epochs training
                  epochs (sampler.record_time / update_cost_model)
    uneven        (--uneven, K > 1) plan-aware with uneven_counts=True: a rank takes any
                  number >= 1 of the step's W x K micro-batches; its speedup is also given
                  against plan-aware, the same model with K per rank

Models are built from one set of timings (the calibrations' and the refinement's own); the
epoch is scored with fresh timings of every kind, taken twice in two orders (ascending, then
shuffled), whose spread is the noise floor. Calibration covers epoch 0; the scored epoch is
``--epoch`` (default 2), as in training after calibration.

    python benchmarks/replay_wan.py --out out/replay              # CUDA + diffusers
    python benchmarks/replay_wan.py --fake --out /tmp/replay      # a synthetic GPU, any machine
    python benchmarks/replay_wan.py --mix held-out-long --worlds 8      # longer 720p clips
    python benchmarks/replay_wan.py --max-batch-size 1 --worlds 8        # batch-size-1 pipelines
    python benchmarks/replay_wan.py --uneven --worlds 8 --ks 4           # uneven counts per rank
    python benchmarks/replay_wan.py --calibration-only --layers 30 --worlds 8 --ks 1

Writes replay.json, replay.csv and replay.png under --out; --write also stores the CSV as
benchmarks/results/<gpu>/replay_wan[_<mix>|_b<max batch size>|_uneven].csv and rewrites
RESULTS.md.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from datetime import date

import numpy as np

from adaptiveload import AdaptiveBatchSampler, CostModel, EqualTokenBatchSampler
from adaptiveload.calibrate import calibrate_plan, grid, kinds_of_plan, plan_kinds
from adaptiveload.composition import step_composition
from adaptiveload.fit import Point, fit_cost_model
from adaptiveload.metadata import Metadata, read_metadata
from adaptiveload.models import family_of, resolve
from adaptiveload.report import balance_report

HERE = os.path.dirname(os.path.abspath(__file__))

# A mix no cost model here was tuned on, with shapes outside the calibration grid
# (adaptiveload.wan.SHAPES): (frames, height, width, share of samples).
HELD_OUT_MIX = [
    (1, 544, 960, 0.35),
    (1, 624, 624, 0.25),
    (9, 480, 832, 0.08),
    (25, 480, 832, 0.08),
    (41, 544, 960, 0.07),
    (57, 480, 832, 0.07),
    (29, 720, 1280, 0.05),
    (61, 720, 1280, 0.05),
]
# The same mix with 77-frame 720p clips (72,000 tokens: outside the grid too) in place of the
# 61-frame ones: attention's share is larger and equal-token buckets lose more.
HELD_OUT_LONG_MIX = [*HELD_OUT_MIX[:-1], (77, 720, 1280, 0.05)]
# LTX-Video's shapes (VAE strides 8, 32, 32: 8k + 1 frames, sides multiples of 32), none
# of them in its calibration grid (adaptiveload.models.ltx_video.SHAPES).
HELD_OUT_LTX_MIX = [
    (1, 480, 704, 0.30),
    (1, 640, 960, 0.25),
    (33, 512, 768, 0.10),
    (65, 480, 832, 0.10),
    (89, 704, 1216, 0.08),
    (145, 512, 768, 0.07),
    (193, 480, 704, 0.05),
    (161, 704, 1216, 0.05),
]
MIXES = {"held-out": HELD_OUT_MIX, "held-out-long": HELD_OUT_LONG_MIX,
         "held-out-ltx": HELD_OUT_LTX_MIX}  # fmt: skip
# The model family replayed (--model): its token count and calibration shapes.
FAMILY = family_of("wan")
ARMS = ["equal-token", "paper rule", "built-in", "grid", "plan-aware", "refined", "uneven"]


def held_out_metadata(n: int, seed: int = 7, mix: str = "held-out") -> Metadata:
    table = np.array([m[:3] for m in MIXES[mix]], dtype=np.int64)
    share = np.array([m[3] for m in MIXES[mix]])
    shapes = table[np.random.default_rng(seed).choice(len(table), n, p=share / share.sum())]
    return Metadata(
        seq_lens=FAMILY.seq_len(shapes[:, 0], shapes[:, 1], shapes[:, 2]), shapes=shapes
    )


class FakeGPU:
    """A synthetic GPU for dry runs: a launch floor, and batch effects no fitted form has."""

    meta = {"device": "fake", "config": "fake"}

    def __init__(self, seed=0):
        self.rng = np.random.default_rng(seed)

    def __call__(self, batch, shape):
        s = FAMILY.seq_len(*shape)
        work = batch * (0.5 + 1.6e-3 * s + 1.4e-7 * s * s) * (1 - 0.2 * (batch >= 8))
        return max(9.0, 1.5 + work) * (1 + 0.005 * self.rng.standard_normal()), 0


class Timings:
    """Measured ms per kind (S, B), or per share (S, B, d) of a micro-batch split d ways
    (``timer(..., degree=d)``; replay_sp.py), each timed once, with the time spent measuring.
    As ``calibrate_plan``'s ``measure``, it returns (ms, 0)."""

    def __init__(self, timer, log=None):
        self.timer, self.ms, self.seconds, self.log = timer, {}, 0.0, log

    def load(self, path, device):
        """Kinds timed by an earlier run on the same ``device`` (a ``log`` of it, JSON lines):
        a run cut off by a time limit goes on where it stopped. Refuses another device's."""
        with open(path) as f:
            rows = [json.loads(line) for line in f if line.strip()]
        if other := {r["device"] for r in rows} - {device}:
            raise ValueError(f"{path}: timed on {sorted(other)}, not on this {device!r}")
        self.ms.update((tuple(r["kind"]), r["ms"]) for r in rows)
        return len(rows)

    def __call__(self, batch, shape, degree=1):
        key = (int(FAMILY.seq_len(*shape)), int(batch)) + ((int(degree),) if degree > 1 else ())
        if key not in self.ms:
            t0 = time.perf_counter()
            split = {"degree": degree} if degree > 1 else {}
            self.ms[key] = self.timer(batch, tuple(int(v) for v in shape), **split)[0]
            self.seconds += time.perf_counter() - t0
            if self.log is not None:  # (path, device): one line per kind, as it is timed
                line = {"device": self.log[1], "kind": key, "ms": self.ms[key]}
                with open(self.log[0], "a") as f:
                    print(json.dumps(line), file=f)
        return self.ms[key], 0


def build_models(args, meta, timer, max_tokens):
    """The cost models of the calibrated arms, from timings of their own (not the scoring
    ones). Returns ({arm: {(W, K): CostModel}}, build timings, info)."""
    builtin = CostModel.wan21_h200("1.3B", layers=args.layers)
    own = Timings(timer)
    info = {}
    # grid: the fixed grid of `adaptiveload calibrate`, fitted (its form chosen by held-out error)
    t0 = time.perf_counter()
    points = []
    for b, shape in grid(max_tokens, FAMILY.shapes, FAMILY.seq_len):
        ms, _ = own(b, shape)
        points.append(Point(b, FAMILY.seq_len(*shape), ms, 0, shape))
    fitted = fit_cost_model(points)
    info["grid"] = {"kinds": len(points), "seconds": time.perf_counter() - t0, "form": fitted.meta}
    models = {"built-in": {}, "grid": {}, "plan-aware": {}, "refined": {}}
    for w in args.worlds:
        for k in args.ks:
            models["built-in"][(w, k)] = builtin
            models["grid"][(w, k)] = fitted

            def make(model, w=w, k=k):
                return sampler_of(meta, max_tokens, w, k, model)

            t0 = time.perf_counter()
            fresh = Timings(timer)  # plan-aware calibration measures from scratch
            cal = calibrate_plan(make, builtin, meta.shapes, fresh, epochs=(0,), progress=False)
            models["plan-aware"][(w, k)] = cal.cost_model
            info[f"plan-aware W={w} K={k}"] = {
                "kinds": cal.meta["kinds_measured"],
                "rounds": len(cal.meta["rounds"]),
                "converged": cal.meta["converged"],
                "seconds": time.perf_counter() - t0,
                "measure_seconds": fresh.seconds,
                "form": cal.meta.get("form"),
                "fallback_heldout_median": cal.meta.get("fallback_heldout_median"),
                "fallback_heldout_p90": cal.meta.get("fallback_heldout_p90"),
            }
            for key, ms in fresh.ms.items():
                own.ms.setdefault(key, ms)
            models["refined"][(w, k)] = refine(
                args, meta, max_tokens, w, k, builtin, own, info.setdefault("trajectory", [])
            )
    return models, own, info


def refine(args, meta, max_tokens, w, k, builtin, own, trajectory):
    """Online refinement as a training run does it: each epoch, time every micro-batch the
    ranks train, record it, update at the epoch's end; the model of epoch --epoch results.
    Each epoch's plan and model go to ``trajectory`` (scored later with fresh timings)."""
    sampler = sampler_of(meta, max_tokens, w, k, builtin)
    lens = meta.seq_lens
    for epoch in range(args.refine_epochs):
        sampler.set_epoch(epoch)
        plan = sampler.plan()
        trajectory.append((w, k, epoch, plan, sampler.cost_model))
        for m in range(plan.num_micro_batches):
            idx = plan.samples[plan.offsets[m] : plan.offsets[m + 1]]
            if len(idx) and np.all(lens[idx] == lens[idx[0]]):
                ms, _ = own(len(idx), tuple(meta.shapes[idx[0]]))
                sampler.record_time(idx, ms)
        sampler.update_cost_model()
    sampler.set_epoch(args.refine_epochs)  # the refined model takes effect here
    return sampler.cost_model


# Samples per micro-batch at most, for every arm (--max-batch-size; None: no limit).
MAX_BATCH_SIZE = None
# --uneven: the uneven-counts arm too (for K > 1).
UNEVEN = False


def sampler_of(meta, max_tokens, w, k, model, **kw):
    return AdaptiveBatchSampler(
        meta.seq_lens,
        max_tokens,
        cost_model=model,
        group_keys=meta.group_keys(),
        num_replicas=w,
        rank=0,
        micro_batches_per_step=k,
        on_oversize="skip",
        max_batch_size=MAX_BATCH_SIZE,
        **kw,
    )


def arm_samplers(meta, max_tokens, w, k, models):
    builtin = models["built-in"][(w, k)]
    out = {
        "equal-token": EqualTokenBatchSampler(
            meta.seq_lens,
            max_tokens,
            cost_model=builtin,
            group_keys=meta.group_keys(),
            num_replicas=w,
            rank=0,
            micro_batches_per_step=k,
            max_batch_size=MAX_BATCH_SIZE,
        ),
        "paper rule": sampler_of(meta, max_tokens, w, k, CostModel.power(1.5), balance=False),
    }
    for arm in ("built-in", "grid", "plan-aware", "refined"):
        out[arm] = sampler_of(meta, max_tokens, w, k, models[arm][(w, k)])
    if UNEVEN and k > 1:
        model = models["plan-aware"][(w, k)]
        out["uneven"] = sampler_of(meta, max_tokens, w, k, model, uneven_counts=True)
    return out


def score_timings(timer, kinds, seed=0):
    """Fresh timings of every kind, twice: ascending (S, B), then shuffled. Returns
    ({kind: mean ms}, {kind: relative spread}, seconds)."""
    t0 = time.perf_counter()
    order = sorted(kinds)
    first = {key: timer(key[1], kinds[key])[0] for key in order}
    shuffled = list(order)
    random.Random(seed).shuffle(shuffled)
    second = {key: timer(key[1], kinds[key])[0] for key in shuffled}
    mean = {key: (first[key] + second[key]) / 2 for key in order}
    spread = {key: abs(first[key] - second[key]) / mean[key] for key in order}
    return mean, spread, time.perf_counter() - t0


def score(plan, lens, ms, model):
    """Measured step times of `plan` and its cost model's errors on its micro-batches."""
    sizes = np.diff(plan.offsets)
    first = lens[plan.samples[plan.offsets[:-1]]]
    t = np.array([ms[(int(s), int(b))] for s, b in zip(first, sizes, strict=True)])
    loads = plan.rank_sums(t)  # (step, rank): K micro-batches each, or any number (uneven)
    mx, mn, mean = loads.max(axis=1), loads.min(axis=1), loads.mean(axis=1)
    out = {
        "steps": plan.num_steps,
        "epoch_s": float(mx.sum()) / 1000,
        "ideal_s": float(mean.sum()) / 1000,
        "imbalance": float(np.mean(1 - mean / mx)),
        "spread": float(np.mean((mx - mn) / mx)),
        "max_over_min": float(np.mean(mx / mn)),
        "predicted_imbalance": balance_report(plan).imbalance,
    }
    counts = plan.rank_sums(np.ones(plan.num_micro_batches, dtype=np.int64))
    out.update(
        counts_min=int(counts.min()),
        counts_max=int(counts.max()),
        micro_batches_mean=float(counts.mean()),
    )
    if model is not None:
        pred = model.batch_costs(lens[plan.samples], plan.offsets)
        err = np.abs(pred - t) / t
        out["err_median"] = float(np.median(err))
        out["err_p90"] = float(np.percentile(err, 90))
        out["err_max"] = float(err.max())
    return out


def composition_columns(plan, meta, image):
    """How representative the plan's steps are (adaptiveload.composition): by shape, against
    shuffles of the same micro-batches, and the share of steps without an image."""
    shape = step_composition(plan, meta.group_keys(), meta.seq_lens)
    modality = step_composition(plan, image, meta.seq_lens)
    return {
        "tv_tokens_ratio": shape.tokens_ratio,
        "tv_samples_ratio": shape.samples_ratio,
        "no_image": modality.missing,
        "shuffle_no_image": modality.shuffle_missing,
    }


def parse_ints(text):
    return [int(v) for v in text.split(",") if v]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--metadata", default=None, help="dataset file (default: the held-out mix)")
    ap.add_argument("--samples", type=int, default=100_000, help="of the held-out mix")
    ap.add_argument("--mix", default="held-out", choices=sorted(MIXES))
    ap.add_argument("--config", default="wan2.1-1.3B", help="Wan config (without --model)")
    ap.add_argument("--model", default=None, help="FAMILY[/CONFIG] (adaptiveload.models)")
    ap.add_argument("--layers", type=int, default=3)
    ap.add_argument("--no-checkpointing", action="store_true")
    ap.add_argument("--no-fused", action="store_true", help="diffusers' blocks, not the fused ops")
    ap.add_argument("--worlds", type=parse_ints, default=[8, 64])
    ap.add_argument("--ks", type=parse_ints, default=[1, 4])
    ap.add_argument("--max-tokens", type=int, default=None, help="default 2x the longest sample")
    ap.add_argument("--epoch", type=int, default=2, help="the scored epoch")
    ap.add_argument(
        "--max-batch-size",
        type=int,
        default=None,
        help="samples per micro-batch at most, every arm (1: batch-size-1 pipelines; the "
        "equal-token arm is then their default, shuffled samples one per micro-batch)",
    )
    ap.add_argument(
        "--uneven", action="store_true", help="also plan-aware with uneven counts (K > 1)"
    )
    ap.add_argument("--refine-epochs", type=int, default=2)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--fake", action="store_true", help="a synthetic GPU (dry run, any machine)")
    ap.add_argument(
        "--calibration-only", action="store_true", help="time the plan-aware calibration only"
    )
    ap.add_argument("--out", default="out/replay")
    ap.add_argument("--write", action="store_true", help="store the CSV under benchmarks/results")
    args = ap.parse_args(argv)
    global MAX_BATCH_SIZE, UNEVEN, FAMILY
    FAMILY, config = resolve(args.model) if args.model else (family_of("wan"), args.config)
    MAX_BATCH_SIZE = args.max_batch_size
    UNEVEN = args.uneven
    os.makedirs(args.out, exist_ok=True)

    meta = (
        read_metadata(args.metadata, FAMILY.seq_len)
        if args.metadata
        else held_out_metadata(args.samples, mix=args.mix)
    )
    max_tokens = args.max_tokens or int(2 * meta.seq_lens.max())
    if args.fake:
        timer = FakeGPU()
    else:
        import torch

        from adaptiveload.timing import ModelTimer, WanTimer

        make = WanTimer if FAMILY.name == "wan" else lambda *a, **kw: ModelTimer(FAMILY, *a, **kw)
        timer = make(
            config, layers=args.layers, dtype=torch.bfloat16, fused=not args.no_fused,
            warmup=args.warmup, repeat=args.repeat,
            activation_checkpointing=not args.no_checkpointing,
        )  # fmt: skip
    setup = {
        "model": FAMILY.name,
        "data": args.metadata or args.mix,
        "samples": len(meta.seq_lens),
        "max_tokens": max_tokens,
        "layers": args.layers,
        "checkpointing": not args.no_checkpointing,
        "max_batch_size": args.max_batch_size,
        "uneven": args.uneven,
        **timer.meta,
    }
    print("setup:", json.dumps(setup), flush=True)

    if args.calibration_only:
        builtin = CostModel.wan21_h200("1.3B", layers=args.layers)
        for w in args.worlds:
            for k in args.ks:
                t0 = time.perf_counter()
                own = Timings(timer)
                cal = calibrate_plan(
                    lambda m, w=w, k=k: sampler_of(meta, max_tokens, w, k, m),
                    builtin, meta.shapes, own, epochs=(0,), progress=True,
                )  # fmt: skip
                wall = time.perf_counter() - t0
                print(
                    f"plan-aware calibration W={w} K={k}: {cal.meta['kinds_measured']} kinds in "
                    f"{len(cal.meta['rounds'])} rounds, {wall:.0f} s wall ({own.seconds:.0f} s "
                    f"measuring), converged={cal.meta['converged']}",
                    flush=True,
                )
                with open(os.path.join(args.out, f"calibration_W{w}_K{k}.json"), "w") as f:
                    json.dump({"setup": setup, "wall_s": wall, **cal.to_dict()}, f, indent=1)
        return 0

    t0 = time.perf_counter()
    models, _own, info = build_models(args, meta, timer, max_tokens)
    print(f"models built in {time.perf_counter() - t0:.0f} s", flush=True)
    trajectory = info.pop("trajectory")
    for name, v in info.items():
        print(f"  {name}: {v}", flush=True)

    plans = {}
    kinds = {}
    for w in args.worlds:
        for k in args.ks:
            for arm, sampler in arm_samplers(meta, max_tokens, w, k, models).items():
                sampler.set_epoch(args.epoch)
                plans[(w, k, arm)] = (
                    sampler.plan(),
                    None if arm == "paper rule" else sampler.cost_model,
                )
                kinds.update(plan_kinds(sampler, meta.shapes, (args.epoch,)))
    for *_, plan, _model in trajectory:
        kinds.update(kinds_of_plan(plan, meta.seq_lens, meta.shapes))
    print(f"scoring {len(kinds)} distinct micro-batch kinds, twice", flush=True)
    ms, spread, secs = score_timings(timer, kinds)
    noise = np.array(list(spread.values()))
    print(
        f"scored in {secs:.0f} s; run-to-run spread: median {np.median(noise):.2%}, "
        f"90th percentile {np.percentile(noise, 90):.2%}, max {noise.max():.2%}",
        flush=True,
    )

    rows = []
    image = (meta.shapes[:, 0] == 1).astype(np.int64)
    for (w, k, arm), (plan, model) in plans.items():
        r = {"ranks": w, "K": k, "arm": arm, **score(plan, meta.seq_lens, ms, model)}
        r.update(composition_columns(plan, meta, image))
        rows.append(r)
    for r in rows:
        base = next(
            x for x in rows if (x["ranks"], x["K"], x["arm"]) == (r["ranks"], r["K"], "equal-token")
        )
        r["speedup"] = base["epoch_s"] / r["epoch_s"]
        r["speedup_if_balanced"] = base["epoch_s"] / r["ideal_s"]
        if r["arm"] == "uneven":
            even = next(
                x
                for x in rows
                if (x["ranks"], x["K"], x["arm"]) == (r["ranks"], r["K"], "plan-aware")
            )
            r["speedup_vs_even_counts"] = even["epoch_s"] / r["epoch_s"]

    # The refined arm epoch by epoch: what a training log shows.
    refined = []
    for w, k, epoch, plan, model in trajectory:
        refined.append(
            {"ranks": w, "K": k, "epoch": epoch, **score(plan, meta.seq_lens, ms, model)}
        )
    for w, k in ((w, k) for w in args.worlds for k in args.ks):
        last = next(r for r in rows if (r["ranks"], r["K"], r["arm"]) == (w, k, "refined"))
        refined.append(
            {
                "ranks": w,
                "K": k,
                "epoch": args.epoch,
                **{c: last[c] for c in last if c not in ("ranks", "K", "arm")},
            }
        )
    print("\nonline refinement from the built-in profile, epoch by epoch (measured):")
    for r in refined:
        print(
            f"  W={r['ranks']:>3} K={r['K']} epoch {r['epoch']}: imbalance {r['imbalance']:.1%}, "
            f"model error median {r['err_median']:.1%} p90 {r['err_p90']:.1%}"
        )

    head = f"{'W':>3} {'K':>2} {'arm':<12} {'epoch s':>8} {'speedup':>8} {'imbal':>6} {'pred':>6} {'(max-min)/max':>13} {'err med':>8} {'err p90':>8} {'mix':>6} {'no img':>6}"
    print("\n" + head)
    for r in rows:
        if "speedup_vs_even_counts" in r:
            print(
                f"    (uneven: {r['speedup_vs_even_counts']:.3f}x vs plan-aware with K per rank; "
                f"micro-batches per rank and step {r['counts_min']}-{r['counts_max']}, "
                f"mean {r['micro_batches_mean']:.2f})"
            )
        e = (
            f"{r['err_median']:8.1%} {r['err_p90']:8.1%}"
            if "err_median" in r
            else f"{'-':>8} {'-':>8}"
        )
        print(
            f"{r['ranks']:>3} {r['K']:>2} {r['arm']:<12} {r['epoch_s']:>8.1f} {r['speedup']:>7.2f}x "
            f"{r['imbalance']:>6.1%} {r['predicted_imbalance']:>6.1%} {r['spread']:>13.1%} {e} "
            f"{r['tv_tokens_ratio']:>5.2f}x {r['no_image']:>6.0%}"
        )  # fmt: skip

    result = {
        "setup": setup,
        "models": {a: {f"{w},{k}": m.to_dict() for (w, k), m in v.items()} for a, v in models.items()},
        "build": info,
        "noise": {"median": float(np.median(noise)), "p90": float(np.percentile(noise, 90)),
                  "max": float(noise.max())},
        "kinds_ms": [[s, b, ms[(s, b)], spread[(s, b)]] for s, b in sorted(ms)],
        "rows": rows,
        "refined_by_epoch": refined,
    }  # fmt: skip
    with open(os.path.join(args.out, "replay.json"), "w") as f:
        json.dump(result, f, indent=1, default=str)
    sys.path.insert(0, HERE)
    from make_results import write_csv

    write_csv(os.path.join(args.out, "replay.csv"), rows)
    figure(rows, os.path.join(args.out, "replay.png"))
    if args.write:
        write(rows, setup, result["noise"])
    return 0


def figure(rows, path):
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("no matplotlib: figure skipped", file=sys.stderr)
        return
    settings = sorted({(r["ranks"], r["K"]) for r in rows})
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.8))
    arms = [a for a in ARMS if all(any(r["arm"] == a for r in rows) for _ in settings)]
    width = 0.8 / len(arms)
    for i, arm in enumerate(arms):
        sel = [
            next((r for r in rows if (r["ranks"], r["K"], r["arm"]) == (w, k, arm)), None)
            for w, k in settings
        ]
        sel = [r or {"imbalance": 0.0, "speedup": 0.0} for r in sel]
        x = np.arange(len(settings)) + i * width
        axes[0].bar(x, [r["imbalance"] * 100 for r in sel], width, label=arm)
        axes[1].bar(x, [r["speedup"] for r in sel], width, label=arm)
    for ax, title in zip(axes, ("measured imbalance (%)", "speedup vs equal-token"), strict=True):
        ax.set_xticks(np.arange(len(settings)) + 0.4 - width / 2)
        ax.set_xticklabels([f"W={w} K={k}" for w, k in settings])
        ax.set_title(title)
    axes[1].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def write(rows, setup, noise):
    sys.path.insert(0, HERE)
    from make_results import write_results

    head = ["ranks", "K", "arm", "epoch (s)", "speedup vs equal-token", "measured imbalance",
            "predicted imbalance", "(max-min)/max", "model error median", "model error p90",
            "speedup if balanced", "composition vs shuffle (tokens)", "steps without an image"]  # fmt: skip
    out = []
    for r in rows:
        err = (f"{r['err_median']:.1%}", f"{r['err_p90']:.1%}") if "err_median" in r else ("-", "-")
        out.append([r["ranks"], r["K"], r["arm"], f"{r['epoch_s']:.1f}", f"{r['speedup']:.2f}x",
                    f"{r['imbalance']:.1%}", f"{r['predicted_imbalance']:.1%}", f"{r['spread']:.1%}",
                    *err, f"{r['speedup_if_balanced']:.2f}x", f"{r['tv_tokens_ratio']:.2f}x",
                    f"{r['no_image']:.0%} (shuffle {r['shuffle_no_image']:.0%})"])  # fmt: skip
    gpu = "fake" if setup.get("device") == "fake" else "h200"
    family = setup.get("model", "wan")
    meta = {
        "date": str(date.today()),
        "machine": setup.get("device", ""),
        "command": "python benchmarks/replay_wan.py --write"
        + ("" if family == "wan" else f" --model {family} --mix {setup['data']}"),
        "setup": f"{setup['data']}, {setup['samples']} samples, max_tokens {setup['max_tokens']}, "
        f"{setup['layers']} blocks, checkpointing {setup['checkpointing']}, "
        f"{'fused ops' if setup.get('fused', True) else 'unfused'}, "
        f"noise median {noise['median']:.2%} p90 {noise['p90']:.2%}",
    }
    # replay_wan[_<mix>][_b<max_batch_size>][_uneven].csv: one file per setup, the Ks as rows.
    name = f"replay_{family}" if setup["data"] == "held-out" else f"replay_{family}_{setup['data']}"
    if setup.get("max_batch_size"):
        name += f"_b{setup['max_batch_size']}"
        meta["setup"] += f", max_batch_size {setup['max_batch_size']}"
    if setup.get("uneven"):
        name += "_uneven"
        head += ["speedup vs even counts", "micro-batches per rank and step"]
        for row, r in zip(out, rows, strict=True):
            row += [
                f"{r['speedup_vs_even_counts']:.3f}x" if "speedup_vs_even_counts" in r else "-",
                f"{r['counts_min']}-{r['counts_max']} (mean {r['micro_batches_mean']:.2f})",
            ]
    print("wrote", write_results(f"{gpu}/{name}.csv", head, out, meta))


if __name__ == "__main__":
    sys.exit(main())
