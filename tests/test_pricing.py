"""API pricing: the inverse reading of price sheets and forward tier prices."""

from __future__ import annotations

import numpy as np


def test_api_pricing_study(shipped):
    run = shipped("api_pricing")
    inv = run.table("pricing_inverse")
    at100 = inv[(inv["params_active"] == 1e11)]
    assert ((at100["kv_bytes_per_token"] > 1.5e3) & (at100["kv_bytes_per_token"] < 2.1e3)).all()  # ~1.7 KB
    assert set(inv["decode_over_prefill"]) == {8.0, 6.0}
    assert inv["working"].str.contains("B/token").all()
    ok = run.table("pricing_consistent")
    ok100 = ok[(ok["params_active"] == 1e11) & (ok["sheet"] == "gemini-2.5-pro")]
    assert ((ok100["crossover_context"] - 2e5).abs() <= 5e4).all() and len(ok100) >= 1
    # the lecture's reading: 8 KV heads of 128 in FP8 fits a 100B-active model with cross-layer sharing
    assert ((ok100["kv_heads"] == 8) & (ok100["kv_dtype"] == "fp8")).any()
    fwd = run.table("pricing_forward")
    growth = {}
    for model, g in fwd.groupby("model"):
        g = g.sort_values("context")
        assert (np.diff(g["usd_per_mtok"]) >= -1e-12).all()  # longer context never costs less per token
        growth[model] = g["usd_per_mtok"].iloc[-1] / g["usd_per_mtok"].iloc[0]
    assert growth["deepseek-v3.2"] < growth["llama-3.1-70b"]  # sparse attention flattens the curve
    tiers = run.table("pricing_tiers")
    for model, g in tiers.groupby("model"):
        assert g["price_usd_per_mtok"].is_monotonic_increasing
        inside = fwd[fwd["model"] == model]
        for _, t in g.iterrows():
            cost = inside[(inside["context"] > t["tier_from"]) & (inside["context"] <= t["tier_to"])]["usd_per_mtok"]
            assert (t["price_usd_per_mtok"] >= cost).all()  # every tier stays profitable
