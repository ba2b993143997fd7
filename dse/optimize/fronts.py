"""Exact, complete Pareto fronts of a serving space, from every (block, batch) pair.

Two fronts, on the axes serving engineers read:

- ``cost``: USD per request against TPOT (both minimized);
- ``throughput``: output tokens/s per GPU against tokens/s per user = 1 / TPOT (both maximized), i.e.
  chip-seconds per output token against TPOT (both minimized).

Candidates are every feasible configuration of the space: each aggregated (block, n) pair that fits,
keeps up with its prefill and meets the workload's TTFT (and TPOT, when given) targets; and each
disaggregated decode pair that fits and meets the TPOT target, combined with the prefill option of
its (weights, KV) format group that is best on the front's own second axis (cheapest per request,
or fewest chip-seconds per request). That pairing loses no front point: at a given decode pair
the TPOT is fixed and the second axis is the decode term plus the prefill term, so any other
prefill option gives a dominated point. A point is on the front when no candidate is at least as
good on both axes and better on one; equal points are reported once. The front is the whole
non-dominated set (no sampling of TPOT targets), computed by one sort: by TPOT, then by the second
axis, keeping each point that improves on every point before it; the candidates are streamed in chunks
of whole blocks, each reduced to its own front as it comes, so memory does not grow with the space.
`tests/test_fronts.py` checks it against the non-dominated set of an independent enumeration.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pandas as pd

from dse.catalog.units import DTYPES
from dse.optimize.requests import (
    DisaggregatedTables,
    PrefillOptions,
    best_prefill,
    decode_chunks,
    evaluate_pairs,
    feasible_mask,
    numerics_group,
    prefill_of,
    unit_replicas_many,
)
from dse.optimize.space import Space, chunk_size, pair_chunks
from dse.physics.codes import KV_TIERS
from dse.physics.serving import Request, prefill_ttft

OBJECTIVES = ("cost", "throughput")


def non_dominated(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Indices of the points no other point weakly dominates (both minimized; one of each equal pair kept),
    in increasing x.
    """
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    ok = np.flatnonzero(np.isfinite(x) & np.isfinite(y))
    order = ok[np.lexsort((y[ok], x[ok]))]
    if not len(order):
        return order
    ys = y[order]
    best_before = np.minimum.accumulate(np.concatenate(([np.inf], ys[:-1])))
    return order[ys < best_before]


COLUMNS = ("serving", "pos", "n", "prefill", "tpot_s", "ttft_s", "usd_per_request", "chips", "pool_ratio",
           "prefill_chips", "prefill_usd_per_request", "chip_s_per_token")


