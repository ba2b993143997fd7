"""What the serving study kinds share: optima as `dse evaluate` reports them (with their error bands), the searched
modes of a space judged as the study decides (`decide_of`), whether each optimum is decided against the best of
every other system and mode (`decision`), and the loop over (model, workload) that gathers each one's optima,
solves and rows into a `Solved`.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

import numpy as np

from dse.catalog.calibration import Bands, band_keys, bands_of, calibrated, family_of
from dse.catalog.hardware import System
from dse.catalog.models import get_model
from dse.errors import InfeasibleError
from dse.optimize.margins import Margins, margins_for
from dse.optimize.requests import (
    BlockOptima,
    DisaggregatedResult,
    DisaggregatedTables,
    RequestResult,
    best_result,
    block_optima,
    disaggregated_tables,
    ranked,
    ranked_disaggregated,
)
from dse.optimize.solver import SolveResult
from dse.optimize.space import Space, build_space, describe_choice, subset
from dse.optimize.whole import Budget, racks_of, whole_aggregated, whole_disaggregated
from dse.physics.evaluate import Config, evaluate_levels
from dse.physics.queueing import QUANTILES, quantile_name
from dse.physics.serving import Request
from dse.studies.base import StudySpec
from dse.studies.contract import Optimum, Progress, Solved, status_of
from dse.table import Table

if TYPE_CHECKING:
    import pandas as pd

METRICS = ("tpot_s", "ttft_s", "usd_per_mtok", "tokens_per_s", "hbm_bytes_per_chip")
EXTRA = (
    "usd_per_mtok_input", "compute_s", "memory_s", "comm_s", "step_s", "bound", "tp_comm_s", "ep_comm_s",
    "pp_comm_s", "weights_bytes_per_chip", "kv_bytes_per_chip", "activation_bytes_per_chip", "hbm_capacity_per_chip",
    "sequences_in_flight", "usd_per_chip_hour", "prompt", "price_kind", "price_is_estimate", "power_w",
    "joules_per_token", "experts_dtype", "attention_dtype", "beyond_trained_context", "max_context", "framework",
    "mem_fraction", "hbm_usable_per_chip", "device_memory_per_chip",
)
QUANTILE_KEYS = tuple(f"{m}_{quantile_name(q)}_s" for q in QUANTILES for m in ("ttft", "tpot"))
"""The quantile keys of a request-level entry (``ttft_p90_s``, ...)."""


def pools_quantiles(e: dict) -> None:
    """Clear the quantile keys of an entry whose figures a program combined from several pools: `config_entry`
    evaluated its largest pool as one aggregated replica, whose quantiles are not the deployment's (the means are
    set from the pools).
    """
    if e.get("serving") != "aggregated" or len(e.get("pools") or ()) > 1:
        e.update({k: None for k in QUANTILE_KEYS})


REQUEST_EXTRA = (
    "serving", "usd_per_request", "usd_per_mtok_input", "usd_per_mtok_output", "usd_per_mtok_blended",
    "tokens_per_s_per_gpu", "tokens_per_s_per_user", "power_w", "price_kind", "prefill_share", "arrival",
    "stack_latency_s", *QUANTILE_KEYS,
)
CONFIG_KEYS = ("system", "chips", "tp", "ep", "pp", "dp", "batch", "weights_dtype", "kv_dtype", "kv_tier")
LAYOUT_KEYS = ("system", "batch", "context", "tp", "ep", "pp", "dp", "etp", "weights_dtype", "kv_dtype", "kv_tier")
"""The fields of a configuration that `Config` takes as they are."""


def config_entry(model: str, workload_name: str, prompt: int, cfg: dict, ideal: bool,
                 output: int | None = None, request_level: bool = False, system: System | None = None,
                 weight_only: bool = True, req: Request | None = None, framework: str | None = None,
                 mem_fraction: float | None = None, memo: dict | None = None) -> dict:
    """A configuration with its metrics computed by `dse evaluate` on the catalog hardware, at the price
    of ``system`` (the priced system of the study's space) when given. The space already decided which
    formats and contexts are allowed, so they are not checked again.

    With ``output``, the request-level keys of the same replica serving requests aggregated at its
    batch are added (`dse evaluate --prompt --output`): `serving`, `usd_per_request`,
    `usd_per_mtok_input|output|blended`, `tokens_per_s_per_gpu|user`, `power_w`, `price_kind`,
    `prefill_share`, and the request-level TTFT and TPOT (with prefill interference) as
    `request_ttft_s` and `request_tpot_s`; `ttft_s` and `tpot_s` stay the step-level figures the
    search constrains. Every predicted figure carries its band (`dse.catalog.calibration.band_keys`).

    With ``request_level`` (the configuration was chosen on the request-level objective), `ttft_s`,
    `tpot_s`, `usd_per_mtok` (USD per request / O: the whole request, prefill included, per million
    output tokens) and `tokens_per_s` (the replica's output tokens/s at its request rate) are the
    request-level figures, the step-level ones move to `step_ttft_s`, `step_tpot_s`,
    `step_usd_per_mtok` and `step_tokens_per_s`, and `pools` lists the one aggregated pool.

    ``req`` (the workload as the space serves it) gives the request's chunk budget, prefix-cache share,
    speculation, arrivals and serving framework; ``framework`` and ``mem_fraction`` the deployment's framework (where
    ``req`` names none) and its memory fraction.

    ``memo`` (a dict the caller keeps, e.g. `ModeTables.entries`): a configuration asked for again with the same
    arguments (``system`` and ``req`` the same objects) gets a copy of its first entry instead of a second
    evaluation.
    """
    if memo is None:
        return _config_entry(model, workload_name, prompt, cfg, ideal, output, request_level, system, weight_only, req,
                             framework, mem_fraction)
    key = (model, workload_name, prompt, tuple(sorted(cfg.items())), ideal, output, request_level, id(system),
           weight_only, id(req), framework, mem_fraction)
    if key not in memo:  # the objects keyed by identity are kept with the entry: their ids stay theirs
        memo[key] = (_config_entry(model, workload_name, prompt, cfg, ideal, output, request_level, system,
                                   weight_only, req, framework, mem_fraction), system, req)
    return copy.deepcopy(memo[key][0])


def _config_entry(model: str, workload_name: str, prompt: int, cfg: dict, ideal: bool, output: int | None,
                  request_level: bool, system: System | None, weight_only: bool, req: Request | None,
                  framework: str | None, mem_fraction: float | None) -> dict:
    """`config_entry` evaluated."""
    price = {} if system is None else {"price_kind": system.price_kind, "usd_per_chip_hour": system.price_per_s * 3600}
    served = {} if req is None else {"chunk": req.chunk, "cached": req.cached, "draft": req.draft,
                                     "accept": req.accept, "arrival": req.arrival}
    config = Config(model=model, prompt=prompt, weight_only=weight_only, allow_beyond_trained_context=True,
                    framework=(req.stack.framework if req is not None else "") or framework,
                    mem_fraction=mem_fraction, **{k: cfg[k] for k in LAYOUT_KEYS}, **price, **served)
    ev, rq = evaluate_levels(config if output is None else replace(config, output=output), ideal=ideal)
    if system is not None:
        ev["price_is_estimate"] = system.price_is_estimate
    ev["usd_per_mtok_input"] = ev["chips"] * ev["usd_per_chip_hour"] / 3600 * ev["ttft_s"] / prompt * 1e6
    req: dict = {}
    if output is not None:
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
    out.update(band_keys(out, None if ideal else bands_of(cfg["system"])))
    return out


BAND_COLUMNS = ("usd_per_request", "ttft_s", "tpot_s")
"""The bands a table row of an optimum spells out as flat columns."""


def band_columns(e: dict) -> dict:
    """``<key>_band_low`` and ``<key>_band_high`` of an entry's bands of BAND_COLUMNS (a table's cells are numbers)."""
    out = {}
    for key in BAND_COLUMNS:
        band = e.get(f"{key}_band") or [float("nan")] * 2
        out[f"{key}_band_low"], out[f"{key}_band_high"] = band
    return out


def pooled_bands(cost: list[tuple[str, float]], ttft: list[tuple[str, float]], tpot: list[tuple[str, float]],
                 sized_low: bool = False) -> Bands | None:
    """The bands of a deployment of several pools as multipliers of its own figures: its cost the sum of the
    (system, USD) parts of ``cost``, each at its system's band; its TTFT and TPOT the largest of the (system,
    seconds) parts of ``ttft`` and ``tpot``, each at its system's band. ``sized_low``: each pool's replicas were
    bought for its throughput band's low end, so its cost of serving the demand runs from what the band's high
    end needs up to what was bought. None where a system has no band.
    """
    systems = {s for s, _ in (*cost, *ttft, *tpot)}
    bands = {s: bands_of(s) for s in systems}
    if any(b is None for b in bands.values()) or not cost:
        return None
    total = sum(v for _, v in cost)

    def scaled(end: int) -> float:
        return sum(v * bands[s].cost[end] * (bands[s].throughput[0] if sized_low else 1.0) for s, v in cost) / total

    def worst(parts: list[tuple[str, float]], metric: str) -> tuple[float, float]:
        top = max(v for _, v in parts)
        return tuple(max(v * getattr(bands[s], metric)[end] for s, v in parts) / top for end in (0, 1))

    return Bands((1.0 / scaled(1), 1.0 / scaled(0)), worst(tpot, "tpot"), worst(ttft, "ttft"))


def banded(out: dict, deployed: dict, bands: Bands | None) -> None:
    """An entry's bands (`band_keys`). Where a pool holds fewer sequences than planned (``served_edges`` of its
    figures as deployed: `dse.optimize.requests.at_served_load`), each end of its TTFT and TPOT band is the band's
    multiplier times the figure at the batch the pool holds at that end of its throughput band: a pool slower than
    predicted holds more sequences for the same rate, so its TPOT rises more than the multiplier alone says.
    """
    out.update(band_keys(out, bands))
    for key, (fast, slow) in (deployed.get("served_edges") or {}).items():
        if bands is not None and out.get(f"{key}_band") is not None:
            lo, hi = getattr(bands, key.removesuffix("_s"))
            out[f"{key}_band"] = [fast * lo, slow * hi]


def served_pools(pools: pd.DataFrame, space_of: Callable[[dict], Space]) -> tuple[pd.DataFrame, dict, dict]:
    """A deployment's pools (operating points with their ``load``: the share of their replicas' requests/s they
    serve) at the load they serve (`dse.optimize.operating_points.served_point`, each in its space, ``space_of``):
    their TTFT and TPOT, ``batch_served`` where they hold a batch; the served figures of a deployment of one pool
    (its quantiles; empty for several); and each figure's ``served_edges`` over the pools (the largest at each end
    of the throughput band; a pool without edges counts its figure at both ends).
    """
    import pandas as pd  # only the deployment and fleet studies' tables need it: a serving answer loads no pandas

    from dse.optimize.operating_points import served_point

    rows, edges, one = [], {}, {}
    for p in pools.to_dict("records"):
        at = served_point(space_of(p), p, p["load"])
        for key in ("ttft_s", "tpot_s"):
            if key in at and np.isfinite(p[key]):
                p[key] = at[key]
                fast, slow = at.get("served_edges", {}).get(key, (at[key], at[key]))
                lo, hi = edges.get(key, (-math.inf, -math.inf))
                edges[key] = (max(lo, fast), max(hi, slow))
        if "batch_served" in at:
            p["batch_served"] = int(at["batch_served"])
        rows.append(p)
        one = at
    return pd.DataFrame(rows, index=pools.index), edges, one if len(rows) == 1 else {}


def served_entry(e: dict, pools: pd.DataFrame, keys: tuple[str, ...], main: object, one: dict) -> None:
    """An entry's pools as served (`served_pools`): each pool's ``keys`` and its ``batch_served`` where it holds a
    batch, the entry's ``batch_served`` that of its largest pool (label ``main``) where it holds one, and, for a
    deployment of one pool (``one``), its quantiles as served.
    """
    import pandas as pd

    def plain(k: str, v):
        return int(v) if k == "batch_served" else v.item() if hasattr(v, "item") else v

    e["pools"] = [{k: plain(k, v) for k, v in p.items()
                   if k in keys + ("batch_served",) and not (k == "batch_served" and pd.isna(v))}
                  for p in pools.to_dict("records")]
    if not pd.isna(pools.loc[main].get("batch_served", math.nan)):
        e["batch_served"] = int(pools.loc[main, "batch_served"])
    e.update({k: one[k] for k in QUANTILE_KEYS if k in one})


def entry(space: Space, res: RequestResult, ideal: bool, sized_low: bool = False, memo: dict | None = None) -> dict:
    """One aggregated optimum of the request-level search as the contract names it: model, workload, configuration
    and step figures (as `dse evaluate`), the request-level keys of its whole deployment as deployed, and the limit
    that binds its batch as `binding`.
    """
    system = next(s for s in space.systems if s.id == res.config["system"])
    out = config_entry(space.model.id, space.workload.name, space.workload.prompt, res.config, ideal,
                       output=space.workload.output, request_level=True, system=system,
                       req=space.workload, mem_fraction=space.mem_fraction, memo=memo)
    out["binding"] = res.binding
    out["pools"][0]["replicas"] = res.replicas
    if "batch_served" in res.deployed:  # the replicas have capacity to spare: each holds fewer sequences
        out["pools"][0]["batch_served"] = res.deployed["batch_served"]
    as_deployed(out, res.deployed, res.metrics["usd_per_request"], space.workload.output)
    out["racks"] = racks_of(out["pools"], lambda _: int(system.scaleup_domain))  # the deployment's, as chips
    if space.workload.closed_loop and space.workload.concurrency is not None:
        out["concurrency"] = space.workload.concurrency  # the replicas hold the closed loop exactly
    parts = [(system.id, out[k]) for k in ("usd_per_request", "ttft_s", "tpot_s")]
    banded(out, res.deployed, None if ideal else pooled_bands(*([p] for p in parts), sized_low=sized_low))
    out["chunk_tokens"] = space.workload.chunk  # the chunked-prefill budget the plan was solved at
    out["solver_status"] = res.result.status
    out["gap"] = res.result.gap
    return out


DEPLOYED_KEYS = ("ttft_s", "tpot_s", "tokens_per_s_per_gpu", "tokens_per_s_per_user", "usd_per_request",
                 "usd_per_mtok_input", "usd_per_mtok_output", "usd_per_mtok_blended", "chips", "power_w",
                 "prefill_share", "requests_per_s", *QUANTILE_KEYS)
"""The request-level keys of an entry that are its whole deployment's, as deployed."""


