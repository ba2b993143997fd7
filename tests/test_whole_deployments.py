"""Whole deployments within a budget of GPUs or nodes, or for a demand, or both (`dse.optimize.whole`), against a
brute force over every decode batch, every prefill option and every replica count of random small spaces.

The brute force shares no code with the search: it lists the layouts itself (`helpers.brute_force_choices`),
evaluates every aggregated replica and every decode replica at every batch per DP rank and every prefill replica
with and without context parallelism through the request-level physics, packs replicas onto nodes one by one, and
tries every (prefill replicas, decode replicas) count the budget holds. A deployment serves min(x a, y b)
requests/s (a: a prefill replica's requests/s at the utilisation its TTFT target allows, b: a decode replica's at
its batch) and costs every chip's USD/s; in a budget the least USD per request as deployed wins, for a demand the
least USD/s serving it. Equal costs (within a relative 1e-9 here) go to the lower TPOT, then the lower TTFT (a
prefill pool's at its utilisation as deployed), then in a budget the most requests/s and the fewest GPUs, for a
demand the fewest GPUs and then nodes, among each layout at its batch serving the most requests/s (its cheapest per
request; a lower batch of a pool that does not bind could serve at the same cost and a lower TPOT, and the search
does not offer it).
"""

from __future__ import annotations

import functools
import math
from dataclasses import replace

import numpy as np
import pytest
from helpers import brute_force_choices, brute_force_pools, candidates_of, random_space, served

from dse.catalog.calibration import error_band
from dse.catalog.hardware import IDEAL, default_systems
from dse.catalog.models import get_model
from dse.catalog.units import DTYPES
from dse.errors import InfeasibleError
from dse.optimize.requests import block_optima, disaggregated_tables
from dse.optimize.space import build_space, describe_choice
from dse.optimize.whole import SOLVER, Budget, whole_aggregated, whole_disaggregated
from dse.physics.roofline import ModelTable, SystemTable
from dse.physics.serving import Request, aggregated, decode_pool, prefill_ttft

TOL = 1e-9
MOST_PER_UNIT = 128
"""More replicas than a GPU or a node (a host of at most 8 chips) holds (the loops stop where the budget runs
out)."""


SMALL = ("llama-3.1-8b", "qwen3-32b", "llama-3.1-70b", "mixtral-8x22b", "gpt-oss-120b", "minimax-m2.5")
"""Models that fit in a replica of at most 8 chips (the spaces here), dense and MoE."""


def _case(rng: np.random.Generator):
    _, opts = random_space(rng)
    model = get_model(SMALL[rng.integers(len(SMALL))])
    opts = replace(opts, max_batch_per_rank=int(rng.choice([4, 12])), max_chips_per_stage=8, max_racks=1,
                   tp=tuple(t for t in opts.tp if t <= 4) or (1,), pp=(1,))
    tpot = float(rng.choice([0.02, 0.05, 0.2])) if rng.random() < 0.7 else None
    ttft = float(rng.choice([0.5, 5.0, 60.0])) if rng.random() < 0.7 else None
    w = Request(name="random", prompt=int(rng.choice([500, 4000, 32_000])), output=int(rng.choice([50, 500])),
                tpot_max=tpot, ttft_max=ttft)
    kind = rng.integers(3)
    servers = tuple(s for s in opts.systems if default_systems()[s].chips_per_node)  # a sourced host size
    budget = None if kind == 2 else (Budget(nodes=int(rng.choice([1, 2]))) if rng.random() < 0.4 and servers
                                     else Budget(gpus=int(rng.choice([2, 8, 16, 24]))))
    if budget is not None and budget.nodes is not None:
        opts = replace(opts, systems=servers)
    demand = float(rng.choice([2e3, 3e4])) if kind > 0 else None  # output tokens/s
    return model, w, opts, budget, demand


@functools.cache
def _packed(chips: int, node: int, count: int) -> np.ndarray:
    """Nodes of ``node`` chips that 0, 1, ..., ``count`` replicas of ``chips`` chips take, placed one by one: a
    replica fits in the free chips of the last node opened, or opens a node (a replica larger than a node opens as
    many as it needs)."""
    nodes, free, out = 0, 0, [0]
    for _ in range(count):
        if chips <= node:
            if free < chips:
                nodes, free = nodes + 1, node
            free -= chips
        else:
            nodes, free = nodes + math.ceil(chips / node), 0
        out.append(nodes)
    return np.array(out)


