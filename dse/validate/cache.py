"""A cache of `dse validate --cases` results, keyed by everything they are computed from.

Cross-validating measured runs refits the decode factors and the serving stacks once per left-out sweep (some 300
decode-factor fits; with the physics of every row and the report, about 4.5 s of CPU on the 3,113 runs of the
catalog's file); the result is a pure function of the runs files' bytes, the catalogs' files, dse's own source and
the versions of the numerical libraries. `lookup` returns the result stored under the SHA-256 of all of them,
`store` keeps one: a second run of the same inputs reads it back instead of fitting again, and any change to any of
them (a row of the CSV, a factor of the catalog, a line of dse) is another key, so a stale result is never read.

The files are ``validate-<key>.pkl`` in dse's cache folder (`dse.catalog.cache`: ``$DSE_CACHE_DIR``, empty for no
cache, else ``$XDG_CACHE_HOME/dse``, else ``~/.cache/dse``), written and read as that module says.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from dse.catalog import cache as files
from dse.catalog.cache import CACHE_ENV, cache_dir, sources_digest

__all__ = ["CACHE_ENV", "cache_dir", "key", "lookup", "sources_digest", "store"]

FORMAT = b"dse validate cache 1"
"""Changes whenever what is stored changes shape."""


def key(paths: list[Path]) -> str:
    """The SHA-256 of the inputs of `dse.validate.run.validate_file` on ``paths``: the files' bytes in order and
    `sources_digest`.
    """
    h = hashlib.sha256(FORMAT)
    h.update(sources_digest().encode())
    for p in paths:
        h.update(b"input\0" + Path(p).read_bytes())
    return h.hexdigest()


def lookup(k: str) -> object | None:
    """The result stored under ``k``, or None (no cache, no such file, or one that cannot be read as it)."""
    return files.lookup(f"validate-{k}.pkl", k)


def store(k: str, value: object) -> None:
    """Keep ``value`` under ``k`` (nothing where there is no cache or its folder cannot be written)."""
    files.store(f"validate-{k}.pkl", k, value)
