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


def test_the_fit_moves_a_length_or_fixed_time_stored_at_zero(sample):
    """The catalog may hold a half-performance length or a fixed time at 0, the bound of the catalog's fit. The
    descent's coordinates keep the factors themselves (not their logs), so the loss has a slope there: TPOTs made at
    known factors give the factors back from such a start, and a key's fit (`fit_key`, the lowest of its starts)
    never ends above the fit from its start alone."""
    from dse.validate.fit import fit_key, key_starts

    _, _, _, _, terms, _ = sample
    measured = tpot_at(terms, OTHER)
    off = (0.7, 1.3, 0.75, 1.25, 0.8, 1.2, 0.7, 1.3, 0.75, 1.0)
    start = {k: OTHER[k] * m for k, m in zip(FACTORS, off, strict=True)}
    start.update(attention_half_context=0.0, layer_overhead=0.0)

    def loss(f):
        return float(np.abs(np.log(tpot_at(terms, f) / measured)).sum())

    plain = fit_factors(terms, measured, start)
    for k in ("attention_half_context", "layer_overhead"):
        assert OTHER[k] > 0 and plain[k] == pytest.approx(OTHER[k], rel=1e-3), k
    assert len(key_starts(terms, start)) == 2  # and from the GEMM's rows at 0
    fitted, held = fit_key(terms, measured, start)
    assert not held and loss(fitted) <= loss(plain)  # every factor identified: none held


def test_fractions_stay_shares_of_a_peak_and_latencies_stay_positive(sample):
    """TPOTs faster than any physics allows push the shares to their bound of 1, never beyond, and the
    latencies towards 0, never below."""
    _, _, _, _, terms, catalog = sample
    f = fit_factors(terms, 0.05 * tpot_at(terms, catalog), {k: float(np.median(catalog[k])) for k in FACTORS})
    assert all(0 < f[k] <= 1.0 for k in ("compute_decode", "memory", "link"))
    assert all(f[k] > 0 for k in FACTORS[3:] if k != "kernel_overlap")  # the kernels' overlap: the catalog's 0
    assert f["memory"] == pytest.approx(1.0)


# ---- the descent against scipy's Nelder-Mead, the loss and its Jacobian against tpot_at ----------------------------
def _scipy_fit(d, measured, start, passes=6):
    """The decode-factor fit as written first: scipy's Nelder-Mead on log factors, the loss from `tpot_at` at
    `_unpack`, restarted from its optimum while a run still lowers the loss by more than 1e-6 of it."""
    from scipy.optimize import minimize

    from dse.validate.fit import _pack, _unpack

    free = used_by(d)
    fixed = {k: start[k] for k in FACTORS if k not in free}
    log_meas = np.log(measured)

    def loss(x):
        return float(np.abs(np.log(tpot_at(d, _unpack(x, free, fixed))) - log_meas).sum())

    x = _pack(start, free)
    best = loss(x)
    for _ in range(passes):
        res = minimize(loss, x, method="Nelder-Mead", options={"maxiter": 4000, "xatol": 1e-4, "fatol": 1e-7})
        gain = best - res.fun
        x, best = (res.x, res.fun) if res.fun < best else (x, best)
        if gain <= 1e-6 * best:
            break
    return _unpack(x, free, fixed), best


