"""Validated error bands on every prediction, and decisions that respect them.

- The stored bands (calibration/fitted.yaml's ``bands``) are what `dse validate --bands` computes from the stored
  fit, and an unseen family's band is never narrower than a calibrated family's.
- `dse evaluate` and every `best` entry carry ``*_band`` keys; each `best` entry says whether it is ``decided``.
- ``decide: robust`` judges a configuration at the unfavourable end of its band: a system of no calibrated family
  wins only where it wins there; the robust argmin equals a brute force on random spaces.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from helpers import brute_force_choices, brute_force_pools, candidates_of, dse, random_space, served

from dse import run as run_study
from dse.catalog.calibration import BAND_METRICS, bands_of, calibrated, families, family_of, load_fitted
from dse.catalog.hardware import IDEAL, hw_dir
from dse.catalog.units import DTYPES
from dse.errors import InfeasibleError
from dse.optimize.margins import Margins
from dse.optimize.requests import block_optima, disaggregated_tables, pick, pick_disaggregated
from dse.optimize.space import build_space
from dse.optimize.whole import whole_aggregated
from dse.physics.roofline import ModelTable, SystemTable
from dse.physics.serving import Request, aggregated, rho_for_ttft
from dse.validate.bands import MIN_POINTS, Ratios, compose


# ---- the stored bands ------------------------------------------------------------------------------------------------
def test_the_stored_bands_are_the_recomputed_ones(tmp_path):
    """`dse validate --bands` on a copy of the catalog recomputes the stored section from the stored fit and
    writes only that section of calibration/fitted.yaml."""
    import shutil

    import yaml

    copy = tmp_path / "hw_catalog"
    shutil.copytree(hw_dir(), copy)
    r = dse("validate", "--bands", "--json", "--out", str(tmp_path / "v"), env={"DSE_HW_CATALOG": str(copy)},
            timeout=900)
    assert r.returncode == 0, r.stderr
    before = (hw_dir() / "calibration" / "fitted.yaml").read_text()
    after = (copy / "calibration" / "fitted.yaml").read_text()
    assert after.split("\nbands:\n")[0] == before.split("\nbands:\n")[0]  # every key before it, as it was
    stored, again = yaml.safe_load(before), yaml.safe_load(after)
    assert {k: v for k, v in stored.items() if k != "bands"} == {k: v for k, v in again.items() if k != "bands"}
    assert list(stored) == list(again)
    for metric in BAND_METRICS:
        assert set(again["bands"][metric]) == set(stored["bands"][metric]) == {*families(), "default"}
        for fam, entry in stored["bands"][metric].items():
            for key, value in entry.items():
                if isinstance(value, list):
                    assert again["bands"][metric][fam][key] == pytest.approx(value, abs=2e-4), (metric, fam, key)
                else:
                    assert again["bands"][metric][fam][key] == value, (metric, fam, key)


def test_an_unseen_family_is_never_narrower_than_a_calibrated_one():
    stored = load_fitted()["bands"]
    for metric in BAND_METRICS:
        lo, hi = stored[metric]["default"]["band"]
        for fam, entry in stored[metric].items():
            assert lo <= entry["band"][0] <= 1 <= entry["band"][1] <= hi or fam == "default", (metric, fam)
            if "leave_family_out" in entry:  # the envelope holds every family left out
                assert lo <= entry["leave_family_out"][0] and entry["leave_family_out"][1] <= hi
    assert family_of("tpu-v5e") is None and family_of("a100") is None
    unseen = bands_of("a100")
    assert unseen == bands_of("trn2") and unseen.throughput == tuple(stored["throughput"]["default"]["band"])
    for s in ("h100", "b200", "mi300x", "tpu-v6e", "mi355x"):
        b = bands_of(s)
        for metric in BAND_METRICS:
            assert getattr(unseen, metric)[0] <= getattr(b, metric)[0] and getattr(b, metric)[1] <= getattr(
                unseen, metric)[1], (s, metric)


def test_the_band_rules():
    """A family with MIN_POINTS independent units takes its own band; with fewer, the envelope of its own and its
    left-out band, however many points its few units hold (twins: 40 points of 3 configurations); with none, the
    unseen band, the envelope of every band and left-out band."""
    fams = list(families())
    rng = np.random.default_rng(7)
    many, few, twins, none = fams[:4]
    own = {many: rng.uniform(0.9, 1.1, 50), few: np.array([1.0, 1.02, 1.05]), twins: rng.uniform(0.97, 1.03, 40)}
    left_out = {many: rng.uniform(0.5, 1.6, 50), few: rng.uniform(0.7, 0.9, 3), twins: rng.uniform(0.6, 0.8, 40)}
    out = compose(Ratios(own, left_out, "leave-one-out", {many: 50, few: 3, twins: 3}, "configurations"))
    assert out[many]["basis"] == "leave-one-out" and out[many]["band"] == out[many]["leave_one_out"]
    assert out[twins]["points"] == 40 >= MIN_POINTS > out[twins]["configurations"] == 3
    for f in (few, twins):
        assert out[f]["band"] == [min(out[f]["leave_one_out"][0], out[f]["leave_family_out"][0], 1.0),
                                  max(out[f]["leave_one_out"][1], out[f]["leave_family_out"][1], 1.0)]
        assert "fewer than 10 configurations" in out[f]["basis"]
    assert out[none]["points"] == 0 and out[none]["band"] == out["default"]["band"]
    every = [out[f]["band"] for f in (many, few, twins)] + [out[f]["leave_family_out"] for f in (many, few, twins)]
    assert out["default"]["band"] == [min(b[0] for b in every), max(b[1] for b in every)]


def test_published_points_count_once_per_configuration():
    """The stored throughput bands count a family's units as the configurations of its scored points (model,
    system, layout, formats, lengths and kind), counted here from the cases and the stored table, and a family is
    calibrated on throughput only with MIN_POINTS of them, however many points they hold."""
    from dse.validate import load_cases

    stored = load_fitted()
    scored = {r["case"] for r in stored["table"]
              if r["category"] == "serving_throughput" and r.get("loo_error") is not None}
    seen: dict[str, set] = {}
    for p in load_cases().points:
        if p.category == "serving_throughput" and p.case in scored:
            seen.setdefault(family_of(p.system), set()).add(
                (p.model, p.system, p.tp, p.dp, p.ep, p.pp, p.weights_dtype, p.kv_dtype, p.isl, p.osl, p.kind))
    for fam in families():
        entry = stored["bands"]["throughput"][fam]
        assert entry["configurations"] == len(seen.get(fam, ())) <= entry["points"], fam
        if entry["configurations"] < MIN_POINTS:
            assert "fewer than 10 configurations" in entry["basis"] and not any(
                calibrated(s) for s in families()[fam]), fam


# ---- bands on every prediction ---------------------------------------------------------------------------------------
def test_evaluate_json_carries_the_request_level_bands():
    args = ("evaluate", "--model", "llama-3.1-8b", "--tp", "1", "--batch", "16", "--context", "2500",
            "--prompt", "2000", "--output", "500", "--json")
    for system in ("h100", "a100"):
        r = dse(*args, "--system", system)
        assert r.returncode == 0, r.stderr
        doc = json.loads(r.stdout)
        b = bands_of(system)
        for key, (lo, hi) in (("ttft_s", b.ttft), ("tpot_s", b.tpot), ("tokens_per_s_per_gpu", b.throughput),
                              ("usd_per_request", b.cost), ("usd_per_mtok", b.cost), ("tokens_per_s", b.throughput)):
            band = doc[f"{key}_band"]
            assert band == pytest.approx([doc[key] * lo, doc[key] * hi], rel=1e-12), key
            assert band[0] <= doc[key] <= band[1]
    ideal = json.loads(dse(*args, "--system", "h100", "--ideal").stdout)
    assert ideal["usd_per_request_band"] is None and ideal["ttft_s_band"] is None


def _study(systems: list[str], prices: dict | None = None, decide: str | None = None, serving=("aggregated",),
           **workload) -> dict:
    doc = {"study": "bands", "kind": "cheapest", "description": "d", "expect": "e", "models": ["llama-3.1-8b"],
           "workloads": [{"name": "chat", "prompt": 2000, "output": 500, **workload}],
           "space": {"systems": systems, "weights_dtypes": ["bf16"], "kv_dtypes": ["bf16"], "kv_tiers": ["hbm"],
                     "tp": [1, 2], "pp": [1], "max_racks": 1, "max_chips_per_stage": 8, "max_batch_per_rank": 64,
                     "serving": list(serving)}}
    if prices:
        doc["prices"] = prices
    if decide:
        doc["decide"] = decide
    return doc


def _systems(doc: dict) -> dict[str, float]:
    """USD per request of the best deployment of each system (the ``systems`` table), as predicted."""
    t = run_study({**doc, "decide": "expected"}).tables["systems"]
    return dict(zip(t["system"], t["usd_per_request"], strict=True))


def test_best_entries_carry_bands_and_a_decision():
    res = run_study(_study(["h100", "h200"], serving=("aggregated", "disaggregated")))
    (e,) = res.summary["best"]
    assert e["decide"] == "expected"  # both systems are of a calibrated family
    for key in ("usd_per_request", "ttft_s", "tpot_s", "tokens_per_s_per_gpu", "usd_per_mtok"):
        lo, hi = e[f"{key}_band"]
        assert lo <= e[key] <= hi, key
    assert isinstance(e["decided"], bool) and isinstance(e["contenders"], list)
    assert e["runner_up"]["system"] in ("h100", "h200") and "TP" in e["runner_up"]["layout"]
    assert e["decided"] == (not e["contenders"])


def test_a_close_race_is_not_decided(tmp_path):
    """Two Hopper systems priced 5% apart sit inside each other's bands: not decided, the other a contender (the
    terminal and the report say which to measure); 2.5x apart: decided against the runner-up."""
    import yaml

    doc = _study(["h100", "h200"])
    cost = _systems(doc)
    ratio = cost["h200"] / cost["h100"]
    for gap, decided in ((1.05, False), (2.5, True)):
        # h200 priced so that its best costs ``gap`` times h100's (USD per request scales with the price)
        price = 3.5 / ratio * gap
        (e,) = run_study({**doc, "prices": {"h200": price}}).summary["best"]
        assert e["system"] == "h100" and e["decided"] is decided
        assert e["runner_up"]["system"] == "h200"
        assert e["runner_up"]["usd_per_request"] == pytest.approx(cost["h100"] * gap, rel=1e-9)
        if decided:
            assert e["contenders"] == [] and e["usd_per_request_band"][1] < e["runner_up"]["usd_per_request_band"][0]
        else:
            (c,) = e["contenders"]
            assert c["system"] == "h200" and c["usd_per_request_band"][0] <= e["usd_per_request_band"][1]
            assert "TP" in c["layout"] and c["serving"] == "aggregated"
            path = tmp_path / "race.yaml"
            path.write_text(yaml.safe_dump({**doc, "prices": {"h200": price}}))
            r = dse("run", str(path), "--out", str(tmp_path / "out"), env={"COLUMNS": "400"})
            assert r.returncode == 0, r.stderr
            line = next(ln for ln in r.stdout.splitlines() if "not decided" in ln)
            assert "measure these: aggregated 1 x [1 h200 TP1" in line
            assert "measure these" in (tmp_path / "out" / "report.html").read_text()


def test_an_uncalibrated_family_wins_only_at_the_edge_of_its_band():
    """a100 (no calibration data) priced 1.25x cheaper than h100 in expectation: it wins with decide: expected,
    not with decide: robust (the default here: a candidate system is uncalibrated), where its cost at the high end
    of its band exceeds h100's; priced 3x cheaper it wins robustly too."""
    doc = _study(["a100", "h100"])
    cost = _systems(doc)
    ratio = cost["a100"] / cost["h100"]
    a100, h100 = bands_of("a100").cost[1], bands_of("h100").cost[1]
    for cheaper, robust_winner in ((1.25, "h100"), (3.0, "a100")):
        price = 2.95 / ratio / cheaper
        assert (1 / cheaper) * a100 > h100 if robust_winner == "h100" else (1 / cheaper) * a100 < h100
        priced = {**doc, "prices": {"a100": price}}
        (exp,) = run_study({**priced, "decide": "expected"}).summary["best"]
        assert exp["system"] == "a100" and exp["decide"] == "expected"
        for d in (None, "robust"):
            (rob,) = run_study({**priced, **({"decide": d} if d else {})}).summary["best"]
            assert rob["decide"] == "robust" and rob["system"] == robust_winner
            assert rob["calibration"] == ("uncalibrated family" if robust_winner == "a100" else "hopper")


