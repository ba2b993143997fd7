"""The decode pass as a function of the efficiency factors (`dse.validate.decode`), read off the
physics, and its fit to measured TPOTs (`dse.validate.fit.fit_factors`)."""

from __future__ import annotations

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
         "layer_overhead": 23e-6, "moe_layer_overhead": 11e-6, "gemm_half_rows": 70.0, "attention_half_context": 900.0}


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
    for (mode, isl, osl), g in t.groupby(["mode", "isl", "osl"], sort=False):
        at = rows[t.index.get_indexer(g.index)]
        batch = (g["in_flight"] if mode == "agg" else pred["decode_batch"][g.index]).to_numpy() / g["pp"].to_numpy()
        cand = run_candidates(g, models, systems, "", batch, isl + osl / 2.0, np.where(split[at], 2, 1))
        physics = evaluate_at(cand, mt, st, eff, [{"context": isl + osl / 2.0, "phase": 0}])[0]["step_s"]
        mine = terms.take(at)
        mine.overlap = np.where(split[at], 1.0, 0.0)  # the physics' own overlap at these factors
        assert np.allclose(decode_step(mine, OTHER), physics, rtol=1e-9)


def test_the_catalog_factors_reproduce_the_predicted_tpot(sample):
    _, _, _, p, terms, catalog = sample
    assert np.allclose(tpot_at(terms, catalog), p, rtol=1e-12)


def test_the_fit_recovers_known_factors(sample):
    """TPOTs made at known factors: the fit from the catalog's factors finds them (those the rows identify)
    and reproduces every TPOT."""
    _, _, _, _, terms, catalog = sample
    measured = tpot_at(terms, OTHER)
    start = {k: float(np.median(catalog[k])) for k in FACTORS}
    f = fit_factors(terms, measured, start)
    assert np.abs(tpot_at(terms, f) / measured - 1).max() < 1e-3
    assert set(used_by(terms)) == set(FACTORS)
    assert f["memory"] == pytest.approx(OTHER["memory"], rel=1e-2)
    assert f["layer_overhead"] == pytest.approx(OTHER["layer_overhead"], rel=5e-2)


def test_fractions_stay_shares_of_a_peak_and_latencies_stay_positive(sample):
    """TPOTs faster than any physics allows push the shares to their bound of 1, never beyond, and the
    latencies towards 0, never below."""
    _, _, _, _, terms, catalog = sample
    f = fit_factors(terms, 0.05 * tpot_at(terms, catalog), {k: float(np.median(catalog[k])) for k in FACTORS})
    assert all(0 < f[k] <= 1.0 for k in ("compute_decode", "memory", "link"))
    assert all(f[k] > 0 for k in FACTORS[3:])
    assert f["memory"] == pytest.approx(1.0)
