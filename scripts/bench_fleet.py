"""Scale benchmark of the fleet program: up to 10 models x 4 workload classes x every shipped system with a
committed and an on-demand price and a power figure x 24 hourly slices. Options come from the request-level
physics (aggregated operating points, a small space per model and system); prints the time and the optimality
gap as the instance grows, and the gain over the greedy. Goal: at most 1% gap within 60 s on 2 cores.
A report, not a timed test.

    PYTHONPATH=. python scripts/bench_fleet.py [--limit 60] [--solver scip] [--sizes 2x6,5x12,10x24]
"""

from __future__ import annotations

import argparse
import math
import time
from dataclasses import replace

import numpy as np
import pandas as pd

from dse.catalog.hardware import default_systems, shipping_ids
from dse.catalog.models import get_model
from dse.optimize.fleet import FleetData, greedy, replica_nodes, solve_fleet
from dse.optimize.operating_points import operating_points
from dse.optimize.space import SpaceOptions, build_space
from dse.physics.serving import Request

MODELS = ("llama-3.1-8b", "qwen3-32b", "llama-3.1-70b", "llama-3.3-70b", "gpt-oss-120b", "mixtral-8x22b",
          "qwen3-235b-a22b", "llama-4-maverick", "deepseek-v3", "kimi-k2")
CLASSES = (Request(name="chat", prompt=1000, output=500, tpot_max=0.05, ttft_max=2.0),
           Request(name="rag", prompt=8000, output=300, tpot_max=0.05, ttft_max=3.0),
           Request(name="coding", prompt=16000, output=1500, tpot_max=0.05, ttft_max=5.0),
           Request(name="batch", prompt=2000, output=2000, tpot_max=0.2, ttft_max=30.0))
CURVE = 0.4 + 0.6 * np.sin(np.linspace(0, np.pi, 24)) ** 2


def systems_table() -> pd.DataFrame:
    res, od = default_systems("rental_3yr"), default_systems("on_demand")
    rows = {}
    for s in shipping_ids():
        r, h = res[s].price_per_s * 3600, od[s].price_per_s * 3600
        if not (math.isfinite(r) and math.isfinite(h)):
            continue
        node = int(od[s].scaleup_domain)
        pw = od[s].power_all_in_w if math.isfinite(od[s].power_all_in_w) else od[s].power
        if not math.isfinite(pw):
            continue  # no power figure: it cannot count against the site's cap
        rows[s] = {"node_chips": node, "reserved_usd_per_node_h": r * node, "hourly_usd_per_node_h": h * node,
                   "power_per_node_w": pw * node, "fixed_usd_per_day": 500.0}
    return pd.DataFrame.from_dict(rows, orient="index")


def options(models, systems: pd.DataFrame) -> pd.DataFrame:
    rows = []
    for mid in models:
        for w in CLASSES:
            for s in systems.index:
                opts = SpaceOptions(systems=(s,), weights_dtypes=("fp8", "bf16"), kv_dtypes=("fp8", "bf16"),
                                    kv_tiers=("hbm",), tp=(1, 8), pp=(1,), max_racks=1, max_batch_per_rank=256)
                opts = replace(opts, weights_dtypes=("fp8",) if s not in ("mi300x", "tpu-v6e") else ("bf16", "fp8"))
                try:
                    space = build_space(get_model(mid), w, opts)
                except Exception:  # noqa: BLE001 - a model that does not fit a system has no options there
                    continue
                pts = operating_points(space, ("aggregated",))
                if pts.empty:
                    continue
                pts = pts.assign(nodes=replica_nodes(pts["chips"].to_numpy(), int(systems.loc[s, "node_chips"])))
                pts = pts.sort_values(by="nodes", key=lambda n: n / pts.loc[n.index, "requests_per_s"]).head(2)
                for p in pts.to_dict("records"):
                    rows.append({"model": mid, "cls": w.name, "system": s, "nodes": int(p["nodes"]),
                                 "requests_per_s": p["requests_per_s"]})
    return pd.DataFrame(rows)


def instance(n_models: int, n_slices: int, systems: pd.DataFrame, all_opts: pd.DataFrame) -> FleetData:
    models = MODELS[:n_models]
    o = all_opts[all_opts["model"].isin(models)].reset_index(drop=True)
    slices = list(range(n_slices))
    curve = CURVE[np.linspace(0, 23, n_slices).astype(int)]
    idx, rows = [], []
    rng = np.random.default_rng(1)
    for mid in models:
        for w in CLASSES:
            sel = o[(o["model"] == mid) & (o["cls"] == w.name)]
            if sel.empty:
                continue
            peak = float(sel["requests_per_s"].median()) * rng.uniform(5, 20)
            idx.append((mid, w.name))
            rows.append(list(peak * curve))
    demand = pd.DataFrame(rows, index=pd.MultiIndex.from_tuples(idx), columns=slices)
    inv = pd.DataFrame({t: [max(4, 160 * n_models // int(systems.loc[s, "node_chips"])) for s in systems.index]
                        for t in slices}, index=systems.index)
    full_power = float((inv[0] * systems["power_per_node_w"]).sum())
    return FleetData(systems, inv, o, demand, slice_h=24 / n_slices, power_cap_w=0.6 * full_power,
                     budget_usd_per_day=None, n_plus_one=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--limit", type=float, default=60.0)
    ap.add_argument("--solver", default="scip", help="scip reports its incumbent at the time limit; highs through "
                    "model_builder answers 'unknown' there")
    ap.add_argument("--sizes", default="2x6,5x12,10x24")
    args = ap.parse_args()
    systems = systems_table()
    sizes = [tuple(int(x) for x in s.split("x")) for s in args.sizes.split(",")]
    t0 = time.perf_counter()
    all_opts = options(MODELS[:max(m for m, _ in sizes)], systems)
    print(f"options from the physics: {len(all_opts)} over {len(systems)} priced systems "
          f"({', '.join(systems.index)}), {time.perf_counter() - t0:.1f} s")
    print(f"{'models':>6} {'classes':>7} {'slices':>6} {'options':>7} {'status':>9} {'wall_s':>7} {'gap':>8} "
          f"{'usd_per_day':>12} {'greedy':>12} {'gain':>6}")
    for n_models, n_slices in sizes:
        d = instance(n_models, n_slices, systems, all_opts)
        try:
            r = solve_fleet(d, args.solver, args.limit, duals=False)
            status, wall, gap, obj = r.result.status, r.result.wall_s, r.result.gap, r.result.objective
        except Exception as exc:  # noqa: BLE001 - report and go on
            print(f"{n_models:>6} {len(CLASSES):>7} {n_slices:>6} {len(d.options):>7} failed: {exc}")
            continue
        g = greedy(d)
        gain = 1 - obj / g if math.isfinite(g) else float("nan")
        print(f"{n_models:>6} {len(CLASSES):>7} {n_slices:>6} {len(d.options):>7} {status:>9} {wall:>7.1f} "
              f"{gap:>8.2%} {obj:>12,.0f} {g:>12,.0f} {gain:>6.1%}", flush=True)


if __name__ == "__main__":
    main()
