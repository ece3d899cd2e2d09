"""Writes benchmarks/RESULTS.md from the raw numbers in benchmarks/results/<machine>/*.csv.

Each benchmark script writes (or appends to) its CSV; this renders the current tables, with the
command, machine and date each CSV records. Run it after adding results:

    python benchmarks/make_results.py            # rewrites benchmarks/RESULTS.md
"""

from __future__ import annotations

import csv
import os
import sys

from results_convergence import convergence, fidelity
from results_io import (  # noqa: F401 - append_csv, write_csv: the benchmark scripts import them
    HERE,
    RESULTS,
    append_csv,
    provenance,
    read,
    table,
    write_csv,
)
from results_ops import host_overhead, ops_bandwidth, rms_bandwidth, rms_tuning, tuning_sweep


def write_results(rel: str, head: list[str], rows: list[list], meta: dict) -> str:
    """Writes one benchmark's rows to benchmarks/results/<rel> (replacing it), each row led by
    the `meta` columns (date, machine, command), then rewrites RESULTS.md."""
    path = os.path.join(RESULTS, rel)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(list(meta) + head)
        for r in rows:
            w.writerow(list(meta.values()) + list(r))
    main()
    return path


def copied(rel: str, title: str, question: str, note: str = "") -> list[str]:
    rows = read(rel)
    if not rows:
        return []
    skip = {"date", "machine", "command", "setup"}
    head = [k for k in rows[0] if k not in skip]
    if rows[0].get("setup"):
        note = f"Setup: {rows[0]['setup']}." + (f" {note}" if note else "")
    return (
        [f"## {title}", "", f"{question} {provenance(rows)}." + (f" {note}" if note else ""), ""]
        + table(head, [[r[k] for k in head] for r in rows])
        + [""]
    )


