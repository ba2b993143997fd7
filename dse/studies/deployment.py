"""``kind: deployment``: the cheapest whole deployment of each model for its demand (the deployment program: integer
replicas of aggregated, prefill and decode operating points, several configurations mixed in a pool, one numerics
by a disjunction), per group of systems, solved three ways: aggregated only, disaggregated only, and both mixed.
The table ``modes`` says when splitting prefill from decode pays and at what pool ratio.

Judged as the study decides (`dse.studies.common.decide_of`): robust, each system's operating points meet the
targets at the edge of its TTFT and TPOT bands and serve their requests/s at the low end of its throughput band,
so the program buys the replicas that serve the demand there. Each `best` entry says whether it is decided
against the group's other modes.
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
from dse.optimize.margins import Margins, margins_for
from dse.optimize.operating_points import non_dominated, operating_points
from dse.optimize.space import Space, build_space, subset
from dse.optimize.whole import racks_of
from dse.physics.serving import cost_keys
from dse.studies.base import MAX_LIST, Strict, StudySpec
from dse.studies.common import (
    banded,
    best_table,
    candidate_systems,
    config_entry,
    decide_of,
    decision,
    pool_text,
    pooled_bands,
    pools_quantiles,
    served_entry,
    served_pools,
)
from dse.studies.contract import Optimum, Plot, Progress, Solved, StudyOutput, status_of
from dse.studies.plotting import save, subplots

USES_STORAGE = False
OBJECTIVE = "usd_per_s"
"""What the deployment program minimizes: the pools' USD per second serving the demand."""
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


def _points(space: Space, cps: tuple[bool, ...], margins: Margins | None) -> pd.DataFrame:
    """The operating points of a space (`operating_points`), as predicted or, with ``margins``, judged at each
    system's band edge: its targets divided by its TPOT and TTFT margins, and each point's requests/s divided by
    its cost margin (what it serves at the low end of its throughput band); non-dominated again across systems.
    Each margin is one per system, so a point is still the best of its block as the program sees it.
    """
    if margins is None:
        return operating_points(space, context_parallel=cps)
    w, si = space.workload, space.blocks["system_idx"]
    frames = []
    for k in sorted(set(si.tolist())):
        tight = replace(w, tpot_max=None if w.tpot_max is None else w.tpot_max / margins.tpot[k],
                        ttft_max=None if w.ttft_max is None else w.ttft_max / margins.ttft[k])
        p = operating_points(replace(subset(space, si == k), workload=tight), context_parallel=cps)
        frames.append(p.assign(requests_per_s=p["requests_per_s"] / margins.cost[k]))
    pts = pd.concat(frames, ignore_index=True) if frames else operating_points(space, context_parallel=cps)
    return non_dominated(pts)


def _margins_of(pools: pd.DataFrame, margins: Margins, systems: list) -> dict[str, pd.Series]:
    """Each pool's (cost, TPOT, TTFT) margins, by its system."""
    k = pools["system"].map({s.id: i for i, s in enumerate(systems)}).to_numpy()
    return {name: pd.Series(getattr(margins, name)[k], index=pools.index) for name in ("cost", "tpot", "ttft")}


def _robust_check(pools: pd.DataFrame, margins: Margins, systems: list, targets: dict) -> list[str]:
    """The targets re-checked on every pool's TTFT and TPOT times its margins (the robust program's promise)."""
    m, bad = _margins_of(pools, margins, systems), []
    for c, (tpot, ttft) in targets.items():
        mine = pools["cls"] == c
        if tpot is not None and ((pools["tpot_s"] * m["tpot"])[mine].dropna() > tpot * (1 + 1e-6)).any():
            bad.append(f"class {c}: a pool's TPOT at its band's edge exceeds {tpot}")
        judged = (pools["ttft_s"] * m["ttft"])[mine & (pools["role"] != "decode")].dropna()
        if ttft is not None and (judged > ttft * (1 + 1e-6)).any():
            bad.append(f"class {c}: a pool's TTFT at its band's edge exceeds {ttft}")
    return bad


def input_usd_per_s(pools: pd.DataFrame) -> float:
    """The input part of the pools' USD/s as `dse.physics.serving` splits a request's cost: each pool's replicas'
    cost at its operating point's ``prefill_share`` (a prefill pool's whole, an aggregated pool's share of time on
    prefill chunks, a decode pool's none).
    """
    return float((pools["usd_per_s"] * pools["replicas"] * pools["prefill_share"]).sum())


def _cost_parts(pools: pd.DataFrame) -> list[tuple[str, float]]:
    return [(p["system"], float(p["usd_per_s"] * p["replicas"])) for p in pools.to_dict("records")]


