"""Plots (PNG) and the self-contained HTML report of a study run."""

from __future__ import annotations

import base64
import html
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from dse.study import StudySpec  # noqa: E402


def _save(fig, path: Path) -> None:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _cost_by_system(table: pd.DataFrame, path: Path) -> None:
    groups = list(table.groupby(["model", "workload"], sort=False))
    fig, axes = plt.subplots(len(groups), 1, figsize=(9, 2.2 + 0.28 * table["system"].nunique() * len(groups)),
                             squeeze=False)
    for ax, ((model, workload), g) in zip(axes[:, 0], groups, strict=True):
        g = g.iloc[::-1].reset_index(drop=True)
        ok = (g["status"] != "infeasible").to_numpy()
        y = np.arange(len(g))
        cost = g["usd_per_mtok"].to_numpy(dtype=float) if "usd_per_mtok" in g else np.full(len(g), np.nan)
        if ok.any():
            left = np.nanmin(cost[ok]) / 2
            ax.barh(y[ok], cost[ok] - left, left=left, color="#3b7dd8")
            ax.set_xscale("log")
            for yi, c in zip(y[ok], cost[ok], strict=True):
                ax.text(c, yi, f" {c:.3g}", va="center", fontsize=7)
        for yi in y[~ok]:
            ax.text(0.01, yi, "infeasible", transform=ax.get_yaxis_transform(), va="center", fontsize=8, color="#b00")
        ax.set_yticks(y, g["system"], fontsize=8)
        ax.set_xlabel("USD per million output tokens (best configuration of each system)")
        ax.set_title(f"{model} / {workload}", fontsize=10)
    _save(fig, path)


def _breakdown(best: pd.DataFrame, path: Path) -> None:
    labels = [f"{m}\n{w}\n{s}" for m, w, s in zip(best["model"], best["workload"], best["system"], strict=True)]
    fig, ax = plt.subplots(figsize=(max(5, 1.6 * len(best)), 4))
    x = range(len(best))
    width = 0.27
    for i, (key, color) in enumerate((("compute_s", "#e07b39"), ("memory_s", "#3b7dd8"), ("comm_s", "#59a14f"))):
        ax.bar([v + (i - 1) * width for v in x], best[key] * 1e3, width, label=key.removesuffix("_s"), color=color)
    ax.set_xticks(list(x), labels, fontsize=7)
    ax.set_ylabel("time per decode step (ms)")
    ax.legend()
    ax.set_title("What binds the chosen configurations")
    _save(fig, path)


def _pareto(table: pd.DataFrame, path: Path) -> None:
    fig, ax = plt.subplots(figsize=(9, 6))
    for (model, workload), g in table.groupby(["model", "workload"], sort=False):
        ax.plot(g["tpot_s"] * 1e3, g["usd_per_mtok"], "o-", drawstyle="steps-post", label=f"{model} / {workload}")
        for _, r in g.iterrows():
            ax.annotate(r["label"], (r["tpot_s"] * 1e3, r["usd_per_mtok"]), fontsize=5.5, rotation=20,
                        xytext=(3, 3), textcoords="offset points")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("TPOT (ms per output token)")
    ax.set_ylabel("USD per million output tokens")
    ax.set_title("Pareto front: latency against cost (each point optimal for its TPOT target)")
    ax.legend(fontsize=8)
    _save(fig, path)


def _fast_slow(table: pd.DataFrame, path: Path) -> None:
    fig, ax = plt.subplots(figsize=(7, 5))
    ok = table[table["status"] != "infeasible"]
    for (model, workload), g in ok.groupby(["model", "workload"], sort=False):
        line = ax.plot(g["speed_multiplier"], g["cost_multiplier"], "o-", label=f"{model} / {workload}: re-provisioned")
        if "cost_multiplier_same_layout" in g:
            ax.plot(g["speed_multiplier"], g["cost_multiplier_same_layout"], "s--", color=line[0].get_color(),
                    label=f"{model} / {workload}: same layout, smaller batch")
    ax.plot([2.5], [6.0], "r*", markersize=14, label="fast mode at published prices: 2.5x speed for 6x price")
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.axvline(1.0, color="grey", lw=0.8)
    ax.set_yscale("log")
    ax.set_xlabel("speed multiplier (TPOT of the cost optimum / TPOT)")
    ax.set_ylabel("cost multiplier (USD per token / cost optimum)")
    ax.set_title("Fast and slow modes: what speed costs")
    ax.legend(fontsize=8, loc="upper left")
    _save(fig, path)


