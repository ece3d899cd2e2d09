"""Every model family's adapter (adaptiveload.models) on tiny random configs on CPU: its token
geometry against the tokens the model's blocks see, and its fused-op patch against the
unpatched model (outputs and every gradient in fp32; bf16 against an fp32 run), undo,
save/load and torch.compile."""

import io

import numpy as np
import pytest
import torch

pytest.importorskip("diffusers")

from adaptiveload.models import FAMILIES, family_of, resolve  # noqa: E402

PATCHED = sorted(name for name, f in FAMILIES.items() if f.patch is not None)
# (frames, height, width) in pixels of one small clip per family (its VAE's strides).
CLIP = {"wan": (9, 64, 96), "hunyuanvideo": (9, 64, 96), "ltx-video": (17, 128, 192),
        "cogvideox": (9, 64, 96), "mochi": (13, 64, 96), "skyreels-v2": (9, 64, 96)}  # fmt: skip


DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)]  # skipped without a GPU


@pytest.fixture(autouse=True)
def fp32_without_tf32():
    """fp32 parity on CUDA compares fp32 arithmetic: cuDNN's convolutions (the patch embedding)
    default to TF32, whose 10-bit mantissa turns last-bit differences upstream into 1e-3 in
    their weight gradients."""
    saved = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    yield
    torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = saved


def build(name, dtype=torch.float32, seed=0, device="cpu"):
    return family_of(name).build("tiny", dtype=dtype, seed=seed, device=device)


def batch(name, model, seed, batch=2, clip=None):
    device = next(model.parameters()).device
    g = torch.Generator(device).manual_seed(seed)
    return family_of(name).random_batch(model, batch, *(clip or CLIP[name]), generator=g)


def loss_and_grads(model, inputs):
    model.zero_grad(set_to_none=True)
    out = model(**inputs, return_dict=False)[0]
    weights = torch.linspace(-1, 1, out.numel(), device=out.device).reshape(out.shape)
    (out.float() * weights).sum().backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    return out.detach(), grads


def test_resolve_names_the_family_and_config():
    family, config = resolve("ltx-video/ltx-video-2B")
    assert family.name == "ltx-video" and config == "ltx-video-2B"
    assert resolve("hunyuanvideo")[1] == "hunyuanvideo-13B"
    with pytest.raises(ValueError, match="unknown model family 'cogvideo'"):
        resolve("cogvideo/x")
    with pytest.raises(ValueError, match="unknown wan config 'wan9'"):
        resolve("wan/wan9")


# Whose self-attention runs over the text tokens too (an MMDiT's joint attention); the
# others take text by cross-attention.
JOINT_ATTENTION = {"wan": False, "hunyuanvideo": True, "ltx-video": False, "cogvideox": True,
                   "mochi": True, "skyreels-v2": False}  # fmt: skip


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_geometry_counts_the_tokens_the_blocks_see(name):
    family = family_of(name)
    model = build(name)
    seen = []

    def count(module, args, kwargs):
        video, text = (list(args) + [kwargs.get(k) for k in ("hidden_states",
                       "encoder_hidden_states")])[:2]  # fmt: skip
        seen.append(video.shape[1] + (text.shape[1] if JOINT_ATTENTION[name] else 0))

    hook = family.blocks(model)[0].register_forward_pre_hook(count, with_kwargs=True)
    f, h, w = CLIP[name]
    for clip in [(f, h, w), (1, h, w), (2 * f - 1, h, 2 * w)]:
        seen.clear()
        with torch.no_grad():
            model(**batch(name, model, 0, batch=1, clip=clip), return_dict=False)
        assert family.seq_len(*clip) == seen[0], (name, clip)
    hook.remove()
    lens = family.seq_len(np.array([1, f]), np.array([h, h]), np.array([w, w]))
    assert lens.dtype == np.int64 and lens.tolist() == [
        family.seq_len(1, h, w),
        family.seq_len(f, h, w),
    ]