def _deployment_bands(pools: pd.DataFrame, robust: bool):
    """The bands of a deployment's figures (`pooled_bands`; robust: its replicas were bought at the low end of
    each pool's throughput band).
    """
    ttft = [(p["system"], p["ttft_s"]) for p in pools.to_dict("records") if p["role"] != "decode"]
    tpot = [(p["system"], p["tpot_s"]) for p in pools.to_dict("records") if p["role"] != "prefill"]
    return pooled_bands(_cost_parts(pools), ttft, tpot, sized_low=robust)


def _serving(pools: pd.DataFrame) -> str:
    roles = set(pools["role"])
    return "aggregated" if roles == {"both"} else "disaggregated" if "both" not in roles else "mixed"


def _key(pools: pd.DataFrame) -> tuple[str, tuple[str, ...]]:
    """What a rival must differ in: the mode its pools serve in, or their systems."""
    return _serving(pools), tuple(sorted(set(pools["system"])))


def _rival(pools: pd.DataFrame, w, robust: bool, ideal: bool) -> dict:
    """Another mode's deployment of the class as `decision` compares it: its USD per request and band."""
    usd = sum(v for _, v in _cost_parts(pools)) / (w.demand_tokens_per_s / w.output)
    bands = None if ideal else _deployment_bands(pools, robust)
    return {"system": ", ".join(_key(pools)[1]), "serving": _serving(pools),
            "layout": "; ".join(pool_text(p) for p in pools.to_dict("records")), "usd_per_request": usd,
            "usd_per_request_band": [usd, usd] if bands is None else [usd * bands.cost[0], usd * bands.cost[1]]}


def _loads(pools: pd.DataFrame, rate: float) -> pd.Series:
    """Each pool's share of its replicas' requests/s at the class's ``rate``: the demand spread over what the pools
    offer (the aggregated replicas' rate and the requests the prefill and decode pools carry together, the lesser of
    their rates), all at the same share; a prefill or decode pool at that share of the pair's rate over its own.
    """
    cap = pools["requests_per_s"] * pools["replicas"]
    by_role = cap.groupby(pools["role"]).sum()
    pre, dec = float(by_role.get("prefill", 0.0)), float(by_role.get("decode", 0.0))
    pair = min(pre, dec)
    offered = float(by_role.get("both", 0.0)) + pair
    share = min(1.0, rate / offered) if offered > 0 else 0.0
    own = pools["role"].map({"both": 1.0, "prefill": pair / pre if pre else 0.0, "decode": pair / dec if dec else 0.0})
    return (share * own).clip(upper=1.0)


