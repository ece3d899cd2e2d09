"""Metadata at scale: numeric Parquet columns and .npy files read whole (no Python object per
row), Parquet shards read as one table, and every error still naming the file, row and column."""

from __future__ import annotations

import numpy as np
import pytest

from adaptiveload.metadata import read_metadata
from adaptiveload.wan import wan_seq_len

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")


def _lens(n, seed=None):
    return np.random.default_rng(seed).choice([1560, 7800, 32760, 75600], n).astype(np.int64)


def test_numeric_parquet_is_read_without_a_python_object_per_row(tmp_path, monkeypatch):
    lens = _lens(50_000)
    pq.write_table(
        pa.table({"seq_len": lens, "other": np.arange(len(lens))}), tmp_path / "m.parquet"
    )

    import adaptiveload.metadata as metadata

    read = metadata._arrow_values
    kinds = []
    monkeypatch.setattr(metadata, "_arrow_values", lambda c: kinds.append(read(c)) or kinds[-1])
    m = read_metadata(tmp_path / "m.parquet")
    assert m.seq_lens.dtype == np.int64 and (m.seq_lens == lens).all()
    assert kinds and all(isinstance(k, np.ndarray) for k in kinds)  # no list of Python ints
    floats = lens.astype(np.float64)  # integral floats are accepted, as in every format
    pq.write_table(pa.table({"seq_len": floats}), tmp_path / "f.parquet")
    assert (read_metadata(tmp_path / "f.parquet").seq_lens == lens).all()


@pytest.mark.parametrize("bad,match", [(0, "0 is not a positive integer"),
                                       (2**41, "larger than the largest"),
                                       (None, "missing value")])  # fmt: skip
def test_parquet_errors_name_the_row(tmp_path, bad, match):
    values = [int(v) for v in _lens(1000)]
    row = int(np.random.default_rng().integers(1, 1000))
    values[row - 1] = bad
    pq.write_table(pa.table({"seq_len": pa.array(values, pa.int64())}), tmp_path / "b.parquet")
    with pytest.raises(ValueError, match=rf"b.parquet row {row}, column 'seq_len': .*{match}"):
        read_metadata(tmp_path / "b.parquet")


def test_a_directory_of_shards_reads_as_one_table(tmp_path):
    parts = [_lens(n) for n in (300, 1, 700)]
    for i, p in enumerate(parts):
        pq.write_table(pa.table({"seq_len": p}), tmp_path / f"part-{i:03d}.parquet")
    (tmp_path / "README.txt").write_text("not a shard")
    m = read_metadata(tmp_path)
    assert (m.seq_lens == np.concatenate(parts)).all()
    bad = parts[2].copy()
    bad[41] = -5
    pq.write_table(pa.table({"seq_len": bad}), tmp_path / "part-002.parquet")
    with pytest.raises(ValueError, match=r"part-002.parquet row 42, column 'seq_len'"):
        read_metadata(tmp_path)
    pq.write_table(pa.table({"seq_len": parts[2]}), tmp_path / "part-002.parquet")
    pq.write_table(pa.table({"num_frames": [1], "height": [480], "width": [832]}),
                   tmp_path / "part-003.parquet")  # fmt: skip
    with pytest.raises(ValueError, match="the shards do not have the same columns"):
        read_metadata(tmp_path)
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ValueError, match="is a directory without .parquet shards"):
        read_metadata(empty)


def test_npy_is_read_in_place(tmp_path):
    lens = _lens(10_000)
    np.save(tmp_path / "l.npy", lens)
    m = read_metadata(tmp_path / "l.npy")
    assert isinstance(m.seq_lens, np.memmap) and (m.seq_lens == lens).all()  # not copied
    shapes = np.zeros(3, dtype=[("num_frames", "i4"), ("height", "i4"), ("width", "i4")])
    shapes["num_frames"], shapes["height"], shapes["width"] = [1, 81, 41], [480, 480, 720], 832
    shapes["width"][2] = 1280
    np.save(tmp_path / "s.npy", shapes)
    m = read_metadata(tmp_path / "s.npy")
    assert (
        m.seq_lens == wan_seq_len(shapes["num_frames"], shapes["height"], shapes["width"])
    ).all()
    assert len(np.unique(m.group_keys())) == 3
    shapes["height"][1] = 0
    np.save(tmp_path / "s.npy", shapes)
    with pytest.raises(ValueError, match=r"s.npy row 2, column 'height'"):
        read_metadata(tmp_path / "s.npy")
    np.save(tmp_path / "two.npy", np.ones((2, 2), np.int64))
    with pytest.raises(ValueError, match="expected a 1-D array"):
        read_metadata(tmp_path / "two.npy")


