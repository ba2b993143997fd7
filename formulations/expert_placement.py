"""MoE expert placement as a mixed-integer program (Pyomo).

Experts with loads (tokens per step) are placed on GPUs grouped in scale-up domains; each GPU has a
number of expert slots (from its HBM), and a budget of redundant replicas lets hot experts live on
several GPUs. x[e, g] = 1 places a replica of expert e on GPU g; y[e, g] >= 0 is the share of e's
tokens that g serves (only where a replica is). Stage 1 minimizes the most-loaded GPU's tokens
(the slowest GPU sets the step); stage 2 keeps that and minimizes the tokens that cross the
scale-out network, counting a token of expert e from domain d as local when d holds a replica.

The constraints live in three blocks (each expert's own, the GPUs' capacity, the domains' locality) declared
in that order: the bridge compiles blocks in declaration order, so the rows reach the solver expert by expert,
then GPU by GPU. The study stops SCIP at node limits, where the answer depends on that order.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyomo.environ as pyo


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


def add_sets(m: pyo.ConcreteModel, d: PlacementData) -> None:
    m.E = pyo.Set(initialize=range(d.experts))
    m.G = pyo.Set(initialize=range(d.gpus))
    m.D = pyo.Set(initialize=range(d.domains))


def add_variables(m: pyo.ConcreteModel, d: PlacementData) -> None:
    m.x = pyo.Var(m.E, m.G, domain=pyo.Binary)  # a replica of e on g
    m.y = pyo.Var(m.E, m.G, domain=pyo.NonNegativeReals, bounds=(0.0, 1.0))  # share of e's tokens served by g
    m.h = pyo.Var(m.E, m.D, domain=pyo.Binary)  # domain d holds a replica of e
    m.peak = pyo.Var(domain=pyo.NonNegativeReals, bounds=(0.0, float(d.loads.sum())))


def add_experts(m: pyo.ConcreteModel, d: PlacementData) -> None:
    """Every expert has at least one replica, its tokens are fully served, and only by GPUs holding a replica."""

    def expert(b: pyo.Block, e: int) -> None:
        b.placed = pyo.Constraint(expr=sum(m.x[e, g] for g in m.G) >= 1)
        b.served = pyo.Constraint(expr=sum(m.y[e, g] for g in m.G) == 1)
        b.only_where_placed = pyo.Constraint(m.G, rule=lambda _, g: m.y[e, g] <= m.x[e, g])

    m.expert = pyo.Block(m.E, rule=expert)


def add_capacity(m: pyo.ConcreteModel, d: PlacementData) -> None:
    """Each GPU holds at most its slots, all replicas stay within the budget, and the peak is at least every
    GPU's load.
    """
    loads = [float(w) for w in d.loads]

    def capacity(b: pyo.Block) -> None:
        b.slots = pyo.Constraint(m.G, rule=lambda _, g: sum(m.x[e, g] for e in m.E) <= d.slots)
        b.replicas = pyo.Constraint(expr=sum(m.x[e, g] for e in m.E for g in m.G) <= d.experts + d.redundant)
        b.peak_load = pyo.Constraint(m.G, rule=lambda _, g: m.peak - sum(loads[e] * m.y[e, g] for e in m.E) >= 0)

    m.capacity = pyo.Block(rule=capacity)


def add_locality(m: pyo.ConcreteModel, d: PlacementData) -> None:
    """h[e, d] may be 1 only where domain d holds a replica of e."""

    def locality(b: pyo.Block) -> None:
        b.held = pyo.Constraint(m.E, m.D, rule=lambda _, e, k: m.h[e, k] <= sum(
            m.x[e, g] for g in m.G if d.domain_of(g) == k))

    m.locality = pyo.Block(rule=locality)


def build(d: PlacementData, peak_max: float | None = None) -> pyo.ConcreteModel:
    """Stage 1 (peak_max None): minimize the peak GPU load. Stage 2: cap the peak, minimize crossing tokens
    (the tokens of e from domain k, an even share of its load, cross the scale-out network unless k holds e).
    """
    m = pyo.ConcreteModel("expert_placement")
    add_sets(m, d)
    add_variables(m, d)
    add_experts(m, d)
    add_capacity(m, d)
    add_locality(m, d)
    if peak_max is None:
        m.cost = pyo.Objective(expr=m.peak, sense=pyo.minimize)
        return m
    m.locality.peak_cap = pyo.Constraint(expr=m.peak <= peak_max)
    share = 1.0 / d.domains
    m.cost = pyo.Objective(expr=sum(-float(d.loads[e]) * share * m.h[e, k] for e in m.E for k in m.D),
                           sense=pyo.minimize)
    return m
