"""What `dse validate` reports and the files it writes: the published points' validation (validate.csv,
summary.json, scatter.png, report.html), the measured runs' (validate_runs.csv, summary.json, scatters,
report.html) with their summaries by category and partition, and the catalog's calibration (efficiency.yaml,
calibration/fitted.yaml).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from dse.catalog.calibration import families as hardware_families
from dse.catalog.hardware import Efficiency, default_efficiency_catalog
from dse.validate.calibration import Calibration
from dse.validate.factors import FACTOR, FACTORS, FITTED, stored_value
from dse.validate.points import Skipped
from dse.validate.runs import METRICS


# ---- the published points --------------------------------------------------------------------------------------------
@dataclass
class Validation:
    """Every published point with its prediction and errors, the summary by category, what was skipped."""

    table: pd.DataFrame
    summary: pd.DataFrame
    skipped: list[Skipped]
    families: list[dict] = field(default_factory=list)
    """Per hardware family and metric, the stored out-of-sample and leave-family-out errors and the band
    (`family_bands`)."""

    def as_dict(self) -> dict:
        clean = self.table.astype(object).where(self.table.notna(), None)
        return {
            "points": clean.to_dict(orient="records"),
            "summary": self.summary.to_dict(orient="records"),
            "families": self.families,
            "skipped": [{"case": s.case, "category": s.category, "reason": s.reason} for s in self.skipped],
        }


def family_bands(fitted: dict | None) -> list[dict]:
    """Per hardware family and metric (throughput, TPOT, TTFT) of the stored bands (`dse validate --bands`): the
    points or runs, the median absolute error out of sample (leave-one-out for throughput, leave-group-out for
    TPOT and TTFT) and with the family left out (the fits on the other families alone), and the band with its
    basis. Empty where no band is stored.
    """
    rows = []
    for metric, per in ((fitted or {}).get("bands") or {}).items():
        if not isinstance(per, dict):
            continue
        for fam, e in per.items():
            if fam == "default" or not isinstance(e, dict):
                continue
            own = next((v for k, v in e.items() if k.endswith("_median_abs_error")
                        and not k.startswith("leave_family_out")), None)
            rows.append({"family": fam, "metric": metric, "n": e.get("points", 0), "median_abs_error": own,
                         "leave_family_out_median_abs_error": e.get("leave_family_out_median_abs_error"),
                         "band": e.get("band"), "basis": e.get("basis", "")})
    return rows


def summarize(df: pd.DataFrame) -> pd.DataFrame:
    """Median and 90th-percentile absolute error by category (in-sample and leave-one-out)."""
    rows = []
    for cat, g in df.groupby("category"):
        row = {"category": cat, "points": len(g),
               "median_abs_error": float(g["error"].abs().median()),
               "p90_abs_error": float(g["error"].abs().quantile(0.9))}
        if "loo_error" in g:
            row["loo_median_abs_error"] = float(g["loo_error"].abs().median())
            row["loo_p90_abs_error"] = float(g["loo_error"].abs().quantile(0.9))
        rows.append(row)
    return pd.DataFrame(rows)


def write_validation_report(report: Validation, folder: Path) -> None:
    """validate.csv, summary.json, the predicted-vs-measured scatter and report.html (self-contained)."""
    import base64
    import html
    import json

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    report.table.to_csv(folder / "validate.csv", index=False)
    (folder / "summary.json").write_text(json.dumps(report.as_dict(), indent=2, default=float))
    fig, ax = plt.subplots(figsize=(7, 6))
    thr = report.table[report.table["category"] == "serving_throughput"]
    for fam, g in thr.groupby("family"):
        ax.scatter(g["measured"], g["predicted"], s=18, label=f"{fam}: calibrated")
        ax.scatter(g["measured"], g["ideal"], s=14, facecolors="none", edgecolors="grey", linewidths=0.6)
    lo, hi = thr[["measured", "predicted"]].min().min() / 1.5, thr[["measured", "ideal"]].max().max() * 1.5
    ax.plot([lo, hi], [lo, hi], "k-", lw=0.8)
    ax.plot([lo, hi], [lo * 1.15, hi * 1.15], "k:", lw=0.6)
    ax.plot([lo, hi], [lo / 1.15, hi / 1.15], "k:", lw=0.6)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("measured (tokens/s)")
    ax.set_ylabel("predicted (tokens/s); hollow: ideal roofline")
    ax.set_title("Serving throughput: predicted against measured (dotted: +-15%)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(folder / "scatter.png", dpi=110)
    plt.close(fig)
    img = base64.b64encode((folder / "scatter.png").read_bytes()).decode()
    parts = [
        "<!doctype html><html><head><meta charset='utf-8'><title>dse validate</title>",
        "<style>body{font-family:sans-serif;max-width:1100px;margin:2em auto}table{border-collapse:collapse;"
        "font-size:12px}td,th{border:1px solid #ccc;padding:2px 6px}img{max-width:100%}</style></head><body>",
        "<h1>Predictions against published measurements</h1>",
        "<p>Calibrated predictions use the factors of hw_catalog/efficiency.yaml; leave-one-out errors come from "
        "refitting without each point (hw_catalog/calibration/fitted.yaml).</p>",
        "<h2>Error by category</h2>", report.summary.to_html(index=False, float_format=lambda v: f"{v:.3f}"),
        "<h2>By hardware family: out of sample and with the family left out (the stored bands)</h2>",
        pd.DataFrame(report.families).to_html(index=False, float_format=lambda v: f"{v:.3f}")
        if report.families else "<p>no bands stored</p>",
        f"<h2>Predicted against measured</h2><img src='data:image/png;base64,{img}'>",
        "<h2>Every point</h2>", report.table.to_html(index=False, float_format=lambda v: f"{v:.4g}"),
        "<h2>Skipped</h2><ul>",
        *[f"<li>{html.escape(s.case)} ({s.category}): {html.escape(s.reason)}</li>" for s in report.skipped],
        "</ul></body></html>",
    ]
    (folder / "report.html").write_text("\n".join(parts))


# ---- measured serving runs -------------------------------------------------------------------------------------------
@dataclass
class RunsValidation:
    """Every mapped row with its predictions and errors; the fitted scales; what was skipped."""

    table: pd.DataFrame
    scales: dict[str, dict[str, float]]
    skipped: list[dict]
    given: int
    duplicates: list[dict] = field(default_factory=list)
    """Rows that repeat another row's measurement, read once (`dse.validate.runs.Runs.duplicates`)."""

    @property
    def measurements(self) -> int:
        """The distinct measurements given: the rows less the copies."""
        return self.given - len(self.duplicates)

    @property
    def coverage(self) -> float:
        return len(self.table) / self.measurements if self.measurements else 0.0

    def as_dict(self, worst: int = 20) -> dict:
        """The summary, the errors by partition, the fitted scales, the ``worst`` rows by leave-group-out error
        per metric and the skipped rows by reason (summary.json, ``dse validate --cases FILE.csv --json``).
        """
        from collections import Counter

        t = self.table
        reasons = Counter(s["reason"] for s in self.skipped)
        worst_rows = {}
        for m in METRICS:
            if t.empty:
                continue
            w = t.reindex(t[f"{m}_loo_error"].abs().sort_values(ascending=False).index[:worst])
            worst_rows[m] = w[["id", "model", "system", "backend", "mode", "isl", "osl", "concurrency",
                               f"measured_{m}_s", f"predicted_{m}_s", f"{m}_error", f"{m}_loo_error"]
                              ].to_dict("records")
        unknown = int((t["layout"] != "stated").sum()) if "layout" in t else 0
        return {"rows_given": self.given, "rows_duplicate": len(self.duplicates), "rows_predicted": len(t),
                "coverage": self.coverage, "rows_layout_unknown": unknown,
                "rows_layout_padded": int((t["layout"] == "padded").sum()) if "layout" in t else 0,
                "rows_layout_conflicting": int((t["layout"] == "conflicting").sum()) if "layout" in t else 0,
                "rows_no_concurrency": int((t["layout"] == "no_concurrency").sum()) if "layout" in t else 0,
                "coverage_stated_layout": (len(t) - unknown) / self.measurements if self.measurements else 0.0,
                "summary": summary(self),
                "rows_failing_the_memory_check": int((~t["fits"]).sum()) if "fits" in t else 0,
                "rows_admission_queued": int((t["admission_s"] > 0).sum()) if "admission_s" in t else 0,
                "partitions": partitions(self) if not t.empty else {},
                "families": families_left_out(self) if not t.empty else [], "scales": self.scales,
                "worst": worst_rows,
                "skipped": {"count": len(self.skipped), "by_reason": dict(reasons.most_common()),
                            "rows": self.skipped}}


