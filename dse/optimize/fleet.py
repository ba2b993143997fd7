"""The fleet program, solved: `formulations.fleet` through the bridge, warm-started from a greedy fleet, the
solution re-checked independently, the duals of the LP with the replica plan fixed (what a unit more of power or
inventory would save), and, when infeasible, the elastic program that names the binding resource and its shortfall.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field, replace

import numpy as np
import pandas as pd
import pyomo.environ as pyo

from dse.errors import InfeasibleError, SolverLimitError
from dse.optimize.bridge import lp_savings, relaxation_bound, solve_pyomo, solve_pyomo_milp
from dse.optimize.fleet_bound import ColumnBound, column_bound, cut_bound
from dse.optimize.operating_points import operating_points
from dse.optimize.solver import SolveResult, elastic_shortfalls, relative_gap
from dse.optimize.space import Space
from formulations.fleet import OPTION_COLUMNS as OPTION_COLUMNS
from formulations.fleet import FleetData, build, build_plans, relax_replicas

TOL = 1e-6


@dataclass
class Fleet:
    """A fleet: nodes per system, replicas per option and slice, and the requests each prefill pool hands off and
    each decode pool takes (rows (class index, numerics group, system), columns slice).
    """

    reserved: pd.Series  # nodes per system
    hourly: pd.DataFrame  # nodes per system x slice
    replicas: pd.DataFrame  # options x slice
    prefill: pd.DataFrame = field(default_factory=pd.DataFrame)
    decode: pd.DataFrame = field(default_factory=pd.DataFrame)
    plans: dict = field(default_factory=dict)  # (class index, slice): the replicas of its plan (`plans_of`; greedy)


@dataclass
class FleetResult(Fleet):
    """A solved fleet with the solver's answer, the cost breakdown and the marginal values."""

    result: SolveResult = None  # type: ignore[assignment]
    cost: dict = field(default_factory=dict)
    duals: dict = field(default_factory=dict)
    greedy_usd_per_day: float = math.inf


def breakdown(d: FleetData, reserved: pd.Series, hourly: pd.DataFrame) -> dict:
    """USD per day, recomputed from the values: reserved, hourly and fixed costs."""
    sy, w = d.systems, d.weights
    hours = d.slice_h * float(w.sum())
    scale = 24.0 / hours
    res = float((reserved * sy["reserved_usd_per_node_h"]).sum() * hours * scale)
    hr = float(((hourly * w).sum(axis=1) * sy["hourly_usd_per_node_h"]).sum() * d.slice_h * scale)
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
    return elastic_shortfalls(m, "fleet", "slice", d.inventory, d.power_cap_w, d.budget_usd_per_day, "USD/day",
                              "no resource shortfall found (demand has no option)")


def _no_option(d: FleetData) -> None:
    o = d.options
    for mod, cls in d.demand.index:
        if not ((o["model"] == mod) & (o["cls"] == cls)).any() and (d.demand.loc[(mod, cls)] > 0).any():
            raise InfeasibleError(f"infeasible fleet: {mod} / {cls} has no operating point meeting its targets on "
                                  f"any system (short by {d.demand.loc[(mod, cls)].max():.4g} requests/s)")


def _read(m, d: FleetData) -> Fleet:
    """The fleet held in a solved model's variables."""
    T = list(m.T)
    reserved, hourly = _read_nodes(m)
    reps = pd.DataFrame([[round(m.x[k, t].value or 0) for t in T] for k in m.K], columns=T, dtype=float)
    pre = pd.DataFrame([[max(0.0, m.p[i + (t,)].value or 0.0) for t in T] for i in m.FP],
                       index=pd.MultiIndex.from_tuples(list(m.FP)) if len(m.FP) else None, columns=T, dtype=float)
    dec = pd.DataFrame([[max(0.0, m.q[i + (t,)].value or 0.0) for t in T] for i in m.FQ],
                       index=pd.MultiIndex.from_tuples(list(m.FQ)) if len(m.FQ) else None, columns=T, dtype=float)
    return Fleet(reserved, hourly, reps, pre, dec)


def _start_nodes(m, f: Fleet) -> None:
    """Set the node variables (reserved, hourly, systems in use) to the fleet's."""
    for s in m.S:
        m.reserved[s].set_value(float(f.reserved[s]))
        for t in m.T:
            m.hourly[s, t].set_value(float(f.hourly.loc[s, t]))
    for s in m.SU:
        m.used[s].set_value(float((f.reserved[s] + f.hourly.loc[s]).max() > 0))


def _read_nodes(m) -> tuple[pd.Series, pd.DataFrame]:
    """Reserved nodes per system and hourly nodes per system and slice held in a solved model (whole nodes)."""
    S, T = list(m.S), list(m.T)
    reserved = pd.Series({s: float(round(m.reserved[s].value or 0)) for s in S}, dtype=float)
    hourly = pd.DataFrame([[float(math.ceil((m.hourly[s, t].value or 0) - 1e-6)) for t in T] for s in S], index=S,
                          columns=T, dtype=float)
    return reserved, hourly


def start_from(m, d: FleetData, f: Fleet) -> None:
    """Set every variable of the model to the fleet's values (a warm start the solver may take as its incumbent)."""
    _start_nodes(m, f)
    for k in m.K:
        for t in m.T:
            m.x[k, t].set_value(float(f.replicas.at[k, t]))
    for i in m.FP:
        for t in m.T:
            m.p[i + (t,)].set_value(max(0.0, float(f.prefill.loc[i, t])) if i in f.prefill.index else 0.0)
    for i in m.FQ:
        for t in m.T:
            m.q[i + (t,)].set_value(max(0.0, float(f.decode.loc[i, t])) if i in f.decode.index else 0.0)
    if hasattr(m, "level"):  # a level is reached when the largest rate in use in its group is at or above it
        o = d.options
        rate = o["requests_per_s"].to_numpy(dtype=float)
        cls = {c: j for j, c in enumerate(d.classes)}
        key = [("both", cls[(a, b)]) if r == "both" else (r, cls[(a, b)], int(g), sy)
               for a, b, r, g, sy in zip(o["model"], o["cls"], o["role"], o["group"], o["system"], strict=True)]
        members: dict = {}
        for k, kk in enumerate(key):
            members.setdefault(m.spare_group.get(kk, -1), []).append(k)
        for (g, t), levels in m.spare_rates.items():
            ks = [k for k in members.get(g, []) if f.replicas.at[k, t] > 0]
            top = float(rate[ks].max()) if ks else 0.0
            active = max((i for i, v in enumerate(levels) if top >= v * (1 - 1e-9)), default=0)
            for li in range(1, len(levels)):
                m.level[g, li, t].set_value(float(li <= active))
            for k in members.get(g, []) if hasattr(m, "y") else ():
                for li in range(len(levels)):
                    if (k, li, t) in m.HC:
                        m.y[k, li, t].set_value(float(f.replicas.at[k, t]) if li == active else 0.0)
    for i, s in getattr(m, "CCS", ()):  # a capacity cover's share: what the system's replicas give, at most 1
        m.cover_share[i, s].set_value(min(1.0, pyo.value(m.cover_part[i, s]), float(m.used[s].value)))
    if hasattr(m, "send"):
        for (j, g, s) in m.X:
            for t in m.T:
                p = float(f.prefill.loc[(j, g, s), t]) if (j, g, s) in f.prefill.index else 0.0
                q = float(f.decode.loc[(j, g, s), t]) if (j, g, s) in f.decode.index else 0.0
                m.send[j, g, s, t].set_value(max(0.0, p - q))
                m.take[j, g, s, t].set_value(max(0.0, q - p))


def _class_of(d: FleetData, k: int) -> int:
    return d.classes.index((d.options["model"].iat[k], d.options["cls"].iat[k]))


HINTS = ("scip", "sat")
"""Solvers given the warm start as a hint (`model_builder`'s ``add_hint``): SCIP takes it as a partial solution to
complete and CP-SAT as a search hint, both safely. HiGHS through ``model_builder`` (OR-Tools 9.15) crashes the process
on hints (a segmentation fault on the fleet program), so it is never given one; its answer is compared with the warm
start's fleet afterwards instead, which keeps the same guarantee: never dearer than the greedy."""

PLAN_STAGE_MIN = 400
"""Integer replica columns (options x distinct slices) from which `solve_fleet` first solves the restricted program
of one configuration per class and slice (`formulations.fleet.build_plans`): below, the full program reaches its
optimum within seconds and the stage would only take its time."""

FULL_PROGRAM_MAX = 3000
"""Columns above which the full program's branch and bound does not finish its root within a minute on 2 cores
(aggregated 10 models x 12 distinct slices: no bound after 40 s): there the bound is the linear relaxation of the
lean program (`relaxation_bound` of `formulations.fleet.build` with ``lean``: the hull of `add_hull` and the capacity
covers, without the big-M rows a relaxation satisfies with slivers; up to half the time limit) and the rest of the
time goes to the plan program."""


AGGREGATED_SHARE = 1 / 3
"""Share of the time limit for the program restricted to aggregated options (`solve_aggregated`), solved first where
a program with pools has one below `FULL_PROGRAM_MAX` columns: the answer is then never dearer than that
restriction's fleet within this share. Where the program itself is above `FULL_PROGRAM_MAX` columns, its bound comes
from the column generation, which needs its time, and the share is `AGGREGATED_SHARE_COLUMNS` where the restriction
has more than `AGGREGATED_COLUMNS_MAX` columns. Measured with `scripts/bench_fleet.py` (60 s, load 1-1.4, one
window), on mixed and disaggregated 2 x 12 (3,080 and 3,360 columns; the restriction 616) a third gives 6,424 USD/day
in both, a sixth 6,890 and 6,472 (6,424-6,471 in another window): the restriction's node relaxation needs the time;
a third leaves the column generation where pools join a bound of 6,163-6,206 (a sixth 6,181-6,201)."""
AGGREGATED_SHARE_COLUMNS = 1 / 6
AGGREGATED_COLUMNS_MAX = 1000
"""Most integer replica columns of the restriction to aggregated options (its options x distinct slices) given
`AGGREGATED_SHARE` of the time where the program is above `FULL_PROGRAM_MAX` columns; above, the restriction's fleets
are dearer than the pools' on `scripts/bench_fleet.py`'s instances (5 and 10 models: 1,782-4,368 columns; mixed
5 x 12: 14,382 USD/day against 14,090-14,176; 10 x 6: 66,700 against 45,919) and it takes `AGGREGATED_SHARE_COLUMNS`.
Skipping it there altogether left mixed 10 x 24 bounds of 46,576-46,758 in three runs where it ran gave 46,942
(before the node program over the column generation's cuts); with that program, where pools join across systems it is
skipped there (`JOINED_SHARE`: the cuts need the time)."""
OWN_SHARE = 1 / 6
"""Share of the time limit for the column generation on the restriction of a program whose pools join across systems
to pools paired on their own system, below `FULL_PROGRAM_MAX` columns (its fleets and reserved nodes only;
`solve_fleet`)."""
COLUMN_SHARE = 1 / 3
"""Share of the time limit for the column generation bound (`dse.optimize.fleet_bound.column_bound`): measured with
`scripts/bench_fleet.py` it converges (to 0.1% of its master) in 13 CPU s on disaggregated 10 models x 24 h and
5 CPU s on aggregated; stopped early, it still returns a valid bound (its best Lagrangian value). With the master
warm (`dse.optimize.fleet_bound.WarmMaster`, 60 s, load 1.6-2, one run each), half of the time instead of a third
closed disaggregated 2 x 12 (gap 0.99-1.02% -> 0.85%, bound 6,330-6,332 -> 6,341 USD/day) but left the plan
program too little on disaggregated 5 x 24 (14,042 -> 14,070, gap 0.92% -> 1.07%) and the search over the reserved
nodes on aggregated 10 x 6 (66,308 -> 66,486, 0.70% -> 0.95%); aggregated 10 x 24 0.96% -> 0.88%, disaggregated
5 x 12 0.97% -> 0.93%. Where the aggregated-only stage ends before its share (its restriction solved), the time it
leaves goes to the column generation too: disaggregated 1 x 24 (the restriction proved in 9 s of its 20), gap
1.35-1.54% -> 0.91% (bound 3,990-3,998 -> 4,016 USD/day, the fleet the restriction's 4,053; load 1.6-2)."""
COLUMN_SHARE_FULL = 1 / 6
"""The same share where the node relaxations (`node_bound`) follow (up to `NODE_COLUMNS_MAX` columns) and need the
time: measured with `scripts/bench_fleet.py` aggregated 2 x 12 (60 s, load 3.5-3.7), with a third the node
relaxation did not end in the time left (bound 6,299 USD/day from the column generation, gap 1.95%)."""


