"""The decode-factor fits' minimizer (`dse.validate.fit.fit_factors`): sum |log(TPOT / measured)| over each fit's
rows, many fits on one set of rows at once, by a damped Gauss-Newton descent on reweighted least squares.

The loss is smoothed in `SMOOTHING` steps: |r| as sqrt(r^2 + eps^2), and each max of a pass (a row's roofline
turning from compute to memory, its pass from work to communication) rounded over a relative width of its tie,
both lowered in turn down to the pass itself and an eps of 1e-4 (the loss within 1e-4 per row of sum |r|). At each
step, each fit minimizes the quadratic that bounds its smoothed loss from above at its current log errors r (weights
1 / sqrt(r^2 + eps^2): iteratively reweighted least squares), the log errors linearized by their Jacobian
(`dse.validate.losses.log_tpot`, Gauss-Newton), damped as Levenberg-Marquardt does (the diagonal scaled by
1 + lambda), within each factor's range: a coordinate at a bound whose gradient points out of the range is held
there. A step is kept where it lowers the smoothed loss by more than the step's tolerance times the loss (lambda then
shrinks) and refused where it raises it (lambda grows); a fit moves to the next smoothing once a step gains less
than that (it is not taken), or once no step lowers the loss (lambda past `STUCK`). A fit that ends no lower than its
start (exact loss) returns its start: a fit begun at its optimum stays there to the last bit.

The coordinates are those of `dse.validate.losses.to_coords`, in which a decode pass is linear but for one
product: a fixed time or length at 0 still has a slope there, and a share's reciprocal moves a time at the peak in
proportion. Every fit of one call advances together, each on its own rows (``use``), until each has converged: a
round costs a handful of array operations whatever the number of fits.
"""

from __future__ import annotations

import numpy as np

from dse.validate.factors import FACTOR, FACTORS
from dse.validate.losses import RECIPROCAL, from_coords, log_tpot, to_coords

SMOOTHING = ((1e-2, 1e-2, 1e-5), (1e-3, 1e-3, 1e-5), (1e-4, 0.0, 1e-6))
"""The smoothing in turn: eps of |r| (log errors), the relative width over which each max of a pass is rounded
(`dse.validate.losses.log_tpot`) and the tolerance of a step (the share of the loss it must gain to be kept). The
first rounds the kinks of the loss, where a row's error changes sign and where its pass turns from one bound to
another, so that the first steps see the slope of many rows and cross kinks a descent on the pass itself stops at
(on the measured runs, without the rounded maxes, one key of ten ended 0.1% to 32% above Nelder-Mead's loss as the
steps of eps went; 0.03% above with them); the last is the pass itself. A tolerance of 1e-6 at every step, with or
without a fourth (eps and width 1e-4), lowered no key's loss by more than 0.02% and no left-out fit's by more than
0.06%, at 1.1 to 1.8 times the cost."""
DAMPING, SHRINK, GROW, STUCK = 1e-3, 3.0, 4.0, 1e10
"""Levenberg-Marquardt's lambda: its start (at each eps), what a kept step divides it by, what a refused one
multiplies it by, and where a fit has no step left that lowers its loss."""
MAX_ROUNDS = 1000
"""Steps a fit takes at most (the 320 decode fits of the measured runs take 7 to 166, median 28)."""
LOG_LO = np.array([FACTOR[k].log_range[0] for k in FACTORS])
LOG_HI = np.array([FACTOR[k].log_range[1] for k in FACTORS])
LO = to_coords(np.where(RECIPROCAL, LOG_HI, LOG_LO))
HI = to_coords(np.where(RECIPROCAL, LOG_LO, LOG_HI))
"""Each factor's range in the coordinates of `to_coords`."""


def _smoothed(r: np.ndarray, use: np.ndarray, eps: np.ndarray) -> np.ndarray:
    return np.add.reduce(use * np.sqrt(r * r + (eps * eps)[:, None]), axis=1)


