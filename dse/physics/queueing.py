"""Waiting at the prefill servers, as a request sees it: the waiting-time distribution of the M/D/1 queue (Poisson
arrivals, open loop: production traffic), the wait of a closed loop's synchronized waves (a benchmark holding N
requests in flight), and the quantiles of a request's TTFT and TPOT that follow from them.

**M/D/1** (Poisson arrivals at rate lambda, deterministic service S, utilisation rho = lambda S). In units of S,
x = t / S, the waiting time's distribution depends on rho alone. Below ``rho x = EXACT_RHO_X`` it is Erlang's and
Crommelin's closed form (Crommelin 1932; Kleinrock, *Queueing Systems* vol. 1, problem 5.8)

    P(W <= x S) = (1 - rho) sum_{j=0}^{floor(x)} (rho (j - x))^j / j! e^{rho (x - j)},

whose alternating terms stay within e^{2 rho x} of the result (at most about 1e7: 9 digits kept); above, the
Cramer-Lundberg tail, exact in the limit: P(W > x S) -> C e^{-y x}, with y > 0 the root of rho (e^y - 1) = y
(y = -W_{-1}(-rho e^{-rho}) - rho, W_{-1} the lower branch of Lambert's W) and C = (1 - rho) / (rho e^y - 1).
The tail's relative error is of order e^{-(Re s_1 - y) x}, s_1 the next root of the characteristic equation
(Re s_1 about ln(2 pi / rho)), below 1e-6 wherever it is used (`tests/test_queueing.py` checks both pieces against
each other and against a simulation of Lindley's recursion); y is found by Newton's method (numpy alone: no scipy on
the command line's paths). Quantiles come from a table per quantile q of
x_q(rho): below one service time in closed form, x_q = ln(q / (1 - rho)) / rho (0 where the atom P(W = 0) = 1 - rho
covers q); above, on a grid of z = -ln(1 - rho) ``GRID_STEP`` apart from the utilisation where x_q = 1, each node
solved by bisection on the distribution and read by linear interpolation in z (error below 1e-5 (1 + x_q), tested);
past the grid, the tail's quantile ln(C / (1 - q)) / y. x_q is nondecreasing in rho, as in the queue, so a target
on a quantile stays a bound on rho (`rho_for_wait_quantile` inverts it). The tables of `QUANTILES` ship with the
package (`TABLES_FILE`, written by ``scripts/make_md1_tables.py``), so a command reads them instead of building them.

**Closed loop** (a benchmark: N requests in flight, each replaced as it completes). Requests started together
with identical lengths finish together and come back together: in a synchronized wave a prompt waits for the
prompts queued ahead of it, n - 1 others at its prefill server at most, each costing S_b (its share of a pass
carrying a full chunk of prompts); a scheduler that mixes prefill chunks into decode passes staggers the waves,
one that runs prefill batches apart re-synchronizes them. The wait is taken as uniform on [0, 2 xi (n - 1) S_b],
with xi, the *queue share* (mean wait / (n - 1) S_b: 1/2 for a fully synchronized wave, 0 for perfectly staggered
arrivals), a property of the serving stack fitted per framework and mode from measured runs
(`dse.catalog.frameworks`). Its q-quantile is 2 q xi (n - 1) S_b.

**TPOT of one request** (aggregated serving): its m decode passes each take t_d, and those that carry a prefill
chunk t_c more. Chunks arrive with the requests, ``c`` consecutive chunks per prompt; the prompts reaching a
replica during a request's decode are taken as Poisson (as the arrivals are; in a closed loop, an approximation),
so the chunks it meets are c x Poisson(mu / c) with mu = u m t_d / ((1 - u) t_c), u the prefill share of the
replica's time (the mean is then the request-level TPOT). Its q-quantile is (m t_d + c k_q t_c) / (m a), k_q the
Poisson quantile (`poisson_quantile`).
"""

from __future__ import annotations

import math
from functools import lru_cache
from pathlib import Path
from statistics import NormalDist

import numpy as np

