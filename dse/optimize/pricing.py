"""What API price sheets reveal (inverse) and how an operator should price context tiers (forward).

Inverse (the lecture's reading): a price step at context L* says that above L* the KV fetch time
of decode passes its compute time, so KV bytes per token = (bandwidth / FLOP/s) x 2 N_active / L*;
and the output / input price ratio says how much less efficiently decode uses the chips than prefill.
Forward: the cheapest serving cost per token at each context (the serving MIP), and the price of
each tier set at its most expensive context plus a margin, so that every tier stays profitable.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dse.catalog.hardware import System
from dse.physics.roofline import kv_crossover_bytes_per_token


@dataclass(frozen=True)
class PriceSheet:
    name: str
    step_context: float  # tokens where the long-context tier starts
    input_short: float
    input_long: float
    output_short: float
    output_long: float

    @property
    def decode_over_prefill(self) -> float:
        """Output over input price below the step: decode's chip time per token over prefill's."""
        return self.output_short / self.input_short


def inverse(sheet: PriceSheet, system: System, actives: np.ndarray, dtype: str = "fp8") -> list[dict]:
    """For each active-parameter count, the KV bytes per token that put the crossover at the price step."""
    flops = system.flops[system.compute_dtype(dtype)]
    rows = []
    for n in actives:
        kv = kv_crossover_bytes_per_token(flops, system.hbm_bandwidth, float(n), sheet.step_context)
        rows.append({
            "sheet": sheet.name, "system": system.id, "params_active": float(n), "step_context": sheet.step_context,
            "kv_bytes_per_token": kv, "flop_per_byte": flops / system.hbm_bandwidth,
            "working": f"({system.hbm_bandwidth / 1e12:.3g} TB/s / {flops / 1e15:.3g} PFLOP/s) x 2 x "
                       f"{n / 1e9:.0f}B / {sheet.step_context:,.0f} = {kv:,.0f} B/token",
            "decode_over_prefill": sheet.decode_over_prefill,
            "implied_decode_mfu": 1.0 / sheet.decode_over_prefill,
            "gqa_kv_heads_at_128_dims_fp8": kv / (2 * 128),  # per layer-equivalent, the lecture's 8 x 128
        })
    return rows


def tier_prices(contexts: np.ndarray, costs: np.ndarray, boundaries: list[float], margin: float) -> list[dict]:
    """Price each tier (contexts up to its boundary) at its most expensive context times (1 + margin)."""
    out, lo = [], 0.0
    for hi in boundaries:
        inside = (contexts > lo) & (contexts <= hi)
        worst = float(costs[inside].max()) if inside.any() else float("nan")
        out.append({"tier_from": lo, "tier_to": hi, "max_cost_usd_per_mtok": worst,
                    "price_usd_per_mtok": worst * (1 + margin)})
        lo = hi
    return out


def consistent_architectures(sheet: PriceSheet, system: System, actives: np.ndarray, tolerance: float = 0.25,
                             dtype: str = "fp8") -> list[dict]:
    """Every architecture of a grid (active size, KV heads of 128, layers, cross-layer sharing, KV format)
    whose decode crossover context lies within ``tolerance`` of the price step.
    """
    flops = system.flops[system.compute_dtype(dtype)]
    rows = []
    for n in actives:
        for kv_heads in (1, 2, 4, 8, 16):
            for layers in (40, 60, 80, 100, 120):
                for share in sorted({1, 2, 4, 8, 16, layers}):  # layers sharing one KV cache; all of them
                    for kv_dtype, width in (("fp8", 1.0), ("bf16", 2.0)):
                        kv = 2 * kv_heads * 128 * layers / share * width
                        crossover = system.hbm_bandwidth / flops * 2.0 * float(n) / kv
                        if abs(crossover / sheet.step_context - 1.0) <= tolerance:
                            rows.append({"sheet": sheet.name, "params_active": float(n), "kv_heads": kv_heads,
                                         "layers": layers, "layers_sharing_kv": share, "kv_dtype": kv_dtype,
                                         "kv_bytes_per_token": kv, "crossover_context": crossover})
    return rows
