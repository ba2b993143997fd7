"""``kind: deployment``: the cheapest whole deployment of each model for its demand (the deployment program: integer
replicas of aggregated, prefill and decode operating points, several configurations mixed in a pool, one numerics
by a disjunction), per group of systems, solved three ways: aggregated only, disaggregated only, and both mixed.
The table ``modes`` says when splitting prefill from decode pays and at what pool ratio.
"""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path
from typing import Literal

import pandas as pd
from pydantic import Field

from dse.catalog.models import get_model
from dse.errors import InfeasibleError, InputError
from dse.optimize.deployment import check, data_of, greedy, solve_deployment
from dse.optimize.operating_points import operating_points
from dse.optimize.space import build_space
from dse.studies.base import MAX_LIST, Strict, StudySpec
from dse.studies.common import best_table, config_entry
from dse.studies.contract import Optimum, Plot, Progress, Solved, StudyOutput, status_of
from dse.studies.plotting import plt, save

USES_STORAGE = False
WORKERS = False
MODES = {"aggregated": ("aggregated",), "disaggregated": ("disaggregated",), "mixed": ("aggregated", "disaggregated")}
POOL_KEYS = ("role", "system", "replicas", "chips", "racks", "tp", "ep", "pp", "dp", "batch", "weights_dtype",
             "kv_dtype", "kv_tier", "context_parallel", "utilisation", "requests_per_s", "usd_per_s", "ttft_s",
             "tpot_s", "power_w")


class SystemGroup(Strict):
    name: str
    systems: list[str] = Field(min_length=1, max_length=MAX_LIST)


class DeploymentSpec(Strict):
    """Which groups of systems to compare, and how the program is built."""

    groups: list[SystemGroup] = Field(min_length=1, max_length=MAX_LIST)
    gdp: Literal["bigm", "hull"] = "bigm"
    mix_workloads: bool = False
    """Whether the workloads are classes of one deployment (one numerics for all) rather than one each."""


class Spec(StudySpec):
    deployment: DeploymentSpec | None = None

    def check_catalog(self, path: Path, models: dict) -> None:
        from dse.catalog.hardware import default_systems

        if self.deployment is None:
            raise InputError(f"{path}: missing required field 'deployment' (groups of systems to compare)")
        systems = default_systems()
        for i, g in enumerate(self.deployment.groups):
            for j, s in enumerate(g.systems):
                if s not in systems:
                    raise InputError(f"{path}: field 'deployment.groups.{i}.systems.{j}': unknown system '{s}'; "
                                     f"allowed: {', '.join(systems)}")
        for j, w in enumerate(self.workloads):
            if w.demand_tokens_per_s is None:
                raise InputError(f"{path}: field 'workloads.{j}.demand_tokens_per_s': a deployment needs a demand")


