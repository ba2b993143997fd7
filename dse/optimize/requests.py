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

Robust searches. With `dse.optimize.margins.Margins` (a multiplier per system on cost, TPOT and TTFT), every
search here judges a configuration at the unfavourable end of its band: its targets met by its scaled TTFT and
TPOT, its cost scaled (whole deployments: `dse.optimize.whole`); the reported metrics stay the predictions. Each
multiplier is one per block, so the searches stay exact (`dse.optimize.margins` says why).

Bounded memory. Every search here streams the pairs in chunks of whole blocks (`dse.optimize.space.pair_chunks`)
and keeps, per block, only the pairs some question can choose (its cheapest feasible batch per request, which is
also what a whole deployment takes of it, and the highest feasible request rate): the memory of a search grows
with the number of blocks, never with the number of configurations.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from dataclasses import dataclass, field, replace

import numpy as np

from dse.catalog.calibration import error_band
from dse.catalog.hardware import FP8_ENCODINGS, IDEAL, default_systems
from dse.catalog.units import DTYPES
from dse.errors import InfeasibleError
from dse.optimize.margins import Margins
from dse.optimize.serving import SOLVER_NAME, diagnose
from dse.optimize.solver import SolveResult
from dse.optimize.space import Choice, Space, block_candidates, chunk_size, describe_choice, pair_chunks, subset
from dse.optimize.ties import tie_order
from dse.physics.queueing import QUANTILES, quantile_name
from dse.physics.serving import (
    Request,
    aggregated,
    cost_keys,
    decode_pool,
    disaggregated,
    prefill_pool,
    prefill_ttft,
    rho_for_ttft,
)
from dse.table import Table

TOL = 1e-9
KEYS = ("usd_per_request", "ttft_s", "tpot_s", "requests_per_s", "usd_per_s", "prefill_share")


def evaluate_pairs(space: Space, blocks: Table, pos: np.ndarray, n: np.ndarray, req: Request,
                   chunk: int | None = None) -> dict[str, np.ndarray]:
    """Request-level metrics (``KEYS``, the quantiles of ``req.quantiles``, ``fits`` and ``stable``) of each
    (block, n) pair.
    """
    mt, st = space.tables()
    eff = IDEAL if space.ideal else None
    req = space.served(req)
    keys = (*KEYS, *quantile_keys(req))
    out = {k: np.empty(len(pos)) for k in keys}
    out["fits"] = np.zeros(len(pos), dtype=bool)
    out["stable"] = np.zeros(len(pos), dtype=bool)
    chunk = chunk_size(chunk)
    for s in range(0, len(pos), chunk):
        sl = slice(s, s + chunk)
        r = aggregated(block_candidates(blocks, n[sl], space.workload.context, pos=pos[sl]), mt, st, req, eff)
        for k in keys:
            out[k][sl] = r[k]
        out["fits"][sl] = r["fits"]
        out["stable"][sl] = r["stable"]
    out["holds"] = holds_concurrency(blocks, pos, n, req)
    return out


def holds_concurrency(blocks: Table, pos: np.ndarray, n: np.ndarray, req: Request) -> np.ndarray:
    """Whether whole replicas of each (block, n) hold exactly the workload's closed loop: N = R x n x DP x PP for a
    whole number R of replicas (every pair, under Poisson arrivals or without a stated concurrency).
    """
    if not req.closed_loop or req.concurrency is None:
        return np.ones(len(pos), dtype=bool)
    return req.concurrency % in_flight_per_replica(blocks, pos, n) == 0


def in_flight_per_replica(blocks: Table, pos: np.ndarray | int, n: np.ndarray | int) -> np.ndarray | int:
    """Sequences one replica of each (block, n) holds in flight: n per DP rank of each of its PP stages."""
    return n * blocks["dp"][pos] * blocks["pp"][pos]


def quantile_keys(req: Request) -> tuple[str, ...]:
    """The metrics of the quantiles the physics computes for ``req`` (``ttft_p90_s``, ``tpot_p90_s``, ...)."""
    return tuple(f"{metric}_{quantile_name(q)}_s" for q in req.quantiles for metric in ("ttft", "tpot"))


def targets(req: Request) -> list[tuple[str, float, str]]:
    """The targets of ``req`` as (metric, seconds, how a binding message names it): the means' and the quantiles'."""
    out = []
    if req.tpot_max is not None:
        out.append(("tpot_s", req.tpot_max, f"the TPOT target of {req.tpot_max * 1e3:g} ms (request level, with "
                                            "prefill interference)"))
    for q, t in req.tpot_quantile_max:
        out.append((f"tpot_{quantile_name(q)}_s", t, f"the {quantile_name(q)} TPOT target of {t * 1e3:g} ms"))
    if req.ttft_max is not None:
        out.append(("ttft_s", req.ttft_max, f"the TTFT target of {req.ttft_max:g} s (request level, with queueing)"))
    for q, t in req.ttft_quantile_max:
        out.append((f"ttft_{quantile_name(q)}_s", t, f"the {quantile_name(q)} TTFT target of {t:g} s ({req.arrival} "
                                                     "arrivals)"))
    return out


def feasible_mask(m: dict[str, np.ndarray], req: Request, tpot_margin: np.ndarray | float = 1.0,
                  ttft_margin: np.ndarray | float = 1.0) -> np.ndarray:
    """Pairs that fit, keep up with their prefill, hold the workload's closed loop in whole replicas (``holds``) and
    meet every target of ``req`` (means and quantiles) with their TPOT and TTFT times the margins.
    """
    ok = m["fits"] & m["stable"] & np.isfinite(m["usd_per_request"]) & (m["usd_per_request"] > 0)
    if "holds" in m:
        ok &= m["holds"]
    for key, target, _ in targets(req):
        ok &= m[key] * (tpot_margin if key.startswith("tpot") else ttft_margin) <= target * (1 + TOL)
    return ok


def per_pair(margins: Margins | None, space: Space, pos: np.ndarray) -> tuple[np.ndarray | float, ...]:
    """The (cost, TPOT, TTFT) margins of the pairs at block positions ``pos``: ones without margins."""
    if margins is None:
        return 1.0, 1.0, 1.0
    si = space.blocks["system_idx"][pos]
    return margins.cost[si], margins.tpot[si], margins.ttft[si]


@dataclass
class RequestResult:
    """The request-level optimum of one space: its configuration, metrics and what binds it."""

    result: SolveResult
    choice: Choice
    config: dict
    metrics: dict
    binding: str
    stats: dict = field(default_factory=dict)
    replicas: int = 1
    """Whole replicas deployed (a budget or a demand sets them; else one)."""
    deployed: dict = field(default_factory=dict)
    """The deployment's figures as deployed (`aggregated_deployed`): its USD per request over what its replicas
    serve, its GPUs, power and output tokens/s per GPU."""
    whole: bool = False
    """Chosen among whole deployments (a budget or a demand): ``deployed`` is what it was judged on."""


