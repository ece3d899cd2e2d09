"""CUDA only, the RMSNorm ops: against the CPU kernels, CUDA graphs, LTX-Video's shape
deterministic, explicit tuning-table rows of the RMS kind, an RMS twin for every LayerNorm row.
References, helpers and the accuracy rule are test_ops.py's and test_ops_rms.py's."""

from __future__ import annotations

import pytest
import torch

from adaptiveload import ops
from test_ops import EPS, cuda_only, rand, reference_rms
from test_ops_rms import mod

# ---------------------------------------------------------------- CUDA only


@cuda_only
def test_cuda_matches_cpu():
    gen = torch.Generator().manual_seed(8)
    x = rand((2, 33, 2048), torch.float32, "cpu", gen)
    shift, scale = (mod("ltx_token", x.shape, torch.float32, "cpu", gen, k) for k in (0, 1))
    y_cpu = ops.rms_norm_modulate(x, shift, scale)
    y_gpu = ops.rms_norm_modulate(x.cuda(), shift.cuda(), scale.cuda())
    torch.testing.assert_close(y_gpu.cpu(), y_cpu, atol=1e-4, rtol=1e-4)


@cuda_only
def test_cuda_graph_capture():
    gen = torch.Generator().manual_seed(6)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        x = rand((2, 256, 2048), torch.bfloat16, "cuda", gen).requires_grad_()
        res = rand((2, 256, 2048), torch.bfloat16, "cuda", gen).requires_grad_()
        ada = rand((2, 256, 6, 2048), torch.bfloat16, "cuda", gen, 0.3).requires_grad_()
        dy = torch.randn_like(x)

    def step():
        shift, scale, gate = ada.unbind(dim=2)[:3]
        y = ops.rms_norm_modulate(x, shift, scale)
        r, y2 = ops.gated_residual_rms_norm_modulate(res, x, gate, shift, scale)
        return (y, r, y2, *torch.autograd.grad([y, r, y2], [x, res, ada], [dy, dy, dy]))

    with torch.cuda.stream(s):
        eager = step()
        step()  # warm up
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=s):
        captured = step()
    graph.replay()
    torch.cuda.synchronize()
    for a, b in zip(eager, captured, strict=True):
        assert torch.equal(a, b)


@cuda_only
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


@cuda_only
def test_explicit_configurations_check_the_norm():
    x = torch.randn(2, 8, 1536, device="cuda", dtype=torch.bfloat16)
    m = torch.randn(2, 1, 1536, device="cuda")
    rms_fwd = torch.ops.adaptiveload._rms_norm_modulate_with_config
    ln_fwd = torch.ops.adaptiveload._layer_norm_modulate_with_config
    with pytest.raises(RuntimeError, match="compiled for layer, not rms"):
        rms_fwd(x, None, None, m, m, None, EPS, None, "fwd.bf16.plain.block.warp6x2x1")
    with pytest.raises(RuntimeError, match="compiled for rms, not layer"):
        ln_fwd(x, None, None, m, m, None, None, EPS, None, "fwd.bf16.rms.plain.block.warp6x2x1")
    _, y, rstd = rms_fwd(x, None, None, m, m, None, EPS, None, "fwd.bf16.rms.plain.block.warp6x2x1")
    mask = [True, False, False, True, True, False]
    with pytest.raises(RuntimeError, match="compiled for layer, not rms"):
        torch.ops.adaptiveload._rms_norm_modulate_backward_with_config(
            None, y, x, None, None, m, m, None, rstd, mask, "bwd.bf16.dy16.lean2"
        )


# CUDA builds register the tables whether or not a GPU is present.
HAS_TABLES = bool(ops._tuning_table())


@pytest.mark.skipif(not HAS_TABLES, reason="a CPU-only build has no CUDA tuning tables")
def test_every_layer_norm_row_has_an_rms_twin():
    # The RMSNorm rows repeat the LayerNorm rows' keys, kernels and settings (docs/ops.md), so
    # an RMSNorm problem runs the kernel its LayerNorm twin would.
    rows = ops._tuning_table()
    layer = [r for r in rows if r["norm"] == "layer"]
    rms = {r["id"]: r for r in rows if r["norm"] == "rms"}
    assert layer and len(rms) == len(layer)
    for row in layer:
        direction, dtype, rest = row["id"].split(".", 2)
        twin = rms[f"{direction}.{dtype}.rms.{rest}"]
        assert twin["kernel"] == row["kernel"][:-1] + ",rms>"
        same = {k: v for k, v in row.items() if k not in ("id", "norm", "kernel")}
        assert {k: v for k, v in twin.items() if k not in ("id", "norm", "kernel")} == same
