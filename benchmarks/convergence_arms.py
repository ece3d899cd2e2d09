"""The arms of benchmarks/convergence_wan.py and one training run of each: the step structures
(packed or one sample per micro-batch, K = 4 or 1, for 8 simulated ranks), the orders compared
within each (the default plan, the segregated plan, and the control: the default plan's own
micro-batches dealt to steps by a uniform shuffle), the wiring checks that make the comparisons
ones of order only, the DDP step simulated on one device, and the conflict run (item 4 of
issue #34: does training on one modality undo the other?)."""

from __future__ import annotations

import math
import time
from collections import Counter
from dataclasses import dataclass

import numpy as np
import torch

from adaptiveload import AdaptiveBatchSampler
from convergence_data import (
    PATCH,
    Setup,
    TrainSet,
    ValSet,
    learning_rate,
    loss_sum,
)
from fidelity_arms import STRUCTURES  # the step structures: one table for both benchmarks
from fidelity_data import build_model

# The orders of one structure; each is compared with the control, "shuffled".
ORDERS = ("default", "segregated", "shuffled")
CONTROL = "shuffled"
NORMALIZATIONS = ("tokens", "samples")
# A stream of the shuffle's generator apart from the planner's (seed, epoch) stream.
SHUFFLE_STREAM = 34

# (rank, sample indices, padding repeat) of one micro-batch; a step is W x K of them.
MicroBatchRef = tuple[int, np.ndarray, bool]


def describe(structure: str, order: str) -> str:
    """The sampler of an arm, as a reader would construct it."""
    max_batch_size, _ = STRUCTURES[structure]
    args = [] if max_batch_size is None else [f"max_batch_size={max_batch_size}"]
    if order == "segregated":
        args.append("mix_tolerance=0.0")
    sampler = f"AdaptiveBatchSampler({', '.join(args)})"
    if order == CONTROL:
        return f"uniform shuffle of {sampler}'s micro-batches into its steps"
    return sampler


def make_planner(structure: str, order: str, data: TrainSet, ranks: int, seed: int):
    """The planner of an arm (the control's is the default one): ``max_tokens`` is the longest
    sample, so that the longest clips run alone, as the longest do in a real mix."""
    max_batch_size, k = STRUCTURES[structure]
    kwargs = {"mix_tolerance": 0.0} if order == "segregated" else {}
    return AdaptiveBatchSampler(
        data.seq_lens,
        int(data.seq_lens.max()),
        group_keys=data.shapes,
        num_replicas=ranks,
        rank=0,  # every rank's micro-batches come from plan()
        micro_batches_per_step=k,
        seed=seed,
        max_batch_size=max_batch_size,
        **kwargs,
    )


def plan_steps(plan) -> list[list[MicroBatchRef]]:
    """Every step of the plan as its micro-batches, rank by rank."""
    return [
        [
            (r, plan.micro_batch(t, r, k), bool(plan.padding[plan.micro_batch_id(t, r, k)]))
            for r in range(plan.num_replicas)
            for k in range(plan.micro_batches_in_step(t, r))
        ]
        for t in range(plan.num_steps)
    ]


