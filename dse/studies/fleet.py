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

from dse.catalog.calibration import bands_of
from dse.catalog.hardware import PRICE_KINDS, default_systems, priced
from dse.catalog.models import get_model
from dse.errors import InputError
from dse.optimize.fleet import OPTION_COLUMNS, FleetData, check, fleet_options, loads, solve_fleet
from dse.optimize.space import Space, build_space
from dse.optimize.whole import racks_of
from dse.physics.serving import cost_keys
from dse.studies.base import MAX_LIST, Strict, StudySpec
from dse.studies.common import banded, config_entry, pools_quantiles, served_entry, served_pools
from dse.studies.contract import Optimum, Plot, Progress, Solved, StudyOutput
from dse.studies.plotting import save, subplots

USES_STORAGE = False
OBJECTIVE = "usd_per_day"
"""What the fleet program minimizes: the USD of the nodes held through the day (reserved, hourly, fixed)."""
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
    """Operating points kept per (model, workload, system, role) after the exact reduction: the fewest chips (as
    they occupy nodes) per request/s first."""
    interconnect_gbytes_per_s: dict[str, Annotated[float, Field(gt=0, le=1e6)]] = {}
    """KV hand-off bandwidth (GB/s, each way) between a system's pools and other systems' pools; a system without one
    pairs its prefill and decode pools only with each other."""
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
                      "power_all_in_w_per_gpu", "fixed_usd_per_day", "interconnect_gbytes_per_s"):
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


def _options(spec: Spec, model_id: str, w, sid: str) -> tuple[pd.DataFrame, Space]:
    """The (model, workload) options on one system: its aggregated, prefill and decode operating points
    (`fleet_options`), prefill and decode replicas sized separately by the fleet program; with their space.
    """
    opts = replace(spec.options(), systems=(sid,))
    space = build_space(get_model(model_id), w.workload(), opts)
    modes = tuple(spec.fleet.modes)
    return fleet_options(space, modes), space


def fleet_data(spec: Spec, progress: Progress | None = None) -> tuple[FleetData, dict, dict]:
    """The fleet program's data from the study: systems priced by kind, options from the physics (at most
    ``options_per_system`` per class, system and role after the exact reduction), the demand; and the space of each
    (model, workload, system) the options came from.
    """
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
                       "power_per_node_w": pw * node, "fixed_usd_per_day": f.fixed_usd_per_day.get(s, 0.0),
                       "interconnect_bytes_per_s": f.interconnect_gbytes_per_s.get(s, 0.0) * 1e9}
    systems = pd.DataFrame.from_dict(sys_rows, orient="index")
    inv = pd.DataFrame({t: [f.inventory_nodes[s] - (f.lent_nodes.get(s, [0] * len(slices))[t]) for s in systems.index]
                        for t in slices}, index=systems.index)
    frames, rows, index, spaces = [], [], [], {}
    for model_id in spec.models:
        for w in spec.workloads:
            index.append((model_id, w.name))
            rows.append([w.demand_tokens_per_s / w.output * c for c in f.demand_curve])
            for s in systems.index:
                if progress:
                    progress(f"{model_id} / {w.name} / {s}")
                pts, spaces[(model_id, w.name, s)] = _options(spec, model_id, w, s)
                if not pts.empty:
                    frames.append(pts.assign(model=model_id, cls=w.name))
    demand = pd.DataFrame(rows, index=pd.MultiIndex.from_tuples(index), columns=slices)
    table = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=list(OPTION_COLUMNS))
    data = FleetData(systems, inv, table, demand, f.slice_h,
                     None if f.power_cap_kw is None else f.power_cap_kw * 1e3, f.budget_usd_per_day, f.n_plus_one)
    data = data.reduced().shortlist(f.options_per_system)
    return data, {"left_out_for_want_of_a_price": no_price, "left_out_for_want_of_a_power_figure": no_power,
                  "power_source": power_src}, spaces


def _option_cost(d: FleetData, r, t) -> np.ndarray:
    """USD/s of the fleet in slice ``t`` shared among the options' replicas: each system's nodes held (reserved at
    the committed price, hourly at the on-demand price; its fixed cost over the day) split by the chips each
    option's replicas occupy there, idle chips shared alike. The shares add up to the slice's cost.
    """
    o, sy = d.options, d.systems
    foot = d.footprint() * r.replicas[t].to_numpy()
    out = np.zeros(len(o))
    for s in sy.index:
        usd_s = (r.reserved[s] * sy.loc[s, "reserved_usd_per_node_h"] + r.hourly.loc[s, t]
                 * sy.loc[s, "hourly_usd_per_node_h"]) / 3600 + (
            sy.loc[s, "fixed_usd_per_day"] / 86400 if (r.reserved[s] + r.hourly.loc[s]).max() > 0 else 0.0)
        sel = (o["system"] == s).to_numpy()
        total = float(foot[sel].sum())
        if total > 0:
            out[sel] = usd_s * foot[sel] / total
    return out