def as_deployed(out: dict, deployed: dict, fluid_usd_per_request: float, output: int) -> None:
    """An entry's request-level figures made those of its whole deployment as deployed (`dse.optimize.requests`'s
    ``deployed``: every chip's USD/s over the requests served, its GPUs in total), the search's per-request cost at
    fractional replica counts kept as ``usd_per_request_fluid``.
    """
    for key in DEPLOYED_KEYS:
        if key in deployed:
            out[key] = deployed[key]
    out["chips"] = int(out["chips"])
    out["batch_served"] = deployed.get("batch_served", out["batch"])  # fewer where the pool has capacity to spare
    out["usd_per_request_fluid"] = fluid_usd_per_request
    out["usd_per_mtok"] = out["usd_per_request"] / output * 1e6
    out["tokens_per_s"] = out["requests_per_s"] * output


def disaggregated_entry(space: Space, res: DisaggregatedResult, ideal: bool, sized_low: bool = False,
                        memo: dict | None = None) -> dict:
    """A disaggregated optimum as the contract names it: the decode pool's configuration and step figures at the
    top level (as an aggregated entry has its replica's), the request-level keys of the whole deployment as
    deployed (`as_deployed`: its GPUs, both pools' costs over the requests served, TTFT with the KV transfer at the
    prefill pool's utilisation as deployed), the figure at the fluid pool ratio, and ``pools``. ``sized_low``: the
    replicas were bought for a demand at the low end of each pool's throughput band (its cost band says so).
    """
    system = next(s for s in space.systems if s.id == res.pools[1]["system"])
    pre_sys = next(s for s in space.systems if s.id == res.pools[0]["system"])
    cfg = describe_choice(space, res.decode)
    out = config_entry(space.model.id, space.workload.name, space.workload.prompt, cfg, ideal,
                       output=space.workload.output, request_level=True, system=system,
                       req=space.workload, mem_fraction=space.mem_fraction, memo=memo)
    m, dep = res.metrics, res.deployed
    out["serving"] = "disaggregated"
    as_deployed(out, dep, m["usd_per_request"], space.workload.output)
    out["kv_transfer_s"] = dep["kv_transfer_s"]
    for key in ("stack_latency_s", *QUANTILE_KEYS):  # at the prefill pool's utilisation as deployed
        out[key] = dep.get(key)
    out["pool_ratio"] = m["prefill_replicas"]  # prefill replicas per decode replica (fluid)
    out["prefill_utilisation"] = dep["prefill_rho"]  # as deployed (at most the planned one)
    out["prefill_service_s"] = dep["prefill_service_s"]
    out["context_parallel"] = res.context_parallel
    out["pools"] = res.pools
    out["racks"] = racks_of(res.pools, lambda s: int((system if s == system.id else pre_sys).scaleup_domain))
    out["price_is_estimate"] = bool(system.price_is_estimate or pre_sys.price_is_estimate)
    cal = {family_of(s.id) or "uncalibrated family" for s in (system, pre_sys)}
    out["calibration"] = "uncalibrated family" if "uncalibrated family" in cal else ", ".join(sorted(cal))
    usd, share = out["usd_per_request"], out["prefill_share"]
    banded(out, dep, None if ideal else pooled_bands(
        [(system.id, usd * (1 - share)), (pre_sys.id, usd * share)], [(pre_sys.id, out["ttft_s"])],
        [(system.id, out["tpot_s"])], sized_low=sized_low))
    out["binding"] = res.binding
    out["chunk_tokens"] = space.workload.chunk  # the chunked-prefill budget the plan was solved at
    out["solver_status"] = res.result.status
    out["gap"] = res.result.gap
    return out


