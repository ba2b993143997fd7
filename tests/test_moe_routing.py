"""The slowest expert group under uniform top-k routing: the closed forms against a Monte-Carlo of the
routing itself (numpy draws; no code shared with dse.physics.roofline)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from dse.physics.roofline import expected_max_binomial, routed_straggler


def _simulate(n_exp: int, top_k: int, ep: int, tokens: int, reps: int, rng) -> tuple[float, float, float]:
    """Mean over ``reps`` routings of the busiest group's (token-expert pairs, distinct experts, tokens)."""
    per = n_exp // ep
    pairs, experts, received = [], [], []
    for _ in range(reps):
        chosen = np.argpartition(rng.random((tokens, n_exp)), top_k, axis=1)[:, :top_k]  # k distinct experts
        group = chosen // per
        pairs.append(np.bincount(group.ravel(), minlength=ep).max())
        hit = np.zeros(n_exp, dtype=bool)
        hit[chosen.ravel()] = True
        experts.append(hit.reshape(ep, per).sum(axis=1).max())
        reached = np.zeros((tokens, ep), dtype=bool)
        reached[np.arange(tokens)[:, None], group] = True
        received.append(reached.sum(axis=0).max())
    return float(np.mean(pairs)), float(np.mean(experts)), float(np.mean(received))


# (experts, top-k): DeepSeek-V3/Kimi, Qwen3-235B, gpt-oss-120b, Mixtral
@pytest.mark.parametrize("n_exp,top_k", [(256, 8), (128, 8), (128, 4), (8, 2)])
def test_the_busiest_group_matches_a_simulated_routing(n_exp, top_k):
    rng = np.random.default_rng(7)
    for ep in (2, 8, 32, 64):
        if ep > n_exp:
            continue
        per = n_exp // ep
        for tokens in (1, 4, 16, 128):
            load_f, touched_f, received_f = routed_straggler(tokens, n_exp, top_k, ep)
            pairs, experts, received = _simulate(n_exp, top_k, ep, tokens, 2000 if tokens <= 4 else 300, rng)
            p = 1 - (1 - top_k / n_exp) ** tokens
            h = 1 - math.comb(n_exp - per, top_k) / math.comb(n_exp, top_k)  # a token reaches the group
            where = f"N={n_exp} k={top_k} ep={ep} tokens={tokens}"
            assert float(load_f) * tokens * top_k / ep == pytest.approx(pairs, rel=0.08), where
            assert float(touched_f) * per * p == pytest.approx(experts, rel=0.05), where
            assert float(received_f) * tokens * h == pytest.approx(received, rel=0.08), where


def test_the_expected_maximum_is_exact_for_small_counts():
    """Below the exact-sum threshold the expectation is exact: against a direct sum over P(max = j)."""
    for n, trials, q in ((8, 4, 8 / 256), (72, 4, 0.3), (16, 40, 0.25), (64, 12, 0.97), (3, 1, 0.5)):
        cdf = [sum(math.comb(trials, i) * q**i * (1 - q) ** (trials - i) for i in range(j + 1))
               for j in range(trials + 1)]
        exact = sum(j * (cdf[j] ** n - (cdf[j - 1] ** n if j else 0.0)) for j in range(trials + 1))
        assert float(expected_max_binomial(n, trials, q)) == pytest.approx(exact, rel=1e-9, abs=1e-12)


def test_the_expected_maximum_of_large_counts_follows_their_skewed_normal_tail():
    rng = np.random.default_rng(3)
    for n, trials, q in ((8, 4000, 0.05), (64, 1000, 0.125), (256, 20000, 1 / 256), (2, 100, 0.5)):
        drawn = rng.binomial(trials, q, size=(4000, n)).max(axis=1).mean()
        assert float(expected_max_binomial(n, trials, q)) == pytest.approx(drawn, rel=0.01)


def test_one_group_or_a_dense_model_has_no_straggler_and_large_batches_balance():
    for f in routed_straggler(64, 256, 8, 1) + routed_straggler(64, 0, 0, 8):
        assert float(f) == 1.0
    tokens = np.array([1, 2, 8, 32, 128, 1024, 16384, 1 << 20])
    load_f, touched_f, received_f = routed_straggler(tokens, 256, 8, 32)
    for f in (load_f, touched_f, received_f):
        assert (f >= 1.0).all() and (np.diff(f) <= 1e-12).all()  # the busiest group's excess only shrinks
        assert f[-1] == pytest.approx(1.0, abs=0.01)
    # a batch-1 decode on EP 32 with 8 experts per GPU: a token's 8 experts reach 7.1 of the 32 GPUs
    # (32 (1 - (31/32)^8)); the busiest one reads at least one whole expert against a mean of 1/4
    assert float(touched_f[0]) * 8 * (8 / 256) >= 1.0


def test_the_exact_sum_is_the_same_whichever_path_takes_its_rows():
    """`_exact_sum` computes up to EXACT_ROWS rows at once and more one j at a time: the same rows give the same
    sums to the last bit either way (each row's operations are its own)."""
    from dse.physics.roofline import EXACT_MEAN, EXACT_ROWS, _exact_sum

    rng = np.random.default_rng(7)
    k = EXACT_ROWS // 2
    n = rng.integers(2, 300, k).astype(float)
    trials = np.floor(rng.uniform(1, 2000, k))
    p = np.minimum(rng.uniform(0, 1, k) * EXACT_MEAN / trials, 0.5)
    mean = trials * p
    bound = np.minimum(np.ceil(mean + 10 * np.sqrt(mean * (1 - p)) + 10), trials)
    for complement in (False, True):
        alone = _exact_sum(n, trials, p, bound, complement)
        among = _exact_sum(*(np.tile(a, 3) for a in (n, trials, p, bound)), complement)  # 3k > EXACT_ROWS rows
        assert np.array_equal(alone, among[:k])
