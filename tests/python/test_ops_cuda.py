"""CUDA only, both norms: the CUDA kernels against the CPU ones, CUDA graphs, streams, a model's
full shapes deterministic and right (Wan 14B's, LTX-Video 2B's), and more than 2^31 elements.
References: op_refs.py."""

from __future__ import annotations

import pytest
import torch

from adaptiveload import ops
from op_refs import CUDA, NORMS, make_mod, mod, rand, reference, reference_rms

pytestmark = pytest.mark.cuda


# (norm, hidden size, modulation): Wan 14B's chunks of (B, 6, D), LTX-Video 2B's ada views.
@pytest.mark.parametrize("norm,d,mod_kind", [("layer", 5120, "chunk"), ("rms", 2048, "ltx_token")])
def test_cuda_matches_cpu(norm, d, mod_kind):
    op = NORMS[norm].op
    gen = torch.Generator().manual_seed(8)
    x = rand((2, 33, d), torch.float32, "cpu", gen)
    shift, scale = (mod(mod_kind, x.shape, torch.float32, "cpu", gen, k) for k in (0, 1))
    y_cpu = op(x, shift, scale)
    y_gpu = op(x.cuda(), shift.cuda(), scale.cuda())
    torch.testing.assert_close(y_gpu.cpu(), y_cpu, atol=1e-4, rtol=1e-4)


def wan_step(gen):
    """The LayerNorm op and its gradients, modulated per sample (Wan)."""
    x = rand((2, 256, 3072), torch.bfloat16, "cuda", gen).requires_grad_()
    shift, scale = (
        make_mod("per_sample", x.shape, torch.float32, "cuda", gen).requires_grad_()
        for _ in range(2)
    )
    dy = torch.randn_like(x)

    def step():
        y = ops.layer_norm_modulate(x, shift, scale)
        return (y, *torch.autograd.grad(y, [x, shift, scale], dy))

    return step


def ltx_step(gen):
    """The RMSNorm ops, plain and fused, and their gradients, modulated by views of one
    (B, S, 6, D) ada_values (LTX-Video)."""
    x = rand((2, 256, 2048), torch.bfloat16, "cuda", gen).requires_grad_()
    res = rand((2, 256, 2048), torch.bfloat16, "cuda", gen).requires_grad_()
    ada = rand((2, 256, 6, 2048), torch.bfloat16, "cuda", gen, 0.3).requires_grad_()
    dy = torch.randn_like(x)

    def step():
        shift, scale, gate = ada.unbind(dim=2)[:3]
        y = ops.rms_norm_modulate(x, shift, scale)
        r, y2 = ops.gated_residual_rms_norm_modulate(res, x, gate, shift, scale)
        return (y, r, y2, *torch.autograd.grad([y, r, y2], [x, res, ada], [dy, dy, dy]))

    return step


@pytest.mark.parametrize("workload", [wan_step, ltx_step], ids=["layer", "rms"])
def test_cuda_graph_capture(workload):
    gen = torch.Generator().manual_seed(6)
    # Inputs, warm-up and capture all on one side stream: autograd syncs with the stream a
    # leaf was made on, and the legacy default stream may not be touched during capture.
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        step = workload(gen)
        eager = step()
        step()  # warm up
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=s):
        captured = step()
    graph.replay()
    torch.cuda.synchronize()
    for a, b in zip(eager, captured, strict=True):
        assert torch.equal(a, b)


def test_cuda_non_default_stream():
    x = torch.randn(64, 1536, device="cuda", dtype=torch.bfloat16)
    m = torch.randn(1536, device="cuda")
    ref = ops.layer_norm_modulate(x, m, m)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        y = ops.layer_norm_modulate(x, m, m)
    torch.cuda.current_stream().wait_stream(s)
    assert torch.equal(y, ref)


def test_cuda_large_deterministic():
    gen = torch.Generator(device="cuda").manual_seed(0)
    shape = (2, 32760, 5120)
    x = torch.randn(shape, device="cuda", dtype=torch.bfloat16, generator=gen).requires_grad_()
    e = torch.randn(2, 6, 5120, device="cuda", generator=gen).requires_grad_()
    shift, scale = e.chunk(6, dim=1)[0], e.chunk(6, dim=1)[1]
    dy = torch.randn(shape, device="cuda", dtype=torch.bfloat16, generator=gen)
    first = torch.autograd.grad(ops.layer_norm_modulate(x, shift, scale), [x, e], dy)
    second = torch.autograd.grad(ops.layer_norm_modulate(x, shift, scale), [x, e], dy)
    for a, b in zip(first, second, strict=True):
        assert torch.equal(a, b)
    # Spot-check a few rows of dx and the full de against a float64 reference.
    rows = [0, 17, 32759]
    xs = x.detach()[:, rows].double().requires_grad_()
    y_ref = reference(xs, shift.detach().double(), scale.detach().double())
    (dx_ref,) = torch.autograd.grad(y_ref, xs, dy[:, rows].double())
    torch.testing.assert_close(first[0][:, rows].double(), dx_ref, atol=5e-2, rtol=2e-2)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_cuda_ltx_shape_deterministic(dtype):
    # LTX-Video 2B: hidden 2048, per-token modulation from ada_values (B, S, 6, D).
    gen = torch.Generator(device="cuda").manual_seed(0)
    shape = (2, 20480, 2048)
    x = torch.randn(shape, device="cuda", dtype=torch.bfloat16, generator=gen).requires_grad_()
    ada = torch.randn(2, 20480, 6, 2048, device="cuda", dtype=dtype, generator=gen)
    ada = (0.3 * ada).requires_grad_()
    dy = torch.randn(shape, device="cuda", dtype=torch.bfloat16, generator=gen)

    def grads():
        shift, scale = ada.unbind(dim=2)[:2]
        return torch.autograd.grad(ops.rms_norm_modulate(x, shift, scale), [x, ada], dy)

    first, second = grads(), grads()
    for a, b in zip(first, second, strict=True):
        assert torch.equal(a, b)
    rows = [0, 17, 20479]
    xs = x.detach()[:, rows].double().requires_grad_()
    shift, scale = (t.detach()[:, rows].double() for t in ada.unbind(dim=2)[:2])
    (dx_ref,) = torch.autograd.grad(reference_rms(xs, shift, scale), xs, dy[:, rows].double())
    torch.testing.assert_close(first[0][:, rows].double(), dx_ref, atol=5e-2, rtol=2e-2)


def _free_bytes():
    free, _ = torch.cuda.mem_get_info()
    return free


@pytest.mark.skipif(CUDA and _free_bytes() < 40 * 2**30, reason="needs ~40 GiB of GPU memory")
def test_cuda_more_than_2_31_elements():
    d = 5120
    rows = 2**31 // d + 8
    x = torch.empty(1, rows, d, device="cuda", dtype=torch.bfloat16)
    x.normal_()
    assert x.numel() > 2**31
    shift = torch.randn(1, 1, d, device="cuda", requires_grad=True)
    scale = torch.randn(1, 1, d, device="cuda")
    x.requires_grad_()
    y = ops.layer_norm_modulate(x, shift, scale)
    check = [0, rows // 2, rows - 1]
    ref = reference(x.detach()[:, check].double(), shift.double(), scale.double())
    torch.testing.assert_close(y[:, check].double(), ref, atol=6e-2, rtol=2e-2)
    dy = torch.ones_like(y)
    dx, dshift = torch.autograd.grad(y, [x, shift], dy)
    assert dx[:, -1].isfinite().all()
    torch.testing.assert_close(dshift, torch.full_like(dshift, float(rows)))