@dataclass(frozen=True)
class Whole:
    """The whole deployments a study asks for: within ``budget``, serving ``demand`` output tokens/s, or both."""

    budget: Budget | None = None
    demand: float | None = None

    @classmethod
    def of(cls, budget: Budget | None, demand: float | None) -> Whole | None:
        """The question, or None where neither is stated (then the fluid optimum and its smallest whole
        deployment answer).
        """
        return None if budget is None and demand is None else cls(budget, demand)


@dataclass
class ModeTables:
    """The evaluated pairs of each searched deployment mode of one space (evaluated once, masked per question),
    judged as ``decide`` says (``margins``: the robust search's multipliers, None as predicted), and the whole
    deployments asked for (``whole``; None: the fluid optimum of each mode).
    """

    aggregated: BlockOptima | None
    disaggregated: DisaggregatedTables | None
    decide: str = "expected"
    margins: Margins | None = None
    whole: Whole | None = None
    searched: dict = field(default_factory=dict, init=False, repr=False)
    """`_search`'s answers by (mode, mask, top): a question asked again (the best of a system among the rivals, then
    in the systems table) is answered once."""
    entries: dict = field(default_factory=dict, init=False, repr=False)
    """`config_entry`'s memo for the entries `pick_modes` describes: a configuration chosen again (over the whole
    space, then as its system's best) is evaluated once."""


