"""The files of benchmarks/fidelity.py and its slices. A slice (``--seeds A-B``) runs those
seeds for every setup and arm and writes its rows (``fidelity.csv``) and its record
(``fidelity_slice.json``: the configuration, its digest, the seeds, the wiring checks);
``--summarize-only DIR ...`` merges slices of one configuration (it refuses any other), writes
the summary (``fidelity.csv``, ``.json``, ``.md``) and names the comparisons that still need
seeds and the next seeds to run."""

from __future__ import annotations

import csv
import glob
import hashlib
import json
import os
import sys
from dataclasses import asdict
from datetime import datetime, timezone

import torch

import fidelity_stats as fs
from fidelity_arms import ARMS, control_of, runs_of

COLUMNS = (
    "setup",
    "run",
    "seed",
    "same_as",
    "steps",
    "epoch",
    "lr",
    "samples_seen",
    "tokens_seen",
    "micro_batches",
    "mixed_steps",
    "train_loss",
    "wall_s",
    "val_image",
    "val_clip",
    "val_mean",
)
ROWS_CSV = "fidelity.csv"
SLICE_JSON = "fidelity_slice.json"
HERE = os.path.dirname(os.path.abspath(__file__))


class Refused(Exception):
    """Slices that must not be merged."""


def parse_seeds(text: str) -> list[int]:
    """``0-1``, ``0,3,7`` or a mix: ``0-2,9``."""
    seeds = []
    for part in (p for p in text.split(",") if p):
        low, _, high = part.partition("-")
        seeds += list(range(int(low), int(high or low) + 1))
    if not seeds:
        raise ValueError(f"no seeds in {text!r}")
    return sorted(set(seeds))


def format_seeds(seeds) -> str:
    """The inverse of ``parse_seeds``: ``[0, 1, 2, 5]`` -> ``0-2,5``."""
    parts, seeds = [], sorted(seeds)
    for i, s in enumerate(seeds):
        if i and s == seeds[i - 1] + 1:
            parts[-1][1] = s
        else:
            parts.append([s, s])
    return ",".join(f"{a}" if a == b else f"{a}-{b}" for a, b in parts)


def config(size, setups, arms, device: str, min_seeds: int, max_seeds: int, batch: int) -> dict:
    """What the rows of a seed depend on, and the stopping rule: slices merge only if equal."""
    return {
        "size": asdict(size),
        "setups": list(setups),
        "arms": {a: {"keywords": ARMS[a][0], "control": control_of(a)} for a in arms},
        "device": torch.device(device).type,  # bf16 autocast on a GPU, fp32 on the CPU
        "primary": fs.PRIMARY,
        "margin": fs.MARGIN,
        "levels": list(fs.LEVELS),
        "seeds": {"min": min_seeds, "max": max_seeds, "batch": batch},
    }


def digest(cfg: dict) -> str:
    return hashlib.sha256(json.dumps(cfg, sort_keys=True, default=str).encode()).hexdigest()[:16]


def provenance() -> dict:
    """Versions and a hash of the code that trains (its sampler and this benchmark): slices
    whose differ are merged with a warning."""
    import diffusers

    import adaptiveload

    files = sorted(glob.glob(os.path.join(os.path.dirname(adaptiveload.__file__), "*.py")))
    files += [os.path.join(HERE, f"fidelity_{m}.py") for m in ("arms", "data")]
    code = hashlib.sha256()
    for path in files:
        with open(path, "rb") as f:
            code.update(f.read())
    return {
        "torch": torch.__version__,
        "diffusers": diffusers.__version__,
        "adaptiveload": adaptiveload.__version__,
        "code": code.hexdigest()[:16],
    }


def start_rows(path: str) -> None:
    with open(path, "w", newline="") as f:
        csv.writer(f).writerow(COLUMNS)


def add_rows(path: str, rows) -> None:
    with open(path, "a", newline="") as f:
        csv.DictWriter(f, fieldnames=COLUMNS).writerows(rows)


def read_rows(path: str) -> list[dict]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def write_slice(out_dir: str, record: dict) -> None:
    with open(os.path.join(out_dir, SLICE_JSON), "w") as f:
        json.dump(record, f, indent=1, default=str)