def _sweep(table: pd.DataFrame, path: Path, systems: pd.DataFrame | None = None) -> None:
    groups = list(table.groupby(["model", "workload", "parameter"], sort=False))
    fig, axes = plt.subplots(len(groups), 1, figsize=(8, 3.6 * len(groups)), squeeze=False)
    for ax, ((model, workload, parameter), g) in zip(axes[:, 0], groups, strict=True):
        g = g.sort_values("factor")
        if systems is not None and not systems.empty:
            sg = systems[(systems["model"] == model) & (systems["workload"] == workload)]
            for _, h in sg.groupby("system"):
                h = h.sort_values("factor")
                ax.plot(h["factor"], h["usd_per_mtok"], lw=0.7, alpha=0.5, color="grey")
        ok = np.isfinite(g["usd_per_mtok"].astype(float))
        ax.plot(g["factor"][ok], g["usd_per_mtok"][ok], "o-", lw=2, color="#3b7dd8", label="optimum over all systems")
        for _, r in g[ok].iterrows():
            ax.annotate(f"{r['system']}\n{r['bound']}", (r["factor"], r["usd_per_mtok"]), fontsize=6,
                        xytext=(3, 4), textcoords="offset points")
        if "bound_changes_here" in g:
            ch = g[g["bound_changes_here"].fillna(False).astype(bool) & ok]
            ax.plot(ch["factor"], ch["usd_per_mtok"], "r*", markersize=12, label="binding resource changes")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel(f"{parameter} (x catalog value)")
        ax.set_ylabel("USD per million output tokens")
        ax.set_title(f"{model} / {workload} (grey: best of each system)", fontsize=10)
        ax.legend(fontsize=8)
    _save(fig, path)


def _tornado(table: pd.DataFrame, path: Path) -> None:
    groups = list(table.groupby(["model", "workload"], sort=False))
    fig, axes = plt.subplots(len(groups), 1, figsize=(8, 3.2 * len(groups)), squeeze=False)
    for ax, ((model, workload), g) in zip(axes[:, 0], groups, strict=True):
        base = g[g["factor"] == 1.0]["usd_per_mtok"].iloc[0]
        rows = []
        for parameter, h in g[g["factor"] != 1.0].groupby("parameter", sort=False):
            lo = h[h["factor"] < 1]["usd_per_mtok"].iloc[0] / base - 1
            hi = h[h["factor"] > 1]["usd_per_mtok"].iloc[0] / base - 1
            rows.append((parameter, lo, hi))
        rows.sort(key=lambda r: max(abs(r[1]), abs(r[2])))
        y = np.arange(len(rows))
        ax.barh(y, [100 * r[1] for r in rows], color="#e07b39", label="x 0.5 (low)")
        ax.barh(y, [100 * r[2] for r in rows], color="#3b7dd8", label="x 2 (high)")
        ax.set_yticks(y, [r[0] for r in rows], fontsize=8)
        ax.axvline(0, color="k", lw=0.8)
        ax.set_xlabel("change of the optimal cost per token (%)")
        ax.set_title(f"{model} / {workload}: base {base:.3g} USD/Mtok", fontsize=10)
        ax.legend(fontsize=8)
    _save(fig, path)


def _overtraining(table: pd.DataFrame, path: Path) -> None:
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    ok = table[np.isfinite(table["lifetime_usd"].astype(float))] if "lifetime_usd" in table else table
    for demand, g in ok.groupby("demand_tokens_per_s"):
        g = g.sort_values("overtraining_ratio")
        axes[0].plot(g["overtraining_ratio"], g["lifetime_usd"], "o", ms=3, label=f"{demand:.3g} tokens/s")
        b = g.loc[g["lifetime_usd"].idxmin()]
        axes[0].plot([b["overtraining_ratio"]], [b["lifetime_usd"]], "k*", ms=12)
        g = g.sort_values("params")
        axes[1].plot(g["params"] / 1e9, g["lifetime_usd"], "o", ms=3, label=f"{demand:.3g} tokens/s")
    for ax in axes:
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_ylabel("lifetime cost (USD): pre-training + RL + inference")
        ax.legend(fontsize=8, title="inference demand")
    axes[0].set_xlabel("pre-training tokens / Chinchilla-optimal (20 per parameter)")
    axes[1].set_xlabel("parameters (billions)")
    axes[0].set_title("Optimum (star) moves past Chinchilla as inference demand grows", fontsize=10)
    _save(fig, path)


