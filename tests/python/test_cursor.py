"""A sampler's pass state has one owner, its ``Cursor`` (sampler/cursor.py), changed only by
named transitions; and ``Options`` is the one source of its settings."""

import dataclasses
import pickle

import numpy as np
import pytest

from adaptiveload import AdaptiveBatchSampler, CostModel, EqualTokenBatchSampler
from adaptiveload.sampler.cursor import DONE, READY, RUNNING, Cursor
from adaptiveload.sampler.iteration import rank_stream
from adaptiveload.sampler.readers import PLAIN, Reader
from adaptiveload.sampler.sources import WholeEpoch
from plans import random_mix

AHEAD = Reader("a loader that reads ahead", True)


class CountingSource(WholeEpoch):
    """A real sampler's plan source that counts the plans it makes."""

    def __init__(self, sampler):
        super().__init__(self.make, "digest", len(sampler.seq_lens))
        self.sampler, self.made = sampler, []

    def make(self, epoch, excluded):
        self.made.append((epoch, excluded))
        s = self.sampler
        return s.plan() if (epoch, excluded) == (s.epoch, None) else None


def make_cursor(**settings):
    """A cursor over a real sampler's plans, counting the plans it makes."""
    s = AdaptiveBatchSampler(
        random_mix(400, seed=3),
        151200,
        num_replicas=2,
        rank=1,
        micro_batches_per_step=2,
        **settings,
    )
    source = CountingSource(s)
    return Cursor("Test", s.options, source), s, source.made


def test_the_cursor_makes_its_plan_once_per_epoch_and_again_after_a_new_epoch():
    c, s, made = make_cursor()
    assert (c.epoch, c.start, c.stage, c.position, c.trained) == (0, (0, 0), READY, (0, 0), None)
    assert c.plan() is c.plan() is s.plan() and made == [(0, None)]
    assert c.source.left(c) == s.plan().num_rank_micro_batches(1)
    c.again()
    c.plan()
    assert made == [(0, None)] * 2
    c.new_epoch(4)
    assert (c.epoch, c.start, c.stage, c.position, c.cached_plan) == (
        4,
        (0, 0),
        READY,
        (0, 0),
        None,
    )


def test_a_pass_goes_ready_running_done_through_its_transitions():
    c, s, _ = make_cursor()
    c.start = (1, 1)
    c.begin(AHEAD)
    assert (c.stage, c.position, c.reader, c.trained, c.count) == (RUNNING, (1, 1), AHEAD, None, 0)
    stream = rank_stream(c)
    batches = [next(stream), next(stream)]
    assert (c.stage, c.position, c.count) == (RUNNING, (2, 1), 2)
    assert batches[0] == s.plan().micro_batch(1, 1, 1).tolist()
    c.received((2, 0))
    assert c.trained == (2, 0)
    rest = list(stream)
    assert c.stage == DONE and c.position == (s.plan().num_steps, 0)
    assert len(batches) + len(rest) == c.source.left(c)
    c.begin(PLAIN)  # a new pass forgets what the last one's loop received
    assert (c.stage, c.position, c.trained, c.reader) == (RUNNING, (1, 1), None, PLAIN)
    c.finish()
    assert c.stage == DONE


def test_known_position_follows_the_stage_the_reader_and_the_loop():
    c, _, _ = make_cursor()
    c.start = (1, 0)
    assert c.known_position() == (1, 0)  # no pass begun
    c.begin(PLAIN)
    c.handed((1, 1))
    with pytest.raises(ValueError, match="1 micro-batches this sampler has handed out"):
        c.known_position()  # drawn by a reader the sampler cannot see, not declared
    c.received((1, 1))
    assert c.known_position() == (1, 1)
    declared, _, _ = make_cursor(drawn_is_trained=True)
    declared.begin(PLAIN)
    declared.handed((0, 1))
    declared.handed((1, 0))
    assert declared.known_position() == (1, 0)
    declared.begin(AHEAD)
    declared.handed((0, 1))
    with pytest.raises(ValueError, match="reads ahead of training"):
        declared.known_position()  # declared, but this reader reads ahead


def test_a_copy_of_the_cursor_plans_anew_and_knows_no_reader():
    s = AdaptiveBatchSampler(random_mix(400, seed=5), 151200, micro_batches_per_step=2)
    it = iter(s)
    next(it)
    copy = pickle.loads(pickle.dumps(s))
    assert copy.state_dict(micro_batches_done=1) == s.state_dict(micro_batches_done=1)
    assert copy.plan() is not s.plan()
    assert np.array_equal(copy.plan().samples, s.plan().samples)


@pytest.mark.parametrize("kind", [AdaptiveBatchSampler, EqualTokenBatchSampler])
def test_every_setting_reads_the_options_and_cannot_be_set_apart(kind):
    s = kind(random_mix(300, seed=2), 151200, num_replicas=2, rank=1, seed=7)
    names = [f.name for f in dataclasses.fields(s.options)]
    for name in names:
        if name in ("max_cost", "cost_model"):
            continue  # the cap in use and the current epoch's model: see below
        assert getattr(s, name) == getattr(s.options, name), name
        with pytest.raises(AttributeError, match=f"{name} is a setting of the sampler's options"):
            setattr(s, name, getattr(s, name))
    assert s.base_cost_model is s.options.cost_model is s.cost_model
    assert (s.seed, s.rank, s.num_replicas) == (7, 1, 2)


def test_the_cost_model_of_an_epoch_is_the_base_one_with_the_learned_kinds():
    lens = np.full(64, 4096)
    s = AdaptiveBatchSampler(lens, 16384, cost_model=CostModel.default())
    ms = round(1.1 * float(s.base_cost_model.uniform_costs([4096], [4])[0]), 3)
    for batch in s:
        assert s.record_time(batch, ms)
    s.update_cost_model()
    assert s.cost_model is s.base_cost_model  # learned times wait for the next epoch
    s.set_epoch(1)
    assert s.cost_model is not s.base_cost_model
    assert s.base_cost_model is s.options.cost_model
    assert s.cost_model.measured[(4096, 4)] == ms


def test_a_refused_state_leaves_the_cursor_and_the_learned_times_as_they_were():
    lens = random_mix(500, seed=8)
    s = AdaptiveBatchSampler(lens, 151200, num_replicas=2, rank=0, micro_batches_per_step=2)
    s.set_epoch(2)
    it = iter(s)
    for _ in range(3):
        next(it)
    b = next(b for b in AdaptiveBatchSampler(lens, 151200) if len(set(lens[b])) == 1)
    assert s.record_time(b, 1.2 * s.base_cost_model.uniform_costs([lens[b[0]]], [len(b)])[0])
    s.update_cost_model()
    state = s.state_dict(micro_batches_done=3)
    plan = s.plan()
    bad = dict(state, consumed=bytes(len(state["consumed"])), num_consumed=0)
    with pytest.raises(ValueError, match="sampler state"):
        s.load_state_dict(bad)
    assert s.plan() is plan and s.epoch == 2 and s.state_dict(micro_batches_done=3) == state
    assert next(it) is not None  # the pass under way goes on