def _entry(spec: Spec, d: FleetData, r, j: int, systems_priced: dict, usd: np.ndarray, t, spaces: dict,
           load: np.ndarray) -> Optimum | None:
    """A class's figures at its peak slice from the operating points the program chose there, each pool at the
    load it serves there (``load``: every option's share in slice ``t``, `dse.optimize.fleet.loads`; `served_pools`):
    TTFT of its prefill (or aggregated) pools, TPOT of its decode (or aggregated) pools, the fleet's cost shared by
    chips (`_option_cost`, ``usd``), split into input (prefill pools, and each aggregated replica's prefill share
    of its time) and output; every pool with its replicas and the batch it serves.
    """
    o = d.options
    model_id, cls = d.classes[j]
    w = next(x for x in spec.workloads if x.name == cls)
    sel = ((o["model"] == model_id) & (o["cls"] == cls)).to_numpy() & (r.replicas[t].to_numpy() > 0)
    if not sel.any():
        return None
    pools = o[sel].assign(replicas=r.replicas.loc[sel, t].astype(int).to_numpy(), load=load[sel])
    pools, edges, one = served_pools(pools, lambda p: spaces[(model_id, cls, p["system"])])
    lam = float(d.demand.loc[(model_id, cls), t])
    main = pools[pools["role"] != "prefill"]
    main = main.loc[(main["chips"] * main["replicas"]).idxmax()]
    cfg = {k: (int(main[k]) if k in ("chips", "racks", "tp", "ep", "pp", "dp", "etp", "batch", "context")
               else main[k]) for k in CFG}
    e = config_entry(model_id, cls, w.prompt, cfg, spec.space.ideal, output=w.output, request_level=True,
                     system=systems_priced[cfg["system"]], framework=spec.framework, mem_fraction=spec.mem_fraction)
    # each pool's share of the slice's cost (not its on-demand price), and its power as the fleet counts it against
    # the site's cap (the study's or the catalog's all-in figure per GPU, `FleetData.systems`)
    per_gpu_w = d.systems["power_per_node_w"] / d.systems["node_chips"]
    pools = pools.assign(fleet_usd_per_s=usd[sel], power_w=pools["chips"] * pools["system"].map(per_gpu_w))
    usd_s = float(pools["fleet_usd_per_s"].sum())
    input_s = float((pools["fleet_usd_per_s"] * pools["prefill_share"]).sum())  # as `dse.physics.serving` splits it
    chips = int((pools["chips"] * pools["replicas"]).sum())
    roles = set(pools["role"])
    usd_req = usd_s / lam
    e.update(serving="aggregated" if roles == {"both"} else "disaggregated" if "both" not in roles else "mixed",
             chips=chips, racks=racks_of(pools.to_dict("records"), lambda s: int(d.systems.loc[s, "node_chips"])),
             peak_slice=t,
             demand_requests_per_s=lam, usd_per_s=usd_s,
             **cost_keys(usd_s, lam, input_s / usd_s if usd_s else 0.0, w.prompt, w.output),
             usd_per_mtok=usd_req / w.output * 1e6,
             ttft_s=float(pools.loc[pools["role"] != "decode", "ttft_s"].max()),
             tpot_s=float(pools.loc[pools["role"] != "prefill", "tpot_s"].max()),
             tokens_per_s=lam * w.output, tokens_per_s_per_gpu=lam * w.output / chips,
             power_w=float((pools["power_w"] * pools["replicas"]).sum()), price_kind=_price_text(spec.fleet),
             replicas=int(pools["replicas"].sum()))
    served_entry(e, pools, POOL + ("replicas",), main.name, one)
    e["tokens_per_s_per_user"] = 1.0 / e["tpot_s"]
    e["joules_per_token"] = e["power_w"] / e["tokens_per_s"]
    pools_quantiles(e)  # the figures of several pools: the largest pool's quantiles are not the entry's
    banded(e, {"served_edges": edges}, None if spec.space.ideal else bands_of(cfg["system"]))
    return Optimum(e, request_level=True)


def _price_text(f: FleetSpec) -> str:
    return f"{f.reserved_price} (reserved nodes) + {f.hourly_price} (hourly nodes)"