def load_slices(dirs) -> list[dict]:
    """Every folder's slice record with its rows; raises ``Refused`` on a missing file or a
    configuration other than the first folder's (naming the keys that differ)."""
    slices = []
    for d in dirs:
        paths = [os.path.join(d, name) for name in (SLICE_JSON, ROWS_CSV)]
        if not all(os.path.exists(p) for p in paths):
            raise Refused(f"{d}: not a slice (no {SLICE_JSON} or {ROWS_CSV}; run --seeds A-B)")
        with open(paths[0]) as f:
            record = json.load(f)
        if digest(record["config"]) != record["digest"]:
            raise Refused(f"{d}: its configuration does not match its digest (edited?)")
        slices.append(record | {"dir": d, "rows": read_rows(paths[1])})
    first = slices[0]
    for s in slices[1:]:
        if s["digest"] != first["digest"]:
            keys = [k for k in first["config"] if first["config"][k] != s["config"].get(k)]
            if "size" in keys:
                a, b = first["config"]["size"], s["config"]["size"]
                keys += [f"size.{k}" for k in a if a[k] != b.get(k)]
            raise Refused(
                f"{s['dir']} (config {s['digest']}) and {first['dir']} (config "
                f"{first['digest']}) ran different configurations: {', '.join(keys)} differ"
            )
        for key, value in s["provenance"].items():
            if value != first["provenance"].get(key):
                print(
                    f"WARNING: {key} differs: {value} in {s['dir']}, "
                    f"{first['provenance'].get(key)} in {first['dir']}",
                    file=sys.stderr,
                )
    return slices


def merge_rows(slices) -> list[dict]:
    """The slices' rows, each run (seed, setup, run) from the first slice that has it: a slice
    writes a run's rows when the run finishes, so a run in several slices (a seed a time
    budget cut short and then ran again, a slice of the pending comparisons) counts once."""
    source, seen_in = {}, {}
    for i, s in enumerate(slices):
        for r in s["rows"]:
            key = (int(r["seed"]), r["setup"], r["run"])
            source.setdefault(key, i)
            seen_in.setdefault(key[0], {}).setdefault(i, set()).add(key)
    for seed, by_slice in sorted(seen_in.items()):
        if len(by_slice) > 1:
            dirs = ", ".join(slices[i]["dir"] for i in by_slice)
            print(f"seed {seed} is in {dirs}: each run from the first of them that has it")
    return [
        r
        for i, s in enumerate(slices)
        for r in s["rows"]
        if source[(int(r["seed"]), r["setup"], r["run"])] == i
    ]


def check_config(slices, cfg: dict) -> None:
    """Raises ``Refused`` where the slices ran another configuration than ``cfg``."""
    if slices[0]["digest"] != digest(cfg):
        raise Refused(
            f"{slices[0]['dir']} ran configuration {slices[0]['digest']}, this run is "
            f"{digest(cfg)}: pass the setups, arms and seed rule those slices ran"
        )


def pending_of(dirs, cfg: dict) -> list[dict]:
    """``pending`` of the merge of the slices in ``dirs``. Raises ``Refused`` where they ran
    another configuration than ``cfg``."""
    slices = load_slices(dirs)
    check_config(slices, cfg)
    return pending(fs.comparisons(merge_rows(slices), cfg["setups"], list(cfg["arms"])), cfg)


def pending_work(dirs, cfg: dict, seeds) -> dict:
    """{seed: {setup: [runs]}}: of ``seeds``, the runs of the comparisons that the merge of the
    slices in ``dirs`` says still need seeds (each arm with its control), for the seeds each
    lacks. Raises ``Refused`` where the slices ran another configuration than ``cfg``."""
    work = {}
    for todo in pending_of(dirs, cfg):
        for seed in seeds:
            if seed not in todo["seeds"]:
                runs = work.setdefault(seed, {}).setdefault(todo["setup"], [])
                runs.extend(r for r in runs_of([todo["arm"]]) if r not in runs)
    return work


def pending(comps, cfg: dict) -> list[dict]:
    """The comparisons that need more seeds: fewer than the first round's ``min``, or
    inconclusive with fewer than the stated maximum."""
    have = {(c["setup"], c["arm"]): c for c in comps}
    out = []
    for setup in cfg["setups"]:
        for arm in cfg["arms"]:
            c = have.get((setup, arm))
            seeds = c["seeds"] if c else []
            verdict = c[fs.PRIMARY]["verdict"] if c else "not run"
            few = len(seeds) < cfg["seeds"]["min"]
            if few or (verdict == "inconclusive" and len(seeds) < cfg["seeds"]["max"]):
                out.append({"setup": setup, "arm": arm, "seeds": seeds, "verdict": verdict})
    return out


def next_seeds(todo, cfg: dict) -> list[int]:
    """The next ``batch`` seeds, lowest first, that some pending comparison lacks."""
    need = [s for s in range(cfg["seeds"]["max"]) if any(s not in t["seeds"] for t in todo)]
    return need[: cfg["seeds"]["batch"]]


