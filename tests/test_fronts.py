"""The complete Pareto fronts (`dse.optimize.fronts`) against the non-dominated set of an independent
enumeration.

The reference shares no code with the space builder or the fronts: it lists the layouts itself
(`helpers.brute_force_choices`), evaluates every aggregated (layout, batch) pair and every
disaggregated (prefill option, decode pair) combination of the same formats through the request-level
physics, and keeps the non-dominated points with its own scan.
"""

from __future__ import annotations

import numpy as np
import pytest
from helpers import brute_force_pools, candidates_of, random_space

from dse.optimize.fronts import front
from dse.optimize.requests import disaggregated_tables
from dse.optimize.space import build_space
from dse.physics.serving import Request, aggregated, disaggregated


def reference_points(model, w: Request, opts) -> dict[str, list[tuple[float, float, float]]]:
    """(TPOT, USD per request, chip-seconds per output token) of every feasible configuration."""
    t = brute_force_pools(model, w, opts)
    if t is None:
        return {"agg": [], "dis": []}
    rows, dec, d_ok, pre_rows, pre, rho = (t[k] for k in ("rows", "dec", "d_ok", "pre_rows", "pre", "rho"))
    pts: list[tuple[float, float, float]] = []
    chips = np.array([r[1] * r[2] * r[5] for r in rows], dtype=float)
    ag = aggregated(candidates_of(rows, w.prompt + w.output), t["mt"], t["st"], t["req"], t["eff"])
    ok = ag["fits"] & ag["stable"] & np.isfinite(ag["usd_per_request"]) & (ag["usd_per_request"] > 0)
    for key, cap in (("tpot_s", w.tpot_max), ("ttft_s", w.ttft_max)):
        if cap is not None:
            ok &= ag[key] <= cap * (1 + 1e-9)
    for i in np.flatnonzero(ok):
        pts.append((ag["tpot_s"][i], ag["usd_per_request"][i], chips[i] / (ag["requests_per_s"][i] * w.output)))
    dis = []
    for j in np.flatnonzero(t["p_ok"]):
        same = d_ok & (t["pair"] == t["pre_pair"][j])
        if not same.any():
            continue
        one = {k: (v[j] if np.ndim(v) else v) for k, v in pre.items()}
        sub = {k: (v[same] if np.ndim(v) else v) for k, v in dec.items()}
        m = disaggregated(sub, one, t["req"], rho[j])
        for tp_, c, tok in zip(m["tpot_s"], m["usd_per_request"], m["tokens_per_s_per_gpu"], strict=True):
            dis.append((tp_, c, 1.0 / tok))
    return {"agg": pts, "dis": dis}


def scan_front(points: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """Non-dominated (x, y), both minimized, one of each equal pair: walk x upward, keep strict y records."""
    out: list[tuple[float, float]] = []
    best = float("inf")
    for x, y in sorted(points):
        if y < best:
            out.append((x, y))
            best = y
    return out


def random_case(rng):
    model, opts = random_space(rng, moe=bool(rng.random() < 0.6))
    tpot = float(rng.choice([0.03, 0.1, 0.3])) if rng.random() < 0.3 else None
    ttft = float(rng.choice([2.0, 30.0, 600.0])) if rng.random() < 0.6 else None
    return model, Request(name="random", prompt=int(rng.choice([128, 2000, 32_000])), output=int(rng.choice([16, 500])), tpot_max=tpot, ttft_max=ttft), opts


@pytest.mark.parametrize("seed", range(2))
def test_fronts_equal_the_non_dominated_set_of_every_configuration(seed):
    """30 random spaces (MoE below and above saturation, dense; with and without targets): both fronts, with
    aggregated, disaggregated and both modes, equal the reference's non-dominated sets point for point."""
    rng = np.random.default_rng(4200 + seed)
    compared = points = 0
    for _ in range(15):
        model, w, opts = random_case(rng)
        space = build_space(model, w, opts)
        ref = reference_points(model, w, opts)
        if space.blocks.empty:
            assert not ref["agg"] and not ref["dis"]
            continue
        dis = disaggregated_tables(space, space.workload)
        for modes in (("agg",), ("dis",), ("agg", "dis")):
            cand = [p for m in modes for p in ref[m]]
            for objective, k in (("cost", 1), ("throughput", 2)):
                want = scan_front([(p[0], p[k]) for p in cand])
                f = front(space, space.workload, "agg" in modes, dis if "dis" in modes else None, objective)
                y = f["usd_per_request"] if objective == "cost" else 1.0 / f["tokens_per_s_per_gpu"]
                got = list(zip(f["tpot_s"], y, strict=True))
                assert len(got) == len(want), (model.id, w, modes, objective)
                np.testing.assert_allclose(np.array(got).reshape(-1, 2), np.array(want).reshape(-1, 2), rtol=1e-9)
                compared += 1
                points += len(got)
    print(f"fronts: {compared} fronts over random spaces equal the reference ({points} points)")
    assert compared >= 30


def test_front_is_monotone_and_contains_the_cost_optimum():
    from dse.catalog.models import get_model
    from dse.optimize.requests import solve_disaggregated, solve_requests
    from dse.optimize.space import SpaceOptions

    space = build_space(get_model("llama-3.1-70b"), Request(name="chat", prompt=2000, output=500, ttft_max=2.0),
                        SpaceOptions(systems=("h100", "b200"), pp=(1,), max_batch_per_rank=256))
    dis = disaggregated_tables(space, space.workload)
    f = front(space, space.workload, True, dis, "cost")
    assert len(f) >= 20
    assert (np.diff(f["tpot_s"]) > 0).all() and (np.diff(f["usd_per_request"]) < 0).all()
    best = min(solve_requests(space).metrics["usd_per_request"], solve_disaggregated(space).metrics["usd_per_request"])
    assert f["usd_per_request"].min() == pytest.approx(best, rel=1e-12)
    t = front(space, space.workload, True, dis, "throughput")
    user, gpu = t["tokens_per_s_per_user"].to_numpy(), t["tokens_per_s_per_gpu"].to_numpy()
    assert (np.diff(user) <= 1e-12 * user[1:]).all() and (np.diff(gpu) > 0).all()  # equal TPOT up to rounding


def test_smallest_whole_of_an_aggregated_front_keeps_every_figure():
    """A front without disaggregated points (no prefill options): each point's whole deployment is one replica, its
    figures the point's own, TTFT included."""
    from dse.catalog.models import get_model
    from dse.optimize.fronts import smallest_whole
    from dse.optimize.space import SpaceOptions

    space = build_space(get_model("llama-3.1-8b"), Request(name="chat", prompt=2000, output=500, ttft_max=2.0),
                        SpaceOptions(systems=("h100",), pp=(1,), max_batch_per_rank=128))
    f = front(space, space.workload, True, None, "cost")
    w = smallest_whole(f)
    assert len(f) and (w["decode_replicas"] == 1).all() and (w["prefill_replicas"] == 0).all()
    for key in ("chips", "usd_per_request", "tokens_per_s_per_gpu", "ttft_s"):
        assert np.array_equal(w[key].to_numpy(), f[key].to_numpy()), key
