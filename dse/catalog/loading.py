"""Loading of catalog YAML files: quantities with unit, source and date, validated once at load.

Each entity's fields are declared once (name, dimension, required, description); loading,
validation messages and the catalog tables are driven by that declaration.
"""

from __future__ import annotations

import datetime as _dt
import functools
import hashlib
import importlib.util
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from dse.catalog import cache
from dse.catalog.units import to_si
from dse.errors import InputError, close_names


@dataclass(frozen=True)
class FieldSpec:
    """Declaration of one catalog quantity: its dimension, whether required, what it means."""

    dimension: str
    required: bool
    description: str
    positive: bool = True


@dataclass(frozen=True)
class Quantity:
    """A catalog number as written (value, unit) with provenance, and its SI value."""

    value: float
    unit: str
    source: str
    date: str
    si: float
    note: str = ""
    kind: str = ""
    estimate: bool = False


QUANTITY_KEYS = ("value", "unit", "source", "date", "note", "kind", "estimate")


MAX_FILE_BYTES = 8_000_000
"""Largest catalog or study file read (bytes): far above any real one, so a wrong file fails fast."""
MAX_DEPTH = 32
"""Deepest nesting of mappings and lists accepted in a YAML file."""


@functools.cache
def _loader() -> type:
    """PyYAML's safe loader (its libyaml parser where PyYAML has one: some four times faster on the catalogs),
    except that a key given twice in one mapping is an error (not "last wins"). Made on first use: a document read
    back from the cache (`read_yaml`) imports no YAML library.
    """
    import yaml

    class UniqueKeyLoader(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):
        def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
            seen: dict = {}
            for key_node, _ in node.value:
                key = self.construct_object(key_node, deep=deep)
                try:
                    hash(key)
                except TypeError:
                    raise yaml.constructor.ConstructorError(None, None, f"unhashable key {key!r}",
                                                            key_node.start_mark) from None
                if key in seen:
                    raise _DuplicateKey(key, key_node.start_mark.line + 1, seen[key])
                seen[key] = key_node.start_mark.line + 1
            return super().construct_mapping(node, deep=deep)

    return UniqueKeyLoader


class _DuplicateKey(Exception):
    def __init__(self, key: object, line: int, first: int) -> None:
        super().__init__(key, line, first)
        self.key, self.line, self.first = key, line, first


def _depth(doc: Any) -> int:
    """Nesting depth of a parsed document (iterative: deep documents do not exhaust the stack)."""
    deepest, stack = 0, [(doc, 1)]
    while stack:
        node, d = stack.pop()
        if isinstance(node, dict):
            deepest = max(deepest, d)
            stack += [(v, d + 1) for v in node.values()]
        elif isinstance(node, list):
            deepest = max(deepest, d)
            stack += [(v, d + 1) for v in node]
        if deepest > MAX_DEPTH:
            break
    return deepest


def read_text(path: Path, max_bytes: int = MAX_FILE_BYTES) -> str:
    """A file's text: UTF-8 only, bounded in size; anything else is an InputError naming the file."""
    try:
        if path.stat().st_size > max_bytes:
            raise InputError(f"{path}: file of {path.stat().st_size:,} bytes; at most {max_bytes:,} are read")
        data = path.read_bytes()
    except OSError as exc:
        raise InputError(f"{path}: cannot read: {exc.strerror}") from None
    if b"\x00" in data:
        raise InputError(f"{path}: not a text file (it holds NUL bytes); expected UTF-8 text")
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise InputError(f"{path}: not UTF-8 text (byte {exc.start}); save the file as UTF-8") from None


