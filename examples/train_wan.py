"""Flow-matching training of the Wan 2.1 transformer with AdaptiveLoad.

    torchrun --nproc_per_node 2 examples/train_wan.py --data /tmp/wan_data --config wan2.1-1.3B --layers 6

Reads precomputed latents (one safetensors file per sample, see
make_synthetic_latents.py), batches them with AdaptiveBatchSampler (or the equal-token
baseline, --sampler equal), runs diffusers' WanTransformer3DModel with AdaptiveLoad's
fused adaLN ops (or without, --no-fused), under DDP or FSDP2 (--parallel), and logs per
step and per rank: compute time, imbalance, peak memory and throughput (--log-file FILE,
JSON lines). Checkpoints hold model, optimizer and sampler state; --resume continues
mid-epoch, on any number of ranks, and a resubmitted run that is already finished (all
epochs, or --max-steps) trains nothing and leaves its checkpoint as it is.

Loss weighting: micro-batches differ in size across ranks, so each rank's loss is its
sum of squared errors divided by the number of latent elements of the WHOLE optimizer
step (all ranks, all micro-batches; known from the plan without communication), and
gradients are summed across ranks: the step's gradient is that of the global mean.

Uneven counts (--uneven-counts, adaptive sampler): a rank may take any number >= 1 of each
step's W x K micro-batches (AdaptiveBatchSampler(uneven_counts=True)); the loop runs this
rank's count (sampler.micro_batches_in_step), the normalizer above is unchanged, and gradients
are still synchronized once per step (DDP: the all-reduce after the step's last micro-batch;
FSDP2: parameters stay gathered through the step, reduce-scatter at its last backward).

Sequence parallelism (--sequence-parallel D or auto; DDP or FSDP2): each member of a micro-batch's
group runs it in adaptiveload.parallel.split_sequence (its 1/d of the tokens; the loss on the
gathered output, whose backward keeps its own tokens' gradient); the normalizer is unchanged and
a split micro-batch's loss, samples and tokens count once. The log's "degrees": each listing's d.

Online refinement (--refine-cost-model, on by default with the adaptive sampler): each
micro-batch's measured forward+backward time is recorded in the sampler, and at each
epoch's end the ranks fold their records into the cost model the next epoch plans with
(AdaptiveBatchSampler.update_cost_model). Per epoch, rank 0 logs the measured imbalance,
how representative the plan's steps are of the data's shapes (adaptiveload.composition:
distance from the epoch's mix against a shuffle's, steps missing a shape) and the cost model's
error on that epoch's micro-batches (a JSON line with "epoch" and no "step").

Memory budget (--memory-model FILE --memory-budget GiB, adaptive sampler): the sampler plans
every micro-batch under the budget and chooses how many blocks it checkpoints (the fewest whose
predicted peak fits); the loop applies that per micro-batch (set_checkpointed_blocks), measures
each micro-batch's peak against the budget and the prediction (logged when over the budget;
summed up at the end as "memory"), and after an out-of-memory error re-runs the step with that
micro-batch kind fully checkpointed for the rest of the run (DDP and one process; under FSDP or
with sequence parallelism an out-of-memory error is raised, since the other ranks are inside
collectives). With sequence parallelism each member checkpoints what its share needs. The memory model
(from `adaptiveload calibrate`) holds weights and gradients but no optimizer state: the sampler
plans with the budget less AdamW's two fp32 moments per parameter.

Everything but the arguments and the loop is in wan_training.py, beside this script.

Timing: with DDP, each rank runs its micro-batches without gradient sync, records its
compute time, then gradients are all-reduced in buckets; the wait for the slowest rank
shows up in the all-reduce, not in the compute time. With FSDP2, parameter gathers and
gradient reduce-scatters run inside forward and backward, so per-rank compute time
includes communication.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from contextlib import nullcontext
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # also when loaded as a file
from wan_training import (  # noqa: E402 - beside this script
    LatentDataset,
    allreduce_gradients,
    build_model,
    checkpoint_state,
    collate,
    epoch_summary,
    flow_matching_loss,
    load_checkpoint_state,
    sequence_parallel_arg,
    sequence_parallel_degree,
    warm_shapes,
    wrap,
)

from adaptiveload import AdaptiveBatchSampler, CostModel, EqualTokenBatchSampler, MemoryModel
from adaptiveload.composition import step_composition
from adaptiveload.models.checkpointing import set_checkpointed_blocks
from adaptiveload.parallel import SequenceParallelGroups, split_sequence
from adaptiveload.wan import CONFIGS, PATCH


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", required=True)
    ap.add_argument("--config", default="wan2.1-1.3B", choices=sorted(CONFIGS))
    ap.add_argument("--layers", type=int, default=None, help="override the number of blocks")
    ap.add_argument("--sampler", default="adaptive", choices=["adaptive", "equal"])
    ap.add_argument("--fused", action=argparse.BooleanOptionalAction, default=True)
    ap.add_argument("--parallel", default="ddp", choices=["ddp", "fsdp"])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument(
        "--dtype", default=None, choices=["bf16", "fp32"], help="default: bf16 on CUDA, fp32 on CPU"
    )
    ap.add_argument("--activation-checkpointing", action="store_true")
    ap.add_argument(
        "--memory-model", default=None, help="MemoryModel JSON (adaptiveload calibrate)"
    )
    ap.add_argument(
        "--memory-budget",
        type=float,
        default=None,
        help="GiB per GPU: checkpoint, per micro-batch, the fewest blocks that fit (needs "
        "--memory-model)",
    )
    ap.add_argument("--max-tokens", type=int, default=None, help="default: 2x the longest sample")
    ap.add_argument("--max-cost", type=float, default=None)
    ap.add_argument(
        "--cost-model", default=None, help="calibrated JSON (default: built-in Wan 2.1 fit)"
    )
    ap.add_argument("--micro-batches-per-step", type=int, default=1)
    ap.add_argument(
        "--uneven-counts",
        action="store_true",
        help="adaptive sampler: ranks take any number >= 1 of each step's W x K micro-batches, "
        "so a rank of images and a rank of one long clip finish together (FSDP2 then keeps "
        "parameters unsharded through the step)",
    )
    ap.add_argument(
        "--max-batch-size", type=int, default=None, help="samples per micro-batch at most"
    )
    ap.add_argument(
        "--sequence-parallel",
        type=sequence_parallel_arg,
        default="auto",
        help="D or 'auto' (the default, with --sampler adaptive: the largest power of two <= 8 "
        "dividing the GPUs; any head count, as Ulysses x ring): each micro-batch runs on "
        "d <= D ranks, each on 1/d of its tokens (turns on --uneven-counts where D > 1); 1: off",
    )
    ap.add_argument("--lookahead-steps", type=int, default=64)
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument(
        "--max-steps", type=int, default=None, help="stop after this many optimizer steps in all"
    )
    ap.add_argument("--lr", type=float, default=1e-4)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--num-workers", type=int, default=2)
    ap.add_argument("--checkpoint-dir", default=None)
    ap.add_argument(
        "--checkpoint-every", type=int, default=0, help="optimizer steps; 0: only at the end"
    )
    ap.add_argument("--resume", action="store_true", help="continue from --checkpoint-dir/last.pt")
    ap.add_argument(
        "--timeout",
        type=float,
        default=600.0,
        help="seconds a rank waits for its peers (rendezvous, collectives) before the run "
        "fails; torch's default is 30 minutes",
    )
    ap.add_argument("--log-file", default=None, help="JSON lines, one per optimizer step (rank 0)")
    ap.add_argument(
        "--warmup-steps",
        type=int,
        default=0,
        help="first steps of the run left out of the epoch summaries and of cost refinement",
    )
    ap.add_argument("--no-progress", action="store_true")
    ap.add_argument(
        "--warm-shapes",
        action="store_true",
        help="before each epoch, run each new micro-batch shape once, untimed (see warm_shapes)",
    )
    ap.add_argument(
        "--refine-cost-model",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="record each micro-batch's time and refine the sampler's cost model at each "
        "epoch's end (default: on with --sampler adaptive). With FSDP the times include "
        "parameter gathers, which wait for the slowest rank",
    )
    args = ap.parse_args(argv)
    if (args.memory_model is None) != (args.memory_budget is None):
        ap.error("--memory-model and --memory-budget go together")
    if args.memory_budget is not None and args.sampler != "adaptive":
        ap.error("--memory-budget needs --sampler adaptive")
    if args.memory_budget is not None and args.activation_checkpointing:
        ap.error(
            "--memory-budget chooses checkpointing per micro-batch; drop --activation-checkpointing"
        )
    if args.sequence_parallel == "auto" and args.sampler != "adaptive":
        args.sequence_parallel = 1  # the baselines plan whole micro-batches
    if args.sequence_parallel not in (1, "auto"):
        if args.sampler != "adaptive":
            ap.error("--sequence-parallel needs --sampler adaptive")
        args.uneven_counts = True
    if args.uneven_counts and args.sampler != "adaptive":
        ap.error("--uneven-counts needs --sampler adaptive")
    if args.refine_cost_model is None:
        args.refine_cost_model = args.sampler == "adaptive"
    return args


def main(argv=None):
    args = parse_args(argv)
    device = torch.device(args.device)
    backend = "nccl" if device.type == "cuda" else "gloo"
    if "RANK" in os.environ:  # started by torchrun
        if device.type == "cuda":
            device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
            torch.cuda.set_device(device)
        dist.init_process_group(backend, timeout=timedelta(seconds=args.timeout))
    else:  # a one-process group keeps one code path
        store = dist.HashStore()
        dist.init_process_group(backend, store=store, rank=0, world_size=1)
    world, rank = dist.get_world_size(), dist.get_rank()
    dtype = {"bf16": torch.bfloat16, "fp32": torch.float32}[
        args.dtype or ("bf16" if device.type == "cuda" else "fp32")
    ]

    degree = sequence_parallel_degree(args.sequence_parallel, world)
    args.uneven_counts = args.uneven_counts or degree > 1  # split micro-batches need them
    groups = SequenceParallelGroups(degree) if degree > 1 else None
    data = LatentDataset(args.data, seed=args.seed)
    seq_lens = data.seq_lens
    memory = MemoryModel.load(args.memory_model) if args.memory_model else None
    max_tokens = args.max_tokens or (None if memory else int(2 * seq_lens.max()))
    cost = CostModel.from_json(args.cost_model) if args.cost_model else None
    common = dict(
        group_keys=data.shapes,
        num_replicas=world,
        rank=rank,
        micro_batches_per_step=args.micro_batches_per_step,
        max_batch_size=args.max_batch_size,
        seed=args.seed,
    )
    model = build_model(args, device, dtype)
    policy = None
    if memory is not None:
        n_blocks = len(model.blocks)
        if memory.num_blocks != n_blocks:
            raise SystemExit(
                f"--memory-model describes {memory.num_blocks} blocks, the model has {n_blocks}"
            )
        # AdamW's two fp32 moments per parameter, which the calibration does not hold.
        optimizer_gib = 8 * sum(p.numel() for p in model.parameters() if p.requires_grad) / 2**30
        plan_budget = args.memory_budget - optimizer_gib
        if plan_budget <= 0:
            raise SystemExit(
                f"--memory-budget {args.memory_budget} GiB leaves nothing after the optimizer "
                f"state ({optimizer_gib:.2f} GiB)"
            )
    if args.sampler == "adaptive":
        sampler = AdaptiveBatchSampler(
            seq_lens,
            max_tokens,
            max_cost=args.max_cost,
            cost_model=cost,
            lookahead_steps=args.lookahead_steps,
            uneven_counts=args.uneven_counts,
            **({"sequence_parallel": degree} if degree > 1 else {}),
            **common,
            **(
                {"memory_model": memory, "memory_budget_gib": plan_budget}
                if memory is not None
                else {}
            ),
        )
        if memory is not None:
            policy = sampler.memory_policy(
                log=lambda msg: print(f"[rank {rank}] {msg}"), reserved_gib=optimizer_gib
            )
    else:
        sampler = EqualTokenBatchSampler(seq_lens, max_tokens, cost_model=cost, **common)

    model = wrap(model, args, device)
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=args.lr, weight_decay=0.0)

    start_epoch, global_step = 0, 0
    ckpt_path = os.path.join(args.checkpoint_dir, "last.pt") if args.checkpoint_dir else None
    if args.resume:
        if not ckpt_path or not os.path.exists(ckpt_path):
            raise SystemExit(f"--resume: no checkpoint at {ckpt_path}")
        try:
            ckpt = torch.load(ckpt_path, weights_only=False, map_location="cpu")
            load_checkpoint_state(model, optimizer, ckpt["model"], ckpt["optimizer"])
            sampler.load_state_dict(ckpt["sampler"])
            start_epoch, global_step = int(ckpt["epoch"]), int(ckpt["global_step"])
        except Exception as e:  # noqa: BLE001 - any failure to read it: name the file
            raise SystemExit(f"--resume: cannot load checkpoint {ckpt_path}: {e}") from e

    def save(epoch, steps_in_epoch):
        """Checkpoint after ``steps_in_epoch`` steps of ``epoch``'s plan (all of them once
        the epoch is done: the sampler state then says so, and a resume moves on)."""
        if not ckpt_path:
            return
        assert sampler.epoch == epoch, (sampler.epoch, epoch)
        model_sd, optim_sd = checkpoint_state(model, optimizer)
        state = {
            "model": model_sd,
            "optimizer": optim_sd,
            "sampler": sampler.state_dict(steps_done=steps_in_epoch),
            "epoch": epoch,
            "global_step": global_step,
        }
        if rank == 0:
            os.makedirs(args.checkpoint_dir, exist_ok=True)
            torch.save(state, ckpt_path + ".tmp")
            os.replace(ckpt_path + ".tmp", ckpt_path)
        dist.barrier()

    log = open(args.log_file, "a") if (args.log_file and rank == 0) else None
    elements_per_token = CONFIGS[args.config]["in_channels"] * math.prod(PATCH)
    ddp_manual = args.parallel == "ddp"
    on_cuda = device.type == "cuda"
    progress = None
    steps_run = 0  # optimizer steps of this invocation
    position = None  # (epoch, steps of its plan done) after the last step run
    saved_at = None
    seen_shapes: set = set()
    text_len = data[0]["text"].shape[0] if args.warm_shapes else 0
    inner = model.module if hasattr(model, "module") else model
    oom_retries = 0

    def reached_max_steps():
        return args.max_steps is not None and global_step >= args.max_steps

    for epoch in range(start_epoch, args.epochs):
        if reached_max_steps():
            break
        sampler.set_epoch(epoch)
        data.epoch = epoch  # before the DataLoader forks its workers
        plan = sampler.plan()
        if sampler.start_step >= plan.num_steps:
            continue  # a resumed epoch with nothing left
        step_tokens = plan.step_tokens()
        if args.warm_shapes:
            t_warm = time.perf_counter()
            warmed = warm_shapes(model, plan, rank, data.shapes, text_len, device, seen_shapes)
            if on_cuda:
                torch.cuda.synchronize(device)
            warm_s = time.perf_counter() - t_warm
            if rank == 0:
                print(f"epoch {epoch}: warmed {warmed} new micro-batch shapes in {warm_s:.1f} s")
                if log:
                    log.write(
                        json.dumps({"epoch": epoch, "warm_shapes": warmed, "warm_s": warm_s}) + "\n"
                    )
        loader = DataLoader(
            data,
            batch_sampler=sampler,
            num_workers=args.num_workers,
            collate_fn=collate,
            pin_memory=on_cuda,
            persistent_workers=False,
        )
        if rank == 0 and not args.no_progress:
            try:
                from tqdm import tqdm

                progress = tqdm(
                    total=plan.num_steps,
                    initial=sampler.start_step,
                    desc=f"epoch {epoch}",
                    unit="step",
                )
            except ImportError:
                progress = None
        it = iter(loader)
        imbalances, errors = [], []  # this epoch's, on rank 0
        save_after_update = False
        for step in range(sampler.start_step, plan.num_steps):
            if reached_max_steps():
                break
            normalizer = float(step_tokens[step]) * elements_per_token
            if on_cuda:
                torch.cuda.reset_peak_memory_stats(device)
                torch.cuda.synchronize(device)
            t_start = time.perf_counter()
            data_wait = 0.0
            fetched = []  # this step's batches, kept for a re-run after an out-of-memory error
            count = sampler.micro_batches_in_step(step)  # K, or this rank's share (uneven)
            k = 0
            while k < count:
                if k == 0:  # (re)start the step
                    loss_sum = torch.zeros((), device=device)
                    samples = tokens = 0
                    batches = []
                    degrees = []  # of each micro-batch (1 unless split)
                    micro_batch_ms = []  # forward+backward of each micro-batch
                    # Per micro-batch: (start, inputs on GPU, end) events; model time =
                    # end - inputs.
                    marks = [] if on_cuda else None
                    step_peaks = []
                if k == len(fetched):
                    t_data = time.perf_counter()
                    fetched.append(next(it))
                    data_wait += time.perf_counter() - t_data
                batch = fetched[k]
                lens_k = seq_lens[batch["index"].numpy()]
                d, member, split = 1, 0, nullcontext()
                if groups is not None:  # this micro-batch's degree and this rank's share
                    m = plan.micro_batch_id(step, rank, k)
                    d, member = int(plan.degrees[m]), int(plan.members[m])
                    split = split_sequence(inner, groups.group(rank, d), d, member)
                if policy is not None:  # the blocks this rank's share needs
                    n_ckpt = policy.blocks_for(lens_k, d)
                    set_checkpointed_blocks(inner, n_ckpt)
                    if on_cuda:
                        torch.cuda.reset_peak_memory_stats(device)
                sync = nullcontext()
                if ddp_manual and hasattr(model, "no_sync"):
                    sync = model.no_sync()
                elif hasattr(model, "set_requires_gradient_sync"):
                    model.set_requires_gradient_sync(k == count - 1)
                    if args.uneven_counts:
                        model.set_reshard_after_backward(k == count - 1)
                if marks is not None:
                    marks.append(torch.cuda.Event(enable_timing=True))
                    marks[-1].record()
                t_micro = time.perf_counter()
                try:
                    with sync, split:
                        scale = world if args.parallel == "fsdp" else 1  # FSDP averages over ranks
                        loss = flow_matching_loss(model, batch, device, dtype, normalizer, marks)
                        (loss * scale).backward()
                except torch.OutOfMemoryError:
                    # Re-run the step only where no other rank waits in one of its collectives.
                    alone = policy is not None and args.parallel != "fsdp" and groups is None
                    if not (alone and policy.on_oom(lens_k)):
                        raise
                    # Gradients of this step are partial: clear them and run the step again
                    # from its first micro-batch, this kind now fully checkpointed.
                    loss = None  # frees the graph of the failed micro-batch, if it got one
                    optimizer.zero_grad(set_to_none=True)
                    torch.cuda.empty_cache()
                    oom_retries += 1
                    k = 0
                    continue
                if marks is not None:
                    marks.append(torch.cuda.Event(enable_timing=True))
                    marks[-1].record()
                else:  # CPU: synchronous
                    micro_batch_ms.append((time.perf_counter() - t_micro) * 1000)
                if policy is not None and on_cuda:
                    peak_k = torch.cuda.max_memory_allocated(device)
                    policy.check_peak(lens_k, n_ckpt, peak_k, d)
                    step_peaks.append((int(n_ckpt), int(peak_k)))
                batches.append(batch["index"].tolist())
                degrees.append(d)
                if member == 0:  # a split micro-batch counts once: its members' losses are one
                    samples += len(batch["index"])
                    tokens += int(lens_k.sum())
                    loss_sum += loss.detach()
                k += 1
            if on_cuda:
                torch.cuda.synchronize(device)
            compute_s = time.perf_counter() - t_start - data_wait
            # GPU time of the model's forward and backward alone (inputs already on the GPU).
            if marks:
                micro_batch_ms = [
                    marks[i + 1].elapsed_time(marks[i + 2]) for i in range(0, len(marks), 3)
                ]
            model_s = sum(micro_batch_ms) / 1000 if marks else 0.0
            warming_up = steps_run < args.warmup_steps  # this process's first steps
            if args.refine_cost_model and not warming_up:
                for idx, ms, d in zip(batches, micro_batch_ms, degrees, strict=True):
                    if ms > 0:
                        sampler.record_time(idx, ms, **({"degree": d} if groups else {}))
            if ddp_manual and world > 1:
                allreduce_gradients(params)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            if on_cuda:
                torch.cuda.synchronize(device)
            step_s = time.perf_counter() - t_start
            peak = torch.cuda.max_memory_allocated(device) if on_cuda else 0
            if step_peaks:  # peak stats were reset per micro-batch
                peak = max(peak, *(p for _, p in step_peaks))
            stats = torch.tensor(
                [
                    compute_s,
                    step_s,
                    float(peak),
                    float(samples),
                    float(tokens),
                    float(loss_sum),
                    model_s,
                ],
                dtype=torch.float64,
                device=device,
            )
            gathered = [torch.zeros_like(stats) for _ in range(world)]
            dist.all_gather(gathered, stats)
            per_rank = [None] * world
            dist.all_gather_object(per_rank, (batches, micro_batch_ms, degrees))
            all_batches = [b for b, _, _ in per_rank]
            global_step += 1
            if rank == 0:
                g = torch.stack(gathered).cpu()
                compute = g[:, 0]
                record = {
                    "epoch": epoch,
                    "step": step,
                    "global_step": global_step,
                    "loss": float(g[:, 5].sum()),
                    "compute_ms": (compute * 1000).tolist(),
                    "model_ms": (g[:, 6] * 1000).tolist(),
                    "step_ms": float(g[:, 1].max() * 1000),
                    "imbalance": float(1 - compute.mean() / compute.max())
                    if compute.max() > 0
                    else 0.0,
                    "peak_bytes": g[:, 2].tolist(),
                    "samples": int(g[:, 3].sum()),
                    "tokens": int(g[:, 4].sum()),
                    "batches": all_batches,
                    "micro_batch_ms": [ms for _, ms, _ in per_rank],
                }
                if groups is not None:  # a micro-batch of degree d is listed by its d ranks
                    record["degrees"] = [d for _, _, d in per_rank]
                if policy is not None:
                    record["checkpointed_and_peak"] = step_peaks  # rank 0's micro-batches
                if not warming_up:
                    imbalances.append(record["imbalance"])
                    for r, (_, times, _) in enumerate(per_rank):
                        for k, ms in enumerate(times):
                            if ms > 0:
                                errors.append(
                                    abs(plan.costs[plan.micro_batch_id(step, r, k)] / ms - 1)
                                )
                if log:
                    log.write(json.dumps(record) + "\n")
                    log.flush()
                if progress is not None:
                    progress.set_postfix(
                        loss=f"{record['loss']:.4f}", imb=f"{record['imbalance']:.1%}"
                    )
                    progress.update(1)
            steps_run += 1
            position = (epoch, step + 1)
            if args.checkpoint_every and global_step % args.checkpoint_every == 0:
                if args.refine_cost_model and step + 1 == plan.num_steps:
                    save_after_update = True  # with this epoch's times in the sampler state
                else:
                    save(*position)
                    saved_at = position
        if progress is not None:
            progress.close()
        del it, loader
        # A collective: every rank reaches it, after the same steps.
        refined = sampler.update_cost_model() if args.refine_cost_model else None
        if save_after_update:
            save(*position)
            saved_at = position
        if rank == 0 and imbalances:
            keys = sampler.group_keys if sampler.group_keys is not None else seq_lens
            comp = step_composition(plan, keys, seq_lens)
            summary = epoch_summary(epoch, imbalances, errors, refined, comp)
            line = (
                f"epoch {epoch}: measured imbalance {summary['measured_imbalance']:.1%}, "
                f"composition vs shuffle {comp.tokens_ratio:.2f}x, steps missing a shape "
                f"{comp.missing:.0%} (shuffle {comp.shuffle_missing:.0%})"
            )
            if errors:
                line += (
                    f", cost model error median {summary['cost_error_median']:.1%} "
                    f"p90 {summary['cost_error_p90']:.1%}"
                )
            if refined is not None:
                line += (
                    f"; refined with {refined['records']} times, {refined['kinds']} kinds "
                    f"({refined['new_kinds']} new) for the next epoch"
                )
            print(line, flush=True)
            if log:
                log.write(json.dumps(summary) + "\n")
                log.flush()
    if policy is not None:
        mem = policy.report() | {"oom_retries": oom_retries, "budget_gib": args.memory_budget,
                                 "planned_budget_gib": plan_budget}  # fmt: skip
        print(f"[rank {rank}] memory: {json.dumps(mem)}", flush=True)
        if log:
            log.write(json.dumps({"memory": mem}) + "\n")
    if steps_run == 0 and rank == 0:
        print(f"nothing to train: run finished (epoch {start_epoch}, global step {global_step})")
    if ckpt_path and position is not None and saved_at != position:
        save(*position)
    if log:
        log.close()
    # Every rank past its last collective before any tears its process group down.
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
