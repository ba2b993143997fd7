"""Cheapest serving configuration as a mixed-integer program (a disjunction over blocks).

Exactly one of the blocks (system x layout x formats x KV tier) is active, or one of the exact
points below expert saturation. An active block chooses its integer batch n per DP rank; its step
time is bounded below by the six affine pieces of the physics and above by the TPOT target. The
objective is a ratio (USD per token = a x step / n); `dse.optimize.serving` solves it exactly by Dinkelbach
iterations, each of which minimizes  sum a T - lambda sum n  over this model.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
from ortools.linear_solver.python import model_builder as mb

from dse.optimize.space import pieces


@dataclass
class ServingModel:
    """The built model and handles to its variables, indexed like the data."""

    model: mb.Model
    z: pd.Series  # block active
    n: pd.Series  # batch per DP rank
    t: pd.Series  # step time
    p: pd.Series  # point chosen
    blocks: pd.DataFrame
    points: pd.DataFrame

    def set_objective(self, lam: float, objective: str = "cost") -> None:
        """Dinkelbach objective for the ratio (cost), or plain step time (latency)."""
        terms, coefs = [], []
        if objective == "cost":
            terms += list(self.t) + list(self.n) + list(self.p)
            coefs += list(self.blocks["a"]) + [-lam] * len(self.n)
            coefs += list(self.points["a"] * self.points["step"] - lam * self.points["n"])
        else:
            terms += list(self.t) + list(self.p)
            coefs += [1.0] * len(self.t) + list(self.points["step"])
        self.model.minimize(mb.LinearExpr.weighted_sum(terms, coefs))


def add_cost_cap(m: mb.Model, blocks: pd.DataFrame, t: pd.Series, n: pd.Series, cost_max: float) -> None:
    """Cost per token stays at or below cost_max: a T - cost_max n <= 0 (for the lexicographic front)."""
    for k in blocks.index:
        m.add(float(blocks.at[k, "a"]) * t[k] - cost_max * n[k] <= 0)


def add_choice(m: mb.Model, blocks: pd.DataFrame, points: pd.DataFrame) -> tuple[pd.Series, pd.Series]:
    """Exactly one block or one point is chosen."""
    z = m.new_bool_var_series("z", blocks.index)
    p = m.new_bool_var_series("p", points.index)
    m.add(mb.LinearExpr.sum(list(z) + list(p)) == 1)
    return z, p


def add_batch(m: mb.Model, blocks: pd.DataFrame, z: pd.Series) -> pd.Series:
    """An active block's batch per rank lies in [n_lo, n_hi]; an inactive block's is 0."""
    n = m.new_int_var_series("n", blocks.index, lower_bounds=0, upper_bounds=blocks["n_hi"].astype(float))
    for k in blocks.index:
        m.add(n[k] <= float(blocks.at[k, "n_hi"]) * z[k])
        m.add(n[k] >= float(blocks.at[k, "n_lo"]) * z[k])
    return n


def add_step_time(m: mb.Model, blocks: pd.DataFrame, z: pd.Series, n: pd.Series, tpot_max: float | None) -> pd.Series:
    """The step time is at least every affine piece of the physics and at most the TPOT target."""
    alpha, beta = pieces(blocks)
    upper = np.full(len(blocks), np.inf) if tpot_max is None else np.full(len(blocks), tpot_max)
    t = m.new_num_var_series("t", blocks.index, lower_bounds=0.0, upper_bounds=pd.Series(upper, index=blocks.index))
    for i, k in enumerate(blocks.index):
        for j in range(alpha.shape[1]):
            m.add(t[k] >= float(alpha[i, j]) * z[k] + float(beta[i, j]) * n[k])
        if tpot_max is not None:
            m.add(t[k] <= tpot_max * z[k])
    return t


def build(
    blocks: pd.DataFrame, points: pd.DataFrame, tpot_max: float | None, cost_max: float | None = None
) -> ServingModel:
    """Build the serving program over the given blocks and points (both already presolved)."""
    m = mb.Model()
    z, p = add_choice(m, blocks, points)
    n = add_batch(m, blocks, z)
    t = add_step_time(m, blocks, z, n, tpot_max)
    if cost_max is not None:
        add_cost_cap(m, blocks, t, n, cost_max)
    return ServingModel(m, z, n, t, p, blocks, points)


@dataclass
class DemandModel:
    """Replica counts that meet a demand, one configuration per option."""

    model: mb.Model
    z: pd.Series
    r: pd.Series
    options: pd.DataFrame


def build_demand(options: pd.DataFrame, demand: float) -> DemandModel:
    """Choose one option (a block at its largest feasible batch, or a point) and an integer number of
    replicas r with r x tokens_per_s >= demand; minimize r x chips x price (USD per second).
    """
    m = mb.Model()
    z = m.new_bool_var_series("z", options.index)
    upper = np.ceil(demand / options["tokens_per_s"].to_numpy())
    r = m.new_int_var_series("r", options.index, lower_bounds=0, upper_bounds=pd.Series(upper, index=options.index))
    m.add(mb.LinearExpr.sum(list(z)) == 1)
    for k in options.index:
        m.add(float(options.at[k, "tokens_per_s"]) * r[k] >= demand * z[k])
        m.add(r[k] <= float(upper[options.index.get_loc(k)]) * z[k])
    m.minimize(mb.LinearExpr.weighted_sum(list(r), list(options["usd_per_s"])))
    return DemandModel(m, z, r, options)
