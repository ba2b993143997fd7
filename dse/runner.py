"""Run a study: solve every (model, workload), gather tables, write summary, CSVs, plots and report.

Outputs are written into a fresh folder beside the target and moved into place at the end, so an
interrupted or failed run leaves nothing half-written.
"""

from __future__ import annotations

import json
import math
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import pandas as pd

from dse.errors import InfeasibleError
from dse.evaluate import Config, evaluate_config
from dse.models import get_model
from dse.serving import ServingResult, solve_demand, solve_serving
from dse.space import Space, build_space, describe_choice, subset
from dse.study import StudySpec

METRICS = ("tpot_s", "ttft_s", "usd_per_mtok", "tokens_per_s", "hbm_bytes_per_chip")
EXTRA = (
    "usd_per_mtok_input", "compute_s", "memory_s", "comm_s", "step_s", "bound", "tp_comm_s", "ep_comm_s",
    "pp_comm_s", "weights_bytes_per_chip", "kv_bytes_per_chip", "activation_bytes_per_chip", "hbm_capacity_per_chip",
    "sequences_in_flight", "usd_per_chip_hour", "prompt", "usd_per_mtok_band", "tokens_per_s_band",
)


@dataclass
class StudyOutput:
    """Everything a study produced, before it is written."""

    summary: dict
    tables: dict[str, pd.DataFrame] = field(default_factory=dict)
    spaces: dict[tuple[str, str], Space] = field(default_factory=dict)


def config_entry(model: str, workload_name: str, prompt: int, cfg: dict, ideal: bool) -> dict:
    """A configuration with its metrics computed by `dse evaluate` on the catalog hardware."""
    ev = evaluate_config(
        Config(
            model=model, system=cfg["system"], batch=cfg["batch"], context=cfg["context"], tp=cfg["tp"],
            ep=cfg["ep"], pp=cfg["pp"], dp=cfg["dp"], etp=cfg["etp"], weights_dtype=cfg["weights_dtype"],
            kv_dtype=cfg["kv_dtype"], kv_tier=cfg["kv_tier"], prompt=prompt,
        ),
        ideal=ideal,
    )
    ev["usd_per_mtok_input"] = ev["chips"] * ev["usd_per_chip_hour"] / 3600 * ev["ttft_s"] / prompt * 1e6
    keys = ("system", "chips", "racks", "tp", "ep", "pp", "dp", "etp", "batch", "context", "weights_dtype",
            "kv_dtype", "kv_tier")
    out = {"model": model, "workload": workload_name, **{k: cfg[k] for k in keys}}
    out.update({k: ev[k] for k in METRICS})
    out.update({k: ev[k] for k in EXTRA})
    return out


def _summary(spec: StudySpec, **extra) -> dict:
    """The keys every summary.json starts with; ``extra`` adds or replaces keys."""
    return {"study": spec.study, "kind": spec.kind, "description": spec.description.strip(),
            "expect": spec.expect.strip(), "best": [], "infeasible": [], "spaces": [], **extra}


def _solved(spec: StudySpec, results: list, t0: float) -> dict:
    """Status and solver statistics from the SolveResults of a study."""
    return {
        "status": "optimal" if all(r.status == "optimal" for r in results) else "feasible",
        "solver": {"name": spec.solver.name, "wall_s": time.perf_counter() - t0,
                   "solve_wall_s": float(sum(r.wall_s for r in results)), "solves": len(results),
                   "gap": float(max((r.gap for r in results), default=0.0))},
    }


def entry(space: Space, res: ServingResult, ideal: bool) -> dict:
    """One optimum as the contract names it: model, workload, configuration, metrics (as `dse evaluate`)."""
    out = config_entry(space.model.id, space.workload.name, space.workload.prompt, res.config, ideal)
    out["solver_status"] = res.result.status
    out["gap"] = res.result.gap
    return out


def _solve(space: Space, spec: StudySpec, tpot: float | None, **kw) -> ServingResult:
    return solve_serving(space, tpot, solver=spec.solver.name, time_limit_s=spec.solver.time_limit_s, **kw)