@dataclass
class BlockOptima:
    """Per block (rows of ``blocks``), the cheapest feasible n per request and its metrics (n = 0: none)."""

    blocks: Table
    n: np.ndarray
    metrics: dict[str, np.ndarray]
    binding: list[str]
    evaluated: int
    margins: Margins | None = None  # the robust search's (None: judged as predicted)
    req: Request | None = None  # the request the pairs were evaluated for (None: the space's workload)


def _binding(n: int, n_hi: int, cap: int | None, m_next: dict | None, req: Request, robust: bool = False) -> str:
    """What stops the block's batch at n: the study's batch cap, HBM capacity, a target (``robust``: met at the
    high end of the prediction's error band, `Margins`, which the label says), or the cost itself.
    """
    if n >= n_hi:
        return "the study's batch cap (max_batch_per_rank)" if cap is not None and n_hi >= cap else "HBM capacity"
    if m_next is not None:
        if not m_next.get("stable", True):
            return "the prefill load (one more sequence per rank and the prefill no longer keeps up)"
        for key, target, label in targets(req):
            if key in m_next and m_next[key] > target * (1 + TOL):
                return label + (", met at the high end of the prediction's error band" if robust else "")
    return "the cost per request (a larger batch costs more per request)"


def first_min_per_block(pos: np.ndarray, score: np.ndarray) -> np.ndarray:
    """Per block of ``pos`` (pairs contiguous by block), the index of the first pair with its least finite score;
    blocks whose every score is infinite have none. Indices in increasing order. One pass, no sort: each block's
    least score (NaN scores ignored), then the first pair that reaches it.
    """
    if not len(pos):
        return np.zeros(0, dtype=np.int64)
    first = np.concatenate(([True], pos[1:] != pos[:-1]))  # each block's first pair
    least = np.fmin.reduceat(score, np.flatnonzero(first))  # its least score (NaN only where all are NaN)
    block = np.cumsum(first) - 1
    at = np.flatnonzero(score == least[block])  # pairs that reach their block's least score
    heads = at[np.concatenate(([True], block[at[1:]] != block[at[:-1]]))] if len(at) else at
    return heads[np.isfinite(score[heads])]


def has_next(pos: np.ndarray, idx: np.ndarray) -> np.ndarray:
    """Whether the pair after each of ``idx`` (pairs contiguous by block, n ascending) is its block's next batch."""
    after = np.minimum(idx + 1, len(pos) - 1)
    return (idx + 1 < len(pos)) & (pos[after] == pos[idx])


def block_optima(space: Space, req: Request | None = None, max_pairs: int | None = None,
                 margins: Margins | None = None) -> BlockOptima:
    """Evaluate every (block, n) pair of the space; keep each block's cheapest feasible n per request.

    A block's USD/s is one figure at every n, so its cheapest n per request is also the n serving the most
    requests/s: what a whole deployment for a budget or a demand takes of it (`dse.optimize.whole`). The pairs are
    streamed in chunks of whole blocks (``max_pairs``), each reduced before the next is evaluated. With
    ``margins``, the targets are met at the band's edge (`Margins`).
    """
    req = req or space.workload
    w = space.workload
    b = space.blocks
    best_n = np.zeros(len(b), dtype=np.int64)
    metrics = {k: np.full(len(b), np.nan) for k in KEYS}
    nxt = {"stable": np.ones(len(b), dtype=bool)}  # the pair at best n + 1, when the block has one
    nxt.update({key: np.full(len(b), np.nan) for key, _, _ in targets(w)})
    evaluated = 0
    for pos, n in pair_chunks(b, max_pairs):
        m = evaluate_pairs(space, b, pos, n, req)
        evaluated += len(pos)
        _, tpot_m, ttft_m = per_pair(margins, space, pos)
        ok = feasible_mask(m, w, tpot_m, ttft_m)
        heads = first_min_per_block(pos, np.where(ok, m["usd_per_request"], np.inf))
        at = pos[heads]
        best_n[at] = n[heads]
        for k in KEYS:
            metrics[k][at] = m[k][heads]
        more = heads[has_next(pos, heads)]
        judged = {"stable": m["stable"]}
        judged.update({key: m[key] * (tpot_m if key.startswith("tpot") else ttft_m) for key, _, _ in targets(w)})
        for k in nxt:
            nxt[k][pos[more]] = judged[k][more + 1]
    cap = int(space.stats.get("max_batch_per_rank", 0)) or None
    n_hi = b["n_hi"]
    binding = []
    for j in range(len(b)):
        if best_n[j] == 0:
            binding.append("")
            continue
        following = {k: v[j] for k, v in nxt.items()} if best_n[j] < n_hi[j] else None
        binding.append(_binding(int(best_n[j]), int(n_hi[j]), cap, following, w, margins is not None))
    return BlockOptima(b, best_n, metrics, binding, evaluated, margins, req)


def diagnose_requests(space: Space, req: Request, margins: Margins | None = None) -> str:
    """Which request-level limit leaves no configuration feasible, and by how much (with ``margins``, the TTFT and
    TPOT at the high end of their bands).
    """
    b, w = space.blocks, space.workload
    if b.empty or not (b["n_hi"] >= 1).any():
        return diagnose(space, w.tpot_max)
    head = (f"no feasible configuration for {space.model.id} / {w.name} (prompt {w.prompt:,}, output "
            f"{w.output:,} tokens, aggregated)")
    fit = b[b["n_hi"] >= 1]
    m = evaluate_pairs(space, fit, np.arange(len(fit)), np.ones(len(fit), dtype=np.int64), req)
    _, tpot_m, ttft_m = per_pair(margins, space, np.flatnonzero(b["n_hi"] >= 1))
    for key, _, _ in targets(w):
        m[key] = m[key] * (tpot_m if key.startswith("tpot") else ttft_m)
    edge = ", at the high end of its error band" if margins is not None else ""
    ok = m["fits"] & m["stable"]
    if not ok.any():
        return f"{head}: the prefill load runs out (even one sequence per rank, the prefill cannot keep up)"
    met = ok.copy()  # TTFT targets first (one sequence per rank is the fastest TTFT), then TPOT among those
    for key, target, label in sorted(targets(w), key=lambda t: not t[0].startswith("ttft")):
        value = np.where(met, m[key], np.inf)
        if value.min() > target * (1 + TOL):
            i = int(np.argmin(value))
            unit, scale = ("s", 1.0) if key.startswith("ttft") else ("ms", 1e3)
            metric = key[:4].upper() if key.count("_") == 1 else f"{key.split('_')[1]} {key[:4].upper()}"
            what = "TTFT" if key.startswith("ttft") else "TPOT (with prefill interference)"
            return (f"{head}: the {metric} target runs out ({label}). The fastest request-level {what} (one "
                    f"sequence per rank{edge}, {fit['system'][i]}, {int(fit['chips'][i])} chips) is "
                    f"{value[i] * scale:.3g} {unit}, {(value[i] - target) * scale:.3g} {unit} over it")
        met &= m[key] <= target * (1 + TOL)
    return f"{head}: no configuration meets every target at once"


