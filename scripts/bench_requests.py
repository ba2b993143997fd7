"""Benchmark: the request-level serving studies end to end, and what their exact searches enumerate.

Runs the shipped 1M-context study (every catalog system with a price of its kind, aggregated and
disaggregated) and the Pareto study in this process and prints, per study, the wall time, the
(block, batch) pairs and prefill options evaluated, and per front its size against the feasible
configurations it was taken from.

Usage: python scripts/bench_requests.py [--repeat 1]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")

import dse  # noqa: E402
from dse.physics import keep_freed_memory  # noqa: E402

keep_freed_memory()  # as the dse command does at start

ROOT = Path(__file__).resolve().parents[1]
STUDIES = ("cheapest_1m_context.yaml", "pareto_latency_cost.yaml", "fast_slow_mode.yaml")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=1)
    args = parser.parse_args()
    for name in STUDIES:
        best = float("inf")
        for _ in range(args.repeat):
            with tempfile.TemporaryDirectory() as tmp:
                t0 = time.perf_counter()
                result = dse.run(ROOT / "studies" / name, out=Path(tmp) / "out")
                best = min(best, time.perf_counter() - t0)
        s = result.summary
        configs = sum(sp.get("configurations", 0) for sp in s.get("spaces", []))
        print(f"{name}: {best:.2f} s end to end (best of {args.repeat}, plots and report included), status "
              f"{s['status']}, {configs:,} (block, batch) configurations in its spaces, solver {s['solver']['name']}")
        for e in s.get("best", []):
            print(f"  {e['model']} / {e['workload']}: {e['serving']}, {e['usd_per_request']:.4g} USD per request, "
                  f"TTFT {e['ttft_s']:.3g} s, TPOT {e['tpot_s'] * 1e3:.3g} ms, "
                  f"prefill {e['prefill_share']:.0%} of cost")
        for f in s.get("fronts", []):
            print(f"  {f['model']} / {f['workload']} {f['front']} front: {f['points']:,} non-dominated points of "
                  f"{f['candidates']:,} feasible configurations ({f['aggregated_points']:,} aggregated)")


if __name__ == "__main__":
    main()