def _cheapest(space: Space, spec: StudySpec, out: StudyOutput, ideal: bool) -> None:
    w = space.workload
    res = _solve(space, spec, w.tpot_max)
    e = entry(space, res, ideal)
    if w.demand is not None:
        d = solve_demand(space, w.demand, w.tpot_max, spec.solver.name)
        dcfg = describe_choice(space, d.choice)
        e["demand_tokens_per_s"] = w.demand
        e["replicas"] = d.replicas
        e["usd_per_mtok_at_demand"] = d.usd_per_s / w.demand * 1e6
        e["demand_config"] = dcfg
    out.summary["best"].append(e)
    out.summary["_results"].append(res.result)
    rows = []
    for si, system in enumerate(space.systems):
        sub = subset(space, (space.blocks["system_idx"] == si).to_numpy())
        row = {"model": space.model.id, "workload": w.name, "system": system.id}
        try:
            r = _solve(sub, spec, w.tpot_max)
        except InfeasibleError as exc:
            row.update(status="infeasible", reason=str(exc))
        else:
            out.summary["_results"].append(r.result)
            se = entry(sub, r, ideal)
            row.update(status=r.result.status, reason="")
            row.update({k: se[k] for k in ("chips", "racks", "tp", "ep", "pp", "dp", "batch", "weights_dtype",
                                             "kv_dtype", "kv_tier", *METRICS, "bound")})
        rows.append(row)
    out.tables.setdefault("systems", []).extend(rows)


def _pareto(space: Space, spec: StudySpec, out: StudyOutput, ideal: bool) -> None:
    w = space.workload
    base = _solve(space, spec, w.tpot_max)
    out.summary["best"].append(entry(space, base, ideal))
    out.summary["_results"].append(base.result)
    eps = base.choice.step
    rows = []
    while len(rows) < spec.pareto.max_points:
        try:
            cheapest = _solve(space, spec, eps)
            fastest = _solve(space, spec, eps, objective="latency", cost_max=cheapest.choice.cost,
                             start=cheapest.choice)
        except InfeasibleError:
            break
        out.summary["_results"] += [cheapest.result, fastest.result]
        e = entry(space, fastest, ideal)
        e["label"] = f"{e['system']} TP{e['tp']} EP{e['ep']} PP{e['pp']} B{e['batch']} {e['weights_dtype']}"
        rows.append(e)
        eps = fastest.choice.step * (1 - spec.pareto.min_step)
    out.tables.setdefault("pareto", []).extend(rows)


def _fast_slow(space: Space, spec: StudySpec, out: StudyOutput, ideal: bool) -> None:
    w = space.workload
    base = _solve(space, spec, w.tpot_max)
    be = entry(space, base, ideal)
    out.summary["best"].append(be)
    out.summary["_results"].append(base.result)
    rows = []
    for s in spec.fast_slow.speedups:
        target = base.choice.step / s
        row = {"model": space.model.id, "workload": w.name, "speed_multiplier": s, "tpot_target_s": target}
        try:
            r = _solve(space, spec, target)
        except InfeasibleError as exc:
            row.update(status="infeasible", reason=str(exc))
        else:
            out.summary["_results"].append(r.result)
            e = entry(space, r, ideal)
            row.update(status=r.result.status, reason="", cost_multiplier=e["usd_per_mtok"] / be["usd_per_mtok"],
                       speedup_achieved=be["tpot_s"] / e["tpot_s"])
            try:  # the lecture's mechanism: same hardware and layout, only the batch shrinks
                same = _solve(subset(space, (space.blocks.index == base.choice.block)), spec, target)
                row["cost_multiplier_same_layout"] = entry(space, same, ideal)["usd_per_mtok"] / be["usd_per_mtok"]
                row["batch_same_layout"] = describe_choice(space, same.choice)["batch"]
            except InfeasibleError:
                row["cost_multiplier_same_layout"] = math.nan
                row["batch_same_layout"] = 0
            row.update({k: e[k] for k in ("system", "chips", "tp", "ep", "pp", "dp", "batch", "weights_dtype",
                                            "kv_dtype", "kv_tier", *METRICS, "bound")})
        rows.append(row)
    out.tables.setdefault("fast_slow", []).extend(rows)


KINDS: dict[str, Callable] = {"cheapest": _cheapest, "pareto": _pareto, "fast_slow": _fast_slow}


