"""Resuming the sampler: a state of the same plan replays it exactly, of other settings or
another number of ranks re-plans the samples not yet consumed, of another dataset is refused;
every field of a state is checked (sampler/resume.py)."""

import collections

import numpy as np
import pytest
from torch.utils.data import DataLoader

from adaptiveload import AdaptiveBatchSampler, CostModel, EqualTokenBatchSampler
from plans import IndexDataset, check_plan, random_mix

# -- resumption -------------------------------------------------------------------------------


def consume(sampler, steps):
    k = sampler.micro_batches_per_step
    it = iter(sampler)
    return [next(it) for _ in range(steps * k)]


@pytest.mark.parametrize("new_world", [4, 3, 1, 7])
def test_resume_mid_epoch_with_changed_world_size(new_world):
    lens = random_mix(2500, seed=6)
    old = [
        AdaptiveBatchSampler(lens, 151200, num_replicas=4, rank=r, micro_batches_per_step=2, seed=9)
        for r in range(4)
    ]
    for s in old:
        s.set_epoch(3)
    done = [i for s in old for b in consume(s, 7) for i in b]
    state = old[0].state_dict(steps_done=7)
    assert state == old[3].state_dict(steps_done=7)
    rest = []
    lengths = set()
    for r in range(new_world):
        s = AdaptiveBatchSampler(
            lens, 151200, num_replicas=new_world, rank=r, micro_batches_per_step=2, seed=0
        )
        s.load_state_dict(state)
        s.set_epoch(3)  # the loop's usual call keeps the resumed position
        batches = list(s)
        lengths.add(len(batches))
        rest += [i for b in batches for i in b]
        plan = s.plan()
    assert len(lengths) == 1
    padded = plan.num_padded_samples
    counts = collections.Counter(done + rest)
    assert set(counts) == set(range(len(lens)))
    assert sum(c - 1 for c in counts.values()) == padded
    assert not set(done) & set(rest) or padded


def test_resume_on_same_ranks_replays_the_plan():
    lens = random_mix(1500, seed=10)
    kw = dict(num_replicas=3, micro_batches_per_step=2, seed=4)
    for r in range(3):
        whole = AdaptiveBatchSampler(lens, 151200, rank=r, **kw)
        whole.set_epoch(2)
        expected = list(whole)
        first = AdaptiveBatchSampler(lens, 151200, rank=r, **kw)
        first.set_epoch(2)
        got = consume(first, 5)
        resumed = AdaptiveBatchSampler(lens, 151200, rank=r, drawn_is_trained=True, **kw)
        resumed.load_state_dict(first.state_dict(steps_done=5))
        resumed.set_epoch(2)
        assert resumed.start_step == 5
        assert len(resumed) == len(expected) - 10
        got += list(resumed)
        assert got == expected
        # Saving again after the resume counts steps from the plan's start.
        assert resumed.state_dict()["micro_batches_done"] == len(expected)


def test_resume_twice_and_next_epoch_is_whole():
    lens = random_mix(1200, seed=7)
    s = AdaptiveBatchSampler(lens, 151200, num_replicas=2, rank=0)
    s.set_epoch(1)
    consume(s, 5)
    st1 = s.state_dict(steps_done=5)
    s2 = AdaptiveBatchSampler(lens, 151200, num_replicas=3, rank=0)
    s2.load_state_dict(st1)
    consume(s2, 4)
    st2 = s2.state_dict(steps_done=4)
    assert st2["num_consumed"] > st1["num_consumed"]
    s3 = AdaptiveBatchSampler(lens, 151200, num_replicas=2, rank=0)
    s3.load_state_dict(st2)
    remaining = s3.plan()
    left = set(
        remaining.samples[np.repeat(remaining.padding == 0, np.diff(remaining.offsets))].tolist()
    )
    assert len(left) == len(lens) - st2["num_consumed"]
    list(s3)  # finish the resumed epoch; then the next one is whole
    s3.set_epoch(2)
    assert len(check_plan(s3)) == len(lens)


def test_state_dict_defaults_to_iterated_steps_and_rejects_mismatch():
    lens = random_mix(400, seed=8)
    s = AdaptiveBatchSampler(
        lens, 151200, num_replicas=2, rank=0, micro_batches_per_step=2, drawn_is_trained=True
    )
    consume(s, 3)
    assert s.state_dict() == s.state_dict(steps_done=3)
    with pytest.raises(ValueError, match="steps_done"):
        s.state_dict(steps_done=10**6)
    other = AdaptiveBatchSampler(lens[:100], 151200, num_replicas=2, rank=0)
    with pytest.raises(ValueError, match="another dataset"):
        other.load_state_dict(s.state_dict())


