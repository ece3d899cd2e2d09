"""benchmarks/fidelity.py: each control holds exactly its arm's micro-batches in steps of the
same sizes, the learning rate is the same at every step for every arm, validation patterns are
never trained on, every seed draws its own data, a step's gradient batched by shape is the
per-micro-batch one, the verdicts are the ones claimed, and ``--quick`` runs end to end."""

import csv
import json
import os
import sys

import numpy as np
import pytest
import torch

pytest.importorskip("diffusers")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
import fidelity as fb  # noqa: E402
import fidelity_arms as fa  # noqa: E402
import fidelity_data as fd  # noqa: E402
import fidelity_slices as fsl  # noqa: E402
import fidelity_stats as fs  # noqa: E402

SIZE = fd.SIZES["quick"]
QUICK_SETUPS = ("packed_k4/w8", "b1_k1/w8")


@pytest.fixture(autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def data():
    return fd.SeedData(SIZE, 3, "cpu")


def as_sets(steps):
    return [sorted((tuple(int(i) for i in idx), pad) for idx, pad in s) for s in steps]


@pytest.mark.parametrize("setup", QUICK_SETUPS)
@pytest.mark.parametrize("arm", list(fa.ARMS))
def test_control_holds_its_arms_micro_batches_dealt_otherwise(data, setup, arm):
    control = fa.control_of(arm)
    source, _ = fa.source_of(control)
    for epoch in (0, 2):
        planned = fa.RunPlans(setup, source, data).epoch(epoch)
        shuffled = fa.RunPlans(setup, control, data).epoch(epoch)
        assert [len(s) for s in shuffled] == [len(s) for s in planned]
        assert fa.micro_batch_multiset(shuffled) == fa.micro_batch_multiset(planned)
        if len(planned) > 1 or setup == "b1_k1/w8":  # a single step has one order
            assert as_sets(shuffled) != as_sets(planned), "the control is not shuffled"


def test_the_wiring_check_can_fail(data, monkeypatch):
    runs = fa.runs_of(fa.ARMS)
    found = fa.check_wiring("b1_k1/w8", runs, data)
    assert set(found) == set(runs)

    def lose_one(steps, rng):  # a shuffle that repeats one micro-batch in place of another
        out = [list(s) for s in steps]
        out[0][0] = out[-1][-1]
        return out

    monkeypatch.setattr(fa, "shuffled_steps", lose_one)
    with pytest.raises(RuntimeError, match="lost or changed"):
        fa.check_wiring("b1_k1/w8", runs, data)


def test_the_learning_rate_is_a_function_of_the_step(data):
    """Every run's trace is the schedule's, exactly, whatever its steps per epoch."""
    expected = [fd.learning_rate(SIZE, i) for i in range(SIZE.steps)]
    assert expected[-1] < max(expected)
    for run in ("default", "shuffled", "sp4"):
        steps = fa.run_steps("b1_k1/w8", run, data, SIZE)
        assert fa.train_run("b1_k1/w8", run, steps, data, SIZE).lrs == expected


def test_validation_patterns_are_new_and_seeds_draw_their_own_data(data):
    for m, val in data.val_patterns.items():
        train = data.patterns[m].params()
        for row in val.params():
            assert not (train == row).all(axis=1).any()
    assert fb.data_facts(data)["val_patterns_trained"] == 0
    other = fd.SeedData(SIZE, 4, "cpu")
    assert not np.array_equal(other.shapes, data.shapes)
    for m in fd.MODALITIES:
        assert not np.array_equal(other.patterns[m].params(), data.patterns[m].params())
    timesteps = sorted({float(t) for _, b in data.val for t in b.timestep})
    assert len(timesteps) == SIZE.val_timesteps


def test_a_step_batched_by_shape_is_the_per_micro_batch_gradient(data):
    """One backward per shape over the step's samples equals accumulating every micro-batch
    with the step's normalizer (the loss summed over its elements / the step's elements)."""
    steps = fa.RunPlans("packed_k4/w8", "shuffled", data).epoch(1)
    step = max(steps, key=lambda s: len({tuple(data.shapes[i]) for i in fa.step_samples(s)}))
    samples = fa.step_samples(step)
    assert len({tuple(s) for s in data.shapes[samples]}) > 1
    model = fd.build_model(SIZE, 3, "cpu")
    fd.step_loss_backward(model, data.batches(samples, 1))
    batched = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    elements = sum(b.target.numel() for b in data.batches(samples, 1))
    for idx, _ in step:
        for b in data.batches(idx, 1):
            ((fd.forward(model, b) - b.target).square().sum() / elements).backward()
    for a, p in zip(batched, model.parameters(), strict=True):
        torch.testing.assert_close(a, p.grad, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize(
    ("diffs", "verdict"),
    [
        ([0.001, -0.001, 0.002, 0.0, -0.002], "equivalent"),
        ([0.05, 0.06, 0.055, 0.052, 0.058], "worse"),
        ([-0.05, -0.06, -0.055, -0.052, -0.058], "better"),
        ([0.05, -0.05, 0.0, 0.04, -0.03], "inconclusive"),
    ],
)
def test_paired_verdicts(diffs, verdict):
    control = [1.0, 1.1, 0.9, 1.0, 1.0]
    r = fs.paired([c + d for c, d in zip(control, diffs, strict=True)], control)
    assert r["verdict"] == r["verdict95"] == verdict
    half95 = 2.776445 * np.std(diffs, ddof=1) / np.sqrt(5)  # t(0.975, 4)
    half90 = 2.131847 * np.std(diffs, ddof=1) / np.sqrt(5)  # t(0.95, 4)
    assert r["high95_pct"] - r["diff_pct"] == pytest.approx(100 * half95, rel=1e-5)
    assert r["high90_pct"] - r["diff_pct"] == pytest.approx(100 * half90, rel=1e-5)


def test_quick_runs_end_to_end(tmp_path, capsys):
    out = tmp_path / "fidelity"
    assert fb.main(["--quick", "--setups", ",".join(QUICK_SETUPS), "--out-dir", str(out)]) == 0
    printed = capsys.readouterr().out
    assert printed.index("PRIMARY MEASURE") < printed.index("seed 0:")
    with open(out / "fidelity.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    runs = {(r["setup"], r["run"], r["seed"]) for r in rows}
    assert runs == {
        (s, r, str(seed)) for s in QUICK_SETUPS for r in fa.runs_of(fa.ARMS) for seed in (0, 1)
    }
    lr_at = {}
    for r in rows:  # the same learning rate at the same step in every run of a setup
        assert lr_at.setdefault((r["setup"], r["steps"]), r["lr"]) == r["lr"]
    with open(out / "fidelity.json") as f:
        summary = json.load(f)
    assert set(summary["wiring"]["lr_same_across_runs"].values()) == {True}
    assert {d["val_patterns_trained"] for d in summary["wiring"]["data"].values()} == {0}
    assert len({d["x0_sum"] for d in summary["wiring"]["data"].values()}) == 2
    assert len(summary["comparisons"]) == len(QUICK_SETUPS) * len(fa.ARMS)
    assert len(summary["targets"]) == len(QUICK_SETUPS)
    text = (out / "fidelity.md").read_text()
    assert text.count("\n| ") == 1 + len(summary["comparisons"])  # header + every comparison


def test_no_run_starts_after_the_time_budget(tmp_path, capsys):
    argv = ["--quick", "--setups", "b1_k1/w8", "--time-budget", "0", "--out-dir", str(tmp_path)]
    assert fb.main(argv) == 1
    assert "time budget reached" in capsys.readouterr().out


def test_runs_in_worker_processes_train_as_in_one(tmp_path):
    """--workers 2 (spawned processes, each rebuilding the seed's data) gives every row of one
    process's run, bit for bit but the wall clock."""
    argv = ["--quick", "--setups", "packed_k4/w8", "--arms", "default,segregated"]
    tables = []
    for workers in ("1", "2"):
        out = tmp_path / workers
        assert fb.main([*argv, "--workers", workers, "--out-dir", str(out)]) == 0
        with open(out / "fidelity.csv", newline="") as f:
            rows = [{k: v for k, v in r.items() if k != "wall_s"} for r in csv.DictReader(f)]
        tables.append(sorted(rows, key=lambda r: (r["seed"], r["run"], int(r["steps"]))))
    assert len(tables[0]) == 2 * 3 * fd.SIZES["quick"].evals  # 2 seeds x 3 runs
    assert tables[0] == tables[1]


# -- slices: --seeds A-B, merged by --summarize-only -----------------------------------------

SLICE_ARGS = ["--quick", "--setups", "packed_k4/w8", "--arms", "default,segregated"]


def test_slices_merged_are_one_run_of_their_seeds(tmp_path, capsys):
    """Seeds 0 and 1 as two slices, merged, give exactly the numbers of one run of both."""
    one, merged = str(tmp_path / "one"), str(tmp_path / "merged")
    assert fb.main([*SLICE_ARGS, "--out-dir", one]) == 0
    for seed in (0, 1):
        assert (
            fb.main([*SLICE_ARGS, "--seeds", str(seed), "--out-dir", str(tmp_path / f"s{seed}")])
            == 0
        )
        assert not (tmp_path / f"s{seed}" / "fidelity.json").exists()  # a slice: rows only
    slices = [str(tmp_path / f"s{seed}") for seed in (0, 1)]
    capsys.readouterr()
    assert fb.main(["--summarize-only", *slices, "--out-dir", merged]) == 0
    assert "merged 2 slices" in capsys.readouterr().out
    summaries = []
    for d in (one, merged):
        with open(os.path.join(d, "fidelity.json")) as f:
            summaries.append(json.load(f))
    a, b = summaries
    assert a["comparisons"] and a["comparisons"] == b["comparisons"]
    assert a["targets"] == b["targets"] and a["config_digest"] == b["config_digest"]
    assert b["seeds"] == [0, 1] and len(b["commands"]) == 2
    assert set(b["wiring"]["lr_same_across_runs"].values()) == {True}
    body = [open(os.path.join(d, "fidelity.md")).read().split("\n", 1)[1] for d in (one, merged)]
    assert body[0] == body[1]  # every line but the header (dates, commands)


def test_a_slice_killed_before_its_end_merges_the_runs_it_finished(tmp_path, capsys, monkeypatch):
    """The device call's limit can kill a slice mid-run: its record is written as each run
    finishes, so the runs done merge (the seed named again, as a budget cut names it)."""
    real, trained = fb.train_run, []

    def killed_after_two(*args, **kw):
        if len(trained) == 2:
            raise KeyboardInterrupt  # what the call's limit does to the process
        trained.append(args[1])
        return real(*args, **kw)

    monkeypatch.setattr(fb, "train_run", killed_after_two)
    out = tmp_path / "s0"
    with pytest.raises(KeyboardInterrupt):
        fb.main([*SLICE_ARGS, "--seeds", "0", "--out-dir", str(out)])
    with open(out / fsl.SLICE_JSON) as f:
        record = json.load(f)
    assert record["time_budget_cut"] is True and record["seeds"] == [0]
    rows = fsl.read_rows(out / fsl.ROWS_CSV)
    assert {r["run"] for r in rows} >= set(trained) and len(trained) == 2
    capsys.readouterr()
    assert fb.main(["--summarize-only", str(out), "--out-dir", str(tmp_path / "m")]) == 0
    assert "merged 1 slices" in capsys.readouterr().out


def fake_slice(path, seeds, diffs, max_seeds=6, runs=None):
    """A slice folder without training: per seed, arm - control of the primary measure is
    ``diffs[arm][seed]`` (controls at 1.0); ``runs``: only these (default: every one)."""
    cfg = fsl.config(SIZE, ["b1_k1/w8"], list(diffs), "cpu", 2, max_seeds, 2)
    os.makedirs(path)
    rows = []
    for seed in seeds:
        for run in runs or fa.runs_of(list(diffs)):
            v = 1.0 + diffs[run][seed] if run in diffs else 1.0
            rows.append(
                dict.fromkeys(fsl.COLUMNS, 0)
                | {"setup": "b1_k1/w8", "run": run, "seed": seed, "steps": SIZE.steps}
                | {"same_as": "", "val_mean": v, "val_image": v, "val_clip": v}
            )
    fsl.start_rows(os.path.join(path, fsl.ROWS_CSV))
    fsl.add_rows(os.path.join(path, fsl.ROWS_CSV), rows)
    wiring = {"plans": {}, "data": {}, "lr_same_across_runs": {}}
    fsl.write_slice(
        path,
        {"config": cfg, "digest": fsl.digest(cfg), "seeds": seeds, "machine_key": "cpu"}
        | {"date": "", "command": f"--seeds {fsl.format_seeds(seeds)}", "machine": "cpu"}
        | {
            "device": "cpu",
            "provenance": {"torch": torch.__version__},
            "time_budget_cut": False,
            "wall_s": 1.0,
        }
        | {"wiring": wiring},
    )
    return str(path)


DIFFS = {  # default equivalent after two seeds, segregated inconclusive
    "default": [0.001, -0.001, 0.001, -0.001],
    "segregated": [0.05, -0.05, 0.04, -0.03],
}


def test_summarize_only_names_the_inconclusive_and_the_next_seeds(tmp_path, capsys):
    dirs = [fake_slice(tmp_path / f"s{s}", [s], DIFFS) for s in (0, 1)]
    assert fb.main(["--summarize-only", *dirs, "--out-dir", str(tmp_path / "m")]) == 0
    out = capsys.readouterr().out
    assert "needs seeds: b1_k1/w8 segregated: inconclusive at 2" in out
    assert "default: equivalent" not in out and "next: --seeds 2-3" in out
    dirs.append(fake_slice(tmp_path / "s23", [2, 3], DIFFS))
    assert fb.main(["--summarize-only", *dirs, "--out-dir", str(tmp_path / "m")]) == 0
    assert "next: --seeds 4-5" in capsys.readouterr().out
    with open(tmp_path / "m" / "fidelity.json") as f:
        assert json.load(f)["progress"]["next_seeds"] == [4, 5]
    assert fsl.parse_seeds("0-2,5,9") == [0, 1, 2, 5, 9]
    assert fsl.format_seeds([0, 1, 2, 5, 9]) == "0-2,5,9"


def test_slices_of_other_configurations_are_refused(tmp_path, capsys):
    a = fake_slice(tmp_path / "a", [0], DIFFS)
    b = fake_slice(tmp_path / "b", [1], DIFFS, max_seeds=8)
    assert fb.main(["--summarize-only", a, b, "--out-dir", str(tmp_path / "m")]) == 2
    err = capsys.readouterr().err
    assert "REFUSED" in err and "ran different configurations: seeds differ" in err
    assert not (tmp_path / "m").exists()
    with open(os.path.join(a, fsl.SLICE_JSON)) as f:
        record = json.load(f)
    record["config"]["margin"] = 0.05  # edited by hand: its digest no longer matches
    with open(os.path.join(a, fsl.SLICE_JSON), "w") as f:
        json.dump(record, f)
    assert fb.main(["--summarize-only", a, "--out-dir", str(tmp_path / "m")]) == 2
    assert "does not match its digest" in capsys.readouterr().err


def test_targets_tell_the_undecided_from_the_missed(tmp_path, capsys):
    """A default arm inconclusive with fewer than the stated maximum of seeds is undecided, not
    missed; inconclusive at the maximum, or worse, it is missed; equivalent, met."""
    rng = np.random.default_rng()
    wide = [float(x) for x in np.array([1, -1, 1, -1]) * rng.uniform(0.05, 0.1, 4)]
    for diffs, seeds, status in (
        ({"default": wide}, [0, 1], "undecided"),
        ({"default": wide}, [0, 1, 2, 3], "missed"),
        ({"default": [0.05 + x / 100 for x in wide]}, [0, 1, 2, 3], "missed"),
        ({"default": DIFFS["default"]}, [0, 1], "met"),
    ):
        d = tmp_path / f"{status}{len(seeds)}{rng.integers(1 << 30)}"
        src = fake_slice(d / "s", seeds, diffs, max_seeds=4)
        assert fb.main(["--summarize-only", src, "--out-dir", str(d / "m")]) == 0
        with open(d / "m" / "fidelity.json") as f:
            (target,) = json.load(f)["targets"]
        assert target["status"] == status and target["met"] == (status == "met")
        with open(d / "m" / "fidelity.md") as f:
            md = f.read()
        assert f"1 {status}" in md
        if status != "met":
            assert f"- {status}: b1_k1/w8 default equivalent" in md
    capsys.readouterr()


# -- the pending comparisons alone: --seeds A-B --pending DIR ..., and --continue DIR ... -----


def test_runs_merge_one_by_one_from_the_slices_that_have_them(tmp_path, capsys):
    """A seed cut short in one slice (segregated not run) and completed by a slice of the
    pending comparisons: every run counts, once (a merge by whole seeds dropped one)."""
    a = fake_slice(tmp_path / "a", [0, 1], DIFFS)
    rows = [r for r in fsl.read_rows(os.path.join(a, fsl.ROWS_CSV))]
    cut = [r for r in rows if not (r["seed"] == "1" and r["run"] == "segregated")]
    fsl.start_rows(os.path.join(a, fsl.ROWS_CSV))
    fsl.add_rows(os.path.join(a, fsl.ROWS_CSV), cut)
    b = fake_slice(tmp_path / "b", [1], DIFFS, runs=["shuffled", "segregated"])
    rows = fsl.merge_rows(fsl.load_slices([a, b]))
    keys = [(r["seed"], r["run"]) for r in rows]
    assert sorted(keys) == sorted({(str(s), r) for s in (0, 1) for r in fa.runs_of(DIFFS)})
    comps = {c["arm"]: c for c in fs.comparisons(rows, ["b1_k1/w8"], list(DIFFS))}
    assert comps["segregated"]["seeds"] == [0, 1] and comps["default"]["seeds"] == [0, 1]
    assert "each run from the first of them that has it" in capsys.readouterr().out


def test_a_slice_of_the_pending_runs_only_the_undecided_comparisons(tmp_path, capsys):
    dirs = [fake_slice(tmp_path / f"s{s}", [s], DIFFS) for s in (0, 1)]
    cfg = fsl.config(SIZE, ["b1_k1/w8"], list(DIFFS), "cpu", 2, 6, 2)
    work = fsl.pending_work(dirs, cfg, [1, 2, 3])  # seed 1: every comparison has it
    assert work == {s: {"b1_k1/w8": ["shuffled", "segregated"]} for s in (2, 3)}
    other = fsl.config(SIZE, ["b1_k1/w8"], list(DIFFS), "cpu", 2, 8, 2)
    with pytest.raises(fsl.Refused, match="pass the setups, arms and seed rule"):
        fsl.pending_work(dirs, other, [2, 3])
    assert fb.main(["--summarize-only", *dirs, "--out-dir", str(tmp_path / "m")]) == 0
    out = capsys.readouterr().out
    assert f"--seeds 2-3 --pending {' '.join(dirs)}" in out and "--continue" in out


CONTINUE_ARGS = ["--quick", "--device", "cpu", "--setups", "b1_k1/w8"]
CONTINUE_ARGS += ["--arms", "default,segregated", "--max-seeds", "4"]


def test_continue_trains_the_pending_comparisons_until_the_maximum(tmp_path, capsys):
    """Over slices where the default is decided and segregated is not, --continue trains
    segregated and its control for seeds 2-3 (real training) and stops at the maximum."""
    dirs = [fake_slice(tmp_path / f"s{s}", [s], DIFFS, max_seeds=4) for s in (0, 1)]
    out = tmp_path / "more"
    assert fb.main([*CONTINUE_ARGS, "--continue", *dirs, "--out-dir", str(out)]) == 0
    assert "decided: every comparison decided or at the maximum" in capsys.readouterr().out
    (made,) = os.listdir(out)
    assert made == "seeds2-3"
    rows = fsl.read_rows(out / made / fsl.ROWS_CSV)
    assert {(r["seed"], r["run"]) for r in rows} == {
        (s, r) for s in ("2", "3") for r in ("shuffled", "segregated")
    }
    with open(out / made / fsl.SLICE_JSON) as f:
        assert "--pending" in json.load(f)["command"]
    merged = tmp_path / "m"
    assert fb.main(["--summarize-only", *dirs, str(out / made), "--out-dir", str(merged)]) == 0
    with open(merged / "fidelity.json") as f:
        comps = {c["arm"]: c for c in json.load(f)["comparisons"]}
    assert comps["segregated"]["seeds"] == [0, 1, 2, 3] and comps["default"]["seeds"] == [0, 1]
    assert fb.main([*CONTINUE_ARGS, "--continue", *dirs, "--out-dir", str(out)]) == 0
    assert sorted(os.listdir(out)) == ["seeds2-3", "seeds2-3.2"]  # the first one kept
    with pytest.raises(SystemExit):  # a slice of the pending names its seeds
        fb.main([*CONTINUE_ARGS, "--pending", *dirs])
    assert "--pending runs a slice: name its --seeds" in capsys.readouterr().err