def candidate_systems(space: Space) -> list[System]:
    """The systems of a space that have a block (the ones a search can choose)."""
    return [space.systems[i] for i in sorted(set(space.blocks["system_idx"].astype(int)))]


def decide_of(spec: StudySpec, systems: list[System]) -> str:
    """How the optima of a search over ``systems`` are chosen: the study's ``decide``, else ``robust`` when any
    of them is not `calibrated` (of no family, or of a family with fewer than MIN_POINTS sweeps or points of its
    own on a metric: its predictions rest on other families' data there), else ``expected``.
    """
    if spec.decide is not None:
        return spec.decide
    return "expected" if all(calibrated(s.id) for s in systems) else "robust"


def mode_tables(space: Space, spec: StudySpec, whole: Whole | None = None) -> ModeTables:
    """Evaluate the space once per deployment mode the study searches (``space.serving``), judged as the study
    decides (`decide_of`; robust: `dse.optimize.margins`), for the whole deployments ``whole`` asks for.
    """
    modes = spec.space.serving
    req = space.workload
    decide = "expected" if space.ideal else decide_of(spec, candidate_systems(space))  # the ideal has no band
    margins = margins_for(space.systems, decide)
    agg = block_optima(space, req, margins=margins) if "aggregated" in modes else None
    cps = (False, True) if spec.space.context_parallel else (False,)
    dis = disaggregated_tables(space, req, cps, margins=margins) if "disaggregated" in modes else None
    return ModeTables(agg, dis, decide, margins, whole)


