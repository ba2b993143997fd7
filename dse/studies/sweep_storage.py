"""The SQLite file a sweep keeps in its output folder: its name and the mark that makes it dse's.

Kept apart from `dse.studies.optuna_sweep` (which imports Optuna) so that the output layer can recognise the
file without importing Optuna on every run.
"""

from __future__ import annotations

import os
from pathlib import Path

STORAGE = "optuna.db"
"""The sweep's SQLite storage in the output folder (`dse run` without --storage)."""
STORAGE_APP_ID = 0x64736531
"""The SQLite ``application_id`` of every storage file `dse run` creates ("dse1"): how an output folder knows its
storage from a user's file of that name (dse.report.output)."""


def create_storage(path: Path) -> None:
    """Create the SQLite file of a storage at ``path``, marked with dse's application id, unless one is there."""
    import sqlite3  # here: a run that keeps no storage does not load SQLite

    if os.path.lexists(path):
        return
    con = sqlite3.connect(path)
    try:
        con.execute(f"PRAGMA application_id = {STORAGE_APP_ID}")
        con.commit()
    finally:
        con.close()
