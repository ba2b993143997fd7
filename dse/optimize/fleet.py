"""The fleet program, solved: `formulations.fleet` through the bridge, the solution re-checked independently,
the duals of the LP with the integers fixed (what a unit more of power or inventory would save), a greedy
baseline, and, when infeasible, the elastic program that names the binding resource and its shortfall.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from dse.errors import InfeasibleError, SolverLimitError
from dse.optimize.bridge import lp_duals, solve_pyomo
from dse.optimize.solver import SolveResult
from formulations.fleet import FleetData, build

TOL = 1e-6


@dataclass
class FleetResult:
    """Nodes per system, replicas per option and slice, the cost breakdown and the marginal values."""

    result: SolveResult
    reserved: pd.Series  # nodes per system
    hourly: pd.DataFrame  # nodes per system x slice
    replicas: pd.DataFrame  # options x slice
    cost: dict
    duals: dict = field(default_factory=dict)


def breakdown(d: FleetData, reserved: pd.Series, hourly: pd.DataFrame) -> dict:
    """USD per day, recomputed from the values: reserved, hourly and fixed costs."""
    sy = d.systems
    hours = d.slice_h * len(d.slices)
    scale = 24.0 / hours
    res = float((reserved * sy["reserved_usd_per_node_h"]).sum() * hours * scale)
    hr = float((hourly.sum(axis=1) * sy["hourly_usd_per_node_h"]).sum() * d.slice_h * scale)
    used = (reserved + hourly.max(axis=1)) > 0
    fixed = float((used * sy["fixed_usd_per_day"]).sum())
    return {"reserved_usd_per_day": res, "hourly_usd_per_day": hr, "fixed_usd_per_day": fixed,
            "usd_per_day": res + hr + fixed}


def diagnose(d: FleetData, solver: str = "highs", time_limit_s: float = 10.0) -> str:
    """The elastic program's shortfalls: which resource binds, and by how much."""
    m = build(d, elastic=True)
    res = solve_pyomo(m, solver, time_limit_s)
    if not res.ok:
        return f"the fleet program is infeasible and its elastic form is {res.status}"
    parts = []
    for (s, t), v in m.short_nodes.items():
        if (v.value or 0) > 1e-6:
            parts.append(f"inventory of {s} in slice {t}: short by {v.value:.4g} nodes "
                         f"({d.inventory.loc[s, t]:g} available)")
    for t, v in m.short_power_w.items():
        if (v.value or 0) > 1e-6:
            parts.append(f"site power in slice {t}: short by {v.value / 1e3:.4g} kW (cap {d.power_cap_w / 1e3:g} kW)")
    for v in m.short_usd.values():
        if (v.value or 0) > 1e-6:
            parts.append(f"budget: short by {v.value:,.0f} USD/day (budget {d.budget_usd_per_day:,.0f} USD/day)")
    return "infeasible fleet: " + ("; ".join(parts[:6]) + (f" (and {len(parts) - 6} more)" if len(parts) > 6 else "")
                                   if parts else "no resource shortfall found (demand has no option)")


def solve_fleet(d: FleetData, solver: str = "highs", time_limit_s: float = 60.0, duals: bool = True) -> FleetResult:
    """Solve the fleet program; InfeasibleError names the binding resource and its shortfall."""
    o = d.options
    for mod, cls in d.demand.index:
        if not ((o["model"] == mod) & (o["cls"] == cls)).any() and (d.demand.loc[(mod, cls)] > 0).any():
            raise InfeasibleError(f"infeasible fleet: {mod} / {cls} has no operating point meeting its targets on "
                                  f"any system (short by {d.demand.loc[(mod, cls)].max():.4g} requests/s)")
    m = build(d)
    res = solve_pyomo(m, solver, time_limit_s)
    if res.status == "infeasible":
        raise InfeasibleError(diagnose(d, solver))
    if not res.ok:
        other = "scip" if solver != "scip" else "highs"
        raise SolverLimitError(f"no fleet found within {time_limit_s:g} s by {solver} (it stopped with no "
                               f"solution, status {res.status}); raise solver.time_limit_s or try solver.name: {other}")
    S, T = list(m.S), list(m.T)
    reserved = pd.Series({s: round(m.reserved[s].value or 0) for s in S}, dtype=float)
    hourly = pd.DataFrame([[round(m.hourly[s, t].value or 0) for t in T] for s in S], index=S, columns=T, dtype=float)
    reps = pd.DataFrame([[round(m.x[k, t].value or 0) for t in T] for k in m.K], columns=T, dtype=float)
    out = FleetResult(res, reserved, hourly, reps, breakdown(d, reserved, hourly))
    if duals:
        dv = lp_duals(m, fix=("used",))
        out.duals = {"usd_per_day_per_kw": {t: -1e3 * dv.get(("power", t), 0.0) for t in T} if d.power_cap_w else {},
                     "usd_per_day_per_node": {(s, t): -dv.get(("inventory", (s, t)), 0.0) * float(
                         m.used[s].value or 0) for s in S for t in T}}
    return out


