"""KV-cache tiering as a mixed-integer program (Pyomo).

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
import pyomo.environ as pyo

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

    def closed(self, c: int, t: int) -> bool:
        """Whether tier t cannot serve class c: too slow for its TTFT, or absent (no price)."""
        return bool(self.load_s[c, t] > self.ttft_s[c] or not np.isfinite(self.cost[c, t]))


def add_sets(m: pyo.ConcreteModel, d: TieringData) -> None:
    m.C = pyo.Set(initialize=range(len(d.classes)))
    m.T = pyo.Set(initialize=range(len(TIERS)))


def add_variables(m: pyo.ConcreteModel, d: TieringData) -> None:
    m.z = pyo.Var(m.C, m.T, domain=pyo.Binary)  # class c lives on tier t


def add_assignment(m: pyo.ConcreteModel, d: TieringData) -> None:
    """Each class lives on exactly one tier (or is recomputed); tiers too slow for its TTFT are closed."""
    m.one_tier = pyo.Constraint(m.C, rule=lambda _, c: sum(m.z[c, t] for t in m.T) == 1)
    shut = [(c, t) for c in m.C for t in m.T if d.closed(c, t)]
    if shut:
        m.closed = pyo.Constraint(shut, rule=lambda _, c, t: m.z[c, t] == 0)


def add_tier_limits(m: pyo.ConcreteModel, d: TieringData) -> None:
    """A tier holds at most its capacity and serves at most its read bandwidth (recomputation has neither)."""
    held = [t for t in m.T if np.isfinite(d.capacity[t])]
    read = [t for t in m.T if np.isfinite(d.bandwidth[t])]
    m.capacity = pyo.Constraint(held, rule=lambda _, t: sum(
        float(d.bytes_kept[c]) * m.z[c, t] for c in m.C) <= float(d.capacity[t]))
    m.bandwidth = pyo.Constraint(read, rule=lambda _, t: sum(
        float(d.read_rate[c]) * m.z[c, t] for c in m.C) <= float(d.bandwidth[t]))


def build(d: TieringData) -> pyo.ConcreteModel:
    """The tiering program: minimize USD per second of storage, reads and recomputation."""
    m = pyo.ConcreteModel("kv_tiering")
    add_sets(m, d)
    add_variables(m, d)
    add_assignment(m, d)
    add_tier_limits(m, d)
    cost = {(c, t): float(d.cost[c, t]) if np.isfinite(d.cost[c, t]) else 0.0 for c in m.C for t in m.T}
    m.cost = pyo.Objective(expr=sum(cost[c, t] * m.z[c, t] for c in m.C for t in m.T), sense=pyo.minimize)
    return m
