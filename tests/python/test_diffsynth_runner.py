"""``adaptiveload.integrations.diffsynth_runner.launch_training_task`` against DiffSynth-Studio
2.1.12's own ``launch_training_task``, on a tiny DiffSynth ``WanModel`` in float64 on CPU:

- 1 process, DiffSynth's shuffle replaced by our sampler's order: the same losses and the same
  final weights (also as DiffSynth's ``ModelLogger`` saves them);
- 2 gloo processes, in float32, sequence parallelism on (the default) and off: every sample
  trained once per epoch (a split micro-batch once; with it on, the samples too long for one
  process and others split), and the losses and final weights those of the same plan's steps
  computed on one process, unsplit.

This file is also the script torchrun starts: ``python -m torch.distributed.run ... THIS
SCENARIO OUT_DIR``."""

from __future__ import annotations

import collections
import importlib.util
import os
import sys

import pytest
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
EXAMPLE = os.path.join(os.path.dirname(os.path.dirname(HERE)), "examples", "train_diffsynth.py")
SAMPLES, K, EPOCHS, SEED, LR = 8, 2, 2, 5, 1e-3
# The sampler plans by these lengths (the data is tiny): every fourth sample is too long for
# one process (max_tokens), so the 2-process run splits it.
LONG, SHORT, MAX_TOKENS = 75600, 1560, 40000


def example():
    spec = importlib.util.spec_from_file_location("train_diffsynth", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def parts(ex, dtype=torch.float64):
    """The tiny model (float64) in a training module that records the samples it sees and
    draws its loss's timestep and noise from (call, sample), whatever loop runs it."""

    class Recorded(ex.WanTrainingModule):
        def forward(self, data):
            if self.reseed:
                torch.manual_seed(1000 * len(self.seen) + int(data["index"]))
            self.seen.append(int(data["index"]))
            return super().forward(data)

    model = Recorded(ex.build_dit("tiny", seed=SEED).to(dtype), dtype)
    model.seen, model.reseed = [], True
    return model, ex.CachedLatents(SAMPLES, "tiny", "tiny", SEED)


def weights(model):
    return {n: p.detach().clone() for n, p in model.dit.named_parameters()}


def logger_class():
    from diffsynth.diffusion.logger import ModelLogger

    class Losses(ModelLogger):
        def on_step_end(self, accelerator, model, save_steps=None, **kw):
            super().on_step_end(accelerator, model, save_steps, loss=kw["loss"])
            self.records.append({k: v for k, v in kw.items() if k != "loss"})
            self.records[-1]["loss"] = kw["loss"].item()
            mb = kw.get("micro_batch")
            if mb is not None:
                self.records[-1]["micro_batch"] = [mb.step, mb.degree, mb.member, mb.step_samples]

    return Losses


class FixedOrder(torch.utils.data.Sampler):
    """Epoch after epoch, the orders given."""

    def __init__(self, orders):
        self.orders = iter(orders)

    def __iter__(self):
        return iter(next(self.orders))

    def __len__(self):
        return SAMPLES


def equivalence(out_dir):
    """Ours on 1 process (no split, no fused ops), then DiffSynth's in the order ours drew."""
    from accelerate import Accelerator
    from diffsynth.diffusion import runner

    from adaptiveload.integrations.diffsynth_runner import launch_training_task

    ex, Losses, result = example(), logger_class(), {}
    model, data = parts(ex)
    logger = Losses(os.path.join(out_dir, "ours"))
    logger.records = []
    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=K)
    launch_training_task(
        accelerator, data, model, logger, learning_rate=LR, num_workers=0,
        num_epochs=EPOCHS, seq_lens=data.shapes, seed=SEED, fused_ops=False,
    )  # fmt: skip
    result["ours"] = {"seen": model.seen, "records": logger.records, "weights": weights(model)}
    orders = [model.seen[e * SAMPLES : (e + 1) * SAMPLES] for e in range(EPOCHS)]

    real = torch.utils.data.DataLoader

    class InOurOrder(real):
        def __init__(self, dataset, shuffle, collate_fn, num_workers):
            assert shuffle  # DiffSynth's shuffle, replaced by the order ours drew
            super().__init__(dataset, sampler=FixedOrder(orders), collate_fn=collate_fn)

    model, data = parts(ex)
    logger = Losses(os.path.join(out_dir, "theirs"))
    logger.records = []
    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=K)
    torch.utils.data.DataLoader = InOurOrder
    try:
        runner.launch_training_task(
            accelerator, data, model, logger, learning_rate=LR, num_workers=0,
            num_epochs=EPOCHS,
        )  # fmt: skip
    finally:
        torch.utils.data.DataLoader = real
    result["theirs"] = {"seen": model.seen, "records": logger.records, "weights": weights(model)}
    return result


def split(out_dir, sequence_parallel):
    """Ours on 2 processes with the planning lengths above, in float32 (the members' check of
    a split micro-batch takes float32 and narrower)."""
    from accelerate import Accelerator

    from adaptiveload.integrations.diffsynth_runner import launch_training_task

    ex, Losses = example(), logger_class()
    model, data = parts(ex, torch.float32)
    model.reseed = False  # the function's seeding of (seed, epoch, sample) alone
    init = weights(model)
    logger = Losses(os.path.join(out_dir, "split"))
    logger.records = []
    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=K)
    lengths = [LONG if i % 4 == 0 else SHORT for i in range(SAMPLES)]
    launch_training_task(
        accelerator, data, model, logger, learning_rate=LR, num_workers=0,
        num_epochs=EPOCHS, seq_lens=lengths, seed=SEED, fused_ops=False,
        sequence_parallel=sequence_parallel,
        sampler_options={"max_tokens": MAX_TOKENS} if sequence_parallel else None,
    )  # fmt: skip
    return {"records": logger.records, "weights": weights(model), "init": init}