def pick(space: Space, opt: BlockOptima, mask: np.ndarray | None = None, t0: float | None = None,
         req: Request | None = None) -> RequestResult:
    """The argmin over the blocks where ``mask`` holds (of the cost times its margin, with ``opt.margins``);
    InfeasibleError names the binding limit.
    """
    return ranked(space, opt, 1, mask, t0, req)[0]


def ranked(space: Space, opt: BlockOptima, top: int, mask: np.ndarray | None = None, t0: float | None = None,
           req: Request | None = None) -> list[RequestResult]:
    """The ``top`` cheapest blocks where ``mask`` holds, each at its cheapest batch (judged as `pick` judges),
    cheapest first (equal costs by lower TPOT, lower TTFT, fewer chips deployed: `tie_order`); InfeasibleError
    names the binding limit where there is none.
    """
    t0 = time.perf_counter() if t0 is None else t0
    cost_m = opt.margins.cost[opt.blocks["system_idx"]] if opt.margins is not None else 1.0
    cost = np.where(opt.n > 0, opt.metrics["usd_per_request"] * cost_m, np.inf)
    if mask is not None:
        cost = np.where(mask, cost, np.inf)
    if not np.isfinite(cost).any():
        sub = space if mask is None else subset(space, mask)
        raise InfeasibleError(diagnose_requests(sub, req or space.workload, opt.margins))
    chips = opt.blocks["chips"] * replicas_held(space, opt)
    order = tie_order(cost, opt.metrics["tpot_s"], opt.metrics["ttft_s"], chips)[:top]
    out = []
    for j in order:
        res = SolveResult("optimal", "argmin", float(cost[j]), float(cost[j]), 0.0, time.perf_counter() - t0,
                          SOLVER_NAME)
        out.append(aggregated_result(space, opt, int(j), res))
    return out


def replicas_held(space: Space, opt: BlockOptima) -> np.ndarray:
    """Replicas of each block (at its cheapest batch) a fluid answer deploys: one, or under a closed loop of a stated
    concurrency the replicas it fills (`aggregated_result`).
    """
    w = space.workload
    if not (w.closed_loop and w.concurrency is not None):
        return np.ones(len(opt.n), dtype=np.int64)
    return w.concurrency // np.maximum(in_flight_per_replica(opt.blocks, np.arange(len(opt.n)), opt.n), 1)


def aggregated_result(space: Space, opt: BlockOptima, j: int, res: SolveResult, replicas: int = 1,
                      demand: float | None = None, whole: bool = False) -> RequestResult:
    """The result of block position ``j`` at its cheapest batch, ``replicas`` whole replicas deployed (serving
    ``demand`` output tokens/s, when given, else their capacity). A closed loop of a stated concurrency is held by
    exactly the replicas it fills (`holds_concurrency`): that many, whatever ``replicas`` says.
    """
    metrics = {k: float(v[j]) for k, v in opt.metrics.items()}
    choice = Choice(int(opt.blocks.index[j]), int(opt.n[j]), metrics["tpot_s"], metrics["usd_per_request"])
    chips = int(opt.blocks["chips"][j])
    w = space.workload
    if w.closed_loop and w.concurrency is not None and demand is None:
        replicas = w.concurrency // int(in_flight_per_replica(opt.blocks, j, int(opt.n[j])))
    system = space.systems[int(opt.blocks["system_idx"][j])]
    rate = replicas * metrics["requests_per_s"] if demand is None else demand / space.workload.output
    served = served_aggregated(space, opt, j, rate / replicas) if spare(rate, replicas, metrics) else None
    return RequestResult(res, choice, describe_choice(space, choice), metrics, opt.binding[j],
                         {"pairs_evaluated": opt.evaluated, "blocks": len(opt.blocks)}, replicas,
                         aggregated_deployed(metrics, replicas, chips, system.power_all_in_w, rate, space.workload,
                                             served), whole)


def spare(rate: float, replicas: int, metrics: dict) -> bool:
    """Whether ``replicas`` replicas, each serving ``metrics["requests_per_s"]`` at its planned batch, serve
    ``rate`` requests/s with capacity to spare (their served batch is then smaller: `served_batch`).
    """
    return rate < replicas * metrics["requests_per_s"] * (1 - 1e-6)


def served_batch(rates: np.ndarray, rate: float) -> int:
    """The sequences per rank a replica serving ``rate`` requests/s holds, given its rate ``rates[n - 1]`` at n
    sequences per rank up to its planned batch: the fewest whose rate covers ``rate`` (Little's law: a replica
    below its capacity holds fewer requests in flight, rounded up to a whole sequence, so its TTFT and TPOT there
    are at or above those of the exact load), the planned batch where none does.
    """
    covers = np.flatnonzero(rates >= rate * (1 - TOL))
    return int(covers[0]) + 1 if len(covers) else len(rates)


def at_served_load(space: Space, system_idx: int, dp: int, m: dict[str, np.ndarray], rate: float) -> dict:
    """The figures ``m`` (arrays over 1, 2, ... sequences per rank, up to a planned batch) at the batch a replica
    serving ``rate`` requests/s holds (`served_batch`), that batch over the ``dp`` ranks as ``batch_served``, and
    as ``served_edges`` the TTFT and TPOT at the batches it holds at the low and high ends of its system's
    throughput band (a replica slower than predicted holds more sequences for the same rate: a band's edge is its
    multiplier times the figure at that edge's batch, `dse.studies.common`). No edges in the ideal roofline or
    where the system has no band.
    """
    rates = np.asarray(m["requests_per_s"], dtype=np.float64)
    k = served_batch(rates, rate)
    out = {key: float(np.asarray(v)[k - 1]) for key, v in m.items() if np.ndim(v)}
    out["batch_served"] = k * dp
    band = None if space.ideal else error_band(space.systems[system_idx].id)
    if band is not None:
        slow, fast = served_batch(rates * band[0], rate), served_batch(rates * band[1], rate)
        out["served_edges"] = {key: (float(np.asarray(m[key])[fast - 1]), float(np.asarray(m[key])[slow - 1]))
                               for key in ("ttft_s", "tpot_s") if key in m}
    return out


def served_pair(space: Space, blocks: Table, pos: int, n: int, rate: float, req: Request, decode: bool = False
                ) -> dict:
    """The figures of block ``pos`` of ``blocks`` at 1 to ``n`` sequences per rank, at the batch a replica serving
    ``rate`` requests/s holds (`at_served_load`): an aggregated replica's request-level metrics (every quantile) or,
    with ``decode``, a decode replica's TPOT (`decode_replicas`; ``blocks`` is then ``space.blocks``).
    """
    at, upto = np.full(n, pos), np.arange(1, n + 1)
    if decode:
        r = decode_replicas(space, space.served(req), at, upto)
        m = {k: r[k] for k in ("tpot_s", "requests_per_s")}
    else:
        m = evaluate_pairs(space, blocks, at, upto, replace(req, report_quantiles=QUANTILES))
    return at_served_load(space, int(blocks["system_idx"][pos]), int(blocks["dp"][pos]), m, rate)


