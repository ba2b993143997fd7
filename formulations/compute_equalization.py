"""The training cluster as a mixed-integer program (Pyomo), and the lifetime cost it feeds.

`build_training` chooses one training configuration (system x TP x PP x DP x micro-batch x
recomputation, each a row whose step time, memory and cost per token come from `dse.physics.training`)
subject to: the configuration fits in HBM, the pre-training finishes by the deadline, and the chips
stay within the budget; it minimizes the cost of the pre-training tokens. The lifetime cost of a
model (`dse.optimize.equalization`) adds RL and inference to it, as in the lecture:

    pre-training 6 N D_pre,  RL (2 to 6) N D_RL x inefficiency,  inference 2 N D_inf x inefficiency.
"""

from __future__ import annotations

import pandas as pd
import pyomo.environ as pyo


def build_training(options: pd.DataFrame, tokens: float, deadline_s: float, chip_budget: int) -> pyo.ConcreteModel:
    """One configuration (``z[r]`` for row position r of ``options``); its time to train ``tokens`` within the
    deadline, its chips within budget. Memory: only configurations that fit are offered (a row fits or not).
    """
    seconds = tokens / options["tokens_per_s"]
    chips = options["chips"].astype(float)
    usd = tokens * options["usd_per_token"]
    m = pyo.ConcreteModel("training_cluster")
    m.R = pyo.Set(initialize=range(len(options)))
    m.z = pyo.Var(m.R, domain=pyo.Binary)
    # Exactly one configuration is chosen.
    m.one = pyo.Constraint(expr=sum(m.z[r] for r in m.R) == 1)
    # Deadline: tokens / throughput of the chosen configuration <= deadline.
    m.deadline = pyo.Constraint(expr=sum(float(seconds.iat[r]) * m.z[r] for r in m.R) <= deadline_s)
    # Budget: the chosen configuration's chips.
    m.budget = pyo.Constraint(expr=sum(float(chips.iat[r]) * m.z[r] for r in m.R) <= chip_budget)
    m.cost = pyo.Objective(expr=sum(float(usd.iat[r]) * m.z[r] for r in m.R), sense=pyo.minimize)
    return m
