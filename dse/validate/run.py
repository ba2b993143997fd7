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
  attention's half-performance context) fitted per hardware family and framework on the rows' decode passes
  (`factor_key`); the left-out sweep is predicted with the factors refitted without it. One factor set per
  family shared by the frameworks (`family_key`, as the catalog's `dse validate --fit` has it) is refitted beside
  it, out of sample too (``loo_family_factors_median_abs_error``).
- TTFT: the optimizer's request-level physics (`dse.physics.serving`) in a closed loop at the row's concurrency
  (``arrival: concurrency``: a benchmark holds a fixed number of requests in flight, each replaced as it
  completes, not the Poisson arrivals of production traffic) through the row's framework's serving stack: one
  prompt's prefill, plus the wait in the wave of the other requests in flight at its prefill server (a queue share
  xi of (n - 1) prompts, each at its share of a pass carrying a full chunk of prompts; `dse.physics.queueing`),
  plus the KV hand-off (disaggregated), plus the stack's fixed latency tau. The shipped terms (xi, tau) per
  framework, mode and model (disaggregated, per model and hardware family where it has sweeps enough there:
  `dse.validate.fit.stack_levels`) are the catalog's (hw_catalog/calibration/serving_stack.yaml, fitted by
  `dse validate --fit` on the rows with stated layouts); the leave-group-out prediction refits them without the
  row's sweep (`dse.validate.fit.fit_stack`; TTFT is affine in (xi, tau), `dse.physics.serving.closed_loop_ttft`),
  on the rows `dse.validate.stack.stack_rows` reads (a measurement over twice its deployment's TTFT at a higher
  concurrency, or over twice the longest closed loop any terms give it, is predicted and judged but fits nothing).
  Measured TTFT grows nearly linearly with the concurrency in most sweeps (R^2 > 0.9 in most of the 286 aggregated
  sweeps with 4 or more concurrencies), at a slope of a fraction of one prompt's prefill per request in flight: the
  wave.
- Leave-family-out: each hardware family's rows predicted by the fits on the other families' rows (the error
  of a family with no measured runs of its own: the band of `dse.validate.bands` for such a family).
