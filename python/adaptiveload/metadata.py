"""Reading dataset metadata (one row per sample) into sequence lengths and group keys.

Accepted: CSV (UTF-8, with or without a byte-order mark), JSON Lines (``.jsonl``/``.ndjson``),
Parquet (needs ``pyarrow``; a directory of ``.parquet`` shards reads as one table, in name
order) and ``.npy`` (read memory-mapped: a 1-D integer array is the ``seq_len`` column, a
structured array's fields are columns), with a ``seq_len`` column, or ``num_frames``, ``height`` and
``width`` columns (Wan 2.1 token counts through ``wan_seq_len``), or both: then ``seq_len``
gives the token counts and the shapes the group keys. Every format converts its values by the
same rules: a positive integer (an integral float such as ``1560.0`` too, or its text) of at
most 2^40 - 1 is accepted; a fraction, a boolean, a missing value or a larger number is refused
with an error naming the file, row and column. The columns of JSON Lines are the keys of all
its rows: a row without a key that another row has misses that value (as an empty CSV cell or a
Parquet null does). A column read twice (a CSV or Parquet header, or a key of one JSON object)
is refused, as is a shape the model cannot take (its row and column named). Blank lines are
skipped in JSON Lines, and at the end of a CSV file. Numeric Parquet and ``.npy`` columns are
checked and converted whole, never as one Python object per row (100M rows read in seconds).
A file that is not what its name says (a damaged Parquet shard, a text file named ``.npy``) is
refused naming it, as ``adaptiveload.sampler.columns`` refuses the sampler's ``.npy`` columns.
"""

from __future__ import annotations

import collections
import csv
import json
import operator
import os
from dataclasses import dataclass

import numpy as np

from adaptiveload.sampler.checks import as_group_ids
from adaptiveload.sampler.columns import map_npy
from adaptiveload.wan import ShapeError, wan_seq_len

SHAPE_COLUMNS = ("num_frames", "height", "width")
# The largest value of any column: the sampler's bound on one sample's tokens.
_MAX_VALUE = 2**40 - 1
# The value of a JSON Lines row without a key that other rows have: a missing value.
_ABSENT = object()


@dataclass
class Metadata:
    """Per-sample token counts, with the (frames, height, width) shape when known.

    ``seq_len_column``: the token counts came from a ``seq_len`` column (not from the shapes).
    """

    seq_lens: np.ndarray
    shapes: np.ndarray | None = None  # (n, 3) int64: num_frames, height, width
    seq_len_column: bool = False

    def group_keys(self) -> np.ndarray | None:
        """One int64 key per distinct shape, so a micro-batch never mixes shapes: the
        samplers' own numbering of ``group_keys`` (dense ids in sorted shape order), which
        they then take as they are."""
        if self.shapes is None:
            return None
        return as_group_ids(self.shapes, self.seq_lens)


def _csv_columns(path: str, wanted: list[str]):
    with open(path, newline="", encoding="utf-8-sig") as f:
        reader = csv.reader(f)
        header = next(reader, None)
        if header is None:
            raise ValueError(f"{path}: empty CSV file (no header row)")
        header = [h.strip() for h in header]
        _refuse_repeated_columns(path, header, wanted)
        index = {name: header.index(name) for name in wanted if name in header}
        cols: dict[str, list] = {name: [] for name in index}
        width = len(header)
        blank = None  # the first of the blank lines read since the last row
        for line, row in enumerate(reader, start=2):  # line 1 is the header
            if not row:  # trailing blank lines end the file; others are refused below
                blank = blank or line
                continue
            if blank is not None:
                if width == 1:
                    raise ValueError(f"{path} row {blank}, column {header[0]!r}: missing value")
                raise ValueError(f"{path} row {blank}: empty row")
            if len(row) != width:
                raise ValueError(f"{path} row {line}: {len(row)} fields, the header has {width}")
            for name, j in index.items():
                cols[name].append(row[j])
    return header, cols, None  # CSV rows are numbered from 2


def _refuse_repeated_columns(path: str, names: list[str], wanted: list[str]) -> None:
    for name in wanted:
        if names.count(name) > 1:
            raise ValueError(
                f"{path}: column {name!r} appears {names.count(name)} times; keep one (which "
                "to read would be a guess)"
            )


def _refuse_repeated_keys(path: str, row: int, line: str, wanted: list[str]) -> None:
    """Refuse a key of ``wanted`` that the JSON object on ``line`` holds twice at its top
    level (``json.loads`` keeps the last one silently)."""
    if all(line.count(f'"{name}"') < 2 for name in wanted):
        return  # the common case, without a second parse
    keys = collections.Counter(k for k, _ in json.loads(line, object_pairs_hook=list))
    for name in wanted:
        if keys[name] > 1:
            raise ValueError(f"{path} row {row}: key {name!r} appears {keys[name]} times; keep one")