CONCURRENCY_BANDS = (0, 8, 32, 128, 512, math.inf)


def _stats(err: pd.Series) -> dict:
    a = err.dropna().abs()
    return {"n": int(len(a)), "median_abs_error": float(a.median()) if len(a) else math.nan,
            "mape": float(a.mean()) if len(a) else math.nan,
            "p90_abs_error": float(a.quantile(0.9)) if len(a) else math.nan,
            "signed_median": float(err.dropna().median()) if len(a) else math.nan}


def _stated(t: pd.DataFrame) -> pd.DataFrame:
    """The rows that state their layout (every row of a table without the ``layout`` column)."""
    return t[t["layout"] == "stated"] if "layout" in t else t


def summary(v: RunsValidation) -> list[dict]:
    """Per category and metric: the shipped physics' errors, the leave-group-out one, and
    ``within_sweep_median_abs_error``, the leave-group-out error once each sweep's own median level is removed
    (the error of the shape across concurrency alone: the floor a better level for each sweep could reach),
    and for TPOT ``loo_family_factors_median_abs_error``, the leave-group-out error with one decode factor set
    per hardware family shared by the frameworks (`family_key`) instead of one per family and framework, and for
    TTFT ``leave_model_out_median_abs_error``, each row's TTFT through stack terms fitted without its model's rows
    (what a model measured on no run gets: its framework and mode's terms). The
    categories all, agg and disagg hold the rows that state their layout; ``layout_unknown`` the rows reported
    apart (``layout`` ``unknown`` or ``padded``; `dse.validate.run.validate_runs`: predicted by fits that never
    read them).
    """
    out = []
    t = v.table
    for cat in ("all", "agg", "disagg", "layout_unknown"):
        if cat == "layout_unknown":
            sub = t[t["layout"] != "stated"] if "layout" in t else t.iloc[:0]
        else:
            sub = _stated(t) if cat == "all" else _stated(t)[_stated(t)["mode"] == cat]
        for m in METRICS:
            if sub.empty:
                continue
            e = {"category": cat, "metric": m, **_stats(sub[f"{m}_error"]),
                 "loo_median_abs_error": float(sub[f"{m}_loo_error"].abs().median()),
                 "in_sample_median_abs_error": float(sub[f"{m}_in_sample_error"].abs().median()),
                 "ideal_median_abs_error": float(sub[f"{m}_ideal_error"].abs().median()),
                 "within_sweep_median_abs_error": float(sub[f"{m}_within_sweep_error"].abs().median())}
            if m == "tpot":
                e["loo_family_factors_median_abs_error"] = float(sub["tpot_loo_family_error"].abs().median())
            elif "ttft_lmo_error" in sub:
                e["leave_model_out_median_abs_error"] = float(sub["ttft_lmo_error"].abs().median())
            out.append(e)
    return out


