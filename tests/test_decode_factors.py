"""The decode pass as a function of the efficiency factors (`dse.validate.decode`), read off the
physics, and its fit to measured TPOTs (`dse.validate.fit.fit_factors`)."""

from __future__ import annotations

import importlib
from pathlib import Path

import numpy as np
import pytest

from dse.catalog.hardware import Efficiency, default_systems
from dse.catalog.models import default_models
from dse.physics.roofline import ModelTable, SystemTable, evaluate_at
from dse.validate.decode import decode_step, decode_terms, tpot_at
from dse.validate.factors import FACTORS
from dse.validate.fit import fit_factors, used_by
from dse.validate.predict import predict_runs, run_candidates
from dse.validate.runs import map_runs, read_runs

ROOT = Path(__file__).resolve().parents[1]
MEASURED = ROOT / "hw_catalog" / "calibration" / "published" / "measured_serving.csv"
OTHER = {"compute_decode": 0.41, "memory": 0.83, "link": 0.37, "latency_scaleup": 7e-6, "latency_scaleout": 31e-6,
         "layer_overhead": 23e-6, "moe_layer_overhead": 11e-6, "gemm_half_rows": 70.0, "attention_half_context": 900.0,
         "kernel_overlap": 0.0}  # the catalog's, never fitted


@pytest.fixture(scope="module")
def sample():
    """Every tenth measured run (aggregated and disaggregated, dense and MoE, one and several domains), with
    the expert-parallel rows' passes split into two micro-batches."""
    raw = read_runs(MEASURED)
    t = map_runs(raw.iloc[::10]).table
    pred = predict_runs(t)
    split = (t["ep"] > 1).to_numpy()
    p = pred["predicted_tpot_s"].astype(float).to_numpy().copy()
    p[split] = predict_runs(t[split], two_batch=True)["predicted_tpot_s"].astype(float).to_numpy()
    terms, catalog = decode_terms(t, p, pred["decode_batch"], split)
    return t, pred, split, p, terms, catalog


def test_the_terms_give_the_physics_decode_pass_at_any_factors(sample):
    """At factors other than the catalog's, the pass rebuilt from the terms equals the roofline's own pass:
    the terms are exact, not a linearization (the step is positively homogeneous in each time)."""
    t, pred, split, _, terms, _ = sample
    assert {"agg", "disagg"} <= set(t["mode"]) and split.any() and (terms.n_scaleout > 0).any()
    models, systems = sorted(set(t["model"])), sorted(set(t["system"]))
    mt = ModelTable.build([default_models()[m] for m in models])
    st = SystemTable.build([default_systems()[s] for s in systems])
    eff = Efficiency(**{**OTHER, "overlap": 0.0})
    rows = np.arange(len(t))
    for (_mode, isl, osl), g in t.groupby(["mode", "isl", "osl"], sort=False):
        at = rows[t.index.get_indexer(g.index)]
        batch = pred["decode_batch"][g.index].to_numpy() / g["pp"].to_numpy()  # what its replica runs at once
        cand = run_candidates(g, models, systems, "", batch, isl + osl / 2.0, np.where(split[at], 2, 1))
        physics = evaluate_at(cand, mt, st, eff, [{"context": isl + osl / 2.0, "phase": 0}])[0]["step_s"]
        mine = terms.take(at)
        mine.overlap = np.where(split[at], 1.0, 0.0)  # the physics' own overlap at these factors
        assert np.allclose(decode_step(mine, OTHER), physics, rtol=1e-9)


def test_the_catalog_factors_reproduce_the_predicted_tpot(sample):
    _, _, _, p, terms, catalog = sample
    assert np.allclose(tpot_at(terms, catalog), p, rtol=1e-12)


def test_the_fit_recovers_known_factors(sample):
    """TPOTs made at known factors: the fit from a start 20-30% off every factor finds them all and reproduces
    every TPOT. (Not from the catalog's factors: the catalog holds attention's half-performance context at 0, the
    bound of its range, and Nelder-Mead's first simplex moves a coordinate at 0 by 0.00025 of its own unit, so a
    factor fitted to 0 is never moved again by a fit that starts there; from there the fit stops 0.7% off.)"""
    _, _, _, _, terms, catalog = sample
    measured = tpot_at(terms, OTHER)
    off = (0.7, 1.3, 0.75, 1.25, 0.8, 1.2, 0.7, 1.3, 0.75, 1.0)
    start = {k: OTHER[k] * m for k, m in zip(FACTORS, off, strict=True)}
    f = fit_factors(terms, measured, start)
    err = np.abs(tpot_at(terms, f) / measured - 1)
    assert np.median(err) < 1e-6 and err.max() < 1e-6
    assert set(used_by(terms)) == set(FACTORS) - {"kernel_overlap"}  # the kernels' overlap is the catalog's
    for k in used_by(terms):
        assert f[k] == pytest.approx(OTHER[k], rel=1e-4), k


