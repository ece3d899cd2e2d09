"""The arms of benchmarks/fidelity.py and one training run of each: the setups teams run
(packed or one sample per micro-batch, K = 4 or 1, at 8 or 64 ranks), the arms compared within
each (one table of sampler keywords), the order-only controls (an arm's own micro-batches dealt
to steps of the same sizes by a uniform permutation), the wiring checks, and ``train_run``: a
fixed number of optimizer steps, every rank's micro-batches of a step in one gradient."""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass

import numpy as np
import torch

from adaptiveload import AdaptiveBatchSampler
from fidelity_data import (
    SeedData,
    Size,
    build_model,
    learning_rate,
    step_loss_backward,
    validation_loss,
)
from fidelity_data import cost_model as scaled_cost_model

# Step structure -> (max_batch_size, K): micro-batches packed up to max_tokens (the longest
# sample) or of one sample, K per rank per step.
STRUCTURES: dict[str, tuple[int | None, int]] = {
    "packed_k4": (None, 4),
    "packed_k1": (None, 1),
    "b1_k4": (1, 4),
    "b1_k1": (1, 1),
}
RANKS = (8, 64)
SETUPS = tuple(f"{s}/w{w}" for w in RANKS for s in STRUCTURES)

# Arm -> (the sampler's keywords beyond the setup's, the arm whose micro-batches its control
# deals by a uniform shuffle). "default" passes none, so it follows the library's defaults.
ARMS: dict[str, tuple[dict, str]] = {
    "default": ({}, "default"),
    "segregated": ({"composition": "balanced", "mix_tolerance": 0.0}, "default"),
    "tolerance_0.1": ({"composition": "balanced", "mix_tolerance": 0.1}, "default"),
    "tolerance_1.0": ({"composition": "balanced", "mix_tolerance": 1.0}, "default"),
    "uneven": ({"uneven_counts": True}, "uneven"),
    "sp4": ({"uneven_counts": True, "sequence_parallel": 4}, "sp4"),
}
CONTROL = "shuffled"


def control_of(arm: str) -> str:
    """The name of an arm's control run: ``shuffled`` or ``shuffled(<source arm>)``."""
    source = ARMS[arm][1]
    return CONTROL if source == "default" else f"{CONTROL}({source})"


def runs_of(arms) -> list[str]:
    """The runs that compare ``arms``: each arm and its control, each once, controls first."""
    return list(dict.fromkeys([*(control_of(a) for a in arms), *arms]))


def source_of(run: str) -> tuple[str, bool]:
    """(the arm whose plan a run follows, whether it is that plan shuffled)."""
    if run == CONTROL:
        return "default", True
    if run.startswith(f"{CONTROL}("):
        return run[len(CONTROL) + 1 : -1], True
    return run, False


def sampler_keywords(arm: str) -> dict:
    """The arm's keywords, as ``AdaptiveBatchSampler`` takes them."""
    return dict(ARMS[arm][0])


def describe(setup: str, run: str) -> str:
    """The sampler of a run, as a reader would construct it."""
    structure, _ = setup.split("/")
    max_batch_size, k = STRUCTURES[structure]
    arm, shuffled = source_of(run)
    args = [f"micro_batches_per_step={k}"]
    if max_batch_size is not None:
        args.append(f"max_batch_size={max_batch_size}")
    args += [f"{key}={v!r}" for key, v in ARMS[arm][0].items()]
    sampler = f"AdaptiveBatchSampler({', '.join(args)})"
    return f"uniform shuffle of {sampler}'s micro-batches into its steps" if shuffled else sampler


def make_sampler(setup: str, arm: str, data: SeedData) -> AdaptiveBatchSampler:
    """The sampler of an arm: ``max_tokens`` is the longest sample, so that the longest clips
    run alone, as the longest do in a real mix; costs are Wan 14B's, rescaled."""
    structure, ranks = setup.split("/")
    max_batch_size, k = STRUCTURES[structure]
    return AdaptiveBatchSampler(
        data.seq_lens,
        int(data.seq_lens.max()),
        cost_model=scaled_cost_model(),
        group_keys=data.shapes,
        num_replicas=int(ranks[1:]),
        rank=0,  # every rank's micro-batches come from plan()
        micro_batches_per_step=k,
        seed=data.seed,
        max_batch_size=max_batch_size,
        **sampler_keywords(arm),
    )


# (sample indices, padding repeat) of one micro-batch; a step is a list of them, all ranks'.
MicroBatchRef = tuple[np.ndarray, bool]


