"""Sparsity co-design: the number of experts and the active size that serve a fixed quality cheapest.

Quality of a routed model: an effective dense size N_eff = N_active x S^gamma, with S = total / active
parameters (the bilinear log law of Clark et al. 2022 reduced to its slope at fixed active size).
gamma = 1/3 encodes the lecture's reading of that paper (64x the total parameters is worth 4x the
active ones); DeepSeekMoE's 16.4B total / 2.8B active matching a 7B dense model gives gamma ~ 0.52
(`moe_equivalence_deepseekmoe`). For each sparsity, the smallest DeepSeek-shaped MoE that reaches
N_eff is served on one scale-up domain per replica (weights and KV must fit in its HBM), priced per request
with its prefill, aggregated or disaggregated (`dse.optimize.requests.solve_cheapest`).
"""

from __future__ import annotations

import math

from dse.catalog.models import Architecture, ModelSpec
from dse.errors import InfeasibleError
from dse.optimize.requests import solve_cheapest
from dse.optimize.space import SpaceOptions, build_space
from dse.physics.serving import Request

TOP_K = 8


def moe_model(d: int, sparsity: int, top_k: int = TOP_K) -> Architecture:
    """DeepSeek-V3-shaped: 61 layers (3 dense), MLA, 1 shared + ``top_k`` routed of ``top_k`` x sparsity experts
    (sparsity 1: dense, of the same width).
    """
    heads = max(8, round(d / 56 / 8) * 8)
    expert_ff = max(256, round(d * 2 / 7 / 128) * 128)
    ffn = {"kind": "dense", "d_ff": 4 * expert_ff * 9 // 4} if sparsity == 1 else {
        "kind": "moe", "n_experts": top_k * sparsity, "top_k": top_k, "n_shared": 1, "d_ff_expert": expert_ff,
        "dense_layers": 3, "d_ff_dense": round(d * 18 / 7 / 128) * 128}
    routed = top_k != TOP_K and sparsity > 1
    return Architecture(ModelSpec.model_validate({
        "id": f"moe-d{d}-s{sparsity}" + (f"-k{top_k}" if routed else ""),
        "name": f"MoE d={d} sparsity {sparsity}" + (f" top-{top_k}" if routed else ""), "d_model": d, "n_layers": 61,
        "vocab": 129280,
        "source": {"title": "DeepSeek-V3-shaped family of dse.optimize.codesign", "date": "2026-11-22"},
        "published_b": {"total": 1, "active": 1, "precision_total": 1e9, "precision_active": 1e9, "source": "n/a"},
        "attention": {"kind": "mla", "n_heads": heads, "q_lora_rank": 1536, "kv_lora_rank": 512,
                      "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128},
        "ffn": ffn,
    }))


def effective_params(model: Architecture, gamma: float) -> float:
    return model.params_active * (model.params_total / model.params_active) ** gamma


def smallest_reaching(n_eff: float, sparsity: int, gamma: float) -> Architecture | None:
    for d in range(1024, 49153, 512):
        m = moe_model(d, sparsity)
        if effective_params(m, gamma) >= n_eff:
            return m
    return None


def codesign_point(n_eff: float, sparsity: int, gamma: float, workload: Request, opts: SpaceOptions,
                   solver: str = "highs") -> dict:
    """The serving optimum of the smallest model of this sparsity that reaches the quality."""
    m = smallest_reaching(n_eff, sparsity, gamma)
    row = {"sparsity": sparsity, "experts": TOP_K * sparsity if sparsity > 1 else 0}
    if m is None:
        return {**row, "status": "infeasible", "reason": "no model of the family reaches the quality",
                "usd_per_mtok": math.inf}
    row.update(model=m.id, params_total=m.params_total, params_active=m.params_active,
               effective_params=effective_params(m, gamma))
    space = build_space(m, workload, opts)
    try:
        mode, r = solve_cheapest(space)  # USD per request with its prefill, aggregated or disaggregated
    except InfeasibleError as exc:
        return {**row, "status": "infeasible", "reason": str(exc), "usd_per_mtok": math.inf}
    choice = r.choice if mode == "aggregated" else r.decode
    b = space.blocks.loc(choice.block)
    return {**row, "status": r.result.status, "reason": "", "serving": mode,
            "usd_per_mtok": r.metrics["usd_per_request"] / workload.output * 1e6, "tpot_s": r.metrics["tpot_s"],
            "ttft_s": r.metrics["ttft_s"], "prefill_share": r.metrics["prefill_share"],
            "chips": int(b["chips"]), "system": b["system"], "batch": int(b["dp"]) * choice.n}
