"""Evaluate single configurations through the vectorized physics, with any System object."""

from __future__ import annotations

from dse.catalog.hardware import IDEAL, Efficiency, System
from dse.catalog.models import Architecture
from dse.catalog.units import DTYPES
from dse.physics.codes import KV_TIERS, PHASES
from dse.physics.layout import Layout
from dse.physics.roofline import Candidates, ModelTable, SystemTable, evaluate


def run(
    model: Architecture,
    system: System,
    layout: Layout,
    batch: float,
    context: float,
    phase: str = "decode",
    weights: str = "bf16",
    kv: str = "bf16",
    tier: str = "hbm",
    eff: Efficiency = IDEAL,
) -> dict[str, float]:
    cand = Candidates(
        model=0, system=0, tp=layout.tp, dp=layout.dp, ep=layout.ep, etp=layout.etp, pp=layout.pp,
        batch=batch, context=context, phase=PHASES.index(phase), weights_dtype=DTYPES.index(weights),
        kv_dtype=DTYPES.index(kv), kv_tier=KV_TIERS.index(tier),
    )
    out = evaluate(cand, ModelTable.build([model]), SystemTable.build([system]), eff)
    return {k: v.item() for k, v in out.items()}
