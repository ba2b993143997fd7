"""What a report shows first and how its numbers read: the headline block, tables with units and
sensible rounding, and an interactive (hover) chart drawn as inline SVG, which needs no library
and no network.
"""

from __future__ import annotations

import html
import math

import numpy as np

from dse.catalog.units import si
from dse.studies.common import deployment_text
from dse.studies.contract import Chart, StudyOutput, numeric
from dse.studies.registry import study_module
from dse.table import Table, as_table


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


def table_html(table: Table, max_rows: int = 200) -> str:
    """A table (a `Table` or a DataFrame) as an HTML table with units and rounding (at most ``max_rows`` rows, said
    so).
    """
    table = as_table(table)
    shown = table.take(slice(0, max_rows))
    head = "".join(f"<th>{html.escape(str(c))}</th>" for c in shown.columns)
    rows = []
    for rec in shown.records():
        cells = "".join(f"<td>{html.escape(cell(str(c), v))}</td>" for c, v in rec.items())
        rows.append(f"<tr>{cells}</tr>")
    more = f"<p>{len(table) - max_rows:,} more rows in the CSV.</p>" if len(table) > max_rows else ""
    return (f"<div class='tbl'><table><thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table></div>"
            f"{more}")


def _usd(v: float | None) -> str:
    return "–" if v is None or v != v else f"{v:.4g}"


def marks(e: dict) -> str:
    """What the reader must know about an answer's figures: estimated prices, an uncalibrated family, a context
    beyond the model's trained window.
    """
    out = []
    if e.get("price_is_estimate"):
        out.append("price is an estimate")
    if e.get("calibration") == "uncalibrated family":
        out.append("uncalibrated family: no published measurement fits its efficiency factors")
    if e.get("beyond_trained_context"):
        out.append("context beyond the trained window")
    return "".join(f" [{m}]" for m in out)


def latency_text(e: dict, micro: str = "µ") -> str:
    """TTFT and TPOT as served (the TTFT percentile and arrival model where the entry states them)."""
    ttft = f"TTFT {si(e['ttft_s'], 's', micro=micro)}"
    if e.get("ttft_p90_s") is not None:
        ttft = f"TTFT p90 {si(e['ttft_p90_s'], 's', micro=micro)} (mean {si(e['ttft_s'], 's', micro=micro)})"
    arrival = f", {e['arrival']} arrivals" if e.get("arrival") else ""
    return f"{ttft}, TPOT {si(e['tpot_s'], 's', micro=micro)}{arrival}"


def answer_lines(e: dict, micro: str = "µ") -> list[str]:
    """A serving answer as an operator reads it, in four lines: mode and each pool (replicas x chips x layout x
    batch) with the GPUs in total and the formats; USD per request as deployed (and at the fluid pool ratio), per
    input and output million tokens, and the price kind; TTFT, TPOT, tokens/s per GPU and per user; what binds
    (and the budget or demand the deployment was sized for).
    """
    group = f" on {e['group']}" if e.get("group") else ""  # the deployment kind's group of systems
    head = (f"{e['model']} / {e['workload']}{group}: {e['serving']}, {deployment_text(e['pools'])}; "
            f"{formats_text(e)}{marks(e)}")
    fluid = e.get("usd_per_request_fluid")
    at_fluid = (f" ({_usd(fluid)} at the fluid pool ratio)" if fluid is not None
                and abs(fluid - e["usd_per_request"]) > 1e-12 * e["usd_per_request"] else "")
    cost = (f"{_usd(e['usd_per_request'])} USD per request as deployed{at_fluid}; {_usd(e['usd_per_mtok_input'])} "
            f"USD/Mtok input, {_usd(e['usd_per_mtok_output'])} USD/Mtok output; {e.get('price_kind', '')} prices")
    speed = (f"{latency_text(e, micro)}; {e['tokens_per_s_per_gpu']:,.4g} output tokens/s per GPU, "
             f"{e['tokens_per_s_per_user']:,.3g} per user")
    sized = []
    if e.get("budget"):
        sized.append(f"within {e['budget']}")
    if e.get("demand_tokens_per_s"):
        # a robust decision buys the replicas for the demand at each pool's throughput band's low end
        low = " at the low end of each pool's throughput band" if e.get("decide") == "robust" else ""
        sized.append(f"for {e['demand_tokens_per_s']:,.0f} output tokens/s{low}")
    binds = (f"what binds the batch: {e['binding']}" if e.get("binding") else
             f"what binds the decode step: {e.get('bound', '-')}")
    if sized:
        binds += f"; sized {' and '.join(sized)}"
    elif e["serving"] == "disaggregated" and "usd_per_request_fluid" in e:
        binds += "; the smallest whole deployment of the fluid optimum"
    return [head, cost, speed, binds]


