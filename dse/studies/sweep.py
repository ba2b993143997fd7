"""``kind: sweep``: the optimal cost as one hardware parameter is scaled by each factor, overall and per
system, with elasticities and the factors where the binding resource changes (Optuna points).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

import numpy as np
import pandas as pd
from pydantic import Field, field_validator

from dse.studies.base import MAX_LIST, Strict
from dse.studies.contract import Plot, Progress, Solved, StudyOutput
from dse.studies.optuna_sweep import OBJECTIVE, SweepStudy, run_sweep_study
from dse.studies.plotting import place_labels, save, subplots

USES_STORAGE = True
WORKERS = True
Parameter = Literal["hbm_bandwidth", "hbm_capacity", "flops", "scaleup_bandwidth", "scaleout_bandwidth",
                    "scaleup_domain", "price"]


class SweepSpec(Strict):
    """One catalog parameter scaled by each factor (1 = the catalog), for some systems or all."""

    parameter: Parameter = "hbm_bandwidth"
    factors: list[Annotated[float, Field(ge=0.001, le=1000)]] = Field(default=[0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 4.0],
                                                                   max_length=MAX_LIST)
    systems: list[str] | Literal["all"] = Field(default="all", max_length=MAX_LIST)
    per_system: bool = True

    @field_validator("factors")
    @classmethod
    def _factors(cls, v: list[float]) -> list[float]:
        if len(v) < 2 or any(x <= 0 for x in v):
            raise ValueError(f"must list at least two factors > 0, got {v}")
        return sorted(set(v))


class Spec(SweepStudy):
    sweep: SweepSpec = SweepSpec()

    system_fields = ("sweep.systems",)

    def pairs(self) -> list[tuple[str, float]]:
        return [(self.sweep.parameter, f) for f in self.sweep.factors]

    def scaled_systems(self) -> tuple[str, ...]:
        return () if self.sweep.systems == "all" else tuple(self.sweep.systems)

    def per_system(self) -> bool:
        return self.sweep.per_system


def solve(spec: Spec, progress: Progress | None = None, storage: str | None = None) -> Solved:
    """Every point of the sweep, solved here or by workers sharing the storage."""
    return run_sweep_study(spec, storage, progress)


def _sweep(out: StudyOutput, path: Path) -> None:
    table, systems = out.frames["sweep"], out.frames.get("sweep_systems")
    groups = list(table.groupby(["model", "workload", "parameter"], sort=False))
    fig, axes = subplots(len(groups), 1, figsize=(8, 4.2 * len(groups)), squeeze=False)
    labels = []
    for ax, ((model, workload, parameter), g) in zip(axes[:, 0], groups, strict=True):
        g = g.sort_values("factor")
        if systems is not None and not systems.empty:
            sg = systems[(systems["model"] == model) & (systems["workload"] == workload)]
            for k, (_, h) in enumerate(sg.groupby("system")):
                h = h.sort_values("factor")
                ax.plot(h["factor"], h[OBJECTIVE], lw=0.7, alpha=0.5, color="grey",
                        label="best of each system" if k == 0 else None)
        ok = np.isfinite(g[OBJECTIVE].astype(float))
        ax.plot(g["factor"][ok], g[OBJECTIVE][ok], "o-", lw=2, color="#3b7dd8",
                label="optimum over all systems")
        if "bound_changes_here" in g:
            ch = g[g["bound_changes_here"].fillna(False).astype(bool) & ok]
            ax.plot(ch["factor"], ch[OBJECTIVE], "r*", markersize=12, label="binding resource changes")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel(f"{parameter} (x catalog value)")
        ax.set_ylabel("USD per request at the fluid pool ratio")
        ax.set_title(f"{model} / {workload} (grey: best of each system)", fontsize=10)
        ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.18), ncol=3)
        shown = g[ok]
        xy = (shown["factor"].to_numpy(), shown[OBJECTIVE].to_numpy())
        labels.append((ax, *xy, [f"{r['system']}, {r['bound']}" for _, r in shown.iterrows()], xy))
    for ax, lx, ly, texts, avoid in labels:  # every panel drawn: the layout is final
        place_labels(ax, lx, ly, texts, avoid=avoid)
    save(fig, path)


PLOTS = (Plot("sweep", "sweep.png", _sweep, needs=OBJECTIVE),)


def headline(summary: dict, tables: dict[str, pd.DataFrame]) -> list[str]:
    """Per (model, workload): the optimal cost at the lowest and highest factor and the elasticity range."""
    lines = []
    table = tables.get("sweep", pd.DataFrame())
    for (model, workload, parameter), g in table.groupby(["model", "workload", "parameter"], sort=False):
        ok = g[np.isfinite(g[OBJECTIVE].astype(float))].sort_values("factor")
        if ok.empty:
            lines.append(f"{model} / {workload}: no feasible point")
            continue
        lo, hi = ok.iloc[0], ok.iloc[-1]
        el = ok["elasticity"].dropna()
        span = f"; elasticity {el.min():.2f} to {el.max():.2f}" if not el.empty else ""
        lines.append(f"{model} / {workload}: {parameter} x{lo['factor']:g} -> {lo[OBJECTIVE]:.4g} USD "
                     f"per request at the fluid pool ratio ({lo['system']}, {lo['bound']}), x{hi['factor']:g} -> "
                     f"{hi[OBJECTIVE]:.4g} "
                     f"({hi['system']}, {hi['bound']}){span}")
    return lines
