"""The report's PNG figures read without effort: the labels of the Pareto fronts and the sensitivity sweep lie
inside their axes and clear of each other (their boxes as matplotlib lays them out), one model per panel."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest


def _drawn(monkeypatch, module, draw, out) -> object:
    """The figure ``draw`` makes from ``out``, kept instead of saved."""
    kept = {}
    monkeypatch.setattr(module, "save", lambda fig, path: kept.setdefault("fig", fig))
    draw(out, None)
    return kept["fig"]


def _clear(fig) -> int:
    """Every annotation of the figure lies inside its axes and clear of the others; returns how many there are."""
    renderer = fig.canvas.get_renderer()
    boxes = []
    for ax in fig.axes:
        inside = ax.get_window_extent(renderer)
        for text in ax.texts:
            box = text.get_window_extent(renderer)
            assert inside.x0 <= box.x0 and box.x1 <= inside.x1 and inside.y0 <= box.y0 and box.y1 <= inside.y1, (
                text.get_text())
            assert not any(box.overlaps(b) for b in boxes), text.get_text()
            boxes.append(box)
    return len(boxes)


@pytest.mark.parametrize("front", ["cost", "throughput"])
def test_pareto_labels_are_inside_and_apart(shipped, monkeypatch, front):
    from dse.studies import pareto

    r = shipped("pareto_latency_cost")
    tables = {name: r.table(name) for name in ("pareto", "pareto_throughput")}
    fig = _drawn(monkeypatch, pareto, pareto._cost if front == "cost" else pareto._throughput,
                 SimpleNamespace(frames=tables, summary=r.summary))
    assert len(fig.axes) == tables["pareto"][["model", "workload"]].drop_duplicates().shape[0]  # a panel each
    assert _clear(fig) >= 4
    assert all(ax.get_legend() is not None and ax.get_xticks().size and ax.get_yticks().size for ax in fig.axes)


def test_sweep_labels_are_inside_and_apart(shipped, monkeypatch):
    from dse.studies import sweep

    r = shipped("hbm_bandwidth_sensitivity")
    tables = {"sweep": r.table("sweep"), "sweep_systems": r.table("sweep_systems")}
    fig = _drawn(monkeypatch, sweep, sweep._sweep, SimpleNamespace(frames=tables, summary=r.summary))
    assert _clear(fig) >= 4


def test_crowded_labels_never_overlap():
    """Twelve labels on points bunched in a corner: those placed are inside the axes and apart; the rest are left out
    rather than drawn over each other."""
    from dse.studies.plotting import place_labels, subplots

    rng = np.random.default_rng(5)
    fig, ax = subplots(figsize=(6, 4))
    x, y = 1 + rng.random(12) * 0.1, 1 + rng.random(12) * 0.1
    ax.plot([1, 10], [1, 10], alpha=0)
    ax.plot(x, y, "o")
    placed = place_labels(ax, x, y, [f"configuration number {i}" for i in range(12)], avoid=(x, y))
    assert 1 <= len(placed) < 12
    assert _clear(fig) == len(placed)


def test_report_rows_are_the_frames_records():
    """`Table.records` of a DataFrame gives what ``DataFrame.to_dict(orient="records")`` gives, value for value and type for type, on the
    column types of the study tables (so report.html's cells are unchanged)."""
    import pandas as pd

    from dse.report.present import table_html
    from dse.table import as_table

    frame = pd.DataFrame({"chips": [8, 16, 24], "usd_per_request": [1e-3, float("nan"), 2.5],
                          "fits": [True, False, True], "system": ["h200", None, "b200"],
                          "layout": [[1, 2], None, ("a", 3.0)], "n": pd.array([1, None, 3], dtype="Int64")})
    for table in (frame, frame.head(0), frame[[]], frame.iloc[[2, 0]]):
        mine, theirs = as_table(table).records(), table.to_dict(orient="records")
        assert [list(r) for r in mine] == [list(r) for r in theirs]
        for a, b in zip(mine, theirs, strict=True):
            for key in a:
                assert type(a[key]) is type(b[key]) and (a[key] == b[key] or a[key] is b[key]
                                                         or (a[key] != a[key] and b[key] != b[key])), key
    assert "<td>–</td>" in table_html(frame) and "<td>1 – 2</td>" in table_html(frame)
