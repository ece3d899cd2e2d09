"""Metadata files (CSV, JSONL, Parquet) and the `adaptiveload plan` command."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from adaptiveload import wan_seq_len
from adaptiveload.cli import main
from adaptiveload.demo import MIXES, demo_metadata
from adaptiveload.metadata import read_metadata

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SHAPES = [(1, 480, 832), (81, 480, 832), (81, 720, 1280), (33, 480, 832)]


def write_csv(path, header, rows):
    path.write_text(",".join(header) + "\n" + "".join(",".join(map(str, r)) + "\n" for r in rows))


def test_reads_csv_jsonl_parquet_alike(tmp_path):
    rows = [SHAPES[i % 4] for i in range(40)]
    write_csv(
        tmp_path / "m.csv",
        ["num_frames", "height", "width", "caption"],
        [r + ("a cat",) for r in rows],
    )
    (tmp_path / "m.jsonl").write_text(
        "".join(json.dumps({"num_frames": f, "height": h, "width": w}) + "\n" for f, h, w in rows)
    )
    import pyarrow as pa
    import pyarrow.parquet as pq

    cols = list(zip(*rows, strict=True))
    pq.write_table(
        pa.table({"num_frames": cols[0], "height": cols[1], "width": cols[2]}),
        tmp_path / "m.parquet",
    )
    expected = wan_seq_len(*map(np.array, cols))
    for name in ("m.csv", "m.jsonl", "m.parquet"):
        meta = read_metadata(tmp_path / name)
        np.testing.assert_array_equal(meta.seq_lens, expected)
        keys = meta.group_keys()
        assert len(set(keys.tolist())) == 4
        assert all(keys[i] == keys[i + 4] for i in range(36))


def test_reads_seq_len_column(tmp_path):
    write_csv(tmp_path / "s.csv", ["seq_len"], [[1560], [75600]])
    meta = read_metadata(tmp_path / "s.csv")
    assert meta.seq_lens.tolist() == [1560, 75600] and meta.shapes is None


@pytest.mark.parametrize(
    "content,match",
    [
        ("num_frames,height,width\n1,480,832\n81,abc,832\n", r"row 3, column 'height': 'abc'"),
        ("num_frames,height,width\n1,480,832\n0,480,832\n", r"row 3, column 'num_frames'"),
        ("num_frames,height,width\n1,480,\n", r"row 2, column 'width': missing"),
        ("frames,h,w\n1,480,832\n", "needs a 'seq_len' column"),
        ("seq_len\n", "no samples"),
    ],
)
def test_bad_metadata_names_row_and_column(tmp_path, content, match):
    (tmp_path / "bad.csv").write_text(content)
    with pytest.raises(ValueError, match=match):
        read_metadata(tmp_path / "bad.csv")


def test_bad_jsonl_and_unknown_format(tmp_path):
    (tmp_path / "bad.jsonl").write_text('{"seq_len": 10}\n{"seq_len": \n')
    with pytest.raises(ValueError, match="line 2"):
        read_metadata(tmp_path / "bad.jsonl")
    (tmp_path / "x.txt").write_text("seq_len\n1\n")
    with pytest.raises(ValueError, match="unknown metadata format"):
        read_metadata(tmp_path / "x.txt")
    with pytest.raises(FileNotFoundError):
        read_metadata(tmp_path / "missing.csv")


def test_demo_mixes_are_deterministic():
    for mix in MIXES:
        a, b = demo_metadata(500, mix, seed=1), demo_metadata(500, mix, seed=1)
        np.testing.assert_array_equal(a.seq_lens, b.seq_lens)
    with pytest.raises(ValueError, match="unknown demo mix"):
        demo_metadata(10, "nope")


def test_plan_demo_prints_tables_and_draws_figure(tmp_path, capsys):
    fig, rep = tmp_path / "plan.png", tmp_path / "plan.json"
    assert (
        main(["plan", "--demo", "--demo-samples", "3000", "--figure", str(fig), "--json", str(rep)])
        == 0
    )
    out = capsys.readouterr().out
    for text in ("81x720x1280", "AdaptiveLoad", "equal-token buckets", "paper rule", "imbalance"):
        assert text in out
    assert fig.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    report = json.loads(rep.read_text())
    ours, base = report["reports"]["AdaptiveLoad"], report["reports"]["equal-token buckets"]
    assert ours["imbalance"] < base["imbalance"]
    assert ours["over_token_cap"] == 0 and ours["over_cost_cap"] == 0


@pytest.mark.distributed
def test_plan_from_metadata_file_via_console_entry(tmp_path):
    rows = [SHAPES[i % 4] for i in range(200)]
    write_csv(tmp_path / "m.csv", ["num_frames", "height", "width"], rows)
    cmd = [
        sys.executable,
        "-m",
        "adaptiveload",
        "plan",
        "--metadata",
        str(tmp_path / "m.csv"),
        "--num-replicas",
        "2",
        "--figure",
        "none",
        "--cost-model",
        "power:1.5",
    ]
    done = subprocess.run(cmd, capture_output=True, text=True, check=True)
    assert "AdaptiveLoad" in done.stdout


def test_plan_reports_bad_input_without_traceback(tmp_path, capsys):
    (tmp_path / "bad.csv").write_text("seq_len\n10\n-1\n")
    assert main(["plan", "--metadata", str(tmp_path / "bad.csv"), "--figure", "none"]) == 2
    err = capsys.readouterr().err
    assert "row 3, column 'seq_len'" in err


# -- no failure after the report, clear errors, large inputs ------------------------------------


@pytest.mark.distributed
def test_plan_without_matplotlib_still_writes_the_report(tmp_path):
    # A fresh machine may lack matplotlib (it is a dependency, but a broken or removed one
    # must not cost the user the report): the JSON is written and the exit code is 0.
    rep, fig = tmp_path / "plan.json", tmp_path / "plan.png"
    code = (
        "import sys; sys.modules['matplotlib'] = None\n"
        "from adaptiveload.cli import main\n"
        f"sys.exit(main(['plan', '--demo', '--demo-samples', '500', '--json', {str(rep)!r}, "
        f"'--figure', {str(fig)!r}]))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "equal-token buckets" in done.stdout
    assert json.loads(rep.read_text())["reports"]["AdaptiveLoad"]["num_steps"] > 0
    assert "figure not drawn" in done.stderr and "matplotlib" in done.stderr
    assert not fig.exists()


def test_matplotlib_is_a_dependency_of_the_package():
    import re

    with open(os.path.join(ROOT, "pyproject.toml")) as f:
        deps = re.search(r"^dependencies = \[(.*?)\]", f.read(), re.M | re.S).group(1)
    assert "matplotlib" in deps


@pytest.mark.parametrize("value", ["0", "-5", "1.5"])
def test_max_tokens_must_be_positive(capsys, value):
    with pytest.raises(SystemExit) as e:
        main(["plan", "--demo", "--max-tokens", value, "--figure", "none"])
    assert e.value.code == 2
    assert "--max-tokens" in capsys.readouterr().err


def test_directories_get_a_clear_error(tmp_path, capsys):
    assert main(["plan", "--metadata", str(tmp_path), "--figure", "none"]) == 2
    assert "is a directory" in capsys.readouterr().err
    assert main(["plan", "--demo", "--cost-model", str(tmp_path), "--figure", "none"]) == 2
    assert "is a directory" in capsys.readouterr().err


def test_csv_with_a_utf8_bom_is_read(tmp_path):
    path = tmp_path / "bom.csv"
    path.write_bytes("num_frames,height,width\n1,480,832\n81,480,832\n".encode("utf-8-sig"))
    assert read_metadata(path).seq_lens.tolist() == [1560, 32760]


@pytest.mark.parametrize(
    "content,match",
    [
        (
            "num_frames,height,width,caption\n1,480,832,a\n81,480\n",
            r"row 3: 2 fields, the header has 4",
        ),
        ("seq_len\n10\n20,30\n", r"row 3: 2 fields, the header has 1"),
    ],
)
def test_ragged_rows_are_rejected(tmp_path, content, match):
    (tmp_path / "r.csv").write_text(content)
    with pytest.raises(ValueError, match=match):
        read_metadata(tmp_path / "r.csv")


def test_seq_len_and_shape_columns_are_both_used(tmp_path, capsys):
    # seq_len gives the token counts (another VAE or patch may have made them); the shapes
    # still keep micro-batches to one shape.
    rows = [(1, 480, 832, 1000), (1, 832, 480, 1000), (81, 480, 832, 30000)] * 20
    write_csv(tmp_path / "m.csv", ["num_frames", "height", "width", "seq_len"], rows)
    meta = read_metadata(tmp_path / "m.csv")
    assert meta.seq_lens.tolist()[:3] == [1000, 1000, 30000]
    assert meta.shapes is not None and len(set(meta.group_keys().tolist())) == 3
    assert main(["plan", "--metadata", str(tmp_path / "m.csv"), "--figure", "none"]) == 0
    out = capsys.readouterr().out
    assert "1x832x480" in out and "1x480x832" in out
    assert "seq_len column" in out


def test_bucket_table_is_compact_with_thousands_of_groups(tmp_path, capsys):
    rng = np.random.default_rng(0)
    lens = rng.integers(1000, 60000, size=20000)
    write_csv(tmp_path / "many.csv", ["seq_len"], [[v] for v in lens])
    rep = tmp_path / "many.json"
    args = [
        "plan",
        "--metadata",
        str(tmp_path / "many.csv"),
        "--figure",
        "none",
        "--json",
        str(rep),
    ]
    assert main(args) == 0
    out = capsys.readouterr().out
    table = out.split("shape (FxHxW)")[1].split("sampler")[0]
    assert len(table.strip().splitlines()) < 40
    assert "more groups" in table
    buckets = json.loads(rep.read_text())["buckets"]
    assert len(buckets) == len(set(lens.tolist()))
    assert sum(b["samples"] for b in buckets) == len(lens)


def test_bucket_table_values_match_the_plan(tmp_path):
    from adaptiveload.cli_plan import bucket_table
    from adaptiveload.sampler import AdaptiveBatchSampler, EqualTokenBatchSampler

    meta = demo_metadata(3000, "wan-mix", seed=5)
    ours = AdaptiveBatchSampler(
        meta.seq_lens, 151200, group_keys=meta.shapes, num_replicas=4, rank=0
    )
    equal = EqualTokenBatchSampler(
        meta.seq_lens, 151200, group_keys=meta.shapes, num_replicas=4, rank=0
    )
    plan = ours.plan()
    rows = bucket_table(meta, ours, equal)
    assert sum(r["samples"] for r in rows) == 3000
    for r in rows:
        shape = tuple(int(v) for v in r["shape"].split("x"))
        members = np.flatnonzero((meta.shapes == shape).all(axis=1))
        assert r["samples"] == len(members) and r["seq_len"] == meta.seq_lens[members[0]]
        sizes = [
            plan.offsets[m + 1] - plan.offsets[m]
            for m in range(plan.num_micro_batches)
            if not plan.padding[m] and plan.samples[plan.offsets[m]] in set(members.tolist())
        ]
        assert r["batch"] == max(sizes)
        assert r["equal_token_batch"] == 151200 // r["seq_len"]


def test_compare_samplers_is_the_three_samplers_built_by_hand():
    from adaptiveload import AdaptiveBatchSampler, CostModel, EqualTokenBatchSampler
    from adaptiveload.compare import COMPARED_SAMPLERS, compare_samplers
    from adaptiveload.report import balance_report, rescore

    meta = demo_metadata(2000, "wan-mix", seed=2)
    cost = CostModel.wan21_h200("1.3B")
    common = dict(
        group_keys=meta.group_keys(), num_replicas=4, rank=0, micro_batches_per_step=2, seed=3
    )
    by_hand = [
        AdaptiveBatchSampler(
            meta.seq_lens, 151200, max_cost=30000.0, cost_model=cost, lookahead_steps=4, **common
        ),
        EqualTokenBatchSampler(meta.seq_lens, 151200, cost_model=cost, **common),
        AdaptiveBatchSampler(
            meta.seq_lens, 151200, cost_model=CostModel.power(1.5), balance=False, **common
        ),
    ]
    for s in by_hand:
        s.set_epoch(1)
    plans = [s.plan() for s in by_hand]
    plans[2] = rescore(plans[2], meta.seq_lens, cost)
    compared = compare_samplers(
        meta.seq_lens,
        151200,
        cost_model=cost,
        group_keys=meta.group_keys(),
        num_replicas=4,
        micro_batches_per_step=2,
        seed=3,
        epoch=1,
        max_cost=30000.0,
        lookahead_steps=4,
    )
    assert list(compared) == list(COMPARED_SAMPLERS)
    for (sampler, plan, report), hand, want in zip(compared.values(), by_hand, plans, strict=True):
        assert type(sampler) is type(hand) and sampler.epoch == 1
        assert sampler.cost_model.to_dict() == hand.cost_model.to_dict()
        np.testing.assert_array_equal(plan.samples, want.samples)
        np.testing.assert_array_equal(plan.offsets, want.offsets)
        np.testing.assert_allclose(plan.costs, want.costs)
        assert report == balance_report(want, meta.group_keys(), meta.seq_lens)
    assert compared["AdaptiveLoad"].sampler.max_cost == 30000.0
    assert compared["paper rule (S^1.5, no balancing)"].plan.max_cost is None


# -- composition of the steps beside balance ----------------------------------------------------


def plan_json(tmp_path, *extra):
    rep = tmp_path / "plan.json"
    args = ["plan", "--demo", "--demo-samples", "3000", "--figure", "none", "--json", str(rep)]
    assert main([*args, *extra]) == 0
    return json.loads(rep.read_text())["reports"]


def test_plan_reports_composition_beside_balance(tmp_path, capsys):
    reports = plan_json(tmp_path)
    out = capsys.readouterr().out
    header = next(line for line in out.splitlines() if line.startswith("sampler"))
    for column in ("imbalance", "speedup", "mix vs shuffle", "missing (shuffle)", "no image"):
        assert column in header
    assert "windows of steps fully mixed" not in out  # the tolerance's rule only
    plan_json(tmp_path, "--composition", "balanced")
    assert "windows of steps fully mixed (--mix-tolerance 0.02)" in capsys.readouterr().out
    for name, rep in reports.items():
        comp = rep["composition"]
        row = next(line for line in out.splitlines() if line.startswith(name))
        assert f"{comp['tokens_ratio']:.2f}/{comp['samples_ratio']:.2f}x" in row
        assert f"{comp['missing']:.0%} ({comp['shuffle_missing']:.0%})" in row
        assert row.endswith(f"{rep['steps_without_image']:.0%}")
        assert comp["num_steps"] == rep["num_steps"] and comp["num_groups"] == 5


def test_mix_tolerance_reaches_the_adaptive_sampler(tmp_path, capsys):
    segregated = plan_json(tmp_path, "--mix-tolerance", "0")
    mixed = plan_json(tmp_path, "--mix-tolerance", "1")
    ours = "AdaptiveLoad"
    assert segregated[ours]["composition"]["tokens_ratio"] > 1.5
    assert mixed[ours]["composition"]["tokens_ratio"] < 1.0
    assert mixed[ours]["steps_without_image"] < segregated[ours]["steps_without_image"]
    # The baselines do not mix: their plans are the same.
    for name in ("equal-token buckets", "paper rule (S^1.5, no balancing)"):
        assert mixed[name] == segregated[name]
    capsys.readouterr()
    with pytest.raises(SystemExit) as e:
        main(["plan", "--demo", "--mix-tolerance", "1.5", "--figure", "none"])
    assert e.value.code == 2 and "--mix-tolerance" in capsys.readouterr().err


def test_plan_with_sequence_parallelism_mixes_the_steps_whole_samples_cannot(tmp_path, capsys):
    """``plan --sequence-parallel 8``: the demo at K = 4, segregated by the tolerance's rule
    without splitting (the built-in 14B profile), mixes by default with it at about the same
    predicted epoch time; the report says how many micro-batches are split over how many
    ranks, each counted once."""
    demo = ("--demo-samples", "20000", "--micro-batches-per-step", "4")
    whole = plan_json(tmp_path, *demo, "--composition", "balanced")["AdaptiveLoad"]
    capsys.readouterr()
    split = plan_json(tmp_path, *demo, "--sequence-parallel", "8")
    out = capsys.readouterr().out
    ours = split["AdaptiveLoad"]
    assert whole["steps_without_image"] > 0.3 and whole["composition"]["tokens_ratio"] > 1.5
    assert ours["steps_without_image"] == 0.0 and ours["composition"]["tokens_ratio"] < 1.1
    assert ours["epoch_time"] <= whole["epoch_time"] * 1.03
    line = next(x for x in out.splitlines() if x.startswith("sequence parallelism"))
    assert "up to 8 ranks per micro-batch" in line and " over 4 ranks" in line
    assert "Steps: as representative as a shuffle" in out
    for bad, says in ((["--sequence-parallel", "3"], "power of two"),
                      (["--sequence-parallel", "2", "--stream"], "--stream")):  # fmt: skip
        assert main(["plan", "--demo", "--demo-samples", "300", "--figure", "none", *bad]) == 2
        assert says in capsys.readouterr().err


def steps_line(out):
    return next(line for line in out.splitlines() if line.startswith("Steps: "))


def test_the_report_says_in_one_line_whether_this_plan_segregates(tmp_path, capsys):
    # --mix-tolerance 0 segregates the demo's steps; 1 mixes them: the line says which, for
    # the plan at hand, with the figures it rests on and the pointer to the docs.
    segregated = plan_json(tmp_path, "--mix-tolerance", "0")["AdaptiveLoad"]
    line = steps_line(capsys.readouterr().out)
    comp = segregated["composition"]
    assert line.startswith("Steps: segregated")
    assert f"{comp['tokens_ratio']:.2f}x a shuffle's distance" in line
    assert f"{segregated['steps_without_image']:.0%} of steps hold no image" in line
    assert "--mix-tolerance 0" in line and 'docs/sampler.md, "Representative steps"' in line
    mixed = plan_json(tmp_path, "--mix-tolerance", "1")["AdaptiveLoad"]
    line = steps_line(capsys.readouterr().out)
    assert line.startswith("Steps: as representative as a shuffle")
    assert f"{mixed['composition']['tokens_ratio']:.2f}x a shuffle's distance" in line


def test_the_demo_plans_the_recommended_setup_and_names_the_alternatives(capsys):
    """plan --demo: the defaults' steps are representative, and one line per alternative says
    its speed, whether its steps are representative, and what it trades."""
    assert main(["plan", "--demo", "--demo-samples", "6000", "--figure", "none"]) == 0
    out = capsys.readouterr().out
    assert steps_line(out).startswith("Steps: as representative as a shuffle")
    lines = out.split("Alternatives (each alone, against equal-token buckets at its K):\n")[1]
    lines = lines.strip().splitlines()
    assert [line.split(":")[0].strip() for line in lines] == [
        "--composition balanced",
        "--micro-batches-per-step 4",
        "--sequence-parallel 8",
    ]
    assert "steps segregated" in lines[0] and "speed over fidelity" in lines[0]
    assert "steps representative" in lines[2]
    # An alternative the command line already chose is not offered again.
    assert main(["plan", "--demo", "--demo-samples", "6000", "--figure", "none",
                 "--composition", "balanced"]) == 0  # fmt: skip
    out = capsys.readouterr().out
    assert steps_line(out).startswith("Steps: segregated, by choice")
    assert "  --composition balanced:" not in out


def test_no_image_column_needs_shapes(tmp_path, capsys):
    write_csv(tmp_path / "s.csv", ["seq_len"], [[1560 + 8 * (i % 7)] for i in range(300)])
    assert main(["plan", "--metadata", str(tmp_path / "s.csv"), "--figure", "none"]) == 0
    header = next(
        line for line in capsys.readouterr().out.splitlines() if line.startswith("sampler")
    )
    assert "mix vs shuffle" in header and "no image" not in header


# -- every row's values, duplicate columns, shapes a model cannot take -------------------------


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


SHAPE = {"num_frames": 1, "height": 480, "width": 832}


@pytest.mark.parametrize(
    "rows,match",
    [
        # A key first seen after row 1 is a column: the rows without it miss a value.
        ([SHAPE, {**SHAPE, "seq_len": 5}], r"j.jsonl row 1, column 'seq_len': missing value"),
        ([{"seq_len": 5}, {**SHAPE, "seq_len": 7}], r"j.jsonl row 1, column 'num_frames': missing"),
        ([{"seq_len": 5}, {"caption": "a"}], r"j.jsonl row 2, column 'seq_len': missing value"),
        ([SHAPE, {"num_frames": 1, "height": 480}], r"j.jsonl row 2, column 'width': missing"),
        ([{"a": 1}, {"b": 2}], r"needs a 'seq_len' column .* found \['a', 'b'\]"),
    ],
)
def test_jsonl_columns_are_the_keys_of_every_row(tmp_path, rows, match):
    path = write_jsonl(tmp_path / "j.jsonl", rows)
    with pytest.raises(ValueError, match=match):
        read_metadata(path)


def test_jsonl_reads_every_rows_values_in_any_key_order(tmp_path):
    rows = [{**SHAPE, "seq_len": 5}, {"seq_len": 7, "width": 832, "height": 720, "num_frames": 81}]
    meta = read_metadata(write_jsonl(tmp_path / "j.jsonl", rows))
    assert meta.seq_lens.tolist() == [5, 7] and meta.seq_len_column
    assert meta.shapes.tolist() == [[1, 480, 832], [81, 720, 832]]


@pytest.mark.parametrize(
    "name,content,match",
    [
        ("p.csv", "num_frames,height,width\n1,480,832\n1,8,832\n", r"p.csv row 3, column 'height'"),
        ("p.csv", "num_frames,height,width\n1,480,8\n", r"p.csv row 2, column 'width'"),
        ("p.jsonl", '{"num_frames": 1, "height": 480, "width": 832}\n\n'
         '{"num_frames": 1, "height": 480, "width": 4}\n', r"p.jsonl row 3, column 'width'"),
    ],
)  # fmt: skip
def test_a_shape_smaller_than_a_patch_names_file_row_and_column(tmp_path, name, content, match):
    (tmp_path / name).write_text(content)
    with pytest.raises(ValueError, match=match + r": 1x\d+x\d+: smaller than one patch"):
        read_metadata(tmp_path / name)


def test_duplicate_columns_are_refused(tmp_path):
    (tmp_path / "d.csv").write_text("seq_len,caption,seq_len\n10,a,20\n")
    with pytest.raises(ValueError, match=r"d.csv: column 'seq_len' appears 2 times"):
        read_metadata(tmp_path / "d.csv")
    (tmp_path / "d.jsonl").write_text('{"seq_len": 10}\n{"seq_len": 10, "seq_len": 20}\n')
    with pytest.raises(ValueError, match=r"d.jsonl row 2: key 'seq_len' appears 2 times"):
        read_metadata(tmp_path / "d.jsonl")
    # Columns the reader does not use may repeat; a key of a nested object is another key.
    (tmp_path / "ok.csv").write_text("seq_len,caption,caption\n10,a,b\n")
    assert read_metadata(tmp_path / "ok.csv").seq_lens.tolist() == [10]
    (tmp_path / "ok.jsonl").write_text('{"seq_len": 10, "meta": {"seq_len": 3}}\n')
    assert read_metadata(tmp_path / "ok.jsonl").seq_lens.tolist() == [10]
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    table = pa.Table.from_arrays([pa.array([10]), pa.array([20])], names=["seq_len", "seq_len"])
    pq.write_table(table, tmp_path / "d.parquet")
    with pytest.raises(ValueError, match=r"d.parquet: column 'seq_len' appears 2 times"):
        read_metadata(tmp_path / "d.parquet")


def demo_buckets(tmp_path, *extra):
    rep = tmp_path / "demo.json"
    args = ["plan", "--demo", "--demo-samples", "500", "--figure", "none", "--json", str(rep)]
    assert main([*args, *extra]) == 0
    return {b["shape"]: b["seq_len"] for b in json.loads(rep.read_text())["buckets"]}


def test_plan_demo_counts_tokens_as_the_model_does(tmp_path, capsys):
    assert demo_buckets(tmp_path)["1x480x832"] == 1560
    ltx = demo_buckets(tmp_path, "--model", "ltx-video")
    assert ltx["1x480x832"] == 390 and ltx["81x720x1280"] == 11 * 22 * 40
    assert "ltx-video" in capsys.readouterr().out
    # Mochi takes 6k+1 frames: the mix's clips are rounded down to the next it takes.
    mochi = demo_buckets(tmp_path, "--model", "mochi/mochi-10B")
    assert mochi["1x480x832"] == 30 * 52 + 256 and mochi["79x720x1280"] == 14 * 45 * 80 + 256
    assert "81x720x1280" not in mochi
    assert "81x720x1280 as 79x720x1280" in capsys.readouterr().out


def test_plan_refuses_an_unknown_model_listing_the_known(capsys):
    assert main(["plan", "--demo", "--model", "bogus", "--figure", "none"]) == 2
    err = capsys.readouterr().err
    assert "unknown model family 'bogus'" in err and "'ltx-video'" in err and "'wan'" in err


@pytest.mark.parametrize(
    "option,value",
    [("--seed", "-1"), ("--epoch", "-1"), ("--num-replicas", "0"), ("--demo-samples", "0"),
     ("--micro-batches-per-step", "0"), ("--lookahead-steps", "0"), ("--figure-steps", "0"),
     ("--max-cost", "-1"), ("--max-cost", "nan")],
)  # fmt: skip
def test_plan_options_out_of_range_are_refused_naming_the_option(capsys, option, value):
    with pytest.raises(SystemExit) as e:
        main(["plan", "--demo", option, value, "--figure", "none"])
    assert e.value.code == 2 and f"argument {option}" in capsys.readouterr().err


def test_seq_len_column_beside_shapes_the_model_cannot_take_is_a_note(tmp_path, capsys):
    # The seq_len column gives the tokens; the shapes are group keys only, so a shape Mochi
    # cannot take is worth saying, not a reason to refuse the file.
    rows = [(13, 480, 848, 20000), (10, 72, 100, 3000)] * 20
    write_csv(tmp_path / "m.csv", ["num_frames", "height", "width", "seq_len"], rows)
    path = str(tmp_path / "m.csv")
    assert main(["plan", "--metadata", path, "--model", "mochi", "--figure", "none"]) == 0
    out = capsys.readouterr().out
    assert "mochi cannot take the shape of dataset index 1, 10x72x100: mochi takes 6k+1" in out


@pytest.mark.parametrize(
    "option,value",
    [("--seed", "-1"), ("--layers", "0"), ("--max-tokens", "0"), ("--warmup", "-1"),
     ("--repeat", "0"), ("--text-len", "0"), ("--memory-budget", "-2")],
)  # fmt: skip
def test_calibrate_options_out_of_range_are_refused_naming_the_option(capsys, option, value):
    with pytest.raises(SystemExit) as e:
        main(["calibrate", "--device", "cpu", option, value])
    assert e.value.code == 2 and f"argument {option}" in capsys.readouterr().err