def _entry(spec: Spec, model: str, w, group: str, pools: pd.DataFrame, systems: dict, usd_per_s: float,
           mode: str) -> Optimum:
    """The contract's entry: the largest pool's configuration evaluated as `dse evaluate` does, the deployment's
    request-level figures, and every pool.
    """
    main = pools.sort_values("usd_per_s", key=lambda s: s * pools.loc[s.index, "replicas"]).iloc[-1]
    cfg = {k: main[k] for k in ("system", "chips", "racks", "tp", "ep", "pp", "dp", "etp", "batch", "context",
                                "weights_dtype", "kv_dtype", "kv_tier")}
    cfg = {k: (int(v) if k in ("chips", "racks", "tp", "ep", "pp", "dp", "etp", "batch", "context") else v)
           for k, v in cfg.items()}
    e = config_entry(model, w.name, w.prompt, cfg, spec.space.ideal, output=w.output, request_level=True,
                     system=systems[cfg["system"]])
    lam = w.demand_tokens_per_s / w.output
    chips = int((pools["chips"] * pools["replicas"]).sum())
    roles = set(pools["role"])
    e["serving"] = "aggregated" if roles == {"both"} else "disaggregated" if "both" not in roles else "mixed"
    e["chips"] = chips
    e["racks"] = int((pools["racks"] * pools["replicas"]).sum())
    e["usd_per_s"] = usd_per_s
    e["usd_per_request"] = usd_per_s / lam
    e["usd_per_mtok_output"] = usd_per_s / w.demand_tokens_per_s * 1e6
    e["usd_per_mtok_blended"] = usd_per_s / (lam * (w.prompt + w.output)) * 1e6
    e["usd_per_mtok"] = e["usd_per_mtok_output"]
    e["tokens_per_s_per_gpu"] = w.demand_tokens_per_s / chips
    e["tokens_per_s"] = w.demand_tokens_per_s
    e["ttft_s"] = float(pools.loc[pools["role"] != "decode", "ttft_s"].max())
    e["tpot_s"] = float(pools.loc[pools["role"] != "prefill", "tpot_s"].max())
    e["tokens_per_s_per_user"] = 1.0 / e["tpot_s"]
    e["power_w"] = float((pools["power_w"] * pools["replicas"]).sum())
    e["price_kind"] = spec.price
    e["mode_searched"] = mode
    e["pools"] = [{k: (v.item() if hasattr(v, "item") else v) for k, v in p.items() if k in POOL_KEYS}
                  for p in pools.to_dict("records")]
    e["group"] = group
    return Optimum(e, request_level=True)


def solve(spec: Spec, progress: Progress | None = None, storage: str | None = None) -> Solved:
    """Per model, workload (or the mix) and group of systems: operating points, then the program in each mode."""
    dep = spec.deployment
    opts = spec.options()
    results, rows = [], []
    best: list[Optimum] = []
    infeasible: list[dict] = []
    spaces = {}
    from dse.catalog.hardware import default_systems, priced

    catalog = default_systems(spec.price)
    systems = {s: (priced(catalog[s], spec.price, spec.prices[s]) if s in spec.prices else catalog[s])
               for s in catalog}
    batches = [spec.workloads] if dep.mix_workloads else [[w] for w in spec.workloads]
    for model_id in spec.models:
        model = get_model(model_id)
        for ws in batches:
            label = "+".join(w.name for w in ws)
            for g in dep.groups:
                if progress:
                    progress(f"{model_id} / {label} / {g.name}")
                pts = {}
                for w in ws:
                    o = replace(opts, systems=tuple(g.systems))
                    space = build_space(model, w.workload(), o)
                    spaces[(model_id, w.name)] = space
                    pts[w.name] = operating_points(space, context_parallel=(False, True) if spec.space.context_parallel
                                                   else (False,))
                demand = {w.name: w.demand_tokens_per_s / w.output for w in ws}
                found = {}
                for mode, roles in MODES.items():
                    keep = {"aggregated": {"both"}, "disaggregated": {"prefill", "decode"}}
                    allowed = set().union(*(keep[r] for r in roles))
                    d = data_of({c: p[p["role"].isin(allowed)] for c, p in pts.items()}, demand)
                    row = {"model": model_id, "workload": label, "group": g.name, "mode": mode}
                    try:
                        r = solve_deployment(d, spec.solver.name, dep.gdp, spec.solver.time_limit_s)
                    except InfeasibleError as exc:
                        rows.append({**row, "status": "infeasible", "reason": str(exc)})
                        continue
                    bad = check(d, r.pools, {w.name: (w.tpot_max_s, w.ttft_max_s) for w in ws})
                    if bad:
                        raise RuntimeError(f"re-check failed: {bad}")
                    results.append(r.result)
                    p = r.pools
                    chips = {role: int((p.loc[p["role"] == role, "chips"] * p.loc[p["role"] == role, "replicas"]).sum())
                             for role in ("both", "prefill", "decode")}
                    g_cost = greedy(d)
                    found[mode] = r
                    rows.append({**row, "status": r.result.status, "reason": "", "usd_per_s": r.usd_per_s,
                                 "usd_per_hour": r.usd_per_s * 3600,
                                 "usd_per_mtok_output": r.usd_per_s / sum(w.demand_tokens_per_s for w in ws) * 1e6,
                                 "chips": sum(chips.values()), "aggregated_chips": chips["both"],
                                 "prefill_chips": chips["prefill"], "decode_chips": chips["decode"],
                                 "decode_per_prefill_chip": chips["decode"] / chips["prefill"] if chips["prefill"]
                                 else math.nan,
                                 "configurations": len(p), "greedy_usd_per_s": g_cost,
                                 "gain_over_greedy": 1 - r.usd_per_s / g_cost if math.isfinite(g_cost) else math.nan,
                                 "pools": "; ".join(f"{q['role']} x{q['replicas']}: {q['chips']} x {q['system']} "
                                                    f"TP{q['tp']} DP{q['dp']} EP{q['ep']} batch {q['batch']}"
                                                    for q in p.to_dict("records"))})
                if found:
                    mode, r = min(found.items(), key=lambda kv: kv[1].usd_per_s)
                    for w in ws:
                        pools = r.pools[r.pools["cls"] == w.name]
                        if len(pools):
                            best.append(_entry(spec, model_id, w, g.name, pools, systems, float(
                                (pools["usd_per_s"] * pools["replicas"]).sum()), mode))
                else:
                    infeasible.append({"model": model_id, "workload": label,
                                       "reason": f"{g.name}: no mode is feasible"})
    tables = {"modes": pd.DataFrame(rows)}
    if best:
        tables["best"] = best_table(best)
    return Solved(status=status_of(results, infeasible), best=best, infeasible=infeasible, tables=tables,
                  results=results, solver_name=f"pyomo+gdp.{dep.gdp} -> ortools {spec.solver.name}", spaces=spaces,
                  facts={"objective": "usd_per_s", "gdp_transformation": dep.gdp})