def _band(c: float) -> str:
    for lo, hi in zip(CONCURRENCY_BANDS[:-1], CONCURRENCY_BANDS[1:], strict=True):
        if lo < c <= hi:
            return f"{lo + 1}-{hi:g}" if math.isfinite(hi) else f">{lo}"
    return "?"


def partitions(v: RunsValidation) -> dict[str, list[dict]]:
    """Median absolute errors (shipped physics and leave-group-out) of the rows that state their layout by
    system x mode, model, framework, mode, ISL/OSL and concurrency band, and of every row by how its layout is known
    (``layout``: ``stated``; ``unknown``, a disaggregated row without worker counts, predicted apart on the
    smallest deployment of its worker sizes; ``padded``, an attention TP that does not divide the heads beside a
    stated attention DP, read with the heads padded and predicted apart).
    """
    t = v.table.assign(isl_osl=v.table["isl"].astype(str) + "/" + v.table["osl"].astype(str),
                       concurrency_band=v.table["concurrency"].map(_band),
                       system_mode=v.table["system"] + " " + v.table["mode"])
    out = {}
    for by in ("system_mode", "model", "backend", "mode", "isl_osl", "concurrency_band", "layout"):
        rows = []
        for key, g in (t if by == "layout" else _stated(t)).groupby(by, sort=True):
            row = {by: key, "n": len(g)}
            for m in METRICS:
                row[f"{m}_median_abs_error"] = float(g[f"{m}_error"].abs().median())
                row[f"{m}_loo_median_abs_error"] = float(g[f"{m}_loo_error"].abs().median())
            rows.append(row)
        out[by] = rows
    return out


