"""Fleet program (Pyomo): reserved and hourly nodes (or racks) per system, integer replicas of each (model, class,
system) operating point per time slice, under inventory, site power, budget and N+1, at least cost per day. Built
from data and returned unsolved.

Units: a *node* is the system's whole allocation unit (an 8-GPU server, or a 72-GPU NVL72 rack); a replica of an
option occupies ``nodes`` whole nodes (its chips lie within nodes). Reserved nodes are paid for every hour of the
horizon at the committed price, hourly nodes only in the slices they are rented, at the on-demand price.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import pandas as pd
import pyomo.environ as pyo


@dataclass
class FleetData:
    """Everything the fleet program needs, as plain tables."""

    systems: pd.DataFrame  # index system: node_chips, reserved_usd_per_node_h, hourly_usd_per_node_h, power_per_node_w,
    # fixed_usd_per_day
    inventory: pd.DataFrame  # rows system, columns slice: nodes available
    options: pd.DataFrame  # model, cls, system, nodes (per replica), requests_per_s (per replica), usd ignored
    demand: pd.DataFrame  # rows (model, cls), columns slice: requests/s
    slice_h: float = 1.0
    power_cap_w: float | None = None
    budget_usd_per_day: float | None = None
    n_plus_one: bool = True
    meta: dict = field(default_factory=dict)

    @property
    def slices(self) -> list:
        return list(self.demand.columns)

    def spare(self, model: str, cls: str) -> float:
        """Rate of the largest replica of (model, class): an upper bound on what N+1 adds to the demand."""
        o = self.options
        r = o.loc[(o["model"] == model) & (o["cls"] == cls), "requests_per_s"]
        return float(r.max()) if self.n_plus_one and len(r) else 0.0


def add_variables(m: pyo.ConcreteModel, d: FleetData) -> None:
    inv = d.inventory
    if hasattr(m, "short_nodes"):  # the elastic program: inventory is a soft limit
        inv = inv * 0 + int(d.inventory.to_numpy().max()) * 100 + 1000
    m.S = pyo.Set(initialize=list(d.systems.index))
    m.T = pyo.Set(initialize=d.slices)
    m.K = pyo.Set(initialize=range(len(d.options)))
    m.reserved = pyo.Var(m.S, domain=pyo.NonNegativeIntegers, bounds=lambda _, s: (0, int(inv.loc[s].min())))
    m.hourly = pyo.Var(m.S, m.T, domain=pyo.NonNegativeIntegers, bounds=lambda _, s, t: (0, int(inv.loc[s, t])))
    m.used = pyo.Var(m.S, domain=pyo.Binary)

    def x_bound(_, k, t):
        o = d.options.iloc[k]
        need = d.demand.loc[(o["model"], o["cls"]), t] + d.spare(o["model"], o["cls"])
        return 0, min(int(inv.loc[o["system"], t] // o["nodes"]), int(math.ceil(need / o["requests_per_s"] + 1e-9)))

    m.x = pyo.Var(m.K, m.T, domain=pyo.NonNegativeIntegers, bounds=x_bound)


def add_demand(m: pyo.ConcreteModel, d: FleetData) -> None:
    """Each (model, class) demand is served in each slice, and still served with any one of its replicas down (N+1:
    capacity less the rate of each option in use, ``on`` marking the options with a replica in the slice).
    """
    o = d.options
    pairs = list(d.demand.index)
    m.MC = pyo.Set(initialize=range(len(pairs)))
    of = {j: [k for k in m.K if o["model"].iat[k] == pairs[j][0] and o["cls"].iat[k] == pairs[j][1]] for j in m.MC}

    def capacity(j, t):
        return sum(float(o["requests_per_s"].iat[k]) * m.x[k, t] for k in of[j])

    def rule(_, j, t):
        need = float(d.demand.loc[pairs[j], t])
        return pyo.Constraint.Skip if need <= 0 else capacity(j, t) >= need

    m.demand = pyo.Constraint(m.MC, m.T, rule=rule)
    if not d.n_plus_one:
        return
    m.on = pyo.Var(m.K, m.T, domain=pyo.Binary)
    m.on_link = pyo.Constraint(m.K, m.T, rule=lambda _, k, t: m.x[k, t] <= m.x[k, t].ub * m.on[k, t])
    pair_of = {k: j for j in m.MC for k in of[j]}

    def spare(_, k, t):
        j = pair_of[k]
        need = float(d.demand.loc[pairs[j], t])
        if need <= 0:
            return pyo.Constraint.Skip
        return capacity(j, t) - float(o["requests_per_s"].iat[k]) * m.on[k, t] >= need

    m.n_plus_one = pyo.Constraint(m.K, m.T, rule=spare)


def add_nodes(m: pyo.ConcreteModel, d: FleetData) -> None:
    """Replicas occupy whole nodes: per system and slice, reserved plus hourly nodes hold them; within inventory,
    and only on systems in use (which carry their fixed cost).
    """
    o = d.options

    def hold(_, s, t):
        ks = [k for k in m.K if o["system"].iat[k] == s]
        return sum(int(o["nodes"].iat[k]) * m.x[k, t] for k in ks) <= m.reserved[s] + m.hourly[s, t]

    m.hold = pyo.Constraint(m.S, m.T, rule=hold)
    m.inventory = pyo.Constraint(m.S, m.T, rule=lambda _, s, t: m.reserved[s] + m.hourly[s, t]
                                 <= float(d.inventory.loc[s, t]) * m.used[s] + _slack(m, "short_nodes", (s, t)))


def add_power(m: pyo.ConcreteModel, d: FleetData) -> None:
    """The site's all-in power in every slice stays within its cap (nodes held draw power whether busy or not)."""
    if d.power_cap_w is None:
        return
    p = d.systems["power_per_node_w"]
    m.power = pyo.Constraint(m.T, rule=lambda _, t: sum(float(p[s]) * (m.reserved[s] + m.hourly[s, t]) for s in m.S)
                             <= d.power_cap_w + _slack(m, "short_power_w", t))


