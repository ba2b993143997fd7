"""``kind: cheapest``: the cost optimum of every (model, workload), the fleet for its demand, and the
best configuration of every system, on the request-level objective: USD per request of an
aggregated replica (prefill counted, TTFT and TPOT targets on the request-level figures), found by
`dse.optimize.requests` over every (block, batch) pair of the space.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from dse.errors import InfeasibleError
from dse.optimize.requests import block_optima, pick
from dse.optimize.space import Choice, Space, describe_choice
from dse.studies.base import StudySpec
from dse.studies.common import CONFIG_KEYS, METRICS, Plot, Progress, StudyOutput, entry, run_serving
from dse.studies.plotting import TIME_BREAKDOWN, plt, save

USES_STORAGE = False
WORKERS = False


class Spec(StudySpec):
    """A cheapest-configuration study: the common fields only."""


def solve_one(space: Space, spec: StudySpec, out: StudyOutput, ideal: bool) -> None:
    w = space.workload
    if space.blocks.empty:
        raise InfeasibleError(f"{space.model.id} / {w.name}: {space.empty_reason}")
    opt = block_optima(space, demand=w.demand)  # every (block, batch) pair, evaluated once
    res = pick(space, opt)
    e = entry(space, res, ideal)
    if w.demand is not None and opt.demand is not None:
        d = opt.demand
        row = opt.blocks.iloc[d["pos"]]
        choice = Choice(int(opt.blocks.index[d["pos"]]), d["n"], float("nan"), float("nan"))
        e["demand_tokens_per_s"] = w.demand
        e["replicas"] = d["replicas"]
        e["usd_per_mtok_at_demand"] = d["usd_per_s"] / w.demand * 1e6
        e["demand_config"] = describe_choice(space, choice)
        e["demand_chips"] = d["replicas"] * int(row["chips"])
    out.summary["best"].append(e)
    out.summary["_results"].append(res.result)
    rows = []
    sys_idx = space.blocks["system_idx"].to_numpy()
    for si, system in enumerate(space.systems):
        row = {"model": space.model.id, "workload": w.name, "system": system.id}
        try:
            r = pick(space, opt, mask=sys_idx == si)
        except InfeasibleError as exc:
            row.update(status="infeasible", reason=str(exc))
        else:
            out.summary["_results"].append(r.result)
            se = entry(space, r, ideal)
            row.update(status=r.result.status, reason="")
            row.update({k: se[k] for k in ("chips", "racks", *CONFIG_KEYS[2:], *METRICS, "usd_per_request",
                                             "prefill_share", "bound", "binding", "calibration", "price_is_estimate")})
        rows.append(row)
    out.tables.setdefault("systems", []).extend(rows)


def run(spec: Spec, progress: Progress | None = None, storage: str | None = None) -> StudyOutput:
    """Solve every (model, workload), then every system on its own."""
    return run_serving(spec, solve_one, progress)


def _cost_by_system(out: StudyOutput, path: Path) -> None:
    table: pd.DataFrame = out.tables["systems"]
    groups = list(table.groupby(["model", "workload"], sort=False))
    fig, axes = plt.subplots(len(groups), 1, figsize=(9, 2.2 + 0.28 * table["system"].nunique() * len(groups)),
                             squeeze=False)
    for ax, ((model, workload), g) in zip(axes[:, 0], groups, strict=True):
        g = g.iloc[::-1].reset_index(drop=True)
        ok = (g["status"] != "infeasible").to_numpy()
        y = np.arange(len(g))
        cost = g["usd_per_request"].to_numpy(dtype=float) if "usd_per_request" in g else np.full(len(g), np.nan)
        if ok.any():
            left = np.nanmin(cost[ok]) / 2
            ax.barh(y[ok], cost[ok] - left, left=left, color="#3b7dd8")
            ax.set_xscale("log")
            for yi, c in zip(y[ok], cost[ok], strict=True):
                ax.text(c, yi, f" {c:.3g}", va="center", fontsize=7)
        for yi in y[~ok]:
            ax.text(0.01, yi, "infeasible", transform=ax.get_yaxis_transform(), va="center", fontsize=8, color="#b00")
        ax.set_yticks(y, g["system"], fontsize=8)
        ax.set_xlabel("USD per request, prefill included (best aggregated configuration of each system)")
        ax.set_title(f"{model} / {workload}", fontsize=10)
    save(fig, path)


PLOTS = (Plot("systems", "cost_by_system.png", _cost_by_system, needs="usd_per_request"), TIME_BREAKDOWN)
