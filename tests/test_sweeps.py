"""Sweeps on Optuna: results, the embedded default storage, kill and resume, PostgreSQL workers."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pandas as pd
import pytest
from helpers import dse
from postgres import find_bin, postgres_server

from dse.catalog.hardware import default_systems
from dse.studies.base import load_study
from dse.studies.optuna_sweep import count_complete, open_storage, points_of

ROOT = Path(__file__).resolve().parent.parent
SMALL = ROOT / "tests" / "fixtures" / "small_sweep.yaml"


SMALL_STUDY = "small_sweep/llama-3.1-70b/chat"  # one Optuna study per (model, workload) of a sweep


def load(url: str, name: str = SMALL_STUDY) -> optuna.Study:
    return optuna.load_study(study_name=name, storage=open_storage(url))


@pytest.fixture(scope="module")
def hbm_run(shipped):
    """The output folder of the session's run of the shipped bandwidth sweep, for the tests that read it."""
    r = shipped("hbm_bandwidth_sensitivity")
    assert r.returncode == 0, r.stderr
    return r.out


def test_hbm_bandwidth_sensitivity_study(hbm_run):
    out = hbm_run
    sweep = pd.read_csv(out / "sweep.csv")
    assert set(sweep["factor"]) == {0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 4.0}
    for workload, g in sweep.groupby("workload"):
        g = g.sort_values("factor")
        # more bandwidth never costs more (the optimum each point minimizes: at the fluid pool ratio)
        assert (g["usd_per_request_fluid"].diff().dropna() <= 1e-12).all(), workload
        assert (g["usd_per_request"] >= g["usd_per_request_fluid"] * (1 - 1e-12)).all()  # its whole deployment
        assert g["chips"].dtype.kind == "i"  # whole GPUs
    long = sweep[sweep["workload"] == "1m-context"].sort_values("factor")
    # per request, the compute-bound prefill (most of a 1M-token request's cost) does not move with bandwidth:
    # the request's elasticity stays small while the decode share (output cost) moves nearly one for one
    assert (long["elasticity"] <= 0).all() and long["elasticity"].min() > -0.5 and (long["bound"] == "memory").all()
    out_cost = long.set_index("factor")["usd_per_mtok_output"]
    assert out_cost[0.5] / out_cost[1.0] > 1.6 and (long["prefill_share"].diff().dropna() >= -1e-9).all()
    # at least seven tenths: 73% at half the bandwidth, where the decode pool (on MI300X, as the prefill pool:
    # CDNA3's FP8 KV cache crosses to no other system's) takes the rest
    assert (long["prefill_share"] > 0.70).all()
    for name in ("sweep.png", "sweep_systems.csv", "report.html", "summary.json", "optuna.db"):
        assert (out / name).exists()


def test_tornado_price_moves_cost_one_for_one(shipped):
    r = shipped("tornado")
    out = r.out
    assert r.returncode == 0, r.stderr
    t = pd.read_csv(out / "tornado.csv")
    best = json.loads((out / "summary.json").read_text())["best"]
    mesh = any(default_systems()[e["system"]].topology == "mesh" for e in best)
    for _, g in t.groupby("workload"):
        base = g[g["factor"] == 1.0]["usd_per_request_fluid"].iloc[0]
        price = g[g["parameter"] == "price"].set_index("factor")["usd_per_request_fluid"]
        assert price[2.0] == pytest.approx(2 * base, rel=1e-9)
        assert price[0.5] == pytest.approx(0.5 * base, rel=1e-9)
        for parameter, h in g[g["parameter"] != "price"].groupby("parameter"):
            if parameter == "scaleup_domain" and mesh:
                continue  # a wider full mesh with the same total bandwidth per chip thins each peer's link
            h = h.set_index("factor")["usd_per_request_fluid"]
            assert h[2.0] <= base * (1 + 1e-9) <= h[0.5] * (1 + 1e-9), parameter  # more hardware never costs more
    assert (out / "tornado.png").exists()


