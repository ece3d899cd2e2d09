"""Sequence parallelism per micro-batch, trained (adaptiveload.parallel): a sample split over d
gloo ranks gives the loss and every gradient of the same sample processed whole by one process
(fp32, relative error <= 1e-5), lengths divisible by d and not, in a step mixing degrees, under
DDP and FSDP2, for each family with a split (Wan in diffusers and in DiffSynth-Studio,
LTX-Video, HunyuanVideo); and one member's share runs on one device (``ONE_DEVICE``, what the
replay times)."""

from __future__ import annotations

import contextlib

import pytest
import torch
import torch.distributed as dist

from adaptiveload.parallel import ONE_DEVICE, SequenceParallelGroups, split_sequence
from processes import full_grads, run_on_ranks
from split_models import (
    FAMILIES,
    _check,
    _inputs,
    _loss,
    _model,
    _output,
    _seed,
    _trained,
)


def _split_rank(rank, world, family, schedule, seed, wrap):
    """Each micro-batch of ``schedule`` ([(shape name, degree, first rank)], in run order,
    every rank in the same number of slots) on the ranks of its group; the gradients summed
    over ranks: by hand (no wrapper), or by DDP's or FSDP2's reduction at the last backward
    (they average: times W)."""
    groups = SequenceParallelGroups(world)
    dit = _model(family)
    model = _trained(family, dit)
    if wrap == "ddp":
        net = torch.nn.parallel.DistributedDataParallel(model, find_unused_parameters=True)
    elif wrap == "fsdp2":
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        # CPU ranks (gloo) also where a GPU is present: FSDP2 would pick the GPU by default.
        mesh = init_device_mesh("cpu", (world,))
        net = fully_shard(model, mesh=mesh, reshard_after_forward=False)
    else:
        net = model
    mine = [(i, mb) for i, mb in enumerate(schedule) if mb[2] <= rank < mb[2] + mb[1]]
    losses = {}
    for j, (i, (name, degree, first)) in enumerate(mine):
        last = j == len(mine) - 1
        sync = contextlib.nullcontext()
        if wrap == "ddp" and not last:
            sync = net.no_sync()
        elif wrap == "fsdp2":
            net.set_requires_gradient_sync(last)
        inputs, target = _inputs(family, name, seed + i)
        with sync:
            split_on = dit if family == "diffsynth" else net  # the DiT; else DDP's unwrapping
            with split_sequence(split_on, groups.group(rank, degree), degree, rank - first):
                loss = _loss(family, net, inputs, target)
            loss.backward()
        losses[i] = float(loss.detach())
    if wrap is None:
        grads = {}
        for n, p in model.named_parameters():
            g = p.grad if p.grad is not None else torch.zeros_like(p)
            dist.all_reduce(g)
            grads[n] = g
    else:
        grads = {n: g * world for n, g in full_grads(model).items()}
    return {"losses": losses, "grads": grads}


@pytest.mark.distributed
def test_split_sample_equals_whole(tmp_path):
    """Without a wrapper (gradients summed by hand), on 4 ranks: a sample of 48 tokens over
    ranks 0-1 beside one of 45 over ranks 2-3, then each over all 4, with cross-attention on
    head shards, then on the token shard (a text of 2 tokens): every loss and the summed
    gradient equal one process's."""
    schedule = [("even", 2, 0), ("odd", 2, 2), ("even", 4, 0), ("odd", 4, 0), ("odd-t2", 2, 0),
                ("even-t2", 2, 2), ("odd-t2", 4, 0)]  # fmt: skip
    seed = _seed()
    results = run_on_ranks(_split_rank, 4, tmp_path, "split", "wan", schedule, seed, None)
    _check(results, "wan", schedule, seed)


def _split_rank_float64(rank, world, *args):
    torch.set_default_dtype(torch.float64)
    return _split_rank(rank, world, *args)


@pytest.mark.distributed
def test_split_in_float64_equals_whole(tmp_path):
    """A model and inputs in float64 (a gradient check's precision): the members' agreement
    check takes any dtype, and the split equals one process's run in float64."""
    schedule = [("odd", 2, 0), ("even", 2, 0)]
    seed = _seed()
    results = run_on_ranks(_split_rank_float64, 2, tmp_path, "f64", "wan", schedule, seed, None)
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        assert all(g.dtype == torch.float64 for g in results[0]["grads"].values())
        _check(results, "wan", schedule, seed)
    finally:
        torch.set_default_dtype(default)


