"""The serving formulation against its exhaustive reference, on random small spaces."""

from __future__ import annotations

import math

import numpy as np
import pytest
from formulation_contract import FormulationContract

from dse.catalog.hardware import default_systems
from dse.catalog.models import default_models, get_model
from dse.optimize.serving import presolve, solve_demand, solve_serving
from dse.optimize.space import SpaceOptions, Workload, build_space, describe_choice, exhaustive
from dse.physics.evaluate import Config, evaluate_config
from dse.physics.layout import Layout, check_layout
from formulations import serving as formulation

MODELS = sorted(default_models())
SYSTEMS = sorted(s for s, v in default_systems().items() if v.price_per_s == v.price_per_s)  # priced


def random_space(rng: np.random.Generator):
    model = get_model(MODELS[rng.integers(len(MODELS))])
    systems = tuple(rng.choice(SYSTEMS, size=rng.integers(1, 3), replace=False))
    prompt = int(rng.choice([128, 2000, 32_000, 200_000]))
    opts = SpaceOptions(
        systems=systems,
        weights_dtypes=tuple(rng.choice(["bf16", "fp8", "fp4"], size=rng.integers(1, 3), replace=False)),
        kv_dtypes=tuple(rng.choice(["bf16", "fp8"], size=1)),
        kv_tiers=("hbm",) if rng.random() < 0.7 else ("hbm", "host"),
        tp=tuple(sorted(rng.choice([1, 2, 4, 8], size=rng.integers(1, 3), replace=False))),
        pp=(1,) if rng.random() < 0.6 else (1, 2),
        max_racks=int(rng.integers(1, 3)),
        max_chips_per_stage=int(rng.choice([8, 16, 72])),
        max_batch_per_rank=int(rng.choice([8, 32, 96])),
        ideal=bool(rng.random() < 0.3),
    )
    tpot = None if rng.random() < 0.2 else float(rng.choice([0.005, 0.02, 0.05, 0.2]))
    ttft = None if rng.random() < 0.7 else float(rng.choice([1.0, 30.0]))
    w = Workload("random", prompt, int(rng.choice([16, 500])), tpot, ttft)
    return build_space(model, w, opts)


def recheck_config(space, cfg: dict, claimed_cost: float) -> None:
    """Recompute the chosen configuration with `dse evaluate` and check every constraint."""
    w = space.workload
    lay = Layout(cfg["tp"], cfg["dp"], cfg["ep"], cfg["etp"], cfg["pp"])
    check_layout(space.model, lay)
    ev = evaluate_config(
        Config(space.model.id, cfg["system"], cfg["batch"], cfg["context"], tp=cfg["tp"], ep=cfg["ep"], pp=cfg["pp"],
               dp=cfg["dp"], etp=cfg["etp"], weights_dtype=cfg["weights_dtype"], kv_dtype=cfg["kv_dtype"],
               kv_tier=cfg["kv_tier"], prompt=w.prompt, allow_beyond_trained_context=True),
        ideal=space.ideal,
    )
    assert ev["fits"], cfg
    assert cfg["batch"] % cfg["dp"] == 0
    assert cfg["batch"] // cfg["dp"] <= max(space.blocks["n_hi"])
    if w.tpot_max is not None:
        assert ev["tpot_s"] <= w.tpot_max * (1 + 1e-9)
    if w.ttft_max is not None:
        assert ev["ttft_s"] <= w.ttft_max * (1 + 1e-9)
    assert ev["usd_per_mtok"] == pytest.approx(claimed_cost, rel=1e-6)
    assert ev["chips"] == cfg["chips"] == cfg["tp"] * cfg["dp"] * cfg["pp"]


class TestServingContract(FormulationContract):
    """Cost per token by Dinkelbach, without the bound presolve (the whole space is in the MIP)."""

    prune = False

    def make_instance(self, rng):
        return random_space(rng)

    def solve_mip(self, space):
        r = solve_serving(space, space.workload.tpot_max, prune=self.prune)
        return r.choice.cost, r.config, r.result

    def solve_exhaustive(self, space):
        best = exhaustive(space, space.workload.tpot_max)
        return None if best is None else best.cost

    def recheck(self, space, cfg, value):
        recheck_config(space, cfg, value)

    def build_model(self, space):
        blocks, points, _, _ = presolve(space, space.workload.tpot_max, prune=False)
        return formulation.build(blocks, points.reset_index(drop=True), space.workload.tpot_max).model


