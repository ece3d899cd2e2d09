"""Writes the "which kernel runs" tables of docs/ops.md from the CUDA tuning tables.

Reads the rows of csrc/ops/cuda/tuned_{fwd,bwd}_*.cu (a shared row, ``ROW(...)``, per line,
which stands for a LayerNorm row and an RMSNorm row, configs.h; or a whole row, one C++
initializer per line) in table order, and
replaces the text between the `<!-- tuning-table:begin -->` and `<!-- tuning-table:end -->`
markers of docs/ops.md. Needs no build and no GPU:

    python scripts/ops_table.py
"""

from __future__ import annotations

import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CUDA = os.path.join(ROOT, "csrc", "ops", "cuda")
DOC = os.path.join(ROOT, "docs", "ops.md")
ROW = re.compile(r'^\{"([^"]+)", (.*)\},$')
SHARED = re.compile(r"^ROW\((.*)\)(?: \\)?$")
NORM_ROW = {
    "LAYER_NORM_ROW": ("Norm::kLayer", "", ""),
    "RMS_NORM_ROW": ("Norm::kRms", "rms.", ",rms"),
}


def split_top(text: str) -> list[str]:
    """``text`` split at top-level commas (template arguments, calls, braces stay whole)."""
    out, depth, cur, quoted = [], 0, "", False
    for ch in text:
        if ch == '"':
            quoted = not quoted
        elif quoted:
            pass
        elif ch in "<({":
            depth += 1
        elif ch in ">)}":
            depth -= 1
        if ch == "," and depth == 0 and not quoted:
            out.append(cur.strip())
            cur = ""
        else:
            cur += ch
    out.append(cur.strip())
    return out


def fields(line: str) -> list[str] | None:
    """A whole row's fields (the kernel's template arguments and the settings braces stay
    whole)."""
    m = ROW.match(line.strip())
    return [m.group(1)] + split_top(m.group(2)) if m else None


def expand(shared: list[str], table_id: str, norm_row: str) -> list[str]:
    """The fields of the row a shared row stands for under LAYER_NORM_ROW or RMS_NORM_ROW, as
    the macro in configs.h writes it."""
    norm, rms_id, rms_name = NORM_ROW[norm_row]
    rid, arch, columns, kernel, before, after, name, settings = shared
    kernel = f'{kernel}<{before[1:-1]}, {norm}{after[1:-1]}>({name[:-1]}{rms_name}>")'
    return [table_id + rms_id + rid.strip('"'), arch, norm, *split_top(columns[1:-1]), kernel,
            settings]  # fmt: skip


def limit(v: str) -> str:
    return "any" if v == "kNoLimit" else v


def kernel_name(call: str) -> str:
    m = re.search(r'\("([^"]+)"\)', call)
    return m.group(1) if m else call


def table_rows(name: str) -> list[list[str]]:
    """The fields of every row of the tuning table csrc/ops/cuda/<name>.cu, in table order: the
    items of its kRows initializer, each shared list expanded for its norm."""
    with open(os.path.join(CUDA, f"{name}.cu")) as f:
        lines = [line.strip() for line in f]
    table_id = next(line.split('"')[1] for line in lines if line.startswith("#define TABLE_ID"))
    shared = [split_top(m.group(1)) for m in map(SHARED.match, lines) if m]
    start = next(i for i, line in enumerate(lines) if "kRows[] = {" in line)
    text = lines[start].split("{", 1)[1]
    for line in lines[start + 1 :]:
        if text.rstrip().endswith("};"):
            break
        text += "\n" + line
    rows = []
    for item in re.findall(r'SHARED_ROWS\((\w+)\)|^(\{".*\},)$', text, flags=re.M):
        rows += [expand(r, table_id, item[0]) for r in shared] if item[0] else [fields(item[1])]
    return rows


OP = {"kEither": "any", "0": "plain", "1": "gated"}
NORM = {"Norm::kLayer": "layer", "Norm::kRms": "rms"}


def d_range(vector: str, dmin: str, dmax: str) -> str:
    return f"{dmin}-{limit(dmax)}" if vector == "true" else "any, not vector"


def forward_rows(dtype: str) -> list[str]:
    rows = []
    for f in table_rows(f"tuned_fwd_{dtype}"):
        rid, arch, norm, op, mod, vector, dmin, dmax, rmin, rmax, kernel, settings = f
        op = OP[op]
        mod = mod.replace("Mod::k", "").lower()
        if ",raw16" in kernel:  # needs the modulation of x's own 16-bit type
            mod += ", x's type"
        d = d_range(vector, dmin, dmax)
        rows_ = "any" if rmax == "kNoLimit" else f"{rmin}-{rmax}"
        arch = f">= sm_{arch}" if arch != "0" else "any"
        rows.append(
            f"| {dtype} | {NORM[norm]} | {op} | {mod} | {d} | {rows_} | {arch} | "
            f"`{kernel_name(kernel)}` {settings.strip('{}')} | `{rid}` |"
        )
    return rows


def backward_rows(dtype: str) -> list[str]:
    rows = []
    for f in table_rows(f"tuned_bwd_{dtype}"):
        rid, arch, norm, dy, op, affine, lean, vector, dmin, dmax, kernel, settings = f
        dy = {"-1": "any", "kF32": "f32", "kBF16": "bf16", "kF16": "f16"}[dy]
        op = OP[op]
        affine = {"kEither": "any", "0": "no", "1": "yes"}[affine]
        case = "lean case" if lean == "true" else "token case" if "bwd_token<" in kernel else ""
        d = d_range(vector, dmin, dmax)
        rows.append(
            f"| {dtype} | {NORM[norm]} | {dy} | {op} | {affine} {case} | {d} | "
            f"`{kernel_name(kernel)}` | `{rid}` |"
        )
    return rows


def render() -> str:
    out = [
        "Forward (first matching row wins; settings: warps per block, ring slots, y as 4-byte "
        "words, interleaved rows):",
        "",
        "| x | norm | op | modulation | D | rows | GPU | kernel, settings | row |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for dtype in ("bf16", "f16", "f32"):
        out += forward_rows(dtype)
    out += [
        "",
        "Backward (teams and ring depth 0: the launcher's rule, launch.cuh):",
        "",
        "| x | norm | dy | op | affine | D | kernel | row |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for dtype in ("bf16", "f16", "f32"):
        out += backward_rows(dtype)
    return "\n".join(out)


def main() -> int:
    doc = open(DOC).read()
    begin, end = "<!-- tuning-table:begin -->", "<!-- tuning-table:end -->"
    if begin not in doc:
        print(f"{DOC} has no {begin} marker", file=sys.stderr)
        return 1
    doc = doc[: doc.index(begin) + len(begin)] + "\n" + render() + "\n" + doc[doc.index(end) :]
    with open(DOC, "w") as f:
        f.write(doc)
    print(f"wrote the tuning tables into {os.path.relpath(DOC, ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