# -- resume: one plan fingerprint ---------------------------------------------------------------


def ranks_of(cls, lens, world, **kw):
    return [
        cls(lens, kw.pop("max_tokens", 151200), num_replicas=world, rank=r, **kw)
        for r in range(world)
    ]


def make(cls, lens, world, rank, **kw):
    kw = dict(kw)
    max_tokens = kw.pop("max_tokens", 151200)
    return cls(lens, max_tokens, num_replicas=world, rank=rank, **kw)


def epoch_cover(lens, first, rest_samplers, steps, epoch=1):
    """Consume `steps` steps on `first` (one sampler per rank), save, resume on
    `rest_samplers`, finish the epoch; return the Counter of samples and the padding."""
    for s in first:
        s.set_epoch(epoch)
    done = [i for s in first for b in consume(s, steps) for i in b]
    state = first[0].state_dict(steps_done=steps)
    for s in first[1:]:
        assert s.state_dict(steps_done=steps) == state, "ranks disagree on the state"
    rest = []
    for s in rest_samplers:
        s.load_state_dict(state)
        s.set_epoch(epoch)
        rest += [i for b in s for i in b]
    padded = rest_samplers[0].plan().num_padded_samples
    return collections.Counter(done + rest), padded


BASE = dict(micro_batches_per_step=2, seed=9)


@pytest.mark.parametrize(
    "cls_new,change",
    [
        (AdaptiveBatchSampler, dict(max_tokens=100_000)),
        (AdaptiveBatchSampler, dict(max_cost=45_000.0)),
        (AdaptiveBatchSampler, dict(cost_model=CostModel.power(1.5))),
        (AdaptiveBatchSampler, dict(lookahead_steps=3)),
        (AdaptiveBatchSampler, dict(balance=False)),
        (AdaptiveBatchSampler, dict(drop_last=True)),
        (AdaptiveBatchSampler, dict(seed=10)),
        (AdaptiveBatchSampler, dict(micro_batches_per_step=3)),
        (AdaptiveBatchSampler, dict(mix_tolerance=0.0)),
        (AdaptiveBatchSampler, dict(mix_tolerance=1.0)),
        (EqualTokenBatchSampler, dict()),
    ],
)
def test_resume_with_other_settings_replans_the_rest(cls_new, change):
    lens = random_mix(2300, seed=12)
    first = [make(AdaptiveBatchSampler, lens, 3, r, **BASE) for r in range(3)]
    new_kw = BASE | change
    if cls_new is EqualTokenBatchSampler:
        new_kw = {k: v for k, v in new_kw.items() if k in ("micro_batches_per_step", "seed")}
    rest = [make(cls_new, lens, 3, r, **new_kw) for r in range(3)]
    counts, padded = epoch_cover(lens, first, rest, steps=20)
    dropped = rest[0].plan().num_dropped_samples
    assert len(counts) == len(lens) - dropped, "samples lost"
    assert sum(c - 1 for c in counts.values()) == padded, "samples repeated"


def test_states_of_the_segregating_planner_replan_their_unconsumed_samples():
    # A state saved before mix_tolerance existed: its plan was today's mix_tolerance=0, its
    # fingerprint had no such key. The mixing default re-plans what it did not consume.
    lens = random_mix(2300, seed=14)
    first = [make(AdaptiveBatchSampler, lens, 3, r, mix_tolerance=0.0, **BASE) for r in range(3)]
    rest = [make(AdaptiveBatchSampler, lens, 3, r, **BASE) for r in range(3)]
    resume_without_key(lens, first, rest, "mix_tolerance")


def resume_without_key(lens, first, rest, key):
    """Train 20 steps of epoch 1 on ``first`` (one sampler per rank), save, drop ``key`` from
    the state's fingerprint (as a state saved before that key existed), resume on ``rest``:
    the rest re-plans what was not consumed, nothing lost or repeated beyond its padding."""
    for s in first:
        s.set_epoch(1)
    done = [i for s in first for b in consume(s, 20) for i in b]
    state = first[0].state_dict(steps_done=20)
    del state["fingerprint"][key]
    again = []
    for s in rest:
        s.load_state_dict(state)
        s.set_epoch(1)
        assert s.start_step == 0, "a state of another planner replayed as if the same plan"
        again += [i for b in s for i in b]
    counts = collections.Counter(done + again)
    assert len(counts) == len(lens), "samples lost"
    assert sum(c - 1 for c in counts.values()) == rest[0].plan().num_padded_samples


