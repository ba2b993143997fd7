"""Vectorized roofline physics of one serving replica, over arrays of candidate configurations.

Per forward pass of a micro-batch through all pipeline stages (the decode step of the lecture: R. Pope, "The math
behind how LLMs are trained and served", Dwarkesh Podcast, 29 April 2026):

    compute = FLOPs / (chips per stage x FLOP/s)                 weights 2 x active params per
                                                                  token, plus attention FLOPs
    memory  = (weight bytes read + KV bytes read) per chip / HBM bandwidth, x PP
    comm    = TP all-reduce + EP all-to-all (scale-up, and scale-out for the share that leaves the
              domain) + PP hand-offs, x PP
    step    = max(compute, memory, comm) + fixed per-layer overhead
              (--ideal: communication fully overlapped, no fixed latencies: the lecture's roofline)
    Calibrated, the step is ov x max(comm, work) + (1 - ov) x (comm + work) + overhead, with
    work = k x max(compute, memory) + (1 - k) x (max(C_gemm, M_gemm) + max(C_attn, M_attn)), and each
    collective pays a fixed latency. The work splits the pass into its two kernel groups, which a GPU runs one
    after the other: the weight GEMMs (dense and routed experts; FLOPs against weight bytes) and attention
    (FLOPs against KV bytes); k (``kernel_overlap``, fitted per family on measured TPOTs at varying batch and
    context; 1 under --ideal) is the share costed as one roofline of the whole pass (`kernel_work`).

Kernel curves (half-performance lengths, Hockney's n_1/2; 0 under --ideal and for the families no measured
runs calibrate): a GEMM of m rows takes the time of m + ``gemm_half_rows`` rows at its asymptotic rate, so it
reaches half that rate at m = n_1/2 (tile padding, wave quantization, pipeline fill), paid once per dense weight
matrix of a rank and once per routed expert the busiest chip multiplies (``gemm_fixed_s``: what a speculative
verify pass or a prefill chunk joining the decode pass does not pay again); decode attention reads
``attention_half_context`` tokens of KV more per sequence and attention layer than it holds (split-KV
reduction, launch and occupancy at short contexts). The KV held is unchanged.

Number formats: dense and attention-block weights compute at the rate of ``weights_dtype``, routed
experts at that of ``experts_dtype``; a format the chip has no tensor units for is weight-only
quantization: stored narrow, dequantized to the narrowest native wider format, computed at that rate
and read with one FP16 scale per group of 128 weights (Marlin's W4A16 layout: 4.125 bits per 4-bit
weight, the 3.87x rather than 4x ideal of its README). Attention math runs at FP8 where the KV cache is
FP8 or narrower and the chip has FP8 tensor units (FlashAttention-3 / FlashMLA FP8), else at BF16,
never at the weights' FP4 rate.

Routed experts (uniform top-k routing): the slowest expert group sets the step. Its routed tokens and the
distinct experts it must read are the expected maxima over the EP groups of their per-group counts, not
the means (`expected_max_binomial`): at batch 1 on EP 72 some GPU reads a whole expert while the mean GPU
reads 1/9 of one. A placement's skew (``imbalance``, most-loaded group over the mean) adds to it.

KV of few heads over TP (``kv_shard``): split by head (what vLLM, SGLang and TensorRT-LLM do), a model with
fewer KV heads than TP ranks (MQA, MLA's one latent) keeps a whole copy of each sequence's KV on every rank
that needs its head. Split by batch (Pope et al., "Efficiently Scaling Transformer Inference", 2022, sec.
3.3), each TP rank holds the whole KV of 1/TP of the sequences and runs all heads' attention for them; the
queries and the attention outputs are re-sharded by two all-to-alls per layer over the TP group.

Two-batch overlap (``micro_batches`` 2, SGLang's and TensorRT-LLM's wide-EP decode): the decode pass runs two
micro-batches of half the batch, one communicating while the other computes; each re-reads the weights, so
the pass costs max(2 W_h, 2 M_h) + overhead with W_h and M_h one half's work and communication (`_split_pass`).

Pipeline parallelism as in the lecture: weights per chip fall as 1/PP; the stage holds KV for PP
micro-batches of its layers, so KV per chip does not fall; latency is unchanged; PP micro-batches
are in flight, so throughput per replica is batch x PP / step. A stage holds whole layers: the best
contiguous split of L layers into PP stages leaves ceil(L / PP) on the busiest one (61 layers on PP 4: 16),
and that stage sets the pass (PP x its time), the weights and KV per chip; every layer counts as the model's
average layer, as everywhere in this roofline. Where PP divides L nothing changes. Everything is SI (s,
bytes, FLOP).
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Callable
from dataclasses import dataclass, fields, replace

import numpy as np

from dse.catalog.frameworks import Memory, framework_for
from dse.catalog.hardware import Efficiency, System, efficiency_for
from dse.catalog.models import Architecture
from dse.catalog.units import DTYPE_BYTES, DTYPES
from dse.physics.codes import DEFAULT_CHUNK

TOPOLOGY_DIMS = {"switch": 0, "mesh": -1, "torus2d": 2, "torus3d": 3}
GROUP_SCALE_BYTES = 2.0 / 128  # weight-only quantization: one FP16 scale per 128 weights (Marlin, group 128)
ACT_BYTES = 2.0  # activations travel and live in bf16
ACT_WIDTH = 8.0
"""Activation values live per token at the peak of one layer's forward pass, in units of d_model: the residual
stream and its normalized copy, Q, K, V and the attention output, and the MLP's gate and up projections (the
largest term); an estimate of the working set, not fitted (only prefill, thousands of tokens per rank, makes it
matter beside the weights and KV cache)."""
LOGIT_BYTES = 4.0  # logits in fp32
MAX_GROUPS = 2  # layer groups per model (full attention, sliding window)
EXACT_MEAN = 32.0  # below this mean the expected maximum of binomial counts is summed exactly


def _f(x: object) -> np.ndarray:
    return np.asarray(x, dtype=np.float64)


def _fit(a: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """``a`` broadcast to ``shape`` (itself where it has that shape: np.broadcast_to's Python costs a pass of a
    slice's thousands of candidates as much as a few arithmetic operations).
    """
    return a if np.shape(a) == shape else np.broadcast_to(a, shape)


DTYPE_BYTES_ARR = _f([DTYPE_BYTES[d] for d in DTYPES])
@functools.cache
def _z_max() -> np.ndarray:
    """Expected maximum of n standard normals (Blom's order-statistic approximation), n = 0..4096 (made on first
    use: 4,095 inverse normal CDFs, which a command that routes no experts does not pay for at start-up).
    """
    from statistics import NormalDist

    return _f([0.0, 0.0] + [NormalDist().inv_cdf((n - 0.375) / (n + 0.25)) for n in range(2, 4097)])


def expected_max_binomial(n: object, trials: object, q: object) -> np.ndarray:
    """Expected maximum of ``n`` independent Binomial(``trials``, ``q``) counts (vectorized).

    Below a mean of EXACT_MEAN it is the exact sum E[max] = sum_j 1 - F(j)^n over the support (with
    q > 1/2 through the complement, E[max X] = trials - sum_j (1 - F_Y(j))^n for Y = trials - X, so no
    probability underflows); above, the mean plus the expected maximum of n normals corrected for the
    binomial's skew (Cornish-Fisher), capped at ``trials``. One count (n <= 1) is its mean.
    """
    n, trials, q = np.broadcast_arrays(_f(n), _f(trials), _f(q))
    shape = n.shape
    n, trials, q = n.ravel(), trials.ravel(), q.ravel()
    mean = trials * q
    sd = np.sqrt(mean * (1.0 - q))
    z = _z_max()[np.clip(n, 0, 4096).astype(np.int64)]
    with np.errstate(divide="ignore", invalid="ignore"):
        skew = np.where(sd > 0, (1.0 - 2.0 * q) / sd, 0.0)
    out = np.clip(mean + sd * (z + skew * (z * z - 1.0) / 6.0), mean, trials)
    out = np.where(n > 1, out, mean)
    flip = q > 0.5
    qs = np.where(flip, 1.0 - q, q)
    ms = trials * qs
    small = np.flatnonzero((ms < EXACT_MEAN) & (n > 1) & (qs > 0))
    if small.size:
        sds = np.sqrt(ms[small] * (1.0 - qs[small]))
        bound = np.minimum(np.ceil(ms[small] + 10.0 * sds + 10.0), np.floor(trials[small]))
        for complement in (False, True):  # each row's sum takes one of the two forms: each form its own rows
            mine = flip[small] == complement
            if mine.any():
                rows = small[mine]
                total = _exact_sum(n[rows], trials[rows], qs[rows], bound[mine], complement)
                out[rows] = trials[rows] - total if complement else total
    return out.reshape(shape)


EXACT_ROWS = 256
"""Up to this many rows `_exact_sum` computes every row's terms at once (j x rows); past it, one j at a time over
the rows still in support (the Python loop's fixed cost then matters less than the padding's arithmetic)."""


def _exact_sum(n: np.ndarray, trials: np.ndarray, p: np.ndarray, bound: np.ndarray, complement: bool) -> np.ndarray:
    """`expected_max_binomial`'s exact sum over j = 0 .. ``bound`` of 1 - F(j)^n for Binomial(trials, p) counts,
    or with ``complement`` of (1 - F(j))^n (the expected maximum is then trials less it).

    Either way the same operations in the same order on each row: the pmf by the running product of its ratios
    pmf(j) / pmf(j - 1), the CDF and the sum by running sums (numpy's accumulate adds left to right, as the loop
    does; the terms past a row's bound are zero, which adds nothing).
    """
    def term(c: np.ndarray, nn: np.ndarray) -> np.ndarray:
        c = np.minimum(c, 1.0)
        return (1.0 - c) ** nn if complement else 1.0 - c ** nn

    if len(n) <= EXACT_ROWS:
        j = np.arange(int(bound.max()) + 1 if len(n) else 1, dtype=np.float64)[:, None]
        steps = np.empty((len(j), len(n)))
        steps[0] = np.exp(trials * np.log1p(-p))
        steps[1:] = np.maximum(trials - j[1:] + 1.0, 0.0) / j[1:] * (p / (1.0 - p))
        terms = term(np.cumsum(np.cumprod(steps, axis=0), axis=0),
                     np.repeat(n[None, :], len(j), axis=0))  # contiguous, as the loop's power reads it
        terms[j > bound] = 0.0
        return np.cumsum(terms, axis=0)[-1]
    order = np.argsort(bound, kind="stable")  # the loop below narrows to the counts still in support
    jb = bound[order]
    nn, m_, p = n[order], trials[order], p[order]
    pmf = np.exp(m_ * np.log1p(-p))
    cdf = pmf.copy()

    total = term(cdf, nn)
    ratio = p / (1.0 - p)
    start = 0
    for j in range(1, int(jb[-1]) + 1):
        if jb[start] < j:
            start = int(np.searchsorted(jb, j, side="left"))
        s = slice(start, None)
        pmf[s] *= np.maximum(m_[s] - j + 1.0, 0.0) / j * ratio[s]
        cdf[s] += pmf[s]
        total[s] += term(cdf[s], nn[s])
    out = np.empty_like(total)
    out[order] = total
    return out


def _expert_key(n_exp: np.ndarray, top_k: np.ndarray, ep: np.ndarray) -> np.ndarray:
    """One float per (experts, top-k, EP) triple, distinct for whole numbers below 2^12, 2^12 and 2^24
    (2^48 in all: exact in a float64).
    """
    return (n_exp * 4096.0 + top_k) * 16777216.0 + ep


def distinct_rows(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Rows grouped by equal (``a``, ``b``), ``a`` whole numbers >= 0 and ``b`` floats: (one row of each group,
    each row's group).

    Where ``b`` is whole too and its range is at most some times the number of rows, the values of ``b`` are
    numbered through a table indexed by ``b``, and the groups read off a table indexed by a x (values of b) +
    b's number: a few passes over the rows and tables, no sort. Otherwise by `np.unique` of a + i b.
    """
    if not a.size:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    a = np.asarray(a, dtype=np.int64)
    lo, hi = float(b.min()), float(b.max())
    limit = 32 * a.size + 65536
    if lo >= 0 and hi < limit:
        bi = b.astype(np.int64)
        if np.array_equal(bi, b):
            seen = np.zeros(int(hi) + 1, dtype=bool)
            seen[bi] = True
            number = np.cumsum(seen)
            values = int(number[-1])
            span = (int(a.max()) + 1) * values
            if span <= limit:
                slot = a * values
                slot += number[bi]
                slot -= 1
                row = np.full(span, -1, dtype=np.int64)
                row[slot] = np.arange(a.size)
                present = row >= 0
                rank = np.cumsum(present)
                rank -= 1
                return row[present], rank[slot]
    _, first, inverse = np.unique(a + 1j * b, return_index=True, return_inverse=True)
    return first, inverse.ravel()


def routed_straggler(tokens: object, n_exp: object, top_k: object,
                     ep: object) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Routed work of the most-loaded of ``ep`` expert groups over the mean group, for ``tokens`` tokens
    each sent to ``top_k`` distinct experts of ``n_exp`` at random: (token-expert pairs it computes,
    distinct experts it reads, tokens it receives).

    A group of E = ceil(N / ep) experts receives from one token a hypergeometric count of pairs
    (mean k/ep, variance k/ep (1 - 1/ep)(N - k)/(N - 1)); over the tokens its load is taken as the
    binomial of that mean and variance. Each of its experts is touched with p = 1 - (1 - k/N)^tokens, so
    it reads Binomial(E, p) distinct experts; a token reaches it (one dispatched copy, however many of its
    experts live there) with h = `group_hit`, so it receives Binomial(tokens, h) copies. The maxima
    are `expected_max_binomial` of these, floored by what must hold: the busiest group computes at least
    ceil(mean) pairs, reads at least one expert, and computes at least as many pairs as it reads experts
    or receives tokens. Dense models (no experts) and EP 1 give 1.
    """
    cols = np.broadcast_arrays(*(_f(x) for x in (tokens, n_exp, top_k, ep)))
    shape = cols[0].shape
    tokens, n_exp, top_k, ep = (c.ravel() for c in cols)
    out = [np.ones(tokens.shape) for _ in range(3)]
    moe = np.flatnonzero((n_exp > 0) & (ep > 1))
    if moe.size:
        # the work is per distinct (experts, top-k, EP, tokens): compute it once each
        layout = _expert_key(n_exp[moe], top_k[moe], ep[moe])
        _, first, inverse = np.unique(layout + 1j * tokens[moe], return_index=True, return_inverse=True)
        rows = moe[first]
        for o, f in zip(out, _straggler(tokens[rows], n_exp[rows], top_k[rows], ep[rows]), strict=True):
            o[moe] = f[inverse]
    return out[0].reshape(shape), out[1].reshape(shape), out[2].reshape(shape)


def _straggler(tokens: np.ndarray, nn: np.ndarray, top_k: np.ndarray, groups: np.ndarray) -> list[np.ndarray]:
    """`routed_straggler` of MoE rows with EP > 1 (the three maxima in one `expected_max_binomial`)."""
    per = np.ceil(nn / groups)
    k = np.minimum(top_k, nn)
    mean_load = tokens * k / groups
    q = np.clip(1.0 - (1.0 - 1.0 / groups) * (nn - k) / np.maximum(nn - 1.0, 1.0), 1e-12, 1.0)
    p = -np.expm1(tokens * np.log1p(-k / nn))
    h = group_hit(nn, k, groups)
    r = len(tokens)
    with np.errstate(divide="ignore", invalid="ignore"):
        most = expected_max_binomial(np.concatenate([groups, groups, groups]),
                                     np.concatenate([per, tokens, mean_load / q]), np.concatenate([p, h, q]))
        touched = np.maximum(most[:r], np.minimum(1.0, per))
        received = np.maximum(most[r:2 * r], np.minimum(1.0, tokens))
        load = np.maximum(most[2 * r:], np.ceil(mean_load - 1e-9))
        load = np.maximum(load, np.maximum(touched, received))
        return [np.where(mean > 0, most / mean, 1.0)
                for most, mean in ((load, mean_load), (touched, per * p), (received, tokens * h))]


class _StragglerMemo:
    """`_straggler` of rows of (tokens, experts, top-k, EP), each distinct row computed once and kept for later
    calls: a long candidate list goes through `evaluate` in slices (`SLICE`), and its slices, the passes of a
    request-level metric and the searches of a study meet the same (experts, top-k, EP, tokens) again and again.
    A row's figures depend on that row alone (`_exact_sum` does the same operations on each row, whatever rows
    it sums with), so a kept figure is the one a new computation gives, bit for bit. Kept in a sorted array of
    keys, (experts, top-k, EP) in the real part (`_expert_key`) and the tokens in the imaginary part; at most
    ``limit`` rows (then it starts again).
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.keys = np.zeros(0, dtype=np.complex128)
        self.values = np.zeros((3, 0))

    def __call__(self, tokens: np.ndarray, nn: np.ndarray, top_k: np.ndarray, groups: np.ndarray) -> list[np.ndarray]:
        key = _expert_key(nn, top_k, groups) + 1j * tokens
        if not np.isfinite(key).all():
            return _straggler(tokens, nn, top_k, groups)
        distinct, first, inverse = np.unique(key, return_index=True, return_inverse=True)
        at = np.minimum(np.searchsorted(self.keys, distinct), max(self.keys.size - 1, 0))
        new = np.flatnonzero(self.keys[at] != distinct) if self.keys.size else np.arange(distinct.size)
        if new.size:
            rows = first[new]
            values = np.stack(_straggler(tokens[rows], nn[rows], top_k[rows], groups[rows]))
            if self.keys.size + new.size > self.limit:
                self.keys, self.values = self.keys[:0], self.values[:, :0]
            keys = np.concatenate([self.keys, distinct[new]])
            order = np.argsort(keys, kind="stable")
            self.keys, self.values = keys[order], np.concatenate([self.values, values], axis=1)[:, order]
            at = np.searchsorted(self.keys, distinct)
        return list(self.values[:, at[inverse.ravel()]])


_STRAGGLERS = _StragglerMemo(1 << 18)


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
    q_heads: np.ndarray  # attention (query) heads, the unit TP shards attention by
    g_layers: np.ndarray  # (models, MAX_GROUPS)
    g_stored: np.ndarray
    g_window: np.ndarray
    g_cap: np.ndarray
    idx_bytes_layer: np.ndarray
    attn_decode: np.ndarray
    attn_prefill: np.ndarray
    idx_flops: np.ndarray
    state_bytes: np.ndarray  # fixed per-sequence state of linear-attention layers (bytes)
    attn_io: np.ndarray  # elements per token per layer of the attention's queries plus outputs

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
            q_heads=_f([m.spec.attention.n_heads for m in models]),
            g_layers=_f([groups(m, 0) for m in models]),
            g_stored=_f([groups(m, 1) for m in models]),
            g_window=_f([groups(m, 2) for m in models]),
            g_cap=_f([groups(m, 3) for m in models]),
            idx_bytes_layer=_f([0 if s is None else s.indexer_head_dim * DTYPE_BYTES[s.indexer_dtype] for s in sparse]),
            attn_decode=_f([m.attention_flops_per_attended_token("decode") for m in models]),
            attn_prefill=_f([m.attention_flops_per_attended_token("prefill") for m in models]),
            idx_flops=_f([m.indexer_flops_per_scored_token() for m in models]),
            state_bytes=_f([m.state_bytes_per_sequence() for m in models]),
            # a query of heads x qk dims in, an output of heads x v dims back (MLA: its absorbed latent form)
            attn_io=_f([m.attention_flops_per_attended_token("decode") / 2.0 for m in models]),
        )


