"""Fixtures shared by the Python suites."""

import numpy as np
import pytest


@pytest.fixture
def seed():
    """A fresh seed per test, printed (pytest shows it when the test fails)."""
    value = int(np.random.SeedSequence().entropy % 2**32)
    print(f"seed {value}")
    return value