def test_a_family_short_of_data_is_uncalibrated_and_judged_at_its_band_edge():
    """A system is calibrated only where its family has MIN_POINTS units of its own on every metric of the stored
    bands (the stored counts, read independently here); a space holding one that is not (MI355X: CDNA4 has no
    measured run) is judged robustly by default, and there MI355X wins only where it wins at its band's edge."""
    bands = load_fitted()["bands"]
    for fam, systems in families().items():
        own = all(bands[m].get(fam, {}).get("sweeps", bands[m].get(fam, {}).get("configurations", 0)) >= MIN_POINTS
                  for m in BAND_METRICS)
        assert all(calibrated(s) == own for s in systems), fam
    assert calibrated("h100") and not calibrated("mi355x") and not calibrated("a100")
    doc = _study(["h200", "mi355x"], prices={"mi355x": 3.0})  # MI355X has no sourced on-demand price
    cost = _systems(doc)
    high = {k: bands_of(k).cost[1] for k in cost}  # the unfavourable edge of each cost band, as a multiplier
    assert high["mi355x"] > high["h200"]  # CDNA4's band (no run of its own) is wider than Hopper's
    ratio = (1 + high["mi355x"] / high["h200"]) / 2  # cheaper by this as predicted, dearer at the band edges
    doc["prices"] = {"mi355x": 3.0 * cost["h200"] / cost["mi355x"] / ratio}
    cost = _systems(doc)
    edge = {k: v * bands_of(k).cost[1] for k, v in cost.items()}
    assert cost["mi355x"] < cost["h200"] and edge["h200"] < edge["mi355x"]
    (exp,) = run_study({**doc, "decide": "expected"}).summary["best"]
    assert exp["decide"] == "expected" and exp["system"] == "mi355x"
    (rob,) = run_study(doc).summary["best"]
    assert rob["decide"] == "robust" and rob["system"] == "h200"