def served_aggregated(space: Space, opt: BlockOptima, j: int, rate: float) -> dict:
    """Request-level metrics (every quantile) of block ``j`` of ``opt`` at the batch a replica serving ``rate``
    requests/s holds, up to its planned batch (`served_pair`).
    """
    return served_pair(space, opt.blocks, j, int(opt.n[j]), rate, opt.req or space.workload)


def aggregated_deployed(metrics: dict, replicas: int, chips: int, power_per_chip: float, rate: float,
                        req: Request, served: dict | None = None) -> dict:
    """An aggregated deployment of ``replicas`` replicas (one replica's request-level ``metrics`` at its batch)
    serving ``rate`` requests/s (their capacity or less), costed as deployed: every chip's USD/s over the requests
    served, split into input and output by the replica's prefill share of time at its planned batch. TTFT and TPOT
    (and their quantiles) are those at the batch each replica serves (``served``: `served_aggregated`, where the
    replicas have capacity to spare), else at the planned batch.
    """
    usd_s = replicas * metrics["usd_per_s"]
    u = metrics["prefill_share"]
    gpus = replicas * chips
    at = served or metrics
    latency = {k: v for k, v in at.items() if k.startswith(("ttft_", "tpot_"))}
    return {**cost_keys(usd_s, rate, u, req.prompt, req.output), "chips": gpus, "power_w": gpus * power_per_chip,
            "requests_per_s": rate, "usd_per_s": usd_s, "tokens_per_s_per_gpu": rate * req.output / gpus, **latency,
            "tokens_per_s_per_user": 1.0 / at["tpot_s"], "replicas": replicas,
            **({k: served[k] for k in ("batch_served", "served_edges") if k in served} if served else {})}


def solve_requests(space: Space, req: Request | None = None) -> RequestResult:
    """The aggregated configuration with the least USD per request meeting the request-level targets."""
    t0 = time.perf_counter()
    if space.blocks.empty:
        raise InfeasibleError(f"{space.model.id} / {space.workload.name}: {space.empty_reason}")
    return pick(space, block_optima(space, req), t0=t0, req=req)


# ---- disaggregated serving: a prefill pool and a decode pool -------------------------------------
DECODE_KEYS = ("usd_per_request", "tpot_s", "requests_per_s", "usd_per_s", "chips", "decode_step_s",
               "hbm_bytes_per_chip")
PREFILL_KEYS = ("prefill_service_s", "servers", "kv_transfer_s", "stack_latency_s", "usd_per_prompt", "usd_per_s",
                "chips", "chip_s_per_prompt", "hbm_bytes_per_chip", "ring_s")


def decode_chunks(space: Space, req: Request, max_pairs: int | None = None, only: np.ndarray | None = None,
                  margins: Margins | None = None) -> Iterator[tuple[np.ndarray, np.ndarray, dict[str, np.ndarray]]]:
    """Every (block, n) of the space (of the blocks at positions ``only``, when given) as a decode replica
    (`dse.physics.serving.decode_pool`), in chunks of whole blocks: positions into ``space.blocks``, n, and the
    metrics (``DECODE_KEYS`` plus ``fits`` and ``ok``: fits and meets the workload's TPOT target, with its TPOT
    times its margin where ``margins`` are given).
    """
    b, req = space.blocks, space.served(req)
    # a decode pool's passes carry no prefill: every request's TPOT is the pass's, its quantiles the mean
    tpot_targets = [t for key, t, _ in targets(space.workload) if key.startswith("tpot")]
    for pos, n in pair_chunks(b, max_pairs, only):
        r = decode_replicas(space, req, pos, n)
        m = {k: np.asarray(r[k], dtype=np.float64) for k in DECODE_KEYS}
        m["fits"] = np.asarray(r["fits"], dtype=bool)
        m["ok"] = m["fits"] & np.isfinite(m["usd_per_request"]) & (m["usd_per_request"] > 0)
        for tpot_max in tpot_targets:
            m["ok"] &= m["tpot_s"] * per_pair(margins, space, pos)[1] <= tpot_max * (1 + TOL)
        yield pos, n, m


def decode_replicas(space: Space, req: Request, pos: np.ndarray, n: np.ndarray) -> dict[str, np.ndarray]:
    """A decode replica (`dse.physics.serving.decode_pool`) of each (block, n) pair, ``pos`` positions into
    ``space.blocks``, serving ``req`` (as the space serves it: `Space.served`).
    """
    mt, st = space.tables()
    return decode_pool(block_candidates(space.blocks, n, space.workload.context, pos=pos), mt, st, req,
                       IDEAL if space.ideal else None)


def served_decode(space: Space, t: DisaggregatedTables, i: int, rate: float) -> dict:
    """TPOT of decode pair ``i`` of ``t`` at the batch a decode replica serving ``rate`` requests/s holds, up to the
    pair's batch (`served_pair`).
    """
    return served_pair(space, space.blocks, int(t.dpos[i]), int(t.dn[i]), rate, t.req, decode=True)


@dataclass
class PrefillOptions:
    """Every prefill configuration of a space: each distinct (system, layout, formats) block, without and with
    context parallelism, at the highest utilisation its TTFT target allows (`rho_for_ttft`).

    ``pos`` indexes ``space.blocks`` (KV-tier variants of a layout are one prefill configuration: the prefill
    holds its prompt's KV in HBM), ``cp`` says whether the prompt is split over the DP ranks.
    """

    pos: np.ndarray
    cp: np.ndarray
    metrics: dict[str, np.ndarray]
    rho: np.ndarray
    ok: np.ndarray  # fits and meets the TTFT target (rho is a number)
    fits: np.ndarray

    @property
    def usd_per_request(self) -> np.ndarray:
        """Prefill cost per request: USD per prompt at full utilisation over the planned utilisation."""
        return self.metrics["usd_per_prompt"] / self.rho

    @property
    def chip_s_per_request(self) -> np.ndarray:
        return self.metrics["chip_s_per_prompt"] / self.rho