def _round_master(d: FleetData, solver: str, cb, plans: dict, time_limit_s: float, deadline: float | None = None
                  ) -> Fleet | None:
    """Fleets of the column generation's plans (``plans``: every plan it priced, `_column_stage`), slice by slice
    with the systems in use and the reserved nodes of its master fixed (`solve_plans_by_slice`): first those of the
    node program over its cuts where it ran (`ColumnBound.cut_at`, with its own systems in use), then the root
    master's rounded to the nearest, down, and one below down (the hourly nodes take the rest), and the least-bound
    box's after branching rounded to the nearest; the cheapest. On `scripts/bench_fleet.py`'s aggregated 10 models
    x 24 h the root's reach 75,475 USD/day in 3 CPU s, where the plan program reached 75,855 in 60 s. On its mixed
    5 x 12 (reserved H200 nodes 26.75 in the master), with only the plans near the duals (within ``near_usd``, even
    at 50 USD/day) 27 and 26 nodes gave 14,070 and 14,051, 25 gave 14,080; with every plan 25 gave 14,032 (the
    answer's gap 1.11% -> 0.97%; aggregated 10 x 6 and 10 x 24 0.86-0.89% -> 0.68-0.71% and 0.85%). ``deadline``:
    none is started, and none finished, after it.
    """
    if cb.x is None:
        return None
    S, nT = list(d.systems.index), len(d.slices)
    fixed = [s for s in S if float(d.systems.loc[s, "fixed_usd_per_day"]) > 0]
    used = frozenset({s for s, v in zip(fixed, cb.x[len(S) * (1 + nT):], strict=True) if v > 1e-6}
                     | {s for s in S if s not in fixed})
    best = None
    down = np.floor(cb.x[:len(S)] + 1e-6)
    tries = [(tuple(r), used) for r in sorted({tuple(np.round(cb.x[:len(S)])), tuple(down),
                                                  tuple(np.maximum(down - 1, 0))})]
    if cb.leaf is not None:
        tries.append((tuple(np.round(cb.leaf[:len(S)])), used))
    if cb.cut_at is not None:  # the node program's nodes and systems first
        tries.insert(0, (tuple(cb.cut_at[0].reindex(S).to_numpy()), frozenset(cb.cut_at[1])))
    for rounded, on in dict.fromkeys(tries):
        if deadline is not None and time.perf_counter() >= deadline:
            break
        f = solve_plans_by_slice(d, solver, time_limit_s / len(tries), pd.Series(rounded, index=S), set(on), plans,
                                 False, deadline)
        if f is not None and fleet_cost(d, f) < fleet_cost(d, best):
            best = f
    return best


def _start_plans(d: FleetData, g: Fleet) -> dict:
    """Plans the column generation starts from: per class and slice the greedy's and each single configuration
    (`plans_of`).
    """
    table = plan_options(d)
    out: dict = {}
    for j in range(len(d.classes)):
        for t in d.slices:
            need = float(d.demand.iloc[j][t])
            if need > 0:
                out[(j, t)] = [c for c, _, _ in plans_of(d, j, need, table=table)]
    for key, counts in g.plans.items():
        out.setdefault(key, []).append(counts)
    return out


JOINED_SHARE = 1 / 2
"""Most share of the time limit for the column generation on a program whose pools join across systems (its pairs
across systems priced by `dse.optimize.fleet_bound.priced_pool`, after its pools paired on their own systems,
`column_bound`'s ``own_first``; rounds cut at the limit), where the full program does not run; at most the time
left less `JOINED_LEFT`, which the node program over its cuts (`JOINED_CUT_SHARE`) and the fleets at its nodes and
the master's take. Its cuts need the rounds: measured with `scripts/bench_fleet.py`'s mixed 5 models x 24 slices
(load 1), the node program over the cuts of 30 s of generation proves 14,022.4 USD/day in 15-20 s (twice), over
those of 20 s it stays at 13,900.8 (the linear relaxation's value) after 25 s. In `solve_fleet` (60 s, load 0.6-1):
with two thirds capped by the time left less a quarter and a sixth (after the aggregated-only stage, 11.7 s) the
generation had 23.4 s and the node program 10 s, bound 13,900.6, gap 1.07%; with no aggregated-only stage (the
restriction's fleet was 16,824 against 14,051), 35 s and 10 s, 13,901.6 and 1.00%; the same on mixed 5 x 12 (0.93%
-> 0.92%) and 10 x 24 (0.66% both). With half here and a third for the node program (30 s and 20 s): 13,930.4 (its
branching stopped at the limit; gap 0.89%) in one run, 14,022 (proven; 0.20%) in the whole bench's; mixed 5 x 12
0.24% (bound 13,998), 10 x 6 0.06%, 10 x 12 0.47-0.66%, 10 x 24 0.61-0.71%."""
JOINED_LEFT = 5 / 12
"""Share of the time limit the column generation leaves where pools join across systems above `FULL_PROGRAM_MAX`
columns (`JOINED_SHARE`): the node program over its cuts and the fleets of its plans."""
JOINED_CUT_SHARE = 1 / 3
"""Most share of the time limit for the node program over the cuts where pools join across systems above
`FULL_PROGRAM_MAX` columns; the fleets of the column generation's plans at its nodes and its master's
(`_round_master`) keep a sixth."""
CUTS_SHARE = 1 / 6
"""Most share of the time limit for the program's own column generation, for its cuts, where pools join across
systems below `FULL_PROGRAM_MAX` columns (there the column generation on the own-system restriction gives the fleets
and reserved nodes, its cuts not the program's): at most half the time left. Measured with `scripts/bench_fleet.py`'s
mixed 1 x 24 (load 1): the cuts of 10 s (184-403 distinct) prove the best fleet's 4,052.8 USD/day in 2.6-3.7 s, those
of 20 s and 40 s in 4.0 and 4.9 s."""
CUT_SHARE = 1 / 6
"""Most share of the time limit for the node program over the column generation's cuts (`cut_bound`). Measured with
`scripts/bench_fleet.py` (column generation alone, then the node program, load 1-2): mixed 2 x 12 after 10 / 15 / 20 s
of generation, 6,352 / 6,366 / 6,395.2 USD/day (the best fleet's) in 4.2-4.9 s. Mixed 5 x 24 after 20 s: 13,900.6 in
10 or 20 s, where HiGHS's branching leaves it at the linear relaxation's value (so does SCIP's in 25 s; HiGHS with no
heuristics, 13,900.8); after 30 s once 14,021 (proven in 21.5 s)."""


PLANS_SEARCH_SHARE = 0.5
"""Share of the time left after the column generation that the plan program (`solve_plans`) leaves, above
`FULL_PROGRAM_MAX` columns, to the search over the reserved nodes with plan programs per slice over the column
generation's plans, where the whole plan program is SCIP's (above `PLAN_HIGHS_MAX` pairs; below, HiGHS proves it and
its fleet is the better use of the time: disaggregated 5 x 12 with half of it 14,051 USD/day, with all 14,042).
Measured with `scripts/bench_fleet.py` (60 s, load 2, one run each), aggregated 10 models x 12
and x 24 slices: with none (the plan program taking all the time) 69,531 and 69,750 USD/day (gaps 1.11% and 1.46%);
with half, 69,456 and 69,440 (1.00% and 1.02%), each found by the search where the plan program found nothing."""
SEARCH_LEFT = 1 / 12
"""Above `FULL_PROGRAM_MAX` columns, where the plan program (`solve_plans`) ends with more than this share of the
time limit left, the search over the reserved nodes (`search_reserved`) takes the rest from the best fleet."""
NODE_SHARE = 3 / 4
"""Most share of the time limit for the node relaxations' bound (`node_bound`) and the slices at their nodes, where
`solve_fleet` runs them (up to `NODE_COLUMNS_MAX` columns), before the search over the reserved nodes: where their
bound meets the best fleet nothing else runs. Measured with `scripts/bench_fleet.py` (60 s, load 3.3), with half of
the time the stage left aggregated 2 models x 12 slices at 6,414 / 6,310 USD/day (gap 1.63%; HiGHS proves 6,414 in
33 s at load 3)."""
SLICES_SHARE = 1 / 6
"""Share of the time limit the node relaxations leave for the slices solved at their nodes (`solve_by_slice`): at
load 3.5 a relaxation given the time to the limit ended there, its fleet unsolved (aggregated 2 x 12: 6,970 USD/day
against 6,414 with its slices solved)."""
NODE_COLUMNS_MAX = 1700
"""Most integer replica columns (options x distinct slices) for which `solve_fleet` runs `node_bound`: measured with
`scripts/bench_fleet.py` (load 2.6-4.5), HiGHS proves the node relaxation's optimum at up to 1,680 columns
(disaggregated 1 model x 24 slices, 23 s) and finds no solution, so no bound, within 45 s at 1,782 (aggregated
5 x 12) or within 100 s at 1,820 (aggregated 10 x 6 as merged); there its time goes to the full program."""
NODE_JOINED_COLUMNS_MAX = 1700
"""The same where pools join across systems: measured with `scripts/bench_fleet.py` (60 s, load 2.3-2.8), on mixed
1 model x 6 slices (700 columns) the stage proves the optimum (3,899 USD/day) in 47.8 s; on mixed 1 x 24 (1,680),
solved by HiGHS through ``model_builder`` after the search over the reserved nodes, its relaxation ended with a
dual bound of 0 and left the full program too little time (gap 100%); through scipy's ``milp`` and before the
search it proves 4,038.4 in 25 s (load 2.3-2.9), the answer 4,076 (gap 0.92%, 3.97-10.4% without the stage)."""
WHOLE_REPLICAS_MAX = 1000
"""Most integer replica columns (options x distinct slices) for which `solve_fleet` also solves the lean relaxation
with whole replicas (`node_bound` with ``whole``) where the node relaxation leaves a gap: measured with
`scripts/bench_fleet.py` (load 3-3.5), HiGHS proves it on disaggregated and mixed 1 model x 6 slices (700 columns;
3,899 USD/day, the best fleet's cost, in 14-16 s) and not within 40 s on aggregated 2 x 12 (616 columns, where the
node relaxation alone proves 6,414 in 24 s), disaggregated 1 x 24 (1,680) or mixed 2 x 12 (3,080)."""


