"""``kind: cheapest``: the cost optimum of every (model, workload) and the best deployment of every system, on the
request-level objective: USD per request (prefill counted, TTFT and TPOT targets on the request-level figures) of
aggregated replicas and of disaggregated prefill and decode pools (``space.serving``), found by
`dse.optimize.requests` over every (block, batch) pair of the space. With a ``budget`` (GPUs or nodes) or a
workload's demand, every answer is the best whole deployment within the budget and for the demand, costed as
deployed (`dse.optimize.whole`); else the optimum at the fluid pool ratio, reported with its smallest whole
deployment. Table ``serving`` gives each mode's optimum side by side; each `best` entry lists the next
``ALTERNATIVES`` deployments of each mode.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from pydantic import Field, model_validator

from dse.errors import InfeasibleError
from dse.optimize.space import Space
from dse.optimize.whole import Budget
from dse.studies.base import ClosedLoop, Strict, StudySpec
from dse.studies.common import (
    ALTERNATIVES,
    CONFIG_KEYS,
    Found,
    Whole,
    band_columns,
    deployment_text,
    mode_tables,
    optimum,
    pick_modes,
    run_serving,
)
from dse.studies.contract import Chart, Plot, Progress, Solved, StudyOutput
from dse.studies.plotting import TIME_BREAKDOWN, save, subplots

USES_STORAGE = False

WORKERS = False


def OBJECTIVE(spec) -> str:  # noqa: N802 - the kind's OBJECTIVE, which a cheapest study's demand decides
    """What the answers minimize: USD per request as deployed where a budget or the workload's demand asks for whole
    deployments, else at the fluid pool ratio.
    """
    whole = [spec.budget is not None or w.demand_tokens_per_s is not None for w in spec.workloads]
    if all(whole):
        return "usd_per_request"
    if not any(whole):
        return "usd_per_request_fluid"
    return "usd_per_request_fluid (usd_per_request where a workload states its demand)"


class BudgetSpec(Strict):
    """The most GPUs, or nodes (hosts, the catalog's ``chips_per_node``: an 8-GPU server, a GB200 compute tray of
    4), one deployment may take.
    """

    gpus: int | None = Field(default=None, ge=1, le=100_000)
    nodes: int | None = Field(default=None, ge=1, le=10_000)

    @model_validator(mode="after")
    def _one(self) -> BudgetSpec:
        if (self.gpus is None) == (self.nodes is None):
            raise ValueError("state exactly one of gpus and nodes")
        return self

    def budget(self) -> Budget:
        return Budget(self.gpus, self.nodes)


class Spec(StudySpec):
    """A cheapest-deployment study: the common fields and, optionally, a budget each deployment fits in. With a
    budget or a workload's demand, each answer is the best whole deployment (integer replicas per pool) within
    the budget and for the demand, costed as deployed (`dse.optimize.whole`); else the fluid optimum and its
    smallest whole deployment.
    """

    budget: BudgetSpec | None = None

    @model_validator(mode="after")
    def _closed_loop_sets_its_replicas(self) -> Spec:
        if self.budget is not None:
            for i, w in enumerate(self.workloads):
                if isinstance(w.arrival, ClosedLoop):
                    raise ValueError(f"workloads.{i}.arrival: a closed loop ({{concurrency: {w.arrival.concurrency}}}) "
                                     "is held by exactly the replicas it fills (concurrency / (batch x DP x PP)); "
                                     "give it or a budget, not both")
        return self


ROW_KEYS = ("serving", "chips", "usd_per_request", "usd_per_request_fluid", "usd_per_mtok_input",
            "usd_per_mtok_output", "ttft_s", "tpot_s", "tokens_per_s_per_gpu", "tokens_per_s_per_user", "racks",
            *CONFIG_KEYS[2:], "batch_served", "tokens_per_s", "hbm_bytes_per_chip", "usd_per_mtok_blended",
            "prefill_share", "bound", "binding", "calibration", "price_is_estimate")
"""The columns of a table row of an optimum, the operator's figures first (``chips``: the whole deployment's
GPUs; the configuration columns are the decode pool's for a disaggregated one, ``deployment`` spells out both)."""
MODE_KEYS = ("etp", "step_tpot_s", "step_ttft_s", "power_w", "price_kind", "pool_ratio", "prefill_utilisation",
             "context_parallel", "kv_transfer_s")
"""Besides ROW_KEYS, what the ``serving`` table gives of each mode's optimum (the decode pool's layout for a
disaggregated one, with its pools spelled out in ``pools``)."""


def solve_one(space: Space, spec: Spec, ideal: bool, found: Found) -> None:
    w = space.workload
    if space.blocks.empty:
        raise InfeasibleError(f"{space.model.id} / {w.name}: {space.empty_reason}")
    whole = Whole.of(spec.budget.budget() if spec.budget else None, w.demand)
    tables = mode_tables(space, spec, whole)  # every (block, batch) pair, evaluated once per mode
    picked, reasons = pick_modes(space, tables, ideal, alternatives=ALTERNATIVES)
    if not picked:
        raise InfeasibleError("; ".join(reasons))
    found.results += [r.result for _, r in picked]
    e = picked[0][0]
    if whole is not None:
        e["budget"] = None if whole.budget is None else whole.budget.text()
        e["demand_tokens_per_s"] = whole.demand
    if len(picked) > 1:
        alt = picked[1][0]
        e["other_serving"] = alt["serving"]
        e["other_serving_usd_per_request"] = alt["usd_per_request"]
    found.best.append(optimum(*picked[0]))
    modes = []
    for me, _ in picked:
        modes.append({"model": space.model.id, "workload": w.name, "serving": me["serving"], "status": "optimal",
                      "deployment": deployment_text(me["pools"]), "system": me["system"],
                      **{k: me.get(k) for k in (*ROW_KEYS[1:], *MODE_KEYS)}, **band_columns(me), "reason": ""})
    for reason in reasons:
        modes.append({"model": space.model.id, "workload": w.name, "serving": reason.split(":")[0],
                      "status": "infeasible", "reason": reason})
    found.rows.setdefault("serving", []).extend(modes)
    rows = []
    sys_idx = space.blocks["system_idx"]
    for si, system in enumerate(space.systems):
        row = {"model": space.model.id, "workload": w.name, "system": system.id}
        got, why = pick_modes(space, tables, ideal, mask=sys_idx == si)
        if not got:
            row.update(status="infeasible")
        else:
            se, r = got[0]
            found.results.append(r.result)
            row.update(status=r.result.status, serving=se["serving"], deployment=deployment_text(se["pools"]))
            row.update({k: se.get(k) for k in ROW_KEYS[1:]}, **band_columns(se))
        row["reason"] = "; ".join(why) if not got else ""  # last: the first screen shows the answers
        rows.append(row)
    found.rows.setdefault("systems", []).extend(rows)


def solve(spec: Spec, progress: Progress | None = None, storage: str | None = None) -> Solved:
    """Solve every (model, workload), then every system on its own."""
    return run_serving(spec, solve_one, progress)


def _cost_by_system(out: StudyOutput, path: Path) -> None:
    table = out.frames["systems"]
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
CHARTS = (Chart("systems", "tpot_s", "usd_per_request", "Best deployment of each system: TPOT against USD per request "
                "as deployed", label=lambda t: np.array([f"{s}: {d if isinstance(d, str) else ''}" for s, d in
                                                         zip(t["system"], t["deployment"], strict=True)])),)
