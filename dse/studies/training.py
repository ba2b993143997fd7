"""``kind: training``: the cheapest layout to pre-train a model on a token budget by a deadline within a system
inventory (DP or FSDP, TP, PP with its stage partition, EP, CP, micro-batch, recomputation, GEMM format), and the
exact Pareto front of training time against cost (`dse.optimize.training`).
"""

from __future__ import annotations

import math
import time
from dataclasses import replace
from pathlib import Path
from typing import Annotated, Literal

import pandas as pd
from pydantic import Field, model_validator

from dse.catalog.hardware import default_systems, priced
from dse.errors import InputError, unknown_name_message
from dse.optimize.space import SpaceOptions
from dse.optimize.training import SOLVER_NAME, TrainingJob, TrainingSpace, layout_of, search, shortfall
from dse.studies.base import MAX_LIST, Degree, Strict, StudySpec, WorkloadSpec
from dse.studies.contract import Chart, Plot, Progress, Solved, SolverStats, StudyOutput
from dse.studies.plotting import save, subplots

USES_STORAGE = False
OBJECTIVE = "usd"
"""What the layout search minimizes within the deadline and inventory: the training run's USD."""
WORKERS = False

Precision = Literal["bf16", "fp8", "fp4", "int8"]


class TrainingSpec(Strict):
    """The job (tokens, sequence, global batch, deadline), the inventory and the layout choices."""

    tokens: float = Field(gt=0, le=1e17, description="tokens to train")
    seq: int = Field(default=8192, gt=0, le=10_000_000, description="sequence length")
    global_batch: int = Field(default=1024, gt=0, le=1_000_000, description="sequences per optimizer step")
    deadline_days: float | None = Field(default=None, gt=0, le=3650)
    inventory: dict[str, Annotated[int, Field(ge=1, le=1_000_000)]] = Field(min_length=1, max_length=MAX_LIST,
                                                                           description="chips available per system")
    tp: list[Degree] = Field(default=[1, 2, 4, 8], min_length=1, max_length=MAX_LIST)
    pp: list[Degree] = Field(default=[1, 2, 4, 8], min_length=1, max_length=MAX_LIST)
    cp: list[Degree] = Field(default=[1], min_length=1, max_length=MAX_LIST)
    ep: list[Degree] = Field(default=[1, 8, 32], min_length=1, max_length=MAX_LIST)
    dp: list[Annotated[int, Field(ge=1, le=1_000_000)]] = Field(default=[], max_length=MAX_LIST,
                                                                description="empty: every divisor of the batch")
    micro_batch: list[Degree] = Field(default=[1, 2], min_length=1, max_length=MAX_LIST)
    interleave: list[Degree] = Field(default=[1, 2], min_length=1, max_length=MAX_LIST)
    recompute: list[Literal["none", "selective", "selective_ffn", "full", "reversible"]] = Field(
        default=["none", "selective", "full"], min_length=1, max_length=MAX_LIST)
    zero: list[Annotated[int, Field(ge=0, le=3)]] = Field(default=[1, 3], min_length=1, max_length=4,
                                                          description="ZeRO stages: 0 DDP, 1-2, 3 FSDP")
    precision: list[Precision] = Field(default=["bf16", "fp8", "fp4"], min_length=1, max_length=4,
                                       description="GEMM formats offered (a chip gets those it computes in)")
    ep_overlap: list[Literal["none", "two_microbatch"]] = Field(default=["none", "two_microbatch"], min_length=1,
                                                                max_length=2)
    front: bool = Field(default=True, description="also the front of time against cost (false: the cheapest alone, "
                                                  "by branch and bound)")

    @model_validator(mode="after")
    def _check(self) -> TrainingSpec:
        if self.global_batch * self.seq > self.tokens:
            raise ValueError(f"tokens ({self.tokens:g}) must cover at least one global batch of "
                             f"{self.global_batch} x {self.seq} tokens")
        return self

    def space(self) -> TrainingSpace:
        return TrainingSpace(inventory=dict(self.inventory), tp=tuple(self.tp), pp=tuple(self.pp),
                             cp=tuple(self.cp), ep=tuple(self.ep), dp=tuple(self.dp),
                             micro_batch=tuple(self.micro_batch), interleave=tuple(self.interleave),
                             recompute=tuple(self.recompute), zero=tuple(self.zero),
                             gemm_dtype=tuple(self.precision), ep_overlap=tuple(self.ep_overlap))

    def job(self) -> TrainingJob:
        deadline = self.deadline_days * 86400 if self.deadline_days else math.inf
        return TrainingJob(tokens=self.tokens, seq=self.seq, global_batch=self.global_batch, deadline_s=deadline)


class Spec(StudySpec):
    training: TrainingSpec
    workloads: list[WorkloadSpec] = Field(default=[], max_length=MAX_LIST)  # serving workloads: none needed

    workloads_required = False

    def options(self) -> SpaceOptions:
        """The study's options, the systems its inventory's."""
        return replace(super().options(), systems=tuple(self.training.inventory))

    def check_catalog(self, path: Path, models: dict) -> None:
        systems = default_systems()
        for sid in self.training.inventory:
            if sid not in systems:
                raise InputError(f"{path}: field 'training.inventory.{sid}': "
                                 + unknown_name_message("system", sid, systems))
        for i, m in enumerate(self.models):
            models[m].check_context(self.training.seq, self.allow_beyond_trained_context,
                                    f"{path}: field 'training.seq' for model '{m}' (models.{i})")


