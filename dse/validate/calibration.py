"""The fit of the efficiency factors (globally and per hardware family) and storing it."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import pandas as pd

from dse.catalog.calibration import FAMILIES, MEMBERS, family_of
from dse.catalog.hardware import CURVES, IDEAL, Efficiency, EfficiencyCatalog
from dse.validate.cases import Cases, Point, TrainPoint
from dse.validate.decode_factors import FACTORS, FIXED_TIMES, DecodeTerms, tpot_at
from dse.validate.decode_factors import identified as used_by
from dse.validate.predict import predict, predict_training, summarize, table

# ---- fitting ------------------------------------------------------------------------------------
# The shares of peak are fitted on the published cases. The fixed times (per collective, per layer, per MoE
# layer) and the half-performance lengths (`CURVES`: a GEMM's efficiency over its rows, decode attention's over
# its context) are not: offline-throughput cases at one large batch cannot tell them from a lower efficiency.
# Measured serving runs can (batch 1 to hundreds, contexts of 1k to 12k, at one layout): where a family has them
# (`ServingRows`), its fit is joint, over the cases and the runs' decode passes, and frees RUN_FITTED too.
FITTED = ("compute_prefill", "compute_decode", "memory", "link", "overlap", "hbm_usable")
RUN_FITTED = (*FIXED_TIMES, *CURVES)
"""What only measured serving runs identify."""
BOUNDS = {"compute_prefill": (0.05, 1.0), "compute_decode": (0.05, 1.0), "memory": (0.05, 1.0),
          "link": (0.05, 1.0), "overlap": (0.0, 1.0), "hbm_usable": (0.8, 0.98),
          "latency_scaleup": (0.0, 10e-3), "latency_scaleout": (0.0, 10e-3), "layer_overhead": (0.0, 1000e-6),
          "moe_layer_overhead": (0.0, 1000e-6), "gemm_half_rows": (0.0, 4096.0),
          "attention_half_context": (0.0, 65536.0)}
SCALE = {**dict.fromkeys(FIXED_TIMES, 1e-6), **dict.fromkeys(CURVES, 1.0)}  # fit in microseconds, rows, tokens
SERVING_SOFT = 0.1
"""Log error at which a serving run's residual turns from squared to absolute (soft L1, scipy's ``soft_l1``
shape): the measured runs hold sweeps whose level the physics misses by 50% and more (layouts the file
leaves out), and a squared loss would let them pull the factors of every other run."""


# What each fitted number means physically (stored beside every value in efficiency.yaml).
MEANING = {
    "compute_prefill": "achieved share of the peak dense tensor FLOP/s in prefill passes",
    "compute_decode": "achieved share of the peak dense tensor FLOP/s in decode passes",
    "memory": "achieved share of the peak HBM bandwidth streaming weights and KV cache",
    "link": "achieved share of the scale-up link bandwidth in collectives (TP all-reduce, EP all-to-all)",
    "overlap": "share of the communication time hidden under compute (0: serialized, 1: fully overlapped)",
    "hbm_usable": "share of the HBM capacity the engine fills with weights, KV cache and activations",
    "latency_scaleup": "fixed latency of one collective inside a scale-up domain (launch and synchronization of a "
                       "small message)",
    "latency_scaleout": "fixed latency of one collective over the scale-out network",
    "layer_overhead": "fixed time per layer of a forward pass (kernel boundaries and synchronization, CUDA graphs)",
    "moe_layer_overhead": "fixed time an MoE layer adds per forward pass (router top-k, token permutation and "
                          "un-permutation, the grouped-GEMM launch)",
    "gemm_half_rows": "rows at which a GEMM reaches half its asymptotic FLOP rate (tile padding, wave "
                      "quantization, pipeline fill): each weight matrix multiplied, dense or routed expert, costs "
                      "this many rows of compute beyond its own",
    "attention_half_context": "KV tokens at which decode attention reaches half its asymptotic bandwidth (split-KV "
                              "reduction, launch, occupancy at short sequences): each sequence's attention per "
                              "layer reads this many tokens of KV beyond its own",
}
# Identification of a factor by a set of points (`identified`): a 10% change of the factor must move the
# prediction of at least MIN_POINTS points by at least SENSITIVITY_MIN x 10% (overlap: a change of 0.1 by
# SENSITIVITY_MIN x 0.1); the factors fitted together must not be (nearly) collinear: the condition number of
# their unit-norm sensitivity columns stays at or below MAX_CONDITION (past 100, two digits of the fitted values
# are lost to the direction the points cannot see); and a family never fits more than one factor per
# POINTS_PER_FACTOR points. Factors are taken most informative first (largest sensitivity norm).
SENSITIVITY_STEP = 0.1
SENSITIVITY_MIN = 0.05
MIN_POINTS = 2
MAX_CONDITION = 100.0
POINTS_PER_FACTOR = 2


@dataclass
class ServingRows:
    """Measured serving runs as the joint fit sees them (`dse.validate.serving_runs.serving_tpot_terms`): each
    row's decode pass as `DecodeTerms`, whether it runs as two micro-batches (its overlap is then the split's,
    else the catalog's ``overlap``), its measured TPOT (s) and the family whose factors it calibrates (""
    where it calibrates none: a layout with assumed worker counts, a system of no family).
    """

    terms: DecodeTerms
    split: np.ndarray
    measured: np.ndarray
    family: np.ndarray

    def of(self, family: str) -> ServingRows | None:
        """The rows of ``family``; None where there are none."""
        rows = np.flatnonzero(self.family == family)
        if not len(rows):
            return None
        return ServingRows(self.terms.take(rows), self.split[rows], self.measured[rows], self.family[rows])

    def log_errors(self, eff: Efficiency) -> np.ndarray:
        """log(predicted / measured) TPOT at the factors ``eff``."""
        d = replace(self.terms, overlap=np.where(self.split, self.terms.overlap, eff.overlap))
        return np.log(tpot_at(d, {k: getattr(eff, k) for k in FACTORS}) / self.measured)


def load_serving_rows(path: Path, factors: EfficiencyCatalog | None = None) -> ServingRows:
    """The measured runs of ``path`` (the columns of measured_serving.csv) as `ServingRows`, what the request
    level adds to their decode passes taken at ``factors`` (default: the catalog's efficiency factors).
    """
    from dse.validate.serving_runs import serving_tpot_terms

    terms, split, measured, keys = serving_tpot_terms(path, factors)
    family = np.array([k if k in FAMILIES else "" for k in keys], dtype=object)
    return ServingRows(terms, split, measured, family)


def _soft(r: np.ndarray, c: float = SERVING_SOFT) -> np.ndarray:
    """A residual whose square is the soft-L1 loss of ``r`` (r^2 below c, 2 c |r| above)."""
    return c * np.sign(r) * np.sqrt(2.0 * (np.sqrt(1.0 + (r / c) ** 2) - 1.0))


def _to_eff(theta: np.ndarray, base: Efficiency, names: tuple[str, ...] = FITTED) -> Efficiency:
    return replace(base, **{k: float(v) * SCALE.get(k, 1.0) for k, v in zip(names, theta, strict=True)})


def _from_eff(eff: Efficiency, names: tuple[str, ...] = FITTED) -> np.ndarray:
    return np.array([getattr(eff, k) / SCALE.get(k, 1.0) for k in names])


def _fit(points: list[Point], start: Efficiency, max_nfev: int, names: tuple[str, ...],
         serving: ServingRows | None) -> tuple[Efficiency, float, float]:
    """`fit`, and the objective it reached (its ``cost``)."""
    from scipy.optimize import least_squares

    measured = np.array([p.measured for p in points])
    n_cases, n_runs = len(points), len(serving.measured) if serving else 0

    def residuals(eff: Efficiency) -> tuple[np.ndarray, np.ndarray]:
        r = np.log(np.maximum(predict(points, eff), 1e-30) / measured)
        if not n_runs:
            return r, r
        return r, np.concatenate([r / np.sqrt(n_cases), _soft(serving.log_errors(eff)) / np.sqrt(n_runs)])

    if not names:
        r, w = residuals(start)
        return start, float(np.sqrt(np.mean(r**2))), float(0.5 * np.sum(w**2))
    lo = np.array([BOUNDS[k][0] / SCALE.get(k, 1.0) for k in names])
    hi = np.array([BOUNDS[k][1] / SCALE.get(k, 1.0) for k in names])
    x0 = np.clip(_from_eff(start, names), lo + 1e-9, hi - 1e-9)
    res = least_squares(lambda x: residuals(_to_eff(x, start, names))[1], x0, bounds=(lo, hi), max_nfev=max_nfev,
                        x_scale="jac")
    eff = _to_eff(res.x, start, names)
    return eff, float(np.sqrt(np.mean(residuals(eff)[0] ** 2))), float(res.cost)


def fit(points: list[Point], start: Efficiency, max_nfev: int = 400, names: tuple[str, ...] = FITTED,
        serving: ServingRows | None = None) -> tuple[Efficiency, float]:
    """Least squares on log(predicted / measured) over the points; returns factors and RMS log error (of the
    points). Only the factors in ``names`` move; the others keep their values in ``start``.

    With ``serving`` rows the fit is joint: the objective is the mean squared log error of the points plus the
    mean soft-L1 loss (`SERVING_SOFT`) of the rows' log TPOT errors, so each data set weighs the same
    whatever its size.
    """
    eff, rms, _ = _fit(points, start, max_nfev, names, serving)
    return eff, rms


def sensitivities(points: list[Point], at: Efficiency) -> np.ndarray:
    """Sensitivity d log(prediction) / d log(factor) of every point (rows) to every fitted factor (columns), by
    finite differences; for ``overlap`` (which may be 0), d log(prediction) / d overlap.
    """
    base = np.log(np.maximum(predict(points, at), 1e-30))
    cols = []
    for name in FITTED:
        value = getattr(at, name)
        lo, hi = BOUNDS[name]
        if name == "overlap":
            step = SENSITIVITY_STEP if value + SENSITIVITY_STEP <= hi else -SENSITIVITY_STEP
            moved, scale = value + step, 1.0 / step
        else:
            moved = value * (1.0 - SENSITIVITY_STEP) if value * (1.0 - SENSITIVITY_STEP) >= lo else value * (
                1.0 + SENSITIVITY_STEP)
            scale = 1.0 / np.log(moved / value)
        shifted = np.log(np.maximum(predict(points, replace(at, **{name: moved})), 1e-30))
        cols.append((shifted - base) * scale)
    return np.column_stack(cols)


def identified(points: list[Point], at: Efficiency, serving: ServingRows | None = None) -> tuple[str, ...]:
    """The factors these points identify (the rule above SENSITIVITY_STEP), in FITTED order; with ``serving``
    rows, also every factor of their decode passes some row depends on (`used_by`), fixed times last.
    """
    chosen = _identified_by_points(points, at)
    if serving is None:
        return chosen
    runs = set(used_by(serving.terms))
    return tuple(k for k in (*FITTED, *RUN_FITTED) if k in chosen or k in runs)


def _identified_by_points(points: list[Point], at: Efficiency) -> tuple[str, ...]:
    """The rule above SENSITIVITY_STEP on the points alone."""
    jac = sensitivities(points, at)
    strong = (np.abs(jac) >= SENSITIVITY_MIN).sum(axis=0)
    norms = np.linalg.norm(jac, axis=0)
    chosen: list[int] = []
    for k in sorted((k for k in range(len(FITTED)) if strong[k] >= MIN_POINTS), key=lambda k: -norms[k]):
        if len(chosen) + 1 > len(points) // POINTS_PER_FACTOR:
            break
        trial = [*chosen, k]
        if np.linalg.cond(jac[:, trial] / norms[trial]) <= MAX_CONDITION:
            chosen = trial
    return tuple(FITTED[k] for k in sorted(chosen))


def fit_family(points: list[Point], start: Efficiency, max_nfev: int = 400, at: Efficiency | None = None,
               also: tuple[Efficiency, ...] = (), serving: ServingRows | None = None,
               ) -> tuple[Efficiency, float, tuple[str, ...]]:
    """Fit the factors the family's points (and ``serving`` rows, jointly) identify at ``at`` (default:
    ``start``); the others stay at ``start``. Returns the factors, the points' RMS log error and the names fitted.

    ``also``: further starting points (e.g. the family's stored factors); the fit with the lowest objective wins,
    since the capacity limit (``hbm_usable``) makes the error surface piecewise and a single start can stop in a
    worse local minimum.
    """
    names = identified(points, at or start, serving)
    best = _fit(points, start, max_nfev, names, serving)
    for other in also:
        # the identified factors start from ``other``; the rest keep ``start``'s (global) values
        trial = _fit(points, replace(start, **{k: getattr(other, k) for k in names}), max_nfev, names, serving)
        if trial[2] < best[2]:
            best = trial
    return best[0], best[1], names


def _calibrate_training(points: list[TrainPoint], default: Efficiency, families: dict[str, Efficiency], loo: bool):
    """Fit the training matmul efficiency (one value for every system) on the training points."""
    from scipy.optimize import minimize_scalar

    measured = np.array([p.measured for p in points])

    def effs(value: float, pts: list[TrainPoint]) -> list[Efficiency]:
        return [replace(families.get(family_of(p.system), default), compute_train=value) for p in pts]

    def predict_with(value: float, pts: list[TrainPoint]) -> np.ndarray:
        return np.array([predict_training([p], e)[0] for p, e in zip(pts, effs(value, pts), strict=True)])

    def best(pts: list[TrainPoint], meas: np.ndarray) -> float:
        res = minimize_scalar(lambda v: float(np.sum(np.log(predict_with(v, pts) / meas) ** 2)),
                              bounds=(0.05, 1.0), method="bounded", options={"xatol": 1e-5})
        return float(res.x)

    value = best(points, measured)
    pred = predict_with(value, points)
    ideal = predict_training(points, IDEAL)
    loo_pred = None
    if loo:
        loo_pred = np.array([
            predict_with(best([q for j, q in enumerate(points) if j != i], np.delete(measured, i)), [p])[0]
            for i, p in enumerate(points)
        ])
    df = pd.DataFrame({"case": [p.case for p in points], "category": "training_mfu",
                       "label": [p.label for p in points], "unit": [p.unit for p in points], "measured": measured,
                       "predicted": pred, "ideal": ideal})
    df["error"] = df["predicted"] / df["measured"] - 1.0
    if loo_pred is not None:
        df["loo_predicted"] = loo_pred
        df["loo_error"] = df["loo_predicted"] / df["measured"] - 1.0
    df["family"] = "training"
    default = replace(default, compute_train=value)
    families = {k: replace(v, compute_train=value) for k, v in families.items()}
    return default, families, df


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


def _moved(a: Efficiency, b: Efficiency) -> float:
    """The largest relative change of a fitted factor (fixed times relative to 1 us)."""
    return max(abs(getattr(a, k) - getattr(b, k)) / max(abs(getattr(a, k)), SCALE.get(k, 1e-3))
               for k in (*FITTED, *RUN_FITTED))


def _runs_errors(rows: ServingRows, eff: Efficiency) -> dict:
    """The TPOT errors of the serving rows at the factors ``eff`` (in sample: they were fitted on them)."""
    err = np.expm1(rows.log_errors(eff))
    return {"rows": len(err), "tpot_median_abs_error": round(float(np.median(np.abs(err))), 4),
            "tpot_signed_median": round(float(np.median(err)), 4)}


def calibrate(cases: Cases, start: Efficiency, loo: bool = True, progress=None,
              stored: dict[str, Efficiency] | None = None, serving_file: Path | None = None,
              serving_name: str = "") -> Calibration:
    """Fit every family (and the global default on all points), then leave each point out in turn.

    ``stored``: the families' current factors, tried as a second starting point of each family's fit.
    ``serving_file``: measured serving runs (`load_serving_rows`; ``serving_name`` is how the stored fit names
    it): a family with rows is fitted jointly on its points and its rows (`fit`), and a left-out point of it
    predicted from the joint fit without it. What the request level adds to a run's decode pass (``rest``)
    depends on the factors, so the joint fit is repeated on the rows re-derived at its own factors until no
    factor moves by more than FIXED_POINT_TOL (a fixed point: the stored factors reproduce themselves). The
    global default (the start of every family's fit, and the factors of the systems of no family) is fitted on
    the points alone: one set of fixed times for hardware the runs do not measure would be a guess dressed as
    a fit, so the families without runs keep the estimated fixed times.
    """
    pts = cases.points
    default, rms_all = fit(pts, start)
    families, rms, names, runs = {}, {"default": rms_all}, {}, {}
    by_family = {fam: [p for p in pts if family_of(p.system) == fam] for fam in FAMILIES}

    def rows_by_family(factors: EfficiencyCatalog | None) -> dict[str, ServingRows]:
        rows = load_serving_rows(serving_file, factors)
        return {fam: r for fam in FAMILIES if by_family[fam] and (r := rows.of(fam)) is not None}

    serving = rows_by_family(None) if serving_file else {}  # at the catalog's factors
    joint = set(serving)
    for fam in FAMILIES:
        if by_family[fam] and fam not in joint:
            eff, r, chosen = fit_family(by_family[fam], default, also=tuple(e for f, e in (stored or {}).items()
                                                                             if f == fam))
            if chosen:
                families[fam], rms[fam], names[fam] = eff, r, chosen
    previous: dict[str, Efficiency] = {}
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
        serving = rows_by_family(EfficiencyCatalog(default, dict(families), MEMBERS))
    for fam in sorted(joint):
        runs[fam] = {**_runs_errors(serving[fam], families[fam]), "fixed_point_rounds": rounds,
                     "fixed_point_largest_move": round(float(moved), 6)}
    families = {fam: families[fam] for fam in FAMILIES if fam in families}
    by_point = [families.get(family_of(p.system), default) for p in pts]
    pred = np.array([predict([p], e)[0] for p, e in zip(pts, by_point, strict=True)])
    ideal = predict(pts, IDEAL)
    loo_pred = None
    if loo:
        loo_pred = np.empty(len(pts))
        for i, p in enumerate(pts):
            if progress:
                progress(i, len(pts))
            fam = family_of(p.system)
            pool = [q for j, q in enumerate(pts) if j != i and (fam not in families or family_of(q.system) == fam)]
            if fam in families:  # the family's whole procedure again: which factors its other points identify
                e, _, _ = fit_family(pool, families[fam], max_nfev=60, at=default,
                                     serving=serving.get(fam))
            else:
                e, _ = fit(pool, default, max_nfev=60)
            loo_pred[i] = predict([p], e)[0]
    df = table(pts, pred, ideal, loo_pred)
    df["family"] = [family_of(p.system) if family_of(p.system) in families else "default" for p in pts]
    if cases.training:
        default, families, train_df = _calibrate_training(cases.training, default, families, loo)
        rms["training"] = float(np.sqrt(np.mean(np.log(1 + train_df["error"]) ** 2)))
        df = pd.concat([df, train_df], ignore_index=True)
    band = {}
    col = "loo_error" if loo else "error"
    for fam in ["default", *families]:
        g = df[(df["category"] == "serving_throughput") & ((df["family"] == fam) | (fam == "default"))]
        ratio = 1.0 / (1.0 + g[col])  # measured / predicted
        band[fam] = (float(ratio.quantile(0.1)), float(ratio.quantile(0.9)))
    return Calibration(default, families, rms, df, band, names, runs, serving_name if runs else "")


# ---- storing the fit ------------------------------------------------------------------------------
UNITS = {"layer_overhead": ("us", 1e6), "moe_layer_overhead": ("us", 1e6), "latency_scaleup": ("us", 1e6),
         "latency_scaleout": ("us", 1e6), "gemm_half_rows": ("rows", 1.0), "attention_half_context": ("tokens", 1.0)}


def _quantity(name: str, value: float, source: str, date: str, note: str) -> str:
    unit, factor = UNITS.get(name, ("fraction", 1.0))
    value = 0.0 if abs(value) < 1e-9 else value
    return f'{{value: {value * factor:.4g}, unit: {unit}, source: {source}, date: "{date}", note: "{note}"}}'


TRAIN_NOTE = "fitted on the training cases (Megatron-LM 2021 Table 1, Llama 3 Table 4), one value for all"
ESTIMATES = {
    "latency_scaleup": "small-message collective inside an NVLink-class domain; not fitted",
    "latency_scaleout": "a collective over RDMA scale-out, ~2.5x the scale-up latency; not fitted",
    "layer_overhead": "kernel boundaries and synchronization of one layer in decode with CUDA graphs; not fitted",
    "moe_layer_overhead": ("router top-k, token permutation and un-permutation and the grouped-GEMM launch an MoE "
                           "layer adds, about two kernel boundaries; not fitted"),
    "gemm_half_rows": "a GEMM at its asymptotic rate at any row count, as the roofline takes it; not fitted",
    "attention_half_context": "decode attention at its asymptotic bandwidth at any context, as the roofline takes "
                              "it; not fitted",
}
"""The fixed times' notes where no serving runs fit them (`dse validate --fit` without measured runs)."""


def _family_summary(cal: Calibration) -> dict:
    """Per fitted family: its systems, points, the factors fitted, and the in-sample and leave-one-out errors."""
    out = {}
    for fam in cal.families:
        g = cal.table[cal.table["family"] == fam]
        entry = {"systems": list(FAMILIES[fam]), "points": len(g),
                 "fitted_factors": list(cal.fitted_names.get(fam, FITTED)),
                 "median_abs_error": round(float(g["error"].abs().median()), 4)}
        if "loo_error" in g:
            entry["loo_median_abs_error"] = round(float(g["loo_error"].abs().median()), 4)
        for cat, h in g.groupby("category"):
            entry[f"{cat}_points"] = len(h)
        out[fam] = entry
    return out


def write_calibration(cal: Calibration, cases_file: str, folder: Path, date: str) -> None:
    """Write efficiency.yaml (the factors the predictions use) and calibration/fitted.yaml (the errors)."""
    n = len(cal.table)
    summary = summarize(cal.table)
    thr = summary[summary["category"] == "serving_throughput"].iloc[0]
    rows = sum(r["rows"] for r in cal.runs.values())
    with_runs = f" and {rows:,} measured serving TPOTs ({cal.runs_file})" if rows else ""
    lines = [
        "# Efficiency factors: achieved fractions of each peak, and the fixed latencies a roofline leaves out.",
        "# `--ideal` sets every fraction to 1 and every latency to 0 (full overlap): the pure roofline.",
        "# Written by `dse validate --fit`: least squares on log(predicted / measured) over the published cases",
        "# (hw_catalog/calibration/cases.yaml), jointly with the decode passes of measured serving runs where a",
        "# family has them (their TPOTs identify the fixed times per collective, per layer and per MoE layer);",
        "# per-point and leave-one-out errors are in calibration/fitted.yaml.",
        "# `factors` apply to every system; `families` replace them for the systems they list.",
        "",
        "sources:",
        f'  dse_validate_fit: {{title: "Fit of dse validate --fit on {n} published measurements{with_runs}; '
        f'leave-one-out median absolute error {100 * thr["loo_median_abs_error"]:.1f}% on serving throughput", '
        f'url: "hw_catalog/calibration/fitted.yaml", date: "{date}"}}',
        f'  estimate: {{title: "Not identifiable from the cases; engineering estimate", url: "", date: "{date}"}}',
        "",
        "factors:",
    ]

    def block(eff: Efficiency, indent: str, note: str, fitted_here: tuple[str, ...], unfitted: str = "") -> list[str]:
        out = []
        for name in (*FITTED, "compute_train", *RUN_FITTED):
            # a fixed time is fitted only where this block's own fit freed it, else it is the estimate
            fitted = name in FITTED or name == "compute_train" or name in fitted_here
            lo, hi = BOUNDS.get(name, (0.05, 1.0))
            value = getattr(eff, name)
            at_bound = fitted and (abs(value - lo) < 1e-6 * max(hi, 1e-9) or abs(value - hi) < 1e-6 * max(hi, 1e-9))
            if name == "compute_train":
                why = TRAIN_NOTE
            elif name in fitted_here:
                why = f"{note}: {MEANING[name]}"
            elif fitted:
                why, at_bound = f"{unfitted}: {MEANING[name]}", False
            else:
                why = ESTIMATES[name]
            why += " (at the bound of its range)" if at_bound else ""
            out.append(f"{indent}{name}: " + _quantity(name, value, "dse_validate_fit" if fitted else "estimate",
                                                       date, why))
        return out

    lines += block(cal.default, "  ", f"fitted on all {n} points", FITTED)
    lines += ["", "families:"]
    for fam, eff in cal.families.items():
        members = ", ".join(FAMILIES[fam])
        count = int((cal.table["family"] == fam).sum())
        runs = cal.runs.get(fam, {}).get("rows", 0)
        lines += [f"  {fam}:", f"    systems: [{members}]", "    factors:"]
        lines += block(eff, "      ", f"fitted on the {count} {fam} points"
                       + (f" and {runs:,} {fam} serving TPOTs" if runs else ""), cal.fitted_names.get(fam, FITTED),
                       f"not identified by the {count} {fam} points (too few points sensitive to it, or collinear "
                       f"with the factors they fit), so the global value")
    (folder / "efficiency.yaml").write_text("\n".join(lines) + "\n")

    calib = folder / "calibration"
    calib.mkdir(exist_ok=True)
    root = folder.resolve().parent
    cases_path = Path(cases_file).resolve()
    doc = {
        "fitted": date,
        "cases": str(cases_path.relative_to(root)) if cases_path.is_relative_to(root) else cases_file,
        "points": n,
        "rms_log_error": {k: round(v, 4) for k, v in cal.rms.items()},
        "summary": summary.round(4).to_dict(orient="records"),
        "band": {k: [round(lo, 4), round(hi, 4)] for k, (lo, hi) in cal.band.items()},
        "band_meaning": "10th and 90th percentile of measured / predicted (leave-one-out) on serving throughput: "
                        "a calibrated throughput T is read as [T x low, T x high]",
        "families": _family_summary(cal),
        "serving_runs": {"file": cal.runs_file, "meaning": "TPOT errors of the measured serving runs the fit used "
                         "(in sample: the factors were fitted on them; `dse validate --cases` on the file gives "
                         "the leave-sweep-out figures)", **cal.runs} if cal.runs else {},
        "table": cal.table.round(6).to_dict(orient="records"),
    }
    import yaml

    (calib / "fitted.yaml").write_text(yaml.safe_dump(doc, sort_keys=False, width=120))


