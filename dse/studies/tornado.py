"""``kind: tornado``: which hardware parameter moves the optimal cost most, each at a low and a high
factor around the catalog value (Optuna points, like a sweep).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
from pydantic import Field, model_validator

from dse.studies.base import Strict
from dse.studies.contract import Plot, Progress, Solved, StudyOutput
from dse.studies.optuna_sweep import OBJECTIVE, SweepStudy, run_sweep_study
from dse.studies.plotting import save, subplots
from dse.studies.sweep import Parameter

USES_STORAGE = True
WORKERS = True
PARAMETERS = ("hbm_bandwidth", "hbm_capacity", "flops", "scaleup_bandwidth", "scaleout_bandwidth",
              "scaleup_domain", "price")


class TornadoSpec(Strict):
    """Each parameter at a low and a high factor around the catalog value."""

    parameters: list[Parameter] = Field(default=list(PARAMETERS), max_length=len(PARAMETERS))
    low: float = Field(default=0.5, ge=0.001)
    high: float = Field(default=2.0, gt=0, le=1000)

    @model_validator(mode="after")
    def _range(self) -> TornadoSpec:
        if not self.parameters:
            raise ValueError("parameters: must list at least one parameter")
        if not self.low < 1.0 < self.high:
            raise ValueError(f"low < 1 < high must hold, got low={self.low}, high={self.high}")
        return self


class Spec(SweepStudy):
    tornado: TornadoSpec = TornadoSpec()

    def pairs(self) -> list[tuple[str, float]]:
        t = self.tornado
        return [(t.parameters[0], 1.0)] + [(p, f) for p in t.parameters for f in (t.low, t.high)]


def solve(spec: Spec, progress: Progress | None = None, storage: str | None = None) -> Solved:
    """The base point and every parameter at its low and high factor."""
    return run_sweep_study(spec, storage, progress)


def swings(g: pd.DataFrame) -> tuple[float, list[tuple[str, float, float]]]:
    """The base cost of one (model, workload) and each parameter's relative cost change at its low and high
    factor, smallest swing first.
    """
    base = g[g["factor"] == 1.0][OBJECTIVE].iloc[0]
    rows = []
    for parameter, h in g[g["factor"] != 1.0].groupby("parameter", sort=False):
        lo = h[h["factor"] < 1][OBJECTIVE].iloc[0] / base - 1
        hi = h[h["factor"] > 1][OBJECTIVE].iloc[0] / base - 1
        rows.append((parameter, lo, hi))
    return base, sorted(rows, key=lambda r: max(abs(r[1]), abs(r[2])))


def _tornado(out: StudyOutput, path: Path) -> None:
    table = out.frames["tornado"]
    groups = list(table.groupby(["model", "workload"], sort=False))
    fig, axes = subplots(len(groups), 1, figsize=(8, 3.2 * len(groups)), squeeze=False)
    for ax, ((model, workload), g) in zip(axes[:, 0], groups, strict=True):
        base, rows = swings(g)
        y = np.arange(len(rows))
        ax.barh(y, [100 * r[1] for r in rows], color="#e07b39", label="x 0.5 (low)")
        ax.barh(y, [100 * r[2] for r in rows], color="#3b7dd8", label="x 2 (high)")
        ax.set_yticks(y, [r[0] for r in rows], fontsize=8)
        ax.axvline(0, color="k", lw=0.8)
        ax.set_xlabel("change of the optimal cost per token (%)")
        ax.set_title(f"{model} / {workload}: base {base:.3g} USD per request (fluid pool ratio)", fontsize=10)
        ax.legend(fontsize=8)
    save(fig, path)


PLOTS = (Plot("tornado", "tornado.png", _tornado, needs=OBJECTIVE),)


def headline(summary: dict, tables: dict[str, pd.DataFrame]) -> list[str]:
    """Per (model, workload): the parameters ranked by how far they move the optimal cost."""
    lines = []
    table = tables.get("tornado", pd.DataFrame())
    for (model, workload), g in table.groupby(["model", "workload"], sort=False):
        base, rows = swings(g)
        ranked = ", ".join(f"{p} {lo:+.0%}/{hi:+.0%}" for p, lo, hi in reversed(rows))
        lines.append(f"{model} / {workload} (base {base:.4g} USD per request at the fluid pool ratio), cost change "
                     f"at low/high factor, largest first: {ranked}")
    return lines
