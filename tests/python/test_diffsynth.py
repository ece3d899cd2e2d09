"""DiffSynth-Studio's Wan model with AdaptiveLoad's fused ops: same outputs and gradients.

The model runs through ``model_fn_wan_video``, the forward DiffSynth's pipeline and trainer
call (``WanModel.forward`` itself is not what they use). The reference is the same model with
DiffSynth's own ``DiTBlock.forward``.
"""

import copy
import sys

import pytest
import torch

pytest.importorskip("diffsynth.models.wan_video_dit")

from diffsynth.models.wan_video_dit import WanModel  # noqa: E402
from diffsynth.models.wan_video_vace import VaceWanModel  # noqa: E402
from diffsynth.pipelines.wan_video import model_fn_wan_video  # noqa: E402

from adaptiveload.integrations.diffsynth import (  # noqa: E402
    apply_fused_ops,
    is_fused,
    remove_fused_ops,
)

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)]  # skipped without a GPU
# Hidden size 36 (3 heads of 12, a head size that Wan's 3-axis RoPE splits evenly, as 128),
# FFN 52, 3 x 3 x 5 = 45 tokens per sample after the (1, 2, 2) patch embedding.
DIM, HEADS, FFN, IN_DIM, TEXT_DIM, FREQ_DIM = 36, 3, 52, 4, 20, 16
LATENT = (3, 6, 10)  # frames, height, width
# eps of norm1, norm2, norm3: distinct and far from the default, so a fused forward that
# takes another norm's eps or a fixed one misses the tolerances below by orders of magnitude.
NORM_EPS = (1e-2, 2e-2, 4e-2)
# fp32: (output rtol, gradient rtol), relative to the norm of the reference.
FP32_TOLERANCE = (5e-6, 5e-5)
# bf16: the fused model's error against an fp32 run may be at most this multiple of the
# unfused model's error (plus a floor for near-exact cases).
BF16_ERROR_RATIO, BF16_FLOOR = 2.0, 1e-3


def build(layers=2, seed=0, per_token=False, dtype=torch.float32, device="cpu"):
    torch.manual_seed(seed)
    model = WanModel(
        dim=DIM,
        in_dim=IN_DIM,
        ffn_dim=FFN,
        out_dim=IN_DIM,
        text_dim=TEXT_DIM,
        freq_dim=FREQ_DIM,
        eps=1e-6,
        patch_size=(1, 2, 2),
        num_heads=HEADS,
        num_layers=layers,
        has_image_input=False,
        seperated_timestep=per_token,
    )
    with torch.no_grad():
        for block in model.blocks:
            block.norm1.eps, block.norm2.eps, block.norm3.eps = NORM_EPS
            # norm3's affine parameters start as ones and zeros: make them matter.
            block.norm3.weight.normal_(1.0, 0.3)
            block.norm3.bias.normal_(0.0, 0.3)
    return model.to(device=device, dtype=dtype)


def random_inputs(batch=2, dtype=torch.float32, device="cpu", seed=None):
    """Fresh random latents, text states and timesteps (one per sample)."""
    seed = torch.randint(0, 2**31, ()).item() if seed is None else seed
    g = torch.Generator().manual_seed(seed)
    return {
        "latents": torch.randn(batch, IN_DIM, *LATENT, generator=g).to(device, dtype),
        "context": torch.randn(batch, 7, TEXT_DIM, generator=g).to(device, dtype),
        "timestep": (torch.rand(batch, generator=g) * 1000).to(device, dtype),
    }


def rope_freqs(model, f, h, w):
    """The (f * h * w, 1, head_dim / 2) complex RoPE factors of an f x h x w token grid."""
    by_frame, by_row, by_col = model.freqs
    grid = (
        by_frame[:f].view(f, 1, 1, -1).expand(f, h, w, -1),
        by_row[:h].view(1, h, 1, -1).expand(f, h, w, -1),
        by_col[:w].view(1, 1, w, -1).expand(f, h, w, -1),
    )
    return torch.cat(grid, dim=-1).reshape(f * h * w, 1, -1)


def rel_err(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-12)).item()


def run(model, inputs, fn=model_fn_wan_video, **kwargs):
    """Output, and the gradients of every parameter and of latents and context, of a fixed
    random projection of the output (so that every output element matters)."""
    model.zero_grad(set_to_none=True)
    leaves = {k: v.clone().requires_grad_(k != "timestep") for k, v in inputs.items()}
    out = fn(model, **leaves, **kwargs)
    g = torch.Generator().manual_seed(1)
    weight = torch.randn(out.shape, generator=g).to(out.device)
    (out.float() * weight).sum().backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    grads.update({f"input.{k}": v.grad.clone() for k, v in leaves.items() if v.grad is not None})
    return out.detach(), grads


