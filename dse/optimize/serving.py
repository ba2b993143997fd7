"""Solve the serving program exactly: presolve, greedy warm start, Dinkelbach over the MIP.

The ratio USD/token = a x step / n is minimized by Dinkelbach iterations: with lambda the best
ratio so far, minimize sum a T - lambda sum n; a negative optimum gives a better ratio, a zero
optimum proves lambda optimal. Presolve drops blocks that break a target at every batch and, given
the greedy incumbent, blocks whose lower bound (their cost at the largest batch that fits, since
cost per token never rises with the batch) cannot beat it.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from dse.errors import InfeasibleError
from dse.optimize.solver import SolveResult, relative_gap, solve
from dse.optimize.space import Choice, Space, describe_choice, pieces, step_time
from formulations import serving as formulation

TOL = 1e-9


@dataclass
class ServingResult:
    """The optimum of one serving program with its provenance."""

    result: SolveResult
    choice: Choice
    config: dict
    presolve: dict = field(default_factory=dict)


def _feasible_blocks(space: Space, tpot_max: float | None) -> pd.DataFrame:
    b = space.blocks
    keep = b["n_lo"] <= b["n_hi"]
    if space.workload.ttft_max is not None:
        keep &= b["ttft"] <= space.workload.ttft_max
    b = b[keep]
    if tpot_max is not None and not b.empty:
        b = b[step_time(b, b["n_lo"].to_numpy()) <= tpot_max * (1 + TOL)]
    return b


def _feasible_points(space: Space, tpot_max: float | None) -> pd.DataFrame:
    p = space.points
    if p.empty:
        return p
    keep = p["fits"].astype(bool)
    if space.workload.ttft_max is not None:
        keep &= space.blocks["ttft"].loc[p["block"]].to_numpy() <= space.workload.ttft_max
    if tpot_max is not None:
        keep &= p["step"] <= tpot_max * (1 + TOL)
    return p[keep]


def largest_batch(blocks: pd.DataFrame, tpot_max: float | None) -> np.ndarray:
    """Per block, the largest batch per rank that fits and meets the TPOT target."""
    hi = blocks["n_hi"].to_numpy().astype(float)
    if tpot_max is None:
        return hi
    alpha, beta = pieces(blocks)
    with np.errstate(divide="ignore", invalid="ignore"):
        limit = np.where(beta > 0, (tpot_max - alpha) / beta, np.inf).min(axis=1)
    return np.floor(np.minimum(hi, limit * (1 + TOL)))


def greedy(blocks: pd.DataFrame, points: pd.DataFrame, tpot_max: float | None, objective: str) -> Choice | None:
    """Incumbent: each block at its largest feasible batch (cost) or smallest (latency); best of all."""
    best: Choice | None = None
    if not blocks.empty:
        n = largest_batch(blocks, tpot_max) if objective == "cost" else blocks["n_lo"].to_numpy().astype(float)
        ok = n >= blocks["n_lo"].to_numpy()
        if ok.any():
            sub, n = blocks[ok], n[ok]
            step = step_time(sub, n)
            cost = sub["a"].to_numpy() * step / n
            score = cost if objective == "cost" else step
            i = int(np.argmin(score))
            best = Choice(int(sub.index[i]), int(n[i]), float(step[i]), float(cost[i]))
    if not points.empty:
        score = points["cost"] if objective == "cost" else points["step"]
        j = int(np.argmin(score.to_numpy()))
        row = points.iloc[j]
        value = float(score.iloc[j])
        current = None if best is None else (best.cost if objective == "cost" else best.step)
        if current is None or value < current:
            best = Choice(int(row["block"]), int(row["n"]), float(row["step"]), float(row["cost"]))
    return best


def presolve(space: Space, tpot_max: float | None, objective: str = "cost", prune: bool = True):
    """Feasible blocks and points, the greedy incumbent, and bound pruning against it."""
    blocks = _feasible_blocks(space, tpot_max)
    points = _feasible_points(space, tpot_max)
    incumbent = greedy(blocks, points, tpot_max, objective)
    stats = {"blocks_feasible": len(blocks), "points_feasible": len(points)}
    if prune and incumbent is not None:
        bound_target = (incumbent.cost if objective == "cost" else incumbent.step) * (1 + 1e-7)
        if objective == "cost":
            hi = blocks["n_hi"].to_numpy()
            lower = blocks["a"].to_numpy() * step_time(blocks, hi) / hi
            blocks = blocks[lower <= bound_target]
            points = points[points["cost"] <= bound_target]
        else:
            blocks = blocks[step_time(blocks, blocks["n_lo"].to_numpy()) <= bound_target]
            points = points[points["step"] <= bound_target]
    stats.update(blocks_in_mip=len(blocks), points_in_mip=len(points))
    return blocks, points, incumbent, stats


def solve_serving(
    space: Space,
    tpot_max: float | None = None,
    objective: str = "cost",
    solver: str = "highs",
    prune: bool = True,
    time_limit_s: float = 60.0,
    cost_max: float | None = None,
    start: Choice | None = None,
) -> ServingResult:
    """The exact optimum of the serving program; InfeasibleError names the binding resource.

    ``objective`` "cost" minimizes USD per token; "latency" minimizes the step time, optionally with
    cost per token capped at ``cost_max`` (the second stage of a lexicographic Pareto point);
    ``start`` is a known feasible choice under that cap (the first stage's optimum).
    """
    t0 = time.perf_counter()
    if space.blocks.empty:
        raise InfeasibleError(f"{space.model.id} / {space.workload.name}: {space.empty_reason}")
    blocks, points, incumbent, stats = presolve(space, tpot_max, objective, prune and cost_max is None)
    if cost_max is not None:  # the greedy ignores the cap: prune by the cap and by the known start
        cap = cost_max * (1 + 1e-7)
        if not blocks.empty:
            hi = blocks["n_hi"].to_numpy()
            blocks = blocks[blocks["a"].to_numpy() * step_time(blocks, hi) / hi <= cap]
        points = points[points["cost"] <= cap]
        if start is not None and prune:
            blocks = blocks[step_time(blocks, blocks["n_lo"].to_numpy()) <= start.step * (1 + 1e-7)]
            points = points[points["step"] <= start.step * (1 + 1e-7)]
        stats.update(blocks_in_mip=len(blocks), points_in_mip=len(points))
        incumbent = start or (None if blocks.empty and points.empty else Choice(-1, 1, math.inf, math.inf))
    if incumbent is None:
        raise InfeasibleError(diagnose(space, tpot_max))
    sm = formulation.build(
        blocks.reset_index(drop=False).set_index("index"), points.reset_index(drop=True), tpot_max,
        cost_max=None if cost_max is None else cost_max * (1 + 1e-9),
    )
    lam = incumbent.cost if objective == "cost" else 0.0
    choice = incumbent
    iterations = 0
    last: SolveResult | None = None
    while True:
        iterations += 1
        sm.set_objective(lam, objective)
        engine, res = solve(sm.model, solver, time_limit_s)
        last = res
        if not res.ok:
            break
        found = _read_choice(engine, sm)
        if choice.block < 0:
            choice = found
        if objective == "latency":
            if found.step < choice.step * (1 - TOL):
                choice = found
            break
        scale = max(abs(lam) * max(found.n, 1), 1e-12)
        if res.objective >= -TOL * scale or iterations >= 50:
            break
        if found.cost < choice.cost * (1 - TOL):
            choice = found
        lam = choice.cost
    wall = time.perf_counter() - t0
    assert last is not None
    if objective == "cost":
        bound = lam + min(0.0, last.bound) if last.ok else math.nan
        value = choice.cost
    else:
        bound = last.bound if last.ok else math.nan
        value = choice.step
    if choice.block < 0:
        raise InfeasibleError(diagnose(space, tpot_max))
    status = "optimal" if last.ok and relative_gap(value, bound) <= 1e-6 else ("feasible" if last.ok else last.status)
    result = SolveResult(status, last.termination, value, bound, max(0.0, relative_gap(value, bound)), wall,
                         solver, iterations=iterations)
    return ServingResult(result, choice, describe_choice(space, choice), stats)


@dataclass
class DemandResult:
    """The cheapest way to meet a demand: one configuration, an integer number of replicas."""

    result: SolveResult
    choice: Choice
    replicas: int
    usd_per_s: float


def solve_demand(space: Space, demand: float, tpot_max: float | None, solver: str = "highs") -> DemandResult:
    """Meet ``demand`` output tokens/s with an integer number of replicas at least cost.

    Within a block, throughput per replica never falls as the batch grows, so the block's best
    option is its largest feasible batch; the MIP then picks the option and the replica count.
    """
    t0 = time.perf_counter()
    blocks = _feasible_blocks(space, tpot_max)
    points = _feasible_points(space, tpot_max)
    rows = []
    if not blocks.empty:
        n = largest_batch(blocks, tpot_max)
        ok = n >= blocks["n_lo"].to_numpy()
        sub, n = blocks[ok], n[ok]
        step = step_time(sub, n)
        for k, nn, st in zip(sub.index, n, step, strict=True):
            rows.append((int(k), int(nn), float(st)))
    for _, row in points.iterrows():
        rows.append((int(row["block"]), int(row["n"]), float(row["step"])))
    if not rows:
        raise InfeasibleError(diagnose(space, tpot_max))
    opts = pd.DataFrame(rows, columns=["block", "n", "step"])
    b = space.blocks.loc[opts["block"]]
    opts["tokens_per_s"] = (b["dp"].to_numpy() * opts["n"] * b["pp"].to_numpy()) / opts["step"]
    price = np.array([space.systems[i].price_per_s for i in b["system_idx"]])
    opts["usd_per_s"] = b["chips"].to_numpy() * price
    # presolve: continuous lower bound against the rounded-up greedy
    greedy_cost = np.ceil(demand / opts["tokens_per_s"]) * opts["usd_per_s"]
    lower = demand / opts["tokens_per_s"] * opts["usd_per_s"]
    opts = opts[lower <= greedy_cost.min() * (1 + 1e-9)].reset_index(drop=True)
    dm = formulation.build_demand(opts, demand)
    engine, res = solve(dm.model, solver)
    z = engine.values(dm.z)
    j = int(z.idxmax())
    replicas = int(round(engine.values(dm.r)[j]))
    row = opts.loc[j]
    b = space.blocks.loc[int(row["block"])]
    choice = Choice(int(row["block"]), int(row["n"]), float(row["step"]), float(b["a"] * row["step"] / row["n"]))
    res.wall_s = time.perf_counter() - t0
    return DemandResult(res, choice, replicas, replicas * float(row["usd_per_s"]))


def _read_choice(engine, sm: formulation.ServingModel) -> Choice:
    z = engine.values(sm.z) if len(sm.z) else pd.Series(dtype=float)
    if len(z) and z.max() > 0.5:
        k = z.idxmax()
        n = int(round(engine.values(sm.n)[k]))
        row = sm.blocks.loc[[k]]
        step = float(step_time(row, np.array([n]))[0])
        return Choice(int(k), n, step, float(row["a"].iloc[0]) * step / n)
    p = engine.values(sm.p)
    j = p.idxmax()
    row = sm.points.loc[j]
    return Choice(int(row["block"]), int(row["n"]), float(row["step"]), float(row["cost"]))


def _gb(x: float) -> str:
    return f"{x / 1e9:,.1f} GB"


def diagnose(space: Space, tpot_max: float | None) -> str:
    """Which resource runs out, and by how much, when no configuration is feasible."""
    b, w, model = space.blocks, space.workload, space.model
    head = f"no feasible configuration for {model.id} / {w.name} (context {w.context:,} tokens)"
    if b.empty:
        return f"{head}: the space is empty"
    cap = np.array([space.systems[i].hbm_capacity for i in b["system_idx"]]) * b["hbm_usable"].to_numpy()
    need = b["hbm_base"].to_numpy() + b["hbm_per_seq"].to_numpy()
    fits = b["n_hi"].to_numpy() >= 1
    if not fits.any():
        short = need - cap
        i = int(np.argmin(short / cap))
        row = b.iloc[i]
        return (
            f"{head}: HBM capacity runs out. Even the best layout ({row['system']}, {int(row['chips'])} chips, "
            f"TP{int(row['tp'])} DP{int(row['dp'])} EP{int(row['ep'])} PP{int(row['pp'])}) needs {_gb(need[i])} "
            f"per chip "
            f"for the weights plus the KV of one {w.context:,}-token sequence "
            f"({_gb(space.model.kv_bytes_per_sequence(w.context, 'fp8'))} in FP8 for the whole model), "
            f"{_gb(short[i])} more than its usable {_gb(cap[i])}"
        )
    ttft = b["ttft"].to_numpy()
    if w.ttft_max is not None and not (fits & (ttft <= w.ttft_max)).any():
        i = int(np.argmin(np.where(fits, ttft, np.inf)))
        return (
            f"{head}: the TTFT target runs out. The fastest prefill of a {w.prompt:,}-token prompt that fits "
            f"({b.iloc[i]['system']}, {int(b.iloc[i]['chips'])} chips) takes {ttft[i]:.3g} s, "
            f"{ttft[i] - w.ttft_max:.3g} s over the {w.ttft_max:g} s target"
        )
    ok = fits & ((ttft <= w.ttft_max) if w.ttft_max is not None else True)
    steps = np.where(ok, step_time(b, np.ones(len(b))), np.inf)
    if not space.points.empty:
        ok_pts = ok[b.index.get_indexer(space.points["block"].to_numpy())]
        pts = space.points[space.points["fits"].astype(bool).to_numpy() & ok_pts]
        if not pts.empty:
            steps = np.minimum(steps.min(), pts["step"].min()) * np.ones(1)
    best = float(np.min(steps))
    return (
        f"{head}: the TPOT target runs out. The fastest decode step that fits takes {best:.3g} s "
        f"at one sequence per rank, {best - (tpot_max or 0):.3g} s over the {tpot_max:g} s target"
    )
