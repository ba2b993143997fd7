"""A pass costed by its kernel groups (`dse.physics.roofline.kernel_work`): the weight GEMMs (FLOPs against weight
bytes) and attention (FLOPs against KV bytes) run one after the other, so the work of a pass is
k max(C, M) + (1 - k) (max(C_gemm, M_gemm) + max(C_attn, M_attn)), k the efficiency factor ``kernel_overlap``."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from helpers import run

from dse.catalog.hardware import IDEAL, default_efficiency_catalog
from dse.catalog.units import DTYPES
from dse.physics.codes import KV_TIERS, PHASES
from dse.physics.layout import Layout
from dse.physics.roofline import Candidates, ModelTable, SystemTable, evaluate_at
from dse.physics.serving import Request, aggregated

TP1 = Layout(tp=1, dp=1, ep=1, etp=1, pp=1)


def test_the_blended_step_is_the_single_roofline_at_one_and_the_kernel_groups_sum_at_zero(models, systems):
    """Llama 3.1 8B on one H200 (no communication, no overhead under the ideal factors): at k = 1 the step is
    max(compute, memory), the lecture's roofline; at k = 0 it is the GEMMs' roofline plus attention's, the latter
    from the attention FLOPs at the FP8 rate and the KV bytes at the HBM bandwidth (a pass of full-attention
    layers reads every KV byte it holds); between, the straight line of k, so never longer as k grows."""
    m, h200 = models["llama-3.1-8b"], systems["h200"]
    ks = np.linspace(0.0, 1.0, 11)
    for batch, ctx in ((1, 1000), (64, 2250), (518, 2250), (256, 8000), (4, 120000)):
        one = run(m, h200, TP1, batch, ctx, weights="fp8", kv="fp8")
        c, mem = one["compute_s"], one["memory_s"]
        assert one["step_s"] == max(c, mem)  # IDEAL: k = 1, to the bit
        c_attn = one["attention_flops_per_step"] / h200.flops["fp8"]
        m_kv = one["kv_bytes_per_chip"] / h200.hbm_bandwidth
        apart = max(c - c_attn, mem - m_kv) + max(c_attn, m_kv)
        steps = []
        for k in ks:
            r = run(m, h200, TP1, batch, ctx, weights="fp8", kv="fp8", eff=replace(IDEAL, kernel_overlap=k))
            assert (r["compute_s"], r["memory_s"]) == (c, mem)  # k moves how the times combine, not the times
            steps.append(r["step_s"])
        assert steps[0] == pytest.approx(apart, rel=1e-12)
        assert steps[-1] == max(c, mem)
        assert np.allclose(steps, ks * max(c, mem) + (1.0 - ks) * apart, rtol=1e-12, atol=0.0)
        assert all(a >= b * (1 - 1e-15) for a, b in zip(steps, steps[1:], strict=False))  # non-increasing in k (to rounding)
    # a memory-bound decode pass at large batch and long context: its GEMMs do not hide under the KV reads
    big = run(m, h200, TP1, 518, 2250, weights="fp8", kv="fp8", eff=replace(IDEAL, kernel_overlap=0.0))
    assert big["step_s"] > big["memory_s"] > big["compute_s"]


def _grid() -> tuple[Candidates, dict]:
    """Aggregated replicas of Llama 3.1 8B and 70B on H100 and H200 (PP 1), TP 1 to 8, DP 1 and 2, batch 8 to 1024
    sequences, FP8 weights and KV."""
    rows = [(mi, si, tp, dp, b) for mi in (0, 1) for si in (0, 1) for tp in (1, 2, 4, 8) for dp in (1, 2)
            for b in (8, 64, 256, 1024) if not (mi == 1 and tp < 4)]
    mi, si, tp, dp, b = (np.array(c, dtype=np.float64) for c in zip(*rows, strict=True))
    n = len(rows)
    cand = Candidates(model=mi.astype(np.int64), system=si.astype(np.int64), tp=tp, dp=dp, ep=np.ones(n), etp=tp,
                      pp=np.ones(n), batch=b * dp, context=np.full(n, 2500.0),
                      phase=np.full(n, PHASES.index("decode")), weights_dtype=np.full(n, DTYPES.index("fp8")),
                      kv_dtype=np.full(n, DTYPES.index("fp8")), kv_tier=np.full(n, KV_TIERS.index("hbm")))
    return cand, {"tp": tp}


@pytest.mark.parametrize("prompt", [2000, 12000])
def test_a_prompt_pays_at_least_its_gemm_compute_where_the_decode_gemms_are_compute_bound(models, systems, prompt):
    """The input share u of an aggregated replica's GPU time is at least (1 - k) x its prompt's GEMM compute time
    over the request's GPU time (the prompt's GEMM FLOPs, 2 P (active - embedding parameters) per token, at the
    chip's FP8 peak times the prefill compute share, on the TP chips of its rank while all chips of the replica
    wait: u >= (1 - k) G lambda) wherever the decode pass's weight GEMMs are compute-bound, so a chunk's rows
    cannot ride on the weight stream: at k = 0 the whole of it. A single roofline (k = 1) prices such prompts
    near zero where the decode pass is memory-bound."""
    ms = [models["llama-3.1-8b"], models["llama-3.1-70b"]]
    ss = [systems["h100"], systems["h200"]]
    mt, st = ModelTable.build(ms), SystemTable.build(ss)
    cand, cols = _grid()
    req = Request(prompt=prompt, output=500)
    hopper = default_efficiency_catalog().for_system("h200")
    for k in (0.0, 0.5, hopper.kernel_overlap):
        eff = replace(hopper, kernel_overlap=k)
        out = aggregated(cand, mt, st, req, eff)
        mean = evaluate_at(cand, mt, st, eff, [{"context": prompt + 250.0, "phase": 0}])[0]
        gemm_c = mean["compute_s"] - mean["attention_compute_s"]
        gemm_m = mean["memory_s"] - mean["kv_memory_s"]
        params = np.array([m.params_active - m.params_embedding for m in ms])[cand.model]
        peak = np.array([s.flops["fp8"] for s in ss])[cand.system]
        g = 2.0 * prompt * params / (cols["tp"] * peak * eff.compute_prefill)
        chosen = (gemm_c >= gemm_m) & out["stable"] & out["fits"]
        assert chosen.sum() >= 10
        u, lam = out["prefill_share"][chosen], out["requests_per_s"][chosen]
        assert np.all(u >= (1.0 - k) * g[chosen] * lam * (1 - 1e-9))
    single = aggregated(cand, mt, st, req, replace(hopper, kernel_overlap=1.0))
    low = single["prefill_share"] < g * single["requests_per_s"] / 2
    assert low.any()  # what the single roofline gets wrong
