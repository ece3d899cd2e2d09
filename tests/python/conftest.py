"""Fixtures shared by the Python suites (a fresh seed, modelled calibration times), and the cuda
marker's skip."""

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


@pytest.fixture
def modelled_times(monkeypatch):
    """Calibration timed in modelled milliseconds instead of by the clock: ``time_call`` (what
    every ``StepTimer`` times with) runs the step as often as it would, and returns 1 ms plus
    1 ms per million floating-point operations the step ran (``FlopCounterMode``): a function of
    the batch, the shape, the checkpointed blocks and the split, never of how busy the machine
    is. On a loaded CPU a tiny model's clock times come in no order, and a fit of them fails
    ("do not grow with tokens"). Returns the times handed out, in order. The clock itself is
    tested alone (test_calibrate_any_model: time_call and StepTimer measure something > 0)."""
    from torch.utils.flop_counter import FlopCounterMode

    import adaptiveload.timing as timing

    given = []

    def time_call(fn, device, warmup=2, repeat=5):
        for _ in range(warmup + repeat - 1):
            fn()
        with FlopCounterMode(display=False) as flops:  # the same work each call: count one
            fn()
        given.append(1.0 + flops.get_total_flops() / 1e6)
        return given[-1]

    monkeypatch.setattr(timing, "time_call", time_call)
    return given
