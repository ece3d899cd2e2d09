"""The ``adaptiveload calibrate`` command: time micro-batches of a model on this GPU and fit
the cost model (a grid of shapes, or plan-aware on ``--metadata``) and, with
``--memory-model``, the memory model of a checkpointing policy. ``--model FAMILY/CONFIG``
picks the model (``adaptiveload.models``); without it, Wan and ``--config``."""

from __future__ import annotations

import argparse
import os
import sys

from adaptiveload.cost import CostModel
from adaptiveload.metadata import read_metadata
from adaptiveload.wan import SHAPES


def model_of_args(args: argparse.Namespace):
    """``(family, config)`` of ``--model FAMILY[/CONFIG]``, else Wan and ``--config``."""
    from adaptiveload.models import family_of, resolve

    if getattr(args, "model", None):
        return resolve(args.model)
    return family_of("wan"), getattr(args, "config", None) or "wan2.1-1.3B"


def _shapes(spec: str | None, default=SHAPES):
    if not spec:
        return default
    try:
        shapes = [tuple(int(v) for v in item.lower().split("x")) for item in spec.split(",")]
    except ValueError:
        shapes = []
    if not shapes or any(len(s) != 3 or min(s) < 1 for s in shapes):
        raise ValueError(f"--shapes must be FxHxW[,FxHxW...] in pixels, got {spec!r}")
    return shapes


def cmd_calibrate(args: argparse.Namespace) -> int:
    import torch

    from adaptiveload.calibrate import calibrate_family, calibrate_wan

    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print(
            "adaptiveload calibrate: no CUDA GPU here (use --device cpu for a dry run)",
            file=sys.stderr,
        )
        return 2
    if args.comm:
        return _calibrate_comm(args)
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
        family, config = model_of_args(args)
        if family.name == "wan":
            cal = calibrate_wan(
                config,
                max_tokens=args.max_tokens,
                shapes=_shapes(args.shapes),
                progress=not args.no_progress,
                **_timer_args(args, dtype),
            )
        else:
            cal = calibrate_family(
                family,
                config,
                max_tokens=args.max_tokens,
                shapes=_shapes(args.shapes, family.shapes),
                progress=not args.no_progress,
                **_timer_args(args, dtype),
            )
    _print_calibration(cal, args)
    cal.to_json(args.out)
    print(f"wrote {args.out} (load it with CostModel.from_json or --cost-model)")
    if args.memory_model:
        _calibrate_memory(args, dtype)
    return 0


def _calibrate_comm(args: argparse.Namespace) -> int:
    """``--comm``: the all-to-all rates of degrees 2, 4, .. stored in the cost model at
    ``--out`` (``comm.with_comm``)."""
    from adaptiveload.comm import measure_comm, with_comm
    from adaptiveload.wan import CONFIGS

    family, config = model_of_args(args)
    if family.name != "wan" or config not in CONFIGS:
        raise ValueError(f"calibrate --comm: Wan configs only so far ({sorted(CONFIGS)})")
    cfg = CONFIGS[config]
    hidden = cfg["num_attention_heads"] * cfg["attention_head_dim"]
    layers = args.layers if args.layers is not None else cfg["num_layers"]
    if os.path.exists(args.out):
        model = CostModel.from_json(args.out)
    else:
        size = config.rsplit("-", 1)[-1]
        model = CostModel.wan21_h200(size if size in ("1.3B", "14B") else "1.3B", layers=layers)
    backend = "gloo" if args.device == "cpu" else None
    rates = measure_comm(args.comm_ranks, backend=backend)
    for d, r in sorted(rates.items()):
        print(f"all-to-all over {d} ranks: {r / 1e9:.1f} GB/s sent per rank")
    model = with_comm(model, rates, hidden, layers, heads=cfg["num_attention_heads"])
    model.to_json(args.out)
    print(
        f"sequence_parallel_comm = {model.meta['sequence_parallel_comm']:.3g} ms per token "
        f"({config}, {layers} layers); wrote {args.out}"
    )
    return 0


