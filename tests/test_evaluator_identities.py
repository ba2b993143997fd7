"""The evaluator's shortcuts change no figure: rows grouped without a sort are the groups a sort finds, the routing
statistics computed once per group are `routed_straggler`'s per candidate, a memory-only pass is the full pass's
memory check, and a long candidate list evaluated in slices gives what it gives at once, bit for bit."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from dse.catalog.hardware import default_systems
from dse.catalog.models import default_models
from dse.physics import roofline
from dse.physics.layout import layouts_for
from dse.physics.roofline import Candidates, ModelTable, SystemTable, distinct_rows, evaluate, evaluate_at
from dse.physics.serving import Request, aggregated, decode_pool, prefill_pool


@pytest.fixture(scope="module")
def drawn():
    """3,000 candidates drawn over every catalog model and system, valid layouts, batches, contexts and formats."""
    rng = np.random.default_rng(3)
    models, systems = list(default_models().values()), list(default_systems().values())
    rows = np.array([(i, lay.tp, lay.dp, lay.ep, lay.etp, lay.pp) for i, m in enumerate(models)
                     for cps in (1, 8, 16, 72) for lay in layouts_for(m, cps, pps=(1, 2))])
    n = 3000
    pick = rows[rng.integers(0, len(rows), n)]
    cand = Candidates(model=pick[:, 0], system=rng.integers(0, len(systems), n), tp=pick[:, 1], dp=pick[:, 2],
                      ep=pick[:, 3], etp=pick[:, 4], pp=pick[:, 5], batch=2 ** rng.integers(0, 11, n),
                      context=2 ** rng.integers(8, 17, n), weights_dtype=rng.integers(0, 3, n),
                      kv_dtype=rng.integers(0, 2, n), kv_tier=rng.integers(0, 2, n),
                      micro_batches=rng.integers(1, 3, n), kv_shard=rng.integers(0, 2, n))
    return cand, ModelTable.build(models), SystemTable.build(systems)


@pytest.mark.parametrize("whole", [True, False])
def test_distinct_rows_are_the_groups_of_equal_rows(whole):
    rng = np.random.default_rng(0)
    for size in (1, 7, 500, 20000):
        a = rng.integers(0, 9, size)
        b = rng.integers(0, 40, size).astype(float) * (1.0 if whole else 0.5) + (0.0 if whole else 0.25)
        first, inverse = distinct_rows(a, b)
        assert (a[first][inverse] == a).all() and (b[first][inverse] == b).all()  # each row in its group
        assert len(set(zip(a[first].tolist(), b[first].tolist(), strict=True))) == len(first)  # groups distinct


def test_routing_per_group_is_the_straggler_of_each_candidate(drawn):
    cand, mt, st = drawn
    c = cand.broadcast()
    g = roofline._Gathered(c, mt, st, st.efficiency_of(np.asarray(c.system)))
    tokens = np.asarray(c.batch, dtype=float)
    load, received, share = roofline._routing(g, tokens, tokens, 1.0)
    want_load, want_touched, want_received = roofline.routed_straggler(tokens, g.n_exp, g.top_k, g.ep)
    touched = np.where(g.n_exp > 0, -np.expm1(tokens * np.log1p(-g.top_k / np.maximum(g.n_exp, 1.0))), 0.0)
    assert np.array_equal(load, want_load) and np.array_equal(received, want_received)
    assert np.array_equal(share, np.minimum(touched * want_touched, 1.0))


def test_memory_only_pass_is_the_full_pass_memory_check(drawn):
    cand, mt, st = drawn
    full, memory = evaluate_at(cand, mt, st, None, [{"context": 3000.0, "phase": 0},
                                                     {"context": 3000.0, "phase": 0, "times": False}])
    assert set(memory) == set(roofline.MEMORY_KEYS)
    for k in roofline.MEMORY_KEYS:
        assert np.array_equal(full[k], memory[k])


def test_slices_change_no_figure(drawn, monkeypatch):
    cand, mt, st = drawn
    req = Request(3000, 400, cached=0.25, draft=1, accept=1.6)
    dec = replace(cand, phase=0)
    cp = np.arange(len(cand.batch)) % 2 == 0
    runs = {"evaluate": lambda: evaluate(cand, mt, st), "aggregated": lambda: aggregated(dec, mt, st, req),
            "decode_pool": lambda: decode_pool(dec, mt, st, req),
            "prefill_pool": lambda: prefill_pool(dec, mt, st, req, cp, full_chunk=True)}
    at_once = {name: run() for name, run in runs.items()}
    monkeypatch.setattr(roofline, "SLICE", 256)
    for name, run in runs.items():
        sliced = run()
        assert sliced.keys() == at_once[name].keys()
        for k, v in sliced.items():
            assert np.array_equal(v, np.broadcast_to(at_once[name][k], v.shape), equal_nan=v.dtype.kind == "f"), (name, k)


def test_kept_routing_statistics_are_new_ones_bit_for_bit():
    """The memo of `_straggler` returns what a new computation gives, across calls, repeats and its reset."""
    rng = np.random.default_rng(5)
    memo = roofline._StragglerMemo(limit=40)
    for _ in range(6):
        n = rng.integers(1, 30)
        tokens = rng.integers(1, 5000, n).astype(float) * rng.choice([1.0, 0.5], n)
        nn = rng.choice([16.0, 64.0, 256.0], n)
        kk = rng.choice([1.0, 2.0, 8.0], n)
        ep = rng.choice([2.0, 8.0, 64.0], n)
        for got, want in zip(memo(tokens, nn, kk, ep), roofline._straggler(tokens, nn, kk, ep), strict=True):
            assert np.array_equal(got, want)
        assert memo.keys.size <= 40


def test_masked_is_where():
    rng = np.random.default_rng(6)
    x = rng.random(1000) * 10.0 ** rng.integers(-8, 3, 1000)
    on = (rng.random(1000) < 0.5).astype(float)
    assert np.array_equal(roofline._masked(x, on), np.where(on > 0, x, 0.0))
    x[3] = np.inf
    assert np.array_equal(roofline._masked(x, on), np.where(on > 0, x, 0.0))
