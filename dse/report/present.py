"""What a report shows first and how its numbers read: the headline block, tables with units and
sensible rounding, and an interactive (hover) chart drawn as inline SVG, which needs no library
and no network.
"""

from __future__ import annotations

import html
import math

import numpy as np
import pandas as pd

from dse.catalog.units import si
from dse.studies.contract import Chart, Optimum, StudyOutput
from dse.studies.registry import study_module

HEADLINE_KEYS = (  # (key, label, unit kind) of an optimum, shown when the entry has them
    ("usd_per_request", "USD/request", "usd"),
    ("usd_per_request_band", "its 80% band", "band"),
    ("usd_per_mtok", "USD/Mtok (output)", "usd"),
    ("usd_per_mtok_output", "USD/Mtok output", "usd"),
    ("usd_per_mtok_input", "USD/Mtok input", "usd"),
    ("ttft_s", "TTFT", "s"),
    ("ttft_s_band", "its 80% band", "band"),
    ("tpot_s", "TPOT", "s"),
    ("tpot_s_band", "its 80% band", "band"),
    ("tokens_per_s_per_gpu", "tokens/s per GPU", "rate"),
    ("tokens_per_s_per_user", "tokens/s per user", "rate"),
    ("tokens_per_s", "tokens/s", "rate"),
    ("replicas", "replicas for the demand (decode pool when disaggregated)", "count"),
    ("prefill_replicas_at_demand", "prefill replicas for the demand", "count"),
    ("power_w", "power", "W"),
    ("price_kind", "price kind", "text"),
    ("prefill_share", "prefill share of cost", "text"),
    ("other_serving", "other mode", "text"),
    ("other_serving_usd_per_request", "its USD/request", "usd"),
)