def cost_expr(m: pyo.ConcreteModel, d: FleetData):
    sy = d.systems
    hours = d.slice_h * len(d.slices)
    return (sum(float(sy.loc[s, "reserved_usd_per_node_h"]) * hours * m.reserved[s] for s in m.S)
            + sum(float(sy.loc[s, "hourly_usd_per_node_h"]) * d.slice_h * m.hourly[s, t] for s in m.S for t in m.T)
            ) * (24.0 / hours) + sum(float(sy.loc[s, "fixed_usd_per_day"]) * m.used[s] for s in m.S)


ELASTIC = 1e7
"""Penalty per node, per kW and per thousand USD of shortfall in the elastic program (diagnosis only)."""


def _slack(m: pyo.ConcreteModel, name: str, index):
    """A shortfall variable of the elastic program (0 in the real one)."""
    block = getattr(m, name, None)
    if block is None:
        return 0
    return block[index]


def build(d: FleetData, elastic: bool = False) -> pyo.ConcreteModel:
    """The fleet program: minimize USD per day (a horizon other than 24 h is scaled to a day). With ``elastic``,
    inventory, power and budget may be exceeded at a large penalty: the shortfalls name what binds.
    """
    m = pyo.ConcreteModel("fleet")
    if elastic:
        m.short_nodes = pyo.Var(list(d.systems.index), d.slices, domain=pyo.NonNegativeReals)
        m.short_power_w = pyo.Var(d.slices, domain=pyo.NonNegativeReals)
        m.short_usd = pyo.Var([None], domain=pyo.NonNegativeReals)
    add_variables(m, d)
    add_demand(m, d)
    add_nodes(m, d)
    add_power(m, d)
    m.cost_per_day = pyo.Expression(expr=cost_expr(m, d))
    if d.budget_usd_per_day is not None:
        m.budget = pyo.Constraint(expr=m.cost_per_day <= d.budget_usd_per_day + _slack(m, "short_usd", None))
    penalty = 0
    if elastic:
        penalty = ELASTIC * (sum(m.short_nodes.values()) + sum(v / 1e3 for v in m.short_power_w.values())
                             + sum(v / 1e3 for v in m.short_usd.values()))
    m.cost = pyo.Objective(expr=m.cost_per_day + penalty, sense=pyo.minimize)
    return m
