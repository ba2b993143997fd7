"""Cheapest serving configuration as a mixed-integer program (a disjunction over blocks).

Exactly one of the blocks (system x layout x formats x KV tier) is active, or one of the exact
points below expert saturation. An active block chooses its integer batch n per DP rank; its step
time is bounded below by the six affine pieces of the physics and above by the TPOT target. The
objective is a ratio (USD per token = a x step / n); `dse.serving` solves it exactly by Dinkelbach
iterations, each of which minimizes  sum a T - lambda sum n  over this model.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
from ortools.linear_solver.python import model_builder as mb

from dse.space import pieces


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


def build(blocks: pd.DataFrame, points: pd.DataFrame, tpot_max: float | None) -> ServingModel:
    """Build the serving program over the given blocks and points (both already presolved)."""
    m = mb.Model()
    z, p = add_choice(m, blocks, points)
    n = add_batch(m, blocks, z)
    t = add_step_time(m, blocks, z, n, tpot_max)
    return ServingModel(m, z, n, t, p, blocks, points)
