"""KV-cache tiers from the catalogs: per-tier capacity, bandwidth, drain time and price, the costs the
tiering program (`formulations.kv_tiering`) compares (storage, reads, recomputation), its solve through the
bridge and an exhaustive reference.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import numpy as np

from dse.catalog.hardware import System, get_system, load_memory_tiers
from dse.catalog.models import get_model
from dse.optimize.bridge import solve_pyomo
from dse.optimize.solver import SolveResult
from dse.physics.evaluate import Config, evaluate_config
from formulations.kv_tiering import TIERS, TieringData, build


@dataclass(frozen=True)
class Tier:
    name: str
    capacity: float  # bytes, per node
    bandwidth: float  # bytes/s, per node
    usd_per_byte_s: float

    @property
    def drain_s(self) -> float:
        """Time to read the whole tier once: capacity / bandwidth (the lecture's match to cache lifetimes);
        NaN for a tier the node does not have (no drives).
        """
        return self.capacity / self.bandwidth if self.bandwidth > 0 else math.nan


def node_tiers(system: System, chips: int, nvme_drives: int, hdd_drives: int) -> dict[str, Tier]:
    """The tiers of one serving node of ``chips`` chips."""
    cat = load_memory_tiers()
    hbm_price = system.price_per_s / system.hbm_capacity  # the chip's rent per byte of its HBM
    nvme, hdd = cat["nvme"], cat["hdd"]
    return {
        "hbm": Tier("hbm", system.hbm_capacity * chips, system.hbm_bandwidth * chips, hbm_price),
        "host_dram": Tier("host_dram", system.host_memory_capacity * chips, system.host_offload_bandwidth * chips,
                          cat["host_dram"].price_per_byte_s),
        "nvme": Tier("nvme", nvme.device_capacity * nvme_drives, nvme.device_bandwidth * nvme_drives,
                     nvme.price_per_byte_s),
        "hdd": Tier("hdd", hdd.device_capacity * hdd_drives, hdd.device_bandwidth * hdd_drives, hdd.price_per_byte_s),
    }


@dataclass(frozen=True)
class PrefixClass:
    name: str
    prefix_tokens: int
    prefixes_kept: int  # distinct prefixes held at once
    lifetime_s: float  # how long one is kept (the cache's time-to-live)
    hits_per_s: float  # reads of the class per second
    ttft_s: float


def tiering_data(model_id: str, system_id: str, chips: int, serve: dict, classes: list[PrefixClass],
                 nvme_drives: int, hdd_drives: int, kv_dtype: str = "fp8") -> tuple[TieringData, dict]:
    """Costs and limits of every (class, tier) for a model served on ``serve`` (a `dse evaluate` config)."""
    model, system = get_model(model_id), get_system(system_id)
    tiers = node_tiers(system, chips, nvme_drives, hdd_drives)
    per_token = model.kv_bytes_per_token(kv_dtype)
    n = len(classes)
    cost = np.zeros((n, len(TIERS)))
    load = np.zeros((n, len(TIERS)))
    kept = np.array([c.prefix_tokens * per_token * c.prefixes_kept for c in classes], dtype=float)
    read = np.array([c.prefix_tokens * per_token * c.hits_per_s for c in classes], dtype=float)
    prefill = {}
    for i, c in enumerate(classes):
        ev = evaluate_config(Config(model=model_id, system=system_id, batch=1, context=c.prefix_tokens,
                                    phase="prefill", kv_dtype=kv_dtype, **serve))
        prefill[c.name] = ev
        one = c.prefix_tokens * per_token
        for j, t in enumerate(TIERS):
            if t == "recompute":  # a prefill per hit, at the replica's rent
                cost[i, j] = c.hits_per_s * ev["chips"] * ev["usd_per_chip_hour"] / 3600 * ev["step_s"]
                load[i, j] = ev["step_s"]
                continue
            tier = tiers[t]
            if not (math.isfinite(tier.capacity) and tier.capacity > 0):
                cost[i, j] = math.inf
                continue
            storage = kept[i] * tier.usd_per_byte_s
            device_time = one / tier.bandwidth  # seconds of the tier's read bandwidth per hit
            reads = c.hits_per_s * device_time * tier.capacity * tier.usd_per_byte_s  # that time of the devices' rent
            cost[i, j] = storage + reads
            load[i, j] = one / tier.bandwidth
    capacity = np.array([tiers[t].capacity if t in tiers else math.inf for t in TIERS])
    bandwidth = np.array([tiers[t].bandwidth if t in tiers else math.inf for t in TIERS])
    data = TieringData([c.name for c in classes], kept, read, cost, load, np.array([c.ttft_s for c in classes]),
                       np.nan_to_num(capacity, nan=0.0), np.nan_to_num(bandwidth, nan=0.0))
    return data, {"tiers": tiers, "prefill": prefill, "kv_bytes_per_token": per_token}


def solve_tiering(data: TieringData, solver: str = "highs", time_limit_s: float = 60.0
                  ) -> tuple[SolveResult, np.ndarray | None]:
    """Solve the tiering program: the solver's answer and each class's tier (an index into TIERS; None when
    no assignment was found).
    """
    m = build(data)
    res = solve_pyomo(m, solver, time_limit_s)
    if not res.ok:
        return res, None
    z = np.array([[m.z[c, t].value for t in m.T] for c in m.C], dtype=float)
    return res, z.argmax(axis=1)


def exhaustive(data: TieringData) -> float | None:
    """Cheapest feasible assignment over every tier per class (small instances); None if infeasible."""
    best = None
    for choice in itertools.product(range(len(TIERS)), repeat=len(data.classes)):
        c = np.arange(len(data.classes))
        t = np.array(choice)
        if (data.load_s[c, t] > data.ttft_s).any() or not np.isfinite(data.cost[c, t]).all():
            continue
        held = np.bincount(t, weights=data.bytes_kept, minlength=len(TIERS))
        read = np.bincount(t, weights=data.read_rate, minlength=len(TIERS))
        if (held > data.capacity).any() or (read > data.bandwidth).any():
            continue
        total = float(data.cost[c, t].sum())
        best = total if best is None else min(best, total)
    return best