Result = RequestResult | DisaggregatedResult


def _search(space: Space, tables: ModeTables, mode: str, mask: np.ndarray | None, top: int) -> list[Result]:
    """The ``top`` best deployments of one mode where ``mask`` holds, best first: whole deployments where the
    tables ask for them (`dse.optimize.whole`), else the fluid optima (`ranked`, `ranked_disaggregated`). Each
    question is searched once per tables (`ModeTables.searched`); the answers are shared, never changed.
    """
    key = (mode, top, None if mask is None else (mask.dtype.str, mask.tobytes()))
    if key not in tables.searched:
        tables.searched[key] = _searched(space, tables, mode, mask, top)
    return tables.searched[key]


def _searched(space: Space, tables: ModeTables, mode: str, mask: np.ndarray | None, top: int) -> list[Result]:
    w = tables.whole
    if mode == "aggregated":
        if w is not None:
            return whole_aggregated(space, tables.aggregated, w.budget, w.demand, mask, top)
        return ranked(space, tables.aggregated, top, mask)
    if w is not None:
        return whole_disaggregated(space, tables.disaggregated, w.budget, w.demand, mask, top)
    return ranked_disaggregated(space, tables.disaggregated, top, mask)


ALTERNATIVES = 5
"""How many alternatives per deployment mode a `best` entry lists (``alternatives``)."""


