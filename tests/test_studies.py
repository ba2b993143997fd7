"""Every shipped study runs and gives the result its file says it expects; `dse run` contract."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
import yaml
from helpers import dse

from dse.physics.evaluate import Config, evaluate_config

ROOT = Path(__file__).resolve().parent.parent
STUDIES = ROOT / "studies"
BEST_KEYS = {"model", "workload", "system", "chips", "racks", "tp", "ep", "pp", "dp", "batch", "context",
             "weights_dtype", "kv_dtype", "kv_tier", "tpot_s", "ttft_s", "usd_per_mtok", "tokens_per_s",
             "hbm_bytes_per_chip"}
REQUEST_KEYS = {"serving", "ttft_s", "tpot_s", "tokens_per_s_per_gpu", "tokens_per_s_per_user", "usd_per_request",
                "usd_per_mtok_input", "usd_per_mtok_output", "usd_per_mtok_blended", "chips", "power_w", "price_kind",
                "pools", "step_tpot_s", "step_ttft_s"}
POOL_KEYS = ("system", "chips", "racks", "tp", "ep", "pp", "dp", "batch", "weights_dtype", "kv_dtype", "kv_tier")


@pytest.fixture(scope="module")
def cheapest_run(shipped):
    r = shipped("cheapest_1m_context")
    return r, r.out


def test_cheapest_1m_context_is_optimal_and_writes_every_output(cheapest_run):
    r, out = cheapest_run
    assert r.returncode == 0, r.stderr
    summary = json.loads(r.stdout)
    assert summary["status"] == "optimal"
    assert {"name", "wall_s", "gap"} <= set(summary["solver"]) and summary["solver"]["gap"] <= 1e-6
    for name in ("summary.json", "best.csv", "systems.csv", "cost_by_system.png", "time_breakdown.png", "report.html"):
        assert (out / name).stat().st_size > 0, name
    html = (out / "report.html").read_text()
    assert "data:image/png;base64," in html and "Binding resource" in html and "src='http" not in html
    best = {e["model"]: e for e in summary["best"]}
    assert set(best) == {"llama-4-maverick", "llama-3-8b-1048k"}  # the catalog's models with a 1M trained window
    # each block's batch by the argmin over every batch, then whole replicas for the demand
    assert summary["solver"]["name"] == ("argmin (vectorized enumeration) per block, then enumeration of whole "
                                         "replica counts (pruned by the fluid bound)")
    assert summary["price_kind"] == "on_demand" and "on_demand" in html and "No price" in html
    assert "mi355x" in summary["no_price"]  # no sourced on-demand price: left out, never proxied
    modes = pd.read_csv(out / "serving.csv")
    systems = pd.read_csv(out / "systems.csv")
    assert list(systems.columns[:8]) == ["model", "workload", "system", "status", "serving", "deployment", "chips",
                                         "usd_per_request"]  # the first screen: the answers, the reasons last
    for e in best.values():
        assert BEST_KEYS <= set(e) and REQUEST_KEYS <= set(e)
        # the targets hold on the request-level figures, which include queueing, KV transfer and interference
        assert e["context"] == 1_001_000 and e["tpot_s"] <= 0.1 * (1 + 1e-9) and e["ttft_s"] <= 300 * (1 + 1e-9)
        assert e["bound"] == "memory" and e["kv_dtype"] == "fp8"  # KV reads dominate the decode step
        assert e["prefill_share"] > 0.6  # prefill is most of a 1M-token request's cost
        assert e["usd_per_request"] == pytest.approx(
            e["usd_per_mtok_input"] * 1.0 + e["usd_per_mtok_output"] * 1e-3, rel=1e-9)
        assert e["usd_per_mtok_blended"] == pytest.approx(e["usd_per_request"] / 1.001, rel=1e-9)
        assert e["binding"]
        if e["decide"] == "robust" and "target" in e["binding"]:  # a target met at the band's edge says so
            assert e["binding"].endswith("met at the high end of the prediction's error band")
        assert e["price_kind"] == "on_demand" and e["price_is_estimate"] is False and e["power_w"] > 0
        # both modes were searched; the chosen one is the cheaper
        mine = modes[modes["model"] == e["model"]].set_index("serving")
        assert set(mine.index) == {"aggregated", "disaggregated"}
        assert e["usd_per_request"] == pytest.approx(mine["usd_per_request"].min(), rel=1e-12)
        assert e["other_serving_usd_per_request"] >= e["usd_per_request"]
        agg = mine.loc["aggregated"]
        # prefill chunks slow the decode steps they share (Llama 4 Maverick 3.2x, Llama 3 8B 1048k 1.18x)
        assert agg["tpot_s"] > 1.15 * agg["step_tpot_s"]
        # the whole deployment for the demand: integer GPUs, every chip's cost over the requests the demand brings
        assert isinstance(e["chips"], int) and e["chips"] == sum(p["replicas"] * p["chips"] for p in e["pools"])
        assert e["tokens_per_s"] == pytest.approx(50_000, rel=1e-12) and e["demand_tokens_per_s"] == 50_000
        assert e["usd_per_request"] >= e["usd_per_request_fluid"] * (1 - 1e-9)  # never below the fluid figure
        if e["serving"] == "aggregated":
            (pool,) = e["pools"]
            assert pool["role"] == "both" and pool["replicas"] >= 1
            layout = [k for k in POOL_KEYS if k != "chips"]
            assert {k: pool[k] for k in layout} == {k: e[k] for k in layout}
        else:
            pre, dec = e["pools"]
            assert (pre["role"], dec["role"]) == ("prefill", "decode")
            layout = [k for k in POOL_KEYS if k not in ("chips", "racks")]  # chips: the deployment's
            assert {k: dec[k] for k in layout} == {k: e[k] for k in layout}  # top level: the decode pool's layout
            assert pre["weights_dtype"] == dec["weights_dtype"] and pre["kv_dtype"] == dec["kv_dtype"]
            # the prefill pool serves the demand at no more than its planned utilisation, so TTFT holds
            assert 0 < e["prefill_utilisation"] == pre["utilisation"] <= 0.9
            # no prefill in the decode pool: its TPOT is the decode step at the mean context P + O/2 (the step
            # figure is quoted at the last token's context P + O), at the batch it serves (the pool's replicas for
            # the demand have capacity to spare, so fewer sequences than its planned batch)
            assert e["batch_served"] == dec["batch_served"] < e["batch"]
            step = evaluate_config(Config(
                model=e["model"], system=e["system"], batch=int(e["batch_served"]), context=int(e["context"]),
                tp=int(e["tp"]), ep=int(e["ep"]), pp=int(e["pp"]), dp=int(e["dp"]), etp=int(e["etp"]),
                weights_dtype=e["weights_dtype"], kv_dtype=e["kv_dtype"], kv_tier=e["kv_tier"]))["step_s"]
            assert 0.99 * step <= e["tpot_s"] <= step < e["step_tpot_s"]
            assert e["ttft_s"] >= e["prefill_service_s"] + e["kv_transfer_s"]
    # shipping systems with an on-demand price only: no announced part, no proxy price
    assert set(systems["system"]) == {"a100", "h100", "h200", "b200", "b300", "gb200-nvl72", "tpu-v4", "tpu-v5e",
                                      "tpu-v5p", "tpu-v6e", "mi300x", "mi325x"}


def test_dse_evaluate_reproduces_the_reported_best(cheapest_run):
    """`dse evaluate --prompt --output` of each aggregated optimum gives its step figures at its batch and its
    request-level figures at the batch it serves (fewer sequences where the deployment for the demand has
    capacity to spare); of a disaggregated optimum's decode pool, its decode step."""
    _, out = cheapest_run
    summary = json.loads((out / "summary.json").read_text())
    modes = pd.read_csv(out / "serving.csv")
    rows = [dict(r, prompt=1_000_000, output=1000, context=1_001_000) for _, r in modes[modes["serving"] == "aggregated"].iterrows()]
    assert rows
    def at(e: dict, batch: int) -> dict:
        return evaluate_config(Config(
            model=e["model"], system=e["system"], batch=batch, context=int(e["context"]), tp=int(e["tp"]),
            ep=int(e["ep"]), pp=int(e["pp"]), dp=int(e["dp"]), etp=int(e["etp"]), weights_dtype=e["weights_dtype"],
            kv_dtype=e["kv_dtype"], kv_tier=e["kv_tier"], prompt=int(e["prompt"]), output=int(e["output"])))

    served = 0
    for e in [*rows, *summary["best"]]:
        ev = at(e, int(e["batch"]))
        assert ev["step_s"] == pytest.approx(e["step_tpot_s"], rel=1e-9)
        assert ev["fits"]
        assert 1 <= int(e["batch_served"]) <= int(e["batch"])
        if e["serving"] != "aggregated":
            continue
        # one replica's figures (the whole deployment for the demand has as many as it needs, costed as deployed)
        assert ev["usd_per_request"] == pytest.approx(e["usd_per_request_fluid"], rel=1e-9)
        assert ev["prefill_keeps_up"]
        served += int(e["batch_served"]) < int(e["batch"])
        ev = at(e, int(e["batch_served"]))
        for key in ("ttft_s", "tpot_s", "tokens_per_s_per_user"):
            assert ev[key] == pytest.approx(e[key], rel=1e-9), key
    assert served  # the replicas for the 1M-token demand have capacity to spare


