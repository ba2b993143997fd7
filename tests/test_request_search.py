"""The request-level search (`dse.optimize.requests`) against an independent brute force.

The brute force shares no code with the space builder or the search: it enumerates the layouts
itself (from the physics' `layouts_for`), every batch per DP rank from 1 to the study's cap, and
calls the request-level physics (`dse.physics.serving.aggregated`) directly, keeping the cheapest
USD per request that fits, keeps up with its prefill and meets the request-level targets.
"""

from __future__ import annotations

import numpy as np
import pytest
from helpers import brute_force_choices, candidates_of, random_space, served

from dse.catalog.hardware import IDEAL
from dse.catalog.units import DTYPES
from dse.errors import InfeasibleError
from dse.optimize.requests import SOLVER_NAME, evaluate_pairs, solve_requests
from dse.optimize.space import SpaceOptions, build_space, pairs
from dse.physics.queueing import QUANTILES
from dse.physics.roofline import ModelTable, SystemTable
from dse.physics.serving import Request, aggregated


def random_case(rng: np.random.Generator, moe: bool | None = None):
    model, opts = random_space(rng, moe)
    cap = rng.random()
    tpot = float(rng.choice([0.01, 0.03, 0.1, 0.3])) if cap < 0.7 else None
    ttft = float(rng.choice([0.5, 5.0, 60.0, 600.0])) if cap > 0.4 else None
    # quantile targets (p50, p90, p99 of TTFT and of TPOT) on a third of the cases
    ttft_q = ((float(rng.choice(QUANTILES)), float(rng.choice([0.5, 5.0, 60.0]))),) if rng.random() < 0.33 else ()
    tpot_q = ((float(rng.choice(QUANTILES)), float(rng.choice([0.03, 0.1, 0.3]))),) if rng.random() < 0.33 else ()
    # a closed loop of N requests in flight (whole replicas holding exactly N) on a fifth of the cases
    closed = {"arrival": "concurrency", "concurrency": int(rng.choice([48, 64, 256]))} if rng.random() < 0.2 else {}
    w = Request(name="random", prompt=int(rng.choice([128, 2000, 32_000, 200_000])), output=int(rng.choice([16, 500])),
                tpot_max=tpot, ttft_max=ttft, ttft_quantile_max=ttft_q, tpot_quantile_max=tpot_q, **closed)
    return model, w, opts


def brute_force(model, w: Request, opts: SpaceOptions):
    """(usd_per_request, system, tp, dp, ep, pp, batch, wd, kd, tier) of the cheapest feasible pair; None if none."""
    systems, choices = brute_force_choices(model, opts)
    rows = [(si, lay.tp, lay.dp, lay.ep, lay.etp, lay.pp, DTYPES.index(wd), DTYPES.index(kd), int(tier == "host"), n)
            for si, lay, wd, kd, tier in choices for n in range(1, opts.max_batch_per_rank + 1)]
    if not rows:
        return None
    a = np.array(rows, dtype=np.int64).T
    cand = candidates_of(rows, w.prompt + w.output)
    mt, st = ModelTable.build([model]), SystemTable.build(systems)
    quantiles = tuple(q for q, _ in (*w.ttft_quantile_max, *w.tpot_quantile_max))
    r = aggregated(cand, mt, st, served(Request(w.prompt, w.output, report_quantiles=quantiles, arrival=w.arrival),
                                        opts.ideal, model), IDEAL if opts.ideal else None)
    cost = r["usd_per_request"]
    ok = r["fits"] & r["stable"] & np.isfinite(cost) & (cost > 0)
    if w.concurrency is not None:  # whole replicas of n per DP rank and micro-batch hold the N requests exactly
        ok &= np.array([w.concurrency % (row[9] * row[2] * row[5]) == 0 for row in rows])
    if w.tpot_max is not None:
        ok &= r["tpot_s"] <= w.tpot_max * (1 + 1e-9)
    if w.ttft_max is not None:
        ok &= r["ttft_s"] <= w.ttft_max * (1 + 1e-9)
    for metric, caps in (("ttft", w.ttft_quantile_max), ("tpot", w.tpot_quantile_max)):
        for q, cap in caps:
            ok &= r[f"{metric}_p{q * 100:g}_s"] <= cap * (1 + 1e-9)
    if not ok.any():
        return None
    i = int(np.argmin(np.where(ok, cost, np.inf)))
    s = a[:, i]
    return (float(cost[i]), systems[s[0]].id, int(s[1]), int(s[2]), int(s[3]), int(s[5]), int(s[2] * s[9]),
            DTYPES[s[6]], DTYPES[s[7]], ("hbm", "host")[s[8]])


