"""`dse validate --cases FILE.csv`: measured serving runs (shared/data/measured_serving.csv) predicted at request
level, with leave-group-out cross-validation, errors by partition and the rows it cannot represent."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from helpers import dse

from dse.catalog.hardware import efficiency_for
from dse.validate.run import validate_file, validate_runs
from dse.validate.runs import GROUP, factor_key, map_runs, read_runs

ROOT = Path(__file__).resolve().parents[1]
MEASURED = ROOT / "hw_catalog" / "calibration" / "published" / "measured_serving.csv"


@pytest.fixture(scope="module")
def full():
    return validate_file(MEASURED)


def test_the_measured_runs_are_predicted_with_the_figures_reported(full):
    """Coverage and the leave-group-out errors as they stand on the rows that state their layout (the issue's
    goals: coverage >= 97%, TPOT <= 12%, TTFT <= 25%): the assertions pin what is reached, so a regression shows.
    Each measurement counts once (512 of the 3,113 rows repeat another row's measurement; of those listed with
    different layouts, 53 are read on the copy that states the whole layout). The 439 disaggregated measurements of
    unknown layout, the 45 whose attention TP does not divide the heads beside a stated attention DP, the 43 listed
    with conflicting layouts and the 12 that state no concurrency are reported apart (``layout_unknown``)."""
    doc = full.as_dict()
    assert doc["rows_given"] == 3113 and doc["rows_duplicate"] == 512
    assert doc["coverage"] >= 0.99  # 99.5% of the 2,601 measurements: 12 skipped, each with its reason
    assert doc["rows_layout_unknown"] == 539 and doc["rows_layout_padded"] == 45
    assert doc["rows_layout_conflicting"] == 43 and doc["rows_no_concurrency"] == 12
    assert doc["rows_failing_the_memory_check"] <= 0.1 * doc["rows_predicted"]  # a finding, reported
    by = {(e["category"], e["metric"]): e for e in doc["summary"]}
    assert {"n", "median_abs_error", "mape", "p90_abs_error", "signed_median", "loo_median_abs_error",
            "within_sweep_median_abs_error"} <= set(by[("all", "tpot")])
    assert by[("all", "tpot")]["n"] == 2050 and by[("layout_unknown", "tpot")]["n"] == 539
    # each sweep's level removed, the shape across concurrency errs far less than the level: the gap to the goals
    # is the level of whole sweeps
    assert by[("agg", "tpot")]["within_sweep_median_abs_error"] <= 0.08  # 7.3%
    assert by[("agg", "ttft")]["within_sweep_median_abs_error"] <= 0.145  # 14.1% (13.4% with stack terms per model alone)
    assert by[("all", "tpot")]["loo_median_abs_error"] <= 0.11  # 10.5%
    assert by[("agg", "tpot")]["loo_median_abs_error"] <= 0.11  # 10.5%
    # 11.1% (9.3% before the measured H100 steps entered Hopper's fit: left out, 15 of B200's SGLang DeepSeek rows
    # flip their two-batch-overlap choice, which SGLang's disaggregated sweeps on Hopper share with them)
    assert by[("disagg", "tpot")]["loo_median_abs_error"] <= 0.115
    # a decode factor set per framework errs less out of sample than one per family shared by the frameworks on
    # the aggregated rows (10.5% against 12.0%) and overall (10.5% against 11.7%); not on the 142 disaggregated
    # rows (11.1% against 8.6%)
    e = by[("agg", "tpot")]
    assert e["loo_median_abs_error"] < e["loo_family_factors_median_abs_error"] - 0.004
    e = by[("all", "tpot")]
    assert e["loo_median_abs_error"] < e["loo_family_factors_median_abs_error"]
    # TTFT by the optimizer's own physics in a closed loop through the catalog's serving stacks, where the
    # optimizer's steady state without the stack's latency and the closed loop's wave erred 84.6% (signed -83.6%)
    # (the stacks' terms per framework, mode and model; per framework and mode alone the leave-group-out TTFT errs
    # 30.6%)
    assert by[("all", "ttft")]["median_abs_error"] <= 0.205 and abs(by[("all", "ttft")]["signed_median"]) < 0.02
    assert by[("all", "ttft")]["loo_median_abs_error"] <= 0.23  # 22.5%
    assert by[("agg", "ttft")]["loo_median_abs_error"] <= 0.225  # 21.9%
    # 30.4% on 142, with disaggregated terms per model and hardware family (35.3% with terms per model alone; 26.9%
    # on 101 while the 41 whose whole layout another copy states were read apart as conflicting; 38.1% with the rows
    # beyond every closed loop read by the stack fit, `beyond_every_loop`)
    assert by[("disagg", "ttft")]["loo_median_abs_error"] <= 0.31
    # every system x mode within 35% but H200 disaggregated (42.6%, 16 measurements in two sweeps, too few for
    # Hopper terms of its own): the goal is not met there; GB200 disaggregated 31.1% (43.0% with terms per
    # model alone)
    parts = {r["system_mode"]: r for r in doc["partitions"]["system_mode"]}
    assert parts["gb200-nvl72 disagg"]["ttft_loo_median_abs_error"] <= 0.32
    assert parts["h200 disagg"]["ttft_loo_median_abs_error"] <= 0.44 and parts["h200 disagg"]["n"] == 16
    assert all(r["ttft_loo_median_abs_error"] <= 0.35 for k, r in parts.items() if k != "h200 disagg")
    # the rows of unknown layout, predicted by fits that never read them on the smallest deployment of their
    # worker sizes, are over-predicted (their deployments were larger)
    assert by[("layout_unknown", "tpot")]["signed_median"] > 0.5
    # the calibrated physics beats the ideal roofline on what it was calibrated for
    assert by[("all", "tpot")]["median_abs_error"] < by[("all", "tpot")]["ideal_median_abs_error"]
    assert set(doc["partitions"]) == {"system_mode", "model", "backend", "mode", "isl_osl", "concurrency_band",
                                      "layout"}
    layouts = {r["layout"]: r["n"] for r in doc["partitions"]["layout"]}
    assert layouts == {"stated": 2050, "unknown": 439, "padded": 45, "conflicting": 43, "no_concurrency": 12}
    t = full.table
    stated_disagg = t[(t["mode"] == "disagg") & (t["layout"] == "stated")]
    # a disaggregated closed loop's decode batch follows the predicted TTFT, so the prefill physics and the wave
    # move these rows' decode passes
    assert stated_disagg["tpot_loo_error"].abs().median() <= 0.115  # 11.1% (9.3% before the H100 steps)
    # the shipped physics (the catalog's factors, fitted jointly on these runs where the workers are stated, and
    # on offline throughput): 13.1% on the stated rows
    t = full.table
    assert t[t["layout"] == "stated"]["tpot_error"].abs().median() <= 0.14
    # leave-family-out per family: Hopper's TPOT 20.9% (its rows predicted by factors fitted on Blackwell's)
    fams = {r["family"]: r for r in doc["families"]}
    assert set(fams) == {"hopper", "blackwell"}
    for r in fams.values():
        assert r["tpot_lfo_median_abs_error"] >= r["tpot_loo_median_abs_error"] - 1e-9
    # the decode factors keep their meaning: shares of a peak in (0, 1], latencies and overheads positive
    for f in full.scales["tpot"].values():
        assert all(0 < v <= 1 for k, v in f["fitted"].items() if k in ("compute_decode", "memory", "link"))
        assert all(v >= 0 for v in f["fitted"].values())
    assert doc["worst"]["tpot"]
    assert doc["skipped"]["count"] == doc["rows_given"] - doc["rows_duplicate"] - doc["rows_predicted"]


def test_the_stored_serving_stacks_are_the_fit_on_these_runs():
    """calibration/serving_stack.yaml is its own fixed point: the terms refitted in sample on the stated rows of the
    catalog's measured runs, at the catalog's factors, are the stored ones, framework by framework, mode by mode and,
    where a model has terms of its own, model by model, and family by family where a model has them on one
    (disaggregated, DeepSeek-V3 on Blackwell with SGLang and TensorRT-LLM; aggregated, 19 models' on Hopper, Blackwell
    or CDNA3)."""
    from dse.catalog.frameworks import stack_of
    from dse.validate.runs import catalog_runs_files

    full = validate_file(catalog_runs_files())  # the files `dse validate --fit` fits the stacks on
    keys = set(full.scales["ttft"])
    assert keys >= {f"{fw}|{m}" for fw in ("sglang", "trtllm", "vllm") for m in ("agg", "disagg")}
    assert {"trtllm|agg|deepseek-v3", "trtllm|agg|llama-3.1-70b", "vllm|agg|minimax-m2.5"} <= keys
    checked = 0
    for key, f in full.scales["ttft"].items():
        fw, *rest = key.split("|")
        if not rest:  # the framework's terms over all its modes: stored as a mode's only where it has none of its own
            continue
        stack = stack_of(fw, rest[1] if len(rest) >= 2 and rest[1] else None)  # "": the framework's on a family
        mode = "aggregated" if rest[0] == "agg" else "disaggregated"
        stored = stack.terms_of(mode, rest[2]) if len(rest) == 3 else stack.terms(mode)
        assert (f["queue_share"], f["fixed_latency_s"]) == pytest.approx((stored.queue_share, stored.fixed_latency_s))
        checked += 1
    assert checked >= 6 + 19
    assert {"sglang|disagg|deepseek-v3|blackwell", "trtllm|disagg|deepseek-v3|blackwell",
            "sglang|agg|deepseek-v3|cdna3", "sglang|agg|deepseek-v3|hopper"} <= keys


def test_a_ttft_that_falls_with_load_is_predicted_but_not_fitted(full):
    """A measurement over twice the TTFT of its deployment at a higher concurrency contradicts every closed loop (the
    physics' TTFT rises with the load): the stack fit does not read it (10 of the 2,050 rows that state their layout,
    two disaggregated: 38.6 s on GB200 at 4 in flight where 36 measure 10.9 s), yet it is predicted and judged as
    every row is, and a sweep of its key left out is predicted by terms fitted without it."""
    from dse.validate.stack import FALLING_TTFT, falls_with_load, stack_rows

    t = full.table[full.table["layout"] == "stated"]
    out = falls_with_load(t)
    assert out.sum() == 10 and not (stack_rows(t) & out).any()
    flagged = t[out]
    assert flagged["id"].str.endswith("_c4_cfg378").sum() == 1 and (flagged["mode"] == "disagg").sum() == 2
    assert flagged["ttft_loo_error"].notna().all() and flagged["ttft_in_sample_error"].notna().all()
    # each flagged row has a higher concurrency of its deployment measuring under half its TTFT
    for _, r in flagged.iterrows():
        same = t[(t["system"] == r["system"]) & (t["backend"] == r["backend"]) & (t["model"] == r["model"])
                 & (t["isl"] == r["isl"]) & (t["osl"] == r["osl"]) & (t["tp"] == r["tp"]) & (t["dp"] == r["dp"])
                 & (t["p_replicas"].fillna(0) == (0 if pd.isna(r["p_replicas"]) else r["p_replicas"]))]
        higher = same[same["concurrency"] > r["concurrency"]]
        assert (r["measured_ttft_s"] > FALLING_TTFT * higher["measured_ttft_s"]).any()
    key = full.scales["ttft"]["trtllm|disagg|deepseek-v3"]
    rows = ((t["backend"] == "trtllm") & (t["mode"] == "disagg") & (t["model"] == "deepseek-v3")).to_numpy()
    assert key["rows"] == (rows & stack_rows(t)).sum() == rows.sum() - 9  # 2 falling with load, 9 beyond every loop


def test_a_ttft_beyond_every_closed_loop_is_predicted_but_not_fitted(full):
    """A measurement over twice the longest TTFT any stack terms give it (its prefill, the whole wave of the other
    requests in flight ahead of it or the saturated loop's wait, its hand-off and the grid's longest fixed latency)
    is no state of a closed loop: the stack fit does not read it (35 of the 2,050 rows that state their layout, 9 of
    them disaggregated), yet it is predicted and judged as every row is. Recomputed here from the physics' own
    closed loop at the top of both grids."""
    from dse.catalog.frameworks import StackTerms
    from dse.physics.serving import closed_loop_ttft
    from dse.validate.fit import FIXED_LATENCIES, QUEUE_SHARES
    from dse.validate.predict import outside_stack
    from dse.validate.stack import FALLING_TTFT, beyond_every_loop, stack_rows

    t = full.table[full.table["layout"] == "stated"]
    out = beyond_every_loop(t)
    longest = closed_loop_ttft(t["prefill_s"].to_numpy(), outside_stack(t), t["wave_s"].to_numpy(),
                               StackTerms(fixed_latency_s=FIXED_LATENCIES.max(), queue_share=QUEUE_SHARES.max()),
                               t["wait_floor_s"].to_numpy())
    assert (out == (t["measured_ttft_s"].to_numpy() > FALLING_TTFT * longest)).all()
    assert out.sum() == 35 and (t[out]["mode"] == "disagg").sum() == 9
    assert not (stack_rows(t) & out).any()
    assert t[out]["ttft_loo_error"].notna().all() and t[out]["ttft_in_sample_error"].notna().all()
    # every one of them is under-predicted: the physics cannot reach what the benchmark measured
    assert (t[out]["ttft_in_sample_error"] < -0.5).all()


def test_a_calibrated_decode_step_is_never_faster_than_the_roofline(full):
    """The catalog's factors, and the decode factors refitted in sample and without each sweep (shares of a
    peak at most 1, latencies at least 0), never predict a TPOT below the ideal roofline's at the same operating
    point (a run its framework admits in part runs, ideal or not, the batch admitted)."""
    t = full.table
    assert (t["predicted_tpot_s"] >= t["ideal_tpot_s"] * (1 - 1e-9)).all()
    assert (t["measured_tpot_s"] * (1 + t["tpot_in_sample_error"]) >= t["ideal_tpot_s"] * (1 - 1e-9)).all()
    # a left-out sweep is predicted on the pass its framework's two-batch choice without it takes
    assert (t["measured_tpot_s"] * (1 + t["tpot_loo_error"]) >= t["ideal_tpot_loo_s"] * (1 - 1e-9)).all()


def test_the_ideal_ttft_is_the_engine_alone(full):
    """The ideal roofline's TTFT carries no serving-stack term (as `--ideal` has it): the calibrated prediction is
    above it by at least the row's stack fixed latency (its model's on its hardware family where the fit has one), and
    few runs (under 3%) measure faster than it."""
    from dse.catalog.calibration import family_of
    from dse.catalog.frameworks import stack_of

    t = full.table
    tau = np.array([stack_of(fw, md).terms_of("aggregated" if mode == "agg" else "disaggregated",
                                              family_of(system)).fixed_latency_s
                    for fw, md, mode, system in zip(t["backend"], t["model"], t["mode"], t["system"], strict=True)])
    assert (t["predicted_ttft_s"] - t["ideal_ttft_s"] >= tau * (1 - 1e-9) - 1e-12).all()
    assert (t["measured_ttft_s"] < t["ideal_ttft_s"]).mean() < 0.03


@pytest.mark.parametrize("metric", ["tpot", "ttft"])
def test_leave_group_out_never_sees_the_sweep_it_predicts(metric):
    """A synthetic sweep measured 3x slower than all others: in sample its fit is shared with the rest, and
    leaving its group out cannot learn its offset (its error stays large), while the others are centred."""
    raw = read_runs(MEASURED)
    runs = map_runs(raw[raw["model_path"] == "Qwen/Qwen3-32B"])
    t = runs.table
    groups = t[list(GROUP)].astype(str).agg("|".join, axis=1)
    first = groups == groups.iloc[0]
    t.loc[first, f"measured_{metric}_s"] *= 3.0
    v = validate_runs(runs)
    odd = v.table.loc[first, f"{metric}_loo_error"].abs().median()
    rest = v.table.loc[~first, f"{metric}_loo_error"].abs().median()
    # most of the offset log 3 stays unexplained (an error of -0.4 leaves log 1.8 of log 3)
    assert odd > 0.4 and rest < odd and odd >= v.table.loc[first, f"{metric}_in_sample_error"].abs().median()


def test_the_stack_fit_recovers_planted_terms_through_the_optimizers_physics():
    """Measured TTFTs made by the request-level physics itself in a closed loop through planted serving stacks
    (queue share 0.2 of the wave, fixed latency 150 ms, every framework and mode): the fit finds them, in sample
    and with each sweep left out, and the errors vanish; a row's prediction is the optimizer's `aggregated` at the
    row's concurrency, nothing fitted beside it."""
    from dse.catalog.frameworks import Stack, StackTerms, stack_of
    from dse.physics.serving import Request, aggregated
    from dse.validate.predict import predict_runs, run_candidates, run_tables

    raw = read_runs(MEASURED)
    runs = map_runs(raw[raw["model_path"].isin(["Qwen/Qwen3-32B", "openai/gpt-oss-120b"])])
    t = runs.table
    terms = StackTerms(fixed_latency_s=0.15, queue_share=0.2)
    planted = {fw: Stack(fw, terms, terms) for fw in set(t["backend"])}
    t["measured_ttft_s"] = predict_runs(t, stacks=planted)["predicted_ttft_s"].astype(float)
    v = validate_runs(runs)
    assert v.scales["ttft"] and all(f["queue_share"] == pytest.approx(0.2) and f["fixed_latency_s"] ==
                                    pytest.approx(0.15) for f in v.scales["ttft"].values())
    # exact wherever the wave, not a saturated prefill pool, sets the wait (a saturated disaggregated loop's wait
    # follows its decode batch, which the queue share moves: there the pieces are the catalog's terms'), on the
    # rows that have fitted terms (`stack_key_of`: a row of unknown layout whose framework no stated row has takes
    # none: the physics' prefill, wait floor and hand-off alone)
    from dse.validate.fit import stack_key_of

    tv = v.table
    fitted = np.array([stack_key_of(v.scales["ttft"], f, m, md) is not None
                       for f, m, md in zip(tv["backend"], tv["mode"], tv["model"], strict=True)])
    # a row whose concurrency its KV pool does not hold waits in the framework's admission queue, its wait taken at
    # the catalog's terms' rate (`dse.validate.predict.admitted`): not exact under other terms, so left out here
    wave_sets = (tv["wait_floor_s"] <= 0.2 * tv["wave_s"]) & (tv["admission_s"] == 0)
    assert wave_sets.mean() > 0.97  # 97.8% of the 551 measurements (98.3% counting the copies of some twice)
    assert tv.loc[wave_sets & fitted, "ttft_in_sample_error"].abs().max() < 1e-9
    assert tv.loc[wave_sets & fitted, "ttft_loo_error"].abs().max() < 1e-9
    alone = tv[~fitted]
    assert np.allclose(alone["ttft_loo_s"], alone["prefill_s"] + np.maximum(alone["wait_floor_s"], 0.0)
                       + alone["transfer_s"] + alone["admission_s"], rtol=1e-12)
    # the shipped prediction of an aggregated row is the optimizer's physics at the row's concurrency
    row = t[t["mode"] == "agg"].iloc[[0]]
    models, systems, mt, st = run_tables(row, None, row["backend"].iloc[0])
    req = Request(int(row["isl"].iloc[0]), int(row["osl"].iloc[0]), arrival="concurrency",
                  stack=stack_of(row["backend"].iloc[0], row["model"].iloc[0]))
    cand = run_candidates(row, models, systems, "", row["in_flight"].to_numpy() / row["pp"].to_numpy(),
                          int(row["isl"].iloc[0] + row["osl"].iloc[0]))
    direct = aggregated(cand, mt, st, req)  # one micro-batch: the pass TTFT's prediction is read off
    assert v.table.loc[row.index, "predicted_ttft_s"].iloc[0] == pytest.approx(direct["ttft_s"][0], rel=1e-12)


