"""Shared test helpers: the `dse` command in a process of its own, single configurations evaluated through the
vectorized physics with any System object, and the brute-force references of the search tests."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from dse.catalog.hardware import IDEAL, Efficiency, System
from dse.catalog.models import Architecture
from dse.catalog.units import DTYPES
from dse.physics.codes import KV_SHARDS, KV_TIERS, PHASES
from dse.physics.layout import Layout
from dse.physics.roofline import Candidates, ModelTable, SystemTable, evaluate


def dse(*args: str, env: dict | None = None, cwd: Path | None = None, timeout: float = 300,
        input: str | None = None) -> subprocess.CompletedProcess:
    """Run ``python -m dse.cli *args`` with this interpreter, as a user runs it; ``env`` is added to this
    process's environment. Output is captured as text; a run past ``timeout`` seconds raises TimeoutExpired."""
    return subprocess.run([sys.executable, "-m", "dse.cli", *args], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})}, cwd=cwd, input=input)


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
    kv_shard: str = "heads",
) -> dict[str, float]:
    cand = Candidates(
        model=0, system=0, tp=layout.tp, dp=layout.dp, ep=layout.ep, etp=layout.etp, pp=layout.pp,
        batch=batch, context=context, phase=PHASES.index(phase), weights_dtype=DTYPES.index(weights),
        kv_dtype=DTYPES.index(kv), kv_tier=KV_TIERS.index(tier), kv_shard=KV_SHARDS.index(kv_shard),
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


def candidates_of(rows: list[tuple], context: float):
    """Candidates from (system, tp, dp, ep, etp, pp, wd, kd, tier, n) rows: batch = DP x n per micro-batch."""
    import numpy as np

    from dse.physics.roofline import Candidates

    a = np.array(rows, dtype=np.int64).T
    return Candidates(model=0, system=a[0], tp=a[1], dp=a[2], ep=a[3], etp=a[4], pp=a[5], batch=a[2] * a[9],
                      context=context, weights_dtype=a[6], kv_dtype=a[7], kv_tier=a[8])


def served(w, ideal: bool = False, model=None):
    """The request as a study's space serves ``model``: through the serving stack of the catalog's default framework
    (vLLM on every vendor), its terms fitted in hw_catalog/calibration/serving_stack.yaml (the model's own where
    the fit has them); the engine alone in the pure roofline (``ideal``).
    """
    from dataclasses import replace

    from dse.catalog.frameworks import ENGINE_ONLY, stack_of

    return replace(w, stack=ENGINE_ONLY if ideal else stack_of("vllm", model.id if model is not None else None))


def brute_force_pools(model, w, opts):
    """Every decode replica (every layout at every batch per DP rank up to the cap) and every prefill replica
    (without and with context parallelism) of a space, listed independently of the space builder and
    evaluated by the request-level physics. Returns None when the space has no layout, else a dict with
    ``rows`` and ``dec`` (decode rows and `decode_pool` metrics), ``d_ok`` (fits and meets the TPOT target),
    ``pre_rows``, ``pre`` (`prefill_pool` metrics), ``rho`` (`rho_for_ttft`), ``p_ok`` (fits, TTFT met),
    ``cp``, ``pair`` and ``pre_pair`` (a decode row and a prefill row may pair where these are equal) and the
    physics inputs ``mt``, ``st``, ``eff``, ``req``."""
    import numpy as np

    from dse.catalog.hardware import IDEAL
    from dse.catalog.units import DTYPES
    from dse.physics.roofline import ModelTable, SystemTable
    from dse.physics.serving import decode_pool, prefill_pool, rho_for_ttft

    systems, choices = brute_force_choices(model, opts)
    if not choices:
        return None
    mt, st = ModelTable.build([model]), SystemTable.build(systems)
    eff = IDEAL if opts.ideal else None
    req = w = served(w, opts.ideal, model)
    rows = [(si, lay.tp, lay.dp, lay.ep, lay.etp, lay.pp, DTYPES.index(wd), DTYPES.index(kd), int(tier == "host"), n)
            for si, lay, wd, kd, tier in choices for n in range(1, opts.max_batch_per_rank + 1)]
    dec = decode_pool(candidates_of(rows, w.prompt + w.output), mt, st, req, eff)
    d_ok = dec["fits"] & np.isfinite(dec["usd_per_request"])
    if w.tpot_max is not None:
        d_ok &= dec["tpot_s"] <= w.tpot_max * (1 + 1e-9)
    for _, cap in w.tpot_quantile_max:  # a decode pool's passes carry no prefill: every request's TPOT is the pass's
        d_ok &= dec["tpot_s"] <= cap * (1 + 1e-9)
    pre_rows = [(si, lay.tp, lay.dp, lay.ep, lay.etp, lay.pp, DTYPES.index(wd), DTYPES.index(kd), 0, 1)
                for si, lay, wd, kd, tier in choices if tier == "hbm"] * 2
    cp = np.repeat([False, True], len(pre_rows) // 2)
    pre = prefill_pool(candidates_of(pre_rows, w.prompt), mt, st, req, cp, eff)
    rho = rho_for_ttft(pre["prefill_service_s"], pre["kv_transfer_s"], pre["stack_latency_s"], w)
    def pair(r):  # pools pair on one checkpoint and one KV encoding: the weights and KV formats, and FP8's encoding;
        # and on one vendor's hardware (the KV cache crosses within one vendor's serving stack) unless mixed allowed
        fnuz = int(DTYPES[r[7]] == "fp8" and systems[r[0]].kv_fp8 == "e4m3fnuz")
        vendor = "" if opts.mixed_vendors else systems[r[0]].vendor
        return f"{r[6]}/{r[7]}/{fnuz}/{vendor}"

    return {"rows": rows, "dec": dec, "d_ok": d_ok, "pre_rows": pre_rows, "pre": pre, "rho": rho,
            "pair": np.array([pair(r) for r in rows]), "pre_pair": np.array([pair(r) for r in pre_rows]),
            "p_ok": pre["fits"] & np.isfinite(rho), "cp": cp, "mt": mt, "st": st, "eff": eff, "req": req}