MIB, GIB = 2.0**20, 2.0**30
SGLANG_FIXED = 512 * MIB
SGLANG_PER_CHUNK_TOKEN = 1.5 * MIB
SGLANG_GRAPHS = 256 * 2 * MIB
SGLANG_PER_RANK = GIB / 8
SGLANG_FLOOR, SGLANG_FLOOR_ABOVE = 10 * GIB, 60 * GIB
"""SGLang's default mem_fraction_static (server_args.py, _handle_gpu_memory_settings, PR 10975; hw_catalog/
frameworks.yaml sglang_server_args): (C - reserved) / C with reserved = 512 MiB + 1.5 MiB per chunked-prefill token
(activations) + 2 MiB per CUDA-graph batch (256 of them) + tp x pp / 8 GiB, at least 10 GiB on a device of more
than 60 GiB."""


def with_memory(eff: Efficiency, memory: Memory) -> Efficiency:
    """``eff`` with a framework's memory reservation (`dse.catalog.frameworks.Memory`)."""
    return replace(eff, mem_rule=float(memory.rule_code), mem_fraction=memory.fraction, mem_reserve=memory.reserve,
                   mem_reserve_moe=memory.reserve_moe)


def memory_budget(cap: np.ndarray, eff: Efficiency, chunk: np.ndarray, tp: np.ndarray, pp: np.ndarray,
                  moe: np.ndarray | bool = False) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The framework's memory check as weights + a_act x activations + a_kv x KV (in HBM) <= budget, per chip
    of the memory ``cap`` the device reports: returns (a_act, a_kv, budget), with fraction f and reserve R
    (``eff.mem_*``: what the framework holds outside its pools, CUDA context, NCCL buffers, CUDA graphs, its
    profile run's peak; ``mem_reserve_moe`` where ``moe``, the model routing experts).

    - total (vLLM: gpu_memory_utilization of the device): weights + activations + R + KV <= f C;
    - static (SGLang: mem_fraction_static for weights and the KV pool; activations and CUDA graphs in the rest):
      weights + KV + R <= f C, f by default (C - reserved) / C with SGLang's own reserved (`SGLANG_FIXED`...);
    - free (TensorRT-LLM: free_gpu_memory_fraction of what weights, activations and buffers leave):
      KV <= f (C - weights - activations - R), i.e. weights + activations + KV / f <= C - R.

    Every byte of HBM (rule total, f = 1, R = 0) is the pure roofline's.
    """
    rule, f, reserve = (np.asarray(x, dtype=np.float64) for x in (eff.mem_rule, eff.mem_fraction, eff.mem_reserve))
    if np.any(moe):
        reserve = np.where(moe, np.asarray(eff.mem_reserve_moe, dtype=np.float64), reserve)
    if not rule.any():  # every candidate's rule is total: the rest need not be computed
        return 1.0, 1.0, f * cap - reserve
    reserved = SGLANG_FIXED + SGLANG_PER_CHUNK_TOKEN * chunk + SGLANG_GRAPHS + SGLANG_PER_RANK * tp * pp
    reserved = np.where(cap > SGLANG_FLOOR_ABOVE, np.maximum(reserved, SGLANG_FLOOR), reserved)
    static = np.where(np.isnan(f), cap - reserved, f * cap) - reserve
    budget = np.where(rule == 0, f * cap - reserve, np.where(rule == 1, static, cap - reserve))
    with np.errstate(divide="ignore", invalid="ignore"):
        a_kv = np.where(rule == 2, 1.0 / f, 1.0)
    a_act = np.where(rule == 1, 0.0, 1.0)
    return a_act, a_kv, budget


@dataclass(frozen=True)
class SystemTable:
    """Per-system scalars as arrays indexed by system number; unknown optional figures are 0."""

    ids: tuple[str, ...]
    flops: np.ndarray  # (systems, len(DTYPES)): FLOP/s when weights are in that dtype
    native: np.ndarray  # (systems, len(DTYPES)): whether the chip has tensor units for the dtype
    hbm_capacity: np.ndarray  # nominal (the drain time's)
    device_memory: np.ndarray  # as the device reports it (the memory check's)
    hbm_bandwidth: np.ndarray
    domain: np.ndarray
    scaleup_bw: np.ndarray
    scaleout_bw: np.ndarray
    topo_dims: np.ndarray
    host_capacity: np.ndarray
    host_bw: np.ndarray
    price_per_s: np.ndarray
    power_all_in: np.ndarray  # W per chip, NaN where the catalog has no all-in figure
    efficiency: dict[str, np.ndarray]  # calibrated factor -> value per system

    @classmethod
    def build(cls, systems: list[System], efficiency: list[Efficiency] | None = None,
              memory: list[Memory] | None = None) -> SystemTable:
        """Columns of the systems; ``efficiency`` (one per system) defaults to each system's calibration, with the
        memory reservation of ``memory`` (one per system; default: the framework each system runs by default,
        `dse.catalog.frameworks.framework_for`).
        """

        def known(v: float) -> float:
            return 0.0 if np.isnan(v) else v

        effs = efficiency if efficiency is not None else [efficiency_for(s.id) for s in systems]
        memory = memory if memory is not None else [framework_for(s).memory for s in systems]
        effs = [with_memory(e, m) for e, m in zip(effs, memory, strict=True)]
        return cls(
            ids=tuple(s.id for s in systems),
            flops=_f([[s.flops[s.compute_dtype(d)] for d in DTYPES] for s in systems]),
            native=np.array([[s.is_native(d) for d in DTYPES] for s in systems], dtype=bool).reshape(-1, len(DTYPES)),
            hbm_capacity=_f([s.hbm_capacity for s in systems]),
            device_memory=_f([s.device_memory for s in systems]),
            hbm_bandwidth=_f([s.hbm_bandwidth for s in systems]),
            domain=_f([s.scaleup_domain for s in systems]),
            scaleup_bw=_f([s.scaleup_bandwidth for s in systems]),
            scaleout_bw=_f([known(s.scaleout_bandwidth) for s in systems]),
            topo_dims=_f([TOPOLOGY_DIMS[s.topology] for s in systems]),
            host_capacity=_f([known(s.host_memory_capacity) for s in systems]),
            host_bw=_f([known(s.host_offload_bandwidth) for s in systems]),
            price_per_s=_f([s.price_per_s for s in systems]),
            power_all_in=_f([s.power_all_in_w for s in systems]),
            efficiency={f.name: _f([getattr(e, f.name) for e in effs]) for f in fields(Efficiency)},
        )

    def efficiency_of(self, system: np.ndarray) -> Efficiency:
        """The calibrated factors of each candidate's system, as arrays."""
        return Efficiency(**{name: col.take(system) for name, col in self.efficiency.items()})

    def factors_of(self, system: np.ndarray) -> Efficiency:
        """`efficiency_of` for the physics: a factor every candidate's system shares (the candidates' systems number
        from lo to hi, and it has one value over them) as that one value, the same figure in every formula without a
        gathered copy.
        """
        system = np.asarray(system)
        if not system.size:
            return self.efficiency_of(system)
        lo, hi = int(system.min()), int(system.max())

        def one(col: np.ndarray) -> np.ndarray:
            span = col[lo:hi + 1]
            return col[lo] if (span == span[0]).all() else col.take(system)

        return Efficiency(**{name: one(col) for name, col in self.efficiency.items()})


@dataclass
class Candidates:
    """Arrays (or scalars, broadcast) of candidate configurations.

    ``model``/``system`` index the tables; ``batch`` is the micro-batch of sequences one forward
    pass carries (PP of them are in flight); ``context`` is the KV length in decode and the prompt
    length in prefill; ``phase``, ``weights_dtype``, ``kv_dtype`` and ``kv_tier`` are codes into
    PHASES, DTYPES, DTYPES and KV_TIERS; ``experts_dtype`` (a DTYPES code, -1: as the weights) is the
    format of the routed experts; ``kv_shard`` a KV_SHARDS code; ``micro_batches`` (1 or 2) splits a decode
    pass into that many micro-batches whose communication overlaps each other's compute.
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
    imbalance: np.ndarray | float = 1.0  # placement skew: most-loaded group's mean routed tokens over the mean
    experts_dtype: np.ndarray | int = -1
    kv_shard: np.ndarray | int = 0  # KV_SHARDS code: TP ranks split the KV by head (0) or by sequence (1)
    micro_batches: np.ndarray | int = 1  # a decode pass split into this many micro-batches (2: two-batch overlap)
    chunk: np.ndarray | float = DEFAULT_CHUNK  # chunked-prefill budget: prompt tokens per DP rank resident at once

    def broadcast(self) -> Candidates:
        arrays = [np.asarray(getattr(self, f.name)) for f in fields(self)]
        shape = np.broadcast_shapes(*(a.shape for a in arrays))
        return Candidates(*(_fit(a, shape) for a in arrays))

    def __len__(self) -> int:
        return int(np.broadcast(*(np.asarray(getattr(self, f.name)) for f in fields(self))).size)


def alltoall_factor(group: np.ndarray, dims: np.ndarray, domain: np.ndarray | float = 1.0) -> np.ndarray:
    """Share of a chip's injection bandwidth an all-to-all over ``group`` chips achieves.

    A switch gives every pair full bandwidth (1). A full mesh of direct links (dims -1: AMD Infinity
    Fabric, 7 links per GPU in an 8-GPU domain) gives each peer one link, 1/(domain - 1) of the total,
    so an all-to-all over ``group`` chips uses (group - 1)/(domain - 1) of it. On an n-D torus of side
    k = group^(1/n), uniform traffic travels n k / 4 hops on average over 2n links per chip, so the
    achieved share is min(1, 4 / (n k)).
    """
    shape = np.broadcast_shapes(np.shape(group), np.shape(dims), np.shape(domain))
    group, dims, domain = (np.broadcast_to(_f(x), shape).ravel() for x in (group, dims, domain))
    out = np.ones(group.shape)
    torus, mesh = np.flatnonzero(dims > 0), np.flatnonzero(dims < 0)  # each computed on its own rows only
    if torus.size:
        n = np.maximum(dims[torus], 1.0)
        side = np.power(np.maximum(group[torus], 1.0), 1.0 / n)
        out[torus] = np.minimum(1.0, 4.0 / (n * side))
    if mesh.size:
        out[mesh] = np.minimum(1.0, np.maximum(group[mesh] - 1.0, 1.0) / np.maximum(domain[mesh] - 1.0, 1.0))
    return out.reshape(shape)


def _p2p_links(systems: SystemTable) -> np.ndarray:
    """Per system, the share of a chip's scale-up bandwidth a point-to-point transfer (a PP hand-off) uses: on a
    full mesh only the link to its peer (`alltoall_factor` of two chips), elsewhere all of it.
    """
    return np.where(systems.topo_dims < 0, alltoall_factor(2.0, systems.topo_dims, systems.domain), 1.0)


def group_hit(n_exp: object, top_k: object, ep: object) -> np.ndarray:
    """Chance that one token's ``top_k`` distinct experts of ``n_exp`` (uniform routing) include one of a
    given group's, the experts spread evenly over ``ep`` groups: 1 - C(N - N/ep, k) / C(N, k).
    """
    n, k, ep = np.broadcast_arrays(_f(n_exp), _f(top_k), _f(ep))
    shape = n.shape
    _, first, inverse = np.unique(_expert_key(n.ravel(), k.ravel(), ep.ravel()), return_index=True,
                                  return_inverse=True)
    n, k, ep = n.ravel()[first], k.ravel()[first], np.maximum(ep.ravel()[first], 1.0)
    miss = np.ones(n.shape)
    for i in range(int(np.max(k, initial=0.0))):
        miss = miss * np.where(i < k, np.clip((n - n / ep - i) / np.maximum(n - i, 1.0), 0.0, 1.0), 1.0)
    return (1.0 - miss)[inverse].reshape(shape)


def dispatch_copies(n_exp, top_k, ep, etp, tp, chips, domain, hit=None) -> tuple[np.ndarray, np.ndarray]:
    """Copies of one token an MoE dispatch sends from the chips holding it (its DP rank's ``tp`` chips) over
    scale-up links and over the scale-out network, among ``chips`` chips of which ``domain`` share a scale-up
    domain, with ``n_exp`` experts over ``ep`` groups of ``etp`` chips (uniform routing).

    A token's top-k experts land on ep `group_hit` distinct expert groups, each of etp chips, and the
    dispatch sends one copy per destination chip, not one per expert. Copies to the other chips of the
    token's own domain cross scale-up links; across domains one copy per destination domain crosses the
    scale-out network and is forwarded inside it (DeepEP's internode dispatch). With experts TP-sharded over
    the attention TP group (EP 1, DP 1) every chip already holds every token: no dispatch (the MLP's
    all-reduce is the TP all-reduce). The combine sends the same copies back. ``hit``: `group_hit` of the
    rows, where the caller has it.
    """
    top_k, ep, etp, tp, chips = (np.asarray(x, dtype=np.float64) for x in (top_k, ep, etp, tp, chips))
    local = np.minimum(chips, domain)
    groups = np.where(ep > 1, ep * (group_hit(n_exp, top_k, ep) if hit is None else hit), np.minimum(top_k, 1.0))
    copies = groups * etp  # chips that need the token
    scaleup = copies * np.maximum(local - tp, 0.0) / chips
    domains = chips / local
    shape = np.broadcast_shapes(np.shape(copies), np.shape(domains))
    copies, domains = np.broadcast_to(copies, shape).ravel(), np.broadcast_to(domains, shape).ravel()
    scaleout = np.zeros(shape).ravel()
    many = np.flatnonzero(domains > 1)  # a replica within one domain sends nothing over the scale-out network
    if many.size:
        d = domains[many]
        hit = d * -np.expm1(copies[many] * np.log1p(-1.0 / np.maximum(d, 1.0 + 1e-12)))
        scaleout[many] = hit * (d - 1.0) / d
    return scaleup, scaleout.reshape(shape)


def busiest_stage_layers(layers: object, pp: object) -> np.ndarray:
    """Layers on the busiest stage of the best split of ``layers`` whole layers, in order, into ``pp`` contiguous
    stages: ceil(layers / pp) (some stage holds at least that many; stages of ceil or floor size reach it).
    """
    return np.ceil(_f(layers) / _f(pp))


def _causal(context: np.ndarray, cap: np.ndarray) -> np.ndarray:
    """Sum over positions 1..L of min(position, cap)."""
    c = np.minimum(context, cap)
    return c * ((c + 1.0) * 0.5 + (context - c))


class _Gathered:
    """Per-candidate copies of the table columns and layout degrees, gathered once; what every pass shares is
    computed once, on first use, and what depends on the context again for each context.
    """

    def __init__(self, c: Candidates, models: ModelTable, systems: SystemTable, eff: Efficiency) -> None:
        m, s = c.model, c.system
        self.model = np.asarray(m)
        self.eff = eff
        self.tp, self.dp, self.ep, self.etp, self.pp = (_f(x) for x in (c.tp, c.dp, c.ep, c.etp, c.pp))
        self.cps = self.tp * self.dp
        self.chips = self.cps * self.pp
        self.batch, self.ctx = _f(c.batch), _f(c.context)
        self.phase = np.asarray(c.phase)
        dtype_bytes = DTYPE_BYTES_ARR
        wd = np.asarray(c.weights_dtype)
        exd = np.asarray(c.experts_dtype)
        ed = np.where(exd < 0, wd, exd) if (exd >= 0).any() else wd  # -1: as the weights
        # per (system, format), gathered by one flat index: bytes per weight (weight-only quantization, a format
        # without tensor units, reads its group scales too), FLOP/s, and the bytes an expert dispatch sends per
        # token element there and back (FP8 out where the experts compute in FP8 or FP4, the activations back in bf16)
        per_byte = dtype_bytes + np.where(systems.native, 0.0, GROUP_SCALE_BYTES)
        dispatch_bytes = np.where(per_byte < 2, 1.0, ACT_BYTES) + ACT_BYTES
        formats = len(DTYPES)
        at_w = s * formats + wd
        at_e = at_w if ed is wd else s * formats + ed
        self.wbytes, self.flops_rate = per_byte.ravel().take(at_w), systems.flops.ravel().take(at_w)
        self.ebytes, self.experts_rate = per_byte.ravel().take(at_e), systems.flops.ravel().take(at_e)
        self.dispatch_bytes = dispatch_bytes.ravel().take(at_e)
        fp8 = DTYPES.index("fp8")
        attn_fp8 = systems.native[:, fp8, None] & (DTYPE_BYTES_ARR <= 1.0)  # per (system, KV format)
        attn_rates = np.where(attn_fp8, systems.flops[:, fp8, None], systems.flops[:, DTYPES.index("bf16"), None])
        self.attn_rate = attn_rates.ravel().take(s * formats + np.asarray(c.kv_dtype))
        self.on_host = np.asarray(c.kv_tier) == 1
        self.any_host = bool(self.on_host.any())
        self.imbalance = _f(c.imbalance)
        self.micro = _f(c.micro_batches)
        self.chunk = _f(c.chunk)
        # model columns
        self.p_act, self.p_dense = models.p_active.take(m), models.p_dense.take(m)
        self.p_emb = models.p_embedding.take(m)
        self.p_exp, self.moe_l = models.p_expert.take(m), models.moe_layers.take(m)
        self.n_exp, self.top_k = models.n_experts.take(m), models.top_k.take(m)
        self.n_layers, self.d, self.vocab = models.n_layers.take(m), models.d_model.take(m), models.vocab.take(m)
        # layer groups: those no candidate's model has (no layers, no KV) add 0 to every sum over groups; left out
        groups = [k for k in range(models.g_layers.shape[1])
                  if k == 0 or models.g_layers[:, k].take(m).any() or models.g_stored[:, k].take(m).any()]
        self.g_layers = [models.g_layers[:, k].take(m) for k in groups]
        self.g_cap = [models.g_cap[:, k].take(m) for k in groups]
        self.g_stored = [models.g_stored[:, k].take(m) for k in groups]
        self.g_window = [models.g_window[:, k].take(m) for k in groups]
        self.idx_flops, self.idx_b = models.idx_flops.take(m), models.idx_bytes_layer.take(m)
        self.any_idx_flops, self.any_idx_b = bool(self.idx_flops.any()), bool(self.idx_b.any())  # sparse attention
        self.attn_decode, self.attn_prefill = models.attn_decode.take(m), models.attn_prefill.take(m)
        # KV split by head: a rank keeps ceil(kv_heads / TP) heads of every sequence (a whole copy where there
        # are fewer KV heads than ranks); split by sequence: all heads of 1/TP of the sequences
        self.by_seq = (np.asarray(c.kv_shard) == 1) & (self.tp > 1)
        self.any_by_seq = bool(self.by_seq.any())
        kv_heads = models.kv_heads.take(m)
        shard = np.ceil(kv_heads / self.tp) / kv_heads
        if self.any_by_seq:
            shard = np.where(self.by_seq, 1.0, shard)
        self.kv_main = models.kv_elems.take(m) * dtype_bytes[c.kv_dtype] * shard  # bytes per token per layer per chip
        # linear-attention state: split over TP with its heads (or whole, by sequence), read and written once
        # per decode step
        self.state = models.state_bytes.take(m) / (np.where(self.by_seq, 1.0, self.tp) if self.any_by_seq else self.tp)
        self.any_state = bool(self.state.any())
        self.attn_io = models.attn_io.take(m)
        self.attn_layers = sum(self.g_layers)  # layers with attention over a KV cache
        self._context: dict[str, np.ndarray] = {}
        # system columns
        self.hbm_cap = systems.device_memory.take(s)  # what the memory check holds everything within
        self.hbm_nominal = systems.hbm_capacity.take(s)
        self.hbm_bw = systems.hbm_bandwidth.take(s) * eff.memory
        self.host_bw = systems.host_bw.take(s) * eff.memory
        self.host_cap = systems.host_capacity.take(s)
        self.domain = systems.domain.take(s)
        self.su = systems.scaleup_bw.take(s) * eff.link
        self.so = systems.scaleout_bw.take(s) * eff.link
        self.topo = systems.topo_dims.take(s)
        self.price = systems.price_per_s.take(s)
        self.power = systems.power_all_in.take(s)
        # layout-only quantities shared by every pass
        self.experts_per_chip = np.ceil(self.n_exp / self.ep)
        # whole layers per stage: the busiest of PP stages holds ceil(L / PP) of the L layers, as many as each of
        # pp_even = L / ceil(L / PP) even stages would (pp_even is PP where PP divides L); the pipeline's pass is
        # PP times that stage's time, ``stretch`` = PP / pp_even times an even split's
        self.pp_even = self.n_layers / busiest_stage_layers(self.n_layers, self.pp)
        self.stretch = self.pp / self.pp_even
        self.routed_per_chip = self.moe_l / self.pp_even * self.experts_per_chip * self.p_exp / self.etp
        self.routed_bytes_per_chip = self.ebytes * self.routed_per_chip
        self.routed_active = self.moe_l * self.top_k * self.p_exp
        self.dense_read = self.wbytes * (self.p_dense - self.p_emb) / (self.tp * self.pp_even)
        local = np.minimum(self.cps, self.domain)
        self.inter = np.maximum(self.cps - self.domain, 0.0) / self.cps
        # MoE rows and their (model, EP) groups: routing statistics are computed once per group
        self.moe_rows = np.flatnonzero(self.n_exp > 0)  # positions in the raveled candidates
        self.expert_group = np.zeros(self.moe_rows.shape, dtype=np.int64)
        hit = None
        if self.moe_rows.size:
            ep, moe = self.ep.ravel(), self.moe_rows
            first, self.expert_group = distinct_rows(np.broadcast_to(self.model, self.ep.shape).ravel()[moe], ep[moe])
            rows = moe[first]
            hit = np.zeros(ep.shape)
            hit[moe] = group_hit(self.n_exp.ravel()[rows], self.top_k.ravel()[rows], ep[rows])[self.expert_group]
            hit = hit.reshape(self.ep.shape)
        self.copies_scaleup, self.copies_scaleout = dispatch_copies(
            self.n_exp, self.top_k, self.ep, self.etp, self.tp, self.cps, self.domain, hit=hit)
        self.a2a_bw = self.su * alltoall_factor(local, self.topo, self.domain)
        # on a full mesh a ring all-reduce over TP chips and a PP hand-off use only their peers' links
        mesh = self.topo < 0
        tp_group = alltoall_factor(np.minimum(self.tp, self.domain), self.topo, self.domain)
        self.tp_link = np.where(mesh, tp_group, 1.0)
        self.p2p_link = _p2p_links(systems).take(s)
        self.tp_a2a = np.where(mesh, 1.0, tp_group)  # an all-to-all's share beyond tp_link (torus)
        # fixed latencies (0 under --ideal): one per collective, and per layer
        tp_latency = np.where(self.tp <= self.domain, eff.latency_scaleup, eff.latency_scaleout)
        self.tp_on = (self.tp > 1).astype(np.float64)  # TP ranks exchange activations (1.0) or not (0.0)
        self.lat_tp = _masked(tp_latency, self.tp_on)
        self.lat_ep = np.where(self.inter > 0, eff.latency_scaleout, eff.latency_scaleup)
        self.lat_pp = np.where(self.chips <= self.domain, eff.latency_scaleup, eff.latency_scaleout)
        self.overhead = (self.n_layers * eff.layer_overhead + self.moe_l * eff.moe_layer_overhead) * self.stretch
        # the parts of each pass's terms that do not depend on its batch, context or phase
        self.dense_flops = 2.0 * (self.p_act - self.routed_active)  # per token
        # TP splits the heads (a rank computes ceil(heads / TP) of them: a TP that does not divide the heads, as
        # measured runs state, pads the busiest rank), or the sequences
        q_heads = models.q_heads.take(m)
        self.attn_split = q_heads / np.ceil(q_heads / self.tp)
        if self.any_by_seq:
            self.attn_split = np.where(self.by_seq, 1.0, self.attn_split)
        self.tp_bw = np.where(self.tp <= self.domain, self.su * self.tp_link, self.so)
        self.any_tp = bool(self.tp_on.any())
        self.ring_share = 2.0 * (self.tp - 1) / self.tp  # a ring all-reduce's bytes per byte reduced
        self.tp_layers = 2.0 * self.n_layers / self.pp_even  # all-reduces per pass through a stage
        self.dispatch = (self.n_exp > 0) & (self.copies_scaleup + self.copies_scaleout > 0)
        self.any_dispatch = bool(self.dispatch.any())
        self.any_inter = bool((self.inter > 0).any())
        # the scale-out bandwidth of a dispatch leaving the domain (1 where it does not: it sends nothing there)
        self.so_out = np.where(self.inter > 0, self.so, 1.0) if self.any_inter else self.so
        self.pp_on = (self.pp > 1).astype(np.float64)  # stages hand activations on (1.0) or not (0.0)
        self.any_pp = bool(self.pp_on.any())
        # the dispatch's all-to-alls per pass through a stage (none where nothing is dispatched)
        self.ep_layers = _masked(self.moe_l / self.pp_even, self.dispatch.astype(np.float64))
        self.hand_bw = np.where(self.chips <= self.domain, self.su * self.p2p_link, self.so)
        self.any_split = bool((self.micro > 1).any())
        self.skew = self.imbalance - 1.0
        self.any_skew = bool((self.skew != 0.0).any())
        self.weights_bytes = self.wbytes * self.p_dense / (self.tp * self.pp_even) + self.routed_bytes_per_chip
        self.mem_a_act, self.mem_a_kv, self.mem_budget = memory_budget(self.hbm_cap, eff, self.chunk, self.tp,
                                                                       self.pp, self.n_exp > 0)

    def _ctx(self, name: str) -> np.ndarray:
        """A term at the candidates' context, computed on first use: ``attended`` (KV tokens attended per
        sequence, summed over attention layers), ``read_per_seq`` (decode KV bytes read per sequence) or
        ``stored_per_seq`` (KV bytes held per sequence).
        """
        if name not in self._context:
            ctx = self.ctx
            if name == "attended":
                value = _gsum(self.g_layers, [np.minimum(ctx, cap) for cap in self.g_cap])
            elif name == "indexer":
                value = self.idx_b * self.n_layers * ctx
            elif name == "read_per_seq":
                # decode attention reaches half its bandwidth at attention_half_context tokens: each layer's
                # kernel costs a sequence that many tokens of KV more than it holds
                half = self.kv_main * self.eff.attention_half_context * self.attn_layers
                value = self.kv_main * self._ctx("attended") + half
                value = self._plus_index_state(value, 2.0)
            else:
                value = self._plus_index_state(
                    self.kv_main * _gsum(self.g_stored, [np.minimum(ctx, w) for w in self.g_window]), 1.0)
            self._context[name] = value
        return self._context[name]

    def _plus_index_state(self, value: np.ndarray, state_times: float) -> np.ndarray:
        """``value`` + the indexer's keys + ``state_times`` x the linear-attention state, per sequence (terms no
        candidate has are 0, and left out).
        """
        if self.any_idx_b:
            value = value + self._ctx("indexer")
        if self.any_state:
            value = value + state_times * self.state
        return value

    @property
    def attended(self) -> np.ndarray:
        return self._ctx("attended")

    @property
    def read_per_seq(self) -> np.ndarray:
        return self._ctx("read_per_seq")

    @property
    def stored_per_seq(self) -> np.ndarray:
        return self._ctx("stored_per_seq")

    def with_inputs(self, batch: object = None, context: object = None, phase: object = None,
                    kv_tier: object = None) -> _Gathered:
        """The same candidates at another batch, context, phase or KV tier (the catalog columns are reused)."""
        g = copy.copy(self)
        if batch is not None:
            g.batch = _fit(_f(batch), self.batch.shape)
        if phase is not None:
            g.phase = _fit(np.asarray(phase), self.phase.shape)
        if kv_tier is not None:
            g.on_host = _fit(np.asarray(kv_tier) == 1, self.on_host.shape)
            g.any_host = bool(g.on_host.any())
        if context is not None:
            g.ctx = _fit(_f(context), self.ctx.shape)
            g._context = {}
        return g


def _masked(x: np.ndarray, on: np.ndarray) -> np.ndarray:
    """``np.where(on > 0, x, 0.0)`` for x >= 0 (times, layers) and a mask ``on`` of 0.0 and 1.0: x times ``on``
    where every x is finite (x 1.0 = x, x 0.0 = 0.0), the same figures without np.where's branch per element, which
    a mask in no order mispredicts (there it takes ten multiplications' time).
    """
    return x * on if np.isfinite(x).all() else np.where(on > 0, x, 0.0)


def _gsum(weights: list[np.ndarray], values: list[np.ndarray]) -> np.ndarray:
    """Sum over layer groups of weight x value."""
    total = weights[0] * values[0]
    for w, v in zip(weights[1:], values[1:], strict=True):
        total = total + w * v
    return total


def _where(cond: np.ndarray | bool, a: object, b: object) -> np.ndarray:
    """np.where that skips the work of the branch a uniform condition never takes."""
    if np.ndim(cond) == 0:
        return _f(a() if cond else b())
    return np.where(cond, a(), b())


def _uniform(a: np.ndarray) -> bool:
    """Whether ``a`` is one value broadcast (a scalar, or a view that repeats one element)."""
    return a.ndim == 0 or a.size <= 1 or not any(a.strides)


def _occupancy(g: _Gathered, batch: np.ndarray, prefill: np.ndarray | bool
               ) -> tuple[np.ndarray | float, np.ndarray, np.ndarray, np.ndarray]:
    """Tokens each sequence adds, and the sequences, tokens and KV-holding sequences of the busiest rank's chip."""
    per_seq = _where(prefill, lambda: g.ctx, lambda: 1.0)  # tokens each sequence adds
    seqs_rank = np.ceil(batch / g.dp)  # sequences on the busiest attention (DP) rank
    tokens_rank = seqs_rank if prefill is False else seqs_rank * per_seq
    # sequences whose KV the busiest chip of the rank holds and attends: all (split by head) or 1/TP of them
    seqs_kv = np.where(g.by_seq, np.ceil(seqs_rank / g.tp), seqs_rank) if g.any_by_seq else seqs_rank
    return per_seq, seqs_rank, tokens_rank, seqs_kv


def _routing(g: _Gathered, batch: np.ndarray, tokens: np.ndarray, per_seq: np.ndarray | float
             ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per candidate: the busiest expert group's routed pairs and received tokens over the mean group's
    (`routed_straggler`, plus the placement's skew) and the share of its experts a token lands on. Computed once
    per distinct (model, EP, tokens) of the MoE rows (the tokens told apart by the batch where every sequence
    adds as many).
    """
    shape = tokens.shape
    moe = g.moe_rows
    if not moe.size:
        load_f, received_f, share = np.ones(shape), np.ones(shape), np.zeros(shape)
    else:
        tokens = tokens.ravel()
        key = (np.broadcast_to(batch, shape) if _uniform(np.asarray(per_seq)) else tokens).ravel()
        first, inverse = distinct_rows(g.expert_group, key[moe])
        rows = moe[first]
        t, nn, kk, e = tokens[rows], g.n_exp.ravel()[rows], g.top_k.ravel()[rows], g.ep.ravel()[rows]
        touched = -np.expm1(t * np.log1p(-kk / np.maximum(nn, 1.0)))
        f_load, f_touched, f_received = np.ones(len(rows)), np.ones(len(rows)), np.ones(len(rows))
        multi = np.flatnonzero(e > 1)
        if multi.size:
            for o, f in zip((f_load, f_touched, f_received), _STRAGGLERS(t[multi], nn[multi], kk[multi], e[multi]),
                            strict=True):
                o[multi] = f
        # per group, and first for the rows of no MoE: 1, 1 and 0
        table = np.stack([np.concatenate([[1.0], f_load]), np.concatenate([[1.0], f_received]),
                          np.concatenate([[0.0], np.minimum(touched * f_touched, 1.0)])])
        at = np.zeros(tokens.size, dtype=np.int64)
        at[moe] = inverse + 1
        load_f, received_f, share = (t.take(at).reshape(shape) for t in table)
    if g.any_skew:
        load_f, received_f = load_f + g.skew, received_f + g.skew
    return load_f, received_f, share


def kernel_work(compute: object, memory: object, attention_compute: object, kv_memory: object,
                kernel_overlap: object) -> np.ndarray:
    """The work of a pass, its kernels' compute and memory times combined: k max(C, M) + (1 - k) (max(C_g, M_g) +
    max(C_a, M_a)), with C and M the pass's compute and memory times, C_a and M_a their attention kernels' share
    (attention FLOPs, KV bytes), C_g = C - C_a and M_g = M - M_a the weight GEMMs' (dense and routed experts:
    FLOPs, weight bytes), and k = ``kernel_overlap``. The kernels of a pass run one after the other, so the
    attention over the KV cache (memory-bound in decode) does not hide the GEMMs (compute-bound at large batch)
    nor the reverse: k = 0 is the sum of the two groups' rooflines, k = 1 the lecture's single roofline of the
    whole pass (what ``--ideal`` keeps, to the bit). The decode fit's losses (`dse.validate.losses`) compute it
    operation for operation into arrays they keep.
    """
    k = _f(kernel_overlap)
    one = k.item() if k.size == 1 else None  # one share for every row: tested as a float (an array's any() costs
    # more than the pass itself on a few hundred rows)
    if not (one < 1.0 if one is not None else (k < 1.0).any()):
        return np.maximum(compute, memory)
    with np.errstate(invalid="ignore"):  # a candidate with an infinite time (it cannot run) gets NaN, unwarned
        apart = np.maximum(_f(compute) - attention_compute, _f(memory) - kv_memory) + np.maximum(attention_compute,
                                                                                                  kv_memory)
    if not (one > 0.0 if one is not None else (k > 0.0).any()):  # k = 0 (the catalog's): 0 max(C, M) + 1 apart
        return apart  # is apart, to the bit (and where a time is infinite, the groups' sum itself, not 0 x inf's NaN)
    below = k < 1.0
    single = np.maximum(compute, memory)
    with np.errstate(invalid="ignore"):
        blend = k * single + (1.0 - k) * apart
        return blend if below.all() else np.where(below, blend, single)


def _pass(g: _Gathered, batch: np.ndarray, prefill: np.ndarray | bool) -> dict[str, np.ndarray]:
    """Compute, memory and communication time of one forward pass of a micro-batch of ``batch``."""
    eff, ctx = g.eff, g.ctx
    per_seq, seqs_rank, tokens_rank, seqs_kv = _occupancy(g, batch, prefill)
    tokens = batch if prefill is False else batch * per_seq
    eff_c = _where(prefill, lambda: eff.compute_prefill, lambda: eff.compute_decode)

    # compute: attention, dense MLPs and shared experts run per DP rank on its own sequences (TP
    # splits them); routed experts run over every token of the stage, spread over all its chips.
    def attn_prefill() -> np.ndarray:
        attended = g.attn_prefill * _gsum(g.g_layers, [_causal(ctx, cap) for cap in g.g_cap])
        return attended + g.idx_flops * g.n_layers * _causal(ctx, np.inf) if g.any_idx_flops else attended

    def attn_decode() -> np.ndarray:
        attended = g.attn_decode * g.attended
        return attended + g.idx_flops * g.n_layers * ctx if g.any_idx_flops else attended

    attn = _where(prefill, attn_prefill, attn_decode)  # attention FLOPs per sequence
    rate, rate_e, rate_a = g.flops_rate * eff_c, g.experts_rate * eff_c, g.attn_rate * eff_c
    rate_rank = g.tp * rate
    attn_s = seqs_kv * attn / rate_a / g.attn_split  # TP splits the heads, or the sequences
    # the slowest expert group sets the step: its routed tokens are the expected maximum over the EP
    # groups (routing statistics) plus the placement's skew; the share of its experts a token lands on
    load_f, received_f, expert_share = _routing(g, batch, tokens, per_seq)
    # a GEMM of m rows takes (m + gemm_half_rows) rows' time (Hockney's half-performance length): once per
    # dense weight matrix of the rank, once per routed expert the busiest chip multiplies
    # (the layer work of the whole model, stretched to PP passes through the busiest stage)
    gemm_fixed_s = eff.gemm_half_rows * (g.dense_flops / rate_rank * g.stretch
                                         + 2.0 * g.pp * g.routed_per_chip * expert_share / rate_e)
    compute_s = (tokens_rank * g.dense_flops / rate_rank * g.stretch + attn_s * g.stretch + gemm_fixed_s
                 + load_f * tokens * 2.0 * g.routed_active / (g.cps * rate_e) * g.stretch)

    # memory: weights of the stage (routed experts only where a token landed, on the group touching the
    # most) and KV of the batch
    weights_read = g.dense_read + g.routed_bytes_per_chip * expert_share
    kv_bytes = seqs_kv * g.stored_per_seq * g.stretch  # the stage holds PP micro-batches of its layers
    kv_read = _where(prefill, lambda: kv_bytes, lambda: seqs_kv * g.read_per_seq * g.stretch) / g.pp
    with np.errstate(divide="ignore", invalid="ignore"):
        if g.any_host:
            kv_time = np.where(g.on_host, np.where(kv_read > 0, kv_read / g.host_bw, 0.0), kv_read / g.hbm_bw)
        else:
            kv_time = kv_read / g.hbm_bw
        memory_s = g.pp * (weights_read / g.hbm_bw + kv_time)

        # communication: TP all-reduce (ring), EP dispatch + combine all-to-all, PP hand-off (terms no
        # candidate has are 0)
        tp_s = ep_s = pp_s = 0.0
        if g.any_tp:
            msg = tokens_rank * g.d * ACT_BYTES
            allreduce = _masked(g.ring_share * msg / g.tp_bw + g.lat_tp, g.tp_on)
            tp_s = g.tp_layers * allreduce
        # KV split by sequence: queries to the rank holding their sequence's KV, outputs back (two all-to-alls)
        if g.any_by_seq:
            io = tokens_rank * g.attn_io * ACT_BYTES / g.tp * (g.tp - 1.0) / g.tp
            tp_s = tp_s + np.where(g.by_seq, g.n_layers / g.pp_even * (io / (g.tp_bw * g.tp_a2a) + 2.0 * g.lat_tp),
                                   0.0)
        if g.any_dispatch:
            # each TP chip sends 1/TP of its rank's tokens; the busiest group receives received_f x the mean
            token_bytes = received_f * tokens_rank / g.tp * g.d * g.dispatch_bytes
            # (no copies leave the domain where the replica fits in it: 0 bytes over 1)
            scaleout = token_bytes * g.copies_scaleout / g.so_out if g.any_inter else 0.0
            a2a = np.maximum(token_bytes * g.copies_scaleup / g.a2a_bw, scaleout) + 2.0 * g.lat_ep  # both ways
            ep_s = g.ep_layers * a2a if np.isfinite(a2a).all() else np.where(g.dispatch, g.ep_layers * a2a, 0.0)
        if g.any_pp:
            pp_s = _masked(tokens * g.d * ACT_BYTES / g.cps / g.hand_bw + g.lat_pp, g.pp_on)
    comm_s = g.pp * (tp_s + ep_s + pp_s)

    attention_s = attn_s * g.stretch  # the attention kernels' share of compute_s and of memory_s
    kv_memory_s = g.pp * kv_time
    work = kernel_work(compute_s, memory_s, attention_s, kv_memory_s, eff.kernel_overlap)
    step_s = np.maximum(work, comm_s) + (1.0 - eff.overlap) * np.minimum(comm_s, work) + g.overhead
    out = {
        "compute_s": compute_s, "memory_s": memory_s, "comm_s": comm_s, "step_s": step_s, "work": work,
        "attention_compute_s": attention_s, "kv_memory_s": kv_memory_s,
        "kernel_overlap": np.broadcast_to(_f(eff.kernel_overlap), step_s.shape),
        "tp_s": tp_s, "ep_s": ep_s, "pp_s": pp_s, "kv_bytes": kv_bytes, "seqs_rank": seqs_rank,
        "gemm_fixed_s": gemm_fixed_s,
        "tokens_rank": tokens_rank, "eff_c": eff_c, "attn": attn, "tokens": tokens,
        "overlap": np.broadcast_to(_f(eff.overlap), step_s.shape),
    }
    if g.any_split and prefill is not True:
        split = (g.micro > 1) & ~np.asarray(prefill, dtype=bool)
        if split.any():
            _split_pass(g, batch, prefill, split, out)
    return out


def _split_pass(g: _Gathered, batch: np.ndarray, prefill: np.ndarray | bool, split: np.ndarray, out: dict) -> None:
    """Two-batch overlap: a decode pass of n micro-batches of batch / n (rounded up on the busiest rank) in
    which one micro-batch's communication runs while another computes, as SGLang's and TensorRT-LLM's
    wide-EP decode schedule it. Each micro-batch reads the weights again and computes and communicates its
    own tokens, so the pass does n times a micro-batch's work W_h = max(compute, memory) and n times its
    communication M_h, and takes max(n W_h, n M_h) + overhead: communication hidden wherever compute is
    longer and the reverse (the one-segment fill at either end of the pass and the extra kernel launches,
    hidden under the other micro-batch, are neglected). Prefill passes are not split.
    """
    n = g.micro
    one = copy.copy(g)
    one.micro = np.ones_like(n)
    one.any_split = False
    h = _pass(one, batch / n, prefill)
    for k in ("compute_s", "memory_s", "comm_s", "tp_s", "ep_s", "pp_s", "work", "gemm_fixed_s", "attention_compute_s",
              "kv_memory_s"):
        out[k] = np.where(split, n * h[k], out[k])
    out["step_s"] = np.where(split, np.maximum(out["work"], out["comm_s"]) + g.overhead, out["step_s"])
    out["overlap"] = np.where(split, 1.0, out["overlap"])


SLICE = 1 << 16
"""Candidates `evaluate` and the request-level functions (`dse.physics.serving`) evaluate at once: a longer list
goes through in slices of this many, so a call's temporaries (some hundred arrays of a slice) stay near the
processor's caches: 2M candidates of `serving.aggregated` at once ran at 0.77M evaluations/s on one core, in
slices of 2^16 at 1.2M/s. Every output entry depends on its own candidate alone, so the slices change no figure."""


def in_slices(shared: int) -> Callable[[Callable[..., dict]], Callable[..., dict]]:
    """``fn(cand, *args, **kwargs)`` over slices of `SLICE` candidates where there are more, its outputs joined:
    the first ``shared`` of ``args`` go whole to every slice, every further argument must be one value for all
    candidates or one per candidate (an `Efficiency` of either), else the candidates go through at once.
    """
    return functools.partial(_in_slices, shared=shared)


def _in_slices(fn: Callable[..., dict], shared: int) -> Callable[..., dict]:
    def columns(a: object) -> list:
        return [getattr(a, f.name) for f in fields(a)] if isinstance(a, Efficiency) else [a]

    def part(a: object, sl: slice) -> object:
        if isinstance(a, Efficiency):
            return Efficiency(*(part(v, sl) for v in columns(a)))
        return a[sl] if np.ndim(a) else a

    @functools.wraps(fn)
    def run(cand: Candidates, *args: object, **kwargs: object) -> dict:
        c = cand.broadcast()
        n = c.model.size
        rest = [v for a in (*args[shared:], *kwargs.values()) for v in columns(a)]
        if c.model.ndim != 1 or n <= SLICE or any(np.ndim(v) and np.shape(v) != (n,) for v in rest):
            return fn(c, *args, **kwargs)
        out: dict[str, np.ndarray] = {}
        for lo in range(0, n, SLICE):  # each slice's outputs copied into place while the caches hold them
            sl = slice(lo, lo + SLICE)
            o = fn(Candidates(*(getattr(c, f.name)[sl] for f in fields(c))), *args[:shared],
                   *(part(a, sl) for a in args[shared:]), **{k: part(v, sl) for k, v in kwargs.items()})
            for k, v in o.items():
                v = np.asarray(v)
                if k not in out:
                    out[k] = np.empty(n, dtype=v.dtype)
                elif v.dtype != out[k].dtype:  # the type their concatenation would have
                    out[k] = out[k].astype(np.promote_types(out[k].dtype, v.dtype))
                out[k][sl] = v
        return out

    return run


@in_slices(2)
def evaluate(
    cand: Candidates, models: ModelTable, systems: SystemTable, eff: Efficiency | None = None, ttft: bool = True
) -> dict[str, np.ndarray]:
    """Roofline metrics of every candidate (SI units), as a dict of equal-length arrays.

    ``eff`` applies one set of factors to every candidate (IDEAL for the pure roofline); None
    applies each system's calibrated factors.
    """
    c = cand.broadcast()
    if eff is None:
        eff = systems.factors_of(np.asarray(c.system))
    return _evaluate(_Gathered(c, models, systems, eff), ttft)


def evaluate_at(cand: Candidates, models: ModelTable, systems: SystemTable, eff: Efficiency | None,
                inputs: list[dict]) -> list[dict[str, np.ndarray]]:
    """`evaluate` (without TTFT) of the same candidates at several inputs, each a dict of ``batch``,
    ``context``, ``phase`` or ``kv_tier`` overrides; the catalog columns are gathered once. An input with
    ``times: False`` gets only the memory check (``MEMORY_KEYS``), not the pass times; one with ``memory: False``
    only the pass times (``BRIEF_KEYS`` less ``CHECK_KEYS``); one with ``brief: False`` all of `evaluate`'s
    figures (with ``ttft: True``, its TTFT too).
    """
    c = cand.broadcast()
    if eff is None:
        eff = systems.factors_of(np.asarray(c.system))
    g = _Gathered(c, models, systems, eff)
    out = []
    for kw in inputs:
        kw = dict(kw)
        times, memory = kw.pop("times", True), kw.pop("memory", True)
        brief, ttft = kw.pop("brief", True), kw.pop("ttft", False)
        at = g.with_inputs(**kw)
        if not brief:
            out.append(_evaluate(at, ttft))
        else:
            out.append(_evaluate(at, ttft=False, brief=True, memory=memory) if times else _memory(at))
    return out


BRIEF_KEYS = ("chips", "compute_s", "memory_s", "comm_s", "step_s", "bound", "overhead_s", "kv_bytes_per_chip",
              "hbm_bytes_per_chip", "fits", "overlap", "gemm_fixed_s", "weights_bytes_per_chip",
              "activation_bytes_per_chip", "attention_compute_s", "kv_memory_s", "kernel_overlap")
"""What `evaluate_at` returns: the pass times and the memory check (what request-level physics builds on)."""
MEMORY_KEYS = ("chips", "kv_bytes_per_chip", "hbm_bytes_per_chip", "fits")
"""What `evaluate_at` returns for an input with ``times: False``: the memory check alone."""
CHECK_KEYS = ("hbm_bytes_per_chip", "fits", "activation_bytes_per_chip")
"""What `evaluate_at` leaves out for an input with ``memory: False``: the memory check beyond the bytes held."""


def _phase(g: _Gathered) -> np.ndarray | bool:
    """The candidates' prefill flags, or one bool where every candidate is in the same phase."""
    prefill = g.phase == 1
    if prefill.ndim and (prefill.all() or not prefill.any()):
        prefill = bool(prefill.all())  # uniform phase: take one branch only
    return prefill


def _hbm(g: _Gathered, prefill: np.ndarray | bool, seqs_rank: np.ndarray, tokens_rank: np.ndarray,
         kv_bytes: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Activation and HBM bytes per chip, and whether the candidate fits (HBM, and host memory for KV held there)."""
    # prefill activations: at most the chunked-prefill budget per DP rank is resident at once
    act_tokens = _where(prefill, lambda: np.minimum(tokens_rank, g.chunk), lambda: tokens_rank)
    act_bytes = act_tokens * ACT_WIDTH * g.d * ACT_BYTES + seqs_rank * g.vocab / g.tp * LOGIT_BYTES
    kv_hbm = np.where(g.on_host, 0.0, kv_bytes) if g.any_host else kv_bytes
    hbm_bytes = g.weights_bytes + kv_hbm + act_bytes
    # the framework's check (`memory_budget`), and every byte within the HBM
    fits = ((g.weights_bytes + g.mem_a_act * act_bytes + g.mem_a_kv * kv_hbm <= g.mem_budget)
            & (hbm_bytes <= g.hbm_cap))
    if g.any_host:
        fits &= ~g.on_host | (kv_bytes <= g.host_cap)
    return act_bytes, hbm_bytes, fits


def _memory(g: _Gathered) -> dict[str, np.ndarray]:
    """The memory check of `_evaluate` without the pass times (``MEMORY_KEYS``)."""
    prefill = _phase(g)
    _, seqs_rank, tokens_rank, seqs_kv = _occupancy(g, g.batch, prefill)
    kv_bytes = seqs_kv * g.stored_per_seq * g.stretch
    _, hbm_bytes, fits = _hbm(g, prefill, seqs_rank, tokens_rank, kv_bytes)
    return {"chips": g.chips, "kv_bytes_per_chip": kv_bytes, "hbm_bytes_per_chip": hbm_bytes, "fits": fits}


def _evaluate(g: _Gathered, ttft: bool, brief: bool = False, memory: bool = True) -> dict[str, np.ndarray]:
    prefill = _phase(g)
    r = _pass(g, g.batch, prefill)
    step_s, compute_s, memory_s, comm_s = r["step_s"], r["compute_s"], r["memory_s"], r["comm_s"]
    comm_bound = comm_s > r["work"]  # the bound's code: 2 communication, else 1 memory, else 0 compute
    bound = ((memory_s > compute_s) & ~comm_bound).astype(np.int64) + 2 * comm_bound

    # memory capacity per chip
    weights_bytes = g.weights_bytes
    kv_bytes = r["kv_bytes"]
    if brief:
        out = {"chips": g.chips, "compute_s": compute_s, "memory_s": memory_s, "comm_s": comm_s, "step_s": step_s,
               "bound": bound, "overhead_s": np.broadcast_to(g.overhead, step_s.shape), "kv_bytes_per_chip": kv_bytes,
               "overlap": r["overlap"], "gemm_fixed_s": np.broadcast_to(r["gemm_fixed_s"], step_s.shape),
               "weights_bytes_per_chip": weights_bytes, "attention_compute_s": r["attention_compute_s"],
               "kv_memory_s": r["kv_memory_s"], "kernel_overlap": r["kernel_overlap"]}
        if memory:
            out.update(zip(("activation_bytes_per_chip", "hbm_bytes_per_chip", "fits"),
                           _hbm(g, prefill, r["seqs_rank"], r["tokens_rank"], kv_bytes), strict=True))
        return out
    act_bytes, hbm_bytes, fits = _hbm(g, prefill, r["seqs_rank"], r["tokens_rank"], kv_bytes)

    # throughput and cost: PP micro-batches are in flight
    seqs_in_flight = g.batch * g.pp
    tokens_per_s = seqs_in_flight * _where(prefill, lambda: g.ctx, lambda: 1.0) / step_s
    usd_per_mtok = g.chips * g.price / tokens_per_s * 1e6
    power_w = g.chips * g.power  # all-in facility power of the replica

    # derived figures
    rate, rate_a = g.flops_rate * r["eff_c"], g.attn_rate * r["eff_c"]
    weights_read_all = g.dense_read + g.routed_bytes_per_chip
    balance_batch = weights_read_all / g.hbm_bw * g.cps * rate / (2.0 * g.p_act / g.pp_even)
    unbounded_layers = _gsum(g.g_layers, [np.isinf(cap) for cap in g.g_cap])
    capped = _gsum(g.g_layers, [np.where(np.isinf(cap), 0.0, cap) for cap in g.g_cap])
    rate_rank, attn_rank = g.tp * rate, g.tp * rate_a  # FLOP/s serving one DP rank's sequences
    per_chip = np.where(g.by_seq, 1.0 / g.tp, 1.0)  # a chip's share of a rank sequence's KV beyond kv_main
    kv_seq, idx_seq = g.kv_main * per_chip, g.idx_b * per_chip
    slope = (kv_seq * unbounded_layers + idx_seq * g.n_layers) / g.hbm_bw
    slope = slope - (g.attn_decode * unbounded_layers + g.idx_flops * g.n_layers) / attn_rank
    offset = 2.0 * g.p_act / rate_rank + g.attn_decode * capped / attn_rank - kv_seq * capped / g.hbm_bw
    with np.errstate(divide="ignore", invalid="ignore"):
        kv_crossover = np.where(slope > 0, np.maximum(offset, 0.0) / slope, np.inf)

    out = {
        "chips": g.chips,
        "compute_s": compute_s,
        "memory_s": memory_s,
        "comm_s": comm_s,
        "step_s": step_s,
        "bound": bound,
        "tokens_per_s": tokens_per_s,
        "tpot_s": _where(prefill, lambda: np.full_like(step_s, np.nan), lambda: step_s),
        "usd_per_mtok": usd_per_mtok,
        "power_w": power_w,
        "joules_per_token": power_w / tokens_per_s,
        "weights_bytes_per_chip": weights_bytes,
        "kv_bytes_per_chip": kv_bytes,
        "activation_bytes_per_chip": act_bytes,
        "hbm_bytes_per_chip": hbm_bytes,
        "fits": fits,
        "flops_per_step": r["tokens"] * 2.0 * g.p_act + g.batch * r["attn"],
        "attention_flops_per_step": g.batch * r["attn"],
        "tp_comm_s": g.pp * r["tp_s"],
        "ep_comm_s": g.pp * r["ep_s"],
        "pp_comm_s": g.pp * r["pp_s"],
        "overhead_s": g.overhead * np.ones_like(step_s),
        "gemm_fixed_s": r["gemm_fixed_s"] * np.ones_like(step_s),  # compute_s's share set by gemm_half_rows
        "overlap": r["overlap"],  # share of the shorter of work and communication hidden (1: two-batch overlap)
        "attention_compute_s": r["attention_compute_s"],  # the attention kernels' share of compute_s
        "kv_memory_s": r["kv_memory_s"],  # and of memory_s (the KV read or written)
        "kernel_overlap": r["kernel_overlap"],  # share of the pass costed as one roofline (`kernel_work`)
        "sequences_in_flight": seqs_in_flight,
        "balance_batch": balance_batch,
        "hbm_drain_s": g.hbm_nominal / (g.hbm_bw / g.eff.memory),
        "kv_crossover_context": kv_crossover,
    }
    if ttft:
        first = _pass(g, np.ones_like(g.batch), True)["step_s"]
        out["ttft_s"] = np.where(prefill, step_s, first)
    return out




def balance_batch_closed_form(
    flops: float, bandwidth: float, bytes_per_param: float, total: float, active: float
) -> float:
    """The lecture's balance batch: (FLOP/s / bytes/s) x (bytes per param / 2) x (total / active)."""
    return flops / bandwidth * bytes_per_param / 2.0 * total / active


def kv_crossover_bytes_per_token(flops: float, bandwidth: float, active: float, context: float) -> float:
    """KV bytes per token at which KV fetch time equals weight compute time at ``context``:
    B L bytes / bandwidth = B 2 N_active / FLOP/s, so bytes = (bandwidth / FLOP/s) x 2 N / L.
    """
    return bandwidth / flops * 2.0 * active / context
