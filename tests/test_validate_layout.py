"""The layout of `dse.validate`: no import loop among its modules, one fitting module, one factor table."""

from __future__ import annotations

import ast
from dataclasses import fields
from pathlib import Path

from dse.catalog.hardware import CURVES, MEMORY_FIELDS, Efficiency
from dse.validate.factors import FACTOR, FACTORS, FITTED, FIXED_TIMES, RUN_FITTED, TABLE

PACKAGE = Path(__file__).resolve().parents[1] / "dse" / "validate"


def _name(path: Path) -> str:
    return "dse.validate" if path.name == "__init__.py" else f"dse.validate.{path.stem}"


def _imports(path: Path, modules: set[str]) -> set[str]:
    """The modules of ``modules`` an import statement of ``path`` names (top level and inside functions);
    ``from dse.validate import x`` names the submodule x where there is one, else the package."""
    package = "dse.validate"
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package if node.level else ""
            if node.level > 1:
                base = ".".join(package.split(".")[: 1 - node.level])
            base = ".".join(p for p in (base, node.module or "") if p)
            names = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
        else:
            continue
        out |= {n for n in names if n in modules}
    return out


def _graph(folder: Path) -> dict[str, set[str]]:
    paths = sorted(folder.glob("*.py"))
    modules = {_name(p) for p in paths}
    return {_name(p): _imports(p, modules) - {_name(p)} for p in paths}


def _cycle(graph: dict[str, set[str]]) -> list[str]:
    """One import loop of ``graph`` (the modules along it, the first repeated at the end), or [] if none."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str]:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt):], nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        state[node] = 2
        path.pop()
        return []

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return []


def test_no_import_loop_among_the_validate_modules():
    graph = _graph(PACKAGE)
    assert len(graph) > 5 and graph["dse.validate"]  # the package itself re-exports its modules
    assert not _cycle(graph), " -> ".join(_cycle(graph))


def test_the_loop_check_sees_a_loop(tmp_path):
    (tmp_path / "a.py").write_text("from dse.validate.b import x\n")
    (tmp_path / "b.py").write_text("def f():\n    from dse.validate import a\n    return a\n")
    (tmp_path / "c.py").write_text("from dse.validate.a import x\n")
    graph = _graph(tmp_path)
    assert graph == {"dse.validate.a": {"dse.validate.b"}, "dse.validate.b": {"dse.validate.a"},
                     "dse.validate.c": {"dse.validate.a"}}
    assert _cycle(graph) == ["dse.validate.a", "dse.validate.b", "dse.validate.a"]
    assert _cycle({"x": {"y"}, "y": set()}) == []


def test_fitting_happens_in_one_module():
    """Only `dse.validate.fit` runs an optimizer."""
    users = {_name(p) for p in PACKAGE.glob("*.py") if "scipy.optimize" in p.read_text()}
    assert users == {"dse.validate.fit"}


def test_every_fitted_factor_is_defined_once_in_the_table():
    names = [f.name for f in TABLE]
    assert len(names) == len(set(names)) == len(FACTOR)
    assert set(names) == {f.name for f in fields(Efficiency)} - set(MEMORY_FIELDS)  # those the framework sets
    assert RUN_FITTED == (*FIXED_TIMES, *CURVES)
    never = {f.name for f in TABLE if f.fitted_on == "none"}
    assert never == {"kernel_overlap"} and set(FITTED) | set(RUN_FITTED) | never == set(names)
    for f in TABLE:
        lo, hi = f.bounds
        assert lo <= hi and f.meaning and f.unit
        assert bool(f.term) == (f.log_range is not None) == (f.name in FACTORS)
        assert bool(f.estimate) == (f.name in RUN_FITTED or f.name in never)
        assert bool(f.probe) == (f.name in RUN_FITTED)  # a share of a pass is read, not probed
