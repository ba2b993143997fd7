"""The disaggregated search (`dse.optimize.requests.solve_disaggregated`) against an independent brute force.

The brute force shares no code with the space builder or the search: it lists the layouts itself
(`helpers.brute_force_choices`), evaluates every decode replica at every batch per DP rank from 1 to
the study's cap and every prefill replica with and without context parallelism through the
request-level physics (`decode_pool`, `prefill_pool`, `rho_for_ttft`, `disaggregated`), and keeps
the cheapest USD per request over every (prefill, decode) combination whose pools share their
weights and KV formats, fit, and meet the TPOT and TTFT targets.
"""

from __future__ import annotations

import numpy as np
import pytest
from helpers import brute_force_pools, random_space

from dse.catalog.units import DTYPES
from dse.errors import InfeasibleError
from dse.optimize.requests import SOLVER_NAME, solve_disaggregated
from dse.optimize.space import build_space
from dse.physics.queueing import QUANTILES
from dse.physics.serving import Request, disaggregated


def random_case(rng: np.random.Generator, moe: bool | None = None):
    model, opts = random_space(rng, moe)
    tpot = float(rng.choice([0.01, 0.03, 0.1, 0.3])) if rng.random() < 0.7 else None
    ttft = float(rng.choice([0.3, 2.0, 30.0, 600.0])) if rng.random() < 0.7 else None
    ttft_q = ((float(rng.choice(QUANTILES)), float(rng.choice([0.3, 2.0, 30.0]))),) if rng.random() < 0.33 else ()
    tpot_q = ((float(rng.choice(QUANTILES)), float(rng.choice([0.03, 0.1]))),) if rng.random() < 0.2 else ()
    w = Request(name="random", prompt=int(rng.choice([128, 2000, 32_000, 200_000])), output=int(rng.choice([16, 500])),
                tpot_max=tpot, ttft_max=ttft, ttft_quantile_max=ttft_q, tpot_quantile_max=tpot_q)
    return model, w, opts


def brute_force(model, w: Request, opts):
    """The least USD per request of a disaggregated deployment (None if none) and its metrics."""
    t = brute_force_pools(model, w, opts)
    if t is None:
        return None
    rows, dec, d_ok, pre_rows, pre, rho = (t[k] for k in ("rows", "dec", "d_ok", "pre_rows", "pre", "rho"))
    best = None
    for j in np.flatnonzero(t["p_ok"]):  # every prefill option against every decode pair of the same formats
        same = d_ok & (t["pair"] == t["pre_pair"][j])
        if not same.any():
            continue
        one = {k: (v[j] if np.ndim(v) else v) for k, v in pre.items()}
        m = disaggregated({k: (v[same] if np.ndim(v) else v) for k, v in dec.items()}, one, t["req"], rho[j])
        i = int(np.argmin(m["usd_per_request"]))
        if best is None or m["usd_per_request"][i] < best[0]:
            best = (float(m["usd_per_request"][i]), {k: np.asarray(v)[i] if np.ndim(v) else v for k, v in m.items()})
    return best


@pytest.mark.parametrize("chunk", range(3))
def test_disaggregated_optimum_equals_brute_force(chunk):
    """60 random spaces (MoE below and above saturation, dense; TPOT and TTFT caps; ideal and calibrated)."""
    rng = np.random.default_rng(3100 + chunk)
    cases = [random_case(rng, moe=True) for _ in range(10)] + [random_case(rng, moe=False) for _ in range(6)]
    cases += [random_case(rng) for _ in range(4)]
    agree = feasible = 0
    for model, w, opts in cases:
        ref = brute_force(model, w, opts)
        space = build_space(model, w, opts)
        if ref is None:
            with pytest.raises(InfeasibleError, match="no feasible|design space is empty"):
                solve_disaggregated(space)
            continue
        feasible += 1
        r = solve_disaggregated(space)
        assert r.metrics["usd_per_request"] == pytest.approx(ref[0], rel=1e-9), (model.id, w, opts)
        for key in ("ttft_s", "tpot_s"):  # the chosen deployment meets the targets as the physics states them
            target = w.ttft_max if key == "ttft_s" else w.tpot_max
            assert target is None or r.metrics[key] <= target * (1 + 1e-9)
        assert r.result.solver == SOLVER_NAME and r.result.gap == 0
        roles = [p["role"] for p in r.pools]
        assert roles == ["prefill", "decode"] and all(p["replicas"] >= 1 for p in r.pools)
        assert r.pools[0]["weights_dtype"] == r.pools[1]["weights_dtype"]
        assert r.pools[0]["kv_dtype"] == r.pools[1]["kv_dtype"]
        agree += 1
    print(f"disaggregated brute force: {agree} of {feasible} feasible spaces agree ({len(cases)} spaces)")
    assert feasible >= 6 and agree == feasible


