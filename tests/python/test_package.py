"""The installed package: version, and an import that never touches a GPU."""

import os
import re
import subprocess
import sys

import adaptiveload

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_version_matches_pyproject():
    with open(os.path.join(ROOT, "pyproject.toml")) as f:
        version = re.search(r'^version = "([^"]+)"', f.read(), re.M).group(1)
    assert adaptiveload.__version__ == version


def test_import_does_not_initialize_cuda():
    code = (
        "import adaptiveload, torch; print(adaptiveload.__version__, torch.cuda.is_initialized())"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert out.split() == [adaptiveload.__version__, "False"]


def test_ops_are_registered_with_torch():
    import torch

    for name in (
        "layer_norm_modulate",
        "_layer_norm_modulate_backward",
        "gated_residual_layer_norm_modulate",
        "_gated_residual_layer_norm_modulate_backward",
    ):
        assert hasattr(torch.ops.adaptiveload, name), name
