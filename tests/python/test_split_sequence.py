"""Sequence parallelism per micro-batch, trained (adaptiveload.parallel): a sample split over d
gloo ranks gives the loss and every gradient of the same sample processed whole by one process
(fp32, relative error <= 1e-5), lengths divisible by d and not, in a step mixing degrees, under
DDP; and one member's share runs on one device (``ONE_DEVICE``, what the replay times)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.distributed as dist

from adaptiveload.parallel import ONE_DEVICE, SequenceParallelGroups, split_sequence
from processes import run_on_ranks

# Tiny Wan: 4 heads (d = 2 and 4 divide them), latent 4 x (f, h, w) -> f * h/2 * w/2 tokens.
SHAPES = {
    "even": (3, 8, 8),  # 48 tokens: divisible by 2 and 4
    "odd": (3, 6, 10),  # 45 tokens: divisible by neither
}


def _model(seed=0):
    from diffusers import WanTransformer3DModel

    torch.manual_seed(seed)
    return WanTransformer3DModel(
        patch_size=(1, 2, 2), num_attention_heads=4, attention_head_dim=12, in_channels=4,
        out_channels=4, text_dim=32, freq_dim=32, ffn_dim=64, num_layers=2,
    )  # fmt: skip


def _inputs(model, shape, seed):
    g = torch.Generator().manual_seed(seed)
    f, h, w = shape
    cfg = model.config
    return {
        "hidden_states": torch.randn(1, cfg.in_channels, f, h, w, generator=g),
        "timestep": torch.rand(1, generator=g) * 1000,
        "encoder_hidden_states": torch.randn(1, 7, cfg.text_dim, generator=g),
    }


def _loss(model, inputs, target):
    out = model(**inputs, return_dict=False)[0]
    return ((out.float() - target) ** 2).mean()


def _reference(shape_names, seed):
    """Losses and summed gradients of the micro-batches processed whole, one process."""
    model = _model()
    losses = []
    for i, name in enumerate(shape_names):
        inputs = _inputs(model, SHAPES[name], seed + i)
        target = torch.full_like(inputs["hidden_states"], 0.5).float()
        loss = _loss(model, inputs, target)
        loss.backward()
        losses.append(float(loss))
    return losses, {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def _split_rank(rank, world, schedule, seed, ddp):
    """Each micro-batch of ``schedule`` ([(shape name, degree, first rank)], in run order) on the
    ranks of its group; gradients summed over ranks (DDP's all-reduce times W)."""
    groups = SequenceParallelGroups(world)
    model = _model()
    net = torch.nn.parallel.DistributedDataParallel(model) if ddp else model
    losses = {}
    ctx = net.no_sync() if ddp else torch.enable_grad()
    with ctx:
        for i, (name, degree, first) in enumerate(schedule):
            if not first <= rank < first + degree:
                continue
            member = rank - first
            inputs = _inputs(model, SHAPES[name], seed + i)
            target = torch.full_like(inputs["hidden_states"], 0.5).float()
            with split_sequence(net, groups.group(rank, degree), degree, member):
                loss = _loss(net, inputs, target)
            loss.backward()
            losses[i] = float(loss)
    grads = {}
    for n, p in model.named_parameters():
        g = p.grad if p.grad is not None else torch.zeros_like(p)
        dist.all_reduce(g)
        grads[n] = g
    return {"losses": losses, "grads": grads}


def _check(results, schedule, seed):
    names = [name for name, _, _ in schedule]
    ref_losses, ref_grads = _reference(names, seed)
    for r, res in enumerate(results):
        for i, loss in res["losses"].items():
            assert loss == pytest.approx(ref_losses[i], rel=1e-5), (r, i)
    grads = results[0]["grads"]
    assert set(ref_grads) <= set(grads)
    for n, ref in ref_grads.items():
        err = (grads[n] - ref).norm() / ref.norm().clamp_min(1e-12)
        assert err <= 1e-5, (n, float(err))
    # every rank holds the same summed gradient
    for res in results[1:]:
        for n in ref_grads:
            torch.testing.assert_close(res["grads"][n], grads[n], rtol=0, atol=0)


@pytest.mark.distributed
@pytest.mark.parametrize("degree", [2, 4])
@pytest.mark.parametrize("shape", ["even", "odd"])
def test_split_sample_equals_whole(tmp_path, degree, shape):
    schedule = [(shape, degree, 0)]
    seed = int(np.random.SeedSequence().entropy % 10_000)
    results = run_on_ranks(_split_rank, degree, tmp_path, "split", schedule, seed, False)
    _check(results, schedule, seed)


@pytest.mark.distributed
def test_step_mixing_degrees_under_ddp(tmp_path):
    """4 ranks: one micro-batch over all 4, then one over ranks 0-1, then each rank its own and
    rank 2 and 3 a pair: the schedule of a step with degrees 4, 2 and 1, under DDP."""
    schedule = [
        ("odd", 4, 0),
        ("even", 2, 0),
        ("odd", 2, 2),
        ("even", 1, 0),
        ("odd", 1, 1),
        ("even", 1, 2),
        ("odd", 1, 3),
    ]
    seed = int(np.random.SeedSequence().entropy % 10_000)
    results = run_on_ranks(_split_rank, 4, tmp_path, "mixed", schedule, seed, True)
    _check(results, schedule, seed)


def test_one_device_share_runs_a_members_shapes():
    """``ONE_DEVICE``: one member's share on one device, no collective; the output has the
    whole micro-batch's shape and gradients reach every parameter the whole one reaches; back at
    degree 1 the model gives its own output again."""
    model = _model()
    x = torch.randn(1, 4, 3, 6, 10)
    inputs = {"hidden_states": x, "timestep": torch.tensor([500.0]),
              "encoder_hidden_states": torch.randn(1, 7, 32)}  # fmt: skip
    before = model(**inputs, return_dict=False)[0]
    before.square().mean().backward()
    reached = {n for n, p in model.named_parameters() if p.grad is not None}
    for d, member in ((2, 0), (4, 0), (2, 1), (4, 3)):  # 45 tokens: the last members hold fewer
        model.zero_grad(set_to_none=True)
        with split_sequence(model, ONE_DEVICE, d, member):
            out = model(**inputs, return_dict=False)[0]
        assert out.shape == x.shape
        out.square().mean().backward()
        assert {n for n, p in model.named_parameters() if p.grad is not None} == reached
    with split_sequence(model, None, 1, 0):  # degree 1: the model as it is again
        whole = model(**inputs, return_dict=False)[0]
    torch.testing.assert_close(whole, before, rtol=0, atol=0)
    with pytest.raises(ValueError, match="does not divide the model's 4 attention heads"):
        with split_sequence(model, ONE_DEVICE, 8, 0):
            pass


@pytest.mark.cuda
def test_fused_kernels_inside_a_split_share_match_diffusers_norms():
    """On the GPU, the project's fused adaLN kernels inside a split block: one member's share
    (``ONE_DEVICE``, d = 2 and 4, a length divisible by neither) with the fused ops gives the
    output and every gradient of the same share with diffusers' own norms (fp32), for a batch
    of two samples."""
    import copy

    from adaptiveload.integrations.diffusers import apply_fused_ops

    plain = _model().cuda()
    fused = apply_fused_ops(copy.deepcopy(plain))
    two = [_inputs(plain, SHAPES["odd"], seed) for seed in (11, 12)]  # batch 2: a cut is strided
    inputs = {k: torch.cat([two[0][k], two[1][k]]).cuda() for k in two[0]}
    for d in (2, 4):
        outs, grads = [], []
        for model in (plain, fused):
            model.zero_grad(set_to_none=True)
            with split_sequence(model, ONE_DEVICE, d, 1):
                out = model(**inputs, return_dict=False)[0]
            out.square().mean().backward()
            outs.append(out.detach())
            grads.append({n: p.grad for n, p in model.named_parameters() if p.grad is not None})
        torch.testing.assert_close(outs[1], outs[0], rtol=1e-4, atol=1e-5)
        assert grads[1].keys() == grads[0].keys()
        for name, g in grads[0].items():
            torch.testing.assert_close(grads[1][name], g, rtol=1e-3, atol=1e-5, msg=name)
