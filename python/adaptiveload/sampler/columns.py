"""Per-sample columns (lengths, group ids) given as arrays or ``.npy`` files, and the identity
of such a file.

``load_column`` returns a 1-D int32/int64 array as it is (a ``.npy`` is memory-mapped, never
copied) and refuses anything else with one message naming the file and what is wrong: numpy's
own errors on a bad file say neither (a text file is reported as pickled data, with advice to
load it unsafely).

``FileIdentity`` is what a sampler that maps a file keeps to notice that the file was rewritten
in place while mapped: the pages under the mapping are then the new content, read through a
plan made from the old one. Replacing the file by a rename is safe: the mapping keeps the old
file's data, and the sampler keeps reading it.
"""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass

import numpy as np

# What a file that is not a .npy often is, by its first bytes.
_OTHER_FORMATS = {
    b"PK\x03\x04": "a zip archive, as np.savez writes",
    b"\x80": "a Python pickle",
    b"PAR1": "a Parquet file",
}
_SAVE = "np.save(path, np.asarray(values, dtype=np.int64))"


class MissingFileError(FileNotFoundError, ValueError):
    """A column's file does not exist (a ``ValueError`` too, as every other bad input here)."""


def _not_npy(what: str, head: bytes) -> ValueError:
    kind = next((v for k, v in _OTHER_FORMATS.items() if head.startswith(k)), None)
    if kind is None and head:
        try:
            head.decode("utf-8")
            kind = "text"
        except UnicodeDecodeError:
            kind = None
    shown = (f"{kind}: " if kind else "") + f"it begins with {head[:8]!r}" if head else "empty"
    return ValueError(f"{what}: not a NumPy .npy file ({shown}); write it with {_SAVE}")


def _read_header(f, what: str):
    """(shape, fortran_order, dtype) of an open ``.npy``, or one ValueError saying why not."""
    fmt = np.lib.format
    head = f.read(8)
    f.seek(0)
    try:
        version = fmt.read_magic(f)
    except ValueError:
        raise _not_npy(what, head) from None
    try:
        if version == (1, 0):
            return fmt.read_array_header_1_0(f)
        return fmt.read_array_header_2_0(f)
    except Exception as e:  # noqa: BLE001 - numpy raises ValueError, SyntaxError, TokenError...
        reason = e.args[0] if e.args and isinstance(e.args[0], str) else type(e).__name__
        raise ValueError(
            f"{what}: the .npy header is damaged ({reason.splitlines()[0][:120]}); write the "
            f"file again with {_SAVE}"
        ) from None


def map_npy(path: str | os.PathLike, name: str) -> np.ndarray:
    """``np.load(path, mmap_mode="r")`` of a ``.npy`` holding one array of plain values (any
    shape and non-object dtype: the caller checks them), or one ValueError naming the file and
    what is wrong: missing, not a ``.npy``, a damaged header, Python objects, fewer bytes than
    the header declares."""
    path = os.fspath(path)
    what = f"{name} file {path}"
    try:
        with open(path, "rb") as f:
            shape, _, dtype = _read_header(f, what)
            offset = f.tell()
            size = os.fstat(f.fileno()).st_size
    except FileNotFoundError:
        raise MissingFileError(f"{what}: no such file") from None
    except IsADirectoryError:
        raise ValueError(f"{what}: a directory, not a .npy file") from None
    if dtype.hasobject:
        raise ValueError(
            f"{what}: holds Python objects (dtype {dtype}), which are not loaded (that would "
            f"run pickled code from the file); write it with {_SAVE}"
        )
    need = offset + int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    if size < need:
        raise ValueError(
            f"{what}: cut short: its header declares shape {shape} of {dtype} ({need} bytes "
            f"with the header), the file holds {size} bytes; write it again"
        )
    return np.load(path, mmap_mode="r")


def load_column(values, name: str) -> np.ndarray:
    """A 1-D int32/int64 native contiguous array as it is (a memory map stays one, not copied),
    any other 1-D integer array (but uint64) as a contiguous int64 copy. ``values``: an array,
    a sequence, or the path of a ``.npy`` (memory-mapped). Anything else is refused with one
    ValueError naming ``name`` (and the file) and what is wrong."""
    if isinstance(values, str | os.PathLike):
        what = f"{name} file {os.fspath(values)}"
        values = map_npy(values, name)
    else:
        what = name
    a = values if isinstance(values, np.ndarray) else np.asarray(values)
    if a.ndim != 1:
        raise ValueError(f"{what} must be 1-D (one value per dataset index), got shape {a.shape}")
    if a.dtype in (np.int32, np.int64) and a.dtype.isnative and a.flags.c_contiguous:
        return a
    if a.dtype.kind not in "iu" or a.dtype == np.uint64:
        raise ValueError(f"{what} must hold integers (int32 or int64), got dtype {a.dtype}")
    return np.ascontiguousarray(a, dtype=np.int64)


def mapped_file(values) -> str | None:
    """The file under a memory-mapped array (``np.memmap``, ``np.load(mmap_mode=...)``, or a
    view of one), else None."""
    while isinstance(values, np.ndarray):
        if isinstance(values, np.memmap) and values.filename is not None:
            return values.filename
        values = values.base
    return None


@dataclass(frozen=True)
class FileIdentity:
    """What tells cheaply whether a file's content may have changed: its size and modification
    time, and which file (device, inode) the path named. Take it before or as the file is
    mapped, then ``check`` it where a rewrite would matter (at each epoch's start)."""

    path: str
    size: int
    mtime_ns: int
    inode: int
    device: int

    @classmethod
    def of(cls, values) -> FileIdentity | None:
        """The identity of the file ``values`` is (a path) or maps (a memory map); None for
        anything else (an array in memory), and for a map whose file was removed since."""
        mapped = not isinstance(values, str | os.PathLike)
        path = mapped_file(values) if mapped else os.fspath(values)
        if path is None:
            return None
        try:
            st = os.stat(path)
        except FileNotFoundError:
            if mapped:
                return None
            raise MissingFileError(f"{path}: no such file") from None
        return cls(os.path.abspath(path), st.st_size, st.st_mtime_ns, st.st_ino, st.st_dev)

    def check(self, owner: str, what: str = "lengths file") -> None:
        """Raise a ValueError if the file was rewritten in place since (same file, other size
        or modification time): its mapped pages are then the new content. If the path now
        names another file (replaced by a rename) or none, the mapped data is the old file's,
        intact: the sampler goes on with it, and a warning says that the new file is unused."""
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            st = None
        if st is None or (st.st_ino, st.st_dev) != (self.inode, self.device):
            now = "names no file" if st is None else "names another file"
            warnings.warn(
                f"{owner}: the {what} {self.path} {now} since the sampler was made (replaced "
                "or removed); the sampler goes on with the data it mapped, the old file's. "
                "Make a new sampler to read the new file.",
                stacklevel=2,
            )
            return
        if (st.st_size, st.st_mtime_ns) != (self.size, self.mtime_ns):
            changed = "changed" if st.st_mtime_ns != self.mtime_ns else "the same"
            raise ValueError(
                f"{owner}: the {what} {self.path} changed since the sampler was made (size "
                f"{self.size} -> {st.st_size} bytes, modification time {changed}): the "
                "sampler maps the file in place, so rewriting it changes the data under the "
                "sampler's plan. To change the data, write a new file and rename it over the "
                "old path (os.replace), then make a new sampler."
            )