def run_study(spec: StudySpec, progress: Callable[[str], None] | None = None) -> StudyOutput:
    """Solve every (model, workload) of the study; infeasible pairs are recorded, not raised."""
    t0 = time.perf_counter()
    opts = spec.space.options()
    out = StudyOutput(summary=_summary(spec, _results=[]))
    for model_id in spec.models:
        model = get_model(model_id)
        for ws in spec.workloads:
            w = ws.workload()
            if progress:
                progress(f"{model_id} / {w.name}")
            space = build_space(model, w, opts)
            out.spaces[(model_id, w.name)] = space
            out.summary["spaces"].append({"model": model_id, "workload": w.name, **space.stats})
            try:
                KINDS[spec.kind](space, spec, out, opts.ideal)
            except InfeasibleError as exc:
                out.summary["infeasible"].append({"model": model_id, "workload": w.name, "reason": str(exc)})
    results = out.summary.pop("_results")
    if out.summary["infeasible"]:
        status = "infeasible"
    elif all(r.status == "optimal" for r in results):
        status = "optimal"
    else:
        status = "feasible"
    out.summary["status"] = status
    out.summary["solver"] = {
        "name": spec.solver.name,
        "wall_s": time.perf_counter() - t0,
        "solve_wall_s": float(sum(r.wall_s for r in results)),
        "solves": len(results),
        "gap": float(max((r.gap for r in results), default=0.0)),
    }
    out.tables = {k: pd.DataFrame(v) for k, v in out.tables.items()}
    if out.summary["best"]:
        flat = [{k: v for k, v in e.items() if not isinstance(v, (dict, list))} for e in out.summary["best"]]
        out.tables["best"] = pd.DataFrame(flat)
    return out


def _jsonable(obj):
    if isinstance(obj, dict):
        return {k: _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, (np.integer,)):
        return int(obj)
    if isinstance(obj, (np.floating, float)):
        f = float(obj)
        return None if math.isnan(f) or math.isinf(f) else f
    if isinstance(obj, np.bool_):
        return bool(obj)
    return obj


def write_outputs(out: StudyOutput, spec: StudySpec, target: Path) -> list[str]:
    """Write summary.json, one CSV per table, PNG plots and report.html; all or nothing.

    Files are written into a fresh folder and moved into ``target`` at the end; a sweep's Optuna
    storage (optuna.db) in ``target`` is kept.
    """
    from dse.report import write_plots, write_report

    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        files = []
        for name, table in out.tables.items():
            table.to_csv(tmp / f"{name}.csv", index=False)
            files.append(f"{name}.csv")
        files += write_plots(out, spec, tmp)
        files.append("report.html")
        files.append("summary.json")
        out.summary["outputs"] = sorted(files)
        (tmp / "summary.json").write_text(json.dumps(_jsonable(out.summary), indent=2))
        write_report(out, spec, tmp)
        target.mkdir(exist_ok=True)
        for old in target.iterdir():
            if old.is_file() and not old.name.startswith("optuna.db") and old.name not in files:
                old.unlink()
        for name in files:
            (tmp / name).replace(target / name)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return sorted(files)


def run_sweep_study(spec: StudySpec, storage_url: str, progress: Callable[[str], None] | None = None,
                    max_points: int | None = None) -> StudyOutput | None:
    """A sweep or tornado study on Optuna; None when stopped early (``max_points``)."""
    from dse.sweep import results, run_sweep

    t0 = time.perf_counter()
    study, points, solved = run_sweep(spec, storage_url, progress, create=True, max_points=max_points)
    df = results(study, points)
    if len(df) < len(points):
        return None
    out = StudyOutput(summary=_summary(spec, storage=storage_url, points=len(points), points_solved_here=solved))
    per_system = []
    for _, r in df.iterrows():
        for system, cost in (r.get("per_system") or {}).items():
            per_system.append({"model": r["model"], "workload": r["workload"], "parameter": r["parameter"],
                               "factor": r["factor"], "system": system, "usd_per_mtok": cost})
        if r["status"] == "infeasible":
            out.summary["infeasible"].append({"model": r["model"], "workload": r["workload"],
                                              "reason": f"{r['parameter']} x {r['factor']:g}: {r['reason']}"})
        elif r["factor"] == 1.0:  # the catalog itself: metrics as `dse evaluate` gives them
            prompt = next(w.prompt for w in spec.workloads if w.name == r["workload"])
            out.summary["best"].append(config_entry(r["model"], r["workload"], prompt, r, spec.space.ideal))
    table = df.drop(columns=["per_system"])
    out.tables = {spec.kind: table}
    if per_system:
        out.tables["sweep_systems"] = pd.DataFrame(per_system)
    statuses = set(table["status"])
    out.summary["status"] = "infeasible" if "infeasible" in statuses and statuses == {"infeasible"} else (
        "optimal" if statuses <= {"optimal", "infeasible"} else "feasible")
    out.summary["solver"] = {
        "name": spec.solver.name, "wall_s": time.perf_counter() - t0,
        "solve_wall_s": float(table["solve_wall_s"].sum()), "solves": len(table),
        "per_point_s": float(table["solve_wall_s"].mean()),
        "gap": float(table["gap"].fillna(0).max()) if "gap" in table else 0.0,
    }
    return out


