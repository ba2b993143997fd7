"""``kind: kv_tiers``: which memory tier (HBM, host DRAM, NVMe, HDD) or recomputation each class of cached
prefixes belongs on (a MIP), with drain times and the cost of a cache hit against a cache write.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import pandas as pd
from pydantic import Field

from dse.errors import InfeasibleError, InputError
from dse.studies.base import MAX_LIST, Strict, StudySpec
from dse.studies.contract import Progress, Solved, status_of

USES_STORAGE = False
OBJECTIVE = "usd_per_s"
"""What the tiering program minimizes: USD per second of storage, reads and recomputation."""
WORKERS = False


class PrefixClassSpec(Strict):
    name: str
    prefix_tokens: int = Field(gt=0, le=100_000_000)
    prefixes_kept: int = Field(gt=0, le=1_000_000_000)
    lifetime_s: float = Field(gt=0, le=1e9)
    hits_per_s: float = Field(ge=0, le=1e9)
    ttft_s: float = Field(gt=0, le=86400)


class KVTiersSpec(Strict):
    """Cached-prefix classes on one serving node's memory tiers."""

    system: str = "h100"
    chips: int = Field(default=8, ge=1, le=4096)
    tp: int = Field(default=8, ge=1, le=4096)
    weights_dtype: Literal["bf16", "fp8", "fp4"] = "fp8"
    nvme_drives: int = Field(default=8, ge=0, le=10_000)
    hdd_drives: int = Field(default=12, ge=0, le=100_000)
    classes: list[PrefixClassSpec] = Field(min_length=1, max_length=MAX_LIST)


class Spec(StudySpec):
    kv_tiers: KVTiersSpec | None = None

    system_fields = ("kv_tiers.system",)

    def check_catalog(self, path: Path, models: dict) -> None:
        if self.kv_tiers is None:
            raise InputError(f"{path}: missing required field 'kv_tiers' (classes of cached prefixes and the node)")


def solve(spec: Spec, progress: Progress | None = None, storage: str | None = None) -> Solved:
    """Assign each class of cached prefixes a tier (MIP); drain times; cache-hit against cache-write cost."""
    from dse.optimize.kv_tiers import TIERS, PrefixClass, solve_tiering, tiering_data

    kt = spec.kv_tiers
    classes = [PrefixClass(c.name, c.prefix_tokens, c.prefixes_kept, c.lifetime_s, c.hits_per_s, c.ttft_s)
               for c in kt.classes]
    rows, results = [], []
    tiers_info = {}
    for model_id in spec.models:
        if progress:
            progress(model_id)
        serve = {"tp": kt.tp, "chips": kt.chips, "weights_dtype": kt.weights_dtype}
        data, info = tiering_data(model_id, kt.system, kt.chips, serve, classes, kt.nvme_drives, kt.hdd_drives)
        res, tier = solve_tiering(data, spec.solver.name)
        results.append(res)
        if tier is None:
            raise InfeasibleError(f"{model_id}: no tier assignment fits the tiers' capacity, bandwidth and TTFT")
        tiers_info = {k: {"capacity": v.capacity, "bandwidth": v.bandwidth, "drain_s": v.drain_s,
                          "usd_per_gb_hour": v.usd_per_byte_s * 1e9 * 3600} for k, v in info["tiers"].items()}
        for i, c in enumerate(classes):
            j = int(tier[i])
            recompute = TIERS.index("recompute")
            write = data.cost[i, recompute] / c.hits_per_s if c.hits_per_s else float("nan")  # one prefill
            hit = data.cost[i, j] / c.hits_per_s if c.hits_per_s and j != recompute else write
            drains = {t: tiers_info[t]["drain_s"] for t in tiers_info}
            rows.append({"model": model_id, "class": c.name, "prefix_tokens": c.prefix_tokens,
                         "lifetime_s": c.lifetime_s, "hits_per_s": c.hits_per_s, "tier": TIERS[j],
                         "usd_per_hour": data.cost[i, j] * 3600, "load_s": data.load_s[i, j],
                         "tier_drain_s": drains.get(TIERS[j], float("nan")),
                         "usd_per_cache_write": write, "usd_per_cache_hit": hit,
                         "write_over_hit": write / hit if hit else float("nan"),
                         "gb_kept": data.bytes_kept[i] / 1e9})
    tables = {"kv_tiers": pd.DataFrame(rows), "tiers": pd.DataFrame([{"tier": k, **v} for k, v in tiers_info.items()])}
    return Solved(status=status_of(results, []), tables=tables, results=results, facts={"tiers": tiers_info})


PLOTS = ()


def headline(summary: dict, tables: dict[str, pd.DataFrame]) -> list[str]:
    """One line per class of cached prefixes: its tier, the tier's drain time and the hit against the write cost."""
    lines = []
    for _, r in tables["kv_tiers"].iterrows():
        drain = "" if pd.isna(r["tier_drain_s"]) else f" (drain {r['tier_drain_s']:.3g} s)"
        lines.append(f"{r['model']} / {r['class']}: {r['tier']}{drain}, {r['gb_kept']:,.1f} GB kept, "
                     f"{r['usd_per_hour']:.3g} USD/h; a cache write costs {r['write_over_hit']:,.0f}x a hit")
    if lines:  # what a hit is charged, and what it is not
        lines.append("a hit costs the tier's storage and its devices' read time; the GPUs' time while the prefix "
                     "loads is not charged (the load assumed to overlap other requests' work; load_s gives it)")
    return lines
