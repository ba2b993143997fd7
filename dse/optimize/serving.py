"""The best single serving configuration of one workload, exactly, as an argmin.

Why an argmin is exact here. Within a block (system, layout, formats, KV tier) the step time of a
batch of n sequences per DP rank is t(n) = max_i f_i(n) + overhead, where each piece f_i (compute,
memory, communication and their overlapped sums, `dse.physics.roofline._pass`) is non-decreasing
and concave in n with f_i(0) >= 0: compute, KV reads and communication are affine in the tokens
with non-negative intercepts (weights, fixed latencies), and the routed-expert weight read
1 - (1 - k/E)^(n DP) is concave. The work of a pass costed by its kernel groups (`roofline.kernel_work`:
the weight GEMMs' roofline plus attention's) is a sum of such maxima, each of the same kind. For a concave f
with f(0) >= 0, f(n)/n is non-increasing; a max, or a sum, of non-increasing functions is non-increasing. So,
per block:

- the step (TPOT) never falls as n grows, and
- the cost per token, price x chips x t(n) / (n DP PP), never rises as n grows.

The cheapest configuration of a block under a TPOT target is therefore its largest feasible
batch (memory and TPOT are both monotone in n, so that batch is found by bisection over the
integers, evaluating the physics itself), and the optimum of the space is the argmin over blocks.
The fastest configuration of a block is n = 1 (under a cost cap: the smallest n meeting it).
`tests/test_exact_search.py` checks both monotonicities on random blocks and the optimum against a
brute force over every integer batch. No mixed-integer program is involved; results report the
solver as ``argmin (vectorized enumeration)`` with gap 0.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from dse.catalog.hardware import IDEAL
from dse.errors import InfeasibleError
from dse.optimize.solver import SolveResult
from dse.optimize.space import Choice, Space, block_candidates, describe_choice
from dse.optimize.ties import tie_order
from dse.physics.roofline import evaluate
from dse.table import Table

SOLVER_NAME = "argmin (vectorized enumeration)"
TOL = 1e-9


@dataclass
class ServingResult:
    """The optimum of one serving search with its provenance."""

    result: SolveResult
    choice: Choice
    config: dict
    evaluated: int = 0  # blocks evaluated: those meeting the TPOT target, each at its largest batch


def block_physics(space: Space, blocks: Table, n: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Exact step time, cost (USD per Mtok of output) and fit of each block at n sequences per rank."""
    mt, st = space.tables()
    n = np.asarray(n, dtype=float)
    eff = IDEAL if space.ideal else None
    r = evaluate(block_candidates(blocks, n, space.workload.context), mt, st, eff, ttft=False)
    cost = blocks["a"] * r["step_s"] / n
    return r["step_s"], cost, r["fits"].astype(bool)


