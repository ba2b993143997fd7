"""A cache of `dse validate --cases` results, keyed by everything they are computed from.

Cross-validating measured runs refits the decode factors and the serving stacks once per left-out sweep (hundreds
of Nelder-Mead fits, about ten seconds of CPU on the 3,113 runs of the catalog's file); the result is a pure
function of the runs files' bytes, the catalogs' files, dse's own source and the versions of the numerical
libraries. `lookup` returns the result stored under the SHA-256 of all of them, `store` keeps one: a second run
of the same inputs reads it back instead of fitting again, and any change to any of them (a row of the CSV, a
factor of the catalog, a line of dse) is another key, so a stale result is never read.

The folder is ``$DSE_CACHE_DIR`` (empty: no cache), else ``$XDG_CACHE_HOME/dse``, else ``~/.cache/dse``. dse
writes there only files named ``validate-<key>.pkl`` (each written to a temporary sibling, then linked to its
name, so a reader never sees half a file); it overwrites nothing and deletes nothing but its own temporary file.
A file that cannot be read, or holds another key, is ignored (and left in place); a folder that cannot be written
leaves the result uncached.
"""

from __future__ import annotations

import hashlib
import os
import pickle
import platform
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd

from dse.catalog.hardware import hw_dir
from dse.catalog.models import model_dir

CACHE_ENV = "DSE_CACHE_DIR"
FORMAT = b"dse validate cache 1"
"""Changes whenever what is stored changes shape."""
PACKAGE = Path(__file__).resolve().parents[1]
"""dse's own source: its modules are part of every key."""


def cache_dir() -> Path | None:
    """Where results are kept: ``$DSE_CACHE_DIR`` (None where it is set empty), else the user's cache folder."""
    given = os.environ.get(CACHE_ENV)
    if given is not None:
        return Path(given) if given else None
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "dse"


def _tree(h, folder: Path, suffixes: tuple[str, ...]) -> None:
    """Every file of ``folder`` with one of ``suffixes``, its path relative to the folder and its bytes, in a
    fixed order.
    """
    for f in sorted(p for p in folder.rglob("*") if p.is_file() and p.suffix in suffixes):
        h.update(str(f.relative_to(folder)).encode() + b"\0")
        h.update(f.read_bytes() + b"\0")


def key(paths: list[Path]) -> str:
    """The SHA-256 of the inputs of `dse.validate.run.validate_file` on ``paths``: the files' bytes in order, the
    hardware and model catalogs, dse's source and the Python, numpy and pandas versions.
    """
    h = hashlib.sha256(FORMAT)
    h.update(f"{platform.python_version()} {np.__version__} {pd.__version__}".encode())
    _tree(h, PACKAGE, (".py",))
    _tree(h, hw_dir(), (".yaml", ".yml", ".csv", ".json"))
    _tree(h, model_dir(), (".yaml", ".yml", ".json"))
    for p in paths:
        h.update(b"input\0" + Path(p).read_bytes())
    return h.hexdigest()


def _file(k: str) -> Path | None:
    folder = cache_dir()
    return None if folder is None else folder / f"validate-{k}.pkl"


def lookup(k: str) -> object | None:
    """The result stored under ``k``, or None (no cache, no such file, or one that cannot be read as it)."""
    f = _file(k)
    if f is None or not f.is_file():
        return None
    try:
        with f.open("rb") as fh:
            stored_key, value = pickle.load(fh)
    except Exception:  # a damaged or foreign file is not a result: fit again
        return None
    return value if stored_key == k else None


def store(k: str, value: object) -> None:
    """Keep ``value`` under ``k`` (nothing where there is no cache or its folder cannot be written)."""
    f = _file(k)
    if f is None or f.exists():  # kept before (the same result), or a file dse may not have written: left as it is
        return
    tmp = None
    try:
        f.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile("wb", dir=f.parent, prefix=f".{f.name}.", delete=False) as fh:
            tmp = Path(fh.name)
            pickle.dump((k, value), fh, protocol=pickle.HIGHEST_PROTOCOL)
        os.link(tmp, f)  # whole, and never over a file that appeared meanwhile (FileExistsError)
    except OSError:
        pass
    finally:
        if tmp is not None:  # our own temporary name
            tmp.unlink(missing_ok=True)
