"""Benchmark: configurations per second of the vectorized physics on one core.

Draws N candidate serving configurations at random over every catalog model and system, valid
layouts, batches, contexts, dtypes and phases, then times `dse.physics.evaluate` on them.
Usage: python scripts/bench_evaluate.py [--n 2000000] [--repeat 3] [--no-ttft]
"""

from __future__ import annotations

import argparse
import os
import time
from dataclasses import replace

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import numpy as np  # noqa: E402

from dse.catalog.hardware import default_systems  # noqa: E402
from dse.catalog.models import default_models  # noqa: E402
from dse.physics import keep_freed_memory  # noqa: E402
from dse.physics.layout import layouts_for  # noqa: E402
from dse.physics.roofline import Candidates, ModelTable, SystemTable, evaluate  # noqa: E402
from dse.physics.serving import Request, aggregated  # noqa: E402

keep_freed_memory()  # as the dse command does at start


def candidates(n: int, seed: int = 0) -> tuple[Candidates, ModelTable, SystemTable]:
    rng = np.random.default_rng(seed)
    models = list(default_models().values())
    systems = list(default_systems().values())
    rows = []  # (model, tp, dp, ep, etp, pp) valid by construction
    for mi, m in enumerate(models):
        for cps in (1, 2, 4, 8, 16, 32, 64, 72, 144):
            for lay in layouts_for(m, cps, pps=(1, 2, 4)):
                rows.append((mi, lay.tp, lay.dp, lay.ep, lay.etp, lay.pp))
    table = np.array(rows, dtype=np.int64)
    pick = table[rng.integers(0, len(table), n)]
    cand = Candidates(
        model=pick[:, 0],
        system=rng.integers(0, len(systems), n),
        tp=pick[:, 1], dp=pick[:, 2], ep=pick[:, 3], etp=pick[:, 4], pp=pick[:, 5],
        batch=2 ** rng.integers(0, 13, n),
        context=2 ** rng.integers(7, 21, n),
        phase=rng.integers(0, 2, n),
        weights_dtype=rng.integers(0, 3, n),
        kv_dtype=rng.integers(0, 2, n),
        kv_tier=0,
    )
    return cand, ModelTable.build(models), SystemTable.build(systems)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=2_000_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--no-ttft", action="store_true", help="skip the per-candidate TTFT (second prefill pass)")
    args = parser.parse_args()
    cand, mt, st = candidates(args.n)
    eff = None  # each system's calibrated factors
    best = float("inf")
    for _ in range(args.repeat):
        t0 = time.perf_counter()
        out = evaluate(cand, mt, st, eff, ttft=not args.no_ttft)
        best = min(best, time.perf_counter() - t0)
    fits = int(out["fits"].sum())
    print(f"candidates: {args.n:,} ({fits:,} fit in HBM), ttft: {not args.no_ttft}")
    print(f"best of {args.repeat}: {best:.3f} s -> {args.n / best:,.0f} configurations per second (one core)")
    # request level: aggregated replicas (chat: 2,000-token prompts, 500 output tokens), decode candidates
    req = Request(2000, 500)
    dec = replace(cand, phase=0)
    best = float("inf")
    for _ in range(args.repeat):
        t0 = time.perf_counter()
        r = aggregated(dec, mt, st, req, eff)
        best = min(best, time.perf_counter() - t0)
    print(f"request level (aggregated, {int(r['fits'].sum()):,} fit): best of {args.repeat}: {best:.3f} s -> "
          f"{args.n / best:,.0f} request-level evaluations per second (one core)")


if __name__ == "__main__":
    main()