def test_robust_targets_hold_at_the_band_edge():
    """With TTFT and TPOT targets, the robust optimum meets them at the high end of its bands; the expected one
    meets them as predicted."""
    doc = _study(["a100", "h100"], serving=("aggregated", "disaggregated"), tpot_max_s=0.03, ttft_max_s=1.0)
    for decide in ("expected", "robust"):
        (e,) = run_study({**doc, "decide": decide}).summary["best"]
        edge = 1 if decide == "robust" else None
        for key, target in (("tpot_s", 0.03), ("ttft_s", 1.0)):
            value = e[f"{key}_band"][edge] if edge else e[key]
            assert value <= target * (1 + 1e-6), (decide, key, e[key], e[f"{key}_band"])


def test_the_deployment_kind_buys_for_the_band_edge():
    """``kind: deployment``: a group with an uncalibrated system is judged robustly (its replicas serve the demand
    at the low end of each pool's throughput band, its targets hold at the edge of its TTFT and TPOT bands), a
    group of calibrated systems as predicted; each entry says whether it is decided against the other modes."""
    doc = {"study": "dep", "kind": "deployment", "description": "d", "expect": "e", "models": ["llama-3.1-8b"],
           "workloads": [{"name": "chat", "prompt": 2000, "output": 500, "tpot_max_s": 0.05, "ttft_max_s": 1.0,
                          "demand_tokens_per_s": 200_000}],
           "space": {"weights_dtypes": ["bf16"], "kv_dtypes": ["bf16"], "kv_tiers": ["hbm"], "tp": [1, 2], "pp": [1],
                     "max_racks": 1, "max_chips_per_stage": 8, "max_batch_per_rank": 128},
           "deployment": {"groups": [{"name": "hopper", "systems": ["h100"]},
                                     {"name": "with-a100", "systems": ["a100", "h100"]}]}}
    best = {e["group"]: e for e in run_study(doc).summary["best"]}
    assert best["hopper"]["decide"] == "expected" and best["with-a100"]["decide"] == "robust"
    lam = 200_000 / 500
    for e in best.values():
        assert isinstance(e["decided"], bool) and e["decided"] == (not e["contenders"])
        assert e["usd_per_request"] == pytest.approx(e["usd_per_s"] / lam, rel=1e-12)
        lo, hi = e["usd_per_request_band"]
        assert lo < e["usd_per_request"] <= hi * (1 + 1e-12)
    robust = best["with-a100"]
    assert robust["usd_per_request_band"][1] == pytest.approx(robust["usd_per_request"], rel=1e-12)  # bought for it
    assert robust["tpot_s_band"][1] <= 0.05 * (1 + 1e-6) and robust["ttft_s_band"][1] <= 1.0 * (1 + 1e-6)
    served = sum(p["requests_per_s"] * p["replicas"] * bands_of(p["system"]).throughput[0]
                 for p in robust["pools"] if p["role"] != "prefill")
    assert served >= lam * (1 - 1e-6)  # the demand, at the low end of each pool's throughput band


