"""Issue 13 item 5: AMD Instinct and Google TPU calibration from the published serving rows.

Every row of hw_catalog/calibration/published/amd_tpu_serving.csv becomes a point or is skipped with its reason; the
explicit columns agree with the hand-copied notes; the families cdna3, cdna4 and tpu fit only the factors their points
identify; the stored leave-one-out errors are reproducible; no calibrated prediction beats the ideal roofline.
"""

from __future__ import annotations

import csv
import re
from collections import Counter
from dataclasses import replace

import numpy as np
import pytest
import yaml

from dse.catalog.calibration import families, family_of, load_fitted
from dse.catalog.hardware import IDEAL, default_efficiency_catalog, hw_dir
from dse.errors import InputError
from dse.validate.cases import load_cases
from dse.validate.factors import FITTED, RUN_FITTED
from dse.validate.fit import POINTS_PER_FACTOR, fit_family, identified
from dse.validate.predict import _cands, predict
from dse.validate.published import load_published, published_path

NEW_FAMILIES = {"cdna3": ("mi300x", "mi325x"), "cdna4": ("mi355x",), "tpu": ("tpu-v6e", "tpu-v7")}


@pytest.fixture(scope="module")
def rows():
    with published_path().open(newline="") as f:
        return list(csv.DictReader(f))


@pytest.fixture(scope="module")
def published():
    return load_published()


@pytest.fixture(scope="module")
def fitted():
    return load_fitted()


def test_every_row_is_a_point_or_skipped_with_a_reason(rows, published):
    ids = [r["id"] for r in rows]
    points = [p.case for p in published.points]
    skipped = [s.case for s in published.skipped]
    assert len(rows) == 117 and len(points) == 99 and len(skipped) == 18
    assert not any("mlperf41" in i or "v4.1" in r["source"] for i, r in zip(ids, rows, strict=True))  # kept aside
    assert sorted(points + skipped) == sorted(ids) and not set(points) & set(skipped)
    assert all(s.reason for s in published.skipped)
    reasons = Counter(s.reason.split(":")[0].split(" '")[0] for s in published.skipped)
    assert reasons == {
        "model": 8,  # Mixtral 8x7B (4 rows) and the TPU v5e Llama-3-8B / Llama-2-7B rows (4)
        "layout not read": 2,  # MLPerf v5.0 MI325X: harness config not read
        "'Throughput (tokens/s)' may or may not count input tokens, which changes it by 20% at 500/2000 (more than "
        "10%)": 2,
        "'Throughput (tokens/s)' may or may not count input tokens, which changes it by 50% at 2048/2048 (more than "
        "10%)": 2,
        "the number of prompts and the engine's batch cap are not stated, so the batch the throughput was measured at "
        "is unknown": 2,
        "no public source for the mean input length of this data set was found": 2,  # gpt-oss-120b MLPerf v6.0
    }


def test_points_by_family_and_kind(published):
    by_family = Counter(family_of(p.system) for p in published.points)
    assert by_family == {"cdna3": 66, "cdna4": 22, "tpu": 11}
    assert Counter(p.kind for p in published.points) == {"offline": 55, "static": 44}
    assert all(p.category == ("latency" if p.kind == "static" else "serving_throughput") for p in published.points)


def _note_number(note: str, key: str) -> float | None:
    m = re.search(rf"(?<![a-z_]){key}=([0-9.]+)", note)
    return float(m.group(1)) if m else None


def test_explicit_columns_carry_the_numbers_of_the_notes(rows):
    """Every number a point uses sits in a column, and it is the number the hand-copied note gives."""
    for r in rows:
        note = r["note"]
        derived = "derived throughput_tok_s" in note
        for column, key in (("throughput_tok_s", "throughput_tok_s"), ("samples_per_s", "samples_per_s"),
                            ("mean_request_latency_s", "mean_request_latency_s"), ("num_chips", "num_chips")):
            value = _note_number(note, key)
            if value is not None and not (derived and column == "throughput_tok_s"):
                assert float(r[column]) == value, (r["id"], column)
        latency = _note_number(note, "end_to_end_latency_s") or _note_number(note, "average_latency_s")
        assert (float(r["e2e_latency_s"]) if r["e2e_latency_s"] else None) == latency, r["id"]
        if r["scenario"].startswith("mlperf"):
            assert float(r["mean_osl"]) == pytest.approx(float(r["throughput_tok_s"]) / float(r["samples_per_s"]),
                                                         abs=0.05)
            assert float(r["mean_osl"]) == pytest.approx(_note_number(note, "mean_osl"), abs=0.05)