def pick_modes(space: Space, tables: ModeTables, ideal: bool, mask: np.ndarray | None = None, entries: bool = True,
               alternatives: int = 0) -> tuple[list[tuple[dict, object]], list[str]]:
    """The optimum of each searched mode where ``mask`` holds: (entry, result) pairs, best first as the searches
    judge them (robust: at each system's band edge), and the reason of each mode that has none. With ``entries``
    false the entry holds only ``serving`` and ``usd_per_request`` (no `dse evaluate` of the configuration).
    Over the whole space (no ``mask``) with ``entries``, the best entry says how it was chosen (``decide``),
    whether it is decided against the best of every other system and mode (`decision`) and, with
    ``alternatives``, lists the next best deployments of each mode (`alternative`).
    """
    found, reasons, others = [], [], {}
    sized = tables.margins is not None and tables.whole is not None and tables.whole.demand is not None
    modes = (("aggregated", tables.aggregated, entry), ("disaggregated", tables.disaggregated, disaggregated_entry))
    for mode, table, describe in modes:
        if table is None:
            continue
        try:
            results = _search(space, tables, mode, mask, 1 + alternatives)
        except InfeasibleError as exc:
            reasons.append(f"{mode}: {exc}")
            continue
        r = results[0]
        e = (describe(space, r, ideal, sized, memo=tables.entries) if entries
             else {"serving": mode, "usd_per_request": _cost(r)})
        found.append((e, r))
        others[mode] = results
    if found:  # the least objective, equal ones by lower TPOT, lower TTFT, fewer GPUs (`best_result`)
        found = [found[k] for k in best_result([r for _, r in found], np.array([r.result.objective for _, r in found]))]
    if found and entries and mask is None:
        e, r = found[0]
        e["decide"] = tables.decide
        e.update(decision(e, rivals(space, tables, ideal, _deployment_key(e["serving"], _pools_of(r))), _cost(r)))
        if alternatives:
            e["alternatives"] = [alternative(space, mode, x) for mode, results in others.items()
                                 for x in (results[1:] if mode == e["serving"] else results)[:alternatives]]
    return found, reasons


