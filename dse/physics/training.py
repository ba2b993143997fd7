"""Training-step physics: one optimizer step of a (TP x PP x DP x CP) layout, with pipeline
bubbles, activation memory (with and without recomputation), optimizer-state sharding and the
tensor-, pipeline- and data-parallel communication.

Sources of the formulas: 6N FLOPs per token (forward 2N, backward 4N), 8N with full activation
recomputation (Narayanan et al. 2021, Megatron-LM); the 1F1B pipeline bubble (PP - 1) / (v m + PP - 1)
with m micro-batches and v interleaved stages per device (ibid.); activation bytes per layer
s b h (34 + 5 a s / h) with sequence parallelism dividing by TP, 34 s b h / TP with selective
recomputation and 2 s b h (the layer input) with full recomputation (Korthikanti et al. 2022);
reversible layers keep only the stage boundary and recompute like full recomputation (Gomez et
al. 2017, RevNets); MoE experts shard over EP with an all-to-all per MoE layer;
mixed-precision Adam keeps 2 + 2 + 12 bytes per parameter (weights, gradients, fp32 master and two
moments), the 12 sharded over DP with ZeRO-1 (Rajbhandari et al. 2020).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from dse.catalog.hardware import IDEAL, Efficiency, System, efficiency_for
from dse.catalog.models import Architecture
from dse.errors import InputError
from dse.physics.roofline import dispatch_copies

ACT = 2.0  # bf16 activations and gradients


@dataclass(frozen=True)
class TrainLayout:
    """One training configuration."""

    tp: int
    pp: int
    dp: int
    cp: int = 1
    ep: int = 1  # expert parallelism (MoE): experts sharded over ep of the DP x TP chips of a stage
    micro_batch: int = 1  # sequences per micro-batch
    interleave: int = 1  # virtual pipeline stages per device
    recompute: str = "full"  # none | selective | full | reversible
    zero: int = 1  # 0: optimizer states replicated; 1: sharded over DP
    gemm_dtype: str = "bf16"  # bf16 | fp8: the format of the linear layers' GEMMs (forward, dgrad, wgrad)

    @property
    def chips(self) -> int:
        return self.tp * self.pp * self.dp * self.cp


def train_step(model: Architecture, system: System, lay: TrainLayout, global_batch: int, seq: int,
               eff: Efficiency | None = None, ideal: bool = False) -> dict:
    """Time of one optimizer step of ``global_batch`` sequences of ``seq`` tokens, memory per chip, MFU."""
    eff = IDEAL if ideal else (eff or efficiency_for(system.id))
    d, layers, heads = model.spec.d_model, model.spec.n_layers, model.spec.attention.n_heads
    tokens = global_batch * seq
    m = global_batch / (lay.dp * lay.micro_batch)  # micro-batches per pipeline per step
    n_act = model.params_active
    attn_fwd = model.attention_flops_per_token(seq, "prefill")
    model_flops = tokens * (6.0 * n_act + 3.0 * attn_fwd)
    # full recomputation and reversible layers (which rebuild each layer's input from its output,
    # Gomez et al. 2017) both run the forward pass again in the backward pass
    extra = {"full": 2.0 * n_act + attn_fwd, "reversible": 2.0 * n_act + attn_fwd, "selective": attn_fwd,
             "none": 0.0}[lay.recompute]
    hw_flops = model_flops + tokens * extra
    peak = system.flops["bf16"]
    # FP8 training (DeepSeek-V3's recipe): the linear layers' GEMMs run at the FP8 rate, attention's
    # score and value products (and everything else) in BF16; MFU stays against the BF16 peak
    if lay.gemm_dtype not in ("bf16", "fp8"):
        raise InputError(f"training GEMM format {lay.gemm_dtype!r}: allowed bf16, fp8")
    if lay.gemm_dtype == "fp8" and not system.is_native("fp8"):
        raise InputError(f"training GEMM format 'fp8': '{system.id}' has no FP8 tensor units (it computes in "
                         f"{', '.join(system.native_dtypes)})")
    attn_flops = tokens * 3.0 * attn_fwd * (1.0 + {"full": 1 / 3, "reversible": 1 / 3, "selective": 1 / 3,
                                                   "none": 0.0}[lay.recompute])
    gemm_rate = system.flops[lay.gemm_dtype]
    compute_s = ((hw_flops - attn_flops) / gemm_rate + attn_flops / peak) / (lay.chips * eff.compute_train)
    bubble = (lay.pp - 1) / (lay.interleave * m + lay.pp - 1) if lay.pp > 1 else 0.0

    domain = system.scaleup_domain
    if lay.chips > domain and math.isnan(system.scaleout_bandwidth):
        raise InputError(
            f"training layout of {lay.chips} chips spans more than one {domain}-chip domain of '{system.id}', "
            "whose scale-out (DCN) bandwidth the catalog does not know; use at most "
            f"{domain} chips or a system with a scale-out figure"
        )
    su, so = system.scaleup_bandwidth * eff.link, system.scaleout_bandwidth * eff.link
    s_local = seq / lay.cp
    # TP: with sequence parallelism, 4 all-gather/reduce-scatter pairs per layer forward and backward
    # (+2 with full recompute), each moving (TP-1)/TP of the micro-batch activations
    passes = 4 + (2 if lay.recompute == "full" else 0)
    msg = lay.micro_batch * s_local * d * ACT
    tp_bw = su if lay.tp <= domain else so
    tp_s = (m * layers / lay.pp * passes * (lay.tp - 1) / lay.tp * msg / tp_bw + m * layers / lay.pp * passes
            * eff.latency_scaleup) if lay.tp > 1 else 0.0
    # PP: each micro-batch crosses each stage boundary forward and backward
    pp_bw = su if lay.tp * lay.pp <= domain else so
    pp_s = (2 * m * lay.interleave * msg / lay.tp / pp_bw) if lay.pp > 1 else 0.0
    # DP (and CP) gradient reduce-scatter + all-gather of bf16 gradients, mostly hidden behind backward
    grad_bytes = ACT * model.params_total / (lay.tp * lay.pp)
    group = lay.dp * lay.cp
    dp_bw = su if lay.chips <= domain else so
    dp_s = 2.0 * (group - 1) / group * grad_bytes / dp_bw if group > 1 else 0.0
    # CP: the KV of each layer is all-gathered around the CP ring, forward and backward
    kv = model.kv_bytes_per_token("bf16") / layers * s_local * lay.micro_batch
    cp_s = (m * layers / lay.pp * 2 * (lay.cp - 1) * kv / (su if lay.chips <= domain else so)) if lay.cp > 1 else 0.0
    # EP: dispatch and combine of every routed token, forward and backward (and the recomputed forward), over
    # the EP group of ep x TP chips (each expert TP-sharded over TP chips), one copy per destination chip and
    # domain as in serving (`dispatch_copies`)
    ep_s = 0.0
    if model.is_moe and lay.ep > 1:
        group = lay.ep * lay.tp
        up, out = dispatch_copies(model.spec.ffn.n_experts, model.spec.ffn.top_k, lay.ep, lay.tp, lay.tp, group, domain)
        token = lay.micro_batch * s_local / lay.tp * d * ACT * 2  # dispatch and combine of the chip's share
        a2a_s = max(token * float(up) / su, token * float(out) / so if out > 0 else 0.0)
        latency = eff.latency_scaleup if group <= domain else eff.latency_scaleout
        ep_s = m * model.moe_layers / lay.pp * (passes / 2) * (a2a_s + 2 * latency)
    exposed = (1.0 - eff.overlap) * (tp_s + pp_s + cp_s + ep_s) + (1.0 - eff.overlap) * dp_s
    step_s = compute_s / (1.0 - bubble) + exposed

    # memory per chip: dense weights over TP x PP, routed experts also over EP
    params_chip = (model.params_dense + model.params_routed / lay.ep) / (lay.tp * lay.pp)
    weights = 2.0 * params_chip
    grads = 2.0 * params_chip
    replicas = lay.dp * lay.cp / (lay.ep if model.is_moe else 1)  # copies of each expert shard
    optim = 12.0 * params_chip / (max(replicas, 1.0) if lay.zero else 1)
    b, s = lay.micro_batch, s_local
    per_layer = {
        "none": s * b * d * (34 + 5 * heads * s / d) / lay.tp,
        "selective": 34 * s * b * d / lay.tp,
        "full": 2 * s * b * d / lay.tp,
        "reversible": 0.0,  # rebuilt from the next layer's output: only the stage's boundary is kept
    }[lay.recompute]
    in_flight = min(lay.pp, math.ceil(m))  # 1F1B: the first stage holds PP micro-batches
    activations = per_layer * layers / lay.pp * in_flight
    if lay.recompute == "reversible":
        activations = 2 * s * b * d / lay.tp * in_flight
    if lay.recompute in ("full", "reversible"):  # one layer's full activations are rebuilt at a time
        activations += s * b * d * (34 + 5 * heads * s / d) / lay.tp
    hbm = weights + grads + optim + activations
    usable = system.hbm_capacity * eff.hbm_usable
    return {
        "chips": lay.chips, "step_s": step_s, "compute_s": compute_s, "bubble": bubble, "tp_s": tp_s, "pp_s": pp_s,
        "dp_s": dp_s, "cp_s": cp_s, "ep_s": ep_s, "model_flops": model_flops, "hardware_flops": hw_flops,
        "mfu": model_flops / (step_s * lay.chips * peak), "tokens_per_s": tokens / step_s,
        "hbm_bytes_per_chip": hbm, "weights_bytes_per_chip": weights, "optimizer_bytes_per_chip": optim,
        "activation_bytes_per_chip": activations, "fits": hbm <= usable,
        "usd_per_mtok": lay.chips * system.price_per_s * step_s / tokens * 1e6,
    }