def _jsonl_columns(path: str, wanted: list[str]):
    cols: dict[str, list] = {}
    lines: list[int] = []
    header: dict[str, None] = {}  # the keys of all rows, in order of first appearance
    with open(path, encoding="utf-8-sig") as f:
        for i, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path} line {i}: not valid JSON ({e.msg})") from None
            if not isinstance(row, dict):
                raise ValueError(f"{path} line {i}: expected a JSON object per line")
            _refuse_repeated_keys(path, i, line, wanted)
            header.update(dict.fromkeys(row))
            for name in wanted:  # a column first seen here: the rows before miss its value
                if name in row and name not in cols:
                    cols[name] = [_ABSENT] * len(lines)
            for name, values in cols.items():
                values.append(row.get(name, _ABSENT))
            lines.append(i)
    return list(header), cols, np.asarray(lines, dtype=np.int64)


def _parquet(path: str, read):
    """``read(pq.ParquetFile(path))``, or one ValueError naming the file when pyarrow cannot
    read it (pyarrow's own error does not name it: in a directory of shards, which one?)."""
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        raise ImportError(
            f"{path}: reading Parquet needs pyarrow (pip install 'adaptiveload[parquet]')"
        ) from None
    try:
        return read(pq.ParquetFile(path))
    except (pa.ArrowException, OSError) as e:
        if isinstance(e, FileNotFoundError | PermissionError):
            raise
        reason = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise ValueError(
            f"{path}: cannot be read as Parquet ({reason}); the file is damaged or is not "
            "Parquet: write it again (or move it out of the directory of shards)"
        ) from None


def _num_rows(file) -> int:
    return file.metadata.num_rows


def _parquet_columns(path: str, wanted: list[str]):
    def read(file):
        names = list(file.schema_arrow.names)
        _refuse_repeated_columns(path, names, wanted)
        table = file.read(columns=[name for name in wanted if name in names])
        return names, table, file.metadata.num_rows

    names, table, rows = _parquet(path, read)
    cols = {name: _arrow_values(table.column(name)) for name in table.column_names}
    return names, cols, range(1, rows + 1)


def _arrow_values(column):
    """A Parquet column as a numpy array where its type is numeric and it has no nulls (read
    without a Python object per row), else as Python values (what the row-by-row checks name)."""
    import pyarrow as pa

    numeric = pa.types.is_integer(column.type) or pa.types.is_floating(column.type)
    if numeric and column.null_count == 0:
        return column.to_numpy()
    return column.to_pylist()


def _npy_columns(path: str, wanted: list[str]):
    """A ``.npy`` read memory-mapped: a 1-D integer array is the ``seq_len`` column; a
    structured array's fields are its columns."""
    a = map_npy(path, "metadata")
    if a.ndim != 1:
        raise ValueError(f"{path}: expected a 1-D array (one row per sample), got shape {a.shape}")
    if a.dtype.names is None:
        return ["seq_len"], {"seq_len": a}, range(1, len(a) + 1)
    names = list(a.dtype.names)
    cols = {name: a[name] for name in wanted if name in names}
    return names, cols, range(1, len(a) + 1)


def _positive_int(path: str, row: int, column: str, value) -> int:
    what = f"{path} row {row}, column {column!r}"
    if value is _ABSENT:
        raise ValueError(f"{what}: missing value (the row has no such key; other rows have it)")
    if value is None or (isinstance(value, str) and not value.strip()):
        raise ValueError(f"{what}: missing value")
    if isinstance(value, bool):
        raise ValueError(f"{what}: {value!r} is not a positive integer")
    try:
        v = int(value.strip()) if isinstance(value, str) else operator.index(value)
    except (TypeError, ValueError):  # not integer text or an integer: an integral float?
        try:
            f = float(value)
        except (TypeError, ValueError):
            raise ValueError(f"{what}: {value!r} is not a positive integer") from None
        if not np.isfinite(f) or f != int(f):
            raise ValueError(f"{what}: {value!r} is not a positive integer") from None
        v = int(f)
    if v < 1:
        raise ValueError(f"{what}: {value!r} is not a positive integer")
    if v > _MAX_VALUE:
        raise ValueError(f"{what}: {value!r} is larger than the largest supported (2^40 - 1)")
    return v


def _int_column(path: str, name: str, values, rows) -> np.ndarray:
    """Positive integers, converted in one pass; on any doubt, value by value so that the
    error names the first bad row. ``values``: a list, or a numeric numpy array (checked
    whole, and returned without a copy where it is int64 already); ``rows``: the row of each
    value (None: CSV's, from 2)."""
    row_of = (lambda j: j + 2) if rows is None else (lambda j: int(rows[j]))
    if isinstance(values, np.ndarray) and values.dtype.kind in "iuf" and values.ndim == 1:
        if values.dtype.kind == "f":
            values = values.astype(np.float64, copy=False)  # bounds compared exactly
            finite = np.isfinite(values)
            bad = ~finite | (values != np.floor(np.where(finite, values, 0)))
            bad |= (values < 1) | (values > _MAX_VALUE)
        else:
            bad = (values < 1) | (values > _MAX_VALUE)
        if bad.any():
            j = int(np.argmax(bad))
            _positive_int(path, row_of(j), name, values[j].item())  # raises, naming it
        return values.astype(np.int64, copy=False)
    if isinstance(values, np.ndarray):
        values = values.tolist()
    fast = None
    # Only when every value is integer text, or an int (not a bool, float or None): numpy
    # would truncate a float and convert a bool after the first value.
    if all(type(v) is str for v in values) or all(type(v) is int for v in values):
        try:
            fast = np.array(values, dtype=np.int64)
        except (ValueError, OverflowError, TypeError):
            fast = None
    if fast is not None and fast.ndim == 1 and (fast >= 1).all() and (fast <= _MAX_VALUE).all():
        return fast
    return np.array(
        [_positive_int(path, row_of(j), name, v) for j, v in enumerate(values)], dtype=np.int64
    )


