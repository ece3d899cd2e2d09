"""Sequence parallelism per micro-batch, trained (adaptiveload.parallel): a sample split over d
gloo ranks gives the loss and every gradient of the same sample processed whole by one process
(fp32, relative error <= 1e-5), lengths divisible by d and not, in a step mixing degrees, under
DDP and FSDP2, for each family with a split (Wan in diffusers and in DiffSynth-Studio,
LTX-Video, HunyuanVideo); and one member's share runs on one device (``ONE_DEVICE``, what the
replay times)."""

from __future__ import annotations

import contextlib

import numpy as np
import pytest
import torch
import torch.distributed as dist

from adaptiveload.parallel import ONE_DEVICE, SequenceParallelGroups, split_sequence
from processes import full_grads, run_on_ranks

# Tiny models of 4 heads (d = 2 and 4 divide them). Latent shapes per family: "even" holds 48
# tokens (divisible by 2 and 4), "odd" 45 (divisible by neither).
WAN_SHAPES = {"even": (3, 8, 8), "odd": (3, 6, 10)}  # (f, h, w), patches of (1, 2, 2)
LTX_SHAPES = {"even": (3, 4, 4), "odd": (3, 3, 5)}  # patches of (1, 1, 1)
TEXT = 7
# "-t2": Wan's samples with 2 text tokens, so few that cross-attention keeps the token shard
# (parallel.wan.cross_attention_on_head_shards: 45 or 48 tokens > 16 x 2); with TEXT it runs
# on head shards at d = 4 (on the token shard at d = 2).
SHORT_TEXT = 2


def _wan(seed=0):
    from diffusers import WanTransformer3DModel

    torch.manual_seed(seed)
    return WanTransformer3DModel(
        patch_size=(1, 2, 2), num_attention_heads=4, attention_head_dim=12, in_channels=4,
        out_channels=4, text_dim=32, freq_dim=32, ffn_dim=64, num_layers=2,
    )  # fmt: skip


def _ltx(seed=0):
    from diffusers import LTXVideoTransformer3DModel

    torch.manual_seed(seed)
    return LTXVideoTransformer3DModel(
        in_channels=8, out_channels=8, num_attention_heads=4, attention_head_dim=8,
        cross_attention_dim=32, num_layers=2, caption_channels=32,
    )  # fmt: skip


def _hunyuan(seed=0):
    from diffusers import HunyuanVideoTransformer3DModel

    torch.manual_seed(seed)
    return HunyuanVideoTransformer3DModel(
        in_channels=4, out_channels=4, num_attention_heads=4, attention_head_dim=16,
        num_layers=1, num_single_layers=2, num_refiner_layers=1, mlp_ratio=2.0,
        text_embed_dim=32, pooled_projection_dim=16, rope_axes_dim=(4, 6, 6), patch_size=2,
        patch_size_t=1,
    )  # fmt: skip


def _diffsynth(seed=0):
    from diffsynth.models.wan_video_dit import WanModel

    torch.manual_seed(seed)
    return WanModel(
        dim=48, in_dim=4, ffn_dim=64, out_dim=4, text_dim=32, freq_dim=32, eps=1e-6,
        patch_size=(1, 2, 2), num_heads=4, num_layers=2, has_image_input=False,
    )  # fmt: skip


