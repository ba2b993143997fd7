"""Error types that map to the command-line exit codes (2: bad input, 3: infeasible)."""

from __future__ import annotations

import difflib
from collections.abc import Iterable


class InputError(ValueError):
    """Bad input: a file, field or option holds a value that is not allowed (exit code 2)."""

    exit_code = 2


class InfeasibleError(RuntimeError):
    """A study has no feasible configuration; the message names the binding resource (exit code 3)."""

    exit_code = 3


class SolverLimitError(RuntimeError):
    """The solver reached its time limit without a solution: no answer, yet no proof that there is none; the
    message names the solver, its limit and what to change (exit code 1).
    """

    exit_code = 1


def close_names(name: str, allowed: Iterable[str], n: int = 3) -> list[str]:
    """Return up to ``n`` names from ``allowed`` that look like ``name``."""
    allowed = list(allowed)
    low = name.lower()
    contains = [a for a in allowed if low in a.lower()]  # "gb200" -> "gb200-nvl72"
    similar = difflib.get_close_matches(name, allowed, n=n, cutoff=0.5)
    out: list[str] = []
    for a in contains + similar:
        if a not in out:
            out.append(a)
    return out[:n]


def unknown_name_message(kind: str, name: str, allowed: Iterable[str]) -> str:
    """Message for an unknown id: the close names if any, else every allowed one."""
    allowed = sorted(allowed)
    close = close_names(name, allowed)
    if close:
        return f"unknown {kind} '{name}'; did you mean: {', '.join(close)}? (allowed: {', '.join(allowed)})"
    return f"unknown {kind} '{name}'; allowed: {', '.join(allowed)}"


def mask_url(url: str) -> str:
    """A URL fit to show: its password (``scheme://user:password@host``) replaced by ``***``."""
    import re

    return re.sub(r"(?<=://)([^:/@]*):([^@/]*)@", r"\1:***@", url)


def mask_in(text: str, url: str) -> str:
    """``text`` with the URL's password, wherever it appears, replaced by ``***``."""
    import re

    m = re.search(r"://[^:/@]*:([^@/]*)@", url)
    return text.replace(m.group(1), "***") if m and m.group(1) else text
