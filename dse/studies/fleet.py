"""``kind: fleet``: how many nodes (8-GPU servers) or racks of which systems a portfolio of models and request
classes needs through a day of demand, reserved for the day at a committed price or rented by the hour, within
an inventory (less what is lent to other work), a site power cap and a budget, with N+1 replicas (the fleet
program). Writes ``fleet.csv``: nodes per system and replicas per configuration and time slice.
"""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path
from typing import Annotated, Literal

import numpy as np
import pandas as pd
from pydantic import Field

from dse.catalog.calibration import band_keys, bands_of
from dse.catalog.hardware import PRICE_KINDS, default_systems, priced
from dse.catalog.models import get_model
from dse.errors import InputError
from dse.optimize.fleet import FleetData, check, greedy, replica_nodes, solve_fleet
from dse.optimize.operating_points import operating_points
from dse.optimize.requests import unit_replicas
from dse.optimize.space import build_space
from dse.studies.base import MAX_LIST, Strict, StudySpec
from dse.studies.common import config_entry, pools_quantiles
from dse.studies.contract import Optimum, Plot, Progress, Solved, StudyOutput
from dse.studies.plotting import save, subplots

USES_STORAGE = False
WORKERS = False
CFG = ("system", "chips", "racks", "tp", "ep", "pp", "dp", "etp", "batch", "context", "weights_dtype", "kv_dtype",
       "kv_tier")
POOL = ("role", "system", "chips", "racks", "tp", "ep", "pp", "dp", "batch", "weights_dtype", "kv_dtype", "kv_tier",
        "context_parallel", "utilisation")


Nodes = Annotated[int, Field(ge=0, le=10_000_000)]
Usd = Annotated[float, Field(gt=0, le=1e6)]
Watts = Annotated[float, Field(gt=0, le=1e6)]


class FleetSpec(Strict):
    """The fleet's systems, inventory, prices, power, budget and the day's demand curve."""

    systems: list[str] = Field(min_length=1, max_length=MAX_LIST)
    inventory_nodes: dict[str, Nodes]
    """Nodes (the system's scale-up domain: an 8-GPU server, or an NVL72 rack) available per system."""
    lent_nodes: dict[str, list[Nodes]] = {}
    """Nodes lent to other work per system and slice (taken out of the inventory)."""
    demand_curve: list[Annotated[float, Field(ge=0, le=1000)]] = Field(min_length=1, max_length=168)
    """Share of each workload's demand (``demand_tokens_per_s`` is the peak) in each slice."""
    slice_h: float = Field(default=1.0, gt=0, le=24)
    reserved_price: str = "rental_3yr"
    hourly_price: str = "on_demand"
    reserved_usd_per_gpu_hour: dict[str, Usd] = {}
    hourly_usd_per_gpu_hour: dict[str, Usd] = {}
    power_all_in_w_per_gpu: dict[str, Watts] = {}
    """All-in power per GPU where the catalog has none (else the catalog's all-in figure)."""
    power_cap_kw: float | None = Field(default=None, gt=0, le=1e9)
    budget_usd_per_day: float | None = Field(default=None, gt=0, le=1e12)
    fixed_usd_per_day: dict[str, Annotated[float, Field(ge=0, le=1e12)]] = {}
    n_plus_one: bool = True
    options_per_system: int = Field(default=3, ge=1, le=50)
    """Operating points kept per (model, workload, system): the fewest nodes per request/s first."""
    modes: list[Literal["aggregated", "disaggregated"]] = Field(default=["aggregated", "disaggregated"], min_length=1,
                                                                max_length=2)


class Spec(StudySpec):
    fleet: FleetSpec | None = None
    system_fields = ("fleet.systems",)

    def check_catalog(self, path: Path, models: dict) -> None:
        f = self.fleet
        if f is None:
            raise InputError(f"{path}: missing required field 'fleet' (systems, inventory_nodes, demand_curve)")
        for field, kind in (("reserved_price", f.reserved_price), ("hourly_price", f.hourly_price)):
            if kind not in PRICE_KINDS:
                raise InputError(f"{path}: field 'fleet.{field}': '{kind}'; allowed: {', '.join(PRICE_KINDS)}")
        for field in ("inventory_nodes", "lent_nodes", "reserved_usd_per_gpu_hour", "hourly_usd_per_gpu_hour",
                      "power_all_in_w_per_gpu", "fixed_usd_per_day"):
            for s in getattr(f, field):
                if s not in f.systems:
                    raise InputError(f"{path}: field 'fleet.{field}.{s}': not a system of the fleet; allowed: "
                                     f"{', '.join(f.systems)}")
        for s in f.systems:
            if s not in f.inventory_nodes:
                raise InputError(f"{path}: field 'fleet.inventory_nodes': no inventory for system '{s}'; "
                                 f"allowed: {', '.join(f.systems)} (one entry each)")
        for s, lent in f.lent_nodes.items():
            if len(lent) != len(f.demand_curve):
                raise InputError(f"{path}: field 'fleet.lent_nodes.{s}': {len(lent)} slices, the demand curve has "
                                 f"{len(f.demand_curve)}")
            over = [t for t, n in enumerate(lent) if n > f.inventory_nodes.get(s, 0)]
            if over:
                raise InputError(f"{path}: field 'fleet.lent_nodes.{s}.{over[0]}': lends {lent[over[0]]} nodes, more "
                                 f"than the inventory of {f.inventory_nodes.get(s, 0)}")
        for j, w in enumerate(self.workloads):
            if w.demand_tokens_per_s is None:
                raise InputError(f"{path}: field 'workloads.{j}.demand_tokens_per_s': the fleet needs each peak demand")


