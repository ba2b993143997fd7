"""The bridge to OR-Tools: one result type for every solve, and the solve call itself.

Formulations build an OR-Tools ``model_builder`` model (or a Pyomo model, compiled to the same
standard form) and return it; this module solves it with a named solver and maps the answer to
`SolveResult`. Unknown solver answers map to ``unknown``, never to a crash.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from dse.errors import InputError

if TYPE_CHECKING:  # OR-Tools is imported by the solves that use it (its import costs a study that solves none 0.2 s)
    from ortools.linear_solver.python import model_builder as mb

SOLVERS = ("highs", "scip", "sat")
_STATUS = {"OPTIMAL": "optimal", "FEASIBLE": "feasible", "INFEASIBLE": "infeasible", "UNBOUNDED": "unbounded"}
"""Solve statuses by their `model_builder.SolveStatus` names."""


@dataclass
class SolveResult:
    """What every solve returns: status, objective, bound, gap, wall time and the chosen values."""

    status: str  # optimal | feasible | infeasible | unbounded | unknown
    termination: str
    objective: float
    bound: float
    gap: float
    wall_s: float
    solver: str
    values: dict = field(default_factory=dict)
    iterations: int = 1
    time_limited: bool = False  # stopped short of optimality by its time limit: the answer depends on machine speed

    @property
    def ok(self) -> bool:
        return self.status in ("optimal", "feasible")

    def as_dict(self) -> dict:
        return {"name": self.solver, "status": self.status, "wall_s": self.wall_s, "gap": self.gap,
                "objective": self.objective, "bound": self.bound, "iterations": self.iterations,
                "time_limited": self.time_limited}


def stopped_by_time(status: str, wall_s: float, time_limit_s: float) -> bool:
    """Whether a solve that did not prove optimality ran to its time limit (rather than to a node limit or a
    proof): its answer then depends on the machine's speed and load, and is not reproducible.
    """
    return status != "optimal" and wall_s >= 0.98 * time_limit_s


def relative_gap(objective: float, bound: float) -> float:
    """|objective - bound| / max(|objective|, tiny); 0 when both agree."""
    if math.isnan(objective) or math.isnan(bound):
        return math.inf
    return abs(objective - bound) / max(abs(objective), 1e-12)


def solve(model: mb.Model, solver: str = "highs", time_limit_s: float = 60.0,
          node_limit: int | None = None, settings: tuple[str, ...] = ()) -> tuple[mb.Solver, SolveResult]:
    """Solve a model_builder model with a named OR-Tools back end.

    ``node_limit`` bounds the branch-and-bound nodes: unlike a time limit, it gives the same answer on every
    run on one machine whatever its load (single-threaded solvers are deterministic), so it is the limit that
    should decide. Across CPUs the LP's floating-point path can differ, and a node-limited answer with it
    (`dse.optimize.placement` measures one case).
    ``settings`` are further solver-specific parameters, one per line in the back end's own syntax (SCIP:
    ``separating/maxroundsroot = 2``), set before the node limit.
    """
    from ortools.linear_solver.python import model_builder as mb

    if solver not in SOLVERS:
        raise InputError(f"solver '{solver}' is not allowed; allowed: {', '.join(SOLVERS)}")
    engine = mb.Solver(solver)
    if not engine.solver_is_supported():
        raise InputError(f"solver '{solver}' is not available in this OR-Tools build; allowed: {', '.join(SOLVERS)}")
    engine.set_time_limit_in_seconds(time_limit_s)
    if solver == "highs":
        nodes = (f"mip_max_nodes={node_limit}",) if node_limit else ()
        engine.set_solver_specific_parameters("\n".join(("output_flag=false", "mip_rel_gap=1e-9", *settings, *nodes)))
    elif solver == "scip" and (node_limit or settings):
        nodes = (f"limits/nodes = {node_limit}",) if node_limit else ()
        engine.set_solver_specific_parameters("\n".join((*settings, *nodes)))
    elif settings:
        engine.set_solver_specific_parameters("\n".join(settings))
    t0 = time.perf_counter()
    status = engine.solve(model)
    wall = time.perf_counter() - t0
    name = _STATUS.get(getattr(status, "name", ""), "unknown")
    if name in ("optimal", "feasible"):
        obj, bound = engine.objective_value, engine.best_objective_bound
    else:
        obj = bound = math.nan
        if name == "unknown":  # stopped with no solution: its bound may still be known
            try:
                bound = float(engine.best_objective_bound)
            except (TypeError, ValueError):
                bound = math.nan
    gap = relative_gap(obj, bound) if name in ("optimal", "feasible") else math.inf
    return engine, SolveResult(name, str(status), obj, bound, gap, wall, solver,
                               time_limited=stopped_by_time(name, wall, time_limit_s))


def elastic_shortfalls(m, what: str, period: str, inventory, power_cap_w: float, budget: float | None, usd: str,
                       empty: str) -> str:
    """What an elastic program's solution falls short by, in one line: the nodes of a system in a ``period``
    (its ``short_nodes``, against ``inventory.loc[system, period]``), site power (``short_power_w``, against
    ``power_cap_w``) and the budget (``short_usd``, in ``usd``), the first six and how many more; ``empty`` where
    nothing falls short.
    """
    parts = []
    for (s, t), v in m.short_nodes.items():
        if (v.value or 0) > 1e-6:
            parts.append(f"inventory of {s} in {period} {t}: short by {v.value:.4g} nodes "
                         f"({inventory.loc[s, t]:g} available)")
    for t, v in m.short_power_w.items():
        if (v.value or 0) > 1e-6:
            parts.append(f"site power in {period} {t}: short by {v.value / 1e3:.4g} kW (cap {power_cap_w / 1e3:g} kW)")
    for v in m.short_usd.values():
        if (v.value or 0) > 1e-6:
            parts.append(f"budget: short by {v.value:,.0f} {usd} (budget {budget:,.0f} {usd})")
    more = f" (and {len(parts) - 6} more)" if len(parts) > 6 else ""
    return f"infeasible {what}: " + ("; ".join(parts[:6]) + more if parts else empty)
