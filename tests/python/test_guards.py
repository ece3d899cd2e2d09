"""Every guard of the pass machinery, for every sampler: one table of bad values refused by
each sampler with the same message, the ``set_epoch`` guard after a resume, and saved states
with a field that is not the sampler's refused (never a lost, repeated or re-cut epoch)."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

from adaptiveload import AdaptiveBatchSampler, EqualTokenBatchSampler, StreamingBatchSampler

LENGTHS = [1560, 3600, 14040, 32760, 75600]
SAMPLERS = [AdaptiveBatchSampler, EqualTokenBatchSampler, StreamingBatchSampler]
ONLY_BALANCED = {"mix_tolerance", "max_cost", "uneven_counts", "lookahead_steps"}


def lengths(n=600, seed=0):
    rng = np.random.default_rng(seed)
    return rng.choice(LENGTHS, size=n, p=[0.4, 0.2, 0.1, 0.2, 0.1]).astype(np.int32)


def make(kind, lens=None, **kw):
    lens = lengths() if lens is None else lens
    base = {"num_replicas": 2, "rank": 0, "micro_batches_per_step": 2}
    if kind is StreamingBatchSampler:
        base |= {"segment_samples": 150, "lookahead_steps": 2}
    return kind(lens, 151_200, **(base | kw))


# (argument, bad value, what the message says)
BAD = [
    ("mix_tolerance", True, "mix_tolerance must be a number in [0, 1]"),
    ("mix_tolerance", 1.5, "mix_tolerance must be a number in [0, 1]"),
    ("mix_tolerance", "0.1", "mix_tolerance must be a number in [0, 1]"),
    ("max_batch_size", 0, "max_batch_size must be an integer >= 1"),
    ("max_batch_size", False, "max_batch_size must be an integer >= 1"),
    ("max_batch_size", 0.0, "max_batch_size must be an integer >= 1"),
    ("max_cost", -1.0, "max_cost must be a finite number > 0"),
    ("max_cost", float("inf"), "max_cost must be a finite number > 0"),
    ("seed", 2**64, "seed must be an integer in [0, 18446744073709551615]"),
    ("seed", -1, "seed must be an integer in [0, 18446744073709551615]"),
    ("seed", 1.5, "seed must be an integer in [0, 18446744073709551615]"),
    ("micro_batches_per_step", 0, "micro_batches_per_step must be an integer >= 1"),
    ("lookahead_steps", 0, "lookahead_steps must be an integer >= 1"),
    ("shuffle", "yes", "shuffle must be True or False"),
    ("drop_last", 1, "drop_last must be True or False"),
    ("uneven_counts", None, "uneven_counts must be True or False"),
    ("verify_ranks", 0, "verify_ranks must be True or False"),
    ("drawn_is_trained", "no", "drawn_is_trained must be True or False"),
    ("on_oversize", "drop", "on_oversize must be 'error' or 'skip'"),
    ("num_replicas", 0, "num_replicas must be an integer >= 1"),
]


@pytest.mark.parametrize("kind", SAMPLERS, ids=lambda k: k.__name__)
@pytest.mark.parametrize(("name", "value", "message"), BAD, ids=[f"{b[0]}={b[1]!r}" for b in BAD])
def test_the_same_bad_value_is_refused_by_every_sampler_with_the_same_message(
    kind, name, value, message
):
    if kind is EqualTokenBatchSampler and name in ONLY_BALANCED:
        pytest.skip(f"EqualTokenBatchSampler has no {name}")
    with pytest.raises(ValueError) as refused:
        make(kind, **{name: value})
    assert message in str(refused.value), str(refused.value)


@pytest.mark.parametrize("kind", [AdaptiveBatchSampler, StreamingBatchSampler])
def test_numpy_numbers_are_taken_as_the_numbers_they_are(kind):
    made = make(kind, mix_tolerance=np.float32(0.05), max_cost=np.float64(5e6), seed=np.int64(3))
    plain = make(kind, mix_tolerance=float(np.float32(0.05)), max_cost=5e6, seed=3)
    assert list(made) == list(plain)


@pytest.mark.parametrize("kind", SAMPLERS, ids=lambda k: k.__name__)
def test_the_largest_seed_plans(kind):
    s = make(kind, seed=2**64 - 1)
    assert sum(len(b) for b in s) > 0


@pytest.mark.parametrize("kind", SAMPLERS, ids=lambda k: k.__name__)
def test_set_epoch_cannot_leave_a_resumed_epoch_before_its_pass(kind):
    s = make(kind, drawn_is_trained=True)
    s.set_epoch(3)
    it = iter(s)
    head = [next(it) for _ in range(6)]
    state = s.state_dict()
    t = make(kind)
    t.load_state_dict(pickle.loads(pickle.dumps(state)))
    with pytest.raises(ValueError, match="resumed at epoch 3"):
        t.set_epoch(4)
    t.set_epoch(3)  # the resumed epoch keeps its position
    whole = make(kind)
    whole.set_epoch(3)
    assert head + list(t) == list(whole)
    t.set_epoch(4)  # once the resumed pass ran, any epoch
    # A state at an epoch's end leaves nothing to skip.
    end = make(kind, drawn_is_trained=True)
    end.set_epoch(3)
    list(end)
    u = make(kind)
    u.load_state_dict(end.state_dict())
    u.set_epoch(5)


def streamed_state(**kw):
    s = make(StreamingBatchSampler, drawn_is_trained=True, **kw)
    it = iter(s)
    for _ in range(9):
        next(it)
    return s.state_dict()


def edited(state, path, value):
    out = pickle.loads(pickle.dumps(state))
    target = out
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    return out


N = len(lengths())
CORRUPT = [
    (("steps_done",), 10**9),
    (("steps_done",), -3),
    (("micro_batches_done",), 10**9),
    (("segment", "begin"), N + 5),
    (("segment", "begin"), 17),
    (("segment", "index"), 7),
    (("segment", "steps_before"), 1),
    (("fingerprint",), {}),
    (("epoch",), -1),
    (("epoch",), "0"),
    (("segment",), None),
]


@pytest.mark.parametrize(("path", "value"), CORRUPT, ids=[f"{p}={v!r}" for p, v in CORRUPT])
def test_a_streamed_state_with_a_field_not_its_own_is_refused(path, value):
    state = streamed_state()
    t = make(StreamingBatchSampler)
    before = t.state_dict()
    with pytest.raises(ValueError, match="sampler state"):
        t.load_state_dict(edited(state, path, value))
    assert t.state_dict() == before  # the sampler stays as it was
    t.load_state_dict(state)  # the state as saved resumes
    assert t.start_step == state["steps_done"]


def test_states_of_the_other_plan_source_are_refused_by_name():
    streamed = streamed_state()
    planned = make(AdaptiveBatchSampler).state_dict()
    with pytest.raises(ValueError, match="resumes only states of its own plan source"):
        make(AdaptiveBatchSampler).load_state_dict(streamed)
    with pytest.raises(ValueError, match="resumes only states of its own plan source"):
        make(StreamingBatchSampler).load_state_dict(planned)
