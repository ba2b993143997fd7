"""The self-contained HTML report of a study run, and its plots drawn by the study's kind."""

from __future__ import annotations

import base64
import html
from pathlib import Path

import numpy as np

from dse.report.present import STYLE, headline_html, interactive_charts, table_html
from dse.studies.base import StudySpec
from dse.studies.contract import Optimum, Plot, StudyOutput
from dse.studies.registry import study_module
from dse.table import Table


def _plots(out: StudyOutput, spec: StudySpec) -> list[Plot]:
    """The kind's plots whose tables have data."""
    return [plot for plot in study_module(spec.kind).PLOTS if plot.has_data(out)]


def plot_files(out: StudyOutput, spec: StudySpec) -> list[str]:
    """The files `write_plots` draws."""
    return [plot.file for plot in _plots(out, spec)]


def write_plots(out: StudyOutput, spec: StudySpec, folder: Path) -> list[str]:
    """Draw the kind's plots whose tables have data into ``folder``; return their file names."""
    plots = _plots(out, spec)
    for plot in plots:
        plot.draw(out, folder / plot.file)
    return [plot.file for plot in plots]


NEAR_TARGET = 0.98
"""Where an entry names no binding limit, a TPOT within 2% of its target is explained as the target capping the
batch (a wording threshold of the report, no physics)."""


def _fmt_bytes(x: float) -> str:
    return f"{x / 1e9:,.1f} GB"


def _band(e: dict) -> str:
    band = e.get("usd_per_mtok_band")
    return "" if not band else (f" (80% band {band[0]:.3g}-{band[1]:.3g}, from the out-of-sample errors of dse "
                                "validate for its hardware family)")


def explain(o: Optimum, space) -> str:
    """Why this configuration: which resource binds, the time and the memory breakdown."""
    e = o.entry
    parts = {"compute": e["compute_s"], "memory (HBM bandwidth)": e["memory_s"], "communication": e["comm_s"]}
    binding = max(parts, key=parts.get)
    times = ", ".join(f"{k} {v * 1e3:.3g} ms" for k, v in parts.items())
    n = e["batch"] // e["dp"]
    row = None
    if space is not None:
        blocks = space.blocks
        match = np.flatnonzero((blocks["system"] == e["system"]) & (blocks["tp"] == e["tp"])
                               & (blocks["dp"] == e["dp"]) & (blocks["ep"] == e["ep"]) & (blocks["pp"] == e["pp"]))
        row = blocks.row(int(match[0])) if len(match) else None
    w = space.workload if space is not None else None
    if e.get("binding"):
        cap = f"What stops the batch at {n} per rank: {e['binding']}"
    elif row is not None and n >= int(row["n_hi"]):
        cap = "HBM capacity caps the batch (one more sequence per rank would not fit)"
    elif w is not None and w.tpot_max is not None and e["tpot_s"] >= NEAR_TARGET * w.tpot_max:
        cap = f"the TPOT target of {w.tpot_max * 1e3:g} ms caps the batch"
    else:
        cap = "the batch stops where a larger one no longer lowers the cost per token, or at the study's limit"
    device = e.get("device_memory_per_chip") or e["hbm_capacity_per_chip"]  # as the device reports it
    usable = e.get("hbm_usable_per_chip") or device  # what the framework lets weights, KV and activations fill
    free = usable - e["hbm_bytes_per_chip"]
    held = f"{_fmt_bytes(usable)} {e['framework']} may fill of " if e.get("framework") and usable < device else ""
    pool = e["pools"][-1] if o.request_level and e.get("pools") else e  # the aggregated or decode replica
    which = {"both": "Each replica", "decode": "Each decode replica"}.get(pool.get("role", ""), "The replica")
    price = (f" at {e.get('usd_per_chip_hour') or float('nan'):.3g} USD per chip-hour ({e.get('price_kind', '')}"
             f"{', <b>ESTIMATE</b>' if e.get('price_is_estimate') else ''})")
    if o.request_level:
        cost = (f"Cost {e['usd_per_request']:.4g} USD per request as deployed{price}: {e['usd_per_mtok_input']:.4g} "
                f"USD per million input tokens, {e['usd_per_mtok_output']:.4g} per million output tokens")
    else:
        cost = (f"Cost {e['usd_per_mtok']:.4g} USD per million output tokens{_band(e)}{price}, "
                f"{e['usd_per_mtok_input']:.4g} per million input tokens (prefill one prompt at a time)")
    return (
        f"<p><b>{html.escape(e['model'])} / {html.escape(e['workload'])}</b>: {which}: {pool['chips']} x "
        f"{e['system']} ({pool['racks']} scale-up domain{'s' if pool['racks'] > 1 else ''}), TP{e['tp']} DP{e['dp']} "
        f"EP{e['ep']} PP{e['pp']}, batch {e['batch']}, weights {e['weights_dtype']}, KV {e['kv_dtype']} in "
        f"{e['kv_tier']}. Binding resource: <b>{binding}</b> ({times} per step). {cap}. "
        f"Memory per chip: weights {_fmt_bytes(e['weights_bytes_per_chip'])}, KV {_fmt_bytes(e['kv_bytes_per_chip'])}, "
        f"activations {_fmt_bytes(e['activation_bytes_per_chip'])}, free {_fmt_bytes(free)} of the "
        f"{held}{_fmt_bytes(device)} the device reports. {cost}; "
        f"TPOT {e['tpot_s'] * 1e3:.3g} ms, TTFT {e['ttft_s']:.3g} s.{_request(o)}{_power(e)}"
        + (f" <b>Context {e['context']:,} is beyond the model's published maximum of {e['max_context']:,} tokens "
           "(allow_beyond_trained_context).</b>" if e.get("beyond_trained_context") else "")
        + "</p>"
    )


