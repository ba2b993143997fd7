"""Figure helpers for the study kinds' plots (matplotlib, drawn off-screen).

matplotlib is imported by the first figure drawn, never by importing a study kind, so that a run
without plots (`dse run --no-plots`, `dse.run` without ``out``) and every other command start
without it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd

from dse.studies.contract import Plot, StudyOutput

__all__ = ["TIME_BREAKDOWN", "save", "subplots"]


def _pyplot():
    """The pyplot module on matplotlib's off-screen Agg back end, imported on first use."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def subplots(*args: Any, **kwargs: Any):
    """``matplotlib.pyplot.subplots``: a new figure and its axes."""
    return _pyplot().subplots(*args, **kwargs)


def save(fig, path: Path) -> None:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    _pyplot().close(fig)


def _breakdown(out: StudyOutput, path: Path) -> None:
    best: pd.DataFrame = out.tables["best"]
    labels = [f"{m}\n{w}\n{s}" for m, w, s in zip(best["model"], best["workload"], best["system"], strict=True)]
    fig, ax = subplots(figsize=(max(5, 1.6 * len(best)), 4))
    x = range(len(best))
    width = 0.27
    for i, (key, color) in enumerate((("compute_s", "#e07b39"), ("memory_s", "#3b7dd8"), ("comm_s", "#59a14f"))):
        ax.bar([v + (i - 1) * width for v in x], best[key] * 1e3, width, label=key.removesuffix("_s"), color=color)
    ax.set_xticks(list(x), labels, fontsize=7)
    ax.set_ylabel("time per decode step (ms)")
    ax.legend()
    ax.set_title("What binds the chosen configurations")
    save(fig, path)


TIME_BREAKDOWN = Plot("best", "time_breakdown.png", _breakdown, needs="step_s")
"""Compute, memory and communication time of each chosen configuration."""