def test_context_parallel_prefill_serves_long_prompts_faster():
    """Splitting a long prompt over the DP ranks of a prefill replica divides its service time (the ring's KV
    traffic overlapped), so a tight TTFT target on a long prompt is met only with context parallelism."""
    from dse.catalog.models import get_model
    from dse.optimize.space import SpaceOptions

    model = get_model("llama-3.1-8b")
    opts = SpaceOptions(systems=("h100",), weights_dtypes=("fp8",), kv_dtypes=("fp8",), kv_tiers=("hbm",),
                        tp=(1,), pp=(1,), max_racks=1, max_chips_per_stage=8, max_batch_per_rank=64, ideal=True)
    plain = solve_disaggregated(build_space(model, Request(name="long", prompt=120_000, output=200), opts), context_parallel=(False,))
    target = plain.metrics["prefill_service_s"] * 0.5
    space = build_space(model, Request(name="long", prompt=120_000, output=200, ttft_max=target), opts)
    with pytest.raises(InfeasibleError, match="TTFT target runs out in the prefill pool"):
        solve_disaggregated(space, context_parallel=(False,))
    r = solve_disaggregated(space)
    assert r.context_parallel and r.metrics["ttft_s"] <= target * (1 + 1e-9)
    assert r.pools[0]["context_parallel"] and r.pools[0]["dp"] > 1


def test_disaggregated_metrics_recompute_from_their_parts():
    """The optimum's request-level metrics recompute from their parts: input plus output cost is the request's,
    blended is the request's cost over all its tokens, per-user speed is 1 / TPOT, and the prefill pool's
    ratio serves the decode pool's request rate at the planned utilisation."""
    from dse.catalog.models import get_model
    from dse.optimize.space import SpaceOptions

    model = get_model("llama-3.1-70b")
    w = Request(name="chat", prompt=4000, output=500, tpot_max=0.05, ttft_max=5.0)
    space = build_space(model, w, SpaceOptions(systems=("h200",), pp=(1,), max_batch_per_rank=128))
    r = solve_disaggregated(space)
    m = r.metrics
    assert m["usd_per_mtok_blended"] == pytest.approx(m["usd_per_request"] / (w.prompt + w.output) * 1e6)
    parts = m["usd_per_mtok_input"] * w.prompt / 1e6 + m["usd_per_mtok_output"] * w.output / 1e6
    assert parts == pytest.approx(m["usd_per_request"])
    assert m["tokens_per_s_per_user"] == pytest.approx(1.0 / m["tpot_s"])
    assert m["prefill_replicas"] * m["prefill_rho"] == pytest.approx(m["requests_per_s"] * m["prefill_service_s"]
                                                                / (r.pools[0]["dp"] * r.pools[0]["pp"]))
    assert m["ttft_s"] <= 5.0 and m["tpot_s"] <= 0.05


def test_results_evaluated_together_equal_each_evaluated_alone():
    """The reported deployments of a search are evaluated together (`disaggregated_results`: their pools at once,
    then combined at the fluid and at the deployed utilisation); each one's figures equal those of its pair
    evaluated alone, exactly."""
    from dse.catalog.models import get_model
    from dse.optimize.requests import disaggregated_results, disaggregated_tables, ranked_disaggregated
    from dse.optimize.space import SpaceOptions

    w = Request(name="chat", prompt=4000, output=500, tpot_max=0.05, ttft_max=1.0)
    space = build_space(get_model("llama-3.1-70b"), w, SpaceOptions(systems=("h200",), pp=(1,),
                                                                    max_batch_per_rank=128))
    t = disaggregated_tables(space)
    together = ranked_disaggregated(space, t, 4)
    assert len(together) == 4
    pre = t.searched_pre
    for r in together:
        i = next(k for k in range(len(t.dpos)) if int(space.blocks.index[t.dpos[k]]) == r.decode.block
                 and int(t.dn[k]) == r.decode.n)
        j = next(k for k in range(len(pre.pos)) if int(space.blocks.index[pre.pos[k]]) == r.prefill_block
                 and bool(pre.cp[k]) == r.context_parallel)
        (alone,) = disaggregated_results(space, t, [i], [j], [r.result])
        assert alone.metrics == r.metrics and alone.deployed == r.deployed and alone.pools == r.pools
        assert alone.binding == r.binding


