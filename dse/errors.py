"""Error types that map to the command-line exit codes (2: bad input, 3: infeasible)."""

from __future__ import annotations

import difflib
import re
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
    """A URL fit to show: the password of its user info and every password-like query parameter as ``***``.

    The URL is parsed, not matched: the user info runs from ``://`` to the last ``@`` before the host, so a raw
    ``@``, ``:``, ``/``, ``?`` or ``#`` in a password is hidden with the rest of it; query keys are compared
    case-insensitively (``password``, ``passwd``, ``pwd``, ``secret``, ``token``, ``sslpassword``, ``api_key``
    ...). A secret that another parser (SQLAlchemy's) would split differently is hidden too. A string that does
    not parse as ``scheme://...`` is shown as its scheme only (``postgresql:***``).
    """
    parsed = _url_parts(url)
    if parsed is None:
        scheme = re.match(r"[A-Za-z][A-Za-z0-9+.\-]*:", url)
        if scheme:
            return scheme.group(0) + "***"
        return "***" if any(c in url for c in ":@?=") else url
    scheme, userinfo, location, query = parsed
    shown = scheme
    if userinfo is not None:
        user, _, password = userinfo.partition(":")
        shown += f"{user}:***@" if password else f"{userinfo}@"
    shown += location
    if query is not None:
        shown += "?" + "&".join(f"{pair.split('=', 1)[0]}=***" if _secret_pair(pair) else pair
                                for pair in query.split("&"))
    return _replace(shown, _secrets(url))


def mask_in(text: str, url: str) -> str:
    """``text`` with every secret the URL holds replaced by ``***`` wherever it appears (drivers echo them).

    The secrets are the password of the user info and the value of each password-like query parameter, each
    raw, percent-decoded and percent-encoded, and the pieces a parser that stops at an earlier ``@`` sees.
    """
    return _replace(text, _secrets(url))


_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.\-]*://")
_QUERY_PAIR = re.compile(r"[A-Za-z_][A-Za-z0-9_.\-]*(=.*)?|", re.S)
_SECRET_KEYS = ("pass", "pwd", "secret", "token", "key", "auth", "credential", "signature")
_SQLALCHEMY_URL = re.compile(r"[\w+]+://(?:(?P<user>[^:/]*)(?::(?P<password>[^@]*))?@)?"
                             r"(?P<host>\[[^/?]+\]|[^/:?]+)?(?::[^/?]*)?(?:/[^?]*)?(?:\?(?P<query>.*))?$", re.S)
_MIN_PIECE = 3
"""Pieces of a password split at a raw ``@`` are hidden from this length on (shorter ones would hide letters)."""


def _url_parts(url: str) -> tuple[str, str | None, str, str | None] | None:
    """``scheme://``, the user info (None when absent), host and path, the query (None when absent); None when
    ``url`` has no ``scheme://``. The query starts at the last ``?`` followed by ``key=value`` pairs only (a
    password may hold a ``?``).
    """
    m = _SCHEME.match(url)
    if m is None:
        return None
    rest, query = url[m.end():], None
    for i in reversed([i for i, c in enumerate(rest) if c == "?"]):
        pairs = rest[i + 1:].split("&")
        if all(_QUERY_PAIR.fullmatch(p) for p in pairs) and any("=" in p for p in pairs):
            rest, query = rest[:i], rest[i + 1:]
            break
    at = rest.rfind("@")
    if rest.startswith("/") or at < 0:
        return url[:m.end()], None, rest, query
    return url[:m.end()], rest[:at], rest[at + 1:], query


def _secret_pair(pair: str) -> bool:
    key, eq, value = pair.partition("=")
    return bool(eq and value) and any(k in key.lower() for k in _SECRET_KEYS)


def _secrets(url: str) -> list[str]:
    """Every secret ``url`` holds in every form worth hiding, longest first."""
    from urllib.parse import parse_qsl, quote, quote_plus, unquote, unquote_plus

    found: set[str] = set()  # hidden at any length
    pieces: set[str] = set()  # parts of a password: hidden from _MIN_PIECE characters on
    parsed = _url_parts(url)
    if parsed is None:  # not a URL: hide the whole text and each of its words
        found.add(url)
        pieces |= set(re.split(r"[:@/?#&=]", url))
    else:
        _, userinfo, _, query = parsed
        if userinfo and ":" in userinfo:
            password = userinfo.split(":", 1)[1]
            found.add(password)
            pieces |= set(password.split("@"))
        found |= {pair.split("=", 1)[1] for pair in (query or "").split("&") if _secret_pair(pair)}
    m = _SQLALCHEMY_URL.match(url)  # what SQLAlchemy hands the driver: the password ends at the first '@'
    if m:
        pieces.add(m["password"] or "")
        if "@" in (m["host"] or ""):  # the rest of a password with a raw '@', echoed as the host name
            found.add(m["host"])
        found |= {v for k, v in parse_qsl(m["query"] or "") if _secret_pair(f"{k}={v}")}
    found |= {p for p in pieces if len(p) >= _MIN_PIECE}
    forms = set()
    for s in found:
        forms |= {s, unquote(s), unquote_plus(s), quote(unquote(s), safe=""), quote_plus(unquote_plus(s))}
    return sorted((f for f in forms if f), key=len, reverse=True)


def _replace(text: str, secrets: list[str]) -> str:
    for secret in secrets:
        text = text.replace(secret, "***")
    return text