def prefill_options(space: Space, req: Request, context_parallel: tuple[bool, ...] = (False, True)) -> PrefillOptions:
    """Evaluate every prefill configuration of the space (`dse.physics.serving.prefill_pool`)."""
    b = space.blocks
    layout = ["system_idx", "tp", "dp", "ep", "etp", "pp", "wd", "kd"]
    first = np.flatnonzero(~b.duplicated(layout))
    cps = [cp for cp in dict.fromkeys(context_parallel)]
    pos = np.concatenate([first] * len(cps)) if len(first) else np.zeros(0, dtype=np.int64)
    cp = np.repeat(np.array(cps, dtype=bool), len(first))
    if not len(pos):
        empty = {k: np.zeros(0) for k in PREFILL_KEYS}
        return PrefillOptions(pos, cp, empty, np.zeros(0), np.zeros(0, dtype=bool), np.zeros(0, dtype=bool))
    mt, st = space.tables()
    req = space.served(req)
    sub = b.take(pos)
    r = prefill_pool(block_candidates(sub, np.ones(len(pos)), req.prompt), mt, st, req, cp,
                     IDEAL if space.ideal else None)
    metrics = {k: np.asarray(r[k], dtype=np.float64) for k in PREFILL_KEYS}
    rho = rho_for_ttft(metrics["prefill_service_s"], metrics["kv_transfer_s"], metrics["stack_latency_s"], req)
    ok = r["fits"] & np.isfinite(rho) & (rho > 0)
    return PrefillOptions(pos, cp, metrics, rho, ok, np.asarray(r["fits"], dtype=bool))


def judged_prefill(space: Space, pre: PrefillOptions, margins: Margins) -> PrefillOptions:
    """The prefill options at the highest utilisation whose TTFT times its system's margin meets the targets (the
    same evaluations, another utilisation).
    """
    w = space.workload
    if w.ttft_max is None and not w.ttft_quantile_max:
        return pre
    pm = pre.metrics
    rho = rho_for_ttft(pm["prefill_service_s"], pm["kv_transfer_s"], pm["stack_latency_s"], w,
                       per_pair(margins, space, pre.pos)[2])
    return replace(pre, rho=rho, ok=pre.fits & np.isfinite(rho) & (rho > 0))


def numerics_group(space: Space, pos: np.ndarray) -> np.ndarray:
    """The pairing group of blocks: both pools of a deployment must share it. Its numerics (weights format, KV
    format and, for an FP8 KV cache, its encoding: `System.kv_fp8`; the same checkpoint computes both phases, and
    the KV crosses without conversion) and, unless the space allows mixed vendors (``space.mixed_vendors``), the
    system's vendor: serving frameworks hand the KV cache between GPUs of one vendor's stack (NVIDIA generations mix,
    NVIDIA and AMD do not). A vendor's code is its rank among the catalog's vendors, so groups of spaces over
    different systems (a fleet's, one per system) compare.
    """
    b = space.blocks
    si = b["system_idx"][pos].astype(np.int64)
    kd = b["kd"][pos]
    fnuz = np.array([s.kv_fp8 != FP8_ENCODINGS[0] for s in space.systems], dtype=np.int64)
    encoding = np.where(kd == DTYPES.index("fp8"), fnuz[si], 0)
    group = (b["wd"][pos] * 16 + kd) * 2 + encoding
    if space.mixed_vendors:
        return group
    vendors = sorted({s.vendor for s in default_systems().values()} | {s.vendor for s in space.systems})
    code = np.array([vendors.index(s.vendor) for s in space.systems], dtype=np.int64)
    return group * len(vendors) + code[si]


def best_prefill(space: Space, pre: PrefillOptions, score: np.ndarray) -> dict[int, int]:
    """Per numerics group, the prefill option with the least ``score`` among those that are ``ok``."""
    g = numerics_group(space, pre.pos)
    out: dict[int, int] = {}
    s = np.where(pre.ok, score, np.inf)
    for key in np.unique(g):
        idx = np.flatnonzero(g == key)
        i = idx[int(np.argmin(s[idx]))]
        if np.isfinite(s[i]):
            out[int(key)] = int(i)
    return out


def prefill_of(bestp: dict[int, int], groups: np.ndarray) -> np.ndarray:
    """The prefill option ``bestp`` names for each numerics group in ``groups`` (-1 where it names none)."""
    table = np.full(max([*bestp, int(groups.max(initial=0))]) + 1, -1, dtype=np.int64)
    for g, j in bestp.items():
        table[g] = j
    return table[groups]


@dataclass
class DisaggregatedResult:
    """The cheapest disaggregated deployment of one workload: a decode configuration and a prefill one."""

    result: SolveResult
    decode: Choice
    prefill_block: int
    context_parallel: bool
    metrics: dict
    """The search's figures: the pools at their fluid ratio (``prefill_replicas`` prefill replicas per decode
    replica), per decode replica."""
    pools: list[dict]
    binding: str
    stats: dict = field(default_factory=dict)
    deployed: dict = field(default_factory=dict)
    """The whole deployment of ``pools`` as deployed (`disaggregated_deployed`)."""
    whole: bool = False
    """Chosen among whole deployments (a budget or a demand): ``deployed`` is what it was judged on."""


def unit_replicas(ratio: float, within: float = 0.05, largest: int = 1000) -> tuple[int, int]:
    """The smallest whole deployment (prefill replicas, decode replicas) whose prefill share is within
    ``within`` of the fluid ratio (prefill replicas per decode replica) while covering it.
    """
    p, d = unit_replicas_many(np.array([ratio]), within, largest)
    return int(p[0]), int(d[0])


def unit_replicas_many(ratio: np.ndarray, within: float = 0.05, largest: int = 1000) -> tuple[np.ndarray, np.ndarray]:
    """`unit_replicas` of each ratio: the fewest decode replicas d (up to ``largest``) whose p = ceil(ratio d)
    prefill replicas are within ``within`` of ratio d; where none is, the (p, d) of least p / d.
    """
    ratio = np.asarray(ratio, dtype=np.float64)
    best_p, best_d = np.maximum(1, np.ceil(ratio)).astype(np.int64), np.ones(len(ratio), dtype=np.int64)
    found = np.zeros(len(ratio), dtype=bool)
    for d in range(1, largest + 1):
        p = np.maximum(1, np.ceil(ratio * d * (1 - 1e-12))).astype(np.int64)
        hit = ~found & (p / (ratio * d) <= 1 + within)
        closer = ~found & ~hit & (p * best_d < best_p * d)
        best_p, best_d = np.where(hit | closer, p, best_p), np.where(hit | closer, d, best_d)
        found |= hit
        if found.all():
            break
    return best_p, best_d


def pair_pools(space: Space, req: Request, i: np.ndarray, dpos: np.ndarray, dn: np.ndarray, pre: PrefillOptions,
               j: np.ndarray) -> tuple[dict, dict, Request]:
    """The decode pools of pairs ``i`` and the prefill pools of options ``j`` (`dse.physics.serving.decode_pool`,
    `prefill_pool`), evaluated together, and the request they serve (reporting every quantile): what
    `pair_metrics` combines at any prefill utilisation.
    """
    mt, st = space.tables()
    eff = IDEAL if space.ideal else None
    b = space.blocks
    req = replace(space.served(req), report_quantiles=QUANTILES)  # the answer reports every quantile
    dec = decode_replicas(space, req, dpos[i], dn[i])
    pr = prefill_pool(block_candidates(b, np.ones(len(j)), req.prompt, pos=pre.pos[j]), mt, st, req, pre.cp[j], eff)
    return dec, pr, req