def read_yaml(path: Path, keys: tuple[str, ...] | None = None) -> Any:
    """Parse a YAML file strictly: UTF-8, no duplicate keys, bounded size and nesting; every problem is an
    InputError naming the file (and the line where YAML tells it).

    With ``keys``, a document that is a mapping keeps those top-level keys alone: the others are parsed (a syntax
    error anywhere is still reported) but never built into Python objects, which is most of the cost of a large
    section the caller does not read.

    A document read before is read back from dse's cache (`dse.catalog.cache`), keyed by the file's text, ``keys``,
    this module's source and the YAML library's files: parsing the catalogs is most of the work of a small question
    after its imports. Only documents that parsed without a problem are kept, so every message above still comes.
    """
    text = read_text(path)
    k = _parse_key(text, keys)
    found = None if k is None else cache.lookup(f"yaml-{k}.pkl", k)
    if isinstance(found, tuple) and len(found) == 1:
        return found[0]
    doc = _parse(path, text, keys)
    if k is not None:
        cache.store(f"yaml-{k}.pkl", k, (doc,))
    return doc


PARSE_FORMAT = b"dse parsed yaml 1"
"""Changes whenever what `read_yaml` keeps changes shape."""


def _parse_key(text: str, keys: tuple[str, ...] | None) -> str | None:
    """The cache key of ``read_yaml(path, keys)`` on a file holding ``text`` (None: no cache, or no YAML library)."""
    if cache.cache_dir() is None:
        return None
    parser = _parser_files()
    if parser is None:
        return None
    h = hashlib.sha256(parser)
    h.update(b"\0keys\0" + repr(keys).encode() + b"\0text\0" + text.encode())
    return h.hexdigest()


@functools.cache
def _parser_files() -> bytes | None:
    """What a parse depends on besides the text, once per process: `PARSE_FORMAT`, this module's source and the YAML
    library's modules and compiled parser (name, size and modification time of each); None without the library.
    """
    spec = importlib.util.find_spec("yaml")
    if spec is None or spec.origin is None:
        return None
    out = [PARSE_FORMAT, Path(__file__).read_bytes()]
    for f in sorted(Path(spec.origin).parent.iterdir()):
        if f.suffix in (".py", ".so", ".pyd"):
            st = f.stat()
            out.append(f"{f.name} {st.st_size} {st.st_mtime_ns}".encode())
    return b"\0".join(out)


def _parse(path: Path, text: str, keys: tuple[str, ...] | None) -> Any:
    """`read_yaml`'s parse of ``text``, the contents of ``path``."""
    import yaml

    loader = _loader()(text)
    try:
        node = loader.get_single_node()
        if keys is not None and isinstance(node, yaml.MappingNode):
            node.value = [(k, v) for k, v in node.value if isinstance(k, yaml.ScalarNode) and k.value in keys]
        doc = None if node is None else loader.construct_document(node)
    except _DuplicateKey as dup:
        raise InputError(f"{path}: line {dup.line}: key '{dup.key}' given twice (first on line {dup.first}); "
                         "each key may appear once") from None
    except RecursionError:
        raise InputError(f"{path}: nested too deeply; at most {MAX_DEPTH} levels are read") from None
    except yaml.YAMLError as exc:
        if "nesting depth" in str(getattr(exc, "problem", "")):  # libyaml's own limit, below Python's stack
            raise InputError(f"{path}: nested too deeply; at most {MAX_DEPTH} levels are read") from None
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark is not None else ""
        raise InputError(f"{path}:{where}: not valid YAML: {getattr(exc, 'problem', exc)}") from None
    finally:
        loader.dispose()
    if _depth(doc) > MAX_DEPTH:
        raise InputError(f"{path}: nested too deeply; at most {MAX_DEPTH} levels are read")
    return doc


def check_keys(mapping: dict, allowed: list[str] | tuple[str, ...], where: str) -> None:
    """Reject unknown keys, naming the close allowed ones."""
    for key in mapping:
        if key not in allowed:
            close = close_names(str(key), allowed)
            hint = f"; did you mean {', '.join(close)}?" if close else ""
            raise InputError(f"{where}: unknown field '{key}'{hint} (allowed: {', '.join(allowed)})")


