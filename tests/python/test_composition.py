"""adaptiveload.composition.step_composition on plans built by hand, the planner's mixing of
an image + video epoch (mix_tolerance), and the composition in balance reports."""

import numpy as np
import pytest

from adaptiveload import AdaptiveBatchSampler, balance_report, wan_seq_len
from adaptiveload.composition import step_composition, steps_without
from adaptiveload.sampler import Plan

# Two groups of 4 samples: A (indices 0-3, 1 token each), B (indices 4-7, 3 tokens each). The
# epoch's shares: samples A 1/2, B 1/2; tokens A 4/16 = 1/4, B 12/16 = 3/4.
LENS = np.array([1, 1, 1, 1, 3, 3, 3, 3])
GROUPS = np.array([0, 0, 0, 0, 1, 1, 1, 1])


def hand_plan(micro_batches, num_replicas=2, micro_batches_per_step=1):
    """A Plan whose micro-batch m holds ``micro_batches[m]`` (dataset indices)."""
    sizes = [len(mb) for mb in micro_batches]
    m = len(micro_batches)
    return Plan(
        num_replicas=num_replicas,
        micro_batches_per_step=micro_batches_per_step,
        num_steps=m // (num_replicas * micro_batches_per_step),
        samples=np.concatenate([np.asarray(mb, dtype=np.int64) for mb in micro_batches]),
        offsets=np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64),
        costs=np.ones(m),
        tokens=np.ones(m, dtype=np.int64),
        padding=np.zeros(m, dtype=bool),
        max_tokens=100,
        max_cost=None,
    )


# W=2, K=1, 4 steps of 2 micro-batches of one sample each.
SEGREGATED = hand_plan([[0], [1], [2], [3], [4], [5], [6], [7]])  # steps AA AA BB BB
ALTERNATING = hand_plan([[0], [4], [1], [5], [2], [6], [3], [7]])  # steps AB AB AB AB


def test_segregated_steps_by_hand():
    c = step_composition(SEGREGATED, GROUPS, LENS)
    # An all-A step: samples 1/2 (|1 - 1/2| + |0 - 1/2|) = 1/2, tokens 1/2 (3/4 + 3/4) = 3/4;
    # an all-B step: samples 1/2, tokens 1/2 (1/4 + 1/4) = 1/4.
    assert c.tv_samples == pytest.approx(0.5)
    assert c.tv_tokens == pytest.approx((0.75 + 0.75 + 0.25 + 0.25) / 4)
    assert c.missing == 1.0  # every step lacks one of the two groups (both over 5%)
    assert c.groups_per_step == 1
    assert (c.num_steps, c.num_groups) == (4, 2)
    assert c.tokens_ratio == pytest.approx(c.tv_tokens / c.shuffle_tv_tokens)
    assert steps_without(SEGREGATED, GROUPS == 0) == 0.5


def test_alternating_steps_hold_the_epochs_mix():
    c = step_composition(ALTERNATING, GROUPS, LENS)
    assert c.tv_samples == pytest.approx(0.0, abs=1e-15)
    assert c.tv_tokens == pytest.approx(0.0, abs=1e-15)
    assert c.missing == 0.0 and c.groups_per_step == 2
    assert c.tokens_ratio == pytest.approx(0.0, abs=1e-14)
    assert steps_without(ALTERNATING, GROUPS == 0) == 0.0


def test_shuffle_reference_is_deterministic_and_unbiased():
    a = step_composition(SEGREGATED, GROUPS, LENS, seed=3)
    assert a == step_composition(SEGREGATED, GROUPS, LENS, seed=3)
    # The shuffle depends on the micro-batches, not on their order in the plan.
    b = step_composition(ALTERNATING, GROUPS, LENS, seed=3)
    assert (a.shuffle_tv_tokens, a.shuffle_missing) == (b.shuffle_tv_tokens, b.shuffle_missing)
    # A shuffled step pairs two of the 8 micro-batches: AA with probability 6/28 (distance
    # 3/4 in tokens, 1/2 in samples), BB 6/28 (1/4, 1/2), AB 16/28 (0, 0).
    many = step_composition(SEGREGATED, GROUPS, LENS, shuffles=4000, seed=0)
    assert many.shuffle_tv_tokens == pytest.approx(6 / 28 * 0.75 + 6 / 28 * 0.25, abs=0.01)
    assert many.shuffle_tv_samples == pytest.approx(12 / 28 * 0.5, abs=0.01)
    assert many.shuffle_missing == pytest.approx(12 / 28, abs=0.02)