def pair_metrics(dec: dict, pr: dict, req: Request, rho: np.ndarray) -> list[dict]:
    """Request-level metrics of each (decode pool, prefill pool) of `pair_pools` through
    `dse.physics.serving.disaggregated`, the prefill pool at utilisation ``rho`` (one per pair): a dict of floats
    per pair.
    """
    m = disaggregated(dec, pr, req, rho)
    flat = {k: np.asarray(v).ravel() for k, v in m.items()
            if k != "serving" and (np.ndim(v) or isinstance(v, (float, int, np.number)))}
    other = {k: v for k, v in m.items() if k != "serving" and k not in flat}
    return [{k: (float(v[r if v.size > 1 else 0]) if k in flat else v) for k, v in {**flat, **other}.items()}
            for r in range(len(rho))]


@dataclass
class DisaggregatedTables:
    """The decode pairs of a space that any question asked of it can choose, and every prefill option.

    Every (block, n) pair is evaluated once, streamed; per block are kept the pairs that are the answer to some
    question a mask over blocks can ask: its cheapest feasible decode pair per request (a block's USD/s is one
    figure, so this is also the pair serving the most requests/s, what a whole decode pool for a budget or a
    demand takes), its highest feasible request rate and its fastest pair that fits (for the diagnosis). Each is
    the first of its block in batch order, so an argmin over the kept pairs equals the argmin over all of them.
    ``dm['tpot_next_s']`` is the TPOT at one more sequence per rank (what binds).
    """

    req: Request
    dpos: np.ndarray
    dn: np.ndarray
    dm: dict[str, np.ndarray]
    dok: np.ndarray  # fits and meets the TPOT target
    pre: PrefillOptions
    evaluated: int = 0  # decode pairs evaluated
    margins: Margins | None = None  # the robust search's (None: judged as predicted)
    judged_pre: PrefillOptions | None = None  # with margins: the prefill options at the tightened TTFT targets

    @property
    def searched_pre(self) -> PrefillOptions:
        """The prefill options the searches choose from: ``judged_pre`` with margins, else ``pre`` (which stays
        as predicted: the fronts pair decode pairs with it).
        """
        return self.pre if self.judged_pre is None else self.judged_pre


def disaggregated_tables(space: Space, req: Request | None = None, context_parallel: tuple[bool, ...] = (False, True),
                         max_pairs: int | None = None, margins: Margins | None = None) -> DisaggregatedTables:
    """Evaluate every decode pair (streamed, reduced per block) and every prefill option of the space; with
    ``margins``, each judged at the unfavourable end of its band (`Margins`).
    """
    req = req or space.workload
    kept: list[tuple[np.ndarray, np.ndarray, dict]] = []
    evaluated = 0
    for pos, n, m in decode_chunks(space, req, max_pairs, margins=margins):
        evaluated += len(pos)
        ok = m["ok"]
        picks = [first_min_per_block(pos, np.where(ok, m["usd_per_request"], np.inf)),
                 first_min_per_block(pos, np.where(ok, -m["requests_per_s"], np.inf)),
                 first_min_per_block(pos, np.where(m["fits"], m["tpot_s"], np.inf))]
        sel = np.unique(np.concatenate(picks))
        same = has_next(pos, sel)
        tpot_next = np.where(same, m["tpot_s"][np.minimum(sel + 1, len(pos) - 1)], np.nan)
        m = {k: v[sel] for k, v in m.items()}
        m["tpot_next_s"] = tpot_next
        kept.append((pos[sel], n[sel], m))
    if kept:
        dpos = np.concatenate([k[0] for k in kept])
        dn = np.concatenate([k[1] for k in kept])
        dm = {k: np.concatenate([c[2][k] for c in kept]) for k in kept[0][2]}
    else:
        dpos, dn = np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
        dm = {k: np.zeros(0) for k in (*DECODE_KEYS, "tpot_next_s")}
        dm["fits"] = dm["ok"] = np.zeros(0, dtype=bool)
    dok = dm.pop("ok")
    pre = prefill_options(space, req, context_parallel)
    return DisaggregatedTables(req, dpos, dn, dm, dok, pre, evaluated, margins,
                               None if margins is None else judged_prefill(space, pre, margins))


def solve_disaggregated(space: Space, req: Request | None = None,
                        context_parallel: tuple[bool, ...] = (False, True)) -> DisaggregatedResult:
    """The disaggregated deployment with the least USD per request meeting the targets, exactly.

    Why the argmin of each pool is exact. At the fluid pool ratio, USD per request = decode USD per request
    (a decode replica's USD/s over its request rate) + prefill USD per request (a prefill replica's USD/s
    x its service time / servers / rho). The decode term and the TPOT depend on the decode configuration
    alone; the prefill term and the TTFT (service + M/D/1 wait at rho + KV transfer) on the prefill
    configuration alone; memory is checked per pool. The only coupling is the pairing group: both pools use
    the same weights and KV formats, on one vendor's hardware (`numerics_group`). So, per group, the optimum is
    the cheapest feasible decode pair (every integer batch of every block) plus the cheapest feasible prefill option
    (every block, with and without context parallelism, at the highest utilisation the TTFT target
    allows: the prefill cost falls as 1/rho), and the answer is the best group. `tests/test_disaggregated.py`
    checks it against a brute force over every (prefill option, decode pair) combination.
    """
    t0 = time.perf_counter()
    if space.blocks.empty:
        raise InfeasibleError(f"{space.model.id} / {space.workload.name}: {space.empty_reason}")
    return pick_disaggregated(space, disaggregated_tables(space, req, context_parallel), t0=t0)


def pick_disaggregated(space: Space, t: DisaggregatedTables, mask: np.ndarray | None = None,
                       t0: float | None = None) -> DisaggregatedResult:
    """The cheapest (decode pair, prefill option) whose blocks lie where ``mask`` (over ``space.blocks``) holds."""
    return ranked_disaggregated(space, t, 1, mask, t0)[0]


