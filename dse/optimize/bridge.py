"""Pyomo to OR-Tools, in memory: walk a Pyomo model's variables and linear constraints
(`pyomo.repn.generate_standard_repn`) and build the ``model_builder`` model directly, no files.

A model with `pyomo.gdp` disjunctions is first transformed by a named transformation (``bigm`` or
``hull``, Pyomo's registered ``gdp.<name>``). Rows follow Pyomo's order of the constraints (a block's own, in
declaration order, then its sub-blocks'); columns follow the variables' first use in those rows (``first_use``)
or their declaration (``declared``), chosen by name. That order is part of the model the solver sees: it picks
among tied optima and sets a node-limited solver's path. `solve_pyomo` returns the project's `SolveResult` with
the values of every variable (keyed by the Pyomo component's name and index), optionally warm-started from the
variables' current values; `lp_duals` fixes the integers at their values, solves the remaining LP and gives each
constraint's dual.
"""

from __future__ import annotations

import math
import time

import pyomo.environ as pyo
from ortools.linear_solver.python import model_builder as mb
from pyomo.repn import generate_standard_repn

from dse.errors import InputError
from dse.optimize.solver import SolveResult, relative_gap, solve, stopped_by_time

TRANSFORMATIONS = ("bigm", "hull")
COLUMN_ORDERS = ("first_use", "declared")


def transform(model: pyo.ConcreteModel, name: str = "bigm") -> pyo.ConcreteModel:
    """Apply the named GDP transformation (in place) when the model holds disjunctions."""
    if name not in TRANSFORMATIONS:
        raise InputError(f"gdp transformation '{name}' is not allowed; allowed: {', '.join(TRANSFORMATIONS)}")
    from pyomo.gdp import Disjunct

    if any(True for _ in model.component_data_objects(Disjunct, active=True)):
        pyo.TransformationFactory(f"gdp.{name}").apply_to(model)
    return model


def _key(v) -> tuple[str, object]:
    parent = v.parent_component()
    return parent.name, v.index()


def compile_model(model: pyo.ConcreteModel, relax: bool = False, columns: str = "first_use"
                  ) -> tuple[mb.Model, dict, dict]:
    """The model_builder model of a (transformed) Pyomo model: (model, Pyomo var -> mb var, Pyomo con -> mb con).

    With ``relax`` every variable is continuous. Fixed variables enter as constants. ``columns`` names the order
    of the columns (`COLUMN_ORDERS`); variables that appear in no row come last either way.
    """
    if columns not in COLUMN_ORDERS:
        raise InputError(f"column order '{columns}' is not allowed; allowed: {', '.join(COLUMN_ORDERS)}")
    m = mb.Model()
    vmap: dict = {}

    def var(v):
        if id(v) not in vmap:
            lb = -math.inf if v.lb is None else float(v.lb)
            ub = math.inf if v.ub is None else float(v.ub)
            if v.fixed:
                lb = ub = float(v.value)
            integer = (v.is_integer() or v.is_binary()) and not relax
            vmap[id(v)] = (v, m.new_var(lb, ub, integer, v.name))
        return vmap[id(v)][1]

    if columns == "declared":
        for v in model.component_data_objects(pyo.Var, active=True, descend_into=True):
            var(v)
    cmap: dict = {}
    for c in model.component_data_objects(pyo.Constraint, active=True, descend_into=True):
        repn = generate_standard_repn(c.body, compute_values=True)
        if not repn.is_linear():
            raise InputError(f"constraint {c.name} is not linear; the bridge compiles linear models only")
        expr = sum(float(coef) * var(v) for coef, v in zip(repn.linear_coefs, repn.linear_vars, strict=True)
                   ) if repn.linear_vars else 0
        const = float(repn.constant)
        if not all(math.isfinite(float(a)) for a in repn.linear_coefs) or math.isnan(const):
            raise InputError(f"constraint {c.name} has a coefficient that is not a number (missing data)")
        lo = -math.inf if c.lower is None else float(pyo.value(c.lower)) - const
        hi = math.inf if c.upper is None else float(pyo.value(c.upper)) - const
        if isinstance(expr, int):
            if lo > 1e-9 or hi < -1e-9:
                raise InputError(f"constraint {c.name} has no variables and does not hold")
            continue
        cmap[c] = _add_bounded(m, expr, lo, hi)
    objs = list(model.component_data_objects(pyo.Objective, active=True))
    if len(objs) != 1:
        raise InputError(f"the model has {len(objs)} active objectives; the bridge needs one")
    repn = generate_standard_repn(objs[0].expr, compute_values=True)
    expr = sum(float(coef) * var(v) for coef, v in zip(repn.linear_coefs, repn.linear_vars, strict=True)) \
        + float(repn.constant)
    if objs[0].sense == pyo.minimize:
        m.minimize(expr)
    else:
        m.maximize(expr)
    for v in model.component_data_objects(pyo.Var, active=True, descend_into=True):
        var(v)  # variables that appear nowhere still get a value
    return m, vmap, cmap