def test_a_key_fit_lifts_a_length_or_fixed_time_stored_at_zero(sample):
    """The catalog may hold a half-performance length or a fixed time at 0, the bound of the catalog's fit. From
    there alone Nelder-Mead never moves it (the loss is flat over many units of its log, and its first simplex sees
    no slope); `fit_key` fits from it lifted too and keeps the lower loss, so TPOTs made at known factors give the
    factors back, and the lifted start never ends above the plain one."""
    from dse.validate.fit import fit_key

    _, _, _, _, terms, _ = sample
    measured = tpot_at(terms, OTHER)
    off = (0.7, 1.3, 0.75, 1.25, 0.8, 1.2, 0.7, 1.3, 0.75, 1.0)
    start = {k: OTHER[k] * m for k, m in zip(FACTORS, off, strict=True)}
    start.update(attention_half_context=0.0, layer_overhead=0.0)

    def loss(f):
        return float(np.abs(np.log(tpot_at(terms, f) / measured)).sum())

    plain = fit_factors(terms, measured, start)
    assert plain["attention_half_context"] < 1e-6  # stuck at its bound
    f = fit_key(terms, measured, start)
    assert loss(f) <= loss(plain)
    for k in ("attention_half_context", "layer_overhead"):
        assert OTHER[k] > 0 and f[k] == pytest.approx(OTHER[k], rel=1e-3), k
    assert fit_key(terms, measured, dict(OTHER)) == fit_factors(terms, measured, dict(OTHER))  # nothing at 0


def test_fractions_stay_shares_of_a_peak_and_latencies_stay_positive(sample):
    """TPOTs faster than any physics allows push the shares to their bound of 1, never beyond, and the
    latencies towards 0, never below."""
    _, _, _, _, terms, catalog = sample
    f = fit_factors(terms, 0.05 * tpot_at(terms, catalog), {k: float(np.median(catalog[k])) for k in FACTORS})
    assert all(0 < f[k] <= 1.0 for k in ("compute_decode", "memory", "link"))
    assert all(f[k] > 0 for k in FACTORS[3:] if k != "kernel_overlap")  # the kernels' overlap: the catalog's 0
    assert f["memory"] == pytest.approx(1.0)


# ---- the fits on arrays are the fits one at a time, to the last bit ----------------------------------------------
def _scipy_fit(d, measured, start, max_iter, passes):
    """The decode-factor fit as written first: scipy's Nelder-Mead, the loss from `tpot_at` at `_unpack`."""
    from scipy.optimize import minimize

    from dse.validate.fit import RESTART_GAIN, _pack, _unpack

    free = used_by(d)
    fixed = {k: start[k] for k in FACTORS if k not in free}
    log_meas = np.log(measured)

    def loss(x):
        return float(np.abs(np.log(tpot_at(d, _unpack(x, free, fixed))) - log_meas).sum())

    x = _pack(start, free)
    best = loss(x)
    for _ in range(passes):
        res = minimize(loss, x, method="Nelder-Mead", options={"maxiter": max_iter, "xatol": 1e-4, "fatol": 1e-7})
        gain = best - res.fun
        x, best = (res.x, res.fun) if res.fun < best else (x, best)
        if gain <= RESTART_GAIN * best:
            break
    return _unpack(x, free, fixed)


def test_nelder_mead_takes_scipys_steps():
    """On a function with a flat floor (clipped, so vertices tie) and a curved valley, from several starts:
    the same point and value as scipy's Nelder-Mead, bit for bit, one problem or many stepped together."""
    from scipy.optimize import minimize

    from dse.validate.simplex import minimize_many, nelder_mead

    def f(x):
        y = np.clip(x, -1.0, 3.0)
        return float(np.sum((y - np.arange(len(y)) * 0.3) ** 2) + (y[0] * y[-1] - 0.5) ** 2)

    rng = np.random.default_rng(7)
    starts = [rng.uniform(-2, 4, n) for n in (2, 3, 5, 5, 8)] + [np.zeros(4)]
    for x0 in starts:
        ref = minimize(f, x0, method="Nelder-Mead", options={"maxiter": 150, "xatol": 1e-4, "fatol": 1e-7})
        x, fun = nelder_mead(f, x0, 150, xatol=1e-4, fatol=1e-7)
        assert np.array_equal(x, ref.x) and fun == ref.fun
    x, fun = minimize_many(lambda reqs: [np.array([f(p) for p in pts]) for _, pts in reqs], starts,
                           np.full(len(starts), 150), np.full(len(starts), 1), xatol=1e-4, fatol=1e-7)
    for x0, xi, fi in zip(starts, x, fun, strict=True):
        ref = minimize(f, x0, method="Nelder-Mead", options={"maxiter": 150, "xatol": 1e-4, "fatol": 1e-7})
        assert np.array_equal(xi, ref.x) and fi == ref.fun


