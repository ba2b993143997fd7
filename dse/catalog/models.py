"""The model catalog: architectures, derived parameter counts and KV-cache bytes per token.

Counts follow the publishers' configuration files: every weight matrix, bias and norm, without
the multi-token-prediction module. Attention variants: MHA/GQA/MQA, MLA latent caches, sliding
windows, cross-layer KV sharing and top-k sparse attention with a cached indexer.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from functools import cached_property, lru_cache
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from dse.catalog.loading import read_yaml, validation_message
from dse.catalog.units import DTYPE_BYTES
from dse.errors import InputError, unknown_name_message

MODEL_DIR = Path(__file__).resolve().parents[2] / "model_catalog"


def model_dir() -> Path:
    """The model catalog folder: ``$DSE_MODEL_CATALOG`` if set, else the embedded one."""
    return Path(os.environ.get("DSE_MODEL_CATALOG") or MODEL_DIR)


class _Strict(BaseModel):
    """Strict fields: no unknown keys, no booleans or strings as numbers, no NaN or infinity. A class's validator is
    built when it first validates (``defer_build``): a nested class is validated inside its parent's validator, so
    its own is never built on the way of a question (some 0.02 s of start-up).
    """

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False, defer_build=True)


Pos = Annotated[int, Field(gt=0, le=10**9)]
"""A size that must be a positive whole number."""
Count = Annotated[int, Field(ge=0, le=10**9)]
"""A count that may be zero."""


class SparseAttention(_Strict):
    """Top-k token selection (DeepSeek Sparse Attention): a lightweight indexer scores every
    cached token with its own cached keys, and the main attention reads only the top_k.
    """

    top_k: Pos
    indexer_heads: Pos
    indexer_head_dim: Pos
    indexer_dtype: Literal["bf16", "fp8", "fp4"] = "fp8"


class LinearAttention(_Strict):
    """Linear-attention layers in place of softmax attention on ``layers`` of the model (Gated
    DeltaNet, as Qwen3-Next/Qwen3.5): no KV cache, a fixed per-sequence state of v_heads x v_head_dim x
    k_head_dim (recurrent) plus (2 k_dim + v_dim) x (conv_kernel - 1) (convolution).
    """

    kind: Literal["gated_deltanet"]
    layers: Pos
    k_heads: Pos
    v_heads: Pos
    k_head_dim: Pos
    v_head_dim: Pos
    conv_kernel: Pos = 4
    state_dtype_bytes: Annotated[float, Field(gt=0, le=16)] = 4.0


class Attention(_Strict):
    """Attention block of every layer (the softmax layers; ``linear`` replaces it on some layers)."""

    kind: Literal["mha", "gqa", "mqa", "mla"]
    n_heads: Pos
    n_kv_heads: Pos | None = None
    head_dim: Pos | None = None
    q_lora_rank: Pos | None = None
    kv_lora_rank: Pos | None = None
    qk_nope_head_dim: Pos | None = None
    qk_rope_head_dim: Pos | None = None
    v_head_dim: Pos | None = None
    bias: bool = False
    qk_norm: bool = False
    sinks: bool = False
    sliding_window: Pos | None = None
    sliding_layers: Count = 0
    kv_shared_layers: Pos = 1
    sparse: SparseAttention | None = None
    output_gate: bool = False  # q_proj also emits a sigmoid gate on the attention output (Qwen3-Next/3.5)
    linear: LinearAttention | None = None

    @model_validator(mode="after")
    def _check(self) -> Attention:
        if self.kind == "mla":
            for name in ("kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"):
                if getattr(self, name) is None:
                    raise ValueError(f"attention.kind 'mla' needs '{name}'")
        else:
            if self.n_kv_heads is None or self.head_dim is None:
                raise ValueError(f"attention.kind '{self.kind}' needs 'n_kv_heads' and 'head_dim'")
            if self.kind == "mha" and self.n_kv_heads != self.n_heads:
                raise ValueError(f"mha needs n_kv_heads == n_heads, got {self.n_kv_heads} and {self.n_heads}")
            if self.kind == "mqa" and self.n_kv_heads != 1:
                raise ValueError(f"mqa needs n_kv_heads == 1, got {self.n_kv_heads}")
            if self.n_heads % self.n_kv_heads:
                raise ValueError(f"n_heads ({self.n_heads}) must be a multiple of n_kv_heads ({self.n_kv_heads})")
        if self.sliding_layers and not self.sliding_window:
            raise ValueError("sliding_layers needs sliding_window")
        if self.linear and (self.sliding_layers or self.kind == "mla"):
            raise ValueError("attention.linear cannot be combined with sliding_layers or mla")
        if self.kv_shared_layers < 1:
            raise ValueError(f"kv_shared_layers must be >= 1, got {self.kv_shared_layers}")
        return self


class FFN(_Strict):
    """Feed-forward block: a dense gated MLP or a mixture of experts."""

    kind: Literal["dense", "moe"]
    d_ff: Pos | None = None
    n_experts: Count = 0
    top_k: Count = 0
    n_shared: Count = 0
    d_ff_expert: Pos | None = None
    dense_layers: Count = 0
    d_ff_dense: Pos | None = None
    bias: bool = False
    router_bias: bool = False
    gated: bool = True  # SwiGLU-style (3 matrices); False: the GPT-style MLP (2 matrices)

    @model_validator(mode="after")
    def _check(self) -> FFN:
        if self.kind == "dense" and not self.d_ff:
            raise ValueError("ffn.kind 'dense' needs 'd_ff'")
        if self.kind == "moe":
            if not (self.n_experts and self.top_k and self.d_ff_expert):
                raise ValueError("ffn.kind 'moe' needs 'n_experts', 'top_k' and 'd_ff_expert'")
            if self.top_k > self.n_experts:
                raise ValueError(f"top_k ({self.top_k}) cannot exceed n_experts ({self.n_experts})")
            if self.dense_layers and not self.d_ff_dense:
                raise ValueError("dense_layers needs 'd_ff_dense'")
        return self


class MTP(_Strict):
    """Multi-token-prediction modules trained beside the main head (DeepSeek-V3 report Sec. 2.2): each is two
    norms, a 2d -> d projection and one transformer layer of the model's last kind, sharing the embedding and the
    output head. Left out of the published totals; trained, and dropped or used for speculation at inference.
    """

    modules: Pos
    source: str


class Source(_Strict):
    title: str
    url: str = ""
    date: str


class MaxContext(_Strict):
    """The published maximum context window in tokens, with its source."""

    tokens: int = Field(gt=0)
    source: str
    date: str


class Published(_Strict):
    """Published parameter counts in billions and the precision they were rounded to."""

    total: Annotated[float, Field(gt=0)]
    active: Annotated[float, Field(gt=0)]
    precision_total: Annotated[float, Field(gt=0)]
    precision_active: Annotated[float, Field(gt=0)]
    source: str
    active_includes_embedding: bool = False
    active_excludes_lm_head: bool = False


class ModelSpec(_Strict):
    """One catalog entry as written in ``models.yaml``."""

    id: str
    name: str
    source: Source
    published_b: Published
    hypothetical: bool = False
    max_context: MaxContext | None = None
    note: str = ""
    d_model: Pos
    n_layers: Pos
    vocab: Pos
    tie_embeddings: bool = False
    attention: Attention
    ffn: FFN
    mtp: MTP | None = None

    @model_validator(mode="after")
    def _check(self) -> ModelSpec:
        if self.attention.linear and self.attention.linear.layers >= self.n_layers:
            raise ValueError(f"attention.linear.layers ({self.attention.linear.layers}) must be below n_layers")
        if self.attention.sliding_layers > self.n_layers:
            raise ValueError(f"sliding_layers ({self.attention.sliding_layers}) exceeds n_layers ({self.n_layers})")
        if self.ffn.dense_layers >= self.n_layers:
            raise ValueError(f"dense_layers ({self.ffn.dense_layers}) must be below n_layers ({self.n_layers})")
        return self


@dataclass(frozen=True)
class Architecture:
    """A model with its derived counts; all counts are parameters or elements, not bytes."""

    spec: ModelSpec

    @property
    def id(self) -> str:
        return self.spec.id

    # -- per-layer parameter counts -------------------------------------------------------
    @cached_property
    def attention_params_per_layer(self) -> int:
        """Weights of one attention block, its norms and (if any) its sparse indexer."""
        a, d = self.spec.attention, self.spec.d_model
        if a.kind == "mla":
            qk = a.qk_nope_head_dim + a.qk_rope_head_dim
            if a.q_lora_rank:
                q = d * a.q_lora_rank + a.q_lora_rank + a.q_lora_rank * a.n_heads * qk
            else:
                q = d * a.n_heads * qk
            kv = d * (a.kv_lora_rank + a.qk_rope_head_dim) + a.kv_lora_rank
            kv += a.kv_lora_rank * a.n_heads * (a.qk_nope_head_dim + a.v_head_dim)
            o = a.n_heads * a.v_head_dim * d
            n = q + kv + o
        else:
            q_dim, kv_dim = a.n_heads * a.head_dim, a.n_kv_heads * a.head_dim
            n = d * q_dim * (2 if a.output_gate else 1) + 2 * d * kv_dim + q_dim * d
            if a.bias:
                n += q_dim + 2 * kv_dim + d
            if a.qk_norm:
                n += 2 * a.head_dim
            if a.sinks:
                n += a.n_heads
        if a.sparse:
            s = a.sparse
            q_in = a.q_lora_rank or d
            n += q_in * s.indexer_heads * s.indexer_head_dim + d * s.indexer_head_dim
            n += 2 * s.indexer_head_dim + d * s.indexer_heads
        return n + 2 * d  # pre-attention and pre-FFN norms

    @cached_property
    def linear_params_per_layer(self) -> int:
        """Weights of one Gated DeltaNet layer with its norms (HF Qwen3-Next layout): in_proj_qkvz,
        in_proj_ba, the depthwise conv, A_log and dt_bias, the gated RMSNorm, out_proj.
        """
        g, d = self.spec.attention.linear, self.spec.d_model
        if g is None:
            return 0
        k_dim, v_dim = g.k_heads * g.k_head_dim, g.v_heads * g.v_head_dim
        n = d * (2 * k_dim + 2 * v_dim) + d * 2 * g.v_heads + (2 * k_dim + v_dim) * g.conv_kernel
        n += 2 * g.v_heads + g.v_head_dim + v_dim * d
        return n + 2 * d  # pre-mixer and pre-FFN norms

    @property
    def linear_layers(self) -> int:
        g = self.spec.attention.linear
        return g.layers if g else 0

    def state_bytes_per_sequence(self) -> float:
        """Fixed per-sequence state of the linear-attention layers (recurrent + convolution), bytes."""
        g = self.spec.attention.linear
        if g is None:
            return 0.0
        recurrent = g.v_heads * g.v_head_dim * g.k_head_dim * g.state_dtype_bytes
        conv = (2 * g.k_heads * g.k_head_dim + g.v_heads * g.v_head_dim) * (g.conv_kernel - 1) * 2.0
        return g.layers * (recurrent + conv)

    def _mlp(self, d_ff: int, bias: bool) -> int:
        d, gated = self.spec.d_model, self.spec.ffn.gated
        matrices = 3 if gated else 2
        return matrices * d * d_ff + (((2 if gated else 1) * d_ff + d) if bias else 0)

    @cached_property
    def expert_params(self) -> int:
        """Weights of one routed expert in one layer (0 for dense models)."""
        f = self.spec.ffn
        return self._mlp(f.d_ff_expert, f.bias) if f.kind == "moe" else 0

    @cached_property
    def moe_layers(self) -> int:
        f = self.spec.ffn
        return self.spec.n_layers - f.dense_layers if f.kind == "moe" else 0

    @cached_property
    def dense_ffn_params_per_layer(self) -> int:
        """Always-active FFN weights of a layer: the dense MLP, or shared experts plus router."""
        f, d = self.spec.ffn, self.spec.d_model
        if f.kind == "dense":
            return self._mlp(f.d_ff, f.bias)
        return f.n_shared * self.expert_params + d * f.n_experts + (f.n_experts if f.router_bias else 0)

    # -- totals ---------------------------------------------------------------------------
    @cached_property
    def params_embedding(self) -> int:
        """The input embedding table (a lookup, no FLOPs)."""
        return self.spec.vocab * self.spec.d_model

    @cached_property
    def params_lm_head(self) -> int:
        return 0 if self.spec.tie_embeddings else self.spec.vocab * self.spec.d_model

    @cached_property
    def params_routed(self) -> int:
        """All routed-expert weights, sharded by expert parallelism."""
        return self.moe_layers * self.spec.ffn.n_experts * self.expert_params

    @cached_property
    def params_dense(self) -> int:
        """Every weight that is not a routed expert (attention, dense MLPs, shared experts, embeddings)."""
        f, s = self.spec.ffn, self.spec
        per_layer_ffn = self.moe_layers * self.dense_ffn_params_per_layer
        if f.kind == "moe" and f.dense_layers:
            per_layer_ffn += f.dense_layers * self._mlp(f.d_ff_dense, f.bias)
        else:
            per_layer_ffn = s.n_layers * self.dense_ffn_params_per_layer
        softmax_layers = s.n_layers - self.linear_layers
        return (
            softmax_layers * self.attention_params_per_layer
            + self.linear_layers * self.linear_params_per_layer
            + per_layer_ffn
            + self.params_embedding
            + self.params_lm_head
            + s.d_model  # final norm
        )

    @cached_property
    def params_total(self) -> int:
        return self.params_dense + self.params_routed

    @cached_property
    def params_active(self) -> int:
        """Weights a token touches in a forward pass, without the input-embedding lookup (which
        does no multiply-adds); this is the count whose 2x gives the weight FLOPs per token.
        """
        f = self.spec.ffn
        routed_active = self.moe_layers * f.top_k * self.expert_params
        return self.params_dense - self.params_embedding + routed_active

    @cached_property
    def params_mtp(self) -> int:
        """Weights of the MTP modules (not in `params_total`): per module two norms, the 2d -> d projection and one
        layer of the last layer's kind (its embedding and head shared with the main model).
        """
        s = self.spec
        if not s.mtp:
            return 0
        d = s.d_model
        ffn = self.dense_ffn_params_per_layer + s.ffn.n_experts * self.expert_params if self.is_moe else \
            self.dense_ffn_params_per_layer
        mixer = self.attention_params_per_layer if self.linear_layers < s.n_layers else self.linear_params_per_layer
        return s.mtp.modules * (2 * d + 2 * d * d + mixer + ffn)

    @property
    def max_context(self) -> int | None:
        """The published maximum context in tokens (None for a hypothetical model without one)."""
        return self.spec.max_context.tokens if self.spec.max_context else None

    def check_context(self, tokens: int, allow_beyond: bool = False, where: str = "--context") -> bool:
        """Whether ``tokens`` lies beyond the trained window; raises InputError unless ``allow_beyond``."""
        limit = self.max_context
        beyond = limit is not None and tokens > limit
        if beyond and not allow_beyond:
            raise InputError(
                f"{where}: {tokens:,} tokens is beyond the published maximum context of '{self.id}' "
                f"({limit:,} tokens, {self.spec.max_context.source}); allowed: at most {limit:,}, or opt in "
                "with allow_beyond_trained_context: true (--allow-beyond-trained-context)"
            )
        return beyond

    @property
    def active_as_published(self) -> int:
        """Active parameters counted as the publisher counts them (with the input embedding, or
        without the output head, where ``published_b`` says so).
        """
        pub = self.spec.published_b
        return (self.params_active + (self.params_embedding if pub.active_includes_embedding else 0)
                - (self.params_lm_head if pub.active_excludes_lm_head else 0))

    @property
    def is_moe(self) -> bool:
        return self.spec.ffn.kind == "moe"

    @property
    def sparsity(self) -> float:
        """Total over active weights: the lecture's sparsity ratio."""
        return self.params_total / self.params_active

    # -- KV cache ---------------------------------------------------------------------------
    @cached_property
    def kv_elems_per_layer(self) -> int:
        """KV elements cached per token per layer (K and V heads, or the MLA latent and RoPE key)."""
        a = self.spec.attention
        if a.kind == "mla":
            return a.kv_lora_rank + a.qk_rope_head_dim
        return 2 * a.n_kv_heads * a.head_dim

    @property
    def kv_heads(self) -> int:
        """KV heads tensor parallelism can split; an MLA latent is one unsplittable head."""
        a = self.spec.attention
        return 1 if a.kind == "mla" else a.n_kv_heads

    @cached_property
    def layer_groups(self) -> tuple[tuple[int, int, float, float], ...]:
        """(layers, stored KV layers, stored-token window, attended-token cap) per group of layers."""
        a, n = self.spec.attention, self.spec.n_layers
        share = a.kv_shared_layers
        groups = []
        full = n - a.sliding_layers - self.linear_layers
        cap = float(a.sparse.top_k) if a.sparse else math.inf
        if full:
            groups.append((full, math.ceil(full / share), math.inf, cap))
        if self.linear_layers:  # no KV and no attended tokens: their state is state_bytes_per_sequence
            groups.append((self.linear_layers, 0, 0.0, 0.0))
        if a.sliding_layers:
            w = float(a.sliding_window)
            groups.append((a.sliding_layers, math.ceil(a.sliding_layers / share), w, w))
        return tuple(groups)

    def indexer_bytes_per_token(self) -> float:
        """Cached indexer-key bytes per token over all layers (sparse attention only)."""
        s = self.spec.attention.sparse
        return 0.0 if s is None else self.spec.n_layers * s.indexer_head_dim * DTYPE_BYTES[s.indexer_dtype]

    def kv_bytes_per_token(self, kv_dtype: str = "bf16") -> float:
        """KV bytes stored per token of context, over all layers, at full windows."""
        stored = sum(g[1] for g in self.layer_groups)
        return stored * self.kv_elems_per_layer * DTYPE_BYTES[kv_dtype] + self.indexer_bytes_per_token()
        # (linear-attention layers hold a fixed state per sequence instead: state_bytes_per_sequence)

    def kv_bytes_per_sequence(self, context: float, kv_dtype: str = "bf16") -> float:
        """KV bytes one sequence of ``context`` tokens holds (sliding windows cap their layers)."""
        elems = sum(st * min(context, w) for _, st, w, _ in self.layer_groups) * self.kv_elems_per_layer
        state = self.state_bytes_per_sequence()
        return elems * DTYPE_BYTES[kv_dtype] + context * self.indexer_bytes_per_token() + state

    # -- attention FLOPs ------------------------------------------------------------------
    def attention_flops_per_attended_token(self, phase: str) -> float:
        """FLOPs per query token per attended key, per layer: 2 x heads x (qk dim + v dim).

        MLA decodes in the absorbed latent form (keys of kv_lora + rope, values of kv_lora) and
        prefills in the expanded form (DeepSeek-V2 paper, Sec. 2.1.3).
        """
        a = self.spec.attention
        if a.kind == "mla":
            if phase == "decode":
                return 2.0 * a.n_heads * (2 * a.kv_lora_rank + a.qk_rope_head_dim)
            return 2.0 * a.n_heads * (a.qk_nope_head_dim + a.qk_rope_head_dim + a.v_head_dim)
        return 4.0 * a.n_heads * a.head_dim

    def indexer_flops_per_scored_token(self) -> float:
        """FLOPs per query token per scored key per layer of the sparse-attention indexer."""
        s = self.spec.attention.sparse
        return 0.0 if s is None else 2.0 * s.indexer_heads * s.indexer_head_dim

    def attention_flops_per_token(self, context: float, phase: str = "decode") -> float:
        """Attention-score FLOPs of one token at ``context`` (decode), or per prompt token
        averaged over a causal prompt of ``context`` tokens (prefill).
        """
        per = self.attention_flops_per_attended_token(phase)
        if phase == "decode":
            attended = sum(n * min(context, cap) for n, _, _, cap in self.layer_groups)
            return per * attended + self.indexer_flops_per_scored_token() * self.spec.n_layers * context
        attended = sum(n * causal_attended(context, cap) for n, _, _, cap in self.layer_groups) / context
        scored = self.spec.n_layers * causal_attended(context, math.inf) / context
        return per * attended + self.indexer_flops_per_scored_token() * scored