def _add_bounded(m: mb.Model, expr, lo: float, hi: float):
    if lo == hi:
        return m.add(expr == lo)
    if math.isinf(lo):
        return m.add(expr <= hi)
    if math.isinf(hi):
        return m.add(expr >= lo)
    c = m.add(expr >= lo)  # a range row: two rows, the dual reported is the lower one's
    m.add(expr <= hi)
    return c


def solve_pyomo(model: pyo.ConcreteModel, solver: str = "highs", time_limit_s: float = 60.0,
                gdp: str = "bigm", node_limit: int | None = None, settings: tuple[str, ...] = (),
                warm_start: bool = False, columns: str = "first_use") -> SolveResult:
    """Transform the disjunctions by name, compile, solve; values keyed (component name, index).

    ``node_limit`` and ``settings`` go to `dse.optimize.solver.solve`; ``columns`` to `compile_model`. With
    ``warm_start``, every variable that holds a value (a greedy solution, or an earlier stage's) is passed to the
    solver as a hint, in column order (not to HiGHS: OR-Tools 9.15's HiGHS interface crashes the process on a
    model with hints, so HiGHS starts cold; its objective bound, or a constraint capping the objective at a known
    plan's cost, is no substitute: either led HiGHS's presolve to a dearer plan reported optimal on the lifetime
    program). HiGHS's "infeasible" is confirmed by a second solve without presolve: its presolve has declared a
    feasible lifetime program infeasible (`tests/test_compute_equalization.py`).
    """
    transform(model, gdp)
    m, vmap, _ = compile_model(model, columns=columns)
    if warm_start and solver != "highs":  # OR-Tools 9.15 crashes (segmentation fault) passing hints to HiGHS
        for v, x in vmap.values():
            if v.value is not None and not v.fixed:
                m.add_hint(x, float(v.value))
    engine, res = solve(m, solver, time_limit_s, node_limit, settings)
    if solver == "highs" and res.status == "infeasible":  # confirmed without presolve
        engine, res = solve(m, solver, time_limit_s, node_limit, (*settings, "presolve=off"))
    if res.ok:
        _store(vmap, engine.values([x for _, x in vmap.values()]), res)
    return res


def _store(vmap: dict, vals, res: SolveResult) -> None:
    """A solution's values (in ``vmap``'s order) set on the model's variables (integers rounded) and kept in
    ``res.values`` keyed (component name, index).
    """
    for (v, _), val in zip(vmap.values(), vals, strict=True):
        val = float(val)
        if v.is_integer() or v.is_binary():
            val = float(round(val))
        v.set_value(val, skip_validation=True)
        res.values[_key(v)] = val


def relaxation_bound(model: pyo.ConcreteModel, solver: str = "highs", time_limit_s: float = 60.0) -> float:
    """The optimum of a minimizing model's linear relaxation (every variable continuous): a bound on its integer
    optimum; minus infinity when the LP is not solved within the limit.
    """
    transform(model)
    m, _, _ = compile_model(model, relax=True)
    engine = mb.Solver(solver)
    engine.set_time_limit_in_seconds(time_limit_s)
    if solver == "highs":  # interior point: on the fleet program's relaxations 1.5-3x faster than dual simplex
        engine.set_solver_specific_parameters("output_flag=false\nsolver=ipm")
    status = engine.solve(m)
    return float(engine.objective_value) if status == mb.SolveStatus.OPTIMAL else -math.inf


DUAL_TIME_LIMIT_S = 30.0
"""Seconds for the LP behind `lp_duals`: its integers are fixed, so it solves in far less; the limit only stops a
runaway solve (no duals are reported then)."""


def lp_duals(model: pyo.ConcreteModel, fix: tuple[str, ...] | None = None, solver: str = "glop"
             ) -> dict[tuple[str, object], float]:
    """Duals of the LP left when the integer variables (those of components named in ``fix``, or every one)
    are fixed at their current values and the rest relaxed: d objective / d right-hand side per constraint.

    GLOP by default: HiGHS through ``model_builder`` (OR-Tools 9.15) reports the right-hand side, not the dual.
    """
    fixed = _fix_integers(model, fix)
    try:
        m, _, cmap = compile_model(model, relax=True)
        engine = mb.Solver(solver)
        engine.set_time_limit_in_seconds(DUAL_TIME_LIMIT_S)
        status = engine.solve(m)
        if status != mb.SolveStatus.OPTIMAL:
            return {}
        return {(c.parent_component().name, c.index()): float(engine.dual_value(x)) for c, x in cmap.items()}
    finally:
        for v in fixed:
            v.unfix()


def _fix_integers(model: pyo.ConcreteModel, fix: tuple[str, ...] | None) -> list:
    fixed = []
    for v in model.component_data_objects(pyo.Var, active=True, descend_into=True):
        if (v.is_integer() or v.is_binary()) and (fix is None or v.parent_component().name in fix) and not v.fixed:
            v.fix(round(v.value or 0.0))
            fixed.append(v)
    return fixed