SECTIONS = [
    (
        "How close do the fused adaLN kernels get to the copy bandwidth, and against torch.compile?",
        ops_bandwidth,
    ),
    ("How much host time does a call of the fused op cost?", host_overhead),
    ("Does the tuning table pick the fastest configuration?", tuning_sweep),
    (
        "What share of a DiffSynth-Studio Wan training step do the fused ops take and save?",
        lambda: copied(
            "h200/diffsynth_step.csv",
            "Fused ops inside DiffSynth-Studio's Wan model",
            "benchmarks/diffsynth_step.py: forward and backward of DiffSynth's WanModel blocks "
            "at the Wan-2.1-1.3B shape, one 32,760-token sample (480x832, 81 frames), with "
            "DiffSynth's own blocks and with apply_fused_ops; the fused kernels' share from "
            "torch.profiler over one fused step.",
            "At this length attention dominates the step; the adaLN steps are about 3% of it "
            "unfused, and fusing them saves about half of that.",
        ),
    ),
    (
        "What does a new micro-batch shape cost (cuDNN's attention plan build)?",
        lambda: copied(
            "h200/cold_shapes.csv",
            "New micro-batch shapes: the attention plan build",
            "Forward+backward of a 4-block Wan-2.1-1.3B model, first call of a shape against a repeat.",
        ),
    ),
    (
        "What do the sampler and the fused ops give end to end, on 2 GPUs?",
        lambda: copied(
            "h200x2/e2e_wan.csv",
            "Wan 2.1 end to end (2 H200s)",
            "One epoch per arm of 320 synthetic joint-pretrain samples, Wan-2.1-1.3B with 4 of "
            "its 30 blocks, bf16, DDP, shapes warmed first.",
            "Imbalance: per step 1 - mean/max of the ranks' compute times, averaged over steps "
            "(the first two left out); speedup by epoch time; mean peak / budget over a 100 GiB "
            "budget.",
        ),
    ),
    (
        "How well does the sampler balance ranks, against equal-token buckets and the paper's rule?",
        lambda: (
            copied(
                "cpu/sampler_balance.csv",
                "Sampler balance",
                "Simulated with the measured Wan-2.1-14B block table on an H200 x 40 layers; 50,000 "
                "samples per mix; max_tokens = 2 x the longest sample.",
            )
            + copied(
                "cpu/sampler_lookahead.csv",
                "Lookahead window",
                "How far the order departs from a plain shuffle against balance (joint-pretrain, W = 8).",
            )
            + copied(
                "cpu/planning_cost.csv",
                "Planning cost",
                "One core, fresh process.",
            )
        ),
    ),
    (
        "What balance do the plans get in measured time (one GPU replaying 8 and 64 ranks)?",
        lambda: copied(
            "h200/replay_wan.csv",
            "Measured balance: one H200 replaying many ranks",
            "Every distinct micro-batch of each arm's plan of epoch 2 timed forward+backward on "
            "Wan-2.1-1.3B with 3 of its 30 blocks (bf16, fused ops, activation checkpointing); "
            "each step rebuilt as its slowest rank's measured time. Held-out mix "
            "(benchmarks/replay_wan.py HELD_OUT_MIX, shapes outside the calibration grid); "
            "models built from timings of their own, scored with fresh ones.",
            "Each kind's time is the mean of its two fresh timings, used for every micro-batch "
            "of that kind: per-call jitter (the noise above) is not in the step maxima, so "
            "measured imbalance shows the plan and the model's error, not run-to-run noise. "
            "Imbalance: mean over steps of 1 - mean/max of the ranks' measured times; model "
            "error: |predicted - measured| / measured over the plan's micro-batches; "
            "\"speedup if balanced\": equal-token's epoch over this plan's perfectly balanced "
            "one (the bound of its micro-batches).",
        ),
    ),
    (
        "And on a mix with longer clips, where equal-token buckets lose more?",
        lambda: copied(
            "h200/replay_wan_held-out-long.csv",
            "Measured balance with long 720p clips",
            "The replay above (8 ranks) on benchmarks/replay_wan.py HELD_OUT_LONG_MIX: the "
            "same mix with 77-frame 720p clips (72,000 tokens) in place of the 61-frame ones.",
        ),
    ),
    (
        "And for other video DiTs: HunyuanVideo and LTX-Video?",
        lambda: (
            copied(
                "h200/replay_hunyuanvideo.csv",
                "Measured balance: HunyuanVideo",
                "The replay above for HunyuanVideo-13B (benchmarks/replay_wan.py --model "
                "hunyuanvideo/hunyuanvideo-13B --layers 1 --ks 4 --no-fused: one dual-stream and "
                "one single-stream block, bf16, diffusers' blocks, activation checkpointing), 8 "
                "ranks, 20,000 samples of the held-out mix; a sample's tokens count its 256 text "
                "tokens (joint attention). The built-in arm uses the Wan-2.1 H200 profile, the "
                "default a user gets before calibrating.",
            )
            + copied(
                "h200/replay_ltx-video_held-out-ltx.csv",
                "Measured balance: LTX-Video",
                "LTX-Video-2B (--model ltx-video/ltx-video-2B --layers 2 --no-fused), 8 ranks, "
                "20,000 samples of benchmarks/replay_wan.py HELD_OUT_LTX_MIX (LTX-Video's "
                "shapes, none in its calibration grid): its VAE compresses 8 x 32 x 32, so "
                "samples are 300 to 12,000 tokens and attention's share is smaller than Wan's.",
            )
        ),
    ),
    (
        "What does balancing give a batch-size-1 pipeline (DiffSynth-Studio's trainer)?",
        lambda: copied(
            "h200/replay_wan_b1.csv",
            "Batch size 1: one sample per micro-batch",
            "The replay above with max_batch_size=1 for every arm: the equal-token arm is then "
            "the batch-size-1 pipelines' default (shuffled samples, one per micro-batch, "
            "dealt to ranks in order; the paper's rule is the same plan). K = 4 is gradient "
            "accumulation over 4 samples per rank.",
            "Single-sample micro-batches of images are bound by the host's launches and their "
            "timings are noisy (run-to-run spread median 3.7%, 90th percentile 29%), which is "
            "most of the model error here.",
        ),
    ),
    (
        "What do uneven micro-batch counts per rank give over K per rank?",
        lambda: (
            copied(
                "h200/replay_wan_b1_uneven.csv",
                "Uneven micro-batch counts per rank, batch size 1",
                "benchmarks/replay_wan.py --uneven --worlds 8 --ks 4 --max-batch-size 1: the "
                "uneven arm is plan-aware with uneven_counts=True (a rank takes any number >= 1 "
                "of the step's W x K micro-batches); its speedup is also given against "
                "plan-aware with K per rank.",
            )
            + copied(
                "h200/replay_wan_uneven.csv",
                "Uneven micro-batch counts per rank, mixed plan",
                "The same without max_batch_size.",
            )
            + copied(
                "h200/replay_wan_held-out-long_b1_uneven.csv",
                "Uneven micro-batch counts per rank, batch size 1, long 720p clips",
                "benchmarks/replay_wan.py --uneven --mix held-out-long --worlds 8 --ks 2,4 "
                "--max-batch-size 1: the mix where one clip costs most against an image.",
            )
        ),
    ),
    (
        "Does online refinement bring the measured imbalance down, and how long does plan-aware calibration take?",
        lambda: (
            copied(
                "h200/replay_wan_refined.csv",
                "Online refinement, epoch by epoch",
                "The refined arm of the replay above: the built-in profile, then each epoch's "
                "measured micro-batch times folded in (record_time / update_cost_model), scored "
                "with fresh timings; epoch 2 is the table above.",
            )
            + copied(
                "h200/calibrate_plan.csv",
                "Plan-aware calibration time",
                "`calibrate_plan` of the held-out mix, one warm-up and two timed calls per kind, "
                "activation checkpointing, Wan-2.1-1.3B; rounds until no kind is new. The "
                "fallback's error is k-fold over the measured kinds (kinds the plan uses are "
                "exact). `adaptiveload calibrate --metadata` defaults to 2 warm-ups and 5 timed "
                "calls, about 7/3 of these times.",
            )
        ),
    ),
    (
        "How much faster is an epoch when each micro-batch checkpoints only what its memory needs?",
        lambda: (
            copied(
                "h200/replay_memory.csv",
                "Memory headroom into speed: the checkpointing policy",
                "benchmarks/replay_memory.py: memory model fitted to measured peaks of the mix's "
                "kinds with n of L blocks checkpointed, plans at one memory budget (8 ranks), "
                "every distinct (S, B, n) kind of each plan timed fresh twice with its peak; "
                "Wan-2.1-1.3B with 6 of its 30 blocks, bf16, fused ops, the budget emulated "
                "(the short model's fixed memory plus the full model's activation budget "
                'scaled by 6/30). "policy plan, full ckpt" is the policy\'s own plan run with '
                "every block checkpointed; the full-checkpointing arms use the largest "
                "max_tokens at which any shape's micro-batch fits the budget.",
                "Packing under the policy stops a micro-batch of two or more samples before "
                "it would need recomputation; docs/memory.md explains the peak/budget mean "
                "(74.8%, target 80%) and the speedup over equal-token (1.58x, target 1.9x). "
                "The training run below used the same memory model with the previous packing "
                "rule.",
            )
            + copied(
                "h200/train_memory.csv",
                "The policy in a real training run",
                "examples/train_wan.py on one H200 with --memory-model/--memory-budget: each "
                "micro-batch checkpoints the blocks its plan chose; peaks measured per "
                "micro-batch. The prediction adds the 8 bytes per parameter left to AdamW, "
                "which the bf16 model's state fills about half of (hence over-prediction).",
            )
        ),
    ),
    (
        "Are the defaults fast and faithful at every setup teams run (predicted)?",
        lambda: copied(
            "cpu/frontier.csv",
            "Fast and faithful: the frontier per setup (predicted)",
            "benchmarks/frontier.py: the held-out mix (20,000 samples), the built-in "
            "Wan-2.1-1.3B profile, 8 and 64 ranks, sequence parallelism over 4 (Ulysses) and "
            "8 (Ulysses 4 x ring 2, the ring's communication priced); the default "
            '(composition="representative") '
            'against composition="balanced" at the setup\'s tolerance, at 0 and at 1, each '
            "against the baseline it replaces (equal-token buckets; at batch size 1 shuffled "
            "single samples). Distances are over a shuffle's of the same micro-batches; steps "
            "missing a modality are those without an image or without a clip, beside a "
            "shuffle's.",
            "Representative: both distances within 1.10x a shuffle's and steps missing a shape "
            "within 3 points of a shuffle's (adaptiveload.report.representative). Issue #54's "
            "speed targets apply to the default at 8 ranks; at batch size 1 without sequence "
            "parallelism only segregated steps are fast, so the default is a shuffle's speed "
            'and composition="balanced" is the explicit choice of speed over fidelity.',
        ),
    ),
    (
        "What does mixing every step's shapes cost in speed (the mix_tolerance frontier)?",
        lambda: (
            copied(
                "h200/replay_mix.csv",
                "mix_tolerance frontier",
                "benchmarks/replay_mix.py: the held-out mix for 8 ranks at K = 1 and 4, packed "
                "and one sample per micro-batch; per setting one plan-aware cost model, then "
                "plans at each mix_tolerance (0: steps of similar cost, the planner before "
                "2026-12) beside equal-token buckets, every micro-batch kind timed fresh twice "
                "on Wan-2.1-1.3B with 3 of its 30 blocks (bf16, diffusers' adaLN, activation "
                "checkpointing).",
                "Composition vs shuffle: the mean total-variation distance of the steps' "
                "token (sample) shares by shape from the epoch's, over a uniform shuffle's of "
                "the same micro-batches (1.0: as representative as a shuffle; below: more).",
            )
            + ["![frontier](results/h200/replay_mix.png)", ""]
            if read("h200/replay_mix.csv")
            else []
        ),
    ),
    (
        "Does sequence parallelism per micro-batch make representative steps balance?",
        lambda: (
            copied(
                "h100/replay_sp_13b_d8.csv",
                "The 1.3B model at its largest degree (Ulysses 4 x ring 2), final defaults",
                "benchmarks/replay_sp.py --config wan2.1-1.3B --degree 8 --worlds 8: the "
                "held-out mix for 8 ranks with the defaults of issue 54. today: the default "
                "plan (representative steps); today balanced: the segregated plan "
                '(composition="balanced", speed over fidelity); today uneven: the default with '
                "uneven counts; sp 8: sequence_parallel=8 with uneven counts, representative "
                "(Wan 2.1-1.3B's 12 heads over 8 ranks run Ulysses over 4 times a ring of 2); "
                "sp 8 mixed: the same at mix_tolerance=1. Every arm calibrated on its own plans "
                "of epoch 0 and scored on epoch 1; every listing timed on the H100 as one "
                "member's share of 3 of the model's 30 blocks (bf16, diffusers' adaLN, "
                "activation checkpointing), the all-to-alls modeled, the ring's part at 1.43x "
                "Ulysses' bytes (parallel.groups.ring_comm_factor).",
                "Every default arm is as representative as a shuffle (composition at most "
                "0.99x a shuffle's distance, no more steps without an image). Batch size 1 with "
                "sequence parallelism: 2.51x shuffled single samples at K = 1 (0.84x the "
                "segregated plan's speed) and 2.03x at K = 4 (the segregated plan's speed, with "
                "mixed steps), below the full-depth profile's prediction (3.22x, 2.53x) because 3 "
                "blocks carry a floor of about 50 ms a micro-batch (one image: 48 ms; an eighth "
                "of a 28,800-token clip: 55 ms, where the whole takes 223): splitting gains "
                "less than it will at 30 blocks. Without sequence parallelism batch size 1 "
                "runs at a shuffle's speed by default; the segregated plan's 2.97x leaves 40% "
                "of steps without an image. Packed, the default holds a shuffle's composition "
                "at K = 1 (0.58x) and K = 4 (0.31x); sequence parallelism adds 1.4% at K = 1.",
            )
            + ["![frontier](results/h100/replay_sp_13b_d8.png)", ""]
            + copied(
                "h100/replay_sp.csv",
                "Sequence parallelism chosen per micro-batch, today's defaults, on an H100",
                "benchmarks/replay_sp.py: as in the next section (the held-out mix, 8 ranks "
                "and a simulated 64, every arm calibrated on its own plans of epoch 0 and "
                "scored on epoch 1), with the defaults of today: mix_tolerance bounds the time "
                "lost to waiting and to splitting, 0.05 with sequence parallelism and 0.10 at "
                "batch size 1 and K = 1 (sampler.defaults.MIX_TOLERANCE_BY_SETUP), calibration "
                "measures what a share is weighed against, cost models price what a share "
                "keeps whole, Wan's cross-attention runs on head shards where that pays.",
                "Every 8-rank row of issue 35's table within its bar in this run. Packed K = 1 "
                "stands at the edge: the previous H100 run of the same settings gave 0.974x "
                "today's at 1.74x a shuffle's composition (its windows mixed less), so its "
                "composition varies run to run with the calibration's timings.",
            )
            + ["![frontier](results/h100/replay_sp.png)", ""]
            + copied(
                "h100/replay_sp_demo_builtin.csv",
                "The CLI's demo mix planned with the built-in 14B profile, on an H100",
                "benchmarks/replay_sp.py --data demo --builtin --batches packed --ks 4 "
                "--worlds 8: the mix of `adaptiveload plan --demo --micro-batches-per-step 4` "
                "planned as the CLI plans it (the built-in full-depth Wan 2.1-14B profile, no "
                "calibration), each listing timed as one block of it.",
                "Predicted imbalance is the built-in profile's (issue 35's bar: 2%); measured, "
                "that of one block timed per listing, where the launch floor weighs more.",
            )
            + copied(
                "h200/replay_sp.csv",
                "Sequence parallelism chosen per micro-batch, replayed",
                "benchmarks/replay_sp.py: the held-out mix (20,000 samples) for 8 ranks and a "
                "simulated 64, batch size 1 and packed, K = 1 and 4: shuffled batch size 1, "
                "today's default plan, today's with uneven counts, and sequence_parallel=8 "
                "(Wan 2.1-14B's 40 heads allow 1, 2, 4, 8) at the default mix_tolerance (0.02; "
                "0.08 at batch size 1 and K = 1, sampler.defaults.MIX_TOLERANCE_BY_SETUP) and "
                "fully mixed (mix_tolerance=1). Each arm plans with a cost model calibrated on its own "
                "plans of epoch 0 (calibrate_plan: whole micro-batches and, split, one rank's "
                "share (S, B, d)) and is scored on epoch 1. Every listing timed on the H200 as "
                "exactly one member's share (parallel.ONE_DEVICE; 1 of 40 blocks, bf16, the "
                "project's fused adaLN, activation checkpointing), all-to-alls modeled at 350 "
                "GB/s, each step replayed rank by rank with shared micro-batches waiting for "
                "their last member.",
                "Predicted imbalance is the planner's; measured, the replay's. Calibration and "
                "scoring use the same timing of each kind, so the two agree wherever every "
                "micro-batch is of one kind: the agreement shows the planner prices what it "
                "plans, not the timings' run-to-run noise (0.4% median on the H200). One block "
                "of 40 weighs the per-micro-batch launch floor more than the whole model does. "
                "Run to run (each arm calibrated anew), batch size 1 at K = 1 with sequence "
                "parallelism gave 3.48-3.53x shuffled batch size 1, 0.82-0.93x a shuffle's "
                "composition distance and 5.7-6.8% imbalance over two runs; packed K = 1 "
                "0.949-0.960x today's plan.",
            )
            + ["![frontier](results/h200/replay_sp.png)", ""]
            + copied(
                "h200/split_share.csv",
                "One member's share of a split micro-batch, against the whole",
                "benchmarks/bench_split_share.py: one member's share (parallel.ONE_DEVICE) of "
                "micro-batches of Wan 2.1-14B split d ways, with cross-attention on the token "
                "shard (every member projects the whole text, 512 tokens per sample, for every "
                "head) and on head shards (each member projects the text for its own heads; "
                "its queries and output cross the group), all-to-alls not timed.",
                "1.00 is a share of exactly 1/d of the whole. Head shards pay where many short "
                "samples share a micro-batch (96 images: 1.56 -> 1.35 at d = 8) and cost "
                "0.5-1% from 32,760 tokens up, and at d = 2 stay within 1% either way, so "
                "parallel.wan uses them up to 16 tokens per text token over 4 ranks or more "
                "(HEAD_SHARDS_UP_TO_TOKENS_PER_TEXT_TOKEN, HEAD_SHARDS_FROM_DEGREE). What stays above 1.00 "
                "for packed images is per-sample work outside the block (the text embedding, "
                "1/40 of it in the whole 40-block model) and smaller kernels.",
            )
            + copied(
                "h200/replay_sp_demo.csv",
                "The same on the CLI's demo mix",
                "benchmarks/replay_sp.py --data demo --worlds 8: the mix of `adaptiveload plan "
                "--demo` (joint-pretrain, 20,000 samples), otherwise as above.",
                "With one calibrated block, today's packed K = 4 plan already mixes this mix "
                "(the built-in full-depth 14B profile segregates it, 49% of steps without an "
                "image: docs/sampler.md).",
            )
            + ["![frontier, demo mix](results/h200/replay_sp_demo.png)", ""]
            + copied(
                "h100/replay_sp_packed_k1.csv",
                "Packed K = 1 with the lost-time bound, on an H100",
                "benchmarks/replay_sp.py --batches packed --ks 1 --worlds 8: packed K = 1 "
                "only, after mix_tolerance came to bound the time lost to waiting and to "
                "splitting (default 0.05 with sequence parallelism), calibration to measure "
                "what a share is weighed against, and cost models to price what a share keeps "
                "whole; otherwise as above, timed on an H100.",
                "The bound holds (0.968x today's at 0.05, within its 5%) and the planner "
                "prices what it plans (predicted = measured imbalance), but no tolerance tried gives "
                "both a shuffle's composition and 0.97x today's speed here.",
            )
            if read("h200/replay_sp.csv")
            or read("h100/replay_sp.csv")
            or read("h100/replay_sp_13b_d8.csv")
            else []
        ),
    ),
    ("Does the default train as a shuffle does (issue #54's fidelity benchmark)?", fidelity),
    ("What does the step order do to training?", convergence),
    ("How fast is rms_norm_modulate (LTX-Video's adaLN)?", rms_bandwidth),
    (
        "Which kernel choices did tuning measure, and what did each give?",
        lambda: copied(
            "h200/kernel_notes.csv",
            "Kernel tuning notes",
            "The measurements behind the choices the CUDA kernels' comments name (csrc/ops/cuda), "
            "taken on an H200 while the kernels were tuned (bf16 unless the row says otherwise, "
            "% of the copy bandwidth measured in the same run)",
        ),
    ),
    ("Which rms_norm_modulate kernel is fastest at LTX-Video's shapes?", rms_tuning),
    (
        "What do the fused ops save in a training step of each model family?",
        lambda: copied(
            "h200/family_step.csv",
            "Fused ops in a training step, per model family",
            "benchmarks/family_step.py: a random model of each family at a real training shape "
            "(bf16, activation checkpointing), forward and backward of the whole model with "
            "diffusers' blocks and with apply_fused_ops; fused_kernels_share_of_step: our "
            "kernels' GPU time over the fused step's (torch.profiler).",
            "Measured with the per-token kernels before the token16 forward rows.",
        ),
    ),
    (
        "How do the samplers compare under the cost model calibrated on the GPU?",
        lambda: copied(
            "cpu/sim_calibrated.csv",
            "8 ranks with the H200-calibrated cost model",
            "Cost model benchmarks/data/wan1.3b_4layers_h200_calibrated.json; 50,000 samples of "
            "the joint-pretrain mix.",
        ),
    ),
    (
        "How does planning scale with the epoch?",
        lambda: copied(
            "cpu/scale.csv",
            "Planning at scale, today (the baseline of issue 36)",
            "benchmarks/bench_scale.py: lengths of an image and video mix memory-mapped from a "
            ".npy, rank processes of one node started together, 1,024 ranks, K = 4: each plans "
            "the whole epoch before its first micro-batch and keeps it (peak memory includes "
            "the ~0.45 GiB of importing torch).",
            "The resume state holds two bits per sample (the excluded and consumed sets). "
            "StreamingBatchSampler (next section) is the sampler for such epochs.",
        ),
    ),
    (
        "How does a streamed plan scale?",
        lambda: copied(
            "cpu/scale_stream.csv",
            "Plans that stream",
            "benchmarks/bench_scale.py --stream: StreamingBatchSampler over int32 lengths of the "
            "same mix, memory-mapped from a .npy, 8 rank processes of one node started together "
            "(on this machine's 2 cores, so each time is about 4x what a core per process "
            "gives), 1,024 ranks, K = 4, default segments (at least 2^20 samples, whole "
            "windows). "
            "'table pass' is making the sampler (one pass over the lengths); the first "
            "micro-batch is timed from set_epoch and plans one segment; the rates are a rank's "
            "own micro-batches and samples per second while it iterates, a segment planned for "
            "all ranks whenever it reaches one. A process's own memory is its anonymous "
            "resident memory (about 0.3 GiB of it is importing torch); the node's adds the "
            "lengths file once (the page cache all processes read).",
            "The whole plan is the report path (segments(workers=2): a thread per core, one "
            "planner fewer while the next segment is cut), the least of 3 runs, as is numpy's "
            "permutation of as many samples, alternated in one process. 2026-12-05: the "
            "permutation computed a block of positions at a time in vector registers, the "
            "exchange index as trees of minima per cost (no walk through tied ranks) and the "
            "heaviest rank kept in a tree, lengths packed by counting while cutting, a "
            "segment's table built from its lengths' indices, windows sorted on cost ranks "
            "taken once; same plans. Before (2026-12-04, the same table's command): 0.95 s "
            "against 0.283 s at 1e7 (3.3x), 10.23 / 8.135 s at 1e8 (1.3x); first micro-batch "
            "3.71 / 4.57 / 3.23 s with 8 processes. Run to run on this machine the 1e7 ratio "
            "was 1.7-1.9x over three runs of the table's command on 2026-12-05 (numpy's "
            "permutation 0.36-0.40 s); the 8-process first micro-batch at 1e9 was 1.47-2.33 s "
            "with the file in the page cache and 4.08 s in a run that found it evicted (8 "
            "processes on 2 cores plan 8 segments at once: about 2 s of CPU per core). With 2 "
            "processes (a core each), 2026-12-05, at 1e7 (python benchmarks/bench_scale.py "
            "--stream --sizes 1e7 --procs 2 --k 4, then --k 1): whole plan 0.67-0.68 s "
            "against 0.39 s (1.7-1.8x) at K = 4, 0.57-0.64 s against 0.38-0.39 s (1.5-1.7x) "
            "at K = 1, over two runs each; first micro-batch 0.17-0.20 s (0.23 s before, "
            "0.32 s on 2026-12-04 morning); 5,800-6,100 samples/s per rank; at 1e8 / 1e9 "
            "(--sizes 1e8,1e9 --procs 2 --iterate 300, warm page cache) 0.21-0.28 / "
            "0.31-0.34 s (0.36 / 0.42 s on 2026-12-04), 3,500-5,300 / 3,000-4,300 samples/s, "
            "table pass 0.27 / 2.71 s. One thread, the C++ planner alone at 1e7 / K = 4: "
            "cutting 0.36 s (0.63 s before), planning 0.70-0.75 s (1.21 s), and the plans' "
            "digest unchanged. 2026-12-07, the table: the representative default "
            '(composition="representative", issue #54) measures 8 shuffles of each window '
            "and tries about 6 arrangements where the balanced rule tried one (1e7, K = 4: 9 "
            "windows, 133 candidates, 51 tried); with 2 processes at 1e7 (--procs 2 --k 4 "
            "--iterate 300) the whole plan took 2.30 s against 0.84 s (2.7x), the first "
            "micro-batch 0.60 s (0.61 s at 1e9), 762-766 samples/s per rank, 38x what a rank "
            'needs; composition="balanced" in one process, least of 4: first micro-batch '
            "0.16-0.26 s against the default's 0.25 s (K = 1) and 0.42 s (K = 4), after the "
            "shuffles were dealt rather than sorted (0.41 / 0.66 s before). "
            "Consumption assumed for the planning rate: an H200 trains at most about 20 "
            "samples/s of this mix, generously (an image through 3 of Wan 2.1-1.3B's 30 blocks "
            "alone takes about 55 ms forward and backward), so a rank needs 20 samples/s and a "
            "node of 8, 160; the "
            "whole plan of 1e9 samples was not timed (about 210 s at the 1e8 rate).",
        ),
    ),
    (
        "Do streamed plans balance and mix as whole-epoch plans do?",
        lambda: copied(
            "cpu/stream_vs_whole.csv",
            "Streamed plans against whole-epoch plans",
            "benchmarks/compare_stream.py: 1,000,000 samples of the held-out mix, planned "
            "whole (AdaptiveBatchSampler) and streamed in segments of at least 50,000 samples "
            "(StreamingBatchSampler; a segment then holds whole windows, so 7-19 segments), Wan "
            "2.1-1.3B plan-aware cost model of the H200, default settings; predicted imbalance, "
            "the composition distance of steps against a shuffle of the same micro-batches "
            "(tokens; < 1: more representative), and the share of steps without an image.",
            "Balance within 0.05 point and steps without an image within 0.1 point; streamed "
            "steps as representative at 8 ranks, K = 1 (0.88x against 0.87x a shuffle's "
            "distance) and more elsewhere (0.05-0.08 lower: 0.12x against 0.17x). An "
            "earlier rule (segments of whole steps, not whole windows) cut windows short at "
            "every segment's end, and a short last window of 200,000 samples failed to mix "
            "(23% of steps without an image at 64 ranks, K = 4): segments now hold whole "
            "windows, and a rest shorter than a segment joins the last.",
        ),
    ),
]


def render() -> str:
    lines = [
        "# Benchmark results",
        "",
        "Generated by `python benchmarks/make_results.py` from the raw numbers in",
        "`benchmarks/results/<machine>/*.csv`; each section names its command, machine and date.",
        "",
    ]
    done = [(question, section()) for question, section in SECTIONS]
    done = [(question, body) for question, body in done if body]  # benchmarks with results
    for question, _ in done:
        lines.append(f"- {question}")
    lines.append("")
    for _, body in done:
        lines += body
    return "\n".join(lines).rstrip() + "\n"


def main() -> int:
    text = render()
    with open(os.path.join(HERE, "RESULTS.md"), "w") as f:
        f.write(text)
    print(f"wrote benchmarks/RESULTS.md ({len(text.splitlines())} lines)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
