"""``kind: fast_slow``: what 1.5x-4x the per-user speed of the cost optimum costs per request (and what a
slow mode saves), re-provisioned (any system, layout and deployment mode), or on the same layout with a
smaller batch (the lecture's mechanism); request level, prefill counted, from every feasible configuration.
"""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path
from typing import Annotated, Literal

import numpy as np
import pandas as pd
from pydantic import Field, field_validator

from dse.errors import InfeasibleError
from dse.optimize.fronts import candidate_chunks, describe_points, front, smallest_whole
from dse.optimize.requests import TOL, prefill_options
from dse.optimize.space import Space
from dse.studies.base import MAX_LIST, Strict, StudySpec
from dse.studies.common import ALTERNATIVES, Found, mode_tables, optimum, pick_modes, run_serving
from dse.studies.contract import Plot, Progress, Solved, StudyOutput
from dse.studies.plotting import TIME_BREAKDOWN, save, subplots

USES_STORAGE = False
OBJECTIVE = "usd_per_request_fluid"
"""What each mode's optimum minimizes: USD per request at the fluid pool ratio over every feasible configuration."""
WORKERS = False


class FastSlowSpec(Strict):
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

    decide: Literal["expected"] = Field(
        default="expected", description="`expected` only: the speed multipliers are ratios of points on one front of "
        "predictions (`dse.optimize.fronts.front`), which carries no per-system band, so the base point is chosen "
        "as predicted too; its band and whether it is decided are still reported")


def solve_one(space: Space, spec: Spec, ideal: bool, found: Found) -> None:
    """Every speed multiplier priced from all feasible configurations (the complete cost front's candidates):
    the cheapest at TPOT <= base TPOT / multiplier, re-provisioned or on the base point's own layout.
    """
    w = space.workload
    picked, reasons = pick_modes(space, mode_tables(space, spec), ideal, alternatives=ALTERNATIVES)
    if not picked:
        raise InfeasibleError("; ".join(reasons))
    found.best.append(optimum(*picked[0]))
    found.results += [r.result for _, r in picked]
    relaxed = replace(space, workload=replace(w, tpot_max=None))  # slow modes lie above the workload's target
    req = relaxed.workload
    agg = "aggregated" in spec.space.serving
    dis = prefill_options(relaxed, req) if "disaggregated" in spec.space.serving else None
    # the cheapest configuration at TPOT <= any target lies on the cost front of every feasible configuration
    cand = front(relaxed, req, agg, dis, "cost")
    cost = cand["usd_per_request"].to_numpy()
    tpot = cand["tpot_s"].to_numpy()
    base_i = int(np.argmin(np.where(tpot <= (w.tpot_max or np.inf) * (1 + TOL), cost, np.inf)))
    base = cand.iloc[base_i]
    # the lecture's mechanism: the base point's own hardware and layout (and prefill pool), only the batch shrinks
    agg_base = base["serving"] == "aggregated"
    same = pd.concat(candidate_chunks(relaxed, req, agg_base, None if agg_base else dis, "cost",
                                      only=np.array([int(base["pos"])])), ignore_index=True)
    rows = []
    for s in spec.fast_slow.speedups:
        target = base["tpot_s"] / s
        row = {"model": space.model.id, "workload": w.name, "speed_multiplier": s, "tpot_target_s": target}
        ok = tpot <= target * (1 + TOL)
        if not ok.any():
            row.update(status="infeasible", reason=f"no configuration reaches a TPOT of {target * 1e3:.3g} ms "
                       f"(the fastest is {tpot.min() * 1e3:.3g} ms)")
            rows.append(row)
            continue
        i = int(np.argmin(np.where(ok, cost, np.inf)))
        point = cand.iloc[[i]]
        row.update(status="optimal", reason="", cost_multiplier=cost[i] / base["usd_per_request"],
                   speedup_achieved=base["tpot_s"] / tpot[i])
        k = np.flatnonzero(same["tpot_s"].to_numpy() <= target * (1 + TOL))
        if len(k):
            j = k[int(np.argmin(same["usd_per_request"].to_numpy()[k]))]
            row["cost_multiplier_same_layout"] = same["usd_per_request"].iloc[j] / base["usd_per_request"]
            row["batch_same_layout"] = int(same["n"].iloc[j]) * int(space.blocks["dp"][int(base["pos"])])
        else:
            row["cost_multiplier_same_layout"] = math.nan
            row["batch_same_layout"] = 0
        desc = describe_points(relaxed, point, dis).iloc[0].to_dict()
        row.update(desc)
        row.update(smallest_whole(point, dis, relaxed.served(req)).iloc[0].to_dict())
        row.update({k: float(point[k].iloc[0]) for k in ("tpot_s", "tokens_per_s_per_user")})
        rows.append(row)
    found.rows.setdefault("fast_slow", []).extend(rows)


def solve(spec: Spec, progress: Progress | None = None, storage: str | None = None) -> Solved:
    """Price every speed multiplier of every (model, workload)."""
    return run_serving(spec, solve_one, progress)


def _fast_slow(out: StudyOutput, path: Path) -> None:
    table = out.frames["fast_slow"]
    fig, ax = subplots(figsize=(7, 5))
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
    ax.set_ylabel("cost multiplier (USD per request / cost optimum)")
    ax.set_title("Fast and slow modes: what speed costs")
    ax.legend(fontsize=8, loc="upper left")
    save(fig, path)


PLOTS = (TIME_BREAKDOWN, Plot("fast_slow", "fast_slow.png", _fast_slow, needs="cost_multiplier"))
