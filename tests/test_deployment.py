"""The deployment program (formulations.deployment through the Pyomo bridge) against an independent brute force,
its re-check, the bridge itself, and the operating points of a real space."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pandas as pd
import pyomo.environ as pyo
import pytest
from formulation_contract import FormulationContract

from dse.catalog.models import get_model
from dse.errors import InfeasibleError
from dse.optimize.bridge import compile_model, lp_duals, solve_pyomo, transform
from dse.optimize.deployment import check, greedy, solve_deployment
from dse.optimize.operating_points import operating_points
from dse.optimize.space import SpaceOptions, build_space
from dse.physics.serving import Request
from formulations.deployment import DeploymentData, build


def random_instance(rng):
    classes = [f"c{i}" for i in range(int(rng.integers(1, 3)))]
    rows = []
    for c in classes:
        for _ in range(int(rng.integers(1, 4))):
            role = str(rng.choice(["both", "prefill", "decode"]))
            rows.append({"cls": c, "role": role, "group": int(rng.integers(0, 2)),
                         "usd_per_s": float(rng.uniform(1, 10)), "requests_per_s": float(rng.uniform(1, 5))})
    demand = {c: float(rng.uniform(1, 9)) for c in classes}
    return DeploymentData(pd.DataFrame(rows), demand)


def brute_force(d: DeploymentData):
    """Every integer replica vector, each count from 0 to ceil(demand / rate) of its class: no shared code."""
    pts = d.points.to_dict("records")
    ranges = [range(int(math.ceil(d.demand[p["cls"]] / p["requests_per_s"] - 1e-12)) + 1) for p in pts]
    best = None
    for x in itertools.product(*ranges):
        groups = {p["group"] for p, k in zip(pts, x, strict=True) if k}
        if len(groups) > 1:
            continue
        ok = True
        for c, lam in d.demand.items():
            cap = {"both": 0.0, "prefill": 0.0, "decode": 0.0}
            for p, k in zip(pts, x, strict=True):
                if p["cls"] == c:
                    cap[p["role"]] += k * p["requests_per_s"]
            if cap["both"] + min(cap["prefill"], cap["decode"]) < lam - 1e-9:
                ok = False
                break
        if ok:
            cost = sum(k * p["usd_per_s"] for p, k in zip(pts, x, strict=True))
            best = cost if best is None else min(best, cost)
    return best


class TestDeploymentContract(FormulationContract):
    instances = 20

    def make_instance(self, rng):
        return random_instance(rng)

    def solve_mip(self, d):
        gdp = "hull" if len(d.points) % 2 else "bigm"
        r = solve_deployment(d, gdp=gdp)
        return r.usd_per_s, r.pools, r.result

    def solve_exhaustive(self, d):
        return brute_force(d)

    def recheck(self, d, pools, value):
        assert check(d, pools) == []
        assert float((pools["usd_per_s"] * pools["replicas"]).sum()) == pytest.approx(value, rel=1e-6)
        assert greedy(d) >= value * (1 - 1e-9)

    def build_model(self, d):
        return compile_model(transform(build(d), "bigm"))[0]


def test_bridge_compiles_a_disjunction_both_ways_and_gives_lp_duals():
    for name in ("bigm", "hull"):
        m = pyo.ConcreteModel()
        m.x = pyo.Var([0, 1], domain=pyo.NonNegativeIntegers, bounds=(0, 10))
        m.c = pyo.Constraint(expr=3 * m.x[0] + 5 * m.x[1] >= 17)
        from pyomo.gdp import Disjunction

        m.d = Disjunction(expr=[[m.x[0] == 0], [m.x[1] == 0]])
        m.o = pyo.Objective(expr=2 * m.x[0] + 3.5 * m.x[1])
        r = solve_pyomo(m, gdp=name)
        assert r.status == "optimal" and r.objective == pytest.approx(12.0)
    lp = pyo.ConcreteModel()
    lp.y = pyo.Var(bounds=(0, None))
    lp.c = pyo.Constraint(expr=2 * lp.y >= 6)
    lp.o = pyo.Objective(expr=5 * lp.y)
    solve_pyomo(lp)
    assert lp_duals(lp)[("c", None)] == pytest.approx(2.5)  # d cost / d rhs = 5 / 2


def test_bad_transformation_is_refused():
    from dse.errors import InputError

    with pytest.raises(InputError, match="allowed: bigm, hull"):
        transform(pyo.ConcreteModel(), "cutting_planes")


def test_infeasible_class_names_its_shortfall():
    d = DeploymentData(pd.DataFrame([{"cls": "a", "role": "prefill", "group": 0, "usd_per_s": 1.0,
                                      "requests_per_s": 1.0}]), {"a": 3.0})
    with pytest.raises(InfeasibleError, match="short by 3 requests/s"):
        solve_deployment(d)


def test_operating_points_of_a_real_space_are_non_dominated_and_solve():
    opts = SpaceOptions(systems=("h100",), weights_dtypes=("fp8",), kv_dtypes=("fp8",), kv_tiers=("hbm",),
                        tp=(1, 2), pp=(1,), max_racks=1, max_batch_per_rank=128)
    w = Request(name="chat", prompt=1000, output=300, tpot_max=0.05, ttft_max=2.0)
    space = build_space(get_model("llama-3.1-8b"), w, opts)
    pts = operating_points(space)
    assert set(pts["role"]) == {"both", "prefill", "decode"}
    for _, g in pts.groupby("role"):
        g = g.sort_values("usd_per_s")
        assert (np.diff(g["requests_per_s"].to_numpy()) > 0).all()
    assert (pts.loc[pts["role"] != "decode", "ttft_s"] <= 2.0 + 1e-9).all()
    assert (pts.loc[pts["role"] != "prefill", "tpot_s"] <= 0.05 + 1e-9).all()
    d = DeploymentData(pts.assign(cls="chat"), {"chat": 200.0})
    r = solve_deployment(d)
    assert check(d, r.pools, {"chat": (0.05, 2.0)}) == []
    assert r.usd_per_s <= greedy(d) * (1 + 1e-9)


def test_operating_points_power_is_all_in_or_absent_never_the_tdp():
    """A point's power is chips x the catalog's all-in W per chip (host, network and cooling shares included); on a
    system whose catalog has no all-in figure (H800: a 700 W TDP only) it is absent, as in the request-level physics,
    never the TDP under the all-in name."""
    from dse.catalog.hardware import default_systems

    w = Request(name="chat", prompt=1000, output=300, tpot_max=0.05, ttft_max=2.0)
    h100, h800 = (operating_points(build_space(get_model("llama-3.1-8b"), w, SpaceOptions(
        systems=(s,), weights_dtypes=("fp8",), kv_dtypes=("fp8",), kv_tiers=("hbm",), tp=(1, 2), pp=(1,),
        max_racks=1, max_batch_per_rank=64, prices=((s, 2.0),)))) for s in ("h100", "h800"))
    cat = default_systems("rental_3yr")
    assert np.isnan(cat["h800"].power_all_in_w) and cat["h800"].power == 700.0
    assert len(h100) and len(h800)
    assert np.allclose(h100["power_w"], h100["chips"] * cat["h100"].power_all_in_w, rtol=1e-12)
    assert h800["power_w"].isna().all()
