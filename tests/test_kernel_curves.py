"""Per-kernel efficiency curves: a GEMM's achieved rate over its rows and decode attention's over its context,
as half-performance lengths (Hockney's n_1/2: n units of work at asymptotic rate r take (n + n_1/2) / r)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from helpers import run

from dse.catalog.hardware import CURVES, IDEAL, default_efficiency_catalog
from dse.physics.layout import Layout
from dse.physics.serving import Request, _decode_step

TP8 = Layout(tp=8, dp=1, ep=1, etp=8, pp=1)
EP8 = Layout(tp=8, dp=1, ep=8, etp=1, pp=1)


def test_a_gemm_of_m_rows_takes_the_time_of_m_plus_half_rows(models, systems):
    """A dense model's decode pass: every weight matrix multiplied costs n_1/2 rows more, at any batch; at
    m = n_1/2 rows its GEMMs run at half the asymptotic rate."""
    m, h200 = models["llama-3.1-70b"], systems["h200"]
    n = 64.0
    per_row = 2.0 * m.params_active / (8 * h200.flops["fp8"])  # one row through every GEMM of a TP8 rank
    for batch in (1, 8, 64, 512):
        base = run(m, h200, TP8, batch, 4096, weights="fp8", kv="fp8")
        curved = run(m, h200, TP8, batch, 4096, weights="fp8", kv="fp8", eff=replace(IDEAL, gemm_half_rows=n))
        assert curved["compute_s"] - base["compute_s"] == pytest.approx(n * per_row, rel=1e-12)
        assert curved["gemm_fixed_s"] == pytest.approx(n * per_row, rel=1e-12)
        assert base["gemm_fixed_s"] == 0.0
        assert curved["memory_s"] == base["memory_s"] and curved["comm_s"] == base["comm_s"]
        gemm = base["compute_s"] - base["attention_flops_per_step"] / (8 * h200.flops["fp8"])
        assert gemm == pytest.approx(batch * per_row, rel=1e-12)  # the roofline's GEMM time, m rows
        assert (gemm + n * per_row) / gemm == pytest.approx((batch + n) / batch, rel=1e-12)
        if batch == n:  # half the asymptotic rate
            assert gemm / (gemm + n * per_row) == pytest.approx(0.5, rel=1e-12)


def test_each_routed_expert_multiplied_costs_half_rows_once(models, systems):
    """MoE: the busiest chip pays n_1/2 rows for each expert it multiplies; once every expert has a token,
    that is all of its experts in every MoE layer, and at batch 1 only those a token lands on."""
    m, h200 = models["deepseek-v3"], systems["h200"]
    n = 32.0
    f = m.spec.ffn
    dense = 2.0 * (m.params_active - m.moe_layers * f.top_k * m.expert_params) / (8 * h200.flops["fp8"])
    all_experts = 2.0 * m.moe_layers * (f.n_experts / 8) * m.expert_params / h200.flops["fp8"]
    fixed = {b: run(m, h200, EP8, b, 2048, weights="fp8", kv="fp8",
                    eff=replace(IDEAL, gemm_half_rows=n))["gemm_fixed_s"] for b in (1, 4, 4096)}
    assert fixed[4096] == pytest.approx(n * (dense + all_experts), rel=1e-9)
    # batch 1: the 8 routed experts of one token, at most all 8 on the busiest chip, at least 1
    one_expert = all_experts / (f.n_experts / 8)
    assert n * (dense + one_expert) <= fixed[1] <= n * (dense + f.top_k * one_expert)
    assert fixed[1] < fixed[4] < fixed[4096]


def test_attention_reads_half_context_tokens_more_per_sequence_and_layer(models, systems):
    """Decode attention at context L reads the KV of L + n_1/2 tokens per sequence and layer: for a model of
    full-attention layers only, the pass of a context L + n_1/2 under the roofline; the KV held is unchanged."""
    m, h200 = models["llama-3.1-70b"], systems["h200"]
    n = 1500.0
    for batch, ctx in ((1, 1000), (32, 8000), (128, 2048)):
        curved = run(m, h200, TP8, batch, ctx, kv="fp8", eff=replace(IDEAL, attention_half_context=n))
        longer = run(m, h200, TP8, batch, ctx + n, kv="fp8")
        assert curved["memory_s"] == pytest.approx(longer["memory_s"], rel=1e-12)
        assert curved["kv_bytes_per_chip"] == run(m, h200, TP8, batch, ctx, kv="fp8")["kv_bytes_per_chip"]
    pre = run(m, h200, TP8, 1, 4096, phase="prefill", eff=replace(IDEAL, attention_half_context=n))
    assert pre["memory_s"] == run(m, h200, TP8, 1, 4096, phase="prefill")["memory_s"]  # decode attention only


def test_a_verify_pass_pays_the_half_rows_once():
    """Speculative decoding verifies k + 1 tokens per sequence in one pass: its rows scale by k + 1, the
    GEMMs' half-performance share does not (the draft tokens are rows of the same GEMMs)."""
    mean = {k: np.array([v]) for k, v in {"compute_s": 10e-3, "gemm_fixed_s": 4e-3, "memory_s": 0.0, "comm_s": 0.0,
                                           "overhead_s": 0.0, "overlap": 0.0, "attention_compute_s": 0.0,
                                           "kv_memory_s": 0.0, "kernel_overlap": 1.0}.items()}
    step = _decode_step(mean, Request(prompt=1000, output=100, draft=2, accept=2.0))
    assert step[0] == pytest.approx(3 * 6e-3 + 4e-3, rel=1e-12)


def test_the_fitted_curves_are_physical_where_runs_measure_them():
    """Fitted on the measured serving runs, each family's lengths are of kernel scale (a GEMM reaches half its
    rate between 1 and 512 rows, decode attention below 8,192 tokens of context: with a pass costed by its kernel
    groups, attention's own roofline carries most of what the curve carried, and Hopper's fit puts it at 0);
    families without runs in three sweeps or more keep the roofline's 0 (no size dependence), and the asymptotic
    shares stay at most 1."""
    cat = default_efficiency_catalog()
    for fam in ("hopper", "blackwell", "cdna3"):
        e = cat.families[fam]
        assert 1.0 < e.gemm_half_rows < 512.0, fam
        assert 0.0 <= e.attention_half_context < 8192.0, fam
        assert 0 < e.compute_decode <= 1 and 0 < e.memory <= 1
    assert cat.families["cdna3"].attention_half_context > 10.0
    for fam in ("cdna4", "tpu"):
        assert all(getattr(cat.families[fam], k) == 0.0 for k in CURVES), fam
    assert all(getattr(cat.default, k) == 0.0 for k in CURVES)