def test_sweep_killed_midway_resumes_without_losing_or_recomputing(tmp_path):
    out = tmp_path / "resume"
    url = f"sqlite:///{out / 'optuna.db'}"
    proc = subprocess.Popen([sys.executable, "-m", "dse.cli", "run", str(SMALL), "--out", str(out)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    done_before: dict[int, object] = {}
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        time.sleep(0.2)
        if not (out / "optuna.db").exists():
            continue
        try:
            trials = load(url).get_trials(states=(optuna.trial.TrialState.COMPLETE,))
        except Exception:  # the study may not be created yet
            continue
        if len(trials) >= 3:
            break
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    study = load(url)
    done_before = {t.number: t.datetime_complete for t in study.get_trials(states=(optuna.trial.TrialState.COMPLETE,))}
    points = points_of(load_study(SMALL))
    assert 3 <= len(done_before) < len(points), "the kill must land mid-way"
    r = dse("run", str(SMALL), "--out", str(out), timeout=600)
    assert r.returncode == 0, r.stderr
    study = load(url)
    counts = count_complete({("llama-3.1-70b", "chat"): study})
    assert sorted(counts) == sorted(p.key for p in points)  # none missing
    assert set(counts.values()) == {1}  # none solved twice
    after = {t.number: t.datetime_complete for t in study.get_trials(states=(optuna.trial.TrialState.COMPLETE,))}
    assert all(after[n] == when for n, when in done_before.items())  # completed points kept as they were
    assert len(pd.read_csv(out / "sweep.csv")) == len(points)


@pytest.mark.skipif(find_bin("initdb") is None, reason="PostgreSQL server binaries missing: .ci/run installs them")
def test_four_workers_on_postgresql_finish_one_sweep(tmp_path):
    with postgres_server(tmp_path / "pg") as url:
        out = tmp_path / "pgsweep"
        coordinator = subprocess.Popen([sys.executable, "-m", "dse.cli", "run", str(SMALL), "--out", str(out),
                                        "--storage", url], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        workers = [subprocess.Popen([sys.executable, "-m", "dse.cli", "worker", str(SMALL), "--storage", url],
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(3)]
        _, coordinator_err = coordinator.communicate(timeout=600)
        errors = [w.communicate(timeout=600)[1] for w in workers]
        assert coordinator.returncode == 0, coordinator_err
        for w, err in zip(workers, errors, strict=True):
            assert w.returncode == 0, err
        counts = count_complete({("llama-3.1-70b", "chat"): load(url)})
        points = points_of(load_study(SMALL))
        assert sorted(counts) == sorted(p.key for p in points)
        assert set(counts.values()) == {1}
        assert len(pd.read_csv(out / "sweep.csv")) == len(points)


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("mongodb://localhost/x", "unsupported URL; allowed: sqlite:///PATH or postgresql://"),
        ("postgresql://nobody@127.0.0.1:1/nodb", "cannot open the storage"),
    ],
)
def test_bad_storage_url_exits_2(tmp_path, url, message):
    r = dse("run", str(SMALL), "--out", str(tmp_path / "o"), "--storage", url)
    assert r.returncode == 2, r.stderr
    assert message in " ".join(r.stderr.split()) and "Traceback" not in r.stderr
    r = dse("worker", str(SMALL), "--storage", url)
    assert r.returncode == 2 and message in " ".join(r.stderr.split())


def test_storage_is_refused_for_studies_that_are_not_sweeps(tmp_path):
    r = dse("run", str(ROOT / "studies" / "pareto_latency_cost.yaml"), "--storage", "sqlite:///x.db",
            cwd=tmp_path)
    assert r.returncode == 2 and "only sweep, tornado and compute_equalization studies use a storage" in " ".join(r.stderr.split())


def test_a_trial_killed_before_its_first_heartbeat_is_failed(tmp_path, monkeypatch):
    import dse.studies.optuna_sweep as sw

    monkeypatch.setattr(sw, "GRACE_S", 1)
    study = optuna.create_study(study_name="t", storage=sw.open_storage(f"sqlite:///{tmp_path / 'x.db'}"))
    study.enqueue_trial({"point": "a"})
    study.ask()  # RUNNING, and no heartbeat was ever recorded: its process died at once
    sw.fail_dead_trials(study)
    assert [t.state.name for t in study.get_trials()] == ["RUNNING"]  # not yet past the grace period
    time.sleep(1.2)
    sw.fail_dead_trials(study)
    assert [t.state.name for t in study.get_trials()] == ["FAIL"]


def test_a_sweep_storage_reads_in_optuna_as_a_dashboard_shows_it(hbm_run):
    """One Optuna study per (model, workload), numeric parameters, a named objective, the configuration in
    user attributes: what optuna-dashboard needs to plot a sweep (read here through Optuna's public API)."""
    out = hbm_run
    storage = optuna.storages.RDBStorage(f"sqlite:///{out / 'optuna.db'}")
    names = sorted(s.study_name for s in optuna.get_all_study_summaries(storage))
    assert names == ["hbm_bandwidth_sensitivity/llama-4-maverick/1m-context",
                     "hbm_bandwidth_sensitivity/llama-4-maverick/chat"]
    for name in names:
        study = optuna.load_study(study_name=name, storage=storage)
        assert study.metric_names == ["usd_per_request_fluid"]
        done = study.get_trials(states=(optuna.trial.TrialState.COMPLETE,))
        assert sorted(t.params["factor"] for t in done) == [0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 4.0]
        assert {t.params["parameter"] for t in done} == {"hbm_bandwidth"}
        assert all(isinstance(t.params["factor"], float) for t in done)
        assert all({"system", "chips", "batch", "bound"} <= set(t.user_attrs) for t in done)