@pytest.mark.parametrize(
    "cls,kw", [(EqualTokenBatchSampler, {}), (AdaptiveBatchSampler, dict(balance=False))]
)
def test_states_from_before_halves_stayed_in_place_replan_their_unconsumed_samples(cls, kw):
    # Plans without balancing once appended the halves of a micro-batch split to fill whole
    # steps; they now take its place, so the order differs from the first split on. A state
    # saved before (its fingerprint had no such key) re-plans what it did not consume
    # instead of replaying a plan whose first steps are not the ones it consumed.
    lens = random_mix(2300, seed=12)
    first = [make(cls, lens, 3, r, **BASE, **kw) for r in range(3)]
    assert first[0].plan().num_split_micro_batches > 0
    assert first[0]._fingerprint()["halves_in_place"] is True
    assert "halves_in_place" not in make(AdaptiveBatchSampler, lens, 3, 0)._fingerprint()
    rest = [make(cls, lens, 3, r, **BASE, **kw) for r in range(3)]
    resume_without_key(lens, first, rest, "halves_in_place")


@pytest.mark.parametrize(
    "cls,kw",
    [
        (EqualTokenBatchSampler, {}),
        (AdaptiveBatchSampler, dict(balance=False)),
        (AdaptiveBatchSampler, {}),
        (AdaptiveBatchSampler, dict(uneven_counts=True)),
    ],
)
def test_states_from_before_halves_were_spread_replan_their_unconsumed_samples(cls, kw):
    # The earliest of the largest micro-batches were once halved (and their halves appended
    # where balanced); the halved ones are now spread over the epoch, in place. A state saved
    # before (its fingerprint had no such key) re-plans what it did not consume.
    lens = random_mix(2300, seed=12)
    first = [make(cls, lens, 3, r, **BASE, **kw) for r in range(3)]
    assert first[0].plan().num_split_micro_batches > 0
    assert first[0]._fingerprint()["halves_spread"] is True
    assert "halves_spread" not in make(cls, lens, 3, 0, drop_last=True)._fingerprint()
    rest = [make(cls, lens, 3, r, **BASE, **kw) for r in range(3)]
    resume_without_key(lens, first, rest, "halves_spread")


def test_mixed_plans_resume_exactly_on_the_same_settings():
    lens = random_mix(2300, seed=15)
    full = make(AdaptiveBatchSampler, lens, 2, 1, **BASE)
    full.set_epoch(1)
    assert full.plan().window_strata is not None
    whole = [list(b) for b in full]
    first = make(AdaptiveBatchSampler, lens, 2, 1, **BASE)
    first.set_epoch(1)
    head = consume(first, 7)
    state = first.state_dict(steps_done=7)
    again = make(AdaptiveBatchSampler, lens, 2, 1, **BASE)
    again.load_state_dict(state)
    again.set_epoch(1)
    assert again.start_step == 7
    assert [list(b) for b in head] + [list(b) for b in again] == whole


def test_resume_from_equal_token_state_into_adaptive_replans():
    lens = random_mix(1500, seed=13)
    first = [make(EqualTokenBatchSampler, lens, 2, r, **BASE) for r in range(2)]
    rest = [make(AdaptiveBatchSampler, lens, 2, r, **BASE) for r in range(2)]
    counts, padded = epoch_cover(lens, first, rest, steps=15)
    assert len(counts) == len(lens)
    assert sum(c - 1 for c in counts.values()) == padded


def test_resume_refuses_another_dataset_of_the_same_size():
    lens = random_mix(1200, seed=14)
    s = make(AdaptiveBatchSampler, lens, 2, 0, **BASE)
    consume(s, 4)
    state = s.state_dict(steps_done=4)
    other = make(AdaptiveBatchSampler, np.roll(lens, 1), 2, 0, **BASE)
    with pytest.raises(ValueError, match="another dataset"):
        other.load_state_dict(state)
    keys = np.arange(len(lens)) % 3
    other = make(AdaptiveBatchSampler, lens, 2, 0, group_keys=keys, **BASE)
    with pytest.raises(ValueError, match="another dataset"):
        other.load_state_dict(state)