def cell(column: str, value) -> str:
    """One table cell, formatted by what its column name says about its unit."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    if isinstance(value, (bool, np.bool_)):
        return "yes" if value else "no"
    if isinstance(value, (list, tuple)):
        return " – ".join(cell(column, v) for v in value)
    if not isinstance(value, (int, float, np.integer, np.floating)):
        return str(value)
    v = float(value)
    if column.startswith("tokens_per_s") or column.endswith("_tokens") or column.startswith("demand"):
        return si(v, "")
    if column.endswith("_per_s"):
        return si(v, "/s")
    if column.endswith("_s") or column.endswith("_s_band"):
        return si(v, "s")
    if "bytes" in column or column.startswith("hbm_capacity") or column == "capacity":
        return si(v, "B")
    if column == "bandwidth" or column.endswith("bandwidth"):
        return si(v, "B/s")
    if column.startswith("usd") or column.endswith("_usd") or column.startswith("price"):
        return f"{v:,.4g}"
    if column.endswith("_share") or column.endswith("utilisation"):
        return f"{v:.0%}"
    if column.endswith("_w") or column == "power":
        return si(v, "W")
    if isinstance(value, (int, np.integer)) or v.is_integer() and abs(v) < 1e15:
        return f"{int(v):,}"
    return f"{v:.4g}"


def table_html(table: pd.DataFrame, max_rows: int = 200) -> str:
    """A DataFrame as an HTML table with units and rounding (at most ``max_rows`` rows, said so)."""
    shown = table.head(max_rows)
    head = "".join(f"<th>{html.escape(str(c))}</th>" for c in shown.columns)
    rows = []
    for rec in shown.to_dict(orient="records"):
        cells = "".join(f"<td>{html.escape(cell(str(c), v))}</td>" for c, v in rec.items())
        rows.append(f"<tr>{cells}</tr>")
    more = f"<p>{len(table) - max_rows:,} more rows in the CSV.</p>" if len(table) > max_rows else ""
    return (f"<div class='tbl'><table><thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table></div>"
            f"{more}")


def _configuration(o: Optimum) -> str:
    """The chosen configuration in words: a prefill pool with a decode pool by their roles, else the entry's own
    (one replica, or the largest pool of several).
    """
    e = o.entry
    pools = e["pools"] if o.request_level else []  # a request-level entry lists its pools
    roles = {p["role"]: p for p in pools} if len(pools) == 2 else {}
    if roles.keys() == {"prefill", "decode"}:
        pre, dec = roles["prefill"], roles["decode"]
        cp = ", context parallel" if pre.get("context_parallel") else ""
        return (f"disaggregated: {pre['replicas']} prefill replica(s) of {pre['chips']} x {pre['system']} "
                f"TP{pre['tp']} DP{pre['dp']} EP{pre['ep']}{cp} at {pre.get('utilisation', float('nan')):.0%} "
                f"utilisation per {dec['replicas']} decode replica(s) of {dec['chips']} x {dec['system']} "
                f"TP{dec['tp']} DP{dec['dp']} EP{dec['ep']} PP{dec['pp']}, batch {dec['batch']}; "
                f"{dec['weights_dtype']} weights, {dec['kv_dtype']} KV in {dec['kv_tier']}")
    return (f"{e['chips']} x {e['system']} TP{e['tp']} DP{e['dp']} EP{e['ep']} PP{e['pp']}, batch {e['batch']}, "
            f"{e['weights_dtype']} weights, {e['kv_dtype']} KV in {e['kv_tier']}")


def decision_text(e: dict) -> str | None:
    """Whether an optimum is decided, in a line (None for an entry that does not say): decided, its cost band
    clears the runner-up's; else the contenders to measure. The costs compared are those the search compared
    (as deployed for a budget or a demand, else at the fluid pool ratio).
    """
    if "decided" not in e:
        return None
    fluid = " at the fluid pool ratio" if e.get("budget") is None and e.get("demand_tokens_per_s") is None and (
        e.get("serving") == "disaggregated") else ""
    how = f"({e.get('decide', 'expected')}; 80% bands of USD per request{fluid})"

    def band(b: list[float]) -> str:
        return f"{b[0]:.3g}-{b[1]:.3g}"

    mine = band(e.get("decision_band") or e["usd_per_request_band"])
    if e["decided"]:
        ru = e.get("runner_up")
        if not ru:
            return f"decided {how}: no other system or mode is feasible"
        return (f"decided {how}: {mine} clears the runner-up, {ru['serving']} on {ru['system']} "
                f"({band(ru['usd_per_request_band'])})")
    rivals = "; ".join(f"{c['serving']} {c['layout']}: {band(c['usd_per_request_band'])}" for c in e["contenders"])
    return f"not decided {how}, this one {mine}; measure these: {rivals}"


def headline_html(out: StudyOutput, kind: str) -> str:
    """The answer block: the kind's headline lines, then each optimum with its cost and speed."""
    parts = ["<section id='headline'><h2>Answer</h2>"]
    lines = []
    headline = getattr(study_module(kind), "headline", None)
    if headline:
        lines = headline(out.summary, out.tables)
    if lines:
        parts.append("<ul>" + "".join(f"<li>{html.escape(ln)}</li>" for ln in lines) + "</ul>")
    best = out.solved.best
    if best:
        rows = []
        for o in best:
            e = o.entry
            estimate = " <span class='estimate'>(price is an estimate)</span>" if e.get("price_is_estimate") else ""
            if e.get("calibration") == "uncalibrated family":
                estimate += (" <span class='estimate'>(uncalibrated family: no published measurement fits its "
                             "efficiency factors; the default factors apply)</span>")
            metrics = [f"{label} <b>{html.escape(cell(key, e[key]) if unit != 's' else si(e[key], 's'))}</b>"
                       for key, label, unit in HEADLINE_KEYS if key in e and e[key] is not None]
            decided = decision_text(e)
            rows.append(f"<li><b>{html.escape(e['model'])} / {html.escape(e['workload'])}</b>: "
                        f"{html.escape(_configuration(o))}{estimate}<br>{' &middot; '.join(metrics)}"
                        + (f"<br>{html.escape(decided)}" if decided else "") + "</li>")
        parts.append("<ul class='optima'>" + "".join(rows) + "</ul>")
    if not lines and not best:
        parts.append("<p>No configuration was chosen: see the infeasible list below.</p>")
    parts.append("</section>")
    return "\n".join(parts)


