"""The ``adaptiveload`` command line.

``adaptiveload plan``: plan an epoch from metadata (or ``--demo`` data), print the bucket
table and the balance and composition report against equal-token buckets and the paper's
rule, and draw the per-rank load and the group mix of each step.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np

from adaptiveload.composition import steps_without
from adaptiveload.cost import CostModel
from adaptiveload.demo import MIXES, demo_metadata
from adaptiveload.figure import draw_plans, figure_groups
from adaptiveload.metadata import Metadata, read_metadata
from adaptiveload.report import compare_samplers
from adaptiveload.sampler import MIX_TOLERANCE
from adaptiveload.wan import CONFIGS, SHAPES, TEXT_LEN, wan_seq_len


def _cost_model(spec: str) -> CostModel:
    named = {"wan21-14b": ("14B",), "wan21-1.3b": ("1.3B",)}
    if spec.lower() in named:
        return CostModel.wan21_h200(*named[spec.lower()])
    if spec.startswith("power:"):
        try:
            return CostModel.power(float(spec.split(":", 1)[1]))
        except ValueError as e:
            raise SystemExit(f"adaptiveload: bad --cost-model {spec!r}: {e}") from None
    if os.path.isdir(spec):
        raise ValueError(f"--cost-model {spec} is a directory: give a cost model JSON file")
    if os.path.exists(spec):
        return CostModel.from_json(spec)
    raise SystemExit(
        f"adaptiveload: --cost-model must be wan21-14b, wan21-1.3b, power:P or a JSON file; got {spec!r}"
    )


def bucket_table(meta: Metadata, ours, equal) -> list[dict]:
    """One row per group (shape, or sequence length without shapes): its samples, the
    largest micro-batch the plan makes of it, that micro-batch's predicted cost, and the
    equal-token batch size. O(N log N) in the number of samples."""
    plan = ours.plan()
    keys = meta.group_keys() if meta.shapes is not None else meta.seq_lens
    groups, first, ids, counts = np.unique(
        keys, return_index=True, return_inverse=True, return_counts=True
    )
    ids = ids.reshape(-1)
    sizes = np.diff(plan.offsets)
    real = (plan.padding == 0) & (sizes > 0)
    batch = np.zeros(len(groups), dtype=np.int64)
    if real.any():
        owner = ids[plan.samples[plan.offsets[:-1][real]]]
        np.maximum.at(batch, owner, sizes[real])
    seq = meta.seq_lens[first]
    cost = np.where(batch > 0, ours.cost_model.uniform_costs(seq, batch), 0.0)
    rows = [
        {
            "shape": "x".join(str(v) for v in meta.shapes[i]) if meta.shapes is not None else "-",
            "seq_len": int(seq[g]),
            "samples": int(counts[g]),
            "batch": int(batch[g]),
            "cost": float(cost[g]),
            "equal_token_batch": int(
                min(equal.max_tokens // seq[g], equal.max_batch_size or 1 << 62)
            ),
        }
        for g, i in enumerate(first)
    ]
    return sorted(rows, key=lambda r: (r["seq_len"], r["shape"]))


def _print_bucket_table(rows: list[dict], limit: int = 30) -> None:
    print(
        f"{'shape (FxHxW)':>15} {'S':>7} {'samples':>8} {'batch':>6} {'cost/micro-batch':>17} {'equal-token batch':>18}"
    )
    shown = rows
    if len(rows) > limit:
        keep = set(sorted(range(len(rows)), key=lambda i: -rows[i]["samples"])[:limit])
        shown = [r for i, r in enumerate(rows) if i in keep]
    for r in shown:
        print(
            f"{r['shape']:>15} {r['seq_len']:>7} {r['samples']:>8} {r['batch']:>6} "
            f"{r['cost']:>17.5g} {r['equal_token_batch']:>18}"
        )
    if len(shown) < len(rows):
        rest = sum(r["samples"] for r in rows) - sum(r["samples"] for r in shown)
        print(
            f"{'':>15} ... and {len(rows) - len(shown)} more groups ({rest} samples); "
            "the largest shown, --json lists all"
        )


def _print_reports(reports: dict, no_image: dict) -> None:
    """The balance and composition table, one row per sampler (``no_image``: the share of
    steps without an image per sampler, or empty when unknown)."""
    base = reports["equal-token buckets"][1].epoch_time
    print(
        f"\n{'sampler':<34} {'steps':>6} {'imbalance':>10} {'spread':>8} {'epoch time':>12} {'speedup':>8} {'token use':>10}"
        f" {'mix vs shuffle':>15} {'missing (shuffle)':>18}"
        + (f" {'no image':>9}" if no_image else "")
    )
    for name, (_, rep) in reports.items():
        comp = rep.composition
        print(
            f"{name:<34} {rep.num_steps:>6} {rep.imbalance:>10.1%} {rep.spread:>8.1%} "
            f"{rep.epoch_time:>12.5g} {base / rep.epoch_time:>7.2f}x {rep.token_utilization:>10.1%} "
            f"{f'{comp.tokens_ratio:.2f}/{comp.samples_ratio:.2f}x':>15} "
            f"{f'{comp.missing:.0%} ({comp.shuffle_missing:.0%})':>18}"
            + (f" {no_image[name]:>9.0%}" if no_image else "")
        )
    print(
        "mix vs shuffle: distance of each step's share of tokens/samples per group from the "
        "epoch's, over a shuffle's of the same micro-batches (1.00x: as representative as a "
        f"shuffle); missing: steps without a group holding over {comp.min_share:.0%} of the epoch"
        + ("; no image: steps without an image (num_frames 1)" if no_image else "")
    )


def _write_outputs(args, meta: Metadata, rows: list[dict], reports: dict, no_image: dict):
    """The plan command's JSON report and figure, where asked for."""
    if args.json:
        out = {n: r.to_dict() for n, (_, r) in reports.items()}
        for n, share in no_image.items():
            out[n]["steps_without_image"] = share
        with open(args.json, "w") as f:
            json.dump({"buckets": rows, "reports": out}, f, indent=2)
        print(f"report: {args.json}")
    if args.figure != "none":
        # The report is out; a figure that cannot be drawn is worth a warning, not a failure.
        try:
            labels = meta.group_keys() if meta.shapes is not None else meta.seq_lens
            draw_plans(
                reports,
                args.figure,
                args.figure_steps,
                figure_groups(meta, labels),
                meta.seq_lens,
                mixed=("AdaptiveLoad", "equal-token buckets"),
            )
            print(f"figure: {args.figure}")
        except ImportError as e:
            print(
                f"adaptiveload plan: figure not drawn: {e} (pip install matplotlib)",
                file=sys.stderr,
            )
        except Exception as e:  # noqa: BLE001 - any plotting failure after the report
            print(f"adaptiveload plan: figure not drawn: {e}", file=sys.stderr)