def node_bound(d: FleetData, time_limit_s: float, whole: bool = False
               ) -> tuple[float, tuple[pd.Series, set] | None]:
    """A lower bound on the fleet program from a relaxation that keeps its node counts whole, by HiGHS within
    ``time_limit_s``: the node relaxation (`formulations.fleet.relax_replicas` of the lean program, itself a
    relaxation: `formulations.fleet.build`), its replica counts continuous, or whole with ``whole`` (its N+1 levels
    continuous). The bound is its proven optimum or HiGHS's dual bound where it stops at the limit, with or without
    a solution (HiGHS through scipy's ``milp``, `dse.optimize.bridge.solve_pyomo_milp`); minus infinity where it
    reports none. Returned with the reserved nodes and the systems holding nodes of the solution found (whole counts:
    a start for `solve_by_slice`), or None where it found none.

    HiGHS rather than SCIP: measured with `scripts/bench_fleet.py` (load 3-4.5), on aggregated 1 model x 24 slices
    HiGHS proves the node relaxation's optimum, 4,076 USD/day (the program's), in 9 s where SCIP's bound is 3,987 at
    30 s; HiGHS proves aggregated 2 x 12 (6,414) in 24 s, disaggregated 1 x 24 (4,038) in 23 s, disaggregated and
    mixed 1 x 6 (3,851) in 3.4-4.5 s and mixed 2 x 12 (6,275) in 60 s.
    """
    end = time.perf_counter() + time_limit_s
    m = relax_replicas(build(d, lean=True), replicas=not whole)
    left = end - time.perf_counter()  # the build counts against the limit
    if left < 1.0:
        return -math.inf, None
    res = solve_pyomo_milp(m, left)
    if res.status in ("infeasible", "unbounded") or not math.isfinite(res.bound):
        return -math.inf, None
    if not res.ok:  # stopped with no solution: HiGHS's dual bound still holds
        return float(res.bound), None
    reserved, hourly = _read_nodes(m)
    return float(res.bound), (reserved, {s for s in d.systems.index if float(reserved[s] + hourly.loc[s].max()) > 0})


def demand_pairs(d: FleetData) -> int:
    """(Class, slice) pairs with demand: the blocks of the column generation and of the plan program."""
    return int((d.demand.to_numpy() > 0).sum())


PLAN_HIGHS_MAX = 400
"""Most (class, slice) pairs with demand for which ``solver: auto`` solves the whole plan program with HiGHS rather
than SCIP (`choose_solver`)."""


def choose_solver(d: FleetData, stage: str = "program") -> str:
    """The back end for ``solver: auto``, per stage and size.

    ``plans`` for the whole plan program (`solve_plans`), ``program`` for every other solve. Measured with
    `scripts/bench_fleet.py --sizes 1x6,5x12,10x24` (60 s, 2 shared cores under a load of 2-6; each solver for every
    stage, the plan program's own status, answer and bound logged):

    - The full program (below `FULL_PROGRAM_MAX` columns; 1 model x 6 slices): SCIP. Aggregated (140 columns),
      re-measured under a load of 6.3-6.6: SCIP proves the optimum (3,947 USD/day) in 7.7 CPU s (46 s wall), HiGHS in
      5.5 CPU s (25 s), CP-SAT stops at its 60 s limit with a 2.53% gap (21 CPU s); HiGHS is the faster prover there
      but takes no start, which the programs with pools need: disaggregated and mixed (700 columns), started from the
      best fleet so far, SCIP ended at a 1.9% / 3.9% gap, HiGHS found no fleet and no bound in 38 / 32 s, CP-SAT ended
      at gaps of 44% / 29% (an earlier data set, whose aggregated optimum was 3,899). Disaggregated 1 x 6 given 600 s:
      SCIP proves 3,947 (the aggregated optimum) in 330 s wall under a load of 6.
    - The whole plan program at up to `PLAN_HIGHS_MAX` (class, slice) pairs with demand, counted once equal slices
      merge, as `solve_fleet` compares them (5 models x 12 slices: 220; 5 x 24: 280; 10 x 6: 200): HiGHS.
      It proves the plan program's optimum in 2.2 s (aggregated, 14,954), 13.3 s (disaggregated, 14,286) and 6.4 s
      (mixed, 14,286), where SCIP, started from the best fleet, stops at its limit with a 0.30% gap (19.1 s, same
      fleet) or proves it in 23.0 s and 16.5 s; CP-SAT stops at gaps of 23%, 7.0% and 5.9%. HiGHS takes no start, so
      its answer is compared with the best fleet afterwards (never dearer).
    - The whole plan program above (10 models x 24 slices: 560 pairs once equal slices merge, 960 before; 10 x 12,
      440, falls above too and was not measured apart): SCIP. HiGHS finds no plan in 9-31 s on all
      three (aggregated 10 x 24 then answers the greedy's 90,170, gap 20%); SCIP reaches 73,639 / 48,794 / 48,794
      (gaps 1.8% / 0.30% / 0.26% of the plan program); CP-SAT 73,078 / 49,442 / 49,442 (1.1% / 1.8% / 1.9%): better
      on the aggregated program, no better than its start on the other two.
    """
    if stage == "plans" and demand_pairs(d) <= PLAN_HIGHS_MAX:
        return "highs"
    return "scip"


