"""Solve the expert-placement program (`formulations.expert_placement`, two stages, exact, through the bridge)
and compare it with the EPLB greedy.

The stages stop on limits of work (branch-and-bound nodes), not of time, so that an answer is the same on
every run on one machine, whatever its load: SCIP runs on one thread with fixed settings and is deterministic
as long as no time limit cuts it. Across CPUs the LP's floating-point path differs, and a node-limited answer
with it: the shipped study (studies/expert_placement.yaml) proves a perfect balance at skew 0.6 on one machine
and stops 0.018% above it on an AMD EPYC, where its stage 2 also keeps the greedy's crossing tokens at skews
0.6 and 1.4 (15,895 and 10,602) that another machine's root heuristics cut to 14,930 and 6,855. What holds on
every machine is what a stage proves: its status, its bound and its gap. The time limit stays as a safety net;
a stage it stops is marked ``time_limited`` (its answer depends on the machine's speed and load).
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass

import numpy as np
import pyomo.environ as pyo
from scipy.optimize import linprog

from dse.errors import InfeasibleError, SolverLimitError
from dse.optimize.bridge import solve_pyomo
from dse.optimize.solver import SolveResult
from formulations.expert_placement import PlacementData, build

DIVES = ("adaptivediving", "coefdiving", "conflictdiving", "distributiondiving", "farkasdiving", "fracdiving",
         "guideddiving", "linesearchdiving", "objpscostdiving", "pscostdiving", "rootsoldiving", "veclendiving")
SCIP_SETTINGS = ("separating/maxroundsroot = 2", "branching/mostinf/priority = 1000000",
                 *(f"heuristics/{h}/freq = -1" for h in DIVES))
"""SCIP's settings for this program: two rounds of cuts at the root, branching on the most fractional
placement without strong branching, and no diving heuristics (on the shipped 256-expert instance they
spent about 18,000 LP iterations a stage and never found a better placement; the hint, RINS and the other
large-neighbourhood heuristics do). They bound the work per node, so a node limit bounds the time."""


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

    def imbalance(self, data: PlacementData) -> float:
        """Most-loaded GPU over the mean: the factor the slowest GPU stretches the expert step by."""
        return self.peak / (data.loads.sum() / data.gpus)


def _start(m: pyo.ConcreteModel, x: np.ndarray, y: np.ndarray) -> None:
    """Give the placement and the token shares a starting value (the solver's hint)."""
    for (e, g), v in m.x.items():
        v.set_value(float(x[e, g]), skip_validation=True)
    for (e, g), v in m.y.items():
        v.set_value(float(y[e, g]), skip_validation=True)


def _solve(m: pyo.ConcreteModel, solver: str, time_limit_s: float, node_limit: int | None) -> SolveResult:
    """Solve one stage from its hint: SCIP with `SCIP_SETTINGS` and the node limit, another solver with its
    defaults and the node limit; columns in declaration order (x, y, h, peak), the order the node-limited answers
    of the shipped study were found in.
    """
    settings = SCIP_SETTINGS if solver == "scip" else ()
    return solve_pyomo(m, solver, time_limit_s, node_limit=node_limit, settings=settings, warm_start=True,
                       columns="declared")


def _values(var: pyo.Var, data: PlacementData) -> np.ndarray:
    """A variable of the program as an (experts, GPUs) array."""
    return np.array([[var[e, g].value for g in range(data.gpus)] for e in range(data.experts)], dtype=float)


def solve_placement(data: PlacementData, time_limit_s: float = 600.0, solver: str = "scip",
                    node_limit: int | None = None, crossing_node_limit: int | None = None) -> Placement:
    """Two-stage exact placement, warm-started from the EPLB greedy; status and gap say how exact.

    ``node_limit`` bounds the branch-and-bound nodes of stage 1 (the peak load) and ``crossing_node_limit``
    those of stage 2 (the crossing tokens; default: ``node_limit``): limits of work, which give the same
    answer on every run on one machine (not across CPUs: see the module's docstring). ``time_limit_s`` (per
    stage) is a safety net; a stage it stops is reported (``time_limited``), since its answer then depends on
    the machine's speed.
    """
    t0 = time.perf_counter()
    crossing_node_limit = node_limit if crossing_node_limit is None else crossing_node_limit
    m1 = build(data)
    try:
        _start(m1, *greedy_eplb(data))
    except ValueError:  # the greedy packing can fail where the program still has a solution
        pass
    res1 = _solve(m1, solver, time_limit_s, node_limit)
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
    peak = float(m1.peak.value)
    x1, y1 = _values(m1.x, data), _values(m1.y, data)
    m2 = build(data, peak_max=peak * (1 + 1e-9) + 1e-9)
    _start(m2, x1, y1)
    res2 = _solve(m2, solver, time_limit_s, crossing_node_limit)
    x, y = (_values(m2.x, data), _values(m2.y, data)) if res2.ok else (x1, y1)
    status = "optimal" if res1.status == "optimal" and res2.status == "optimal" else "feasible"
    limited = res1.time_limited or res2.time_limited
    return Placement(peak, crossing_tokens(data, x), x, y, status, res1.gap, time.perf_counter() - t0, res1,
                     limited, res2.gap)


def crossing_tokens(data: PlacementData, x: np.ndarray) -> float:
    """Tokens per step that leave their domain, with tokens routed to a local replica when one exists."""
    held = np.zeros((data.experts, data.domains), dtype=bool)
    for g in range(data.gpus):
        held[:, data.domain_of(g)] |= x[:, g] > 0.5
    return float((data.loads[:, None] * (1.0 / data.domains) * ~held).sum())


def greedy_eplb(data: PlacementData) -> tuple[np.ndarray, np.ndarray]:
    """The balanced-packing baseline of DeepSeek's EPLB: give each redundant replica to the expert
    with the most tokens per replica, split each expert's tokens evenly over its replicas, then place
    replicas heaviest first on the least-loaded GPU with a free slot. Returns (x, y).
    """
    replicas = np.ones(data.experts, dtype=int)
    for _ in range(data.redundant):
        if replicas.sum() >= data.gpus * data.slots:
            break
        room = np.where(replicas < data.gpus, data.loads / replicas, -1.0)  # a replica per GPU at most
        if room.max() < 0:
            break
        replicas[int(np.argmax(room))] += 1
    items = sorted(((data.loads[e] / replicas[e], e) for e in range(data.experts) for _ in range(replicas[e])),
                   reverse=True)
    load = np.zeros(data.gpus)
    used = np.zeros(data.gpus, dtype=int)
    x = np.zeros((data.experts, data.gpus))
    y = np.zeros((data.experts, data.gpus))
    for w, e in items:
        free = [g for g in range(data.gpus) if used[g] < data.slots and x[e, g] == 0]
        if not free:
            raise ValueError("the replicas do not fit in the GPUs' slots")
        g = min(free, key=lambda k: load[k])
        x[e, g] = 1
        y[e, g] = 1.0 / replicas[e]
        load[g] += w
        used[g] += 1
    return x, y


def zipf_loads(experts: int, tokens: float, skew: float, seed: int = 0) -> np.ndarray:
    """Tokens per expert drawn from a Zipf law of exponent ``skew`` over a random expert order."""
    rank = np.random.default_rng(seed).permutation(experts) + 1.0
    w = rank ** -skew
    return tokens * w / w.sum()


def greedy(data: PlacementData) -> Placement:
    """The EPLB greedy's placement, its peak load and crossing tokens."""
    x, y = greedy_eplb(data)
    peak = float((data.loads[:, None] * y).sum(axis=0).max())
    return Placement(peak, crossing_tokens(data, x), x, y, "heuristic", float("nan"), 0.0)


def peak_given_placement(data: PlacementData, x: np.ndarray) -> float:
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


def exhaustive(data: PlacementData) -> float:
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
