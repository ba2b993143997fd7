"""The study-kind contract: every registered kind exposes ``Spec``, ``solve`` and ``PLOTS`` with the right types, and
its ``solve`` of a tiny study returns a `Solved` from which the summary is made."""

from __future__ import annotations

import inspect
import json

import pytest

from dse.optimize.solver import SolveResult
from dse.studies.base import StudySpec, load_study
from dse.studies.contract import Chart, Optimum, Plot, Solved, StudyOutput, solve_study, summary_of
from dse.studies.optuna_sweep import default_storage
from dse.studies.registry import KINDS, study_module
from dse.table import Table

SPACE = {"systems": ["h100"], "weights_dtypes": ["fp8"], "kv_dtypes": ["fp8"], "kv_tiers": ["hbm"], "tp": [8],
         "pp": [1], "max_racks": 1, "max_chips_per_stage": 8, "max_batch_per_rank": 64}
CHAT = {"name": "chat", "prompt": 2000, "output": 500, "tpot_max_s": 0.05, "demand_tokens_per_s": 20000}
TINY: dict[str, dict] = {  # the kind's own fields of a study small enough to solve in a moment
    "cheapest": {},
    "pareto": {"pareto": {"labels": 2}},
    "fast_slow": {"fast_slow": {"speedups": [1.0, 2.0]}},
    "sweep": {"sweep": {"factors": [1.0, 2.0], "per_system": False}},
    "tornado": {"tornado": {"parameters": ["hbm_bandwidth"]}},
    "compute_equalization": {"models": [], "workloads": [{**CHAT, "demand_tokens_per_s": 2e5}],
                             "equalization": {"family": {"widths": [2048, 3072], "sparsities": [1, 8]},
                                              "quality": {"target_loss": 2.05}, "train_systems": ["h100"],
                                              "inventory_nodes": {"h100": 64}, "launch_by_week": 8,
                                              "deployment_weeks": 2, "refine_trials": 2,
                                              "rl": {"output": 1000, "tpot_max_s": 0.1},
                                              "sensitivity": {"assumptions": False}}},
    "expert_placement": {"models": ["deepseek-v3"], "placement": {
        "system": "h100", "gpus": 2, "domain_gpus": 1, "experts": 8, "skews": [1.0], "redundant": 1,
        "tokens_per_step": 512, "extra_slots": 1, "node_limit": 20}},
    "kv_tiers": {"kv_tiers": {"classes": [{"name": "hot", "prefix_tokens": 4000, "prefixes_kept": 10,
                                           "lifetime_s": 3600, "hits_per_s": 10, "ttft_s": 1}]}},
    "api_pricing": {"pricing": {"system": "h100", "actives_b": [100], "contexts": [8000], "tier_boundaries": [8000],
                                "sheets": [{"name": "sheet", "step_context": 200000, "input": [1.0, 2.0],
                                            "output": [8.0, 12.0]}]}},
    "moe_codesign": {"models": [], "codesign": {"effective_params_b": 70, "sparsities": [1, 4], "systems": ["h100"]}},
    "deployment": {"deployment": {"groups": [{"name": "h100", "systems": ["h100"]}]}},
    "fleet": {"fleet": {"systems": ["h100"], "inventory_nodes": {"h100": 1000}, "demand_curve": [0.5, 1.0]}},
    "training": {"models": ["llama-3.1-8b"], "training": {
        "tokens": 1e11, "seq": 4096, "global_batch": 256, "deadline_days": 30, "inventory": {"h100": 64},
        "tp": [1, 2], "pp": [1, 2], "recompute": ["selective"], "zero": [1], "precision": ["bf16", "fp8"]}},
}


def tiny(kind: str) -> StudySpec:
    doc = {"study": f"tiny-{kind}", "kind": kind, "description": "the contract on a tiny study",
           "expect": "a Solved", "models": ["llama-3.1-70b"], "workloads": [CHAT], "space": SPACE, **TINY[kind]}
    return load_study(doc)


def test_every_kind_has_a_tiny_study():
    assert set(TINY) == set(KINDS)


