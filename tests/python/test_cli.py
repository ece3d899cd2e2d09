"""Metadata files (CSV, JSONL, Parquet) and the `adaptiveload plan` command."""

import json
import subprocess
import sys

import numpy as np
import pytest

from adaptiveload import wan_seq_len
from adaptiveload.cli import main
from adaptiveload.demo import MIXES, demo_metadata
from adaptiveload.metadata import read_metadata

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
