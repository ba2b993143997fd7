"""Properties that must hold for every configuration, on inputs generated valid by construction."""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dse.catalog.hardware import IDEAL, default_systems, efficiency_for
from dse.catalog.models import default_models
from dse.physics.layout import check_layout, divisors, layouts_for, resolve_layout
from dse.physics.roofline import Candidates, ModelTable, SystemTable, evaluate

MODELS = list(default_models().values())
SYSTEMS = [s for s in default_systems().values() if s.price_per_s == s.price_per_s]  # priced at the default kind
MT = ModelTable.build(MODELS)
STAGES = (1, 2, 4, 8, 16, 32, 64, 72, 128, 144)


@st.composite
def configs(draw):
    mi = draw(st.integers(0, len(MODELS) - 1))
    model = MODELS[mi]
    cps = draw(st.sampled_from(STAGES))
    layouts = list(layouts_for(model, cps, pps=(1, 2, 4)))
    layout = draw(st.sampled_from(layouts))
    return {
        "model": mi,
        "system": draw(st.integers(0, len(SYSTEMS) - 1)),
        "layout": layout,
        "batch": draw(st.integers(1, 8192)),
        "context": draw(st.integers(1, 2_000_000)),
        "phase": draw(st.integers(0, 1)),
        "weights": draw(st.integers(0, 2)),
        "kv": draw(st.integers(0, 2)),
        "ideal": draw(st.booleans()),
    }


def _eval(cfg, systems, batch=None):
    lay = cfg["layout"]
    cand = Candidates(
        model=cfg["model"], system=cfg["system"], tp=lay.tp, dp=lay.dp, ep=lay.ep, etp=lay.etp, pp=lay.pp,
        batch=cfg["batch"] if batch is None else batch, context=cfg["context"], phase=cfg["phase"],
        weights_dtype=cfg["weights"], kv_dtype=cfg["kv"], kv_tier=0,
    )
    eff = IDEAL if cfg["ideal"] else None
    table = SystemTable.build(systems, [efficiency_for(s.id) for s in SYSTEMS])
    return {k: v.item() for k, v in evaluate(cand, MT, table, eff).items()}


FIELDS = ("hbm_bandwidth", "scaleup_bandwidth", "scaleout_bandwidth", "host_offload_bandwidth", "flops")


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cfg=configs(), field=st.sampled_from(FIELDS), factor=st.floats(1.0, 8.0))
def test_more_bandwidth_or_flops_never_raises_step_time(cfg, field, factor):
    base = _eval(cfg, SYSTEMS)
    faster = [s.scaled(**{field: factor}) if i == cfg["system"] else s for i, s in enumerate(SYSTEMS)]
    better = _eval(cfg, faster)
    assert better["step_s"] <= base["step_s"] * (1 + 1e-12)
    assert better["usd_per_mtok"] <= base["usd_per_mtok"] * (1 + 1e-12)


@settings(max_examples=300, deadline=None)
@given(cfg=configs(), scale=st.integers(1, 64))
def test_larger_batch_never_lowers_cost_below_the_compute_floor(cfg, scale):
    system = SYSTEMS[cfg["system"]]
    model = MODELS[cfg["model"]]
    eff = IDEAL if cfg["ideal"] else efficiency_for(system.id)
    rate = MT_rate(system, cfg["weights"]) * (eff.compute_prefill if cfg["phase"] else eff.compute_decode)
    floor = system.price_per_s * 2 * model.params_active / rate * 1e6  # USD per million tokens
    for batch in (cfg["batch"], cfg["batch"] * scale):
        r = _eval(cfg, SYSTEMS, batch=batch)
        assert r["usd_per_mtok"] >= floor * (1 - 1e-9)


def MT_rate(system, weights_code):
    return SystemTable.build([system]).flops[0, weights_code]


@settings(max_examples=200, deadline=None)
@given(mi=st.integers(0, len(MODELS) - 1), cps=st.sampled_from(STAGES + (6, 12, 24, 96, 288)), pp=st.sampled_from((1, 2, 3, 4)))
def test_layouts_generated_by_construction_satisfy_the_layout_rule(mi, cps, pp):
    model = MODELS[mi]
    layouts = list(layouts_for(model, cps, pps=(pp,)))
    assert layouts, "tp=1, ep=1 is always a layout"
    for lay in layouts:
        assert lay.tp * lay.dp == lay.ep * lay.etp == cps
        assert lay.chips == cps * pp
        check_layout(model, lay)
        again = resolve_layout(model, tp=lay.tp, ep=lay.ep, pp=lay.pp, dp=lay.dp, etp=lay.etp)
        assert again == lay
        assert resolve_layout(model, tp=lay.tp, ep=lay.ep, pp=lay.pp, chips=lay.chips) == lay


def test_layouts_for_covers_every_factor_pair():
    model = default_models()["deepseek-v3"]
    got = {(lay.tp, lay.ep) for lay in layouts_for(model, 72)}
    want = {(tp, ep) for tp in divisors(72) for ep in divisors(72) if 128 % tp == 0}
    assert got == want


def test_vectorized_equals_one_at_a_time():
    rng = np.random.default_rng(1)
    n = 200
    rows = [(i, lay) for i, m in enumerate(MODELS) for lay in layouts_for(m, 8, pps=(1, 2))]
    pick = [rows[k] for k in rng.integers(0, len(rows), n)]
    cand = Candidates(
        model=np.array([p[0] for p in pick]), system=rng.integers(0, len(SYSTEMS), n),
        tp=np.array([p[1].tp for p in pick]), dp=np.array([p[1].dp for p in pick]),
        ep=np.array([p[1].ep for p in pick]), etp=np.array([p[1].etp for p in pick]),
        pp=np.array([p[1].pp for p in pick]), batch=rng.integers(1, 4096, n), context=rng.integers(1, 10**6, n),
        phase=rng.integers(0, 2, n), weights_dtype=rng.integers(0, 3, n), kv_dtype=rng.integers(0, 3, n), kv_tier=0,
    )
    st_ = SystemTable.build(SYSTEMS)
    eff = None
    batch_out = evaluate(cand, MT, st_, eff)
    for i in range(0, n, 17):
        one = Candidates(*(np.asarray(getattr(cand.broadcast(), f))[i] for f in cand.__dataclass_fields__))
        single = evaluate(one, MT, st_, eff)
        for key, value in single.items():
            np.testing.assert_allclose(batch_out[key][i], value, rtol=1e-12, err_msg=key)
