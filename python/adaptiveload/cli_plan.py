"""``adaptiveload plan``: plan an epoch from metadata (or ``--demo`` data), print the bucket
table and the balance and composition report against equal-token buckets and the paper's
rule, what the alternatives to the planned setup trade, and draw the per-rank load and the
group mix of each step. The parser is cli.py's."""

from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np

from adaptiveload.cli_calibrate import model_of_args
from adaptiveload.compare import compare_samplers
from adaptiveload.composition import steps_without
from adaptiveload.cost import CostModel
from adaptiveload.demo import demo_metadata, demo_shapes
from adaptiveload.figure import draw_plans, figure_groups
from adaptiveload.metadata import Metadata, read_metadata
from adaptiveload.report import (
    balance_report,
    degrees_line,
    halved_line,
    merge_reports,
    print_reports,
    representative,
    steps_line,
    uneven_line,
)
from adaptiveload.wan import ShapeError

# plan --demo: the alternatives to the recommended setup (the defaults) it plans beside it, each
# with what it trades: (flags as the command line spells them, keyword arguments, the trade).
ALTERNATIVES = (
    (
        "--composition balanced",
        {"composition": "balanced"},
        "speed over fidelity: steps of one or two shapes where mixing costs balance",
    ),
    (
        "--micro-batches-per-step 4",
        {"micro_batches_per_step": 4},
        "4x the samples per optimizer step (a larger global batch)",
    ),
    (
        "--sequence-parallel W",
        {"sequence_parallel": "W"},
        "the loop runs split_sequence, a micro-batch over up to all W ranks (and takes any "
        "count of micro-batches a rank)",
    ),
)


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


# The built-in cost model of a family's configuration (--cost-model's names), where there is
# one; the default of a plan without --model, or of a configuration without its own.
_BUILTIN_COST_MODELS = {("wan", "wan2.1-1.3B"): "wan21-1.3b", ("wan", "wan2.1-14B"): "wan21-14b"}
_DEFAULT_COST_MODEL = "wan21-14b"


def _cost_model_of_args(args: argparse.Namespace, family, config: str) -> tuple[CostModel, str]:
    """The plan's cost model: ``--cost-model``, else the built-in profile of ``--model``'s
    configuration, else Wan 2.1 14B's; and the words that say which and why."""
    if args.cost_model is not None:
        return _cost_model(args.cost_model), f"{args.cost_model} (--cost-model)"
    if not args.model:
        why = "the default (Wan 2.1 14B on an H200; --model or --cost-model for another)"
        return _cost_model(_DEFAULT_COST_MODEL), f"{_DEFAULT_COST_MODEL}, {why}"
    name = f"{family.name}/{config}"
    own = _BUILTIN_COST_MODELS.get((family.name, config))
    if own is not None:
        return _cost_model(own), f"{own}, the built-in profile of --model {name}"
    return _cost_model(_DEFAULT_COST_MODEL), (
        f"{_DEFAULT_COST_MODEL}, the default: there is no built-in profile of {name} (fit one: "
        f"adaptiveload calibrate --model {name} --out cost.json, then --cost-model cost.json)"
    )


def layout_line(args: argparse.Namespace, family, config: str) -> str | None:
    """With ``--model`` and ``--sequence-parallel D``: how a micro-batch split over D ranks runs
    over the model's attention heads (``parallel.layout``: Ulysses over the heads' share of the
    degree, a ring over the rest, which holds each sample's keys and values whole per head
    shard)."""
    heads = family.configs[config].get("num_attention_heads")
    D = args.sequence_parallel
    if not args.model or D == 1 or heads is None:
        return None
    from adaptiveload.parallel.groups import layout, ring_comm_factor, ring_held_fraction

    u, r = layout(D, heads)
    how = (
        "Ulysses alone"
        if r == 1
        else f"Ulysses {u} x ring {r} (keys and values whole per ring: each member receives "
        f"{ring_comm_factor(D, heads):.2f}x Ulysses' bytes and keeps "
        f"{ring_held_fraction(D, heads):.3g} of the samples' keys and values beyond its share, "
        "which a memory budget counts)"
    )
    return (
        f"sequence parallelism: a micro-batch over {D} ranks of {family.name}/{config} "
        f"({heads} attention heads) runs {how}"
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


def _write_outputs(args, meta: Metadata, rows: list[dict], reports: dict, no_image: dict, unit):
    """The plan command's JSON report and figure (costs in the cost model's ``unit``), where
    asked for."""
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
                unit=unit,
            )
            print(f"figure: {args.figure}")
        except ImportError as e:
            print(
                f"adaptiveload plan: figure not drawn: {e} (pip install matplotlib)",
                file=sys.stderr,
            )
        except Exception as e:  # noqa: BLE001 - any plotting failure after the report
            print(f"adaptiveload plan: figure not drawn: {e}", file=sys.stderr)


