"""Sparsity co-design: the cost-optimal sparsity jumps with the scale-up domain."""

from __future__ import annotations

from dse.optimize.codesign import effective_params, moe_model


def test_effective_size_follows_the_lectures_reading_of_clark():
    # 64x the total parameters is worth 4x the active ones at gamma = 1/3
    m = moe_model(7168, 64)
    assert effective_params(m, 1 / 3) / m.params_active == (m.params_total / m.params_active) ** (1 / 3)
    assert 64 ** (1 / 3) == 4.0 or abs(64 ** (1 / 3) - 4.0) < 1e-12


def test_moe_codesign_study(shipped):
    run = shipped("moe_codesign")
    best = {b["system_domain"]: b for b in run.summary["optimum"]}
    assert best["h200"]["sparsity"] < best["gb200-nvl72"]["sparsity"]  # the jump
    assert best["gb200-nvl72"]["params_total"] > 3 * best["h200"]["params_total"]
    assert best["gb200-nvl72"]["usd_per_mtok"] < best["h200"]["usd_per_mtok"]
    # a domain without a price of the study's kind is left out, not called infeasible
    assert best["rubin-ultra-nvl576"]["status"] == "no_price" and "no price" in best["rubin-ultra-nvl576"]["reason"]
    t = run.table("codesign")
    h200 = t[t["system_domain"] == "h200"]
    assert (h200[h200["sparsity"] >= 16]["status"] == "infeasible").all()  # too big for 8 GPUs' HBM
    assert (run.out / "codesign.png").exists()