def cmd_plan(args: argparse.Namespace) -> int:
    if args.demo:
        meta = demo_metadata(args.demo_samples, args.demo_mix, seed=args.seed)
        source = f"demo mix '{args.demo_mix}' ({args.demo_samples} samples)"
    elif args.metadata:
        meta = read_metadata(args.metadata)
        source = args.metadata
    else:
        print("adaptiveload plan: give --metadata PATH or --demo", file=sys.stderr)
        return 2
    cost = _cost_model(args.cost_model)
    max_tokens = args.max_tokens if args.max_tokens is not None else int(2 * meta.seq_lens.max())
    compared = compare_samplers(
        meta.seq_lens,
        max_tokens,
        cost_model=cost,
        group_keys=meta.group_keys(),
        num_replicas=args.num_replicas,
        micro_batches_per_step=args.micro_batches_per_step,
        seed=args.seed,
        epoch=args.epoch,
        max_cost=args.max_cost,
        lookahead_steps=args.lookahead_steps,
        max_batch_size=args.max_batch_size,
        mix_tolerance=args.mix_tolerance,
    )
    ours = compared["AdaptiveLoad"].sampler
    equal = compared["equal-token buckets"].sampler
    reports = {name: (c.plan, c.report) for name, c in compared.items()}

    unit = f" [{cost.unit}]" if cost.unit else ""
    print(f"data: {source}; {len(meta.seq_lens)} samples; cost model {cost!r}")
    if meta.seq_len_column and meta.shapes is not None:
        own = wan_seq_len(meta.shapes[:, 0], meta.shapes[:, 1], meta.shapes[:, 2])
        differ = int(np.sum(own != meta.seq_lens))
        note = f"; {differ} rows differ from Wan 2.1's token count of their shape" if differ else ""
        print(f"token counts from the seq_len column, shapes used as group keys{note}")
    print(
        f"caps: max_tokens = {max_tokens} tokens, max_cost = {ours.max_cost:.6g}{unit}; "
        f"{args.num_replicas} ranks x {args.micro_batches_per_step} micro-batch(es) per step\n"
    )
    rows = bucket_table(meta, ours, equal)
    _print_bucket_table(rows)
    # Steps without an image, where the shapes say which samples are images.
    images = meta.shapes[:, 0] == 1 if meta.shapes is not None else np.zeros(0, dtype=bool)
    no_image = (
        {n: steps_without(p, images) for n, (p, _) in reports.items()} if images.any() else {}
    )
    _print_reports(reports, no_image)
    rep = reports["AdaptiveLoad"][1]
    strata = reports["AdaptiveLoad"][0].window_strata
    strata_note = (
        f"; {int(np.sum(strata == 1))} of {len(strata)} windows of steps fully mixed "
        f"(--mix-tolerance {ours.mix_tolerance:g})"
        if strata is not None and len(strata)
        else ""
    )
    print(
        f"\nAdaptiveLoad: perfect-balance bound {rep.ideal_time:.5g} ({rep.balance_efficiency:.1%} reached); "
        f"{rep.num_split_micro_batches} micro-batches halved and {rep.num_padded_samples} samples repeated "
        f"to fill the last step; {rep.over_token_cap + rep.over_cost_cap} micro-batches over a cap"
        f"{strata_note}"
    )
    _write_outputs(args, meta, rows, reports, no_image)
    return 0


