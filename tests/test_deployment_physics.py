"""Every pool of the shipped deployment study's answers, recomputed from the request-level physics.

The deployment program chooses among operating points tabulated from the physics; this test takes the
pools it returned (system, layout, batch, replicas) and evaluates each again with `dse.physics.serving`
directly: its request rate, TTFT and TPOT must be the ones the answer reports, its memory must fit, the
targets must hold, and the replicas must serve the demand in both phases.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from helpers import served as through_stack

import dse
from dse.catalog.calibration import bands_of, error_band
from dse.catalog.hardware import default_systems
from dse.catalog.models import get_model
from dse.catalog.units import DTYPES
from dse.physics.codes import KV_TIERS
from dse.physics.roofline import Candidates, ModelTable, SystemTable
from dse.physics.serving import Request, aggregated, decode_pool, prefill_pool, prefill_ttft

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def answer(shipped):
    spec = dse.load_study(ROOT / "studies" / "disaggregated_vs_aggregated.yaml")
    return spec, shipped("disaggregated_vs_aggregated")


def _cand(p: dict) -> Candidates:
    etp = p["tp"] * p["dp"] // p["ep"]
    one = {"model": 0, "system": 0, "tp": p["tp"], "dp": p["dp"], "ep": p["ep"], "etp": etp, "pp": p["pp"],
           "batch": p["batch"], "context": 0, "weights_dtype": DTYPES.index(p["weights_dtype"]),
           "kv_dtype": DTYPES.index(p["kv_dtype"]), "kv_tier": KV_TIERS.index(p["kv_tier"])}
    return Candidates(**{k: np.array([v]) for k, v in one.items()})


def _load(pools: list[dict], need: float) -> dict[str, float]:
    """Per role, the share of a pool's requests/s it serves: the demand spread over what the pools offer (the
    aggregated replicas' rate plus the lesser of the prefill and decode pools' rates)."""
    cap = {r: sum(p["replicas"] * p["requests_per_s"] for p in pools if p["role"] == r)
           for r in ("both", "prefill", "decode")}
    pair = min(cap["prefill"], cap["decode"])
    share = min(1.0, need / (cap["both"] + pair))
    return {"both": share, **{r: share * pair / cap[r] if cap[r] else 0.0 for r in ("prefill", "decode")}}


def test_every_pool_recomputes_from_the_physics(answer):
    """Each pool as planned (its batch, its TTFT-capped utilisation) serves its rate within the targets; as
    served (its share of the demand) a decode or aggregated pool holds the fewest sequences per rank whose rate
    covers its share, and reports TPOT (and TTFT) there; a prefill pool its TTFT at its utilisation as served."""
    spec, result = answer
    workloads = {w.name: w for w in spec.workloads}
    systems = default_systems(spec.price)
    checked = fewer = 0
    for e in result.summary["best"]:
        w = workloads[e["workload"]]
        req = through_stack(Request(w.prompt, w.output), model=get_model(e["model"]))
        mt = ModelTable.build([get_model(e["model"])])
        served = {"both": 0.0, "decode": 0.0, "prefill": 0.0}
        need = w.demand_tokens_per_s / w.output  # requests/s
        load = _load(e["pools"], need)
        slow = []
        for p in e["pools"]:
            st = SystemTable.build([systems[p["system"]]])
            c = _cand(p)
            if p["role"] == "prefill":
                r = prefill_pool(c, mt, st, req, bool(p["context_parallel"]))
                s = float(r["prefill_service_s"][0])
                rate = float(r["servers"][0]) * p["utilisation"] / s
                hand = (r["kv_transfer_s"][0], r["stack_latency_s"][0])
                planned = float(prefill_ttft(s, *hand, p["utilisation"], req))
                ttft = float(prefill_ttft(s, *hand, p["utilisation"] * load["prefill"], req))
                assert ttft == pytest.approx(p["ttft_s"], rel=1e-9) and planned <= w.ttft_max_s * (1 + 1e-9)
                # a prefill replica slower than predicted runs busier, up to its planned utilisation
                busier = min(p["utilisation"], p["utilisation"] * load["prefill"] / error_band(p["system"])[0])
                slow.append(float(prefill_ttft(s, *hand, busier, req)))
            else:
                def at(batch: int, p=p, c=c, st=st, w=w, mt=mt, req=req) -> dict:
                    one = Candidates(**{**c.__dict__, "context": np.array([w.prompt + w.output]),
                                        "batch": np.array([batch])})
                    return (aggregated if p["role"] == "both" else decode_pool)(one, mt, st, req)

                r = at(p["batch"])
                rate = float(r["requests_per_s"][0])
                assert float(r["tpot_s"][0]) <= w.tpot_max_s * (1 + 1e-9)
                k = p.get("batch_served", p["batch"])
                assert k % p["dp"] == 0 and k <= p["batch"]
                q = at(k)
                assert float(q["requests_per_s"][0]) >= rate * load[p["role"]] * (1 - 1e-6)
                assert k == p["dp"] or float(at(k - p["dp"])["requests_per_s"][0]) < rate * load[p["role"]] * (1 - 1e-6)
                assert float(q["tpot_s"][0]) == pytest.approx(p["tpot_s"], rel=1e-9)
                assert p["tpot_s"] <= w.tpot_max_s * (1 + 1e-9)
                if p["role"] == "both":
                    assert float(r["ttft_s"][0]) <= w.ttft_max_s * (1 + 1e-9) and bool(r["stable"][0])
                    assert float(q["ttft_s"][0]) == pytest.approx(p["ttft_s"], rel=1e-9)
                fewer += k < p["batch"]
            assert bool(np.asarray(r["fits"]).ravel()[0]), (e["workload"], p)
            assert rate == pytest.approx(p["requests_per_s"], rel=1e-9)
            served[p["role"]] += p["replicas"] * rate
            checked += 1
        assert served["both"] + served["decode"] >= need * (1 - 1e-9)
        assert served["both"] + served["prefill"] >= need * (1 - 1e-9)
        assert e["tpot_s"] == pytest.approx(max(p["tpot_s"] for p in e["pools"] if p["role"] != "prefill"))
        if slow:  # the TTFT band's upper edge: the slowest prefill pool at its band's low end, times the multiplier
            assert e["ttft_s_band"][1] == pytest.approx(max(slow) * bands_of(e["system"]).ttft[1], rel=1e-9)
    assert checked >= 10 and fewer >= 5  # most pools have whole replicas to spare


def test_each_answer_costs_its_pools_split_into_input_and_output(answer):
    """A request's cost is every pool's replicas' USD/s over the requests the demand brings; its input part is the
    prefill pools' cost (an aggregated pool's at its share of time on prefill chunks), its output part the rest,
    each per million tokens of its kind, so that input x prompt + output x output tokens is the request's cost.
    (The answers were once the largest pool's replica evaluated alone: 1.61 USD/Mtok input for a 1,000-token
    prompt whose whole request cost 0.000311 USD.)"""
    spec, result = answer
    workloads = {w.name: w for w in spec.workloads}
    for e in result.summary["best"]:
        w = workloads[e["workload"]]
        lam = w.demand_tokens_per_s / w.output  # requests/s
        usd = sum(p["usd_per_s"] * p["replicas"] for p in e["pools"])
        assert e["usd_per_request"] == pytest.approx(usd / lam, rel=1e-9)
        assert e["usd_per_mtok"] == pytest.approx(usd / w.demand_tokens_per_s * 1e6, rel=1e-9)
        parts = (e["usd_per_mtok_input"] * w.prompt + e["usd_per_mtok_output"] * w.output) / 1e6
        assert parts == pytest.approx(e["usd_per_request"], rel=1e-9)
        assert e["usd_per_mtok_blended"] == pytest.approx(e["usd_per_request"] / (w.prompt + w.output) * 1e6, rel=1e-9)
        if {p["role"] for p in e["pools"]} == {"prefill", "decode"}:
            pre = sum(p["usd_per_s"] * p["replicas"] for p in e["pools"] if p["role"] == "prefill")
            assert e["usd_per_mtok_input"] * w.prompt / 1e6 == pytest.approx(pre / lam, rel=1e-9)
            assert e["prefill_share"] == pytest.approx(pre / usd, rel=1e-9)
        assert 0.0 <= e["prefill_share"] <= 1.0
        # the deployment's scale-up domains: no fewer than each pool's GPUs fill, no more than a domain per replica
        # (16-GPU replicas share a 72-GPU NVL72 rack four to a rack; each once counted a rack of its own)
        domain = {p["system"]: default_systems(spec.price)[p["system"]].scaleup_domain for p in e["pools"]}
        low = sum(-(-p["replicas"] * p["chips"] // int(domain[p["system"]])) for p in e["pools"])
        high = sum(p["replicas"] * -(-p["chips"] // int(domain[p["system"]])) for p in e["pools"])
        assert low <= e["racks"] <= high
        if e["chips"] == 48 and set(domain) == {"gb200-nvl72"}:
            assert e["racks"] == 2  # 2 x 16 decode GPUs in one rack, 16 prefill GPUs in another
        # the top-level configuration is a replica that decodes (a prefill replica read as a decode step at
        # batch 1 once named what bound the answer's decode)
        assert any(p["role"] != "prefill" and all(p[k] == e[k] for k in ("system", "tp", "dp", "ep", "pp", "batch"))
                   for p in e["pools"])