def test_pareto_front_is_monotone_and_non_dominated(shipped):
    run = shipped("pareto_latency_cost")
    summary = run.summary
    for name in ("pareto.csv", "pareto.png", "pareto_throughput.csv", "pareto_throughput.png"):
        assert name in run.files
    front = run.table("pareto")
    assert len(front) >= 100  # the whole non-dominated set, not a sample of TPOT targets
    assert (front["tpot_s"].diff().dropna() > 0).all()
    assert (front["usd_per_request_fluid"].diff().dropna() < 0).all()  # the front: at the fluid pool ratio
    assert (front["usd_per_request"] >= front["usd_per_request_fluid"] * (1 - 1e-12)).all()  # as deployed
    whole = front["prefill_replicas"] * front["prefill_chips"] + front["decode_replicas"] * front["replica_chips"]
    assert (front["chips"] == whole).all() and front["chips"].dtype.kind == "i"
    assert "disaggregated" in set(front["serving"]) <= {"aggregated", "disaggregated"}
    assert (front["ttft_s"] <= 2.0 * (1 + 1e-9)).all()
    assert front["label"].str.contains("TP").all()
    best = summary["best"][0]
    assert front["usd_per_request_fluid"].min() == pytest.approx(best["usd_per_request_fluid"], rel=1e-12)
    assert (front["tokens_per_s_per_gpu"] <= front["tokens_per_s_per_gpu_fluid"] * (1 + 1e-12)).all()  # as deployed
    agg = front["serving"] == "aggregated"  # one replica: as deployed is the fluid figure
    assert (front.loc[agg, "tokens_per_s_per_gpu"] == front.loc[agg, "tokens_per_s_per_gpu_fluid"]).all()
    thr = run.table("pareto_throughput")
    assert (thr["tokens_per_s_per_gpu_fluid"].diff().dropna() > 0).all()  # the front: at the fluid pool ratio
    assert (thr["tokens_per_s_per_gpu"] <= thr["tokens_per_s_per_gpu_fluid"] * (1 + 1e-12)).all()
    stats = {f["front"]: f for f in summary["fronts"]}
    assert stats["cost"]["points"] == len(front) and stats["cost"]["candidates"] > 100_000
    assert summary["status"] == "optimal"