def families_left_out(v: RunsValidation) -> list[dict]:
    """Per hardware family (the system where it has none), of the rows that state their layout: the frameworks,
    the leave-group-out and the leave-family-out median absolute errors of TPOT and TTFT (leave-family-out: the
    family's rows predicted by the fits on the other families' rows, the error of a family with no runs).
    """
    from dse.validate.runs import family_key

    t = _stated(v.table)
    rows = []
    for fam, g in t.groupby(family_key(t), sort=True):
        row = {"family": fam, "n": len(g), "frameworks": ", ".join(sorted(g["backend"].astype(str).unique()))}
        for m in METRICS:
            row[f"{m}_loo_median_abs_error"] = float(g[f"{m}_loo_error"].abs().median())
            lfo = g[f"{m}_lfo_error"].dropna() if f"{m}_lfo_error" in g else pd.Series(dtype=float)
            row[f"{m}_lfo_median_abs_error"] = float(lfo.abs().median()) if len(lfo) else math.nan
            row[f"{m}_lfo_signed_median"] = float(lfo.median()) if len(lfo) else math.nan
        rows.append(row)
    return rows


def _factor_rows(fits: dict) -> list[dict]:
    """The fitted decode factors as report rows: shares of a peak as fractions, latencies in us, half-performance
    lengths in rows and tokens, and those no row identifies marked as the catalog's.
    """
    def cell(name: str, value: float, fitted: bool) -> str:
        f = FACTOR[name]
        text = (f"{value:.3f}" if f.kind == "share" else f"{value * f.per_si:.1f} {f.unit}" if f.kind == "time"
                else f"{value:,.0f} {f.unit}")
        return text if fitted else f"{text} (catalog)"

    rows = []
    for key, f in fits.items():
        every = {**f["fitted"], **f["kept_from_catalog"]}
        rows.append({"key": key, **{n: cell(n, every[n], n in f["fitted"]) for n in FACTORS}})
    return rows


SCATTER_MARGINS = {"left": 0.11, "right": 0.97, "bottom": 0.09, "top": 0.94}
"""The scatters' margins (shares of the figure), fixed: room for the tick labels and titles of a 7 x 6 in figure
without laying the text out twice."""


