"""How representative each optimizer step of a plan is of the data it trains on.

A balancing planner may reorder an epoch so that a step holds micro-batches of one or two
shapes: the epoch still holds every sample once, but each optimizer update then sees another
mix of the data than a shuffled loader gives it. ``step_composition`` measures that against
a uniform shuffle of the same micro-batches cut into the same steps, so that packing is held
fixed and only the order is judged.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from adaptiveload.keys import as_group_ids

# A group that holds more than this share of the epoch's samples or tokens is one a step
# should not miss (images in a joint image-video mix).
MIN_SHARE = 0.05


@dataclass
class Composition:
    """Per optimizer step t (the ``W x K`` micro-batches of all ranks) and group g (a label
    per sample: the sampler's group keys, a shape, or image vs video):

    - ``tv_tokens``: mean over steps of the total-variation distance
      ``1/2 * sum_g |share_t(g) - share(g)|`` between the step's share of tokens in each group
      and the epoch's: 0 when every step holds the epoch's mix, 1 when steps share no group
      with it;
    - ``tv_samples``: the same with sample counts;
    - ``shuffle_tv_tokens``, ``shuffle_tv_samples``: the same for uniform shuffles of the same
      micro-batches (the mean over ``shuffles`` draws): what a shuffled loader gives;
    - ``tokens_ratio``, ``samples_ratio``: the plan's over the shuffle's. 1.0 is as
      representative as a shuffle; below 1 more (steps drawn in proportion); 2.0 twice as far
      from the epoch's mix as a shuffle;
    - ``missing``: share of steps that hold no sample of some group holding more than
      ``min_share`` of the epoch's samples or tokens (``shuffle_missing``: a shuffle's);
    - ``groups_per_step``: median number of groups a step holds (``shuffle_groups_per_step``).
    """

    num_steps: int
    num_groups: int
    tv_tokens: float
    tv_samples: float
    shuffle_tv_tokens: float
    shuffle_tv_samples: float
    missing: float
    shuffle_missing: float
    groups_per_step: float
    shuffle_groups_per_step: float
    min_share: float

    @property
    def tokens_ratio(self) -> float:
        return self.tv_tokens / self.shuffle_tv_tokens if self.shuffle_tv_tokens else 1.0

    @property
    def samples_ratio(self) -> float:
        return self.tv_samples / self.shuffle_tv_samples if self.shuffle_tv_samples else 1.0

    def to_dict(self) -> dict:
        return asdict(self) | {
            "tokens_ratio": self.tokens_ratio,
            "samples_ratio": self.samples_ratio,
        }

    def __str__(self) -> str:
        return (
            f"composition vs shuffle: {self.tokens_ratio:.2f}x (tokens) "
            f"{self.samples_ratio:.2f}x (samples), steps missing a group over "
            f"{self.min_share:.0%}: {self.missing:.0%} (shuffle {self.shuffle_missing:.0%}), "
            f"groups per step {self.groups_per_step:g} (shuffle {self.shuffle_groups_per_step:g})"
        )


def _dense(labels, seq_lens: np.ndarray) -> tuple[np.ndarray, int]:
    """Dense ids of ``labels``, numbered as the samplers number their group keys (so that
    ``1`` and ``'1'``, or ``None`` and a string, are two groups, as they are to a sampler)."""
    try:
        count = len(labels)
    except TypeError:
        raise ValueError(
            f"labels must be a sequence, array or tensor, got {type(labels).__name__}"
        ) from None
    if count != len(seq_lens):
        raise ValueError(f"labels has {count} entries, seq_lens {len(seq_lens)}")
    ids = as_group_ids(labels, seq_lens, name="labels")
    return ids, int(ids.max()) + 1 if ids.size else 0


def step_composition(
    plan,
    labels,
    seq_lens,
    *,
    min_share: float = MIN_SHARE,
    shuffles: int = 8,
    seed: int = 0,
) -> Composition:
    """Composition of ``plan``'s steps (see ``Composition``), against ``shuffles`` uniform
    shuffles of its micro-batches drawn from ``seed`` (deterministic).

    Args:
        plan: a ``Plan`` (``sampler.plan()``).
        labels: one group label per dataset index (any hashable keys, as the sampler's
            ``group_keys``, or an ``(n, k)`` array of keys), e.g. the sampler's ``group_keys``
            or ``num_frames > 1`` for image vs video.
        seq_lens: tokens per dataset index.
    """
    seq_lens = np.asarray(seq_lens, dtype=np.int64)
    ids, num_groups = _dense(labels, seq_lens)
    steps = plan.num_steps
    if steps == 0 or num_groups == 0:
        return Composition(0, num_groups, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, min_share)
    # Each micro-batch once (a split one by its first member's listing), with its step.
    mb_ids, step_of = plan.step_micro_batches()
    m = len(mb_ids)
    sizes = plan.offsets[mb_ids + 1] - plan.offsets[mb_ids]
    entries = _entries(plan, mb_ids)
    mb_of = np.repeat(np.arange(m, dtype=np.int64), sizes)
    group = ids[entries]
    tokens = seq_lens[entries].astype(np.float64)
    epoch_tokens = np.bincount(group, weights=tokens, minlength=num_groups)
    epoch_samples = np.bincount(group, minlength=num_groups).astype(np.float64)
    share_tokens = epoch_tokens / epoch_tokens.sum()
    share_samples = epoch_samples / epoch_samples.sum()
    major = (share_tokens > min_share) | (share_samples > min_share)

    def measure(step_of_mb: np.ndarray) -> tuple[float, float, float, float]:
        # Sparse in (step, group): only the cells a step holds, so that thousands of groups
        # (sequence lengths as labels) cost O(samples), not O(steps * groups). A group a step
        # lacks adds its epoch share to the step's distance: TV_t = 1/2 * (sum over held g of
        # |share_t(g) - share(g)| + 1 - sum over held g of share(g)).
        cells, cell = np.unique(step_of_mb[mb_of] * num_groups + group, return_inverse=True)
        cell_step, cell_group = cells // num_groups, cells % num_groups
        tok = np.bincount(cell, weights=tokens)
        cnt = np.bincount(cell).astype(np.float64)

        def tv(values: np.ndarray, share: np.ndarray) -> np.ndarray:
            total = np.bincount(cell_step, weights=values, minlength=steps)
            own = values / total[cell_step]
            off = np.bincount(cell_step, weights=np.abs(own - share[cell_group]), minlength=steps)
            held = np.bincount(cell_step, weights=share[cell_group], minlength=steps)
            return 0.5 * (off + 1.0 - held)

        held_major = np.bincount(cell_step, weights=major[cell_group], minlength=steps)
        return (
            float(tv(tok, share_tokens).mean()),
            float(tv(cnt, share_samples).mean()),
            float((held_major < major.sum()).mean()),
            float(np.median(np.bincount(cell_step, minlength=steps))),
        )

    ours = measure(step_of)
    rng = np.random.default_rng(seed)
    draws = np.array([measure(rng.permutation(step_of)) for _ in range(max(1, shuffles))])
    ref = draws.mean(axis=0)
    return Composition(
        num_steps=steps,
        num_groups=num_groups,
        tv_tokens=ours[0],
        tv_samples=ours[1],
        shuffle_tv_tokens=float(ref[0]),
        shuffle_tv_samples=float(ref[1]),
        missing=ours[2],
        shuffle_missing=float(ref[2]),
        groups_per_step=ours[3],
        shuffle_groups_per_step=float(np.median(draws[:, 3])),
        min_share=min_share,
    )


def steps_without(plan, mask: np.ndarray) -> float:
    """Share of ``plan``'s steps that hold no sample whose ``mask`` (one bool per dataset
    index, e.g. ``num_frames == 1``) is set."""
    if plan.num_steps == 0:
        return 0.0
    held = np.zeros(plan.num_steps, dtype=bool)
    held[step_of_entries(plan, plan.num_steps)[mask[step_entries(plan, plan.num_steps)]]] = True
    return float(1.0 - held.mean())


def _entries(plan, ids: np.ndarray) -> np.ndarray:
    """The samples of micro-batches ``ids``, in order."""
    if len(ids) == 0:
        return plan.samples[:0]
    starts, ends = plan.offsets[ids], plan.offsets[ids + 1]
    sizes = ends - starts
    within = np.arange(sizes.sum(), dtype=np.int64) - np.repeat(np.cumsum(sizes) - sizes, sizes)
    return plan.samples[np.repeat(starts, sizes) + within]


def step_entries(plan, steps: int) -> np.ndarray:
    """The samples of the first ``steps`` steps, in plan order (a split micro-batch's once)."""
    return _entries(plan, plan.step_micro_batches(steps)[0])


def step_of_entries(plan, steps: int) -> np.ndarray:
    """The step of each sample of ``step_entries(plan, steps)``."""
    ids, step = plan.step_micro_batches(steps)
    return np.repeat(step, plan.offsets[ids + 1] - plan.offsets[ids])
