"""Reading dataset metadata (one row per sample) into sequence lengths and group keys.

Accepted: CSV, JSON Lines (``.jsonl``/``.ndjson``) and Parquet (needs ``pyarrow``), with
either a ``seq_len`` column or ``num_frames``, ``height`` and ``width`` columns (Wan 2.1
token counts through ``wan_seq_len``). Errors name the file, row and column.
"""

from __future__ import annotations

import csv
import json
import os
from dataclasses import dataclass

import numpy as np

from adaptiveload.seqlen import wan_seq_len

SHAPE_COLUMNS = ("num_frames", "height", "width")


@dataclass
class Metadata:
    """Per-sample token counts, with the (frames, height, width) shape when known."""

    seq_lens: np.ndarray
    shapes: np.ndarray | None = None  # (n, 3) int64: num_frames, height, width

    def group_keys(self) -> np.ndarray | None:
        """One int64 key per distinct shape, so a micro-batch never mixes shapes."""
        if self.shapes is None:
            return None
        _, keys = np.unique(self.shapes, axis=0, return_inverse=True)
        return keys.reshape(-1).astype(np.int64)


def _rows(path: str):
    ext = os.path.splitext(path)[1].lower()
    if ext == ".csv":
        with open(path, newline="") as f:
            reader = csv.DictReader(f)
            if reader.fieldnames is None:
                raise ValueError(f"{path}: empty CSV file (no header row)")
            for i, row in enumerate(reader, start=2):  # line 1 is the header
                yield i, row
    elif ext in (".jsonl", ".ndjson"):
        with open(path) as f:
            for i, line in enumerate(f, start=1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as e:
                    raise ValueError(f"{path} line {i}: not valid JSON ({e.msg})") from None
                if not isinstance(row, dict):
                    raise ValueError(f"{path} line {i}: expected a JSON object per line")
                yield i, row
    elif ext == ".parquet":
        try:
            import pyarrow.parquet as pq
        except ImportError:
            raise ImportError(
                f"{path}: reading Parquet needs pyarrow (pip install 'adaptiveload[parquet]')"
            ) from None
        table = pq.read_table(path)
        for i, row in enumerate(table.to_pylist(), start=1):
            yield i, row
    else:
        raise ValueError(f"{path}: unknown metadata format {ext!r} (use .csv, .jsonl or .parquet)")


def _positive_int(path: str, row: int, column: str, value) -> int:
    what = f"{path} row {row}, column {column!r}"
    if value is None or (isinstance(value, str) and not value.strip()):
        raise ValueError(f"{what}: missing value")
    if isinstance(value, bool):
        raise ValueError(f"{what}: {value!r} is not a positive integer")
    try:
        f = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{what}: {value!r} is not a positive integer") from None
    if not np.isfinite(f) or f != int(f) or f < 1:
        raise ValueError(f"{what}: {value!r} is not a positive integer")
    return int(f)


def read_metadata(path: str | os.PathLike) -> Metadata:
    """Read per-sample metadata; see the module docstring for the accepted formats."""
    path = os.fspath(path)
    if not os.path.exists(path):
        raise FileNotFoundError(f"metadata file not found: {path}")
    seq: list[int] = []
    shapes: list[tuple[int, int, int]] = []
    mode = None
    for i, row in _rows(path):
        if mode is None:
            if "seq_len" in row:
                mode = "seq_len"
            elif all(c in row for c in SHAPE_COLUMNS):
                mode = "shape"
            else:
                raise ValueError(
                    f"{path}: needs a 'seq_len' column or 'num_frames', 'height', 'width' columns; "
                    f"found {sorted(row)}"
                )
        if mode == "seq_len":
            seq.append(_positive_int(path, i, "seq_len", row.get("seq_len")))
        else:
            shapes.append(tuple(_positive_int(path, i, c, row.get(c)) for c in SHAPE_COLUMNS))
    if mode is None:
        raise ValueError(f"{path}: no samples")
    if mode == "seq_len":
        return Metadata(seq_lens=np.asarray(seq, dtype=np.int64))
    arr = np.asarray(shapes, dtype=np.int64)
    return Metadata(seq_lens=wan_seq_len(arr[:, 0], arr[:, 1], arr[:, 2]), shapes=arr)
