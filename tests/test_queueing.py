"""The waiting-time distribution behind TTFT's quantiles (`dse.physics.queueing`): Crommelin's closed form and the
Cramer-Lundberg tail agree where they meet, the quantile tables match the distribution they tabulate, and both match
a simulation of the M/D/1 queue (Lindley's recursion); the closed loop's wave and the TPOT of one request as the
module states them."""

from __future__ import annotations

import numpy as np
import pytest

from dse.physics import queueing as Q


def lindley(rho: float, n: int, seed: int) -> np.ndarray:
    """Waits of n customers of an M/D/1 queue (service 1, Poisson arrivals at rate rho), the first tenth dropped."""
    gaps = np.random.default_rng(seed).exponential(1.0 / rho, n)
    w, out = 0.0, np.empty(n)
    for i, a in enumerate(gaps):
        out[i] = w
        w = max(0.0, w + 1.0 - a)
    return out[n // 10:]


@pytest.mark.parametrize("rho", [0.3, 0.6, 0.85, 0.95, 0.99])
def test_the_closed_form_and_the_tail_agree_where_they_meet(rho):
    x = Q.EXACT_RHO_X / rho * (1 - 1e-9)  # just inside the closed form's range
    exact = Q.wait_cdf(np.array(x), np.array(rho))
    y, c = Q.tail(np.array(rho))
    assert 1 - c * np.exp(-y * x) == pytest.approx(exact, rel=1e-6, abs=1e-12)
    assert rho * (np.exp(y) - 1) == pytest.approx(y, rel=1e-12)  # y is the root of the characteristic equation


def test_the_distribution_has_the_pollaczek_khinchine_mean_and_the_atom_at_zero():
    for rho in (0.2, 0.5, 0.8):
        x = np.linspace(0, 200, 400_001)
        f = Q.wait_cdf(x, np.full_like(x, rho))
        assert f[0] == pytest.approx(1 - rho, abs=1e-12)  # P(W = 0) = 1 - rho
        assert np.all(np.diff(f) >= -1e-8)  # the closed form keeps 9 digits (its terms stay within e^16)
        mean = np.trapezoid(1 - f, x)  # E[W] / S = rho / (2 (1 - rho))
        assert mean == pytest.approx(rho / (2 * (1 - rho)), rel=1e-4)


def test_the_quantile_tables_match_the_distribution():
    rho = np.random.default_rng(7).uniform(0.01, 0.99999, 1000)
    for q in Q.QUANTILES:
        table = Q.wait_quantile(q, rho)
        direct = Q._quantile_direct(q, rho)
        assert np.all(np.abs(table - direct) <= 1e-5 * (1 + direct))
        assert np.all(np.diff(Q.wait_quantile(q, np.sort(rho))) >= 0)  # a bound on a quantile is a bound on rho
        on = table > 0
        back = Q.rho_for_wait_quantile(q, table[on])
        assert np.allclose(Q.wait_quantile(q, back), table[on], rtol=1e-9, atol=1e-9)
    assert Q.wait_quantile(0.9, np.array([0.05, 1.0]))[0] == 0  # the atom covers the quantile
    assert np.isinf(Q.wait_quantile(0.9, np.array([1.0]))[0])
    assert np.isnan(Q.rho_for_wait_quantile(0.9, np.array([-0.1]))[0])
    assert Q.rho_for_wait_quantile(0.9, np.array([0.0]))[0] == pytest.approx(0.1)


def test_the_shipped_tables_are_the_ones_built_today(monkeypatch):
    """The tables a command reads from TABLES_FILE are build_table's (scripts/make_md1_tables.py writes them; on
    the machine that wrote them bit for bit; 1e-9 allowed for another CPU's exp and log: the closed form's
    alternating sum cancels terms far larger than itself near rho x = EXACT_RHO_X, so a last-bit difference in exp
    moves x_q by up to 9.9e-11 of itself on an AMD EPYC), and a file whose settings are not today's is not read."""
    shipped = Q._shipped()
    assert sorted(shipped) == sorted(Q.QUANTILES)
    for q in Q.QUANTILES:
        z, x = Q.build_table(q)
        assert shipped[q][0].shape == z.shape and shipped[q][1].shape == x.shape
        np.testing.assert_allclose(shipped[q][0], z, rtol=1e-12, atol=0)
        np.testing.assert_allclose(shipped[q][1], x, rtol=1e-9, atol=0)
        assert Q._table(q) is shipped[q]
    monkeypatch.setattr(Q, "BISECTION_STEPS", Q.BISECTION_STEPS - 1)
    Q._shipped.cache_clear()
    try:
        assert Q._shipped() == {}
    finally:
        monkeypatch.undo()
        Q._shipped.cache_clear()
    assert sorted(Q._shipped()) == sorted(Q.QUANTILES)


@pytest.mark.parametrize("rho", [0.5, 0.9])
def test_the_quantiles_match_a_simulated_queue(rho):
    waits = lindley(rho, 400_000, seed=int(rho * 100))
    for q in Q.QUANTILES:
        simulated = np.quantile(waits, q)
        assert float(Q.wait_quantile(q, np.array(rho))) == pytest.approx(simulated, rel=0.06, abs=0.02)
    assert waits.mean() == pytest.approx(rho / (2 * (1 - rho)), rel=0.06)


def test_the_closed_loop_wave_and_one_requests_tpot():
    # the wave's wait is uniform on [0, 2 xi (n - 1) S_b]: its median is the mean xi (n - 1) S_b
    assert Q.wave_wait_quantile(0.5, 0.3, np.array(2.0))[()] == pytest.approx(0.6)
    assert Q.wave_wait_quantile(0.9, 0.3, np.array(2.0))[()] == pytest.approx(1.08)
    # TPOT of one request: m passes of t_d, plus t_c for each chunk met; chunks arrive c at a time, Poisson in number
    t_d, t_c, u, m, c = 0.02, 0.03, 0.2, 499.0, 2.0
    mu = u * m * t_d / ((1 - u) * t_c)
    draws = np.random.default_rng(3).poisson(mu / c, 200_000) * c
    simulated = (m * t_d + draws * t_c) / m
    assert simulated.mean() == pytest.approx(t_d / (1 - u), rel=1e-3)  # the mean is the request-level TPOT
    for q in Q.QUANTILES:
        got = float(Q.tpot_quantile(q, np.array(t_d), np.array(t_c), np.array(u), m, np.array(c)))
        assert got == pytest.approx(np.quantile(simulated, q), rel=1e-3)
    assert float(Q.tpot_quantile(0.9, np.array(t_d), np.array(t_c), np.array(0.0), m, np.array(1.0))) == t_d


def test_the_poisson_quantile_and_the_tail_without_scipy_against_scipy():
    """The command line's paths load no scipy: the Poisson quantile is the cumulative sum's below a mean of 50 (exact)
    and the Cornish-Fisher expansion's above (at most one count off); the tail's exponent is Newton's root."""
    from scipy import special, stats

    mu = np.concatenate([np.geomspace(1e-4, 50, 2000), np.linspace(50, 5000, 2000)])
    for q in Q.QUANTILES:
        d = np.abs(Q.poisson_quantile(q, mu) - stats.poisson.ppf(q, mu))
        assert d[mu <= 50].max() == 0 and d.max() <= 1 and (d > 0).mean() < 0.01
    rho = np.linspace(0.01, 0.99, 500)
    y, _ = Q.tail(rho)
    assert np.allclose(y, -special.lambertw(-rho * np.exp(-rho), k=-1).real - rho, rtol=1e-9)