def parse_quantity(raw: Any, spec: FieldSpec, sources: dict, where: str) -> Quantity:
    """Validate one ``{value, unit, source, date}`` mapping and convert it to SI."""
    if not isinstance(raw, dict):
        raise InputError(f"{where}: expected a mapping with value, unit, source and date, got {raw!r}")
    check_keys(raw, QUANTITY_KEYS, where)
    for key in ("value", "unit", "source", "date"):
        if raw.get(key) is None:
            raise InputError(f"{where}: missing '{key}' (every quantity carries value, unit, source and date)")
    value = raw["value"]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise InputError(f"{where}: value must be a finite number, got {value!r}")
    if value < 0 or (spec.positive and value == 0):
        bound = "> 0" if spec.positive else ">= 0"
        raise InputError(f"{where}: value must be {bound}, got {value!r}")
    source = str(raw["source"])
    if source not in sources:
        close = close_names(source, sources)
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        raise InputError(f"{where}: unknown source '{source}'{hint} (declare it under 'sources:')")
    date = raw["date"]
    if isinstance(date, (_dt.date, _dt.datetime)):
        date = date.isoformat()
    si = to_si(value, str(raw["unit"]), spec.dimension, where)
    return Quantity(
        value=float(value),
        unit=str(raw["unit"]),
        source=source,
        date=str(date),
        si=si,
        note=str(raw.get("note") or ""),
        kind=str(raw.get("kind") or ""),
        estimate=bool(raw.get("estimate", False)) or source == "estimate",
    )


def parse_sources(doc: dict, path: Path) -> dict[str, dict]:
    """The ``sources:`` block: key -> {title, url, date}."""
    sources = doc.get("sources") or {}
    if not isinstance(sources, dict):
        raise InputError(f"{path}: 'sources' must be a mapping of key -> {{title, url, date}}")
    for key, src in sources.items():
        where = f"{path}: sources.{key}"
        if not isinstance(src, dict) or not src.get("title") or not src.get("date"):
            raise InputError(f"{where}: a source needs at least a title and a date")
        check_keys(src, ("title", "url", "date"), where)
    return sources


def parse_quantities(
    entry: dict, specs: dict[str, FieldSpec], sources: dict, where: str
) -> dict[str, Quantity]:
    """Parse every declared quantity of an entry; missing required ones are an error."""
    out: dict[str, Quantity] = {}
    for name, spec in specs.items():
        raw = entry.get(name)
        if raw is None:
            if spec.required:
                raise InputError(f"{where}: missing required field '{name}' ({spec.description})")
            continue
        out[name] = parse_quantity(raw, spec, sources, f"{where}: field '{name}'")
    return out


def _sub_model(root: type[BaseModel], loc: tuple) -> type[BaseModel] | None:
    """The pydantic model that holds the field at ``loc`` (list indices skipped)."""
    current: type[BaseModel] | None = root
    for part in loc:
        if isinstance(part, int) or current is None:
            continue
        field = current.model_fields.get(str(part))
        if field is None:
            return current
        options = list(getattr(field.annotation, "__args__", (field.annotation,)))
        for o in list(options):
            options += list(getattr(o, "__args__", ()))
        current = next((t for t in options if isinstance(t, type) and issubclass(t, BaseModel)), None)
    return current


def validation_message(exc: ValidationError, root: type[BaseModel], where: str) -> str:
    """One clear message for a pydantic error: the field, what is wrong, what is allowed."""
    # a misspelled key also makes its field "missing": name the unknown key first
    err = sorted(exc.errors(), key=lambda e: e["type"] != "extra_forbidden")[0]
    loc = ".".join(str(p) for p in err["loc"])
    if err["type"] == "extra_forbidden":
        parent = _sub_model(root, tuple(err["loc"][:-1]))
        allowed = list(parent.model_fields) if parent else []
        close = close_names(str(err["loc"][-1]), allowed)
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        return f"{where}: unknown field '{loc}'{hint} (allowed: {', '.join(allowed)})"
    if err["type"] == "missing":
        return f"{where}: missing required field '{loc}'"
    msg = err["msg"].removeprefix("Value error, ")
    got = err.get("input")
    shown = f" (got {got!r})" if got is not None and not isinstance(got, (dict, list)) else ""
    return f"{where}: field '{loc}': {msg}{shown}" if loc else f"{where}: {msg}"
