"""``kind: expert_placement``: replicas and placement of skewed MoE experts on GPUs in scale-up domains
(a MIP) against DeepSeek's EPLB greedy, and what the imbalance does to decode.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import numpy as np
import pandas as pd
from pydantic import Field, field_validator

from dse.catalog.models import get_model
from dse.errors import InputError
from dse.physics.evaluate import Config, evaluate_config
from dse.studies.base import MAX_LIST, Strict, StudySpec
from dse.studies.contract import Plot, Progress, Solved, SolverStats, StudyOutput
from dse.studies.plotting import save, subplots

USES_STORAGE = False
OBJECTIVE = "peak_gpu_tokens"
"""What the placement program minimizes first: the most-loaded GPU's routed tokens (then, at that peak, the tokens that
cross scale-up domains)."""
WORKERS = False


class PlacementSpec(Strict):
    """Expert placement for one MoE model on one system: load skews and a replica budget."""

    system: str = "gb200-nvl72"
    gpus: int = Field(default=16, ge=2, le=1024)
    domain_gpus: int = Field(default=8, ge=1, le=1024, description="GPUs per scale-up domain in the placement")
    tokens_per_step: int = Field(default=4096, ge=1, le=10_000_000)
    skews: list[Annotated[float, Field(ge=0, le=10)]] = Field(default=[0.0, 0.6, 1.0, 1.4], max_length=MAX_LIST)
    redundant: int = Field(default=16, ge=0, le=4096)
    extra_slots: int = Field(default=2, ge=0, le=64, description="slots per GPU beyond experts / GPUs")
    experts: int | None = Field(default=None, ge=2, le=4096, description="experts to place (default: the model's)")
    node_limit: int | None = Field(default=200, ge=1, le=1_000_000, description="branch-and-bound nodes of stage 1 "
                                   "(peak load): a limit of work, which gives the same answer on every run on one "
                                   "machine, whatever its load; "
                                   "null: the time limit alone decides")
    crossing_node_limit: int | None = Field(default=1, ge=1, le=1_000_000, description="branch-and-bound nodes of "
                                            "stage 2 (crossing tokens; 1: the root, its cuts and heuristics); null: "
                                            "the time limit alone decides")
    time_limit_s: float = Field(default=120.0, gt=0, le=3600, description="seconds per stage, a safety net: an "
                                "answer cut by it depends on the machine's speed, is marked time_limited and is "
                                "not reproducible")
    context: int = Field(default=4096, ge=1, le=100_000_000)

    @field_validator("skews")
    @classmethod
    def _skews(cls, v: list[float]) -> list[float]:
        if not v or any(x < 0 for x in v):
            raise ValueError(f"must list Zipf exponents >= 0, got {v}")
        return v


class Spec(StudySpec):
    placement: PlacementSpec = PlacementSpec()

    system_fields = ("placement.system",)

    def check_catalog(self, path: Path, models: dict) -> None:
        if not all(models[m].is_moe for m in self.models):
            raise InputError(f"{path}: field 'models': expert placement needs MoE models")


def placement_data(pl: PlacementSpec, model_id: str, skew: float):
    """The instance of one model at one Zipf skew: its experts' loads (a fixed seed), GPUs, slots, replicas."""
    from dse.optimize.placement import PlacementData, zipf_loads

    f = get_model(model_id).spec.ffn
    experts = pl.experts or f.n_experts
    loads = zipf_loads(experts, pl.tokens_per_step * f.top_k, skew, seed=1)
    return PlacementData(loads, gpus=pl.gpus, domain=pl.domain_gpus, slots=-(-experts // pl.gpus) + pl.extra_slots,
                            redundant=pl.redundant)


def solve_mip(pl: PlacementSpec, data):
    """The MIP's placement of one instance under the study's limits (`dse.optimize.placement.solve_placement`)."""
    from dse.optimize.placement import solve_placement

    return solve_placement(data, pl.time_limit_s, node_limit=pl.node_limit, crossing_node_limit=pl.crossing_node_limit)


def solve(spec: Spec, progress: Progress | None = None, storage: str | None = None) -> Solved:
    """Expert placement (MIP) against the EPLB greedy, per load skew, and what it does to decode."""
    from dse.optimize.placement import greedy

    pl = spec.placement
    rows = []
    for i, model_id in enumerate(spec.models):
        for j, skew in enumerate(pl.skews):
            if progress:
                progress(f"{model_id}: skew {skew}", i * len(pl.skews) + j, len(spec.models) * len(pl.skews))
            data = placement_data(pl, model_id, skew)
            experts, slots = data.experts, data.slots
            mip, base = solve_mip(pl, data), greedy(data)
            row = {"model": model_id, "skew": skew, "experts": experts, "gpus": pl.gpus, "slots": slots,
                   "redundant": pl.redundant, "status": mip.status, "time_limited": mip.time_limited,
                   "gap": mip.gap, "crossing_gap": mip.crossing_gap, "wall_s": mip.wall_s,
                   "peak_tokens_mip": mip.peak, "peak_tokens_greedy": base.peak,
                   "imbalance_mip": mip.imbalance(data), "imbalance_greedy": base.imbalance(data),
                   "crossing_tokens_mip": mip.crossing, "crossing_tokens_greedy": base.crossing,
                   "peak_improvement": 1 - mip.peak / base.peak,
                   "crossing_improvement": 1 - mip.crossing / base.crossing if base.crossing else 0.0}
            for name, imb in (("mip", row["imbalance_mip"]), ("greedy", row["imbalance_greedy"])):
                ev = evaluate_config(Config(model=model_id, system=pl.system, batch=pl.tokens_per_step,
                                            context=pl.context, ep=pl.gpus,
                                            moe_imbalance=max(1.0, imb)))  # round-off below 1
                row[f"tpot_s_{name}"] = ev["tpot_s"]
                row[f"usd_per_mtok_{name}"] = ev["usd_per_mtok"]
            rows.append(row)
    table = pd.DataFrame(rows)
    limited = bool(table["time_limited"].any())
    stats = SolverStats("scip", solves=2 * len(table), solve_wall_s=float(table["wall_s"].sum()),
                        gap=float(table[["gap", "crossing_gap"]].max().max()),
                        more={"node_limit": pl.node_limit, "crossing_node_limit": pl.crossing_node_limit,
                              "time_limit_s": pl.time_limit_s, "time_limited": limited, "reproducible": not limited})
    return Solved(status="optimal" if (table["status"] == "optimal").all() else "feasible",
                  tables={"placement": table}, stats=stats,
                  facts={"time_limited": limited, "reproducible": not limited, "limits": _limits(pl, limited),
                         "mip_never_worse": bool((table["peak_tokens_mip"] <= table["peak_tokens_greedy"]
                                                  * (1 + 1e-9)).all())})


def _limits(pl: PlacementSpec, limited: bool) -> str:
    """What stopped the stages, and so whether another run gets the same answer."""
    if limited:
        return (f"a stage stopped at the time limit ({pl.time_limit_s:g} s): its answer depends on the machine's "
                "speed and load and is not reproducible; raise placement.time_limit_s or lower the node limits")
    nodes = ", ".join(f"stage {i}: {'no limit' if n is None else f'{n} node' + ('s' if n > 1 else '')}"
                      for i, n in ((1, pl.node_limit), (2, pl.crossing_node_limit)))
    return (f"every stage stopped at optimality or at its node limit ({nodes}), never at the time limit: the same "
            "answer on every run on this machine (a node-limited answer can differ on another CPU; its bound and "
            "gap say how far it can be from the optimum)")


def _placement(out: StudyOutput, path: Path) -> None:
    table = out.frames['placement']
    fig, axes = subplots(1, 2, figsize=(11, 4))
    x = np.arange(len(table))
    labels = [f"{m}\nskew {s:g}" for m, s in zip(table["model"], table["skew"], strict=True)]
    for ax, key, title in ((axes[0], "imbalance", "most-loaded GPU / mean"),
                           (axes[1], "crossing_tokens", "tokens crossing scale-out per step")):
        ax.bar(x - 0.2, table[f"{key}_greedy"], 0.4, label="EPLB greedy", color="#e07b39")
        ax.bar(x + 0.2, table[f"{key}_mip"], 0.4, label="MIP", color="#3b7dd8")
        ax.set_xticks(x, labels, fontsize=7)
        ax.set_title(title, fontsize=10)
        ax.legend(fontsize=8)
    save(fig, path)


PLOTS = (Plot("placement", "placement.png", _placement, needs="imbalance_mip"),)


def headline(summary: dict, tables: dict[str, pd.DataFrame]) -> list[str]:
    """One line per load skew: the most-loaded GPU over the mean, MIP against the EPLB greedy, and decode's TPOT."""
    lines = []
    for _, r in tables["placement"].iterrows():
        limited = ", time-limited: depends on machine speed, not reproducible" if r.get("time_limited") else ""
        lines.append(f"{r['model']}, Zipf skew {r['skew']:g}: imbalance {r['imbalance_mip']:.4f} (MIP, "
                     f"{r['status']}{limited}) vs {r['imbalance_greedy']:.4f} (EPLB greedy); tokens crossing scale-out "
                     f"{r['crossing_tokens_mip']:,.0f} vs {r['crossing_tokens_greedy']:,.0f}; decode TPOT "
                     f"{r['tpot_s_mip'] * 1e3:.2f} ms vs {r['tpot_s_greedy'] * 1e3:.2f} ms")
    return lines
