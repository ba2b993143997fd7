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


def brute_force_choices(model: Architecture, opts) -> tuple[list, list]:
    """The priced systems of ``opts`` and every (system index, layout, weights, KV, tier) of its space, listed
    here independently of the space builder: the brute-force references enumerate from this."""
    import math

    from dse.catalog.hardware import default_systems
    from dse.physics.layout import layouts_for

    catalog = default_systems()  # priced at the default kind; a system without such a price is left out
    systems = [catalog[s] for s in opts.systems if not math.isnan(catalog[s].price_per_s)]
    choices = []
    for si, system in enumerate(systems):
        limit = min(opts.max_chips_per_stage, system.scaleup_domain * opts.max_racks)
        sizes = {2**i for i in range(31) if 2**i <= limit}
        sizes |= {system.scaleup_domain * r for r in range(1, opts.max_racks + 1)
                  if system.scaleup_domain * r <= limit}
        for cps in sorted(sizes):
            for lay in layouts_for(model, cps, pps=opts.pp):
                if lay.tp not in opts.tp or lay.chips > system.scaleup_domain * opts.max_racks:
                    continue
                if (model.is_moe and lay.etp not in (1, lay.tp)) or (not model.is_moe and lay.etp != cps):
                    continue
                if lay.chips > system.scaleup_domain and math.isnan(system.scaleout_bandwidth):
                    continue
                for wd in opts.weights_dtypes:
                    if not system.is_native(wd):  # the chip computes only in formats it has tensor units for
                        continue
                    for kd in opts.kv_dtypes:
                        if kd not in system.kv_dtypes:  # KV formats its kernels support
                            continue
                        for tier in opts.kv_tiers:
                            if tier == "host" and (math.isnan(system.host_memory_capacity)
                                                   or math.isnan(system.host_offload_bandwidth)):
                                continue
                            choices.append((si, lay, wd, kd, tier))
    return systems, choices


def random_space(rng, moe: bool | None = None):
    """A random model (MoE, dense or either) and small space options over the priced systems: the spaces the
    brute-force references are run on (each test adds its own workload and targets)."""
    import math

    from dse.catalog.hardware import default_systems
    from dse.catalog.models import default_models, get_model
    from dse.optimize.space import SpaceOptions

    names = sorted(m for m in default_models() if moe is None or get_model(m).is_moe == moe)
    systems = sorted(s for s, v in default_systems().items() if not math.isnan(v.price_per_s))
    model = get_model(names[rng.integers(len(names))])
    opts = SpaceOptions(
        systems=tuple(rng.choice(systems, size=rng.integers(1, 3), replace=False)),
        weights_dtypes=tuple(rng.choice(["bf16", "fp8", "fp4"], size=rng.integers(1, 3), replace=False)),
        kv_dtypes=tuple(rng.choice(["bf16", "fp8"], size=1)),
        kv_tiers=("hbm",) if rng.random() < 0.7 else ("hbm", "host"),
        tp=tuple(sorted(int(t) for t in rng.choice([1, 2, 4, 8], size=rng.integers(1, 3), replace=False))),
        pp=(1,) if rng.random() < 0.6 else (1, 2),
        max_racks=int(rng.integers(1, 3)),
        max_chips_per_stage=int(rng.choice([8, 16, 72])),
        max_batch_per_rank=int(rng.choice([8, 32, 96])),
        ideal=bool(rng.random() < 0.4),
    )
    return model, opts