def _placement(table: pd.DataFrame, path: Path) -> None:
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    x = np.arange(len(table))
    labels = [f"{m}\nskew {s:g}" for m, s in zip(table["model"], table["skew"], strict=True)]
    for ax, key, title in ((axes[0], "imbalance", "most-loaded GPU / mean"),
                           (axes[1], "crossing_tokens", "tokens crossing scale-out per step")):
        ax.bar(x - 0.2, table[f"{key}_greedy"], 0.4, label="EPLB greedy", color="#e07b39")
        ax.bar(x + 0.2, table[f"{key}_mip"], 0.4, label="MIP", color="#3b7dd8")
        ax.set_xticks(x, labels, fontsize=7)
        ax.set_title(title, fontsize=10)
        ax.legend(fontsize=8)
    _save(fig, path)


def _codesign(table: pd.DataFrame, path: Path) -> None:
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for system, g in table.groupby("system_domain", sort=False):
        ok = g[g["status"] != "infeasible"]
        ax.plot(ok["sparsity"], ok["usd_per_mtok"], "o-", label=f"one {system} domain")
        b = ok.loc[ok["usd_per_mtok"].idxmin()] if not ok.empty else None
        if b is not None:
            ax.plot([b["sparsity"]], [b["usd_per_mtok"]], "k*", ms=12)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("sparsity (total / active expert parameters; fixed quality)")
    ax.set_ylabel("USD per million output tokens")
    ax.set_title("Cost-optimal sparsity (star) jumps with the scale-up domain", fontsize=10)
    ax.legend(fontsize=8)
    _save(fig, path)


def write_plots(out, spec: StudySpec, folder: Path) -> list[str]:
    """Draw the study's plots into ``folder``; return their file names."""
    plots = (("systems", _cost_by_system, "cost_by_system.png"), ("best", _breakdown, "time_breakdown.png"),
             ("pareto", _pareto, "pareto.png"), ("fast_slow", _fast_slow, "fast_slow.png"),
             ("tornado", _tornado, "tornado.png"), ("overtraining", _overtraining, "overtraining.png"),
             ("placement", _placement, "placement.png"), ("codesign", _codesign, "codesign.png"))
    files = []
    if "sweep" in out.tables and not out.tables["sweep"].empty:
        _sweep(out.tables["sweep"], folder / "sweep.png", out.tables.get("sweep_systems"))
        files.append("sweep.png")
    for table, draw, name in plots:
        if table in out.tables and not out.tables[table].empty:
            draw(out.tables[table], folder / name)
            files.append(name)
    return files


def _fmt_bytes(x: float) -> str:
    return f"{x / 1e9:,.1f} GB"


def _band(e: dict) -> str:
    band = e.get("usd_per_mtok_band")
    return "" if not band else f" (80% band {band[0]:.3g}-{band[1]:.3g}, from the leave-one-out errors of dse validate)"


