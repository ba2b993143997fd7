"""The searches stream the (block, batch) pairs in chunks of whole blocks and reduce each chunk as it goes; the
answers must not depend on the chunk size. Each search is run with one block per chunk, a few blocks per chunk
and the whole space in one chunk (how it ran before it streamed), and every figure must be identical to the bit.
"""

from __future__ import annotations

import numpy as np
import pytest

from dse.catalog.models import get_model
from dse.optimize.fronts import front
from dse.optimize.operating_points import operating_points
from dse.optimize.requests import (
    block_optima,
    disaggregated_tables,
    pick,
    pick_disaggregated,
)
from dse.optimize.space import SpaceOptions, build_space, pair_chunks, pairs
from dse.optimize.whole import Budget, whole_aggregated, whole_disaggregated
from dse.physics import serving
from dse.physics.serving import Request

WHOLE = 10**12


@pytest.fixture(scope="module")
def space():
    w = Request(name="chat", prompt=2000, output=300, tpot_max=0.06, ttft_max=3.0, demand=2e4)
    return build_space(get_model("llama-3.1-70b"), w, SpaceOptions(systems=("h100", "mi300x"), pp=(1,),
                                                                   kv_tiers=("hbm",), max_batch_per_rank=24))


def test_chunks_cover_every_pair_once_in_order_without_splitting_a_block(space):
    pos, n = pairs(space.blocks)
    for size in (1, 500, WHOLE):
        chunks = list(pair_chunks(space.blocks, size))
        assert np.array_equal(np.concatenate([c[0] for c in chunks]), pos)
        assert np.array_equal(np.concatenate([c[1] for c in chunks]), n)
        edges = [c[0][-1] for c in chunks[:-1]]
        assert all(e != c[0][0] for e, c in zip(edges, chunks[1:], strict=True))  # no block split
        counts = space.blocks["n_hi"] - space.blocks["n_lo"] + 1
        assert all(len(c[0]) <= max(size, counts[c[0][0]]) for c in chunks)
    with_pairs = np.flatnonzero(counts > 0)
    only = with_pairs[[1, 5, 6]]
    got = list(pair_chunks(space.blocks, 1, only))
    assert [int(c[0][0]) for c in got] == only.tolist()
    assert [len(c[0]) for c in got] == counts[only].tolist()


def _answers(space, max_pairs: int) -> dict:
    req = space.workload
    opt = block_optima(space, req, max_pairs=max_pairs)
    t = disaggregated_tables(space, req, max_pairs=max_pairs)
    sys_idx = space.blocks["system_idx"]
    out = {"n": opt.n.tolist(), "metrics": {k: v.tolist() for k, v in opt.metrics.items()}, "binding": opt.binding,
           "evaluated": (opt.evaluated, t.evaluated)}
    for budget, demand in ((None, 2e4), (Budget(gpus=64), None), (Budget(nodes=16), 2e4)):
        a, d = whole_aggregated(space, opt, budget, demand)[0], whole_disaggregated(space, t, budget, demand)[0]
        out[f"whole {budget} {demand}"] = (a.config, a.replicas, a.deployed, d.metrics, d.pools, d.deployed)
    for si in (None, *range(len(space.systems))):
        mask = None if si is None else sys_idx == si
        a, d = pick(space, opt, mask=mask), pick_disaggregated(space, t, mask=mask)
        out[f"pick {si}"] = (a.config, a.metrics, a.binding, d.metrics, d.pools, d.binding)
    for objective in ("cost", "throughput"):
        f = front(space, req, True, t, objective, max_pairs=max_pairs)
        out[objective] = (f.to_dict("list"), f.attrs["candidates"])
    return out


def test_every_answer_is_the_same_whatever_the_chunk_size(space, monkeypatch):
    whole = _answers(space, WHOLE)
    assert whole["evaluated"][0] == space.size > 1000
    for size in (1, 100):
        assert repr(_answers(space, size)) == repr(whole)
    monkeypatch.setattr("dse.optimize.space.CHUNK_PAIRS", 1)  # the operating points stream with the default
    one = operating_points(space)
    monkeypatch.setattr("dse.optimize.space.CHUNK_PAIRS", WHOLE)
    assert repr(one.to_dict("list")) == repr(operating_points(space).to_dict("list"))


def test_a_request_rate_does_not_depend_on_the_rates_solved_with_it():
    rng = np.random.default_rng(7)
    k = rng.uniform(1, 64, 300)
    c = k * rng.uniform(1, 200, 300)
    s = rng.uniform(1e-3, 2.0, 300)
    m_td = rng.uniform(1e-3, 5.0, 300)
    v = rng.uniform(0, 0.5, 300)
    together = serving._solve_rate(k, c, s, m_td, v)
    alone = np.array([serving._solve_rate(k[i], c[i], s[i], m_td[i], v[i]) for i in range(300)])
    assert np.array_equal(together, alone)
    x = together
    q, w = 1 - x * s, 1 - v * x
    residual = k * x * (s * q + 0.5 * x * s * s + m_td * q / w) - c * q
    assert np.all(np.abs(residual) <= 1e-9 * c)
    # the closed form polished by one Newton step is the bracketed Newton iteration's root to a few ulp
    with np.errstate(divide="ignore"):
        bracketed = serving._bracketed_newton(k, c, s, m_td, v, np.minimum(1.0 / s, 1.0 / v))
    assert np.all(np.abs(x - bracketed) <= 8 * np.spacing(bracketed))


def test_first_min_per_block_is_the_first_least_score_of_each_block():
    """The per-block argmin, without a sort, equals its definition: per block, sort the pairs by (score, place) and
    keep the first when its score is finite (NaN scores last, ties to the earlier pair, -0.0 equal to 0.0)."""
    from dse.optimize.requests import first_min_per_block

    rng = np.random.default_rng(0)
    for _ in range(2000):
        counts = rng.integers(1, 9, rng.integers(1, 12))
        pos = np.repeat(np.sort(rng.choice(50, len(counts), replace=False)), counts)
        score = rng.choice([1.0, 2.0, 3.0, np.inf, -np.inf, np.nan, 0.0, -0.0], len(pos))
        want = []
        for block in np.unique(pos):
            at = np.flatnonzero(pos == block)
            best = min(at, key=lambda i: (np.isnan(score[i]), 0.0 if np.isnan(score[i]) else score[i], i))
            if np.isfinite(score[best]):
                want.append(best)
        assert first_min_per_block(pos, score).tolist() == want
