"""The installed package: version, and an import that never touches a GPU."""

import os
import re
import subprocess
import sys

import pytest

import adaptiveload

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_version_matches_pyproject():
    with open(os.path.join(ROOT, "pyproject.toml")) as f:
        version = re.search(r'^version = "([^"]+)"', f.read(), re.M).group(1)
    assert adaptiveload.__version__ == version


@pytest.mark.distributed
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

    import adaptiveload.ops  # noqa: F401  (loads the op library)

    for name in (
        "layer_norm_modulate",
        "_layer_norm_modulate_backward",
        "gated_residual_layer_norm_modulate",
        "_gated_residual_layer_norm_modulate_backward",
    ):
        assert hasattr(torch.ops.adaptiveload, name), name


def test_wan_geometry_has_one_source():
    from adaptiveload import wan
    from adaptiveload.models import wan as models_wan

    assert adaptiveload.wan_seq_len is wan.wan_seq_len
    for name in ("PATCH", "VAE_STRIDE", "TEXT_LEN", "CONFIGS", "latent_shape"):
        assert getattr(models_wan, name) is getattr(wan, name), name
    assert wan.wan_seq_len(81, 720, 1280) == 75600
    assert wan.latent_shape(81, 480, 832, 16) == (16, 21, 60, 104)


@pytest.mark.distributed
def test_wan_module_needs_neither_torch_nor_diffusers():
    # Loaded on its own, with torch and diffusers made unimportable.
    code = (
        "import importlib.util, sys; sys.modules['torch'] = sys.modules['diffusers'] = None; "
        f"spec = importlib.util.spec_from_file_location('w', {os.path.join(ROOT, 'python', 'adaptiveload', 'wan.py')!r}); "
        "w = importlib.util.module_from_spec(spec); spec.loader.exec_module(w); "
        "print(w.wan_seq_len(1, 480, 832))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["1560"]


@pytest.mark.distributed
def test_import_loads_the_sampler_without_the_op_library():
    # The sampler must work where the op build does not: `import adaptiveload` leaves
    # adaptiveload._C alone, and only the ops need it (then the error says so).
    code = (
        "import sys; sys.modules['adaptiveload._C'] = None\n"
        "import adaptiveload\n"
        "assert 'adaptiveload._C' not in sys.modules or sys.modules['adaptiveload._C'] is None\n"
        "s = adaptiveload.AdaptiveBatchSampler([100, 200, 300], 1000, num_replicas=1, rank=0)\n"
        "assert sorted(i for b in s for i in b) == [0, 1, 2]\n"
        "try:\n"
        "    adaptiveload.layer_norm_modulate\n"
        "except ImportError as e:\n"
        "    print('ops unavailable:', e)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "ops unavailable" in done.stdout
