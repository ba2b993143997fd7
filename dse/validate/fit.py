"""Every fit of the validation: the efficiency factors of the catalog (least squares on the published points,
jointly with the decode passes of measured serving runs), which factors a set of points identifies, the
leave-one-out refits, the decode factors of measured runs per key with their
leave-group-out refits, the two-batch choice, and the serving stacks' closed-loop queue share and fixed latency.

The factors, their ranges and meaning are those of `dse.validate.factors`.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import pandas as pd

from dse.catalog.calibration import family_of
from dse.catalog.frameworks import StackTerms
from dse.catalog.hardware import Efficiency
from dse.physics.serving import closed_loop_ttft
from dse.validate.decode import DecodeTerms, ServingRows, TpotPasses, tpot_at
from dse.validate.descent import descend
from dse.validate.factors import FACTOR, FACTORS, FITTED, RUN_FITTED
from dse.validate.losses import loss_of, term_rows
from dse.validate.points import Point
from dse.validate.predict import outside_stack, predict

# ---- least squares on the published points, jointly with measured runs -----------------------------------------------
# The shares of peak are fitted on the published cases. The fixed times (per collective, per layer, per MoE
# layer) and the half-performance lengths (`CURVES`: a GEMM's efficiency over its rows, decode attention's over
# its context) are not: offline-throughput cases at one large batch cannot tell them from a lower efficiency.
# Measured serving runs can (batch 1 to hundreds, contexts of 1k to 12k, at one layout): where a family has them
# (`ServingRows`), its fit is joint, over the cases and the runs' decode passes, and frees RUN_FITTED too.
SERVING_SOFT = 0.1
"""Log error at which a serving run's residual turns from squared to absolute (soft L1, scipy's ``soft_l1``
shape): the measured runs hold sweeps whose level the physics misses by 50% and more (layouts the file
leaves out), and a squared loss would let them pull the factors of every other run."""


def _soft(r: np.ndarray, c: float = SERVING_SOFT) -> np.ndarray:
    """A residual whose square is the soft-L1 loss of ``r`` (r^2 below c, 2 c |r| above)."""
    return c * np.sign(r) * np.sqrt(2.0 * (np.sqrt(1.0 + (r / c) ** 2) - 1.0))


def _to_eff(theta: np.ndarray, base: Efficiency, names: tuple[str, ...] = FITTED) -> Efficiency:
    return replace(base, **{k: float(v) * FACTOR[k].scale for k, v in zip(names, theta, strict=True)})


def _from_eff(eff: Efficiency, names: tuple[str, ...] = FITTED) -> np.ndarray:
    return np.array([getattr(eff, k) / FACTOR[k].scale for k in names])


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
    lo = np.array([FACTOR[k].bounds[0] / FACTOR[k].scale for k in names])
    hi = np.array([FACTOR[k].bounds[1] / FACTOR[k].scale for k in names])
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


# ---- identifiability -------------------------------------------------------------------------------------------------
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


def sensitivities(points: list[Point], at: Efficiency) -> np.ndarray:
    """Sensitivity d log(prediction) / d log(factor) of every point (rows) to every fitted factor (columns), by
    finite differences; for ``overlap`` (which may be 0), d log(prediction) / d overlap.
    """
    base = np.log(np.maximum(predict(points, at), 1e-30))
    cols = []
    for name in FITTED:
        value = getattr(at, name)
        lo, hi = FACTOR[name].bounds
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
    return tuple(FITTED[k] for k in identifiable(sensitivities(points, at), POINTS_PER_FACTOR))


def identifiable(jac: np.ndarray, per_factor: int) -> list[int]:
    """The columns of a sensitivity matrix (rows: data, columns: factors; log change per log change of the factor)
    the data identify by the rule above SENSITIVITY_STEP, at most one per ``per_factor`` rows, in column order.
    """
    strong = (np.abs(jac) >= SENSITIVITY_MIN).sum(axis=0)
    norms = np.linalg.norm(jac, axis=0)
    chosen: list[int] = []
    for k in sorted((k for k in range(jac.shape[1]) if strong[k] >= MIN_POINTS), key=lambda k: -norms[k]):
        if len(chosen) + 1 > jac.shape[0] // per_factor:
            break
        trial = [*chosen, k]
        if np.linalg.cond(jac[:, trial] / norms[trial]) <= MAX_CONDITION:
            chosen = trial
    return sorted(chosen)


def used_by(d: DecodeTerms) -> tuple[str, ...]:
    """The factors of a decode pass (`FACTORS`) some row's pass depends on: the only ones measured TPOTs can
    move (a run with no collective across domains or no MoE layer says nothing of their fixed times). Unlike
    `identified`, no sensitivity threshold or collinearity test applies: the decode fit's loss is absolute.
    """
    return tuple(k for k, free in zip(FACTORS, _free(d, np.ones((1, len(d.rest)), dtype=bool))[0], strict=True) if free)


PEAKS = ("compute_prefill", "compute_decode", "memory", "link")
"""Shares of a peak rate: a family fit that places one at the top of its range (1, the peak itself, or for the
compute shares `dse.validate.factors.COMPUTE_CEILING`) has not measured it (the data ask for more than the hardware
delivers, so the share compensates what the other factors miss; on CDNA3 the prefill share went to 1 with the
objective within 4% of its value at 0.53): `fit_family` leaves it at the starting (global) value and fits the
others again."""
PEAK_TOL = 1e-4
"""A share within this relative distance of its upper bound is at the peak (the bounded least squares stops
just inside its bounds). A wider tolerance (1%) made the joint fit's fixed point cycle: CDNA3's prefill share,
fitted 1.2% under the ceiling in one round, fell within it in the next and went back to the global value."""


def fit_family(points: list[Point], start: Efficiency, max_nfev: int = 400, at: Efficiency | None = None,
               also: tuple[Efficiency, ...] = (), serving: ServingRows | None = None,
               ) -> tuple[Efficiency, float, tuple[str, ...]]:
    """Fit the factors the family's points (and ``serving`` rows, jointly) identify at ``at`` (default:
    ``start``); the others stay at ``start``. Returns the factors, the points' RMS log error and the names fitted.
    A share of a peak fitted at the peak itself (`PEAKS`) is left at ``start`` and the fit repeated without it.

    ``also``: further starting points (e.g. the family's stored factors); the fit with the lowest objective wins,
    since the capacity limit (``hbm_usable``) makes the error surface piecewise and a single start can stop in a
    worse local minimum.
    """
    names = identified(points, at or start, serving)
    while True:
        best = _fit(points, start, max_nfev, names, serving)
        for other in also:
            # the identified factors start from ``other``; the rest keep ``start``'s (global) values
            trial = _fit(points, replace(start, **{k: getattr(other, k) for k in names}), max_nfev, names, serving)
            if trial[2] < best[2]:
                best = trial
        at_peak = {k for k in names if k in PEAKS and getattr(best[0], k) >= FACTOR[k].bounds[1] * (1 - PEAK_TOL)}
        if not at_peak:
            return best[0], best[1], names
        names = tuple(k for k in names if k not in at_peak)


# ---- leave one out of the published points ---------------------------------------------------------------------------
LOO_MAX_NFEV = 60
"""Least-squares evaluations of a leave-one-out refit (it starts from the family's own fit)."""


def leave_one_out(points: list[Point], default: Efficiency, families: dict[str, Efficiency],
                  serving: dict[str, ServingRows], progress=None) -> np.ndarray:
    """Each point predicted from a fit without it: for a point of a fitted family, the family's whole procedure
    again on its other points (which factors they identify, jointly with the family's ``serving`` rows), from
    the family's factors; for a point of no fitted family, the global fit on every other point (less those that
    calibrate their own family only).
    ``progress(i, n)`` is called before each point.
    """
    out = np.empty(len(points))
    for i, p in enumerate(points):
        if progress:
            progress(i, len(points))
        fam = family_of(p.system)
        pool = [q for j, q in enumerate(points) if j != i and (family_of(q.system) == fam if fam in families
                                                               else not q.family_only)]
        if fam in families:  # the family's whole procedure again: which factors its other points identify
            e, _, _ = fit_family(pool, families[fam], max_nfev=LOO_MAX_NFEV, at=default, serving=serving.get(fam))
        else:
            e, _ = fit(pool, default, max_nfev=LOO_MAX_NFEV)
        out[i] = predict([p], e)[0]
    return out


# ---- the decode factors of measured runs -----------------------------------------------------------------------------
# The nine factors of a decode pass fitted to measured TPOTs (`dse.validate.decode`): each keeps its physical
# meaning and range (`dse.validate.factors`); a factor no row depends on (no collective across domains, no MoE
# layer) stays at its catalog value. The fit minimizes the sum of absolute log errors by a damped Gauss-Newton
# descent on reweighted least squares with the loss's analytic Jacobian (`dse.validate.descent`), every fit on one
# set of rows advanced together; a key's fit then holds at the catalog's values the factors a likelihood-ratio test
# does not free (`fit_key`), and its left-out fits hold the same.
def _unpack(x: np.ndarray, free: tuple[str, ...], fixed: dict) -> dict:
    f = dict(fixed)
    for name, v in zip(free, x, strict=True):
        lo, hi = FACTOR[name].log_range
        f[name] = float(np.exp(np.clip(v, lo, hi)))
    return f


def _pack(f: dict, free: tuple[str, ...]) -> np.ndarray:
    """The start in log space: each factor's value, a 0 at the bottom of its log range."""
    return np.array([np.log(f[name]) if f[name] > 0 else FACTOR[name].log_range[0] for name in free])


def _free(d: DecodeTerms, use: np.ndarray) -> np.ndarray:
    """Per fit (a row of ``use``, the rows of ``d`` it reads), whether each factor of `FACTORS` is one some of its
    rows' passes depend on (`used_by` of its rows).
    """
    free = np.zeros((len(use), len(FACTORS)), dtype=bool)
    for i, k in enumerate(FACTORS):
        if FACTOR[k].fitted_on != "none":
            free[:, i] = np.any(use & (getattr(d, FACTOR[k].term) > 0), axis=1)
    return free


def _descend(d: DecodeTerms, measured: np.ndarray, use: np.ndarray, starts: list[dict],
             held: np.ndarray | None = None, first: int = 0) -> list[dict]:
    """The factors of the fits reading the rows ``use`` (fits x rows) of ``d``, each from its start (``starts``),
    made together (`descend`); a factor none of a fit's rows depends on, or ``held`` for it (fits x `FACTORS`),
    keeps its start value.
    """
    free = _free(d, use) if held is None else _free(d, use) & ~held
    x = descend(term_rows(d), np.log(measured), use, np.array([_pack(s, FACTORS) for s in starts]), free, first)
    return [_unpack(xi[f], tuple(k for k, moved in zip(FACTORS, f, strict=True) if moved), s)
            for xi, f, s in zip(x, free, starts, strict=True)]


def fit_factors(d: DecodeTerms, measured: np.ndarray, start: dict, held: tuple[str, ...] = ()) -> dict:
    """The factors minimizing sum |log(tpot / measured)| over the rows' decode passes, from ``start`` (every
    factor of `FACTORS`), each within its ``log_range``; those no row uses (`used_by`) and those ``held`` keep
    their start value.
    """
    return _descend(d, measured, np.ones((1, len(measured)), dtype=bool), [start],
                    np.array([[k in held for k in FACTORS]]))[0]


CHI2_95 = (3.8415, 5.9915, 7.8147, 9.4877, 11.0705, 12.5916, 14.0671, 15.5073, 16.9190, 18.3070)
"""The 95th percentile of the chi-squared distribution with 1 to 10 degrees of freedom (``scipy.special.chdtri(k,
0.05)``, to 4 decimals; importing scipy.stats would cost a second): the likelihood-ratio test's threshold at 5%
for as many factors held (`fit_key`; `FACTORS` counts 10)."""


def _rejects(n: int, held: float, free: float, k: int) -> bool:
    """Whether the likelihood-ratio test at 5% rejects holding ``k`` factors whose holding raises the loss (sum of
    absolute log errors over ``n`` rows) from ``free`` to ``held``: whether n ln(held / free) reaches `CHI2_95`.
    Half the statistic of Laplace-distributed log errors (whose likelihood at its fitted scale L / n is
    (e n / L)^-n, so 2 n ln): on TPOTs made at known factors, each row moved by 5% (normal noise, 40 rows, ten
    draws), `fit_key` then frees a factor the rows were not made with in 3 draws of 10, with the full statistic in
    7 (the backward search tests several factors, and the rows' errors are not Laplace's).
    """
    return held > free and (free <= 0 or n * np.log(held / free) >= CHI2_95[k - 1])


def fit_key(d: DecodeTerms, measured: np.ndarray, start: dict) -> tuple[dict, tuple[str, ...]]:
    """A key's decode factors and those held at ``start``'s values (the catalog's). Every factor some row uses is
    fitted (`fit_free`); then, backward, the factor whose holding at its start value raises the loss least (each
    free factor held in turn, the others refitted, all fits together) is held while the likelihood-ratio test
    (`_rejects`, one degree of freedom) does not reject holding it, and whatever it says while more than one factor
    per `POINTS_PER_FACTOR` rows is free. A factor whose holding with the others as they are (no refit, which could
    only lower the loss) the test already does not reject against the last refit is held without a refit (half the
    selection's cost). Last, the factors left free are held too unless the test rejects holding them all at once
    (as many degrees of freedom as factors free). With few rows a free fit finds shares of peak the rows do not
    identify: on CDNA3's 19, 1.7% of peak compute with eight factors free, its loss 16% under the start's
    (n ln(L_held / L_free) = 3.3 against the 5% threshold of 15.5 for eight).
    """
    n = len(measured)
    at = loss_of(d, measured)
    fitted = fit_free(d, measured, start)
    loss = at([fitted[k] for k in FACTORS])
    free = _free(d, np.ones((1, n), dtype=bool))[0]
    cap = n // POINTS_PER_FACTOR
    held, base, pending = ~free, loss, 0  # the last refitted loss, and the factors held since without a refit
    while (~held).any():
        trial = np.flatnonzero(~held)
        over = len(trial) > cap  # one more must be held whatever the test says
        reset = [at([start[k] if k == FACTORS[i] else fitted[k] for k in FACTORS]) for i in trial]
        cheap = int(np.argmin(reset))  # held with the others as they are: a refit could only lower its loss
        if not over and not _rejects(n, reset[cheap], base, 1):
            held = held | (np.arange(len(FACTORS)) == trial[cheap])
            fitted = {**fitted, FACTORS[trial[cheap]]: start[FACTORS[trial[cheap]]]}
            loss, pending = reset[cheap], pending + 1
            continue
        masks = np.repeat(held[None, :], len(trial) + bool(pending), axis=0)
        masks[np.arange(len(trial)), trial] = True  # each free factor held in turn (and the factors as they are)
        tries = [*({**fitted, FACTORS[i]: start[FACTORS[i]]} for i in trial), *([fitted] if pending else [])]
        fits = _descend(d, measured, np.ones((len(tries), n), dtype=bool), tries, held=masks)
        losses = [at([f[k] for k in FACTORS]) for f in fits]
        if pending and losses[-1] < loss:
            fitted, loss = fits[-1], losses[-1]
        best = int(np.argmin(losses[:len(trial)]))
        if not over and _rejects(n, losses[best], loss, 1):
            break
        held, fitted, loss, base, pending = masks[best], fits[best], losses[best], losses[best], 0
    if (~held).any() and not _rejects(n, at([start[k] for k in FACTORS]), loss, int((~held).sum())):
        fitted, held = start, np.ones(len(FACTORS), dtype=bool)
    return fitted, tuple(k for k, h in zip(FACTORS, held & free, strict=True) if h)


def fit_free(d: DecodeTerms, measured: np.ndarray, start: dict) -> dict:
    """Every factor some row uses fitted from each of `key_starts`, the fits made together, the fit of the lowest
    loss (`best_of`): where a key's fit (`fit_key`) begins.
    """
    starts = key_starts(d, start)
    return best_of(d, measured, _descend(d, measured, np.ones((len(starts), len(measured)), dtype=bool), starts))


KEY_LENGTHS = ("gemm_half_rows", "attention_half_context")
"""The half-performance lengths a key's second start (`key_starts`) puts at 0."""


def key_starts(d: DecodeTerms, start: dict) -> list[dict]:
    """The starts of a key's fit (`fit_key`): ``start``, and ``start`` with the half-performance lengths
    (`KEY_LENGTHS`) at 0, where it holds one above 0 that some row uses. The lengths trade against the shares of
    peak compute and memory (a GEMM's rows against the compute share, attention's context against the memory
    share) along valleys a local descent does not cross: on the measured runs, two keys of ten reach a loss 1.8%
    and 4.4% lower from lengths at 0, the others the same loss (within 0.01%) or a lower one from ``start``.
    """
    zero = {k: 0.0 for k in KEY_LENGTHS if start[k] > 0 and k in used_by(d)}
    return [start, {**start, **zero}] if zero else [start]


def best_of(d: DecodeTerms, measured: np.ndarray, fits: list[dict]) -> dict:
    """The fit of the lowest loss (`loss_of`, the loss the fits minimized; the first on a tie)."""
    at = loss_of(d, measured)
    losses = [at([f[k] for k in FACTORS]) for f in fits]
    return fits[losses.index(min(losses))]


def fit_factors_many(fits: list[tuple], held: tuple[str, ...] = (), first: int = 0) -> list[dict]:
    """`fit_factors` of each fit (terms, measured TPOTs aligned with them, start, and optionally the rows of the
    terms it reads: all where left out), the fits given the same terms object made together (`descend`); the
    factors ``held`` keep their start values.
    """
    out: list = [None] * len(fits)
    together: dict[int, list[int]] = {}
    for i, (d, *_) in enumerate(fits):
        together.setdefault(id(d), []).append(i)
    for members in together.values():
        d, measured = fits[members[0]][:2]
        use = np.zeros((len(members), len(measured)), dtype=bool)
        for j, i in enumerate(members):
            use[j, fits[i][3] if len(fits[i]) > 3 and fits[i][3] is not None else slice(None)] = True
        hold = np.repeat([[k in held for k in FACTORS]], len(members), axis=0)
        for i, f in zip(members, _descend(d, measured, use, [fits[i][2] for i in members], hold, first), strict=True):
            out[i] = f
    return out


# ---- two-batch overlap, chosen by the data ---------------------------------------------------------------------------
@dataclass
class TwoBatch:
    """The data's two-batch choice for one set of factor keys (`choose_two_batch`): per (framework, mode) in
    ``choice``, per row in ``per_row``, per left-out sweep in ``without``.
    """

    choice: dict
    per_row: np.ndarray
    without: dict


def choose_two_batch(tp: TpotPasses, keys: np.ndarray) -> TwoBatch:
    """Two-batch overlap per (framework, mode) as the data choose it with one factor set per ``keys``."""
    return TwoBatch(*_two_batch_choice(tp.log_error, tp.split_log_error, tp.fw_mode, keys, tp.groups, tp.eligible))


def _two_batch_choice(lr1: np.ndarray, lr2: np.ndarray, keys: np.ndarray, scale_keys: np.ndarray,
                      groups: np.ndarray, eligible: np.ndarray) -> tuple[dict, np.ndarray, dict]:
    """Whether each (framework, mode) runs two-batch overlap, decided from the data: on where splitting the
    decode passes of its rows with an expert all-to-all lowers the sum of its rows' absolute log errors around
    the median of their key's rows (what remains once one scale per key is fitted; the other frameworks'
    rows as predicted without the split).

    Returns the in-sample choice per key, the in-sample choice per row, and per left-out group the choice for
    its key made without that group's rows (no eligible rows left: off, the physics' default).
    """
    def spread(rows: np.ndarray, use: np.ndarray, split: bool) -> float:
        lr = np.where(rows & eligible, lr2, lr1) if split else lr1
        return float(sum(np.abs(lr[rows & (scale_keys == sk)] - np.median(lr[use & (scale_keys == sk)])).sum()
                         for sk in np.unique(scale_keys[rows])))

    def on(k: str, use: np.ndarray) -> bool:
        rows = (keys == k) & use
        return bool((rows & eligible).any()) and spread(rows, use, True) < spread(rows, use, False)

    everything = np.ones(len(keys), dtype=bool)
    choice = {k: on(k, everything) for k in np.unique(keys)}
    per_row = eligible & np.array([choice[k] for k in keys], dtype=bool)
    without = {}
    for name in np.unique(groups):
        mine = groups == name
        k = keys[mine][0]
        without[name] = on(k, ~mine) if (eligible & mine).any() else choice[k]
    return choice, per_row, without


# ---- the decode factors refitted per key, with each sweep left out ---------------------------------------------------
def refit_tpot_sets(sets: list[tuple], meas: np.ndarray,
                    ) -> list[tuple[dict, TwoBatch, np.ndarray, np.ndarray, np.ndarray]]:
    """Per set (the passes, their keys, and optionally whether the caller reads the in-sample fits, default True:
    where not, a key no left-out fit starts from is not fitted,
    absent from the factors per key and NaN in sample): the decode factors
    fitted per key on its rows' decode passes, with two-batch overlap as the data choose it for those keys: per key
    the factors the rows identify and those kept from the catalog (no row depends on them, or the
    likelihood-ratio test of `fit_key` holds them), the two-batch choice,
    TPOT in sample and with each row's sweep (its group of the passes) left out (factors and two-batch choice
    re-made without it), and per row whether that left-out prediction split its pass. The left-out refits start
    from the in-sample factors and run to convergence. The fits of every key of every set are made by `fit_keys`,
    those leaving out the sweeps of one key at one two-batch choice together, on the key's rows.
    """
    out, jobs, places = [], [], []
    for tp, keys, *read in sets:
        tb = choose_two_batch(tp, keys)
        chosen = tp.terms_for(tb.per_row)
        scales, in_sample, loo = {}, np.full(len(keys), np.nan), np.full(len(keys), np.nan)
        loo_split = np.zeros(len(keys), dtype=bool)
        left: dict = {key: ([], []) for key in np.unique(keys)}  # per key: its left-out fits, where their TPOTs go
        shared: dict = {}  # a key's rows at one two-batch choice: the fits leaving out each of its sweeps read them
        for g, idx in pd.Series(np.arange(len(keys))).groupby(tp.groups).groups.items():
            idx = np.asarray(idx)
            mine = tp.fw_mode == tp.fw_mode[idx[0]]  # the rows whose choice was re-made without this sweep
            split = np.where(mine, tp.eligible & tb.without[g], tb.per_row)
            view = tp.terms_for(split)
            loo_split[idx] = split[idx]
            rows = np.flatnonzero(keys == keys[idx[0]])
            train = np.flatnonzero(tp.groups[rows] != g)
            if len(train):
                d = shared.setdefault((keys[idx[0]], split[rows].tobytes()), view.take(rows))
                left[keys[idx[0]]][0].append((d, meas[rows], train))
                left[keys[idx[0]]][1].append((idx, view.take(idx)))
            else:  # a key in no other sweep: the catalog's
                loo[idx] = tpot_at(view.take(idx), {k: tp.catalog[k][idx] for k in FACTORS})
        for key, (fits, at) in left.items():
            if not fits and read == [False]:  # nobody reads its fit
                continue
            rows = np.flatnonzero(keys == key)
            jobs.append(KeyFits(chosen.take(rows), meas[rows], {k: float(np.median(tp.catalog[k][rows]))
                                                                for k in FACTORS}, fits))
            places.append((scales, key, rows, in_sample, loo, at))
        out.append((scales, tb, in_sample, loo, loo_split))
    for job, (scales, key, rows, in_sample, loo, at), (fitted, held, left_out) in zip(jobs, places, fit_keys(jobs),
                                                                                       strict=True):
        free = tuple(k for k in used_by(job.terms) if k not in held)
        scales[key] = {"fitted": {k: v for k, v in fitted.items() if k in free},
                       "kept_from_catalog": {k: v for k, v in fitted.items() if k not in free}}
        in_sample[rows] = tpot_at(job.terms, fitted)
        for (idx, d), f in zip(at, left_out, strict=True):
            loo[idx] = tpot_at(d, f)
    return out


LEFT_FIRST = 2
"""The step of the descent's smoothing (`dse.validate.descent.SMOOTHING`) a left-out fit begins at: the pass itself.
It starts at its key's fit, an optimum of the pass a sweep away, and needs no rounded kinks to reach its own: from
the first step, TPOT leave-group-out 10.40% (disaggregated 9.55%) on the NVIDIA and AMD/TPU runs, 10.34% (9.56%)
from the last, at two thirds of the left-out fits' cost."""


@dataclass
class KeyFits:
    """One key's decode-factor fit (`fit_key` of its terms and measured TPOTs from ``start``) and the fits that
    start from its factors (``left_out``: terms, measured TPOTs aligned with them, the rows each reads).
    """

    terms: DecodeTerms
    measured: np.ndarray
    start: dict
    left_out: list[tuple[DecodeTerms, np.ndarray, np.ndarray]]


def fit_keys(jobs: list[KeyFits]) -> list[tuple[dict, tuple[str, ...], list[dict]]]:
    """Per job, its key's factors and the factors it holds (`fit_key`), and the factors of each of its left-out
    fits, from the key's factors, holding the same (`fit_factors_many`).
    """
    out = []
    for j in jobs:
        fitted, held = fit_key(j.terms, j.measured, j.start)
        out.append((fitted, held, fit_factors_many([(d, m, fitted, rows) for d, m, rows in j.left_out], held,
                                                           LEFT_FIRST)))
    return out


# ---- the serving stack's terms ---------------------------------------------------------------------------------------
QUEUE_SHARES = np.linspace(0.0, 1.0, 101)
"""Grid of xi, the queue share of a closed loop (`dse.physics.queueing`): 0 when arrivals are staggered (each prompt
finds its server free), 1/2 when they come in synchronized waves (the median prompt of a wave waits for half of
it), up to 1 (the whole wave ahead, as when every prompt of the wave is prefilled before any first token returns)."""
FIXED_LATENCIES = np.linspace(0.0, 1.0, 101)
"""Grid of tau (seconds), the serving stack's fixed latency per request outside the forward passes (HTTP,
tokenization, scheduling, the first token's detokenization and streaming)."""


MIN_SWEEPS = 2
"""Concurrency sweeps a (framework, mode, model) needs for terms of its own, and a (framework, mode) for terms of
its own (two: each then predicted from the other, out of sample); with fewer, a model takes its framework and
mode's terms, and a mode the terms fitted on all the framework's rows."""


def stack_levels(fw: str, mode: str, model: str, family: str = "") -> tuple[str, ...]:
    """The keys of the stack terms a row of ``fw``, ``mode``, ``model`` and hardware ``family`` may take, the most
    specific first: the model's own on that framework and mode on the family (the same framework runs other kernels
    and a scheduler tuned for other chips, and disaggregated, a KV hand-off over the family's fabric with its
    transfer library: `dse.catalog.frameworks.Stack.terms_of`); the model's own on that framework and mode; the
    framework and mode's on the family, fitted on all its models' rows there (``fw|mode||family``: a model measured
    in too few sweeps for terms of its own, on a family its framework has sweeps on); the framework and mode's; the
    framework's.
    """
    own = (f"{fw}|{mode}|{model}|{family}",) if family else ()
    on_family = (f"{fw}|{mode}||{family}",) if family else ()  # every model's rows of the framework on the family
    return *own, f"{fw}|{mode}|{model}", *on_family, f"{fw}|{mode}", fw


def stack_families(t: pd.DataFrame) -> np.ndarray:
    """Each row's hardware family as `stack_levels` keys it ("" for a system of no family, which takes its model's
    terms, as `dse.catalog.frameworks.Stack.terms_of` gives them).
    """
    return np.array([family_of(str(s)) or "" for s in t["system"]], dtype=object).astype(str)


def stack_key_of(fits: dict, fw: str, mode: str, model: str, family: str = "") -> str | None:
    """The most specific key of `stack_levels` that ``fits`` (`fit_stack`'s) holds, None where it holds none."""
    return next((k for k in stack_levels(fw, mode, model, family) if k in fits), None)


def fit_stack(t: pd.DataFrame, groups: pd.Series, train: np.ndarray | None = None,
              ) -> tuple[dict, pd.Series, pd.Series]:
    """The serving stack's terms (xi, tau) minimizing the mean |log(predicted / measured)| TTFT on the grids, the
    prediction being the physics' closed-loop TTFT (`dse.physics.serving.closed_loop_ttft` of the rows'
    ``prefill_s``, ``transfer_s``, ``wave_s`` and ``wait_floor_s``), per key of `stack_levels`: a row takes the
    terms of the most specific key whose rows of ``train`` (default: all) span MIN_SWEEPS groups (its
    framework, mode and model; else its framework and mode; else its framework). Per model: the serving stacks'
    fixed latency and queue share differ by model on one framework (tokenizer and chat template, the kernels and
    scheduling paths a model's prefill takes: MLA, expert routing and dispatch), by as much as between frameworks.
    Returns the in-sample terms per key (`StackTerms`, with the rows and sweeps they were fitted on; every
    ``framework|mode`` of the rows has a key, with its framework's terms where it has none of its own) and both
    predictions of every row: in sample, and with the row's group (its concurrency sweep, or another partition)
    left out of its key's rows (a key left with no training row gives way to the next; none: no stack terms, the
    engine alone).
    """
    return fit_stack_sets(t, [groups], train)[0]


STACK_CHUNK = 1 << 20
"""Grid entries (rows x xi x tau) `fit_stack_sets` evaluates at once."""


def fit_stack_sets(t: pd.DataFrame, group_sets: list[pd.Series], train: np.ndarray | None = None,
                   ) -> list[tuple[dict, pd.Series, pd.Series]]:
    """`fit_stack` with each partition of ``group_sets``, the rows' errors on the grids computed once: summed per
    cell (framework, mode, model, training or not, and group of each partition), a fit's total is the sum of its
    cells and a left-out group's the total less the group's cells.
    """
    train = np.ones(len(t), dtype=bool) if train is None else np.asarray(train, dtype=bool)
    fw, mode, model = (t[c].astype(str).to_numpy() for c in ("backend", "mode", "model"))
    fam = stack_families(t)
    service, wave, floor = (t[c].to_numpy(dtype=float) for c in ("prefill_s", "wave_s", "wait_floor_s"))
    transfer = outside_stack(t)
    measured = t["measured_ttft_s"].to_numpy(dtype=float)
    keys = [fw, mode, model, fam, train, *(np.asarray(g) for g in group_sets)]
    cell = pd.MultiIndex.from_arrays(keys).factorize()[0] if len(t) else np.zeros(0, dtype=np.int64)
    order = np.argsort(cell, kind="stable")
    first = np.flatnonzero(np.r_[True, cell[order][1:] != cell[order][:-1]]) if len(t) else np.zeros(0, int)
    sums = np.zeros((len(first), len(QUEUE_SHARES) * len(FIXED_LATENCIES)))  # per cell, its rows' errors summed
    step = max(1, STACK_CHUNK // sums.shape[1])
    for lo in range(0, len(t), step):  # every row at every (xi, tau), its rows in cell order
        r = order[lo:lo + step]
        # `closed_loop_ttft`, operation for operation, at every grid point
        pred = (service[r, None] + np.maximum(QUEUE_SHARES[None, :] * wave[r, None], floor[r, None])
                + transfer[r, None])[:, :, None] + FIXED_LATENCIES[None, None, :]
        err = np.abs(np.log(pred / measured[r, None, None])).reshape(len(r), -1)
        starts = first[(first >= lo) & (first < lo + len(r))] - lo
        if not len(starts) or starts[0]:  # a cell begun in the previous chunk
            starts = np.r_[0, starts]
        part = np.add.reduceat(err, starts, axis=0)
        at = cell[r[starts]]
        sums[at] += part
    head = order[first]
    cell_fw, cell_mode, cell_model, cell_fam, cell_train = fw[head], mode[head], model[head], fam[head], train[head]
    pairs = sorted(set(zip(fw, mode, model, fam, strict=True)))

    def predict(rows: np.ndarray, ij: tuple[int, int] | None) -> np.ndarray:
        i, j = ij or (0, 0)
        return closed_loop_ttft(service[rows], transfer[rows], wave[rows],
                                StackTerms(queue_share=QUEUE_SHARES[i], fixed_latency_s=FIXED_LATENCIES[j]),
                                floor[rows])

    def best(cells: np.ndarray) -> tuple[int, int] | None:
        if not cells.any():
            return None
        return np.unravel_index(np.argmin(sums[cells].sum(axis=0)), (len(QUEUE_SHARES), len(FIXED_LATENCIES)))

    def level_masks(key: str) -> tuple[np.ndarray, np.ndarray]:  # a key's cells and rows: each part it names
        parts = key.split("|")
        cells, rows = cell_fw == parts[0], fw == parts[0]
        for part, c_col, r_col in zip(parts[1:], (cell_mode, cell_model, cell_fam), (mode, model, fam), strict=False):
            if part:
                cells, rows = cells & (c_col == part), rows & (r_col == part)
        return cells, rows

    level_cells, level_rows = {}, {}  # each key of `stack_levels`: its training cells and rows
    for f, m, md, fa in pairs:
        for key in stack_levels(f, m, md, fa):
            if key not in level_cells:
                cells, rows = level_masks(key)
                level_cells[key], level_rows[key] = cells & cell_train, rows & train
    out = []
    for g in group_sets:
        gk = np.asarray(g)
        cell_group = gk[head]
        fits, at, in_sample, loo = {}, {}, np.full(len(t), np.nan), np.full(len(t), np.nan)
        for key, cells in level_cells.items():
            sweeps = len(np.unique(cell_group[cells]))
            if sweeps >= MIN_SWEEPS or ("|" not in key and cells.any()):
                at[key] = i, j = best(cells)
                fits[key] = {"terms": StackTerms(queue_share=float(QUEUE_SHARES[i]),
                                                 fixed_latency_s=float(FIXED_LATENCIES[j])),
                             "rows": int(level_rows[key].sum()), "sweeps": sweeps}
        for f, m, md, fa in pairs:
            rows = np.flatnonzero((fw == f) & (mode == m) & (model == md) & (fam == fa))
            own = [k for k in stack_levels(f, m, md, fa) if k in fits]
            in_sample[rows] = predict(rows, at[own[0]] if own else None)
            for name in np.unique(gk[rows]):
                mine = rows[gk[rows] == name]
                left = (best(level_cells[k] & (cell_group != name)) for k in own)
                loo[mine] = predict(mine, next((ij for ij in left if ij is not None), None))
        for f, m in set(zip(fw, mode, strict=True)):  # a mode without terms of its own takes the framework's
            if f"{f}|{m}" not in fits and f in fits:
                fits[f"{f}|{m}"] = fits[f]
        out.append((fits, pd.Series(in_sample, index=t.index), pd.Series(loo, index=t.index)))
    return out


# ---- the training fits -----------------------------------------------------------------------------------------------
def bounded_least_squares(residuals, x0: np.ndarray, lo: np.ndarray, hi: np.ndarray,
                          max_nfev: int = 200) -> tuple[np.ndarray, float]:
    """Least squares of ``residuals(x)`` within [lo, hi] from ``x0`` (scipy's trust-region reflective, Jacobian
    scaling): the optimum and its objective (half the sum of squares). The training-step fits
    (`dse.validate.training`) run through it.
    """
    from scipy.optimize import least_squares

    res = least_squares(residuals, x0, bounds=(lo, hi), x_scale="jac", max_nfev=max_nfev)
    return res.x, float(res.cost)