def test_mean_lengths_follow_their_stated_sources(rows):
    for r in rows:
        if "llama2_70b" in r["id"] and r["scenario"].startswith("mlperf"):
            assert r["mean_isl"] == f"{5_463_976 / 24_576:.1f}" == "222.3"  # OpenOrca input tokens / samples
        if r["id"].startswith("tpu7_"):  # InferenceX client: uniform integers in [int(0.8 L), L]
            for col, nominal in (("mean_isl", "isl"), ("mean_osl", "osl")):
                length = int(r[nominal])
                assert float(r[col]) == (int(0.8 * length) + length) / 2
        if r["scenario"] in ("closed_loop", "static_batch") and r["id"].startswith(("mi300x", "tpu6e")):
            assert (r["mean_isl"], r["mean_osl"]) == (r["isl"], r["osl"])


def test_mlperf_server_rows_are_the_closed_loop_of_their_littles_law_mean_in_flight(rows, published):
    by_id = {r["id"]: r for r in rows}
    servers = [p for p in published.points if "server" in p.case or "interactive" in p.case]
    assert len(servers) == 26
    for p in servers:
        r = by_id[p.case]
        in_flight = float(r["samples_per_s"]) * float(r["mean_request_latency_s"]) / int(r["replicas"])
        assert p.max_batch == round(min(in_flight, int(r["batch_size"])))
        assert p.measured == pytest.approx(float(r["throughput_tok_s"]) / int(r["replicas"]))
    interactive = next(p for p in servers if p.case == "mi300x_mlperf51_llama2_70b_interactive")
    assert interactive.max_batch == 36 and interactive.tp == 1 and interactive.dp == 1  # 29.41/s x 9.717 s / 8


def test_mlperf_partner_rows_carry_the_layout_of_their_submissions_harness(rows, published):
    """Partner submissions of AMD's MLPerf harness (v5.1 MI300X/MI325X, v6.0 MI355X): every GPU one TP1 vLLM replica,
    the engine's batch cap the scenario's max_num_seqs the note copies from the submission's yaml, the source the
    submitter's own results folder; independent submitters' Offline throughputs per GPU agree within 10% per
    system (a copying error would not)."""
    partner = [r for r in rows if r["scenario"].startswith("mlperf") and "submitter " in r["note"]]
    assert len(partner) == 30
    assert Counter(r["system"] for r in partner) == {"mi355x": 18, "mi325x": 9, "mi300x": 3}
    points = {p.case: p for p in published.points}
    for r in partner:
        submitter = re.search(r"submitter (\S+),", r["note"]).group(1)
        assert f"/closed/{submitter}/results/" in r["source"], r["id"]
        assert r["tp_size"] == "1" and r["replicas"] == r["num_chips"] and r["kv_dtype"] == "fp8", r["id"]
        assert r["batch_size"] == re.search(r"max_num_seqs=(\d+)", r["note"]).group(1), r["id"]
        p = points[r["id"]]
        assert (p.tp, p.dp, p.ep) == (1, 1, 1) and p.max_batch <= int(r["batch_size"])
    offline = {}
    for r in rows:
        if r["scenario"] == "mlperf_offline" and r["catalog_model"] == "llama-2-70b" and "mlperf51open" not in r["id"]:
            offline.setdefault(r["system"], []).append(float(r["throughput_tok_s"]) / int(r["num_chips"]))
    assert {k: len(v) for k, v in offline.items()} == {"mi300x": 2, "mi325x": 5, "mi355x": 7}
    assert all(max(v) / min(v) < 1.10 for v in offline.values())


def test_tpu7_tensor_parallel_size_counts_two_tensorcores_per_chip(published):
    coder = next(p for p in published.points if p.case == "tpu7_qwen3_coder_480b_fp8_4chip_tp8ep_1k1k_c64")
    assert (coder.tp, coder.ep, coder.dp) == (4, 4, 1)  # TP8 + EP over 8 TensorCores = 4 chips
    dense = next(p for p in published.points if p.case == "tpu7_qwen3_32b_fp8_1chip_1k1k_c320")
    assert (dense.tp, dense.max_batch) == (1, 135)  # TP2 over one chip's 2 cores; 320 clients capped by max-num-seqs


