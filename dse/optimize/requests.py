"""The cheapest aggregated deployment of one workload per request, exactly, by vectorized enumeration.

Objective: USD per request of an aggregated replica (`dse.physics.serving.aggregated`: in-flight
batching with chunked prefill, prefill interference in TPOT, M/D/1 wait in TTFT), subject to the
workload's TTFT and TPOT targets applied to those request-level figures, memory at the peak
context P + O, and a prefill that keeps up (rho < 1).

Why enumeration and not bisection. The decode-step argument of `dse.optimize.serving` (cost per
token never rises with the batch) does not carry over: the concurrency n also sets the request
rate through Little's law, and with it the prefill load, the interference and the queueing wait.
USD per request is not monotone in n in general (on random blocks it rises again for large n
once prefill chunks crowd the passes and the M/D/1 wait grows), and neither is the feasibility
under a TTFT target (`tests/test_request_search.py` measures both). So every integer n from 1 to
the block's largest that fits (``n_hi``, at most ``max_batch_per_rank``) is evaluated, vectorized
over all (block, n) pairs in chunks; the optimum is the argmin, exact within the space. The result
reports the solver as ``argmin (vectorized enumeration)`` with gap 0.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from dse.catalog.hardware import IDEAL
from dse.errors import InfeasibleError
from dse.optimize.serving import SOLVER_NAME, diagnose
from dse.optimize.solver import SolveResult
from dse.optimize.space import Choice, Space, _candidates, describe_choice, subset
from dse.physics.roofline import ModelTable, SystemTable
from dse.physics.serving import Request, aggregated

TOL = 1e-9
CHUNK_PAIRS = 100_000
KEYS = ("usd_per_request", "ttft_s", "tpot_s", "requests_per_s", "usd_per_s", "prefill_share")


def request_of(space: Space) -> Request:
    """The request of a space's workload (default chunk, no prefix cache, no speculation)."""
    return Request(space.workload.prompt, space.workload.output)


