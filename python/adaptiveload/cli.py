"""The ``adaptiveload`` command line: its parser and entry point. The commands live in
cli_plan.py (``plan``) and cli_calibrate.py (``calibrate``).
"""

from __future__ import annotations

import argparse
import math
import sys

from adaptiveload.cli_calibrate import cmd_calibrate
from adaptiveload.cli_plan import cmd_plan
from adaptiveload.demo import MIXES
from adaptiveload.wan import CONFIGS, TEXT_LEN


def _option_type(convert, noun: str, ok, rule: str, shown=lambda text, value: value):
    """An argparse ``type``: ``convert(text)``, refused unless ``ok``, naming the ``rule``."""

    def parse(text: str):
        try:
            value = convert(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {noun}") from None
        if not ok(value):
            raise argparse.ArgumentTypeError(f"must be {rule}, got {shown(text, value)}")
        return value

    return parse


_positive_int = _option_type(int, "an integer", lambda v: v >= 1, "a positive integer")
_non_negative_int = _option_type(int, "an integer", lambda v: v >= 0, "a non-negative integer")
_positive_number = _option_type(
    float, "a number", lambda v: math.isfinite(v) and v > 0, "a finite number > 0",
    lambda text, value: text,
)  # fmt: skip
_fraction = _option_type(
    float, "a number", lambda v: 0.0 <= v <= 1.0, "a number in [0, 1]",
    lambda text, value: f"{value:g}",
)  # fmt: skip


def _model_help() -> str:
    from adaptiveload.models import FAMILIES

    return "FAMILY[/CONFIG] of " + "; ".join(
        f"{name}: {', '.join(sorted(f.configs))}" for name, f in sorted(FAMILIES.items())
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="adaptiveload", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("plan", help="plan an epoch and compare it with equal-token buckets")
    src = p.add_mutually_exclusive_group()
    src.add_argument(
        "--metadata", help="CSV, JSONL or Parquet with seq_len or num_frames,height,width"
    )
    src.add_argument("--demo", action="store_true", help="use a built-in image+video mix")
    p.add_argument(
        "--model",
        default=None,
        help="count the tokens of shapes as this family does: " + _model_help(),
    )
    p.add_argument("--demo-mix", default="joint-pretrain", choices=sorted(MIXES))
    p.add_argument("--demo-samples", type=_positive_int, default=20_000)
    p.add_argument(
        "--max-tokens",
        type=_positive_int,
        default=None,
        help="memory cap (default: 2x the longest sample)",
    )
    p.add_argument(
        "--max-cost", type=_positive_number, default=None, help="compute cap (default: see docs)"
    )
    p.add_argument(
        "--cost-model",
        default=None,
        help="wan21-14b, wan21-1.3b, power:P or a JSON file (default: the built-in profile of "
        "--model's configuration where there is one, else wan21-14b)",
    )
    p.add_argument("--num-replicas", type=_positive_int, default=8)
    p.add_argument("--micro-batches-per-step", type=_positive_int, default=1)
    p.add_argument("--lookahead-steps", type=_positive_int, default=64)
    p.add_argument(
        "--mix-tolerance",
        type=_fraction,
        default=None,
        help="with --composition balanced (which giving it alone implies): the predicted "
        "imbalance AdaptiveLoad's steps may take on to mix the data's groups (0: steps of "
        "similar cost, the best balance; default: the setup's, sampler/defaults.py)",
    )
    p.add_argument(
        "--composition",
        choices=["representative", "balanced"],
        default=None,
        help="representative (the default): every step as representative of the data as a "
        "shuffle; balanced: speed over fidelity, steps mix only as far as --mix-tolerance allows",
    )
    p.add_argument(
        "--sequence-parallel",
        type=_positive_int,
        default=1,
        help="AdaptiveLoad may split a micro-batch over up to this many ranks "
        "(sequence_parallel=D, uneven_counts=True; a power of two dividing --num-replicas)",
    )
    p.add_argument(
        "--uneven-counts",
        action="store_true",
        help="AdaptiveLoad's ranks may take any number >= 1 of a step's W x K micro-batches "
        "(uneven_counts=True, for loops that synchronize gradients once per step; the "
        "compared samplers unchanged)",
    )
    p.add_argument(
        "--max-batch-size",
        type=_positive_int,
        default=None,
        help="samples per micro-batch at most (1: batch-size-1 pipelines such as DiffSynth's)",
    )
    p.add_argument("--seed", type=_non_negative_int, default=0)
    p.add_argument("--epoch", type=_non_negative_int, default=0)
    p.add_argument("--figure", default="adaptiveload_plan.png", help="PNG path, or 'none'")
    p.add_argument(
        "--figure-steps", type=_positive_int, default=60, help="steps drawn in the figure"
    )
    p.add_argument("--json", default=None, help="also write the report as JSON here")
    p.add_argument(
        "--stream",
        action="store_true",
        help="plan as StreamingBatchSampler does, segment by segment (epochs of 100M+ samples)",
    )
    p.add_argument("--segment-samples", type=_positive_int, default=None)
    p.set_defaults(func=cmd_plan)

    c = sub.add_parser(
        "calibrate", help="profile a video DiT on this GPU and fit the cost and memory models"
    )
    c.add_argument("--model", default=None, help=_model_help() + " (default: Wan, --config)")
    c.add_argument(
        "--config", default="wan2.1-1.3B", help="Wan config: " + ", ".join(sorted(CONFIGS))
    )
    c.add_argument(
        "--layers",
        type=_positive_int,
        default=None,
        help="blocks to build (default: the full model)",
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
        type=_positive_int,
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
    c.add_argument(
        "--sequence-parallel",
        type=_positive_int,
        default=1,
        help="with --metadata: plan as AdaptiveBatchSampler(sequence_parallel=D, "
        "uneven_counts=True) does and measure each split micro-batch as one rank's share "
        "(Wan; the all-to-alls are modeled: --comm measures them)",
    )
    c.add_argument("--seed", type=_non_negative_int, default=0, help="with --metadata")
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
    c.add_argument("--text-len", type=_positive_int, default=TEXT_LEN)
    c.add_argument(
        "--memory-budget",
        type=_positive_number,
        default=None,
        help="GiB; prints the max_tokens that fits",
    )
    c.add_argument(
        "--memory-model",
        default=None,
        help="also measure peak memory with n of L blocks checkpointed and write the memory "
        "model of the checkpointing policy here (JSON; the shapes of --metadata, else the grid)",
    )
    c.add_argument(
        "--warmup",
        type=_non_negative_int,
        default=None,
        help="untimed calls per kind (default 2; --metadata: 1)",
    )
    c.add_argument(
        "--repeat",
        type=_positive_int,
        default=None,
        help="timed calls per kind, median kept (default 5; --metadata: 2, whose run-to-run "
        "spread on an H200 was 0.4%% median)",
    )
    c.add_argument(
        "--comm",
        action="store_true",
        help="measure the all-to-all bandwidth of sequence parallelism over this machine's "
        "GPUs (one process each) and store it in the cost model at --out (read if it exists, "
        "else the built-in profile of --config); the sampler's default then uses it",
    )
    c.add_argument(
        "--comm-ranks",
        type=_positive_int,
        default=None,
        help="with --comm: processes (default: every GPU; gloo CPU processes with --device cpu)",
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