EXACT_RHO_X = 8.0
"""Below this rho x the M/D/1 waiting-time distribution is Crommelin's closed form; above, its exponential tail."""
GRID_STEP = 1e-3
"""Spacing of the quantile tables in z = -ln(1 - rho)."""
GRID_Z_MAX = 12.0
"""The tables reach rho = 1 - e^{-12} (1 - 6e-6); past it, the tail's quantile."""
QUANTILES = (0.5, 0.9, 0.99)
"""The quantiles a workload may set a target on and a result reports (``ttft_p50_s``, ``ttft_p90_s``, ...)."""
BISECTION_STEPS = 64
TAIL_NEWTON_STEPS = 40
"""Newton steps for the tail's exponent (quadratic near the root; a few more from a start far right of it)."""
TABLES_FILE = Path(__file__).with_name("md1_wait_quantiles.npz")
"""`build_table` of each of `QUANTILES`, as ``scripts/make_md1_tables.py`` writes them (a test rebuilds them and
finds the same numbers): a command that sets a target on a quantile reads its table instead of building it."""
POISSON_EXACT_MEAN = 50.0
"""Below this mean a Poisson quantile is the cumulative sum's; above, the Cornish-Fisher expansion's."""


def quantile_name(q: float) -> str:
    """The key fragment of a quantile: 0.9 -> ``p90``, 0.99 -> ``p99``, 0.5 -> ``p50``."""
    return "p" + f"{q * 100:g}".replace(".", "_")


