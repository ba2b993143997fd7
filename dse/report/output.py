"""The files a study run writes: summary.json, one CSV per table, PNG plots and report.html, all or nothing.

Outputs are written into a fresh folder beside the target, which then replaces the target in one
rename, so an interrupted or failed run leaves nothing half-written; a run never deletes or
overwrites a file it did not write (a marker file lists dse's own).
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


MARKER = ".dse-output.json"
"""The file that marks a folder as dse's output and lists the files dse wrote there."""
STORAGE_PREFIX = "optuna.db"


def _marker(target: Path) -> dict | None:
    path = target / MARKER
    if not path.is_file():
        return None
    try:
        doc = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None
    return doc if isinstance(doc, dict) and isinstance(doc.get("files"), list) else None


def own_files(target: Path) -> set[str]:
    """The names in ``target`` that dse wrote: the marker, the files it lists and the sweep storage."""
    marker = _marker(target)
    if marker is None:
        return set()
    names = {MARKER, *map(str, marker["files"])}
    names |= {p.name for p in target.iterdir() if p.name.startswith(STORAGE_PREFIX)}
    return names


def foreign_files(target: Path) -> list[str]:
    """Files (and folders) in ``target`` that dse did not write."""
    if not target.is_dir():
        return []
    ours = own_files(target)
    return sorted(p.name for p in target.iterdir() if p.name not in ours)


def _siblings(target: Path, tag: str) -> list[Path]:
    return sorted(target.parent.glob(f".{target.name}.dse-{tag}-*")) if target.parent.is_dir() else []


def recover(target: Path) -> None:
    """Finish or undo what a killed run left beside ``target``: a half-written new folder is removed; an old
    folder moved aside is put back when the new one never arrived, else removed.
    """
    for tmp in _siblings(target, "new"):
        shutil.rmtree(tmp, ignore_errors=True)
    for old in _siblings(target, "old"):
        if not target.exists():
            old.rename(target)
        else:
            shutil.rmtree(old, ignore_errors=True)


def prepare(target: Path, force: bool = False) -> None:
    """Check ``target`` before a run: a new folder, or one dse wrote, or (with ``force``) any folder, whose
    files dse did not write are then kept. Creates it with its marker, so a sweep can keep its storage there.
    """
    from dse.errors import InputError

    if target.exists() and not target.is_dir():
        raise InputError(f"--out {target}: exists and is not a folder")
    recover(target)
    foreign = foreign_files(target)
    if foreign and not force:
        shown = ", ".join(foreign[:5]) + (f" and {len(foreign) - 5} more" if len(foreign) > 5 else "")
        raise InputError(f"--out {target}: holds files dse did not write ({shown}); choose a new or empty folder, "
                         "or give --force to replace only dse's own files there")
    target.mkdir(parents=True, exist_ok=True)
    if _marker(target) is None:
        (target / MARKER).write_text(json.dumps({"files": []}))


def write_outputs(out: StudyOutput, spec: StudySpec, target: Path, force: bool = False) -> list[str]:
    """Write summary.json, one CSV per table, PNG plots and report.html; all or nothing.

    The files are written into a sibling folder, which then replaces ``target`` in one rename (a sweep's
    Optuna storage moves along); a file dse did not write is never deleted or overwritten. With ``force``
    and such files in ``target``, dse's own files are replaced there one by one and the others kept.
    """
    from dse.report.html import write_plots, write_report

    target = Path(target)
    prepare(target, force)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.dse-new-", dir=target.parent))
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
        (tmp / MARKER).write_text(json.dumps({"study": spec.study, "files": sorted(files)}))
        if foreign_files(target):  # --force: replace dse's own files, keep the others
            for name in own_files(target) - {MARKER} - set(files):
                if not name.startswith(STORAGE_PREFIX):
                    (target / name).unlink(missing_ok=True)
            for name in [*files, MARKER]:
                (tmp / name).replace(target / name)
        else:
            for storage in target.glob(f"{STORAGE_PREFIX}*"):
                storage.rename(tmp / storage.name)
            old = target.parent / f".{target.name}.dse-old-{tmp.name.rsplit('-', 1)[-1]}"
            target.rename(old)
            tmp.rename(target)
            shutil.rmtree(old, ignore_errors=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return sorted(files)
