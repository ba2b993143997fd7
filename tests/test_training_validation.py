"""The training runs of the calibration (hw_catalog/calibration/training_runs.yaml), the stored training fit and
its leave-one-out errors (`dse.validate.training`)."""

from __future__ import annotations

import numpy as np
import pytest

from dse.catalog.loading import read_yaml
from dse.catalog.training import TRAIN_IDEAL, default_training_efficiency
from dse.validate.training import (
    calibrate_training,
    fit_factors,
    fitted_path,
    load_training_runs,
    predict_runs,
    runs_path,
    validation_rows,
)

KEPT_ASIDE = ("performance-summary", "performance summary", "megatron-bridge", "tiering", "torchtitan",
              "2407.21783", "2412.19437", "2204.02311", "2402.15627", "llama 3 herd", "palm:", "megascale")
"""Sources kept aside to check the tool independently (NeMo / Megatron-Bridge performance summaries, MaxText
tiering tables, torchtitan tables, the Llama 3, DeepSeek-V3, PaLM and MegaScale reports' training totals)."""


@pytest.fixture(scope="module")
def runs():
    return load_training_runs()


def test_every_run_is_sourced_and_none_is_kept_aside(runs):
    doc = read_yaml(runs_path())
    sources = doc["sources"]
    text = repr(doc).lower()
    assert not [k for k in KEPT_ASIDE if k in text]
    for raw in doc["runs"]:
        src = sources[raw["source"]]
        assert src["title"] and src["url"] and src["date"]
        assert raw["derived"] and raw["measured"] > 0
        if raw["source"].startswith("mlperf"):  # a results repository: the commit, the logs and the launch config
            assert raw["commit"] and raw["result"] and raw["config"]
    assert len(runs) == len(doc["runs"]) >= 70
    assert {r.system for r in runs} >= {"a100", "h100", "b200", "gb200-nvl72", "gb300-nvl72", "tpu-v5p"}
    assert sum(r.moe for r in runs) >= 2


def test_calibrated_runs_stay_under_the_ideal_step(runs):
    cal, ideal = predict_runs(runs), predict_runs(runs, TRAIN_IDEAL)
    assert np.all(cal > 0) and np.all(cal <= ideal * (1 + 1e-12))


def test_stored_leave_one_out_error_meets_the_goal():
    """Median |error| of tokens/s per chip, each run predicted by its group's fit without it: at most 10% overall
    and for dense models, at most 20% for MoE and for every family of three runs or more."""
    s = read_yaml(fitted_path())["summary"]
    assert s["all"]["runs"] >= 70
    assert s["all"]["loo_median_abs_error"] <= 0.10
    assert s["kind:dense"]["loo_median_abs_error"] <= 0.10
    assert s["kind:moe"]["loo_median_abs_error"] <= 0.20
    for key, row in s.items():
        if key.startswith("family:") and row["runs"] >= 3:
            assert row["loo_median_abs_error"] <= 0.20, key
            assert row["loo_median_abs_error"] >= row["median_abs_error"] - 0.02, key  # out of sample is no better


def test_stored_fit_is_the_physics_of_today(runs):
    """The validation table predicts every run with the stored factors as the stored fit did (a change of the
    physics without `dse validate --fit-training` fails here)."""
    rows = validation_rows(runs)
    stored = {r["id"]: r for r in read_yaml(fitted_path())["table"]}
    assert set(rows["case"]) == set(stored)
    for case, pred in zip(rows["case"], rows["predicted"], strict=True):
        assert pred == pytest.approx(stored[case]["predicted"], rel=1e-3), case  # factors stored to 4 digits
    assert rows["loo_error"].notna().all()


def test_refit_of_a_family_lands_on_its_stored_factors(runs):
    """The TPU v6e / TPU7x family refitted from the stored global factors gives the stored GEMM share."""
    cat = default_training_efficiency()
    tpu = [r for r in runs if cat.family_of(r.system) == "tpu"]
    eff, names = fit_factors(tpu, cat.default)
    assert names == ("gemm",)
    assert eff.gemm == pytest.approx(cat.families["tpu"].gemm, rel=1e-3)


def test_leave_one_out_machinery_on_a_subset(runs):
    sub = [r for r in runs if r.system == "tpu-v5p"]
    fit = calibrate_training(sub)
    assert fit.table["loo_predicted"].notna().all()
    assert (fit.table["loo_error"].abs() >= 0).all() and len(fit.table) == len(sub)
