"""`dse validate`: predictions against the published cases, the calibration and its errors."""

from __future__ import annotations

import json

import numpy as np
import pytest
from helpers import dse

from dse.catalog.hardware import IDEAL, default_efficiency_catalog
from dse.catalog.training import TRAIN_IDEAL
from dse.errors import InputError
from dse.validate import (
    FITTED,
    calibrate,
    load_cases,
    load_fitted,
    load_training_runs,
    predict,
    predict_training,
    run_validation,
)
from dse.validate.fit import fit_family


@pytest.fixture(scope="module")
def cases():
    return load_cases()


def test_every_case_is_predicted_or_skipped_with_a_reason(cases):
    predicted = {p.case for p in cases.points}
    skipped = {s.case for s in cases.skipped}
    import yaml

    from dse.validate import cases_path

    # a case naming a file of runs is covered row by row (tests/test_amd_tpu_calibration.py)
    ids = {c["id"] for c in yaml.safe_load(cases_path().read_text())["cases"] if "file" not in c}
    assert ids <= predicted | skipped
    assert all(s.reason for s in cases.skipped)
    assert len(cases.points) >= 100


def test_no_calibrated_prediction_exceeds_the_ideal_roofline(cases):
    throughput = [p for p in cases.points if p.category == "serving_throughput"]
    calibrated = predict(throughput, None)
    ideal = predict(throughput, IDEAL)
    assert np.all(calibrated <= ideal * (1 + 1e-12))
    assert np.all(calibrated > 0)
    runs = load_training_runs()
    train_cal, train_ideal = predict_training(runs, None), predict_training(runs, TRAIN_IDEAL)
    assert np.all(train_cal <= train_ideal * (1 + 1e-12)) and np.all(train_cal > 0)


def test_every_point_has_a_label_of_its_own(cases, tmp_path):
    """A label keys a point's stored leave-one-out prediction: two points of one label would read each other's. A
    cases file whose points share a label is refused, naming both cases (a GPU measurement's label names its
    formats where they are not bf16: tests/test_measure.py)."""
    labels = [p.label for p in cases.points]
    assert len(set(labels)) == len(labels)
    from dse.validate.cases import cases_path

    folder = cases_path().parent
    text = cases_path().read_text().replace("file: ", f"file: {folder}/")  # the files beside the original
    entry = text[text.index("- id: dse_measured_h200_llama31_8b"):].split("\n- id:")[0]
    path = tmp_path / "cases.yaml"
    path.write_text(text + "\n" + entry.replace("dse_measured_h200_llama31_8b", "again", 1) + "\n")
    with pytest.raises(InputError, match="cases 'dse_measured_h200_llama31_8b' and 'again': two points labelled"):
        load_cases(path)


def test_stored_leave_one_out_error_meets_the_target():
    fitted = load_fitted()
    row = next(r for r in fitted["summary"] if r["category"] == "serving_throughput")
    assert row["points"] >= 100
    assert row["loo_median_abs_error"] <= 0.15
    assert row["loo_median_abs_error"] >= row["median_abs_error"] - 0.02  # out of sample is not better


def test_validation_uses_the_stored_factors(cases):
    report = run_validation(cases)
    thr = report.summary.set_index("category").loc["serving_throughput"]
    assert thr["median_abs_error"] <= 0.15
    assert "loo_error" in report.table and report.table["loo_error"].notna().sum() >= 100


def test_the_fit_is_reproducible(cases):
    """Refitting the TPU family (points alone: its measured runs are one sweep, too few for a joint fit) from the
    global factors lands on the stored TPU factors; the joint Hopper fit's reproduction is in
    tests/test_joint_calibration.py."""
    cat = default_efficiency_catalog()
    tpu = [p for p in cases.points if p.system in ("tpu-v6e", "tpu-v7")]
    eff, rms, names = fit_family(tpu, cat.default)
    stored = cat.families["tpu"]
    assert names == tuple(load_fitted()["families"]["tpu"]["fitted_factors"])
    for name in FITTED:
        assert getattr(eff, name) == pytest.approx(getattr(stored, name), rel=0.02, abs=1e-3), name
    assert rms < 0.25


def test_leave_one_out_machinery_on_a_subset(cases):
    sub = type(cases)(points=[p for p in cases.points if p.system == "h200" and p.model == "llama-3.3-70b"])
    cal = calibrate(sub, default_efficiency_catalog().default, loo=True)
    assert cal.table["loo_predicted"].notna().all()
    assert cal.band["default"][0] <= 1 <= cal.band["default"][1] + 0.5


def test_measured_gpu_steps_calibrate_their_own_family_and_not_the_pooled_default(cases):
    """The H100 steps measured by scripts/measure_gpu.py fit Hopper's factors; the default that families without
    data inherit is the fit of the published points alone, with or without them."""
    measured = [p for p in cases.points if p.case == "dse_measured_h100_llama31_8b"]
    assert len(measured) == 27 and all(p.family_only and p.system == "h100" for p in measured)
    published = [p for p in cases.points if p.system in ("h200", "b200") and p.model == "llama-3.3-70b"]
    start = default_efficiency_catalog().default
    without = calibrate(type(cases)(points=published), start, loo=False)
    both = calibrate(type(cases)(points=published + measured), start, loo=False)
    assert both.default == without.default
    assert "hopper" in both.families and both.families["hopper"] != without.families["hopper"]


def test_dse_validate_command(tmp_path):
    out = tmp_path / "v"
    r = dse("validate", "--json", "--out", str(out))
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert {s["category"] for s in doc["summary"]} >= {"serving_throughput", "training_throughput", "latency"}
    assert any("pricing" in s["category"] for s in doc["skipped"])
    for name in ("validate.csv", "summary.json", "scatter.png", "report.html"):
        assert (out / name).stat().st_size > 0
    assert "data:image/png;base64," in (out / "report.html").read_text()


def test_evaluate_reports_an_error_band():
    from dse.physics.evaluate import Config, evaluate_config

    r = evaluate_config(Config("llama-3.1-70b", "h100", 64, 4096, tp=8))
    lo, hi = r["tokens_per_s_band"]
    assert lo < r["tokens_per_s"] < hi
    assert evaluate_config(Config("llama-3.1-70b", "h100", 64, 4096, tp=8), ideal=True)["tokens_per_s_band"] is None