def headline(summary: dict, tables: dict[str, pd.DataFrame]) -> list[str]:
    """Per workload and group: the cheapest mode, what disaggregation saves over aggregated, and the pool ratio."""
    t = tables.get("modes")
    lines = []
    if t is None or t.empty:
        return lines
    for (wl, grp), g in t.groupby(["workload", "group"], sort=False):
        ok = g[g["status"] != "infeasible"].set_index("mode")
        if ok.empty:
            lines.append(f"{wl} on {grp}: infeasible")
            continue
        best = ok["usd_per_s"].idxmin()
        agg = ok["usd_per_s"].get("aggregated", math.nan)
        dis = ok["usd_per_s"].get("disaggregated", math.nan)
        save_ = 1 - dis / agg if math.isfinite(agg) and math.isfinite(dis) else math.nan
        ratio = ok["decode_per_prefill_chip"].get("disaggregated", math.nan)
        lines.append(f"{wl} on {grp}: {best} is cheapest at {ok.loc[best, 'usd_per_hour']:,.0f} USD/h; "
                     f"disaggregated vs aggregated {save_:+.1%} saved"
                     + (f", {ratio:.2g} decode chips per prefill chip" if math.isfinite(ratio) else ""))
    return lines


def _modes_plot(out: StudyOutput, path: Path) -> None:
    t = out.tables["modes"]
    t = t[t["status"] != "infeasible"]
    fig, ax = plt.subplots(figsize=(9, 4))
    labels = [f"{w}\n{g}" for w, g in dict.fromkeys(zip(t["workload"], t["group"], strict=True))]
    for i, mode in enumerate(MODES):
        sub = t[t["mode"] == mode].set_index(["workload", "group"])["usd_per_mtok_output"]
        vals = [sub.get((lb.split("\n")[0], lb.split("\n")[1]), float("nan")) for lb in labels]
        ax.bar([j + 0.27 * (i - 1) for j in range(len(labels))], vals, width=0.27, label=mode)
    ax.set_xticks(range(len(labels)), labels, fontsize=7)
    ax.set_ylabel("USD per million output tokens at the demand")
    ax.legend()
    save(fig, path)


PLOTS = (Plot("modes", "modes.png", _modes_plot, needs="usd_per_mtok_output"),)