def test_the_descent_reaches_scipys_nelder_mead_loss(sample):
    """On TPOTs the factors cannot fit exactly (known factors, each row's TPOT moved by up to 20%), from the
    catalog's factors: a key's fit with every factor free (`fit_free`) on each of three selections of the rows ends within 0.5% of the loss
    of scipy's Nelder-Mead run to convergence with restarts on the same rows from the same start (here 0.15% to
    0.5% under it); `fit_factors_many` gives each fit, fits reading a selection of shared rows and fits of their own
    rows alike, what `fit_factors` gives it alone."""
    from dse.validate.fit import fit_factors_many, fit_free

    t, _, _, p, terms, catalog = sample
    measured = tpot_at(terms, OTHER) * np.exp(np.sin(np.arange(len(p))) * 0.2)
    start = {k: float(np.median(catalog[k])) for k in FACTORS}
    half = np.arange(len(p) // 2)
    fits = [(terms, measured, start, np.flatnonzero(np.arange(len(p)) % 5 != j)) for j in range(2)]
    fits.append((terms.take(half), measured[half], start))
    many = fit_factors_many(fits)
    for fit, got in zip(fits, many, strict=True):
        d, m, s, *rows = fit
        if rows:
            d, m = d.take(rows[0]), m[rows[0]]
        _, want = _scipy_fit(d, m, s)
        assert float(np.abs(np.log(tpot_at(d, fit_free(d, m, s)) / m)).sum()) <= want * 1.005
        alone = fit_factors(d, m, s)
        assert all(alone[k] == pytest.approx(got[k], rel=1e-9, abs=1e-15) for k in FACTORS)


def test_the_jacobian_is_the_loss_s_slope(sample):
    """`log_tpot`'s derivatives by each coordinate equal central differences of its log TPOT, on rows that overlap
    their communication or none and at a kernel overlap of 0, between 0 and 1, and 1."""
    from dataclasses import replace

    from dse.validate.losses import log_tpot, term_rows, to_coords

    _, _, _, p, terms, _ = sample
    rng = np.random.default_rng(11)
    for overlap in (np.zeros(len(p)), np.where(np.arange(len(p)) % 3 == 0, 0.6, 0.0)):
        t = term_rows(replace(terms, overlap=overlap))
        for k in (0.0, 0.35, 1.0):
            f = {key: OTHER[key] * rng.uniform(0.5, 2.0) for key in FACTORS} | {"kernel_overlap": k}
            at = to_coords(np.log(np.array([[max(f[key], 1e-300) for key in FACTORS]])))
            log, jac = log_tpot(t, at)
            assert np.allclose(log[0], np.log(tpot_at(replace(terms, overlap=overlap), f)), rtol=0, atol=1e-12)
            for i in range(len(FACTORS)):
                h = 1e-6 * max(at[0, i], 1e-3)
                up, down = at.copy(), at.copy()
                up[0, i] += h
                down[0, i] -= h
                slope = (log_tpot(t, up, False)[0] - log_tpot(t, down, False)[0]) / (2 * h)
                kink = np.abs(slope - jac[0, i]) > 1e-5 * np.maximum(np.abs(jac[0, i]), 1e-3 / max(at[0, i], 1e-3))
                assert kink.mean() < 0.01, (FACTORS[i], k)  # a max within h of its tie: a kink, rare


def test_one_fits_loss_is_numpys_sum_of_tpot_at(sample):
    """`loss_of` (one fit, one factor set) gives numpy's sum of |log(TPOT / measured)| over `tpot_at` to the last
    bit: rows that overlap their communication or none, and a kernel overlap of 0, between 0 and 1, and 1 (each
    branch of `kernel_work`)."""
    from dataclasses import replace

    from dse.validate.losses import loss_of

    t, _, _, p, terms, catalog = sample
    rng = np.random.default_rng(5)
    measured = p * rng.uniform(0.7, 1.4, len(p))
    for overlap in (np.zeros(len(p)), np.where(np.arange(len(p)) % 3 == 0, 0.6, 0.0)):
        d = replace(terms, overlap=overlap)
        for k in (0.0, 0.35, 1.0):
            f = {key: OTHER[key] * rng.uniform(0.5, 2.0) for key in FACTORS} | {"kernel_overlap": k}
            want = np.abs(np.log(tpot_at(d, f)) - np.log(measured)).sum()
            assert loss_of(d, measured)(np.array([[f[key]] for key in FACTORS])) == want
            assert loss_of(d, measured)([f[key] for key in FACTORS]) == want


def test_a_key_s_left_out_fits_start_from_its_fit(sample):
    """`fit_keys`: each key's factors are `fit_key`'s, and each of its left-out fits is `fit_factors` of its rows
    from them, holding the factors the key's fit holds."""
    fit = importlib.import_module("dse.validate.fit")  # the module (the package re-exports a function `fit`)
    t, _, _, p, terms, _ = sample
    measured = tpot_at(terms, OTHER) * np.exp(np.sin(np.arange(len(p))) * 0.2)
    jobs = []
    for mode in ("agg", "disagg"):
        rows = np.flatnonzero((t["mode"] == mode).to_numpy())
        d, m = terms.take(rows), measured[rows]
        jobs.append(fit.KeyFits(d, m, dict(OTHER), [(d, m, np.flatnonzero(np.arange(len(rows)) % 5 != j))
                                                     for j in range(3)]))
    for job, (fitted, held, left) in zip(jobs, fit.fit_keys(jobs), strict=True):
        assert (fitted, held) == fit.fit_key(job.terms, job.measured, job.start)
        for (d, m, rows), got in zip(job.left_out, left, strict=True):
            alone = fit.fit_factors(d.take(rows), m[rows], fitted, held)
            assert all(alone[k] == pytest.approx(got[k], rel=1e-9, abs=1e-15) for k in FACTORS)


def test_a_key_holds_the_factors_its_rows_do_not_identify(sample):
    """`fit_key` holds at the start's values the factors the likelihood-ratio test does not free: on TPOTs made at
    the start's factors, each row moved by 5% (normal noise), a sweep-sized key (40 rows) gets the start back (every
    factor held: freeing them fits the noise alone), while the same rows made at other shares of peak compute and
    memory free those two and find them within 2%; the test's thresholds are the chi-squared quantiles."""
    from scipy.special import chdtri

    from dse.validate.fit import CHI2_95, fit_key

    _, _, _, p, terms, catalog = sample
    rows = np.arange(40)
    d = terms.take(rows)
    start = {k: float(np.median(catalog[k])) for k in FACTORS}
    noise = np.exp(np.random.default_rng(2).normal(0.0, 0.05, len(rows)))
    fitted, held = fit_key(d, tpot_at(d, start) * noise, start)
    assert fitted == start and set(held) == set(used_by(d))
    moved = {**start, "compute_decode": 0.5 * start["compute_decode"], "memory": 0.6 * start["memory"]}
    fitted, held = fit_key(d, tpot_at(d, moved) * noise, start)
    assert set(used_by(d)) - set(held) == {"compute_decode", "memory"}
    assert all(fitted[k] == pytest.approx(moved[k], rel=0.02) for k in ("compute_decode", "memory"))
    assert all(fitted[k] == start[k] for k in held)
    assert CHI2_95 == pytest.approx([float(chdtri(k, 0.05)) for k in range(1, 11)], abs=1e-4)