def _price(f: FleetSpec, s: str, kind: str, override: dict) -> float:
    """USD per GPU-hour of a kind (the study's figure first); NaN where neither has one."""
    if s in override:
        return float(override[s])
    return default_systems(kind)[s].price_per_s * 3600


def _options(spec: Spec, model_id: str, w, sid: str, node_chips: int) -> list[dict]:
    """The (model, workload) options on one system: aggregated replicas and disaggregated units (prefill and decode
    replicas in whole numbers near their rate ratio), each with whole nodes, the fewest nodes per request/s first.
    """
    f = spec.fleet
    opts = replace(spec.options(), systems=(sid,))
    space = build_space(get_model(model_id), w.workload(), opts)
    pts = operating_points(space, tuple(f.modes))
    if pts.empty:
        return []
    pts = pts.assign(nodes=replica_nodes(pts["chips"].to_numpy(), node_chips))
    out = []
    for p in pts[pts["role"] == "both"].to_dict("records"):
        out.append({"serving": "aggregated", "nodes": int(p["nodes"]), "requests_per_s": p["requests_per_s"],
                    "cfg": {k: p[k] for k in CFG}, "pools": [{**{k: p[k] for k in POOL}, "replicas": 1}]})
    for _, grp in pts.groupby("group"):
        pre = grp[grp["role"] == "prefill"]
        if pre.empty:
            continue
        pb = pre.loc[(pre["nodes"] / pre["requests_per_s"]).idxmin()].to_dict()
        for d in grp[grp["role"] == "decode"].to_dict("records"):
            npre, ndec = unit_replicas(d["requests_per_s"] / pb["requests_per_s"], within=0.1, largest=16)
            rate = min(ndec * d["requests_per_s"], npre * pb["requests_per_s"])
            out.append({"serving": "disaggregated", "nodes": int(npre * pb["nodes"] + ndec * d["nodes"]),
                        "requests_per_s": rate, "cfg": {k: d[k] for k in CFG},
                        "pools": [{**{k: pb[k] for k in POOL}, "replicas": npre},
                                  {**{k: d[k] for k in POOL}, "replicas": ndec}]})
    out.sort(key=lambda o: o["nodes"] / o["requests_per_s"])
    return out[:f.options_per_system]