def _shapes(spec: str | None):
    if not spec:
        return SHAPES
    try:
        shapes = [tuple(int(v) for v in item.lower().split("x")) for item in spec.split(",")]
    except ValueError:
        shapes = []
    if not shapes or any(len(s) != 3 or min(s) < 1 for s in shapes):
        raise ValueError(f"--shapes must be FxHxW[,FxHxW...] in pixels, got {spec!r}")
    return shapes


def cmd_calibrate(args: argparse.Namespace) -> int:
    import torch

    from adaptiveload.calibrate import calibrate_wan

    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print(
            "adaptiveload calibrate: no CUDA GPU here (use --device cpu for a dry run)",
            file=sys.stderr,
        )
        return 2
    dtype = {"bf16": torch.bfloat16, "fp32": torch.float32}[args.dtype]
    plan_aware = args.metadata is not None
    if args.warmup is None:
        args.warmup = 1 if plan_aware else 2
    if args.repeat is None:
        args.repeat = 2 if plan_aware else 5
    if plan_aware:
        cal = _calibrate_plan(args, dtype)
    else:
        if args.max_tokens is None:
            args.max_tokens = 151_200
        cal = calibrate_wan(
            args.config,
            max_tokens=args.max_tokens,
            shapes=_shapes(args.shapes),
            progress=not args.no_progress,
            **_timer_args(args, dtype),
        )
    print(
        f"\n{'shape':>12} {'B':>4} {'S':>7} {'measured ms':>12} {'predicted':>10} {'error':>7} {'peak GiB':>9}"
    )
    for p in cal.points:
        shape = "x".join(map(str, p.shape)) if p.shape else "-"
        print(
            f"{shape:>12} {p.batch:>4} {p.seq_len:>7} {p.ms:>12.2f} {p.predicted_ms:>10.2f} "
            f"{p.rel_error:>+7.1%} {p.peak_bytes / 2**30:>9.2f}"
        )
    summary = cal.summary()
    print(f"\ncost model: {cal.cost_model!r}")
    if args.metadata is not None:
        m = cal.meta
        print(
            f"plan-aware: {m['kinds_measured']} kinds measured ({m['kinds_resumed']} read back "
            f"from {args.points}) in {len(m['rounds'])} rounds, "
            f"{'converged' if m['converged'] else 'NOT converged (raise --max-rounds)'}; "
            f"measuring took {m['measure_seconds']:.0f} s"
        )
        if "fallback_heldout_p90" in m:
            print(
                f"fallback form {m['form']!r}, held-out error on measured kinds: median "
                f"{m['fallback_heldout_median']:.1%}, 90th percentile {m['fallback_heldout_p90']:.1%}"
                " (the fit errors below are the fallback's; measured kinds are exact)"
            )
    print(
        f"fit error: median {summary['median_abs_rel_error']:.1%}, 90th percentile "
        f"{summary['p90_abs_rel_error']:.1%}, max {summary['max_abs_rel_error']:.1%}"
    )
    print(
        f"memory model: peak = {cal.memory_m0 / 2**30:.2f} GiB + {cal.memory_m1 / 2**10:.1f} KiB x tokens"
    )
    if args.memory_budget and cal.memory_m1 > 0 and args.device != "cpu":
        tokens = cal.suggest_max_tokens(args.memory_budget * 2**30)
        cal.meta["suggested_max_tokens"] = tokens
        print(f"suggested max_tokens for a {args.memory_budget:g} GiB budget: {tokens}")
    cal.to_json(args.out)
    print(f"wrote {args.out} (load it with CostModel.from_json or --cost-model)")
    if args.memory_model:
        _calibrate_memory(args, dtype)
    return 0


