"""Per-layer roofline times of one pipeline stage's work, for partitioning layers into stages.

Each layer's decode time for a micro-batch on the chips of one stage is the roofline max of its
compute (2 x its active weights per token + its attention FLOPs) and its memory traffic (its weights,
routed experts only where tokens land, and its KV reads), with the same conventions as
`dse.physics`. Layers differ: dense first layers, MoE layers, sliding-window or sparse attention,
and an optional multi-token-prediction head (one more MoE layer at the end).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dse.catalog.hardware import IDEAL, Efficiency, System
from dse.catalog.models import Architecture
from dse.catalog.units import DTYPE_BYTES


@dataclass(frozen=True)
class LayerTimes:
    kinds: list[str]
    seconds: np.ndarray  # per layer, per micro-batch step on one stage
    handoff_bytes: float  # activations a stage passes to the next per micro-batch


def layer_times(model: Architecture, system: System, chips: int, batch: int, context: int, weights: str = "fp8",
                kv: str = "fp8", mtp: bool = False, eff: Efficiency = IDEAL) -> LayerTimes:
    spec, ffn = model.spec, model.spec.ffn
    wb, kb = DTYPE_BYTES[weights], DTYPE_BYTES[kv]
    rate = system.flops[system.compute_dtype(weights)] * eff.compute_decode * chips
    bw = system.hbm_bandwidth * eff.memory * chips
    attn_w = model.attention_params_per_layer
    sliding = set(range(spec.n_layers - spec.attention.sliding_layers, spec.n_layers))
    if spec.attention.sliding_layers:  # alternate sliding and global layers, as gpt-oss does
        sliding = set(range(1, 2 * spec.attention.sliding_layers, 2))
    per_attended = model.attention_flops_per_attended_token("decode")
    sparse = spec.attention.sparse
    kinds, times = [], []
    n_layers = spec.n_layers + (1 if mtp else 0)
    for layer in range(n_layers):
        is_mtp = layer == spec.n_layers
        window = spec.attention.sliding_window if layer in sliding else None
        attended = min(context, window or (sparse.top_k if sparse else context))
        if ffn.kind == "moe" and (layer >= ffn.dense_layers or is_mtp):
            touched = 1 - (1 - ffn.top_k / ffn.n_experts) ** batch
            ffn_read = model.dense_ffn_params_per_layer + ffn.n_experts * model.expert_params * touched
            ffn_active = model.dense_ffn_params_per_layer + ffn.top_k * model.expert_params
            kind = "mtp" if is_mtp else "moe"
        else:
            dense = model._mlp(ffn.d_ff_dense if ffn.kind == "moe" else ffn.d_ff, ffn.bias)
            ffn_read = ffn_active = dense
            kind = "dense"
        kind += "/sliding" if window else ("/sparse" if sparse else "/global")
        flops = batch * (2.0 * (attn_w + ffn_active) + per_attended * attended)
        kv_bytes = batch * attended * model.kv_elems_per_layer * kb
        mem = (attn_w + ffn_read) * wb + kv_bytes
        kinds.append(kind)
        times.append(max(flops / rate, mem / bw))
    return LayerTimes(kinds, np.array(times), batch * spec.d_model * 2.0)


def pipelining_across_racks_pays(active_experts: int, layers_per_stage: int, scaleup: float, scaleout: float) -> bool:
    """The lecture's condition: a stage hand-off (d bytes per token over scale-out) costs less than the
    stage's own expert all-to-all (2 x active experts x layers x d bytes over scale-up) when
    active experts x layers per stage x 2 > scale-up / scale-out bandwidth.
    """
    return active_experts * layers_per_stage * 2 > scaleup / scaleout
