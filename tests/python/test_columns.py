"""Columns given as arrays or .npy files (load_column): every bad file is refused with one
message naming it and what is wrong; good ones are returned as they are, a memory map never
copied. FileIdentity notices a file rewritten in place under a mapping."""

from __future__ import annotations

import os
import re
import warnings

import numpy as np
import pytest

from adaptiveload.sampler.columns import FileIdentity, load_column


def _lens(n, dtype=np.int64, seed=None):
    return np.random.default_rng(seed).integers(1, 80_000, n).astype(dtype)


def _corrupt_header(path):
    data = bytearray(path.read_bytes())
    start = data.index(b"{")
    data[start + 1 : start + 9] = b"'descr' ("  # an unclosed parenthesis: a tokenizer error
    path.write_bytes(bytes(data))


def _write_zip(path):
    np.savez(str(path) + ".npz", a=np.arange(3))
    os.replace(str(path) + ".npz", path)


# (how to write the bad file, what the message says after the file's name)
BAD_FILES = {
    "text": (
        lambda p: p.write_text("1560\n7800\n"),
        r"not a NumPy \.npy file \(text: it begins with",
    ),
    "csv": (lambda p: p.write_text("seq_len\n1560\n"), r"not a NumPy \.npy file"),
    "empty": (lambda p: p.write_bytes(b""), r"not a NumPy \.npy file \(empty\)"),
    "npz": (_write_zip, r"not a NumPy \.npy file .*zip archive, as np\.savez"),
    "pickle": (lambda p: p.write_bytes(b"\x80\x04\x95" + b"\0" * 20), r"not a NumPy.*pickle"),
    "corrupt header": (
        lambda p: (np.save(p, _lens(10)), _corrupt_header(p)),
        r"the \.npy header is damaged \(EOF in multi-line statement\)",
    ),
    "header cut": (
        lambda p: (np.save(p, _lens(10)), p.write_bytes(p.read_bytes()[:40])),
        r"header is damaged",
    ),
    "data cut": (
        lambda p: (np.save(p, _lens(1000)), p.write_bytes(p.read_bytes()[:1000])),
        r"cut short: its header declares shape \(1000,\) of int64",
    ),
    "objects": (
        lambda p: np.save(p, np.array([1, "a"], dtype=object), allow_pickle=True),
        r"holds Python objects \(dtype object\)",
    ),
    "floats": (lambda p: np.save(p, np.ones(4)), r"must hold integers \(int32 or int64\).*float64"),
    "bools": (lambda p: np.save(p, np.ones(4, bool)), r"must hold integers.*got dtype bool"),
    "uint64": (lambda p: np.save(p, np.ones(4, np.uint64)), r"must hold integers.*uint64"),
    "structured": (
        lambda p: np.save(p, np.zeros(3, [("seq_len", "i8")])),
        r"must hold integers",
    ),
    "2-D": (lambda p: np.save(p, np.ones((2, 3), np.int64)), r"must be 1-D .*shape \(2, 3\)"),
    "missing": (lambda p: None, r"no such file"),
}


@pytest.mark.parametrize("kind", BAD_FILES)
def test_each_bad_file_gives_one_message_naming_it(tmp_path, kind):
    write, match = BAD_FILES[kind]
    path = tmp_path / "lengths.npy"
    write(path)
    with pytest.raises(ValueError) as info:
        load_column(path, "seq_lens")
    message = str(info.value)
    assert message.startswith(f"seq_lens file {path}"), message
    assert re.search(match, message), message
    assert "allow_pickle" not in message and "\n" not in message
    error = info.value  # one message: no chained error printed under it
    assert error.__cause__ is None and (error.__context__ is None or error.__suppress_context__)
    if kind == "missing":
        assert isinstance(info.value, FileNotFoundError)
    with pytest.raises(ValueError, match=re.escape(str(path))):
        load_column(str(path), "seq_lens")  # a str names it alike


def test_a_directory_is_not_a_file(tmp_path):
    with pytest.raises(ValueError, match=rf"group_ids file {re.escape(str(tmp_path))}: a dir"):
        load_column(tmp_path, "group_ids")


