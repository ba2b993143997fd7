"""Vectorized roofline physics of one serving replica, over arrays of candidate configurations.

Per forward pass of a micro-batch through all pipeline stages (the lecture's decode step):

    compute = FLOPs / (chips per stage x FLOP/s)                 weights 2 x active params per
                                                                  token, plus attention FLOPs
    memory  = (weight bytes read + KV bytes read) per chip / HBM bandwidth, x PP
    comm    = TP all-reduce + EP all-to-all (scale-up, and scale-out for the share that leaves the
              domain) + PP hand-offs, x PP
    step    = max(compute, memory, comm)            (--ideal: communication fully overlapped)

Pipeline parallelism as in the lecture: weights per chip fall as 1/PP; the stage holds KV for PP
micro-batches of its layers, so KV per chip does not fall; latency is unchanged; PP micro-batches
are in flight, so throughput per replica is batch x PP / step. Everything is SI (s, bytes, FLOP).
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np

from dse.hardware import Efficiency, System
from dse.models import Architecture
from dse.units import DTYPE_BYTES, DTYPES

PHASES = ("decode", "prefill")
KV_TIERS = ("hbm", "host")
TOPOLOGY_DIMS = {"switch": 0, "torus2d": 2, "torus3d": 3}
ACT_BYTES = 2.0  # activations travel and live in bf16
LOGIT_BYTES = 4.0  # logits in fp32
PREFILL_CHUNK = 8192  # tokens per DP rank resident at once under chunked prefill
MAX_GROUPS = 2  # layer groups per model (full attention, sliding window)


def _f(x: object) -> np.ndarray:
    return np.asarray(x, dtype=np.float64)


@dataclass(frozen=True)
class ModelTable:
    """Per-model scalars as arrays indexed by model number."""

    ids: tuple[str, ...]
    p_active: np.ndarray
    p_dense: np.ndarray
    p_embedding: np.ndarray
    p_expert: np.ndarray
    moe_layers: np.ndarray
    n_experts: np.ndarray
    top_k: np.ndarray
    n_layers: np.ndarray
    d_model: np.ndarray
    vocab: np.ndarray
    kv_elems: np.ndarray
    kv_heads: np.ndarray
    g_layers: np.ndarray  # (models, MAX_GROUPS)
    g_stored: np.ndarray
    g_window: np.ndarray
    g_cap: np.ndarray
    idx_bytes_layer: np.ndarray
    attn_decode: np.ndarray
    attn_prefill: np.ndarray
    idx_flops: np.ndarray

    @classmethod
    def build(cls, models: list[Architecture]) -> ModelTable:
        def groups(m: Architecture, k: int) -> list[float]:
            g = list(m.layer_groups) + [(0, 0, np.inf, np.inf)] * (MAX_GROUPS - len(m.layer_groups))
            return [float(x[k]) for x in g]

        sparse = [m.spec.attention.sparse for m in models]
        return cls(
            ids=tuple(m.id for m in models),
            p_active=_f([m.params_active for m in models]),
            p_dense=_f([m.params_dense for m in models]),
            p_embedding=_f([m.params_embedding for m in models]),
            p_expert=_f([m.expert_params for m in models]),
            moe_layers=_f([m.moe_layers for m in models]),
            n_experts=_f([m.spec.ffn.n_experts if m.is_moe else 0 for m in models]),
            top_k=_f([m.spec.ffn.top_k if m.is_moe else 0 for m in models]),
            n_layers=_f([m.spec.n_layers for m in models]),
            d_model=_f([m.spec.d_model for m in models]),
            vocab=_f([m.spec.vocab for m in models]),
            kv_elems=_f([m.kv_elems_per_layer for m in models]),
            kv_heads=_f([m.kv_heads for m in models]),
            g_layers=_f([groups(m, 0) for m in models]),
            g_stored=_f([groups(m, 1) for m in models]),
            g_window=_f([groups(m, 2) for m in models]),
            g_cap=_f([groups(m, 3) for m in models]),
            idx_bytes_layer=_f([0 if s is None else s.indexer_head_dim * DTYPE_BYTES[s.indexer_dtype] for s in sparse]),
            attn_decode=_f([m.attention_flops_per_attended_token("decode") for m in models]),
            attn_prefill=_f([m.attention_flops_per_attended_token("prefill") for m in models]),
            idx_flops=_f([m.indexer_flops_per_scored_token() for m in models]),
        )


@dataclass(frozen=True)
class SystemTable:
    """Per-system scalars as arrays indexed by system number; unknown optional figures are 0."""

    ids: tuple[str, ...]
    flops: np.ndarray  # (systems, len(DTYPES)): FLOP/s when weights are in that dtype
    hbm_capacity: np.ndarray
    hbm_bandwidth: np.ndarray
    domain: np.ndarray
    scaleup_bw: np.ndarray
    scaleout_bw: np.ndarray
    topo_dims: np.ndarray
    host_capacity: np.ndarray
    host_bw: np.ndarray
    price_per_s: np.ndarray

    @classmethod
    def build(cls, systems: list[System]) -> SystemTable:
        def known(v: float) -> float:
            return 0.0 if np.isnan(v) else v

        return cls(
            ids=tuple(s.id for s in systems),
            flops=_f([[s.flops[s.compute_dtype(d)] for d in DTYPES] for s in systems]),
            hbm_capacity=_f([s.hbm_capacity for s in systems]),
            hbm_bandwidth=_f([s.hbm_bandwidth for s in systems]),
            domain=_f([s.scaleup_domain for s in systems]),
            scaleup_bw=_f([s.scaleup_bandwidth for s in systems]),
            scaleout_bw=_f([known(s.scaleout_bandwidth) for s in systems]),
            topo_dims=_f([TOPOLOGY_DIMS[s.topology] for s in systems]),
            host_capacity=_f([known(s.host_memory_capacity) for s in systems]),
            host_bw=_f([known(s.host_offload_bandwidth) for s in systems]),
            price_per_s=_f([s.price_per_s for s in systems]),
        )


@dataclass
class Candidates:
    """Arrays (or scalars, broadcast) of candidate configurations.

    ``model``/``system`` index the tables; ``batch`` is the micro-batch of sequences one forward
    pass carries (PP of them are in flight); ``context`` is the KV length in decode and the prompt
    length in prefill; ``phase``, ``weights_dtype``, ``kv_dtype`` and ``kv_tier`` are codes into
    PHASES, DTYPES, DTYPES and KV_TIERS.
    """

    model: np.ndarray
    system: np.ndarray
    tp: np.ndarray
    dp: np.ndarray
    ep: np.ndarray
    etp: np.ndarray
    pp: np.ndarray
    batch: np.ndarray
    context: np.ndarray
    phase: np.ndarray | int = 0
    weights_dtype: np.ndarray | int = 0
    kv_dtype: np.ndarray | int = 0
    kv_tier: np.ndarray | int = 0

    def broadcast(self) -> Candidates:
        arrays = np.broadcast_arrays(*(np.asarray(getattr(self, f.name)) for f in fields(self)))
        return Candidates(*arrays)

    def __len__(self) -> int:
        return int(np.broadcast(*(np.asarray(getattr(self, f.name)) for f in fields(self))).size)


def alltoall_factor(group: np.ndarray, dims: np.ndarray) -> np.ndarray:
    """Share of a chip's injection bandwidth an all-to-all over ``group`` chips achieves.

    A switch gives every pair full bandwidth (1). On an n-D torus of side k = group^(1/n), uniform
    traffic travels n k / 4 hops on average over 2n links per chip, so the achieved share is
    min(1, 4 / (n k)).
    """
    n = np.maximum(dims, 1.0)
    side = np.power(np.maximum(group, 1.0), 1.0 / n)
    torus = np.minimum(1.0, 4.0 / (n * side))
    return np.where(dims > 0, torus, 1.0)


def _causal(context: np.ndarray, cap: np.ndarray) -> np.ndarray:
    """Sum over positions 1..L of min(position, cap)."""
    c = np.minimum(context, cap)
    return c * (c + 1.0) / 2.0 + (context - c) * c


def evaluate(
    cand: Candidates, models: ModelTable, systems: SystemTable, eff: Efficiency, ttft: bool = True
) -> dict[str, np.ndarray]:
    """Roofline metrics of every candidate (SI units), as a dict of equal-length arrays."""
    c = cand.broadcast()
    m, s = c.model, c.system
    tp, dp, ep, etp, pp = (_f(x) for x in (c.tp, c.dp, c.ep, c.etp, c.pp))
    batch, ctx = _f(c.batch), _f(c.context)
    prefill = np.asarray(c.phase) == 1
    cps = tp * dp
    chips = cps * pp

    wbytes = np.take(_f([DTYPE_BYTES[d] for d in DTYPES]), c.weights_dtype)
    kvbytes = np.take(_f([DTYPE_BYTES[d] for d in DTYPES]), c.kv_dtype)
    flops_rate = systems.flops[s, c.weights_dtype]
    eff_c = np.where(prefill, eff.compute_prefill, eff.compute_decode)

    p_act, p_dense, p_emb, p_exp = models.p_active[m], models.p_dense[m], models.p_embedding[m], models.p_expert[m]
    moe_l, n_exp, top_k = models.moe_layers[m], models.n_experts[m], models.top_k[m]
    n_layers, d, vocab = models.n_layers[m], models.d_model[m], models.vocab[m]

    per_seq = np.where(prefill, ctx, 1.0)  # tokens each sequence adds per forward pass
    tokens = batch * per_seq  # tokens per forward pass
    seqs_rank = np.ceil(batch / dp)  # sequences on the busiest attention (DP) rank
    tokens_rank = seqs_rank * per_seq

    # ---- compute ------------------------------------------------------------------------
    # Attention, dense MLPs and shared experts run on each DP rank over its own sequences (TP
    # splits them); routed experts run over every token of the stage, spread over all its chips.
    g_layers, g_cap = models.g_layers[m], models.g_cap[m]
    ctx2 = ctx[..., None]
    attended_dec = (g_layers * np.minimum(ctx2, g_cap)).sum(axis=-1)
    attended_pre = (g_layers * _causal(ctx2, g_cap)).sum(axis=-1)
    attn = np.where(  # attention FLOPs per sequence per forward pass
        prefill,
        models.attn_prefill[m] * attended_pre + models.idx_flops[m] * n_layers * _causal(ctx, np.inf),
        models.attn_decode[m] * attended_dec + models.idx_flops[m] * n_layers * ctx,
    )
    routed_active = moe_l * top_k * p_exp
    dense_rank_flops = tokens_rank * 2.0 * (p_act - routed_active) + seqs_rank * attn
    routed_flops = tokens * 2.0 * routed_active
    rate = flops_rate * eff_c
    compute_s = dense_rank_flops / (tp * rate) + routed_flops / (cps * rate)
    attn_flops = batch * attn
    flops = tokens * 2.0 * p_act + attn_flops

    # ---- memory per chip ------------------------------------------------------------------
    experts_per_chip = np.ceil(n_exp / ep)
    routed_per_chip = moe_l / pp * experts_per_chip * p_exp / etp
    dense_per_chip = p_dense / (tp * pp)
    weights_bytes = wbytes * (dense_per_chip + routed_per_chip)
    touched = np.where(n_exp > 0, -np.expm1(tokens * np.log1p(-top_k / np.maximum(n_exp, 1.0))), 0.0)
    weights_read = wbytes * ((p_dense - p_emb) / (tp * pp) + routed_per_chip * touched)

    shard = np.ceil(models.kv_heads[m] / tp) / models.kv_heads[m]
    kv_main = models.kv_elems[m] * kvbytes * shard
    idx_b = models.idx_bytes_layer[m]
    stored_per_seq = kv_main * (models.g_stored[m] * np.minimum(ctx2, models.g_window[m])).sum(axis=-1)
    stored_per_seq = stored_per_seq + idx_b * n_layers * ctx
    read_per_seq = kv_main * (g_layers * np.minimum(ctx2, g_cap)).sum(axis=-1) + idx_b * n_layers * ctx
    # A stage holds PP micro-batches of 1/PP of the layers: KV per chip does not fall with PP.
    kv_bytes = seqs_rank * stored_per_seq
    kv_read = np.where(prefill, kv_bytes, seqs_rank * read_per_seq) / pp  # prefill writes its KV once

    on_host = np.asarray(c.kv_tier) == 1
    hbm_bw = systems.hbm_bandwidth[s] * eff.memory
    host_bw = systems.host_bw[s] * eff.memory
    with np.errstate(divide="ignore", invalid="ignore"):
        kv_time = np.where(on_host, np.where(kv_read > 0, kv_read / host_bw, 0.0), kv_read / hbm_bw)
    memory_s = pp * (weights_read / hbm_bw + kv_time)

    # ---- communication --------------------------------------------------------------------
    domain = systems.domain[s]
    su = systems.scaleup_bw[s] * eff.link
    so = systems.scaleout_bw[s] * eff.link
    msg = tokens_rank * d * ACT_BYTES
    tp_bw = np.where(tp <= domain, su, so)
    with np.errstate(divide="ignore", invalid="ignore"):
        allreduce = np.where(tp > 1, 2.0 * (tp - 1) / tp * msg / tp_bw, 0.0)
        tp_s = 2.0 * n_layers / pp * allreduce

        disp_bytes = np.where(wbytes < 2, 1.0, ACT_BYTES)
        a2a_bytes = tokens_rank / tp * top_k * etp * d * (disp_bytes + ACT_BYTES)
        local = np.minimum(cps, domain)
        intra = np.maximum(local - 1.0, 0.0) / cps
        inter = np.maximum(cps - domain, 0.0) / cps
        a2a_bw = su * alltoall_factor(local, systems.topo_dims[s])
        a2a = np.maximum(a2a_bytes * intra / a2a_bw, np.where(inter > 0, a2a_bytes * inter / so, 0.0))
        ep_s = np.where((n_exp > 0) & (cps > 1), moe_l / pp * a2a, 0.0)

        hand_bw = np.where(chips <= domain, su, so)
        pp_s = np.where(pp > 1, tokens * d * ACT_BYTES / cps / hand_bw, 0.0)
    comm_s = pp * (tp_s + ep_s + pp_s)

    # ---- step -------------------------------------------------------------------------------
    work = np.maximum(compute_s, memory_s)
    longest = np.maximum(work, comm_s)
    step_s = longest + (1.0 - eff.overlap) * np.minimum(comm_s, work)
    bound = np.where(comm_s > work, 2, np.where(memory_s > compute_s, 1, 0))

    # ---- memory capacity ------------------------------------------------------------------
    act_tokens = np.where(prefill, np.minimum(tokens_rank, PREFILL_CHUNK), tokens_rank)
    logit_tokens = seqs_rank
    act_bytes = act_tokens * 8.0 * d * ACT_BYTES + logit_tokens * vocab / tp * LOGIT_BYTES
    kv_in_hbm = np.where(on_host, 0.0, kv_bytes)
    hbm_bytes = weights_bytes + kv_in_hbm + act_bytes
    hbm_cap = systems.hbm_capacity[s]
    fits = (hbm_bytes <= hbm_cap * eff.hbm_usable) & (~on_host | (kv_bytes <= systems.host_capacity[s]))

    # ---- throughput and cost ----------------------------------------------------------------
    seqs_in_flight = batch * pp
    tokens_per_s = np.where(prefill, seqs_in_flight * ctx, seqs_in_flight) / step_s
    usd_per_mtok = chips * systems.price_per_s[s] / tokens_per_s * 1e6

    # ---- derived figures ----------------------------------------------------------------------
    weights_read_all = wbytes * ((p_dense - p_emb) / (tp * pp) + routed_per_chip)
    balance_batch = weights_read_all / hbm_bw * cps * flops_rate * eff_c / (2.0 * p_act / pp)
    hbm_drain_s = hbm_cap / systems.hbm_bandwidth[s]
    kv_per_token_read = kv_main * (g_layers * (g_cap == np.inf)).sum(axis=-1) + idx_b * n_layers
    attn_per_token = models.attn_decode[m] * (g_layers * (g_cap == np.inf)).sum(axis=-1) + models.idx_flops[m] * n_layers
    capped = (g_layers * np.where(np.isinf(g_cap), 0.0, g_cap)).sum(axis=-1)
    rate_c = tp * rate  # FLOP/s serving one DP rank's sequences
    slope = kv_per_token_read / hbm_bw - attn_per_token / rate_c
    offset = (2.0 * p_act + models.attn_decode[m] * capped) / rate_c - kv_main * capped / hbm_bw
    with np.errstate(divide="ignore", invalid="ignore"):
        kv_crossover = np.where(slope > 0, np.maximum(offset, 0.0) / slope, np.inf)

    out = {
        "chips": chips,
        "compute_s": compute_s,
        "memory_s": memory_s,
        "comm_s": comm_s,
        "step_s": step_s,
        "bound": bound,
        "tokens_per_s": tokens_per_s,
        "tpot_s": np.where(prefill, np.nan, step_s),
        "usd_per_mtok": usd_per_mtok,
        "weights_bytes_per_chip": weights_bytes,
        "kv_bytes_per_chip": kv_bytes,
        "activation_bytes_per_chip": act_bytes,
        "hbm_bytes_per_chip": hbm_bytes,
        "fits": fits,
        "flops_per_step": flops,
        "attention_flops_per_step": attn_flops,
        "tp_comm_s": pp * tp_s,
        "ep_comm_s": pp * ep_s,
        "pp_comm_s": pp * pp_s,
        "sequences_in_flight": seqs_in_flight,
        "balance_batch": balance_batch,
        "hbm_drain_s": hbm_drain_s,
        "kv_crossover_context": kv_crossover,
    }
    if ttft:
        pre = Candidates(
            m, s, c.tp, c.dp, c.ep, c.etp, c.pp, np.ones_like(batch), ctx, 1, c.weights_dtype, c.kv_dtype, c.kv_tier
        )
        out["ttft_s"] = np.where(prefill, step_s, evaluate(pre, models, systems, eff, ttft=False)["step_s"])
    return out


BOUNDS = ("compute", "memory", "comm")


def balance_batch_closed_form(flops: float, bandwidth: float, bytes_per_param: float, total: float, active: float) -> float:
    """The lecture's balance batch: (FLOP/s / bytes/s) x (bytes per param / 2) x (total / active)."""
    return flops / bandwidth * bytes_per_param / 2.0 * total / active


def kv_crossover_bytes_per_token(flops: float, bandwidth: float, active: float, context: float) -> float:
    """KV bytes per token at which KV fetch time equals weight compute time at ``context``:
    B L bytes / bandwidth = B 2 N_active / FLOP/s, so bytes = (bandwidth / FLOP/s) x 2 N / L."""
    return bandwidth / flops * 2.0 * active / context
