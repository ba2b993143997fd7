"""The deployment program, solved: operating points of one model's request classes (`operating_points`) into
`formulations.deployment`, solved through the bridge, re-checked against the physics, and compared with a greedy
that picks the cheapest single configuration per pool.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from dse.errors import InfeasibleError, SolverLimitError
from dse.optimize.bridge import solve_pyomo
from dse.optimize.solver import SolveResult
from formulations.deployment import DeploymentData, build

TOL = 1e-6


@dataclass
class DeploymentResult:
    """The chosen replicas per operating point, the cost and the solver's answer."""

    result: SolveResult
    pools: pd.DataFrame  # the points with replicas > 0, column ``replicas``
    usd_per_s: float
    disaggregated_rps: dict[str, float]


def data_of(points: dict[str, pd.DataFrame], demand: dict[str, float]) -> DeploymentData:
    """One table of points (column ``cls``) from each class's points."""
    frames = [p.assign(cls=c) for c, p in points.items() if not p.empty]
    table = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(
        columns=["cls", "role", "group", "usd_per_s", "requests_per_s"])
    return DeploymentData(table, dict(demand))


def diagnose(d: DeploymentData) -> str | None:
    """Why no deployment exists: a class with no aggregated point and no prefill and decode points sharing
    numerics (the TTFT, TPOT or memory limits left none).
    """
    p = d.points
    short = []
    for c, lam in d.demand.items():
        q = p[p["cls"] == c]
        both = (q["role"] == "both").any()
        pairs = set(q.loc[q["role"] == "prefill", "group"]) & set(q.loc[q["role"] == "decode", "group"])
        if lam > 0 and not both and not pairs:
            short.append(f"class '{c}': no operating point meets its TTFT and TPOT targets within HBM (demand "
                         f"{lam:.4g} requests/s, capacity 0: short by {lam:.4g} requests/s)")
    return "; ".join(short) or None


def solve_deployment(d: DeploymentData, solver: str = "highs", gdp: str = "bigm",
                     time_limit_s: float = 60.0) -> DeploymentResult:
    """Solve the deployment program; InfeasibleError names the class and shortfall."""
    why = diagnose(d)
    if why:
        raise InfeasibleError(why)
    m = build(d)
    res = solve_pyomo(m, solver, time_limit_s, gdp)
    if res.status == "infeasible":
        raise InfeasibleError(f"the deployment program is infeasible ({res.termination})")
    if not res.ok:
        raise SolverLimitError(f"no deployment found within {time_limit_s:g} s by {solver} (it stopped with no "
                               f"solution, status {res.status}); raise solver.time_limit_s")
    reps = np.array([round(m.x[i].value or 0) for i in m.P], dtype=int)
    pools = d.points.assign(replicas=reps)
    pools = pools[pools["replicas"] > 0].reset_index(drop=True)
    return DeploymentResult(res, pools, float(res.objective), {c: float(m.s[c].value) for c in m.C})


def check(d: DeploymentData, pools: pd.DataFrame, targets: dict[str, tuple[float | None, float | None]] | None = None
          ) -> list[str]:
    """Independent re-check of a solution: every class served (aggregated capacity plus the lesser of its prefill
    and decode capacities), one numerics group, every pool within its class's TTFT and TPOT targets.
    """
    bad = []
    if pools["group"].nunique() > 1:
        bad.append(f"pools mix numerics groups {sorted(pools['group'].unique())}")
    for c, lam in d.demand.items():
        q = pools[pools["cls"] == c]
        cap = {r: float((q.loc[q["role"] == r, "requests_per_s"] * q.loc[q["role"] == r, "replicas"]).sum())
               for r in ("both", "prefill", "decode")}
        served = cap["both"] + min(cap["prefill"], cap["decode"])
        if served < lam * (1 - TOL):
            bad.append(f"class {c}: serves {served:.6g} of {lam:.6g} requests/s")
        if targets and c in targets:
            tpot, ttft = targets[c]
            if tpot is not None and (q["tpot_s"].dropna() > tpot * (1 + TOL)).any():
                bad.append(f"class {c}: a pool's TPOT exceeds {tpot}")
            if ttft is not None and (q.loc[q["role"] != "decode", "ttft_s"].dropna() > ttft * (1 + TOL)).any():
                bad.append(f"class {c}: a pool's TTFT exceeds {ttft}")
    return bad


def greedy(d: DeploymentData) -> float:
    """Cost per second of the greedy deployment: per class, the cheapest single aggregated configuration or the
    cheapest single (prefill, decode) pair of one numerics, in whole replicas; one numerics for all classes (the
    best group).
    """
    p = d.points
    best = math.inf
    for g in p["group"].unique():
        total = 0.0
        for c, lam in d.demand.items():
            q = p[(p["cls"] == c) & (p["group"] == g)]
            opts = [math.inf]
            for _, r in q[q["role"] == "both"].iterrows():
                opts.append(math.ceil(lam / r["requests_per_s"] - 1e-9) * r["usd_per_s"])
            pre, dec = q[q["role"] == "prefill"], q[q["role"] == "decode"]
            if len(pre) and len(dec):
                cp = min(math.ceil(lam / r["requests_per_s"] - 1e-9) * r["usd_per_s"] for _, r in pre.iterrows())
                cd = min(math.ceil(lam / r["requests_per_s"] - 1e-9) * r["usd_per_s"] for _, r in dec.iterrows())
                opts.append(cp + cd)
            total += min(opts)
        best = min(best, total)
    return best