@pytest.mark.parametrize(("column", "value", "message"), [
    ("throughput_tok_s", "lots", "field 'throughput_tok_s': expected a positive number, got 'lots'"),
    ("mean_isl", "-3", "field 'mean_isl': expected a positive number"),
    ("scenario", "benchmark", "field 'scenario': 'benchmark' is not one of mlperf_offline"),
    ("system", "mi400x", "field 'system': 'mi400x' is not one of"),
    ("kv_dtype", "fp6", "field 'kv_dtype': 'fp6' is not one of"),
    ("catalog_model", "llama-9", "field 'catalog_model': 'llama-9' is not a model of the catalog"),
    ("num_chips", "", "field 'num_chips': required"),
])
def test_a_malformed_file_names_file_row_and_field(tmp_path, rows, column, value, message):
    bad = [dict(r) for r in rows]
    bad[4][column] = value
    path = tmp_path / "runs.csv"
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(bad)
    with pytest.raises(InputError) as exc:
        load_published(path)
    text = str(exc.value)
    assert str(path) in text and f"row 6 (id '{rows[4]['id']}')" in text and message in text


def test_a_file_without_the_explicit_columns_or_with_a_duplicate_id_is_refused(tmp_path, rows):
    path = tmp_path / "runs.csv"
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=[c for c in rows[0] if c != "mean_isl"])
        w.writeheader()
        w.writerows({k: v for k, v in r.items() if k != "mean_isl"} for r in rows[:3])
    with pytest.raises(InputError, match=r"runs.csv: missing column\(s\) mean_isl"):
        load_published(path)
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows([rows[0], rows[0]])
    with pytest.raises(InputError, match=r"row 3 \(id 'mi300x_mlperf51_llama2_70b_offline'\): field 'id': duplicate"):
        load_published(path)


def test_the_cases_file_includes_the_published_rows():
    cases = load_cases()
    assert sum(family_of(p.system) in NEW_FAMILIES for p in cases.points) == 99
    assert sum(s.case.startswith(("mi3", "tpu")) for s in cases.skipped) == 18


def test_calibrated_predictions_never_beat_the_ideal_roofline(published):
    pts = published.points
    cal, ideal = predict(pts, None), predict(pts, IDEAL)
    throughput = np.array([p.kind == "offline" for p in pts])
    assert np.all(cal[throughput] <= ideal[throughput] * (1 + 1e-12)) and np.all(cal > 0)
    assert np.all(cal[~throughput] >= ideal[~throughput] * (1 - 1e-12))  # a latency: never shorter than ideal
    # by construction: every fitted fraction of every family lies in (0, 1] and overlap in [0, 1]
    cat = default_efficiency_catalog()
    for eff in (cat.default, *cat.families.values()):
        for name in ("compute_prefill", "compute_decode", "memory", "link", "hbm_usable"):
            assert 0 < getattr(eff, name) <= 1
        assert 0 <= eff.overlap <= 1 and eff.layer_overhead >= 0


def test_static_batch_latency_is_prefill_plus_every_decode_step():
    """Independent recomputation: the ideal latency of a static batch summed step by step over all 2,047 decode
    contexts equals the kind's midpoint rule (exact: the ideal decode step is affine in the context)."""
    pts = [p for p in load_published().points if p.case == "mi300x_amdperf_llama31_70b_fp8_tp8_latency_bs4"]
    p = pts[0]
    from dse.physics.roofline import evaluate

    cand, mt, st = _cands(pts, np.array([4.0]), np.array([128.0]), 1)
    prefill = evaluate(cand, mt, st, IDEAL, ttft=False)["step_s"][0]
    contexts = p.isl + np.arange(1, p.osl, dtype=float)
    many = replace(cand, model=np.zeros(len(contexts), dtype=int), system=np.zeros(len(contexts), dtype=int),
                   batch=np.full(len(contexts), 4.0), context=contexts, phase=0)
    decode = evaluate(many, mt, st, IDEAL, ttft=False)["step_s"].sum()
    assert predict(pts, IDEAL)[0] == pytest.approx(prefill + decode, rel=1e-9)


def test_families_group_the_amd_and_tpu_generations():
    assert family_of("mi300x") == family_of("mi325x") == "cdna3"
    assert family_of("mi355x") == "cdna4"
    assert family_of("tpu-v6e") == family_of("tpu-v7") == "tpu"
    assert family_of("tpu-v5e") is None and family_of("trn2") is None
    cat = default_efficiency_catalog()
    for fam, members in families().items():  # every family is fitted and stored with the same members
        assert fam in cat.families and {s for s, f in cat.members.items() if f == fam} == set(members)