def test_fast_slow_mode(shipped):
    run = shipped("fast_slow_mode")
    table = run.table("fast_slow")
    for _, g in table.groupby("model"):
        g = g.sort_values("speed_multiplier")
        assert (g["cost_multiplier"].diff().dropna() >= -1e-9).all()
        same = g["cost_multiplier_same_layout"].fillna(float("inf"))  # NaN: the layout cannot reach that speed
        assert (same >= g["cost_multiplier"] - 1e-9).all()
        assert (g.loc[g["speed_multiplier"] < 1, "cost_multiplier"] <= 1 + 1e-9).all()
        at = g.loc[g["speed_multiplier"] == 2.5, "cost_multiplier"].iloc[0]
        assert 1.0 < at < 3.0  # on-demand prices: ~1.2x (Llama 3.1 70B) and ~1.03x (DeepSeek-V3), far below 6x
    best = {e["model"]: e for e in run.summary["best"]}
    base = table[table["speed_multiplier"] == 1.0].set_index("model")
    for model, e in best.items():  # the base point is the request-level optimum under the 50 ms target
        assert base.loc[model, "usd_per_request"] == pytest.approx(e["usd_per_request"], rel=1e-9)
        for key in ("chips", "ttft_s", "tokens_per_s_per_gpu"):  # every figure of the row its whole deployment's
            assert base.loc[model, key] == pytest.approx(e[key], rel=1e-9), key
        assert base.loc[model, "tokens_per_s_per_gpu_fluid"] >= e["tokens_per_s_per_gpu"]
        assert e["tpot_s"] <= 0.05 * (1 + 1e-9)


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda d: d.update(workload=d.pop("workloads")), "unknown field 'workload'; did you mean workloads"),
        (lambda d: d["workloads"][0].update(prompt="long"), "field 'workloads.0.prompt'"),
        (lambda d: d["workloads"][0].update(tpot_max_s=-1), "field 'workloads.0.tpot_max_s': Input should be greater than 0"),
        (lambda d: d.update(models=["deepseek-v4"]), "unknown model 'deepseek-v4'; did you mean: deepseek-v3"),
        (lambda d: d["space"].update(systems=["gb200"]), "unknown system 'gb200'; did you mean: gb200-nvl72"),
        (lambda d: d["space"].update(tp=[]), "field 'space.tp': Value error, must list at least one value"),
        (lambda d: d.update(models=[]), "models: must list at least one model"),
        (lambda d: d["space"].update(max_racks=0), "field 'space.max_racks'"),
        (lambda d: d.update(kind="cheapst"), "field 'kind'"),
        (lambda d: d["space"].update(min_chips_per_stage=64, max_chips_per_stage=8),
         "field 'space': Value error, min_chips_per_stage (64) must be <= max_chips_per_stage (8)"),
    ],
)
def test_bad_study_exits_2_and_writes_nothing(tmp_path, mutate, message):
    doc = yaml.safe_load((STUDIES / "cheapest_1m_context.yaml").read_text())
    mutate(doc)
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    out = tmp_path / "out"
    r = dse("run", str(path), "--out", str(out))
    assert r.returncode == 2, r.stderr
    text = " ".join(r.stderr.split())
    assert str(path) in text and message.split("Value error, ")[-1] in text
    assert "Traceback" not in r.stderr
    assert not out.exists()


def test_infeasible_study_exits_3_naming_the_resource(tmp_path):
    doc = yaml.safe_load((STUDIES / "cheapest_1m_context.yaml").read_text())
    doc.update(models=["llama-3.1-405b"])
    doc["workloads"][0].update(prompt=100_000)
    doc["space"].update(systems=["tpu-v5e"], max_chips_per_stage=8, max_racks=1, kv_tiers=["hbm"])
    path = tmp_path / "infeasible.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    r = dse("run", str(path), "--out", str(tmp_path / "out"))
    assert r.returncode == 3
    text = " ".join(r.stderr.split())
    assert "HBM capacity runs out" in text and "GB more than its usable" in text


def test_missing_study_file_exits_2(tmp_path):
    r = dse("run", str(tmp_path / "nope.yaml"), cwd=tmp_path)
    assert r.returncode == 2 and "no such study file" in r.stderr
