"""Scale benchmark of the fleet program: 1 to 10 models x 4 request classes x every shipped system with a committed
(rental_3yr) and an on-demand price and a power figure x 6 to 24 hourly slices, in three modes: ``aggregated``
options only; ``disaggregated``: aggregated, prefill and decode options, the pools sized separately, prefill and
decode pools paired on their own system; ``mixed``: the same with every system's pools joined to the others' by an
interconnect, so a prefill pool may feed a decode pool on other hardware. Options come from the request-level
physics (`fleet_options`; a small space per model and system, FP8 weights where the chip computes in FP8; at most
two per class, system and role after the exact reduction). Per instance: the status, the solve's wall and CPU time,
the cost, bound and gap, the greedy's cost and the gain over it, and the machine's load. Goal: every instance
within 1% gap in 60 s on 2 cores, never dearer than the greedy. A report, not a timed test.

    PYTHONPATH=. python scripts/bench_fleet.py [--limit 60] [--solver auto|scip|highs|sat] [--sizes 1x6,10x24]
        [--modes aggregated,disaggregated,mixed] [--cache options.pkl]

Assumptions of the instances (not catalog data): a fixed cost of 500 USD/day per system used; inventory of
max(4, 160 x models / node GPUs) nodes per system; a site power cap of 60% of the inventory's all-in power; per
class a peak demand of 5-20 times the median aggregated replica's rate, on a diurnal curve (0.4 + 0.6 sin^2); in
``mixed``, 200 GB/s each way between each system's pools and the rest of the site for KV hand-offs.
"""

from __future__ import annotations

import argparse
import math
import os
import pickle
import sys
import time
from dataclasses import replace

import numpy as np
import pandas as pd

from dse.catalog.hardware import default_systems, shipping_ids
from dse.catalog.models import get_model
from dse.cli import native_stdout_to_stderr
from dse.errors import InputError
from dse.optimize.fleet import FleetData, check, fleet_options, solve_fleet
from dse.optimize.space import SpaceOptions, build_space
from dse.physics.serving import Request

MODELS = ("llama-3.1-8b", "qwen3-32b", "llama-3.1-70b", "llama-3.3-70b", "gpt-oss-120b", "mixtral-8x22b",
          "qwen3-235b-a22b", "llama-4-maverick", "deepseek-v3", "kimi-k2")
CLASSES = (Request(name="chat", prompt=1000, output=500, tpot_max=0.05, ttft_max=2.0),
           Request(name="rag", prompt=8000, output=300, tpot_max=0.05, ttft_max=3.0),
           Request(name="coding", prompt=16000, output=1500, tpot_max=0.05, ttft_max=5.0),
           Request(name="batch", prompt=2000, output=2000, tpot_max=0.2, ttft_max=30.0))
CURVE = 0.4 + 0.6 * np.sin(np.linspace(0, np.pi, 24)) ** 2
INTERCONNECT = 200e9  # bytes/s each way between a system's pools and the rest of the site (an assumption)
SIZES = "1x6,1x24,2x12,5x12,5x24,10x6,10x12,10x24"


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
                   "power_per_node_w": pw * node, "fixed_usd_per_day": 500.0, "interconnect_bytes_per_s": 0.0}
    return pd.DataFrame.from_dict(rows, orient="index")


def options(models, systems: pd.DataFrame) -> pd.DataFrame:
    """Every model x class x system's operating points as fleet options (aggregated, prefill and decode)."""
    frames = []
    for mid in models:
        for w in CLASSES:
            for s in systems.index:
                opts = SpaceOptions(systems=(s,), weights_dtypes=("fp8",), kv_dtypes=("fp8", "bf16"),
                                    kv_tiers=("hbm",), tp=(1, 8), pp=(1,), max_racks=1, max_batch_per_rank=256)
                if s in ("mi300x", "tpu-v6e"):
                    opts = replace(opts, weights_dtypes=("bf16", "fp8"))
                try:
                    space = build_space(get_model(mid), w, opts)
                except InputError:  # a model that does not fit a system has no options there
                    continue
                pts = fleet_options(space)
                if not pts.empty:
                    frames.append(pts.assign(model=mid, cls=w.name))
    return pd.concat(frames, ignore_index=True)