def _calibrate_memory(args: argparse.Namespace, dtype) -> None:
    """The memory model with activation checkpointing, for AdaptiveBatchSampler(memory_model=)."""
    from adaptiveload.calibrate import WanTimer, calibrate_memory

    if not args.device.startswith("cuda"):
        print("memory model: peak memory is measured on CUDA only; no memory model written")
        return
    if args.metadata is not None:
        meta = read_metadata(args.metadata)
        shapes = meta.shapes
        max_tokens = args.max_tokens or int(2 * meta.seq_lens.max())
    else:
        shapes = _shapes(args.shapes)
        max_tokens = args.max_tokens or 151_200
    timer = WanTimer(args.config, **_timer_args(args, dtype))
    points = os.path.splitext(args.memory_model)[0] + ".points.jsonl"
    log = None if args.no_progress else print
    model, rows = calibrate_memory(timer, shapes, max_tokens, points_file=points, log=log)
    m = model.meta
    print(
        f"\nmemory model ({len(rows)} points, {m['out_of_memory']} out of memory): {model!r}\n"
        f"fit error: median {m['error_median']:.1%}, max {m['error_max']:.1%}; worst "
        f"leave-one-out under-prediction {m['loo_under_max']:.1%}, so margin {model.margin:.1%}; "
        f"recompute share {model.recompute_share:.1%}"
    )
    model.save(args.memory_model)
    print(
        f"wrote {args.memory_model} (AdaptiveBatchSampler(memory_model=MemoryModel.load(...), "
        "memory_budget_gib=...))"
    )


def _timer_args(args: argparse.Namespace, dtype) -> dict:
    """How each micro-batch is timed: the same for grid and plan-aware calibration."""
    return dict(
        layers=args.layers,
        device=args.device,
        dtype=dtype,
        fused=args.fused,
        text_len=args.text_len,
        warmup=args.warmup,
        repeat=args.repeat,
        activation_checkpointing=args.activation_checkpointing,
    )


def _calibrate_plan(args: argparse.Namespace, dtype):
    """Plan-aware calibration of ``args.metadata`` with the sampler settings of ``args``."""
    from adaptiveload.calibrate import WanTimer, calibrate_plan
    from adaptiveload.sampler import AdaptiveBatchSampler

    meta = read_metadata(args.metadata)
    if meta.shapes is None:
        raise ValueError(
            f"{args.metadata}: plan-aware calibration needs each sample's pixel shape "
            "(columns num_frames, height, width) to build its micro-batches"
        )
    max_tokens = args.max_tokens if args.max_tokens is not None else int(2 * meta.seq_lens.max())
    # The first plan's model: the built-in profile of the same size (1.3B's for other configs);
    # only its ratios matter, and only until 8 kinds are measured.
    size = args.config.rsplit("-", 1)[-1]
    prior = CostModel.wan21_h200(size if size in ("1.3B", "14B") else "1.3B", layers=args.layers)
    keys = meta.group_keys()

    def make_sampler(model):
        return AdaptiveBatchSampler(
            meta.seq_lens,
            max_tokens,
            cost_model=model,
            group_keys=keys,
            num_replicas=args.num_replicas,
            rank=0,
            micro_batches_per_step=args.micro_batches_per_step,
            lookahead_steps=args.lookahead_steps,
            seed=args.seed,
            on_oversize="skip",
            max_batch_size=args.max_batch_size,
        )

    timer = WanTimer(args.config, **_timer_args(args, dtype))
    if args.points is None:
        args.points = os.path.splitext(args.out)[0] + ".points.jsonl"
    header = {**timer.meta, "max_tokens": max_tokens}
    return calibrate_plan(
        make_sampler,
        prior,
        meta.shapes,
        timer,
        epochs=tuple(range(args.epochs)),
        points_file=args.points,
        header=header,
        max_rounds=args.max_rounds,
        progress=not args.no_progress,
    )


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {value}")
    return value