def shuffled_steps(steps, k: int, rng: np.random.Generator) -> list[list[MicroBatchRef]]:
    """The same micro-batches in as many steps of as many micro-batches, assigned to steps
    (and ranks, K each) by a uniform permutation: what a plain shuffle would make of them."""
    per_step = len(steps[0])
    if any(len(s) != per_step for s in steps):
        raise ValueError("the shuffle deals W x K micro-batches to every step")
    flat = [(idx, pad) for step in steps for _, idx, pad in step]
    order = rng.permutation(len(flat))
    return [
        [(j // k, *flat[order[t * per_step + j]]) for j in range(per_step)]
        for t in range(len(steps))
    ]


def micro_batch_multiset(steps) -> Counter:
    return Counter((tuple(int(i) for i in idx), pad) for step in steps for _, idx, pad in step)


class ArmPlans:
    """The steps of each epoch of one arm, for one seed."""

    def __init__(self, structure: str, order: str, data: TrainSet, ranks: int, seed: int):
        self.structure, self.order, self.seed = structure, order, seed
        self.k = STRUCTURES[structure][1]
        self.planner = make_planner(structure, order, data, ranks, seed)

    def epoch(self, epoch: int) -> list[list[MicroBatchRef]]:
        self.planner.set_epoch(epoch)
        steps = plan_steps(self.planner.plan())
        if self.order != CONTROL:
            return steps
        rng = np.random.default_rng([self.seed, epoch, SHUFFLE_STREAM])
        shuffled = shuffled_steps(steps, self.k, rng)
        if micro_batch_multiset(shuffled) != micro_batch_multiset(steps):
            raise RuntimeError("the shuffled arm lost or changed a micro-batch")
        return shuffled


def mixed(step, data: TrainSet) -> bool:
    """Whether the step holds images and clips."""
    return len({bool(data.is_image()[idx[0]]) for _, idx, _ in step}) == 2


def check_wiring(data: TrainSet, ranks: int, seed: int, epochs=(0, 1)) -> dict:
    """Checks, per structure and epoch, that the arms differ in order only: the control holds
    exactly the default plan's micro-batches in as many steps; every arm's steps hold W x K
    micro-batches of one shape each and train every sample once (padding repeats aside); at
    batch size 1 every micro-batch is one sample. Raises ``RuntimeError`` on a miss; returns
    per structure what it found, with whether the segregated plan holds the default plan's
    micro-batches too (it does when the planner packs before it orders, not required)."""
    found = {}
    for structure, (max_batch_size, k) in STRUCTURES.items():
        facts = {"steps": {}, "mixed_steps": {}, "segregated_same_micro_batches": True}
        for epoch in epochs:
            steps = {o: ArmPlans(structure, o, data, ranks, seed).epoch(epoch) for o in ORDERS}
            for order, arm in steps.items():
                where = f"{structure}/{order}, epoch {epoch}"
                trained = []
                for step in arm:
                    if len(step) != ranks * k or [r for r, _, _ in step] != sorted(
                        r for r in range(ranks) for _ in range(k)
                    ):
                        raise RuntimeError(f"{where}: a step is not W x K micro-batches")
                    for _, idx, pad in step:
                        if not len(idx) or (data.shapes[idx] != data.shapes[idx[0]]).any():
                            raise RuntimeError(f"{where}: a micro-batch mixes shapes")
                        if max_batch_size == 1 and len(idx) != 1:
                            raise RuntimeError(f"{where}: a micro-batch of {len(idx)} samples")
                        if not pad:
                            trained.append(idx)
                if not np.array_equal(np.sort(np.concatenate(trained)), np.arange(len(data))):
                    raise RuntimeError(f"{where}: not every sample once")
                facts["steps"].setdefault(order, []).append(len(arm))
                facts["mixed_steps"].setdefault(order, []).append(
                    float(np.mean([mixed(s, data) for s in arm]))
                )
            default = micro_batch_multiset(steps["default"])
            if len(steps[CONTROL]) != len(steps["default"]):
                raise RuntimeError(f"{structure}, epoch {epoch}: the control's step count differs")
            if micro_batch_multiset(steps[CONTROL]) != default:
                raise RuntimeError(
                    f"{structure}, epoch {epoch}: the control's micro-batches differ"
                )
            if [len(s) for s in steps[CONTROL]] != [len(s) for s in steps["default"]]:
                raise RuntimeError(
                    f"{structure}, epoch {epoch}: the control's steps differ in size"
                )
            same = micro_batch_multiset(steps["segregated"]) == default
            facts["segregated_same_micro_batches"] &= same
        found[structure] = facts
    return found


# -- one run ----------------------------------------------------------------------------------


@dataclass
class Context:
    """What every run of a process shares: the setup, the data, the device, the ranks."""

    setup: Setup
    data: TrainSet
    val: ValSet
    device: torch.device
    ranks: int


def step_normalizer(step, data: TrainSet, normalization: str, elements_per_token: int) -> float:
    """The step's latent elements over all ranks (``tokens``: a loss averaged over tokens), or
    its samples over all ranks (``samples``: each sample's mean, averaged), padding repeats
    included as the plan counts them (``Plan.step_tokens``, ``Plan.step_samples``)."""
    if normalization == "tokens":
        return float(sum(int(data.seq_lens[idx].sum()) for _, idx, _ in step) * elements_per_token)
    return float(sum(len(idx) for _, idx, _ in step))


def val_losses(val: ValSet, model) -> dict[str, float]:
    """The row's ``val_image`` and ``val_clip``, to 6 decimals (as the CSV keeps them)."""
    return {f"val_{m}": round(v, 6) for m, v in val.loss(model).items()}


def accumulate_step(model, micro_batches, normalization: str, normalizer: float) -> torch.Tensor:
    """Forward+backward of each micro-batch, accumulating the gradient of ``loss_sum /
    normalizer``: DDP's averaged gradient times W. Returns the step's loss, on the device."""
    total = 0.0
    for inputs in micro_batches:
        loss = loss_sum(model, inputs, normalization) / normalizer
        loss.backward()
        total = total + loss.detach()
    return total


def train_run(structure: str, order: str, normalization: str, seed: int, ctx: Context):
    """One arm, one normalization, one seed: the structure's schedule from the seed's initial
    weights; one row per evaluation (before training, ``evals_per_epoch`` times per epoch by
    samples seen, and at the end)."""
    t_start = time.perf_counter()
    setup, data = ctx.setup, ctx.data
    schedule = setup.schedules[structure]
    model = build_model(setup, seed, ctx.device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=schedule.lr, weight_decay=0.0)
    plans = ArmPlans(structure, order, data, ctx.ranks, seed)
    elements = setup.model["out_channels"] * math.prod(PATCH)
    every = len(data) / schedule.evals_per_epoch
    total = schedule.epochs * len(data)
    state = dict(steps=0, samples=0, tokens=0, micro_batches=0, mixed=0)
    losses, rows = [], []

    def log(epoch):
        rows.append(
            {
                "structure": structure,
                "order": order,
                "normalization": normalization,
                "seed": seed,
                "lr": schedule.lr,
                "epoch": epoch,
                "steps": state["steps"],
                "samples_seen": state["samples"],
                "tokens_seen": state["tokens"],
                "micro_batches": state["micro_batches"],
                "mixed_steps": round(state["mixed"] / max(state["steps"], 1), 4),
                "train_loss": round(float(torch.stack(losses).mean()), 6) if losses else "",
                "wall_s": round(time.perf_counter() - t_start, 2),
            }
            | val_losses(ctx.val, model)
        )
        losses.clear()

    log(0)
    next_eval = every
    for epoch in range(schedule.epochs):
        steps = plans.epoch(epoch)
        for i, step in enumerate(steps):
            lr = learning_rate(setup, schedule.lr, state["samples"], total)
            for group in optimizer.param_groups:
                group["lr"] = lr
            inputs = [data.inputs(idx, epoch, seed) for _, idx, _ in step]
            norm = step_normalizer(step, data, normalization, elements)
            losses.append(accumulate_step(model, inputs, normalization, norm))
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            state["steps"] += 1
            state["samples"] += sum(len(idx) for _, idx, _ in step)
            state["tokens"] += sum(int(data.seq_lens[idx].sum()) for _, idx, _ in step)
            state["micro_batches"] += len(step)
            state["mixed"] += mixed(step, data)
            if state["samples"] >= next_eval or (
                epoch == schedule.epochs - 1 and i == len(steps) - 1
            ):
                log(epoch)
                next_eval = (math.floor(state["samples"] / every) + 1) * every
    return rows


# -- the conflict run -------------------------------------------------------------------------


def gradient(model, data: TrainSet, indices, seed: int) -> torch.Tensor:
    """The flattened gradient of the mean per-sample loss over ``indices`` (one shape at a
    time), at fixed noise."""
    model.zero_grad(set_to_none=True)
    shapes = {tuple(s) for s in data.shapes[indices]}
    for shape in shapes:
        same = indices[(data.shapes[indices] == shape).all(axis=1)]
        (loss_sum(model, data.inputs(same, 0, seed), "samples") / len(indices)).backward()
    flat = torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])
    model.zero_grad(set_to_none=True)
    return flat


