"""What every study kind shares: the output type, optima as `dse evaluate` reports them, the summary
header, solver statistics, and the loop over (model, workload) of the serving kinds.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from dse.catalog.hardware import System, default_systems
from dse.catalog.models import get_model
from dse.errors import InfeasibleError
from dse.optimize.serving import ServingResult, solve_serving
from dse.optimize.space import Space, build_space
from dse.physics.evaluate import Config, evaluate_config
from dse.studies.base import StudySpec

Progress = Callable[[str], None]

METRICS = ("tpot_s", "ttft_s", "usd_per_mtok", "tokens_per_s", "hbm_bytes_per_chip")
EXTRA = (
    "usd_per_mtok_input", "compute_s", "memory_s", "comm_s", "step_s", "bound", "tp_comm_s", "ep_comm_s",
    "pp_comm_s", "weights_bytes_per_chip", "kv_bytes_per_chip", "activation_bytes_per_chip", "hbm_capacity_per_chip",
    "sequences_in_flight", "usd_per_chip_hour", "prompt", "usd_per_mtok_band", "tokens_per_s_band",
    "price_kind", "price_is_estimate", "power_w", "joules_per_token", "experts_dtype", "attention_dtype",
    "beyond_trained_context", "max_context",
)
CONFIG_KEYS = ("system", "chips", "tp", "ep", "pp", "dp", "batch", "weights_dtype", "kv_dtype", "kv_tier")


@dataclass
class StudyOutput:
    """Everything a study produced, before it is written."""

    summary: dict
    tables: dict[str, pd.DataFrame] = field(default_factory=dict)
    spaces: dict[tuple[str, str], Space] = field(default_factory=dict)


@dataclass(frozen=True)
class Plot:
    """One figure of a study's report: drawn from the output into ``file`` when ``table`` has rows."""

    table: str
    file: str
    draw: Callable[[StudyOutput, Path], None]


def config_entry(model: str, workload_name: str, prompt: int, cfg: dict, ideal: bool,
                 system: System | None = None, weight_only: bool = True) -> dict:
    """A configuration with its metrics computed by `dse evaluate` on the catalog hardware, at the price
    of ``system`` (the priced system of the study's space) when given. The space already decided which
    formats and contexts are allowed, so they are not checked again.
    """
    ev = evaluate_config(
        Config(
            model=model, system=cfg["system"], batch=cfg["batch"], context=cfg["context"], tp=cfg["tp"],
            ep=cfg["ep"], pp=cfg["pp"], dp=cfg["dp"], etp=cfg["etp"], weights_dtype=cfg["weights_dtype"],
            kv_dtype=cfg["kv_dtype"], kv_tier=cfg["kv_tier"], prompt=prompt, weight_only=weight_only,
            allow_beyond_trained_context=True,
            **({} if system is None else {"price_kind": system.price_kind,
                                          "usd_per_chip_hour": system.price_per_s * 3600}),
        ),
        ideal=ideal,
    )
    if system is not None:
        ev["price_is_estimate"] = system.price_is_estimate
    ev["usd_per_mtok_input"] = ev["chips"] * ev["usd_per_chip_hour"] / 3600 * ev["ttft_s"] / prompt * 1e6
    keys = ("system", "chips", "racks", "tp", "ep", "pp", "dp", "etp", "batch", "context", "weights_dtype",
            "kv_dtype", "kv_tier")
    out = {"model": model, "workload": workload_name, **{k: cfg[k] for k in keys}}
    out.update({k: ev[k] for k in METRICS})
    out.update({k: ev[k] for k in EXTRA})
    return out


def no_price(spec: StudySpec) -> list[str]:
    """Systems of the study's space without a price of its kind (and none supplied): left out of costs."""
    opts = spec.options()
    catalog = default_systems(spec.price)
    return [s for s in opts.systems if s in catalog and math.isnan(catalog[s].price_per_s) and s not in spec.prices]


def summary_header(spec: StudySpec, **extra) -> dict:
    """The keys every summary.json starts with; ``extra`` adds or replaces keys."""
    return {"study": spec.study, "kind": spec.kind, "description": spec.description.strip(),
            "expect": spec.expect.strip(), "price_kind": spec.price, "no_price": no_price(spec),
            "best": [], "infeasible": [], "spaces": [], **extra}


def solver_summary(spec: StudySpec, results: list, t0: float, name: str | None = None) -> dict:
    """The ``solver`` block of a summary from the SolveResults of a study."""
    return {"name": name or spec.solver.name, "wall_s": time.perf_counter() - t0,
            "solve_wall_s": float(sum(r.wall_s for r in results)), "solves": len(results),
            "gap": float(max((r.gap for r in results), default=0.0))}


def solved(spec: StudySpec, results: list, t0: float) -> dict:
    """Status and solver statistics from the SolveResults of a study."""
    return {"status": "optimal" if all(r.status == "optimal" for r in results) else "feasible",
            "solver": solver_summary(spec, results, t0)}


def entry(space: Space, res: ServingResult, ideal: bool) -> dict:
    """One optimum as the contract names it: model, workload, configuration, metrics (as `dse evaluate`)."""
    system = next(s for s in space.systems if s.id == res.config["system"])
    out = config_entry(space.model.id, space.workload.name, space.workload.prompt, res.config, ideal, system)
    out["solver_status"] = res.result.status
    out["gap"] = res.result.gap
    return out


def solve_space(space: Space, spec: StudySpec, tpot: float | None, **kw) -> ServingResult:
    """The serving optimum of a space under a TPOT target, with the study's solver settings."""
    return solve_serving(space, tpot, solver=spec.solver.name, time_limit_s=spec.solver.time_limit_s, **kw)


def run_serving(spec: StudySpec, solve_one: Callable[[Space, StudySpec, StudyOutput, bool], None],
                progress: Progress | None = None) -> StudyOutput:
    """Build the space of every (model, workload) and hand it to ``solve_one``; infeasible pairs are
    recorded, not raised. ``solve_one`` appends its optima to ``summary['best']``, its SolveResults to
    ``summary['_results']`` and its rows to ``tables`` (lists of dicts, framed here).
    """
    t0 = time.perf_counter()
    opts = spec.options()
    out = StudyOutput(summary=summary_header(spec, _results=[]))
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
                solve_one(space, spec, out, opts.ideal)
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
    out.summary["solver"] = solver_summary(spec, results, t0)
    out.tables = {k: pd.DataFrame(v) for k, v in out.tables.items()}
    if out.summary["best"]:
        flat = [{k: v for k, v in e.items() if not isinstance(v, (dict, list))} for e in out.summary["best"]]
        out.tables["best"] = pd.DataFrame(flat)
    return out