def _cost(r: Result) -> float:
    """USD per request as the search compared it: as deployed for a whole deployment (a budget or a demand), else
    at the fluid pool ratio (the smallest whole deployment is what the entry's figures give).
    """
    return r.deployed["usd_per_request"] if r.whole else r.metrics["usd_per_request"]


CONTENDERS = 5
"""The most configurations a `best` entry lists as ``contenders``."""


def _pools_of(r: Result) -> list[dict]:
    return r.pools if isinstance(r, DisaggregatedResult) else [{"role": "both", "replicas": r.replicas, **r.config}]


def _deployment_key(serving: str, pools: list[dict]) -> tuple[str, tuple[str, ...]]:
    """What a rival must differ in: the mode, or the systems of its pools."""
    return serving, tuple(sorted({p["system"] for p in pools}))


def pool_text(p: dict) -> str:
    """One pool in a line: replicas, role, chips, system, layout and batch (``2 x decode [8 h200 TP8 DP1 EP1,
    batch 64]``; ``batch 64, serving 41`` where the replicas have capacity to spare); a prefill pool's batch is
    one prompt per DP rank, so it is not repeated, and context parallelism (a prompt split over the DP ranks) is
    named where there are ranks to split it over.
    """
    role = "" if p.get("role", "both") == "both" else f"{p['role']} "
    layout = f"{p['chips']} {p['system']} TP{p['tp']} DP{p['dp']} EP{p['ep']}" + (
        f" PP{p['pp']}" if p["pp"] > 1 else "") + (" CP" if p.get("context_parallel") and p["dp"] > 1 else "")
    served = f", serving {p['batch_served']}" if p.get("batch_served") not in (None, p["batch"]) else ""
    batch = "" if p.get("role") == "prefill" else f", batch {p['batch']}{served}"
    return f"{p['replicas']} x {role}[{layout}{batch}]"


def deployment_text(pools: list[dict]) -> str:
    """A deployment in a line: its pools joined, then its GPUs in total."""
    gpus = sum(p["replicas"] * p["chips"] for p in pools)
    return f"{' + '.join(pool_text(p) for p in pools)} = {gpus:,} GPU{'s' if gpus != 1 else ''}"


ALTERNATIVE_KEYS = ("usd_per_request", "usd_per_mtok_input", "usd_per_mtok_output", "ttft_s", "tpot_s",
                    "tokens_per_s_per_gpu", "chips", "requests_per_s")


def alternative(space: Space, mode: str, r: Result) -> dict:
    """Another deployment as an operator reads it: mode, pools (replicas, layout, batch), GPUs, USD per request
    as deployed (and at the fluid pool ratio), per input and output Mtok, TTFT, TPOT, tokens/s per GPU and per
    user, formats and what binds its batch.
    """
    pools = [{k: v for k, v in p.items() if k not in ("context", "etp")} for p in _pools_of(r)]
    dep = r.deployed
    out = {"serving": mode, "pools": pools, "layout": deployment_text(pools),
           **{k: dep[k] for k in ALTERNATIVE_KEYS}, "usd_per_request_fluid": r.metrics["usd_per_request"],
           "tokens_per_s_per_user": 1.0 / dep["tpot_s"], "weights_dtype": pools[-1]["weights_dtype"],
           "kv_dtype": pools[-1]["kv_dtype"], "kv_tier": pools[-1]["kv_tier"], "binding": r.binding}
    out["chips"] = int(out["chips"])
    return out


def _cost_band(cost: float, system: str, ideal: bool) -> list[float]:
    """A cost at one system's band; a prediction with no band (the ideal roofline) is its own band."""
    b = None if ideal else bands_of(system)
    return [cost, cost] if b is None else [cost * b.cost[0], cost * b.cost[1]]