def run_overtraining_study(spec: StudySpec, storage_url: str, progress: Callable[[str], None] | None = None
                           ) -> StudyOutput:
    """Optuna over model size (TPE, seeded), one study per inference demand, in the given storage."""
    import math as _math

    import optuna

    from dse.equalization import Lifetime, equalization_heuristic, lifetime_cost
    from dse.sweep import open_storage

    o = spec.overtraining
    storage = open_storage(storage_url)
    workload = spec.workloads[0].workload()
    rows, best = [], []
    t0 = time.perf_counter()
    lo, hi = _math.log10(o.params_b[0] * 1e9), _math.log10(o.params_b[1] * 1e9)
    for demand in o.demands_tokens_per_s:
        life = Lifetime(o.target_loss, o.loss_fit, demand, o.deployment_days, o.rl_tokens_per_pretrain_token,
                        o.rl_flops_factor, o.rl_inefficiency, o.seq, o.global_batch_tokens, o.deadline_days,
                        o.chip_budget, tuple(o.train_systems), workload, spec.space.options())
        study = optuna.create_study(study_name=f"{spec.study}-{demand:g}", storage=storage, direction="minimize",
                                    load_if_exists=True, sampler=optuna.samplers.TPESampler(seed=0, n_startup_trials=8))

        def objective(trial: optuna.Trial, life: Lifetime = life) -> float:
            n = 10 ** trial.suggest_float("log10_params", lo, hi)
            try:
                r = lifetime_cost(n, life)
            except InfeasibleError as exc:
                trial.set_user_attr("result", json.dumps({"params": n, "reason": str(exc)}))
                return 1e30
            trial.set_user_attr("result", json.dumps(r, default=float))
            return r["lifetime_usd"]

        done = len(study.get_trials(states=(optuna.trial.TrialState.COMPLETE,)))
        if progress:
            progress(f"demand {demand:g} tokens/s: {done}/{o.trials} trials")
        if done < o.trials:
            study.optimize(objective, n_trials=o.trials - done)
        trials = [t for t in study.get_trials(states=(optuna.trial.TrialState.COMPLETE,))]
        for t in trials:
            rows.append({"demand_tokens_per_s": demand, "trial": t.number, **json.loads(t.user_attrs["result"])})
        b = json.loads(study.best_trial.user_attrs["result"])
        heuristic = equalization_heuristic(life, b["params"])
        best.append({"model": f"dense {b['params'] / 1e9:.0f}B", "workload": workload.name,
                     "demand_tokens_per_s": demand, **b,
                     "heuristic_overtraining_ratio": heuristic["overtraining_ratio"]})
    out = StudyOutput(summary=_summary(
        spec, optimum=best, storage=storage_url, status="feasible",
        solver={"name": f"optuna TPE + {spec.solver.name}", "wall_s": time.perf_counter() - t0,
                   "solve_wall_s": float(sum(r.get("solve_wall_s", 0.0) for r in rows)), "solves": len(rows),
                   "gap": 0.0},
        lecture={"inference_tokens_at_50M_per_s_for_60_days": 50e6 * 60 * 86400},
    ))
    out.tables = {"overtraining": pd.DataFrame(rows), "overtraining_best": pd.DataFrame(best)}
    return out