def descend(t: np.ndarray, log_measured: np.ndarray, use: np.ndarray, x0: np.ndarray, free: np.ndarray,
            first: int = 0) -> np.ndarray:
    """Minimize, for each fit, sum |log TPOT - log measured| over its rows, from its start.

    ``t``: the rows' terms (`dse.validate.losses.term_rows`, `TERMS` x rows) and ``log_measured`` their measured
    log TPOTs; per fit (the first axis of the rest): ``use``, the rows it reads (fits x rows, bool); ``x0``, the
    log of each factor of `FACTORS` at its start (fits x factors; clipped to the factors' ``log_range``);
    ``free``, the factors it moves (the others stay at their start); ``first``, the step of `SMOOTHING` the fits
    begin at (2: the pass itself, for fits that start at or near an optimum). Returns the logs of the factors
    fitted.
    """
    fits = len(x0)
    weight = np.asarray(use, dtype=np.float64)
    eps, width, tol = np.array(SMOOTHING).T
    p = to_coords(np.clip(x0, LOG_LO, LOG_HI))
    p0, weight0, out = p.copy(), weight, p.copy()
    cols = np.flatnonzero(np.any(free, axis=0))  # the coordinates some fit moves
    free, lo, hi = np.asarray(free, dtype=bool)[:, cols], LO[cols], HI[cols]
    at = np.arange(fits)  # the fits still descending, and their state
    level = np.full(fits, first, dtype=np.int64)
    rounds, damping = np.zeros(fits, dtype=np.int64), np.full(fits, DAMPING)
    log, jac = log_tpot(t, p, width=width[level], columns=cols)
    r = log - log_measured
    loss = _smoothed(r, weight, eps[level])
    diag = np.arange(len(cols))
    while len(at):
        w = weight / np.sqrt(r * r + (eps[level] ** 2)[:, None])
        jw = jac * w[:, None, :]
        g = np.matmul(jw, r[:, :, None])[:, :, 0]
        h = np.matmul(jw, jac.transpose(0, 2, 1))
        scale = h[:, diag, diag].copy()
        x = p[:, cols]
        held = ~free | ((x <= lo) & (g > 0)) | ((x >= hi) & (g < 0)) | (scale <= 0)
        h[held] = 0.0
        h.transpose(0, 2, 1)[held] = 0.0
        g[held] = 0.0
        scale[held] = 0.0
        h[:, diag, diag] += damping[:, None] * scale + held
        trial = p.copy()
        trial[:, cols] = np.clip(x - np.linalg.solve(h, g[:, :, None])[:, :, 0], lo, hi)
        log, trial_jac = log_tpot(t, trial, width=width[level], columns=cols)
        trial_r = log - log_measured
        trial_loss = _smoothed(trial_r, weight, eps[level])
        gain = loss - trial_loss
        kept = gain > tol[level] * loss
        p[kept], r[kept], jac[kept], loss[kept] = trial[kept], trial_r[kept], trial_jac[kept], trial_loss[kept]
        damping = np.where(kept, np.maximum(damping / SHRINK, 1e-12), damping * GROW)
        rounds += 1
        converged = ~kept & ((gain > 0) | (damping > STUCK))
        if converged.any():
            level[converged] += 1
            damping[converged] = DAMPING
            going = converged & (level < len(eps))
            if going.any():  # the loss and its slope at the next smoothing
                log, jac[going] = log_tpot(t, p[going], width=width[level[going]], columns=cols)
                r[going] = log - log_measured
                loss[going] = _smoothed(r[going], weight[going], eps[level[going]])
        done = (level >= len(eps)) | (rounds >= MAX_ROUNDS)
        if done.any():
            out[at[done]] = p[done]
            keep = ~done
            at, p, r, jac, loss, weight, free = at[keep], p[keep], r[keep], jac[keep], loss[keep], weight[keep], free[
                keep]
            level, rounds, damping = level[keep], rounds[keep], damping[keep]
    start, end = (np.add.reduce(weight0 * np.abs(log_tpot(t, q, False)[0] - log_measured), axis=1) for q in (p0, out))
    out[end >= start] = p0[end >= start]  # no lower than its start: the start (where the fit began at its optimum)
    return np.clip(from_coords(out), LOG_LO, LOG_HI)