def conflict_run(seed: int, ctx: Context, probe: int = 64) -> list[dict]:
    """Do the two modalities pull the parameters apart? The b1_k1 control (shuffled samples,
    W x 1 per step, ``samples`` normalization) trains for half its schedule; from there three
    branches of half as many steps again: clips only, images only, and the same shuffled mix.
    Rows: validation losses at the branch point and along each branch, and at the branch
    point the cosine between the gradients of ``probe`` training images and ``probe`` clips
    (below 0: they pull the shared parameters in opposite directions)."""
    setup, data = ctx.setup, ctx.data
    schedule = setup.schedules["b1_k1"]
    model = build_model(setup, seed, ctx.device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=schedule.lr, weight_decay=0.0)
    plans = ArmPlans("b1_k1", CONTROL, data, ctx.ranks, seed)
    per_step = ctx.ranks * STRUCTURES["b1_k1"][1]
    warm = schedule.epochs * len(data) // per_step // 2
    branch_steps = max(warm // 2, 1)
    elements = setup.model["out_channels"] * math.prod(PATCH)

    def train(step, epoch, n_done):
        lr = learning_rate(setup, schedule.lr, min(n_done, warm) * per_step, 2 * warm * per_step)
        for group in optimizer.param_groups:
            group["lr"] = lr
        inputs = [data.inputs(idx, epoch, seed) for _, idx, _ in step]
        accumulate_step(model, inputs, "samples", step_normalizer(step, data, "samples", elements))
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    done, epoch = 0, 0
    while done < warm:
        for step in plans.epoch(epoch)[: warm - done]:
            train(step, epoch, done)
            done += 1
        epoch += 1
    rng = np.random.default_rng([seed, SHUFFLE_STREAM, 1])
    images, clips = np.flatnonzero(data.is_image()), np.flatnonzero(~data.is_image())
    g_image = gradient(
        model, data, rng.choice(images, min(probe, len(images)), replace=False), seed
    )
    g_clip = gradient(model, data, rng.choice(clips, min(probe, len(clips)), replace=False), seed)
    cosine = round(float(g_image @ g_clip / (g_image.norm() * g_clip.norm())), 6)
    start = val_losses(ctx.val, model)
    rows = [{"seed": seed, "branch": "start", "steps": done, "grad_cosine": cosine} | start]
    saved = (
        {k: v.clone() for k, v in model.state_dict().items()},
        _clone_optimizer_state(optimizer.state_dict()),
    )
    pools = {"clips only": clips, "images only": images, "mixed": np.arange(len(data))}
    for branch, pool in pools.items():
        model.load_state_dict(saved[0])
        optimizer.load_state_dict(_clone_optimizer_state(saved[1]))
        draw = np.concatenate(
            [rng.permutation(pool) for _ in range(-(-branch_steps * per_step // len(pool)))]
        )
        for b in range(branch_steps):
            idx = draw[b * per_step : (b + 1) * per_step]
            passes = epoch + 1 + b * per_step // len(pool)  # fresh noise on each pass
            train([(j, idx[j : j + 1], False) for j in range(per_step)], passes, done + b)
            if (b + 1) % max(branch_steps // 4, 1) == 0 or b == branch_steps - 1:
                rows.append(
                    {"seed": seed, "branch": branch, "steps": done + b + 1, "grad_cosine": ""}
                    | val_losses(ctx.val, model)
                )
    return rows


def _clone_optimizer_state(state: dict) -> dict:
    return {
        "state": {
            k: {n: v.clone() if torch.is_tensor(v) else v for n, v in s.items()}
            for k, s in state["state"].items()
        },
        "param_groups": [dict(g) for g in state["param_groups"]],
    }
