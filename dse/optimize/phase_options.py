"""The options of each phase of a model's life, from the physics: training layouts on whole nodes for pre-training
and RL training (`dse.physics.training.train_step`: step time, memory, MFU), and operating points of replicas for
serving and for generating RL rollouts (`dse.optimize.operating_points`, on the request-level serving physics).

A node is a system's scale-up domain (an 8-GPU server, an NVL72 rack). Per system and number of nodes, the
training option is the fastest layout that fits in HBM among TP x PP x EP x recomputation x GEMM format, its DP
filling the nodes and its global batch the multiple of DP x micro-batch nearest the target; an option is kept only
when it trains faster than every option on fewer nodes of its system (the others cost more per token and finish no
sooner).
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pandas as pd

from dse.catalog.hardware import System
from dse.catalog.models import Architecture
from dse.catalog.training import TRAIN_IDEAL
from dse.optimize.operating_points import operating_points
from dse.optimize.space import SpaceOptions, build_space
from dse.physics.serving import Request
from dse.physics.training import TrainCandidates, TrainLayout, refused, train_steps

TRAIN_TP = (1, 2, 4, 8)
TRAIN_PP = (1, 2, 4, 8, 16)
TRAIN_EP = (1, 8, 16, 32, 64)
TRAIN_RECOMPUTE = ("selective", "full")
TRAIN_INTERLEAVE = (1, 2, 4)
"""Pipeline chunks per device (1F1B, interleaved over v virtual stages; Narayanan et al. 2021): with the stage
partition the step's partition program places in them, the pipeline's share of the layout decision."""
TRAIN_COLUMNS = ("system", "nodes", "chips", "tp", "pp", "interleave", "dp", "ep", "micro_batch", "recompute",
                 "gemm_dtype", "global_batch", "seq", "tokens_per_s", "mfu", "step_s", "stages")


def node_counts(most: int) -> list[int]:
    """Whole nodes a training job may take: the powers of two up to ``most``."""
    return [2 ** k for k in range(int(math.log2(most)) + 1)] if most >= 1 else []


def _layouts(model: Architecture, chips: int, gemm_dtypes: tuple[str, ...]):
    heads = model.spec.attention.n_heads
    experts = model.spec.ffn.n_experts if model.is_moe else 1
    for tp, pp in itertools.product(TRAIN_TP, TRAIN_PP):
        if heads % tp or chips % (tp * pp) or pp > model.spec.n_layers:
            continue
        dp = chips // (tp * pp)
        for ep, recompute, gemm, v in itertools.product(TRAIN_EP, TRAIN_RECOMPUTE, gemm_dtypes, TRAIN_INTERLEAVE):
            if ep > 1 and (not model.is_moe or experts % ep or (dp * tp) % ep):
                continue
            if (pp == 1 and v > 1) or pp * v > model.spec.n_layers:
                continue
            yield TrainLayout(tp=tp, pp=pp, dp=dp, ep=ep, micro_batch=1, interleave=v, recompute=recompute,
                              gemm_dtype=gemm)


def training_options(model: Architecture, system: System, nodes: list[int], seq: int, batch_tokens: float,
                     gemm_dtypes: tuple[str, ...] = ("bf16",), ideal: bool = False) -> pd.DataFrame:
    """Per number of nodes, the fastest layout that fits (`TRAIN_COLUMNS`; the first listed among equals), on the
    front of nodes against tokens/s; ``stages`` is its pipeline partition (items per chunk, the embedding and head
    among them), the one the step's partition program chooses (the least bottleneck within memory). Formats the
    chip has no tensor units for, and layouts the step refuses (no scale-out bandwidth across domains, more
    pipeline chunks than the model places), are skipped. Every layout of every node count is evaluated in one call
    of the vectorized step (`train_steps`).
    """
    dtypes = tuple(g for g in gemm_dtypes if g == "bf16" or system.is_native(g))
    listed = [(n, lay) for n in nodes for lay in _layouts(model, n * int(system.scaleup_domain), dtypes)]
    rows: list[dict] = []
    if not listed:
        return pd.DataFrame(rows, columns=list(TRAIN_COLUMNS))
    lays = [lay for _, lay in listed]
    cand = TrainCandidates.from_layouts(lays)
    sequences = np.array([max(1, round(batch_tokens / seq / (lay.dp * lay.micro_batch))) * lay.dp * lay.micro_batch
                          for lay in lays])
    ok = ~refused(model, system, cand, seq)
    idx = np.flatnonzero(ok)
    r = train_steps(model, system, cand.take(idx), sequences[idx], seq, TRAIN_IDEAL if ideal else None) \
        if idx.size else None
    fits = np.zeros(len(lays), dtype=bool)
    tps, mfu, step = (np.full(len(lays), np.nan) for _ in range(3))
    stages = np.full(len(lays), "", dtype=object)
    if r is not None:
        fits[idx], tps[idx], mfu[idx], step[idx] = r["fits"], r["tokens_per_s"], r["mfu"], r["step_s"]
        stages[idx] = np.asarray(r["stages"], dtype=object)
    node_of = np.array([n for n, _ in listed])
    for n in nodes:
        here = np.flatnonzero((node_of == n) & fits)
        if not here.size:
            continue
        i = int(here[np.argmax(tps[here])])  # the first of the fastest
        lay = lays[i]
        if rows and tps[i] <= rows[-1]["tokens_per_s"]:
            continue
        rows.append({"system": system.id, "nodes": n, "chips": n * int(system.scaleup_domain), "tp": lay.tp,
                     "pp": lay.pp, "interleave": lay.interleave, "dp": lay.dp, "ep": lay.ep,
                     "micro_batch": lay.micro_batch, "recompute": lay.recompute, "gemm_dtype": lay.gemm_dtype,
                     "global_batch": int(sequences[i]),
                     "seq": seq, "tokens_per_s": float(tps[i]), "mfu": float(mfu[i]), "step_s": float(step[i]),
                     "stages": str(stages[i])})
    return pd.DataFrame(rows, columns=list(TRAIN_COLUMNS))


SERVE_COLUMNS = ("system", "role", "group", "numerics", "chips", "tp", "ep", "pp", "dp", "batch", "kv_tier",
                 "placement", "context_parallel", "requests_per_s", "usd_per_s",
                 "ttft_s", "tpot_s", "nodes", "per_bundle")
SERVE_CLASSES = ("role", "group", "system", "kv_tier", "placement")
"""A serving option is compared only with those of its class: its role, numerics, system, KV tier and expert
placement (`dse.optimize.operating_points.placement`). Within a system a point that costs no more per second and
serves no fewer requests per second also takes no more nodes per bundle for no less rate (a node holds at least as
many of its smaller replicas), so dropping the other loses nothing under any inventory; across systems dropping it
would decide in advance what the lifetime program decides under the shared inventory, and across tiers or
placements it would leave a study that holds them to HBM or to one scale-up domain without its options (the
lifetime data narrows them per system once those are applied: `dse.optimize.equalization.narrow_serving`)."""


def serving_options(model: Architecture, workload: Request, opts: SpaceOptions,
                    modes: tuple[str, ...] = ("aggregated", "disaggregated")) -> pd.DataFrame:
    """The non-dominated operating points of the model serving the workload (aggregated replicas, prefill and
    decode replicas) of each of `SERVE_CLASSES`, each as a bundle of whole nodes: the ``per_bundle`` replicas one
    node holds where a replica takes at most a node (a node of 8 chips holds two 4-chip replicas; a 72-chip rack
    nine 8-chip ones), else one replica on the nodes it spans (``nodes``). ``requests_per_s`` and ``usd_per_s`` stay
    per replica.
    """
    space = build_space(model, workload, opts)
    pts = operating_points(space, modes, by=SERVE_CLASSES)
    if pts.empty:
        return pd.DataFrame(columns=list(SERVE_COLUMNS))
    per_node = pts["system"].map({s.id: int(s.scaleup_domain) for s in space.systems}).to_numpy()
    chips = pts["chips"].to_numpy()
    small = chips <= per_node
    pts = pts.assign(nodes=np.where(small, 1, np.ceil(chips / per_node)).astype(int),
                     per_bundle=np.where(small, per_node // np.maximum(chips, 1), 1).astype(int))
    return pts[list(SERVE_COLUMNS)].reset_index(drop=True)