def fleet_data(spec: Spec, progress: Progress | None = None) -> tuple[FleetData, list[dict], dict]:
    """The fleet program's data from the study: systems priced by kind, options from the physics, the demand."""
    f = spec.fleet
    catalog = default_systems()
    slices = list(range(len(f.demand_curve)))
    sys_rows, no_price, no_power, power_src = {}, [], [], {}
    for s in f.systems:
        res = _price(f, s, f.reserved_price, f.reserved_usd_per_gpu_hour)
        hr = _price(f, s, f.hourly_price, f.hourly_usd_per_gpu_hour)
        if not (math.isfinite(res) and math.isfinite(hr)):
            no_price.append(s)
            continue
        sy = catalog[s]
        node = int(sy.scaleup_domain)
        if s in f.power_all_in_w_per_gpu:
            pw, power_src[s] = f.power_all_in_w_per_gpu[s], "study"
        elif math.isfinite(sy.power_all_in_w):
            pw, power_src[s] = sy.power_all_in_w, "catalog all-in"
        elif math.isfinite(sy.power):
            pw, power_src[s] = sy.power, "catalog TDP (no all-in figure)"
        else:
            no_power.append(s)  # no power figure: it cannot count against the site's cap
            continue
        sys_rows[s] = {"node_chips": node, "reserved_usd_per_node_h": res * node, "hourly_usd_per_node_h": hr * node,
                       "power_per_node_w": pw * node, "fixed_usd_per_day": f.fixed_usd_per_day.get(s, 0.0)}
    systems = pd.DataFrame.from_dict(sys_rows, orient="index")
    inv = pd.DataFrame({t: [f.inventory_nodes[s] - (f.lent_nodes.get(s, [0] * len(slices))[t]) for s in systems.index]
                        for t in slices}, index=systems.index)
    options, rows, index = [], [], []
    for model_id in spec.models:
        for w in spec.workloads:
            index.append((model_id, w.name))
            rows.append([w.demand_tokens_per_s / w.output * c for c in f.demand_curve])
            for s in systems.index:
                if progress:
                    progress(f"{model_id} / {w.name} / {s}")
                for o in _options(spec, model_id, w, s, int(systems.loc[s, "node_chips"])):
                    options.append({"model": model_id, "cls": w.name, "system": s, **o})
    demand = pd.DataFrame(rows, index=pd.MultiIndex.from_tuples(index), columns=slices)
    table = pd.DataFrame(options, columns=["model", "cls", "system", "serving", "nodes", "requests_per_s", "cfg",
                                           "pools"])
    data = FleetData(systems, inv, table, demand, f.slice_h,
                     None if f.power_cap_kw is None else f.power_cap_kw * 1e3, f.budget_usd_per_day, f.n_plus_one)
    return data, options, {"left_out_for_want_of_a_price": no_price, "left_out_for_want_of_a_power_figure": no_power,
                           "power_source": power_src}


def solve(spec: Spec, progress: Progress | None = None, storage: str | None = None) -> Solved:
    """Options from the physics, the fleet program, its re-check, duals and the greedy baseline; fleet.csv."""
    f = spec.fleet
    d, options, info = fleet_data(spec, progress)
    r = solve_fleet(d, spec.solver.name, spec.solver.time_limit_s)
    bad = check(d, r)
    if bad:
        raise RuntimeError(f"re-check of the fleet solution failed: {bad}")
    g = greedy(d)
    slices = d.slices
    rows = []
    for s in d.systems.index:
        for t in slices:
            held = r.reserved[s] + r.hourly.loc[s, t]
            sel = (d.options["system"] == s).to_numpy()
            busy = float((d.options.loc[sel, "nodes"].to_numpy() * r.replicas.loc[sel, t].to_numpy()).sum())
            rows.append({"row": "system", "slice": t, "system": s, "reserved_nodes": r.reserved[s],
                         "hourly_nodes": r.hourly.loc[s, t], "nodes": held,
                         "chips": held * d.systems.loc[s, "node_chips"],
                         "inventory_nodes": d.inventory.loc[s, t], "utilisation": busy / held if held else math.nan,
                         "power_w": held * d.systems.loc[s, "power_per_node_w"]})
    for k, o in enumerate(options):
        for t in slices:
            n = int(r.replicas.loc[k, t])
            if not n:
                continue
            need = float(d.demand.loc[(o["model"], o["cls"]), t])
            cap = float((d.options["requests_per_s"] * r.replicas[t])[
                (d.options["model"] == o["model"]) & (d.options["cls"] == o["cls"])].sum())
            rows.append({"row": "replicas", "slice": t, "model": o["model"], "workload": o["cls"],
                         "system": o["system"],
                         "serving": o["serving"], "replicas": n, "nodes": n * o["nodes"],
                         "chips": n * sum(p["chips"] * p["replicas"] for p in o["pools"]),
                         "requests_per_s": n * o["requests_per_s"], "demand_requests_per_s": need,
                         "utilisation": need / cap if cap else math.nan,
                         "configuration": "; ".join(f"{p['role']} x{p['replicas']}: {p['chips']} x {p['system']} "
                                                    f"TP{p['tp']} DP{p['dp']} EP{p['ep']} batch {p['batch']}"
                                                    for p in o["pools"])})
    tables = {"fleet": pd.DataFrame(rows),
              "systems": pd.DataFrame([{"system": s, **d.systems.loc[s].to_dict(), "reserved_nodes": r.reserved[s],
                                        "peak_nodes": float((r.reserved[s] + r.hourly.loc[s]).max())}
                                       for s in d.systems.index])}
    facts = {"objective": "usd_per_day", **info, "price_kind": {"reserved": f.reserved_price, "hourly": f.hourly_price},
             "cost": r.cost, "greedy_usd_per_day": g,
             "gain_over_greedy": 1 - r.result.objective / g if math.isfinite(g) else None,
             "marginal": {"usd_per_day_per_kw": {str(t): v for t, v in r.duals.get("usd_per_day_per_kw", {}).items()},
                          "usd_per_day_per_node": {f"{s}@{t}": v for (s, t), v in
                                                   r.duals.get("usd_per_day_per_node", {}).items() if v}},
             "peak_nodes": {s: float((r.reserved[s] + r.hourly.loc[s]).max()) for s in d.systems.index},
             "mean_nodes": {s: float((r.reserved[s] + r.hourly.loc[s]).mean()) for s in d.systems.index}}
    best: list[Optimum] = []
    peak = int(np.argmax(d.demand.sum(axis=0).to_numpy()))
    systems_priced = {s: priced(default_systems()[s], f.hourly_price,
                                float(d.systems.loc[s, "hourly_usd_per_node_h"] / d.systems.loc[s, "node_chips"]))
                      for s in d.systems.index}
    for (model_id, cls) in d.demand.index:
        w = next(x for x in spec.workloads if x.name == cls)
        ks = [k for k, o in enumerate(options) if o["model"] == model_id and o["cls"] == cls
              and r.replicas.loc[k, slices[peak]] > 0]
        if not ks:
            continue
        k = max(ks, key=lambda k: r.replicas.loc[k, slices[peak]] * options[k]["requests_per_s"])
        o = options[k]
        cfg = {key: (int(v) if isinstance(v, (np.integer, int)) and not isinstance(v, bool) else v)
               for key, v in o["cfg"].items()}
        e = config_entry(model_id, cls, w.prompt, cfg, spec.space.ideal, output=w.output, request_level=True,
                         system=systems_priced[o["system"]], framework=spec.framework, mem_fraction=spec.mem_fraction)
        n = int(r.replicas.loc[k, slices[peak]])
        usd_h = float(d.systems.loc[o["system"], "hourly_usd_per_node_h"]) * o["nodes"]
        e.update(serving=o["serving"], replicas=n, peak_slice=slices[peak],
                 pools=[{k2: (v.item() if hasattr(v, "item") else v) for k2, v in {**p, "replicas": p["replicas"] * n
                                                                                  }.items()} for p in o["pools"]],
                 usd_per_request=usd_h / 3600 / o["requests_per_s"], price_kind=f.hourly_price)
        pools_quantiles(e)
        e.update(band_keys(e, bands_of(o["system"])))  # the bands of the figures as set above
        best.append(Optimum(e, request_level=True))  # config_entry(request_level=True) above
    return Solved(status=r.result.status, best=best, tables=tables, results=[r.result],
                  solver_name=f"pyomo -> ortools {spec.solver.name}", facts=facts)