def test_a_target_met_only_as_predicted_is_infeasible_robustly():
    """A TTFT target 20% above the fastest predicted TTFT of an uncalibrated system: feasible as predicted, not at
    the high end of its TTFT band; the reason says so."""
    from dse.catalog.models import get_model
    from dse.optimize.requests import evaluate_pairs
    from dse.studies.base import load_study

    doc = _study(["a100"])
    space = build_space(get_model("llama-3.1-8b"), load_study(doc).workloads[0].workload(), load_study(doc).options())
    ones = np.ones(len(space.blocks), dtype=np.int64)
    m = evaluate_pairs(space, space.blocks, np.arange(len(space.blocks)), ones, space.workload)
    target = 1.2 * float(np.min(np.where(m["fits"] & m["stable"], m["ttft_s"], np.inf)))
    assert 1.2 < bands_of("a100").ttft[1]
    doc["workloads"][0]["ttft_max_s"] = target
    assert run_study({**doc, "decide": "expected"}).summary["status"] == "optimal"
    robust = run_study(doc).summary
    assert robust["status"] == "infeasible" and not robust["best"]
    (why,) = robust["infeasible"]
    assert "TTFT target runs out" in why["reason"] and "at the high end of its error band" in why["reason"]


def test_decide_is_a_validated_field(tmp_path):
    import yaml

    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(_study(["h100"], decide="cautious")))
    r = dse("run", str(path), "--out", str(tmp_path / "o"))
    assert r.returncode == 2 and "decide" in r.stderr and "expected" in r.stderr