def solve_fleet(d: FleetData, solver: str = "auto", time_limit_s: float = 60.0, duals: bool = True,
                hull: str = "aggregated", plan_stage: bool | None = None, aggregated_stage: bool = True,
                bound_stage: bool = True, reserved_stage: bool = True, column_stage: bool = True) -> FleetResult:
    """Solve the fleet program; InfeasibleError names the binding resource and its shortfall.

    Exact reductions first (`FleetData.reduced`: options another matches; `FleetData.merged`: equal slices as one);
    then a greedy fleet. Where classes have pools and the program restricted to aggregated options has fewer than
    `FULL_PROGRAM_MAX` columns, that restriction first (`solve_aggregated`, `AGGREGATED_SHARE` of the time,
    `AGGREGATED_SHARE_COLUMNS` where the program is above `FULL_PROGRAM_MAX` columns and the restriction above
    `AGGREGATED_COLUMNS_MAX`, and not at all there where pools join across systems): its
    fleets are the program's, so the answer is never dearer than the restriction's answer within that share, and
    every later stage starts from the best fleet so far and keeps it. From `PLAN_STAGE_MIN` columns, the column
    generation bound (`dse.optimize.fleet_bound.column_bound`, `COLUMN_SHARE` of the time, `COLUMN_SHARE_FULL` where
    the node relaxations follow), the node program over its cuts (`dse.optimize.fleet_bound.cut_bound`, at most
    `CUT_SHARE`; where its bound meets the best fleet, no fleet of those plans is sought) and fleets of its plans at
    that program's nodes and systems, then at its master's reserved nodes (`_round_master`); where pools join across
    interconnects, below `FULL_PROGRAM_MAX` columns the same on the restriction to pools paired on their own system
    (`OWN_SHARE`: fleets and reserved nodes; its cuts are not the program's), then the program's own column
    generation for its cuts (`CUTS_SHARE`), the node program over them and the slices solved exactly at its nodes;
    above, on the program itself (`JOINED_SHARE`, capped by the time left less `JOINED_LEFT`; the node program
    over its cuts within `JOINED_CUT_SHARE`; its
    plans whose pools pair across systems handing off as `joined_flows` finds);
    where that bounds nothing above `FULL_PROGRAM_MAX` columns, the lean relaxation's bound
    (`formulations.fleet.build` with ``lean``; at most half the time). Below `FULL_PROGRAM_MAX` columns, from
    `PLAN_STAGE_MIN` columns and up to `NODE_COLUMNS_MAX` (`NODE_JOINED_COLUMNS_MAX` where pools join across
    systems), the node relaxations' bound (`node_bound`, at most `NODE_SHARE` of the time, `SLICES_SHARE` left;
    with whole replicas up to `WHOLE_REPLICAS_MAX` columns), each followed by the slices solved at its nodes
    (`solve_by_slice`); where that bound proves the best fleet so far, nothing else runs; else, from
    `PLAN_STAGE_MIN` columns, the search over the reserved nodes and systems in use with every slice solved
    exactly (`search_reserved`, from the best fleet and the column generation master's nodes; half of the time
    left; above `NODE_COLUMNS_MAX` columns, where the column generation priced plans, each slice a plan program over
    its near plans, the greedy's and the best fleet's, all of the time left but `SEARCH_LEFT`: on
    `scripts/bench_fleet.py`'s aggregated 10 models x 6 slices (load 1.4-2, one run each), with every slice solved
    exactly the search found no fleet below the column generation's 66,641 USD/day in half the time left, with plan
    programs 66,625 in half of it and 66,538 in all but `SEARCH_LEFT`); above `FULL_PROGRAM_MAX`, the restricted
    program of one plan per class and slice instead (`solve_plans`:
    the column generation's near plans and the greedy's where it ran, else every single configuration and simple
    mixes; all of the time left; a stage starts only with time left), then the search over the reserved nodes where
    more than `SEARCH_LEFT` of the time is left; then, below `FULL_PROGRAM_MAX` columns, the full program started
    from the best fleet, its bound the answer's where higher.
    The answer is the cheapest fleet found (never dearer than the greedy), its gap against the best bound.
    ``aggregated_stage`` and ``bound_stage`` switch those stages off (a stage's own call needs no bound);
    ``column_stage`` the column generation alone, ``reserved_stage`` the search over the reserved nodes.
    """
    _no_option(d)
    t0 = time.perf_counter()
    name = choose_solver(d) if solver == "auto" else solver
    dr = d.reduced()
    dm, rep = dr.merged()
    g = greedy(dm)
    best, best_cost, found_by = g, fleet_cost(dm, g), "greedy"
    columns = len(dm.options) * len(dm.slices)
    full = columns < FULL_PROGRAM_MAX or g is None
    plans = (columns >= PLAN_STAGE_MIN if plan_stage is None else plan_stage) and g is not None
    bound, extra, bounded_by, master = -math.inf, None, "", None
    end = t0 + time_limit_s

    def remaining() -> float:
        return end - time.perf_counter()

    pooled = bool((dm.options["role"] != "both").any())
    unused = 0.0  # of the aggregated-only stage's share, where it ends early (its restriction solved): the bound's
    small = full or (dm.options["role"] == "both").sum() * len(dm.slices) <= AGGREGATED_COLUMNS_MAX
    joined_pools = bool((dm.systems["interconnect_bytes_per_s"] > 0).any() and pooled)
    if g is not None and pooled and aggregated_stage and (dm.options["role"] == "both").sum() * len(dm.slices) \
            < FULL_PROGRAM_MAX and (small or not joined_pools):
        # the restriction to aggregated options first: its fleets are this program's, so the answer is never dearer
        # than the restriction's within its share, and every later stage starts from the best fleet so far (not
        # where pools join across systems and the restriction is large: there the column generation and the node
        # program over its cuts need the time, `JOINED_SHARE`)
        given, began = (AGGREGATED_SHARE if small else AGGREGATED_SHARE_COLUMNS) * time_limit_s, time.perf_counter()
        f = solve_aggregated(dm, name, given)
        unused = max(0.0, given - (time.perf_counter() - began))
        if f is not None and fleet_cost(dm, f) < best_cost * (1 - 1e-9):
            best, best_cost, found_by = f, fleet_cost(dm, f), "aggregated options alone"
    nodes_stage = full and bound_stage and g is not None and columns <= (
        NODE_JOINED_COLUMNS_MAX if joined_pools else NODE_COLUMNS_MAX)
    if plans and bound_stage and column_stage:
        joined = bool((dm.systems["interconnect_bytes_per_s"] > 0).any())
        if joined and full:
            # pools joined across systems, below `FULL_PROGRAM_MAX` columns (where the full program's search gives
            # the bound): the same options with every pool paired on its own system are a restriction (each of its
            # fleets is one of this program's, its bound is not a bound here) whose column generation converges
            # faster; it gives fleets and near plans and the reserved nodes the search starts from. Above, the
            # program's own column generation prices them first itself (`column_bound`) and takes this time too
            # (`scripts/bench_fleet.py`, 60 s, load 1: mixed 2 x 12 gap 1.74% -> 1.59%, 5 x 12 1.17% -> 1.11%,
            # 5 x 24 1.57% -> 1.28%, the same fleets)
            own = replace(dm, systems=dm.systems.assign(interconnect_bytes_per_s=0.0))
            master, extra, f = _column_stage(own, g, name, OWN_SHARE * time_limit_s, time_limit_s / 12, deadline=end)
            if f is not None and fleet_cost(dm, f) < best_cost * (1 - 1e-9):
                best, best_cost, found_by = f, fleet_cost(dm, f), "plans of pools paired on their own systems"
        if not joined or not full:
            share = (min(JOINED_SHARE * time_limit_s, remaining() - JOINED_LEFT * time_limit_s) if joined
                     else (COLUMN_SHARE_FULL if nodes_stage else COLUMN_SHARE) * time_limit_s + unused)
            cuts_s = JOINED_CUT_SHARE if joined else CUT_SHARE if full else 0.0
            cb, more, f = _column_stage(dm, g, name, max(share, 0.0), time_limit_s / 6, cut=joined, deadline=end,
                                        cuts_s=cuts_s * time_limit_s, best_usd=best_cost)
            master = cb if cb.x is not None else master
            if cb.bound > -math.inf:
                if cb.bound > bound:
                    bound, bounded_by = cb.bound, f"bound by column generation ({cb.iterations} rounds)"
                if cb.cut_value > bound:
                    bound, bounded_by = cb.cut_value, f"bound by the node program over {len(cb.cuts)} cuts"
                if f is not None and fleet_cost(dm, f) < best_cost * (1 - 1e-9):
                    best, best_cost, found_by = f, fleet_cost(dm, f), "plans at the master's nodes"
            for key, p in (more or {}).items():
                extra = extra or {}
                extra.setdefault(key, []).extend(p)
        if joined and full and remaining() > 2.0:
            # the program's own column generation, for its cuts (its rounds pricing the pairs across systems are
            # slow to converge, but every round priced whole leaves a cut per class and slice), then the node
            # program over them and the slices solved exactly at its nodes
            cb = column_bound(dm, min(CUTS_SHARE * time_limit_s, remaining() / 2), _start_plans(dm, g), cut=True)
            if cb.bound > bound:
                bound, bounded_by = cb.bound, f"bound by column generation ({cb.iterations} rounds)"
            if cb.cuts and bound < best_cost * (1 - 1e-9) and remaining() > 1.0:
                value, at = cut_bound(dm, cb, max(1.0, min(CUT_SHARE * time_limit_s, remaining() / 2)))
                if value > bound:
                    bound, bounded_by = value, f"bound by the node program over {len(cb.cuts)} cuts"
                if at is not None and bound < best_cost * (1 - 1e-9) and remaining() > 1.0:
                    f = solve_by_slice(dm, name, remaining() / 2, *at, deadline=end)
                    if f is not None and fleet_cost(dm, f) < best_cost * (1 - 1e-9):
                        best, best_cost, found_by = f, fleet_cost(dm, f), "slices at the node program's nodes"
    if not full and bound_stage and bound == -math.inf:
        bound = relaxation_bound(build(dm, hull=hull, lean=True), "highs", max(1.0, min(time_limit_s / 2, remaining())))
        bounded_by = "bound by the linear relaxation"
    proven = bound >= best_cost * (1 - 1e-9)
    stop = min(end - SLICES_SHARE * time_limit_s, time.perf_counter() + NODE_SHARE * time_limit_s)
    for whole in (False, True) if nodes_stage else ():
        # the node relaxations, replica counts continuous, then whole where the program is small: their bound may
        # prove the best fleet so far, and then the full program is not run
        if proven or stop - time.perf_counter() < 1.0 or (whole and columns > WHOLE_REPLICAS_MAX):
            break
        nb, at = node_bound(dm, stop - time.perf_counter(), whole)
        if nb > bound:
            bound, bounded_by = nb, "bound by the node relaxation"
        if at is not None and bound < best_cost * (1 - 1e-9) and remaining() > 1.0:
            # the slices solved exactly at the relaxation's reserved nodes and systems: a fleet, often its optimum
            f = solve_by_slice(dm, name, remaining() / 2, *at, deadline=end)
            if f is not None and fleet_cost(dm, f) < best_cost * (1 - 1e-9):
                best, best_cost, found_by = f, fleet_cost(dm, f), "slices at the node relaxation's nodes"
        proven = bound >= best_cost * (1 - 1e-9)
    if plans and full and reserved_stage and not proven:
        # where the node relaxations do not run (their slices too large to solve exactly in time) and the column
        # generation priced plans, each point of the search is the plan programs of its slices over those plans
        offered = None
        if extra is not None and columns > (NODE_JOINED_COLUMNS_MAX if joined_pools else NODE_COLUMNS_MAX):
            offered = _offered_plans(extra, best)
        f = search_reserved(dm, name if offered is None or solver != "auto" else choose_solver(dm, "plans"),
                            max(1.0, remaining() / 2 if offered is None else remaining() - SEARCH_LEFT * time_limit_s),
                            _reserved_starts(dm, best, master), offered)
        if f is not None and fleet_cost(dm, f) < best_cost * (1 - 1e-9):
            best, best_cost, found_by = f, fleet_cost(dm, f), "search over the reserved nodes"
    elif plans and (full or remaining() > 1.0) and not proven:
        share = 1 - (PLANS_SEARCH_SHARE if not full and reserved_stage and extra is not None
                     and choose_solver(dm, "plans") != "highs" else 0.0)
        f = solve_plans(dm, name, max(1.0, remaining() * share / (2 if full else 1)), best, extra,
                        mixes=extra is None, whole=choose_solver(dm, "plans") if solver == "auto" else name)
        if f is not None and fleet_cost(dm, f) < best_cost * (1 - 1e-9):
            best, best_cost, found_by = f, fleet_cost(dm, f), "plans"
        if not full and reserved_stage and remaining() > SEARCH_LEFT * time_limit_s:
            # the plan program ended with time left: the search over the reserved nodes from its fleet (each
            # point's slices plan programs over the column generation's plans where it priced some)
            offered = None if extra is None else _offered_plans(extra, best)
            f = search_reserved(dm, name if offered is None or solver != "auto" else choose_solver(dm, "plans"),
                                remaining(), _reserved_starts(dm, best, master), offered)
            if f is not None and fleet_cost(dm, f) < best_cost * (1 - 1e-9):
                best, best_cost, found_by = f, fleet_cost(dm, f), "search over the reserved nodes"
    termination = f"full program not run ({bounded_by or 'no bound'})"
    if full and not proven:
        m = build(dm, hull=hull)
        hinted = name in HINTS and best is not None
        if hinted:
            start_from(m, dm, best)
        left = max(1.0, time_limit_s - (time.perf_counter() - t0))
        res = solve_pyomo(m, name, left, warm_start=hinted)
        if res.status == "infeasible" and best is None:
            raise InfeasibleError(diagnose(d, name if name != "sat" else "highs"))
        if res.ok and res.objective < best_cost * (1 - 1e-9):
            best, best_cost, found_by = _read(m, dm), res.objective, "program"
        if best is None:
            other = "scip" if name != "scip" else "highs"
            raise SolverLimitError(f"no fleet found within {time_limit_s:g} s by {name} (it stopped with no "
                                   f"solution, status {res.status}); raise solver.time_limit_s or try solver.name: "
                                   f"{other}")
        if math.isfinite(res.bound) and res.bound > bound:
            bound, bounded_by = res.bound, ""
        termination = res.termination + (f"; {bounded_by}" if bounded_by else "")
    bound = min(bound, best_cost)
    gap = relative_gap(best_cost, bound) if math.isfinite(bound) else math.inf
    status = "optimal" if gap <= 1e-6 else "feasible"
    wall = time.perf_counter() - t0
    result = SolveResult(status, f"{termination}; fleet from the {found_by}", best_cost, bound, gap, wall, name,
                         time_limited=status != "optimal" and wall >= 0.98 * time_limit_s)
    f = _expand(d, dr, rep, best)
    out = FleetResult(f.reserved, f.hourly, f.replicas, f.prefill, f.decode, result=result,
                      cost=breakdown(d, f.reserved, f.hourly), greedy_usd_per_day=fleet_cost(dm, g))
    if duals:
        out.duals = marginal_values(dr, _expand(dr, dr, rep, best))
    return out


def _column_stage(d: FleetData, g: Fleet, solver: str, bound_s: float, round_s: float, cut: bool = False,
                  deadline: float | None = None, cuts_s: float = 0.0, best_usd: float = math.inf
                  ) -> tuple[ColumnBound, dict | None, Fleet | None]:
    """The column generation on ``d`` from the greedy ``g``'s plans (`column_bound`, within ``bound_s``): its result,
    its near plans with the greedy's per (class index, slice) (None where it priced nothing), and the fleet at its
    master's rounded reserved nodes (`_round_master`, within ``round_s``; None where none). ``cut``: rounds stop at
    the time limit (`column_bound`). With ``cuts_s``, first the node program over the generation's cuts
    (`cut_bound`, within ``cuts_s`` and what ``deadline`` leaves after ``round_s``), its bound and nodes kept on the
    result (``cut_value``, ``cut_at``: `_round_master` tries those nodes first); where that bound reaches
    ``best_usd`` (the best fleet so far), no fleet is sought.
    """
    cb = column_bound(d, bound_s, _start_plans(d, g), cut=cut)
    if cb.bound == -math.inf:
        return cb, None, None
    left = math.inf if deadline is None else deadline - time.perf_counter() - round_s
    if cuts_s > 0 and cb.cuts and min(cuts_s, left) >= 1.0:
        cb.cut_value, cb.cut_at = cut_bound(d, cb, min(cuts_s, left))
    extra = {cb.blocks[b]: p for b, p in cb.near.items()}
    every = {cb.blocks[b]: list(p) for b, p in cb.plans.items()}  # the slices at fixed nodes take every plan priced
    for key, counts in g.plans.items():
        extra.setdefault(key, []).append(counts)
        every.setdefault(key, []).append(counts)
    if cb.cut_value >= best_usd * (1 - 1e-9):
        return cb, extra, None  # the node program proves the best fleet so far: no fleet of these plans is cheaper
    return cb, extra, _round_master(d, solver, cb, every, round_s, deadline)


