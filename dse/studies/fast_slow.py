"""``kind: fast_slow``: what 1.5x-4x the speed of the cost optimum costs (and what a slow mode saves),
re-provisioned, or on the same layout with a smaller batch (the lecture's mechanism).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Annotated

from pydantic import Field, field_validator

from dse.errors import InfeasibleError
from dse.optimize.space import Space, describe_choice, subset
from dse.studies.base import MAX_LIST, StudySpec, _Strict
from dse.studies.common import CONFIG_KEYS, METRICS, Plot, Progress, StudyOutput, entry, run_serving, solve_space
from dse.studies.plotting import TIME_BREAKDOWN, plt, save

USES_STORAGE = False
WORKERS = False


class FastSlowSpec(_Strict):
    """Speed multipliers (TPOT of the base point / TPOT) to price; below 1 is a slow mode."""

    speedups: list[Annotated[float, Field(gt=0, le=100)]] = Field(default=[0.25, 0.5, 1.0, 1.5, 2.0, 2.5, 3.0, 4.0],
                                                                  min_length=1, max_length=MAX_LIST)

    @field_validator("speedups")
    @classmethod
    def _positive(cls, v: list[float]) -> list[float]:
        if not v or any(x <= 0 for x in v):
            raise ValueError(f"must be a non-empty list of numbers > 0, got {v}")
        return sorted(v)


class Spec(StudySpec):
    fast_slow: FastSlowSpec = FastSlowSpec()


def solve_one(space: Space, spec: Spec, out: StudyOutput, ideal: bool) -> None:
    w = space.workload
    base = solve_space(space, spec, w.tpot_max)
    be = entry(space, base, ideal)
    out.summary["best"].append(be)
    out.summary["_results"].append(base.result)
    rows = []
    for s in spec.fast_slow.speedups:
        target = base.choice.step / s
        row = {"model": space.model.id, "workload": w.name, "speed_multiplier": s, "tpot_target_s": target}
        try:
            r = solve_space(space, spec, target)
        except InfeasibleError as exc:
            row.update(status="infeasible", reason=str(exc))
        else:
            out.summary["_results"].append(r.result)
            e = entry(space, r, ideal)
            row.update(status=r.result.status, reason="", cost_multiplier=e["usd_per_mtok"] / be["usd_per_mtok"],
                       speedup_achieved=be["tpot_s"] / e["tpot_s"])
            try:  # the lecture's mechanism: same hardware and layout, only the batch shrinks
                same = solve_space(subset(space, (space.blocks.index == base.choice.block)), spec, target)
                row["cost_multiplier_same_layout"] = entry(space, same, ideal)["usd_per_mtok"] / be["usd_per_mtok"]
                row["batch_same_layout"] = describe_choice(space, same.choice)["batch"]
            except InfeasibleError:
                row["cost_multiplier_same_layout"] = math.nan
                row["batch_same_layout"] = 0
            row.update({k: e[k] for k in (*CONFIG_KEYS, *METRICS, "bound")})
        rows.append(row)
    out.tables.setdefault("fast_slow", []).extend(rows)


def run(spec: Spec, progress: Progress | None = None, storage: str | None = None) -> StudyOutput:
    """Price every speed multiplier of every (model, workload)."""
    return run_serving(spec, solve_one, progress)


def _fast_slow(out: StudyOutput, path: Path) -> None:
    table = out.tables["fast_slow"]
    fig, ax = plt.subplots(figsize=(7, 5))
    ok = table[table["status"] != "infeasible"]
    for (model, workload), g in ok.groupby(["model", "workload"], sort=False):
        line = ax.plot(g["speed_multiplier"], g["cost_multiplier"], "o-", label=f"{model} / {workload}: re-provisioned")
        if "cost_multiplier_same_layout" in g:
            ax.plot(g["speed_multiplier"], g["cost_multiplier_same_layout"], "s--", color=line[0].get_color(),
                    label=f"{model} / {workload}: same layout, smaller batch")
    ax.plot([2.5], [6.0], "r*", markersize=14, label="fast mode at published prices: 2.5x speed for 6x price")
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.axvline(1.0, color="grey", lw=0.8)
    ax.set_yscale("log")
    ax.set_xlabel("speed multiplier (TPOT of the cost optimum / TPOT)")
    ax.set_ylabel("cost multiplier (USD per token / cost optimum)")
    ax.set_title("Fast and slow modes: what speed costs")
    ax.legend(fontsize=8, loc="upper left")
    save(fig, path)


PLOTS = (TIME_BREAKDOWN, Plot("fast_slow", "fast_slow.png", _fast_slow, needs="cost_multiplier"))
