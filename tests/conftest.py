"""Session fixtures: the catalogs, and each shipped study run once with `dse run` (`shipped`)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import pytest
from helpers import dse

from dse.catalog.hardware import default_efficiency, default_systems
from dse.catalog.models import default_models

STUDIES = Path(__file__).resolve().parent.parent / "studies"
os.environ["DSE_CACHE_DIR"] = ""  # no test reads a result another computed (tests/test_validate_cache.py sets its own)


@pytest.fixture(scope="session")
def systems():
    return default_systems()


@pytest.fixture(scope="session")
def models():
    return default_models()


@pytest.fixture(scope="session")
def efficiency():
    return default_efficiency()


@dataclass(frozen=True)
class StudyRun:
    """One `dse run studies/<name>.yaml --out <out> --json` of a shipped study, shared by the session's tests.

    ``out`` is read-only for them: a test that changes outputs works on its own copy (`copy_to`).
    """

    name: str
    returncode: int
    stdout: str
    stderr: str
    out: Path

    @property
    def summary(self) -> dict:
        """summary.json, parsed afresh on each read (so no test sees another's edits)."""
        return json.loads((self.out / "summary.json").read_text())

    @property
    def files(self) -> list[str]:
        """The files the run wrote (summary.json's ``outputs``)."""
        return self.summary["outputs"]

    def table(self, name: str) -> pd.DataFrame:
        """The table ``name`` as written (``<name>.csv``)."""
        return pd.read_csv(self.out / f"{name}.csv")

    def copy_to(self, target: Path) -> Path:
        """A writable copy of the output folder at ``target``."""
        return Path(shutil.copytree(self.out, target))


def _fingerprint(folder: Path) -> dict[str, str]:
    """Every file under ``folder`` (none if it is missing): its path relative to it -> SHA-256 of its bytes."""
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()} if folder.is_dir() else {}


@pytest.fixture(scope="session")
def shipped(tmp_path_factory) -> Iterator[Callable[[str], StudyRun]]:
    """``shipped(name)``: the `StudyRun` of ``studies/<name>.yaml``, run as a user runs it on the first request
    of the session and shared by every later one (thread-safe, so a test may ask for several at once). At the
    end of the session every shared output folder must be as its run left it."""
    base = tmp_path_factory.mktemp("shipped")
    runs: dict[str, StudyRun] = {}
    written: dict[str, dict[str, str]] = {}
    locks: dict[str, threading.Lock] = {}
    guard = threading.Lock()

    def get(name: str) -> StudyRun:
        study = STUDIES / f"{name}.yaml"
        if not study.is_file():
            raise ValueError(f"no shipped study {name!r}; shipped: {sorted(p.stem for p in STUDIES.glob('*.yaml'))}")
        with guard:
            lock = locks.setdefault(name, threading.Lock())
        with lock:
            if name not in runs:
                out = base / name
                r = dse("run", str(study), "--out", str(out), "--json", timeout=900)
                runs[name] = StudyRun(name, r.returncode, r.stdout, r.stderr, out)
                written[name] = _fingerprint(out)
        return runs[name]

    yield get
    changed = {name: sorted({path for path, _ in set(before.items()) ^ set(_fingerprint(runs[name].out).items())})
               for name, before in written.items()}
    changed = {name: paths for name, paths in changed.items() if paths}
    assert not changed, f"tests wrote into the shared outputs of shipped studies (copy_to a tmp_path): {changed}"