def solve_aggregated(d: FleetData, solver: str, time_limit_s: float) -> Fleet | None:
    """The program restricted to aggregated options (a restriction: its fleets are fleets of the full program, its
    bound is not the full program's), solved by `solve_fleet` within the time limit (from `PLAN_STAGE_MIN` columns
    by its search over the reserved nodes, which reaches 6,424 USD/day on `scripts/bench_fleet.py`'s aggregated
    2 x 12 where the restricted plan program reached 6,472; below, by its node relaxations' stage then the program,
    which on aggregated 1 x 24 proves its optimum, 4,076, in 9.5 s at load 2.3, where the program alone reached
    4,122-4,361 in 20 s at load 1.9-2.3, and 4,076 in 20 s with the machine idle); the fleet
    with its plan per class and slice (each class's aggregated replicas serve it with N+1 on their own); None where
    a class has no aggregated option or no fleet is found. Its N+1 modes have their convex hull
    (`formulations.fleet.add_hull`), a relaxation far tighter than that of pools sized apart, so within a share of
    the time it reaches fleets the full program started from the greedy does not
    (`scripts/bench_fleet.py`, disaggregated 1 model x 6 slices: the aggregated optimum, 3,899 USD/day, where the
    full program stops at the greedy's 4,052 in 60 s).
    """
    sub = d.aggregated()
    if not len(sub.options):
        return None
    try:
        # below PLAN_STAGE_MIN columns its node relaxations' stage, then the program; above, the search over the
        # reserved nodes, then the program (the node stage there needs more than the share: on aggregated 2 x 12 its
        # relaxation is proven in 24-33 s at load 3, where the share is 10-20 s and the search reaches 6,424 USD/day
        # in 5 s)
        small = len(sub.options) * len(sub.slices) < PLAN_STAGE_MIN
        r = solve_fleet(sub, solver, time_limit_s, duals=False, bound_stage=small, column_stage=False)
    except (InfeasibleError, SolverLimitError):
        return None
    reps = pd.DataFrame(0.0, index=d.options.index, columns=d.slices)
    reps.iloc[sub.meta["kept_options"], :] = r.replicas.to_numpy()
    empty = pd.DataFrame(columns=d.slices, dtype=float)
    cls = {c: j for j, c in enumerate(d.classes)}
    j_of = [cls.get(c, -1) for c in zip(d.options["model"], d.options["cls"], strict=True)]
    plans: dict = {}  # each class's aggregated replicas serve it with N+1 on their own: a plan per class and slice
    for t in d.slices:
        for k in np.flatnonzero(reps[t].to_numpy() > 0):
            if j_of[k] >= 0:
                plans.setdefault((j_of[k], t), {})[int(k)] = int(reps.at[k, t])
    return Fleet(r.reserved, r.hourly, reps, empty, empty.copy(), plans)


def _expand(d: FleetData, dr: FleetData, rep: dict, f: Fleet) -> Fleet:
    """A fleet of the reduced, merged program as a fleet of ``d``: every slice from the slice it maps to, replicas
    in ``d``'s options (0 for options the reduction dropped).
    """
    T = d.slices
    kept = dr.meta.get("kept_options", np.arange(len(dr.options)))
    if d is dr:
        kept = np.arange(len(d.options))
    reps = pd.DataFrame(0.0, index=d.options.index, columns=T)
    reps.iloc[kept, :] = f.replicas[[rep[t] for t in T]].to_numpy()
    cols = [rep[t] for t in T]

    def spread(df):
        if df is None or not len(df):
            return pd.DataFrame(columns=T, dtype=float)
        out = df[cols].copy()
        out.columns = T
        return out

    return Fleet(f.reserved.copy(), spread(f.hourly), reps, spread(f.prefill), spread(f.decode))


def _plan_table(d: FleetData, extra: dict | None = None, mixes: bool = True) -> tuple[list, list, dict]:
    """Every class's plans in every slice with demand: (class, slice, replicas per option), their hand-offs (a list
    of (group, system, requests/s its prefill pool hands off, requests/s its decode pool takes) per plan), and each
    plan's position by (class, slice, replicas). ``extra``: more plans per (class, slice) ({option: replicas} each,
    as column generation found them), kept where their pools pair on one system (`pooled_flows`) or, across
    interconnects, hand off with N+1 as the program does (`joined_flows`).
    """
    plans, flows, index = [], [], {}
    table = plan_options(d)
    joined = bool((d.systems["interconnect_bytes_per_s"] > 0).any())

    def add(j, t, counts, flow):
        key = (j, t, frozenset(counts.items()))
        if key not in index:
            index[key] = len(plans)
            plans.append((j, t, counts))
            flows.append(flow)

    for j in range(len(d.classes)):
        for t in d.slices:
            need = float(d.demand.iloc[j][t])
            if need <= 0:
                continue
            for counts, flow, _ in plans_of(d, j, need, mixes=True, table=table) if mixes else ():
                add(j, t, counts, [] if flow is None else [(flow[0], flow[1], flow[2], flow[2])])
            for counts in (extra or {}).get((j, t), []):
                flow = pooled_flows(d, j, need, counts)
                if flow is not None:
                    add(j, t, counts, [(g, sy, v, v) for g, sy, v in flow])
                elif joined:
                    flow = joined_flows(d, j, need, counts)
                    if flow is not None:
                        add(j, t, counts, flow)
    return plans, flows, index


def joined_flows(d: FleetData, j: int, need: float, counts: dict) -> list | None:
    """Hand-offs of a class's plan whose prefill and decode pools pair across interconnects: per (numerics group,
    system) what its prefill pool hands off and what its decode pool takes, as (group, system, handed off, taken);
    None where the plan cannot serve ``need`` that way with N+1 as the program counts it (`check`: hand-offs stay
    as planned when a replica fails, so a pool that loses its fastest replica loses what it handed off beyond the
    rest of its rate, and the class's headroom, served less demand, must cover that and its fastest aggregated
    replica). Pools on a system without an interconnect hand off to their own system only.

    The headroom h sets every pool's most: its rate, and with N+1 its rate less its fastest replica's plus h. The
    requests/s the pools can hand off at h, R(h) (per group, the pairs on their own system plus the least of what
    the joined systems' prefill and decode pools give), is concave in h, and the plan needs R(h) >= h + need - A
    (A: the aggregated rate): the least h doing so (bisection between the least admissible headroom and one meeting
    it) fixes the hand-offs, own-system pairs first, then the joined systems' prefill matched to decode on one system,
    the rest across. Bytes per second are left to the program (`formulations.fleet.build_plans`).
    """
    o = d.options
    rate = o["requests_per_s"].to_numpy(dtype=float)
    role, grp, sysv = o["role"].to_numpy(), o["group"].to_numpy(), o["system"].to_numpy()
    spare = d.n_plus_one
    agg, top_agg = 0.0, 0.0
    pools: dict = {}  # group -> system -> [prefill rate, its top, decode rate, its top]
    for k, n in counts.items():
        if n <= 0:
            continue
        if role[k] == "both":
            agg += rate[k] * n
            top_agg = max(top_agg, rate[k])
            continue
        v = pools.setdefault(int(grp[k]), {}).setdefault(sysv[k], [0.0, 0.0, 0.0, 0.0])
        at = 0 if role[k] == "prefill" else 2
        v[at] += rate[k] * n
        v[at + 1] = max(v[at + 1], rate[k])
    joined = {s: d.interconnect(s) > 0 for g in pools for s in pools[g]}

    def most(cap, top, h):
        return min(cap, cap - top + h) if spare and cap > 0 else cap

    def room(h):
        """Per group: (own pairs, joined prefill, joined decode) at headroom h."""
        out = {}
        for g, by in pools.items():
            own = sum(min(most(v[0], v[1], h), most(v[2], v[3], h)) for s, v in by.items() if not joined[s])
            jp = sum(most(v[0], v[1], h) for s, v in by.items() if joined[s])
            jd = sum(most(v[2], v[3], h) for s, v in by.items() if joined[s])
            out[g] = (own, jp, jd)
        return out

    def short(h):  # requests/s the pools fall short of handing off at headroom h (<= 0: enough)
        return h + need - agg - sum(own + min(jp, jd) for own, jp, jd in room(h).values())

    tol = 1e-9 * max(1.0, need)
    lo = max(top_agg if spare else 0.0, agg - need)
    tops = [v[i] for by in pools.values() for v in by.values() for i in (1, 3)]
    h = lo
    if short(lo) > tol:
        hi = next((x for x in sorted(tops) if x > lo and short(x) <= tol), None)
        if hi is None:  # the least shortfall lies between two tops (R is concave): search it
            a, b = lo, max([lo, *tops])
            for _ in range(60):
                m1, m2 = a + (b - a) / 3, b - (b - a) / 3
                a, b = (m1, b) if short(m1) > short(m2) else (a, m2)
            if short(a) > tol:
                return None
            hi = a
        a = lo
        for _ in range(60):  # the shortfall falls from lo to hi: the least headroom with none
            mid = (a + hi) / 2
            a, hi = (a, mid) if short(mid) <= tol else (mid, hi)
        h = hi
    left = max(0.0, h + need - agg)
    out = []
    for g, (own, jp, jd) in room(h).items():
        take = min(left, own + min(jp, jd))
        left -= take
        by = pools[g]
        for s, v in by.items():  # own-system pairs first
            if not joined[s] and take > 0:
                f = min(take, most(v[0], v[1], h), most(v[2], v[3], h))
                take -= f
                if f > 0:
                    out.append((g, s, f, f))
        ps = {s: 0.0 for s in by if joined[s]}
        qs = dict(ps)
        for s in ps:  # each joined system's prefill matched to its own decode
            f = min(take, most(by[s][0], by[s][1], h), most(by[s][2], by[s][3], h))
            ps[s] += f
            qs[s] += f
            take -= f
        sent = taken = take
        for s in ps:  # the rest across the interconnects
            f = min(sent, most(by[s][0], by[s][1], h) - ps[s])
            ps[s] += f
            sent -= f
            f = min(taken, most(by[s][2], by[s][3], h) - qs[s])
            qs[s] += f
            taken -= f
        out += [(g, s, ps[s], qs[s]) for s in ps if ps[s] > 0 or qs[s] > 0]
    return out


