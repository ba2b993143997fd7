"""Scale benchmark of the lifetime program (compute equalization): the shipped study's physics, the program solved
over a growing menu of models and a growing horizon of weeks; prints the program's size, the time and the gap of
each solver, and the gain over the greedy plan. The physics of each model is computed once (and timed apart).
A report, not a timed test.

    PYTHONPATH=. python scripts/bench_equalization.py [--limit 120] [--solvers scip,highs] [--menus 3,6,15]
        [--launch 13,26,52]
"""

from __future__ import annotations

import argparse
import time
from dataclasses import replace

from dse.errors import InfeasibleError, SolverLimitError
from dse.optimize.bridge import compile_model
from dse.optimize.equalization import cost_of, greedy, held, lifetime_data, narrow_serving, solve_lifetime
from dse.studies.base import load_study
from dse.studies.compute_equalization import LifeSolver, menu_of
from formulations.compute_equalization import build


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--study", default="studies/compute_equalization.yaml")
    ap.add_argument("--limit", type=float, default=120.0)
    ap.add_argument("--solvers", default="scip,highs")
    ap.add_argument("--menus", default="3,6,15")
    ap.add_argument("--launch", default="13,26,52")
    a = ap.parse_args()
    spec = load_study(a.study)
    sv = LifeSolver(spec)
    menu = menu_of(spec)
    weeks = max(int(x) for x in a.launch.split(",")) + spec.equalization.deployment_weeks
    sv.life = replace(sv.life, inventory={s: [v[0]] * weeks for s, v in sv.life.inventory.items()})
    t0 = time.perf_counter()
    for key in menu:
        sv.options_of(key)
    print(f"physics of {len(menu)} models: {time.perf_counter() - t0:.1f} s")
    best = sorted(menu, key=lambda k: abs(k[0] - 7168) + 1000 * (k[1] != 32))  # around the study's optimum first
    print(f"{'models':>6} {'launch by':>9} {'vars':>6} {'rows':>6} {'solver':>6} {'status':>8} {'wall s':>7} "
          f"{'gap':>8} {'USD':>14} {'greedy +':>9}")
    for n in (int(x) for x in a.menus.split(",")):
        keys = best[:n]
        for launch in (int(x) for x in a.launch.split(",")):
            life = replace(sv.life, launch_by=launch)
            d, _ = lifetime_data([sv.options_of(k) for k in keys], sv.quality, life)
            d = narrow_serving(d)  # as the study solves it
            if d.models.empty:
                continue
            size = compile_model(build(d))[0]
            g = greedy(d)
            g_usd = cost_of(d, held(d, g))["total"] if g is not None else float("inf")
            for solver in a.solvers.split(","):
                t = time.perf_counter()
                try:
                    r = solve_lifetime(d, solver, a.limit)
                    res = r.result
                    print(f"{n:>6} {launch:>9} {size.num_variables:>6} {size.num_constraints:>6} {solver:>6} "
                          f"{res.status:>8} {time.perf_counter() - t:>7.1f} {res.gap:>8.1e} {res.objective:>14,.0f} "
                          f"{g_usd / res.objective - 1:>9.2%}")
                except (InfeasibleError, SolverLimitError) as exc:
                    print(f"{n:>6} {launch:>9} {size.num_variables:>6} {size.num_constraints:>6} {solver:>6} "
                          f"{'-':>8} {time.perf_counter() - t:>7.1f}  {str(exc)[:60]}")


if __name__ == "__main__":
    main()