def formats_text(e: dict) -> str:
    return f"{e['weights_dtype']} weights, {e['kv_dtype']} KV in {e['kv_tier']}"


ALTERNATIVE_COLUMNS = ("mode", "deployment", "USD/request", "USD/Mtok in", "USD/Mtok out", "TTFT", "TPOT",
                       "tok/s/GPU", "tok/s/user")


def ranked_at_fluid(e: dict) -> bool:
    """Whether the search compared deployments at the fluid pool ratio (no budget, no demand): their smallest whole
    deployments, which the figures as deployed describe, may then rank otherwise.
    """
    return not e.get("budget") and not e.get("demand_tokens_per_s") and "usd_per_request_fluid" in e


def alternatives_title(e: dict) -> str:
    """The heading of an entry's alternatives, saying how they were ranked."""
    return "alternatives: the next best deployments of each mode" + (
        ", ranked at the fluid pool ratio (USD/request: the smallest whole deployment's, as deployed; fluid "
        "in brackets)" if ranked_at_fluid(e) else "")


def alternative_rows(e: dict, micro: str = "µ") -> list[dict[str, str]]:
    """The entry's alternatives (``alternatives``: the next best deployments of each mode) as display cells."""
    fluid = ranked_at_fluid(e)
    return [{"mode": a["serving"], "deployment": a["layout"],
             "USD/request": _usd(a["usd_per_request"]) + (f" ({_usd(a['usd_per_request_fluid'])})" if fluid else ""),
             "USD/Mtok in": _usd(a["usd_per_mtok_input"]), "USD/Mtok out": _usd(a["usd_per_mtok_output"]),
             "TTFT": si(a["ttft_s"], "s", micro=micro), "TPOT": si(a["tpot_s"], "s", micro=micro),
             "tok/s/GPU": f"{a['tokens_per_s_per_gpu']:,.4g}", "tok/s/user": f"{a['tokens_per_s_per_user']:,.3g}"}
            for a in e.get("alternatives") or []]


def decision_text(e: dict) -> str | None:
    """Whether an optimum is decided, in a line (None for an entry that does not say): decided, its cost band
    clears the runner-up's; else the contenders to measure. The costs compared are those the search compared
    (as deployed for a budget or a demand, else at the fluid pool ratio).
    """
    if "decided" not in e:
        return None
    fluid = " at the fluid pool ratio" if e.get("budget") is None and e.get("demand_tokens_per_s") is None and (
        e.get("serving") == "disaggregated" and "usd_per_request_fluid" in e) else ""
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
    """The answer block: the kind's headline lines, then each optimum as an operator reads it (`answer_lines`),
    whether it is decided, and its alternatives.
    """
    parts = ["<section id='headline'><h2>Answer</h2>"]
    lines = []
    headline = getattr(study_module(kind), "headline", None)
    if headline:
        lines = headline(out.summary, out.frames)
    if lines:
        parts.append("<ul>" + "".join(f"<li>{html.escape(ln)}</li>" for ln in lines) + "</ul>")
    best = out.solved.best
    if best:
        rows = []
        for o in best:
            e = o.entry
            first, *rest = answer_lines(e)
            decided = decision_text(e)
            alts = alternative_rows(e)
            table = ""
            if alts:
                table = (f"<details><summary>{html.escape(alternatives_title(e).capitalize())}</summary>"
                         + table_html(Table.from_records(alts)) + "</details>")
            rows.append(f"<li><b>{html.escape(first)}</b><br>" + "<br>".join(html.escape(r) for r in rest)
                        + (f"<br>{html.escape(decided)}" if decided else "") + table + "</li>")
        parts.append("<ul class='optima'>" + "".join(rows) + "</ul>")
    if not lines and not best:
        parts.append("<p>No configuration was chosen: see the infeasible list below.</p>")
    parts.append("</section>")
    return "\n".join(parts)


COLORS = ("#3b7dd8", "#e07b39", "#59a14f", "#b07aa1", "#9c755f")
"""One colour per series of a chart, in order."""
FONT_PX = 12
"""The charts' font size; a character is taken as 0.62 of it wide (the width the margins leave for labels)."""


