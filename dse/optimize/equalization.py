"""Compute equalization and overtraining: the lifetime cost of a model at a target loss.

For a model of N parameters, the pre-training tokens that reach the target loss follow from a
Chinchilla-form loss L(N, D) = E + A / N^alpha + B / D^beta (Hoffmann et al. 2022, or the Epoch AI
refit of Besiroglu et al. 2024). Lifetime cost = pre-training (6 N D_pre) + RL ((2..6) N D_RL x
inefficiency) + inference (D_inf output tokens, D_inf / O requests at the request-level serving
optimum: USD per request with its prefill, aggregated or disaggregated), with D_inf = demand x days.
Optuna searches N (and so the overtraining ratio D_pre / 20 N); every trial solves the exact training-layout
search (`dse.optimize.training`: the cheapest layout that meets the deadline within the chip budget) and the exact
serving search for that model.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from functools import lru_cache

import pandas as pd

from dse.catalog.hardware import default_systems
from dse.catalog.models import Architecture, ModelSpec
from dse.errors import InfeasibleError
from dse.optimize.requests import solve_cheapest
from dse.optimize.space import SpaceOptions, build_space, describe_choice
from dse.optimize.training import TrainingJob, TrainingSpace, layout_of, search, shortfall
from dse.physics.serving import Request

LOSS_FITS = {  # constants as published (calibration cases scaling_chinchilla_parametric, scaling_epoch_replication)
    "hoffmann": {"E": 1.69, "A": 406.4, "B": 410.7, "alpha": 0.34, "beta": 0.28},
    "epoch": {"E": 1.8172, "A": 482.01, "B": 2085.43, "alpha": 0.3478, "beta": 0.3658},
}
CHINCHILLA_TOKENS_PER_PARAM = 20.0


def loss(n: float, d: float, fit: str = "hoffmann") -> float:
    c = LOSS_FITS[fit]
    return c["E"] + c["A"] / n ** c["alpha"] + c["B"] / d ** c["beta"]


def tokens_for_loss(n: float, target: float, fit: str = "hoffmann") -> float:
    """Pre-training tokens a model of n parameters needs to reach the target loss (inf if it cannot)."""
    c = LOSS_FITS[fit]
    room = target - c["E"] - c["A"] / n ** c["alpha"]
    return math.inf if room <= 0 else (c["B"] / room) ** (1.0 / c["beta"])


def dense_model(n_params: float) -> Architecture:
    """A Llama-shaped dense model of about n_params: GQA with 8 KV heads of 128, SwiGLU of 3.5 d,
    one layer per 128 of width (d in steps of 1,024).
    """
    best = None
    for d in range(1024, 32769, 1024):  # 128-wide heads in multiples of 8, so 8 KV heads divide them
        layers = max(8, round(d / 128))
        heads = d // 128
        m = _llama(d, layers, heads)
        if best is None or abs(m.params_total - n_params) < abs(best.params_total - n_params):
            best = m
    return best


def _llama(d: int, layers: int, heads: int) -> Architecture:
    ff = int(round(3.5 * d / 256) * 256)
    return Architecture(ModelSpec.model_validate({
        "id": f"dense-d{d}-l{layers}", "name": f"dense d={d} layers={layers}", "d_model": d, "n_layers": layers,
        "vocab": 128256, "source": {"title": "Llama-shaped family of dse.optimize.equalization", "date": "2026-11-22"},
        "published_b": {"total": 1, "active": 1, "precision_total": 1e9, "precision_active": 1e9, "source": "n/a"},
        "attention": {"kind": "gqa", "n_heads": heads, "n_kv_heads": 8, "head_dim": 128},
        "ffn": {"kind": "dense", "d_ff": ff},
    }))


@dataclass(frozen=True)
class Lifetime:
    """What a lifetime-cost evaluation needs besides the model size."""

    target_loss: float
    fit: str
    demand_tokens_per_s: float
    deployment_days: float
    rl_tokens_per_pretrain_token: float
    rl_flops_factor: float  # 2 (rollouts only) to 6 (train on rollouts)
    rl_inefficiency: float
    seq: int
    global_batch_tokens: float
    deadline_days: float
    chip_budget: int
    train_systems: tuple[str, ...]
    workload: Request
    serving: SpaceOptions


def training_space(life: Lifetime | _TrainingFields) -> TrainingSpace:
    """The layouts offered to the pre-training: each training system up to the chip budget; DP a power of two."""
    return TrainingSpace(inventory={sid: life.chip_budget for sid in life.train_systems}, tp=(1, 2, 4, 8),
                         pp=(1, 2, 4, 8, 16), dp=tuple(2 ** k for k in range(15)), micro_batch=(1, 2, 4),
                         interleave=(1, 2), recompute=("none", "selective", "full", "reversible"), zero=(1,),
                         gemm_dtype=("bf16",), ep_overlap=("none",))


def training_job(life: Lifetime | _TrainingFields, tokens: float) -> TrainingJob:
    """The pre-training of ``tokens`` tokens: global batch a power of two of sequences near the study's tokens."""
    batch = 2 ** max(0, round(math.log2(life.global_batch_tokens / life.seq)))
    return TrainingJob(tokens=tokens, seq=life.seq, global_batch=batch, deadline_s=life.deadline_days * 86400)