def assert_matches(out, grads, out_ref, grads_ref, tolerance=FP32_TOLERANCE):
    out_tol, grad_tol = tolerance
    assert out.dtype == out_ref.dtype and out.shape == out_ref.shape
    assert torch.isfinite(out).all()
    assert rel_err(out, out_ref) < out_tol
    assert grads.keys() == grads_ref.keys()
    for name, ref in grads_ref.items():
        assert ref.abs().sum() > 0, f"{name}: no gradient reached it"
        assert rel_err(grads[name], ref) < grad_tol, name


def assert_as_accurate(out, grads, out_ref, grads_ref, out_exact, grads_exact):
    """The flash-attention rule: against an fp32 run, the fused error is at most a small
    multiple of the reference's own error, for the output and every gradient."""
    assert torch.isfinite(out).all()
    assert grads.keys() == grads_ref.keys() == grads_exact.keys()
    cases = [("output", out, out_ref, out_exact)]
    cases += [(n, grads[n], grads_ref[n], grads_exact[n]) for n in grads_exact]
    for name, a, b, truth in cases:
        err, err_ref = rel_err(a, truth), rel_err(b, truth)
        assert err <= BF16_ERROR_RATIO * err_ref + BF16_FLOOR, (name, err, err_ref)


@pytest.mark.parametrize("device", DEVICES)
def test_fused_model_matches_diffsynth_fp32(device):
    ref = build(layers=3, seed=1, device=device)
    fused = apply_fused_ops(copy.deepcopy(ref))
    assert is_fused(fused) and not is_fused(ref)
    inputs = random_inputs(device=device)
    out_ref, grads_ref = run(ref, inputs)
    out, grads = run(fused, inputs)
    assert "input.latents" in grads and "input.context" in grads
    assert "blocks.0.modulation" in grads and "blocks.2.norm3.weight" in grads
    assert_matches(out, grads, out_ref, grads_ref)


@pytest.mark.parametrize("device", DEVICES)
def test_fused_model_in_bf16_is_as_accurate_as_diffsynth(device):
    # DiffSynth trains with the whole model in bf16. The fused ops round once where the
    # reference rounds after each step, so compare both with an fp32 run of the same weights.
    ref = build(layers=3, seed=2, dtype=torch.bfloat16, device=device)
    fused = apply_fused_ops(copy.deepcopy(ref))
    exact = copy.deepcopy(ref).float()
    inputs = random_inputs(dtype=torch.bfloat16, device=device)
    out_exact, grads_exact = run(exact, {k: v.float() for k, v in inputs.items()})
    out_ref, grads_ref = run(ref, inputs)
    out, grads = run(fused, inputs)
    assert out.dtype == torch.bfloat16
    assert_as_accurate(out, grads, out_ref, grads_ref, out_exact, grads_exact)