# A step of 4 ranks in 4 slots: every rank in a micro-batch over all 4 (48 tokens, then 45),
# then ranks 0-1 and 2-3 in pairs (48 and 45), then each rank its own, then Wan's 45 tokens
# over all 4 with cross-attention on the token shard (a text of 2 tokens).
MIXED = [
    ("odd-t2", 4, 0),
    ("even", 4, 0),
    ("odd", 4, 0),
    ("even", 2, 0),
    ("odd", 2, 2),
    ("even", 1, 0),
    ("odd", 1, 1),
    ("even", 1, 2),
    ("odd", 1, 3),
]


@pytest.mark.distributed
@pytest.mark.parametrize("wrap", ["ddp", "fsdp2"])
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_step_mixing_degrees(tmp_path, family, wrap):
    """A step mixing degrees 4, 2 and 1, lengths divisible by d and not, under DDP and FSDP2,
    for each family: the loss of every micro-batch and the step's summed gradient equal those
    of the micro-batches processed whole by one process."""
    if family == "diffsynth":
        pytest.importorskip("diffsynth")
    seed = _seed()
    results = run_on_ranks(_split_rank, 4, tmp_path, "mixed", family, MIXED, seed, wrap)
    _check(results, family, MIXED, seed)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_one_device_share_runs_a_members_shapes(family):
    """``ONE_DEVICE``: one member's share on one device, no collective; the output has the
    whole micro-batch's shape and gradients reach every parameter the whole one reaches; back at
    degree 1 the model gives its own output again."""
    dit = _model(family)
    model = _trained(family, dit)
    inputs, _ = _inputs(family, "odd", 3)  # 45 tokens: the last members hold fewer
    before = _output(family, model, inputs)
    before.square().mean().backward()
    reached = {n for n, p in model.named_parameters() if p.grad is not None}
    for d, member in ((2, 0), (4, 0), (2, 1), (4, 3)):
        model.zero_grad(set_to_none=True)
        with split_sequence(dit, ONE_DEVICE, d, member):
            out = _output(family, model, inputs)
        assert out.shape == before.shape
        out.square().mean().backward()
        assert {n for n, p in model.named_parameters() if p.grad is not None} == reached
    with split_sequence(dit, None, 1, 0):  # degree 1: the model as it is again
        whole = _output(family, model, inputs)
    torch.testing.assert_close(whole, before, rtol=0, atol=0)
    # any degree runs over any head count (Ulysses x ring, test_split_ring.py); not below 1
    with pytest.raises(ValueError, match="no layout of degree 0 over 4 attention heads"):
        with split_sequence(dit, ONE_DEVICE, 0, 0):
            pass


