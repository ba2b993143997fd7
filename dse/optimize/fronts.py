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
axis, keeping each point that improves on every point before it. `tests/test_fronts.py` checks it
against the non-dominated set of an independent enumeration.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from dse.catalog.units import DTYPES
from dse.optimize.requests import (
    DisaggregatedTables,
    PrefillOptions,
    _group_of,
    best_prefill,
    evaluate_pairs,
    feasible_mask,
    pairs,
)
from dse.optimize.space import Space
from dse.physics.codes import KV_TIERS
from dse.physics.serving import Request

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


def candidates(space: Space, req: Request, aggregated: bool, dis: DisaggregatedTables | None,
               objective: str) -> pd.DataFrame:
    """Every feasible configuration of the space as a row: serving, block position, n, prefill option
    (-1 for aggregated), TPOT, TTFT, USD per request, chips per decode-or-aggregated replica, chip-seconds
    per output token and the deployment's tokens/s per GPU.
    """
    w = space.workload
    b = space.blocks
    frames = []
    if aggregated and not b.empty:
        pos, n = pairs(b)
        m = evaluate_pairs(space, b, pos, n, req)
        ok = feasible_mask(m, w.tpot_max, w.ttft_max)
        chips = b["chips"].to_numpy()[pos]
        chip_s = chips / (m["requests_per_s"] * req.output)
        frames.append(pd.DataFrame({
            "serving": "aggregated", "pos": pos[ok], "n": n[ok], "prefill": -1, "tpot_s": m["tpot_s"][ok],
            "ttft_s": m["ttft_s"][ok], "usd_per_request": m["usd_per_request"][ok], "chips": chips[ok],
            "chip_s_per_token": chip_s[ok]}))
    if dis is not None and len(dis.dpos):
        pre = dis.pre
        pre_chip_s = pre.chip_s_per_request
        score = pre.usd_per_request if objective == "cost" else pre_chip_s
        bestp = best_prefill(space, pre, score)
        g = _group_of(space, dis.dpos)
        j = np.array([bestp.get(int(k), -1) for k in g], dtype=np.int64)
        ok = dis.dok & (j >= 0)
        j_ok = j[ok]
        dm = {k: v[ok] for k, v in dis.dm.items()}
        lam = dm["requests_per_s"]
        ttft = (pre.metrics["prefill_service_s"] * (1 + pre.rho / (2 * (1 - pre.rho))) + pre.metrics["kv_transfer_s"])
        ratio = lam * pre.metrics["prefill_service_s"][j_ok] / (pre.metrics["servers"][j_ok] * pre.rho[j_ok])
        frames.append(pd.DataFrame({
            "serving": "disaggregated", "pos": dis.dpos[ok], "n": dis.dn[ok], "prefill": j_ok, "tpot_s": dm["tpot_s"],
            "ttft_s": ttft[j_ok], "usd_per_request": dm["usd_per_request"] + pre.usd_per_request[j_ok],
            "chips": dm["chips"] + ratio * pre.metrics["chips"][j_ok],
            "chip_s_per_token": (dm["chips"] / lam + pre_chip_s[j_ok]) / req.output}))
    if frames:
        out = pd.concat(frames, ignore_index=True)
    else:
        out = pd.DataFrame({k: np.zeros(0) for k in ("serving", "pos", "n", "prefill", "tpot_s", "ttft_s",
                                                      "usd_per_request", "chips", "chip_s_per_token")})
    out["tokens_per_s_per_gpu"] = 1.0 / out["chip_s_per_token"]
    out["tokens_per_s_per_user"] = 1.0 / out["tpot_s"]
    return out


def front(space: Space, req: Request, aggregated: bool, dis: DisaggregatedTables | None,
          objective: str = "cost") -> pd.DataFrame:
    """The complete front of ``objective`` over the space's feasible configurations, in increasing TPOT."""
    if objective not in OBJECTIVES:
        raise ValueError(f"objective must be one of {OBJECTIVES}, got {objective!r}")
    c = candidates(space, req, aggregated, dis, objective)
    y = c["usd_per_request"] if objective == "cost" else c["chip_s_per_token"]
    keep = non_dominated(c["tpot_s"].to_numpy(), y.to_numpy())
    f = c.iloc[keep].reset_index(drop=True)
    f.attrs["candidates"] = len(c)
    return f



def describe_points(space: Space, f: pd.DataFrame, pre: PrefillOptions | None = None) -> pd.DataFrame:
    """The configuration of each front point, keyed as the output contract names it (vectorized
    `describe_choice`): the aggregated replica's or the decode pool's layout, and for disaggregated points
    the prefill pool's system and layout as ``prefill_*`` (``pre``: the prefill options the points index).
    """
    b = space.blocks
    rows = b.iloc[f["pos"].to_numpy()]
    out = pd.DataFrame({
        "serving": f["serving"].to_numpy(),
        "system": [space.systems[i].id for i in rows["system_idx"]],
        "replica_chips": rows["chips"].to_numpy(), "tp": rows["tp"].to_numpy(), "ep": rows["ep"].to_numpy(),
        "pp": rows["pp"].to_numpy(), "dp": rows["dp"].to_numpy(), "batch": rows["dp"].to_numpy() * f["n"].to_numpy(),
        "weights_dtype": [DTYPES[int(i)] for i in rows["wd"]], "kv_dtype": [DTYPES[int(i)] for i in rows["kd"]],
        "kv_tier": [KV_TIERS[int(i)] for i in rows["tier"]],
    })
    if pre is not None and (f["prefill"] >= 0).any():
        j = f["prefill"].to_numpy()
        has = j >= 0
        pr = b.iloc[pre.pos[np.where(has, j, 0)]]
        out["prefill_context_parallel"] = has & pre.cp[np.where(has, j, 0)]
        out["prefill_system"] = np.where(has, [space.systems[i].id for i in pr["system_idx"]], "")
        for key in ("chips", "tp", "ep", "dp"):
            out["prefill_" + key] = np.where(has, pr[key].to_numpy(), 0)
    return out