def _print_calibration(cal, args: argparse.Namespace) -> None:
    """Each point measured and predicted, the model, its fit error, the memory model."""
    print(
        f"\n{'shape':>12} {'B':>4} {'S':>7} {'d':>2} {'measured ms':>12} {'predicted':>10} "
        f"{'error':>7} {'peak GiB':>9}"
    )
    for p in cal.points:
        shape = "x".join(map(str, p.shape)) if p.shape else "-"
        fit = (  # a share (d > 1) is used as measured: the fitted form leaves it out
            f"{p.predicted_ms:>10.2f} {p.rel_error:>+7.1%}"
            if p.degree == 1
            else f"{'-':>10} {'-':>7}"
        )
        print(
            f"{shape:>12} {p.batch:>4} {p.seq_len:>7} {p.degree:>2} {p.ms:>12.2f} {fit} "
            f"{p.peak_bytes / 2**30:>9.2f}"
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
    if summary["median_abs_rel_error"] is not None:
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


def _calibrate_memory(args: argparse.Namespace, dtype) -> None:
    """The memory model with activation checkpointing, for AdaptiveBatchSampler(memory_model=)."""
    from adaptiveload.calibrate import calibrate_memory

    if not args.device.startswith("cuda"):
        print("memory model: peak memory is measured on CUDA only; no memory model written")
        return
    family, _ = model_of_args(args)
    if args.metadata is not None:
        meta = read_metadata(args.metadata, family.seq_len)
        shapes = meta.shapes
        max_tokens = args.max_tokens or int(2 * meta.seq_lens.max())
    else:
        shapes = _shapes(args.shapes, family.shapes)
        max_tokens = args.max_tokens or 151_200
    timer = _timer(args, dtype)
    points = os.path.splitext(args.memory_model)[0] + ".points.jsonl"
    log = None if args.no_progress else print
    model, rows = calibrate_memory(
        timer,
        shapes,
        max_tokens,
        points_file=points,
        log=log,
        seq_len=model_of_args(args)[0].seq_len,
    )
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
    out = dict(
        layers=args.layers,
        device=args.device,
        dtype=dtype,
        fused=args.fused,
        warmup=args.warmup,
        repeat=args.repeat,
        activation_checkpointing=args.activation_checkpointing,
    )
    if model_of_args(args)[0].name == "wan":
        out["text_len"] = args.text_len
    return out


def _timer(args: argparse.Namespace, dtype):
    """The timer of ``--model`` (Wan: ``WanTimer`` of ``--config``)."""
    from adaptiveload.timing import ModelTimer, WanTimer

    family, config = model_of_args(args)
    if family.name == "wan":
        return WanTimer(config, **_timer_args(args, dtype))
    return ModelTimer(family, config, **_timer_args(args, dtype))


def _calibrate_plan(args: argparse.Namespace, dtype):
    """Plan-aware calibration of ``args.metadata`` with the sampler settings of ``args``."""
    from adaptiveload.calibrate import calibrate_plan
    from adaptiveload.sampler import AdaptiveBatchSampler

    family, config = model_of_args(args)
    meta = read_metadata(args.metadata, family.seq_len)
    if meta.shapes is None:
        raise ValueError(
            f"{args.metadata}: plan-aware calibration needs each sample's pixel shape "
            "(columns num_frames, height, width) to build its micro-batches"
        )
    max_tokens = args.max_tokens if args.max_tokens is not None else int(2 * meta.seq_lens.max())
    # The first plan's model: the built-in profile of the same size (1.3B's for other configs
    # and families); only its ratios matter, and only until 8 kinds are measured.
    size = config.rsplit("-", 1)[-1] if family.name == "wan" else "1.3B"
    prior = CostModel.wan21_h200(size if size in ("1.3B", "14B") else "1.3B", layers=args.layers)
    keys = meta.group_keys()
    sequence_parallel = {}
    if args.sequence_parallel > 1:
        sequence_parallel = dict(uneven_counts=True, sequence_parallel=args.sequence_parallel)

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
            **sequence_parallel,
        )

    timer = _timer(args, dtype)
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