def plan_steps(plan) -> list[list[MicroBatchRef]]:
    """Every step of the plan as its micro-batches, each once (a micro-batch split over ranks
    by sequence parallelism trains as the whole one: its member 0's listing)."""
    ids, step = plan.step_micro_batches()
    steps = [[] for _ in range(plan.num_steps)]
    for m, t in zip(ids.tolist(), step.tolist(), strict=True):
        steps[t].append(
            (plan.samples[plan.offsets[m] : plan.offsets[m + 1]], bool(plan.padding[m]))
        )
    return steps


def shuffled_steps(steps, rng: np.random.Generator) -> list[list[MicroBatchRef]]:
    """The same micro-batches in steps of the same sizes, dealt by a uniform permutation: what
    a plain shuffle would make of them."""
    flat = [mb for step in steps for mb in step]
    order = rng.permutation(len(flat))
    out, at = [], 0
    for step in steps:
        out.append([flat[i] for i in order[at : at + len(step)]])
        at += len(step)
    return out


def micro_batch_multiset(steps) -> Counter:
    return Counter((tuple(int(i) for i in idx), pad) for step in steps for idx, pad in step)


# A stream of the shuffle's generator apart from the planner's (seed, epoch) stream.
SHUFFLE_STREAM = 54


class RunPlans:
    """The steps of each epoch of one run, for one seed: its arm's plan, or that plan's
    micro-batches shuffled (checked to hold exactly them, in steps of the same sizes)."""

    def __init__(self, setup: str, run: str, data: SeedData, cache: dict | None = None):
        self.setup, self.run, self.data, self.seed = setup, run, data, data.seed
        self.arm, self.shuffled = source_of(run)
        # (setup, arm, epoch) -> its plan's steps: an arm and its control plan once
        self.cache = {} if cache is None else cache
        self.sampler = None

    def planned(self, epoch: int) -> list[list[MicroBatchRef]]:
        key = (self.setup, self.arm, epoch)
        if key not in self.cache:
            if self.sampler is None:
                self.sampler = make_sampler(self.setup, self.arm, self.data)
            self.sampler.set_epoch(epoch)
            self.cache[key] = plan_steps(self.sampler.plan())
        return self.cache[key]

    def epoch(self, epoch: int) -> list[list[MicroBatchRef]]:
        steps = self.planned(epoch)
        if not self.shuffled:
            return steps
        shuffled = shuffled_steps(steps, np.random.default_rng([self.seed, epoch, SHUFFLE_STREAM]))
        if micro_batch_multiset(shuffled) != micro_batch_multiset(steps) or [
            len(s) for s in shuffled
        ] != [len(s) for s in steps]:
            raise RuntimeError(f"{self.run}: the shuffle lost or changed a micro-batch")
        return shuffled

    def steps(self, total: int):
        """``(epoch, step)`` for the first ``total`` optimizer steps, epoch after epoch."""
        done, epoch = 0, 0
        while done < total:
            for step in self.epoch(epoch)[: total - done]:
                yield epoch, step
                done += 1
            epoch += 1


def step_samples(step) -> np.ndarray:
    """A step's samples, padding repeats included (they train as the plan counts them)."""
    return np.concatenate([idx for idx, _ in step])


def mixed(step, data: SeedData) -> bool:
    """Whether the step holds images and clips."""
    return len({bool(v) for v in data.is_image()[step_samples(step)]}) == 2


def check_wiring(setup: str, runs, data: SeedData, epochs=(0, 1), cache=None) -> dict:
    """Per run and epoch: every step's micro-batches hold one shape each, every sample trains
    once an epoch (padding repeats aside), at batch size 1 one sample per micro-batch; each
    control holds exactly its arm's micro-batches in steps of the same sizes. Raises
    ``RuntimeError`` on a miss; returns per run its steps per epoch and share of mixed steps."""
    structure, _ = setup.split("/")
    max_batch_size, _ = STRUCTURES[structure]
    found, plans = {}, {}
    for run in runs:
        per_epoch = [RunPlans(setup, run, data, cache).epoch(e) for e in epochs]
        plans[run] = per_epoch
        for epoch, steps in zip(epochs, per_epoch, strict=True):
            where = f"{setup} {run}, epoch {epoch}"
            trained = []
            for step in steps:
                for idx, pad in step:
                    if not len(idx) or (data.shapes[idx] != data.shapes[idx[0]]).any():
                        raise RuntimeError(f"{where}: a micro-batch mixes shapes")
                    if max_batch_size == 1 and len(idx) != 1:
                        raise RuntimeError(f"{where}: a micro-batch of {len(idx)} samples")
                    if not pad:
                        trained.append(idx)
            if not np.array_equal(np.sort(np.concatenate(trained)), np.arange(len(data))):
                raise RuntimeError(f"{where}: not every sample once")
        found[run] = {
            "steps_per_epoch": [len(s) for s in per_epoch],
            "mixed_steps": round(float(np.mean([mixed(s, data) for s in per_epoch[0]])), 4),
        }
    for run in runs:
        arm, shuffled = source_of(run)
        if shuffled and arm in plans:
            for a, c in zip(plans[arm], plans[run], strict=True):
                if micro_batch_multiset(a) != micro_batch_multiset(c):
                    raise RuntimeError(f"{setup} {run}: not {arm}'s micro-batches")
                if [len(s) for s in a] != [len(s) for s in c]:
                    raise RuntimeError(f"{setup} {run}: steps of other sizes than {arm}'s")
    return found


