"""Evaluate one serving configuration: resolve names and layout, run the vectorized physics on a
single candidate, and return plain numbers keyed as in the command-line contract.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from dse.errors import InputError
from dse.hardware import IDEAL, Efficiency, efficiency_for, get_system
from dse.layout import Layout, resolve_layout
from dse.models import get_model
from dse.physics import BOUNDS, KV_TIERS, PHASES, Candidates, ModelTable, SystemTable, evaluate
from dse.units import DTYPES
from dse.validate import error_band


@dataclass(frozen=True)
class Config:
    """One serving configuration as a user states it."""

    model: str
    system: str
    batch: int
    context: int
    tp: int | None = None
    ep: int | None = None
    pp: int | None = None
    dp: int | None = None
    etp: int | None = None
    chips: int | None = None
    phase: str = "decode"
    weights_dtype: str = "bf16"
    kv_dtype: str = "bf16"
    kv_tier: str = "hbm"
    prompt: int | None = None  # prompt length for TTFT; default: the context
    moe_imbalance: float = 1.0  # most-loaded GPU's routed tokens over the mean (from expert placement)


def _choice(name: str, value: str, allowed: tuple[str, ...]) -> int:
    if value not in allowed:
        raise InputError(f"--{name} '{value}' is not allowed; allowed: {', '.join(allowed)}")
    return allowed.index(value)


def evaluate_config(cfg: Config, ideal: bool = False, efficiency: Efficiency | None = None) -> dict:
    """All metrics of one configuration; raises InputError on bad names, layouts or values."""
    model = get_model(cfg.model)
    system = get_system(cfg.system)
    phase = _choice("phase", cfg.phase, PHASES)
    wd = _choice("weights-dtype", cfg.weights_dtype, DTYPES)
    kd = _choice("kv-dtype", cfg.kv_dtype, DTYPES)
    tier = _choice("kv-tier", cfg.kv_tier, KV_TIERS)
    if not cfg.moe_imbalance >= 1.0:
        raise InputError(f"--moe-imbalance must be >= 1 (most-loaded GPU over the mean), got {cfg.moe_imbalance}")
    for name, value in (("batch", cfg.batch), ("context", cfg.context), ("prompt", cfg.prompt or 1)):
        if not isinstance(value, int) or value < 1:
            raise InputError(f"--{name} must be a whole number >= 1, got {value!r}")
    layout: Layout = resolve_layout(model, cfg.tp, cfg.ep, cfg.pp, cfg.dp, cfg.etp, cfg.chips)
    if tier == 1 and (math.isnan(system.host_memory_capacity) or math.isnan(system.host_offload_bandwidth)):
        raise InputError(
            f"--kv-tier host: the catalog has no host memory capacity and bandwidth for system '{system.id}'; "
            "use --kv-tier hbm"
        )
    if math.isnan(system.scaleout_bandwidth) and layout.chips > system.scaleup_domain:
        raise InputError(
            f"layout {layout.describe()} needs {layout.chips} chips, more than one {system.scaleup_domain}-chip "
            f"domain of '{system.id}', whose scale-out bandwidth the catalog does not know"
        )
    eff = IDEAL if ideal else (efficiency or efficiency_for(system.id))
    cand = Candidates(
        model=0, system=0, tp=layout.tp, dp=layout.dp, ep=layout.ep, etp=layout.etp, pp=layout.pp,
        batch=cfg.batch, context=cfg.context, phase=phase, weights_dtype=wd, kv_dtype=kd, kv_tier=tier,
        imbalance=cfg.moe_imbalance,
    )
    tables = ModelTable.build([model]), SystemTable.build([system])
    raw = evaluate(cand, *tables, eff)
    if cfg.prompt is not None and phase == 0:
        first = replace(cand, batch=1, context=cfg.prompt, phase=1)
        raw["ttft_s"] = evaluate(first, *tables, eff, ttft=False)["step_s"]
    out: dict = {
        "model": model.id,
        "system": system.id,
        "phase": cfg.phase,
        "ideal": ideal,
        "tp": layout.tp,
        "dp": layout.dp,
        "ep": layout.ep,
        "etp": layout.etp,
        "pp": layout.pp,
        "racks": math.ceil(layout.chips / system.scaleup_domain),
        "batch": cfg.batch,
        "context": cfg.context,
        "prompt": cfg.prompt or cfg.context,
        "weights_dtype": cfg.weights_dtype,
        "kv_dtype": cfg.kv_dtype,
        "kv_tier": cfg.kv_tier,
        "compute_dtype": system.compute_dtype(cfg.weights_dtype),
    }
    for key, value in raw.items():
        v = value.item()
        if key == "bound":
            out[key] = BOUNDS[int(v)]
        elif key == "fits":
            out[key] = bool(v)
        elif key in ("chips", "sequences_in_flight"):
            out[key] = int(v)
        else:
            out[key] = None if (isinstance(v, float) and math.isnan(v)) else (None if v == math.inf else float(v))
    out["params_total"] = model.params_total
    out["params_active"] = model.params_active
    out["params_embedding"] = model.params_embedding
    out["kv_bytes_per_token"] = model.kv_bytes_per_token(cfg.kv_dtype)
    out["hbm_capacity_per_chip"] = system.hbm_capacity
    out["usd_per_chip_hour"] = system.price_per_s * 3600
    band = None if ideal else error_band(system.id)
    if band is None:
        out["tokens_per_s_band"] = out["usd_per_mtok_band"] = out["tpot_s_band"] = None
    else:  # from the leave-one-out residuals of `dse validate`: 10th-90th percentile of measured / predicted
        lo, hi = band
        out["tokens_per_s_band"] = [out["tokens_per_s"] * lo, out["tokens_per_s"] * hi]
        out["usd_per_mtok_band"] = [out["usd_per_mtok"] / hi, out["usd_per_mtok"] / lo]
        tpot = out["tpot_s"]
        out["tpot_s_band"] = None if tpot is None else [tpot / hi, tpot / lo]
    return out