# ---- the robust argmin against a brute force -------------------------------------------------------------------------
def _margins(rng: np.random.Generator, n: int) -> Margins:
    return Margins(rng.uniform(1.0, 2.5, n), rng.uniform(1.0, 1.6, n), rng.uniform(1.0, 2.5, n))


def _case(rng: np.random.Generator):
    model, opts = random_space(rng)
    tpot = float(rng.choice([0.01, 0.03, 0.1, 0.3])) if rng.random() < 0.7 else None
    ttft = float(rng.choice([0.5, 5.0, 60.0, 600.0])) if rng.random() < 0.7 else None
    w = Request(name="random", prompt=int(rng.choice([128, 2000, 32_000])), output=int(rng.choice([16, 500])),
                tpot_max=tpot, ttft_max=ttft)
    return model, w, opts


def _brute_aggregated(model, w: Request, opts, m: Margins, demand: float | None = None) -> float | None:
    """The least USD per request x cost margin over every (layout, batch) meeting the targets with TPOT and TTFT
    times their margins (with ``demand``: the least USD/s of whole replicas serving it, each at its output
    tokens/s over its cost margin); None if none."""
    systems, choices = brute_force_choices(model, opts)
    rows = [(si, lay.tp, lay.dp, lay.ep, lay.etp, lay.pp, DTYPES.index(wd), DTYPES.index(kd), int(tier == "host"), n)
            for si, lay, wd, kd, tier in choices for n in range(1, opts.max_batch_per_rank + 1)]
    if not rows:
        return None
    si = np.array([r[0] for r in rows])
    r = aggregated(candidates_of(rows, w.prompt + w.output), ModelTable.build([model]), SystemTable.build(systems),
                   served(Request(w.prompt, w.output), opts.ideal, model), IDEAL if opts.ideal else None)
    cost = r["usd_per_request"]
    ok = r["fits"] & r["stable"] & np.isfinite(cost) & (cost > 0)
    if w.tpot_max is not None:
        ok &= r["tpot_s"] * m.tpot[si] <= w.tpot_max * (1 + 1e-9)
    if w.ttft_max is not None:
        ok &= r["ttft_s"] * m.ttft[si] <= w.ttft_max * (1 + 1e-9)
    if not ok.any():
        return None
    if demand is not None:
        replicas = np.ceil(demand / (r["requests_per_s"] * w.output / m.cost[si]) * (1 - 1e-12))
        return float(np.min(np.where(ok, replicas * r["usd_per_s"], np.inf)))
    return float(np.min(np.where(ok, cost * m.cost[si], np.inf)))