def check(d: FleetData, r: FleetResult) -> list[str]:
    """Independent re-check of a fleet solution: demand with N+1, whole nodes, inventory, power and budget."""
    bad = []
    o = d.options
    for t in d.slices:
        for (mod, cls), need in d.demand[t].items():
            sel = ((o["model"] == mod) & (o["cls"] == cls)).to_numpy()
            cap = float((o.loc[sel, "requests_per_s"].to_numpy() * r.replicas.loc[sel, t].to_numpy()).sum())
            used = sel & (r.replicas[t].to_numpy() > 0)
            spare = float(o.loc[used, "requests_per_s"].max()) if d.n_plus_one and used.any() and need > 0 else 0.0
            if need > 0 and cap - spare < need * (1 - TOL):
                bad.append(f"{mod}/{cls} slice {t}: capacity {cap:.6g} less its largest replica in use "
                           f"{spare:.6g} < {need:.6g}")
        for s in d.systems.index:
            sel = (o["system"] == s).to_numpy()
            nodes = float((o.loc[sel, "nodes"].to_numpy() * r.replicas.loc[sel, t].to_numpy()).sum())
            held = r.reserved[s] + r.hourly.loc[s, t]
            if nodes > held + TOL:
                bad.append(f"{s} slice {t}: replicas need {nodes} nodes, {held} held")
            if held > d.inventory.loc[s, t] + TOL:
                bad.append(f"{s} slice {t}: {held} nodes held, inventory {d.inventory.loc[s, t]}")
        if d.power_cap_w is not None:
            pw = float(((r.reserved + r.hourly[t]) * d.systems["power_per_node_w"]).sum())
            if pw > d.power_cap_w * (1 + TOL):
                bad.append(f"slice {t}: power {pw:.6g} W over the cap {d.power_cap_w:.6g} W")
    cost = breakdown(d, r.reserved, r.hourly)["usd_per_day"]
    if d.budget_usd_per_day is not None and cost > d.budget_usd_per_day * (1 + TOL):
        bad.append(f"cost {cost:.6g} over the budget {d.budget_usd_per_day:.6g}")
    if r.result.status == "optimal" and not math.isclose(cost, r.result.objective, rel_tol=1e-6, abs_tol=1e-6):
        bad.append(f"recomputed cost {cost:.8g} differs from the objective {r.result.objective:.8g}")
    return bad


def greedy(d: FleetData) -> float:
    """USD per day of a greedy fleet: per slice and (model, class), the option with the least hourly cost per
    request/s that still fits the inventory and power left, in whole replicas with N+1, all rented by the hour; then
    each system's base load (its least nodes over the slices) moved to reserved nodes where that is cheaper.
    Infinity when the greedy runs out of a resource.
    """
    o, sy = d.options, d.systems
    nodes_used = pd.DataFrame(0.0, index=sy.index, columns=d.slices)
    unit = o["nodes"] * sy.loc[o["system"], "hourly_usd_per_node_h"].to_numpy() / o["requests_per_s"]
    for t in d.slices:
        power = 0.0
        for (mod, cls), need in d.demand[t].items():
            if need <= 0:
                continue
            sel = o[(o["model"] == mod) & (o["cls"] == cls)]
            for k in unit.loc[sel.index].sort_values().index:
                r = o.loc[k]
                n = math.ceil(need / r["requests_per_s"] - 1e-9) + (1 if d.n_plus_one else 0)
                add = n * r["nodes"]
                pw = add * sy.loc[r["system"], "power_per_node_w"]
                if nodes_used.loc[r["system"], t] + add <= d.inventory.loc[r["system"], t] and (
                        d.power_cap_w is None or power + pw <= d.power_cap_w):
                    nodes_used.loc[r["system"], t] += add
                    power += pw
                    break
            else:
                return math.inf
    base = nodes_used.min(axis=1)
    hours = d.slice_h * len(d.slices)
    cheaper = sy["reserved_usd_per_node_h"] * hours < sy["hourly_usd_per_node_h"] * d.slice_h * len(d.slices)
    reserved = (base * cheaper).astype(float)
    hourly = nodes_used.sub(reserved, axis=0)
    cost = breakdown(d, reserved, hourly)["usd_per_day"]
    if d.budget_usd_per_day is not None and cost > d.budget_usd_per_day * (1 + TOL):
        return math.inf
    return cost


def replica_nodes(chips: np.ndarray | int, node_chips: np.ndarray | int) -> np.ndarray:
    """Whole nodes a replica occupies: its chips lie within nodes (racks)."""
    return np.ceil(np.asarray(chips) / np.asarray(node_chips)).astype(int)