def _entry(spec: Spec, model: str, w, group: str, pools: pd.DataFrame, systems: dict, usd_per_s: float,
           mode: str, space: Space, robust: bool = False) -> Optimum:
    """The contract's entry: the costliest decoding (decode or aggregated) pool's configuration evaluated as `dse
    evaluate` does, the deployment's request-level figures with their bands (robust: the replicas serve the demand
    at the low end of each pool's throughput band, so its cost is the band's high end), and every pool. TTFT and
    TPOT are each pool's at the load it serves (`served_pools`, in ``space``: a pool whose replicas could serve more
    holds fewer sequences, ``batch_served``, and a prefill pool runs below its planned utilisation).
    """
    lam = w.demand_tokens_per_s / w.output
    pools, edges, one = served_pools(pools.assign(load=_loads(pools, lam)), lambda _: space)
    # the top level is a replica that decodes (as `disaggregated_entry` has it): the costliest decode or aggregated
    # pool (a prefill replica evaluated as a decode step at batch 1 would name what binds no decode step)
    decoding = pools[pools["role"] != "prefill"]
    main = decoding.sort_values("usd_per_s", key=lambda s: s * decoding.loc[s.index, "replicas"]).iloc[-1]
    cfg = {k: main[k] for k in ("system", "chips", "racks", "tp", "ep", "pp", "dp", "etp", "batch", "context",
                                "weights_dtype", "kv_dtype", "kv_tier")}
    cfg = {k: (int(v) if k in ("chips", "racks", "tp", "ep", "pp", "dp", "etp", "batch", "context") else v)
           for k, v in cfg.items()}
    e = config_entry(model, w.name, w.prompt, cfg, spec.space.ideal, output=w.output, request_level=True,
                     system=systems[cfg["system"]], framework=spec.framework, mem_fraction=spec.mem_fraction)
    chips = int((pools["chips"] * pools["replicas"]).sum())
    roles = set(pools["role"])
    e["serving"] = "aggregated" if roles == {"both"} else "disaggregated" if "both" not in roles else "mixed"
    e["chips"] = chips
    e["racks"] = racks_of(pools.to_dict("records"), lambda s: int(systems[s].scaleup_domain))
    e["usd_per_s"] = usd_per_s
    e.update(cost_keys(usd_per_s, lam, input_usd_per_s(pools) / usd_per_s, w.prompt, w.output))
    e["usd_per_mtok"] = usd_per_s / w.demand_tokens_per_s * 1e6  # every chip's cost over the output tokens
    e["tokens_per_s_per_gpu"] = w.demand_tokens_per_s / chips
    e["tokens_per_s"] = w.demand_tokens_per_s
    e["ttft_s"] = float(pools.loc[pools["role"] != "decode", "ttft_s"].max())
    e["tpot_s"] = float(pools.loc[pools["role"] != "prefill", "tpot_s"].max())
    e["tokens_per_s_per_user"] = 1.0 / e["tpot_s"]
    e["power_w"] = float((pools["power_w"] * pools["replicas"]).sum())
    e["price_kind"] = spec.price
    e["chunk_tokens"] = w.chunk_tokens
    e["mode_searched"] = mode
    served_entry(e, pools, POOL_KEYS, main.name, one)
    e["group"] = group
    pools_quantiles(e)
    banded(e, {"served_edges": edges}, None if spec.space.ideal else _deployment_bands(pools, robust))
    for key in ("tokens_per_s_band", "tokens_per_s_per_gpu_band"):  # the demand: given, not predicted
        e.pop(key, None)
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
                o = replace(opts, systems=tuple(g.systems))
                built = {w.name: build_space(model, w.workload(), o) for w in ws}
                decide = "expected" if opts.ideal else decide_of(  # the ideal roofline has no band
                    spec, [s for space in built.values() for s in candidate_systems(space)])
                pts = {}
                for w in ws:
                    space = spaces[(model_id, w.name)] = built[w.name]
                    margins = margins_for(space.systems, decide)
                    pts[w.name] = _points(space, (False, True) if spec.space.context_parallel else (False,), margins)
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
                    targets = {w.name: (w.tpot_max_s, w.ttft_max_s) for w in ws}
                    bad = check(d, r.pools, targets)
                    if margins is not None:  # the robust promise, and each pool's requests/s as predicted
                        bad += _robust_check(r.pools, margins, space.systems, targets)
                        r.pools["requests_per_s"] *= _margins_of(r.pools, margins, space.systems)["cost"]
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
                                 "usd_per_mtok": r.usd_per_s / sum(w.demand_tokens_per_s for w in ws) * 1e6,
                                 "prefill_share": input_usd_per_s(p) / r.usd_per_s,
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
                    robust = margins is not None
                    for w in ws:
                        pools = r.pools[r.pools["cls"] == w.name]
                        if len(pools):
                            o = _entry(spec, model_id, w, g.name, pools, systems, float(
                                (pools["usd_per_s"] * pools["replicas"]).sum()), mode, built[w.name], robust)
                            o.entry["decide"] = decide
                            others = [_rival(q, w, robust, opts.ideal) for q in
                                      (x.pools[x.pools["cls"] == w.name] for x in found.values())
                                      if len(q) and _key(q) != _key(pools)]
                            o.entry.update(decision(o.entry, sorted(others, key=lambda x: x["usd_per_request"])))
                            best.append(o)
                else:
                    infeasible.append({"model": model_id, "workload": label,
                                       "reason": f"{g.name}: no mode is feasible"})
    tables = {"modes": pd.DataFrame(rows)}
    if best:
        tables["best"] = best_table(best)
    return Solved(status=status_of(results, infeasible), best=best, infeasible=infeasible, tables=tables,
                  results=results, solver_name=f"pyomo+gdp.{dep.gdp} -> ortools {spec.solver.name}", spaces=spaces,
                  facts={"objective": OBJECTIVE, "gdp_transformation": dep.gdp})


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
    t = out.frames["modes"]
    t = t[t["status"] != "infeasible"]
    fig, ax = subplots(figsize=(9, 4))
    labels = [f"{w}\n{g}" for w, g in dict.fromkeys(zip(t["workload"], t["group"], strict=True))]
    for i, mode in enumerate(MODES):
        sub = t[t["mode"] == mode].set_index(["workload", "group"])["usd_per_mtok"]
        vals = [sub.get((lb.split("\n")[0], lb.split("\n")[1]), float("nan")) for lb in labels]
        ax.bar([j + 0.27 * (i - 1) for j in range(len(labels))], vals, width=0.27, label=mode)
    ax.set_xticks(range(len(labels)), labels, fontsize=7)
    ax.set_ylabel("USD per million output tokens at the demand")
    ax.legend()
    save(fig, path)


PLOTS = (Plot("modes", "modes.png", _modes_plot, needs="usd_per_mtok"),)
