"""diffusers' Wan transformer with AdaptiveLoad's fused ops: same outputs and gradients."""

import copy

import pytest
import torch

pytest.importorskip("diffusers")

from adaptiveload.integrations.diffusers import apply_fused_ops, is_fused, remove_fused_ops  # noqa: E402
from adaptiveload.models.wan import FAMILY, build_wan, random_batch  # noqa: E402

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)]  # skipped without a GPU
# (stream dtype, output rtol relative to the output's norm, gradient rtol)
TOLERANCE = {torch.float32: (2e-5, 1e-4), torch.bfloat16: (2e-2, 5e-2)}


def rel_err(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-12)).item()


def run(model, inputs, params=None):
    params = params or model
    params.zero_grad(set_to_none=True)
    out = model(**inputs, return_dict=False)[0]
    # A fixed random projection makes every output element matter to the gradients.
    g = torch.Generator(device=out.device).manual_seed(1)
    weight = torch.randn(out.shape, generator=g, device=out.device)
    (out.float() * weight).sum().backward()
    return out.detach(), {
        n: p.grad.detach().clone() for n, p in params.named_parameters() if p.grad is not None
    }


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fused_model_matches_diffusers(device, dtype):
    ref = build_wan("tiny", layers=3, device=device, dtype=dtype, seed=3)
    fused = apply_fused_ops(copy.deepcopy(ref))
    assert is_fused(fused) and not is_fused(ref)
    g = torch.Generator(device=device).manual_seed(torch.randint(0, 2**31, ()).item())
    inputs = random_batch(ref, 2, 5, 32, 48, text_len=8, generator=g)
    out_ref, grads_ref = run(ref, inputs)
    out, grads = run(fused, inputs)
    out_tol, grad_tol = TOLERANCE[dtype]
    assert out.dtype == out_ref.dtype and out.shape == out_ref.shape
    assert torch.isfinite(out).all()
    assert rel_err(out, out_ref) < out_tol
    assert grads.keys() == grads_ref.keys()
    for name in grads_ref:
        assert rel_err(grads[name], grads_ref[name]) < grad_tol, name


def test_per_token_modulation_block_matches():
    # Wan 2.2 TI2V passes temb of shape (B, S, 6, D): per-token modulation.
    model = build_wan("tiny", layers=1, seed=4)
    block = model.blocks[0]
    fused_block = copy.deepcopy(block)
    apply_fused_ops(torch.nn.Sequential(fused_block))
    b, s, d = 2, 12, block.scale_shift_table.shape[-1]
    x = torch.randn(b, s, d, requires_grad=True)
    text = torch.randn(b, 8, d)
    temb = torch.randn(b, s, 6, d)
    rope = model.rope(torch.randn(b, 4, 1, 8, 6))
    ref = block(x, text, temb, rope)
    out = fused_block(x, text, temb, rope)
    assert rel_err(out, ref) < 2e-5
    (gr,) = torch.autograd.grad(ref.sum(), x)
    (go,) = torch.autograd.grad(out.sum(), x)
    assert rel_err(go, gr) < 1e-4


def test_remove_restores_diffusers_forward_and_rejects_other_models():
    model = build_wan("tiny", layers=1)
    before = type(model.blocks[0]).forward
    apply_fused_ops(model)
    apply_fused_ops(model)  # twice is a no-op
    assert model.blocks[0].forward.func is not before
    remove_fused_ops(model)
    assert not is_fused(model)
    assert "forward" not in vars(model.blocks[0])
    with pytest.raises(ValueError, match="no WanTransformerBlock"):
        apply_fused_ops(torch.nn.Linear(2, 2))
    # Weights and state dict are untouched by patching.
    sd = {k: v.clone() for k, v in model.state_dict().items()}
    apply_fused_ops(model)
    assert all(torch.equal(sd[k], v) for k, v in model.state_dict().items())


def test_fused_model_under_torch_compile():
    ref = build_wan("tiny", layers=2, seed=5)
    fused = apply_fused_ops(copy.deepcopy(ref))
    compiled = torch.compile(fused)
    inputs = random_batch(ref, 1, 5, 32, 48, text_len=8)
    out_ref, grads_ref = run(ref, inputs)
    out, grads = run(compiled, inputs, params=fused)
    assert rel_err(out, out_ref) < 1e-4
    for name in grads_ref:
        assert rel_err(grads[name], grads_ref[name]) < 1e-3, name


def test_patched_model_round_trips_through_torch_save(tmp_path):
    ref = build_wan("tiny", layers=2, seed=6)
    fused = apply_fused_ops(copy.deepcopy(ref))
    torch.save(fused, tmp_path / "model.pt")
    back = torch.load(tmp_path / "model.pt", weights_only=False)
    assert is_fused(back)
    inputs = random_batch(ref, 1, 5, 32, 48, text_len=8)
    out_ref, grads_ref = run(fused, inputs)
    out, grads = run(back, inputs)
    torch.testing.assert_close(out, out_ref, rtol=0, atol=0)
    for name in grads_ref:
        torch.testing.assert_close(grads[name], grads_ref[name], rtol=0, atol=0)
    # Still patched block by block, and undo works on the loaded copy.
    remove_fused_ops(back)
    assert not is_fused(back)
    assert "forward" not in vars(back.blocks[0])


def test_deepcopy_of_a_patched_model_binds_its_own_blocks():
    fused = apply_fused_ops(build_wan("tiny", layers=1, seed=7))
    clone = copy.deepcopy(fused)
    with torch.no_grad():
        for p in clone.parameters():
            p.add_(0.1)
    inputs = random_batch(fused, 1, 5, 32, 48, text_len=8)
    a = fused(**inputs, return_dict=False)[0]
    b = clone(**inputs, return_dict=False)[0]
    assert not torch.equal(a, b), "the copy ran the original's blocks"


def test_build_wan_and_random_batch_are_the_familys():
    # build_wan is FAMILY.build (its checks too); the batch is in the patch embedding's dtype,
    # also where the model's first parameter (the modulation table) stays fp32.
    model = build_wan("tiny", layers=1, dtype=torch.float64, seed=8)
    same = FAMILY.build("tiny", layers=1, dtype=torch.float64, seed=8)
    pairs = zip(model.parameters(), same.parameters(), strict=True)
    assert all(torch.equal(a, b) for a, b in pairs)
    assert next(model.parameters()).dtype == torch.float32
    g, h = (torch.Generator().manual_seed(9) for _ in range(2))
    inputs = random_batch(model, 1, 5, 32, 48, generator=g)
    assert inputs["hidden_states"].dtype == inputs["encoder_hidden_states"].dtype == torch.float64
    family_inputs = FAMILY.random_batch(model, 1, 5, 32, 48, generator=h)
    assert all(torch.equal(inputs[k], family_inputs[k]) for k in inputs)
    for bad in (0, True, 2.5):
        with pytest.raises(ValueError, match="layers must be an integer >= 1"):
            build_wan("tiny", layers=bad)