def test_small_families_fit_only_the_factors_their_points_identify(fitted):
    doc = yaml.safe_load((hw_dir() / "efficiency.yaml").read_text())
    for fam, entry in fitted["families"].items():
        chosen = entry["fitted_factors"]
        assert len(chosen) * POINTS_PER_FACTOR <= entry["points"], fam
        runs = fitted.get("serving_runs", {}).get(fam)  # a family fitted jointly with measured serving runs
        fitted_on = f"fitted on the {entry['points']} {fam} points" + (
            f" and {runs['rows']:,} {fam} serving TPOTs: " if runs else ": ")
        for name in FITTED:
            note = doc["families"][fam]["factors"][name]["note"]
            assert (note.startswith(fitted_on) if name in chosen
                    else note.startswith(f"not identified by the {entry['points']} {fam} points")), (fam, name)
    assert fitted["families"]["cdna4"]["fitted_factors"] == ["compute_decode"]  # 4 points: FP4 decode compute
    assert "hbm_usable" not in fitted["families"]["cdna3"]["fitted_factors"]  # no cdna3 point is capacity-bound
    assert "compute_decode" not in fitted["families"]["tpu"]["fitted_factors"]  # every TPU point decodes memory-bound
    for fam in ("hopper", "blackwell"):  # the runs identify the fixed times and the kernels' curves too
        assert fitted["families"][fam]["fitted_factors"] == [*FITTED, *RUN_FITTED]  # (test_joint_calibration.py)
    cat = default_efficiency_catalog()
    for fam in NEW_FAMILIES:  # a factor not fitted keeps the global value
        for name in set(FITTED) - set(fitted["families"][fam]["fitted_factors"]):
            assert getattr(cat.families[fam], name) == getattr(cat.default, name), (fam, name)


def test_identification_never_fits_more_factors_than_half_the_points(published):
    cat = default_efficiency_catalog()
    cdna4 = [p for p in published.points if p.system == "mi355x"]
    assert identified(cdna4, cat.default) == ("compute_decode",)
    assert identified(cdna4[:3], cat.default) == ("compute_decode",)
    assert identified(cdna4[:1], cat.default) == ()


def test_stored_leave_one_out_errors_per_new_family(fitted, published):
    """The stored per-family errors are those of the stored table, and refitting each cdna4 and tpu fold from the
    stored factors gives the stored leave-one-out predictions."""
    table = [r for r in fitted["table"] if r["family"] in NEW_FAMILIES]
    assert Counter(r["family"] for r in table) == {"cdna3": 66, "cdna4": 22, "tpu": 11}
    for fam in NEW_FAMILIES:
        rows = [r for r in table if r["family"] == fam]
        entry = fitted["families"][fam]
        assert entry["points"] == len(rows)
        assert entry["median_abs_error"] == pytest.approx(np.median([abs(r["error"]) for r in rows]), abs=1e-4)
        assert entry["loo_median_abs_error"] == pytest.approx(np.median([abs(r["loo_error"]) for r in rows]),
                                                              abs=1e-4)
        assert all(abs(r["loo_error"]) >= 0 for r in rows)
    assert fitted["families"]["cdna3"]["loo_median_abs_error"] <= 0.15
    assert fitted["families"]["cdna4"]["loo_median_abs_error"] <= 0.15
    assert fitted["families"]["tpu"]["loo_median_abs_error"] <= 0.25
    cat = default_efficiency_catalog()
    stored = {r["label"]: r["loo_predicted"] for r in table}
    for fam in ("cdna4", "tpu"):
        pts = [p for p in published.points if family_of(p.system) == fam]
        for i, p in enumerate(pts):
            pool = pts[:i] + pts[i + 1:]
            eff, _, _ = fit_family(pool, cat.families[fam], max_nfev=60, at=cat.default)
            assert predict([p], eff)[0] == pytest.approx(stored[p.label], rel=0.02), p.case


def test_families_are_defined_in_the_efficiency_catalog_only(tmp_path):
    """A family added to efficiency.yaml (systems and basis, no fitted factors yet) is a family everywhere: no
    list in the code has to learn it."""
    import os
    import shutil
    import subprocess
    import sys

    from dse.catalog.hardware import hw_dir

    catalog = tmp_path / "hw"
    shutil.copytree(hw_dir(), catalog)
    text = (catalog / "efficiency.yaml").read_text()
    (catalog / "efficiency.yaml").write_text(text.rstrip("\n") + '\n  trainium:\n    systems: [trn2]\n'
                                             '    basis: "one chip, one compiler"\n    factors: {}\n')
    probe = ("from dse.catalog.calibration import families, family_of\n"
             "from dse.catalog.hardware import efficiency_for, default_efficiency\n"
             "print(family_of('trn2'), families()['trainium'], efficiency_for('trn2') == default_efficiency())")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True,
                         env={**os.environ, "DSE_HW_CATALOG": str(catalog)})
    assert out.stdout.split() == ["trainium", "('trn2',)", "True"]
    assert family_of("trn2") is None  # the embedded catalog has no such family