def _demo_of_args(args: argparse.Namespace, family) -> tuple[Metadata, str]:
    """The demo mix, its tokens counted as ``family`` counts them, and a line that names it
    (and the mix's shapes the model takes another shape for)."""
    geometry = family.geometry
    meta = demo_metadata(args.demo_samples, args.demo_mix, seed=args.seed, geometry=geometry)
    source = f"demo mix '{args.demo_mix}' ({args.demo_samples} samples)"
    if args.model:
        source += f", tokens as {family.name} counts them"
        pairs = zip(demo_shapes(args.demo_mix), demo_shapes(args.demo_mix, geometry), strict=True)
        rounded = [f"{_shape(a)} as {_shape(b)}" for a, b in pairs if a != b]
        if rounded:
            source += f" (of shapes {family.name} takes: {', '.join(rounded)})"
    return meta, source


def _note(meta: Metadata, family) -> str:
    """Where a seq_len column gives the tokens: how many rows ``family`` counts otherwise
    from their shape, or the first shape it cannot take (the shapes are group keys only)."""
    model = "Wan 2.1" if family.name == "wan" else family.name
    try:
        own = family.seq_len(meta.shapes[:, 0], meta.shapes[:, 1], meta.shapes[:, 2])
    except ShapeError as e:
        return f"; {model} cannot take the shape of dataset index {e.index}, {e.shape}: {e.rule}"
    differ = int(np.sum(own != meta.seq_lens))
    return f"; {differ} rows differ from {model}'s token count of their shape" if differ else ""


def _shape(shape) -> str:
    return "x".join(str(v) for v in shape)


def cmd_plan(args: argparse.Namespace) -> int:
    if not (args.demo or args.metadata):
        print("adaptiveload plan: give --metadata PATH or --demo", file=sys.stderr)
        return 2
    family, config = model_of_args(args)
    if args.demo:
        meta, source = _demo_of_args(args, family)
    else:
        meta = read_metadata(args.metadata, family.seq_len)
        source = args.metadata
    cost, cost_why = _cost_model_of_args(args, family, config)
    max_tokens = args.max_tokens if args.max_tokens is not None else int(2 * meta.seq_lens.max())
    if args.stream and args.sequence_parallel > 1:
        print(
            "adaptiveload plan: --stream plans without sequence parallelism "
            "(StreamingBatchSampler has no sequence_parallel); drop one of the two",
            file=sys.stderr,
        )
        return 2
    if args.stream:
        return _plan_streamed(args, meta, source, (cost, cost_why), max_tokens)
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
        composition=args.composition,
        sequence_parallel=args.sequence_parallel,
        uneven_counts=args.uneven_counts,
    )
    ours = compared["AdaptiveLoad"].sampler
    equal = compared["equal-token buckets"].sampler
    reports = {name: (c.plan, c.report) for name, c in compared.items()}

    unit = f" [{cost.unit}]" if cost.unit else ""
    print(f"data: {source}; {len(meta.seq_lens)} samples")
    print(f"cost model: {cost_why}: {cost!r}")
    if meta.seq_len_column and meta.shapes is not None:
        print(
            f"token counts from the seq_len column, shapes used as group keys{_note(meta, family)}"
        )
    print(
        f"caps: max_tokens = {max_tokens} tokens, max_cost = {ours.max_cost:.6g}{unit}; "
        f"{args.num_replicas} ranks x {args.micro_batches_per_step} micro-batch(es) per step\n"
    )
    if line := layout_line(args, family, config):
        print(line + "\n")
    rows = bucket_table(meta, ours, equal)
    _print_bucket_table(rows)
    # Steps without an image, where the shapes say which samples are images.
    images = meta.shapes[:, 0] == 1 if meta.shapes is not None else np.zeros(0, dtype=bool)
    no_image = (
        {n: steps_without(p, images) for n, (p, _) in reports.items()} if images.any() else {}
    )
    print_reports(reports, no_image)
    _print_adaptive(args, reports, ours, no_image)
    if args.demo:
        print_alternatives(args, meta, cost, max_tokens)
    _write_outputs(args, meta, rows, reports, no_image, cost.unit)
    return 0


def _print_adaptive(args, reports: dict, ours, no_image: dict) -> None:
    """The closing lines on AdaptiveLoad's plan: its bound, how it filled the last step,
    uneven counts or sequence parallelism, and whether its steps are representative."""
    plan, rep = reports["AdaptiveLoad"]
    strata = plan.window_strata
    strata_note = (
        f"; {int(np.sum(strata == 1))} of {len(strata)} windows of steps fully mixed "
        f"(--mix-tolerance {ours.mix_tolerance:g})"
        if strata is not None and len(strata) and ours.composition == "balanced"
        else ""
    )
    print(
        f"\nAdaptiveLoad: perfect-balance bound {rep.ideal_time:.5g} ({rep.balance_efficiency:.1%} reached); "
        f"{rep.num_split_micro_batches} micro-batches halved and {rep.num_padded_samples} samples repeated "
        f"to fill whole steps; {rep.over_token_cap + rep.over_cost_cap} micro-batches over a cap"
        f"{strata_note}"
    )
    if halved := halved_line(plan):
        print(halved)
    if args.uneven_counts and args.sequence_parallel == 1:
        print(uneven_line(plan))
    if args.sequence_parallel > 1:
        print(degrees_line(plan, args.sequence_parallel))
    print(steps_line(rep.composition, no_image.get("AdaptiveLoad"), ours))


