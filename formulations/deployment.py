"""Deployment program (Pyomo): integer replicas of aggregated, prefill and decode operating points of one model
serving a mix of request classes, at least cost per second; one (weights, KV) numerics per deployment, picked by a
`pyomo.gdp` disjunction. Built from data and returned unsolved.

Data (`DeploymentData`): ``points`` (one row per operating point: ``cls``, ``role`` both|prefill|decode,
``group``, ``usd_per_s``, ``requests_per_s`` at its TTFT/TPOT-feasible batch and planned prefill utilisation) and
``demand`` (requests/s per class). TTFT and TPOT are met by each point by construction (its batch and, for prefill,
its utilisation cap from the TTFT target through the M/D/1 queue); rates add by Little's law.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import pandas as pd
import pyomo.environ as pyo
from pyomo.gdp import Disjunct, Disjunction


@dataclass
class DeploymentData:
    """Operating points and demand of one deployment program."""

    points: pd.DataFrame  # cls, role, group, usd_per_s, requests_per_s
    demand: dict[str, float]  # requests/s per class
    max_replicas: int = 10_000

    def bound(self, i: int) -> int:
        """Most replicas of point i worth considering: enough for its class's whole demand."""
        r = self.points.iloc[i]
        return min(self.max_replicas, int(math.ceil(self.demand[r["cls"]] / r["requests_per_s"] * (1 + 1e-9))))


def add_sets(m: pyo.ConcreteModel, d: DeploymentData) -> None:
    m.P = pyo.Set(initialize=range(len(d.points)))
    m.C = pyo.Set(initialize=list(d.demand))
    m.G = pyo.Set(initialize=sorted({int(g) for g in d.points["group"]}))


def add_variables(m: pyo.ConcreteModel, d: DeploymentData) -> None:
    m.x = pyo.Var(m.P, domain=pyo.NonNegativeIntegers, bounds=lambda _, i: (0, d.bound(i)))
    m.s = pyo.Var(m.C, domain=pyo.NonNegativeReals, bounds=lambda _, c: (0, d.demand[c]))


def add_capacity(m: pyo.ConcreteModel, d: DeploymentData) -> None:
    """Each class's demand is served by aggregated replicas plus disaggregated requests s; the prefill pool and the
    decode pool each carry at least s (decode rate by Little's law, prefill at its TTFT-capped utilisation).
    """
    p = d.points

    def rate(c, role):
        return sum(float(p["requests_per_s"].iat[i]) * m.x[i] for i in m.P if p["cls"].iat[i] == c
                   and p["role"].iat[i] == role)

    m.serve = pyo.Constraint(m.C, rule=lambda _, c: rate(c, "both") + m.s[c] >= d.demand[c])
    m.prefill = pyo.Constraint(m.C, rule=lambda _, c: rate(c, "prefill") >= m.s[c])
    m.decode = pyo.Constraint(m.C, rule=lambda _, c: rate(c, "decode") >= m.s[c])


def add_numerics(m: pyo.ConcreteModel, d: DeploymentData) -> None:
    """One checkpoint and one KV format for the whole deployment: a disjunction over the numerics groups, each
    disjunct switching off every point of the other groups.
    """
    if len(m.G) < 2:
        return
    groups = [int(g) for g in d.points["group"]]
    m.use = Disjunct(m.G)
    for g in m.G:
        m.use[g].off = pyo.Constraint([i for i in m.P if groups[i] != g], rule=lambda _, i: m.x[i] == 0)
    m.one_numerics = Disjunction(expr=[m.use[g] for g in m.G])


def build(d: DeploymentData) -> pyo.ConcreteModel:
    """The deployment program: minimize USD per second."""
    m = pyo.ConcreteModel("deployment")
    add_sets(m, d)
    add_variables(m, d)
    add_capacity(m, d)
    add_numerics(m, d)
    m.cost = pyo.Objective(expr=sum(float(d.points["usd_per_s"].iat[i]) * m.x[i] for i in m.P), sense=pyo.minimize)
    return m
