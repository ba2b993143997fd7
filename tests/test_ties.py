"""Equal-cost candidates (`dse.optimize.ties`): the lower TPOT, then the lower TTFT, then fewer chips, then the
search's own order, checked against references written here (a sequential scan and Python's sort) and on the
searches' own tables with every cost made equal.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from dse.catalog.models import get_model
from dse.optimize.requests import best_result, block_optima, disaggregated_tables, ranked, ranked_disaggregated
from dse.optimize.space import SpaceOptions, build_space
from dse.optimize.ties import TIE, tie_order
from dse.physics.serving import Request


def _reference(cost: list[float], keys: list[list[float]]) -> list[int]:
    """Indices best first: costs sorted, a cost within a relative TIE of the one before joins its run; runs in
    order, then the keys, then the index (Python's sort on tuples)."""
    finite = [k for k in range(len(cost)) if np.isfinite(cost[k])]
    by_cost = sorted(finite, key=lambda k: (cost[k], k))
    run, prev, runs = 0, None, {}
    for k in by_cost:
        if prev is not None and cost[k] - prev > TIE * abs(prev):
            run += 1
        runs[k], prev = run, cost[k]
    return sorted(finite, key=lambda k: (runs[k], *(key[k] for key in keys), k))


@pytest.mark.parametrize("seed", range(5))
def test_tie_order_equals_a_sequential_reference(seed):
    """Costs with planted exact ties and float-noise ties (1e-14 relative), equal keys among some, infinities."""
    rng = np.random.default_rng(seed)
    base = rng.choice([1.0, 2.0, 3.0, 1e-4, 7.5e3], size=60)
    cost = base * (1 + rng.choice([0.0, 1e-14, -1e-14, 1e-6], size=60))
    cost[rng.random(60) < 0.1] = np.inf
    keys = [rng.choice([0.03, 0.05], size=60), rng.choice([1.0, 2.0], size=60), rng.integers(1, 4, size=60) * 2.0]
    got = tie_order(cost, *keys)
    assert got.tolist() == _reference(cost.tolist(), [k.tolist() for k in keys])
    assert not np.isinf(cost[got]).any()


def _space(systems: tuple[str, ...] = ("h200",)):
    opts = SpaceOptions(systems=systems, weights_dtypes=("fp8",), kv_dtypes=("fp8",), kv_tiers=("hbm",), tp=(1, 2, 4),
                        pp=(1,), max_racks=1, max_chips_per_stage=8, max_batch_per_rank=64)
    w = Request(name="chat", prompt=2000, output=300, tpot_max=0.05, ttft_max=3.0)
    return build_space(get_model("llama-3.1-8b"), w, opts)


def test_the_aggregated_search_breaks_equal_costs_by_tpot_ttft_and_chips():
    """Every feasible block at one cost: the ranking is by TPOT, TTFT, chips, as a Python sort of the blocks' own
    figures says."""
    space = _space()
    opt = block_optima(space)
    ok = opt.n > 0
    opt.metrics["usd_per_request"] = np.where(ok, 1e-4, np.nan)
    got = ranked(space, opt, int(ok.sum()))
    chips = space.blocks["chips"]
    ref = sorted(np.flatnonzero(ok), key=lambda j: (opt.metrics["tpot_s"][j], opt.metrics["ttft_s"][j], chips[j], j))
    assert [r.choice.block for r in got] == [int(space.blocks.index[j]) for j in ref]
    assert got[0].metrics["tpot_s"] == min(opt.metrics["tpot_s"][ok])


def test_the_disaggregated_search_breaks_equal_costs_by_tpot_then_ttft():
    """Every feasible decode pair and prefill option at one cost each: the pick has the least TPOT and, among the
    pairs of that TPOT, the least TTFT; every runner-up is no faster on (TPOT, TTFT)."""
    space = _space()
    t = disaggregated_tables(space)
    t.dm["usd_per_request"] = np.full(len(t.dpos), 1e-4)
    t.pre.metrics["usd_per_prompt"] = t.pre.rho * 1e-5
    top = ranked_disaggregated(space, t, 5)
    least_tpot = t.dm["tpot_s"][t.dok].min()
    assert top[0].metrics["tpot_s"] == pytest.approx(least_tpot, rel=1e-12)
    order = [(r.metrics["tpot_s"], r.metrics["ttft_s"]) for r in top]
    assert order == sorted(order)


def test_the_choice_between_modes_breaks_equal_costs_by_tpot():
    """Two results of one cost (within TIE), of either mode: the one with the lower TPOT comes first, however they
    are listed; a cost lower by more than TIE wins whatever its TPOT."""
    def res(cost, tpot, ttft=1.0, chips=8, whole=False):
        figs = {"usd_per_request": cost, "tpot_s": tpot, "ttft_s": ttft, "chips": chips}
        return SimpleNamespace(whole=whole, deployed=figs, metrics=figs)

    a, b = res(1e-4, 0.05), res(1e-4 * (1 + 1e-14), 0.03, whole=True)
    assert best_result([a, b]).tolist() == [1, 0] and best_result([b, a]).tolist() == [0, 1]
    c = res(1e-4 * (1 - 1e-9), 0.049)
    assert best_result([a, b, c]).tolist() == [2, 1, 0]
    d = res(1e-4, 0.03, ttft=0.5, chips=16)
    assert best_result([b, d]).tolist() == [1, 0]