def _brute_disaggregated(model, w: Request, opts, m: Margins) -> float | None:
    """The least decode USD per request x its system's cost margin + prefill USD per request x its own, over every
    (prefill option, decode pair) of one numerics, the prefill at the highest utilisation whose TTFT times its
    margin meets the target, the decode TPOT times its margin meeting its target; None if none."""
    t = brute_force_pools(model, w, opts)
    if t is None:
        return None
    rows, dec, pre, pre_rows = t["rows"], t["dec"], t["pre"], t["pre_rows"]
    dsi = np.array([r[0] for r in rows])
    d_ok = t["d_ok"] & ((dec["tpot_s"] * m.tpot[dsi] <= w.tpot_max * (1 + 1e-9)) if w.tpot_max else True)
    d_cost = np.where(d_ok, dec["usd_per_request"] * m.cost[dsi], np.inf)
    best = math.inf
    for j, pr in enumerate(pre_rows):
        rho = rho_for_ttft(pre["prefill_service_s"][j], pre["kv_transfer_s"][j], pre["stack_latency_s"][j], t["req"],
                           m.ttft[pr[0]])
        if not (pre["fits"][j] and np.isfinite(rho) and rho > 0):
            continue
        same = t["pair"] == t["pre_pair"][j]
        if same.any():
            best = min(best, float(np.min(d_cost[same])) + pre["usd_per_prompt"][j] / rho * m.cost[pr[0]])
    return None if math.isinf(best) else best


def _robust(space, w: Request, m: Margins, mode: str):
    if mode == "aggregated":
        return pick(space, block_optima(space, w, margins=m))
    return pick_disaggregated(space, disaggregated_tables(space, w, margins=m))


@pytest.mark.parametrize("chunk", range(4))
def test_the_robust_argmin_equals_a_brute_force(chunk):
    """Random spaces and random margins per system: the robust aggregated and disaggregated optima (their judged
    costs) and the robust whole aggregated deployment for a demand equal a brute force over every pair, and the
    chosen configurations meet the targets at the margins."""
    rng = np.random.default_rng(4100 + chunk)
    agree = 0
    for _ in range(15):
        model, w, opts = _case(rng)
        space = build_space(model, w, opts)
        m = _margins(rng, len(space.systems))
        demand = float(rng.choice([1e3, 1e5]))
        ref = _brute_aggregated(model, w, opts, m, demand)
        got = None
        if not space.blocks.empty:
            try:
                got = whole_aggregated(space, block_optima(space, w, margins=m), None, demand)[0]
            except InfeasibleError:
                pass
        assert (got is None) == (ref is None)
        if ref is not None:
            assert got.result.objective * demand / w.output == pytest.approx(ref, rel=1e-9)
        for mode, brute in (("aggregated", _brute_aggregated), ("disaggregated", _brute_disaggregated)):
            ref = brute(model, w, opts, m)
            if space.blocks.empty or ref is None:
                if not space.blocks.empty:
                    with pytest.raises(InfeasibleError):
                        _robust(space, w, m, mode)
                continue
            r = _robust(space, w, m, mode)
            assert r.result.objective == pytest.approx(ref, rel=1e-9), (model.id, w, opts)
            agree += 1
            k = [s.id for s in space.systems].index(r.pools[-1]["system"] if hasattr(r, "pools") else r.config["system"])
            if w.tpot_max is not None:
                assert r.metrics["tpot_s"] * m.tpot[k] <= w.tpot_max * (1 + 1e-9)
    assert agree >= 8