def report_progress(comps, cfg: dict) -> dict:
    """Prints which comparisons still need seeds and the next slice to run (``next: --seeds
    6-7``), or that every one is decided or at the maximum."""
    todo = pending(comps, cfg)
    nxt = next_seeds(todo, cfg)
    stuck = [
        f"{c['setup']} {c['arm']}"
        for c in comps
        if c[fs.PRIMARY]["verdict"] == "inconclusive" and len(c["seeds"]) >= cfg["seeds"]["max"]
    ]
    print(
        f"\nsequential seeds: at least {cfg['seeds']['min']}, then +{cfg['seeds']['batch']} "
        f"while inconclusive, at most {cfg['seeds']['max']}"
    )
    for t in todo:
        print(f"  needs seeds: {t['setup']} {t['arm']}: {t['verdict']} at {len(t['seeds'])}")
    if stuck:
        print(f"  inconclusive at the maximum of {cfg['seeds']['max']} seeds: {', '.join(stuck)}")
    if nxt:
        print(f"next: --seeds {format_seeds(nxt)}")
    else:
        print("decided: no more seeds to run (every comparison decided or at the maximum)")
    return {"pending": todo, "inconclusive_at_max": stuck, "next_seeds": nxt}


def write_summary(out_dir: str, rows, cfg: dict, info: dict) -> dict:
    """The table, ``fidelity.json`` and ``fidelity.md`` of ``rows`` (every seed in them)."""
    comps = fs.comparisons(rows, cfg["setups"], list(cfg["arms"]))
    fs.print_table(comps)
    progress = report_progress(comps, cfg)
    summary = info | {
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "config_digest": digest(cfg),
        "config": cfg,
        "seeds": sorted({int(r["seed"]) for r in rows}),
        "primary": fs.PRIMARY_TEXT,
        "arms": {a: {"keywords": kw, "control_shuffles": src} for a, (kw, src) in ARMS.items()},
        "comparisons": comps,
        "targets": fs.targets(comps, cfg["seeds"]["max"]),
        "progress": progress,
    }
    with open(os.path.join(out_dir, "fidelity.json"), "w") as f:
        json.dump(summary, f, indent=1, default=str)
    header = (
        f"benchmarks/fidelity.py: {summary['machine']}; torch {summary['torch']}; "
        f"{summary['date']}; {'; '.join(f'`{c}`' for c in summary['commands'])}; "
        f"{summary['wall_s']:.0f} s."
    )
    with open(os.path.join(out_dir, "fidelity.md"), "w") as f:
        f.write(fs.markdown(comps, header, cfg["seeds"]["max"]))
    return summary


def summarize_only(dirs, out_dir: str | None) -> int:
    """Merges the slices in ``dirs`` and writes their summary under ``out_dir`` (default
    ``benchmarks/results/<gpu>/``); 2 if they must not be merged."""
    try:
        slices = load_slices(dirs)
    except Refused as e:
        print(f"REFUSED: {e}", file=sys.stderr)
        return 2
    rows = merge_rows(slices)
    if not rows:
        print(f"no rows under {', '.join(dirs)}", file=sys.stderr)
        return 1
    first = slices[0]
    machines = sorted({s["machine"] for s in slices})
    out_dir = out_dir or os.path.join(HERE, "results", first["machine_key"])
    os.makedirs(out_dir, exist_ok=True)
    start_rows(os.path.join(out_dir, ROWS_CSV))
    add_rows(os.path.join(out_dir, ROWS_CSV), rows)
    wiring = {"plans": min(slices, key=lambda s: s["seeds"][0])["wiring"]["plans"]}
    for key in ("data", "lr_same_across_runs"):
        wiring[key] = {k: v for s in slices for k, v in s["wiring"][key].items()}
    info = {
        "machine": ", ".join(machines),
        "device": first["config"]["device"],
        **first["provenance"],
        "commands": [s["command"] for s in slices],
        "slices": [
            {k: s[k] for k in ("dir", "seeds", "machine", "time_budget_cut")} for s in slices
        ],
        "time_budget_cut": any(s["time_budget_cut"] for s in slices),
        "wall_s": round(sum(s["wall_s"] for s in slices), 1),
        "wiring": wiring,
    }
    summary = write_summary(out_dir, rows, first["config"], info)
    nxt = summary["progress"]["next_seeds"]
    if nxt:
        listed = " ".join(dirs)
        print(
            f"  the pending comparisons alone: --seeds {format_seeds(nxt)} --pending {listed}"
            f"\n  every round left, in one call: --continue {listed}"
        )
    print(f"merged {len(slices)} slices into {out_dir}/fidelity.csv, .json, .md")
    return 0
