"""The catalog's calibration (`dse validate --fit`): the efficiency factors fitted globally and per hardware
family on the published points, jointly with the decode passes of measured serving runs where a family has
them, then each point left out in turn; the errors give each family's band.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import pandas as pd

from dse.catalog.calibration import families as hardware_families
from dse.catalog.calibration import family_of
from dse.catalog.hardware import IDEAL, Efficiency, EfficiencyCatalog
from dse.validate.decode import DecodeTerms, ServingRows, tpot_passes
from dse.validate.factors import FACTOR, FITTED, RUN_FITTED, stored_value
from dse.validate.fit import choose_two_batch, fit, fit_family, leave_one_out
from dse.validate.points import Cases
from dse.validate.predict import predict, predict_runs, table
from dse.validate.runs import family_key, group_key, map_runs, read_runs_files


@dataclass
class Calibration:
    """The fitted factors (global and per family) with their errors, in-sample and leave-one-out."""

    default: Efficiency
    families: dict[str, Efficiency]
    rms: dict[str, float]
    table: pd.DataFrame
    band: dict[str, tuple[float, float]]  # family or "default" -> (low, high) multipliers on throughput
    fitted_names: dict[str, tuple[str, ...]] = field(default_factory=dict)  # family -> the factors it fits
    runs: dict[str, dict] = field(default_factory=dict)  # family -> its serving rows' TPOT errors
    runs_file: str = ""


FIXED_POINT_ROUNDS = 6
FIXED_POINT_TOL = 1e-3
"""The joint fit's rounds at most, and the largest relative move of any factor at which it stops."""
MOVE_FLOOR = 1e-3
"""A share's move is taken relative to its value, or to this where the value is smaller."""


def _moved(a: Efficiency, b: Efficiency) -> float:
    """The largest relative change of a fitted factor (shares relative to at least MOVE_FLOOR, fixed times to at
    least 1 us, lengths to at least one row or token: the units the fit moves them in).
    """
    return max(abs(getattr(a, k) - getattr(b, k))
               / max(abs(getattr(a, k)), MOVE_FLOOR if FACTOR[k].kind == "share" else FACTOR[k].scale)
               for k in (*FITTED, *RUN_FITTED))


def as_stored(eff: Efficiency) -> Efficiency:
    """The fitted factors as the calibration files store them (`stored_value`)."""
    return replace(eff, **{k: stored_value(k, getattr(eff, k)) / FACTOR[k].per_si for k in (*FITTED, *RUN_FITTED)})


def _runs_errors(rows: ServingRows, eff: Efficiency) -> dict:
    """The TPOT errors of the serving rows at the factors ``eff`` (in sample: they were fitted on them)."""
    err = np.expm1(rows.log_errors(eff))
    return {"rows": len(err), "tpot_median_abs_error": round(float(np.median(np.abs(err))), 4),
            "tpot_signed_median": round(float(np.median(err)), 4)}


MIN_JOINT_SWEEPS = 3
"""Concurrency sweeps a family's measured runs need before its fit is joint: fewer cannot tell the fixed times
and the kernels' curves the joint fit frees from the sweeps' own levels (TPU v6e's one sweep of two rows)."""


def load_serving_rows(path: Path | list[Path], factors: EfficiencyCatalog | None = None) -> ServingRows:
    """The measured runs of ``path`` (files with the columns of measured_serving.csv, read as one) as the joint
    fit uses them: the decode pass of every mapped row that states its layout with two-batch overlap as the data
    chooses it with one factor set per family (`dse.validate.runs.family_key`), which rows it splits, the
    measured TPOTs (s) and each row's family (none for the rows of a family with fewer than MIN_JOINT_SWEEPS
    sweeps); what the request level adds to the pass (``rest``) taken at ``factors`` (default: the catalog's
    efficiency factors).
    """
    t = map_runs(read_runs_files(path if isinstance(path, list | tuple) else [path])).table
    if not t.empty:
        t = t[t["layout"] == "stated"]
    if t.empty:
        empty = np.zeros(0)
        terms, split, measured, keys = DecodeTerms(*[empty] * len(DecodeTerms.__dataclass_fields__)), \
            empty.astype(bool), empty, empty
    else:
        keys = family_key(t).to_numpy().astype(object)
        tp = tpot_passes(t, predict_runs(t, factors=factors), factors)
        split = choose_two_batch(tp, keys).per_row
        terms, measured = tp.terms_for(split), t["measured_tpot_s"].to_numpy()
    known = hardware_families()
    sweeps = pd.Series(group_key(t).to_numpy() if len(keys) else []).groupby(keys).transform("nunique").to_numpy()
    family = np.array([k if k in known and n >= MIN_JOINT_SWEEPS else "" for k, n in zip(keys, sweeps, strict=True)],
                      dtype=object)
    return ServingRows(terms, split, measured, family)


