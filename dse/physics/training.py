"""Training-step physics: one optimizer step of a layout (TP x CP x DP x PP, experts over EP x expert-TP) with
each parallelism's communication overlapped by a named schedule, ZeRO-0/1/2/3 (FSDP) memory and traffic, four
recomputation modes, GEMMs in BF16, FP8, FP4 or INT8 where the chip computes in them, MTP modules, and the
pipeline's stages placed by an exact partition program; vectorized over arrays of candidate layouts of one model
on one system.

The model is a sequence of items: the input embedding, its layers (dense, MoE, linear-attention), its MTP modules
and the output head. A micro-batch's time on an item is its compute (GEMMs at the format's peak, the attention
core at its own, the memory-bound kernels at HBM bandwidth) plus the part of each collective its overlappable
compute leaves exposed (exposed = max(0, communication - overlappable compute)):

- TP (sequence parallel: an all-gather and a reduce-scatter around each GEMM pair, Korthikanti et al. 2022):
  hidden under the layer's GEMMs when ``tp_overlap`` (chunked all-gather / reduce-scatter GEMM pipelining,
  Wang et al. 2023; Transformer Engine userbuffers), else exposed.
- CP (ring attention, Liu et al. 2023: each rank's KV chunk passes around the ring, dKV too in the backward):
  hidden under the attention core.
- EP (a dispatch and a combine all-to-all per MoE layer, forward and backward): exposed, or with
  ``ep_overlap = two_microbatch`` hidden under the other micro-batch's compute of the same layer (DualPipe,
  DeepSeek-V3 report Sec. 3.2.1; Megatron-Core's 1F1B all-to-all overlap).
- PP (activations forward, their gradients backward, per micro-batch and chunk boundary): hidden under the chunk.
- DP / FSDP (bucketed gradient overlap, Li et al. 2020, PyTorch DDP): ZeRO-0 all-reduces the gradients and
  ZeRO-1 reduce-scatters them during the last micro-batch's backward (then all-gathers the parameters during the
  next forward); ZeRO-2 reduce-scatters every micro-batch's gradients during its backward; ZeRO-3 / FSDP
  all-gathers every layer's parameters before its forward and again before its backward and reduce-scatters its
  gradients, every micro-batch (Rajbhandari et al. 2020; Zhao et al. 2023). The exposed part follows the step.

The pipeline's schedule is 1F1B (Narayanan et al. 2021), interleaved over ``interleave`` virtual chunks per
device: with chunk times c_j (device d holding chunks d, d + PP, ...; t_d their sum) and m micro-batches the
pipeline takes m max_d t_d + (sum_j c_j - max_d t_d) / v, which is (m + (PP - 1) / v) t for even chunks (ibid.).
The partition program minimizes its dominant term, the busiest device's time per micro-batch, within memory
(`greedy_partition`: exact over every contiguous partition; interleaved, the best member of `chunk_families`);
the step's other terms that depend on the partition (a chunk's P2P floor, the busiest device's exposed
data-parallel traffic and optimizer step) are evaluated on it, not minimized.

FLOPs: 2 per weight per token forward, 4 backward (data and weight gradients); the attention core 2.5 times its
forward in the backward (FlashAttention-2 recomputes the scores, Dao 2023); recomputation adds its forward again.
Memory per chip: weights, gradient buffers and Adam's states (`ADAM_BYTES`), sharded over the data-parallel group
by the ZeRO stage, plus the activations of the micro-batches in flight (Korthikanti et al. 2022: the first of PP
stages holds PP, (1 + (PP - 1) / (PP v)) times that interleaved).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields, replace
from functools import lru_cache

import numpy as np

from dse.catalog.hardware import System
from dse.catalog.models import Architecture, causal_attended
from dse.catalog.training import TRAIN_IDEAL, TrainEfficiency, training_efficiency_for
from dse.errors import InputError
from dse.physics.roofline import ACT_BYTES, TOPOLOGY_DIMS, alltoall_factor, dispatch_copies

RECOMPUTE = ("none", "selective", "selective_ffn", "full", "reversible")
"""Activation recomputation: ``selective`` recomputes the attention core (Korthikanti et al. 2022),
``selective_ffn`` also the FFN's up-projection GEMM (MaxText's save_dot_except_mlpwi), ``full`` every layer from
its input, ``reversible`` every layer from the next layer's output (Gomez et al. 2017)."""
ZERO_STAGES = (0, 1, 2, 3)
"""0: DDP (everything replicated); 1: optimizer states sharded (Megatron's distributed optimizer); 2: gradients
too; 3: parameters too (ZeRO-3, FSDP)."""
TRAIN_DTYPES = ("bf16", "fp8", "fp4", "int8")
"""Formats of the linear layers' GEMMs (forward, data and weight gradients): the chip must compute in it."""
SCALINGS = ("delayed", "tensor", "block")
"""Scaling of FP8/FP4/INT8 GEMM inputs: per tensor from an amax history (no extra pass), per tensor from the
current amax (one more read of every GEMM input), per block of 16-128 elements (amax and cast fused)."""
EP_OVERLAP = ("none", "two_microbatch")
ATTENTION_DTYPES = ("bf16", "fp8")
QUANT_BYTES = {"bf16": 2.0, "fp8": 1.0, "fp4": 0.5625, "int8": 1.0}
"""Bytes per element a GEMM input is cast to (NVFP4: 4 bits plus an FP8 scale per 16 elements)."""
ATTN_BWD = 2.5
"""Attention-core backward FLOPs over its forward (FlashAttention-2, Dao 2023: recomputes the scores)."""
MAIN_GRAD_BYTES = 4.0
ADAM_BYTES = 12.0  # fp32 master weights, first and second moments
"""Bytes per parameter (Megatron-Core's distributed-optimizer table): DDP (ZeRO-0) keeps bf16 weights, fp32
gradients and Adam's fp32 states (2 + 4 + 12); the distributed optimizer (ZeRO-1) bf16 gradient buckets and, per
shard, the fp32 gradient with the states (2 + 2 + 16 / DP); ZeRO-2 shards the buckets, ZeRO-3 the weights."""
OPTIMIZER_TRAFFIC = 34.0
"""HBM bytes the optimizer step moves per local parameter: reads the fp32 gradient, master weight and two
moments (16), writes them back but the gradient (12), writes the bf16 weight (2), zeroes the gradient (4)."""


@dataclass(frozen=True)
class TrainLayout:
    """One training configuration. ``etp`` 0 means the expert TP equals ``tp`` (Megatron-Core's default);
    ``stages`` gives the items per pipeline chunk (embedding, layers, MTP modules, head in order, PP x interleave
    chunks) instead of the partition program's choice. ``zero_group`` shards the ZeRO states over groups of that
    many data-parallel ranks, replicated across the groups (hybrid sharding: PyTorch's HSDP, MaxText's FSDP inside a
    slice with data parallelism across slices); 0 shards over every DP x CP rank.
    """

    tp: int
    pp: int
    dp: int
    cp: int = 1
    ep: int = 1
    etp: int = 0
    micro_batch: int = 1
    interleave: int = 1
    recompute: str = "selective"
    zero: int = 1
    zero_group: int = 0
    gemm_dtype: str = "bf16"
    head_dtype: str = "bf16"
    scaling: str = "delayed"
    attention_dtype: str = "bf16"
    tp_overlap: bool = True
    ep_overlap: str = "none"
    grad_overlap: bool = True
    stages: tuple[int, ...] | None = None

    @property
    def chips(self) -> int:
        return self.tp * self.cp * self.dp * self.pp

    def describe(self) -> str:
        parts = [f"TP{self.tp}", f"CP{self.cp}", f"DP{self.dp}", f"PP{self.pp}"]
        if self.interleave > 1:
            parts.append(f"VP{self.interleave}")
        if self.ep > 1:
            parts.append(f"EP{self.ep}")
        zero = "FSDP" if self.zero == 3 else f"ZeRO-{self.zero}"
        return (f"{' '.join(parts)}, {zero}, micro-batch {self.micro_batch}, {self.recompute} recompute, "
                f"{self.gemm_dtype} GEMMs")