def _request(o: Optimum) -> str:
    if not o.request_level:
        return ""
    e = o.entry
    return (f" Request level ({e['serving']}, {e['chips']:,} GPUs in all, prefill counted): prefill "
            f"{e['prefill_share']:.0%} of the cost; the decode step alone takes {e['step_tpot_s'] * 1e3:.3g} ms.")


def _power(e: dict) -> str:
    if e.get("power_w") is None or e["power_w"] != e["power_w"]:
        return " Power: no all-in figure in the catalog."
    return f" Power {e['power_w'] / 1e3:.3g} kW all-in, {e['joules_per_token']:.3g} J per output token."


def write_report(out: StudyOutput, spec: StudySpec, folder: Path, plots: list[str],
                 skipped: list[str] | None = None) -> None:
    """A self-contained report.html: text, tables and the PNGs embedded; ``skipped`` names the figures a run
    without plots did not draw (the report says so in their place).
    """
    s = out.summary
    parts = [
        "<!doctype html><html><head><meta charset='utf-8'>",
        f"<title>{html.escape(s['study'])}</title>",
        f"<style>{STYLE}</style></head><body>",
        f"<h1>{html.escape(s['study'])}</h1>",
        headline_html(out, spec.kind),
        f"<p><b>Question.</b> {html.escape(s['description'])}</p>",
        f"<p><b>Expected.</b> {html.escape(s['expect'])}</p>",
        f"<p><b>Status:</b> {s['status']} &middot; solver {s['solver']['name']}, {s['solver']['solves']} solves, "
        f"{s['solver']['solve_wall_s']:.3f} s solving, {s['solver']['wall_s']:.3f} s in all, "
        f"largest gap {s['solver']['gap']:.2g}</p>",
        f"<p><b>Prices:</b> {html.escape(str(s['price_kind']))} (USD per chip-hour of that kind; estimates "
        "are marked). <b>No price</b> of this kind, left out of cost comparisons: "
        f"{html.escape(', '.join(s['no_price']) or 'none')}.</p>",
    ]
    solved = out.solved
    if solved.best:
        parts.append("<h2>Chosen configurations</h2>")
        for o in solved.best:
            parts.append(explain(o, solved.spaces.get((o.entry["model"], o.entry["workload"]))))
    if solved.infeasible:
        parts.append("<h2>Infeasible</h2><ul>")
        parts += [f"<li>{html.escape(i['model'])} / {html.escape(i['workload'])}: {html.escape(i['reason'])}</li>"
                  for i in solved.infeasible]
        parts.append("</ul>")
    for name in plots:
        path = folder / name
        if path.exists():
            data = base64.b64encode(path.read_bytes()).decode()
            title = name.removesuffix(".png").replace("_", " ")
            parts.append(f"<h2>{title}</h2><img src='data:image/png;base64,{data}'>")
    if skipped:
        parts.append(f"<p><b>Figures skipped:</b> this run drew no plots (<code>--no-plots</code>); "
                     f"not drawn: {html.escape(', '.join(skipped))}. The tables below hold their data.</p>")
    parts.append(interactive_charts(out, spec.kind))
    for name, table in solved.tables.items():
        parts.append(f"<h2>{name}.csv</h2>")
        parts.append(table_html(table))
    if solved.space_stats:
        parts.append("<h2>Search spaces</h2>")
        parts.append(table_html(Table.from_records(solved.space_stats)))
    parts.append("</body></html>")
    (folder / "report.html").write_text("\n".join(parts))
