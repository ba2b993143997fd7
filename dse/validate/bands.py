"""The error bands every prediction carries (`dse validate --bands`, and after `dse validate --fit`): per hardware
family and metric, the 10th and 90th percentile of measured / predicted out of sample, with where each comes from.

The metrics and their out-of-sample errors:

- ``throughput`` (and every cost, its inverse): the published serving-throughput points of the family, each
  predicted by the family's fit without it (the leave-one-out predictions of calibration/fitted.yaml's table).
- ``tpot`` and ``ttft``: the measured serving runs of the family (`dse validate --cases`), each predicted by the
  fits without its concurrency sweep (leave-group-out: TPOT's decode factors per family and framework), and for
  TTFT without any row of its model (leave-model-out: the closed-loop queue share and fixed latency of its
  framework and mode fitted on the other models' rows, as a model measured on no run takes them, which also
  leaves the row's sweep out; `dse.validate.run.validate_runs`), pooled over the frameworks and modes (a
  prediction names neither framework nor benchmark). Rows whose worker counts
  the file leaves empty are left out: their layout is unknown, and a prediction always knows its own.

Leave-family-out errors (each family predicted with none of its own data):

- throughput: the global factors (those a system of no family uses) refitted on the other families' points by
  the global fit of `dse validate --fit` (`dse.validate.fit.fit`, from the stored global factors), predicting
  the family's serving-throughput points;
- tpot and ttft: the runs' fits with each family's rows left out (`dse.validate.run.validate_runs`'s
  ``tpot_lfo_error`` and ``ttft_lfo_error``: one decode factor set per framework fitted on the other families'
  rows, two-batch overlap chosen without the family; the serving stacks' terms per framework and mode on the
  other families' rows).

A family's band for a metric:

- with at least MIN_POINTS independent units of the metric (for throughput the configurations of its published
  points, `configuration`: one harness run by several submitters is one unit; for TPOT and TTFT concurrency
  sweeps, whose rows are correlated): the percentiles of its own out-of-sample ratios;
- with fewer: the envelope (lowest low, highest high) of those, its leave-family-out band and 1 (the prediction
  itself): a few units' percentiles understate the spread, its leave-family-out errors are those of the factors
  it would have without them, and a bias measured on so few is not trusted to exclude the prediction;
- with none: the unseen family's band.

The unseen family's band (``default``: the systems of no family, and the families with no point of the metric)
is the envelope of every family's leave-family-out band and every family's own band: never narrower than the
band of any calibrated family.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from dse.catalog.calibration import BAND_METRICS, MIN_POINTS, family_of
from dse.catalog.calibration import families as hardware_families
from dse.catalog.hardware import Efficiency
from dse.validate.fit import fit
from dse.validate.points import Cases, Point
from dse.validate.predict import predict
from dse.validate.run import validate_runs
from dse.validate.runs import group_key, map_runs, read_runs_files

PERCENTILES = (0.1, 0.9)
"""The band: these percentiles of measured / predicted (pandas' linear interpolation)."""
DIGITS = 4
"""Decimals a stored band keeps."""


@dataclass
class Ratios:
    """Measured / predicted per family: out of sample (``own``) and with the family left out (``left_out``)."""

    own: dict[str, np.ndarray]
    left_out: dict[str, np.ndarray]
    source: str
    """How ``own`` was predicted (the basis a band of it states)."""
    units: dict[str, int]
    """Independent units of ``own`` per family: the concurrency sweeps of runs, the configurations of published
    points (`configuration`)."""
    unit_name: str = "sweeps"
    """What a unit is, as the stored band names its count."""


def percentiles(ratio: np.ndarray) -> tuple[float, float]:
    r = pd.Series(np.asarray(ratio, dtype=float)).dropna()
    lo, hi = PERCENTILES
    return round(float(r.quantile(lo)), DIGITS), round(float(r.quantile(hi)), DIGITS)


def envelope(*bands: tuple[float, float]) -> tuple[float, float]:
    """The lowest low and the highest high of ``bands``."""
    return min(b[0] for b in bands), max(b[1] for b in bands)


def configuration(p: Point) -> tuple:
    """What makes two published points one unit of evidence: the same model on the same system, layout, formats,
    lengths and kind of figure. Points of one configuration (one harness run by several submitters, or at several
    loads) share the errors of their configuration, as the rows of one concurrency sweep do, and leaving one out
    leaves its twins in: they count as one unit.
    """
    return (p.model, p.system, p.tp, p.dp, p.ep, p.pp, p.weights_dtype, p.kv_dtype, p.isl, p.osl, p.kind)


def published_ratios(cases: Cases, fitted: dict, start: Efficiency) -> Ratios:
    """Serving throughput: the stored leave-one-out ratios per family, counted in configurations (`configuration`),
    and each family's points predicted by the global factors refitted without the family (from ``start``, the
    stored global factors).
    """
    thr = [r for r in fitted["table"] if r["category"] == "serving_throughput" and r.get("loo_error") is not None]
    own = {fam: np.array([1.0 / (1.0 + r["loo_error"]) for r in thr if r["family"] == fam])
           for fam in hardware_families()}
    scored = {r["case"] for r in thr}
    configurations: dict[str, set] = {}
    for p in cases.points:
        if p.category == "serving_throughput" and p.case in scored:
            configurations.setdefault(family_of(p.system), set()).add(configuration(p))
    left_out = {}
    for fam in hardware_families():
        mine = [p for p in cases.points if family_of(p.system) == fam and p.category == "serving_throughput"]
        if not mine:
            continue
        others, _ = fit([p for p in cases.points if family_of(p.system) != fam], start)
        left_out[fam] = np.array([p.measured for p in mine]) / predict(mine, others)
    return Ratios({k: v for k, v in own.items() if len(v)}, left_out, "leave-one-out",
                  {fam: len(c) for fam, c in configurations.items() if fam}, "configurations")


def runs_ratios(paths: list[Path]) -> tuple[Ratios, Ratios]:
    """TPOT and TTFT: the leave-group-out ratios of the measured runs of ``paths`` (read as one) with stated
    worker counts, per family, and each family's rows predicted by the fits on the other families' rows.
    """
    t = validate_runs(map_runs(read_runs_files(paths))).table
    t = t[t["layout"] == "stated"].reset_index(drop=True)
    fam = np.array([family_of(s) or "" for s in t["system"]], dtype=object)
    known = [f for f in hardware_families() if (fam == f).any()]
    ratio = {(m, kind): 1.0 / (1.0 + t[f"{m}_{kind}_error"].to_numpy()) for m in ("tpot", "ttft")
             for kind in ("loo", "lfo")}
    # TTFT out of sweep and out of model: a prediction's model may have no stack terms of its own
    ratio["ttft", "loo"] = 1.0 / (1.0 + t["ttft_lmo_error"].to_numpy())
    sweeps = {f: int(group_key(t[fam == f]).nunique()) for f in known}
    return tuple(Ratios({f: ratio[m, "loo"][fam == f] for f in known}, {f: ratio[m, "lfo"][fam == f] for f in known},
                        "leave-group-out" if m == "tpot" else "leave-model-out", sweeps) for m in ("tpot", "ttft"))


def median_abs_error(ratio: np.ndarray) -> float:
    """The median of |predicted / measured - 1| over measured / predicted ratios."""
    return round(float(np.median(np.abs(1.0 / np.asarray(ratio, dtype=float) - 1.0))), DIGITS)


def compose(r: Ratios) -> dict:
    """One metric's bands: per family (every family of the catalog) and ``default``, each with its basis and the
    median absolute errors its percentiles come from (own out-of-sample, leave-family-out).
    """
    out: dict[str, dict] = {}
    for fam in hardware_families():
        own = r.own.get(fam, np.zeros(0))
        units = r.units.get(fam, 0)
        entry: dict = {"points": len(own), r.unit_name: units}
        name = r.source.replace("-", "_")
        if len(own):
            entry[name] = list(percentiles(own))
            entry[f"{name}_median_abs_error"] = median_abs_error(own)
        if fam in r.left_out and len(r.left_out[fam]):
            entry["leave_family_out"] = list(percentiles(r.left_out[fam]))
            entry["leave_family_out_median_abs_error"] = median_abs_error(r.left_out[fam])
        if units >= MIN_POINTS:
            band, basis = percentiles(own), r.source
        elif len(own):
            band = envelope(percentiles(own), (1.0, 1.0), *([tuple(entry["leave_family_out"])]
                                                          if "leave_family_out" in entry else []))
            basis = f"{r.source}, leave-family-out and the prediction (fewer than {MIN_POINTS} {r.unit_name})"
        else:
            band, basis = None, "unseen family (no point of this metric)"
        out[fam] = {"band": band, "basis": basis, **entry}
    seen = [tuple(e["band"]) for e in out.values() if e["band"] is not None]
    lfo = [tuple(e["leave_family_out"]) for e in out.values() if "leave_family_out" in e]
    unseen = envelope(*seen, *lfo)
    for e in out.values():
        if e["band"] is None:
            e["band"] = unseen
        e["band"] = list(e["band"])
    out["default"] = {"band": list(unseen), "basis": "unseen family: the envelope of every family's band and "
                      "leave-family-out band"}
    return out


MEANING = ("per metric and hardware family, the 10th and 90th percentile of measured / predicted out of sample: a "
           "throughput T reads [T x low, T x high], a cost C [C / high, C / low], a TPOT or TTFT t [t x low, t x "
           "high]; throughput from the published serving-throughput points (leave-one-out), TPOT and TTFT from the "
           "measured serving runs with stated layouts (leave-group-out: each concurrency sweep predicted by the fits "
           f"without it), pooled over frameworks and modes; a family with fewer than {MIN_POINTS} configurations of "
           "points (sweeps for TPOT and TTFT; the points of one model, system, layout, formats and lengths are one "
           "configuration) takes the envelope of that band, 1 and its leave-family-out band (its points predicted by "
           "the fits without the family), a family with none and a system of no family (`default`) the envelope of "
           "every band and leave-family-out band. Written by `dse validate --bands` (dse.validate.bands)")


def compute_bands(cases: Cases, fitted: dict, start: Efficiency, runs_files: list[Path], runs_name: str) -> dict:
    """The ``bands`` section of calibration/fitted.yaml from the stored fit: ``fitted`` (its leave-one-out table),
    ``start`` (the stored global factors), the catalog's factors and the measured runs of ``runs_files`` (named
    ``runs_name`` in the section).
    """
    tpot, ttft = runs_ratios(runs_files)
    per = {"throughput": published_ratios(cases, fitted, start), "tpot": tpot, "ttft": ttft}
    return {"meaning": MEANING, "runs": runs_name, **{m: compose(per[m]) for m in BAND_METRICS}}
