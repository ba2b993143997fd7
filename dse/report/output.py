"""The files a study run writes: summary.json, one CSV per table, PNG plots and report.html, all or nothing.

Outputs are written into a fresh folder beside the target and moved into place at the end, so an
interrupted or failed run leaves nothing half-written.
"""

from __future__ import annotations

import json
import math
import shutil
import tempfile
from pathlib import Path

import numpy as np

from dse.studies.base import StudySpec
from dse.studies.common import StudyOutput


def _jsonable(obj):
    if isinstance(obj, dict):
        return {k: _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, (np.integer,)):
        return int(obj)
    if isinstance(obj, (np.floating, float)):
        f = float(obj)
        return None if math.isnan(f) or math.isinf(f) else f
    if isinstance(obj, np.bool_):
        return bool(obj)
    return obj


def write_outputs(out: StudyOutput, spec: StudySpec, target: Path) -> list[str]:
    """Write summary.json, one CSV per table, PNG plots and report.html; all or nothing.

    Files are written into a fresh folder and moved into ``target`` at the end; a sweep's Optuna
    storage (optuna.db) in ``target`` is kept.
    """
    from dse.report.html import write_plots, write_report

    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        files = []
        for name, table in out.tables.items():
            table.to_csv(tmp / f"{name}.csv", index=False)
            files.append(f"{name}.csv")
        plots = write_plots(out, spec, tmp)
        files += plots
        files.append("report.html")
        files.append("summary.json")
        out.summary["outputs"] = sorted(files)
        (tmp / "summary.json").write_text(json.dumps(_jsonable(out.summary), indent=2))
        write_report(out, spec, tmp, plots)
        target.mkdir(exist_ok=True)
        for old in target.iterdir():
            if old.is_file() and not old.name.startswith("optuna.db") and old.name not in files:
                old.unlink()
        for name in files:
            (tmp / name).replace(target / name)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return sorted(files)