def _units(budget: Budget | None, replicas: int, chips: int, node: int) -> int:
    if budget is not None and budget.nodes is not None:
        return int(_packed(chips, node, replicas)[replicas])
    return replicas * chips


def _better(cand: tuple, best: tuple | None) -> bool:
    """(cost, tie keys) beats best: a lower cost, or a cost within TOL and lower tie keys (compared in turn)."""
    return best is None or cand[0] < best[0] * (1 - TOL) or (cand[0] <= best[0] * (1 + TOL) and cand[1] < best[1])


def _most_per_layout(rate: np.ndarray, ok: np.ndarray, batches: int) -> np.ndarray:
    """Of each layout's rows (``batches`` consecutive rows, batch 1 up), the feasible one serving the most requests/s
    (the first of equal ones): a replica's USD/s is one figure per layout, so it is also its cheapest per request
    and no whole deployment needs another; the candidates whose ties the search decides."""
    score = np.where(ok, rate, -np.inf).reshape(-1, batches)
    best = np.argmax(score, axis=1)
    keep = np.zeros(score.shape, dtype=bool)
    keep[np.arange(len(best)), best] = np.isfinite(score[np.arange(len(best)), best])
    return keep.ravel()


def brute_aggregated(model, w: Request, opts, budget: Budget | None, demand: float | None):
    """(objective, tie keys) of the best whole aggregated deployment, or None."""
    systems, choices = brute_force_choices(model, opts)
    rows = [(si, lay.tp, lay.dp, lay.ep, lay.etp, lay.pp, DTYPES.index(wd), DTYPES.index(kd), int(tier == "host"), n)
            for si, lay, wd, kd, tier in choices for n in range(1, opts.max_batch_per_rank + 1)]
    if not rows:
        return None
    r = aggregated(candidates_of(rows, w.prompt + w.output), ModelTable.build([model]), SystemTable.build(systems),
                   served(Request(w.prompt, w.output), opts.ideal, model), IDEAL if opts.ideal else None)
    ok = r["fits"] & r["stable"] & np.isfinite(r["usd_per_request"]) & (r["usd_per_request"] > 0)
    if w.tpot_max is not None:
        ok &= r["tpot_s"] <= w.tpot_max * (1 + TOL)
    if w.ttft_max is not None:
        ok &= r["ttft_s"] <= w.ttft_max * (1 + TOL)
    ok = _most_per_layout(r["requests_per_s"], ok, opts.max_batch_per_rank)
    best = None
    lam = None if demand is None else demand / w.output
    for k in np.flatnonzero(ok):
        chips, node = int(r["chips"][k]), systems[rows[k][0]].chips_per_node or 1
        rate, usd = float(r["requests_per_s"][k]), float(r["usd_per_s"][k])
        tpot, ttft = float(r["tpot_s"][k]), float(r["ttft_s"][k])
        if budget is None:  # a demand alone: the fewest replicas serving it (more cost more and serve no more)
            x = math.ceil(lam / rate * (1 - 1e-12))
            cand = (x * usd, (tpot, ttft, x * chips, x * chips))
            best = cand if _better(cand, best) else best
            continue
        for x in range(1, budget.limit * MOST_PER_UNIT + 1):
            units = _units(budget, x, chips, node)
            if budget is not None and units > budget.limit:
                break
            if lam is not None:
                if x * rate < lam * (1 - 1e-12):
                    continue
                cand = (x * usd, (tpot, ttft, x * chips, units))
            else:
                cand = (x * usd / (x * rate), (tpot, ttft, -x * rate, x * chips))
            if _better(cand, best):
                best = cand
    return best


