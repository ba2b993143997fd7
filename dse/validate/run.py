"""The two validations of `dse validate`: the published points predicted with the catalog's factors
(`run_validation`), and measured serving runs predicted at request level and cross-validated
(`validate_file`).

Errors are predicted / measured - 1 of the median TTFT and TPOT. Rows of one (model, system, framework,
mode, ISL, OSL) group are one concurrency sweep and are correlated, so the headline figure leaves whole
groups out and predicts the group left out from fits on the others:

- TPOT: two-batch overlap switched on per (framework, mode) where it lowers that framework's spread of errors
  (`dse.validate.fit.choose_two_batch`: the data, not a list of framework features, decide; on the measured
  runs, TRT-LLM's disaggregated decode), then the decode pass's nine efficiency factors (`dse.validate.decode`,
  `dse.validate.factors`: achieved shares of peak compute, HBM and link bandwidth, latency per collective inside
  and across domains, fixed time per layer and per MoE layer, a GEMM's half-performance rows and decode
  attention's half-performance context) fitted per hardware family and framework on the rows' decode passes,
  apart for the disaggregated rows whose worker counts were assumed (`factor_key`); the left-out sweep is
  predicted with the factors refitted without it. A factor set per framework is there because the data demand
  it: one per family shared by the frameworks (`family_key`, as the catalog's `dse validate --fit` has it) errs
  more out of sample (``loo_family_factors_median_abs_error``).
- TTFT: the optimizer's request-level physics (`dse.physics.serving`) in a closed loop at the row's concurrency
  (``arrival: concurrency``: a benchmark holds a fixed number of requests in flight, each replaced as it
  completes, not the Poisson arrivals of production traffic) through the row's framework's serving stack: one
  prompt's prefill, plus the wait in the wave of the other requests in flight at its prefill server (a queue share
  xi of (n - 1) prompts, each at its share of a pass carrying a full chunk of prompts; `dse.physics.queueing`),
  plus the KV hand-off (disaggregated), plus the stack's fixed latency tau. The shipped terms (xi, tau) per
  framework and mode are the catalog's (hw_catalog/calibration/serving_stack.yaml, fitted by `dse validate --fit`
  on the rows with stated layouts); the leave-group-out prediction refits them without the row's sweep
  (`dse.validate.fit.fit_stack`; TTFT is affine in (xi, tau), `dse.physics.serving.closed_loop_ttft`). Measured
  TTFT grows nearly linearly with the concurrency in most sweeps (R^2 > 0.9 in most of the 286 aggregated sweeps
  with 4 or more concurrencies), at a slope of a fraction of one prompt's prefill per request in flight: the wave.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from dse.catalog.calibration import family_of, load_fitted
from dse.catalog.hardware import IDEAL
from dse.errors import InputError
from dse.validate.decode import predicted_passes
from dse.validate.fit import fit_stack, refit_tpot_sets
from dse.validate.points import Cases
from dse.validate.predict import predict, predict_runs, predict_training, table
from dse.validate.report import RunsValidation, Validation, summarize
from dse.validate.runs import METRICS, Runs, factor_key, family_key, group_key, map_runs, nothing_predicted, read_runs
from dse.validate.stack import stack_rows


def run_validation(cases: Cases, use_stored_loo: bool = True) -> Validation:
    """Predict every point with the catalog's calibrated factors; attach the stored leave-one-out errors."""
    pts = cases.points
    df = table(pts, predict(pts, None), predict(pts, IDEAL))
    df["family"] = [family_of(p.system) or "default" for p in pts]
    if cases.training:
        tr = cases.training
        tdf = table(tr, predict_training(tr, None), predict_training(tr, IDEAL))
        tdf["family"] = "training"
        df = pd.concat([df, tdf], ignore_index=True)
    fitted = load_fitted() if use_stored_loo else None
    if fitted:
        loo = {row["label"]: row.get("loo_predicted") for row in fitted["table"]}
        df["loo_predicted"] = [loo.get(label, np.nan) for label in df["label"]]
        df["loo_error"] = df["loo_predicted"] / df["measured"] - 1.0
    return Validation(df, summarize(df), cases.skipped)