@pytest.mark.parametrize("chunk", range(4))
def test_request_optimum_equals_brute_force(chunk):
    """100 random spaces (dense and MoE, TPOT and TTFT caps, ideal and calibrated): same optimum."""
    rng = np.random.default_rng(1200 + chunk)
    cases = [random_case(rng, moe=True) for _ in range(12)] + [random_case(rng, moe=False) for _ in range(8)]
    cases += [random_case(rng) for _ in range(5)]
    agree = feasible = 0
    for model, w, opts in cases:
        ref = brute_force(model, w, opts)
        space = build_space(model, w, opts)
        if ref is None:
            with pytest.raises(InfeasibleError, match="no feasible configuration|design space is empty"):
                solve_requests(space)
            continue
        feasible += 1
        r = solve_requests(space)
        assert r.metrics["usd_per_request"] == pytest.approx(ref[0], rel=1e-9), (model.id, w, opts, ref, r.config)
        c = r.config
        got = (c["system"], c["tp"], c["dp"], c["ep"], c["pp"], c["batch"], c["weights_dtype"], c["kv_dtype"],
               c["kv_tier"])
        assert got == ref[1:] or r.metrics["usd_per_request"] <= ref[0] * (1 + 1e-9)
        assert r.result.solver == SOLVER_NAME and r.result.gap == 0 and r.result.status == "optimal"
        agree += 1
    print(f"request-level brute force: {agree} of {feasible} feasible spaces agree ({len(cases)} spaces)")
    assert feasible >= 8 and agree == feasible


def test_request_cost_is_not_monotone_in_the_batch_but_latencies_are():
    """Why the search enumerates every n: USD per request rises again with n in some blocks (prefill load
    and queueing grow with the concurrency), while on one DP rank request TTFT and TPOT never fall as n grows.
    (With several lock-stepped DP ranks they may fall: a prefill chunk's extra time shrinks as the growing decode
    pass becomes memory-bound and hides the chunk's compute, and the D ranks multiply that share.)"""
    rng = np.random.default_rng(11)
    rises = blocks = 0
    for _ in range(30):
        model, w, opts = random_case(rng)
        space = build_space(model, w, opts)
        if space.blocks.empty:
            continue
        pos, n = pairs(space.blocks)
        m = evaluate_pairs(space, space.blocks, pos, n, space.workload)
        same = (pos[1:] == pos[:-1]) & m["stable"][1:] & m["stable"][:-1]
        one_rank = space.blocks["dp"][pos[1:]] == 1
        for key, where in (("tpot_s", same & one_rank), ("ttft_s", same & one_rank)):
            v = m[key]
            assert not (where & (np.diff(v) < -1e-9 * v[1:])).any(), key
        c = m["usd_per_request"]
        rises += len(set(pos[1:][same & (np.diff(c) > 1e-9 * c[1:])]))
        blocks += len(space.blocks)
    assert blocks > 100 and rises > 0


