"""Fixtures shared by the Python suites, and the cuda marker's skip."""

import numpy as np
import pytest


def pytest_collection_modifyitems(config, items):
    """Tests marked ``cuda`` (whole tests or their CUDA parameters) skip without a GPU, so that
    ``-m cuda`` selects every test that needs one and ``-m 'not cuda'`` the others."""
    marked = [item for item in items if item.get_closest_marker("cuda") is not None]
    if not marked:
        return
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs CUDA")
    for item in marked:
        item.add_marker(skip)


@pytest.fixture
def seed():
    """A fresh seed per test, printed (pytest shows it when the test fails)."""
    value = int(np.random.SeedSequence().entropy % 2**32)
    print(f"seed {value}")
    return value