def ranked_disaggregated(space: Space, t: DisaggregatedTables, top: int, mask: np.ndarray | None = None,
                         t0: float | None = None) -> list[DisaggregatedResult]:
    """The ``top`` cheapest (decode pair, prefill option) combinations of one numerics group each, whose blocks
    lie where ``mask`` holds, cheapest first (the decode term plus the prefill term, each judged at its margin;
    equal sums by lower TPOT, lower TTFT at the planned utilisation, fewer chips in the smallest whole deployment:
    `tie_order`). Per group the ``top`` best of a sum lie among the ``top`` best of each term (the decode term by
    its cost, TPOT and chips, the prefill term by its cost, TTFT and chips), so only those are paired.
    """
    t0 = time.perf_counter() if t0 is None else t0
    pre = t.searched_pre
    dok, pok = t.dok, pre.ok
    if mask is not None:
        dok = dok & mask[t.dpos]
        pok = pok & mask[pre.pos]
    dec_usd = np.where(dok, t.dm["usd_per_request"] * per_pair(t.margins, space, t.dpos)[0], np.inf)
    pre_usd = np.where(pok, pre.usd_per_request * per_pair(t.margins, space, pre.pos)[0], np.inf)
    dg, pg = numerics_group(space, t.dpos), numerics_group(space, pre.pos)
    tpot = t.dm["tpot_s"]
    ttft = prefill_ttft(pre.metrics["prefill_service_s"], pre.metrics["kv_transfer_s"], pre.metrics["stack_latency_s"],
                        pre.rho, space.served(t.req))
    dchips, pchips = t.dm["chips"], pre.metrics["chips"]
    di_all, pj_all = [], []
    for g in np.intersect1d(dg[np.isfinite(dec_usd)], pg[np.isfinite(pre_usd)]):
        # per term, its ``top`` best by (cost, its own tie keys): the ``top`` best sums lie among them
        di = np.flatnonzero(dg == g)
        pj = np.flatnonzero(pg == g)
        di = di[tie_order(dec_usd[di], tpot[di], np.zeros(len(di)), dchips[di])[:top]]
        pj = pj[tie_order(pre_usd[pj], np.zeros(len(pj)), ttft[pj], pchips[pj])[:top]]
        di_all.append(np.repeat(di, len(pj)))
        pj_all.append(np.tile(pj, len(di)))
    if not di_all:
        raise InfeasibleError(diagnose_disaggregated(space, t, mask))
    i, j = np.concatenate(di_all), np.concatenate(pj_all)
    total = dec_usd[i] + pre_usd[j]
    # the whole deployment each is reported as (`unit_replicas`): its chips
    ratio = t.dm["requests_per_s"][i] / prefill_capacity(pre, j)
    p, d = unit_replicas_many(ratio)
    order = tie_order(total, tpot[i], ttft[j], p * pchips[j] + d * dchips[i])[:top]
    res = [SolveResult("optimal", "argmin", float(total[k]), float(total[k]), 0.0, time.perf_counter() - t0,
                       SOLVER_NAME) for k in order]
    return disaggregated_results(space, t, i[order], j[order], res)


def disaggregated_results(space: Space, t: DisaggregatedTables, i: np.ndarray, j: np.ndarray,
                          res: list[SolveResult], replicas: list[tuple[int, int]] | None = None,
                          demand: float | None = None, whole: bool = False) -> list[DisaggregatedResult]:
    """The results of decode pairs ``i`` (of the tables) with prefill options ``j`` (of ``t.searched_pre``), their
    pools evaluated together (`pair_pools`): each one's figures at the fluid pool ratio, and its ``replicas``
    (prefill, decode; default: the smallest whole deployment within 5% of the fluid ratio) as deployed, serving
    ``demand`` output tokens/s when given, else their capacity.
    """
    w, pre, b = space.workload, t.searched_pre, space.blocks
    i, j = np.asarray(i, dtype=np.int64), np.asarray(j, dtype=np.int64)
    dec, pr, req = pair_pools(space, t.req, i, t.dpos, t.dn, pre, j)
    fluid = pair_metrics(dec, pr, req, pre.rho[j])
    units = replicas or [unit_replicas(m["prefill_replicas"]) for m in fluid]
    rates = [deployed_rate(space, t, int(jk), m, p, d, demand) for jk, m, (p, d) in zip(j, fluid, units, strict=True)]
    service, servers = pre.metrics["prefill_service_s"][j], pre.metrics["servers"][j]
    rho = np.array([rate * service[k] / (units[k][0] * servers[k]) for k, rate in enumerate(rates)])
    at_rho = pair_metrics(dec, pr, req, rho)
    index, n_hi = b.index, b["n_hi"]
    cap = int(space.stats.get("max_batch_per_rank", 0)) or None
    out = []
    for k, (ik, jk) in enumerate(zip(i.tolist(), j.tolist(), strict=True)):
        metrics, (p, d) = fluid[k], units[k]
        block, n = int(index[t.dpos[ik]]), int(t.dn[ik])
        choice = Choice(block, n, metrics["tpot_s"], metrics["usd_per_request"])
        served = served_decode(space, t, ik, rates[k] / d) if spare(rates[k], d, metrics) else None
        deployed = disaggregated_deployed(space, t, ik, jk, metrics, at_rho[k], rates[k], p, d, served)
        pools = deployment_pools(space, choice, int(index[pre.pos[jk]]), bool(pre.cp[jk]), deployed, p, d)
        hi = int(n_hi[t.dpos[ik]])
        nxt = None
        if n < hi:
            tpot_m = per_pair(t.margins, space, t.dpos[ik:ik + 1])[1]
            tpot_next = t.dm["tpot_next_s"][ik] * float(np.ravel(tpot_m)[0])
            nxt = {key: tpot_next for key, _, _ in targets(w) if key.startswith("tpot")}  # a decode pass: one TPOT
        out.append(DisaggregatedResult(res[k], choice, int(index[pre.pos[jk]]), bool(pre.cp[jk]), metrics, pools,
                                       _binding(n, hi, cap, nxt, w, t.margins is not None),
                                       {"decode_pairs_evaluated": t.evaluated, "prefill_options": len(pre.pos)},
                                       deployed, whole))
    return out


def prefill_capacity(pre: PrefillOptions, j: int | np.ndarray) -> np.ndarray | float:
    """Requests/s one prefill replica of option ``j`` serves at its planned utilisation: servers x rho / service."""
    return pre.metrics["servers"][j] * pre.rho[j] / pre.metrics["prefill_service_s"][j]


def deployed_rate(space: Space, t: DisaggregatedTables, j: int, fluid: dict, p: int, d: int,
                  demand: float | None = None) -> float:
    """Requests/s ``p`` prefill replicas of option ``j`` and ``d`` decode replicas (``fluid``: their metrics at the
    fluid ratio) serve: ``demand`` (output tokens/s) when given, else their capacity R = min(p a, d lambda).
    """
    if demand is not None:
        return demand / space.workload.output
    return min(p * prefill_capacity(t.searched_pre, j), d * fluid["requests_per_s"])