- Rows whose layout the file leaves unknown (a disaggregated row without worker counts) or states against what
  frameworks document (attention TP that does not divide the heads beside a stated attention DP: read with the heads
  padded) are read by no fit and
  reported apart (the summary's ``layout_unknown``): a layout guessed for want of data neither calibrates nor
  judges the physics.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd

from dse.catalog.calibration import family_of, load_fitted
from dse.catalog.frameworks import StackTerms
from dse.catalog.hardware import IDEAL
from dse.errors import InputError
from dse.physics.serving import closed_loop_ttft
from dse.validate import cache as stored
from dse.validate.decode import TpotPasses, predicted_passes, tpot_at
from dse.validate.factors import FACTORS
from dse.validate.fit import fit_stack_sets, refit_tpot_sets, stack_families, stack_key_of
from dse.validate.points import Cases
from dse.validate.predict import TTFT_PIECES, outside_stack, predict, predict_runs, table
from dse.validate.report import RunsValidation, Validation, family_bands, summarize
from dse.validate.runs import (
    METRICS,
    Runs,
    factor_key,
    family_key,
    group_key,
    map_runs,
    nothing_predicted,
    read_runs,
    read_runs_files,
)
from dse.validate.stack import stack_rows
from dse.validate.training import TrainRun, load_training_runs, validation_rows


def run_validation(cases: Cases, use_stored_loo: bool = True, training: list[TrainRun] | None = None,
                   ) -> Validation:
    """Predict every point with the catalog's calibrated factors, and every training run (default: the catalog's,
    `dse.validate.training`) with the training factors; attach the stored leave-one-out errors.
    """
    pts = cases.points
    df = table(pts, predict(pts, None), predict(pts, IDEAL))
    df["family"] = [family_of(p.system) or "default" for p in pts]
    fitted = load_fitted() if use_stored_loo else None
    if fitted:
        loo = {row["label"]: row.get("loo_predicted") for row in fitted["table"]}
        df["loo_predicted"] = [loo.get(label, np.nan) for label in df["label"]]
        df["loo_error"] = df["loo_predicted"] / df["measured"] - 1.0
    runs = load_training_runs() if training is None else training
    if runs:
        df = pd.concat([df, validation_rows(runs, use_stored_loo)], ignore_index=True)
    return Validation(df, summarize(df), cases.skipped, family_bands(fitted if use_stored_loo else load_fitted()))


def validate_runs(runs: Runs) -> RunsValidation:
    """Predict every row with the catalog's calibrated factors (``error``), with factors fitted on all rows
    (``in_sample_error``) and fitted with the row's whole concurrency sweep left out (``loo_error``, the
    headline), with the fits on the other hardware families' rows alone (``lfo_error``, leave-family-out), and
    with the ideal roofline (``ideal_error``).

    For TPOT, the decode pass's efficiency factors are fitted per `factor_key` (family and framework) on the rows'
    decode passes (`dse.validate.decode.decode_terms`, `dse.validate.fit.refit_tpot_sets`; the request level's
    interference held at the catalog's), after two-batch overlap is chosen per (framework, mode) from the data
    (`dse.validate.fit.choose_two_batch`; ``scales["two_batch_overlap"]``, the row's choice in ``two_batch``, and in
    ``two_batch_loo`` the choice made without its sweep, with ``ideal_tpot_loo_s`` the roofline of that pass):
    ``scales["tpot"]`` holds, per key, the factors the rows identify and those kept from the catalog (no row depends
    on them). ``tpot_loo_family_error`` is the leave-group-out error with one factor set per `family_key` instead,
    shared by the frameworks (the test of whether the data demand a factor set per framework). TTFT is the
    physics' closed loop through the catalog's serving stacks (``error``); the stacks' terms refitted per
    (framework, mode) (`dse.validate.fit.fit_stack`) give ``scales["ttft"]`` (queue share, fixed latency, the rows
    and sweeps they rest on) and ``ttft_in_sample_s`` / ``ttft_loo_s``. Leave-family-out (``tpot_lfo_error``,
    ``ttft_lfo_error``): the decode factors per framework and the stacks' terms per (framework, mode) fitted on the
    rows of the other families, each family's rows predicted by them.

    Rows whose layout is not stated (``layout``: ``unknown``, a disaggregated row without worker counts,
    predicted on the smallest deployment of its worker sizes; ``padded``, a row whose attention TP does not divide
    the heads beside a stated attention DP, read as stated with the heads padded) are read by no fit: they are
    predicted by the fits on the rows that state their layout (out of sample by construction, so their
    leave-group-out error is that prediction's).
    """
    t = runs.table.copy()
    if t.empty:
        return RunsValidation(t, {}, runs.skipped, runs.given, runs.duplicates)
    apart = (t["layout"] != "stated").to_numpy()
    pred, tp = predicted_passes(t)  # every row's prediction is its own: the physics once for both parts
    parts, scales, family_fits = [], {}, ({}, {})
    if (~apart).any():
        stated, scales, family_fits = _validate_stated(t[~apart], pred[~apart], tp.take(np.flatnonzero(~apart)))
        parts.append(stated)
    if apart.any():
        parts.append(_predict_apart(t[apart], scales, family_fits, pred[apart], tp.take(np.flatnonzero(apart))))
    out = pd.concat(parts).loc[t.index] if len(parts) > 1 else parts[0]
    return RunsValidation(out, scales, runs.skipped, runs.given, runs.duplicates)


def _validate_stated(t: pd.DataFrame, pred: pd.DataFrame, tp: TpotPasses,
                     ) -> tuple[pd.DataFrame, dict, tuple[dict, dict]]:
    """`validate_runs` of rows that state their layout, given their `predicted_passes`; also the decode fits per
    `family_key` and their two-batch choice (what `_predict_apart` needs besides ``scales``).
    """
    t = t.copy()
    meas = t["measured_tpot_s"].to_numpy()
    scales = {}
    family = family_key(t).to_numpy()
    # the leave-family-out fits too: each family's rows predicted by decode factors per framework fitted on the
    # other families' rows (only these are read: a framework's fit on all families is only where they start)
    by_factors, by_family, by_framework = refit_tpot_sets(
        [(tp, factor_key(t).to_numpy()), (tp, family),
         (replace(tp, groups=family), t["backend"].astype(str).to_numpy(), False)], meas)
    scales["tpot"], tb, tpot_in_sample, tpot_loo, loo_split = by_factors
    tpot_loo_family = by_family[3]
    ideal = predict_runs(t, IDEAL, decode_batch=tp.decode_batch(tb.per_row))  # the roofline at the same point
    ideal_loo = ideal["predicted_tpot_s"].to_numpy(dtype=float, copy=True)  # of the left-out prediction's pass
    flipped = loo_split != tb.per_row  # its sweep left out, the data choose the other pass
    if flipped.any():
        ideal_loo[flipped] = predict_runs(t[flipped], IDEAL, decode_batch=tp.decode_batch(loo_split)[flipped]
                                          )["predicted_tpot_s"].astype(float).to_numpy()
    groups = group_key(t)
    _copy_prediction(t, pred, ideal)

    # TTFT: the physics' closed loop through each framework's serving stack, its terms refitted per framework
    # and mode
    ttft = t["measured_ttft_s"]
    (fits, in_sample, loo), (_, _, ttft_lfo), (_, _, ttft_lmo) = fit_stack_sets(
        t, [groups, pd.Series(family, index=t.index), t["model"]], stack_rows(t))
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

    # each family predicted by the fits on the other families' rows: decode factors per framework, the stacks'
    # terms per framework and mode
    t["tpot_lfo_error"] = by_framework[3] / meas - 1.0
    t["ttft_lfo_error"] = ttft_lfo / ttft - 1.0
    t["ttft_lmo_error"] = ttft_lmo / ttft - 1.0  # each model's rows through stack terms fitted without them
    _within_sweep(t, groups)
    t["fits"] = pred["fits"].astype(bool)  # the memory check; a measured run that "does not fit" is a finding
    return t, scales, (by_family[0], by_family[1].choice)


def _copy_prediction(t: pd.DataFrame, pred: pd.DataFrame, ideal: pd.DataFrame) -> None:
    """The physics' prediction of TTFT, the pieces it is made of (what refitting the stacks' terms needs), and the
    ideal roofline, into ``t``: ``ideal`` (`predict_runs` with every efficiency 1) at the prediction's operating
    point, its TTFT without the serving stack's terms (no fixed latency, queue share 0: the engine alone, as
    ``--ideal`` has it; the pieces do not depend on them, `closed_loop_ttft`).
    """
    for col in TTFT_PIECES:
        t[col] = pred[col].astype(float)
    for m in METRICS:
        t[f"ideal_{m}_s"] = ideal[f"predicted_{m}_s"].astype(float)
    t["ideal_ttft_s"] = closed_loop_ttft(ideal["prefill_s"].to_numpy(dtype=float), outside_stack(ideal),
                                         ideal["wave_s"].to_numpy(dtype=float), StackTerms(),
                                         ideal["wait_floor_s"].to_numpy(dtype=float))
    for m in METRICS:
        t[f"{m}_ideal_error"] = t[f"ideal_{m}_s"] / t[f"measured_{m}_s"] - 1.0
    t["predicted_ttft_s"] = pred["predicted_ttft_s"].astype(float)
    t["ttft_error"] = t["predicted_ttft_s"] / t["measured_ttft_s"] - 1.0


def _within_sweep(t: pd.DataFrame, groups: pd.Series) -> None:
    """Each sweep's own level removed: what is left is the physics' shape across concurrency."""
    for m in METRICS:
        lr = np.log1p(t[f"{m}_loo_error"])
        t[f"{m}_within_sweep_error"] = np.expm1(lr - lr.groupby(groups).transform("median"))


def _predict_apart(t: pd.DataFrame, scales: dict, family_fits: tuple[dict, dict], pred: pd.DataFrame,
                   tp: TpotPasses) -> pd.DataFrame:
    """Rows of unknown layout predicted by the fits of the rows that state theirs (``scales``; ``family_fits``:
    the decode factors per `family_key` and their two-batch choice): per key the fitted decode factors (the
    catalog's where no stated row shares the key), two-batch overlap as chosen for the row's framework and mode,
    and the serving stack's queue share and fixed latency fitted for its framework, mode and model (`stack_key_of`;
    none fitted: the physics' prefill, wait floor and hand-off alone). No fit read these rows, so each prediction
    is out of sample: in-sample and leave-group-out errors are the same. ``pred`` and ``tp``: the rows'
    `predicted_passes`.
    """
    t = t.copy()
    meas = t["measured_tpot_s"].to_numpy()

    def tpot_by(keys: np.ndarray, fits: dict, choice: dict) -> tuple[np.ndarray, np.ndarray]:
        split = tp.eligible & np.array([bool(choice.get(k, False)) for k in tp.fw_mode], dtype=bool)
        terms, out = tp.terms_for(split), np.empty(len(t))
        for key in np.unique(keys):
            rows = np.flatnonzero(keys == key)
            f = fits.get(key)
            out[rows] = tpot_at(terms.take(rows), {**f["fitted"], **f["kept_from_catalog"]} if f else
                                {k: tp.catalog[k][rows] for k in FACTORS})
        return out, split

    tpot, split = tpot_by(factor_key(t).to_numpy(), scales.get("tpot", {}), scales.get("two_batch_overlap", {}))
    tpot_family = tpot_by(family_key(t).to_numpy(), *family_fits)[0]
    _copy_prediction(t, pred, predict_runs(t, IDEAL, decode_batch=tp.decode_batch(split)))
    fits = scales.get("ttft", {})
    keys = [stack_key_of(fits, f, m, md, fa) for f, m, md, fa in zip(t["backend"].astype(str), t["mode"], t["model"],
                                                                      stack_families(t), strict=True)]
    terms = StackTerms(queue_share=np.array([fits[k]["queue_share"] if k else 0.0 for k in keys]),
                       fixed_latency_s=np.array([fits[k]["fixed_latency_s"] if k else 0.0 for k in keys]))
    ttft = closed_loop_ttft(t["prefill_s"].to_numpy(dtype=float), outside_stack(t), t["wave_s"].to_numpy(dtype=float),
                            terms, t["wait_floor_s"].to_numpy(dtype=float))
    t["ttft_in_sample_s"] = t["ttft_loo_s"] = ttft
    t["ttft_in_sample_error"] = t["ttft_loo_error"] = ttft / t["measured_ttft_s"] - 1.0
    t["two_batch"] = t["two_batch_loo"] = split
    t["ideal_tpot_loo_s"] = t["ideal_tpot_s"]
    t["predicted_tpot_s"] = np.where(split, tp.split_tpot, tp.unsplit_tpot)
    t["tpot_error"] = t["predicted_tpot_s"] / meas - 1.0
    t["tpot_in_sample_error"] = t["tpot_loo_error"] = tpot / meas - 1.0
    t["tpot_loo_family_error"] = tpot_family / meas - 1.0
    t["tpot_lfo_error"] = t["ttft_lfo_error"] = t["ttft_lmo_error"] = np.nan
    _within_sweep(t, group_key(t))
    t["fits"] = pred["fits"].astype(bool)
    return t


def read_measured(path: Path) -> pd.DataFrame:
    """The raw runs of one file: a measured-runs CSV (`read_runs`), or the JSON result of a dse export's benchmark
    script (`dse.validate.benchmarks.read_benchmark`: vllm bench serve, SGLang bench_serving, aiperf).
    """
    if Path(path).suffix.lower() in (".json", ".jsonl"):
        from dse.validate.benchmarks import read_benchmark

        return read_benchmark(Path(path))
    return read_runs(path)


def validate_file(path: Path | list[Path], cache: bool = True) -> RunsValidation:
    """Read, map, predict and cross-validate measured serving runs (`read_measured`: CSVs, or a dse export's
    benchmark results; one file, or several read as one); files none of whose rows can be predicted are an
    InputError saying why each was skipped. With ``cache``, a result computed before from the same files, catalogs
    and source is read back (`dse.validate.cache`), and a new one kept.
    """
    paths = [Path(p) for p in (path if isinstance(path, list | tuple) else [path])]
    runs = map_runs(read_runs_files(paths, read_measured))
    if runs.table.empty:
        raise InputError(nothing_predicted(paths[0] if len(paths) == 1 else Path(", ".join(map(str, paths))), runs))
    k = stored.key(paths) if cache and stored.cache_dir() is not None else None
    found = stored.lookup(k) if k else None
    if isinstance(found, RunsValidation):
        return found
    out = validate_runs(runs)
    if k:
        stored.store(k, out)
    return out
