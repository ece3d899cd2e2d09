"""`adaptiveload plan`'s options and report lines: --uneven-counts, the halved micro-batches,
the figure's labels, and the model's own cost model and attention heads (--model)."""

import json

import numpy as np

from adaptiveload import AdaptiveBatchSampler
from adaptiveload.cli import main
from adaptiveload.cost import CostModel
from adaptiveload.demo import demo_metadata
from adaptiveload.report import balance_report


def plan_json(tmp_path, *extra):
    rep = tmp_path / "plan.json"
    args = ["plan", "--demo", "--demo-samples", "3000", "--figure", "none", "--json", str(rep)]
    assert main([*args, *extra]) == 0
    return json.loads(rep.read_text())["reports"]


def test_plan_with_uneven_counts_plans_adaptiveload_alone_so(tmp_path, capsys):
    """``plan --uneven-counts``: AdaptiveLoad's plan is that of ``uneven_counts=True`` (never
    slower than even counts, some steps uneven), the compared samplers' plans unchanged."""
    k4 = ("--micro-batches-per-step", "4")
    even = plan_json(tmp_path, *k4)
    assert "uneven counts" not in capsys.readouterr().out
    uneven = plan_json(tmp_path, *k4, "--uneven-counts")
    out = capsys.readouterr().out
    for name in ("equal-token buckets", "paper rule (S^1.5, no balancing)"):
        assert uneven[name] == even[name]
    meta = demo_metadata(3000, "joint-pretrain", seed=0)
    sampler = AdaptiveBatchSampler(
        meta.seq_lens,
        int(2 * meta.seq_lens.max()),
        cost_model=CostModel.wan21_h200("14B"),
        group_keys=meta.group_keys(),
        num_replicas=8,
        rank=0,
        micro_batches_per_step=4,
        uneven_counts=True,
    )
    plan = sampler.plan()
    assert uneven["AdaptiveLoad"]["epoch_time"] == balance_report(plan).epoch_time
    assert uneven["AdaptiveLoad"]["epoch_time"] <= even["AdaptiveLoad"]["epoch_time"]
    counts = np.diff(plan.rank_offsets).reshape(plan.num_steps, 8)
    n = int(np.sum((counts != 4).any(axis=1)))
    assert n > 0, "the test needs steps of uneven counts"
    line = next(x for x in out.splitlines() if x.startswith("uneven counts: "))
    assert f"in {n} of {plan.num_steps} steps the ranks take other than 4" in line


def test_the_report_says_what_halved_micro_batches_are(tmp_path, capsys):
    halved = plan_json(tmp_path)["AdaptiveLoad"]["num_split_micro_batches"]
    out = capsys.readouterr().out
    assert halved > 0, "the test needs a plan with halved micro-batches"
    assert f"{halved} micro-batches halved" in out
    line = next(x for x in out.splitlines() if x.startswith("Halved micro-batches"))
    assert "at the epoch's end" in line and "each half a micro-batch of its own" in line
    assert "no sample is lost or repeated" in line and "8 ranks x 1" in line
    # A plan that halves none has no such line (K = 1 and W = 1: every count is whole).
    assert (
        plan_json(tmp_path, "--num-replicas", "1")["AdaptiveLoad"]["num_split_micro_batches"] == 0
    )
    assert "Halved micro-batches" not in capsys.readouterr().out