def _systems(spec: Spec) -> list:
    prices = dict(spec.prices)
    return [priced(default_systems()[sid], spec.price, prices.get(sid)) for sid in spec.training.inventory]


def solve(spec: Spec, progress: Progress | None = None, storage: str | None = None) -> Solved:
    """For each model, every layout of the space evaluated (`dse.optimize.training.search`): the cheapest that fits
    and meets the deadline, and the front of training time against cost.
    """
    from dse.catalog.models import default_models

    t0 = time.perf_counter()
    tr = spec.training
    job, space = tr.job(), tr.space()
    systems = _systems(spec)
    models = default_models()
    optimum, infeasible, fronts, layouts = [], [], [], []
    count = 0
    for k, mid in enumerate(spec.models):
        if progress:
            progress(f"{mid}: every layout", k, len(spec.models))
        model = models[mid]
        result = search(model, systems, space, job, front=tr.front)
        count += result.layouts
        if not result.table.empty:
            t = result.table.copy()
            t.insert(0, "model", mid)
            layouts.append(t[t["fits"]])
        f = result.front.copy()
        f.insert(0, "model", mid)
        fronts.append(f)
        if result.best is None:
            infeasible.append({"model": mid, "workload": spec.study, "reason": str(shortfall(model, result, job))})
            continue
        b = result.best
        lay = layout_of(b)
        optimum.append({
            "model": mid, "system": b["system"], "chips": int(b["chips"]), "layout": lay.describe(),
            **{k: (b[k].item() if hasattr(b[k], "item") else b[k]) for k in ("tp", "pp", "dp", "cp", "ep",
                                                                             "micro_batch", "interleave",
                                                                             "recompute", "zero", "gemm_dtype")},
            "stages": str(b["stages"]), "step_s": float(b["step_s"]), "time_s": float(b["time_s"]),
            "time_days": float(b["time_s"]) / 86400, "usd": float(b["usd"]), "mfu": float(b["mfu"]),
            "tokens_per_s_per_chip": float(b["tokens_per_s_per_chip"]),
            "hbm_bytes_per_chip": float(b["hbm_bytes_per_chip"]),
            "front_points": len(result.front) if tr.front else None,
            "price_kind": spec.price})
    status = "optimal" if optimum and not infeasible else ("feasible" if optimum else "infeasible")
    tables = {"training_best": pd.DataFrame(optimum),
              "training_front": pd.concat(fronts, ignore_index=True) if fronts else pd.DataFrame(),
              "training_layouts": pd.concat(layouts, ignore_index=True) if layouts else pd.DataFrame()}
    for name in ("training_front", "training_layouts"):
        t = tables[name]
        if not t.empty:
            t["time_days"] = t["time_s"] / 86400
            t["label"] = [f"{r.model} {r.chips} x {r.system} TP{r.tp} PP{r.pp} DP{r.dp} CP{r.cp} "
                          f"{r.gemm_dtype} {r.recompute}" for r in t.itertuples()]
    return Solved(status=status, infeasible=infeasible, tables=tables,
                  stats=SolverStats(SOLVER_NAME, solves=len(spec.models), solve_wall_s=time.perf_counter() - t0,
                                    more={"layouts": count}),
                  facts={"optimum": optimum, "job": {"tokens": tr.tokens, "seq": tr.seq,
                                                     "global_batch": tr.global_batch,
                                                     "deadline_days": tr.deadline_days,
                                                     "inventory": dict(tr.inventory)}})


def _front(out: StudyOutput, path: Path) -> None:
    front, every = out.frames["training_front"], out.frames["training_layouts"]
    fig, ax = subplots(figsize=(7.5, 4.8))
    for system, g in every.groupby("system"):
        ax.plot(g["time_days"], g["usd"], ".", ms=2, alpha=0.25, label=f"{system}: layouts that fit")
    for model, g in front.groupby("model"):
        ax.plot(g["time_days"], g["usd"], "o-", ms=4, label=f"{model}: front")
    for e in out.summary.get("optimum", []):
        ax.plot([e["time_days"]], [e["usd"]], "k*", ms=13)
    deadline = out.summary["job"]["deadline_days"]
    if deadline:
        ax.axvline(deadline, color="grey", ls=":", lw=1)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("training time (days)")
    ax.set_ylabel(f"training cost (USD, {out.summary['price_kind']})")
    ax.set_title("Training time against cost: the front, the cheapest within the deadline (star)", fontsize=10)
    ax.legend(fontsize=7, markerscale=4)
    save(fig, path)


PLOTS = (Plot("training_front", "training_front.png", _front, needs="usd"),)
def _model(table: pd.DataFrame) -> pd.Series:
    return table["model"]


def _system(table: pd.DataFrame) -> pd.Series:
    return table["system"]


CHARTS = (Chart("training_front", "time_days", "usd", "Training time (days) against cost (USD): the front",
                panel=_model, series=_system),)


def headline(summary: dict, tables: dict[str, pd.DataFrame]) -> list[str]:
    """One line per model: the cheapest layout, its time and cost, and the size of its front."""
    out = []
    for e in summary["optimum"]:
        front = "front not computed" if e["front_points"] is None else f"front of {e['front_points']} layouts"
        out.append(f"{e['model']}: {e['chips']} x {e['system']} {e['layout']}: {e['time_days']:.1f} days, "
                   f"{e['usd']:.4g} USD ({e['price_kind']}), MFU {e['mfu']:.1%}; {front}")
    return out

