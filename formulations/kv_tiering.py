"""KV-cache tiering as a mixed-integer program.

Classes of cached prefixes (how many are kept, how long, their size, how often they are hit) are
each assigned one tier (HBM, host DRAM, NVMe flash, HDD) or recomputation. The cost per second of a
class on a tier is its storage (bytes x price per byte-second x fraction of time kept) plus its reads
(device time per hit x hits per second); recomputation pays a prefill per hit. Each tier's capacity
and read bandwidth bound what it can hold and serve, and the time to load a prefix (or recompute
it) must fit the TTFT budget.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
from ortools.linear_solver.python import model_builder as mb

TIERS = ("hbm", "host_dram", "nvme", "hdd", "recompute")


@dataclass(frozen=True)
class TieringData:
    """Per class: bytes kept, hits per second, and per (class, tier): cost per second and load time."""

    classes: list[str]
    bytes_kept: np.ndarray  # bytes of all prefixes of a class held at once
    read_rate: np.ndarray  # bytes per second read back by hits
    cost: np.ndarray  # (classes, tiers) USD per second
    load_s: np.ndarray  # (classes, tiers) seconds to bring one prefix back
    ttft_s: np.ndarray  # per class
    capacity: np.ndarray  # per tier, bytes (inf for recompute)
    bandwidth: np.ndarray  # per tier, bytes per second (inf for recompute)


@dataclass
class TieringModel:
    model: mb.Model
    z: pd.Series
    data: TieringData


def build(data: TieringData) -> TieringModel:
    m = mb.Model()
    idx = pd.MultiIndex.from_product([range(len(data.classes)), range(len(TIERS))], names=["class", "tier"])
    z = m.new_bool_var_series("z", idx)
    # Each class lives on exactly one tier (or is recomputed); tiers too slow for its TTFT are closed.
    for c in range(len(data.classes)):
        m.add(mb.LinearExpr.sum([z[c, t] for t in range(len(TIERS))]) == 1)
        for t in range(len(TIERS)):
            if data.load_s[c, t] > data.ttft_s[c] or not np.isfinite(data.cost[c, t]):
                m.add(z[c, t] == 0)
    # A tier holds at most its capacity and serves at most its bandwidth.
    for t in range(len(TIERS)):
        if np.isfinite(data.capacity[t]):
            m.add(mb.LinearExpr.weighted_sum([z[c, t] for c in range(len(data.classes))], list(data.bytes_kept))
                  <= float(data.capacity[t]))
        if np.isfinite(data.bandwidth[t]):
            m.add(mb.LinearExpr.weighted_sum([z[c, t] for c in range(len(data.classes))], list(data.read_rate))
                  <= float(data.bandwidth[t]))
    costs = [float(data.cost[c, t]) if np.isfinite(data.cost[c, t]) else 0.0 for c, t in idx]
    m.minimize(mb.LinearExpr.weighted_sum(list(z), costs))
    return TieringModel(m, z, data)


def exhaustive(data: TieringData) -> float | None:
    """Cheapest feasible assignment over every tier per class (small instances); None if infeasible."""
    import itertools

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