def brute_disaggregated(model, w: Request, opts, budget: Budget | None, demand: float | None):
    """(objective, tie keys) of the best whole disaggregated deployment, or None."""
    t = brute_force_pools(model, w, opts)
    if t is None:
        return None
    systems, _ = brute_force_choices(model, opts)
    rows, dec, pre, pre_rows, rho = t["rows"], t["dec"], t["pre"], t["pre_rows"], t["rho"]
    lam = None if demand is None else demand / w.output
    d_ok = np.flatnonzero(_most_per_layout(dec["requests_per_s"], t["d_ok"], opts.max_batch_per_rank))
    host = np.array([systems[r[0]].chips_per_node or 1 for r in rows])
    best = None
    for j in np.flatnonzero(t["p_ok"]):
        a = float(pre["servers"][j] * rho[j] / pre["prefill_service_s"][j])
        service, transfer = float(pre["prefill_service_s"][j]), float(pre["kv_transfer_s"][j])
        tau = float(pre["stack_latency_s"][j])

        def ttft(rate, x, service=service, transfer=transfer, tau=tau, servers=float(pre["servers"][j])):
            """TTFT with the prefill pool at its utilisation as deployed: rate x service over its servers."""
            return prefill_ttft(service, transfer, tau, rate * service / (x * servers), t["req"])

        u, c = float(pre["usd_per_s"][j]), int(pre["chips"][j])
        g = systems[pre_rows[j][0]].chips_per_node or 1
        same = d_ok[t["pair"][d_ok] == t["pre_pair"][j]]
        if not len(same):
            continue
        b, v, tpot = dec["requests_per_s"][same], dec["usd_per_s"][same], dec["tpot_s"][same]
        dc, dg = dec["chips"][same].astype(np.int64), host[same]
        if budget is None:  # a demand alone: each pool's fewest replicas serving it, every pair of rows
            x, y = math.ceil(lam / a * (1 - 1e-12)), np.ceil(lam / b * (1 - 1e-12))
            cost, gpus = x * u + y * v, (x * c + y * dc).astype(float)
            keys = (tpot, ttft(np.full(len(same), lam), x) * np.ones(len(same)), gpus, gpus)
            best = _least(cost, keys, np.ones(len(same), dtype=bool), best)
            continue
        # every (x, y) the budget holds, every decode row of the same formats at once
        ys = np.arange(1, budget.limit * MOST_PER_UNIT + 1)
        if budget.nodes is not None:
            yu = np.stack([_packed(int(ci), int(gi), len(ys))[1:] for ci, gi in zip(dc, dg, strict=True)], axis=1)
        else:
            yu = ys[:, None] * dc[None, :]
        for x in range(1, budget.limit * MOST_PER_UNIT + 1):
            xu = _units(budget, x, c, g)
            if xu >= budget.limit:
                break
            fits = xu + yu <= budget.limit
            rate = np.minimum(x * a, ys[:, None] * b[None, :])
            gpus = (x * c + ys[:, None] * dc[None, :]).astype(float)
            tp = np.broadcast_to(tpot[None, :], rate.shape)
            if lam is not None:
                fits &= rate >= lam * (1 - 1e-12)
                cost = x * u + ys[:, None] * v[None, :]
                keys = (tp, ttft(np.full(rate.shape, lam), x), gpus, (xu + yu).astype(float))
            else:
                cost = (x * u + ys[:, None] * v[None, :]) / rate
                keys = (tp, ttft(rate, x), -rate, gpus)
            best = _least(cost, keys, fits, best)
    return best


def _least(cost: np.ndarray, keys: tuple, ok: np.ndarray, best: tuple | None) -> tuple | None:
    """The better of ``best`` and the least (cost, tie keys) where ``ok`` holds (ties: costs within TOL of the
    least, then the keys in turn)."""
    if not ok.any():
        return best
    low = np.min(cost[ok])
    near = np.flatnonzero((ok & (cost <= low * (1 + TOL))).ravel())
    k = near[np.lexsort(tuple(np.asarray(key, dtype=float).ravel()[near] for key in reversed(keys)))[0]]
    cand = (float(cost.ravel()[k]), tuple(float(np.asarray(key).ravel()[k]) for key in keys))
    return cand if _better(cand, best) else best