def test_per_token_modulation_through_the_model():
    # Wan 2.2 TI2V: seperated_timestep with fuse_vae_embedding_in_latents gives t_mod of shape
    # (1, S, 6, D), the first frame at timestep 0.
    ref = build(layers=2, seed=3, per_token=True)
    fused = apply_fused_ops(copy.deepcopy(ref))
    shapes = []
    fused.blocks[0].register_forward_pre_hook(lambda m, args: shapes.append(args[2].shape))
    inputs = random_inputs(batch=1)
    out_ref, grads_ref = run(ref, inputs, fuse_vae_embedding_in_latents=True)
    out, grads = run(fused, inputs, fuse_vae_embedding_in_latents=True)
    tokens = LATENT[0] * (LATENT[1] // 2) * (LATENT[2] // 2)
    assert shapes == [torch.Size([1, tokens, 6, DIM])]
    assert_matches(out, grads, out_ref, grads_ref)


@pytest.mark.parametrize(
    "t_mod_shape, t_mod_dtype",
    [
        ((2, 45, 6, DIM), torch.float32),  # per token: every token its own shift, scale, gate
        ((1, 45, 6, DIM), torch.float32),  # per token, shared by the batch
        ((2, 6, DIM), torch.bfloat16),  # per sample, in another dtype than the fp32 stream
    ],
)
def test_block_matches_for_each_modulation_layout(t_mod_shape, t_mod_dtype):
    model = build(layers=1, seed=4)
    block = model.blocks[0]
    fused_block = apply_fused_ops(copy.deepcopy(block))
    f, h, w = LATENT[0], LATENT[1] // 2, LATENT[2] // 2
    assert f * h * w == 45
    freqs = rope_freqs(model, f, h, w)
    g = torch.Generator().manual_seed(torch.randint(0, 2**31, ()).item())
    inputs = {
        "x": torch.randn(2, f * h * w, DIM, generator=g),
        "context": torch.randn(2, 7, DIM, generator=g),
        "t_mod": torch.randn(t_mod_shape, generator=g).to(t_mod_dtype),
    }

    def block_fn(b, x, context, t_mod):
        return b(x, context, t_mod, freqs)

    out_ref, grads_ref = run(block, inputs, fn=block_fn)
    out, grads = run(fused_block, inputs, fn=block_fn)
    assert "input.t_mod" in grads and "modulation" in grads
    if t_mod_dtype == torch.float32:
        assert_matches(out, grads, out_ref, grads_ref)
    else:
        # The reference rounds 1 + scale to bf16 before it multiplies the fp32 stream; the
        # fused op does not. Both against the block run with the same t_mod in fp32:
        exact = run(block, {**inputs, "t_mod": inputs["t_mod"].float()}, fn=block_fn)
        assert_as_accurate(out, grads, out_ref, grads_ref, *exact)


def test_gradient_checkpointing_in_training_mode():
    # DiffSynth's trainer runs the blocks under torch.utils.checkpoint.
    ref = build(layers=2, seed=5)
    fused = apply_fused_ops(copy.deepcopy(ref)).train()
    inputs = random_inputs()
    out_ref, grads_ref = run(ref, inputs)
    out, grads = run(fused, inputs, use_gradient_checkpointing=True)
    assert_matches(out, grads, out_ref, grads_ref)


def test_remove_restores_diffsynth_forward_exactly():
    ref = build(layers=2, seed=6)
    model = copy.deepcopy(ref)
    inputs = random_inputs()
    out_ref, grads_ref = run(ref, inputs)
    apply_fused_ops(model)
    forward = model.blocks[0].forward
    apply_fused_ops(model)  # twice is a no-op
    assert model.blocks[0].forward is forward and is_fused(model)
    out_fused, _ = run(model, inputs)
    assert not torch.equal(out_fused, out_ref)  # the fused ops really ran
    remove_fused_ops(model)
    assert not is_fused(model)
    assert all("forward" not in vars(b) for b in model.blocks)
    out, grads = run(model, inputs)
    torch.testing.assert_close(out, out_ref, rtol=0, atol=0)
    for name in grads_ref:
        torch.testing.assert_close(grads[name], grads_ref[name], rtol=0, atol=0)


def test_weights_untouched_and_other_models_rejected():
    model = build(layers=1)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    apply_fused_ops(model)
    assert state.keys() == model.state_dict().keys()
    assert all(torch.equal(state[k], v) for k, v in model.state_dict().items())
    with pytest.raises(ValueError, match="Linear has no DiffSynth DiTBlock"):
        apply_fused_ops(torch.nn.Linear(2, 2))
    assert not is_fused(torch.nn.Linear(2, 2))


def test_blocks_with_their_own_forward_are_left_alone():
    # VACE's blocks subclass DiTBlock with another forward signature: patching would break them.
    vace = VaceWanModel(
        vace_layers=(0,),
        vace_in_dim=IN_DIM,
        patch_size=(1, 2, 2),
        dim=DIM,
        num_heads=HEADS,
        ffn_dim=FFN,
    )
    with pytest.raises(ValueError, match="VaceWanModel has no DiffSynth DiTBlock"):
        apply_fused_ops(vace)
    both = torch.nn.ModuleList([build(layers=1), vace])
    apply_fused_ops(both)
    assert is_fused(both)
    assert "forward" in vars(both[0].blocks[0])
    assert "forward" not in vars(vace.vace_blocks[0])


def test_missing_diffsynth_names_the_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "diffsynth.models.wan_video_dit", None)
    with pytest.raises(ImportError, match="pip install diffsynth"):
        apply_fused_ops(torch.nn.Linear(2, 2))


@pytest.mark.slow
def test_fused_model_under_torch_compile_fullgraph():
    ref = build(layers=1, seed=7)
    fused = apply_fused_ops(copy.deepcopy(ref))
    compiled = torch.compile(model_fn_wan_video, fullgraph=True)
    inputs = random_inputs()
    out_ref, grads_ref = run(ref, inputs)
    out, grads = run(fused, inputs, fn=compiled)
    assert_matches(out, grads, out_ref, grads_ref, tolerance=(1e-4, 1e-3))


def test_patched_model_round_trips_through_torch_save(tmp_path):
    fused = apply_fused_ops(build(layers=2, seed=8))
    torch.save(fused, tmp_path / "model.pt")
    back = torch.load(tmp_path / "model.pt", weights_only=False)
    assert is_fused(back)
    inputs = random_inputs()
    out_ref, grads_ref = run(fused, inputs)
    out, grads = run(back, inputs)
    torch.testing.assert_close(out, out_ref, rtol=0, atol=0)
    for name in grads_ref:
        torch.testing.assert_close(grads[name], grads_ref[name], rtol=0, atol=0)
    remove_fused_ops(back)
    assert not is_fused(back) and "forward" not in vars(back.blocks[0])


def test_deepcopy_of_a_patched_model_binds_its_own_blocks():
    fused = apply_fused_ops(build(layers=1, seed=9))
    clone = copy.deepcopy(fused)
    assert clone.blocks[0].forward.args[0] is clone.blocks[0]
    with torch.no_grad():
        for p in clone.parameters():
            p.add_(0.1)
    inputs = random_inputs()
    with torch.no_grad():
        a = model_fn_wan_video(fused, **inputs)
        b = model_fn_wan_video(clone, **inputs)
    assert not torch.equal(a, b), "the copy ran the original's blocks"
