"""Nelder-Mead iterate for iterate as scipy runs it, `minimize(method="Nelder-Mead")` (standard
coefficients, scipy's initial simplex and stopping tests), at a fraction of its bookkeeping: one problem
(`nelder_mead`, in plain floats), or many independent problems at once (`minimize_many`, each restarted from
its own optimum while a run still gains).

Every problem takes exactly the steps scipy would take for it: the same trial points, computed by the same
floating-point operations in the same order, hence the same iterates and the same result. In `minimize_many`
the problems advance together, one iteration of each per round, and the objective is asked for the trial
points of all of them in one call, so an objective evaluated on arrays pays its fixed costs once per round
instead of once per point.
"""

from __future__ import annotations

import bisect
import math
import operator
from collections.abc import Callable

import numpy as np

NONZDELT, ZDELT = 0.05, 0.00025
"""The initial simplex (scipy's): each coordinate of the start moved by 5% in turn (to 0.00025 where it is 0)."""
REFLECT, EXPAND, CONTRACT_OUT, CONTRACT_IN = (2, 1), (3, 2), (1.5, 0.5), (0.5, -0.5)
"""Trial points a xbar - b x_worst, with scipy's coefficients rho = 1, chi = 2, psi = 1/2: reflection
(1 + rho, rho), expansion (1 + rho chi, rho chi), outside contraction (1 + psi rho, psi rho) and inside
contraction (1 - psi, -psi) (scipy's xbar (1 - psi) + psi x_worst: subtracting -psi x_worst is adding psi x_worst,
to the last bit)."""
SHRINK = 0.5
"""sigma: a shrink moves every vertex but the best halfway to it."""

Requests = list[tuple[np.ndarray, np.ndarray]]
Objective = Callable[[Requests], list[np.ndarray]]
"""The objective of `minimize_many`: for each request (problem numbers (m,), points (m, n)), the m values."""