def explain(e: dict, space) -> str:
    """Why this configuration: which resource binds, the time and the memory breakdown."""
    parts = {"compute": e["compute_s"], "memory (HBM bandwidth)": e["memory_s"], "communication": e["comm_s"]}
    binding = max(parts, key=parts.get)
    times = ", ".join(f"{k} {v * 1e3:.3g} ms" for k, v in parts.items())
    n = e["batch"] // e["dp"]
    row = None
    if space is not None:
        blocks = space.blocks
        match = blocks[(blocks["system"] == e["system"]) & (blocks["tp"] == e["tp"]) & (blocks["dp"] == e["dp"])
                       & (blocks["ep"] == e["ep"]) & (blocks["pp"] == e["pp"])]
        row = match.iloc[0] if len(match) else None
    w = space.workload if space is not None else None
    if row is not None and n >= int(row["n_hi"]):
        cap = "HBM capacity caps the batch (one more sequence per rank would not fit)"
    elif w is not None and w.tpot_max is not None and e["tpot_s"] >= 0.98 * w.tpot_max:
        cap = f"the TPOT target of {w.tpot_max * 1e3:g} ms caps the batch"
    else:
        cap = "the batch stops where a larger one no longer lowers the cost per token, or at the study's limit"
    free = e["hbm_capacity_per_chip"] - e["hbm_bytes_per_chip"]
    return (
        f"<p><b>{html.escape(e['model'])} / {html.escape(e['workload'])}</b>: {e['chips']} x {e['system']} "
        f"({e['racks']} scale-up domain{'s' if e['racks'] > 1 else ''}), TP{e['tp']} DP{e['dp']} EP{e['ep']} "
        f"PP{e['pp']}, batch {e['batch']}, weights {e['weights_dtype']}, KV {e['kv_dtype']} in {e['kv_tier']}. "
        f"Binding resource: <b>{binding}</b> ({times} per step). {cap}. "
        f"Memory per chip: weights {_fmt_bytes(e['weights_bytes_per_chip'])}, KV {_fmt_bytes(e['kv_bytes_per_chip'])}, "
        f"activations {_fmt_bytes(e['activation_bytes_per_chip'])}, free {_fmt_bytes(free)} of "
        f"{_fmt_bytes(e['hbm_capacity_per_chip'])}. Cost {e['usd_per_mtok']:.4g} USD per million output tokens"
        f"{_band(e)}, "
        f"{e['usd_per_mtok_input']:.4g} per million input tokens (prefill one prompt at a time); "
        f"TPOT {e['tpot_s'] * 1e3:.3g} ms, TTFT {e['ttft_s']:.3g} s.</p>"
    )


def write_report(out, spec: StudySpec, folder: Path) -> None:
    """A self-contained report.html: text, tables and the PNGs embedded."""
    s = out.summary
    parts = [
        "<!doctype html><html><head><meta charset='utf-8'>",
        f"<title>{html.escape(s['study'])}</title>",
        "<style>body{font-family:sans-serif;max-width:1100px;margin:2em auto;padding:0 1em}"
        "table{border-collapse:collapse;font-size:12px}td,th{border:1px solid #ccc;padding:2px 6px}"
        "img{max-width:100%}</style></head><body>",
        f"<h1>{html.escape(s['study'])}</h1>",
        f"<p><b>Question.</b> {html.escape(s['description'])}</p>",
        f"<p><b>Expected.</b> {html.escape(s['expect'])}</p>",
        f"<p><b>Status:</b> {s['status']} &middot; solver {s['solver']['name']}, {s['solver']['solves']} solves, "
        f"{s['solver']['solve_wall_s']:.3f} s solving, {s['solver']['wall_s']:.3f} s in all, "
        f"largest gap {s['solver']['gap']:.2g}</p>",
    ]
    if s["best"]:
        parts.append("<h2>Chosen configurations</h2>")
        for e in s["best"]:
            parts.append(explain(e, out.spaces.get((e["model"], e["workload"]))))
    if s["infeasible"]:
        parts.append("<h2>Infeasible</h2><ul>")
        parts += [f"<li>{html.escape(i['model'])} / {html.escape(i['workload'])}: {html.escape(i['reason'])}</li>"
                  for i in s["infeasible"]]
        parts.append("</ul>")
    for name in ("cost_by_system.png", "time_breakdown.png", "pareto.png", "fast_slow.png", "sweep.png", "tornado.png",
                 "overtraining.png", "placement.png", "codesign.png"):
        path = folder / name
        if path.exists():
            data = base64.b64encode(path.read_bytes()).decode()
            title = name.removesuffix(".png").replace("_", " ")
            parts.append(f"<h2>{title}</h2><img src='data:image/png;base64,{data}'>")
    for name, table in out.tables.items():
        parts.append(f"<h2>{name}.csv</h2>")
        parts.append(table.to_html(index=False, float_format=lambda v: f"{v:.4g}", escape=True))
    if s.get("spaces"):
        parts.append("<h2>Search spaces</h2>")
        parts.append(pd.DataFrame(s["spaces"]).to_html(index=False))
    parts.append("</body></html>")
    (folder / "report.html").write_text("\n".join(parts))
