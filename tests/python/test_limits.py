"""Values that cannot be meant are refused at construction, naming the argument, and the
largest values that are accepted plan at once: no loop of planning runs as long as a cap is
large. Metadata readers convert every value by the same rules in every format."""

import json
import time

import numpy as np
import pytest

from adaptiveload import AdaptiveBatchSampler, EqualTokenBatchSampler, MemoryModel
from adaptiveload.cli import main
from adaptiveload.metadata import read_metadata

LENS = [1560, 75600, 3600, 1560]
# The largest accepted values (sampler.py, planner.h).
MAX_TOKENS = 2**62
MAX_LEN = 2**40 - 1
MAX_BLOCKS = 10000


# What a test allows a call that plans at once (it takes milliseconds): far more than that, so
# that a loaded machine never fails it, and far less than a loop over a cap's range takes (a
# loop over 2^40 values runs for many minutes, one over 2^62 never ends).
AT_ONCE = 30.0


def _timed(fn):
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0


# -- caps and counts -------------------------------------------------------------------------


def test_construction_with_the_largest_caps_plans_at_once():
    s, seconds = _timed(
        lambda: AdaptiveBatchSampler(LENS, max_tokens=MAX_TOKENS, num_replicas=2, rank=0)
    )
    assert seconds < AT_ONCE
    plan = s.plan()
    assert sorted(plan.samples[plan.padding.repeat(np.diff(plan.offsets)) == 0]) == [0, 1, 2, 3]

    # A memory model of the most blocks, with a budget that never binds.
    model = MemoryModel(MAX_BLOCKS, m0=1e9, ma=1.0, mc=0.01)
    s, seconds = _timed(
        lambda: AdaptiveBatchSampler(
            LENS * 500,
            max_tokens=MAX_TOKENS,
            memory_model=model,
            memory_budget_gib=1e12,
            num_replicas=8,
            rank=0,
            micro_batches_per_step=4,
        ).plan()
    )
    assert seconds < AT_ONCE
    # And the longest accepted samples with the default cap.
    s, seconds = _timed(
        lambda: AdaptiveBatchSampler([MAX_LEN, 1, 7], max_tokens=MAX_TOKENS, rank=0).plan()
    )
    assert seconds < AT_ONCE


@pytest.mark.parametrize("value", [2**62 + 1, 2**63 - 1, 2**64])
def test_max_tokens_past_int64_plan_sums_is_refused(value):
    with pytest.raises(ValueError, match=r"max_tokens must be an integer in \[1, "):
        AdaptiveBatchSampler(LENS, max_tokens=value, num_replicas=2, rank=0)


def test_lengths_past_the_bound_are_refused_naming_the_index():
    for lens in ([1560, 2**40], [1560, 2**62], np.array([1560, 2**63 - 1], dtype=np.int64)):
        with pytest.raises(ValueError, match=r"seq_lens\[1\] = .* larger than any supported"):
            AdaptiveBatchSampler(lens, max_tokens=10, rank=0, num_replicas=1)
    with pytest.raises(ValueError, match=r"seq_lens\[1\] = .* larger than any supported"):
        EqualTokenBatchSampler([1560.0, 2.0**41], max_tokens=10, rank=0, num_replicas=1)
    # Each length in range, their sum past 2^62.
    many = np.full(2**22 + 1, MAX_LEN, dtype=np.int64)
    with pytest.raises(ValueError, match=r"tokens in all, more than the 2\^62"):
        AdaptiveBatchSampler(many, max_tokens=MAX_TOKENS, rank=0, num_replicas=1)


def test_micro_batches_per_step_past_the_bound_are_refused():
    with pytest.raises(
        ValueError, match=r"num_replicas \* micro_batches_per_step must be <= 2\^20"
    ):
        AdaptiveBatchSampler(LENS, 151200, num_replicas=2**11, rank=0, micro_batches_per_step=2**10)


@pytest.mark.parametrize("value", [10**9, 10001, 0, -3, 1.5, 6.0, "6", True, None])
def test_memory_model_num_blocks_must_be_a_plausible_integer(value):
    with pytest.raises(ValueError, match=r"num_blocks must be an integer in \[1, 10000\]"):
        MemoryModel(value, m0=1e9, ma=1e3)


def test_memory_model_accepts_numpy_integers():
    assert MemoryModel(np.int64(6), m0=1e9, ma=1e3).num_blocks == 6


def test_too_small_budget_error_gives_the_peak_with_its_margin():
    model = MemoryModel(4, m0=1e9, ma=1e4, margin=0.5)  # 75600 tokens: 1.0 + 0.76 GB
    with pytest.raises(ValueError) as e:
        AdaptiveBatchSampler(
            LENS, None, memory_model=model, memory_budget_gib=2.2, rank=0, num_replicas=1
        )
    peak = model.peak_bytes([75600], 4)
    msg = str(e.value)
    assert f"{peak / 2**30:.2f} GiB, {peak * 1.5 / 2**30:.2f} GiB with the margin of 0.5" in msg