class _Runs:
    """The problems of one dimension n: the best point and value of each over its runs so far and its runs
    made, and the runs in progress (simplex, values, iterations) of those still running, kept together.
    """

    def __init__(self, ids: np.ndarray, x0: np.ndarray, max_iter: np.ndarray, passes: np.ndarray, xatol: float,
                 fatol: float, gain: float) -> None:
        self.ids, self.n = ids, x0.shape[1]
        self.xbest, self.best = np.array(x0, dtype=np.float64), np.full(len(ids), np.nan)
        self.runs = np.zeros(len(ids), dtype=np.int64)
        self.max_iter, self.passes = max_iter, passes
        self.xatol, self.fatol, self.gain = xatol, fatol, gain
        self.starting = np.arange(len(ids))  # problems whose next run starts this round
        self._running(np.zeros(0, dtype=np.int64), np.zeros((0, self.n + 1, self.n)), np.zeros((0, self.n + 1)),
                      np.zeros(0, dtype=np.int64))

    def _running(self, at: np.ndarray, sim: np.ndarray, fsim: np.ndarray, it: np.ndarray) -> None:
        self.at, self.sim, self.fsim, self.it = at, sim, fsim, it
        self.at_ids, self.limit = self.ids[at], self.max_iter[at]
        self.row = np.arange(len(at))[:, None]

    @property
    def live(self) -> bool:
        return bool(len(self.at) or len(self.starting))

    def _end(self, ended: np.ndarray) -> None:
        """End the runs of ``ended``: scipy's result of each (the best vertex, the smallest value), then the
        restart rule: a run that lowered the best value by at most ``gain`` of it, or the last run allowed, ends
        its problem; the others start again from their best point.
        """
        p = self.at[ended]
        fun = np.min(self.fsim[ended], axis=1)
        gained = self.best[p] - fun
        better = fun < self.best[p]
        self.xbest[p[better]] = self.sim[ended][better, 0]
        self.best[p[better]] = fun[better]
        self.runs[p] += 1
        again = (gained > self.gain * self.best[p]) & (self.runs[p] < self.passes[p])
        self.starting = np.concatenate([self.starting, p[again]])
        keep = ~ended
        self._running(self.at[keep], self.sim[keep], self.fsim[keep], self.it[keep])

    def step(self):
        """One round, as a generator yielding the requests of each stage and receiving their values: runs at
        their iteration limit or converged end (and restart or stop), new runs evaluate their initial simplex,
        the others make one Nelder-Mead iteration.
        """
        n = self.n
        if len(self.at):  # scipy's tests: the iteration limit, then every vertex within xatol of the best and
            # every value within fatol
            ended = self.it >= self.limit
            ended |= ((np.abs(self.sim[:, 1:] - self.sim[:, :1]).max(axis=(1, 2)) <= self.xatol)
                      & (np.abs(self.fsim[:, :1] - self.fsim[:, 1:]).max(axis=1) <= self.fatol))
            if ended.any():
                self._end(ended)
        sim, fsim, new = self.sim, self.fsim, self.starting
        requests = []
        if len(new):  # scipy's initial simplex: the start, and the start with each coordinate moved in turn
            self.starting = new[:0]
            x = self.xbest[new]
            start = np.repeat(x[:, None, :], n + 1, axis=1)
            diag = np.arange(n)
            start[:, diag + 1, diag] = np.where(x != 0, (1 + NONZDELT) * x, ZDELT)
            requests.append((np.repeat(self.ids[new], n + 1), start.reshape(-1, n)))
        if len(self.at):
            xbar = np.add.reduce(sim[:, :-1], axis=1) / n
            worst = sim[:, -1]
            xr = REFLECT[0] * xbar - worst  # REFLECT[1] = 1
            requests.append((self.at_ids, xr))
        values = yield requests
        if len(self.at):
            fxr = values[-1]
            lt0, lt2, lt1 = fxr < fsim[:, 0], fxr < fsim[:, -2], fxr < fsim[:, -1]
            second = lt0 | ~lt2  # expand, or contract (outside where below the worst value, else inside)
            f2, x2 = np.full(len(fxr), np.inf), xr[:0]
            if second.any():
                coef = _COEF[np.where(lt0, 0, np.where(lt1, 1, 2))[second]]
                x2 = coef[:, :1] * xbar[second] - coef[:, 1:] * worst[second]
                (f2[second],) = yield [(self.at_ids[second], x2)]
            # the worst vertex's replacement, as scipy picks it: the expansion if it beats the reflection; the
            # reflection if it beats the best or the second worst; a contraction if it beats the reflection
            # (outside) or the worst (inside); else a shrink
            use2 = np.where(lt0, f2 < fxr, ~lt2 & np.where(lt1, f2 <= fxr, f2 < fsim[:, -1]))
            shrink = ~(lt0 | lt2 | use2)
            take_r = ~(use2 | shrink)
            sim[use2, -1] = x2[use2[second]]
            fsim[use2, -1] = f2[use2]
            sim[take_r, -1] = xr[take_r]
            fsim[take_r, -1] = fxr[take_r]
            if shrink.any():
                s = sim[shrink]
                s[:, 1:] = s[:, :1] + SHRINK * (s[:, 1:] - s[:, :1])
                (fs,) = yield [(np.repeat(self.at_ids[shrink], n), s[:, 1:].reshape(-1, n))]
                sim[shrink] = s
                fsim[shrink, 1:] = fs.reshape(-1, n)
            self.it += 1
            order = np.argsort(fsim, axis=1)
            self.sim, self.fsim = sim[self.row, order], fsim[self.row, order]
        if len(new):
            f = values[0].reshape(-1, n + 1)
            first = self.runs[new] == 0
            self.best[new[first]] = f[first, 0]  # the value at the start point, before the first run
            row = np.arange(len(new))[:, None]
            for _ in range(2):  # scipy sorts an initial simplex twice
                order = np.argsort(f, axis=1)
                start, f = start[row, order], f[row, order]
            self._running(np.concatenate([self.at, new]), np.concatenate([self.sim, start]),
                          np.concatenate([self.fsim, f]), np.concatenate([self.it, np.ones(len(new), np.int64)]))


_COEF = np.array([EXPAND, CONTRACT_OUT, CONTRACT_IN], dtype=np.float64)