def test_the_losses_on_arrays_are_numpys_sum_of_tpot_at(sample):
    """Sum |log(TPOT / measured)| of fits reading their own rows or a selection of shared ones, at many factor
    sets at once: equal, to the last bit, to numpy's sum over `tpot_at` of each fit alone."""
    from dse.validate.losses import FitRows

    t, _, _, p, terms, catalog = sample
    rng = np.random.default_rng(3)
    measured = p * rng.uniform(0.7, 1.4, len(p))
    picks = [None, np.arange(0, len(p), 2), np.arange(len(p) // 3), np.sort(rng.choice(len(p), 40, replace=False))]
    own = terms.take(np.arange(len(p) // 2))
    fits = [(terms, measured, rows) for rows in picks] + [(own, measured[:len(p) // 2], None)]
    table = FitRows.build(fits)
    asked = np.array([0, 1, 2, 3, 4, 2, 0])
    f = np.array([[OTHER[k] * rng.uniform(0.5, 2.0) for _ in asked] for k in FACTORS])
    got = table.losses(asked, f)
    for j, i in enumerate(asked):
        d, m, rows = fits[i]
        rows = np.arange(len(m)) if rows is None else rows
        want = np.abs(np.log(tpot_at(d.take(rows), {k: float(f[n, j]) for n, k in enumerate(FACTORS)}))
                      - np.log(m[rows])).sum()
        assert got[j] == want


def test_one_fits_loss_is_numpys_sum_of_tpot_at(sample):
    """`loss_of` (one fit, one factor set) and `FitRows` (many at once) give numpy's sum of |log(TPOT / measured)|
    over `tpot_at` to the last bit: rows that overlap their communication or none, and a kernel overlap of 0,
    between 0 and 1, and 1 (each branch of `kernel_work`)."""
    from dataclasses import replace

    from dse.validate.losses import FitRows, loss_of

    t, _, _, p, terms, catalog = sample
    rng = np.random.default_rng(5)
    measured = p * rng.uniform(0.7, 1.4, len(p))
    for overlap in (np.zeros(len(p)), np.where(np.arange(len(p)) % 3 == 0, 0.6, 0.0)):
        d = replace(terms, overlap=overlap)
        table = FitRows.build([(d, measured, None), (d, measured, np.arange(0, len(p), 2))])
        for k in (0.0, 0.35, 1.0):
            f = {key: OTHER[key] * rng.uniform(0.5, 2.0) for key in FACTORS} | {"kernel_overlap": k}
            want = np.abs(np.log(tpot_at(d, f)) - np.log(measured)).sum()
            assert loss_of(d, measured)(np.array([[f[key]] for key in FACTORS])) == want
            assert loss_of(d, measured)([f[key] for key in FACTORS]) == want
            got = table.losses(np.array([0, 1]), np.array([[f[key]] * 2 for key in FACTORS]))
            rows = np.arange(0, len(p), 2)
            assert got[0] == want
            assert got[1] == np.abs(np.log(tpot_at(d.take(rows), f)) - np.log(measured[rows])).sum()


def test_the_fits_on_arrays_are_the_fits_one_at_a_time(sample):
    """`fit_factors` and `fit_factors_many` (fits sharing rows, and fits of their own) give the factors of the
    fit as first written (scipy's Nelder-Mead on `tpot_at`), bit for bit, with restarts and without."""
    from dse.validate.fit import fit_factors_many

    t, _, _, p, terms, catalog = sample
    measured = tpot_at(terms, OTHER) * np.exp(np.sin(np.arange(len(p))) * 0.2)
    start = {k: float(np.median(catalog[k])) for k in FACTORS}
    half = np.arange(len(p) // 2)
    fits = [(terms, measured, start, np.flatnonzero(np.arange(len(p)) % 5 != j)) for j in range(3)]
    fits.append((terms.take(half), measured[half], start))
    many = fit_factors_many(fits, max_iter=120, passes=2)
    for fit, got in zip(fits, many, strict=True):
        d, m, s, *rows = fit
        if rows:
            d, m = d.take(rows[0]), m[rows[0]]
        want = _scipy_fit(d, m, s, 120, 2)
        assert got == want and list(got) == list(want)
        assert fit_factors(d, m, s, 120, 2) == want


def test_the_fits_in_worker_processes_are_the_fits_in_this_one(sample, monkeypatch):
    """`fit_keys` in two worker processes (each key's left-out fits in pieces of two) gives, to the last bit, the
    factors it gives in this process alone."""
    fit = importlib.import_module("dse.validate.fit")  # the module (the package re-exports a function `fit`)
    t, _, _, p, terms, _ = sample
    measured = tpot_at(terms, OTHER) * np.exp(np.sin(np.arange(len(p))) * 0.2)
    start = dict(OTHER)
    jobs = []
    for mode in ("agg", "disagg"):
        rows = np.flatnonzero((t["mode"] == mode).to_numpy())
        d, m = terms.take(rows), measured[rows]
        left = [(d, m, np.flatnonzero(np.arange(len(rows)) % 5 != j)) for j in range(5)]
        jobs.append(fit.KeyFits(d, m, start, left, 60, 2 if mode == "agg" else 1))
    monkeypatch.setattr(fit, "PIECE", 2)
    alone = fit.fit_keys(jobs, processes=1)
    assert fit.fit_keys(jobs, processes=2) == alone
    d, m, rows = jobs[0].left_out[0]
    assert alone[0][1][0] == fit.fit_factors(d.take(rows), m[rows], alone[0][0], 60, 2)