def candidate_chunks(space: Space, req: Request, aggregated: bool, dis: DisaggregatedTables | PrefillOptions | None,
                     objective: str, only: np.ndarray | None = None, max_pairs: int | None = None
                     ) -> Iterator[pd.DataFrame]:
    """Every feasible configuration of the space (of the blocks at positions ``only``, when given) as rows, in
    chunks of whole blocks: serving, block position, n, prefill option (-1 for aggregated), TPOT, TTFT, USD per
    request (at the fluid pool ratio), chips per decode-or-aggregated replica, the fluid pool ratio (prefill
    replicas per decode replica; 0 aggregated), a prefill replica's chips, the prefill term of the USD per request,
    chip-seconds per output token and the deployment's tokens/s per GPU. Aggregated rows come first, then
    disaggregated ones (when ``dis`` gives the prefill options), each block by block and n ascending.
    """
    w = space.workload
    b = space.blocks
    if aggregated and not b.empty:
        for pos, n in pair_chunks(b, max_pairs, only):
            m = evaluate_pairs(space, b, pos, n, req)
            ok = feasible_mask(m, w)
            chips = b["chips"][pos]
            chip_s = chips / (m["requests_per_s"] * req.output)
            yield _rows(pd.DataFrame({
                "serving": "aggregated", "pos": pos[ok], "n": n[ok], "prefill": -1, "tpot_s": m["tpot_s"][ok],
                "ttft_s": m["ttft_s"][ok], "usd_per_request": m["usd_per_request"][ok], "chips": chips[ok],
                "pool_ratio": 0.0, "prefill_chips": 0, "prefill_usd_per_request": 0.0,
                "chip_s_per_token": chip_s[ok]}))
    if dis is not None and not b.empty:
        pre = dis.pre if isinstance(dis, DisaggregatedTables) else dis
        pre_usd, pre_chip_s = pre.usd_per_request, pre.chip_s_per_request
        bestp = best_prefill(space, pre, pre_usd if objective == "cost" else pre_chip_s)
        pm = pre.metrics
        ttft = prefill_ttft(pm["prefill_service_s"], pm["kv_transfer_s"], pm["stack_latency_s"], pre.rho,
                            space.served(req))
        for pos, n, dm in decode_chunks(space, req, max_pairs, only):
            j = prefill_of(bestp, numerics_group(space, pos))
            ok = dm["ok"] & (j >= 0)
            j_ok = j[ok]
            dm = {k: v[ok] for k, v in dm.items()}
            lam = dm["requests_per_s"]
            ratio = lam * pre.metrics["prefill_service_s"][j_ok] / (pre.metrics["servers"][j_ok] * pre.rho[j_ok])
            yield _rows(pd.DataFrame({
                "serving": "disaggregated", "pos": pos[ok], "n": n[ok], "prefill": j_ok, "tpot_s": dm["tpot_s"],
                "ttft_s": ttft[j_ok], "usd_per_request": dm["usd_per_request"] + pre_usd[j_ok],
                "chips": dm["chips"].astype(np.int64), "pool_ratio": ratio,
                "prefill_chips": pre.metrics["chips"][j_ok].astype(np.int64), "prefill_usd_per_request": pre_usd[j_ok],
                "chip_s_per_token": (dm["chips"] / lam + pre_chip_s[j_ok]) / req.output}))


def _rows(c: pd.DataFrame) -> pd.DataFrame:
    c["tokens_per_s_per_gpu"] = 1.0 / c["chip_s_per_token"]
    c["tokens_per_s_per_user"] = 1.0 / c["tpot_s"]
    return c


def _front_of(c: pd.DataFrame, objective: str) -> pd.DataFrame:
    y = c["usd_per_request"] if objective == "cost" else c["chip_s_per_token"]
    return c.iloc[non_dominated(c["tpot_s"].to_numpy(), y.to_numpy())]


def front(space: Space, req: Request, aggregated: bool, dis: DisaggregatedTables | PrefillOptions | None,
          objective: str = "cost", max_pairs: int | None = None) -> pd.DataFrame:
    """The complete front of ``objective`` over the space's feasible configurations, in increasing TPOT.

    The candidates are streamed in chunks of whole blocks; each chunk is reduced to its own front before the next
    is evaluated (a point off a chunk's front is off the whole front), and the fronts kept are merged whenever
    they hold more than ``max_pairs`` points, so memory stays bounded by the chunk size and the front itself.
    """
    if objective not in OBJECTIVES:
        raise ValueError(f"objective must be one of {OBJECTIVES}, got {objective!r}")
    kept: list[pd.DataFrame] = []
    held = count = 0
    for c in candidate_chunks(space, req, aggregated, dis, objective, max_pairs=max_pairs):
        count += len(c)
        kept.append(_front_of(c, objective))
        held += len(kept[-1])
        if held > chunk_size(max_pairs):
            kept = [_front_of(pd.concat(kept, ignore_index=True), objective)]
            held = len(kept[0])
    if kept:
        f = _front_of(pd.concat(kept, ignore_index=True), objective).reset_index(drop=True)
    else:
        f = _rows(pd.DataFrame({k: np.zeros(0) for k in COLUMNS}))
    f.attrs["candidates"] = count
    return f