def test_workload_options_reach_the_request_physics():
    """A study's prefix-cache share, chunk budget and speculation reach the request-level search: cached prompt
    tokens are not recomputed (cheaper requests), and MTP emitting 1.8 tokens per decode pass serves the
    same TPOT target more cheaply; an acceptance length above draft + 1 is refused naming the field."""
    from dse.catalog.models import get_model
    from dse.optimize.space import SpaceOptions
    from dse.studies.base import WorkloadSpec

    model = get_model("deepseek-v3")
    opts = SpaceOptions(systems=("h200",), weights_dtypes=("fp8",), kv_dtypes=("fp8",), kv_tiers=("hbm",), tp=(1, 8),
                        pp=(1,), max_racks=1, max_chips_per_stage=16, max_batch_per_rank=128)

    def cost(**kw) -> float:
        w = WorkloadSpec(name="chat", prompt=8000, output=500, tpot_max_s=0.05, ttft_max_s=5.0, **kw).workload()
        return solve_requests(build_space(model, w, opts)).metrics["usd_per_request"]

    plain = cost()
    assert cost(cached_prompt_share=0.5) < 0.8 * plain
    assert cost(draft_tokens=1, accept_length=1.8) < plain
    assert cost(chunk_tokens=512) != pytest.approx(plain, rel=1e-6)
    with pytest.raises(ValueError, match="accept_length"):
        WorkloadSpec(name="chat", prompt=8000, output=500, draft_tokens=1, accept_length=2.5)


def test_one_gathering_at_several_inputs_equals_separate_evaluations():
    """`evaluate_at` (the request-level physics' passes over one gathering of the catalog columns) gives exactly
    what `evaluate` gives for each input, on random candidates of every model and system."""
    import sys
    from dataclasses import replace
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
    from bench_evaluate import candidates

    from dse.physics.roofline import BRIEF_KEYS, evaluate, evaluate_at

    cand, mt, st = candidates(20_000, seed=3)
    dp = np.asarray(cand.dp, dtype=float)
    inputs = [{"context": 3000.5, "phase": 0}, {"batch": dp, "context": 5000, "phase": 1, "kv_tier": 0}]
    for kw, got in zip(inputs, evaluate_at(cand, mt, st, None, inputs), strict=True):
        want = evaluate(replace(cand, **kw), mt, st, None, ttft=False)
        for key in BRIEF_KEYS:
            np.testing.assert_array_equal(got[key], want[key], err_msg=key)
    # ``brief: False``: all of evaluate's figures, its TTFT with ``ttft: True``
    (got,) = evaluate_at(cand, mt, st, None, [{"context": 2000, "phase": 0, "brief": False, "ttft": True}])
    want = evaluate(replace(cand, context=2000, phase=0), mt, st, None)
    assert set(got) == set(want) and "ttft_s" in got
    for key in want:
        np.testing.assert_array_equal(got[key], want[key], err_msg=key)


def test_dp_ranks_in_lock_step_share_each_others_prefill_chunks():
    """A stage's DP ranks run each pass together, so a chunk on any rank stretches every rank's pass: with D ranks
    the interference is u = D x P' t_c / K (x the per-rank request rate) and the mean pass t_d / (1 - u); one
    rank is the single-server case."""
    from dse.catalog.hardware import default_systems
    from dse.catalog.models import get_model

    model = get_model("deepseek-v3")
    mt, st = ModelTable.build([model]), SystemTable.build([default_systems()["h200"]])
    req = Request(4000, 500)
    for dp in (1, 4, 8):
        cand = candidates_of([(0, 1, dp, 8, 1, 1, DTYPES.index("fp8"), DTYPES.index("fp8"), 0, 16)], 4500)
        r = aggregated(cand, mt, st, req)
        x = r["requests_per_s"][0] / dp  # per rank (PP 1)
        u = dp * x * req.computed_prompt / min(req.chunk, req.computed_prompt) * r["chunk_extra_s"][0]
        assert r["step_s"][0] == pytest.approx(r["decode_step_s"][0] / (1 - u), rel=1e-9)
        assert r["prefill_share"][0] == pytest.approx(u, rel=1e-9) and r["stable"][0]