@pytest.mark.parametrize("kind", list(KINDS))
def test_the_kind_exposes_its_parts_with_their_types(kind):
    module = study_module(kind)
    assert issubclass(module.Spec, StudySpec)
    assert list(inspect.signature(module.solve).parameters) == ["spec", "progress", "storage"]
    assert all(p.default is None for name, p in inspect.signature(module.solve).parameters.items() if name != "spec")
    assert isinstance(module.PLOTS, tuple) and all(isinstance(p, Plot) for p in module.PLOTS)
    charts = getattr(module, "CHARTS", ())
    assert isinstance(charts, tuple) and all(isinstance(c, Chart) for c in charts)
    assert isinstance(module.USES_STORAGE, bool) and isinstance(module.WORKERS, bool)
    assert isinstance(module.OBJECTIVE, str) or callable(module.OBJECTIVE)  # the metric summary.json names
    assert not hasattr(module, "run")  # one way in: solve, summarised by solve_study


@pytest.mark.parametrize("kind", list(KINDS))
def test_solve_returns_a_solved_the_summary_is_made_from(kind, tmp_path):
    spec = tiny(kind)
    storage = default_storage(tmp_path) if study_module(kind).USES_STORAGE else None
    solved = study_module(kind).solve(spec, None, storage)
    assert isinstance(solved, Solved)
    assert solved.status in ("optimal", "feasible", "infeasible")
    assert solved.tables and all(isinstance(t, Table) for t in solved.tables.values())
    assert all(isinstance(r, SolveResult) for r in solved.results)
    assert solved.results or solved.stats is not None  # the solver block comes from one or the other
    for o in solved.best:
        assert isinstance(o, Optimum) and isinstance(o.entry, dict)
        if o.request_level:  # what the report reads of a request-level optimum
            assert {"serving", "pools", "step_tpot_s", "usd_per_request"} <= set(o.entry)
            assert all(p["role"] in ("prefill", "decode", "both") for p in o.entry["pools"])
    summary = summary_of(spec, solved, 1.0)
    assert summary["best"] == [o.entry for o in solved.best]
    assert summary["infeasible"] == solved.infeasible and summary["status"] == solved.status
    assert {"study", "kind", "price_kind", "no_price", "spaces", "solver"} <= set(summary)
    assert isinstance(summary["objective"], str) and summary["objective"]  # the metric minimized (DESIGN.md)
    assert {"name", "wall_s", "solve_wall_s", "solves", "gap"} <= set(summary["solver"])
    assert not any(k.startswith("_") for k in summary)
    json.dumps(summary, default=float)  # nothing but data


def test_solve_study_times_the_solve_and_keeps_what_was_solved():
    out = solve_study(tiny("cheapest"))
    assert isinstance(out, StudyOutput)
    assert out.tables is out.solved.tables and out.spaces is out.solved.spaces
    assert out.summary["solver"]["wall_s"] > 0
    assert list(out.tables) == ["serving", "systems", "best"]


def test_solved_refuses_a_table_that_is_not_a_dataframe():
    with pytest.raises(TypeError, match="rows"):
        Solved(status="optimal", tables={"rows": [{"a": 1}]})


def test_a_configuration_chosen_again_is_evaluated_once(monkeypatch):
    """`config_entry` with a memo (a study's tables keep one): the same configuration asked for again gets an entry
    equal to the first, a copy of its own (changing one leaves the other as it was), from one evaluation."""
    import dse.studies.common as common
    from dse.catalog.hardware import default_systems
    from dse.physics.serving import Request

    real, calls = common.evaluate_levels, []
    monkeypatch.setattr(common, "evaluate_levels", lambda *a, **k: calls.append(a) or real(*a, **k))
    cfg = {"system": "h200", "chips": 8, "racks": 1, "tp": 8, "ep": 1, "pp": 1, "dp": 1, "etp": 8, "batch": 64,
           "context": 4500, "weights_dtype": "fp8", "kv_dtype": "fp8", "kv_tier": "hbm"}
    system, req, memo = default_systems()["h200"], Request(4000, 500, name="chat"), {}

    def ask() -> dict:
        return common.config_entry("llama-3.1-70b", "chat", 4000, cfg, False, output=500, request_level=True,
                                   system=system, req=req, memo=memo)

    first = ask()
    second = ask()
    assert len(calls) == 1 and second == first
    second["pools"][0]["replicas"] = 7
    assert ask() == first and first["pools"][0]["replicas"] == 1
    assert common.config_entry("llama-3.1-70b", "chat", 4000, cfg, False, output=500, request_level=True,
                               system=system, req=req) == first  # without a memo: the same entry, evaluated
    assert len(calls) == 2