def disaggregated_deployed(space: Space, t: DisaggregatedTables, i: int, j: int, fluid: dict, m: dict, rate: float,
                           p: int, d: int, served: dict | None = None) -> dict:
    """``p`` prefill replicas of option ``j`` and ``d`` decode replicas of pair ``i`` (``fluid``: their metrics at
    the fluid ratio) serving ``rate`` requests/s (`deployed_rate`), costed as deployed: every chip's USD/s over the
    requests served (each pool's idle share included), input the prefill pool's cost, output the decode pool's.
    The prefill pool runs at utilisation R S / (p servers), at most its planned one, and ``m`` are the pair's
    metrics there (`pair_metrics`: TTFT is the physics' at that utilisation); TPOT is the decode pool's at the
    batch each decode replica serves (``served``: `served_decode`, where the decode pool has capacity to spare),
    else at its planned batch.
    """
    req, pre = space.workload, t.searched_pre
    m = dict(m)
    b = space.blocks
    pre_sys, dec_sys = (space.systems[int(b["system_idx"][k])] for k in (pre.pos[j], t.dpos[i]))
    pre_chips, dec_chips = int(pre.metrics["chips"][j]), int(b["chips"][t.dpos[i]])
    usd_pre = p * pre.metrics["usd_per_s"][j]
    usd = usd_pre + d * t.dm["usd_per_s"][i]
    gpus = p * pre_chips + d * dec_chips
    m.update({**cost_keys(usd, rate, usd_pre / usd, req.prompt, req.output), "chips": gpus,
              "power_w": p * pre_chips * pre_sys.power_all_in_w + d * dec_chips * dec_sys.power_all_in_w,
              "requests_per_s": rate, "usd_per_s": usd, "tokens_per_s_per_gpu": rate * req.output / gpus,
              "prefill_replicas": p, "decode_replicas": d})
    tpot = (served or fluid)["tpot_s"]
    # a decode pass carries no prefill: every request's TPOT is the pass's, its quantiles the mean
    m.update({k: tpot for k in m if k.startswith("tpot_")}, tpot_s=tpot, tokens_per_s_per_user=1.0 / tpot)
    m.update({k: served[k] for k in ("batch_served", "served_edges") if k in (served or {})})
    return m


def deployment_pools(space: Space, decode: Choice, prefill_block: int, cp: bool, deployed: dict, p: int,
                     d: int) -> list[dict]:
    """The two pools of a disaggregated deployment as the output contract lists them: ``p`` prefill replicas (at
    the utilisation ``deployed`` states) and ``d`` decode replicas.
    """
    dec = describe_choice(space, decode)
    pre = describe_choice(space, Choice(prefill_block, 1, math.nan, math.nan))
    pre.update(batch=pre["dp"] if not cp else 1, context=space.workload.prompt, kv_tier="hbm")
    keys = ("system", "chips", "racks", "tp", "ep", "pp", "dp", "batch", "weights_dtype", "kv_dtype", "kv_tier")
    return [{"role": "prefill", "replicas": p, "context_parallel": cp, "utilisation": deployed["prefill_rho"],
             **{k: pre[k] for k in keys}},
            {"role": "decode", "replicas": d, **{k: dec[k] for k in keys},
             **{k: deployed[k] for k in ("batch_served",) if k in deployed}}]


def diagnose_disaggregated(space: Space, t: DisaggregatedTables, mask: np.ndarray | None = None) -> str:
    """Which pool runs out, and of what, when no disaggregated deployment is feasible."""
    w, pre = space.workload, t.searched_pre
    dfit = t.dm["fits"] if mask is None else t.dm["fits"] & mask[t.dpos]
    dok = t.dok if mask is None else t.dok & mask[t.dpos]
    pin = np.ones(len(pre.pos), dtype=bool) if mask is None else mask[pre.pos]
    head = (f"no feasible disaggregated deployment for {space.model.id} / {w.name} (prompt {w.prompt:,}, output "
            f"{w.output:,} tokens)")
    if not dfit.any():
        return diagnose(space if mask is None else subset(space, mask), w.tpot_max)
    edge = ", at the high end of its error band" if t.margins is not None else ""
    if not dok.any():
        tpot = t.dm["tpot_s"] * per_pair(t.margins, space, t.dpos)[1]
        tp = float(np.min(np.where(dfit, tpot, np.inf)))
        return (f"{head}: the TPOT target runs out in the decode pool. The fastest decode TPOT{edge} is "
                f"{tp * 1e3:.3g} ms, {(tp - (w.tpot_max or 0)) * 1e3:.3g} ms over the {(w.tpot_max or 0) * 1e3:g} ms "
                "target")
    if not (pre.ok & pin).any() and w.ttft_max is not None:
        tt = ((pre.metrics["prefill_service_s"] + pre.metrics["kv_transfer_s"])
              * per_pair(t.margins, space, pre.pos)[2])
        tt = np.where(pin & pre.fits, tt, np.inf)
        k = int(np.argmin(tt))
        if np.isfinite(tt[k]):
            return (f"{head}: the TTFT target runs out in the prefill pool. The fastest prefill plus KV transfer{edge} "
                    f"({space.blocks['system'][pre.pos[k]]}, {int(pre.metrics['chips'][k])} chips"
                    f"{', context parallel' if pre.cp[k] else ''}) takes {tt[k]:.3g} s with no queue, "
                    f"{tt[k] - w.ttft_max:.3g} s over the {w.ttft_max:g} s target")
    return (f"{head}: HBM capacity runs out in the prefill pool (no layout holds one {w.prompt:,}-token prompt's KV "
            "and activations) or no prefill layout shares a (weights, KV) format and a vendor (unless "
            "space.mixed_vendors) with a feasible decode layout")


def solve_cheapest(space: Space, modes: tuple[str, ...] = ("aggregated", "disaggregated"),
                   req: Request | None = None) -> tuple[str, RequestResult | DisaggregatedResult]:
    """The cheapest deployment per request over the given modes (each exact): (mode, its result). When no mode
    is feasible, InfeasibleError joins each mode's reason.
    """
    found, reasons = [], []
    for mode in modes:
        try:
            r = solve_requests(space, req) if mode == "aggregated" else solve_disaggregated(space, req)
        except InfeasibleError as exc:
            reasons.append(f"{mode}: {exc}")
        else:
            found.append((mode, r))
    if not found:
        raise InfeasibleError("; ".join(reasons))
    return found[int(best_result([r for _, r in found])[0])]


def result_ties(results: list) -> tuple[np.ndarray, ...]:
    """The objective and the tie keys (`dse.optimize.ties`) of results as each reports itself: USD per request,
    TPOT, TTFT and GPUs, as deployed for a whole deployment, else at the fluid ratio (the GPUs of the smallest
    whole deployment).
    """
    fig = [r.deployed if r.whole else r.metrics for r in results]
    return (np.array([f["usd_per_request"] for f in fig]), np.array([f["tpot_s"] for f in fig]),
            np.array([f["ttft_s"] for f in fig]), np.array([r.deployed["chips"] for r in results], dtype=float))


def best_result(results: list, cost: np.ndarray | None = None) -> np.ndarray:
    """Indices of ``results`` (of any mode) best first: by ``cost`` (default their USD per request, `result_ties`),
    equal costs by lower TPOT, lower TTFT and fewer GPUs (`tie_order`).
    """
    own, tpot, ttft, chips = result_ties(results)
    return tie_order(own if cost is None else cost, tpot, ttft, chips)