def lp_savings(model: pyo.ConcreteModel, rows: dict[str, float], fix: tuple[str, ...] | None = None,
               solver: str = "glop") -> dict[tuple[str, object], float]:
    """What one more unit of each ``<=`` row saves in the LP left when the integer variables (those of components
    named in ``fix``, or every one) are fixed at their values and the rest relaxed: per row of the constraint
    components named in ``rows`` (name -> unit), the objective less the objective with the row's right-hand side
    raised by its unit, re-solved. A finite difference, so a degenerate vertex (where a dual is any value of an
    interval) gives the saving of an increase, never a price the increase does not reach; 0 where the row does not
    bind. Empty when the LP is not solved.
    """
    fixed = _fix_integers(model, fix)
    try:
        m, _, cmap = compile_model(model, relax=True)
        engine = mb.Solver(solver)
        engine.set_time_limit_in_seconds(DUAL_TIME_LIMIT_S)
        if engine.solve(m) != mb.SolveStatus.OPTIMAL:
            return {}
        base = float(engine.objective_value)
        out = {}
        for c, x in cmap.items():
            name = c.parent_component().name
            if name not in rows or c.upper is None:
                continue
            ub = x.upper_bound
            x.upper_bound = ub + rows[name]
            ok = engine.solve(m) == mb.SolveStatus.OPTIMAL
            out[(name, c.index())] = max(0.0, base - float(engine.objective_value)) if ok else 0.0
            x.upper_bound = ub
        return out
    finally:
        for v in fixed:
            v.unfix()


def solve_pyomo_milp(model: pyo.ConcreteModel, time_limit_s: float = 60.0, node_limit: int | None = None
                     ) -> SolveResult:
    """A minimizing model solved by HiGHS through scipy's ``milp`` (compiled as `solve_pyomo` compiles it); values
    keyed (component name, index) and set on the model's variables where a solution is found.

    Unlike HiGHS through ``model_builder`` (OR-Tools 9.15), it reports HiGHS's dual bound where the solve stops at
    its limit, with or without a solution (status ``unknown`` without one), and its own first-solution heuristics
    run: measured with `scripts/bench_fleet.py`'s node relaxations (`dse.optimize.fleet.node_bound`; load 3-3.5),
    aggregated 2 models x 12 slices, where ``model_builder``'s HiGHS ended its 23.6 s with neither a solution nor a
    bound, is proven (6,414.4 USD/day) in 33 s with a first solution at 0.1 s; mixed 1 x 24 in 16 s. The bound is
    HiGHS's (``mip_dual_bound``), never its incumbent.
    """
    import numpy as np
    import scipy.sparse as sp
    from scipy.optimize import Bounds, LinearConstraint, milp

    transform(model)
    m, vmap, _ = compile_model(model)
    p = m.export_to_proto()
    if p.maximize:
        raise InputError("solve_pyomo_milp minimizes; the model maximizes")
    c = np.array([v.objective_coefficient for v in p.variable], dtype=float)
    lb = np.array([v.lower_bound for v in p.variable], dtype=float)
    ub = np.array([v.upper_bound for v in p.variable], dtype=float)
    integer = np.array([int(v.is_integer) for v in p.variable])
    rows = [i for i, con in enumerate(p.constraint) for _ in con.var_index]
    cols = [j for con in p.constraint for j in con.var_index]
    vals = [a for con in p.constraint for a in con.coefficient]
    A = sp.csr_matrix((vals, (rows, cols)), shape=(len(p.constraint), len(p.variable)))
    lo = np.array([con.lower_bound for con in p.constraint], dtype=float)
    hi = np.array([con.upper_bound for con in p.constraint], dtype=float)
    t0 = time.perf_counter()
    r = milp(c, integrality=integer, bounds=Bounds(lb, ub), constraints=LinearConstraint(A, lo, hi) if len(lo)
             else (), options={"time_limit": max(0.1, time_limit_s), "mip_rel_gap": 1e-9,
                                  **({"node_limit": node_limit} if node_limit else {})})
    wall = time.perf_counter() - t0
    offset = float(p.objective_offset)
    bound = getattr(r, "mip_dual_bound", None)
    bound = float(bound) + offset if bound is not None and math.isfinite(float(bound)) else math.nan
    if r.x is not None:
        status = "optimal" if r.status == 0 else "feasible"
        obj = float(r.fun) + offset
        if status == "optimal" and math.isnan(bound):
            bound = obj
    else:
        status, obj = {2: "infeasible", 3: "unbounded"}.get(r.status, "unknown"), math.nan
    gap = relative_gap(obj, bound) if status in ("optimal", "feasible") else math.inf
    res = SolveResult(status, str(r.message), obj, bound, gap, wall, "highs",
                      time_limited=stopped_by_time(status, wall, time_limit_s))
    if r.x is not None:
        _store(vmap, [r.x[x.index] for _, x in vmap.values()], res)
    return res
