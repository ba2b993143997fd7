"""``kind: pareto``: the exact, complete Pareto fronts of every (model, workload) at request level, over
aggregated and disaggregated deployments (``space.serving``): USD per request against TPOT
(``pareto.csv``) and output tokens/s per GPU against tokens/s per user (``pareto_throughput.csv``), both at the
fluid pool ratio (``usd_per_request_fluid``, ``tokens_per_s_per_gpu_fluid``); each row also gives its smallest whole
deployment as deployed (`dse.optimize.fronts.smallest_whole`: GPUs, USD per request, tokens/s per GPU, TTFT).

Every feasible configuration of the space is a candidate (every integer batch of every block; see
`dse.optimize.fronts`), so the front is the whole non-dominated set, not a sample of TPOT targets.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import pandas as pd
from pydantic import Field

from dse.errors import InfeasibleError
from dse.optimize.fronts import OBJECTIVES, describe_points, front, smallest_whole
from dse.optimize.space import Space
from dse.studies.base import Strict, StudySpec
from dse.studies.common import ALTERNATIVES, Found, mode_tables, optimum, pick_modes, run_serving
from dse.studies.contract import Chart, Plot, Progress, Solved, StudyOutput
from dse.studies.plotting import TIME_BREAKDOWN, place_labels, save, spread, subplots

USES_STORAGE = False
OBJECTIVE = "usd_per_request_fluid"
"""The cost front's objective: USD per request at the fluid pool ratio at each TPOT (the throughput front maximizes
tokens/s per GPU at the fluid pool ratio at each tokens/s per user)."""
WORKERS = False
TABLES = {"cost": "pareto", "throughput": "pareto_throughput"}


class ParetoSpec(Strict):
    """Which fronts to compute and how many points to label on each plot."""

    fronts: list[Literal["cost", "throughput"]] = Field(default=list(OBJECTIVES), min_length=1, max_length=2)
    labels: int = Field(default=6, ge=0, le=50, description="points labelled per front on the plots")


class Spec(StudySpec):
    pareto: ParetoSpec = ParetoSpec()


def solve_one(space: Space, spec: Spec, ideal: bool, found: Found) -> None:
    tables = mode_tables(space, spec)
    picked, reasons = pick_modes(space, tables, ideal, alternatives=ALTERNATIVES)
    found.facts["labels"] = spec.pareto.labels
    if not picked:
        raise InfeasibleError("; ".join(reasons))
    found.best.append(optimum(*picked[0]))
    found.results += [r.result for _, r in picked]
    req = space.workload
    w = space.workload
    dis = tables.disaggregated
    stats = found.facts.setdefault("fronts", [])
    for objective in spec.pareto.fronts:
        f = front(space, req, tables.aggregated is not None, dis, objective)
        desc = describe_points(space, f, dis.pre if dis is not None else None)
        whole = smallest_whole(f, dis.pre if dis is not None else None, space.served(req))
        rows = pd.concat([desc, whole, f[["tpot_s", "tokens_per_s_per_user"]]], axis=1)
        rows.insert(0, "workload", w.name)
        rows.insert(0, "model", space.model.id)
        rows["usd_per_mtok_blended"] = rows["usd_per_request"] / (w.prompt + w.output) * 1e6
        rows["price_kind"] = spec.price
        rows["label"] = [_label(r) for r in rows.to_dict(orient="records")]
        stats.append({"model": space.model.id, "workload": w.name, "front": objective, "points": len(rows),
                      "candidates": int(f.attrs.get("candidates", 0)),
                      "aggregated_points": int((rows["serving"] == "aggregated").sum())})
        found.rows.setdefault(TABLES[objective], []).extend(rows.to_dict(orient="records"))


def _label(r: dict) -> str:
    text = (f"{r['system']} TP{r['tp']} EP{r['ep']} PP{r['pp']} DP{r['dp']} B{r['batch']} {r['weights_dtype']}")
    if r["serving"] == "disaggregated":
        cp = " CP" if r.get("prefill_context_parallel") else ""
        text = f"decode {text} + prefill {r['prefill_system']} x{r['prefill_chips']}{cp}"
    return text


def solve(spec: Spec, progress: Progress | None = None, storage: str | None = None) -> Solved:
    """The fronts of every (model, workload)."""
    return run_serving(spec, solve_one, progress)


def _draw(out: StudyOutput, path: Path, table: str, y: str, ylabel: str, title: str, x: str = "tpot_s") -> None:
    data = out.frames[table]
    groups = list(data.groupby(["model", "workload"], sort=False))
    fig, axes = subplots(len(groups), 1, figsize=(9, 5.5 * len(groups)), squeeze=False)  # one model per panel
    k = int(out.summary.get("labels", 6))
    labels = []
    for ax, ((model, workload), g) in zip(axes[:, 0], groups, strict=True):
        g = g.reset_index(drop=True)
        xs = g[x] * (1e3 if x == "tpot_s" else 1.0)
        for serving, marker in (("aggregated", "o"), ("disaggregated", "s")):
            sel = g["serving"] == serving
            if sel.any():
                ax.plot(xs[sel], g[y][sel], marker, ms=3, label=serving)
        ax.plot(xs, g[y], "-", lw=0.8, color="grey", drawstyle="steps-post", label="front")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("TPOT (ms per output token, request level)" if x == "tpot_s" else x.replace("_", " "))
        ax.set_ylabel(ylabel)
        ax.set_title(f"{model} / {workload}: {title}", fontsize=10)
        ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.12), ncol=3)
        marked = spread(xs, g[y], k)
        labels.append((ax, xs[marked].to_numpy(), g[y][marked].to_numpy(), [g["label"][i] for i in marked],
                       (xs.to_numpy(), g[y].to_numpy())))
    for ax, lx, ly, texts, avoid in labels:  # every panel drawn: the layout is final
        place_labels(ax, lx, ly, texts, avoid=avoid)
    save(fig, path)


def _cost(out: StudyOutput, path: Path) -> None:
    _draw(out, path, "pareto", "usd_per_request_fluid", "USD per request at the fluid pool ratio (prefill included)",
          "TPOT against cost per request (no configuration is both faster and cheaper than a point)")


def _throughput(out: StudyOutput, path: Path) -> None:
    _draw(out, path, "pareto_throughput", "tokens_per_s_per_gpu_fluid",
          "output tokens/s per GPU at the fluid pool ratio (both pools counted)",
          "tokens/s per user against tokens/s per GPU", x="tokens_per_s_per_user")


PLOTS = (TIME_BREAKDOWN, Plot("pareto", "pareto.png", _cost, needs="usd_per_request_fluid"),
         Plot("pareto_throughput", "pareto_throughput.png", _throughput, needs="tokens_per_s_per_gpu_fluid"))
CHARTS = (Chart("pareto", "tpot_s", "usd_per_request_fluid",
                "Pareto front: TPOT against USD per request at the fluid pool ratio"),
          Chart("pareto_throughput", "tokens_per_s_per_user", "tokens_per_s_per_gpu_fluid",
                "Pareto front: tokens/s per user against tokens/s per GPU at the fluid pool ratio"))


def headline(summary: dict, tables: dict[str, pd.DataFrame]) -> list[str]:
    """Per (model, workload) and front: its size, and the range of each axis along it."""
    lines = []
    for s in summary.get("fronts", []):
        t = tables.get(TABLES[s["front"]], pd.DataFrame())
        g = t[(t["model"] == s["model"]) & (t["workload"] == s["workload"])] if not t.empty else t
        if g.empty:
            continue
        what = ("USD per request at the fluid pool ratio {:.3g} (TPOT {:.3g} ms) to {:.3g} (TPOT {:.3g} ms)"
                if s["front"] == "cost" else
                "{:.4g} tokens/s per GPU at the fluid pool ratio at {:.3g} ms TPOT to {:.4g} at {:.3g} ms")
        first, last = g.iloc[-1], g.iloc[0]
        ykey = "usd_per_request_fluid" if s["front"] == "cost" else "tokens_per_s_per_gpu_fluid"
        lines.append(f"{s['model']} / {s['workload']} {s['front']} front: {s['points']} non-dominated points of "
                     f"{s['candidates']:,} feasible configurations ({s['aggregated_points']} aggregated); "
                     + what.format(first[ykey], first["tpot_s"] * 1e3, last[ykey], last["tpot_s"] * 1e3))
    return lines