CODED = {"recompute": RECOMPUTE, "gemm_dtype": TRAIN_DTYPES, "head_dtype": TRAIN_DTYPES, "scaling": SCALINGS,
         "attention_dtype": ATTENTION_DTYPES, "ep_overlap": EP_OVERLAP}
"""Fields of `TrainLayout` that `TrainCandidates` holds as indices into these tuples."""


@dataclass
class TrainCandidates:
    """Arrays of layouts (one entry per candidate); coded fields hold indices into `CODED`."""

    tp: np.ndarray
    pp: np.ndarray
    dp: np.ndarray
    cp: np.ndarray
    ep: np.ndarray
    etp: np.ndarray
    micro_batch: np.ndarray
    interleave: np.ndarray
    recompute: np.ndarray
    zero: np.ndarray
    zero_group: np.ndarray
    gemm_dtype: np.ndarray
    head_dtype: np.ndarray
    scaling: np.ndarray
    attention_dtype: np.ndarray
    tp_overlap: np.ndarray
    ep_overlap: np.ndarray
    grad_overlap: np.ndarray

    @classmethod
    def from_layouts(cls, layouts: list[TrainLayout]) -> TrainCandidates:
        cols = {}
        for f in fields(cls):
            vals = [getattr(lay, f.name) for lay in layouts]
            if f.name in CODED:
                for v in set(vals):
                    if v not in CODED[f.name]:
                        raise InputError(f"training layout field '{f.name}': {v!r} is not one of "
                                         f"{', '.join(map(str, CODED[f.name]))}")
                vals = [CODED[f.name].index(v) for v in vals]
            if f.name == "etp":
                vals = [lay.etp or lay.tp for lay in layouts]
            if f.name == "zero_group":
                vals = [lay.zero_group or lay.dp * lay.cp for lay in layouts]
            cols[f.name] = np.asarray(vals, dtype=np.float64)
        return cls(**cols)

    def __len__(self) -> int:
        return len(self.tp)

    def take(self, idx: np.ndarray) -> TrainCandidates:
        return TrainCandidates(**{f.name: getattr(self, f.name)[idx] for f in fields(self)})

    @property
    def chips(self) -> np.ndarray:
        return self.tp * self.cp * self.dp * self.pp


# ---- the model as a sequence of items --------------------------------------------------------------------------------
@dataclass(frozen=True)
class Items:
    """Per item (embedding, layers, MTP modules, head), per token of one sequence of ``seq`` tokens, forward pass;
    FLOPs and parameter counts at full width (before any sharding), activation and traffic bytes in bf16.
    """

    kind: tuple[str, ...]  # embedding | dense | moe | mtp | head
    gemm: np.ndarray  # GEMM FLOPs (2 per active weight) of weights in the training format
    gemm_bf16: np.ndarray  # GEMM FLOPs that stay in BF16 (the router)
    head: np.ndarray  # the output heads' GEMM FLOPs (main and MTP), in the layout's head format
    ffn_up: np.ndarray  # of which the FFN up/gate projections' (recomputed by selective_ffn)
    attn: np.ndarray  # attention-core FLOPs (scores and values; linear-attention scans)
    dense_params: np.ndarray  # weights not routed (sharded by TP)
    routed_params: np.ndarray  # routed-expert weights (sharded by EP x expert-TP)
    act: dict[str, np.ndarray]  # stored activation bytes per recompute mode
    act_full: np.ndarray  # the whole layer's activations (rebuilt one layer at a time under full recompute)
    ew: np.ndarray  # memory-bound traffic (norms, activation functions, residuals, rotary, loss)
    quant: np.ndarray  # elements cast to the GEMM format (the GEMMs' inputs)
    tp_attn: np.ndarray  # TP collectives of the mixer and dense parts per forward (sequence parallel)
    tp_ffn: np.ndarray  # TP collectives of a MoE FFN per forward when its experts are TP-sharded
    moe: np.ndarray  # 1 for an item with routed experts
    kv: np.ndarray  # K and V bytes per token the CP ring passes (softmax attention layers)
    n_layers: int
    n_mtp: int
    d: int
    vocab: int
    tied: bool
    n_experts: int
    top_k: int

    def __len__(self) -> int:
        return len(self.kind)