def good_state():
    lens = random_mix(603, seed=15)  # not a multiple of 8: the bitmaps have padding bits
    s = make(AdaptiveBatchSampler, lens, 2, 0, **BASE)
    s.set_epoch(1)
    consume(s, 3)
    return lens, s.state_dict(steps_done=3)


def mutate(state, key, value):
    import copy

    st = copy.deepcopy(state)
    if value is KeyError:
        del st[key]
    else:
        st[key] = value(st[key]) if callable(value) else value
    return st


@pytest.mark.parametrize(
    "key,value,match",
    [
        ("micro_batches_done", -3, "micro_batches_done"),
        ("micro_batches_done", 2.7, "micro_batches_done"),
        ("micro_batches_done", 10**6, "micro_batches_done"),
        ("micro_batches_done", True, "micro_batches_done"),
        ("epoch", -1, "epoch"),
        ("epoch", "1", "epoch"),
        ("consumed", lambda b: b[:-1], "consumed"),
        ("consumed", lambda b: b + b"\x00", "consumed"),
        ("consumed", lambda b: b[:-1] + bytes([b[-1] | 1]), "consumed"),  # padding bit set
        ("consumed", lambda b: bytes(len(b)), "consumed"),  # disagrees with the plan
        ("consumed", "abc", "consumed"),
        ("excluded", lambda b: bytes([255]) * len(b), "excluded"),
        ("num_consumed", lambda n: n + 1, "num_consumed"),
        ("version", 1, "version"),
        ("fingerprint", KeyError, "fingerprint"),
        ("fingerprint", lambda f: f | {"num_replicas": 0}, "num_replicas"),
        ("fingerprint", lambda f: f | {"sampler": "Other"}, "sampler"),
        ("micro_batches_done", KeyError, "micro_batches_done"),
    ],
)
def test_load_state_dict_validates_every_field(key, value, match):
    lens, state = good_state()
    s = make(AdaptiveBatchSampler, lens, 2, 0, **BASE)
    s.load_state_dict(state)  # the unmodified state loads
    with pytest.raises(ValueError, match=match):
        make(AdaptiveBatchSampler, lens, 2, 0, **BASE).load_state_dict(mutate(state, key, value))


def test_load_state_dict_rejects_non_dicts():
    s = make(AdaptiveBatchSampler, [10, 20], 1, 0)
    with pytest.raises(ValueError, match="dict"):
        s.load_state_dict([1, 2])


def test_state_dict_steps_done_is_checked():
    lens = random_mix(600, seed=16)
    s = make(AdaptiveBatchSampler, lens, 2, 0, **BASE)
    consume(s, 3)
    for bad in (-3, 2.7, True, 10**6):
        with pytest.raises(ValueError, match="steps_done"):
            s.state_dict(steps_done=bad)
    resumed = make(AdaptiveBatchSampler, lens, 2, 0, **BASE)
    resumed.load_state_dict(s.state_dict(steps_done=3))
    with pytest.raises(ValueError, match="before the resumed position"):
        resumed.state_dict(steps_done=2)


def test_resumed_sampler_second_pass_is_the_whole_epoch():
    lens = random_mix(800, seed=17)
    whole = make(AdaptiveBatchSampler, lens, 2, 0, **BASE)
    whole.set_epoch(1)
    expected = list(whole)
    s = make(AdaptiveBatchSampler, lens, 2, 0, **BASE)
    s.set_epoch(1)
    consume(s, 4)
    resumed = make(AdaptiveBatchSampler, lens, 2, 0, **BASE)
    resumed.load_state_dict(s.state_dict(steps_done=4))
    assert list(resumed) == expected[8:]
    with pytest.warns(UserWarning, match="again without set_epoch"):
        again = list(resumed)
    assert again == expected


def test_set_epoch_refuses_to_discard_a_resumed_position():
    lens = random_mix(800, seed=18)
    s = make(AdaptiveBatchSampler, lens, 2, 0, **BASE)
    s.set_epoch(3)
    consume(s, 4)
    resumed = make(AdaptiveBatchSampler, lens, 2, 0, **BASE)
    resumed.load_state_dict(s.state_dict(steps_done=4))
    with pytest.raises(ValueError, match="resumed at epoch 3"):
        resumed.set_epoch(0)
    resumed.set_epoch(3)  # keeps the position
    assert resumed.start_step == 4
    list(resumed)
    resumed.set_epoch(4)  # the resumed epoch is done: moving on is fine