def instance(n_models: int, n_slices: int, systems: pd.DataFrame, all_opts: pd.DataFrame, modes: str) -> FleetData:
    models = MODELS[:n_models]
    o = all_opts[all_opts["model"].isin(models)]
    if modes == "aggregated":
        o = o[o["role"] == "both"]
    if modes == "mixed":
        systems = systems.assign(interconnect_bytes_per_s=INTERCONNECT)
    o = o.reset_index(drop=True)
    slices = list(range(n_slices))
    curve = CURVE[np.linspace(0, 23, n_slices).astype(int)]
    idx, rows = [], []
    rng = np.random.default_rng(1)
    for mid in models:
        for w in CLASSES:
            sel = o[(o["model"] == mid) & (o["cls"] == w.name) & (o["role"] == "both")]
            peak = float(sel["requests_per_s"].median()) * rng.uniform(5, 20) if len(sel) else 0.0
            if not peak:
                continue
            idx.append((mid, w.name))
            rows.append(list(peak * curve))
    demand = pd.DataFrame(rows, index=pd.MultiIndex.from_tuples(idx), columns=slices)
    inv = pd.DataFrame({t: [max(4, 160 * n_models // int(systems.loc[s, "node_chips"])) for s in systems.index]
                        for t in slices}, index=systems.index)
    full_power = float((inv[0] * systems["power_per_node_w"]).sum())
    d = FleetData(systems, inv, o, demand, slice_h=24 / n_slices, power_cap_w=0.6 * full_power,
                  budget_usd_per_day=None, n_plus_one=True)
    return d.reduced().shortlist(2)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--limit", type=float, default=60.0)
    ap.add_argument("--solver", default="auto")
    ap.add_argument("--sizes", default=SIZES)
    ap.add_argument("--modes", default="aggregated,disaggregated,mixed")
    ap.add_argument("--cache", default=None, help="a pickle of the options (computed once, reused)")
    args = ap.parse_args()
    systems = systems_table()
    sizes = [tuple(int(x) for x in s.split("x")) for s in args.sizes.split(",")]
    t0 = time.perf_counter()
    if args.cache and os.path.exists(args.cache):
        with open(args.cache, "rb") as fh:
            all_opts = pickle.load(fh)
    else:
        all_opts = options(MODELS[:max(m for m, _ in sizes)], systems)
        if args.cache:
            with open(args.cache, "wb") as fh:
                pickle.dump(all_opts, fh)
    print(f"options from the physics: {len(all_opts)} over {len(systems)} priced systems "
          f"({', '.join(systems.index)}), {time.perf_counter() - t0:.1f} s; load average "
          f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    print(f"{'models':>6} {'cls':>3} {'slices':>6} {'modes':>13} {'options':>7} {'status':>9} {'wall_s':>6} "
          f"{'cpu_s':>6} {'gap':>7} {'usd_per_day':>12} {'bound':>12} {'greedy':>12} {'gain':>6} {'load':>5}  found by")
    for modes in args.modes.split(","):
        for n_models, n_slices in sizes:
            d = instance(n_models, n_slices, systems, all_opts, modes)
            head = f"{n_models:>6} {len(d.classes) // n_models:>3} {n_slices:>6} {modes:>13} {len(d.options):>7}"
            c0 = time.process_time()
            try:
                with native_stdout_to_stderr():  # the solvers' own lines stay out of the table
                    r = solve_fleet(d, args.solver, args.limit, duals=False)
            except Exception as exc:  # noqa: BLE001 - report and go on
                print(f"{head} failed: {exc}", flush=True)
                continue
            cpu = time.process_time() - c0
            bad = check(d, r, r.result.objective)
            res, g = r.result, r.greedy_usd_per_day
            gain = 1 - res.objective / g if math.isfinite(g) else float("nan")
            print(f"{head} {res.status:>9} {res.wall_s:>6.1f} {cpu:>6.1f} {res.gap:>7.2%} {res.objective:>12,.0f} "
                  f"{res.bound:>12,.0f} {g:>12,.0f} {gain:>6.1%} {os.getloadavg()[0]:>5.1f}  "
                  f"{res.termination.rsplit('from the ', 1)[-1]}" + (f"  RE-CHECK FAILED: {bad[:2]}" if bad else ""),
                  flush=True)
    sys.stdout.flush()


if __name__ == "__main__":
    main()