# -- one run ----------------------------------------------------------------------------------


def run_steps(setup: str, run: str, data: SeedData, size: Size, cache=None) -> list[tuple]:
    """The run's ``size.steps`` optimizer steps as ``(epoch, micro-batches)``."""
    return list(RunPlans(setup, run, data, cache).steps(size.steps))


def fingerprint(steps) -> int:
    """Equal for two runs whose every step trains the same samples in the same epoch (so the
    same draws): such runs train alike, and one of them stands for both."""
    return hash(tuple((epoch, tuple(np.sort(step_samples(s)).tolist())) for epoch, s in steps))


@dataclass
class RunResult:
    rows: list[dict]
    #: the learning rate of every step
    lrs: list[float]


def train_run(setup: str, run: str, steps, data: SeedData, size: Size) -> RunResult:
    """One run of ``steps`` (``run_steps``): AdamW from the seed's initial weights, the
    learning rate by step; a row per evaluation (``size.evals`` evenly spaced, the last at the
    end)."""
    t_start = time.perf_counter()
    model = build_model(size, data.seed, data.device)
    fused = data.device.type == "cuda"
    optimizer = torch.optim.AdamW(model.parameters(), lr=size.lr, weight_decay=0.0, fused=fused)
    evals = {round(size.steps * (i + 1) / size.evals) for i in range(size.evals)}
    rows, lrs, losses = [], [], []
    state = dict(samples=0, tokens=0, micro_batches=0, mixed=0)
    for i, (epoch, step) in enumerate(steps):
        lr = learning_rate(size, i)
        lrs.append(lr)
        for group in optimizer.param_groups:
            group["lr"] = lr
        samples = step_samples(step)
        losses.append(step_loss_backward(model, data.batches(samples, epoch)))
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        state["samples"] += len(samples)
        state["tokens"] += int(data.seq_lens[samples].sum())
        state["micro_batches"] += len(step)
        state["mixed"] += mixed(step, data)
        if i + 1 in evals:
            val = validation_loss(model, data)
            rows.append(
                {
                    "setup": setup,
                    "run": run,
                    "seed": data.seed,
                    "steps": i + 1,
                    "epoch": epoch,
                    "lr": round(lr, 8),
                    "samples_seen": state["samples"],
                    "tokens_seen": state["tokens"],
                    "micro_batches": state["micro_batches"],
                    "mixed_steps": round(state["mixed"] / (i + 1), 4),
                    "train_loss": round(float(torch.stack(losses).mean()), 6),
                    "wall_s": round(time.perf_counter() - t_start, 2),
                }
                | {f"val_{m}": round(v, 6) for m, v in val.items()}
                | {"val_mean": round(float(np.mean(list(val.values()))), 6)}
            )
            losses.clear()
    return RunResult(rows, lrs)


# One seed's data per worker process, rebuilt from (size, seed, device) as the main process
# built it (SeedData draws everything from the seed), so a worker trains what it would.
_WORKER_DATA: dict = {}


def train_job(setup: str, run: str, steps, size: Size, seed: int, device: str) -> RunResult:
    """``train_run`` in a worker process (fidelity.py ``--workers``)."""
    key = (repr(size), seed, device)  # Size holds a dict: not hashable
    if key not in _WORKER_DATA:
        _WORKER_DATA.clear()
        _WORKER_DATA[key] = SeedData(size, seed, device)
    return train_run(setup, run, steps, _WORKER_DATA[key], size)
