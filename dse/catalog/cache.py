"""Files dse keeps between runs so that work whose inputs did not change is not done again.

Each file holds one value under a key, the SHA-256 of everything the value is computed from: a parsed YAML document
(`dse.catalog.loading.read_yaml`, ``yaml-<key>.pkl``), the cross-validation of measured runs
(`dse.validate.cache`, ``validate-<key>.pkl``). Any change to any input is another key, so a stale value is never
read. `sources_digest` is the part of such keys every answer shares: dse's source and the catalogs.

The folder is ``$DSE_CACHE_DIR`` (empty: no cache), else ``$XDG_CACHE_HOME/dse``, else ``~/.cache/dse``. dse writes
there only files of the names above (each written to a temporary sibling, then linked to its name, so a reader never
sees half a file); it overwrites nothing and deletes nothing but its own temporary file. A file that cannot be read,
or holds another key, is ignored (and left in place); a folder that cannot be written leaves the value uncached.
"""

from __future__ import annotations

import hashlib
import os
import pickle
import platform
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

CACHE_ENV = "DSE_CACHE_DIR"
_off = 0
"""How many `disabled` blocks are open: none reads or writes the cache while one is."""


def cache_dir() -> Path | None:
    """Where values are kept: ``$DSE_CACHE_DIR`` (None where it is set empty, or inside `disabled`), else the user's
    cache folder.
    """
    if _off:
        return None
    given = os.environ.get(CACHE_ENV)
    if given is not None:
        return Path(given) if given else None
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "dse"


@contextmanager
def disabled() -> Iterator[None]:
    """No value read from or kept in the cache while the block runs (a command's ``--no-cache``)."""
    global _off
    _off += 1
    try:
        yield
    finally:
        _off -= 1


def lookup(name: str, key: str) -> object | None:
    """The value stored in the file ``name`` under ``key``, or None (no cache, no such file, or one that cannot be
    read as it, or holds another key).
    """
    folder = cache_dir()
    if folder is None:
        return None
    try:
        with (folder / name).open("rb") as fh:
            stored_key, value = pickle.load(fh)
    except Exception:  # absent, damaged or foreign: not a value
        return None
    return value if stored_key == key else None


def store(name: str, key: str, value: object) -> None:
    """Keep ``value`` under ``key`` in the file ``name`` (nothing where there is no cache, the file exists already,
    or the folder cannot be written).
    """
    folder = cache_dir()
    if folder is None:
        return
    f = folder / name
    if f.exists():  # kept before (the same value), or a file dse may not have written: left as it is
        return
    tmp = None
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile("wb", dir=folder, prefix=f".{name}.", delete=False) as fh:
            tmp = Path(fh.name)
            pickle.dump((key, value), fh, protocol=pickle.HIGHEST_PROTOCOL)
        os.link(tmp, f)  # whole, and never over a file that appeared meanwhile (FileExistsError)
    except OSError:
        pass
    finally:
        if tmp is not None:  # our own temporary name
            tmp.unlink(missing_ok=True)


PACKAGE = Path(__file__).resolve().parents[1]
"""dse's own source: its modules are part of every key."""


def _tree(h, folder: Path, suffixes: tuple[str, ...]) -> None:
    """Every file of ``folder`` with one of ``suffixes``, its path relative to the folder and its bytes, in a
    fixed order.
    """
    for f in sorted(p for p in folder.rglob("*") if p.is_file() and p.suffix in suffixes):
        h.update(str(f.relative_to(folder)).encode() + b"\0")
        h.update(f.read_bytes() + b"\0")


def sources_digest() -> str:
    """The SHA-256 of what every answer of dse is computed from besides its own inputs: dse's source, the hardware
    and model catalogs (as `hw_dir` and `model_dir` name them now) and the Python, numpy and pandas versions. A
    result stored under it (a cross-validation in `dse.validate.cache`, a sweep's points in
    `dse.studies.optuna_sweep`) is never read back once the catalog is refitted or the physics changes.
    """
    import numpy as np
    import pandas as pd

    from dse.catalog.hardware import hw_dir  # here, not at the top: the catalogs' loaders use this module
    from dse.catalog.models import model_dir

    h = hashlib.sha256(b"dse sources")
    h.update(f"{platform.python_version()} {np.__version__} {pd.__version__}".encode())
    _tree(h, PACKAGE, (".py",))
    _tree(h, hw_dir(), (".yaml", ".yml", ".csv", ".json"))
    _tree(h, model_dir(), (".yaml", ".yml", ".json"))
    return h.hexdigest()