def test_cli_reads_a_subset_and_writes_the_report(tmp_path):
    raw = pd.read_csv(MEASURED)
    sub = tmp_path / "some.csv"
    raw.iloc[::25].to_csv(sub, index=False)
    out = tmp_path / "rep"
    r = dse("validate", "--cases", str(sub), "--out", str(out), "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["rows_given"] == len(raw.iloc[::25]) and doc["coverage"] > 0.9
    for name in ("validate_runs.csv", "summary.json", "scatter_ttft.png", "scatter_tpot.png", "report.html"):
        assert (out / name).stat().st_size > 0
    html = (out / "report.html").read_text()
    assert "data:image/png;base64," in html and "Error by system mode" in html and "Worst rows" in html


def test_rows_it_cannot_represent_are_counted_with_the_reason(tmp_path):
    raw = pd.read_csv(MEASURED).head(6).copy()
    raw.loc[0, "model_path"] = "acme/Unknown-7B"
    raw.loc[1, "system"] = "tpu_v9"
    raw.loc[2, "gemm_quant_mode"] = "int8_wo"
    path = tmp_path / "odd.csv"
    raw.to_csv(path, index=False)
    doc = validate_file(path).as_dict()
    reasons = " | ".join(doc["skipped"]["by_reason"])
    assert doc["rows_predicted"] == 3 and doc["skipped"]["count"] == 3
    assert "acme/Unknown-7B" in reasons and "'tpu_v9' is not in the catalog" in reasons and "'int8_wo' is not" in reasons


@pytest.mark.parametrize(("edit", "message"), [
    (lambda d: d.drop(columns=["silicon_tpot_ms"]), "missing column(s) silicon_tpot_ms"),
    (lambda d: d.assign(isl=["long"] + list(d["isl"].iloc[1:])), "row 2 (id "),
    (lambda d: d.assign(concurrency=[-4.0] + list(d["concurrency"].iloc[1:])), "column 'concurrency': must be"),
])
def test_a_malformed_csv_exits_2_naming_the_file_and_column(tmp_path, edit, message):
    path = tmp_path / "bad.csv"
    edit(pd.read_csv(MEASURED).head(4)).to_csv(path, index=False)
    out = tmp_path / "out"
    r = dse("validate", "--cases", str(path), "--out", str(out))
    assert r.returncode == 2 and str(path) in " ".join(r.stderr.split()) and message in " ".join(r.stderr.split())
    assert "Traceback" not in r.stderr and not out.exists()


def test_closed_loop_of_a_disaggregated_deployment_obeys_littles_law():
    """lambda (TTFT + (O - 1) TPOT) = C at the solved rate, TTFT in the engine (the stack's fixed latency outside
    it); more requests in flight, a longer wave and a longer TTFT: S + xi (n - 1) S + transfer + tau."""
    from dse.catalog.frameworks import Stack, StackTerms
    from dse.physics.serving import Request, disaggregated_closed_loop

    terms = StackTerms(fixed_latency_s=0.2, queue_share=0.3)
    req = Request(4000, 500, arrival="concurrency", stack=Stack("vllm", terms, terms))
    dec = {"tpot_s": np.array([0.02, 0.02, 0.02])}
    pre = {"prefill_service_s": np.array([0.3, 0.3, 0.3]), "servers": np.array([8.0, 8.0, 8.0]),
           "kv_transfer_s": np.array([0.01, 0.01, 0.01]),  # the pool's stack terms, as `prefill_pool` gives them
           "stack_latency_s": np.full(3, terms.fixed_latency_s), "queue_share": np.full(3, terms.queue_share)}
    c = np.array([8.0, 64.0, 512.0])
    r = disaggregated_closed_loop(dec, pre, req, c, np.ones(3))
    np.testing.assert_allclose(r["requests_per_s"] * (r["ttft_s"] - 0.2 + 499 * 0.02), c, rtol=1e-9)
    wave = 0.3 * np.maximum(c / 8 - 1, 0) * 0.3
    saturated = c * 0.3 / 8 - 0.3 - 0.01 - 499 * 0.02  # the prefill servers busy all the time: rho = 1
    np.testing.assert_allclose(r["ttft_s"], 0.3 + np.maximum(wave, saturated) + 0.01 + 0.2, rtol=1e-12)
    assert saturated[-1] > wave[-1] and r["prefill_rho"][-1] == pytest.approx(1.0)
    assert (np.diff(r["ttft_s"]) > 0).all() and (r["prefill_rho"] <= 1 + 1e-12).all()


def test_two_batch_overlap_is_found_in_the_frameworks_whose_runs_it_made():
    """TPOTs made by the physics itself, with the decode passes split into two overlapped micro-batches for
    SGLang and not for the others: the choice per (framework, mode) finds exactly that, in sample and for every
    sweep left out, and every error then vanishes. On the real runs no framework's errors shrink with the
    split (its second weight read costs more than the communication it hides), so it is off everywhere."""
    from dse.validate.predict import predict_runs

    raw = read_runs(MEASURED)
    runs = map_runs(raw[raw["model_path"].isin(["deepseek-ai/DeepSeek-R1", "MiniMaxAI/MiniMax-M2.5"])])
    runs.table = runs.table[runs.table["layout"] == "stated"]  # the rows the fits read
    t = runs.table
    sglang = (t["backend"] == "sglang").to_numpy()
    made_split = sglang & (t["ep"] > 1).to_numpy()  # only a pass with an expert all-to-all has one to hide
    t["measured_tpot_s"] = np.where(made_split, predict_runs(t, two_batch=True)["predicted_tpot_s"].astype(float),
                                    predict_runs(t)["predicted_tpot_s"].astype(float))
    v = validate_runs(runs)
    split = {k for k, on in v.scales["two_batch_overlap"].items() if on}
    eligible = {f"sglang|{m}" for m in t.loc[sglang & (t["ep"] > 1).to_numpy(), "mode"]}
    assert eligible and split == eligible
    assert (v.table["two_batch"] == (sglang & (t["ep"] > 1).to_numpy())).all()
    assert v.table["tpot_in_sample_error"].abs().max() < 1e-9
    assert v.table.loc[made_split, "tpot_loo_error"].abs().max() < 1e-9
    assert v.table["tpot_loo_error"].abs().quantile(0.85) < 1e-9


def test_on_the_runs_that_state_their_layout_no_decode_is_split(full):
    """With a decode factor set per family and framework, the runs that state their layout switch two-batch
    overlap on for no framework and mode. (With the 583 disaggregated rows of unknown layout in the fits, each
    class with its own factors, TRT-LLM's disaggregated decode was split: a choice made by rows whose deployment
    was guessed.)"""
    chosen = full.scales["two_batch_overlap"]
    assert len(chosen) > 1 and not any(chosen.values())
    assert not full.table["two_batch"].any()


def test_an_attention_tp_that_does_not_divide_the_heads(tmp_path):
    """DeepSeek-V3 has 128 heads: TP36 is no attention layout a framework documents (dse evaluate refuses it).
    With attention DP left empty the 36 chips ran attention DP (stated); with attention DP stated as 1 the row
    is read as stated with the heads padded (``padded``: the busiest rank computes ceil(128 / 36) = 4 heads, as
    on TP32) and reported apart (no fit reads it)."""
    from dse.validate.predict import predict_runs

    raw = pd.read_csv(MEASURED)
    row = raw[(raw["model_path"] == "deepseek-ai/DeepSeek-R1") & (raw["mode"] == "agg")
              & (raw["moe_ep_size"] == 8) & (raw["tp_size"] == 8) & raw["concurrency"].notna()].head(1)
    stated = row.assign(tp_size=36.0, attention_dp_size=1.0, moe_tp_size=1.0, moe_ep_size=36.0)
    # another run (its own TPOT): one measurement listed twice with two layouts would be read once, `conflicting`
    silent = stated.assign(attention_dp_size=np.nan, id="silent", silicon_tpot_ms=stated["silicon_tpot_ms"] * 1.01)
    path = tmp_path / "heads.csv"
    pd.concat([stated, silent]).to_csv(path, index=False)
    runs = map_runs(read_runs(path))
    assert runs.skipped == []
    assert runs.table[["tp", "dp", "ep", "etp"]].to_numpy().tolist() == [[36, 1, 36, 1], [1, 36, 36, 1]]
    assert runs.table["layout"].tolist() == ["padded", "stated"]
    assert np.isfinite(predict_runs(runs.table)["predicted_tpot_s"].astype(float)).all()
    # the busiest rank's attention: TP36 splits it as TP32 does (4 heads each), TP64 as TP64, TP8 as TP8
    from dse.catalog.hardware import get_system
    from dse.catalog.models import get_model
    from dse.physics.roofline import Candidates, ModelTable, SystemTable, _Gathered
    mt, st = ModelTable.build([get_model("deepseek-v3")]), SystemTable.build([get_system("gb200-nvl72")])
    tp = np.array([36, 32, 64, 8, 72])
    one = np.ones_like(tp)
    c = Candidates(model=0 * one, system=0 * one, tp=tp, dp=one, ep=tp, etp=one, pp=one, batch=8 * one,
                   context=1024 * one).broadcast()
    g = _Gathered(c, mt, st, st.efficiency_of(np.asarray(c.system)))
    assert g.attn_split.tolist() == [32.0, 32.0, 64.0, 8.0, 64.0]


def test_a_queued_prompt_costs_its_share_of_a_full_chunk():
    """Prompts queued together are prefilled together: each costs a pass carrying floor(K / P') of them divided by
    that count, never more than one prompt's pass alone (weights, fixed latencies and overhead shared) and
    never less than its own FLOPs at the chip's rate (the GEMMs' half-performance rows are paid once per pass,
    shared too); a prompt that fills the chunk costs its own pass."""
    from dataclasses import replace

    from dse.catalog.hardware import get_system
    from dse.catalog.models import get_model
    from dse.catalog.units import DTYPES
    from dse.physics.roofline import Candidates, ModelTable, SystemTable
    from dse.physics.serving import Request, _passes, prefill_pool, prompts_per_chunk

    mt, st = ModelTable.build([get_model("deepseek-v3")]), SystemTable.build([get_system("b200")])
    fp8 = DTYPES.index("fp8")
    cand = Candidates(model=0, system=0, tp=np.array([8, 1, 8]), dp=np.array([1, 8, 1]), ep=np.array([8, 8, 1]),
                      etp=np.array([1, 1, 8]), pp=1, batch=1.0, context=1024, weights_dtype=fp8, kv_dtype=fp8)
    short, long = Request(1024, 1024), Request(8192, 1024)
    assert prompts_per_chunk(short) == 8 and prompts_per_chunk(long) == 1
    pre = prefill_pool(cand, mt, st, short, full_chunk=True)
    alone = _passes(cand.broadcast(), mt, st, st.efficiency_of(np.asarray(cand.broadcast().system)), short,
                    prefill=True, decode=False)["prefill"]
    assert (pre["chunk_share_s"] < pre["prefill_service_s"]).all()
    assert (pre["chunk_share_s"] >= (alone["compute_s"] - alone["gemm_fixed_s"]) * (1 - 1e-12)).all()
    full = prefill_pool(replace(cand, context=8192), mt, st, long, full_chunk=True)
    assert np.allclose(full["chunk_share_s"], full["prefill_service_s"], rtol=1e-12)
    assert "chunk_share_s" not in prefill_pool(cand, mt, st, short)  # the search does not pay for the extra pass


def test_rows_of_unknown_layout_calibrate_nothing_and_are_predicted_apart():
    """Measured TPOTs and TTFTs made by the physics, 20% faster on the rows whose worker counts the file leaves
    empty (as a larger deployment than the smallest one would be): the rows that state their layout keep the
    catalog's factors (every error vanishes), and the others, read by no fit, are predicted by those factors
    (their error is the 25% they were made off by), reported apart from the headline. A factor the stated rows do
    not identify (the roofline of a pass's attention kernels whose other side binds on every stated row) stays
    where the fit leaves it: 10 of the 565 rows of unknown layout (H200 TensorRT-LLM TP8 EP8) then err within 2.7%
    of their 25% (6 within 1.1% while memory checks took the nominal 141 GB, not the 141 GiB the device reports, with
    vLLM's reserve one figure for every model: where the fit leaves that factor moved with them)."""
    from dse.catalog.frameworks import StackTerms
    from dse.physics.serving import closed_loop_ttft
    from dse.validate.predict import predict_runs
    from dse.validate.report import summary

    raw = read_runs(MEASURED)
    runs = map_runs(raw[(raw["mode"] == "disagg") & raw["model_path"].str.startswith("deepseek-ai/")])
    t = runs.table
    unknown = t["layout"] == "unknown"
    assert unknown.any() and (~unknown).any()
    assert (t.loc[unknown, ["replicas", "p_replicas"]] == 1).all().all()  # the smallest deployment
    p = predict_runs(t)
    t["measured_tpot_s"] = p["predicted_tpot_s"].astype(float) * np.where(unknown, 0.8, 1.0)
    # TTFT through a stack with no latency and no queue share: the prefill, the saturated loop's wait, the hand-off
    pieces = (p[c].to_numpy(dtype=float) for c in ("prefill_s", "transfer_s", "wave_s", "wait_floor_s"))
    service, transfer, wave, floor = pieces
    t["measured_ttft_s"] = closed_loop_ttft(service, transfer, wave, StackTerms(fixed_latency_s=0.0, queue_share=0.0), floor) * np.where(
        unknown, 0.8, 1.0)
    v = validate_runs(runs)
    err = v.table["tpot_in_sample_error"]
    apart = (err[unknown] - 0.25).abs()
    stated = t["layout"] == "stated"
    assert err[stated].abs().max() < 1e-9 and (apart < 1e-9).mean() > 0.98 and apart.max() < 0.027
    # every DeepSeek disaggregated measurement listed again with less of its layout is read on the copy that states it
    # whole: none is left `conflicting`
    assert (unknown | stated).all()
    loo = (v.table.loc[unknown, "tpot_loo_error"] - 0.25).abs()
    assert (loo < 1e-9).mean() > 0.98 and loo.max() < 0.027
    assert np.allclose(v.table.loc[unknown, "ttft_loo_error"], 0.25, atol=1e-9)
    for key, f in v.scales["tpot"].items():
        catalog = efficiency_for(v.table.loc[factor_key(v.table) == key, "system"].iloc[0])
        # fitted, or held at the catalog's value where the rows do not free it (`dse.validate.fit.fit_key`)
        assert {**f["fitted"], **f["kept_from_catalog"]}["memory"] == pytest.approx(catalog.memory, rel=1e-6)
    cats = {(e["category"], e["metric"]): e for e in summary(v)}
    assert cats[("all", "tpot")]["n"] == stated.sum() and cats[("layout_unknown", "tpot")]["n"] == (~stated).sum()
    assert cats[("all", "tpot")]["loo_median_abs_error"] < 1e-9


def test_the_split_passes_predicted_with_the_unsplit_ones_are_their_own():
    """`predict_runs_split` evaluates every row unsplit and the expert-parallel rows split in one pass of the
    physics: each prediction equals, to the last bit, the one `predict_runs` makes of the rows alone."""
    from dse.validate.predict import predict_runs, predict_runs_split

    t = map_runs(read_runs(MEASURED).iloc[::7]).table
    split = (t["ep"] > 1).to_numpy()
    assert split.any() and not split.all() and {"agg", "disagg"} <= set(t["mode"])
    one, two = predict_runs_split(t, split)
    pd.testing.assert_frame_equal(one, predict_runs(t), check_exact=True)
    pd.testing.assert_frame_equal(two, predict_runs(t[split], two_batch=True), check_exact=True)


def test_the_stack_fit_per_cell_is_the_grid_argmin_written_out():
    """`fit_stack_sets` sums the rows' grid errors per cell; written out here as the mean |log error| of every
    (xi, tau) over the training rows of each fit (and of each left-out group), its terms and predictions are the
    argmin's, for two partitions at once, at each level of `stack_levels` (a model's own terms in a mode on a
    hardware family where its training rows there span two groups; a model's own terms where they span two groups,
    else its framework and mode's, else its framework's; a system of no family skips the family's level)."""
    from dse.catalog.frameworks import StackTerms
    from dse.physics.serving import closed_loop_ttft
    from dse.validate.fit import FIXED_LATENCIES, MIN_SWEEPS, QUEUE_SHARES, fit_stack_sets, stack_families

    rng = np.random.default_rng(3)
    n = 90
    t = pd.DataFrame({"backend": rng.choice(["sglang", "vllm"], n), "mode": rng.choice(["agg", "disagg"], n),
                      "model": rng.choice(["m1", "m2", "m3"], n, p=[0.6, 0.35, 0.05]),
                      "system": rng.choice(["h200", "b200", "gb200-nvl72", "no-family-chip"], n),
                      "prefill_s": rng.uniform(0.05, 0.5, n), "transfer_s": rng.uniform(0, 0.02, n),
                      "wave_s": rng.uniform(0, 2, n), "wait_floor_s": rng.uniform(0, 0.3, n)})
    t["measured_ttft_s"] = t["prefill_s"] + 0.3 * t["wave_s"] + 0.1 + rng.normal(0, 0.05, n) ** 2
    sweeps = pd.Series(rng.choice(list("abcdef"), n))
    halves = pd.Series(rng.choice(["x", "y"], n))
    train = rng.random(n) < 0.8
    got = fit_stack_sets(t, [sweeps, halves], train)
    cols = [t[c].to_numpy() for c in ("prefill_s", "transfer_s", "wave_s")]
    fam = stack_families(t)
    assert set(fam) == {"hopper", "blackwell", ""}

    def argmin(rows: np.ndarray) -> tuple[float, float]:  # every (xi, tau) of the grids, the first least
        xi, tau = QUEUE_SHARES[:, None, None], FIXED_LATENCIES[None, :, None]
        s, k, w, floor = (t[c].to_numpy()[rows] for c in ("prefill_s", "transfer_s", "wave_s", "wait_floor_s"))
        pred = s + np.maximum(xi * w, floor) + k + tau
        err = np.abs(np.log(pred / t["measured_ttft_s"].to_numpy()[rows])).sum(axis=-1)
        i, j = divmod(int(np.argmin(err)), len(FIXED_LATENCIES))
        return float(QUEUE_SHARES[i]), float(FIXED_LATENCIES[j])

    fw, mode, model = t["backend"].to_numpy(), t["mode"].to_numpy(), t["model"].to_numpy()
    levels_used = set()
    for groups, (fits, in_sample, loo) in zip((sweeps, halves), got, strict=True):
        g = groups.to_numpy()
        for f, m, md, fa in set(zip(fw, mode, model, fam, strict=True)):
            masks = [train & (fw == f) & (mode == m) & (model == md), train & (fw == f) & (mode == m),
                     train & (fw == f)]
            keys = [f"{f}|{m}|{md}", f"{f}|{m}", f]
            if fa:  # the model's own on the family first, the framework's on the family after the model's own
                masks = [masks[0] & (fam == fa), masks[0], masks[1] & (fam == fa), *masks[1:]]
                keys = [f"{f}|{m}|{md}|{fa}", keys[0], f"{f}|{m}||{fa}", *keys[1:]]
            own = [k for k, r in enumerate(masks) if k == len(masks) - 1 or len(np.unique(g[r])) >= MIN_SWEEPS]
            levels_used.add((keys[own[0]].count("|"), "||" in keys[own[0]]))
            fit_rows = masks[own[0]]
            terms = fits[keys[own[0]]]["terms"]
            assert (terms.queue_share, terms.fixed_latency_s) == argmin(fit_rows)
            rows = (fw == f) & (mode == m) & (model == md) & (fam == fa)
            for name in np.unique(g[rows]):
                mine = rows & (g == name)
                rest = next(r for r in (masks[k] & (g != name) for k in own) if r.any())
                xi, tau = argmin(rest)
                expected = closed_loop_ttft(*(c[mine] for c in cols), StackTerms(queue_share=xi, fixed_latency_s=tau),
                                            t["wait_floor_s"].to_numpy()[mine])
                assert np.allclose(loo[mine], expected, rtol=1e-12)
            assert np.all(np.isfinite(in_sample[rows]))
    # models with terms of their own on a family, of their own, that take their framework's on the family, and
    # that take their framework and mode's
    assert levels_used >= {(3, False), (2, False), (3, True)}