@pytest.mark.parametrize(
    "shape,match",
    [
        ((10, 72, 100), r"sample 0 \(10x72x100\): mochi takes 6k\+1 frames \(1, 7, 13, ...\)"),
        ((13, 72, 96), r"\(13x72x96\): mochi takes heights that are multiples of 16, got 72"),
        ((13, 64, 100), r"mochi takes widths that are multiples of 16, got 100"),
    ],
)
def test_mochi_refuses_shapes_its_model_cannot_take(shape, match):
    mochi = family_of("mochi")
    with pytest.raises(ValueError, match=match):
        mochi.seq_len(*shape)
    f, h, w = shape
    with pytest.raises(ValueError, match=match.replace("sample 0", "sample 2")):
        mochi.seq_len(np.array([13, 1, f]), np.array([64, 64, h]), np.array([96, 96, w]))
    assert mochi.seq_len(163, 480, 848) == 28 * 30 * 53 + 256
    assert mochi.geometry.round_shape(*shape) == (7 if shape[0] == 10 else 13, 64, 96)


def test_mochi_rules_are_its_models():
    """A latent of odd height (a 72-pixel-high clip) fails in diffusers' Mochi: the rule the
    geometry enforces is the model's, not a stricter one of ours."""
    model = build("mochi")
    with pytest.raises(RuntimeError, match="invalid for input"), torch.no_grad():
        model(**batch("mochi", model, 0, batch=1, clip=(13, 72, 96)), return_dict=False)
    other = family_of("wan").geometry
    assert other.round_shape(10, 72, 100) == (10, 72, 100)  # Wan takes any shape


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", PATCHED)
def test_patched_model_matches_fp32_outputs_and_every_gradient(name, device, seed):
    family = family_of(name)
    model = build(name, seed=seed % 1000, device=device)
    inputs = batch(name, model, seed)
    ref_out, ref_grads = loss_and_grads(model, inputs)
    family.apply_fused_ops(model)
    assert family.is_fused(model)
    out, grads = loss_and_grads(model, inputs)
    torch.testing.assert_close(out, ref_out, rtol=1e-5, atol=1e-5)
    assert grads.keys() == ref_grads.keys()
    for n in ref_grads:
        torch.testing.assert_close(grads[n], ref_grads[n], rtol=1e-4, atol=1e-5, msg=n)


@pytest.mark.parametrize("device", DEVICES)
def test_ltx_per_token_modulation_matches(device, seed):
    """LTX-Video with a timestep per token: ada_values of shape (B, S, 6, D)."""
    family = family_of("ltx-video")
    model = build("ltx-video", seed=seed % 1000, device=device)
    inputs = batch("ltx-video", model, seed)
    s = inputs["hidden_states"].shape[1]
    g = torch.Generator(device).manual_seed(seed)
    inputs["timestep"] = torch.rand(2, s, generator=g, device=device) * 1000
    ref_out, ref_grads = loss_and_grads(model, inputs)
    family.apply_fused_ops(model)
    out, grads = loss_and_grads(model, inputs)
    torch.testing.assert_close(out, ref_out, rtol=1e-5, atol=1e-5)
    for n in ref_grads:
        torch.testing.assert_close(grads[n], ref_grads[n], rtol=1e-4, atol=1e-5, msg=n)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", PATCHED)
def test_patched_bf16_is_as_close_to_fp32_as_unpatched_bf16(name, device, seed):
    family = family_of(name)
    ref = build(name, seed=seed % 1000, device=device)
    inputs32 = batch(name, ref, seed)
    with torch.no_grad():
        want = ref(**inputs32, return_dict=False)[0].float()
    model = build(name, dtype=torch.bfloat16, seed=seed % 1000, device=device)
    inputs16 = {k: v.to(torch.bfloat16) if isinstance(v, torch.Tensor) and v.is_floating_point()
                else v for k, v in inputs32.items()}  # fmt: skip
    with torch.no_grad():
        plain = (model(**inputs16, return_dict=False)[0].float() - want).abs().mean()
        family.apply_fused_ops(model)
        fused = (model(**inputs16, return_dict=False)[0].float() - want).abs().mean()
    assert fused <= 1.25 * plain + 1e-3, (float(fused), float(plain))


@pytest.mark.parametrize("name", PATCHED)
def test_remove_restores_diffusers_and_save_load_keeps_the_patch(name):
    family = family_of(name)
    model = build(name)
    inputs = batch(name, model, 3)
    with torch.no_grad():
        plain = model(**inputs, return_dict=False)[0]
        family.apply_fused_ops(model)
        family.apply_fused_ops(model)  # twice: a no-op
        fused = model(**inputs, return_dict=False)[0]
        buf = io.BytesIO()
        torch.save(model, buf)
        buf.seek(0)
        loaded = torch.load(buf, weights_only=False)
        assert family.is_fused(loaded)
        torch.testing.assert_close(loaded(**inputs, return_dict=False)[0], fused, rtol=0, atol=0)
        family.remove_fused_ops(model)
        assert not family.is_fused(model)
        torch.testing.assert_close(model(**inputs, return_dict=False)[0], plain, rtol=0, atol=0)


