"""StreamingBatchSampler over a memory-mapped ``.npy`` that is rewritten in place under it (what
re-running a preprocessing job with ``np.save`` on the same path does): the next epoch's planning
reads values the sampler was not made for, and must refuse them with a Python exception naming
the index and the value, never abort the process or plan them. Each case runs in a subprocess,
so that a crash fails its test rather than the suite."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LENGTHS = [256, 512, 1024, 2048]  # the table's distinct lengths; its dense lookup covers < 4096
MAX_TOKENS = 8192

# One epoch planned and drawn over the files as made, then the files rewritten in place with
# np.save on the same paths, then the next epoch drawn. Prints what the second epoch raised.
SCRIPT = textwrap.dedent(
    """
    import sys
    import numpy as np
    from adaptiveload import StreamingBatchSampler

    lens_path, ids_path, new_lens_path, new_ids_path, skip, max_tokens = sys.argv[1:7]
    ids = None if ids_path == "-" else np.load(ids_path, mmap_mode="r")
    s = StreamingBatchSampler(
        np.load(lens_path, mmap_mode="r"), int(max_tokens), group_ids=ids, num_replicas=2, rank=0,
        segment_samples=500, lookahead_steps=4, seed=3,
        on_oversize="skip" if skip == "1" else "error",
    )
    drawn = sum(len(b) for b in s)
    print("first epoch", drawn, flush=True)
    np.save(lens_path, np.load(new_lens_path))
    if ids is not None:
        np.save(ids_path, np.load(new_ids_path))
    s.set_epoch(1)
    try:
        drawn = sum(len(b) for b in s)
    except Exception as e:
        print(f"RAISED {type(e).__name__}: {e}", flush=True)
    else:
        print("NO ERROR", drawn, flush=True)
    """
)


def run_case(tmp_path, lens, new_lens, ids=None, new_ids=None, skip=False):
    paths = {}
    for name, a in (("lens", lens), ("ids", ids), ("new_lens", new_lens), ("new_ids", new_ids)):
        if a is None:
            paths[name] = "-"
            continue
        paths[name] = str(tmp_path / f"{name}.npy")
        np.save(paths[name], a)
    args = [paths[k] for k in ("lens", "ids", "new_lens", "new_ids")]
    args += ["1" if skip else "0", str(MAX_TOKENS)]
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python"))
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, *args], capture_output=True, text=True, env=env, timeout=120
    )
    return done


def lengths(n, rng, dtype):
    return rng.choice(LENGTHS, size=n).astype(dtype)


def assert_refused(done, index_value=None):
    """The subprocess lived, its first epoch ran, and its second raised a clear ValueError."""
    out = done.stdout + done.stderr
    assert done.returncode == 0, f"the process died (return code {done.returncode}):\n{out}"
    assert "first epoch" in done.stdout, out
    assert "RAISED ValueError" in done.stdout, out
    assert "changed under the sampler" in done.stdout, out
    assert "rename it over the old one" in done.stdout, out
    if index_value is not None:
        i, v = index_value
        assert f"index {i} holds {v}" in done.stdout, out


# New values: a length in the dense lookup that the table never saw, one past it but within the
# caps, zero (np.zeros: the file of a job that failed half-way), a negative one, one over the cap.
CASES = {
    "new in-cap length": lambda n: np.full(n, 300),
    "new in-cap length past the dense lookup": lambda n: np.full(n, 6000),
    "zeros": lambda n: np.zeros(n),
    "negative": lambda n: np.full(n, -7),
    "over the cap": lambda n: np.full(n, 10 * MAX_TOKENS),
}


@pytest.mark.distributed
@pytest.mark.parametrize("dtype", [np.int32, np.int64])
@pytest.mark.parametrize("case", sorted(CASES))
def test_changed_lengths_are_refused(tmp_path, case, dtype):
    rng = np.random.default_rng()
    n = int(rng.integers(2000, 3000))
    lens = lengths(n, rng, dtype)
    new = lens.copy()
    # A random half of the samples changed (the next epoch meets one in its first segment).
    changed = rng.random(n) < 0.5
    new[changed] = CASES[case](int(changed.sum())).astype(dtype)
    assert_refused(run_case(tmp_path, lens, new))


@pytest.mark.distributed
def test_one_changed_length_is_named(tmp_path):
    rng = np.random.default_rng()
    n = 1500  # a single segment: every sample is read when the epoch starts
    lens = lengths(n, rng, np.int64)
    new = lens.copy()
    i = int(rng.integers(n))
    new[i] = 777
    assert_refused(run_case(tmp_path, lens, new), (i, 777))


@pytest.mark.distributed
def test_over_the_cap_is_refused_when_skipping_too(tmp_path):
    # on_oversize="skip" skips samples over a cap the sampler was made with; a sample that turns
    # into one after is not skipped silently but refused as a change.
    rng = np.random.default_rng()
    n = 2000
    lens = lengths(n, rng, np.int32)
    new = lens.copy()
    new[rng.random(n) < 0.3] = 10 * MAX_TOKENS
    assert_refused(run_case(tmp_path, lens, new, skip=True))


@pytest.mark.distributed
@pytest.mark.parametrize("bad", [-1, 5, 1 << 20])
def test_changed_group_ids_are_refused(tmp_path, bad):
    rng = np.random.default_rng()
    n = 2000
    lens = lengths(n, rng, np.int32)
    ids = rng.integers(0, 3, n).astype(np.int64)
    ids[:3] = [0, 1, 2]
    new_ids = ids.copy()
    new_ids[rng.random(n) < 0.5] = bad  # 3 groups: 5 and 2^20 are out of range
    done = run_case(tmp_path, lens, lens, ids, new_ids)
    out = done.stdout + done.stderr
    assert done.returncode == 0, f"the process died (return code {done.returncode}):\n{out}"
    assert "RAISED ValueError" in done.stdout and "group" in done.stdout, out
    assert "changed under the sampler" in done.stdout, out


@pytest.mark.distributed
def test_values_it_was_made_for_still_plan(tmp_path):
    # Rewritten with lengths it knows (shuffled): nothing to refuse, the epoch is planned whole.
    # (A change between epochs by stat is the Python side's to detect.)
    rng = np.random.default_rng()
    lens = lengths(2000, rng, np.int32)
    done = run_case(tmp_path, lens, rng.permutation(lens))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "NO ERROR" in done.stdout, done.stdout
