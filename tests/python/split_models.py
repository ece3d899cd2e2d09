"""The tiny models of the sequence-parallel tests (one per family with a split, of any number
of attention heads), one sample's inputs per shape, the loss, and the reference: micro-batches
processed whole on one process."""

from __future__ import annotations

import numpy as np
import pytest
import torch

# Tiny models, of 4 heads unless told (d = 2 and 4 divide them). Latent shapes per family:
# "even" holds 48 tokens (divisible by 2 and 4), "odd" 45 (divisible by neither).
WAN_SHAPES = {"even": (3, 8, 8), "odd": (3, 6, 10)}  # (f, h, w), patches of (1, 2, 2)
LTX_SHAPES = {"even": (3, 4, 4), "odd": (3, 3, 5)}  # patches of (1, 1, 1)
TEXT = 7
# "-t2": Wan's samples with 2 text tokens, so few that cross-attention keeps the token shard
# (parallel.wan.cross_attention_on_head_shards: 45 or 48 tokens > 16 x 2); with TEXT it runs
# on head shards at d = 4 (on the token shard at d = 2).
SHORT_TEXT = 2


def _wan(seed=0, heads=4):
    from diffusers import WanTransformer3DModel

    torch.manual_seed(seed)
    return WanTransformer3DModel(
        **dict(patch_size=(1, 2, 2), num_attention_heads=heads, attention_head_dim=12),
        **dict(in_channels=4, out_channels=4, text_dim=32, freq_dim=32, ffn_dim=64),
        num_layers=2,
    )


def _ltx(seed=0, heads=4):
    from diffusers import LTXVideoTransformer3DModel

    torch.manual_seed(seed)
    return LTXVideoTransformer3DModel(
        **dict(in_channels=8, out_channels=8, num_attention_heads=heads, attention_head_dim=8),
        **dict(cross_attention_dim=8 * heads, num_layers=2, caption_channels=32),
    )


def _hunyuan(seed=0, heads=4):
    from diffusers import HunyuanVideoTransformer3DModel

    torch.manual_seed(seed)
    return HunyuanVideoTransformer3DModel(
        **dict(in_channels=4, out_channels=4, num_attention_heads=heads, attention_head_dim=16),
        **dict(num_layers=1, num_single_layers=2, num_refiner_layers=1, mlp_ratio=2.0),
        **dict(text_embed_dim=32, pooled_projection_dim=16, rope_axes_dim=(4, 6, 6)),
        patch_size=2,
        patch_size_t=1,
    )


def _diffsynth(seed=0, heads=4):
    from diffsynth.models.wan_video_dit import WanModel

    torch.manual_seed(seed)
    return WanModel(
        **dict(dim=12 * heads, in_dim=4, ffn_dim=64, out_dim=4, text_dim=32, freq_dim=32),
        **dict(eps=1e-6, patch_size=(1, 2, 2), num_heads=heads, num_layers=2),
        has_image_input=False,
    )


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
            "timestep": t,
            "encoder_attention_mask": mask,
            "num_frames": f,
            "height": h,
            "width": w,
        }
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
            "hidden_states": x,
            "timestep": t,
            "encoder_hidden_states": text,
            "encoder_attention_mask": mask,
            "pooled_projections": torch.randn(1, 16, generator=g),
            "guidance": torch.full((1,), 6000.0),
        }
    else:  # diffsynth
        inputs = {"latents": x, "timestep": t, "context": text}
    return inputs, torch.full_like(x, 0.5)


FAMILIES = {"wan": _wan, "ltx-video": _ltx, "hunyuan-video": _hunyuan, "diffsynth": _diffsynth}


def _model(family="wan", seed=0, heads=4):
    if family == "diffsynth":
        pytest.importorskip("diffsynth")
    return FAMILIES[family](seed, heads)


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


def _reference(family, shape_names, seed, heads=4):
    """Losses and summed gradients of the micro-batches processed whole, one process (seeds
    ``seed``, ``seed + 1``, ...)."""
    model = _trained(family, _model(family, heads=heads))
    losses = []
    for i, name in enumerate(shape_names):
        inputs, target = _inputs(family, name, seed + i)
        loss = _loss(family, model, inputs, target)
        loss.backward()
        losses.append(float(loss.detach()))
    return losses, {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def _check(results, family, schedule, seed, heads=4):
    """Each rank's ``{"losses": {i: loss}, "grads": summed gradients}`` of the micro-batches of
    ``schedule`` (entries whose first item is the shape name) against one process's: every loss
    and every gradient (relative error <= 1e-5), the same summed gradient on every rank."""
    names = [entry[0] for entry in schedule]
    ref_losses, ref_grads = _reference(family, names, seed, heads)
    for r, res in enumerate(results):
        for i, loss in res["losses"].items():
            assert loss == pytest.approx(ref_losses[i], rel=1e-5), (r, i)
    grads = results[0]["grads"]
    assert set(ref_grads) <= set(grads)
    # Relative to each gradient's norm, or to a millionth of the whole gradient's where a
    # gradient is zero in exact arithmetic (a key projection's bias: softmax ignores it).
    floor = 1e-6 * torch.stack([g.norm() for g in ref_grads.values()]).norm()
    errs = {
        n: (grads[n] - ref).norm() / torch.maximum(ref.norm(), floor)
        for n, ref in ref_grads.items()
    }
    bad = {n: float(e) for n, e in errs.items() if e > 1e-5}
    assert not bad, bad
    # every rank holds the same summed gradient
    for res in results[1:]:
        for n in ref_grads:
            torch.testing.assert_close(res["grads"][n], grads[n], rtol=1e-6, atol=1e-7)


def _seed() -> int:
    return int(np.random.SeedSequence().entropy % 10_000)
