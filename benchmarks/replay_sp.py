"""Sequence parallelism chosen per micro-batch, replayed on one GPU (#35).

For 8 ranks (and a simulated 64), batch size 1 and packed, K = 1 and 4, the held-out mix is
planned four ways: shuffled batch size 1 (equal-token buckets of one sample, dealt
round-robin), today's default plan (K each), today's with uneven counts, and sequence
parallelism (``sequence_parallel=D``, uneven counts, default mix_tolerance). Every distinct
listing (S, B, d) is timed on the GPU as exactly one member's share
(``adaptiveload.parallel.ONE_DEVICE``: its layers on its tokens, attention over all tokens for
H/d heads; Wan 2.1-1.3B, ``--layers`` blocks, bf16, diffusers' adaLN, activation checkpointing), the
all-to-alls are added as modeled (``ulysses_comm_per_token`` at the H200 planning bandwidth;
half as many again where Wan's cross-attention runs on head shards),
and each step is replayed rank by rank in plan order, a shared micro-batch starting when its
last member is free. Reported per arm: epoch time, speed over shuffled batch size 1 and over
today's plan, measured and predicted imbalance, composition against a shuffle (tokens, by
shape) and steps without an image against a shuffle's.

    python benchmarks/replay_sp.py --out out/sp                  # CUDA + diffusers
    python benchmarks/replay_sp.py --fake --out /tmp/sp          # any machine (synthetic GPU)

Writes sp.json, sp.csv and sp.png under --out, and timings.jsonl as each kind is timed (pass it
back as --timings to go on after a time limit); --write also stores the CSV as
benchmarks/results/<gpu>/replay_sp.csv (replay_sp_13b_d8.csv for --config wan2.1-1.3B --degree 8)
and rewrites RESULTS.md.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from datetime import date

import numpy as np

from adaptiveload import AdaptiveBatchSampler, CostModel, EqualTokenBatchSampler
from adaptiveload.calibrate import calibrate_plan
from adaptiveload.composition import step_composition, steps_without
from adaptiveload.cost import ulysses_comm_per_token
from adaptiveload.parallel.groups import layout, peer_comm_factor, ring_comm_factor
from adaptiveload.parallel.wan import cross_attention_on_head_shards
from adaptiveload.wan import TEXT_LEN

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from replay_wan import FAMILY, Timings, held_out_metadata, parse_ints  # noqa: E402


class FakeShare:
    """A synthetic GPU for dry runs, shaped like the H200's measured Wan 2.1-14B micro-batches
    (one block, checkpointed): a sample of S tokens costs w(S) = 0.58 + 5.0e-3 S + 1.7e-7 S^2
    ms whole (results/h200/replay_sp_demo.json, within 0.25%), a share of it over d ranks
    u(S) + (w - u) / d, u(S) = 0.3 + 1e-4 S being what splitting does not shrink under the
    default shard rules (results/h200/split_share.csv: 0.45 ms of an image's 8.9, 7.6 of a
    75,600-token clip's 1,340); every share pays a 1.5 ms launch and a 15 ms floor."""

    meta = {"device": "fake", "config": "fake"}

    def __call__(self, batch, shape, degree=1):
        s = FAMILY.seq_len(*shape)
        whole = 0.58 + 5.0e-3 * s + 1.7e-7 * s * s
        kept = min(whole, 0.3 + 1e-4 * s) if degree > 1 else 0.0
        return max(15.0, 1.5 + batch * (kept + (whole - kept) / degree)), 0


class ShareTimer:
    """ms of forward+backward of one member's share of a micro-batch of ``batch`` samples of
    ``shape`` split ``degree`` ways, on this GPU (``WanTimer(..., degree=)``, which runs it
    inside ``split_sequence(ONE_DEVICE)``)."""

    def __init__(self, config: str, layers: int):
        import torch

        from adaptiveload.calibrate import WanTimer

        # The project's fused adaLN inside the split blocks where its kernels are built.
        try:
            import adaptiveload._C  # noqa: F401

            fused = True
        except ImportError:
            fused = False
        self.timer = WanTimer(config, layers=layers, dtype=torch.bfloat16, fused=fused,
                              warmup=1, repeat=3, activation_checkpointing=True)  # fmt: skip
        self.meta = self.timer.meta

    def __call__(self, batch, shape, degree=1):
        return self.timer(batch, tuple(int(v) for v in shape), degree=degree)


def listings(plan, lens):
    """Per listing: (S of its samples, B, d), and its tokens."""
    sizes = np.diff(plan.offsets)
    first = lens[plan.samples[plan.offsets[:-1]]]
    degrees = np.ones(len(sizes), np.int64) if plan.degrees is None else plan.degrees
    return list(zip(first.tolist(), sizes.tolist(), degrees.tolist(), strict=True))


def arms_of(meta, max_tokens, w, k, b, degree, comm, tolerances=()):
    """Each arm's sampler, made from a cost model: ``{name: make(model)}``; ``tolerances``
    adds sequence-parallel arms at those mix_tolerance values (points of the frontier)."""
    common = dict(group_keys=meta.group_keys(), num_replicas=w, rank=0,
                  micro_batches_per_step=k, max_batch_size=b, on_oversize="skip")  # fmt: skip
    sp = dict(uneven_counts=True, sequence_parallel=degree, sequence_parallel_comm=comm)
    lens = meta.seq_lens
    arms = {}
    if b == 1:
        arms["shuffled b1"] = lambda m: EqualTokenBatchSampler(lens, max_tokens, cost_model=m,
                                                               **common)  # fmt: skip
    arms["today"] = lambda m: AdaptiveBatchSampler(lens, max_tokens, cost_model=m, **common)
    arms["today balanced"] = lambda m: AdaptiveBatchSampler(
        lens, max_tokens, cost_model=m, composition="balanced", **common
    )
    arms["today uneven"] = lambda m: AdaptiveBatchSampler(
        lens, max_tokens, cost_model=m, uneven_counts=True, **common
    )
    arms[f"sp {degree}"] = lambda m: AdaptiveBatchSampler(lens, max_tokens, cost_model=m,
                                                          **sp, **common)  # fmt: skip
    for tol in tolerances:
        arms[f"sp {degree} tol {tol:g}"] = lambda m, tol=tol: AdaptiveBatchSampler(
            lens, max_tokens, cost_model=m, mix_tolerance=tol, **sp, **common
        )
    arms[f"sp {degree} mixed"] = lambda m: AdaptiveBatchSampler(
        lens, max_tokens, cost_model=m, mix_tolerance=1.0, **sp, **common
    )
    return arms


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--samples", type=int, default=20_000, help="of the held-out mix")
    ap.add_argument("--config", default="wan2.1-1.3B")
    ap.add_argument("--layers", type=int, default=3)
    ap.add_argument("--degree", type=int, default=4,
                    help="largest degree (above the heads: Ulysses x ring)")  # fmt: skip
    ap.add_argument("--data", choices=["held-out", "demo"], default="held-out",
                    help="the held-out mix, or the `plan --demo` mix")  # fmt: skip
    ap.add_argument("--worlds", type=parse_ints, default=[8, 64])
    ap.add_argument("--batches", default="1,packed",
                    help="batch sizes replayed, comma-separated: 1 and/or packed")  # fmt: skip
    ap.add_argument("--ks", type=parse_ints, default=[1, 4], help="micro-batches per step")
    ap.add_argument("--epoch", type=int, default=1, help="the epoch scored (calibrated on 0)")
    ap.add_argument("--max-rounds", type=int, default=4, help="of each arm's calibration")
    ap.add_argument("--builtin", action="store_true", help="plan with the built-in profile")
    ap.add_argument("--sp-tolerances", type=lambda v: [float(x) for x in v.split(",")],
                    default=[], help="more sequence-parallel arms at these mix_tolerance "
                    "values, comma-separated")  # fmt: skip
    ap.add_argument("--timings", metavar="FILE", help="kinds already timed on this GPU (an "
                    "earlier run's timings.jsonl): a run cut off by a time limit goes on")  # fmt: skip
    ap.add_argument("--render", metavar="DIR", help="only render a run's DIR/sp.csv and "
                    "DIR/setup.json (the figure, and RESULTS.md with --write)")  # fmt: skip
    ap.add_argument("--fake", action="store_true", help="a synthetic GPU (dry run, any machine)")
    ap.add_argument("--out", default="out/sp")
    ap.add_argument("--write", action="store_true", help="store the CSV under benchmarks/results")
    ap.add_argument("--command", help="with --render --write: the run's command, as recorded")
    args = ap.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    if args.render:
        return render(args.render, args.out, args.write, args.command)
    if args.data == "demo":  # the `plan --demo` mix (joint-pretrain, seed 0)
        from adaptiveload.demo import demo_metadata

        meta = demo_metadata(args.samples)
    else:
        meta = held_out_metadata(args.samples)
    lens = meta.seq_lens
    image = meta.shapes[:, 0] == 1
    max_tokens = int(2 * lens.max())
    timer = FakeShare() if args.fake else ShareTimer(args.config, args.layers)
    from adaptiveload.wan import CONFIGS

    cfg = CONFIGS[args.config]
    heads = cfg["num_attention_heads"]
    prior = CostModel.wan21_h200(args.config.rsplit("-", 1)[-1], layers=args.layers)
    comm = ulysses_comm_per_token(heads * cfg["attention_head_dim"], args.layers)
    setup = {"data": args.data, "samples": len(lens), "max_tokens": max_tokens,
             "layers": args.layers, "degree": args.degree, "comm_ms_per_token": comm,
             "cost_model": "built-in" if args.builtin else "plan-aware, epoch 0",
             "epoch": args.epoch,
             **timer.meta}  # fmt: skip
    print("setup:", json.dumps(setup), flush=True)
    with open(os.path.join(args.out, "setup.json"), "w") as f:
        json.dump(setup, f)

    # Each arm plans with a cost model calibrated on its own plans of epoch 0 (plan-aware, the
    # split micro-batches measured as shares) and is scored on epoch --epoch; the built-in
    # profile is the prior. Every kind is timed once, calibration and scoring alike.
    log = os.path.join(args.out, "timings.jsonl")
    if args.timings and os.path.abspath(args.timings) != os.path.abspath(log):
        import shutil

        shutil.copyfile(args.timings, log)  # the new log holds the old kinds and the new
    timings = Timings(timer, log=(log, setup["device"]))
    if os.path.exists(log):
        print(f"{timings.load(log, setup['device'])} kinds timed before", flush=True)
    t0 = time.perf_counter()
    samplers, calibrated = {}, {}
    for w in args.worlds:
        for b in [1 if v == "1" else None for v in args.batches.split(",")]:
            for k in args.ks:
                for arm, make in arms_of(
                    meta, max_tokens, w, k, b, args.degree, comm, args.sp_tolerances
                ).items():
                    model = prior
                    if arm != "shuffled b1" and not args.builtin:
                        cal = calibrate_plan(make, prior, meta.shapes, timings, epochs=(0,),
                                             max_rounds=args.max_rounds, progress=False)  # fmt: skip
                        model = cal.cost_model
                        calibrated[(w, k, b, arm)] = cal.meta["converged"]
                    s = make(model)
                    s.set_epoch(args.epoch)
                    samplers[(w, k, b, arm)] = s
    print(f"calibrated {len(calibrated)} arms ({sum(calibrated.values())} converged), "
          f"{len(timings.ms)} kinds timed, {time.perf_counter() - t0:.0f} s", flush=True)  # fmt: skip
    shape_of = {
        int(FAMILY.seq_len(*sh)): tuple(int(v) for v in sh) for sh in np.unique(meta.shapes, axis=0)
    }
    for s in samplers.values():
        for s_, b_, d_ in listings(s.plan(), lens):
            timings(b_, shape_of[s_], d_)
    print(f"timed {len(timings.ms)} kinds in {time.perf_counter() - t0:.0f} s", flush=True)

    rows = []
    for (w, k, b, arm), s in samplers.items():
        plan = s.plan()
        kinds_of = listings(plan, lens)
        share = np.array([timings(b_, shape_of[s_], d_)[0] for s_, b_, d_ in kinds_of])
        d = np.array([kind[2] for kind in kinds_of], np.float64)
        # Each member sends (d - 1)/d of its tokens, in 4 exchanges per block, 6 where Wan's
        # cross-attention runs on head shards (parallel.wan; the planner counts 4).
        # With a ring (degrees above the heads, parallel.layout) self-attention's exchanges
        # grow by ring_comm_factor; the cross-attention's travel among the Ulysses peers only
        # (peer_comm_factor), on head shards of the Ulysses part.
        on_heads = np.array(
            [cross_attention_on_head_shards(k[0], TEXT_LEN, layout(k[2], heads)[0])
             for k in kinds_of]
        )  # fmt: skip
        ring = np.array([ring_comm_factor(k[2], heads) for k in kinds_of])
        peer = np.array([peer_comm_factor(k[2], heads) for k in kinds_of])
        share += comm * (ring + np.where(on_heads, 0.5 * peer, 0.0)) * plan.tokens * (d - 1) / d
        spans, busy = plan.replay(share)
        rc = plan.rank_costs()
        comp = step_composition(plan, meta.group_keys(), lens)
        modality = step_composition(plan, image, lens)
        rows.append({
            "ranks": w, "K": k, "batch": b or "packed", "arm": arm, "epoch_s": spans.sum() / 1e3,
            "imbalance": float(np.mean(1 - busy / (w * spans))),
            "predicted_imbalance": float(np.mean(1 - rc.sum(1) / (w * rc.max(1)))),
            "tv_tokens_ratio": comp.tokens_ratio, "no_image": steps_without(plan, image),
            "shuffle_no_image": modality.shuffle_missing,
            "split_share": float((d > 1).mean()),
        })  # fmt: skip
    for r in rows:
        same = [
            x for x in rows if (x["ranks"], x["K"], x["batch"]) == (r["ranks"], r["K"], r["batch"])
        ]
        today = next(x for x in same if x["arm"] == "today")
        b1 = [
            x for x in rows if (x["ranks"], x["K"], x["arm"]) == (r["ranks"], r["K"], "shuffled b1")
        ]
        r["vs_today"] = today["epoch_s"] / r["epoch_s"]
        r["vs_shuffled_b1"] = b1[0]["epoch_s"] / r["epoch_s"] if b1 and r["batch"] == 1 else None
    head = f"{'W':>3} {'K':>2} {'batch':>6} {'arm':<13} {'epoch s':>9} {'vs b1':>6} {'vs today':>8} {'imbal':>6} {'pred':>6} {'TV':>6} {'no img':>6} {'shuf':>5}"
    print("\n" + head)
    for r in rows:
        v = f"{r['vs_shuffled_b1']:.2f}x" if r["vs_shuffled_b1"] else "-"
        print(
            f"{r['ranks']:>3} {r['K']:>2} {r['batch']!s:>6} {r['arm']:<13} {r['epoch_s']:>9.1f} {v:>6} "
            f"{r['vs_today']:>7.3f}x {r['imbalance']:>6.1%} {r['predicted_imbalance']:>6.1%} "
            f"{r['tv_tokens_ratio']:>5.2f}x {r['no_image']:>6.0%} {r['shuffle_no_image']:>5.0%}"
        )  # fmt: skip
    with open(os.path.join(args.out, "sp.json"), "w") as f:
        json.dump(
            {"setup": setup, "rows": rows, "kinds_ms": {str(k): v for k, v in timings.ms.items()}},
            f,
            indent=1,
        )
    from make_results import write_csv

    write_csv(os.path.join(args.out, "sp.csv"), rows)
    figure(rows, os.path.join(args.out, "sp.png"))
    if args.write:
        write(rows, setup)
    return 0


def render(run: str, out: str, write_too: bool, command: str | None = None) -> int:
    """The figure (and with ``write_too`` the results) of a run's rows and setup."""
    import csv

    with open(os.path.join(run, "setup.json")) as f:
        setup = json.load(f)
    rows = []
    with open(os.path.join(run, "sp.csv")) as f:
        for r in csv.DictReader(f):
            row = {
                k: (v if k in ("arm", "batch") else float(v) if v else None) for k, v in r.items()
            }
            row["ranks"], row["K"] = int(row["ranks"]), int(row["K"])
            row["batch"] = int(row["batch"]) if row["batch"] != "packed" else "packed"
            rows.append(row)
    figure(rows, os.path.join(out, "sp.png"))
    if write_too:
        write(rows, setup, command)
    return 0


def figure(rows, path):
    """Speed over today's plan against composition distance (vs a shuffle), with and without
    sequence parallelism, one panel per world size."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("no matplotlib: figure skipped", file=sys.stderr)
        return
    worlds = sorted({r["ranks"] for r in rows})
    fig, axes = plt.subplots(1, len(worlds), figsize=(5.5 * len(worlds), 4), squeeze=False)
    markers = {"shuffled b1": "x", "today": "o", "today uneven": "s", "today balanced": "D"}
    for ax, w in zip(axes[0], worlds, strict=True):
        for r in (x for x in rows if x["ranks"] == w):
            label = f"K={r['K']} {'b1' if r['batch'] == 1 else 'packed'}"
            m = markers.get(r["arm"], "*")
            ax.scatter(r["tv_tokens_ratio"], r["vs_today"], marker=m, s=60 if m == "*" else 30,
                       label=f"{label} {r['arm']}")  # fmt: skip
        ax.set_xscale("log")
        ax.axvline(1.0, color="grey", lw=0.8, ls="--")
        ax.set_xlabel("composition distance / a shuffle's (tokens, by shape; log)")
        ax.set_ylabel("speed over today's plan")
        ax.set_title(f"{w} ranks (* = sequence parallel)")
        ax.legend(fontsize=5, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def write(rows, setup, command=None):
    from make_results import write_results

    head = ["ranks", "K", "micro-batches", "arm", "epoch (s)", "vs shuffled batch size 1",
            "vs today's plan", "measured imbalance", "predicted imbalance",
            "composition vs shuffle (tokens)", "steps without an image", "shuffle's",
            "listings split"]  # fmt: skip
    out = [[r["ranks"], r["K"], r["batch"], r["arm"], f"{r['epoch_s']:.1f}",
            f"{r['vs_shuffled_b1']:.2f}x" if r["vs_shuffled_b1"] else "-",
            f"{r['vs_today']:.3f}x", f"{r['imbalance']:.1%}", f"{r['predicted_imbalance']:.1%}",
            f"{r['tv_tokens_ratio']:.2f}x", f"{r['no_image']:.0%}", f"{r['shuffle_no_image']:.0%}",
            f"{r['split_share']:.0%}"] for r in rows]  # fmt: skip
    device = setup.get("device", "")
    gpu = "fake" if device == "fake" else "h100" if "H100" in device else "h200"
    meta = {
        "date": str(date.today()),
        "machine": device,
        "command": command
        or f"python benchmarks/replay_sp.py --config {setup['config']} --degree "
        f"{setup['degree']} --layers {setup['layers']} --data {setup['data']} --write",
        "setup": f"{setup['data']} mix, {setup['samples']} samples, max_tokens "
        f"{setup['max_tokens']}, {setup['config']}, {setup['layers']} block(s), "
        f"{'fused adaLN' if setup.get('fused') else 'diffusers adaLN'}, sequence_parallel "
        f"{setup['degree']}, cost models {setup.get('cost_model', 'built-in')}, epoch "
        f"{setup.get('epoch', 1)} scored, all-to-all modeled at {setup['comm_ms_per_token']:.2e} "
        "ms per token",
    }
    name = "replay_sp" + ("_demo" if setup["data"] == "demo" else "")
    name += "_builtin" if setup.get("cost_model") == "built-in" else ""
    if setup.get("config", "wan2.1-14B") != "wan2.1-14B":  # e.g. replay_sp_13b_d8
        size = setup["config"].rsplit("-", 1)[-1].lower().replace(".", "")
        name += f"_{size}_d{setup['degree']}"
    print("wrote", write_results(f"{gpu}/{name}.csv", head, out, meta))


if __name__ == "__main__":
    sys.exit(main())
