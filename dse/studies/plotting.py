"""Figure helpers for the study kinds' plots (matplotlib, drawn off-screen).

matplotlib is imported by the first figure drawn, never by importing a study kind, so that a run
without plots (`dse run --no-plots`, `dse.run` without ``out``) and every other command start
without it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dse.studies.contract import Plot, StudyOutput

__all__ = ["TIME_BREAKDOWN", "place_labels", "save", "spread", "subplots"]


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
    if not getattr(fig, "_dse_placed", False):  # a figure whose labels were placed keeps the layout they fit
        fig.tight_layout()
    fig.savefig(path, dpi=110)
    _pyplot().close(fig)


OFFSETS = [(r * dx, r * dy) for r in (6, 18, 36, 60, 90) for dx, dy in
           ((1, 1), (1, -1), (-1, 1), (-1, -1), (1, 0), (-1, 0), (0, 1), (0, -1))]
"""Where a label may sit from its point, in points: nearest first, each direction in turn."""


def place_labels(ax, xs, ys, texts: list[str], fontsize: float = 6, avoid=None) -> list:
    """Annotate points with labels that overlap neither each other nor the axes' edges: each label takes the
    nearest of `OFFSETS` (a leader line where it is not beside its point) whose box lies inside the axes and
    clear of every label placed before it, and of the points ``avoid`` ((x, y) data arrays) where it can; a
    label with no such place is left out. The figure is laid out before its first labels are placed (draw every
    panel first) and `save` keeps that layout. Returns the placed annotations.
    """
    import numpy as np

    fig = ax.figure
    if not getattr(fig, "_dse_placed", False):  # lay the figure out once, before its first label
        fig.tight_layout()
        fig._dse_placed = True
    renderer = fig.canvas.get_renderer()
    inside = ax.get_window_extent(renderer).padded(-2)
    dots = ax.transData.transform(np.column_stack(avoid)) if avoid is not None else np.zeros((0, 2))
    taken: list = []
    placed = []
    for x, y, text in zip(xs, ys, texts, strict=True):
        for (dx, dy), clear in ((o, c) for c in (True, False) for o in OFFSETS):  # clear of the points, then not
            if clear and not len(dots):
                continue
            near = abs(dx) + abs(dy) <= 12
            ann = ax.annotate(text, (x, y), xytext=(dx, dy), textcoords="offset points", fontsize=fontsize,
                              ha="left" if dx > 0 else "right" if dx < 0 else "center",
                              va="bottom" if dy > 0 else "top" if dy < 0 else "center",
                              bbox={"boxstyle": "round,pad=0.2", "fc": "white", "ec": "#888", "alpha": 0.9},
                              arrowprops=None if near else {"arrowstyle": "-", "color": "#888", "lw": 0.6})
            box = ann.get_window_extent(renderer).padded(2)  # the text and its rounded frame
            covers = bool(((dots[:, 0] >= box.x0) & (dots[:, 0] <= box.x1) & (dots[:, 1] >= box.y0)
                           & (dots[:, 1] <= box.y1)).any())
            within = inside.x0 <= box.x0 and box.x1 <= inside.x1 and inside.y0 <= box.y0 and box.y1 <= inside.y1
            if within and not (clear and covers) and not any(box.overlaps(t) for t in taken):
                taken.append(box)
                placed.append(ann)
                break
            ann.remove()
    return placed


def spread(x, y, k: int) -> list[int]:
    """Indices of ``k`` points spread evenly along a curve (by arc length in log-log coordinates), ends included."""
    import numpy as np

    lx, ly = np.log10(np.asarray(x, dtype=float)), np.log10(np.asarray(y, dtype=float))
    if k <= 0 or not len(lx):
        return []
    step = np.hypot(np.diff(lx) / max(np.ptp(lx), 1e-12), np.diff(ly) / max(np.ptp(ly), 1e-12))
    arc = np.concatenate(([0.0], np.cumsum(step)))
    targets = np.linspace(0.0, arc[-1], min(k, len(lx)))
    return sorted({int(np.argmin(np.abs(arc - t))) for t in targets})


def _breakdown(out: StudyOutput, path: Path) -> None:
    best = out.frames["best"]
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
