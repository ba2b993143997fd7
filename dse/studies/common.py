"""What the serving study kinds share: optima as `dse evaluate` reports them, the searched modes of a space, and
the loop over (model, workload) that gathers each one's optima, solves and rows into a `Solved`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace

import numpy as np
import pandas as pd

from dse.catalog.calibration import family_of
from dse.catalog.hardware import System
from dse.catalog.models import get_model
from dse.errors import InfeasibleError
from dse.optimize.requests import (
    BlockOptima,
    DisaggregatedResult,
    DisaggregatedTables,
    RequestResult,
    block_optima,
    disaggregated_tables,
    pick,
    pick_disaggregated,
)
from dse.optimize.serving import ServingResult
from dse.optimize.solver import SolveResult
from dse.optimize.space import Space, build_space, describe_choice, subset
from dse.physics.evaluate import Config, evaluate_config
from dse.studies.base import StudySpec
from dse.studies.contract import Optimum, Progress, Solved, status_of

METRICS = ("tpot_s", "ttft_s", "usd_per_mtok", "tokens_per_s", "hbm_bytes_per_chip")
EXTRA = (
    "usd_per_mtok_input", "compute_s", "memory_s", "comm_s", "step_s", "bound", "tp_comm_s", "ep_comm_s",
    "pp_comm_s", "weights_bytes_per_chip", "kv_bytes_per_chip", "activation_bytes_per_chip", "hbm_capacity_per_chip",
    "sequences_in_flight", "usd_per_chip_hour", "prompt", "usd_per_mtok_band", "tokens_per_s_band",
    "price_kind", "price_is_estimate", "power_w", "joules_per_token", "experts_dtype", "attention_dtype",
    "beyond_trained_context", "max_context",
)
REQUEST_EXTRA = (
    "serving", "usd_per_request", "usd_per_mtok_input", "usd_per_mtok_output", "usd_per_mtok_blended",
    "tokens_per_s_per_gpu", "tokens_per_s_per_user", "power_w", "price_kind", "prefill_share",
)
CONFIG_KEYS = ("system", "chips", "tp", "ep", "pp", "dp", "batch", "weights_dtype", "kv_dtype", "kv_tier")
LAYOUT_KEYS = ("system", "batch", "context", "tp", "ep", "pp", "dp", "etp", "weights_dtype", "kv_dtype", "kv_tier")
"""The fields of a configuration that `Config` takes as they are."""


def config_entry(model: str, workload_name: str, prompt: int, cfg: dict, ideal: bool,
                 output: int | None = None, request_level: bool = False, system: System | None = None,
                 weight_only: bool = True) -> dict:
    """A configuration with its metrics computed by `dse evaluate` on the catalog hardware, at the price
    of ``system`` (the priced system of the study's space) when given. The space already decided which
    formats and contexts are allowed, so they are not checked again.

    With ``output``, the request-level keys of the same replica serving requests aggregated at its
    batch are added (`dse evaluate --prompt --output`): `serving`, `usd_per_request`,
    `usd_per_mtok_input|output|blended`, `tokens_per_s_per_gpu|user`, `power_w`, `price_kind`,
    `prefill_share`, and the request-level TTFT and TPOT (with prefill interference) as
    `request_ttft_s` and `request_tpot_s`; `ttft_s` and `tpot_s` stay the step-level figures the
    search constrains.

    With ``request_level`` (the configuration was chosen on the request-level objective), `ttft_s`,
    `tpot_s`, `usd_per_mtok` (USD per request / O: the whole request, prefill included, per million
    output tokens) and `tokens_per_s` (the replica's output tokens/s at its request rate) are the
    request-level figures, the step-level ones move to `step_ttft_s`, `step_tpot_s`,
    `step_usd_per_mtok` and `step_tokens_per_s`, and `pools` lists the one aggregated pool.
    """
    price = {} if system is None else {"price_kind": system.price_kind, "usd_per_chip_hour": system.price_per_s * 3600}
    config = Config(model=model, prompt=prompt, weight_only=weight_only, allow_beyond_trained_context=True,
                    **{k: cfg[k] for k in LAYOUT_KEYS}, **price)
    ev = evaluate_config(config, ideal=ideal)
    if system is not None:
        ev["price_is_estimate"] = system.price_is_estimate
    ev["usd_per_mtok_input"] = ev["chips"] * ev["usd_per_chip_hour"] / 3600 * ev["ttft_s"] / prompt * 1e6
    req: dict = {}
    if output is not None:
        rq = evaluate_config(replace(config, output=output), ideal=ideal)
        req = {k: rq[k] for k in REQUEST_EXTRA}
        req["request_ttft_s"], req["request_tpot_s"] = rq["ttft_s"], rq["tpot_s"]
    keys = ("system", "chips", "racks", "tp", "ep", "pp", "dp", "etp", "batch", "context", "weights_dtype",
            "kv_dtype", "kv_tier")
    out = {"model": model, "workload": workload_name, **{k: cfg[k] for k in keys}}
    out.update({k: ev[k] for k in METRICS})
    out.update({k: ev[k] for k in EXTRA})
    out.update(req)
    if request_level and output is not None:
        for key in ("ttft_s", "tpot_s", "usd_per_mtok", "tokens_per_s"):
            out["step_" + key] = out[key]
        out["ttft_s"], out["tpot_s"] = out.pop("request_ttft_s"), out.pop("request_tpot_s")
        out["usd_per_mtok"] = out["usd_per_request"] / output * 1e6
        out["tokens_per_s"] = out["tokens_per_s_per_gpu"] * out["chips"]
        out["output"] = output
        out["pools"] = [{"role": "both", "replicas": 1,
                         **{k: cfg[k] for k in ("system", "chips", "racks", "tp", "ep", "pp", "dp", "batch",
                                                "weights_dtype", "kv_dtype", "kv_tier")}}]
    out["calibration"] = family_of(cfg["system"]) or "uncalibrated family"
    out["price_is_estimate"] = bool(ev.get("price_is_estimate", False))
    return out


def entry(space: Space, res: ServingResult | RequestResult, ideal: bool) -> dict:
    """One optimum as the contract names it: model, workload, configuration, metrics (as `dse evaluate`).

    A `RequestResult` (the request-level search) gives the request-level keys under the contract's
    names and the limit that binds its batch as `binding`.
    """
    request_level = isinstance(res, RequestResult)
    system = next(s for s in space.systems if s.id == res.config["system"])
    out = config_entry(space.model.id, space.workload.name, space.workload.prompt, res.config, ideal,
                       output=space.workload.output, request_level=request_level, system=system)
    if request_level:
        out["binding"] = res.binding
    out["solver_status"] = res.result.status
    out["gap"] = res.result.gap
    return out


def disaggregated_entry(space: Space, res: DisaggregatedResult, ideal: bool) -> dict:
    """A disaggregated optimum as the contract names it: the decode pool's configuration and step figures at the
    top level (as an aggregated entry has its replica's), the request-level keys of the whole deployment
    (prefill pool at its planned utilisation, KV transfer in TTFT, costs of both pools), and ``pools``.
    """
    system = next(s for s in space.systems if s.id == res.pools[1]["system"])
    pre_sys = next(s for s in space.systems if s.id == res.pools[0]["system"])
    cfg = describe_choice(space, res.decode)
    out = config_entry(space.model.id, space.workload.name, space.workload.prompt, cfg, ideal,
                       output=space.workload.output, request_level=True, system=system)
    m = res.metrics
    for key in ("ttft_s", "tpot_s", "tokens_per_s_per_gpu", "tokens_per_s_per_user", "usd_per_request",
                "usd_per_mtok_input", "usd_per_mtok_output", "usd_per_mtok_blended", "chips", "power_w",
                "prefill_share", "kv_transfer_s"):
        out[key] = m[key]
    out["serving"] = "disaggregated"
    out["usd_per_mtok"] = m["usd_per_request"] / space.workload.output * 1e6
    out["tokens_per_s"] = m["tokens_per_s_per_gpu"] * m["chips"]
    out["pool_ratio"] = m["prefill_replicas"]  # prefill replicas per decode replica (fluid)
    out["prefill_utilisation"] = m["prefill_rho"]
    out["prefill_service_s"] = m["prefill_service_s"]
    out["context_parallel"] = res.context_parallel
    out["pools"] = res.pools
    out["price_is_estimate"] = bool(system.price_is_estimate or pre_sys.price_is_estimate)
    cal = {family_of(s.id) or "uncalibrated family" for s in (system, pre_sys)}
    out["calibration"] = "uncalibrated family" if "uncalibrated family" in cal else ", ".join(sorted(cal))
    out["binding"] = res.binding
    out["solver_status"] = res.result.status
    out["gap"] = res.result.gap
    return out


@dataclass
class ModeTables:
    """The evaluated pairs of each searched deployment mode of one space (evaluated once, masked per question)."""

    aggregated: BlockOptima | None
    disaggregated: DisaggregatedTables | None


def mode_tables(space: Space, spec: StudySpec, demand: float | None = None) -> ModeTables:
    """Evaluate the space once per deployment mode the study searches (``space.serving``)."""
    modes = spec.space.serving
    req = space.workload
    agg = block_optima(space, req, demand=demand) if "aggregated" in modes else None
    cps = (False, True) if spec.space.context_parallel else (False,)
    dis = disaggregated_tables(space, req, cps, demand=demand) if "disaggregated" in modes else None
    return ModeTables(agg, dis)


def pick_modes(space: Space, tables: ModeTables, ideal: bool, mask: np.ndarray | None = None, entries: bool = True
               ) -> tuple[list[tuple[dict, object]], list[str]]:
    """The optimum of each searched mode where ``mask`` holds: (entry, result) pairs, cheapest first, and the
    reason of each mode that has none. With ``entries`` false the entry holds only ``serving`` and
    ``usd_per_request`` (no `dse evaluate` of the configuration).
    """
    found, reasons = [], []
    searches = (("aggregated", tables.aggregated, pick, entry),
                ("disaggregated", tables.disaggregated, pick_disaggregated, disaggregated_entry))
    for mode, table, choose, describe in searches:
        if table is None:
            continue
        try:
            r = choose(space, table, mask=mask)
        except InfeasibleError as exc:
            reasons.append(f"{mode}: {exc}")
            continue
        e = describe(space, r, ideal) if entries else {"serving": mode,
                                                       "usd_per_request": r.metrics["usd_per_request"]}
        found.append((e, r))
    found.sort(key=lambda fr: fr[0]["usd_per_request"])
    return found, reasons


def optimum(e: dict, res: ServingResult | RequestResult | DisaggregatedResult) -> Optimum:
    """An entry of `entry` or `disaggregated_entry` at the level its result's type gives its figures."""
    return Optimum(e, request_level=isinstance(res, (RequestResult, DisaggregatedResult)))


def chosen_blocks(space: Space, entries: list[dict]) -> Space:
    """The space with only the blocks of its chosen entries (what a report explains), so that a study over many
    spaces keeps no more of each than its answers.
    """
    b = space.blocks
    keep = np.zeros(len(b), dtype=bool)
    for e in entries:
        if (e.get("model"), e.get("workload")) == (space.model.id, space.workload.name):
            keep |= ((b["system"] == e["system"]) & (b["tp"] == e["tp"]) & (b["dp"] == e["dp"])
                     & (b["ep"] == e["ep"]) & (b["pp"] == e["pp"])).to_numpy()
    return subset(space, keep)


def best_table(best: list[Optimum]) -> pd.DataFrame:
    """The ``best`` table: each optimum's flat figures (its pools and other nested keys left to summary.json)."""
    return pd.DataFrame([{k: v for k, v in o.entry.items() if not isinstance(v, (dict, list))} for o in best])


@dataclass
class Found:
    """What the serving kinds' ``solve_one`` gathers over the spaces: optima, solve results, the rows of each table
    (framed once every space is solved) and the kind's own summary keys.
    """

    best: list[Optimum] = field(default_factory=list)
    results: list[SolveResult] = field(default_factory=list)
    rows: dict[str, list[dict]] = field(default_factory=dict)
    facts: dict = field(default_factory=dict)


def run_serving(spec: StudySpec, solve_one: Callable[[Space, StudySpec, bool, Found], None],
                progress: Progress | None = None) -> Solved:
    """Build the space of every (model, workload) and hand it to ``solve_one``, which adds what it finds to a
    `Found`; infeasible pairs are recorded, not raised. The tables are framed here, with ``best`` last.
    """
    opts = spec.options()
    found = Found()
    infeasible: list[dict] = []
    stats: list[dict] = []
    spaces: dict[tuple[str, str], Space] = {}
    jobs = [(model_id, ws.workload()) for model_id in spec.models for ws in spec.workloads]
    sizes = [0] * len(jobs)
    if progress and len(jobs) > 1:  # the whole search's size up front (each space is small beside its pairs)
        for k, (model_id, w) in enumerate(jobs):
            progress(f"counting the configurations of {model_id} / {w.name}", k, len(jobs))
            sizes[k] = build_space(get_model(model_id), w, opts).size
    total = sum(sizes)
    for k, (model_id, w) in enumerate(jobs):
        space = build_space(get_model(model_id), w, opts)
        if progress:
            what = f"{model_id} / {w.name}: {space.size:,} configurations"
            if len(jobs) > 1:
                progress(f"{what} (space {k + 1} of {len(jobs)}, {total:,} in all)", sum(sizes[:k]), total)
            else:
                sizes[k] = total = space.size
                progress(what, 0, total)
        stats.append({"model": model_id, "workload": w.name, **space.stats})
        try:
            solve_one(space, spec, opts.ideal, found)
        except InfeasibleError as exc:
            infeasible.append({"model": model_id, "workload": w.name, "reason": str(exc)})
        spaces[(model_id, w.name)] = chosen_blocks(space, [o.entry for o in found.best])
    if progress:
        progress(f"{total:,} configurations searched", total, total)
    tables = {k: pd.DataFrame(v) for k, v in found.rows.items()}
    if found.best:
        tables["best"] = best_table(found.best)
    return Solved(status=status_of(found.results, infeasible), best=found.best, infeasible=infeasible,
                  tables=tables, results=found.results, spaces=spaces, space_stats=stats, facts=found.facts)