def headline(summary: dict, tables: dict[str, pd.DataFrame]) -> list[str]:
    """Cost per day and its split, nodes per system (peak and reserved), marginal values, gain over the greedy."""
    c = summary.get("cost") or {}
    lines = [f"{c.get('usd_per_day', float('nan')):,.0f} USD/day: reserved {c.get('reserved_usd_per_day', 0):,.0f}, "
             f"hourly {c.get('hourly_usd_per_day', 0):,.0f}, fixed {c.get('fixed_usd_per_day', 0):,.0f}; the greedy "
             f"pays {summary.get('greedy_usd_per_day', float('nan')):,.0f} "
             f"(the program saves {(summary.get('gain_over_greedy') or 0):.1%})"]
    sy = tables.get("systems")
    if sy is not None:
        for _, r in sy.iterrows():
            lines.append(f"{r['system']}: peak {r['peak_nodes']:.0f} nodes of {r['node_chips']:.0f} GPUs, "
                         f"{r['reserved_nodes']:.0f} reserved for the day, mean "
                         f"{summary.get('mean_nodes', {}).get(r['system'], float('nan')):.1f}")
    kw = summary.get("marginal", {}).get("usd_per_day_per_kw") or {}
    if kw:
        lines.append(f"one more kW of site power would save up to {max(kw.values()):,.2f} USD/day")
    return lines


def _nodes_plot(out: StudyOutput, path: Path) -> None:
    t = out.tables["fleet"]
    t = t[t["row"] == "system"]
    fig, ax = subplots(figsize=(9, 4))
    for s, g in t.groupby("system"):
        ax.step(g["slice"], g["nodes"], where="post", label=f"{s} held")
        ax.step(g["slice"], g["reserved_nodes"], where="post", linestyle="--", label=f"{s} reserved")
        ax.step(g["slice"], g["inventory_nodes"], where="post", linestyle=":", label=f"{s} inventory")
    ax.set_xlabel("slice (hour)")
    ax.set_ylabel("nodes")
    ax.legend(fontsize=7)
    save(fig, path)


PLOTS = (Plot("fleet", "nodes.png", _nodes_plot, needs="nodes"),)