def log_ticks(lo: float, hi: float) -> list[float]:
    """Tick values on a log axis from ``lo`` to ``hi``: the decades, or with 2 and 5 between them, or 1.5, 2, 3, 5
    and 7, the first of these giving three ticks or more (else the ends).
    """
    a, b = math.floor(math.log10(lo)), math.ceil(math.log10(hi))
    found: list[float] = []
    for steps in ((1.0,), (1.0, 2.0, 5.0), (1.0, 1.5, 2.0, 3.0, 5.0, 7.0)):
        found = [m * 10.0 ** e for e in range(a, b + 1) for m in steps if lo <= m * 10.0 ** e <= hi]
        if len(found) >= 3:
            return found
    return found if len(found) >= 2 else [lo, hi]


AXIS_NAMES = {"tpot_s": "TPOT", "ttft_s": "TTFT", "usd_per_request": "USD per request as deployed",
              "usd_per_request_fluid": "USD per request at the fluid pool ratio",
              "tokens_per_s_per_user": "output tokens/s per user", "tokens_per_s_per_gpu": "output tokens/s per GPU"}
"""How a chart names the columns it plots."""


def _span(lo: float, hi: float) -> tuple[float, float]:
    """An axis range around [lo, hi] on a log scale: 15% beyond the data, and at least a factor of 3 wide (so that a
    few ticks fall inside even for a single point).
    """
    lo, hi = lo / 1.15, hi * 1.15
    if hi / lo < 3.0:
        mid = math.sqrt(lo * hi)
        lo, hi = mid / math.sqrt(3.0), mid * math.sqrt(3.0)
    return lo, hi


def _text_px(text: str) -> float:
    return 0.62 * FONT_PX * len(text)


def scatter_svg(table: Table, x: str, y: str, label: str, title: str, series: str | None = None,
                width: int = 720, height: int = 420) -> str:
    """A log-log scatter as inline SVG: ticks and grid lines on both axes, axis titles, a legend of ``series``
    (a colour each) and a hover tip per point (an SVG <title>, no script needed). The margins are sized to the
    longest tick label, so nothing is clipped.
    """
    xs, ys = numeric(table[x]), numeric(table[y])
    keep = np.isfinite(xs) & np.isfinite(ys) & (xs > 0) & (ys > 0)
    if not keep.any():
        return ""
    data = table.select([label] + ([series] if series else [])).take(keep).records()
    xs, ys = xs[keep], ys[keep]
    lo_x, hi_x = _span(float(xs.min()), float(xs.max()))
    lo_y, hi_y = _span(float(ys.min()), float(ys.max()))
    xt, yt = log_ticks(lo_x, hi_x), log_ticks(lo_y, hi_y)
    ylabels = [cell(y, v) for v in yt]
    groups = list(dict.fromkeys(r[series] for r in data)) if series else []
    legend_h = 22 if groups else 0
    left = int(max(_text_px(t) for t in ylabels) + FONT_PX * 2.5)
    right = int(max(20, _text_px(cell(x, xt[-1])) / 2 + 6))
    top, bottom = 12 + legend_h, int(FONT_PX * 3.5)
    lx0, lx1 = math.log10(lo_x), math.log10(hi_x)
    ly0, ly1 = math.log10(lo_y), math.log10(hi_y)

    def px(v: float) -> float:
        return left + (math.log10(v) - lx0) / max(lx1 - lx0, 1e-12) * (width - left - right)

    def py(v: float) -> float:
        return height - bottom - (math.log10(v) - ly0) / max(ly1 - ly0, 1e-12) * (height - top - bottom)

    # no tick label in the lower left corner, where the two axes' labels would meet
    xt = [v for v in xt if px(v) > left + FONT_PX] or xt
    yt = [v for v in yt if py(v) < height - bottom - FONT_PX] or yt
    ylabels = [cell(y, v) for v in yt]

    parts = [f"<rect x='{left}' y='{top}' width='{width - left - right}' height='{height - top - bottom}' "
             "fill='none' stroke='#444'/>"]
    for v in xt:
        parts.append(f"<line class='grid' x1='{px(v):.1f}' y1='{top}' x2='{px(v):.1f}' y2='{height - bottom}'/>"
                     f"<text class='tick' x='{px(v):.1f}' y='{height - bottom + FONT_PX + 4}' text-anchor='middle'>"
                     f"{html.escape(cell(x, v))}</text>")
    for v, t in zip(yt, ylabels, strict=True):
        parts.append(f"<line class='grid' x1='{left}' y1='{py(v):.1f}' x2='{width - right}' y2='{py(v):.1f}'/>"
                     f"<text class='tick' x='{left - 5}' y='{py(v) + FONT_PX / 3:.1f}' text-anchor='end'>"
                     f"{html.escape(t)}</text>")
    parts.append(f"<text class='axis' x='{(left + width - right) / 2:.1f}' y='{height - 8}' text-anchor='middle'>"
                 f"{html.escape(AXIS_NAMES.get(x, x))} (log scale)</text>")
    parts.append(f"<text class='axis' x='{FONT_PX + 2}' y='{(top + height - bottom) / 2:.1f}' "
                 f"transform='rotate(-90 {FONT_PX + 2} {(top + height - bottom) / 2:.1f})' text-anchor='middle'>"
                 f"{html.escape(AXIS_NAMES.get(y, y))} (log scale)</text>")
    at = left
    for k, g in enumerate(groups):  # the legend, above the plot
        color = COLORS[k % len(COLORS)]
        mid = top - legend_h / 2
        parts.append(f"<circle cx='{at + 5}' cy='{mid - 2:.1f}' r='4' fill='{color}'/><text class='legend' "
                     f"x='{at + 13}' y='{mid + 2:.1f}'>{html.escape(str(g))}</text>")
        at += 13 + _text_px(str(g)) + 18
    for r, vx, vy in zip(data, xs.tolist(), ys.tolist(), strict=True):
        color = COLORS[groups.index(r[series]) % len(COLORS)] if series else COLORS[0]
        tip = f"{r[label]}: {x} {cell(x, vx)}, {y} {cell(y, vy)}"
        parts.append(f"<circle class='pt' cx='{px(vx):.1f}' cy='{py(vy):.1f}' r='4' fill='{color}'>"
                     f"<title>{html.escape(tip)}</title></circle>")
    return (f"<figure class='chart'><figcaption>{html.escape(title)} (hover a point for its configuration)"
            f"</figcaption><svg xmlns='http://www.w3.org/2000/svg' width='{width}' height='{height}' "
            f"viewBox='0 0 {width} {height}' role='img' font-size='{FONT_PX}'>{''.join(parts)}</svg></figure>")