def _fraction(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"must be a number in [0, 1], got {value:g}")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="adaptiveload", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("plan", help="plan an epoch and compare it with equal-token buckets")
    src = p.add_mutually_exclusive_group()
    src.add_argument(
        "--metadata", help="CSV, JSONL or Parquet with seq_len or num_frames,height,width"
    )
    src.add_argument("--demo", action="store_true", help="use a built-in image+video mix")
    p.add_argument("--demo-mix", default="joint-pretrain", choices=sorted(MIXES))
    p.add_argument("--demo-samples", type=int, default=20_000)
    p.add_argument(
        "--max-tokens",
        type=_positive_int,
        default=None,
        help="memory cap (default: 2x the longest sample)",
    )
    p.add_argument("--max-cost", type=float, default=None, help="compute cap (default: see docs)")
    p.add_argument(
        "--cost-model", default="wan21-14b", help="wan21-14b, wan21-1.3b, power:P or a JSON file"
    )
    p.add_argument("--num-replicas", type=int, default=8)
    p.add_argument("--micro-batches-per-step", type=int, default=1)
    p.add_argument("--lookahead-steps", type=int, default=64)
    p.add_argument(
        "--mix-tolerance",
        type=_fraction,
        default=MIX_TOLERANCE,
        help="predicted imbalance AdaptiveLoad's steps may take on to mix the data's groups "
        "(0: steps of similar cost, the best balance)",
    )
    p.add_argument(
        "--max-batch-size",
        type=_positive_int,
        default=None,
        help="samples per micro-batch at most (1: batch-size-1 pipelines such as DiffSynth's)",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--epoch", type=int, default=0)
    p.add_argument("--figure", default="adaptiveload_plan.png", help="PNG path, or 'none'")
    p.add_argument("--figure-steps", type=int, default=60, help="steps drawn in the figure")
    p.add_argument("--json", default=None, help="also write the report as JSON here")
    p.set_defaults(func=cmd_plan)

    c = sub.add_parser(
        "calibrate", help="profile a Wan model on this GPU and fit the cost and memory models"
    )
    c.add_argument("--config", default="wan2.1-1.3B", help=", ".join(sorted(CONFIGS)))
    c.add_argument(
        "--layers", type=int, default=None, help="blocks to build (default: the full model)"
    )
    c.add_argument("--device", default="cuda")
    c.add_argument("--dtype", default="bf16", choices=["bf16", "fp32"])
    c.add_argument(
        "--fused",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="use the fused adaLN ops",
    )
    c.add_argument("--activation-checkpointing", action="store_true")
    c.add_argument(
        "--max-tokens",
        type=int,
        default=None,
        help="largest micro-batch profiled, in tokens (default 151200; with --metadata: the "
        "sampler's max_tokens, default 2x the longest sample)",
    )
    c.add_argument(
        "--metadata",
        default=None,
        help="plan-aware: measure the micro-batch kinds the sampler's plans of this dataset use "
        "(CSV, JSONL or Parquet with num_frames, height, width)",
    )
    c.add_argument("--num-replicas", type=_positive_int, default=8, help="with --metadata")
    c.add_argument(
        "--micro-batches-per-step", type=_positive_int, default=1, help="with --metadata"
    )
    c.add_argument("--lookahead-steps", type=_positive_int, default=64, help="with --metadata")
    c.add_argument("--max-batch-size", type=_positive_int, default=None, help="with --metadata")
    c.add_argument("--seed", type=int, default=0, help="with --metadata")
    c.add_argument(
        "--epochs",
        type=_positive_int,
        default=1,
        help="with --metadata: epochs whose plans to cover",
    )
    c.add_argument("--max-rounds", type=_positive_int, default=10, help="with --metadata")
    c.add_argument(
        "--points",
        default=None,
        help="with --metadata: JSON-lines file of measurements, appended as measured and read "
        "back to resume (default: --out with .points.jsonl)",
    )
    c.add_argument(
        "--shapes",
        default=None,
        help="FxHxW[,...] pixel shapes to profile (default: Wan 480p/720p set)",
    )
    c.add_argument("--text-len", type=int, default=TEXT_LEN)
    c.add_argument(
        "--memory-budget", type=float, default=None, help="GiB; prints the max_tokens that fits"
    )
    c.add_argument(
        "--memory-model",
        default=None,
        help="also measure peak memory with n of L blocks checkpointed and write the memory "
        "model of the checkpointing policy here (JSON; the shapes of --metadata, else the grid)",
    )
    c.add_argument(
        "--warmup", type=int, default=None, help="untimed calls per kind (default 2; --metadata: 1)"
    )
    c.add_argument(
        "--repeat",
        type=int,
        default=None,
        help="timed calls per kind, median kept (default 5; --metadata: 2, whose run-to-run "
        "spread on an H200 was 0.4%% median)",
    )
    c.add_argument("--out", default="cost_model.json")
    c.add_argument("--no-progress", action="store_true")
    c.set_defaults(func=cmd_calibrate)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (ValueError, OSError, ImportError) as e:
        print(f"adaptiveload {args.command}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