def pooled_flows(d: FleetData, j: int, need: float, counts: dict) -> list | None:
    """The hand-offs of a class's plan whose prefill and decode pools pair on their own system (per numerics group
    and system, min(prefill rate, decode rate)), or None where the plan does not serve ``need`` that way with N+1
    (any one replica down: an aggregated one takes its rate, a prefill or decode one leaves its pair the least of
    the rest of its pool and its mate).
    """
    o = d.options
    rate = o["requests_per_s"].to_numpy(dtype=float)
    agg, pools = 0.0, {}
    tops = []
    for k, n in counts.items():
        if n <= 0:
            continue
        if o["role"].iat[k] == "both":
            agg += rate[k] * n
            tops.append(("both", rate[k]))
            continue
        pool = pools.setdefault((int(o["group"].iat[k]), o["system"].iat[k]), {"prefill": [0.0, 0.0],
                                                                                 "decode": [0.0, 0.0]})
        side = pool[o["role"].iat[k]]
        side[0] += rate[k] * n
        side[1] = max(side[1], rate[k])
    pair = {u: min(p["prefill"][0], p["decode"][0]) for u, p in pools.items()}
    served = agg + sum(pair.values())
    tol = 1e-9 * max(1.0, need)
    if served < need - tol:
        return None
    if d.n_plus_one:
        worst = max((r for _, r in tops), default=0.0)
        for u, p in pools.items():
            cp, cd = p["prefill"][0], p["decode"][0]
            if cp > 0 and cd > 0:
                left = min(min(cp - p["prefill"][1], cd), min(cp, cd - p["decode"][1]))
                worst = max(worst, pair[u] - left)
        if served - worst < need - tol:
            return None
    return [(g, s, v) for (g, s), v in pair.items() if v > 0]


def _plan_fleet(m, d: FleetData, plans: list, flows: list) -> Fleet:
    """The fleet a solved plan program holds, with each class's plan per slice."""
    T = d.slices
    reserved, hourly = _read_nodes(m)
    reps = pd.DataFrame(0.0, index=d.options.index, columns=T)
    handed: dict = {}
    taken: dict = {}
    chosen: dict = {}
    for i in m.P:
        if (m.plan[i].value or 0) > 0.5:
            j, t, counts = plans[i]
            chosen[(j, t)] = counts
            for k, n in counts.items():
                reps.at[k, t] += n
            for g, sy, p, q in flows[i]:
                handed[(j, g, sy, t)] = handed.get((j, g, sy, t), 0.0) + p
                taken[(j, g, sy, t)] = taken.get((j, g, sy, t), 0.0) + q
    return Fleet(reserved, hourly, reps, _flows(handed, T), _flows(taken, T), chosen)


def solve_plans(d: FleetData, solver: str, time_limit_s: float, start: Fleet | None = None,
                extra: dict | None = None, mixes: bool = True, whole: str | None = None) -> Fleet | None:
    """The restricted program of one configuration per class and slice (`plans_of`): first slice by slice
    (`solve_plans_by_slice`) with the reserved nodes and the systems in use of ``start`` fixed and its plans offered
    too (an eighth of the time: a polish, each slice re-planned at no more than it costs in ``start``), then with
    those of its linear relaxation (a quarter of the time), then whole (by ``whole``, ``solver`` where None),
    started from the best so far where the solver takes hints. Each step starts only with time left (building the
    models takes time too). The cheapest fleet found (``start`` where none is cheaper); None when none is.
    """
    t0 = time.perf_counter()
    end = t0 + time_limit_s
    if start is not None and start.plans:  # the start's plans are offered too (so it is a hint the program holds)
        extra = {key: list(p) for key, p in (extra or {}).items()}
        for key, counts in start.plans.items():
            extra.setdefault(key, []).append(counts)
    plans, flows, index = _plan_table(d, extra, mixes)
    best = start
    if start is not None and start.plans:  # polish: each slice re-planned at the start's nodes, its plan offered
        offered = {key: list(p) for key, p in (extra or {}).items()}
        for key, counts in start.plans.items():
            offered.setdefault(key, []).append(counts)
        used = {s for s in d.systems.index if float(start.reserved[s] + start.hourly.loc[s].max()) > 0}
        f = solve_plans_by_slice(d, solver, time_limit_s / 8, start.reserved, used, offered, mixes, end)
        if f is not None and fleet_cost(d, f) < fleet_cost(d, best) * (1 - 1e-9):
            best = f
    m = build_plans(d, plans, flows)
    pyo.TransformationFactory("core.relax_integer_vars").apply_to(m)
    lp = solve_pyomo(m, "highs", time_limit_s / 8)
    if lp.ok and end - time.perf_counter() > time_limit_s / 2:
        reserved = pd.Series({s: float(math.floor((m.reserved[s].value or 0) + 1e-6)) for s in m.S})
        used = {s for s in m.SU if (m.used[s].value or 0) > 1e-6}
        f = solve_plans_by_slice(d, solver, time_limit_s / 4, reserved, used, extra, mixes, end)
        if f is not None and fleet_cost(d, f) < fleet_cost(d, best) * (1 - 1e-9):
            best = f
    if end - time.perf_counter() < time_limit_s / 8:
        return best
    m = build_plans(d, plans, flows)
    solver = whole or solver
    hinted = solver in HINTS and best is not None and bool(best.plans)
    if hinted:
        _start_nodes(m, best)
        chosen = {index[(j, t, frozenset(c.items()))] for (j, t), c in best.plans.items()}
        for i in m.P:
            m.plan[i].set_value(float(i in chosen))
    res = solve_pyomo(m, solver, max(1.0, time_limit_s - (time.perf_counter() - t0)), warm_start=hinted)
    if res.ok and res.objective < fleet_cost(d, best) * (1 - 1e-9):
        best = _plan_fleet(m, d, plans, flows)
    return best


def solve_plans_by_slice(d: FleetData, solver: str, time_limit_s: float, reserved: pd.Series, used: set,
                         extra: dict | None = None, mixes: bool = True, deadline: float | None = None
                         ) -> Fleet | None:
    """The plan program one slice at a time with the reserved nodes and the systems in use fixed (given them, slices
    are independent: each pays only its hourly nodes), then each system's reserved nodes lowered to the count that
    costs least for the nodes the slices hold. A fleet of the full program; None when a slice finds none in time or
    the fleet is over the budget, or when ``deadline`` (a `time.perf_counter` value) passes before the last slice.
    """
    T = d.slices
    parts = []
    for t in T:
        if deadline is not None and time.perf_counter() >= deadline:
            return None
        dt = _one_slice(d, t)
        plans, flows, _ = _plan_table(dt, extra, mixes)
        m = build_plans(dt, plans, flows)
        for s in m.S:
            m.reserved[s].fix(min(float(reserved[s]), float(dt.inventory.loc[s, t])))
        for s in m.SU:
            m.used[s].fix(float(s in used))
        res = solve_pyomo(m, solver, time_limit_s / len(T))
        if not res.ok:
            return None
        parts.append(_plan_fleet(m, dt, plans, flows))
    return _join_slices(d, parts, reserved)


def _join_slices(d: FleetData, parts: list[Fleet], reserved: pd.Series) -> Fleet | None:
    """One fleet from fleets of one slice each, solved with ``reserved`` nodes fixed: the nodes each slice's replicas
    need (whole nodes, packed exactly), then each system's reserved nodes lowered to the count that costs least for
    them (never raised: a slice then holds no more nodes than it did, within its inventory and power). None when over
    the budget.
    """
    T = d.slices
    reps = pd.concat([f.replicas for f in parts], axis=1)[T]

    def flows(frames):
        frames = [df for df in frames if len(df)]
        return pd.concat(frames, axis=1).reindex(columns=T).fillna(0.0) if frames else pd.DataFrame(columns=T)

    pre, dec = flows([f.prefill for f in parts]), flows([f.decode for f in parts])
    plans_all = {k: v for f in parts for k, v in f.plans.items()}
    sy = d.systems
    chips = pd.DataFrame({t: pd.Series(d.footprint() * reps[t].to_numpy()).groupby(d.options["system"]).sum()
                          for t in T}).reindex(sy.index).fillna(0.0)
    need = np.ceil(chips.div(sy["node_chips"], axis=0) - 1e-9)
    w, hours = d.weights, d.slice_h * float(d.weights.sum())
    best_r = {}
    for s in sy.index:
        costs = [sy.loc[s, "reserved_usd_per_node_h"] * hours * r + sy.loc[s, "hourly_usd_per_node_h"] * d.slice_h
                 * float((w * np.maximum(need.loc[s] - r, 0)).sum()) for r in range(int(reserved[s]) + 1)]
        best_r[s] = float(int(np.argmin(costs)))
    res_nodes = pd.Series(best_r)
    hourly = np.maximum(need.sub(res_nodes, axis=0), 0.0)
    f = Fleet(res_nodes, hourly, reps, pre, dec, plans_all)
    if d.budget_usd_per_day is not None and fleet_cost(d, f) > d.budget_usd_per_day * (1 + TOL):
        return None
    return f


def _reserved_starts(d: FleetData, best: Fleet, master: ColumnBound | None) -> list[tuple[pd.Series, set]]:
    """Where `search_reserved` starts: the best fleet's reserved nodes and systems in use, then the column
    generation master's reserved nodes rounded and its systems in use (where it ran).
    """
    S = list(d.systems.index)
    out = [(best.reserved.reindex(S).fillna(0.0).astype(float),
            {s for s in S if float(best.reserved[s] + best.hourly.loc[s].max()) > 0})]
    if master is not None and master.x is not None:
        nT = len(d.slices)
        fixed = [s for s in S if float(d.systems.loc[s, "fixed_usd_per_day"]) > 0]
        used = {s for s, v in zip(fixed, master.x[len(S) * (1 + nT):], strict=True) if v > 1e-6}
        out.append((pd.Series(np.round(master.x[:len(S)]), index=S), used))
    return out


def solve_by_slice(d: FleetData, solver: str, time_limit_s: float, reserved: pd.Series, used: set,
                   deadline: float | None = None, loose: frozenset = frozenset(), models: dict | None = None
                   ) -> Fleet | None:
    """The full program one slice at a time with the reserved nodes and the systems in use fixed (given them, slices
    are independent), joined as `_join_slices` does. On the ``loose`` systems the reserved nodes are left to each
    slice (a slice alone pays a reserved node its day's price, so it holds the nodes it would at the committed
    price) and the join keeps at most the fewest any slice holds (so no slice holds more nodes than it chose: its
    inventory and power still hold). A fleet of the full program; None when a slice has none within its share of
    the time (or is infeasible there), the fleet is over the budget, or ``deadline`` passes first. ``models``: the
    slices' programs built so far, by slice (filled and reused across calls).
    """
    parts = []
    most = reserved.astype(float).copy()
    models = {} if models is None else models
    for t in d.slices:
        if deadline is not None and time.perf_counter() >= deadline:
            return None
        dt = _one_slice(d, t)
        if t not in models:
            models[t] = build(dt)
        m = models[t]
        for s in m.S:
            if s in loose:
                m.reserved[s].unfix()
            else:
                m.reserved[s].fix(min(float(reserved[s]), float(dt.inventory.loc[s, t])))
        for s in m.SU:
            m.used[s].fix(float(s in used))
        res = solve_pyomo(m, solver, time_limit_s / len(d.slices))
        if not res.ok:
            return None
        parts.append(_read(m, dt))
        for s in loose:
            held = float(parts[-1].reserved[s] + parts[-1].hourly.loc[s, t])
            most[s] = held if t == d.slices[0] else min(most[s], held)
    return _join_slices(d, parts, most)