def _with_stacks(factors: EfficiencyCatalog, refit_stack) -> EfficiencyCatalog:
    """``factors``, after the serving stacks' terms are refitted and stored at them (``refit_stack``, if given)."""
    if refit_stack is not None:
        refit_stack(factors)
    return factors


def calibrate(cases: Cases, start: Efficiency, loo: bool = True, progress=None,
              stored: dict[str, Efficiency] | None = None, serving_file: Path | None = None,
              serving_name: str = "", refit_stack=None) -> Calibration:
    """Fit every family (and the global default on all points), then leave each point out in turn.

    ``stored``: the families' current factors, tried as a second starting point of each family's fit.
    ``serving_file``: measured serving runs (`load_serving_rows`; ``serving_name`` is how the stored fit names
    it): a family with rows is fitted jointly on its points and its rows (`fit`), and a left-out point of it
    predicted from the joint fit without it. What the request level adds to a run's decode pass (``rest``)
    depends on the factors, so the joint fit is repeated on the rows re-derived at its own factors until no
    factor moves by more than FIXED_POINT_TOL (a fixed point: the stored factors reproduce themselves). The
    ``refit_stack(factors)``, where given, refits and stores the serving stacks' terms at ``factors`` (an
    `EfficiencyCatalog`) before the rows are re-derived at them: a run's TTFT, and with it the closed loop's decode
    batch, follows the stacks, so the fixed point holds the factors and the stacks together. The
    global default (the start of every family's fit, and the factors of the systems of no family) is fitted on
    the points alone, less those that calibrate their own family only (`Point.family_only`): one set of fixed
    times for hardware the runs do not measure would be a guess dressed as a fit, so the families without runs
    keep the estimated fixed times.
    """
    pts = cases.points
    default, rms_all = fit([p for p in pts if not p.family_only], start)
    families, rms, names, runs = {}, {"default": rms_all}, {}, {}
    members = hardware_families()
    by_family = {fam: [p for p in pts if family_of(p.system) == fam] for fam in members}

    def rows_by_family(factors: EfficiencyCatalog | None) -> dict[str, ServingRows]:
        rows = load_serving_rows(serving_file, factors)
        return {fam: r for fam in members if by_family[fam] and (r := rows.of(fam)) is not None}

    serving = rows_by_family(None) if serving_file else {}  # at the catalog's factors
    joint = set(serving)
    for fam in members:
        if by_family[fam] and fam not in joint:
            eff, r, chosen = fit_family(by_family[fam], default, also=tuple(e for f, e in (stored or {}).items()
                                                                             if f == fam))
            if chosen:
                families[fam], rms[fam], names[fam] = eff, r, chosen
    previous: dict[str, Efficiency] = {}
    member_of = {system: fam for fam, systems in members.items() for system in systems}
    rounds, moved = 0, 0.0
    while joint and rounds < FIXED_POINT_ROUNDS:
        rounds += 1
        for fam in sorted(joint):
            # from the last round's optimum (the rows moved only a little), first from the stored factors
            starts = (previous[fam],) if fam in previous else tuple(e for f, e in (stored or {}).items() if f == fam)
            families[fam], rms[fam], names[fam] = fit_family(by_family[fam], default, also=starts,
                                                             serving=serving[fam])
        moved = max(_moved(previous[f], families[f]) for f in joint) if previous else np.inf
        if moved <= FIXED_POINT_TOL:
            break
        previous = {f: families[f] for f in joint}
        serving = rows_by_family(_with_stacks(EfficiencyCatalog(default, dict(families), member_of), refit_stack))
    if joint:  # the factors as stored, and the rows as a reader of them derives the rows (a decode batch follows
        # the factors and the stacks): the stored errors are those a reader reproduces
        families.update({f: as_stored(families[f]) for f in joint})
        serving = rows_by_family(_with_stacks(EfficiencyCatalog(default, dict(families), member_of), refit_stack))
    for fam in sorted(joint):
        runs[fam] = {**_runs_errors(serving[fam], families[fam]), "fixed_point_rounds": rounds,
                     "fixed_point_largest_move": round(float(moved), 6)}
    families = {fam: families[fam] for fam in members if fam in families}
    by_point = [families.get(family_of(p.system), default) for p in pts]
    pred = np.array([predict([p], e)[0] for p, e in zip(pts, by_point, strict=True)])
    ideal = predict(pts, IDEAL)
    loo_pred = leave_one_out(pts, default, families, serving, progress) if loo else None
    df = table(pts, pred, ideal, loo_pred)
    df["family"] = [family_of(p.system) if family_of(p.system) in families else "default" for p in pts]
    band = {}
    col = "loo_error" if loo else "error"
    for fam in ["default", *families]:
        g = df[(df["category"] == "serving_throughput") & ((df["family"] == fam) | (fam == "default"))]
        ratio = 1.0 / (1.0 + g[col])  # measured / predicted
        band[fam] = (float(ratio.quantile(0.1)), float(ratio.quantile(0.9)))
    return Calibration(default, families, rms, df, band, names, runs, serving_name if runs else "")