def _plan_streamed(args, meta: Metadata, source: str, costed, max_tokens: int) -> int:
    """``plan --stream``: the epoch as StreamingBatchSampler plans it, segment by segment, and
    its merged report (no comparison: equal-token buckets plan whole epochs); ``costed``: the
    cost model and the words naming it."""
    cost, cost_why = costed
    from adaptiveload import StreamingBatchSampler

    s = StreamingBatchSampler(
        meta.seq_lens,
        max_tokens,
        max_cost=args.max_cost,
        cost_model=cost,
        group_ids=meta.group_keys(),
        num_replicas=args.num_replicas,
        rank=0,
        micro_batches_per_step=args.micro_batches_per_step,
        seed=args.seed,
        lookahead_steps=args.lookahead_steps,
        mix_tolerance=args.mix_tolerance,
        composition=args.composition,
        max_batch_size=args.max_batch_size,
        segment_samples=args.segment_samples,
        uneven_counts=args.uneven_counts,
    )
    from adaptiveload.sampler.stream import default_workers

    labels = meta.group_keys() if meta.shapes is not None else meta.seq_lens
    reports = [
        balance_report(seg.plan, labels, meta.seq_lens)
        for seg in s.segments(args.epoch, workers=default_workers())
    ]
    rep, segments = merge_reports(reports), len(reports)
    comp = rep.composition
    print(f"data: {source}; {len(meta.seq_lens)} samples")
    print(f"cost model: {cost_why}: {cost!r}")
    print(
        f"streamed: {segments} segments of at least {s.segment_samples} samples; "
        f"max_tokens = {max_tokens}, max_cost = {s.max_cost:.6g}; "
        f"{args.num_replicas} ranks x {args.micro_batches_per_step} micro-batch(es) per step"
    )
    print(
        f"steps {rep.num_steps}, imbalance {rep.imbalance:.1%}, spread {rep.spread:.1%}, "
        f"epoch time {rep.epoch_time:.5g} (perfect-balance bound {rep.balance_efficiency:.1%} "
        f"reached), token use {rep.token_utilization:.1%}; mix vs shuffle "
        f"{comp.tokens_ratio:.2f}/{comp.samples_ratio:.2f}x, missing {comp.missing:.0%} "
        f"({comp.shuffle_missing:.0%}); {rep.num_split_micro_batches} micro-batches halved and "
        f"{rep.num_padded_samples} samples repeated in the last segment"
    )
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"AdaptiveLoad (streamed)": rep.to_dict()}, f, indent=2)
    return 0


def print_alternatives(args, meta: Metadata, cost, max_tokens: int) -> None:
    """plan --demo: one line per alternative to the planned setup (``ALTERNATIVES``, those the
    command line did not already choose), with its predicted speed against equal-token
    buckets of the same K, whether its steps are representative, and what it trades."""
    images = meta.shapes[:, 0] == 1
    print("\nAlternatives (each alone, against equal-token buckets at its K):")
    for flags, change, trade in ALTERNATIVES:
        chosen = {
            "composition": args.composition or args.mix_tolerance is not None,
            "micro_batches_per_step": args.micro_batches_per_step != 1,
            "sequence_parallel": args.sequence_parallel != 1,
        }
        W = args.num_replicas
        if any(chosen[k] for k in change) or "W" in change.values() and (W < 2 or W & (W - 1)):
            continue
        change = {k: W if v == "W" else v for k, v in change.items()}
        flags = flags.replace(" W", f" {W}")
        kw = {
            "micro_batches_per_step": args.micro_batches_per_step,
            "sequence_parallel": args.sequence_parallel,
            "composition": args.composition,
            "mix_tolerance": args.mix_tolerance,
        } | change
        compared = compare_samplers(
            meta.seq_lens, max_tokens, cost_model=cost, group_keys=meta.group_keys(),
            num_replicas=args.num_replicas, seed=args.seed, epoch=args.epoch,
            max_cost=args.max_cost, lookahead_steps=args.lookahead_steps,
            max_batch_size=args.max_batch_size, uneven_counts=args.uneven_counts, **kw,
        )  # fmt: skip
        plan, rep = compared["AdaptiveLoad"].plan, compared["AdaptiveLoad"].report
        equal = compared["equal-token buckets"].report.epoch_time  # at the alternative's K
        comp = rep.composition
        mixed = "representative" if representative(comp) else "segregated"
        print(
            f"  {flags}: {equal / rep.epoch_time:.2f}x, steps {mixed} "
            f"({steps_without(plan, images):.0%} without an image); {trade}"
        )