def test_checkpointed_blocks_of_samples_over_the_budget_raises():
    model = MemoryModel(4, m0=1e9, ma=1e4, margin=0.0)
    s = AdaptiveBatchSampler(
        LENS, None, memory_model=model, memory_budget_gib=2.5, rank=0, num_replicas=1
    )
    assert s.checkpointed_blocks([1]) >= 0
    with pytest.raises(ValueError, match=r"do not fit the memory budget of 2.5 GiB"):
        s.checkpointed_blocks([1, 1, 1])
    with pytest.raises(ValueError, match=r"indices must be in \[0, 4\)"):
        s.checkpointed_blocks([4])


# -- metadata ----------------------------------------------------------------------------------


def _write_jsonl(path, values, key="seq_len"):
    path.write_text("".join(json.dumps({key: v}) + "\n" for v in values))
    return path


@pytest.mark.parametrize(
    "value,row",
    [(1560.5, 2), (32760.99, 3), (True, 2), (False, 3), (None, 2), ("abc", 3)],
)
def test_jsonl_refuses_what_csv_and_parquet_refuse(tmp_path, value, row):
    values = [1560, 1560, 32760]
    values[row - 1] = value
    path = _write_jsonl(tmp_path / "t.jsonl", values)
    with pytest.raises(ValueError, match=rf"t.jsonl row {row}, column 'seq_len'"):
        read_metadata(path)
    # Parquet and CSV refuse the same value at the same row.
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    if isinstance(value, float):  # a column holds one type: floats after integers become floats
        pq.write_table(pa.table({"seq_len": pa.array(values)}), tmp_path / "t.parquet")
        with pytest.raises(ValueError, match=rf"t.parquet row {row}, column 'seq_len'"):
            read_metadata(tmp_path / "t.parquet")
    csv_value = "" if value is None else str(value)
    (tmp_path / "t.csv").write_text(
        "seq_len\n" + "".join(f"{csv_value if i == row - 1 else v}\n" for i, v in enumerate(values))
    )
    with pytest.raises(ValueError, match=rf"t.csv row {row + 1}, column 'seq_len'"):
        read_metadata(tmp_path / "t.csv")


def test_integral_floats_are_the_same_length_in_every_format(tmp_path):
    path = _write_jsonl(tmp_path / "t.jsonl", [1560, 1560.0, 32760])
    assert read_metadata(path).seq_lens.tolist() == [1560, 1560, 32760]


@pytest.mark.parametrize("value", [2**40, 2**63, 2**70, 10**30])
def test_lengths_past_the_bound_are_a_clear_error_in_every_format(tmp_path, value):
    path = _write_jsonl(tmp_path / "t.jsonl", [1560, value])
    with pytest.raises(ValueError, match=r"t.jsonl row 2, column 'seq_len': .* larger than"):
        read_metadata(path)
    (tmp_path / "t.csv").write_text(f"seq_len\n1560\n{value}\n")
    with pytest.raises(ValueError, match=r"t.csv row 3, column 'seq_len': .* larger than"):
        read_metadata(tmp_path / "t.csv")


def test_plan_cli_with_an_absurd_row_refuses_it_without_hanging(tmp_path, capsys):
    path = _write_jsonl(tmp_path / "t.jsonl", [1560, 2**62, 3600])
    (_, seconds) = _timed(
        lambda: main(["plan", "--metadata", str(path), "--figure", "none"]) == 2 or None
    )
    assert seconds < AT_ONCE
    assert "row 2, column 'seq_len'" in capsys.readouterr().err


def test_plan_cli_with_the_longest_accepted_row_and_a_huge_cap_returns(tmp_path, capsys):
    path = _write_jsonl(tmp_path / "t.jsonl", [1560, MAX_LEN, 3600, 1560])
    for extra in ([], ["--max-tokens", str(10**14)]):
        (code, seconds) = _timed(
            lambda extra=extra: main(["plan", "--metadata", str(path), "--figure", "none", *extra])
        )
        assert code == 0 and seconds < AT_ONCE
    capsys.readouterr()


def test_latin1_metadata_names_the_file(tmp_path):
    path = tmp_path / "latin.csv"
    path.write_bytes("caption,seq_len\ncaf\u00e9,1560\n".encode("latin-1"))
    with pytest.raises(ValueError, match=r"latin.csv: not UTF-8 text"):
        read_metadata(path)
    jl = tmp_path / "latin.jsonl"
    jl.write_bytes('{"caption": "caf\u00e9", "seq_len": 1560}\n'.encode("latin-1"))
    with pytest.raises(ValueError, match=r"latin.jsonl: not UTF-8 text"):
        read_metadata(jl)


def test_trailing_blank_lines_in_csv_are_skipped(tmp_path):
    (tmp_path / "b.csv").write_text("seq_len,caption\n1560,a\n32760,b\n\n\n")
    assert read_metadata(tmp_path / "b.csv").seq_lens.tolist() == [1560, 32760]
    # Inside the file a blank line is a missing row (a missing value with one column).
    (tmp_path / "c.csv").write_text("seq_len,caption\n1560,a\n\n5,b\n")
    with pytest.raises(ValueError, match=r"c.csv row 3: empty row"):
        read_metadata(tmp_path / "c.csv")