def write_runs_report(v: RunsValidation, folder: Path, doc: dict | None = None, plots: bool = True) -> list[str]:
    """validate_runs.csv, summary.json, predicted-vs-measured scatters (log-log; with ``plots``) and report.html;
    ``doc``: ``v.as_dict()`` where the caller has it already.
    """
    import base64
    import html
    import json

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    doc = v.as_dict() if doc is None else doc
    v.table.to_csv(folder / "validate_runs.csv", index=False)
    (folder / "summary.json").write_text(json.dumps(doc, indent=2, default=float))
    files = ["validate_runs.csv", "summary.json"]
    imgs = []
    if plots and not v.table.empty:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    for m in METRICS if plots else ():
        if v.table.empty:
            continue
        fig, ax = plt.subplots(figsize=(7, 6))
        fig.subplots_adjust(**SCATTER_MARGINS)
        for mode, g in v.table.groupby("mode"):
            pred = g[f"measured_{m}_s"] * (1 + g[f"{m}_loo_error"])
            ax.scatter(g[f"measured_{m}_s"] * 1e3, pred * 1e3, s=6, alpha=0.6, label=f"{mode} (leave-group-out)")
        lo = float(v.table[f"measured_{m}_s"].min() * 1e3 / 2)
        hi = float(v.table[f"measured_{m}_s"].max() * 1e3 * 2)
        ax.plot([lo, hi], [lo, hi], "k-", lw=0.8)
        for f in (1.25, 1 / 1.25):
            ax.plot([lo, hi], [lo * f, hi * f], "k:", lw=0.6)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel(f"measured {m.upper()} (ms)")
        ax.set_ylabel(f"predicted {m.upper()} (ms)")
        ax.set_title(f"{m.upper()}: predicted against measured (dotted: +-25%)")
        ax.legend(fontsize=8, loc="upper left")
        name = f"scatter_{m}.png"
        fig.savefig(folder / name, dpi=110)
        plt.close(fig)
        files.append(name)
        imgs.append((m, base64.b64encode((folder / name).read_bytes()).decode()))

    def table_html(rows: list[dict]) -> str:
        return pd.DataFrame(rows).to_html(index=False, float_format=lambda x: f"{x:.3f}") if rows else "<p>none</p>"

    parts = ["<!doctype html><html><head><meta charset='utf-8'><title>dse validate: measured serving runs</title>",
             "<style>body{font-family:sans-serif;max-width:1100px;margin:2em auto}table{border-collapse:collapse;"
             "font-size:12px}td,th{border:1px solid #ccc;padding:2px 6px}img{max-width:100%}</style></head><body>",
             "<h1>Measured serving runs: predicted TTFT and TPOT</h1>",
             f"<p>{len(v.table):,} of {v.measurements:,} measurements predicted (coverage {v.coverage:.1%}; "
             f"{v.given:,} rows, {len(v.duplicates):,} of them copies of another row's measurement, read once). "
             "Errors are predicted / "
             "measured - 1 with the catalog's calibrated physics; leave-group-out errors (the headline figure) "
             "leave the row's whole concurrency sweep out: TPOT refits the decode pass's efficiency factors per "
             "hardware family and framework on the other sweeps (the summary's loo_family_factors_median_abs_error "
             "shares one set per family among the frameworks); rows whose layout is unknown, padded or "
             "conflicting, or that state no concurrency (layout_unknown), are read by no fit and reported apart; "
             "TTFT is the "
             "optimizer's request-level physics in a closed loop at the row's concurrency (one prompt's prefill, "
             "plus a share of the wave of other requests in flight queued ahead of it, plus the KV hand-off, plus "
             "the serving stack's fixed latency), the stack's share and latency refitted per (framework, mode) on "
             "the other sweeps (the catalog's are in calibration/serving_stack.yaml).</p>",
             "<h2>Decode factors fitted on TPOT (in sample)</h2>",
             table_html(_factor_rows(v.scales.get("tpot", {}))),
             "<h2>Serving stacks' terms fitted on TTFT (in sample)</h2>",
             table_html([{"framework_mode": k, **f} for k, f in v.scales.get("ttft", {}).items()]),
             f"<p>{doc['rows_failing_the_memory_check']:,} measured runs fail dse's memory check (as the run's "
             "framework reserves HBM, its layout does not hold the weights, activations and the KV of every request "
             "in flight at its peak context, yet they ran): a framework that allocates KV as tokens are generated, "
             "or queues requests the pool cannot hold, runs them; or the framework reserves less than the catalog "
             "says; or the row's layout is unknown. "
             f"{doc['rows_admission_queued']:,} of them are predicted with the framework admitting what its KV pool "
             "holds (at the mean context where it admits on the prompt, at the peak where it reserves the whole "
             "completion) and the rest waiting in its queue: TPOT at the admitted batch, the queue's wait added to "
             "TTFT.</p>",
             "<h2>Summary</h2>", table_html(doc["summary"]),
             "<h2>By hardware family: leave-group-out and leave-family-out</h2>",
             "<p>Leave-family-out: each family's rows predicted by the decode factors per framework and the "
             "serving stacks' terms per framework and mode fitted on the other families' rows alone.</p>",
             table_html(doc["families"])]
    parts += [f"<h2>{m.upper()}</h2><img src='data:image/png;base64,{img}'>" for m, img in imgs]
    if not plots:
        parts.append("<p>Figures skipped (--no-plots): " + ", ".join(f"scatter_{m}.png" for m in METRICS) + "</p>")
    for by, rows in doc["partitions"].items():
        parts += [f"<h2>Error by {html.escape(by.replace('_', ' '))}</h2>", table_html(rows)]
    for m, rows in doc["worst"].items():
        parts += [f"<h2>Worst rows: {m.upper()} (leave-group-out)</h2>", table_html(rows)]
    parts += ["<h2>Skipped rows</h2><ul>",
              *[f"<li>{html.escape(r)}: {n}</li>" for r, n in doc["skipped"]["by_reason"].items()], "</ul>",
              "</body></html>"]
    (folder / "report.html").write_text("\n".join(parts))
    files.append("report.html")
    return files


