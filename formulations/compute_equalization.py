"""The training cluster as a mixed-integer program, and the lifetime cost it feeds.

`build_training` chooses one training configuration (system x TP x PP x DP x micro-batch x
recomputation, each a row whose step time, memory and cost per token come from `dse.physics.training`)
subject to: the configuration fits in HBM, the pre-training finishes by the deadline, and the chips
stay within the budget; it minimizes the cost of the pre-training tokens. The lifetime cost of a
model (`dse.optimize.equalization`) adds RL and inference to it, as in the lecture:

    pre-training 6 N D_pre,  RL (2 to 6) N D_RL x inefficiency,  inference 2 N D_inf x inefficiency.
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd
from ortools.linear_solver.python import model_builder as mb


@dataclass
class TrainingModel:
    model: mb.Model
    z: pd.Series
    options: pd.DataFrame


def build_training(options: pd.DataFrame, tokens: float, deadline_s: float, chip_budget: int) -> TrainingModel:
    """One configuration; its time to train ``tokens`` within the deadline, its chips within budget."""
    m = mb.Model()
    z = m.new_bool_var_series("z", options.index)
    m.add(mb.LinearExpr.sum(list(z)) == 1)
    # Deadline: tokens / throughput of the chosen configuration <= deadline.
    hours = tokens / options["tokens_per_s"]
    m.add(mb.LinearExpr.weighted_sum(list(z), list(hours)) <= deadline_s)
    # Budget: the chosen configuration's chips.
    m.add(mb.LinearExpr.weighted_sum(list(z), list(options["chips"].astype(float))) <= chip_budget)
    # Memory: only configurations that fit are offered (a row either fits or does not).
    m.minimize(mb.LinearExpr.weighted_sum(list(z), list(tokens * options["usd_per_token"])))
    return TrainingModel(m, z, options)