def _offered_plans(extra: dict, best: Fleet) -> dict:
    """The plans per (class index, slice) the search over the reserved nodes offers each slice's plan program: the
    column generation's near plans (``extra``) and the best fleet's.
    """
    offered = {key: list(p) for key, p in extra.items()}
    for key, counts in best.plans.items():
        offered.setdefault(key, []).append(counts)
    return offered


def search_reserved(d: FleetData, solver: str, time_limit_s: float, starts: list[tuple[pd.Series, set]],
                    plans: dict | None = None) -> Fleet | None:
    """A local search over the reserved nodes and the systems in use, each point's slices solved exactly
    (`solve_by_slice`, which then lowers each system's reserved nodes to the count that costs least for the nodes
    its slices hold): from each start (reserved nodes per system, systems in use), first improvement over the
    neighbours in order, the search going on from the improving fleet's own reserved nodes and systems. The
    neighbours: a system in use swapped for one not in use, its reserved nodes moved there; one reserved node more
    or fewer, or half as many, on a system in use; a system added, or one dropped, the reserved nodes of the
    systems then in use left to the slices (`solve_by_slice`'s ``loose``) and the slices solved again at those the
    join kept. With ``plans`` (per (class index, slice), as `solve_plans_by_slice` takes them), each point's slices
    are plan programs over those plans instead (a point in a second or two where the full program's slices are
    hard), and the neighbours one reserved node more or fewer, or half as many, first, then the swaps, then a
    system added or dropped with the reserved nodes kept.
    A heuristic: its fleets are the full program's, its cost proves nothing. The cheapest fleet found; None where
    none is.

    Measured with `scripts/bench_fleet.py` (2 shared cores, load 6-7): given 600 s, the full program ends at the
    optimum on aggregated 1 x 24 and 2 x 12 and disaggregated 1 x 6 (proven in 273, 551 and 330 s); at 60 s the
    aggregated 2 x 12 answer was 2.4% above it (6,672 against 6,515 USD/day) and the restricted plan program this
    search replaces there found no fleet cheaper than the greedy's 6,932, where this search from the greedy reaches
    6,515.2 within its first 37 s (each point's 11 slices solved in 2-3 s).
    """
    end = time.perf_counter() + time_limit_s
    S = list(d.systems.index)
    free = {s for s in S if float(d.systems.loc[s, "fixed_usd_per_day"]) <= 0}
    cap = d.inventory.reindex(S).min(axis=1).astype(float)
    seen: set = set()
    models: dict = {}
    best, best_cost = None, math.inf

    def visit(reserved: pd.Series, used: set, loose: frozenset = frozenset()) -> Fleet | None:
        nonlocal best, best_cost
        reserved = reserved.where([s in used or s in free for s in S], 0.0).clip(0, cap)  # none off the used
        key = (tuple(reserved.where([s not in loose for s in S], -1.0)), frozenset(used), loose)
        if key in seen:
            return None
        seen.add(key)
        if plans is None:
            f = solve_by_slice(d, solver, max(1.0, end - time.perf_counter()), reserved, used, end, loose, models)
        else:
            f = solve_plans_by_slice(d, solver, max(1.0, end - time.perf_counter()), reserved, used, plans, False,
                                     end)
        if fleet_cost(d, f) < best_cost * (1 - 1e-9):
            best, best_cost = f, fleet_cost(d, f)
        if loose and f is not None:  # the slices again, at the reserved nodes the join kept
            g = visit(f.reserved.reindex(S).astype(float), used)
            f = g if fleet_cost(d, g) < fleet_cost(d, f) else f
        return f

    def in_use(f: Fleet) -> set:
        return {s for s in S if float(f.reserved[s] + f.hourly.loc[s].max()) > 0}

    def moves(here: pd.Series, used: set) -> list:
        swaps, steps = [], []
        for s in sorted(used):
            for s2 in S:
                if s2 not in used and here[s] > 0:
                    r = here.copy()
                    r[s2], r[s] = r[s], 0.0
                    swaps.append((r, used - {s} | {s2}, frozenset()))
        for s in sorted(used):
            for v in sorted({here[s] - 1, here[s] + 1, math.floor(here[s] / 2)}):
                if 0 <= v <= cap[s] and v != here[s]:
                    r = here.copy()
                    r[s] = float(v)
                    steps.append((r, used, frozenset()))
        if plans is not None:  # the plan programs hold the reserved nodes given: none is left to the slices
            return steps + swaps + [(here, used ^ {s}, frozenset()) for s in S]
        out = swaps + steps
        out += [(here, used | {s}, frozenset(used | {s})) for s in S if s not in used]
        out += [(here, used - {s}, frozenset(used - {s})) for s in sorted(used)]
        return out

    for reserved, used in starts:
        f = visit(reserved.reindex(S).fillna(0.0).astype(float), set(used), frozenset(used if plans is None else ()))
        if f is None:
            continue
        here, used, cost = f.reserved.reindex(S).astype(float), in_use(f), fleet_cost(d, f)
        while time.perf_counter() < end:
            for r, u, loose in moves(here, used):
                if time.perf_counter() >= end:
                    break
                f = visit(r, u, loose)
                if f is not None and fleet_cost(d, f) < cost * (1 - 1e-9):
                    here, used, cost = f.reserved.reindex(S).astype(float), in_use(f), fleet_cost(d, f)
                    break
            else:
                break
    return best


def _one_slice(d: FleetData, t) -> FleetData:
    """The program of slice ``t`` alone (its own weight; the budget left out: it bounds the whole day)."""
    return replace(d, demand=d.demand[[t]], inventory=d.inventory[[t]], weight={t: d.weights[t]},
                   budget_usd_per_day=None)


def _flows(keyed: dict, T: list) -> pd.DataFrame:
    """Requests/s handed off per (class, numerics, system) and slice, from {(class, numerics, system, slice): v}."""
    keys = sorted({k[:3] for k in keyed})
    return pd.DataFrame([[keyed.get(key + (t,), 0.0) for t in T] for key in keys],
                        index=pd.MultiIndex.from_tuples(keys) if keys else None, columns=T, dtype=float)


def marginal_values(d: FleetData, f: Fleet) -> dict:
    """USD/day saved by one more kW of site power and by one more node of inventory, slice by slice, with the
    fleet's replicas (and spare levels and systems in use) fixed and the node counts free (`lp_savings`): a saving
    the same replicas reach (a re-planned fleet may save more). Zero where the resource does not bind; never
    negative.
    """
    m = build(d, hull="none")
    start_from(m, d, f)
    saved = lp_savings(m, {"power": 1e3, "inventory": 1.0}, fix=("x", "level", "used"))
    T = list(m.T)
    kw = {t: saved.get(("power", t), 0.0) for t in T} if d.power_cap_w is not None else {}
    node = {(s, t): saved.get(("inventory", (s, t)), 0.0) for s in m.S for t in T}
    return {"usd_per_day_per_kw": kw, "usd_per_day_per_node": node}


def fleet_cost(d: FleetData, f: Fleet | None) -> float:
    """USD per day of a fleet (infinity for none)."""
    return math.inf if f is None else breakdown(d, f.reserved, f.hourly)["usd_per_day"]