def _bisect(lo: np.ndarray, hi: np.ndarray, ok) -> np.ndarray:
    """Per element, the largest integer in [lo, hi] where the monotone predicate ``ok`` holds
    (``ok`` true at lo, false above the answer); lo - 1 where it fails at lo.
    """
    lo = lo.astype(np.int64).copy()
    hi = hi.astype(np.int64).copy()
    good = ok(lo)
    ans = np.where(good, lo, lo - 1)
    lo = np.where(good, lo + 1, hi + 1)
    while (lo <= hi).any():
        active = lo <= hi
        mid = np.where(active, (lo + hi) // 2, ans)
        m_ok = ok(mid) & active
        ans = np.where(m_ok, mid, ans)
        lo = np.where(m_ok, mid + 1, lo)
        hi = np.where(active & ~m_ok, mid - 1, hi)
    return ans


def _smallest(lo: np.ndarray, hi: np.ndarray, ok) -> np.ndarray:
    """Per element, the smallest integer in [lo, hi] where ``ok`` (false then true) holds; hi + 1 if none."""
    lo = lo.astype(np.int64).copy()
    hi = hi.astype(np.int64).copy()
    ans = hi + 1
    while (lo <= hi).any():
        active = lo <= hi
        mid = np.where(active, (lo + hi) // 2, lo)
        m_ok = ok(mid) & active
        ans = np.where(m_ok, mid, ans)
        hi = np.where(m_ok, mid - 1, hi)
        lo = np.where(active & ~m_ok, mid + 1, lo)
    return ans


def _feasible_blocks(space: Space) -> Table:
    b = space.blocks
    keep = b["n_lo"] <= b["n_hi"]
    if space.workload.ttft_max is not None:
        keep &= b["ttft"] <= space.workload.ttft_max
    return b[keep]


def largest_batch(space: Space, blocks: Table, tpot_max: float | None) -> np.ndarray:
    """Per block, the largest batch per rank that fits and meets the TPOT target (n_lo - 1 if none)."""
    def ok(n: np.ndarray) -> np.ndarray:
        step, _, fits = block_physics(space, blocks, np.maximum(n, 1))
        return fits & ((step <= tpot_max * (1 + TOL)) if tpot_max is not None else True)
    return _bisect(blocks["n_lo"], blocks["n_hi"], ok)


def _result(value: float, wall: float) -> SolveResult:
    return SolveResult("optimal", "argmin", value, value, 0.0, wall, SOLVER_NAME)


def _at_largest_batch(space: Space, tpot_max: float | None) -> tuple[Table, np.ndarray]:
    """The blocks that can serve under the TPOT target, each at its largest feasible batch per rank (where, by
    the monotonicity above, its cost per token is least); InfeasibleError names what runs out.
    """
    if space.blocks.empty:
        raise InfeasibleError(f"{space.model.id} / {space.workload.name}: {space.empty_reason}")
    blocks = _feasible_blocks(space)
    if blocks.empty:
        raise InfeasibleError(diagnose(space, tpot_max))
    n = largest_batch(space, blocks, tpot_max)
    ok = n >= blocks["n_lo"]
    blocks, n = blocks[ok], n[ok]
    if blocks.empty:
        raise InfeasibleError(diagnose(space, tpot_max))
    return blocks, n


def solve_serving(
    space: Space,
    tpot_max: float | None = None,
    objective: str = "cost",
    solver: str | None = None,
    time_limit_s: float | None = None,
    cost_max: float | None = None,
    start: Choice | None = None,
) -> ServingResult:
    """The exact optimum over every integer batch of the space; InfeasibleError names the binding resource.

    ``objective`` "cost" minimizes USD per output token (each block at its largest feasible batch);
    "latency" minimizes the step time (each block at its smallest batch, or under ``cost_max`` the
    smallest batch whose cost meets the cap); equal scores go to the lower step time (for "cost") or cost (for
    "latency"), then fewer chips. ``solver``, ``time_limit_s`` and ``start``
    are accepted for compatibility and unused: the argmin needs none of them.
    """
    t0 = time.perf_counter()
    blocks, hi = _at_largest_batch(space, tpot_max)
    if objective == "cost":
        n = hi
    else:
        lo = blocks["n_lo"]
        if cost_max is None:
            n = lo
        else:
            cap = cost_max * (1 + 1e-9)
            n = _smallest(lo, hi, lambda m: block_physics(space, blocks, np.maximum(m, 1))[1] <= cap)
            keep = n <= hi
            blocks, n = blocks[keep], n[keep]
            if blocks.empty:
                raise InfeasibleError(diagnose(space, tpot_max))
    step, cost, _ = block_physics(space, blocks, n)
    score, tie = (cost, step) if objective == "cost" else (step, cost)
    i = _best(score, tie, blocks["chips"])
    choice = Choice(int(blocks.index[i]), int(n[i]), float(step[i]), float(cost[i]))
    res = _result(float(score[i]), time.perf_counter() - t0)
    return ServingResult(res, choice, describe_choice(space, choice), int(len(blocks)))


@dataclass
class DemandResult:
    """The cheapest way to meet a demand: one configuration, an integer number of replicas."""

    result: SolveResult
    choice: Choice
    replicas: int
    usd_per_s: float


def solve_demand(space: Space, demand: float, tpot_max: float | None, solver: str | None = None) -> DemandResult:
    """Meet ``demand`` output tokens/s with an integer number of replicas of one configuration at least cost.

    Throughput per replica, n DP PP / t(n), never falls as n grows (the cost argument above), so a
    block's fewest replicas are at its largest feasible batch; the optimum is the argmin over blocks
    of ceil(demand / throughput) x USD/s per replica (equal costs to the lower step time, then fewer chips).
    """
    t0 = time.perf_counter()
    blocks, n = _at_largest_batch(space, tpot_max)
    step, cost, _ = block_physics(space, blocks, n)
    tps = blocks["dp"] * n * blocks["pp"] / step
    price = np.array([space.systems[i].price_per_s for i in blocks["system_idx"]])
    usd = blocks["chips"] * price
    replicas = np.ceil(demand / tps * (1 - 1e-12))
    total = replicas * usd
    j = _best(total, step, replicas * blocks["chips"])
    choice = Choice(int(blocks.index[j]), int(n[j]), float(step[j]), float(cost[j]))
    res = _result(float(total[j]), time.perf_counter() - t0)
    return DemandResult(res, choice, int(replicas[j]), float(total[j]))


def _best(score: np.ndarray, *keys: np.ndarray) -> int:
    """The position of the least ``score``, scores within a relative 1e-12 of each other ordered by ``keys`` in turn
    (`dse.optimize.ties.tie_order`); the first position where no score is finite.
    """
    order = tie_order(score, *keys)
    return int(order[0]) if len(order) else int(np.argmin(score))


def _gb(x: float) -> str:
    return f"{x / 1e9:,.1f} GB"


def diagnose(space: Space, tpot_max: float | None) -> str:
    """Which resource runs out, and by how much, when no configuration is feasible."""
    b, w, model = space.blocks, space.workload, space.model
    head = f"no feasible configuration for {model.id} / {w.name} (context {w.context:,} tokens)"
    if b.empty:
        return f"{head}: the space is empty"
    cap = b["hbm_budget"]  # what the framework lets weights, activations and KV hold
    need = b["hbm_base"] + b["hbm_per_seq"]
    fits = b["n_hi"] >= 1
    if not fits.any():
        short = need - cap
        i = int(np.argmin(short / cap))
        row = b.row(i)
        return (
            f"{head}: HBM capacity runs out. Even the best layout ({row['system']}, {int(row['chips'])} chips, "
            f"TP{int(row['tp'])} DP{int(row['dp'])} EP{int(row['ep'])} PP{int(row['pp'])}) needs {_gb(need[i])} "
            f"per chip "
            f"for the weights plus the KV of one {w.context:,}-token sequence "
            f"({_gb(space.model.kv_bytes_per_sequence(w.context, 'fp8'))} in FP8 for the whole model), "
            f"{_gb(short[i])} more than its usable {_gb(cap[i])}"
        )
    ttft = b["ttft"]
    if w.ttft_max is not None and not (fits & (ttft <= w.ttft_max)).any():
        i = int(np.argmin(np.where(fits, ttft, np.inf)))
        return (
            f"{head}: the TTFT target runs out. The fastest prefill of a {w.prompt:,}-token prompt that fits "
            f"({b['system'][i]}, {int(b['chips'][i])} chips) takes {ttft[i]:.3g} s, "
            f"{ttft[i] - w.ttft_max:.3g} s over the {w.ttft_max:g} s target"
        )
    ok = fits & ((ttft <= w.ttft_max) if w.ttft_max is not None else True)
    steps = np.where(ok, block_physics(space, b, np.ones(len(b)))[0], np.inf)
    best = float(np.min(steps))
    return (
        f"{head}: the TPOT target runs out. The fastest decode step that fits takes {best:.3g} s "
        f"at one sequence per rank, {best - (tpot_max or 0):.3g} s over the {tpot_max:g} s target"
    )