def train_cluster(model: Architecture, life: Lifetime, tokens: float) -> dict:
    """The cheapest training layout that meets the deadline within the chip budget (`dse.optimize.training`: an
    argmin over every layout, exact over the space). The answer depends on the model, the tokens and the training
    fields of ``life`` alone (not on the serving demand), so trials of the same model share one search.
    """
    return dict(_cluster(model.spec.model_dump_json(), tokens, life.train_systems, life.chip_budget,
                         life.deadline_days, life.seq, life.global_batch_tokens))


@lru_cache(maxsize=256)
def _cluster(spec: str, tokens: float, train_systems: tuple[str, ...], chip_budget: int, deadline_days: float,
             seq: int, global_batch_tokens: float) -> dict:
    model = Architecture(ModelSpec.model_validate_json(spec))
    life = _TrainingFields(train_systems, chip_budget, deadline_days, seq, global_batch_tokens)
    systems = [default_systems()[sid] for sid in train_systems]
    job = training_job(life, tokens)
    result = search(model, systems, training_space(life), job, front=False)
    if result.best is None:
        raise shortfall(model, result, job)
    row = result.best.to_dict()
    row["usd_per_token"] = row["usd"] / tokens
    row["solver_status"] = "optimal"
    return row


@dataclass(frozen=True)
class _TrainingFields:
    """The fields of `Lifetime` the training cluster reads."""

    train_systems: tuple[str, ...]
    chip_budget: int
    deadline_days: float
    seq: int
    global_batch_tokens: float


def lifetime_cost(n_params: float, life: Lifetime) -> dict:
    """Every term of the lifetime cost of a model of about n_params at the target loss."""
    model = dense_model(n_params)
    n = model.params_total
    d_pre = tokens_for_loss(n, life.target_loss, life.fit)
    if not math.isfinite(d_pre):
        raise InfeasibleError(f"a {n / 1e9:.0f}B model cannot reach loss {life.target_loss} at any token count")
    t0 = time.perf_counter()
    train = train_cluster(model, life, d_pre)
    pre_usd = d_pre * train["usd_per_token"]
    d_rl = life.rl_tokens_per_pretrain_token * d_pre
    rl_usd = d_rl * train["usd_per_token"] * life.rl_flops_factor / 6.0 * life.rl_inefficiency
    space = build_space(model, life.workload, life.serving)
    mode, serve = solve_cheapest(space)  # USD per request, prefill counted, aggregated or disaggregated
    d_inf = life.demand_tokens_per_s * life.deployment_days * 86400
    usd_per_mtok = serve.metrics["usd_per_request"] / life.workload.output * 1e6  # the whole request per output Mtok
    inf_usd = d_inf * usd_per_mtok / 1e6
    cfg = describe_choice(space, serve.choice if mode == "aggregated" else serve.decode)
    return {
        "params": n, "d_model": model.spec.d_model, "layers": model.spec.n_layers,
        "pretrain_tokens": d_pre, "chinchilla_tokens": CHINCHILLA_TOKENS_PER_PARAM * n,
        "overtraining_ratio": d_pre / (CHINCHILLA_TOKENS_PER_PARAM * n), "rl_tokens": d_rl, "inference_tokens": d_inf,
        "pretrain_usd": pre_usd, "rl_usd": rl_usd, "inference_usd": inf_usd, "lifetime_usd": pre_usd + rl_usd + inf_usd,
        "pretrain_flops": 6 * n * d_pre, "train_system": train["system"], "train_chips": int(train["chips"]),
        "train_layout": layout_of(pd.Series(train)).describe(),
        "train_mfu": train["mfu"], "train_days": d_pre / train["tokens_per_s"] / 86400,
        "serve_system": cfg["system"], "serve_chips": cfg["chips"], "serving": mode,
        "serve_usd_per_mtok": usd_per_mtok, "serve_prefill_share": serve.metrics["prefill_share"],
        "solve_wall_s": time.perf_counter() - t0,
    }


def equalization_heuristic(life: Lifetime, n_params: float) -> dict:
    """The lecture's back-of-envelope: D_pre = D_inf, and how far that is past Chinchilla for n_params."""
    d_inf = life.demand_tokens_per_s * life.deployment_days * 86400
    return {"inference_tokens": d_inf, "pretrain_tokens": d_inf,
            "overtraining_ratio": d_inf / (CHINCHILLA_TOKENS_PER_PARAM * n_params), "params": n_params}