# ---- the calibration, stored -----------------------------------------------------------------------------------------
def _yaml_number(value: float) -> str:
    """``value`` to 4 significant digits as YAML reads a number back (``1e-09`` without a point is a string to
    YAML 1.1: written ``1.0e-09``).
    """
    text = f"{value:.4g}"
    return text.replace("e", ".0e") if "e" in text and "." not in text else text


def _quantity(name: str, value: float, source: str, date: str, note: str) -> str:
    return (f'{{value: {_yaml_number(stored_value(name, value))}, unit: {FACTOR[name].unit}, source: {source}, '
            f'date: "{date}", note: "{note}"}}')


def _family_summary(cal: Calibration) -> dict:
    """Per fitted family: its systems, points, the factors fitted, and the in-sample and leave-one-out errors."""
    out = {}
    for fam in cal.families:
        g = cal.table[cal.table["family"] == fam]
        entry = {"systems": list(hardware_families()[fam]), "points": len(g),
                 "fitted_factors": list(cal.fitted_names.get(fam, FITTED)),
                 "median_abs_error": round(float(g["error"].abs().median()), 4)}
        if "loo_error" in g:
            entry["loo_median_abs_error"] = round(float(g["loo_error"].abs().median()), 4)
        for cat, h in g.groupby("category"):
            entry[f"{cat}_points"] = len(h)
        out[fam] = entry
    return out