class TestServingContractPresolved(TestServingContract):
    """The same with the greedy incumbent and bound pruning (what studies run)."""

    prune = True


class TestLatencyContract(TestServingContract):
    """Minimum step time (the fast end of the Pareto front)."""

    instances = 25

    def solve_mip(self, space):
        r = solve_serving(space, space.workload.tpot_max, objective="latency")
        return r.choice.step, r.config, r.result

    def solve_exhaustive(self, space):
        best = exhaustive(space, space.workload.tpot_max, objective="latency")
        return None if best is None else best.step

    def recheck(self, space, cfg, value):
        ev = evaluate_config(
            Config(space.model.id, cfg["system"], cfg["batch"], cfg["context"], tp=cfg["tp"], ep=cfg["ep"],
                   pp=cfg["pp"], dp=cfg["dp"], etp=cfg["etp"], weights_dtype=cfg["weights_dtype"],
                   kv_dtype=cfg["kv_dtype"], kv_tier=cfg["kv_tier"], allow_beyond_trained_context=True),
            ideal=space.ideal,
        )
        assert ev["fits"] and ev["tpot_s"] == pytest.approx(value, rel=1e-6)


def test_cost_capped_latency_equals_exhaustive():
    rng = np.random.default_rng(7)
    checked = 0
    for _ in range(60):
        space = random_space(rng)
        base = exhaustive(space, space.workload.tpot_max)
        if base is None:
            continue
        cap = base.cost * 1.5
        ref = exhaustive(space, space.workload.tpot_max, objective="latency", cost_max=cap)
        cheapest = solve_serving(space, space.workload.tpot_max)
        r = solve_serving(space, space.workload.tpot_max, objective="latency", cost_max=cap, start=cheapest.choice)
        assert r.choice.step == pytest.approx(ref.step, rel=1e-6)
        assert r.choice.cost <= cap * (1 + 1e-6)
        checked += 1
    assert checked >= 20


def test_demand_is_met_by_whole_replicas_at_least_cost():
    rng = np.random.default_rng(11)
    checked = 0
    for _ in range(60):
        space = random_space(rng)
        if exhaustive(space, space.workload.tpot_max) is None:
            continue
        demand = float(rng.choice([1e3, 5e4, 1e6]))
        r = solve_demand(space, demand, space.workload.tpot_max)
        # exhaustive: every (block, batch), its throughput per replica, whole replicas to meet demand
        best = math.inf
        b = space.blocks
        for k in b.index:
            row = b.loc[[k]]
            lo, hi = int(row["n_lo"].iloc[0]), int(row["n_hi"].iloc[0])
            if lo > hi or (space.workload.ttft_max is not None and row["ttft"].iloc[0] > space.workload.ttft_max):
                continue
            from dse.optimize.space import step_time
            n = np.arange(lo, hi + 1)
            step = step_time(row.loc[row.index.repeat(len(n))], n)
            ok = step <= (space.workload.tpot_max or np.inf) * (1 + 1e-9)
            if not ok.any():
                continue
            tps = row["dp"].iloc[0] * n[ok] * row["pp"].iloc[0] / step[ok]
            rate = row["chips"].iloc[0] * space.systems[int(row["system_idx"].iloc[0])].price_per_s
            best = min(best, float((np.ceil(demand / tps) * rate).min()))
        for _, p in space.points.iterrows():
            if not p["fits"] or (space.workload.tpot_max is not None and p["step"] > space.workload.tpot_max):
                continue
            row = b.loc[int(p["block"])]
            if space.workload.ttft_max is not None and row["ttft"] > space.workload.ttft_max:
                continue
            tps = row["dp"] * p["n"] * row["pp"] / p["step"]
            best = min(best, math.ceil(demand / tps) * row["chips"] * space.systems[int(row["system_idx"])].price_per_s)
        assert r.usd_per_s == pytest.approx(best, rel=1e-6)
        cfg = describe_choice(space, r.choice)
        tps = cfg["batch"] * cfg["pp"] / r.choice.step
        assert r.replicas * tps >= demand * (1 - 1e-9)
        checked += 1
    assert checked >= 20