def validate_runs(runs: Runs) -> RunsValidation:
    """Predict every row with the catalog's calibrated factors (``error``), with factors fitted on all rows
    (``in_sample_error``) and fitted with the row's whole concurrency sweep left out (``loo_error``, the
    headline), and with the ideal roofline (``ideal_error``).

    For TPOT, the decode pass's efficiency factors are fitted per `factor_key` (family and framework) on the rows'
    decode passes (`dse.validate.decode.decode_terms`, `dse.validate.fit.refit_tpot`; the request level's
    interference held at the catalog's), after two-batch overlap is chosen per (framework, mode) from the data
    (`dse.validate.fit.choose_two_batch`; ``scales["two_batch_overlap"]``, the row's choice in ``two_batch``, and in
    ``two_batch_loo`` the choice made without its sweep, with ``ideal_tpot_loo_s`` the roofline of that pass):
    ``scales["tpot"]`` holds, per key, the factors the rows identify and those kept from the catalog (no row depends
    on them). ``tpot_loo_family_error`` is the leave-group-out error with one factor set per `family_key` instead,
    shared by the frameworks (the test of whether the data demand a factor set per framework). TTFT is the
    physics' closed loop through the catalog's serving stacks (``error``); the stacks' terms refitted per
    (framework, mode) on the rows with stated layouts (`dse.validate.fit.fit_stack`) give ``scales["ttft"]`` (queue
    share, fixed latency, the rows and sweeps they rest on) and ``ttft_in_sample_s`` / ``ttft_loo_s``.
    """
    t = runs.table.copy()
    if t.empty:
        return RunsValidation(t, {}, runs.skipped, runs.given)
    pred, tp = predicted_passes(t)
    meas = t["measured_tpot_s"].to_numpy()
    scales = {}
    by_factors, by_family = refit_tpot_sets(tp, [factor_key(t).to_numpy(), family_key(t).to_numpy()], meas)
    scales["tpot"], tb, tpot_in_sample, tpot_loo, loo_split = by_factors
    tpot_loo_family = by_family[3]
    ideal = predict_runs(t, IDEAL, decode_batch=tp.decode_batch(tb.per_row))  # the roofline at the same point
    ideal_loo = ideal["predicted_tpot_s"].to_numpy(dtype=float, copy=True)  # of the left-out prediction's pass
    flipped = loo_split != tb.per_row  # its sweep left out, the data choose the other pass
    if flipped.any():
        ideal_loo[flipped] = predict_runs(t[flipped], IDEAL, decode_batch=tp.decode_batch(loo_split)[flipped]
                                          )["predicted_tpot_s"].astype(float).to_numpy()
    groups = group_key(t)
    for col in ("prefill_s", "wave_s", "wait_floor_s", "transfer_s"):
        t[col] = pred[col].astype(float)
    for m in METRICS:
        t[f"ideal_{m}_s"] = ideal[f"predicted_{m}_s"].astype(float)
        t[f"{m}_ideal_error"] = t[f"ideal_{m}_s"] / t[f"measured_{m}_s"] - 1.0

    # TTFT: the physics' closed loop through each framework's serving stack, its terms refitted per framework
    # and mode
    ttft = t["measured_ttft_s"]
    t["predicted_ttft_s"] = pred["predicted_ttft_s"].astype(float)
    t["ttft_error"] = t["predicted_ttft_s"] / ttft - 1.0
    fits, in_sample, loo = fit_stack(t, groups, stack_rows(t))
    scales["ttft"] = {k: {"queue_share": f["terms"].queue_share, "fixed_latency_s": f["terms"].fixed_latency_s,
                          "rows": f["rows"], "sweeps": f["sweeps"]} for k, f in fits.items()}
    t["ttft_in_sample_s"], t["ttft_loo_s"] = in_sample, loo
    t["ttft_in_sample_error"] = in_sample / ttft - 1.0
    t["ttft_loo_error"] = loo / ttft - 1.0

    # TPOT: two-batch overlap where the data chooses it, the decode factors refitted per key
    scales["two_batch_overlap"] = tb.choice
    t["two_batch"], t["two_batch_loo"], t["ideal_tpot_loo_s"] = tb.per_row, loo_split, ideal_loo
    t["predicted_tpot_s"] = np.where(tb.per_row, tp.split_tpot, tp.unsplit_tpot)
    t["tpot_error"] = t["predicted_tpot_s"] / meas - 1.0
    t["tpot_in_sample_error"] = tpot_in_sample / meas - 1.0
    t["tpot_loo_error"] = tpot_loo / meas - 1.0
    t["tpot_loo_family_error"] = tpot_loo_family / meas - 1.0
    for m in METRICS:  # each sweep's own level removed: what is left is the physics' shape across concurrency
        lr = np.log1p(t[f"{m}_loo_error"])
        t[f"{m}_within_sweep_error"] = np.expm1(lr - lr.groupby(groups).transform("median"))
    t["fits"] = pred["fits"].astype(bool)  # the memory check; a measured run that "does not fit" is a finding
    return RunsValidation(t, scales, runs.skipped, runs.given)


def validate_file(path: Path) -> RunsValidation:
    """Read, map, predict and cross-validate a CSV of measured serving runs; a file none of whose rows can be
    predicted is an InputError saying why each was skipped.
    """
    runs = map_runs(read_runs(path))
    if runs.table.empty:
        raise InputError(nothing_predicted(Path(path), runs))
    return validate_runs(runs)
