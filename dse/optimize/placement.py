"""Solve the expert-placement program (two stages, exact) and compare it with the EPLB greedy."""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass

import numpy as np
from scipy.optimize import linprog

from dse.errors import InfeasibleError, SolverLimitError
from dse.optimize.solver import solve
from formulations import expert_placement as fp


@dataclass
class Placement:
    peak: float
    crossing: float
    x: np.ndarray
    y: np.ndarray
    status: str
    gap: float
    wall_s: float
    result: object = None  # the stage-1 SolveResult (peak load)
    time_limited: bool = False  # a stage stopped at the time limit: the answer depends on machine speed

    def imbalance(self, data: fp.PlacementData) -> float:
        """Most-loaded GPU over the mean: the factor the slowest GPU stretches the expert step by."""
        return self.peak / (data.loads.sum() / data.gpus)


def _hint(pm: fp.PlacementModel, x: np.ndarray, y: np.ndarray) -> None:
    for (e, g), var in pm.x.items():
        pm.model.add_hint(var, float(x[e, g]))
    for (e, g), var in pm.y.items():
        pm.model.add_hint(var, float(y[e, g]))


def solve_placement(data: fp.PlacementData, time_limit_s: float = 600.0, solver: str = "scip",
                    node_limit: int | None = None) -> Placement:
    """Two-stage exact placement, warm-started from the EPLB greedy; status and gap say how exact.

    ``node_limit`` (per stage) makes the answer the same on every machine; ``time_limit_s`` is a safety
    stop, and a stage that reaches it is reported (``time_limited``), since its answer depends on speed.
    """
    t0 = time.perf_counter()
    pm = fp.build(data)
    try:
        _hint(pm, *fp.greedy_eplb(data))
    except ValueError:  # the greedy packing can fail where the program still has a solution
        pass
    engine, res1 = solve(pm.model, solver, time_limit_s, node_limit)
    if not res1.ok:
        if res1.status == "infeasible":  # slots per GPU too few for the experts and their replicas
            raise InfeasibleError(f"expert placement: {data.experts} experts do not fit {data.gpus} GPUs x "
                                  f"{data.slots} expert slots (short by {data.experts - data.gpus * data.slots} slots)"
                                  if data.experts > data.gpus * data.slots else
                                  f"expert placement: {solver} found the program infeasible")
        raise SolverLimitError(f"expert placement: no placement found within {time_limit_s:g} s by {solver} "
                               f"({res1.status}); raise solver.time_limit_s")
    peak = float(engine.value(pm.peak))
    x1 = engine.values(pm.x).to_numpy().reshape(data.experts, data.gpus)
    y1 = engine.values(pm.y).to_numpy().reshape(data.experts, data.gpus)
    pm2 = fp.build(data, peak_max=peak * (1 + 1e-9) + 1e-9)
    _hint(pm2, x1, y1)
    engine2, res2 = solve(pm2.model, solver, time_limit_s, node_limit)
    if res2.ok:
        x = engine2.values(pm2.x).to_numpy().reshape(data.experts, data.gpus)
        y = engine2.values(pm2.y).to_numpy().reshape(data.experts, data.gpus)
    else:
        x, y = x1, y1
    status = "optimal" if res1.status == "optimal" and res2.status == "optimal" else "feasible"
    limited = any(r.status != "optimal" and r.wall_s >= 0.98 * time_limit_s for r in (res1, res2))
    return Placement(peak, fp.crossing_tokens(data, x), x, y, status, res1.gap, time.perf_counter() - t0, res1,
                     limited)


def greedy(data: fp.PlacementData) -> Placement:
    x, y = fp.greedy_eplb(data)
    peak = float((data.loads[:, None] * y).sum(axis=0).max())
    return Placement(peak, fp.crossing_tokens(data, x), x, y, "heuristic", float("nan"), 0.0)


def peak_given_placement(data: fp.PlacementData, x: np.ndarray) -> float:
    """The LP of splitting tokens over a fixed placement: minimize the peak GPU load."""
    e, g = data.experts, data.gpus
    n = e * g + 1  # y then peak
    c = np.zeros(n)
    c[-1] = 1.0
    a_eq = np.zeros((e, n))
    for i in range(e):
        a_eq[i, i * g:(i + 1) * g] = 1
    a_ub = np.zeros((g, n))
    for j in range(g):
        for i in range(e):
            a_ub[j, i * g + j] = data.loads[i]
        a_ub[j, -1] = -1
    bounds = [(0.0, float(x[i, j])) for i in range(e) for j in range(g)] + [(0, None)]
    r = linprog(c, A_ub=a_ub, b_ub=np.zeros(g), A_eq=a_eq, b_eq=np.ones(e), bounds=bounds, method="highs")
    return float(r.fun) if r.status == 0 else float("inf")


def exhaustive(data: fp.PlacementData) -> float:
    """Best peak over every placement (small instances): each expert's replica set is a non-empty subset."""
    subsets = [s for r in range(1, data.gpus + 1) for s in itertools.combinations(range(data.gpus), r)]
    best = float("inf")
    for choice in itertools.product(subsets, repeat=data.experts):
        if sum(len(s) for s in choice) > data.experts + data.redundant:
            continue
        x = np.zeros((data.experts, data.gpus))
        for i, s in enumerate(choice):
            x[i, list(s)] = 1
        if (x.sum(axis=0) > data.slots).any():
            continue
        best = min(best, peak_given_placement(data, x))
    return best