@pytest.mark.parametrize("family", ["wan", "diffsynth"])
def test_wan_members_project_the_text_for_their_own_heads_only(family):
    """Wan's cross-attention on head shards: a member's share projects the text's keys and
    values for its own heads (the rows of the weights of those heads get gradient, no other
    row does), where the whole micro-batch reaches every row; samples long beside their text
    and groups of 2 keep the token shard."""
    dit = _model(family)
    model = _trained(family, dit)
    inputs, _ = _inputs(family, "odd", 5)

    def projections():
        if family == "wan":
            return [(b.attn2.to_k, b.attn2.to_v) for b in dit.blocks]
        return [(b.cross_attn.k, b.cross_attn.v) for b in dit.blocks]

    _output(family, model, inputs).square().mean().backward()
    for linear in (x for pair in projections() for x in pair):
        assert (linear.weight.grad.abs().sum(1) > 0).all()
    for d, member in ((4, 1), (4, 2)):
        model.zero_grad(set_to_none=True)
        with split_sequence(dit, ONE_DEVICE, d, member):
            _output(family, model, inputs).square().mean().backward()
        for linear in (x for pair in projections() for x in pair):
            rows = linear.weight.shape[0] // d
            reached = linear.weight.grad.abs().sum(1) > 0
            want = torch.zeros_like(reached)
            want[member * rows : (member + 1) * rows] = True
            assert torch.equal(reached, want), (d, member)
    # Samples long beside their text (45 tokens, 2 text tokens), or a group of 2: the token
    # shard, every row.
    for name, d in (("odd-t2", 4), ("odd", 2)):
        model.zero_grad(set_to_none=True)
        with split_sequence(dit, ONE_DEVICE, d, 1):
            _output(family, model, _inputs(family, name, 5)[0]).square().mean().backward()
        for linear in (x for pair in projections() for x in pair):
            assert (linear.weight.grad.abs().sum(1) > 0).all(), name


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_a_copy_of_a_split_model_carries_its_own_split(family):
    """A model copied after its split was installed (an EMA or eval copy; ``torch.save``) has
    hooks of its own: with the original still split, the copy at degree 1 gives the whole
    output, and a saved model loads and runs."""
    import copy
    import io

    dit = _model(family)
    inputs, _ = _inputs(family, "odd", 3)
    with torch.no_grad():
        whole = _output(family, _trained(family, dit), inputs)
        with split_sequence(dit, ONE_DEVICE, 2, 0):
            _output(family, _trained(family, dit), inputs)
        twin = copy.deepcopy(dit)
        buffer = io.BytesIO()
        torch.save(dit, buffer)
        buffer.seek(0)
        loaded = torch.load(buffer, weights_only=False)
        with split_sequence(dit, ONE_DEVICE, 2, 0):  # the original stays split
            pass
        for other in (twin, loaded):
            with split_sequence(other, None, 1, 0):
                out = _output(family, _trained(family, other), inputs)
            torch.testing.assert_close(out, whole, rtol=0, atol=0)


def test_unsupported_models_and_inputs_are_refused():
    """A model without a split, at degree > 1, is refused naming the families that have one
    (degree 1 runs it as it is); per-token timesteps are refused."""
    plain = torch.nn.Linear(4, 4)
    with split_sequence(plain, None, 1, 0):
        plain(torch.randn(2, 4))
    with pytest.raises(NotImplementedError, match="LTXVideoTransformer3DModel"):
        with split_sequence(plain, ONE_DEVICE, 2, 0):
            pass
    model = _model("ltx-video")
    inputs, _ = _inputs("ltx-video", "even", 0)
    inputs["timestep"] = torch.rand(1, 48) * 1000  # one timestep per token
    with split_sequence(model, ONE_DEVICE, 2, 0):
        with pytest.raises(NotImplementedError, match="per-token timesteps"):
            _output("ltx-video", model, inputs)


PATCHES = {
    "wan": "adaptiveload.integrations.diffusers",
    "ltx-video": "adaptiveload.integrations.ltx_video",
    "hunyuan-video": "adaptiveload.integrations.hunyuan_video",
    "diffsynth": "adaptiveload.integrations.diffsynth",
}


@pytest.mark.cuda
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_fused_kernels_inside_a_split_share_match_the_models_norms(family):
    """On the GPU, the project's fused adaLN kernels inside split blocks: one member's share
    (``ONE_DEVICE``, d = 2 and 4, a length divisible by neither) with the fused ops gives the
    output and every gradient of the same share with the model's own norms (fp32), for a batch
    of two samples."""
    import copy
    import importlib

    plain_dit = _model(family).cuda()
    fused_dit = importlib.import_module(PATCHES[family]).apply_fused_ops(copy.deepcopy(plain_dit))
    two = [_inputs(family, "odd", seed)[0] for seed in (11, 12)]  # batch 2: a cut is strided
    inputs = {
        k: torch.cat([two[0][k], two[1][k]]).cuda() if torch.is_tensor(v) else v
        for k, v in two[0].items()
    }
    for d in (2, 4):
        outs, grads = [], []
        for dit in (plain_dit, fused_dit):
            model = _trained(family, dit)
            model.zero_grad(set_to_none=True)
            with split_sequence(dit, ONE_DEVICE, d, 1):
                out = _output(family, model, inputs)
            out.square().mean().backward()
            outs.append(out.detach())
            grads.append({n: p.grad for n, p in model.named_parameters() if p.grad is not None})
        torch.testing.assert_close(outs[1], outs[0], rtol=1e-4, atol=1e-5)
        assert grads[1].keys() == grads[0].keys()
        for name, g in grads[0].items():
            torch.testing.assert_close(grads[1][name], g, rtol=1e-3, atol=1e-5, msg=name)