def _layer_order(model: Architecture) -> list[tuple[str, str, float]]:
    """(FFN kind, mixer kind, attended-token cap) of each layer in order: the first ``dense_layers`` dense, the
    linear-attention and sliding-window layers spread evenly over the depth.
    """
    s, a = model.spec, model.spec.attention
    n = s.n_layers
    linear = model.linear_layers
    sliding = a.sliding_layers
    cap = float(a.sparse.top_k) if a.sparse else math.inf

    def spread(count: int, total: int) -> list[bool]:
        return [(i + 1) * count // total > i * count // total for i in range(total)]

    is_linear = spread(linear, n)
    rest = [i for i in range(n) if not is_linear[i]]
    is_sliding = [False] * n
    for j, flag in zip(rest, spread(sliding, len(rest)), strict=True):
        is_sliding[j] = flag
    out = []
    for i in range(n):
        ffn = "moe" if model.is_moe and i >= s.ffn.dense_layers else "dense"
        mixer = "linear" if is_linear[i] else "softmax"
        out.append((ffn, mixer, float(a.sliding_window) if is_sliding[i] else cap))
    return out


def _mixer(model: Architecture, mixer: str, cap: float, seq: int) -> tuple[float, float, float, float, float]:
    """(GEMM params, core FLOPs per token, stored core activation bytes, K+V bytes for CP, GEMM input elements) of
    one layer's token mixer.
    """
    d, a = model.spec.d_model, model.spec.attention
    if mixer == "linear":
        g = a.linear
        params = model.linear_params_per_layer - 2 * d
        k_dim, v_dim = g.k_heads * g.k_head_dim, g.v_heads * g.v_head_dim
        # chunked delta-rule scan: state update and read-out, d_k x d_v per head and token, twice each
        core = 8.0 * g.v_heads * g.k_head_dim * g.v_head_dim
        act = ACT_BYTES * (2 * k_dim + 2 * v_dim)
        return params, core, act, 0.0, d + v_dim
    params = model.attention_params_per_layer - 2 * d
    attended = causal_attended(seq, cap) / seq
    core = model.attention_flops_per_attended_token("prefill") * attended
    if a.sparse:
        core += model.indexer_flops_per_scored_token() * causal_attended(seq, math.inf) / seq
    if a.kind == "mla":
        q = a.n_heads * (a.qk_nope_head_dim + a.qk_rope_head_dim)
        kv = a.n_heads * (a.qk_nope_head_dim + a.qk_rope_head_dim + a.v_head_dim)
        o = a.n_heads * a.v_head_dim
        gemm_in = d + (a.q_lora_rank or 0) + a.kv_lora_rank + o
    else:
        q, kv, o = a.n_heads * a.head_dim, 2 * a.n_kv_heads * a.head_dim, a.n_heads * a.head_dim
        gemm_in = d + o
    return params, core, ACT_BYTES * (q + kv + o), ACT_BYTES * kv, gemm_in


@lru_cache(maxsize=64)
def model_items(model: Architecture, seq: int) -> Items:
    """The model's items at sequence length ``seq`` (cached per model and length)."""
    s, f = model.spec, model.spec.ffn
    d, v = s.d_model, s.vocab
    rows: list[dict] = []
    norm = 2 * d  # a pre-norm's input, stored for its backward

    def ffn(kind: str) -> dict:
        if kind == "dense":
            d_ff = f.d_ff_dense if model.is_moe else f.d_ff
            p = model._mlp(d_ff, f.bias)
            up = (2 if f.gated else 1) * d * d_ff
            inner = (2 if f.gated else 1) * d_ff
            act = ACT_BYTES * (d + inner + d_ff) + norm
            return dict(gemm=2.0 * p, up=2.0 * up, params=p, routed=0.0, act=act, sel_ffn=ACT_BYTES * (inner + d_ff),
                        quant=d + d_ff, tp_ffn=0.0, moe=0.0, router=0.0, ew=ACT_BYTES * (3 * inner + 2 * d_ff))
        k, e = f.top_k, model.expert_params
        inner = (2 if f.gated else 1) * f.d_ff_expert
        per_copy = ACT_BYTES * (d + inner + f.d_ff_expert)
        shared = f.n_shared * e
        up = (k + f.n_shared) * (2 if f.gated else 1) * d * f.d_ff_expert
        return dict(gemm=2.0 * (k * e + shared), up=2.0 * up, params=model.dense_ffn_params_per_layer,
                    routed=f.n_experts * e, act=(k + f.n_shared) * per_copy + ACT_BYTES * k * d + norm,
                    sel_ffn=(k + f.n_shared) * ACT_BYTES * (inner + f.d_ff_expert),
                    quant=(k + f.n_shared) * (d + f.d_ff_expert), tp_ffn=2.0, moe=1.0,
                    router=2.0 * d * f.n_experts,
                    ew=(k + f.n_shared) * ACT_BYTES * (3 * inner + 2 * f.d_ff_expert) + ACT_BYTES * 4 * k * d)

    def layer(kind: str, ffn_kind: str, mixer: str, cap: float, extra_params: float = 0.0,
              extra_gemm: float = 0.0) -> dict:
        mp, core, core_act, kv, gemm_in = _mixer(model, mixer, cap, seq)
        fr = ffn(ffn_kind)
        base = ACT_BYTES * d + norm + ACT_BYTES * d  # mixer input (after norm) and output projection input
        none = base + core_act + fr["act"]
        return dict(
            kind=kind, gemm=2.0 * mp + fr["gemm"] + extra_gemm, gemm_bf16=fr["router"], head=0.0, ffn_up=fr["up"],
            attn=core,
            dense_params=mp + 2 * d + fr["params"] + extra_params, routed_params=fr["routed"],
            none=none, selective=none - core_act, selective_ffn=none - core_act - fr["sel_ffn"],
            act_full=none, ew=ACT_BYTES * 12 * d + fr["ew"], quant=gemm_in + fr["quant"], tp_attn=2.0 + (
                2.0 if ffn_kind == "dense" else 0.0), tp_ffn=fr["tp_ffn"], moe=fr["moe"], kv=kv)

    head_params = v * d + d
    rows.append(dict(kind="embedding", gemm=0.0, gemm_bf16=0.0, head=0.0, ffn_up=0.0, attn=0.0,
                     dense_params=float(v * d),
                     routed_params=0.0, none=0.0, selective=0.0, selective_ffn=0.0, act_full=0.0,
                     ew=ACT_BYTES * 2 * d, quant=0.0, tp_attn=1.0, tp_ffn=0.0, moe=0.0, kv=0.0))
    order = _layer_order(model)
    for ffn_kind, mixer, cap in order:
        rows.append(layer(ffn_kind, ffn_kind, mixer, cap))
    n_mtp = s.mtp.modules if s.mtp else 0
    last = order[-1]
    for _ in range(n_mtp):  # DeepSeek-V3 Sec. 2.2: two norms, a 2d -> d projection, one layer, the shared head
        r = layer("mtp", last[0], last[1], last[2], extra_params=2 * d * d + 2 * d, extra_gemm=2.0 * 2 * d * d)
        r["head"] += 2.0 * v * d
        r["none"] += ACT_BYTES * (2 * d + v) + 4.0 * v
        r["ew"] += 4.0 * 3 * v
        rows.append(r)
    rows.append(dict(kind="head", gemm=0.0, gemm_bf16=0.0, head=2.0 * v * d, ffn_up=0.0, attn=0.0,
                     dense_params=float(head_params), routed_params=0.0,
                     none=norm + ACT_BYTES * v + 4.0 * v, selective=norm + ACT_BYTES * v + 4.0 * v,
                     selective_ffn=norm + ACT_BYTES * v + 4.0 * v, act_full=0.0, ew=4.0 * 3 * v + ACT_BYTES * 2 * d,
                     quant=0.0, tp_attn=1.0, tp_ffn=0.0, moe=0.0, kv=0.0))
    col = {k: np.array([r[k] for r in rows], dtype=np.float64) for k in rows[0] if k != "kind"}
    act = {"none": col["none"], "selective": col["selective"], "selective_ffn": col["selective_ffn"],
           "full": np.where(col["act_full"] > 0, ACT_BYTES * d, col["none"]),
           "reversible": np.where(col["act_full"] > 0, 0.0, col["none"])}
    return Items(kind=tuple(r["kind"] for r in rows), gemm=col["gemm"], gemm_bf16=col["gemm_bf16"], head=col["head"],
                 ffn_up=col["ffn_up"], attn=col["attn"], dense_params=col["dense_params"],
                 routed_params=col["routed_params"], act=act, act_full=col["act_full"], ew=col["ew"],
                 quant=col["quant"], tp_attn=col["tp_attn"], tp_ffn=col["tp_ffn"], moe=col["moe"], kv=col["kv"],
                 n_layers=s.n_layers, n_mtp=n_mtp, d=d, vocab=v, tied=s.tie_embeddings,
                 n_experts=f.n_experts if model.is_moe else 0, top_k=f.top_k if model.is_moe else 0)


# ---- rates and links -------------------------------------------------------------------------------------------------
def gemm_rate(system: System, dtype: str) -> float:
    """Peak FLOP/s of ``system``'s tensor units in ``dtype``; a format it has no units for is an InputError."""
    if dtype == "int8":
        q = system.quantities.get("flops_int8")
        if q is not None:
            return q.si
    elif dtype in system.flops:
        return system.flops[dtype]
    have = [d for d in TRAIN_DTYPES if d in system.flops or (d == "int8" and "flops_int8" in system.quantities)]
    raise InputError(f"training GEMM format {dtype!r}: '{system.id}' has no {dtype.upper()} tensor units (it "
                     f"computes in {', '.join(have)})")


def check_formats(system: System, lay: TrainLayout) -> None:
    """The layout's formats exist and the chip computes in them (InputError naming the field otherwise)."""
    for name, allowed in CODED.items():
        if getattr(lay, name) not in allowed:
            raise InputError(f"training layout field '{name}': {getattr(lay, name)!r} is not one of "
                             f"{', '.join(allowed)}")
    gemm_rate(system, lay.gemm_dtype)
    gemm_rate(system, lay.head_dtype)
    gemm_rate(system, lay.attention_dtype)


class _Links:
    """Achieved bandwidth and latency of the layouts' groups on one system: a group of ``size`` ranks at rank
    stride ``stride`` holds min(size, domain / stride) ranks per scale-up domain; its collectives move the
    in-domain share over scale-up links and the rest over each rank's own scale-out NIC (rail-parallel).
    """

    def __init__(self, system: System, eff: TrainEfficiency) -> None:
        self.domain = float(system.scaleup_domain)
        self.su = system.scaleup_bandwidth * eff.link
        so = system.scaleout_bandwidth
        self.so = (so if math.isfinite(so) else 0.0) * eff.link
        self.topo = float(TOPOLOGY_DIMS[system.topology])
        self.latency = eff.latency
        self.system = system

    def per_domain(self, stride: np.ndarray, size: np.ndarray) -> np.ndarray:
        return np.clip(np.floor(self.domain / np.maximum(stride, 1.0)), 1.0, np.maximum(size, 1.0))

    def reduce_scatter(self, nbytes: np.ndarray, stride: np.ndarray, size: np.ndarray) -> np.ndarray:
        """Time of a reduce-scatter (or an all-gather) of ``nbytes`` per rank over the group."""
        inner = self.per_domain(stride, size)
        outer = np.ceil(size / inner)
        ring = alltoall_factor(inner, np.full_like(inner, self.topo), self.domain)
        t_in = (inner - 1.0) / inner * nbytes / (self.su * np.where(self.topo < 0, ring, 1.0))
        with np.errstate(divide="ignore", invalid="ignore"):
            t_out = np.where(outer > 1, (outer - 1.0) / outer * nbytes / inner / self.so, 0.0)
        return np.where(size > 1, t_in + t_out + self.latency, 0.0)

    def p2p(self, nbytes: np.ndarray, inside: np.ndarray) -> np.ndarray:
        with np.errstate(divide="ignore"):
            return nbytes / np.where(inside, self.su, self.so) + self.latency

    def check(self, chips: np.ndarray) -> None:
        if self.so == 0 and np.any(chips > self.domain):
            raise InputError(
                f"training layout of {int(np.max(chips))} chips spans more than one {int(self.domain)}-chip domain "
                f"of '{self.system.id}', whose scale-out (DCN) bandwidth the catalog does not know; use at most "
                f"{int(self.domain)} chips or a system with a scale-out figure")


# ---- per-item times -------------------------------------------------------------------------------------------------
@dataclass
class _Terms:
    """Per candidate (rows) and item (columns): a micro-batch's forward + backward on one chip."""

    compute: np.ndarray
    gemm: np.ndarray
    attn: np.ndarray
    exposed: np.ndarray  # TP + CP + EP exposed
    tp: np.ndarray
    cp: np.ndarray
    ep: np.ndarray
    tp_exp: np.ndarray
    cp_exp: np.ndarray
    ep_exp: np.ndarray
    static: np.ndarray  # weight, gradient and optimizer bytes per chip
    act: np.ndarray  # stored activation bytes per chip per micro-batch in flight
    params_dense: np.ndarray  # per chip, before ZeRO sharding
    params_routed: np.ndarray
    hw_flops: np.ndarray  # per micro-batch per chip


def _col(x: np.ndarray) -> np.ndarray:
    return np.asarray(x, dtype=np.float64)[:, None]


def _terms(it: Items, system: System, c: TrainCandidates, seq: int, eff: TrainEfficiency, links: _Links) -> _Terms:
    tp, cp, ep, etp, dp, pp = (_col(getattr(c, k)) for k in ("tp", "cp", "ep", "etp", "dp", "pp"))
    rc = np.asarray(c.recompute, dtype=int)
    full = _col(np.isin(rc, (RECOMPUTE.index("full"), RECOMPUTE.index("reversible"))))
    sel_ffn = _col(rc == RECOMPUTE.index("selective_ffn"))
    attn_rc = _col(rc != RECOMPUTE.index("none"))
    tok = _col(c.micro_batch) * seq / cp  # tokens of a micro-batch per CP rank (shared by its TP group)
    share = tok / tp
    dtypes = np.asarray(c.gemm_dtype, dtype=int)
    rate = _col([_rate(system, k, eff) for k in dtypes])
    bf16 = system.flops["bf16"] * eff.gemm
    fp8_attn = np.asarray(c.attention_dtype) == ATTENTION_DTYPES.index("fp8")
    attn_peak = gemm_rate(system, "fp8") if fp8_attn.any() else system.flops["bf16"]
    attn_rate = _col(np.where(fp8_attn, attn_peak, system.flops["bf16"])) * eff.attention
    head_rate = _col([_rate(system, k, eff) for k in np.asarray(c.head_dtype, dtype=int)])
    gemm_flops = share * ((3.0 + full) * it.gemm + sel_ffn * it.ffn_up)
    bf16_flops = share * (3.0 + full) * it.gemm_bf16
    head_flops = share * (3.0 + full) * it.head
    attn_flops = share * (1.0 + ATTN_BWD + attn_rc) * it.attn
    t_gemm = gemm_flops / rate + bf16_flops / bf16 + head_flops / head_rate
    t_attn = attn_flops / attn_rate
    # memory-bound kernels: forward traffic, twice that backward, once more for what is recomputed
    qbytes = _col(np.array([QUANT_BYTES[TRAIN_DTYPES[k]] for k in dtypes]))
    scal = _col(np.asarray(c.scaling))
    narrow = _col(dtypes > 0)
    quant = narrow * it.quant * 3.0 * (ACT_BYTES + qbytes + ACT_BYTES * (scal == SCALINGS.index("tensor")))
    rc_mem = np.where(full > 0, 1.0, np.where(attn_rc > 0, 0.5, 0.0))
    t_mem = share * ((3.0 + rc_mem) * it.ew + quant) / (system.hbm_bandwidth * eff.memory)
    compute = t_gemm + t_attn + t_mem
    passes = 2.0 + full  # forward, backward, recomputed forward
    # TP: sequence-parallel all-gathers and reduce-scatters of the micro-batch's activations
    n_tp = (it.tp_attn + it.tp_ffn * (etp > 1)) * passes
    tp_bw_inside = tp <= links.domain
    with np.errstate(divide="ignore"):
        tp_time = np.where(tp > 1, n_tp * ((tp - 1.0) / tp * tok * it.d * ACT_BYTES / np.where(
            tp_bw_inside, links.su, links.so) + links.latency), 0.0)
    tp_exp = np.where(_col(c.tp_overlap) > 0, np.maximum(tp_time - t_gemm, 0.0), tp_time)
    # CP: each rank's K and V pass around the ring forward; K, V and their gradients backward
    cp_inside = tp * cp <= links.domain
    with np.errstate(divide="ignore"):
        cp_time = np.where((cp > 1) & (it.kv > 0), (cp - 1.0) * (1.0 + 2.0 + full) * (
            share * it.kv / np.where(cp_inside, links.su, links.so) + links.latency), 0.0)
    cp_exp = np.maximum(cp_time - t_attn, 0.0)
    # EP: dispatch (in the GEMM format where narrower, as DeepSeek-V3) and combine (bf16) per MoE item and pass
    ep_time = np.zeros_like(compute)
    if it.n_experts:
        group = ep * etp
        up, out = dispatch_copies(it.n_experts, it.top_k, ep, etp, 1.0, group, links.domain)
        local = np.minimum(group, links.domain)
        a2a_su = links.su * alltoall_factor(local, np.full_like(local, links.topo), links.domain)
        nbytes = share * it.d * (np.minimum(qbytes, ACT_BYTES) + ACT_BYTES)
        with np.errstate(divide="ignore", invalid="ignore"):
            t_out = np.where(out > 0, out * nbytes / links.so, 0.0)
        a2a = np.maximum(up * nbytes / a2a_su, t_out) + 2.0 * links.latency
        ep_time = np.where((ep > 1) & (it.moe > 0), passes * a2a, 0.0)
    ep_exp = np.where(_col(c.ep_overlap) > 0, np.maximum(ep_time - t_gemm - t_attn, 0.0), ep_time)
    # memory: weights, fp32 gradient buffers, Adam states, each sharded by the ZeRO stage
    zero = _col(c.zero)
    pd = it.dense_params / tp
    pr = it.routed_params / (ep * etp)
    n_dp, n_edp = _col(c.zero_group), dp * cp * tp / (ep * etp)
    grad = np.where(zero >= 1, ACT_BYTES, MAIN_GRAD_BYTES)
    static = sum(b * (pd / np.where(zero >= z, n_dp, 1.0) + pr / np.where(zero >= z, n_edp, 1.0))
                 for b, z in ((ACT_BYTES, 3), (grad, 2), (ADAM_BYTES + MAIN_GRAD_BYTES * (zero >= 1), 1)))
    act = np.zeros_like(compute)
    for k, name in enumerate(RECOMPUTE):
        act = np.where(_col(rc == k), share * it.act[name], act)
    # GEMM inputs kept for the backward in the GEMM's format where narrower (Transformer Engine keeps its casts)
    act = act - np.where(_col(rc < RECOMPUTE.index("full")), share * it.quant * (ACT_BYTES - np.minimum(
        qbytes, ACT_BYTES)), 0.0)
    hw = gemm_flops + bf16_flops + head_flops + attn_flops
    return _Terms(compute, t_gemm, t_attn, tp_exp + cp_exp + ep_exp, tp_time, cp_time, ep_time, tp_exp, cp_exp,
                  ep_exp, static, act, pd, pr, hw)


def _rate(system: System, code: int, eff: TrainEfficiency) -> float:
    dtype = TRAIN_DTYPES[int(code)]
    return gemm_rate(system, dtype) * eff.gemm_share(dtype)


# ---- the pipeline partition ------------------------------------------------------------------------------------------
PARTITION_TOL = 1e-9
"""The partition program's bottleneck is optimal to this relative precision; among the partitions within it the
program returns the one whose first stage holds the most items, then the second, ... (the greedy's)."""
BISECTION_STEPS = 64
FAMILY_BATCH = 4_000_000
"""Elements (candidates x members x chunks) the interleaved partition evaluates at once."""


def in_flight(p: int, v: int, m: np.ndarray) -> np.ndarray:
    """Micro-batches whose activations each of ``p`` devices holds (candidates x devices): 1F1B's first stage
    holds p, the last one; interleaved over v chunks the first holds p + (p - 1) / v (Korthikanti et al. 2022,
    Sec. 4.2.3), bounded by the m micro-batches of the step.
    """
    d = np.arange(p, dtype=np.float64)[None, :]
    held = (p - d) + (p - 1.0 - d) / v if v > 1 else p - d
    return np.minimum(held, np.asarray(m, dtype=np.float64)[:, None])


def _runs(load: np.ndarray, static: np.ndarray, act: np.ndarray) -> list[tuple[int, int]]:
    """(first item, length) of each run of consecutive items that are alike for every candidate."""
    same = (load[:, 1:] == load[:, :-1]).all(axis=0) & (static[:, 1:] == static[:, :-1]).all(axis=0) & (
        act[:, 1:] == act[:, :-1]).all(axis=0)
    starts = [0] + [i + 1 for i in np.flatnonzero(~same)]
    return [(a, b - a) for a, b in zip(starts, [*starts[1:], load.shape[1]], strict=True)]


def _greedy(load: np.ndarray, static: np.ndarray, act: np.ndarray, held: np.ndarray, cap: np.ndarray,
            floor: np.ndarray, bound: np.ndarray, p: int) -> tuple[np.ndarray, np.ndarray]:
    """Items in order into p nonempty contiguous stages, each taking every item it can: its time max(sum,
    ``floor``) within ``bound`` and its memory (static + held x activations) within ``cap``, leaving one item for
    each later stage. Exact for feasibility (a stage of any feasible partition ends no later than the greedy's:
    by induction on the stages, every constraint being monotone in the items a stage holds). A run of alike
    items is taken in one count, so a pass costs (runs + stages) array operations. Returns (feasible, items per
    stage).
    """
    n_c, n = load.shape
    runs = _runs(load, static, act)
    first = np.array([a for a, _ in runs])
    length = np.array([b for _, b in runs])
    rows = np.arange(n_c)
    r = np.zeros(n_c, dtype=int)  # current run
    used = np.zeros(n_c, dtype=int)  # of its items, taken
    stage = np.zeros(n_c, dtype=int)
    t, ms, ma = np.zeros(n_c), np.zeros(n_c), np.zeros(n_c)
    count = np.zeros(n_c, dtype=int)
    ok = floor <= bound
    counts = np.zeros((n_c, p), dtype=int)
    with np.errstate(divide="ignore", invalid="ignore"):
        for _ in range(len(runs) + p + 1):
            live = (r < len(runs)) & ok
            if not live.any():
                break
            i = first[np.minimum(r, len(runs) - 1)]
            w, s_, a_ = load[rows, i], static[rows, i], act[rows, i]
            h = held[rows, np.minimum(stage, p - 1)]
            pos = i + used
            by_time = np.where(w > 0, np.floor((bound - t) / w), np.inf)
            room = s_ + h * a_
            by_mem = np.where(room > 0, np.floor((cap - ms - h * ma) / room), np.inf)
            leave = (n - pos) - (p - 1 - stage)
            rest = length[np.minimum(r, len(runs) - 1)] - used
            k = np.minimum.reduce([rest, np.maximum(by_time, 0), np.maximum(by_mem, 0), leave]).astype(int)
            stuck = (k <= 0) & (count == 0)  # not even one item fits a fresh stage
            ok &= ~(live & stuck)
            k = np.where(live & ~stuck, np.maximum(k, 0), 0)
            t, ms, ma = t + k * w, ms + k * s_, ma + k * a_
            count, used = count + k, used + k
            counts[rows, np.minimum(stage, p - 1)] += np.where(live, k, 0)
            done_run = live & (used >= length[np.minimum(r, len(runs) - 1)])
            close = live & ~done_run
            r, used = np.where(done_run, r + 1, r), np.where(done_run, 0, used)
            stage = np.where(close, stage + 1, stage)
            ok &= stage < p
            t, ms, ma = np.where(close, 0.0, t), np.where(close, 0.0, ms), np.where(close, 0.0, ma)
            count = np.where(close, 0, count)
    return ok & (r >= len(runs)) & (stage == p - 1), counts


def greedy_partition(load: np.ndarray, static: np.ndarray, act: np.ndarray, held: np.ndarray, cap: np.ndarray,
                     floor: np.ndarray, p: int) -> tuple[np.ndarray, np.ndarray]:
    """The partition of items into p contiguous stages (one chunk per device) minimizing the busiest stage's time
    within memory: bisection on the bottleneck over the exact greedy feasibility test (`_greedy`), to a relative
    `PARTITION_TOL`. Returns (some partition fits, items per stage); where none fits, the fastest partition.
    """
    total = load.sum(axis=1)
    hi = np.maximum(total, floor) * (1.0 + PARTITION_TOL)
    ok, _ = _greedy(load, static, act, held, cap, floor, hi, p)
    cap = np.where(ok, cap, np.inf)  # where no partition fits, the fastest one (reported as not fitting)
    lo = np.maximum(np.maximum(load.max(axis=1), total / p), floor)
    at_lo, _ = _greedy(load, static, act, held, cap, floor, lo, p)
    hi = np.where(at_lo, lo, np.minimum(hi, lo + load.max(axis=1) * (1.0 + PARTITION_TOL)))
    hi = np.where(at_lo | _greedy(load, static, act, held, cap, floor, hi, p)[0], hi,
                  np.maximum(total, floor) * (1.0 + PARTITION_TOL))
    for _ in range(BISECTION_STEPS):
        live = ~at_lo & (hi - lo > PARTITION_TOL * 0.25 * hi)
        if not live.any():
            break
        idx = np.flatnonzero(live)
        mid = 0.5 * (lo[idx] + hi[idx])
        feas, _ = _greedy(load[idx], static[idx], act[idx], held[idx], cap[idx], floor[idx], mid, p)
        hi[idx] = np.where(feas, mid, hi[idx])
        lo[idx] = np.where(feas, lo[idx], mid)
    _, counts = _greedy(load, static, act, held, cap, floor, hi * (1.0 + PARTITION_TOL), p)
    return ok, counts


@lru_cache(maxsize=1024)
def chunk_families(n_layers: int, chunks: int) -> tuple[tuple[int, int, int], ...]:
    """(first, middle, last) layer counts of the interleaved partitions: the first chunk holds the embedding and
    ``first`` layers, each of the chunks - 2 middle chunks ``middle`` layers, the last chunk ``last`` layers, the
    MTP modules and the head (Megatron-Core's layouts with uneven first and last stages), in the order tried:
    ``middle`` within one of layers / chunks (from its floor - 1 to its ceiling + 1, at least 1), ``first`` and
    ``last`` at most 2 ``middle`` + 2 (the embedding is light, the head at most a few layers' work).
    """
    mid = max(chunks - 2, 1)
    q_lo = max(1, n_layers // chunks - 1)
    q_hi = min(n_layers // mid, -(-n_layers // chunks) + 1)
    out = []
    for q in range(q_lo, q_hi + 1):
        rest = n_layers - (chunks - 2) * q
        out += [(a, q, rest - a) for a in range(rest + 1) if a <= 2 * q + 2 and rest - a <= 2 * q + 2]
    return tuple(out)


def family_counts(items: Items, chunks: int, family: tuple[int, int, int]) -> list[int]:
    """Items per chunk of one interleaved partition family member."""
    a, q, b = family
    return [1 + a] + [q] * (chunks - 2) + [b + items.n_mtp + 1]


@dataclass
class _Placed:
    """A partition's consequences per candidate and device."""

    chunk: np.ndarray  # (candidates, chunks) time of a micro-batch's forward + backward on each chunk
    device: np.ndarray  # (candidates, devices)
    compute: np.ndarray  # (candidates, devices) compute part
    static: np.ndarray
    act: np.ndarray
    dense: np.ndarray  # parameters per chip (before ZeRO sharding)
    routed: np.ndarray


def _place(terms: _Terms, counts: np.ndarray, p: int, floor: np.ndarray) -> _Placed:
    """Chunk and device sums of the item terms for item counts per chunk (candidates x chunks)."""
    n_c, n_chunks = counts.shape
    ends = np.cumsum(counts, axis=1)
    starts = ends - counts

    def sums(x: np.ndarray) -> np.ndarray:
        cum = np.concatenate([np.zeros((n_c, 1)), np.cumsum(x, axis=1)], axis=1)
        return np.take_along_axis(cum, ends, axis=1) - np.take_along_axis(cum, starts, axis=1)

    def per_device(x: np.ndarray) -> np.ndarray:
        return x.reshape(n_c, n_chunks // p, p).sum(axis=1)

    chunk = np.maximum(sums(terms.compute + terms.exposed), floor[:, None])
    return _Placed(chunk, per_device(chunk), per_device(sums(terms.compute)), per_device(sums(terms.static)),
                   per_device(sums(terms.act)), per_device(sums(terms.params_dense)),
                   per_device(sums(terms.params_routed)))


def _interleaved(items: Items, terms: _Terms, held: np.ndarray, cap: np.ndarray, floor: np.ndarray, p: int,
                 v: int) -> tuple[np.ndarray, np.ndarray]:
    """The interleaved partition: every member of `chunk_families` tried, the least bottleneck of those within
    memory kept (the first tried on a tie). Returns (some member fits, items per chunk); where none fits, the
    fastest member.
    """
    n_c, chunks = len(cap), p * v

    def cum(x: np.ndarray) -> np.ndarray:
        return np.concatenate([np.zeros((n_c, 1)), np.cumsum(x, axis=1)], axis=1)

    load, static, act = cum(terms.compute + terms.exposed), cum(terms.static), cum(terms.act)
    members = np.array([family_counts(items, chunks, fam) for fam in chunk_families(items.n_layers, chunks)])
    ends = np.cumsum(members, axis=1)
    starts = ends - members
    device = np.empty((n_c, len(members)))
    fits = np.empty((n_c, len(members)), dtype=bool)
    step = max(1, FAMILY_BATCH // max(n_c * chunks, 1))
    for lo in range(0, len(members), step):
        e, b = ends[lo:lo + step], starts[lo:lo + step]

        def per_device(c: np.ndarray, e: np.ndarray = e, b: np.ndarray = b) -> np.ndarray:
            return (c[:, e] - c[:, b]).reshape(n_c, len(e), v, p).sum(axis=2)

        device[:, lo:lo + step] = np.maximum(load[:, e] - load[:, b], floor[:, None, None]).reshape(
            n_c, len(e), v, p).sum(axis=2).max(axis=2)
        fits[:, lo:lo + step] = (per_device(static) + held[:, None, :] * per_device(act) <= cap[:, None, None]
                                 ).all(axis=2)
    ok = fits.any(axis=1)
    value = np.where(fits | ~ok[:, None], device, np.inf)  # where none fits, the fastest member
    least = value.min(axis=1, keepdims=True)
    first = (value <= least * (1.0 + PARTITION_TOL)).argmax(axis=1)  # the first member within the tolerance
    return ok, members[first]


# ---- the step -----------------------------------------------------------------------------------------------------
def train_steps(model: Architecture, system: System, c: TrainCandidates, global_batch: int | np.ndarray, seq: int,
                eff: TrainEfficiency | None = None, stages: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """Every candidate's optimizer step of ``global_batch`` sequences (one for all, or one per candidate) of ``seq``
    tokens on ``system`` (arrays).

    ``stages`` (candidates x chunks, items per chunk) fixes the partition; by default the partition program
    chooses it: for one chunk per device the bottleneck-optimal contiguous partition within memory
    (`greedy_partition`), for interleaved chunks the best member of `chunk_families`.
    """
    eff = eff or training_efficiency_for(system.id)
    it, links, terms, m = _setup(model, system, c, global_batch, seq, eff, stages is None)
    n_c = len(c)
    cap = np.full(n_c, system.hbm_capacity * eff.hbm_usable)
    # what every device holds besides its items: FSDP's gathered layers in flight, the layer full recompute rebuilds
    gathered = np.where(c.zero == 3, 2.0 * ACT_BYTES * (terms.params_dense + terms.params_routed)[:, 1:-1].max(
        axis=1, initial=0.0), 0.0)
    rebuilt = np.where(np.isin(c.recompute, (RECOMPUTE.index("full"), RECOMPUTE.index("reversible"))),
                       (c.micro_batch * seq / (c.cp * c.tp)) * it.act_full.max(), 0.0)
    tied = np.where((c.pp == 1) & it.tied, terms.static[:, -1], 0.0)  # the head is the embedding on one stage
    cap_items = cap - gathered - rebuilt + tied
    p2p = links.p2p(c.micro_batch * seq / (c.cp * c.tp) * it.d * ACT_BYTES,
                    c.chips <= links.domain) * np.where(c.pp > 1, 2.0, 0.0)
    stage_text = np.empty(n_c, dtype=object)
    pipeline, hbm_items, busiest, compute_dev = (np.zeros(n_c) for _ in range(4))
    weights, dp_exposed, dp_time, optimizer = (np.zeros(n_c) for _ in range(4))
    fits_part = np.zeros(n_c, dtype=bool)
    for p, v in sorted({(int(a), int(b)) for a, b in zip(c.pp, c.interleave, strict=True)}):
        idx = np.flatnonzero((c.pp == p) & (c.interleave == v))
        sub = _sub(terms, idx)
        held = in_flight(p, v, m[idx])
        if stages is not None:
            counts = np.asarray(stages)[idx].astype(int)
            ok = np.ones(len(idx), dtype=bool)
        elif p == 1:
            counts = np.full((len(idx), 1), len(it), dtype=int)
            ok = np.ones(len(idx), dtype=bool)
        elif v == 1:
            ok, counts = greedy_partition(sub.compute + sub.exposed, sub.static, sub.act, held, cap_items[idx],
                                          p2p[idx], p)
        else:
            ok, counts = _interleaved(it, sub, held, cap_items[idx], p2p[idx], p, v)
        placed = _place(sub, counts, p, p2p[idx])
        mem = placed.static + held * placed.act
        fits_part[idx] = ok & (mem <= cap_items[idx][:, None]).all(axis=1)
        tmax = placed.device.max(axis=1)
        pipeline[idx] = m[idx] * tmax + (placed.chunk.sum(axis=1) - tmax) / v
        busiest[idx] = tmax
        compute_dev[idx] = placed.compute.max(axis=1)
        hbm_items[idx] = (mem + (gathered - tied)[idx][:, None]).max(axis=1)
        weights[idx] = ACT_BYTES * (placed.dense + placed.routed).max(axis=1)
        dp_exposed[idx], dp_time[idx], optimizer[idx] = _data_parallel(c.take(idx), placed, m[idx], links, system,
                                                                       eff)
        stage_text[idx] = [",".join(map(str, row)) for row in counts]
    step = pipeline + dp_exposed + optimizer
    tokens = np.asarray(global_batch, dtype=np.float64) * seq
    chips = c.chips
    hbm = hbm_items + rebuilt
    model_flops = tokens * float(np.sum(3.0 * (it.gemm + it.gemm_bf16 + it.head) + 3.0 * it.attn))
    hw_flops = terms.hw_flops.sum(axis=1) * c.tp * c.cp * c.dp * m
    with np.errstate(invalid="ignore"):
        usd = chips * system.price_per_s * step / tokens * 1e6
    # MFU against the peak of the format the linear layers run in (BF16 for BF16 GEMMs, FP8 for FP8, ...)
    peak = np.array([gemm_rate(system, TRAIN_DTYPES[int(k)]) for k in c.gemm_dtype])
    return {
        "chips": chips, "step_s": step, "pipeline_s": pipeline, "compute_s": m * compute_dev,
        "bubble_s": pipeline - m * busiest, "dp_s": dp_time, "dp_exposed_s": dp_exposed, "optimizer_s": optimizer,
        "tp_s": m * terms.tp.sum(axis=1) / c.pp, "cp_s": m * terms.cp.sum(axis=1) / c.pp,
        "ep_s": m * terms.ep.sum(axis=1) / c.pp, "tp_exposed_s": m * terms.tp_exp.sum(axis=1) / c.pp,
        "cp_exposed_s": m * terms.cp_exp.sum(axis=1) / c.pp, "ep_exposed_s": m * terms.ep_exp.sum(axis=1) / c.pp,
        "model_flops": np.broadcast_to(model_flops, (n_c,)).copy(), "hardware_flops": hw_flops,
        "mfu": model_flops / (step * chips * peak), "mfu_bf16": model_flops / (step * chips * system.flops["bf16"]),
        "tokens_per_s": tokens / step,
        "tokens_per_s_per_chip": tokens / step / chips, "hbm_bytes_per_chip": hbm,
        "weights_bytes_per_chip": weights, "fits": fits_part & (hbm <= cap),
        "micro_batches": m, "usd_per_mtok": usd, "stages": stage_text, "busiest_device_s": busiest,
    }


def _setup(model: Architecture, system: System, c: TrainCandidates, global_batch: int, seq: int,
           eff: TrainEfficiency, families: bool) -> tuple[Items, _Links, _Terms, np.ndarray]:
    """The model's items, the system's links, the per-item terms and the micro-batches per step; an InputError
    where a layout has more chunks than the model can fill (``families``: interleaved layouts need a member of
    `chunk_families`).
    """
    it = model_items(model, seq)
    links = _check(model, system, c, seq, eff, families)
    return it, links, _terms(it, system, c, seq, eff, links), global_batch / (c.dp * c.micro_batch)


def _check(model: Architecture, system: System, c: TrainCandidates, seq: int, eff: TrainEfficiency,
           families: bool) -> _Links:
    """The system's links; an InputError for the first layout `refused` names."""
    it = model_items(model, seq)
    chunks = _too_many_chunks(it, c, families)
    if np.any(chunks):
        i = int(np.argmax(chunks))
        raise InputError(f"training layout PP{int(c.pp[i])} x {int(c.interleave[i])} chunks: '{model.id}' has "
                         f"{it.n_layers} layers, {len(it)} items with its embedding, MTP and head; no partition of "
                         "`chunk_families` places them")
    links = _Links(system, eff)
    links.check(c.chips)
    return links


def _too_many_chunks(it: Items, c: TrainCandidates, families: bool) -> np.ndarray:
    most = np.where(c.interleave > 1, it.n_layers + 2, len(it))
    empty = np.array([families and v > 1 and not chunk_families(it.n_layers, int(p * v))
                      for p, v in zip(c.pp, c.interleave, strict=True)], dtype=bool)
    return (c.pp * c.interleave > most) | empty


def refused(model: Architecture, system: System, c: TrainCandidates, seq: int) -> np.ndarray:
    """Candidates `train_steps` refuses with an InputError: more pipeline chunks than the model has items
    (interleaved: than layers + 2, or no member of `chunk_families`), or more chips than one scale-up domain on a
    system whose scale-out bandwidth the catalog does not know.
    """
    so = system.scaleout_bandwidth
    no_scaleout = not (math.isfinite(so) and so > 0)
    return _too_many_chunks(model_items(model, seq), c, True) | (no_scaleout & (c.chips > system.scaleup_domain))


ITEM_ARRAYS = ("gemm", "gemm_bf16", "head", "ffn_up", "attn", "dense_params", "routed_params", "act_full", "ew",
               "quant", "tp_attn", "tp_ffn", "moe", "kv")


@lru_cache(maxsize=64)
def distinct_items(model: Architecture, seq: int) -> tuple[Items, np.ndarray]:
    """The model's distinct items (alike layers once) and how many times each occurs: per-item sums over the model
    taken on these, weighted by the counts, cost one column per kind of item instead of one per layer.
    """
    it = model_items(model, seq)
    stacked = np.vstack([getattr(it, k) for k in ITEM_ARRAYS] + [it.act[k] for k in RECOMPUTE])
    _, first, inverse, counts = np.unique(stacked, axis=1, return_index=True, return_inverse=True,
                                          return_counts=True)
    keep = np.sort(first)
    order = np.argsort(first)  # unique columns in order of first occurrence
    counts = counts[order]
    sub = {k: getattr(it, k)[keep] for k in ITEM_ARRAYS}
    return replace(it, kind=tuple(it.kind[i] for i in keep), act={k: v[keep] for k, v in it.act.items()},
                   **sub), counts.astype(np.float64)


def step_floor(model: Architecture, system: System, c: TrainCandidates, global_batch: int, seq: int,
               eff: TrainEfficiency | None = None) -> np.ndarray:
    """A lower bound of each candidate's step (`train_steps`) that needs no partition: the chunks' times add up
    to at least the items' compute and exposed communication S, the busiest device holds at least S / PP, so the
    pipeline takes at least (m + (PP - 1) / v) S / PP (its time grows with the busiest device's); the
    data-parallel and optimizer terms are at least 0.
    """
    eff = eff or training_efficiency_for(system.id)
    links = _check(model, system, c, seq, eff, True)
    it, counts = distinct_items(model, seq)
    terms = _terms(it, system, c, seq, eff, links)
    total = (terms.compute + terms.exposed) @ counts
    m = global_batch / (c.dp * c.micro_batch)
    return total * (m + (c.pp - 1.0) / c.interleave) / c.pp


def _sub(terms: _Terms, idx: np.ndarray) -> _Terms:
    return _Terms(**{f.name: getattr(terms, f.name)[idx] for f in fields(_Terms)})


def _data_parallel(c: TrainCandidates, placed: _Placed, m: np.ndarray, links: _Links, system: System,
                   eff: TrainEfficiency) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(exposed data-parallel communication, its whole time, the optimizer step) per candidate of one pipeline
    shape: the ZeRO stage's collectives of each device's parameters against the compute that hides them (the
    schedule of the module docstring), the busiest device setting the step.
    """
    tp, cp, dp, ep, etp = (_col(getattr(c, k)) for k in ("tp", "cp", "dp", "ep", "etp"))
    n_dp, n_edp = _col(c.zero_group), dp * cp * tp / (ep * etp)
    ones = np.ones_like(placed.dense)
    rs = (links.reduce_scatter(ACT_BYTES * placed.dense, tp * ones, n_dp * ones)
          + links.reduce_scatter(ACT_BYTES * placed.routed, ep * etp * ones, n_edp * ones))
    # hybrid sharding: each shard's gradients are all-reduced across the replicas of the shard group, once a step
    rep = 2.0 * links.reduce_scatter(ACT_BYTES * placed.dense / n_dp, tp * n_dp * ones, dp * cp / n_dp * ones)
    ag = rs
    fwd, bwd = placed.compute / 3.0, 2.0 * placed.compute / 3.0
    hide = _col(c.grad_overlap) > 0
    z, mi = _col(c.zero), _col(m)

    def after(comm: np.ndarray, window: np.ndarray) -> np.ndarray:
        return np.where(hide, np.maximum(comm - window, 0.0), comm)

    exposed = np.select([z == 0, z == 1, z == 2], [
        after(2.0 * rs, bwd),
        after(rs + rep, bwd) + after(ag, fwd),
        (mi - 1.0) * after(rs, bwd) + after(rs + rep, bwd) + after(ag, fwd)],
        (mi - 1.0) * (after(ag, fwd) + after(ag + rs, bwd)) + after(ag, fwd) + after(ag + rs + rep, bwd))
    whole = np.select([z == 0, z == 1, z == 2], [2.0 * rs, rs + ag + rep, mi * rs + ag + rep],
                      mi * (2.0 * ag + rs) + rep)
    local = placed.dense / np.where(z >= 1, n_dp, 1.0) + placed.routed / np.where(z >= 1, n_edp, 1.0)
    optim = local.max(axis=1) * OPTIMIZER_TRAFFIC / (system.hbm_bandwidth * eff.memory)
    return exposed.max(axis=1), whole.max(axis=1), optim


def train_step(model: Architecture, system: System, lay: TrainLayout, global_batch: int, seq: int,
               eff: TrainEfficiency | None = None, ideal: bool = False, stack: str = "") -> dict:
    """One layout's optimizer step (`train_steps` on one candidate), the figures as floats; ``stages`` is the
    chosen partition (items per chunk).
    """
    check_formats(system, lay)
    eff = TRAIN_IDEAL if ideal else (eff or training_efficiency_for(system.id, stack))
    stages = None
    if lay.stages is not None:
        if len(lay.stages) != lay.pp * lay.interleave or sum(lay.stages) != len(model_items(model, seq)) or min(
                lay.stages) < 1:
            raise InputError(f"training layout stages {lay.stages}: need {lay.pp * lay.interleave} positive item "
                             f"counts summing to {len(model_items(model, seq))} (embedding, layers, MTP, head)")
        stages = np.asarray([lay.stages])
    r = train_steps(model, system, TrainCandidates.from_layouts([lay]), global_batch, seq, eff, stages)
    out = {k: (v[0].item() if isinstance(v[0], np.generic) else v[0]) for k, v in r.items()}
    out["stages"] = tuple(int(x) for x in str(out["stages"]).split(","))
    return out