def write_calibration(cal: Calibration, cases_file: str, folder: Path, date: str) -> None:
    """Write efficiency.yaml (the factors the predictions use) and calibration/fitted.yaml (the errors)."""
    n = len(cal.table)
    summary = summarize(cal.table)
    thr = summary[summary["category"] == "serving_throughput"].iloc[0]
    rows = sum(r["rows"] for r in cal.runs.values())
    with_runs = f" and {rows:,} measured serving TPOTs ({cal.runs_file})" if rows else ""
    lines = [
        "# Efficiency factors: achieved fractions of each peak, and the fixed latencies a roofline leaves out.",
        "# `--ideal` sets every fraction to 1 and every latency to 0 (full overlap): the pure roofline.",
        "# Written by `dse validate --fit`: least squares on log(predicted / measured) over the published cases",
        "# (hw_catalog/calibration/cases.yaml), jointly with the decode passes of measured serving runs where a",
        "# family has them (their TPOTs identify the fixed times per collective, per layer and per MoE layer);",
        "# per-point and leave-one-out errors are in calibration/fitted.yaml.",
        "# `factors` apply to every system; `families` replace them for the systems they list. The `systems` lists are",
        "# the one definition of the hardware families (a family shares one set of fitted factors; `basis` says why);",
        "# `dse validate --fit` keeps them as they are and refits each family's factors.",
        "",
        "sources:",
        f'  dse_validate_fit: {{title: "Fit of dse validate --fit on {n} published measurements{with_runs}; '
        f'leave-one-out median absolute error {100 * thr["loo_median_abs_error"]:.1f}% on serving throughput", '
        f'url: "hw_catalog/calibration/fitted.yaml", date: "{date}"}}',
        f'  estimate: {{title: "Not identifiable from the cases; engineering estimate", url: "", date: "{date}"}}',
        "",
        "factors:",
    ]

    def block(eff: Efficiency, indent: str, note: str, fitted_here: tuple[str, ...], unfitted: str = "") -> list[str]:
        out = []
        for name in FACTOR:
            # a fixed time is fitted only where this block's own fit freed it, else it is the estimate
            fitted = name in FITTED or name in fitted_here
            lo, hi = FACTOR[name].bounds
            value = getattr(eff, name)
            at_bound = fitted and (abs(value - lo) < 1e-6 * max(hi, 1e-9) or abs(value - hi) < 1e-6 * max(hi, 1e-9))
            if name in fitted_here:
                why = f"{note}: {FACTOR[name].meaning}"
            elif fitted:
                why, at_bound = f"{unfitted}: {FACTOR[name].meaning}", False
            else:
                why = FACTOR[name].estimate
            why += " (at the bound of its range)" if at_bound else ""
            out.append(f"{indent}{name}: " + _quantity(name, value, "dse_validate_fit" if fitted else "estimate",
                                                       date, why))
        return out

    lines += block(cal.default, "  ", f"fitted on all {n} points", FITTED)
    lines += ["", "families:"]
    basis = default_efficiency_catalog().basis
    for fam, systems in hardware_families().items():  # every family stays defined, fitted or not
        lines += [f"  {fam}:", f"    systems: [{', '.join(systems)}]"]
        lines += [f"    basis: {json.dumps(basis[fam])}"] if basis.get(fam) else []
        if fam not in cal.families:
            lines += ["    factors: {}  # no point of this family: the global factors apply"]
            continue
        eff = cal.families[fam]
        count = int((cal.table["family"] == fam).sum())
        runs = cal.runs.get(fam, {}).get("rows", 0)
        lines += ["    factors:"]
        lines += block(eff, "      ", f"fitted on the {count} {fam} points"
                       + (f" and {runs:,} {fam} serving TPOTs" if runs else ""), cal.fitted_names.get(fam, FITTED),
                       f"not identified by the {count} {fam} points (too few points sensitive to it, collinear "
                       f"with the factors they fit, or a share fitted at the peak itself), so the global value")
    (folder / "efficiency.yaml").write_text("\n".join(lines) + "\n")

    calib = folder / "calibration"
    calib.mkdir(exist_ok=True)
    root = folder.resolve().parent
    cases_path = Path(cases_file).resolve()
    doc = {
        "fitted": date,
        "cases": str(cases_path.relative_to(root)) if cases_path.is_relative_to(root) else cases_file,
        "points": n,
        "rms_log_error": {k: round(v, 4) for k, v in cal.rms.items()},
        "summary": summary.round(4).to_dict(orient="records"),
        "band": {k: [round(lo, 4), round(hi, 4)] for k, (lo, hi) in cal.band.items()},
        "band_meaning": "10th and 90th percentile of measured / predicted (leave-one-out) on serving throughput: "
                        "a calibrated throughput T is read as [T x low, T x high]",
        "families": _family_summary(cal),
        "serving_runs": {"file": cal.runs_file, "meaning": "TPOT errors of the measured serving runs the fit used "
                         "(in sample: the factors were fitted on them; `dse validate --cases` on the file gives "
                         "the leave-sweep-out figures)", **cal.runs} if cal.runs else {},
        "table": cal.table.round(6).to_dict(orient="records"),
    }
    import yaml

    (calib / "fitted.yaml").write_text(yaml.safe_dump(doc, sort_keys=False, width=120))


def write_bands(bands: dict, folder: Path) -> None:
    """Set the ``bands`` section of ``folder``/calibration/fitted.yaml (`dse.validate.bands.compute_bands`), after
    ``band_meaning``; every other key is written back as it was read.
    """
    import yaml

    path = Path(folder) / "calibration" / "fitted.yaml"
    doc = yaml.safe_load(path.read_text())
    out = {}
    for key, value in doc.items():
        if key != "bands":
            out[key] = value
        if key == "band_meaning":
            out["bands"] = bands
    out.setdefault("bands", bands)
    path.write_text(yaml.safe_dump(out, sort_keys=False, width=120))