def describe_points(space: Space, f: pd.DataFrame, pre: PrefillOptions | None = None) -> pd.DataFrame:
    """The configuration of each front point, keyed as the output contract names it (vectorized
    `describe_choice`): the aggregated replica's or the decode pool's layout, and for disaggregated points
    the prefill pool's system and layout as ``prefill_*`` (``pre``: the prefill options the points index).
    """
    b = space.blocks
    rows = b.take(f["pos"].to_numpy())
    out = pd.DataFrame({
        "serving": f["serving"].to_numpy(),
        "system": [space.systems[i].id for i in rows["system_idx"]],
        "replica_chips": rows["chips"], "tp": rows["tp"], "ep": rows["ep"],
        "pp": rows["pp"], "dp": rows["dp"], "batch": rows["dp"] * f["n"].to_numpy(),
        "weights_dtype": [DTYPES[int(i)] for i in rows["wd"]], "kv_dtype": [DTYPES[int(i)] for i in rows["kd"]],
        "kv_tier": [KV_TIERS[int(i)] for i in rows["tier"]],
    })
    if pre is not None and (f["prefill"] >= 0).any():
        j = f["prefill"].to_numpy()
        has = j >= 0
        pr = b.take(pre.pos[np.where(has, j, 0)])
        out["prefill_context_parallel"] = has & pre.cp[np.where(has, j, 0)]
        out["prefill_system"] = np.where(has, [space.systems[i].id for i in pr["system_idx"]], "")
        for key in ("chips", "tp", "ep", "dp"):
            out["prefill_" + key] = np.where(has, pr[key], 0)
    return out


def smallest_whole(f: pd.DataFrame, pre: PrefillOptions | None = None, req: Request | None = None) -> pd.DataFrame:
    """Each point's smallest whole deployment (`unit_replicas_many`; aggregated: one replica) as deployed:
    ``prefill_replicas``, ``decode_replicas``, ``chips`` (its GPUs in total), ``usd_per_request`` (every chip's
    USD/s over the requests its decode replicas serve, the prefill pool's idle share included),
    ``tokens_per_s_per_gpu`` (those requests' output tokens/s over its GPUs) and ``ttft_s`` (aggregated: the
    point's; disaggregated, from the prefill options the points index, ``pre``, and the request: the prefill pool at
    the utilisation it runs at as deployed, the planned one x the fluid ratio x d / p, at most the planned one);
    beside them the point's own figures at the fluid pool ratio, ``usd_per_request_fluid`` and
    ``tokens_per_s_per_gpu_fluid`` (what the fronts are over).
    """
    ratio = f["pool_ratio"].to_numpy(dtype=float)
    dis = ratio > 0
    p, d = unit_replicas_many(np.where(dis, ratio, 1.0))
    p, d = np.where(dis, p, 0), np.where(dis, d, 1)
    fluid = f["usd_per_request"].to_numpy(dtype=float)
    pre_usd = f["prefill_usd_per_request"].to_numpy(dtype=float)
    chips, pre_chips = f["chips"].to_numpy(dtype=np.int64), f["prefill_chips"].to_numpy(dtype=np.int64)
    whole = p * pre_chips + d * chips
    tok_fluid = f["tokens_per_s_per_gpu"].to_numpy(dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        deployed = np.where(dis, fluid + pre_usd * (p / (d * ratio) - 1.0), fluid)
        # the decode replicas' output tokens/s (tokens/s per GPU at the fluid ratio x its GPUs per decode replica)
        tok = tok_fluid * (chips + ratio * pre_chips) * d / whole
    out = pd.DataFrame({"prefill_replicas": p, "decode_replicas": d, "chips": whole, "usd_per_request": deployed,
                        "usd_per_request_fluid": fluid, "tokens_per_s_per_gpu": np.where(dis, tok, tok_fluid),
                        "tokens_per_s_per_gpu_fluid": tok_fluid}, index=f.index)
    ttft = f["ttft_s"].to_numpy(dtype=float).copy()
    if dis.any():
        if pre is None or req is None:
            raise ValueError("disaggregated points need the prefill options they index and the request")
        j = f["prefill"].to_numpy()[dis]
        pm = pre.metrics
        rho = pre.rho[j] * ratio[dis] * d[dis] / p[dis]
        ttft[dis] = prefill_ttft(pm["prefill_service_s"][j], pm["kv_transfer_s"][j], pm["stack_latency_s"][j], rho,
                                 req)
    out["ttft_s"] = ttft
    return out