def scatter_svg(table: pd.DataFrame, x: str, y: str, label: str, title: str, width: int = 720,
                height: int = 420) -> str:
    """A log-log scatter as inline SVG; hovering a point shows its row (an SVG <title>), no script needed."""
    data = table[[x, y, label]].copy()
    data = data[np.isfinite(data[x].astype(float)) & np.isfinite(data[y].astype(float))]
    data = data[(data[x] > 0) & (data[y] > 0)]
    if data.empty:
        return ""
    lx, ly = np.log10(data[x].astype(float)), np.log10(data[y].astype(float))
    pad = 50
    span_x = max(lx.max() - lx.min(), 1e-9)
    span_y = max(ly.max() - ly.min(), 1e-9)

    def px(v: float) -> float:
        return pad + (v - lx.min()) / span_x * (width - 2 * pad)

    def py(v: float) -> float:
        return height - pad - (v - ly.min()) / span_y * (height - 2 * pad)

    dots = []
    for (_, r), vx, vy in zip(data.iterrows(), lx, ly, strict=True):
        tip = f"{r[label]}: {x} {cell(x, r[x])}, {y} {cell(y, r[y])}"
        dots.append(f"<circle class='pt' cx='{px(vx):.1f}' cy='{py(vy):.1f}' r='4'><title>{html.escape(tip)}</title>"
                    "</circle>")
    axes = (f"<line x1='{pad}' y1='{height - pad}' x2='{width - pad}' y2='{height - pad}' stroke='#444'/>"
            f"<line x1='{pad}' y1='{pad}' x2='{pad}' y2='{height - pad}' stroke='#444'/>"
            f"<text x='{width / 2}' y='{height - 12}' text-anchor='middle'>{html.escape(x)} (log)</text>"
            f"<text x='14' y='{height / 2}' transform='rotate(-90 14 {height / 2})' text-anchor='middle'>"
            f"{html.escape(y)} (log)</text>"
            f"<text x='{pad}' y='{height - pad + 16}'>{html.escape(cell(x, float(data[x].min())))}</text>"
            f"<text x='{width - pad}' y='{height - pad + 16}' text-anchor='end'>"
            f"{html.escape(cell(x, float(data[x].max())))}</text>"
            f"<text x='{pad - 4}' y='{height - pad}' text-anchor='end'>{html.escape(cell(y, float(data[y].min())))}"
            f"</text><text x='{pad - 4}' y='{pad + 4}' text-anchor='end'>{html.escape(cell(y, float(data[y].max())))}"
            "</text>")
    return (f"<figure class='chart'><figcaption>{html.escape(title)} (hover a point for its configuration)"
            f"</figcaption><svg xmlns='http://www.w3.org/2000/svg' width='{width}' height='{height}' "
            f"viewBox='0 0 {width} {height}' role='img'>{axes}{''.join(dots)}</svg></figure>")


def chart_svg(chart: Chart, tables: dict[str, pd.DataFrame]) -> str:
    """One hover chart a kind declares, drawn where its table has rows and both columns (else nothing)."""
    table = tables.get(chart.table)
    if table is None or table.empty or chart.x not in table or chart.y not in table:
        return ""
    points = pd.DataFrame({chart.x: table[chart.x], chart.y: table[chart.y], "label": chart.label(table)})
    return scatter_svg(points, chart.x, chart.y, "label", chart.title)


def interactive_charts(out: StudyOutput, kind: str) -> str:
    """The kind's hover charts (``CHARTS``) for the tables a person explores point by point."""
    charts = (chart_svg(c, out.tables) for c in getattr(study_module(kind), "CHARTS", ()))
    return "\n".join(c for c in charts if c)


STYLE = ("body{font-family:sans-serif;max-width:1100px;margin:2em auto;padding:0 1em}"
         "table{border-collapse:collapse;font-size:12px}td,th{border:1px solid #ccc;padding:2px 6px;white-space:nowrap;"
         "text-align:right}th{background:#f3f3f3}img{max-width:100%}.tbl{overflow-x:auto;max-width:100%}"
         "#headline{background:#f5f9ff;border:1px solid #b8cff5;padding:0.5em 1em;margin:1em 0}"
         ".estimate{color:#a15c00}circle.pt{fill:#3b7dd8;opacity:0.8}circle.pt:hover{fill:#e07b39;opacity:1}"
         "figure.chart svg{border:1px solid #ddd;background:#fff;max-width:100%;height:auto}")