def tail(rho: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The exponential tail of the M/D/1 wait, P(W > x S) -> C e^{-y x}: (y, C) per rho in (0, 1).

    y is the positive root of h(y) = rho (e^y - 1) - y. h is convex with h(0) = 0 and h'(0) = rho - 1 < 0, and
    both 2 (1 - rho) / rho (since e^y >= 1 + y + y^2 / 2) and 2 ln(1 / rho) + 2 (where rho e^y = e^2 / rho) lie
    right of the root, so Newton's method from the smaller closes in from the right, monotonically;
    C = (1 - rho) / (rho e^y - 1).
    """
    rho = np.asarray(rho, dtype=np.float64)
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        y = np.minimum(2.0 * (1.0 - rho) / rho, 2.0 * np.log(1.0 / rho) + 2.0)
        for _ in range(TAIL_NEWTON_STEPS):
            y = y - (rho * np.expm1(y) - y) / (rho * np.exp(y) - 1.0)
        c = (1.0 - rho) / (rho * np.exp(y) - 1.0)
    return y, c


def wait_cdf(x: np.ndarray, rho: np.ndarray) -> np.ndarray:
    """P(W <= x S) of the M/D/1 queue at utilisation rho (x = t / S >= 0), vectorized: Crommelin's closed form
    where rho x <= EXACT_RHO_X, the Cramer-Lundberg tail beyond.
    """
    x, rho = np.broadcast_arrays(np.asarray(x, dtype=np.float64), np.asarray(rho, dtype=np.float64))
    return _wait_cdf(x, rho, *tail(rho))


def _wait_cdf(x: np.ndarray, rho: np.ndarray, y: np.ndarray, c: np.ndarray) -> np.ndarray:
    """`wait_cdf` with the tail's (y, C) of ``rho`` given (a bisection at fixed rho computes them once). The
    closed form's j-th term is nonzero where x >= j only: each term is computed on those entries alone (sorted by
    x, a prefix), the same operations on the same values as over the whole array.
    """
    x = np.maximum(x, 0.0)
    exact = rho * x <= EXACT_RHO_X
    xe = np.where(exact, x, 0.0).ravel()
    order = np.argsort(-xe, kind="stable")
    xs, rs = xe[order], rho.ravel()[order]
    k_max = int(np.floor(xs[0])) if xs.size else 0
    total = np.zeros_like(xs)
    for j in range(k_max + 1):
        n = int(np.searchsorted(-xs, -float(j), side="right"))  # the entries with x >= j
        d, r = xs[:n] - j, rs[:n]
        total[:n] = total[:n] + (-r * d) ** j / math.factorial(j) * np.exp(r * d)
    closed = np.empty_like(total)
    closed[order] = total
    with np.errstate(over="ignore", invalid="ignore"):
        approx = 1.0 - c * np.exp(-y * x)
    return np.where(exact, np.clip((1.0 - rho) * closed.reshape(x.shape), 0.0, 1.0), approx)


def _quantile_direct(q: float, rho: np.ndarray) -> np.ndarray:
    """x_q(rho) by bisection on `wait_cdf` (0 where the atom 1 - rho covers q)."""
    rho = np.asarray(rho, dtype=np.float64)
    y, c = tail(rho)
    with np.errstate(divide="ignore", invalid="ignore"):
        guess = np.log(np.maximum(c, 1e-300) / (1.0 - q)) / y
    hi = np.maximum(np.where(np.isfinite(guess), 2.0 * guess, 1.0), 1.0) + 1.0
    for _ in range(8):  # widen until the bracket holds the quantile
        short = _wait_cdf(hi, rho, y, c) < q
        if not short.any():
            break
        hi = np.where(short, 2.0 * hi, hi)
    lo = np.zeros_like(hi)
    for _ in range(BISECTION_STEPS):
        mid = 0.5 * (lo + hi)
        below = _wait_cdf(mid, rho, y, c) < q
        lo = np.where(below, mid, lo)
        hi = np.where(below, hi, mid)
    return np.where(1.0 - rho >= q, 0.0, hi)


def _first_piece(q: float, rho: np.ndarray) -> np.ndarray:
    """x_q where it is below one service time: P(W <= x S) = (1 - rho) e^{rho x} there, so x_q = ln(q / (1 - rho))
    / rho (0 where the atom covers q); valid while (1 - rho) e^rho >= q.
    """
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.maximum(np.log(q / (1.0 - rho)) / rho, 0.0)


def _rho_one(q: float) -> float:
    """The utilisation at which the q-quantile wait is one service time: (1 - rho) e^rho = q, by bisection."""
    lo, hi = 1.0 - q, 1.0
    for _ in range(BISECTION_STEPS * 2):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if (1.0 - mid) * np.exp(mid) >= q else (lo, mid)
    return lo


def build_table(q: float) -> tuple[np.ndarray, np.ndarray]:
    """The grid z from the utilisation where x_q = 1 (`_rho_one`: below it the first piece is closed-form) and
    x_q at each node, nondecreasing.
    """
    z1 = -np.log1p(-_rho_one(q))
    z = np.arange(z1, GRID_Z_MAX + GRID_STEP / 2, GRID_STEP)
    x = _quantile_direct(q, -np.expm1(-z))
    x[0] = 1.0
    return z, np.maximum.accumulate(x)  # nondecreasing as in the queue (drops bisection noise in the last bit)


def table_parameters() -> np.ndarray:
    """The settings a table depends on, stored beside the shipped tables: a table is read from the file only when
    they are today's.
    """
    return np.array([GRID_STEP, GRID_Z_MAX, EXACT_RHO_X, BISECTION_STEPS, TAIL_NEWTON_STEPS], dtype=np.float64)


@lru_cache(maxsize=1)
def _shipped() -> dict[float, tuple[np.ndarray, np.ndarray]]:
    """The tables of `TABLES_FILE` by quantile (none when its parameters are not today's)."""
    try:
        data = np.load(TABLES_FILE, allow_pickle=False)
    except OSError:
        return {}
    with data:
        if not np.array_equal(data["parameters"], table_parameters()):
            return {}
        return {float(q): (data[f"z{i}"], data[f"x{i}"]) for i, q in enumerate(data["quantiles"])}


@lru_cache(maxsize=8)
def _table(q: float) -> tuple[np.ndarray, np.ndarray]:
    """`build_table` of q: read from `TABLES_FILE` where it holds q, else built (some 0.1 s of CPU per table)."""
    return _shipped().get(q) or build_table(q)


def wait_quantile(q: float, rho: np.ndarray) -> np.ndarray:
    """x_q(rho) = (the q-quantile of the M/D/1 wait) / S, vectorized over rho in [0, 1); inf at rho >= 1."""
    rho = np.asarray(rho, dtype=np.float64)
    z_grid, x_grid = _table(float(q))
    with np.errstate(divide="ignore", invalid="ignore"):
        z = -np.log1p(-np.clip(rho, 0.0, 1.0))
        out = np.interp(np.minimum(z, GRID_Z_MAX), z_grid, x_grid)
        y, c = tail(rho)
        far = np.log(np.maximum(c, 1e-300) / (1.0 - q)) / y
    out = np.where(z > GRID_Z_MAX, np.maximum(far, x_grid[-1]), out)
    out = np.where(z < z_grid[0], _first_piece(q, rho), out)
    return np.where(rho >= 1.0, np.inf, np.where(rho <= 0.0, 0.0, out))


def rho_for_wait_quantile(q: float, budget: np.ndarray) -> np.ndarray:
    """The highest utilisation whose q-quantile wait is at most ``budget`` service times: the inverse of
    `wait_quantile` on its table (NaN where the budget is negative; 1 - q where it is 0, the atom alone).
    """
    budget = np.asarray(budget, dtype=np.float64)
    z_grid, x_grid = _table(float(q))
    z = np.interp(budget, x_grid, z_grid, right=np.inf)
    rho = np.where(np.isinf(z), 1.0, -np.expm1(-z))
    # below one service time, the closed form's inverse: x_q rises with rho on [1 - q, rho where x_q = 1]
    lo, hi = np.full(budget.shape, 1.0 - q), np.full(budget.shape, -np.expm1(-z_grid[0]))
    for _ in range(BISECTION_STEPS):
        mid = 0.5 * (lo + hi)
        ok = _first_piece(q, mid) <= budget
        lo, hi = np.where(ok, mid, lo), np.where(ok, hi, mid)
    rho = np.where(budget < 1.0, lo, rho)
    return np.where(budget < 0, np.nan, rho)


def wave_wait_quantile(q: float, queue_share: np.ndarray | float, wave_s: np.ndarray) -> np.ndarray:
    """The q-quantile of a closed loop's wait: uniform on [0, 2 xi (n - 1) S_b] (``wave_s`` = (n - 1) S_b)."""
    return 2.0 * q * np.asarray(queue_share, dtype=np.float64) * np.asarray(wave_s, dtype=np.float64)


def poisson_quantile(q: float, mu: np.ndarray) -> np.ndarray:
    """The q-quantile of Poisson(mu), the least k with P(X <= k) >= q: by the cumulative sum below a mean of
    POISSON_EXACT_MEAN (exact), above by the Cornish-Fisher expansion mu + z sqrt(mu) + (z^2 - 1) / 6 + (z^3 - 7 z)
    / (72 sqrt(mu)) rounded (at most one count off, for 1% of means at q = 0.99, tested against scipy). Numpy only:
    `dse evaluate` and a study's answer load no scipy.
    """
    shape = np.shape(mu)
    mu = np.asarray(mu, dtype=np.float64).reshape(-1)
    z = NormalDist().inv_cdf(q)
    with np.errstate(invalid="ignore", divide="ignore"):
        root = np.sqrt(mu)
        out = np.floor(mu + z * root + (z * z - 1.0) / 6.0 + (z**3 - 7.0 * z) / (72.0 * root) + 0.5)
    small = mu <= POISSON_EXACT_MEAN
    if small.any():
        m = mu[small]
        term = np.exp(-m)
        cdf, k = term.copy(), np.zeros_like(m)
        for j in range(1, int(POISSON_EXACT_MEAN * 3) + 1):
            below = cdf < q
            if not below.any():
                break
            k = np.where(below, j, k)
            term = term * m / j
            cdf = cdf + term
        out[small] = k
    return np.maximum(out, 0.0).reshape(shape)


def tpot_quantile(q: float, t_d: np.ndarray, t_c: np.ndarray, u: np.ndarray, passes: float, chunks: np.ndarray,
                  accept: float = 1.0) -> np.ndarray:
    """The q-quantile of one request's TPOT in aggregated serving: (m t_d + c k_q t_c) / (m a), k_q the
    q-quantile of Poisson(mu / c) (`poisson_quantile`), mu = u m t_d / ((1 - u) t_c) the chunks its m decode passes
    meet on average (c = ``chunks`` per prompt); t_d / a where it has no decode pass or meets no chunk.
    """
    t_d, t_c, u, chunks = (np.asarray(a, dtype=np.float64) for a in (t_d, t_c, u, chunks))
    m = max(passes, 0.0)
    if m == 0.0:
        return t_d / accept * np.ones(np.broadcast(t_d, t_c, u, chunks).shape)
    with np.errstate(divide="ignore", invalid="ignore"):
        mu = np.where((u > 0) & (t_c > 0), u * m * t_d / ((1.0 - u) * t_c), 0.0)
        k = np.where(mu > 0, poisson_quantile(q, np.broadcast_to(mu / chunks, mu.shape)), 0.0)
    return (m * t_d + chunks * k * t_c) / (m * accept)
