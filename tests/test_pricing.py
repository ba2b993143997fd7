"""API pricing: the inverse reading of price sheets and forward tier prices."""

from __future__ import annotations

from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent


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
    assert (fwd["status"] == "optimal").all()
    # the request level: each context's optimum split into input and output as the physics splits a request's cost
    parts = (fwd["usd_per_mtok_input"] * (fwd["context"] - 500) + fwd["usd_per_mtok_output"] * 500) / 1e6
    assert np.allclose(parts, fwd["usd_per_request"], rtol=1e-9)
    # past both models' 128K window: flagged in every table, as the study opted in to
    assert (fwd["beyond_trained_context"] == (fwd["context"] > 131_072)).all()
    growth = {}
    for model, g in fwd.groupby("model"):
        g = g.sort_values("context")
        assert (np.diff(g["usd_per_request"]) > 0).all()  # a longer prompt never costs less to serve
        # per token, both prices rise with the context once attention and KV reads outgrow the weights
        assert (np.diff(g["usd_per_mtok_input"]) > 0).all() and (np.diff(g["usd_per_mtok_output"]) > 0).all()
        growth[model] = g["usd_per_mtok_output"].iloc[-1] / g["usd_per_mtok_output"].iloc[0]
    assert growth["deepseek-v3.2"] < growth["llama-3.1-70b"]  # sparse attention flattens the curve
    tiers = run.table("pricing_tiers")
    assert tiers["beyond_trained_context"].all()  # each tier reaches past 131,072 tokens
    for model, g in tiers.groupby("model"):
        inside = fwd[fwd["model"] == model]
        for kind in ("input", "output"):
            assert g[f"price_{kind}_usd_per_mtok"].is_monotonic_increasing
            for _, t in g.iterrows():
                cost = inside[(inside["context"] > t["tier_from"]) & (inside["context"] <= t["tier_to"])]
                assert (t[f"price_{kind}_usd_per_mtok"] >= cost[f"usd_per_mtok_{kind}"]).all()  # every tier pays


def test_forward_contexts_past_the_trained_window_need_the_opt_in(tmp_path):
    """A forward context longer than a model's published window is refused (exit 2, the field named) unless the
    study opts in, as a workload's is."""
    import yaml
    from helpers import dse

    doc = yaml.safe_load((ROOT / "studies" / "api_pricing.yaml").read_text())
    doc.pop("allow_beyond_trained_context")
    path = tmp_path / "study.yaml"
    path.write_text(yaml.safe_dump(doc))
    r = dse("run", str(path), "--out", str(tmp_path / "out"))
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "field 'pricing.contexts.3' for model 'deepseek-v3.2': 200,000 tokens is beyond the published maximum" \
        in " ".join(r.stderr.split())
    assert not (tmp_path / "out").exists()
