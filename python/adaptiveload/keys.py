"""Per-sample keys as dense ids (``as_group_ids``), and arrays of any container
(``to_numpy``): the one numbering of group keys, used by the samplers, the metadata readers and
the composition reports alike. It imports nothing of the package."""

from __future__ import annotations

import numpy as np

__all__ = ["as_group_ids", "to_numpy"]


def to_numpy(values, name: str) -> np.ndarray:
    """A numpy array of a list, array or tensor of any dtype and device (bf16 and fp16
    tensors as float64, which holds them exactly)."""
    try:
        import torch

        if isinstance(values, torch.Tensor):
            t = values.detach().cpu()
            if t.dtype in (torch.bfloat16, torch.float16):
                t = t.double()
            return t.numpy()
    except ImportError:  # pragma: no cover
        pass
    if isinstance(values, np.ndarray):
        return values
    if isinstance(values, str | bytes) or not hasattr(values, "__len__"):
        raise ValueError(f"{name} must be a sequence, array or tensor, got {type(values).__name__}")
    try:
        return np.asarray(values)
    except ValueError:  # ragged nested lists
        return np.asarray(list(values), dtype=object)


def _typed_keys(group_keys, a: np.ndarray) -> np.ndarray:
    """``a``, numpy's array of a list or tuple of keys, where it kept each key as it was; an
    object array of the keys as given where it made text of keys of other types (``[1, '1']``
    becomes ``['1', '1']``: one key)."""
    if a.dtype.kind not in "US" or a.ndim not in (1, 2) or isinstance(group_keys, np.ndarray):
        return a
    text = str if a.dtype.kind == "U" else bytes
    keys = list(group_keys)
    fields = keys if a.ndim == 1 else [v for k in keys for v in k]
    if all(isinstance(v, text) for v in fields):
        return a
    out = np.empty(len(keys), dtype=object)
    for i, k in enumerate(keys):
        out[i] = tuple(k) if a.ndim == 2 else k
    return out


def as_group_ids(group_keys, seq_lens: np.ndarray, name: str = "group_keys") -> np.ndarray:
    """Dense int64 ids, numbered in sorted key order, so that the same keys plan alike in
    any container: a 1-D array, tensor or list of keys, or an ``(n, k)`` array, tensor or
    list of tuples (e.g. ``(frames, height, width)``). Keys are equal as Python compares
    them: ``1`` and ``'1'`` are two keys. The one numbering of group keys:
    ``Metadata.group_keys`` gives its result, which is returned as it is (dense ids are their
    own numbering), and the C++ sample table takes it without renumbering."""
    n = len(seq_lens)
    a = _typed_keys(group_keys, to_numpy(group_keys, name))
    if a.ndim == 0 or len(a) != n:
        got = "a scalar" if a.ndim == 0 else f"{len(a)} entries"
        raise ValueError(f"{name} must have one key per sample ({n}), got {got}")
    if a.ndim > 2:
        raise ValueError(f"{name} must be 1-D or (n, k), got shape {a.shape}")
    if a.ndim == 1 and a.dtype.kind in "iu" and n and a.min() >= 0 and a.max() < n:
        if np.bincount(a, minlength=1).all():  # already dense ids: their own numbering
            return np.ascontiguousarray(a, dtype=np.int64)
    if a.dtype.kind in "iu" and n:
        ids = _integer_key_ids(a)
        if ids is not None:
            return ids
    if a.dtype.kind in "biufUS":
        ids = np.unique(a, axis=0 if a.ndim == 2 else None, return_inverse=True)[1]
        return np.ascontiguousarray(ids.reshape(-1), dtype=np.int64)
    # Arbitrary hashable keys: sorted when they sort, else numbered by first appearance.
    keys = [tuple(k) if isinstance(k, list | np.ndarray) else k for k in a]
    try:
        order = {k: i for i, k in enumerate(sorted(set(keys)))}
    except TypeError:
        order = {}
        for k in keys:
            order.setdefault(k, len(order))
    return np.fromiter((order[k] for k in keys), dtype=np.int64, count=n)


def _integer_key_ids(a: np.ndarray) -> np.ndarray | None:
    """Dense ids of integer keys (1-D, or (n, k) rows) in sorted key order, without sorting the
    rows: each row as one mixed-radix code (which orders as the rows do), then the codes' ranks
    from a table of the codes present (where the codes span at most 2^26), else by sorting the
    codes. None where the codes would not fit in int64."""
    if a.dtype == np.uint64 and a.max() >= 2**63:
        return None  # past int64: np.unique numbers them
    rows = a.reshape(len(a), -1)
    low = rows.min(axis=0)
    span = [int(h) - int(lo) + 1 for lo, h in zip(low, rows.max(axis=0), strict=True)]
    if np.prod(np.array(span, dtype=np.float64)) >= 2.0**62:
        return None
    code = np.zeros(len(a), dtype=np.int64)
    for j, width in enumerate(span):
        code *= width
        code += rows[:, j].astype(np.int64) - int(low[j])
    total = int(np.prod(np.array(span, dtype=object)))
    if total <= 1 << 26:
        present = np.zeros(total, dtype=np.int64)
        present[code] = 1
        return np.cumsum(present)[code] - 1
    return np.unique(code, return_inverse=True)[1].reshape(-1).astype(np.int64)