def chart_svg(chart: Chart, tables: dict[str, Table]) -> str:
    """One hover chart a kind declares, a panel per model and workload, drawn where its table has rows and both
    columns (else nothing).
    """
    table = tables.get(chart.table)
    if table is None or table.empty or chart.x not in table or chart.y not in table:
        return ""
    points = Table({chart.x: table[chart.x], chart.y: table[chart.y], "label": np.asarray(chart.label(table)),
                    "panel": np.asarray(chart.panel(table)), "series": np.asarray(chart.series(table))})
    panels = points["panel"]
    return "\n".join(scatter_svg(points.take(panels == panel), chart.x, chart.y, "label", f"{chart.title}: {panel}",
                                  "series") for panel in dict.fromkeys(panels.tolist()))


def interactive_charts(out: StudyOutput, kind: str) -> str:
    """The kind's hover charts (``CHARTS``) for the tables a person explores point by point."""
    charts = (chart_svg(c, out.tables) for c in getattr(study_module(kind), "CHARTS", ()))
    return "\n".join(c for c in charts if c)


STYLE = ("body{font-family:sans-serif;max-width:1100px;margin:2em auto;padding:0 1em}"
         "table{border-collapse:collapse;font-size:12px}td,th{border:1px solid #ccc;padding:2px 6px;white-space:nowrap;"
         "text-align:right}th{background:#f3f3f3}img{max-width:100%}.tbl{overflow-x:auto;max-width:100%}"
         "#headline{background:#f5f9ff;border:1px solid #b8cff5;padding:0.5em 1em;margin:1em 0}"
         ".estimate{color:#a15c00}circle.pt{opacity:0.8}circle.pt:hover{opacity:1;stroke:#000}"
         "line.grid{stroke:#e4e4e4}text.tick,text.legend{fill:#333}text.axis{fill:#111}"
         "figure.chart svg{border:1px solid #ddd;background:#fff;max-width:100%;height:auto}")