def test_labels_as_strings_and_as_key_rows_group_alike():
    want = step_composition(SEGREGATED, GROUPS, LENS)
    names = np.array(["image"] * 4 + ["video"] * 4)
    assert step_composition(SEGREGATED, names, LENS) == want
    assert step_composition(SEGREGATED, list(names), LENS) == want
    shapes = np.array([(1, 480, 832)] * 4 + [(81, 480, 832)] * 4)
    assert step_composition(SEGREGATED, shapes, LENS) == want
    # Rows are keys: (1, 2) and (2, 1) are two groups, not the values 1 and 2.
    swapped = np.array([(1, 2)] * 4 + [(2, 1)] * 4)
    assert step_composition(SEGREGATED, swapped, LENS) == want


@pytest.mark.parametrize(
    "labels",
    [
        ["image"] * 4 + [None] * 4,  # None is a label like any other, not an error
        [None] * 4 + [(1, 2)] * 4,
        [1] * 4 + ["1"] * 4,  # two labels, as the sampler's group keys are two groups
        (81,) * 4 + ("81",) * 4,
    ],
)
def test_labels_of_any_type_are_groups_as_the_samplers_keys_are(labels):
    want = step_composition(SEGREGATED, GROUPS, LENS)
    assert step_composition(SEGREGATED, labels, LENS) == want
    assert balance_report(SEGREGATED, labels, LENS).composition == want


def test_lengths_must_match():
    with pytest.raises(ValueError, match="labels has 7 entries, seq_lens 8"):
        step_composition(SEGREGATED, GROUPS[:7], LENS)


def test_a_minor_group_missing_from_steps_is_not_counted():
    # A and B: 12 samples of 4 tokens each; C: 1 sample of 1 token (4% of samples, 1% of
    # tokens). Steps alternate A and B; only step 0 holds C.
    lens = np.array([4] * 24 + [1])
    groups = np.array([0] * 12 + [1] * 12 + [2])
    a = [list(range(i, i + 3)) for i in range(0, 12, 3)]
    b = [list(range(i, i + 3)) for i in range(12, 24, 3)]
    plan = hand_plan([a[0] + [24], b[0], a[1], b[1], a[2], b[2], a[3], b[3]])
    c = step_composition(plan, groups, lens)
    assert c.missing == 0.0 and c.num_groups == 3
    assert c.groups_per_step == 2  # median of 3, 2, 2, 2
    assert step_composition(plan, groups, lens, min_share=0.01).missing == 0.75


# -- the planner: segregated with mix_tolerance=0, mixed by default ---------------------------


def image_video_epoch(n=8000, seed=0):
    """Half 544x960 images, half 480p clips of 9, 25, 41 and 57 frames."""
    table = np.array([(1, 544, 960), (9, 480, 832), (25, 480, 832), (41, 480, 832), (57, 480, 832)])
    pick = np.random.default_rng(seed).choice(5, size=n, p=[0.5, 0.125, 0.125, 0.125, 0.125])
    shapes = table[pick]
    return shapes, wan_seq_len(shapes[:, 0], shapes[:, 1], shapes[:, 2])


def plan_of(shapes, lens, **kw):
    sampler = AdaptiveBatchSampler(
        lens, 151200, group_keys=shapes, num_replicas=8, rank=0, micro_batches_per_step=4, **kw
    )
    return sampler.plan()


def test_mix_tolerance_zero_segregates_image_and_video_steps():
    shapes, lens = image_video_epoch()
    plan = plan_of(shapes, lens, mix_tolerance=0.0)
    c = step_composition(plan, shapes, lens)
    assert c.tokens_ratio > 1.5
    assert steps_without(plan, shapes[:, 0] == 1) > 0.5  # most steps hold no image


def test_default_steps_are_as_representative_as_a_shuffle_and_balanced():
    shapes, lens = image_video_epoch()
    plan = plan_of(shapes, lens)
    report = balance_report(plan, shapes, lens)
    c = report.composition
    assert c == step_composition(plan, shapes, lens)
    assert c.tokens_ratio <= 1.10
    assert c.missing <= c.shuffle_missing + 0.03
    assert report.imbalance <= 0.02
    assert plan.window_strata is not None and (plan.window_strata == 1).all()


# -- the composition in balance reports -------------------------------------------------------


def test_balance_report_holds_the_composition_when_given_labels():
    plain = balance_report(SEGREGATED)
    full = balance_report(SEGREGATED, GROUPS, LENS)
    assert plain.composition is None and plain.to_dict()["composition"] is None
    assert full.composition == step_composition(SEGREGATED, GROUPS, LENS)
    assert full.to_dict()["composition"] == full.composition.to_dict()
    assert full.to_dict()["composition"]["tokens_ratio"] == full.composition.tokens_ratio
    assert str(full) == f"{plain}; {full.composition}"
    # Everything but the composition is the report without labels.
    assert full.to_dict() == plain.to_dict() | {"composition": full.composition.to_dict()}
    with pytest.raises(ValueError, match="labels and seq_lens go together"):
        balance_report(SEGREGATED, GROUPS)
    with pytest.raises(ValueError, match="labels and seq_lens go together"):
        balance_report(SEGREGATED, seq_lens=LENS)