def _check(space, w: Request, r, budget: Budget | None, demand: float | None) -> tuple[float, float]:
    """The deployment recomputed from its pools as reported: it fits the budget, serves the demand, meets the
    targets at its planned figures and at those it reports as served (no higher: a pool with capacity to spare
    holds fewer sequences); returns (objective, tie keys at the planned figures) as the brute force states them."""
    pools = r.pools if hasattr(r, "pools") else [{"role": "both", "replicas": r.replicas, **r.config}]
    by_id = {s.id: s for s in space.systems}
    units = sum(_units(budget, p["replicas"], p["chips"], by_id[p["system"]].chips_per_node or 1) for p in pools)
    usd = sum(p["replicas"] * p["chips"] * by_id[p["system"]].price_per_s for p in pools)
    dep = r.deployed
    assert dep["chips"] == sum(p["replicas"] * p["chips"] for p in pools)
    assert dep["usd_per_s"] == pytest.approx(usd, rel=1e-12)
    if budget is not None:
        assert units <= budget.limit
    # planned: the decode pool's TPOT at its batch; TTFT the aggregated replica's at its batch, the prefill pool's
    # at its utilisation as deployed
    tpot = r.metrics["tpot_s"]
    ttft = r.metrics["ttft_s"] if len(pools) == 1 else dep["ttft_s"]
    assert dep["tpot_s"] <= tpot * (1 + TOL) and dep["ttft_s"] <= ttft * (1 + TOL)
    if "batch_served" in dep:  # fewer sequences per rank than planned, never more
        assert 1 <= dep["batch_served"] <= pools[-1]["batch"]
    if w.tpot_max is not None:
        assert dep["tpot_s"] <= tpot <= w.tpot_max * (1 + TOL)
    if w.ttft_max is not None:
        assert dep["ttft_s"] <= ttft <= w.ttft_max * (1 + TOL)
    assert r.result.solver == SOLVER and r.result.gap == 0 and r.whole
    if demand is not None:
        assert dep["requests_per_s"] == pytest.approx(demand / w.output, rel=1e-12)
        return usd, (tpot, ttft, dep["chips"], units)
    return usd / dep["requests_per_s"], (tpot, ttft, -dep["requests_per_s"], dep["chips"])


@pytest.mark.parametrize("chunk", range(3))
def test_whole_deployments_equal_a_brute_force(chunk):
    """60 random small spaces, each with a budget of GPUs or nodes, a demand, or both: the best whole aggregated
    and disaggregated deployments equal the brute force's (cost and tie keys), and recompute from their pools."""
    rng = np.random.default_rng(7300 + chunk)
    agree = checked = 0
    for _ in range(20):
        model, w, opts, budget, demand = _case(rng)
        space = build_space(model, w, opts)
        for mode, brute in (("aggregated", brute_aggregated), ("disaggregated", brute_disaggregated)):
            ref = brute(model, w, opts, budget, demand)
            checked += 1
            if space.blocks.empty:
                assert ref is None
                continue
            try:
                if mode == "aggregated":
                    got = whole_aggregated(space, block_optima(space, w), budget, demand)[0]
                else:
                    got = whole_disaggregated(space, disaggregated_tables(space, w), budget, demand)[0]
            except InfeasibleError as exc:
                assert ref is None, (mode, model.id, w, opts, budget, demand, ref, str(exc))
                continue
            assert ref is not None, (mode, model.id, w, opts, budget, demand)
            cost, tie = _check(space, w, got, budget, demand)
            assert cost == pytest.approx(ref[0], rel=TOL), (mode, model.id, w, opts, budget, demand)
            if cost <= ref[0] * (1 + TOL) and ref[0] <= cost * (1 + TOL):
                assert tie == pytest.approx(ref[1], rel=TOL), (mode, model.id, w, opts, budget, demand)
            agree += 1
    print(f"whole deployments: {agree} of {checked} searches agree with the brute force")
    assert agree >= 10


def test_a_budget_below_the_smallest_deployment_names_the_shortfall():
    """Llama 3.1 70B in BF16 needs more than one H100's HBM: a 1-GPU budget is infeasible, and the message names
    the budget and how many GPUs the smallest deployment needs."""
    from dse.optimize.space import SpaceOptions

    w = Request(name="chat", prompt=2000, output=200, tpot_max=0.1)
    space = build_space(get_model("llama-3.1-70b"), w, SpaceOptions(systems=("h100",), weights_dtypes=("bf16",),
                                                                   kv_dtypes=("bf16",), kv_tiers=("hbm",), pp=(1,),
                                                                   max_batch_per_rank=64))
    with pytest.raises(InfeasibleError, match=r"within the budget of 1 GPUs: one replica of each pool needs at "
                                              r"least 2 GPUs, 1 more than the budget"):
        whole_aggregated(space, block_optima(space, w), Budget(gpus=1), None)
    (r,) = whole_aggregated(space, block_optima(space, w), Budget(gpus=16), None)
    assert r.replicas * r.config["chips"] <= 16 and r.replicas * r.config["chips"] > 8  # copies fill the budget


