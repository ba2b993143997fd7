"""``kind: cheapest``: the cost optimum of every (model, workload), the deployment for its demand, and
the best deployment of every system, on the request-level objective: USD per request (prefill
counted, TTFT and TPOT targets on the request-level figures) of aggregated replicas and of
disaggregated prefill and decode pools (``space.serving``), found by `dse.optimize.requests` over
every (block, batch) pair of the space. Table ``serving`` gives each mode's optimum side by side.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from dse.errors import InfeasibleError
from dse.optimize.requests import disaggregated_demand
from dse.optimize.space import Choice, Space, describe_choice
from dse.studies.base import StudySpec
from dse.studies.common import (
    CONFIG_KEYS,
    METRICS,
    Found,
    band_columns,
    mode_tables,
    optimum,
    pick_modes,
    pool_text,
    run_serving,
)
from dse.studies.contract import Chart, Plot, Progress, Solved, StudyOutput
from dse.studies.plotting import TIME_BREAKDOWN, save, subplots

USES_STORAGE = False
WORKERS = False


class Spec(StudySpec):
    """A cheapest-configuration study: the common fields only."""


ROW_KEYS = ("serving", "chips", "racks", *CONFIG_KEYS[2:], *METRICS, "usd_per_request", "usd_per_mtok_input",
            "usd_per_mtok_output", "usd_per_mtok_blended", "tokens_per_s_per_gpu", "tokens_per_s_per_user",
            "prefill_share", "bound", "binding", "calibration", "price_is_estimate")
MODE_KEYS = ("etp", "step_tpot_s", "step_ttft_s", "power_w", "price_kind", "pool_ratio", "prefill_utilisation",
             "context_parallel", "kv_transfer_s")
"""Besides ROW_KEYS, what the ``serving`` table gives of each mode's optimum (the decode pool's layout for a
disaggregated one, with its pools spelled out in ``pools``)."""


def _demand(space: Space, tables, e: dict, demand: float) -> None:
    """The cheapest whole deployment for the workload's demand in the chosen mode, added to its entry."""
    e["demand_tokens_per_s"] = demand
    if e["serving"] == "aggregated" and tables.aggregated is not None and tables.aggregated.demand is not None:
        d = tables.aggregated.demand
        opt = tables.aggregated
        choice = Choice(int(opt.blocks.index[d["pos"]]), d["n"], float("nan"), float("nan"))
        e["replicas"] = d["replicas"]
        e["usd_per_mtok_at_demand"] = d["usd_per_s"] / demand * 1e6
        e["demand_config"] = describe_choice(space, choice)
        e["demand_chips"] = d["replicas"] * int(opt.blocks.iloc[d["pos"]]["chips"])
    elif e["serving"] == "disaggregated" and tables.disaggregated is not None:
        d = disaggregated_demand(space, tables.disaggregated, demand)
        if d is None:
            return
        b = space.blocks
        dec = describe_choice(space, Choice(int(b.index[d["decode_pos"]]), d["n"], float("nan"), float("nan")))
        pre = describe_choice(space, Choice(int(b.index[d["prefill_pos"]]), 1, float("nan"), float("nan")))
        e["replicas"] = d["decode_replicas"]
        e["prefill_replicas_at_demand"] = d["prefill_replicas"]
        e["usd_per_mtok_at_demand"] = d["usd_per_s"] / demand * 1e6
        e["demand_config"] = {"decode": dec, "prefill": {**pre, "context_parallel": d["context_parallel"]}}
        e["demand_chips"] = d["decode_replicas"] * dec["chips"] + d["prefill_replicas"] * pre["chips"]


def solve_one(space: Space, spec: StudySpec, ideal: bool, found: Found) -> None:
    w = space.workload
    if space.blocks.empty:
        raise InfeasibleError(f"{space.model.id} / {w.name}: {space.empty_reason}")
    tables = mode_tables(space, spec, demand=w.demand)  # every (block, batch) pair, evaluated once per mode
    picked, reasons = pick_modes(space, tables, ideal)
    if not picked:
        raise InfeasibleError("; ".join(reasons))
    found.results += [r.result for _, r in picked]
    e = picked[0][0]
    if len(picked) > 1:
        alt = picked[1][0]
        e["other_serving"] = alt["serving"]
        e["other_serving_usd_per_request"] = alt["usd_per_request"]
    if w.demand is not None:
        _demand(space, tables, e, w.demand)
    found.best.append(optimum(*picked[0]))
    modes = []
    for me, _ in picked:
        modes.append({"model": space.model.id, "workload": w.name, "status": "optimal", "reason": "",
                      "system": me["system"], **{k: me.get(k) for k in (*ROW_KEYS, *MODE_KEYS)},
                      **band_columns(me), "pools": "; ".join(pool_text(p) for p in me["pools"])})
    for reason in reasons:
        modes.append({"model": space.model.id, "workload": w.name, "serving": reason.split(":")[0],
                      "status": "infeasible", "reason": reason})
    found.rows.setdefault("serving", []).extend(modes)
    rows = []
    sys_idx = space.blocks["system_idx"].to_numpy()
    for si, system in enumerate(space.systems):
        row = {"model": space.model.id, "workload": w.name, "system": system.id}
        got, why = pick_modes(space, tables, ideal, mask=sys_idx == si)
        if not got:
            row.update(status="infeasible", reason="; ".join(why))
        else:
            se, r = got[0]
            found.results.append(r.result)
            row.update(status=r.result.status, reason="")
            row.update({k: se.get(k) for k in ROW_KEYS}, **band_columns(se))
        rows.append(row)
    found.rows.setdefault("systems", []).extend(rows)


def solve(spec: Spec, progress: Progress | None = None, storage: str | None = None) -> Solved:
    """Solve every (model, workload), then every system on its own."""
    return run_serving(spec, solve_one, progress)


def _cost_by_system(out: StudyOutput, path: Path) -> None:
    table: pd.DataFrame = out.tables["systems"]
    groups = list(table.groupby(["model", "workload"], sort=False))
    fig, axes = subplots(len(groups), 1, figsize=(9, 2.2 + 0.28 * table["system"].nunique() * len(groups)),
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
        ax.set_xlabel("USD per request, prefill included (best deployment of each system)")
        ax.set_title(f"{model} / {workload}", fontsize=10)
    save(fig, path)


PLOTS = (Plot("systems", "cost_by_system.png", _cost_by_system, needs="usd_per_request"), TIME_BREAKDOWN)
CHARTS = (Chart("systems", "tpot_s", "usd_per_mtok", "Best configuration of each system: TPOT against cost",
                label=lambda t: t["model"] + " / " + t["workload"] + " on " + t["system"]),)