def causal_attended(context: float, cap: float) -> float:
    """Sum over positions 1..L of min(position, cap): keys attended by a causal prompt of L tokens."""
    if context <= cap:
        return context * (context + 1) / 2
    return cap * (cap + 1) / 2 + (context - cap) * cap


def load_models(path: Path | None = None) -> dict[str, Architecture]:
    """Load and validate ``models.yaml``; errors name the file, the row and the field."""
    path = Path(path) if path else model_dir() / "models.yaml"
    doc = read_yaml(path)
    if not isinstance(doc, dict) or not isinstance(doc.get("models"), list):
        raise InputError(f"{path}: expected a top-level 'models:' list")
    out: dict[str, Architecture] = {}
    for i, entry in enumerate(doc["models"]):
        ident = entry.get("id", "?") if isinstance(entry, dict) else "?"
        where = f"{path}: models[{i}] (id '{ident}')"
        try:
            spec = ModelSpec.model_validate(entry)
        except ValidationError as exc:
            raise InputError(validation_message(exc, ModelSpec, where)) from None
        if spec.id in out:
            raise InputError(f"{where}: duplicate id '{spec.id}'")
        out[spec.id] = Architecture(spec)
    return out


@lru_cache(maxsize=1)
def default_models() -> dict[str, Architecture]:
    """The embedded model catalog, loaded once."""
    return load_models()


def get_model(model_id: str, models: dict[str, Architecture] | None = None) -> Architecture:
    """Look up a model by id; an unknown id names the close ones."""
    models = models if models is not None else default_models()
    if model_id not in models:
        raise InputError(unknown_name_message("model", model_id, models))
    return models[model_id]