@pytest.mark.parametrize("name", PATCHED)
def test_apply_refuses_a_model_of_another_family(name):
    other = next(n for n in PATCHED if n != name)
    with pytest.raises(ValueError, match="has no"):
        family_of(name).apply_fused_ops(build(other))


@pytest.mark.slow
@pytest.mark.parametrize("name", ["hunyuanvideo", "ltx-video"])
def test_patched_model_compiles(name):
    family = family_of(name)
    model = family.apply_fused_ops(build(name))
    inputs = batch(name, model, 5)
    with torch.no_grad():
        eager = model(**inputs, return_dict=False)[0]
        compiled = torch.compile(model, fullgraph=False)(**inputs, return_dict=False)[0]
    torch.testing.assert_close(compiled, eager, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("device", DEVICES)
def test_hunyuanvideo_15_blocks_take_the_patch(device, seed):
    """HunyuanVideo 1.5's dual-stream block has 1.0's structure: the patch applies to a model
    holding it, with the same parity (outputs and every gradient, fp32)."""
    from diffusers.models.transformers.transformer_hunyuan_video15 import (
        HunyuanVideo15TransformerBlock,
    )

    torch.manual_seed(seed % 1000)
    holder = torch.nn.ModuleList([HunyuanVideo15TransformerBlock(2, 16, 2.0) for _ in range(2)])
    holder = holder.to(device)
    g = torch.Generator(device).manual_seed(seed)
    x, c = (torch.randn(2, n, 32, generator=g, device=device, requires_grad=True) for n in (40, 7))
    temb = torch.randn(2, 32, generator=g, device=device)
    mask = torch.ones(2, 7, dtype=torch.bool, device=device)
    mask[1, 5:] = False  # the second sample's prompt is shorter

    def run():
        holder.zero_grad(set_to_none=True)
        h, e = x, c
        for block in holder:
            h, e = block(h, e, temb, mask)
        w = torch.linspace(-1, 1, h.numel() + e.numel(), device=device)
        (torch.cat([h.flatten(), e.flatten()]) * w).sum().backward()
        grads = {n: p.grad.clone() for n, p in holder.named_parameters()}
        return h.detach(), e.detach(), grads

    want = run()
    family_of("hunyuanvideo").apply_fused_ops(holder)
    assert family_of("hunyuanvideo").is_fused(holder)
    got = run()
    torch.testing.assert_close(got[0], want[0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got[1], want[1], rtol=1e-5, atol=1e-5)
    for n in want[2]:
        torch.testing.assert_close(got[2][n], want[2][n], rtol=1e-4, atol=1e-5, msg=n)


def swap_classes(model, blocks):
    """What FSDP2's fully_shard does to a module: its class becomes a subclass named
    FSDP<class> (the model's and each block's)."""
    for m in [model, *blocks]:
        kind = type(m)
        m.__class__ = type(f"FSDP{kind.__name__}", (kind,), {})


@pytest.mark.parametrize("name", PATCHED)
def test_models_and_blocks_of_fsdp2_subclasses_are_found(name):
    from adaptiveload.models import family_for
    from adaptiveload.models.checkpointing import checkpointed_blocks, set_checkpointed_blocks

    family = family_of(name)
    model = build(name)
    inputs = batch(name, model, 2)
    with torch.no_grad():
        want = model(**inputs, return_dict=False)[0]
    swap_classes(model, family.blocks(model))
    assert type(model).__name__.startswith("FSDP")
    found, root = family_for(torch.nn.ModuleList([model]))
    assert found is family and root is model
    family.apply_fused_ops(model)
    assert family.is_fused(model)
    set_checkpointed_blocks(model, 1)
    assert checkpointed_blocks(model) == 1
    with torch.no_grad():
        torch.testing.assert_close(
            model(**inputs, return_dict=False)[0], want, rtol=1e-5, atol=1e-5
        )