def test_resume_mid_step_is_exact():
    lens = random_mix(900, seed=19)
    kw = dict(micro_batches_per_step=3, seed=2)
    for r in range(2):
        whole = make(AdaptiveBatchSampler, lens, 2, r, **kw)
        expected = list(whole)
        s = make(AdaptiveBatchSampler, lens, 2, r, **kw)
        got = [b for _, b in zip(range(7), s, strict=False)]  # 2 steps and 1 micro-batch
        resumed = make(AdaptiveBatchSampler, lens, 2, r, **kw)
        resumed.load_state_dict(s.state_dict(micro_batches_done=7))
        assert got + list(resumed) == expected


def test_finished_epoch_resumes_to_nothing_left():
    lens = random_mix(500, seed=20)
    s = make(AdaptiveBatchSampler, lens, 2, 0, drawn_is_trained=True, **BASE)
    s.set_epoch(2)
    list(s)
    state = s.state_dict()  # a completed pass drawn directly: the default is exact
    resumed = make(AdaptiveBatchSampler, lens, 2, 0, **BASE)
    resumed.load_state_dict(state)
    resumed.set_epoch(2)
    assert len(resumed) == 0 and list(resumed) == []
    resumed.set_epoch(3)
    assert len(resumed) > 0


def test_default_state_dict_is_refused_while_workers_prefetch():
    lens = random_mix(600, seed=21)
    s = make(AdaptiveBatchSampler, lens, 1, 0, **BASE)
    loader = DataLoader(IndexDataset(lens), batch_sampler=s, num_workers=2)
    it = iter(loader)
    next(it)
    with pytest.raises(ValueError, match="workers"):
        s.state_dict()
    assert s.state_dict(steps_done=0)["micro_batches_done"] == 0
    del it


def test_default_state_dict_is_exact_without_workers():
    lens = random_mix(600, seed=22)
    s = make(AdaptiveBatchSampler, lens, 1, 0, drawn_is_trained=True, **BASE)
    it = iter(DataLoader(IndexDataset(lens), batch_sampler=s, num_workers=0))
    for _ in range(5):
        next(it)
    assert s.state_dict() == s.state_dict(micro_batches_done=5)


def test_default_state_dict_is_refused_unless_the_position_is_known():
    lens = random_mix(600, seed=23)
    s = make(AdaptiveBatchSampler, lens, 1, 0, **BASE)
    assert s.state_dict()["micro_batches_done"] == 0  # no pass begun: nothing drawn
    it = iter(s)
    next(it)
    with pytest.raises(ValueError, match="drawn_is_trained=True"):
        s.state_dict()  # direct iteration is not declared: the sampler cannot see its reader
    with pytest.raises(ValueError, match="drawn_is_trained must be True or False"):
        make(AdaptiveBatchSampler, lens, 1, 0, drawn_is_trained=1, **BASE)


def test_default_state_dict_is_refused_after_workers_drew_the_last_batch():
    # Workers prefetch: the sampler hands out its last micro-batch (its pass is done) while
    # the loop is still behind. Counting that pass as trained would lose the prefetched ones.
    lens = random_mix(600, seed=24)
    s = make(AdaptiveBatchSampler, lens, 1, 0, **BASE)
    loader = DataLoader(IndexDataset(lens), batch_sampler=s, num_workers=2, prefetch_factor=2)
    it = iter(loader)
    for _ in range(len(loader) - 3):  # 2 workers x 2 prefetched: the sampler is done
        next(it)
    with pytest.raises(ValueError, match="workers"):
        s.state_dict()
    del it


def test_micro_batches_counts_what_the_loop_received_with_workers():
    lens = random_mix(600, seed=25)
    kw = BASE
    expected = list(make(AdaptiveBatchSampler, lens, 1, 0, **kw))
    s = make(AdaptiveBatchSampler, lens, 1, 0, **kw)
    loader = DataLoader(IndexDataset(lens), batch_sampler=s, num_workers=2, collate_fn=list)
    got = []
    for mb in s.micro_batches(loader):
        got.append([int(item[0]) for item in mb.batch])  # IndexDataset: (index, length)
        if len(got) == 7:  # the workers have drawn more; the loop has received 7
            state = s.state_dict()
            break
    assert state == s.state_dict(micro_batches_done=7)
    resumed = make(AdaptiveBatchSampler, lens, 1, 0, **kw)
    resumed.load_state_dict(state)
    assert got + list(resumed) == expected
