"""StreamingBatchSampler over a memory-mapped ``.npy`` that is rewritten in place under it (what
re-running a preprocessing job with ``np.save`` on the same path does): the next epoch's planning
reads values the sampler was not made for, and must refuse them with a Python exception naming
the index and the value, never abort the process or plan them. Every case runs in one subprocess,
one after the other, so that a crash fails its case (and names it) rather than the suite."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import adaptiveload

LENGTHS = [256, 512, 1024, 2048]  # the table's distinct lengths; its dense lookup covers < 4096
MAX_TOKENS = 8192

# Per case: one epoch planned and drawn over the files as made, then the files rewritten in
# place with np.save on the same paths, then the next epoch drawn; what it raised is printed.
SCRIPT = textwrap.dedent(
    """
    import json, os, sys
    import numpy as np
    from adaptiveload import StreamingBatchSampler

    for case in json.load(open(sys.argv[1])):
        print("START", case["name"], flush=True)
        ids = None if case["ids"] is None else np.load(case["ids"], mmap_mode="r")
        s = StreamingBatchSampler(
            np.load(case["lens"], mmap_mode="r"), case["max_tokens"], group_ids=ids,
            num_replicas=2, rank=0, segment_samples=500, lookahead_steps=4, seed=3,
            on_oversize="skip" if case["skip"] else "error",
        )
        sum(len(b) for b in s)
        # Rewritten in place with the old modification time (a rewrite within one tick of the
        # file system's clock): the sampler's check of the file cannot see it, so the planner's
        # checks of what it reads must.
        for path, new in (("lens", "new_lens"), ("ids", "new_ids")):
            if case[path] is not None:
                st = os.stat(case[path])
                np.save(case[path], np.load(case[new]))
                os.utime(case[path], ns=(st.st_atime_ns, st.st_mtime_ns))
        s.set_epoch(1)
        try:
            sum(len(b) for b in s)
        except Exception as e:
            outcome = f"RAISED {type(e).__name__}: {e}"
        else:
            outcome = "NO ERROR"
        print("OUTCOME", json.dumps([case["name"], outcome]), flush=True)
        del s, ids
    """
)


def lengths(n, rng, dtype):
    return rng.choice(LENGTHS, size=n).astype(dtype)


def changed_half(n, dtype, value):
    """Lengths before and after a random half of them turned into `value`."""
    rng = np.random.default_rng()
    lens = lengths(n, rng, dtype)
    new = lens.copy()
    new[rng.random(n) < 0.5] = value
    return {"lens": lens, "new_lens": new}


def one_changed(value):
    """1,500 samples (one segment: every sample is read as the epoch starts), one changed."""
    rng = np.random.default_rng()
    lens = lengths(1500, rng, np.int64)
    new = lens.copy()
    i = int(rng.integers(len(lens)))
    new[i] = value
    return {"lens": lens, "new_lens": new, "expect": f"index {i} holds {value}"}


def changed_groups(value):
    """3 groups, a random half of the ids turned into `value`."""
    rng = np.random.default_rng()
    lens = lengths(2000, rng, np.int32)
    ids = rng.integers(0, 3, len(lens)).astype(np.int64)
    ids[:3] = [0, 1, 2]
    new_ids = ids.copy()
    new_ids[rng.random(len(ids)) < 0.5] = value
    return {"lens": lens, "new_lens": lens, "ids": ids, "new_ids": new_ids, "expect": "group"}


def unchanged_values():
    """Rewritten with the lengths it knows, shuffled: nothing to refuse (a change between epochs
    by stat is the Python side's to detect)."""
    rng = np.random.default_rng()
    lens = lengths(2000, rng, np.int32)
    return {"lens": lens, "new_lens": rng.permutation(lens)}


# New values: a length in the dense lookup that the table never saw, one past it but within the
# caps, zero (np.zeros: the file of a job that failed half-way), a negative one, one over the cap.
VALUES = {
    "new in-cap length": 300,
    "new in-cap length past the dense lookup": 6000,
    "zeros": 0,
    "negative": -7,
    "over the cap": 10 * MAX_TOKENS,
}
REFUSED = [f"{name} {np.dtype(t).name}" for name in sorted(VALUES) for t in (np.int32, np.int64)]
REFUSED += ["one changed length", "over the cap, skipping oversize"]
REFUSED += [f"group id {g}" for g in (-1, 5, 1 << 20)]


def cases():
    out = {}
    for name, value in VALUES.items():
        for dtype in (np.int32, np.int64):
            out[f"{name} {np.dtype(dtype).name}"] = changed_half(2500, dtype, value)
    out["one changed length"] = one_changed(777)
    # Skipped are the samples over a cap the sampler was made with; one that turns into such a
    # sample after is refused as a change, not skipped silently.
    out["over the cap, skipping oversize"] = changed_half(2000, np.int32, 10 * MAX_TOKENS)
    out["over the cap, skipping oversize"]["skip"] = True
    for g in (-1, 5, 1 << 20):  # 3 groups: 5 and 2^20 are out of range
        out[f"group id {g}"] = changed_groups(g)
    out["values it was made for"] = unchanged_values()
    return out


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory):
    """Every case run in one subprocess: {name: what its second epoch did}, the return code and
    the output (a case missing from the dict did not finish)."""
    folder = tmp_path_factory.mktemp("file_change")
    manifest = []
    for k, (name, case) in enumerate(cases().items()):
        entry = {"name": name, "skip": case.get("skip", False), "max_tokens": MAX_TOKENS}
        for key in ("lens", "new_lens", "ids", "new_ids"):
            entry[key] = None
            if case.get(key) is not None:
                entry[key] = str(folder / f"{k}_{key}.npy")
                np.save(entry[key], case[key])
        entry["expect"] = case.get("expect")
        manifest.append(entry)
    path = folder / "cases.json"
    path.write_text(json.dumps(manifest))
    # The subprocess imports the package this test imports (installed, or built in place).
    here = os.path.dirname(os.path.dirname(adaptiveload.__file__))
    paths = [here] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(paths))
    command = [sys.executable, "-c", SCRIPT, str(path)]
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=300)
    results = {}
    for line in done.stdout.splitlines():
        if line.startswith("OUTCOME "):
            name, outcome = json.loads(line[len("OUTCOME ") :])
            results[name] = outcome
    expect = {e["name"]: e["expect"] for e in manifest}
    return results, expect, done


def outcome_of(outcomes, name):
    results, expect, done = outcomes
    if name not in results:
        pytest.fail(
            f"{name}: the process died (return code {done.returncode}) before the case ended:\n"
            f"{done.stdout[-2000:]}\n{done.stderr[-2000:]}"
        )
    return results[name], expect[name]


@pytest.mark.distributed
@pytest.mark.parametrize("name", REFUSED)
def test_changed_values_are_refused(outcomes, name):
    outcome, expect = outcome_of(outcomes, name)
    assert outcome.startswith("RAISED ValueError"), outcome
    assert "changed under the sampler" in outcome, outcome
    assert "rename it over the old one" in outcome, outcome
    if expect is not None:
        assert expect in outcome, outcome


@pytest.mark.distributed
def test_values_it_was_made_for_still_plan(outcomes):
    outcome, _ = outcome_of(outcomes, "values it was made for")
    assert outcome == "NO ERROR", outcome