def test_an_fp8_kv_cache_crosses_only_between_systems_of_one_encoding():
    """CDNA3 holds an FP8 KV cache as E4M3FNUZ, Hopper as OCP E4M3: their bit patterns differ, so even where mixed
    vendors are allowed (`space.mixed_vendors`) an FP8 prefill pool on MI300X never hands its KV to an H200 decode
    pool (nor the reverse); in BF16 the pools then pair freely, and a cross-system optimum in FP8 keeps both pools
    on one encoding."""
    from dse.catalog.hardware import default_systems
    from dse.catalog.models import get_model
    from dse.optimize.requests import numerics_group
    from dse.optimize.space import SpaceOptions

    catalog = default_systems()
    assert catalog["mi300x"].kv_fp8 == catalog["mi325x"].kv_fp8 == "e4m3fnuz"
    assert catalog["h200"].kv_fp8 == catalog["mi355x"].kv_fp8 == "e4m3fn"
    model = get_model("llama-3.1-8b")
    opts = SpaceOptions(systems=("h200", "mi300x"), weights_dtypes=("fp8",), kv_dtypes=("bf16", "fp8"),
                        kv_tiers=("hbm",), tp=(1,), pp=(1,), max_racks=1, max_chips_per_stage=8,
                        max_batch_per_rank=64, mixed_vendors=True)
    space = build_space(model, Request(name="chat", prompt=4000, output=200), opts)
    b = space.blocks
    sys_id = np.array([space.systems[int(i)].id for i in b["system_idx"]])
    group = numerics_group(space, np.arange(len(b)))
    for kv in ("bf16", "fp8"):
        at = b["kd"] == DTYPES.index(kv)
        same = set(group[at & (sys_id == "h200")]) == set(group[at & (sys_id == "mi300x")])
        assert same == (kv == "bf16"), kv
    fp8 = build_space(model, Request(name="chat", prompt=4000, output=200),
                      SpaceOptions(**{**opts.__dict__, "kv_dtypes": ("fp8",)}))
    r = solve_disaggregated(fp8)
    assert len({catalog[p["system"]].kv_fp8 for p in r.pools}) == 1


def test_pools_stay_on_one_vendor_unless_the_study_mixes_them(tmp_path):
    """On MI325X and GB200, Llama 3.1 8B at 1,000/1,000 tokens is cheapest as MI325X prefill handing its KV cache to
    GB200 decode, which no production serving framework does: by default every search that pairs pools (the
    request-level search, whole deployments, the operating points of the deployment and fleet programs, built per
    system as the fleet builds them) keeps both pools on one vendor (GB200 NVL72 for both: with the CDNA3 factors
    fitted on 66 points and 19 runs an all-MI325X deployment costs 24% more); with `space.mixed_vendors` the
    cross-vendor pair wins. Both answers equal the brute force, which reads the vendors off the catalog itself. A value that is
    not a boolean exits 2 naming the file and field."""
    import yaml
    from typer.testing import CliRunner

    from dse.catalog.hardware import default_systems
    from dse.catalog.models import get_model
    from dse.cli import app
    from dse.optimize.operating_points import operating_points
    from dse.optimize.requests import disaggregated_tables
    from dse.optimize.space import SpaceOptions
    from dse.optimize.whole import Budget, whole_disaggregated

    vendor = {s: v.vendor for s, v in default_systems().items()}
    model = get_model("llama-3.1-8b")
    w = Request(name="chat", prompt=1000, output=1000, tpot_max=0.05, ttft_max=5.0)
    base = SpaceOptions(systems=("mi325x", "gb200-nvl72"), weights_dtypes=("bf16", "fp8"), kv_dtypes=("bf16",),
                        kv_tiers=("hbm",), tp=(1,), pp=(1,), max_racks=1, max_chips_per_stage=8, max_batch_per_rank=128)
    cost = {}
    for mixed in (False, True):
        opts = SpaceOptions(**{**base.__dict__, "mixed_vendors": mixed})
        space = build_space(model, w, opts)
        r = solve_disaggregated(space)
        systems = [p["system"] for p in r.pools]
        assert systems == (["mi325x", "gb200-nvl72"] if mixed else ["gb200-nvl72", "gb200-nvl72"]), (mixed, systems)
        cost[mixed] = r.metrics["usd_per_request"]
        assert cost[mixed] == pytest.approx(brute_force(model, w, opts)[0], rel=1e-9)
        (whole,) = whole_disaggregated(space, disaggregated_tables(space), Budget(gpus=16), None)
        assert len({vendor[p["system"]] for p in whole.pools}) == (2 if mixed else 1)
        # the programs' operating points, one space per system as the fleet builds them
        pts = [operating_points(build_space(model, w, SpaceOptions(**{**opts.__dict__, "systems": (s,)})),
                                ("disaggregated",)) for s in opts.systems]
        amd_prefill = set(pts[0].loc[pts[0]["role"] == "prefill", "group"])
        nvidia_decode = set(pts[1].loc[pts[1]["role"] == "decode", "group"])
        assert bool(amd_prefill & nvidia_decode) == mixed
    assert cost[True] < cost[False] * (1 - 1e-3)

    study = {"study": "vendors", "kind": "cheapest", "description": "d", "expect": "e", "models": ["llama-3.1-8b"],
             "workloads": [{"name": "chat", "prompt": 1000, "output": 1000, "tpot_max_s": 0.05, "ttft_max_s": 5.0}],
             "space": {"systems": ["mi325x", "gb200-nvl72"], "mixed_vendors": "yes"}}
    path = tmp_path / "vendors.yaml"
    path.write_text(yaml.safe_dump(study))
    r = CliRunner().invoke(app, ["run", str(path), "--out", str(tmp_path / "out")])
    assert r.exit_code == 2 and f"{path}: field 'space.mixed_vendors'" in " ".join(r.stderr.split())
    assert not (tmp_path / "out").exists()