def nelder_mead(func: Callable[[np.ndarray], float], x0: np.ndarray, max_iter: int, xatol: float = 1e-4,
                fatol: float = 1e-4) -> tuple[np.ndarray, float]:
    """Nelder-Mead on one problem, its bookkeeping in plain floats.

    Iterate for iterate scipy's ``minimize(func, x0, method="Nelder-Mead", options={"maxiter": max_iter,
    "xatol": xatol, "fatol": fatol})``; returns its ``x`` and ``fun``. (Sums are written out left to right:
    scipy's reductions of the simplex add its vertices in order.)
    """
    n = len(x0)
    start = [float(v) for v in x0]
    sim = [start] + [start[:k] + [(1 + NONZDELT) * start[k] if start[k] != 0 else ZDELT] + start[k + 1:]
                     for k in range(n)]
    fsim = [func(np.array(v)) for v in sim]
    for _ in range(2):  # scipy sorts the initial simplex twice
        sim, fsim = _sorted(sim, fsim)
    clean = len(set(fsim)) == len(fsim) and not any(map(math.isnan, fsim))  # `_sorted`'s plain sort applies
    iterations = 1
    while iterations < max_iter:
        best, f_best = sim[0], fsim[0]
        # scipy's test (x first, then the values: no matter, neither acts); the values are sorted, so the one
        # farthest from the best is the last
        if (abs(f_best - fsim[-1]) <= fatol
                and all(abs(v - b) <= xatol for vertex in sim[1:] for v, b in zip(vertex, best, strict=True))):
            break
        total = sim[0]
        for vertex in sim[1:-1]:  # the vertices added in order, coordinate by coordinate
            total = list(map(operator.add, total, vertex))
        xbar = [a / n for a in total]
        worst = sim[-1]
        xr = [REFLECT[0] * a - w for a, w in zip(xbar, worst, strict=True)]  # REFLECT[1] = 1
        fxr = func(np.array(xr))
        shrink = False
        if fxr < f_best:
            xe = [EXPAND[0] * a - EXPAND[1] * w for a, w in zip(xbar, worst, strict=True)]
            fxe = func(np.array(xe))
            sim[-1], fsim[-1] = (xe, fxe) if fxe < fxr else (xr, fxr)
        elif fxr < fsim[-2]:
            sim[-1], fsim[-1] = xr, fxr
        else:
            a_, b_ = CONTRACT_OUT if fxr < fsim[-1] else CONTRACT_IN
            xc = [a_ * a - b_ * w for a, w in zip(xbar, worst, strict=True)]
            fxc = func(np.array(xc))
            if fxc <= fxr if fxr < fsim[-1] else fxc < fsim[-1]:
                sim[-1], fsim[-1] = xc, fxc
            else:
                shrink = True
        if shrink:
            sim = [best] + [[b + SHRINK * (v - b) for v, b in zip(vertex, best, strict=True)] for vertex in sim[1:]]
            fsim = [f_best] + [func(np.array(v)) for v in sim[1:]]
        iterations += 1
        f_new = fsim[-1]
        if not shrink and clean and f_new == f_new and f_new not in fsim[:-1]:
            # one new vertex among values sorted, distinct and not NaN: its place is where a sort puts it
            at = bisect.bisect_left(fsim, f_new, 0, n)
            sim.insert(at, sim.pop())
            fsim.insert(at, fsim.pop())
        else:
            sim, fsim = _sorted(sim, fsim)
            clean = len(set(fsim)) == len(fsim) and not any(map(math.isnan, fsim))
    return np.array(sim[0]), min(fsim)


def _sorted(sim: list, fsim: list) -> tuple[list, list]:
    """The vertices and values in numpy's argsort order of the values: any sort's where they are distinct
    (and not NaN), numpy's own where two tie (its order of equal values is its own).
    """
    if len(set(fsim)) == len(fsim) and not any(map(math.isnan, fsim)):
        order = sorted(range(len(fsim)), key=fsim.__getitem__)
    else:
        order = np.argsort(np.array(fsim)).tolist()
    return [sim[i] for i in order], [fsim[i] for i in order]


def minimize_many(objective: Objective, x0: list[np.ndarray], max_iter: np.ndarray, passes: np.ndarray,
                  xatol: float = 1e-4, fatol: float = 1e-4, gain: float = 0.0) -> tuple[list[np.ndarray], np.ndarray]:
    """Minimize problem i (numbered by its place in ``x0``) from ``x0[i]`` by Nelder-Mead, as
    ``minimize(f_i, x0[i], method="Nelder-Mead", options={"maxiter": max_iter[i], "xatol": xatol,
    "fatol": fatol})`` would, then again from that run's best point while a run lowers the best value by more
    than ``gain`` of it, ``passes[i]`` runs at most. Returns the best point and value of each problem.

    ``objective`` gets, once per stage of a round, the trial points of every problem that needs some (a
    request holds problems of one dimension) and returns their values; a point's value must not depend on
    the others asked with it.
    """
    k = len(x0)
    dims = np.array([len(x) for x in x0])
    groups = [_Runs(ids, np.array([x0[i] for i in ids], dtype=np.float64).reshape(len(ids), n),
                    np.broadcast_to(max_iter, (k,))[ids], np.broadcast_to(passes, (k,))[ids], xatol, fatol, gain)
              for n in np.unique(dims) for ids in [np.flatnonzero(dims == n)]]
    while any(g.live for g in groups):
        pending = {}
        for g in groups:
            if g.live:
                stage = g.step()
                pending[stage] = next(stage)
        while pending:
            asked = [r for reqs in pending.values() for r in reqs]
            answers = iter(objective(asked) if asked else ())
            following = {}
            for stage, reqs in pending.items():
                try:
                    following[stage] = stage.send([next(answers) for _ in reqs])
                except StopIteration:
                    pass
            pending = following
    out = [np.zeros(0)] * k
    best = np.zeros(k)
    for g in groups:
        for j, i in enumerate(g.ids):
            out[i] = g.xbest[j].copy()
        best[g.ids] = g.best
    return out, best
