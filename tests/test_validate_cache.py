"""The cache of `dse validate --cases` results: a second run of the same inputs reads the first one's result back,
any change to an input is another key, a damaged or foreign file is ignored and left in place, and nothing is
kept where the cache is off."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
from helpers import dse

import dse.validate.run as run
from dse.validate import cache

MEASURED = Path(__file__).resolve().parent.parent / "hw_catalog/calibration/published/measured_serving.csv"


@pytest.fixture()
def runs_csv(tmp_path):
    """A small runs file: the catalog's measured runs of Qwen3-32B on vLLM (78 rows)."""
    raw = pd.read_csv(MEASURED)
    path = tmp_path / "runs.csv"
    raw[(raw["model_path"] == "Qwen/Qwen3-32B") & (raw["backend"] == "vllm")].to_csv(path, index=False)
    return path


@pytest.fixture()
def counted(monkeypatch):
    """`validate_runs` counting its calls (the fits a cache hit skips)."""
    calls = []
    inner = run.validate_runs

    def validate_runs(runs):
        calls.append(len(runs.table))
        return inner(runs)

    monkeypatch.setattr(run, "validate_runs", validate_runs)
    return calls


def test_a_second_run_reads_the_first_ones_result_and_a_changed_input_is_fitted_again(tmp_path, monkeypatch,
                                                                                        runs_csv, counted):
    monkeypatch.setenv("DSE_CACHE_DIR", str(tmp_path / "cache"))
    first = run.validate_file(runs_csv)
    kept = list((tmp_path / "cache").glob("validate-*.pkl"))
    assert len(counted) == 1 and len(kept) == 1
    again = run.validate_file(runs_csv)
    assert len(counted) == 1  # no fit: read back
    pd.testing.assert_frame_equal(again.table, first.table)
    # the same summary (as JSON: a figure of no row is NaN in both, and NaN == NaN is False)
    assert json.dumps(again.as_dict(), sort_keys=True, default=str) == json.dumps(first.as_dict(), sort_keys=True,
                                                                                  default=str)
    # one measured TTFT changed: another key, fitted again, kept beside the first
    raw = pd.read_csv(runs_csv)
    raw.loc[0, "silicon_ttft_ms"] *= 1.5
    raw.to_csv(runs_csv, index=False)
    changed = run.validate_file(runs_csv)
    assert len(counted) == 2 and len(list((tmp_path / "cache").glob("validate-*.pkl"))) == 2
    assert not changed.table["measured_ttft_s"].equals(first.table["measured_ttft_s"])
    # without the cache: fitted, nothing read
    run.validate_file(runs_csv, cache=False)
    assert len(counted) == 3


def test_a_damaged_or_foreign_file_under_the_key_is_ignored_and_left_alone(tmp_path, monkeypatch, runs_csv,
                                                                           counted):
    folder = tmp_path / "cache"
    folder.mkdir()
    monkeypatch.setenv("DSE_CACHE_DIR", str(folder))
    target = folder / f"validate-{cache.key([runs_csv])}.pkl"
    target.write_bytes(b"not a pickle")
    run.validate_file(runs_csv)
    run.validate_file(runs_csv)
    assert len(counted) == 2  # never read as a result
    assert target.read_bytes() == b"not a pickle"  # never overwritten
    assert [p.name for p in folder.iterdir()] == [target.name]  # no temporary file left behind


def test_no_cache_keeps_nothing(tmp_path, monkeypatch, runs_csv, counted):
    monkeypatch.setenv("DSE_CACHE_DIR", "")
    assert cache.cache_dir() is None
    run.validate_file(runs_csv)
    run.validate_file(runs_csv)
    assert len(counted) == 2
    # the command line's --no-cache: nothing written into the cache folder
    folder = tmp_path / "cache"
    r = dse("validate", "--cases", str(runs_csv), "--no-cache", "--json", "--out", str(tmp_path / "report"),
            env={"DSE_CACHE_DIR": str(folder)})
    assert r.returncode == 0, r.stderr
    assert not folder.exists()