def rivals(space: Space, tables: ModeTables, ideal: bool, exclude: tuple[str, tuple[str, ...]]) -> list[dict]:
    """The best deployment of every (system, mode) of the space, all of its pools on that system, judged as the
    tables judge (whole deployments where they ask for them), except the deployment key ``exclude`` (the
    winner's), best judged first: system, serving, layout, USD per request as compared (`_cost`) and its band, and
    the judged cost.
    """
    si = space.blocks["system_idx"]
    agg, dis = tables.aggregated, tables.disaggregated
    out = []
    for k, system in enumerate(space.systems):
        mine = si == k
        modes = []
        if agg is not None and ((agg.n > 0) & mine).any():
            modes.append("aggregated")
        pre = None if dis is None else dis.searched_pre
        if dis is not None and (dis.dok & mine[dis.dpos]).any() and (pre.ok & mine[pre.pos]).any():
            modes.append("disaggregated")
        for mode in modes:
            try:
                r = _search(space, tables, mode, mine, 1)[0]
            except InfeasibleError:  # no prefill option shares a numerics group with a feasible decode pair
                continue
            pools = _pools_of(r)
            if _deployment_key(mode, pools) == exclude:
                continue
            cost = float(_cost(r))
            out.append({"system": system.id, "serving": mode, "layout": deployment_text(pools),
                        "usd_per_request": cost, "usd_per_request_band": _cost_band(cost, system.id, ideal),
                        "judged_usd_per_request": r.result.objective})
    return sorted(out, key=lambda o: o["judged_usd_per_request"])


def decision(winner: dict, others: list[dict], cost: float | None = None) -> dict:
    """Whether the model separates ``winner`` (a `best` entry, whose USD per request as compared is ``cost``,
    default its ``usd_per_request``) from ``others`` (`rivals`: the best of every other system and mode, best
    judged first): ``decided`` when the winner's cost at the unfavourable end of its band lies below every other's
    at the favourable end of its own (the runner-up's included); else ``contenders``, the others it does not clear
    (CONTENDERS at most). ``runner_up`` is the best other; ``decision_band`` the winner's band of the cost compared.
    """
    band = winner.get("usd_per_request_band") or [winner["usd_per_request"]] * 2
    band = [(cost or winner["usd_per_request"]) * b / winner["usd_per_request"] for b in band]
    close = [o for o in others if o["usd_per_request_band"][0] <= band[1]]
    keep = ("system", "serving", "layout", "usd_per_request", "usd_per_request_band")
    return {"decided": not close, "decision_band": band,
            "runner_up": {k: others[0][k] for k in keep} if others else None,
            "contenders": [{k: o[k] for k in keep} for o in close[:CONTENDERS]]}


def optimum(e: dict, res: RequestResult | DisaggregatedResult) -> Optimum:
    """An entry of `entry` or `disaggregated_entry`: request-level figures."""
    return Optimum(e, request_level=True)


def chosen_blocks(space: Space, entries: list[dict]) -> Space:
    """The space with only the blocks of its chosen entries (what a report explains), so that a study over many
    spaces keeps no more of each than its answers.
    """
    b = space.blocks
    keep = np.zeros(len(b), dtype=bool)
    for e in entries:
        if (e.get("model"), e.get("workload")) == (space.model.id, space.workload.name):
            keep |= ((b["system"] == e["system"]) & (b["tp"] == e["tp"]) & (b["dp"] == e["dp"])
                     & (b["ep"] == e["ep"]) & (b["pp"] == e["pp"]))
    return subset(space, keep)


def best_table(best: list[Optimum]) -> Table:
    """The ``best`` table: each optimum's flat figures (its pools and other nested keys left to summary.json)."""
    return Table.from_records([{k: v for k, v in o.entry.items() if not isinstance(v, (dict, list))} for o in best])


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
    tables = {k: Table.from_records(v) for k, v in found.rows.items()}
    if found.best:
        tables["best"] = best_table(found.best)
    return Solved(status=status_of(found.results, infeasible), best=found.best, infeasible=infeasible,
                  tables=tables, results=found.results, spaces=spaces, space_stats=stats, facts=found.facts)
