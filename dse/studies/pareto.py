"""``kind: pareto``: the TPOT-cost front by the epsilon-constraint method, from the cost optimum down
to the fastest configuration; each point is the cheapest at its TPOT and the fastest at that cost.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from pydantic import Field

from dse.errors import InfeasibleError
from dse.optimize.space import Space
from dse.studies.base import StudySpec, _Strict
from dse.studies.common import Plot, Progress, StudyOutput, entry, run_serving, solve_space
from dse.studies.plotting import TIME_BREAKDOWN, plt, save

USES_STORAGE = False
LABELS = 6
"""Points labelled on the Pareto plot."""
WORKERS = False


class ParetoSpec(_Strict):
    """Epsilon-constraint sweep of the TPOT target, from the cost optimum down to the fastest point."""

    min_step: float = Field(default=0.02, gt=0, lt=1, description="relative TPOT step between front points")
    max_points: int = Field(default=60, ge=2, le=1000)


class Spec(StudySpec):
    pareto: ParetoSpec = ParetoSpec()


def solve_one(space: Space, spec: Spec, out: StudyOutput, ideal: bool) -> None:
    w = space.workload
    base = solve_space(space, spec, w.tpot_max)
    out.summary["best"].append(entry(space, base, ideal))
    out.summary["_results"].append(base.result)
    eps = base.choice.step
    rows = []
    while len(rows) < spec.pareto.max_points:
        try:
            cheapest = solve_space(space, spec, eps)
            fastest = solve_space(space, spec, eps, objective="latency", cost_max=cheapest.choice.cost,
                                  start=cheapest.choice)
        except InfeasibleError:
            break
        out.summary["_results"] += [cheapest.result, fastest.result]
        e = entry(space, fastest, ideal)
        e["label"] = f"{e['system']} TP{e['tp']} EP{e['ep']} PP{e['pp']} B{e['batch']} {e['weights_dtype']}"
        rows.append(e)
        eps = fastest.choice.step * (1 - spec.pareto.min_step)
    out.tables.setdefault("pareto", []).extend(rows)


def run(spec: Spec, progress: Progress | None = None, storage: str | None = None) -> StudyOutput:
    """The front of every (model, workload)."""
    return run_serving(spec, solve_one, progress)


def _pareto(out: StudyOutput, path: Path) -> None:
    table = out.tables["pareto"]
    fig, ax = plt.subplots(figsize=(9, 6))
    for (model, workload), g in table.groupby(["model", "workload"], sort=False):
        ax.plot(g["tpot_s"] * 1e3, g["usd_per_mtok"], "o-", drawstyle="steps-post", label=f"{model} / {workload}")
        g = g.reset_index(drop=True)
        shown = sorted({round(i) for i in np.linspace(0, len(g) - 1, min(LABELS, len(g)))})
        for i in shown:  # a handful of labels, spread along the front; the report's hover chart has them all
            r = g.iloc[i]
            right = i > len(g) / 2  # labels of the slow end point leftwards, inside the axes
            ax.annotate(r["label"], (r["tpot_s"] * 1e3, r["usd_per_mtok"]), fontsize=7, xytext=(-6 if right else 6, 4),
                        ha="right" if right else "left", textcoords="offset points",
                        bbox={"boxstyle": "round,pad=0.2", "fc": "white", "alpha": 0.8})
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("TPOT (ms per output token)")
    ax.set_ylabel("USD per million output tokens")
    ax.set_title("Pareto front: latency against cost (each point optimal for its TPOT target)")
    ax.legend(fontsize=8)
    save(fig, path)


PLOTS = (TIME_BREAKDOWN, Plot("pareto", "pareto.png", _pareto))
