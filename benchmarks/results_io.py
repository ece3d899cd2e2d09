"""Reading and writing the raw results of benchmarks/results/<machine>/*.csv, and the table and
provenance lines of benchmarks/RESULTS.md (make_results.py renders it)."""

from __future__ import annotations

import csv
import os
import platform
from datetime import date

HERE = os.path.dirname(os.path.abspath(__file__))
RESULTS = os.path.join(HERE, "results")


def append_csv(path: str, rows: list[dict]) -> None:
    """Appends `rows` to the CSV at `path`, writing the header (the first row's keys) when the
    file is new: the --csv option of the GPU benchmarks."""
    new = not os.path.exists(path)
    with open(path, "a", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        if new:
            w.writeheader()
        w.writerows(rows)


def write_csv(path: str, rows: list[dict]) -> None:
    """Writes `rows` as a CSV at `path`, columns the first row's keys (missing values empty):
    the raw output of a benchmark run under its --out folder."""
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]), restval="", extrasaction="ignore")
        w.writeheader()
        w.writerows(rows)


def read(rel: str) -> list[dict]:
    path = os.path.join(RESULTS, rel)
    if not os.path.exists(path):
        return []
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def table(head: list[str], rows: list[list]) -> list[str]:
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    out += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return out


def provenance(rows: list[dict], command: str | None = None) -> str:
    r = rows[0]
    parts = [r.get("machine") or r.get("gpu") or r.get("device", "")]
    if r.get("torch"):
        parts.append(f"torch {r['torch']}")
    parts.append(", ".join(sorted({x["date"] for x in rows if x.get("date")})))
    cmd = command or r.get("command")
    return "; ".join(p for p in parts if p) + (f"; `{cmd}`" if cmd else "")


def cpu_meta(command: str) -> dict:
    """The provenance of a CPU benchmark's CSV: today's date, this machine and its cores, and
    the command that wrote it."""
    return {
        "date": str(date.today()),
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores",
        "command": command,
    }