def pairs(blocks: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """Every (block position, n) with 1 <= n_lo <= n <= n_hi: positions into ``blocks`` and n."""
    lo, hi = blocks["n_lo"].to_numpy(), blocks["n_hi"].to_numpy()
    counts = np.maximum(hi - lo + 1, 0)
    pos = np.repeat(np.arange(len(blocks)), counts)
    n = np.repeat(lo, counts) + np.arange(len(pos)) - np.repeat(np.cumsum(counts) - counts, counts)
    return pos, n.astype(np.int64)


def evaluate_pairs(space: Space, blocks: pd.DataFrame, pos: np.ndarray, n: np.ndarray, req: Request,
                   chunk: int = CHUNK_PAIRS) -> dict[str, np.ndarray]:
    """Request-level metrics (``KEYS`` plus ``fits`` and ``stable``) of each (block, n) pair."""
    mt, st = ModelTable.build([space.model]), SystemTable.build(space.systems)
    eff = IDEAL if space.ideal else None
    out = {k: np.empty(len(pos)) for k in KEYS}
    out["fits"] = np.zeros(len(pos), dtype=bool)
    out["stable"] = np.zeros(len(pos), dtype=bool)
    for s in range(0, len(pos), chunk):
        sl = slice(s, s + chunk)
        sub = blocks.iloc[pos[sl]]
        r = aggregated(_candidates(sub, n[sl], space.workload.context), mt, st, req, eff)
        lam = r["requests_per_s"]
        for k in KEYS:
            out[k][sl] = r["usd_per_request"] * lam if k == "usd_per_s" else r[k]
        out["fits"][sl] = r["fits"]
        out["stable"][sl] = r["stable"]
    return out


def feasible_mask(m: dict[str, np.ndarray], tpot_max: float | None, ttft_max: float | None) -> np.ndarray:
    ok = m["fits"] & m["stable"] & np.isfinite(m["usd_per_request"]) & (m["usd_per_request"] > 0)
    if tpot_max is not None:
        ok &= m["tpot_s"] <= tpot_max * (1 + TOL)
    if ttft_max is not None:
        ok &= m["ttft_s"] <= ttft_max * (1 + TOL)
    return ok


@dataclass
class RequestResult:
    """The request-level optimum of one space: its configuration, metrics and what binds it."""

    result: SolveResult
    choice: Choice
    config: dict
    metrics: dict
    binding: str
    stats: dict = field(default_factory=dict)


@dataclass
class BlockOptima:
    """Per block (rows of ``blocks``), the cheapest feasible n per request and its metrics (n = 0: none)."""

    blocks: pd.DataFrame
    n: np.ndarray
    metrics: dict[str, np.ndarray]
    binding: list[str]
    evaluated: int
    demand: dict | None = None


def _binding(n: int, n_hi: int, cap: int | None, m_next: dict | None, tpot_max, ttft_max) -> str:
    """What stops the block's batch at n: the study's batch cap, HBM capacity, a target, or the cost itself."""
    if n >= n_hi:
        return "the study's batch cap (max_batch_per_rank)" if cap is not None and n_hi >= cap else "HBM capacity"
    if m_next is not None:
        if not m_next["stable"]:
            return "the prefill load (one more sequence per rank and the prefill no longer keeps up)"
        if tpot_max is not None and m_next["tpot_s"] > tpot_max * (1 + TOL):
            return f"the TPOT target of {tpot_max * 1e3:g} ms (request level, with prefill interference)"
        if ttft_max is not None and m_next["ttft_s"] > ttft_max * (1 + TOL):
            return f"the TTFT target of {ttft_max:g} s (request level, with queueing)"
    return "the cost per request (a larger batch costs more per request)"


def block_optima(space: Space, req: Request | None = None, demand: float | None = None) -> BlockOptima:
    """Evaluate every (block, n) pair of the space; keep each block's cheapest feasible n per request.

    With ``demand`` (output tokens/s), also the configuration meeting it with the fewest USD/s in
    whole replicas: ceil(demand / (lambda O)) x USD/s per replica, over every pair.
    """
    req = req or request_of(space)
    w = space.workload
    b = space.blocks
    pos, n = pairs(b)
    m = evaluate_pairs(space, b, pos, n, req)
    ok = feasible_mask(m, w.tpot_max, w.ttft_max)
    score = np.where(ok, m["usd_per_request"], np.inf)
    best_n = np.zeros(len(b), dtype=np.int64)
    best_i = np.full(len(b), -1, dtype=np.int64)
    if len(pos):
        # per block, the first position of its minimum score (rows of a block are contiguous, n ascending)
        order = np.lexsort((np.arange(len(pos)), score, pos))
        first = np.ones(len(order), dtype=bool)
        first[1:] = pos[order[1:]] != pos[order[:-1]]
        heads = order[first]
        good = np.isfinite(score[heads])
        best_i[pos[heads[good]]] = heads[good]
        best_n[pos[heads[good]]] = n[heads[good]]
    metrics = {k: (np.where(best_i >= 0, v[np.maximum(best_i, 0)], np.nan) if len(v) else np.full(len(b), np.nan))
               for k, v in m.items() if k not in ("fits", "stable")}
    cap = int(space.stats.get("max_batch_per_rank", 0)) or None
    binding = []
    n_hi = b["n_hi"].to_numpy()
    for j in range(len(b)):
        i = best_i[j]
        if i < 0:
            binding.append("")
            continue
        nxt = None
        if best_n[j] < n_hi[j]:
            nxt = {"stable": bool(m["stable"][i + 1]), "tpot_s": m["tpot_s"][i + 1], "ttft_s": m["ttft_s"][i + 1]}
        binding.append(_binding(int(best_n[j]), int(n_hi[j]), cap, nxt,
                                w.tpot_max, w.ttft_max))
    dem = None
    if demand is not None and ok.any():
        tps = m["requests_per_s"] * req.output
        total = np.where(ok, np.ceil(demand / tps * (1 - 1e-12)) * m["usd_per_s"], np.inf)
        i = int(np.argmin(total))
        dem = {"pos": int(pos[i]), "n": int(n[i]), "replicas": int(np.ceil(demand / tps[i] * (1 - 1e-12))),
               "usd_per_s": float(total[i])}
    return BlockOptima(b, best_n, metrics, binding, len(pos), dem)


def diagnose_requests(space: Space, req: Request) -> str:
    """Which request-level limit leaves no configuration feasible, and by how much."""
    b, w = space.blocks, space.workload
    if b.empty or not (b["n_hi"] >= 1).any():
        return diagnose(space, w.tpot_max)
    head = (f"no feasible configuration for {space.model.id} / {w.name} (prompt {w.prompt:,}, output "
            f"{w.output:,} tokens, aggregated)")
    fit = b[b["n_hi"] >= 1]
    m = evaluate_pairs(space, fit, np.arange(len(fit)), np.ones(len(fit), dtype=np.int64), req)
    ok = m["fits"] & m["stable"]
    if not ok.any():
        return f"{head}: the prefill load runs out (even one sequence per rank, the prefill cannot keep up)"
    ttft = np.where(ok, m["ttft_s"], np.inf)
    if w.ttft_max is not None and ttft.min() > w.ttft_max:
        i = int(np.argmin(ttft))
        return (f"{head}: the TTFT target runs out. The fastest request-level TTFT (one sequence per rank, "
                f"{fit.iloc[i]['system']}, {int(fit.iloc[i]['chips'])} chips) is {ttft[i]:.3g} s, "
                f"{ttft[i] - w.ttft_max:.3g} s over the {w.ttft_max:g} s target")
    tp = np.where(ok & ((m["ttft_s"] <= w.ttft_max) if w.ttft_max is not None else True), m["tpot_s"], np.inf)
    i = int(np.argmin(tp))
    return (f"{head}: the TPOT target runs out. The fastest request-level TPOT (with prefill interference, one "
            f"sequence per rank, {fit.iloc[i]['system']}) is {tp[i] * 1e3:.3g} ms, "
            f"{(tp[i] - (w.tpot_max or 0)) * 1e3:.3g} ms over the {(w.tpot_max or 0) * 1e3:g} ms target")


def pick(space: Space, opt: BlockOptima, mask: np.ndarray | None = None, t0: float | None = None,
         req: Request | None = None) -> RequestResult:
    """The argmin over the blocks where ``mask`` holds; InfeasibleError names the binding limit."""
    t0 = time.perf_counter() if t0 is None else t0
    cost = np.where(opt.n > 0, opt.metrics["usd_per_request"], np.inf)
    if mask is not None:
        cost = np.where(mask, cost, np.inf)
    if not np.isfinite(cost).any():
        sub = space if mask is None else subset(space, mask)
        raise InfeasibleError(diagnose_requests(sub, req or request_of(space)))
    j = int(np.argmin(cost))
    metrics = {k: float(v[j]) for k, v in opt.metrics.items()}
    choice = Choice(int(opt.blocks.index[j]), int(opt.n[j]), metrics["tpot_s"], metrics["usd_per_request"])
    res = SolveResult("optimal", "argmin", metrics["usd_per_request"], metrics["usd_per_request"], 0.0,
                      time.perf_counter() - t0, SOLVER_NAME)
    return RequestResult(res, choice, describe_choice(space, choice), metrics, opt.binding[j],
                         {"pairs_evaluated": opt.evaluated, "blocks": len(opt.blocks)})


def solve_requests(space: Space, req: Request | None = None) -> RequestResult:
    """The aggregated configuration with the least USD per request meeting the request-level targets."""
    t0 = time.perf_counter()
    if space.blocks.empty:
        raise InfeasibleError(f"{space.model.id} / {space.workload.name}: {space.empty_reason}")
    return pick(space, block_optima(space, req), t0=t0, req=req)
