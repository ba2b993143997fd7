"""`dse.table.Table`, the tables dse computes and writes without pandas: built from records it types each column as
pandas does, and its CSV is byte for byte what ``DataFrame.to_csv(index=False)`` writes of the same rows; a
DataFrame converts in and out unchanged."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from dse.table import Table, as_table

ROWS = [
    {"model": "llama-3.1-70b", "chips": 8, "usd_per_request": 1.3e-3, "fits": True, "note": None, "tiny": 1e-7,
     "huge": 1e16, "mixed": 3, "flags": True, "layout": [1, 2], "text": 'a, "quoted"\nline'},
    {"model": "deepseek-v3", "chips": 16, "usd_per_request": float("nan"), "fits": False, "note": "estimate",
     "tiny": 2.5e-5, "huge": 12345678.0, "mixed": 2.5, "flags": None, "layout": None, "text": ""},
    {"model": "qwen3-32b", "chips": np.int64(4), "usd_per_request": np.float64(0.1), "fits": np.bool_(True),
     "tiny": -0.0, "huge": float("inf"), "mixed": None, "flags": False, "layout": ("a", 3.0), "text": "plain",
     "extra": 7},
]


def _csv(write, tmp_path, name: str) -> bytes:
    path = tmp_path / name
    write(path)
    return path.read_bytes()


@pytest.mark.parametrize("rows", [ROWS, ROWS[:1], ROWS[1:], ROWS[2:], []])
def test_records_write_the_csv_pandas_writes(rows, tmp_path):
    frame = pd.DataFrame(rows)
    table = Table.from_records(rows)
    assert table.columns == [str(c) for c in frame.columns] and len(table) == len(frame)
    mine = _csv(table.to_csv, tmp_path, "mine.csv")
    theirs = _csv(lambda p: frame.to_csv(p, index=False), tmp_path, "theirs.csv")
    assert mine == theirs


def test_column_types_follow_pandas():
    t = Table.from_records(ROWS)
    assert t["chips"].dtype == np.int64 and t["fits"].dtype == bool
    assert t["usd_per_request"].dtype == np.float64 and math.isnan(t["usd_per_request"][1])
    assert t["mixed"].dtype == np.float64 and math.isnan(t["mixed"][2])  # an integer, a float and a missing value
    assert t["flags"].dtype == object and t["extra"].dtype == np.float64  # booleans with a gap; a key one row has
    assert Table.from_records([{"a": 1, "b": True}, {"a": True, "b": 2}])["a"].dtype == object


def test_frames_convert_both_ways(tmp_path):
    frame = pd.DataFrame(ROWS[:2])
    t = as_table(frame)
    assert as_table(t) is t
    back = t.to_frame()
    pd.testing.assert_frame_equal(back, frame)
    assert _csv(t.to_csv, tmp_path, "a.csv") == _csv(lambda p: frame.to_csv(p, index=False), tmp_path, "b.csv")


def test_rows_keep_their_labels():
    t = Table({"system": np.array(["h100", "h200", "b200", "h200"], dtype=object), "tp": np.array([1, 2, 4, 2])})
    sub = t[t["tp"] > 1]
    assert list(sub.index) == [1, 2, 3] and sub.loc(3) == {"system": "h200", "tp": 2}
    assert sub.row(0) == {"system": "h200", "tp": 2} and type(sub.row(0)["tp"]) is int
    assert list(t.duplicated(["system", "tp"])) == [False, False, False, True]
    assert list(t.duplicated(["tp"])) == [False, False, False, True]
    assert list(t.take(slice(1, 3))["system"]) == ["h200", "b200"] and t.take(np.array([], dtype=int)).empty
    with pytest.raises(ValueError, match="rows"):
        Table({"a": [1, 2], "b": [1]})
