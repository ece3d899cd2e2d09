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


def many_groups(n=4000, seed=2):
    """40% images of one shape, the rest videos of 14 shapes, all with more tokens."""
    from adaptiveload.metadata import Metadata

    rng = np.random.default_rng(seed)
    videos = [(f, h, 832) for f in (17, 33, 49, 65, 81, 97, 113) for h in (480, 720)]
    shapes = [(1, 480, 832)] * int(0.4 * n) + [videos[i] for i in rng.integers(0, 14, n)]
    shapes = np.array(shapes[:n], dtype=np.int64)
    lens = (shapes[:, 0] // 4 + 1) * (shapes[:, 1] // 16) * (shapes[:, 2] // 16)
    return Metadata(seq_lens=lens, shapes=shapes)


def test_figure_names_the_largest_groups_by_samples_or_tokens():
    from adaptiveload.figure import _DRAWN_GROUPS, figure_groups

    meta = many_groups()
    keys = meta.group_keys()
    ids, names = figure_groups(meta, keys)
    assert len(names) == _DRAWN_GROUPS + 1 and names[-1].startswith("other (6 groups): ")
    # The images: 40% of the samples, the fewest tokens per sample, named first.
    image_tokens = meta.seq_lens[:1600].sum() / meta.seq_lens.sum()
    assert names[0] == f"1x480x832: 40% of samples, {image_tokens:.0%} of tokens"
    assert image_tokens < 0.05
    assert set(ids[:1600].tolist()) == {0}
    # Every named group holds a larger share (of samples or tokens) than any in "other".
    _, inverse, counts = np.unique(keys, return_inverse=True, return_counts=True)
    tokens = np.bincount(inverse, weights=meta.seq_lens) / meta.seq_lens.sum()
    size = np.maximum(counts / counts.sum(), tokens)[inverse]
    assert size[ids < _DRAWN_GROUPS].min() >= size[ids == _DRAWN_GROUPS].max()
    for g, name in enumerate(names[:-1]):
        shape = "x".join(map(str, meta.shapes[np.flatnonzero(ids == g)[0]]))
        assert name.startswith(shape + ": ") and np.all(keys[ids == g] == keys[ids == g][0])


def figure_texts(fig):
    axes = fig.get_axes()
    return (
        [ax.get_title() for ax in axes],
        [ax.get_ylabel() for ax in axes],
        [t.get_text() for legend in fig.legends for t in legend.get_texts()],
    )


def test_figure_gives_the_cost_models_unit_and_names_the_groups():
    import matplotlib.pyplot as plt

    from adaptiveload.compare import compare_samplers
    from adaptiveload.figure import figure_groups, plan_figure

    meta = many_groups(1500)
    groups = figure_groups(meta, meta.group_keys())
    for cost, unit, label, epoch in (
        (CostModel.wan21_h200("14B"), "ms", "predicted ms", " ms ("),
        (CostModel.power(2.0), "token^2", "predicted cost, token^2", " token^2"),
    ):
        assert cost.unit == unit
        compared = compare_samplers(
            meta.seq_lens,
            2 * int(meta.seq_lens.max()),
            cost_model=cost,
            group_keys=meta.group_keys(),
            num_replicas=4,
        )
        reports = {name: (c.plan, c.report) for name, c in compared.items()}
        fig = plan_figure(reports, 20, groups, meta.seq_lens, ("AdaptiveLoad",), unit)
        titles, ylabels, legend = figure_texts(fig)
        plt.close(fig)
        for name, (_, rep) in reports.items():
            title = next(t for t in titles if t.startswith(f"{name}: imbalance"))
            assert f"predicted epoch time {rep.epoch_time:.4g}{epoch}" in title
        assert ylabels[:3] == [f"rank load\n({label})"] * 3 and ylabels[3] == "token share"
        assert legend == groups[1]


def cost_line(out):
    return next(x for x in out.splitlines() if x.startswith("cost model: "))


def test_plan_model_uses_the_configs_own_cost_model(tmp_path, capsys):
    """``--model wan/wan2.1-1.3B`` plans with the built-in 1.3B profile, as ``--cost-model
    wan21-1.3b`` does; without ``--model`` (or with a config that has no built-in profile)
    the 14B profile stays the default, and the report says which model it used and why."""
    small = plan_json(tmp_path, "--model", "wan/wan2.1-1.3B")
    line = cost_line(capsys.readouterr().out)
    assert line.startswith("cost model: wan21-1.3b, ") and "--model wan/wan2.1-1.3B" in line
    assert small == plan_json(tmp_path, "--cost-model", "wan21-1.3b")
    assert cost_line(capsys.readouterr().out).startswith("cost model: wan21-1.3b (--cost-model)")
    assert plan_json(tmp_path, "--model", "wan")["AdaptiveLoad"] == small["AdaptiveLoad"]
    capsys.readouterr()
    big = plan_json(tmp_path, "--model", "wan/wan2.1-14B")
    assert cost_line(capsys.readouterr().out).startswith("cost model: wan21-14b, ")
    assert big == plan_json(tmp_path)  # the default without --model
    assert cost_line(capsys.readouterr().out).startswith("cost model: wan21-14b, the default")
    assert small["AdaptiveLoad"]["epoch_time"] < big["AdaptiveLoad"]["epoch_time"]
    mochi = plan_json(tmp_path, "--model", "mochi")  # tokens counted as Mochi does
    line = cost_line(capsys.readouterr().out)
    assert mochi == plan_json(tmp_path, "--model", "mochi", "--cost-model", "wan21-14b")
    assert "no built-in profile of mochi/mochi-10B" in line
    assert "adaptiveload calibrate --model mochi/mochi-10B" in line
    # An explicit --cost-model wins over the config's own.
    assert plan_json(tmp_path, "--model", "wan/wan2.1-1.3B", "--cost-model", "wan21-14b") == big


def test_plan_model_says_how_a_degree_runs_over_its_heads(tmp_path, capsys):
    """Any degree runs (Ulysses over the heads' share of it, a ring over the rest): the report
    says which layout, for the model's own head count."""
    demo = ["plan", "--demo", "--demo-samples", "300", "--figure", "none", "--num-replicas", "16"]
    for model, heads, degree, how in (
        ("wan/wan2.1-1.3B", 12, 4, "Ulysses alone"),
        (
            "wan/wan2.1-1.3B",
            12,
            8,
            "Ulysses 4 x ring 2 (keys and values whole per ring: each member receives 1.43x",
        ),
        ("wan/wan2.1-14B", 40, 16, "Ulysses 8 x ring 2"),
        ("hunyuanvideo", 24, 8, "Ulysses alone"),
    ):
        assert main([*demo, "--model", model, "--sequence-parallel", str(degree)]) == 0
        line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("sequence par"))
        assert f"over {degree} ranks" in line and f"({heads} attention heads)" in line
        assert how in line and model.split("/")[-1] in line
        assert ("keeps 0.125 of the samples' keys and values" in line) == (how[-5:] == "1.43x")
    assert main([*demo, "--model", "wan/wan2.1-1.3B", "--sequence-parallel", "4"]) == 0
