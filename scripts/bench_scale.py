"""Benchmark: how a chat study's solve scales with the systems it searches, and two shipped studies.

The chat study asks for the cheapest deployment of Llama 3.1 70B and DeepSeek-V3 (4,000-token prompts,
500 output tokens, TTFT <= 1 s, TPOT <= 50 ms, aggregated and disaggregated, the default space of a
study) on 1, 3 and 10 systems and on every shipping system (``systems: all``). Then the 1M-context
study (studies/cheapest_1m_context.yaml) and the Pareto study (studies/pareto_latency_cost.yaml) as
shipped. Each point runs in a fresh process: the study is loaded (parsing the catalogs, timed apart as
``load s``), then solved in-process without plots or files (``dse.studies.contract.solve_study``, what
`dse run` solves before it writes); the table gives the configurations searched (summed over the
study's spaces), the solve's wall time, the time per configuration and the process's peak resident
memory (``ru_maxrss``).

Goal: the chat study on every shipping system solves in at most 10 s on a 2-core machine, and the time
per configuration stays within 1.5x of the one-system point's, so the search grows no faster than its
space.

Usage: python scripts/bench_scale.py [--repeat N] [--points 1,3,10,all,1m,pareto]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
GOAL_WALL_S = 10.0
"""Solve time of the chat study on every shipping system that the goal allows (2-core machine)."""
GOAL_GROWTH = 1.5
"""Most the time per configuration may grow from one system to all."""
FIRST = ("h200", "b200", "gb200-nvl72")
"""The systems of the smallest points (each holds both models); the larger points add the catalog's others."""

CHILD = r"""
import json, resource, sys, time
from dse.physics import keep_freed_memory
keep_freed_memory()  # as the dse command does at start
from dse.studies.base import load_study
from dse.studies.contract import solve_study
study = json.loads(sys.argv[1])
t0 = time.perf_counter()
spec = load_study(study["path"] if "path" in study else study)
t1 = time.perf_counter()
out = solve_study(spec)
t2 = time.perf_counter()
print(json.dumps({"configurations": sum(s["configurations"] for s in out.summary["spaces"]),
                  "load_s": t1 - t0, "wall_s": t2 - t1, "status": out.summary["status"],
                  "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}))
"""


def chat_study(systems: list[str] | str) -> dict:
    """The chat study on ``systems`` (a list of ids, or ``all``)."""
    n = "all" if systems == "all" else len(systems)
    return {
        "study": f"bench_scale_{n}", "kind": "cheapest",
        "description": "cheapest chat deployment of a dense and an MoE model", "expect": "time grows with the space",
        "models": ["llama-3.1-70b", "deepseek-v3"],
        "workloads": [{"name": "chat", "prompt": 4000, "output": 500, "ttft_max_s": 1.0, "tpot_max_s": 0.05}],
        "space": {"systems": systems, "serving": ["aggregated", "disaggregated"]},
    }


def systems_in_order() -> list[str]:
    """Shipping systems with a price of the default kind, ``FIRST`` first, then the catalog's order."""
    import math

    from dse.catalog.hardware import default_systems, shipping_ids

    catalog = default_systems()
    priced = [s for s in shipping_ids(False) if not math.isnan(catalog[s].price_per_s)]
    return [s for s in FIRST if s in priced] + [s for s in priced if s not in FIRST]


def points(names: list[str]) -> list[tuple[str, dict]]:
    """(label, study) of each point named: a count of systems, ``all``, ``1m`` or ``pareto``."""
    order = systems_in_order()
    shipped = {"1m": "cheapest_1m_context.yaml", "pareto": "pareto_latency_cost.yaml"}
    out = []
    for name in names:
        if name in shipped:
            path = ROOT / "studies" / shipped[name]
            out.append((f"study {path.stem}", {"path": str(path)}))
        elif name == "all":
            out.append(("chat, all shipping systems", chat_study("all")))
        else:
            k = int(name)
            out.append((f"chat, {k} system{'s' if k > 1 else ''}", chat_study(order[:k])))
    return out


def run_point(study: dict, repeat: int) -> dict:
    """The point's figures, best wall time of ``repeat`` fresh processes (its peak memory with it)."""
    best = None
    for _ in range(repeat):
        p = subprocess.run([sys.executable, "-c", CHILD, json.dumps(study)], capture_output=True, text=True,
                           cwd=ROOT, env={**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")})
        if p.returncode:
            raise SystemExit(f"failed:\n{p.stderr[-2000:]}")
        r = json.loads(p.stdout.strip().splitlines()[-1])
        best = r if best is None or r["wall_s"] < best["wall_s"] else best
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=1, help="fresh processes per point (the fastest counts)")
    parser.add_argument("--points", default="1,3,10,all,1m,pareto", help="comma-separated: counts, all, 1m, pareto")
    args = parser.parse_args()
    print(f"{os.cpu_count()} CPUs; load average {os.getloadavg()[0]:.2f} at start")
    print(f"{'point':<36} {'configurations':>15} {'load s':>7} {'solve s':>8} {'us/config':>10} {'peak RSS MB':>12}"
          "  status")
    per_config: dict[str, float] = {}
    walls: dict[str, float] = {}
    for label, study in points(args.points.split(",")):
        r = run_point(study, args.repeat)
        us = r["wall_s"] / r["configurations"] * 1e6
        per_config[label], walls[label] = us, r["wall_s"]
        print(f"{label:<36} {r['configurations']:>15,} {r['load_s']:>7.2f} {r['wall_s']:>8.2f} {us:>10.3f} "
              f"{r['peak_rss_bytes'] / 1e6:>12.0f}  {r['status']}", flush=True)
    one, every = "chat, 1 system", "chat, all shipping systems"
    if one in per_config and every in per_config:
        growth = per_config[every] / per_config[one]
        print(f"goal: all systems <= {GOAL_WALL_S:g} s: {walls[every]:.2f} s "
              f"({'met' if walls[every] <= GOAL_WALL_S else 'NOT met'}, on {os.cpu_count()} CPUs); time per "
              f"configuration from 1 system to all x{growth:.2f} ({'met' if growth <= GOAL_GROWTH else 'NOT met'}, "
              f"<= x{GOAL_GROWTH:g})")
    print(f"load average {os.getloadavg()[0]:.2f} at the end")


if __name__ == "__main__":
    main()