def read_metadata(path: str | os.PathLike, seq_len=None) -> Metadata:
    """Read per-sample metadata; see the module docstring for the accepted formats.
    ``seq_len(frames, height, width)``: tokens of a shape where there is no ``seq_len`` column
    (default ``wan_seq_len``; a family's ``ModelFamily.seq_len`` for another model)."""
    path = os.fspath(path)
    if os.path.isdir(path):
        return _read_shards(path, seq_len)
    if not os.path.exists(path):
        raise FileNotFoundError(f"metadata file not found: {path}")
    ext = os.path.splitext(path)[1].lower()
    readers = {".csv": _csv_columns, ".jsonl": _jsonl_columns, ".ndjson": _jsonl_columns}
    readers[".parquet"] = _parquet_columns
    readers[".npy"] = _npy_columns
    if ext not in readers:
        raise ValueError(
            f"{path}: unknown metadata format {ext!r} (use .csv, .jsonl, .parquet or .npy)"
        )
    wanted = ["seq_len", *SHAPE_COLUMNS]
    try:
        header, cols, rows = readers[ext](path, wanted)
    except UnicodeDecodeError as e:
        raise ValueError(
            f"{path}: not UTF-8 text (a byte 0x{e.object[e.start]:02x}: {e.reason}); save the "
            "file as UTF-8"
        ) from None
    has_seq = "seq_len" in cols
    has_shape = all(c in cols for c in SHAPE_COLUMNS)
    if not header:
        raise ValueError(f"{path}: no samples")
    if not (has_seq or has_shape):
        raise ValueError(
            f"{path}: needs a 'seq_len' column or 'num_frames', 'height', 'width' columns; "
            f"found {sorted(header)}"
        )
    n = len(next(iter(cols.values())))
    if n == 0:
        raise ValueError(f"{path}: no samples")
    shapes = None
    if has_shape:
        shapes = np.stack([_int_column(path, c, cols[c], rows) for c in SHAPE_COLUMNS], axis=1)
    if has_seq:
        seq = _int_column(path, "seq_len", cols["seq_len"], rows)
        return Metadata(seq_lens=seq, shapes=shapes, seq_len_column=True)
    count = wan_seq_len if seq_len is None else seq_len
    try:
        seq = count(shapes[:, 0], shapes[:, 1], shapes[:, 2])
    except ShapeError as e:  # name the row and column, not the sample
        row = e.index + 2 if rows is None else int(rows[e.index])
        column = SHAPE_COLUMNS[("frames", "height", "width").index(e.dimension)]
        raise ValueError(f"{path} row {row}, column {column!r}: {e.shape}: {e.rule}") from None
    return Metadata(seq_lens=seq, shapes=shapes)


def _read_shards(path: str, seq_len) -> Metadata:
    """A directory of Parquet shards (``*.parquet``, in name order) read as one table: its rows
    are the shards' rows one after another; an error names the shard and its row."""
    # As pyarrow lists a dataset: names starting with "_" or "." are not shards.
    names = sorted(f for f in os.listdir(path) if not f.startswith(("_", ".")))
    nested = [f for f in names if os.path.isdir(os.path.join(path, f))]
    if nested:
        raise ValueError(
            f"{path}: holds folders ({', '.join(nested[:3])}): nested or partitioned shards are "
            "not read; give the folder whose files are the shards"
        )
    shards = [f for f in names if f.lower().endswith(".parquet")]
    shards = [f for f in shards if _parquet(os.path.join(path, f), _num_rows)]
    if not shards:
        raise ValueError(
            f"metadata path {path} is a directory without .parquet shards: give a .csv, "
            ".jsonl, .parquet or .npy file, or a directory of .parquet shards"
        )
    parts = [read_metadata(os.path.join(path, f), seq_len) for f in shards]
    kinds = {(m.shapes is not None, m.seq_len_column) for m in parts}
    if len(kinds) > 1:
        raise ValueError(
            f"{path}: the shards do not have the same columns (seq_len and num_frames, height, "
            "width): read alike, they must hold the same ones"
        )
    shapes = None if parts[0].shapes is None else np.concatenate([m.shapes for m in parts])
    return Metadata(
        seq_lens=np.concatenate([m.seq_lens for m in parts]),
        shapes=shapes,
        seq_len_column=parts[0].seq_len_column,
    )
