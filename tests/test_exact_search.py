"""The serving argmin against an independent brute force over every integer batch, and the
monotonicity that makes the argmin exact (`dse.optimize.serving`).

The brute force shares no code with the space builder: it enumerates the layouts itself (from the
physics' `layouts_for`), walks every batch per DP rank from 1 up, and calls the roofline directly.
"""

from __future__ import annotations

import numpy as np
import pytest
from helpers import brute_force_choices, random_space

from dse.catalog.hardware import IDEAL
from dse.catalog.units import DTYPES
from dse.optimize.serving import SOLVER_NAME, solve_demand, solve_serving
from dse.optimize.space import SpaceOptions, build_space
from dse.physics.roofline import Candidates, ModelTable, SystemTable, evaluate
from dse.physics.serving import Request


def random_case(rng: np.random.Generator, moe_only: bool = False):
    model, opts = random_space(rng, moe=True if moe_only else None)
    tpot = None if rng.random() < 0.2 else float(rng.choice([0.005, 0.02, 0.05, 0.2]))
    ttft = None if rng.random() < 0.6 else float(rng.choice([0.5, 5.0, 60.0]))
    w = Request(name="random", prompt=int(rng.choice([128, 2000, 32_000, 200_000])), output=int(rng.choice([16, 500])), tpot_max=tpot, ttft_max=ttft)
    return model, w, opts


def brute_force(model, w: Request, opts: SpaceOptions, objective: str = "cost", demand: float | None = None):
    """Best (value, system, tp, dp, ep, pp, batch) over every integer batch of every layout; None if none."""
    systems, choices = brute_force_choices(model, opts)
    mt, st = ModelTable.build([model]), SystemTable.build(systems)
    best = None
    for si, lay, wd, kd, tier in choices:
        system = systems[si]
        n = np.arange(1, opts.max_batch_per_rank + 1, dtype=float)
        common = dict(model=0, system=si, tp=lay.tp, dp=lay.dp, ep=lay.ep, etp=lay.etp,
                      pp=lay.pp, weights_dtype=DTYPES.index(wd), kv_dtype=DTYPES.index(kd))
        eff = IDEAL if opts.ideal else None
        if w.ttft_max is not None:
            pre = evaluate(Candidates(**common, batch=1, context=w.prompt, phase=1), mt, st,
                           eff, ttft=False)
            if pre["step_s"][()] > w.ttft_max:
                continue
        r = evaluate(Candidates(**common, batch=lay.dp * n, context=w.context,
                                kv_tier=int(tier == "host")), mt, st, eff, ttft=False)
        ok = r["fits"] & (r["step_s"] <= (w.tpot_max or np.inf) * (1 + 1e-9))
        if not ok.any():
            continue
        usd_s = lay.chips * system.price_per_s
        tps = lay.dp * n * lay.pp / r["step_s"]
        if demand is not None:
            value = np.ceil(demand / tps * (1 - 1e-12)) * usd_s
        elif objective == "cost":
            value = usd_s / tps * 1e6
        else:
            value = r["step_s"]
        value = np.where(ok, value, np.inf)
        i = int(np.argmin(value))
        if best is None or value[i] < best[0]:
            best = (float(value[i]), system.id, lay.tp, lay.dp, lay.ep, lay.pp, int(lay.dp * n[i]))
    return best


def _cases(seed: int, count: int, moe_only: bool = False):
    rng = np.random.default_rng(seed)
    return [random_case(rng, moe_only) for _ in range(count)]


@pytest.mark.parametrize("chunk", range(4))
def test_cost_optimum_equals_brute_force(chunk):
    """120 random spaces (MoE below saturation included): the argmin equals the brute force."""
    agree = feasible = 0
    cases = _cases(100 + chunk, 20) + _cases(200 + chunk, 10, moe_only=True)
    for model, w, opts in cases:
        ref = brute_force(model, w, opts)
        space = build_space(model, w, opts)
        if ref is None:
            with pytest.raises(Exception, match="no feasible configuration|design space is empty"):
                solve_serving(space, w.tpot_max)
            continue
        feasible += 1
        r = solve_serving(space, w.tpot_max)
        assert r.choice.cost == pytest.approx(ref[0], rel=1e-9), (model.id, w, opts, ref, r.config)
        assert r.result.solver == SOLVER_NAME and r.result.gap == 0 and r.result.status == "optimal"
        agree += 1
    assert feasible >= 10 and agree == feasible


def test_latency_and_demand_equal_brute_force():
    checked = 0
    for model, w, opts in _cases(7, 30):
        ref = brute_force(model, w, opts, objective="latency")
        if ref is None:
            continue
        space = build_space(model, w, opts)
        assert solve_serving(space, w.tpot_max, objective="latency").choice.step == pytest.approx(ref[0], rel=1e-9)
        demand = 5e4
        d = solve_demand(space, demand, w.tpot_max)
        assert d.usd_per_s == pytest.approx(brute_force(model, w, opts, demand=demand)[0], rel=1e-9)
        checked += 1
    assert checked >= 10


def test_block_monotone_in_batch():
    """Per block: the step never falls and the cost per token never rises as the batch per rank grows."""
    rng = np.random.default_rng(3)
    for model, w, opts in _cases(5, 25):
        space = build_space(model, w, opts)
        if space.blocks.empty:
            continue
        mt, st = ModelTable.build([model]), SystemTable.build(space.systems)
        b = space.blocks.take(rng.integers(len(space.blocks), size=min(5, len(space.blocks))))
        n = np.arange(1, 600, dtype=float)
        for row in b.records():
            r = evaluate(Candidates(model=0, system=int(row["system_idx"]), tp=row["tp"], dp=row["dp"], ep=row["ep"],
                                    etp=row["etp"], pp=row["pp"], batch=row["dp"] * n, context=w.context,
                                    weights_dtype=int(row["wd"]), kv_dtype=int(row["kd"]), kv_tier=int(row["tier"])),
                         mt, st, IDEAL if opts.ideal else None, ttft=False)
            step = r["step_s"]
            per_token = step / n
            assert np.all(np.diff(step) >= -1e-12 * step[1:])
            assert np.all(np.diff(per_token) <= 1e-12 * per_token[1:])