def _inputs(family, shape_name, seed):
    """One sample's inputs and the target of its loss, drawn from ``seed``."""
    shape_name, short, _ = shape_name.partition("-t2")
    g = torch.Generator().manual_seed(seed)
    t = torch.rand(1, generator=g) * 1000
    if family == "ltx-video":
        f, h, w = LTX_SHAPES[shape_name]
        mask = torch.ones(1, TEXT, dtype=torch.int64)
        mask[:, -2:] = 0
        inputs = {
            "hidden_states": torch.randn(1, f * h * w, 8, generator=g),
            "encoder_hidden_states": torch.randn(1, TEXT, 32, generator=g),
            "timestep": t, "encoder_attention_mask": mask, "num_frames": f, "height": h,
            "width": w,
        }  # fmt: skip
        return inputs, torch.full_like(inputs["hidden_states"], 0.5)
    f, h, w = WAN_SHAPES[shape_name]
    x = torch.randn(1, 4, f, h, w, generator=g)
    wan = family in ("wan", "diffsynth")
    text = torch.randn(1, SHORT_TEXT if short and wan else TEXT, 32, generator=g)
    if family == "wan":
        inputs = {"hidden_states": x, "timestep": t, "encoder_hidden_states": text}
    elif family == "hunyuan-video":
        mask = torch.ones(1, TEXT, dtype=torch.int64)
        mask[:, -2:] = 0  # padded text: the mask over the joint sequence matters
        inputs = {
            "hidden_states": x, "timestep": t, "encoder_hidden_states": text,
            "encoder_attention_mask": mask, "pooled_projections": torch.randn(1, 16, generator=g),
            "guidance": torch.full((1,), 6000.0),
        }  # fmt: skip
    else:  # diffsynth
        inputs = {"latents": x, "timestep": t, "context": text}
    return inputs, torch.full_like(x, 0.5)


FAMILIES = {"wan": _wan, "ltx-video": _ltx, "hunyuan-video": _hunyuan, "diffsynth": _diffsynth}


def _model(family="wan", seed=0):
    if family == "diffsynth":
        pytest.importorskip("diffsynth")
    return FAMILIES[family](seed)


class _DiffSynthStep(torch.nn.Module):
    """What DiffSynth-Studio's trainer wraps in DDP or FSDP: a module whose forward runs the
    pipeline's ``model_fn_wan_video`` on the DiT (the split is put on the DiT itself)."""

    def __init__(self, dit):
        super().__init__()
        self.dit = dit

    def forward(self, **inputs):
        from diffsynth.pipelines.wan_video import model_fn_wan_video

        return model_fn_wan_video(self.dit, **inputs)


def _trained(family, model):
    """The module the training loop calls (and wraps)."""
    return _DiffSynthStep(model) if family == "diffsynth" else model


def _output(family, net, inputs):
    if family == "diffsynth":
        return net(**inputs)
    return net(**inputs, return_dict=False)[0]


def _loss(family, model, inputs, target):
    return ((_output(family, model, inputs).float() - target) ** 2).mean()


def _reference(family, shape_names, seed):
    """Losses and summed gradients of the micro-batches processed whole, one process."""
    model = _trained(family, _model(family))
    losses = []
    for i, name in enumerate(shape_names):
        inputs, target = _inputs(family, name, seed + i)
        loss = _loss(family, model, inputs, target)
        loss.backward()
        losses.append(float(loss.detach()))
    return losses, {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


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


def _check(results, family, schedule, seed):
    names = [name for name, _, _ in schedule]
    ref_losses, ref_grads = _reference(family, names, seed)
    for r, res in enumerate(results):
        for i, loss in res["losses"].items():
            assert loss == pytest.approx(ref_losses[i], rel=1e-5), (r, i)
    grads = results[0]["grads"]
    assert set(ref_grads) <= set(grads)
    # Relative to each gradient's norm, or to a millionth of the whole gradient's where a
    # gradient is zero in exact arithmetic (a key projection's bias: softmax ignores it).
    floor = 1e-6 * torch.stack([g.norm() for g in ref_grads.values()]).norm()
    errs = {n: (grads[n] - ref).norm() / torch.maximum(ref.norm(), floor)
            for n, ref in ref_grads.items()}  # fmt: skip
    bad = {n: float(e) for n, e in errs.items() if e > 1e-5}
    assert not bad, bad
    # every rank holds the same summed gradient
    for res in results[1:]:
        for n in ref_grads:
            torch.testing.assert_close(res["grads"][n], grads[n], rtol=1e-6, atol=1e-7)


def _seed() -> int:
    return int(np.random.SeedSequence().entropy % 10_000)


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
    with pytest.raises(ValueError, match="does not divide the model's 4 attention heads"):
        with split_sequence(dit, ONE_DEVICE, 8, 0):
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
