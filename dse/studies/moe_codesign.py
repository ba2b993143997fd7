"""``kind: moe_codesign``: the cost-optimal sparsity and model size at fixed quality, served within one
scale-up domain of each system.
"""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path
from typing import Annotated

import pandas as pd
from pydantic import Field

from dse.studies.base import MAX_LIST, Strict, StudySpec
from dse.studies.contract import Plot, Progress, Solved, SolverStats, StudyOutput
from dse.studies.plotting import save, subplots

USES_STORAGE = False
OBJECTIVE = "usd_per_mtok"
"""What each scale-up domain's optimum minimizes: USD per million output tokens at fixed quality."""
WORKERS = False


class CodesignSpec(Strict):
    """Fixed quality (effective dense size), the sparsities to weigh, the scale-up domains to serve on."""

    effective_params_b: float = Field(default=700, gt=0, le=1e5)
    gamma: float = Field(default=1 / 3, gt=0, lt=1)
    sparsities: list[Annotated[int, Field(ge=1, le=1024)]] = Field(default=[1, 2, 4, 8, 16, 32, 64], min_length=1,
                                                                   max_length=MAX_LIST)
    systems: list[str] = Field(default=["h200", "gb200-nvl72", "rubin-ultra-nvl576"], min_length=1,
                               max_length=MAX_LIST)


class Spec(StudySpec):
    codesign: CodesignSpec = CodesignSpec()

    models_required = False
    system_fields = ("codesign.systems",)


def solve(spec: Spec, progress: Progress | None = None, storage: str | None = None) -> Solved:
    """For each scale-up domain, the serving cost of each sparsity at fixed quality; the optimum per domain."""
    from dse.optimize.codesign import codesign_point

    t0 = time.perf_counter()
    cd = spec.codesign
    w = spec.workloads[0].workload()
    rows = []
    for i, system in enumerate(cd.systems):
        opts = replace(spec.options(), systems=(system,), max_racks=1)  # one scale-up domain
        for j, s in enumerate(cd.sparsities):
            if progress:
                progress(f"{system}: sparsity {s}", i * len(cd.sparsities) + j, len(cd.systems) * len(cd.sparsities))
            rows.append({"system_domain": system, **codesign_point(cd.effective_params_b * 1e9, s, cd.gamma, w, opts,
                                                                   spec.solver.name)})
    table = pd.DataFrame(rows)
    best = []
    for system, g in table.groupby("system_domain", sort=False):
        ok = g[g["status"] != "infeasible"]
        if ok.empty:
            priced = not g["reason"].astype(str).str.contains("has a price of kind").all()
            best.append({"system_domain": system, "status": "infeasible" if priced else "no_price",
                         "reason": "no sparsity fits one domain" if priced else
                         f"left out: no price of kind '{spec.price}' (supply one in the study's prices)"})
            continue
        b = ok.loc[ok["usd_per_mtok"].idxmin()]
        best.append({"system_domain": system, "status": "optimal", "sparsity": int(b["sparsity"]),
                     "params_total": b["params_total"], "params_active": b["params_active"],
                     "usd_per_mtok": b["usd_per_mtok"], "chips": int(b["chips"])})
    solved = table[table["status"] != "infeasible"]
    if solved.empty:
        status = "infeasible"
    else:
        status = "optimal" if (solved["status"] == "optimal").all() else "feasible"
    infeasible = [{"model": f"sparsity {int(r['sparsity'])}", "workload": w.name,
                   "reason": f"one {r['system_domain']} domain: {r['reason']}"}
                  for _, r in table.iterrows() if r["status"] == "infeasible"] if solved.empty else []
    return Solved(status=status, infeasible=infeasible,
                  tables={"codesign": table, "codesign_best": pd.DataFrame(best)},
                  stats=SolverStats(spec.solver.name, solves=len(rows), solve_wall_s=time.perf_counter() - t0),
                  facts={"optimum": best})


def _codesign(out: StudyOutput, path: Path) -> None:
    table = out.frames['codesign']
    fig, ax = subplots(figsize=(7, 4.5))
    for system, g in table.groupby("system_domain", sort=False):
        ok = g[g["status"] != "infeasible"]
        ax.plot(ok["sparsity"], ok["usd_per_mtok"], "o-", label=f"one {system} domain")
        b = ok.loc[ok["usd_per_mtok"].idxmin()] if not ok.empty else None
        if b is not None:
            ax.plot([b["sparsity"]], [b["usd_per_mtok"]], "k*", ms=12)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("sparsity (total / active expert parameters; fixed quality)")
    ax.set_ylabel("USD per million output tokens (whole requests, prefill included)")
    ax.set_title("Cost-optimal sparsity (star) jumps with the scale-up domain", fontsize=10)
    ax.legend(fontsize=8)
    save(fig, path)


PLOTS = (Plot("codesign", "codesign.png", _codesign),)


def headline(summary: dict, tables: dict[str, pd.DataFrame]) -> list[str]:
    """One line per scale-up domain: the cost-optimal sparsity and its cost."""
    lines = []
    for e in summary["optimum"]:
        if e["status"] != "optimal":  # infeasible, or left out for want of a price
            lines.append(f"{e['system_domain']}: {e.get('reason', 'no sparsity fits one domain')}")
            continue
        lines.append(f"{e['system_domain']}: sparsity {e['sparsity']} ({e['params_total'] / 1e12:.2f}T total, "
                     f"{e['params_active'] / 1e9:.0f}B active) on {e['chips']} chips: "
                     f"{e['usd_per_mtok']:.4g} USD per output Mtok, whole requests (prefill included)")
    return lines
