"""Benchmark: the serving argmin against the exhaustive reference on spaces that grow.

At each size (systems x layouts x batch range x formats x KV placement) prints the number of
configurations, the wall time of building the space, of the argmin (each block at its largest
feasible batch, by bisection on the physics) and of the exhaustive evaluation of every
configuration, their ratio, and that both optima agree. Then times the full-catalog 1M-context
study. Usage: python scripts/bench_solve.py [--model deepseek-v3] [--quick]
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")

from dse.catalog.hardware import default_systems  # noqa: E402
from dse.catalog.models import get_model  # noqa: E402
from dse.optimize.serving import solve_serving  # noqa: E402
from dse.optimize.space import SpaceOptions, build_space, exhaustive  # noqa: E402
from dse.physics.serving import Request
from dse.studies.base import load_study  # noqa: E402
from dse.studies.contract import solve_study  # noqa: E402

SIZES = [
    dict(n_sys=1, tp=(1,), pp=(1,), chips=8, batch=64, wd=("fp8",), kd=("fp8",), tiers=("hbm",)),
    dict(n_sys=3, tp=(1, 2), pp=(1,), chips=16, batch=128, wd=("fp8",), kd=("fp8",), tiers=("hbm",)),
    dict(n_sys=6, tp=(1, 2, 4), pp=(1, 2), chips=72, batch=256, wd=("bf16", "fp8"), kd=("fp8",), tiers=("hbm",)),
    dict(n_sys=12, tp=(1, 2, 4, 8), pp=(1, 2), chips=144, batch=512, wd=("bf16", "fp8", "fp4"), kd=("bf16", "fp8"),
         tiers=("hbm",)),
    dict(n_sys=19, tp=(1, 2, 4, 8), pp=(1, 2, 4), chips=512, batch=1024, wd=("bf16", "fp8", "fp4"),
         kd=("bf16", "fp8"), tiers=("hbm", "host")),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="deepseek-v3")
    parser.add_argument("--quick", action="store_true", help="only the three smallest sizes")
    args = parser.parse_args()
    model = get_model(args.model)
    first = ("gb200-nvl72", "h200", "b200")  # the smallest sizes need systems that hold the model
    systems = first + tuple(s for s in default_systems() if s not in first)
    work = Request(name="chat", prompt=2000, output=500, tpot_max=0.05)
    print(f"model {model.id}, workload {work.name} ({work.prompt}+{work.output} tokens, TPOT <= {work.tpot_max} s)")
    print(f"{'size':>4} {'configs':>12} {'blocks':>7} {'build s':>8} {'argmin s':>8} {'exhaustive s':>13} "
          f"{'ratio':>7}  optimum (USD/Mtok) argmin / exhaustive")
    for i, size in enumerate(SIZES[:3] if args.quick else SIZES):
        opts = SpaceOptions(systems=systems[: size["n_sys"]], weights_dtypes=size["wd"], kv_dtypes=size["kd"],
                            kv_tiers=size["tiers"], tp=size["tp"], pp=size["pp"], max_racks=4,
                            max_chips_per_stage=size["chips"], max_batch_per_rank=size["batch"])
        t0 = time.perf_counter()
        space = build_space(model, work, opts)
        t_build = time.perf_counter() - t0
        t0 = time.perf_counter()
        mip = solve_serving(space, work.tpot_max)
        t_mip = time.perf_counter() - t0
        t0 = time.perf_counter()
        ref = exhaustive(space, work.tpot_max)
        t_ex = time.perf_counter() - t0
        agree = abs(mip.choice.cost - ref.cost) <= 1e-6 * ref.cost
        print(f"{i + 1:>4} {space.size:>12,} {len(space.blocks):>7,} {t_build:>8.3f} {t_mip:>8.3f} {t_ex:>13.3f} "
              f"{t_ex / t_mip:>7.1f}  {mip.choice.cost:.6g} / {ref.cost:.6g} {'(equal)' if agree else '(DIFFER)'}"
              f"  [{mip.result.status}, gap {mip.result.gap:.1g}, blocks {mip.evaluated}]")
    spec = load_study(os.path.join(os.path.dirname(__file__), "..", "studies", "cheapest_1m_context.yaml"))
    t0 = time.perf_counter()
    out = solve_study(spec)
    total = time.perf_counter() - t0
    s = out.summary["solver"]
    print(f"full-catalog 1M-context study: status {out.summary['status']}, {s['solves']} solves, "
          f"{s['solve_wall_s']:.3f} s solving, {total:.3f} s with building the spaces (no plotting), "
          f"gap {s['gap']:.1g}")


if __name__ == "__main__":
    main()
