"""Solve the expert-placement program (two stages, exact) and compare it with the EPLB greedy.

The stages stop on limits of work (branch-and-bound nodes), not of time, so that an answer is the same on
every machine: SCIP runs on one thread with fixed settings and is deterministic as long as no time limit
cuts it. The time limit stays as a safety net; a stage it stops is marked ``time_limited`` (its answer
depends on the machine's speed and load).
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass

import numpy as np
from ortools.linear_solver.python import model_builder as mb
from scipy.optimize import linprog

from dse.errors import InfeasibleError, InputError, SolverLimitError
from dse.optimize.solver import SolveResult, relative_gap, solve, stopped_by_time
from formulations import expert_placement as fp

DIVES = ("adaptivediving", "coefdiving", "conflictdiving", "distributiondiving", "farkasdiving", "fracdiving",
         "guideddiving", "linesearchdiving", "objpscostdiving", "pscostdiving", "rootsoldiving", "veclendiving")
SCIP_SETTINGS = ("separating/maxroundsroot = 2", "branching/mostinf/priority = 1000000",
                 *(f"heuristics/{h}/freq = -1" for h in DIVES))
"""SCIP's settings for this program: two rounds of cuts at the root, branching on the most fractional
placement without strong branching, and no diving heuristics (on the shipped 256-expert instance they
spent about 18,000 LP iterations a stage and never found a better placement; the hint, RINS and the other
large-neighbourhood heuristics do). They bound the work per node, so a node limit bounds the time."""
_STATUS = {mb.SolveStatus.OPTIMAL: "optimal", mb.SolveStatus.FEASIBLE: "feasible",
           mb.SolveStatus.INFEASIBLE: "infeasible", mb.SolveStatus.UNBOUNDED: "unbounded"}


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
    crossing_gap: float = float("nan")  # stage 2's relative gap (crossing tokens; inf where it found nothing)

    def imbalance(self, data: fp.PlacementData) -> float:
        """Most-loaded GPU over the mean: the factor the slowest GPU stretches the expert step by."""
        return self.peak / (data.loads.sum() / data.gpus)


def _hint(pm: fp.PlacementModel, x: np.ndarray, y: np.ndarray) -> None:
    for (e, g), var in pm.x.items():
        pm.model.add_hint(var, float(x[e, g]))
    for (e, g), var in pm.y.items():
        pm.model.add_hint(var, float(y[e, g]))


def _solve(model: mb.Model, solver: str, time_limit_s: float, node_limit: int | None) -> tuple[mb.Solver, SolveResult]:
    """Solve one stage: SCIP with `SCIP_SETTINGS` and the node limit, another solver through `solve`."""
    if solver != "scip":
        return solve(model, solver, time_limit_s, node_limit)
    engine = mb.Solver("scip")
    if not engine.solver_is_supported():
        raise InputError("solver 'scip' is not available in this OR-Tools build")
    engine.set_time_limit_in_seconds(time_limit_s)
    limit = (f"limits/nodes = {node_limit}",) if node_limit else ()
    engine.set_solver_specific_parameters("\n".join((*SCIP_SETTINGS, *limit)))
    t0 = time.perf_counter()
    status = engine.solve(model)
    wall = time.perf_counter() - t0
    name = _STATUS.get(status, "unknown")
    ok = name in ("optimal", "feasible")
    obj, bound = (engine.objective_value, engine.best_objective_bound) if ok else (float("nan"), float("nan"))
    return engine, SolveResult(name, str(status), obj, bound, relative_gap(obj, bound) if ok else float("inf"), wall,
                               "scip", time_limited=stopped_by_time(name, wall, time_limit_s))


def solve_placement(data: fp.PlacementData, time_limit_s: float = 600.0, solver: str = "scip",
                    node_limit: int | None = None, crossing_node_limit: int | None = None) -> Placement:
    """Two-stage exact placement, warm-started from the EPLB greedy; status and gap say how exact.

    ``node_limit`` bounds the branch-and-bound nodes of stage 1 (the peak load) and ``crossing_node_limit``
    those of stage 2 (the crossing tokens; default: ``node_limit``): limits of work, which give the same
    answer on every machine. ``time_limit_s`` (per stage) is a safety net; a stage it stops is reported
    (``time_limited``), since its answer then depends on the machine's speed.
    """
    t0 = time.perf_counter()
    crossing_node_limit = node_limit if crossing_node_limit is None else crossing_node_limit
    pm = fp.build(data)
    try:
        _hint(pm, *fp.greedy_eplb(data))
    except ValueError:  # the greedy packing can fail where the program still has a solution
        pass
    engine, res1 = _solve(pm.model, solver, time_limit_s, node_limit)
    if not res1.ok:
        if res1.status == "infeasible":  # slots per GPU too few for the experts and their replicas
            raise InfeasibleError(f"expert placement: {data.experts} experts do not fit {data.gpus} GPUs x "
                                  f"{data.slots} expert slots (short by {data.experts - data.gpus * data.slots} slots)"
                                  if data.experts > data.gpus * data.slots else
                                  f"expert placement: {solver} found the program infeasible")
        if node_limit and not res1.time_limited:
            raise SolverLimitError(f"expert placement: no placement found within {node_limit} branch-and-bound "
                                   f"nodes by {solver} ({res1.status}); raise placement.node_limit")
        raise SolverLimitError(f"expert placement: no placement found within {time_limit_s:g} s by {solver} "
                               f"({res1.status}); raise placement.time_limit_s")
    peak = float(engine.value(pm.peak))
    x1 = engine.values(pm.x).to_numpy().reshape(data.experts, data.gpus)
    y1 = engine.values(pm.y).to_numpy().reshape(data.experts, data.gpus)
    pm2 = fp.build(data, peak_max=peak * (1 + 1e-9) + 1e-9)
    _hint(pm2, x1, y1)
    engine2, res2 = _solve(pm2.model, solver, time_limit_s, crossing_node_limit)
    if res2.ok:
        x = engine2.values(pm2.x).to_numpy().reshape(data.experts, data.gpus)
        y = engine2.values(pm2.y).to_numpy().reshape(data.experts, data.gpus)
    else:
        x, y = x1, y1
    status = "optimal" if res1.status == "optimal" and res2.status == "optimal" else "feasible"
    limited = res1.time_limited or res2.time_limited
    return Placement(peak, fp.crossing_tokens(data, x), x, y, status, res1.gap, time.perf_counter() - t0, res1,
                     limited, res2.gap)


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