def solve(spec: Spec, progress: Progress | None = None, storage: str | None = None) -> Solved:
    """Options from the physics, the fleet program, its re-check, duals and the greedy baseline; fleet.csv."""
    f = spec.fleet
    d, info, spaces = fleet_data(spec, progress)
    r = solve_fleet(d, spec.solver.name, spec.solver.time_limit_s)
    bad = check(d, r)
    if bad:
        raise RuntimeError(f"re-check of the fleet solution failed: {bad}")
    g = r.greedy_usd_per_day
    slices = d.slices
    o = d.options
    rows = []
    for s in d.systems.index:
        for t in slices:
            held = r.reserved[s] + r.hourly.loc[s, t]
            sel = (o["system"] == s).to_numpy()
            busy = float((d.footprint()[sel] * r.replicas.loc[sel, t].to_numpy()).sum())
            node = d.systems.loc[s, "node_chips"]
            rows.append({"row": "system", "slice": t, "system": s, "reserved_nodes": r.reserved[s],
                         "hourly_nodes": r.hourly.loc[s, t], "nodes": held, "chips": held * node,
                         "inventory_nodes": d.inventory.loc[s, t],
                         "utilisation": busy / (held * node) if held else math.nan,
                         "power_w": held * d.systems.loc[s, "power_per_node_w"]})
    served = {t: loads(d, r, t) for t in slices}
    for k, p in enumerate(o.to_dict("records")):
        for t in slices:
            n = int(r.replicas.loc[k, t])
            if not n:
                continue
            rows.append({"row": "replicas", "slice": t, "model": p["model"], "workload": p["cls"],
                         "system": p["system"], "serving": "aggregated" if p["role"] == "both" else "disaggregated",
                         "role": p["role"], "replicas": n, "chips": n * int(p["chips"]),
                         "requests_per_s": n * p["requests_per_s"],
                         "served_requests_per_s": n * p["requests_per_s"] * float(served[t][k]),
                         "demand_requests_per_s": float(d.demand.loc[(p["model"], p["cls"]), t]),
                         "configuration": f"{p['role']} x{n}: {p['chips']} x {p['system']} TP{p['tp']} DP{p['dp']} "
                                          f"EP{p['ep']} batch {p['batch']}"})
    tables = {"fleet": pd.DataFrame(rows),
              "systems": pd.DataFrame([{"system": s, **d.systems.loc[s].to_dict(), "reserved_nodes": r.reserved[s],
                                        "peak_nodes": float((r.reserved[s] + r.hourly.loc[s]).max()),
                                        "mean_nodes": float((r.reserved[s] + r.hourly.loc[s]).mean())}
                                       for s in d.systems.index])}
    kw = r.duals.get("usd_per_day_per_kw", {})
    facts = {"objective": OBJECTIVE, **info, "price_kind": _price_text(f),
             "price_kinds": {"reserved": f.reserved_price, "hourly": f.hourly_price},
             "cost": r.cost, "greedy_usd_per_day": g,
             "gain_over_greedy": 1 - r.result.objective / g if math.isfinite(g) else None,
             "marginal": {"usd_per_day_per_kw": {str(t): v for t, v in kw.items()},
                          "usd_per_day_per_node": {f"{s}@{t}": v for (s, t), v in
                                                   r.duals.get("usd_per_day_per_node", {}).items() if v > 0}},
             "peak_power_w": float(max(((r.reserved + r.hourly[t]) * d.systems["power_per_node_w"]).sum()
                                       for t in slices)),
             "power_cap_w": None if f.power_cap_kw is None else f.power_cap_kw * 1e3,
             "peak_nodes": {s: float((r.reserved[s] + r.hourly.loc[s]).max()) for s in d.systems.index},
             "mean_nodes": {s: float((r.reserved[s] + r.hourly.loc[s]).mean()) for s in d.systems.index}}
    best: list[Optimum] = []
    systems_priced = {s: priced(default_systems()[s], f.hourly_price,
                                float(d.systems.loc[s, "hourly_usd_per_node_h"] / d.systems.loc[s, "node_chips"]))
                      for s in d.systems.index}
    for j, c in enumerate(d.classes):
        t = slices[int(np.argmax(d.demand.loc[c].to_numpy()))]
        opt = _entry(spec, d, r, j, systems_priced, _option_cost(d, r, t), t, spaces, served[t])
        if opt is not None:
            best.append(opt)
    return Solved(status=r.result.status, best=best, tables=tables, results=[r.result],
                  solver_name=f"pyomo -> ortools {r.result.solver}", facts=facts)


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
    marginal = summary.get("marginal", {})
    kw = marginal.get("usd_per_day_per_kw") or {}
    cap = summary.get("power_cap_w")
    if cap and kw and max(kw.values()) > 0:
        t, v = max(kw.items(), key=lambda kv: kv[1])
        lines.append(f"site power binds: one more kW in slice {t} saves {v:,.2f} USD/day with the same replicas")
    elif cap:
        lines.append(f"site power does not bind: peak {summary.get('peak_power_w', 0) / 1e3:,.0f} kW of "
                     f"{cap / 1e3:,.0f} kW")
    node = marginal.get("usd_per_day_per_node") or {}
    if node:
        at, v = max(node.items(), key=lambda kv: kv[1])
        lines.append(f"inventory binds: one more node of {at.replace('@', ' in slice ')} saves {v:,.2f} USD/day "
                     f"with the same replicas")
    return lines


def _nodes_plot(out: StudyOutput, path: Path) -> None:
    t = out.frames["fleet"]
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
