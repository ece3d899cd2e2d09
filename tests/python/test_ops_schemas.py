"""The registered schemas of the norm-modulate ops, pinned: the C++ builds them from one row per
variant (csrc/ops/variants.h), so a change to that machinery must leave them byte for byte as
they were written by hand. And every variant has its public function."""

from __future__ import annotations

import pytest
import torch

from adaptiveload import ops

SCHEMAS = {
    "layer_norm_modulate": (
        "adaptiveload::layer_norm_modulate(Tensor x, Tensor shift, Tensor scale, Tensor? weight, "
        "Tensor? bias, float eps, ScalarType? out_dtype) -> (Tensor y, Tensor mean, Tensor rstd)"
    ),
    "_layer_norm_modulate_backward": (
        "adaptiveload::_layer_norm_modulate_backward(Tensor dy, Tensor x, Tensor shift, "
        "Tensor scale, Tensor? weight, Tensor? bias, Tensor mean, Tensor rstd, "
        "bool[5] output_mask) -> (Tensor dx, Tensor dshift, Tensor dscale, Tensor dweight, "
        "Tensor dbias)"
    ),
    "gated_residual_layer_norm_modulate": (
        "adaptiveload::gated_residual_layer_norm_modulate(Tensor residual, Tensor h, Tensor gate, "
        "Tensor shift, Tensor scale, Tensor? weight, Tensor? bias, float eps, "
        "ScalarType? out_dtype) -> (Tensor r, Tensor y, Tensor mean, Tensor rstd)"
    ),
    "_gated_residual_layer_norm_modulate_backward": (
        "adaptiveload::_gated_residual_layer_norm_modulate_backward(Tensor? dr, Tensor dy, "
        "Tensor r, Tensor h, Tensor gate, Tensor shift, Tensor scale, Tensor? weight, "
        "Tensor? bias, Tensor mean, Tensor rstd, bool[7] output_mask) -> (Tensor dresidual, "
        "Tensor dh, Tensor dgate, Tensor dshift, Tensor dscale, Tensor dweight, Tensor dbias)"
    ),
    "rms_norm_modulate": (
        "adaptiveload::rms_norm_modulate(Tensor x, Tensor shift, Tensor scale, Tensor? weight, "
        "float eps, ScalarType? out_dtype) -> (Tensor y, Tensor rstd)"
    ),
    "_rms_norm_modulate_backward": (
        "adaptiveload::_rms_norm_modulate_backward(Tensor dy, Tensor x, Tensor shift, "
        "Tensor scale, Tensor? weight, Tensor rstd, bool[4] output_mask) -> (Tensor dx, "
        "Tensor dshift, Tensor dscale, Tensor dweight)"
    ),
    "gated_residual_rms_norm_modulate": (
        "adaptiveload::gated_residual_rms_norm_modulate(Tensor residual, Tensor h, Tensor gate, "
        "Tensor shift, Tensor scale, Tensor? weight, float eps, ScalarType? out_dtype) -> "
        "(Tensor r, Tensor y, Tensor rstd)"
    ),
    "_gated_residual_rms_norm_modulate_backward": (
        "adaptiveload::_gated_residual_rms_norm_modulate_backward(Tensor? dr, Tensor dy, "
        "Tensor r, Tensor h, Tensor gate, Tensor shift, Tensor scale, Tensor? weight, "
        "Tensor rstd, bool[6] output_mask) -> (Tensor dresidual, Tensor dh, Tensor dgate, "
        "Tensor dshift, Tensor dscale, Tensor dweight)"
    ),
}


@pytest.mark.parametrize("name", sorted(SCHEMAS))
def test_schema_is_pinned(name):
    assert str(getattr(torch.ops.adaptiveload, name).default._schema) == SCHEMAS[name]


def test_every_variant_has_its_public_function():
    import adaptiveload

    public = {name for name in SCHEMAS if not name.startswith("_")}
    assert {v.name for v in ops._VARIANTS} == public
    assert set(ops.__all__) == public
    for v in ops._VARIANTS:
        assert callable(getattr(ops, v.name)), v.name
        assert getattr(adaptiveload, v.name) is getattr(ops, v.name), v.name
        assert callable(getattr(ops._C, v.name)), v.name  # the direct caller
