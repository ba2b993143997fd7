"""Pipeline stage partition as a mixed-integer program.

Layers (in order, each with its time on a stage) are split into contiguous stages; stage s runs on
rack r(s) (stages fill racks in order), and a stage whose successor is on another rack pays the
hand-off over the scale-out network, else over scale-up. Minimize the bottleneck stage time (the
pipeline's step).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
from ortools.linear_solver.python import model_builder as mb


@dataclass(frozen=True)
class PartitionData:
    seconds: np.ndarray  # per layer
    stages: int
    handoff_s: np.ndarray  # per stage: time to pass the micro-batch to the next stage (0 for the last)


@dataclass
class PartitionModel:
    model: mb.Model
    a: pd.Series
    bottleneck: object
    data: PartitionData


def build(data: PartitionData) -> PartitionModel:
    m = mb.Model()
    n, s = len(data.seconds), data.stages
    idx = pd.MultiIndex.from_product([range(n), range(s)], names=["layer", "stage"])
    a = m.new_bool_var_series("a", idx)
    top = float(data.seconds.sum() + data.handoff_s.max())
    t = m.new_num_var(0.0, top, "bottleneck")
    # Each layer is in exactly one stage; every stage has a layer.
    for layer in range(n):
        m.add(mb.LinearExpr.sum([a[layer, k] for k in range(s)]) == 1)
    for k in range(s):
        m.add(mb.LinearExpr.sum([a[layer, k] for layer in range(n)]) >= 1)
    # Stages are contiguous and in order: a layer's stage index never falls, and rises by at most one.
    def stage_of(layer: int):
        return mb.LinearExpr.weighted_sum([a[layer, k] for k in range(s)], list(range(s)))
    m.add(stage_of(0) == 0)
    for layer in range(n - 1):
        step = stage_of(layer + 1) - stage_of(layer)
        m.add(step >= 0)
        m.add(step <= 1)
    # The bottleneck is at least every stage's layers plus its hand-off.
    for k in range(s):
        m.add(mb.LinearExpr.weighted_sum([a[layer, k] for layer in range(n)], list(data.seconds))
              + float(data.handoff_s[k]) <= t)
    m.minimize(t)
    return PartitionModel(m, a, t, data)


def exhaustive(data: PartitionData) -> float:
    """Best bottleneck over every way to cut the layers into the stages (small instances)."""
    import itertools

    n, s = len(data.seconds), data.stages
    csum = np.concatenate([[0.0], np.cumsum(data.seconds)])
    best = np.inf
    for cuts in itertools.combinations(range(1, n), s - 1):
        bounds = (0, *cuts, n)
        worst = max(csum[bounds[k + 1]] - csum[bounds[k]] + data.handoff_s[k] for k in range(s))
        best = min(best, worst)
    return float(best)