def main(scenario, out_dir):
    rank = int(os.environ.get("RANK", "0"))
    if scenario == "equivalence":
        result = equivalence(out_dir)
    else:
        result = split(out_dir, "auto" if scenario == "split" else False)
    torch.save(result, os.path.join(out_dir, f"{scenario}_{rank}.pt"))
    if torch.distributed.is_initialized():
        torch.distributed.barrier()  # see examples/train_diffsynth.py
        torch.distributed.destroy_process_group()


def run(scenario, tmp_path, nproc):
    from processes import torchrun

    torchrun(__file__, scenario, tmp_path, nproc=nproc, timeout=600)
    return [torch.load(tmp_path / f"{scenario}_{r}.pt") for r in range(nproc)]


def close(a, b, rtol=1e-9, atol=1e-12):
    assert a.keys() == b.keys()
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=rtol, atol=atol, msg=name)


@pytest.mark.distributed
def test_same_losses_and_weights_as_diffsynths_launch_training_task(tmp_path):
    pytest.importorskip("diffsynth.diffusion.runner")
    from safetensors.torch import load_file

    (r,) = run("equivalence", tmp_path, 1)
    ours, theirs = r["ours"], r["theirs"]
    for e in range(EPOCHS):  # our sampler: every sample once per epoch, K per step
        assert sorted(ours["seen"][e * SAMPLES : (e + 1) * SAMPLES]) == list(range(SAMPLES))
    assert all(rec["micro_batch"][3] == K for rec in ours["records"])
    assert theirs["seen"] == ours["seen"]
    assert [x["loss"] for x in theirs["records"]] == pytest.approx(
        [x["loss"] for x in ours["records"]], rel=1e-12
    )
    close(ours["weights"], theirs["weights"])
    assert any(not torch.equal(ours["weights"][n], v) for n, v in weights_at_start().items())
    # DiffSynth's ModelLogger saved the same trainable weights at each epoch's end.
    for e in range(EPOCHS):
        name = f"epoch-{e}.safetensors"
        close(load_file(tmp_path / "ours" / name), load_file(tmp_path / "theirs" / name))


def weights_at_start():
    model, _ = parts(example())
    return weights(model)


def reference(records, init):
    """The steps the 2 processes ran, on one process, unsplit: each micro-batch once, its
    loss over the step's samples; AdamW, and DiffSynth's ConstantLR stepped per process."""
    ex = example()
    model, data = parts(ex, torch.float32)
    model.reseed = False
    with torch.no_grad():
        for n, p in model.dit.named_parameters():
            p.copy_(init[n])
    optimizer = torch.optim.AdamW(model.trainable_modules(), lr=LR, weight_decay=1e-2)
    scheduler = torch.optim.lr_scheduler.ConstantLR(optimizer)
    steps = collections.defaultdict(list)  # (epoch, step) -> [(sample, step_samples)]
    for rec in (x for rank in records for x in rank):
        step, degree, member, step_samples = rec["micro_batch"]
        if member == 0:
            steps[(rec["epoch"], step)].append((rec["sample"], step_samples))
    losses = {}
    for (epoch, _), mbs in sorted(steps.items()):
        assert all(n == len(mbs) for _, n in mbs), "step_samples counts a split micro-batch once"
        for sample in sorted(s for s, _ in mbs):
            torch.manual_seed(SEED * 1_000_003 + epoch * 7_919 + sample)
            loss = model(data[sample])
            (loss / len(mbs)).backward()
            losses[(epoch, sample)] = loss.item()
        optimizer.step()
        for _ in range(2):  # accelerate steps the scheduler once per process
            scheduler.step()
        optimizer.zero_grad()
    return losses, weights(model)


@pytest.mark.distributed
@pytest.mark.parametrize("scenario", ["split", "unsplit"])
def test_two_processes_train_every_sample_once_as_one_process(tmp_path, scenario):
    pytest.importorskip("diffsynth.diffusion.runner")
    per_rank = run(scenario, tmp_path, 2)
    records = [r["records"] for r in per_rank]
    for e in range(EPOCHS):
        once = collections.Counter(
            x["sample"] for rank in records for x in rank
            if x["epoch"] == e and x["micro_batch"][2] == 0
        )  # fmt: skip
        assert once == collections.Counter(range(SAMPLES)), f"epoch {e}"
    degrees = [x["micro_batch"][1] for rank in records for x in rank]
    if scenario == "split":
        assert 2 in degrees, "no micro-batch was split"
        split_samples = {x["sample"] for rank in records for x in rank if x["micro_batch"][1] == 2}
        assert split_samples >= {i for i in range(SAMPLES) if i % 4 == 0}  # too long for one
    else:
        assert set(degrees) == {1}
    losses, final = reference(records, per_rank[0]["init"])
    for rank in records:
        for x in rank:
            assert x["loss"] == pytest.approx(losses[(x["epoch"], x["sample"])], rel=1e-5)
    for r in per_rank:  # float32: the split sums in another order (seen: 1e-7 of changes 2e-3)
        close(r["weights"], final, rtol=1e-4, atol=1e-6)


if __name__ == "__main__":
    sys.path.insert(0, HERE)
    main(sys.argv[1], sys.argv[2])