@pytest.mark.parametrize("dtype", [np.int32, np.int64])
def test_an_int_npy_is_mapped_in_place(tmp_path, dtype):
    lens = _lens(int(np.random.default_rng().integers(1, 5000)), dtype)
    np.save(tmp_path / "l.npy", lens)
    got = load_column(tmp_path / "l.npy", "seq_lens")
    assert isinstance(got, np.memmap) and got.dtype == dtype and np.array_equal(got, lens)
    mapped = np.load(tmp_path / "l.npy", mmap_mode="r")
    same = load_column(mapped, "seq_lens")
    assert same is mapped  # a memory map stays that map: not copied


def test_arrays_and_sequences():
    lens = _lens(100)
    assert load_column(lens, "seq_lens") is lens
    small = lens.astype(np.int32)
    assert load_column(small, "seq_lens") is small
    for other in (np.int16, np.uint8, np.uint32, np.int8):
        values = (lens % 100 + 1).astype(other)
        got = load_column(values, "seq_lens")
        assert got.dtype == np.int64 and got.flags.c_contiguous
        assert np.array_equal(got, values) and not np.shares_memory(got, values)
    listed = load_column(lens.tolist(), "seq_lens")
    assert listed.dtype == np.int64 and np.array_equal(listed, lens)
    strided = lens[::2]
    got = load_column(strided, "seq_lens")
    assert got.flags.c_contiguous and np.array_equal(got, strided)
    swapped = lens.astype(">i8")
    got = load_column(swapped, "seq_lens")
    assert got.dtype == np.int64 and got.dtype.isnative and np.array_equal(got, lens)
    for bad, match in (
        (np.ones(3), r"seq_lens must hold integers .*float64"),
        ([1, 2.5], r"seq_lens must hold integers"),
        ([[1, 2]], r"seq_lens must be 1-D"),
        (np.ones(3, np.uint64), r"seq_lens must hold integers .*uint64"),
    ):
        with pytest.raises(ValueError, match=match):
            load_column(bad, "seq_lens")


def _age(path, seconds=100):
    """Set a file's modification time into the past: the file was written before the sampler
    was made, as a lengths file is (a rewrite within the file system's timestamp granularity
    would keep the time, which a test must not depend on)."""
    st = os.stat(path)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns - seconds * 10**9))


def test_identity_notices_a_rewrite_in_place(tmp_path):
    path = tmp_path / "lengths.npy"
    lens = _lens(1000)
    np.save(path, lens)
    _age(path)
    mapped = load_column(path, "seq_lens")
    identity = FileIdentity.of(mapped)
    assert identity == FileIdentity.of(path) and identity.path == str(path)
    np.load(path)  # reading it again changes nothing
    assert np.array_equal(np.load(path, mmap_mode="r"), lens)
    identity.check("StreamingBatchSampler")
    other = np.random.default_rng().permutation(lens)
    np.save(path, other)  # the same size, other values, in place: the map now reads them
    assert np.array_equal(mapped, other)
    message = r"StreamingBatchSampler: the lengths file .*lengths.npy changed since .*os\.replace"
    with pytest.raises(ValueError, match=message):
        identity.check("StreamingBatchSampler")
    with pytest.raises(ValueError, match=r"the group ids file"):
        identity.check("StreamingBatchSampler", "group ids file")
    _age(path)
    identity = FileIdentity.of(path)
    np.save(path, lens[:-1])  # another size
    with pytest.raises(ValueError, match=r"size 8128 -> 8120 bytes"):
        identity.check("s")
    with pytest.raises(FileNotFoundError, match=r"missing.npy: no such file"):
        FileIdentity.of(tmp_path / "missing.npy")


def test_identity_after_a_rename_warns_and_the_map_keeps_the_old_data(tmp_path):
    path = tmp_path / "lengths.npy"
    lens = _lens(500)
    np.save(path, lens)
    mapped = load_column(path, "seq_lens")
    identity = FileIdentity.of(mapped)
    assert FileIdentity.of(lens) is None and FileIdentity.of([1, 2]) is None
    assert FileIdentity.of(np.asarray(mapped)) == identity  # a view of the map
    assert FileIdentity.of(mapped[10:]) == identity
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        identity.check("s")  # unchanged: no warning
    np.save(tmp_path / "new.npy", lens + 1)
    os.replace(tmp_path / "new.npy", path)  # the documented way: a new file renamed over it
    assert np.array_equal(mapped, lens)  # the old file's data, intact
    with pytest.warns(UserWarning, match=r"names another file .* the old file's"):
        identity.check("s")
    os.remove(path)
    with pytest.warns(UserWarning, match=r"names no file"):
        identity.check("s")
    assert FileIdentity.of(mapped) is None  # its file is gone: nothing to check
