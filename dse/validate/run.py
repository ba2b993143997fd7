"""A validation run: every point predicted with the stored factors, summarized and reported."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from dse.catalog.calibration import family_of, load_fitted
from dse.catalog.hardware import IDEAL
from dse.validate.cases import Cases, Skipped
from dse.validate.predict import predict, predict_training, summarize, table


# ---- the validation report -----------------------------------------------------------------------
@dataclass
class Validation:
    table: pd.DataFrame
    summary: pd.DataFrame
    skipped: list[Skipped]

    def as_dict(self) -> dict:
        clean = self.table.astype(object).where(self.table.notna(), None)
        return {
            "points": clean.to_dict(orient="records"),
            "summary": self.summary.to_dict(orient="records"),
            "skipped": [{"case": s.case, "category": s.category, "reason": s.reason} for s in self.skipped],
        }


def run_validation(cases: Cases, use_stored_loo: bool = True) -> Validation:
    """Predict every point with the catalog's calibrated factors; attach the stored leave-one-out errors."""
    pts = cases.points
    df = table(pts, predict(pts, None), predict(pts, IDEAL))
    df["family"] = [family_of(p.system) or "default" for p in pts]
    if cases.training:
        tr = cases.training
        tdf = pd.DataFrame({"case": [p.case for p in tr], "category": "training_mfu", "label": [p.label for p in tr],
                            "unit": [p.unit for p in tr], "measured": [p.measured for p in tr],
                            "predicted": predict_training(tr, None), "ideal": predict_training(tr, IDEAL)})
        tdf["error"] = tdf["predicted"] / tdf["measured"] - 1.0
        tdf["family"] = "training"
        df = pd.concat([df, tdf], ignore_index=True)
    fitted = load_fitted() if use_stored_loo else None
    if fitted:
        loo = {row["label"]: row.get("loo_predicted") for row in fitted["table"]}
        df["loo_predicted"] = [loo.get(label, np.nan) for label in df["label"]]
        df["loo_error"] = df["loo_predicted"] / df["measured"] - 1.0
    return Validation(df, summarize(df), cases.skipped)


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
        f"<h2>Predicted against measured</h2><img src='data:image/png;base64,{img}'>",
        "<h2>Every point</h2>", report.table.to_html(index=False, float_format=lambda v: f"{v:.4g}"),
        "<h2>Skipped</h2><ul>",
        *[f"<li>{html.escape(s.case)} ({s.category}): {html.escape(s.reason)}</li>" for s in report.skipped],
        "</ul></body></html>",
    ]
    (folder / "report.html").write_text("\n".join(parts))