def _served_by_brute_force(space, w: Request, pool: dict, rate: float, decode: bool, speed: float = 1.0
                           ) -> tuple[int, dict]:
    """The batch (over the DP ranks) one replica of ``pool`` serving ``rate`` requests/s holds, and the physics
    there: its rate at every batch per DP rank up to the pool's, evaluated here from the request-level physics
    (times ``speed``), the fewest sequences whose rate covers ``rate``."""
    systems = [s.id for s in space.systems]
    per_rank = pool["batch"] // pool["dp"]
    row = (systems.index(pool["system"]), pool["tp"], pool["dp"], pool["ep"], pool["etp"], pool["pp"],
           DTYPES.index(pool["weights_dtype"]), DTYPES.index(pool["kv_dtype"]), int(pool["kv_tier"] == "host"))
    cand = candidates_of([(*row, n) for n in range(1, per_rank + 1)], w.prompt + w.output)
    mt, st = space.tables()
    req = replace(space.served(w), report_quantiles=(0.9,))
    m = (decode_pool if decode else aggregated)(cand, mt, st, req, IDEAL if space.ideal else None)
    n = next((n for n in range(1, per_rank + 1) if speed * m["requests_per_s"][n - 1] >= rate * (1 - TOL)),
             per_rank)
    return n * pool["dp"], {k: float(np.ravel(v)[n - 1]) for k, v in m.items() if k.startswith(("ttft", "tpot"))}


def test_pools_with_capacity_to_spare_report_the_batch_they_serve():
    """Random small spaces with a demand: where the replicas of the best whole deployment can serve more than the
    demand, each holds the fewest sequences whose rate covers its share (Little's law, to a whole sequence per DP
    rank), and the TTFT, TPOT and p90s reported are the physics' at that batch, recomputed here at every batch."""
    rng = np.random.default_rng(7400)
    seen = 0
    for _ in range(40):
        model, w, opts, budget, demand = _case(rng)
        if demand is None:
            continue
        space = build_space(model, w, opts)
        if space.blocks.empty:
            continue
        for mode in ("aggregated", "disaggregated"):
            try:
                got = (whole_aggregated(space, block_optima(space, w), None, demand)[0] if mode == "aggregated"
                       else whole_disaggregated(space, disaggregated_tables(space, w), None, demand)[0])
            except InfeasibleError:
                continue
            dep = got.deployed
            pool = ({**describe_choice(space, got.decode), "replicas": got.pools[1]["replicas"]}
                    if mode == "disaggregated" else {**got.config, "replicas": got.replicas})
            share = dep["requests_per_s"] / pool["replicas"]
            batch, m = _served_by_brute_force(space, w, pool, share, mode == "disaggregated")
            assert dep.get("batch_served", pool["batch"]) == batch, (mode, model.id, w, opts, demand)
            assert dep["tpot_s"] == pytest.approx(m["tpot_s"], rel=1e-9)
            assert dep["tpot_p90_s"] == pytest.approx(m.get("tpot_p90_s", m["tpot_s"]), rel=1e-9)
            if mode == "aggregated":
                assert dep["ttft_s"] == pytest.approx(m["ttft_s"], rel=1e-9)
                assert dep["ttft_p90_s"] == pytest.approx(m["ttft_p90_s"], rel=1e-9)
            band = None if space.ideal else error_band(pool["system"])
            if batch < pool["batch"] and band is not None:  # the batches held at the throughput band's ends
                slow = _served_by_brute_force(space, w, pool, share, mode == "disaggregated", band[0])[1]
                fast = _served_by_brute_force(space, w, pool, share, mode == "disaggregated", band[1])[1]
                assert dep["served_edges"]["tpot_s"] == pytest.approx((fast["tpot_s"], slow["tpot_s"]), rel=1e-9)
                assert slow["tpot_s"] >= dep["tpot_s"] >= fast["tpot_s"]
            seen += batch < pool["batch"]
    print(f"{seen} deployments hold fewer sequences than planned")
    assert seen >= 3