@pytest.mark.parametrize("high", [3, 2_000, 2**40])
@pytest.mark.parametrize("width", [1, 3])
def test_integer_group_keys_number_as_sorting_does(high, width):
    from adaptiveload.sampler.checks import as_group_ids

    rng = np.random.default_rng()
    keys = rng.integers(-5, high, (int(rng.integers(1, 5000)), width))
    keys = keys[:, 0] if width == 1 else keys
    want = np.unique(keys, axis=0 if width > 1 else None, return_inverse=True)[1].reshape(-1)
    assert (as_group_ids(keys, np.ones(len(keys))) == want).all()


def test_shards_are_read_as_pyarrow_lists_them(tmp_path):
    parts = [_lens(n) for n in (5, 0, 7)]
    for i, p in enumerate(parts):
        pq.write_table(pa.table({"seq_len": pa.array(p, pa.int64())}), tmp_path / f"p{i}.parquet")
    pq.write_table(pa.table({"seq_len": [9]}), tmp_path / "_tmp.parquet")  # not a shard
    pq.write_table(pa.table({"seq_len": [9]}), tmp_path / ".hidden.parquet")  # nor this
    m = read_metadata(tmp_path)  # the empty shard adds no row
    assert (m.seq_lens == np.concatenate(parts)).all()
    (tmp_path / "year=2024").mkdir()
    pq.write_table(pa.table({"seq_len": [5]}), tmp_path / "year=2024" / "p.parquet")
    with pytest.raises(ValueError, match="year=2024.*nested"):
        read_metadata(tmp_path)


def test_float32_at_the_bound_names_its_row(tmp_path):
    values = np.full(10, 1560, np.float32)
    values[6] = 2.0**40
    np.save(tmp_path / "f.npy", values)
    with pytest.raises(ValueError, match=r"f.npy row 7, column 'seq_len'.*larger"):
        read_metadata(tmp_path / "f.npy")


def test_uint64_keys_past_int64():
    from adaptiveload.sampler.checks import as_group_ids

    keys = np.array([2**64 - 1, 3, 2**63, 3], np.uint64)
    assert as_group_ids(keys, np.ones(4)).tolist() == [2, 0, 1, 0]


def _damage(path, at):
    data = bytearray(path.read_bytes())
    data[at : at + 36] = b"\xff" * 36
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("damage", ["not parquet", "footer", "pages"])
def test_a_damaged_parquet_shard_is_named(tmp_path, damage):
    parts = [_lens(n) for n in (30, 40, 50)]
    for i, p in enumerate(parts):
        pq.write_table(pa.table({"seq_len": p}), tmp_path / f"part-{i}.parquet")
    bad = tmp_path / f"part-{np.random.default_rng().integers(0, 3)}.parquet"
    if damage == "not parquet":
        bad.write_text("seq_len\n1560\n")
    else:
        _damage(bad, len(bad.read_bytes()) - 60 if damage == "footer" else 4)
    with pytest.raises(ValueError, match=rf"^{bad}: cannot be read as Parquet \(.+\)") as info:
        read_metadata(tmp_path)
    assert "\n" not in str(info.value)
    with pytest.raises(ValueError, match=rf"^{bad}: cannot be read as Parquet"):
        read_metadata(bad)  # alone too


@pytest.mark.parametrize(
    "write, match",
    [
        (lambda p: p.write_text("1560\n7800\n"), r"not a NumPy \.npy file \(text"),
        (lambda p: p.write_bytes(b"\x93NUMPY\x01\x00\x10\x00{'descr': (\n"), r"header is damaged"),
        (lambda p: (np.save(p, _lens(100)), p.write_bytes(p.read_bytes()[:300])), "cut short"),
        (lambda p: np.save(p, np.array([1, None]), allow_pickle=True), "holds Python objects"),
    ],
)
def test_a_bad_npy_is_named_as_the_samplers_columns_are(tmp_path, write, match):
    path = tmp_path / "meta.npy"
    write(path)
    with pytest.raises(ValueError, match=rf"^metadata file {path}: .*{match}") as info:
        read_metadata(path)
    assert "allow_pickle" not in str(info.value)
