"""MoE expert placement as a mixed-integer program.

Experts with loads (tokens per step) are placed on GPUs grouped in scale-up domains; each GPU has a
number of expert slots (from its HBM), and a budget of redundant replicas lets hot experts live on
several GPUs. x[e, g] = 1 places a replica of expert e on GPU g; y[e, g] >= 0 is the share of e's
tokens that g serves (only where a replica is). Stage 1 minimizes the most-loaded GPU's tokens
(the slowest GPU sets the step); stage 2 keeps that and minimizes the tokens that cross the
scale-out network, counting a token of expert e from domain d as local when d holds a replica.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
from ortools.linear_solver.python import model_builder as mb


@dataclass(frozen=True)
class PlacementData:
    """Loads per expert, GPUs per domain, slots per GPU, replicas allowed beyond one per expert."""

    loads: np.ndarray  # tokens per step routed to each expert
    gpus: int
    domain: int  # GPUs per scale-up domain
    slots: int  # expert replicas one GPU can hold
    redundant: int  # replicas allowed beyond one per expert

    @property
    def experts(self) -> int:
        return len(self.loads)

    @property
    def domains(self) -> int:
        return int(np.ceil(self.gpus / self.domain))

    def domain_of(self, g: int) -> int:
        return g // self.domain


@dataclass
class PlacementModel:
    model: mb.Model
    x: pd.Series
    y: pd.Series
    h: pd.Series
    peak: object
    data: PlacementData


def build(data: PlacementData, peak_max: float | None = None) -> PlacementModel:
    """Stage 1 (peak_max None): minimize the peak GPU load. Stage 2: cap the peak, minimize crossing tokens."""
    m = mb.Model()
    idx = pd.MultiIndex.from_product([range(data.experts), range(data.gpus)], names=["expert", "gpu"])
    x = m.new_bool_var_series("x", idx)
    y = m.new_num_var_series("y", idx, lower_bounds=0.0, upper_bounds=1.0)
    didx = pd.MultiIndex.from_product([range(data.experts), range(data.domains)], names=["expert", "domain"])
    h = m.new_bool_var_series("h", didx)
    peak = m.new_num_var(0.0, float(data.loads.sum()), "peak")
    # Every expert has at least one replica, and its tokens are fully served.
    for e in range(data.experts):
        m.add(mb.LinearExpr.sum([x[e, g] for g in range(data.gpus)]) >= 1)
        m.add(mb.LinearExpr.sum([y[e, g] for g in range(data.gpus)]) == 1)
        for g in range(data.gpus):
            m.add(y[e, g] <= x[e, g])
    # Each GPU holds at most its slots; all replicas within the budget.
    for g in range(data.gpus):
        m.add(mb.LinearExpr.sum([x[e, g] for e in range(data.experts)]) <= data.slots)
    m.add(mb.LinearExpr.sum(list(x)) <= data.experts + data.redundant)
    # The peak is at least every GPU's load.
    for g in range(data.gpus):
        m.add(mb.LinearExpr.weighted_sum([y[e, g] for e in range(data.experts)], list(data.loads)) <= peak)
    # h[e, d] may be 1 only where domain d holds a replica of e.
    for e in range(data.experts):
        for d in range(data.domains):
            members = [x[e, g] for g in range(data.gpus) if data.domain_of(g) == d]
            m.add(h[e, d] <= mb.LinearExpr.sum(members))
    if peak_max is None:
        m.minimize(peak)
    else:
        m.add(peak <= peak_max)
        # tokens of e from domain d (an even share) cross the scale-out network unless d holds e
        share = 1.0 / data.domains
        m.minimize(mb.LinearExpr.weighted_sum(list(h), [-data.loads[e] * share for e, _ in didx]))
    return PlacementModel(m, x, y, h, peak, data)


def crossing_tokens(data: PlacementData, x: np.ndarray) -> float:
    """Tokens per step that leave their domain, with tokens routed to a local replica when one exists."""
    held = np.zeros((data.experts, data.domains), dtype=bool)
    for g in range(data.gpus):
        held[:, data.domain_of(g)] |= x[:, g] > 0.5
    return float((data.loads[:, None] * (1.0 / data.domains) * ~held).sum())


def greedy_eplb(data: PlacementData) -> tuple[np.ndarray, np.ndarray]:
    """The balanced-packing baseline of DeepSeek's EPLB: give each redundant replica to the expert
    with the most tokens per replica, split each expert's tokens evenly over its replicas, then place
    replicas heaviest first on the least-loaded GPU with a free slot. Returns (x, y).
    """
    replicas = np.ones(data.experts, dtype=int)
    for _ in range(data.redundant):
        if replicas.sum() >= data.gpus * data.slots:
            break
        room = np.where(replicas < data.gpus, data.loads / replicas, -1.0)  # a replica per GPU at most
        if room.max() < 0:
            break
        replicas[int(np.argmax(room))] += 1
    items = sorted(((data.loads[e] / replicas[e], e) for e in range(data.experts) for _ in range(replicas[e])),
                   reverse=True)
    load = np.zeros(data.gpus)
    used = np.zeros(data.gpus, dtype=int)
    x = np.zeros((data.experts, data.gpus))
    y = np.zeros((data.experts, data.gpus))
    for w, e in items:
        free = [g for g in range(data.gpus) if used[g] < data.slots and x[e, g] == 0]
        if not free:
            raise ValueError("the replicas do not fit in the GPUs' slots")
        g = min(free, key=lambda k: load[k])
        x[e, g] = 1
        y[e, g] = 1.0 / replicas[e]
        load[g] += w
        used[g] += 1
    return x, y


def zipf_loads(experts: int, tokens: float, skew: float, seed: int = 0) -> np.ndarray:
    """Tokens per expert drawn from a Zipf law of exponent ``skew`` over a random expert order."""
    rank = np.random.default_rng(seed).permutation(experts) + 1.0
    w = rank ** -skew
    return tokens * w / w.sum()