def pack_nodes(chips: list[int], node_chips: int) -> int:
    """Nodes that hold replicas of these chip counts: a replica whose chips are a power of two dividing the node
    shares nodes (first-fit decreasing into nodes of ``node_chips``), any other occupies its own whole nodes.
    """
    nodes, free = 0, []
    for c in sorted(chips, reverse=True):
        if c & (c - 1) or node_chips % c:
            nodes += -(-c // node_chips)
            continue
        for i, f in enumerate(free):
            if f >= c:
                free[i] -= c
                break
        else:
            free.append(node_chips - c)
    return nodes + len(free)


def check(d: FleetData, r: Fleet, objective: float | None = None) -> list[str]:
    """Independent re-check of a fleet: per class and slice the aggregated replicas plus the requests handed from
    prefill to decode pools cover the demand, and still do when any one replica in use fails (N+1: an aggregated
    replica takes its rate with it; a prefill or decode replica leaves its pool the rest of its rate, and what the
    pool hands off or takes beyond that is lost); each pool hands off or takes no more than its replicas' rate,
    prefilled equals decoded per class and numerics, hand-offs between systems only over interconnects and within
    their bytes/s; replicas packed into the nodes held (first-fit decreasing); inventory, power and budget; the cost
    against ``objective``.
    """
    bad = []
    o = d.options
    rate = o["requests_per_s"].to_numpy(dtype=float)
    role = o["role"].to_numpy()
    pre = r.prefill if len(r.prefill) else pd.DataFrame(columns=d.slices)
    dec = r.decode if len(r.decode) else pd.DataFrame(columns=d.slices)
    for t in d.slices:
        x = r.replicas[t].to_numpy()
        cross: dict = {}
        for j, (mod, cls) in enumerate(d.classes):
            need = float(d.demand.loc[(mod, cls), t])
            mine = ((o["model"] == mod) & (o["cls"] == cls)).to_numpy()
            agg = float((rate * x)[mine & (role == "both")].sum())
            handed = 0.0
            pools: dict = {}  # (role, group, system): (its rate, what it hands off or takes)
            for g in sorted(set(o.loc[mine & (role != "both"), "group"])):
                sent = taken = 0.0
                for s in d.systems.index:
                    at = mine & (o["group"] == g).to_numpy() & (o["system"] == s).to_numpy()
                    p = float(pre.loc[(j, g, s), t]) if (j, g, s) in pre.index else 0.0
                    q = float(dec.loc[(j, g, s), t]) if (j, g, s) in dec.index else 0.0
                    cap_p = float((rate * x)[at & (role == "prefill")].sum())
                    cap_q = float((rate * x)[at & (role == "decode")].sum())
                    pools[("prefill", g, s)], pools[("decode", g, s)] = (cap_p, p), (cap_q, q)
                    if p > cap_p * (1 + TOL) + TOL or q > cap_q * (1 + TOL) + TOL:
                        bad.append(f"{mod}/{cls} slice {t} on {s}: hands off {p:.6g} (prefill {cap_p:.6g}), takes "
                                   f"{q:.6g} (decode {cap_q:.6g}) requests/s")
                    if abs(p - q) > TOL * max(1.0, p, q):
                        if d.interconnect(s) <= 0:
                            bad.append(f"{mod}/{cls} slice {t}: {s} sends or takes KV with no interconnect")
                        kv = float(o.loc[at & (role != "both"), "kv_bytes"].max())
                        cross.setdefault(s, [0.0, 0.0])
                        cross[s][0 if p > q else 1] += kv * abs(p - q)
                    sent, taken = sent + p, taken + q
                if abs(sent - taken) > TOL * max(1.0, sent):
                    bad.append(f"{mod}/{cls} slice {t}: {sent:.6g} requests/s prefilled, {taken:.6g} decoded")
                handed += sent
            served = agg + handed
            if need <= 0:
                continue
            if served < need * (1 - TOL):
                bad.append(f"{mod}/{cls} slice {t}: serves {served:.6g} < {need:.6g} requests/s")
            for k in np.flatnonzero(mine & (x > 0)) if d.n_plus_one else ():
                if role[k] == "both":
                    lost = rate[k]
                else:
                    cap, flow = pools[(role[k], o["group"].iat[k], o["system"].iat[k])]
                    lost = max(0.0, flow - (cap - rate[k]))
                if served - lost < need * (1 - TOL):
                    bad.append(f"{mod}/{cls} slice {t}: with one {role[k]} replica of option {k} down it serves "
                               f"{served - lost:.6g} < {need:.6g} requests/s")
        for s, (out, into) in cross.items():
            if max(out, into) > d.interconnect(s) * (1 + TOL):
                bad.append(f"{s} slice {t}: KV {out:.6g} B/s out, {into:.6g} B/s in, interconnect "
                           f"{d.interconnect(s):.6g} B/s")
        for s in d.systems.index:
            sel = (o["system"] == s).to_numpy()
            chips = [int(c) for c, n in zip(o.loc[sel, "chips"], x[sel], strict=True) for _ in range(int(n))]
            nodes = pack_nodes(chips, int(d.systems.loc[s, "node_chips"]))
            held = r.reserved[s] + r.hourly.loc[s, t]
            if nodes > held + TOL:
                bad.append(f"{s} slice {t}: replicas need {nodes} nodes, {held} held")
            if held > d.inventory.loc[s, t] + TOL:
                bad.append(f"{s} slice {t}: {held} nodes held, inventory {d.inventory.loc[s, t]}")
            if held != round(held) or r.reserved[s] != round(r.reserved[s]):
                bad.append(f"{s} slice {t}: a fraction of a node held ({held})")
        if d.power_cap_w is not None:
            pw = float(((r.reserved + r.hourly[t]) * d.systems["power_per_node_w"]).sum())
            if pw > d.power_cap_w * (1 + TOL):
                bad.append(f"slice {t}: power {pw:.6g} W over the cap {d.power_cap_w:.6g} W")
    cost = breakdown(d, r.reserved, r.hourly)["usd_per_day"]
    if d.budget_usd_per_day is not None and cost > d.budget_usd_per_day * (1 + TOL):
        bad.append(f"cost {cost:.6g} over the budget {d.budget_usd_per_day:.6g}")
    if objective is not None and not math.isclose(cost, objective, rel_tol=1e-6, abs_tol=1e-6):
        bad.append(f"recomputed cost {cost:.8g} differs from the objective {objective:.8g}")
    return bad


def loads(d: FleetData, r: Fleet, t) -> np.ndarray:
    """Per option, the share of its replicas' requests/s they serve in slice ``t`` (0 to 1; NaN where it holds no
    replica), the class's demand spread in proportion to what each pool offers: its aggregated replicas' rate and
    the requests its prefill pools hand to its decode pools, all at the same share (the demand over their sum, at
    most 1: N+1 keeps that sum above the demand). A prefill or decode pool runs at that share of its flow over its
    replicas' rate, each replica of it alike.
    """
    o = d.options
    x = r.replicas[t].to_numpy(dtype=float)
    cap = o["requests_per_s"].to_numpy(dtype=float) * x
    role = o["role"].to_numpy()
    out = np.full(len(o), np.nan)
    for j, (mod, cls) in enumerate(d.classes):
        mine = ((o["model"] == mod) & (o["cls"] == cls)).to_numpy() & (x > 0)
        if not mine.any():
            continue
        pools = {}
        for k in np.flatnonzero(mine & (role != "both")):
            key = (j, int(o["group"].iat[k]), o["system"].iat[k])
            flows = r.prefill if role[k] == "prefill" else r.decode
            flow = float(flows.loc[key, t]) if len(flows) and key in flows.index else 0.0
            pools.setdefault((role[k], key), [flow, []])[1].append(k)
        handed = sum(flow for (rl, _), (flow, _) in pools.items() if rl == "prefill")
        offered = float(cap[mine & (role == "both")].sum()) + handed
        need = float(d.demand.loc[(mod, cls), t])
        share = min(1.0, need / offered) if offered > 0 else 0.0
        out[mine & (role == "both")] = share
        for flow, ks in pools.values():
            total = float(cap[ks].sum())
            out[ks] = min(1.0, share * flow / total) if total > 0 else 0.0
    return out


def plan_options(d: FleetData) -> list[dict]:
    """Per class, the options `plans_of` combines, as plain lists (computed once, not per slice): the aggregated
    options (index, rate, hourly USD/h of a replica) and, per (numerics, system) in order, its prefill and its decode
    options.
    """
    o, sy = d.options, d.systems
    usd = (d.footprint() / sy.loc[o["system"], "node_chips"].to_numpy()
           * sy.loc[o["system"], "hourly_usd_per_node_h"].to_numpy())
    rate = o["requests_per_s"].to_numpy(dtype=float)
    out = [{"agg": [], "pools": {}} for _ in d.classes]
    cls = {c: j for j, c in enumerate(d.classes)}
    for k, (mod, c, role, g, s) in enumerate(zip(o["model"], o["cls"], o["role"], o["group"], o["system"],
                                                  strict=True)):
        j = cls.get((mod, c))
        if j is None:
            continue
        item = (k, float(rate[k]), float(usd[k]))
        if role == "both":
            out[j]["agg"].append(item)
        else:
            out[j]["pools"].setdefault((int(g), s), {"prefill": [], "decode": []})[role].append(item)
    for t in out:
        t["pools"] = dict(sorted(t["pools"].items()))
    return out


def plans_of(d: FleetData, j: int, need: float, mixes: bool = False, table: list[dict] | None = None
             ) -> list[tuple[dict[int, int], tuple | None, float]]:
    """A class's single-configuration plans for one slice: each aggregated option alone, and each prefill option with
    each decode option of its numerics on its own system, whole replicas with N+1 (one replica beyond the demand in
    each pool);
    as (replicas per option, (group, system, requests/s handed off) or None, hourly USD/h), cheapest first. With
    ``mixes``, also each aggregated option with one replica fewer and the fewest replicas of a slower aggregated
    option that make up the demand (the spare still the faster one's), where that is cheaper at hourly prices.
    ``table``: `plan_options` of ``d``, where the caller asks for many slices.
    """
    mine = (table or plan_options(d))[j]
    spare = 1 if d.n_plus_one else 0
    out = []
    for k, rate, usd in mine["agg"]:
        n = math.ceil(need / rate * (1 - 1e-12)) + spare
        out.append(({k: n}, None, n * usd))
        if not mixes or n < 2:
            continue
        for b, rb, ub in mine["agg"]:
            if rb >= rate:
                continue
            m = math.ceil((need + spare * rate - (n - 1) * rate) / rb * (1 - 1e-12))
            if m > 0 and (n - 1) * usd + m * ub < n * usd:
                out.append(({k: n - 1, b: m}, None, (n - 1) * usd + m * ub))
    for (g, s), pool in mine["pools"].items():
        for kp, ratep, up in pool["prefill"]:
            for kd, rated, ud in pool["decode"]:
                n_p = math.ceil(need / ratep * (1 - 1e-12)) + spare  # each pool keeps one replica's rate spare
                n_d = math.ceil(need / rated * (1 - 1e-12)) + spare
                out.append(({kp: n_p, kd: n_d}, (g, s, min(n_p * ratep, n_d * rated)), n_p * up + n_d * ud))
    out.sort(key=lambda p: p[2])
    return out


def greedy(d: FleetData) -> Fleet | None:
    """A greedy fleet: per slice and (model, class) in order, the single-configuration plan (an aggregated option,
    or a prefill and a decode option of one numerics on one system) with the least hourly cost that still fits the
    inventory and power left, in whole replicas with N+1, all rented by the hour; then each system's base load (its
    least nodes over the slices) moved to reserved nodes where that is cheaper. None when it runs out of a resource
    or over the budget.
    """
    o, sy = d.options, d.systems
    foot = d.footprint()
    nc = sy["node_chips"].to_numpy(dtype=float)
    at = pd.Index(sy.index).get_indexer(o["system"])  # each option's system, by position
    pw = sy["power_per_node_w"].to_numpy(dtype=float)
    table = plan_options(d)
    reps = np.zeros((len(o), len(d.slices)))
    nodes = pd.DataFrame(0.0, index=sy.index, columns=d.slices)
    flows: dict = {}
    plans: dict = {}
    chosen: dict = {}
    demand = d.demand.to_numpy(dtype=float)
    for i, t in enumerate(d.slices):
        chips = np.zeros(len(sy))
        inv = d.inventory[t].reindex(sy.index).to_numpy(dtype=float)
        for j in range(len(d.classes)):
            need = float(demand[j, i])
            if need <= 0:
                continue
            if j not in plans or plans[j][0] != need:
                plans[j] = (need, plans_of(d, j, need, table=table))
            for counts, flow, _ in plans[j][1]:
                trial = chips.copy()
                for k, n in counts.items():
                    trial[at[k]] += n * foot[k]
                held = np.ceil(trial / nc - 1e-9)
                if (held <= inv).all() and (d.power_cap_w is None or (held * pw).sum() <= d.power_cap_w):
                    chips = trial
                    for k, n in counts.items():
                        reps[k, i] += n
                    if flow is not None:
                        flows[(j, flow[0], flow[1], t)] = flow[2]
                    chosen[(j, t)] = counts
                    break
            else:
                return None
        nodes[t] = np.ceil(chips / nc - 1e-9)
    reps = pd.DataFrame(reps, index=o.index, columns=d.slices)
    base = nodes.min(axis=1)
    cheaper = sy["reserved_usd_per_node_h"] < sy["hourly_usd_per_node_h"]
    reserved = (base * cheaper).astype(float)
    hourly = nodes.sub(reserved, axis=0)
    pre = _flows(flows, d.slices)
    f = Fleet(reserved, hourly, reps, pre, pre.copy(), chosen)
    if d.budget_usd_per_day is not None and fleet_cost(d, f) > d.budget_usd_per_day * (1 + TOL):
        return None
    return f


def fleet_options(space: Space, modes: tuple[str, ...] = ("aggregated", "disaggregated")) -> pd.DataFrame:
    """The options of one (model, workload) space: its operating points (aggregated replicas, prefill and decode
    replicas, `operating_points`) with the KV bytes one request hands from its prefill to its decode replica (the
    whole prompt's KV at the point's KV format; 0 for aggregated replicas).
    """
    pts = operating_points(space, modes)
    if pts.empty:
        return pts.assign(kv_bytes=pd.Series(dtype=float))
    kv = {dt: space.model.kv_bytes_per_sequence(space.workload.prompt, dt) for dt in set(pts["kv_dtype"])}
    return pts.assign(kv_bytes=np.where(pts["role"] == "both", 0.0, pts["kv_dtype"].map(kv).to_numpy(dtype=float)))
