"""Benchmark: the whole-deployment search (`dse.optimize.whole`) on the shipped studies' largest spaces.

For DeepSeek-V3 chat (the Pareto study's space: every priced system, aggregated and disaggregated) and Llama 4
Maverick with 1M-token prompts (the 1M-context study's), evaluates the space once, then times the best whole
deployment of each mode within budgets of 8 to 4,096 GPUs and 1 to 64 nodes, and for a demand: the options left
after pruning, the pairs the fluid bound let through, and the wall time of each search.

Usage: python scripts/bench_whole.py
"""

from __future__ import annotations

import os
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")

from dse.catalog.models import get_model  # noqa: E402
from dse.errors import InfeasibleError  # noqa: E402
from dse.optimize.space import build_space  # noqa: E402
from dse.optimize.whole import (  # noqa: E402
    Budget,
    aggregated_options,
    decode_options,
    prefill_options_of,
    prune,
    whole_aggregated,
    whole_disaggregated,
)
from dse.studies.base import load_study  # noqa: E402
from dse.studies.common import mode_tables  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
CASES = (("pareto_latency_cost.yaml", "deepseek-v3"), ("cheapest_1m_context.yaml", "llama-4-maverick"))
BUDGETS = (Budget(gpus=8), Budget(gpus=64), Budget(gpus=512), Budget(gpus=4096), Budget(nodes=1), Budget(nodes=64))


def main() -> None:
    for study, model in CASES:
        spec = load_study(ROOT / "studies" / study)
        w = spec.workloads[0].workload()
        t0 = time.perf_counter()
        space = build_space(get_model(model), w, spec.options())
        tables = mode_tables(space, spec)
        print(f"{model} / {w.name} ({study}): {space.size:,} configurations evaluated in "
              f"{time.perf_counter() - t0:.2f} s")
        agg, dis = tables.aggregated, tables.disaggregated
        sizes = (len(aggregated_options(space, agg)), len(prune(aggregated_options(space, agg))),
                 len(prefill_options_of(space, dis)), len(prune(prefill_options_of(space, dis))),
                 len(decode_options(space, dis)), len(prune(decode_options(space, dis))))
        print("  options (kept after pruning): aggregated {} ({}), prefill {} ({}), decode {} ({})".format(*sizes))
        for budget, demand in [(b, None) for b in BUDGETS] + [(None, 5e4), (Budget(gpus=512), 5e4)]:
            for mode, search, table in (("aggregated", whole_aggregated, agg), ("disaggregated", whole_disaggregated,
                                                                                 dis)):
                t0 = time.perf_counter()
                try:
                    (r,) = search(space, table, budget, demand)
                    what = f"{r.deployed['chips']:,} GPUs, {r.deployed['usd_per_request']:.4g} USD per request"
                except InfeasibleError:
                    what = "infeasible"
                print(f"  {mode:13s} budget {budget.text() if budget else '-':>11s} demand "
                      f"{demand or 0:>8,.0f} tok/s: {time.perf_counter() - t0:6.3f} s, {what}")


if __name__ == "__main__":
    main()
