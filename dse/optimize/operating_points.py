"""Candidate operating points per configuration, from the request-level physics, for the deployment and fleet
programs: aggregated replicas, disaggregated prefill replicas and decode replicas, each reduced to its
non-dominated (USD/s, requests/s) points so the programs stay small.

Every figure comes from `dse.optimize.requests` (which calls `dse.physics.serving`): nothing is re-derived.
A replica's USD/s is fixed by its block (chips x price), so per block the non-dominated point is the feasible
batch with the highest request rate; across blocks a point is dropped when another of the same role and
numerics costs no more per second and serves no fewer requests per second.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from dse.catalog.calibration import error_band, family_of
from dse.optimize.requests import (
    disaggregated_tables,
    evaluate_pairs,
    feasible_mask,
    first_min_per_block,
    numerics_group,
    served_pair,
)
from dse.optimize.space import Choice, Space, describe_choice, pair_chunks
from dse.physics.serving import power_w, prefill_ttft

COLUMNS = ("role", "group", "system", "chips", "racks", "tp", "ep", "pp", "dp", "batch", "weights_dtype",
           "kv_dtype", "kv_tier", "usd_per_s", "requests_per_s", "ttft_s", "tpot_s", "power_w", "context_parallel",
           "prefill_service_s", "kv_transfer_s", "utilisation", "prefill_share", "block")
"""``prefill_share``: the input part of the point's cost as `dse.physics.serving` splits it (an aggregated replica's
share of time on prefill chunks at its batch; a prefill replica 1, a decode replica 0). ``block``: the label of the
point's block in its space's ``blocks`` (`served_point` evaluates it again there)."""


def _power(space: Space, pos: np.ndarray, chips: np.ndarray) -> np.ndarray:
    """All-in power of a replica (`dse.physics.serving.power_w`: the catalog's all-in W per chip; NaN where it has
    none, never the chip's TDP under the all-in name).
    """
    si = space.blocks["system_idx"][pos]
    return power_w(chips, np.array([s.power_all_in_w for s in space.systems])[si])


def _config(space: Space, pos: int, n: int) -> dict:
    return describe_choice(space, Choice(int(space.blocks.index[pos]), int(n), np.nan, np.nan))


def placement(space: Space, points: pd.DataFrame) -> np.ndarray:
    """Where each point's expert-parallel group lives: ``scale_up`` when a pipeline stage (the chips its experts and
    attention share) fits in one scale-up domain, ``scale_out`` when its all-to-all crosses the scale-out network
    (`dse.physics.roofline.dispatch_copies`).
    """
    domain = points["system"].map({s.id: int(s.scaleup_domain) for s in space.systems}).to_numpy()
    stage = points["chips"].to_numpy() // np.maximum(points["pp"].to_numpy(), 1)
    return np.where(stage > domain, "scale_out", "scale_up")


def non_dominated(points: pd.DataFrame, by: tuple[str, ...] = ("role", "group")) -> pd.DataFrame:
    """Drop points another of the same ``by`` class (role and numerics group by default) dominates: no more USD/s and
    no fewer requests/s.
    """
    if points.empty:
        return points
    keep = []
    for _, g in points.groupby(list(by), sort=False):
        g = g.sort_values(["usd_per_s", "requests_per_s"], ascending=[True, False])
        best = -np.inf
        for i, r in g.iterrows():
            if r["requests_per_s"] > best * (1 + 1e-9):
                keep.append(i)
                best = r["requests_per_s"]
    return points.loc[sorted(keep)].reset_index(drop=True)


def operating_points(space: Space, modes: tuple[str, ...] = ("aggregated", "disaggregated"),
                     context_parallel: tuple[bool, ...] = (False, True),
                     by: tuple[str, ...] = ("role", "group")) -> pd.DataFrame:
    """The non-dominated operating points of one (model, workload) space, one row per point (``COLUMNS``); a point
    is compared only with those of its ``by`` class (`non_dominated`).
    """
    w, b = space.workload, space.blocks
    req = space.workload
    rows: list[dict] = []
    if b.empty:
        return pd.DataFrame(columns=list(COLUMNS))
    group = numerics_group(space, np.arange(len(b))).astype(int)
    if "aggregated" in modes:
        for pos, n in pair_chunks(b):
            m = evaluate_pairs(space, b, pos, n, req)
            ok = feasible_mask(m, w)
            for i in first_min_per_block(pos, np.where(ok, -m["requests_per_s"], np.inf)):
                cfg = _config(space, pos[i], n[i])
                rows.append({"role": "both", "group": int(group[pos[i]]), **cfg,
                             "usd_per_s": float(m["usd_per_s"][i]), "requests_per_s": float(m["requests_per_s"][i]),
                             "ttft_s": float(m["ttft_s"][i]), "tpot_s": float(m["tpot_s"][i]),
                             "power_w": float(_power(space, pos[[i]], np.array([cfg["chips"]]))[0]),
                             "context_parallel": False, "prefill_service_s": np.nan, "kv_transfer_s": np.nan,
                             "utilisation": np.nan, "prefill_share": float(m["prefill_share"][i]),
                             "block": b.index[pos[i]]})
    if "disaggregated" in modes:
        t = disaggregated_tables(space, req, context_parallel)
        for i in first_min_per_block(t.dpos, np.where(t.dok, -t.dm["requests_per_s"], np.inf)):
            cfg = _config(space, t.dpos[i], t.dn[i])
            rows.append({"role": "decode", "group": int(group[t.dpos[i]]), **cfg,
                         "usd_per_s": float(t.dm["usd_per_s"][i]), "requests_per_s": float(t.dm["requests_per_s"][i]),
                         "ttft_s": np.nan, "tpot_s": float(t.dm["tpot_s"][i]),
                         "power_w": float(_power(space, t.dpos[[i]], np.array([cfg["chips"]]))[0]),
                         "context_parallel": False, "prefill_service_s": np.nan, "kv_transfer_s": np.nan,
                         "utilisation": np.nan, "prefill_share": 0.0, "block": b.index[t.dpos[i]]})
        pre = t.pre
        for j in np.flatnonzero(pre.ok):
            cfg = _config(space, pre.pos[j], 1)
            cp = bool(pre.cp[j])
            cfg.update(batch=1 if cp else cfg["dp"], kv_tier="hbm")
            pm = pre.metrics
            rate = float(pm["servers"][j] * pre.rho[j] / pm["prefill_service_s"][j])
            ttft = float(prefill_ttft(pm["prefill_service_s"][j], pm["kv_transfer_s"][j], pm["stack_latency_s"][j],
                                      pre.rho[j], space.workload))
            rows.append({"role": "prefill", "group": int(group[pre.pos[j]]), **cfg,
                         "usd_per_s": float(pm["usd_per_s"][j]), "requests_per_s": rate, "ttft_s": ttft,
                         "tpot_s": np.nan, "power_w": float(_power(space, pre.pos[[j]], np.array([cfg["chips"]]))[0]),
                         "context_parallel": cp, "prefill_service_s": float(pm["prefill_service_s"][j]),
                         "kv_transfer_s": float(pm["kv_transfer_s"][j]), "utilisation": float(pre.rho[j]),
                         "prefill_share": 1.0, "block": b.index[pre.pos[j]]})
    pts = pd.DataFrame(rows, columns=[c for c in ("role", "group", "system", "chips", "racks", "tp", "ep", "pp", "dp",
                                                  "etp", "batch", "context", "weights_dtype", "kv_dtype", "kv_tier",
                                                  *COLUMNS[13:])])
    if "placement" in by:
        pts["placement"] = placement(space, pts)
    pts = non_dominated(pts, by)
    pts["numerics"] = pts["weights_dtype"].astype(str) + "/" + pts["kv_dtype"].astype(str)
    return pts


def served_point(space: Space, point: dict, load: float) -> dict:
    """The figures of an operating point (a row of `operating_points` of ``space``) whose replicas each serve
    ``load`` (0 to 1) of its requests/s, as a pool with capacity to spare runs: an aggregated or decode replica at
    the batch it holds (`dse.optimize.requests.at_served_load`: TTFT, TPOT and, aggregated, every quantile, with
    ``batch_served`` and ``served_edges``), a prefill replica at the utilisation it runs at (its TTFT from the M/D/1
    wait at ``load`` times its planned utilisation, `prefill_ttft`; its ``served_edges`` at the utilisation it runs
    at at each end of its system's throughput band, at most the planned one). At ``load`` 1, the point's own
    figures.
    """
    pos = int(np.flatnonzero(space.blocks.index == point["block"])[0])
    load = min(max(load, 0.0), 1.0)
    if point["role"] == "prefill":
        planned = float(point["utilisation"])

        system = space.systems[int(space.blocks["system_idx"][pos])]
        tau = space.workload.stack.disaggregated_of(family_of(system.id)).fixed_latency_s  # as `prefill_pool` has it

        def ttft(rho: float) -> float:
            return float(prefill_ttft(point["prefill_service_s"], point["kv_transfer_s"], tau, rho, space.workload))

        out = {"ttft_s": ttft(planned * load)}
        band = None if space.ideal else error_band(system.id)
        if band is not None:  # a replica slower than predicted runs busier, up to its planned utilisation
            out["served_edges"] = {"ttft_s": (ttft(planned * load / band[1]),
                                              ttft(min(planned, planned * load / band[0])))}
        return out
    n = int(point["batch"]) // int(space.blocks["dp"][pos])
    return served_pair(space, space.blocks, pos, n, float(point["requests_per_s"]) * load, space.workload,
                       decode=point["role"] == "decode")