def run_placement_study(spec: StudySpec, progress: Callable[[str], None] | None = None) -> StudyOutput:
    """Expert placement (MIP) against the EPLB greedy, per load skew, and what it does to decode."""
    from dse.placement import greedy, solve_placement
    from formulations import expert_placement as fp

    t0 = time.perf_counter()
    pl = spec.placement
    rows, results = [], []
    for model_id in spec.models:
        model = get_model(model_id)
        f = model.spec.ffn
        experts = pl.experts or f.n_experts
        slots = -(-experts // pl.gpus) + pl.extra_slots
        for skew in pl.skews:
            if progress:
                progress(f"{model_id}: skew {skew}")
            loads = fp.zipf_loads(experts, pl.tokens_per_step * f.top_k, skew, seed=1)
            data = fp.PlacementData(loads, gpus=pl.gpus, domain=pl.domain_gpus, slots=slots, redundant=pl.redundant)
            mip, base = solve_placement(data, pl.time_limit_s), greedy(data)
            results.append(mip.result)
            row = {"model": model_id, "skew": skew, "experts": experts, "gpus": pl.gpus, "slots": slots,
                   "redundant": pl.redundant, "status": mip.status, "gap": mip.gap, "wall_s": mip.wall_s,
                   "peak_tokens_mip": mip.peak, "peak_tokens_greedy": base.peak,
                   "imbalance_mip": mip.imbalance(data), "imbalance_greedy": base.imbalance(data),
                   "crossing_tokens_mip": mip.crossing, "crossing_tokens_greedy": base.crossing,
                   "peak_improvement": 1 - mip.peak / base.peak,
                   "crossing_improvement": 1 - mip.crossing / base.crossing if base.crossing else 0.0}
            for name, imb in (("mip", row["imbalance_mip"]), ("greedy", row["imbalance_greedy"])):
                ev = evaluate_config(Config(model=model_id, system=pl.system, batch=pl.tokens_per_step,
                                            context=pl.context, ep=pl.gpus, moe_imbalance=imb))
                row[f"tpot_s_{name}"] = ev["tpot_s"]
                row[f"usd_per_mtok_{name}"] = ev["usd_per_mtok"]
            rows.append(row)
    table = pd.DataFrame(rows)
    out = StudyOutput(summary=_summary(
        spec, status="optimal" if all(r.status == "optimal" for r in results) else "feasible",
        solver={"name": "scip", "wall_s": time.perf_counter() - t0, "solve_wall_s": float(table["wall_s"].sum()),
                "solves": 2 * len(table), "gap": float(table["gap"].max())},
        mip_never_worse=bool((table["peak_tokens_mip"] <= table["peak_tokens_greedy"] * (1 + 1e-9)).all()),
    ))
    out.tables = {"placement": table}
    return out


def run_kv_tiers_study(spec: StudySpec, progress: Callable[[str], None] | None = None) -> StudyOutput:
    """Assign each class of cached prefixes a tier (MIP); drain times; cache-hit against cache-write cost."""
    from dse.kvcache import PrefixClass, tiering_data
    from dse.solver import solve
    from formulations import kv_tiering as fk

    t0 = time.perf_counter()
    kt = spec.kv_tiers
    classes = [PrefixClass(c.name, c.prefix_tokens, c.prefixes_kept, c.lifetime_s, c.hits_per_s, c.ttft_s)
               for c in kt.classes]
    rows, results = [], []
    tiers_info = {}
    for model_id in spec.models:
        if progress:
            progress(model_id)
        serve = {"tp": kt.tp, "chips": kt.chips, "weights_dtype": kt.weights_dtype}
        data, info = tiering_data(model_id, kt.system, kt.chips, serve, classes, kt.nvme_drives, kt.hdd_drives)
        tm = fk.build(data)
        engine, res = solve(tm.model, spec.solver.name)
        results.append(res)
        if not res.ok:
            raise InfeasibleError(f"{model_id}: no tier assignment fits the tiers' capacity, bandwidth and TTFT")
        z = engine.values(tm.z).to_numpy().reshape(len(classes), len(fk.TIERS))
        tiers_info = {k: {"capacity": v.capacity, "bandwidth": v.bandwidth, "drain_s": v.drain_s,
                          "usd_per_gb_hour": v.usd_per_byte_s * 1e9 * 3600} for k, v in info["tiers"].items()}
        for i, c in enumerate(classes):
            j = int(z[i].argmax())
            recompute = fk.TIERS.index("recompute")
            write = data.cost[i, recompute] / c.hits_per_s if c.hits_per_s else float("nan")  # one prefill
            hit = data.cost[i, j] / c.hits_per_s if c.hits_per_s and j != recompute else write
            drains = {t: tiers_info[t]["drain_s"] for t in tiers_info}
            rows.append({"model": model_id, "class": c.name, "prefix_tokens": c.prefix_tokens,
                         "lifetime_s": c.lifetime_s, "hits_per_s": c.hits_per_s, "tier": fk.TIERS[j],
                         "usd_per_hour": data.cost[i, j] * 3600, "load_s": data.load_s[i, j],
                         "tier_drain_s": drains.get(fk.TIERS[j], float("nan")),
                         "usd_per_cache_write": write, "usd_per_cache_hit": hit,
                         "write_over_hit": write / hit if hit else float("nan"),
                         "gb_kept": data.bytes_kept[i] / 1e9})
    table = pd.DataFrame(rows)
    out = StudyOutput(summary=_summary(spec, tiers=tiers_info, **_solved(spec, results, t0)))
    out.tables = {"kv_tiers": table, "tiers": pd.DataFrame([{"tier": k, **v} for k, v in tiers_info.items()])}
    return out


def run_pricing_study(spec: StudySpec, progress: Callable[[str], None] | None = None) -> StudyOutput:
    """Inverse reading of price sheets; forward tier prices from the serving optimum at each context."""
    import numpy as np

    from dse.hardware import get_system
    from dse.pricing import PriceSheet, consistent_architectures, inverse, tier_prices

    t0 = time.perf_counter()
    pr = spec.pricing
    system = get_system(pr.system)
    inv, consistent = [], []
    for sh in pr.sheets:
        sheet = PriceSheet(sh.name, sh.step_context, sh.input[0], sh.input[1], sh.output[0], sh.output[1])
        inv += inverse(sheet, system, np.array(pr.actives_b) * 1e9)
        consistent += consistent_architectures(sheet, system, np.array(pr.actives_b) * 1e9)
    fwd, tiers, results = [], [], []
    opts = spec.space.options()
    base = spec.workloads[0]
    for model_id in spec.models:
        model = get_model(model_id)
        costs = []
        for ctx in pr.contexts:
            if progress:
                progress(f"{model_id}: context {ctx:,}")
            w = replace(base.workload(), name=f"{ctx}", prompt=ctx - base.output if ctx > base.output else ctx)
            space = build_space(model, w, opts)
            try:
                r = solve_serving(space, w.tpot_max, solver=spec.solver.name)
            except InfeasibleError as exc:
                fwd.append({"model": model_id, "context": ctx, "status": "infeasible", "reason": str(exc)})
                costs.append(np.inf)
                continue
            results.append(r.result)
            e = entry(space, r, opts.ideal)
            fwd.append({"model": model_id, "context": ctx, "status": r.result.status, "reason": "",
                        **{k: e[k] for k in ("system", "chips", "batch", "usd_per_mtok", "usd_per_mtok_input",
                                             "tpot_s", "bound")}})
            costs.append(e["usd_per_mtok"])
        for t in tier_prices(np.array(pr.contexts, dtype=float), np.array(costs), pr.tier_boundaries, pr.margin):
            tiers.append({"model": model_id, **t})
    out = StudyOutput(summary=_summary(spec, **_solved(spec, results, t0)))
    out.tables = {"pricing_inverse": pd.DataFrame(inv), "pricing_consistent": pd.DataFrame(consistent),
                  "pricing_forward": pd.DataFrame(fwd),
                  "pricing_tiers": pd.DataFrame(tiers)}
    return out


def run_codesign_study(spec: StudySpec, progress: Callable[[str], None] | None = None) -> StudyOutput:
    """For each scale-up domain, the serving cost of each sparsity at fixed quality; the optimum per domain."""
    from dse.codesign import codesign_point

    t0 = time.perf_counter()
    cd = spec.codesign
    w = spec.workloads[0].workload()
    rows = []
    for system in cd.systems:
        opts = replace(spec.space.options(), systems=(system,), max_racks=1)  # one scale-up domain
        for s in cd.sparsities:
            if progress:
                progress(f"{system}: sparsity {s}")
            rows.append({"system_domain": system, **codesign_point(cd.effective_params_b * 1e9, s, cd.gamma, w, opts,
                                                                   spec.solver.name)})
    table = pd.DataFrame(rows)
    best = []
    for system, g in table.groupby("system_domain", sort=False):
        ok = g[g["status"] != "infeasible"]
        if ok.empty:
            best.append({"system_domain": system, "status": "infeasible"})
            continue
        b = ok.loc[ok["usd_per_mtok"].idxmin()]
        best.append({"system_domain": system, "status": "optimal", "sparsity": int(b["sparsity"]),
                     "params_total": b["params_total"], "params_active": b["params_active"],
                     "usd_per_mtok": b["usd_per_mtok"], "chips": int(b["chips"])})
    solved = table[table["status"] != "infeasible"]
    out = StudyOutput(summary=_summary(
        spec, optimum=best, status="optimal" if (solved["status"] == "optimal").all() else "feasible",
        solver={"name": spec.solver.name, "wall_s": time.perf_counter() - t0, "solves": len(rows),
                "solve_wall_s": time.perf_counter() - t0, "gap": 0.0},
    ))
    out.tables = {"codesign": table, "codesign_best": pd.DataFrame(best)}
    return out
