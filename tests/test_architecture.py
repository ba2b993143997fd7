"""The layers of the code base, the study-kind registry, the public Python API and a light start-up."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml
from helpers import dse as dse_cli  # `dse` here is the package

import dse
from dse.studies.registry import KINDS, study_module

ROOT = Path(__file__).resolve().parent.parent
# Data flows from the top of this list to the bottom: a module may import its own layer or a layer above.
LAYERS = (("dse.errors", "dse.table"), "dse.catalog", "dse.physics", ("dse.optimize", "formulations"), "dse.validate",
          "dse.studies", "dse.report", ("dse.cli", "dse"))


def _rank(module: str) -> int | None:
    best = None
    for i, layer in enumerate(LAYERS):
        for prefix in (layer,) if isinstance(layer, str) else layer:
            if module == prefix or module.startswith(prefix + "."):
                if best is None or len(prefix) > best[1]:
                    best = (i, len(prefix))
    return None if best is None else best[0]


def _module_name(path: Path, root: Path = ROOT) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path, root: Path = ROOT) -> list[tuple[int, str]]:
    """Every module an import statement names (top level and inside functions), with its line; ``path`` lies
    under ``root`` (the repository, or a copy of its layout)."""
    tree = ast.parse(path.read_text())
    module = _module_name(path, root)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                name = ".".join(base + ([node.module] if node.module else []))
            else:
                name = node.module or ""
            out.append((node.lineno, name))
            out += [(node.lineno, f"{name}.{a.name}") for a in node.names if _rank(f"{name}.{a.name}") is not None
                    and name in ("dse", "formulations")]
    return out


def _sources() -> list[Path]:
    return sorted(p for d in ("dse", "formulations") for p in (ROOT / d).rglob("*.py"))


def test_no_module_imports_from_a_lower_layer():
    wrong = []
    for path in _sources():
        own = _rank(_module_name(path))
        assert own is not None, path
        for line, name in _imports(path):
            rank = _rank(name)
            if rank is not None and rank > own:
                wrong.append(f"{path.relative_to(ROOT)}:{line} imports {name} (layer {rank} > {own})")
    assert not wrong, "\n".join(wrong)


def test_the_layer_check_sees_a_wrong_import(tmp_path):
    assert _rank("dse.physics.roofline") < _rank("dse.optimize.space") < _rank("dse.studies.base")
    assert _rank("formulations.kv_tiering") == _rank("dse.optimize.solver")
    bad = tmp_path / "dse" / "physics" / "_probe_for_test.py"  # the repository's layout, outside the source tree
    bad.parent.mkdir(parents=True)
    bad.write_text("def f():\n    from dse.studies.base import StudySpec\n    return StudySpec\n")
    own = _rank(_module_name(bad, tmp_path))
    assert any(_rank(n) > own for _, n in _imports(bad, tmp_path))


def test_formulations_are_reached_only_through_optimize():
    """Studies, reports and the command line reach the mixed-integer programs through `dse.optimize`."""
    above = [p for p in _sources() if _module_name(p).startswith(("dse.studies", "dse.report", "dse.cli"))]
    assert any(_module_name(p) == "dse.cli" for p in above)
    wrong = [f"{p.relative_to(ROOT)}:{line} imports {name}" for p in above for line, name in _imports(p)
             if name == "formulations" or name.startswith("formulations.")]
    assert not wrong, "\n".join(wrong)


def test_no_private_name_is_imported_from_another_module():
    """A name shared between modules is public: no `from dse.x import _name` (nor `formulations`)."""
    wrong = []
    for path in _sources():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(("dse", "formulations")):
                wrong += [f"{path.relative_to(ROOT)}:{node.lineno} imports {node.module}.{a.name}"
                          for a in node.names if a.name.startswith("_") and not a.name.startswith("__")]
    assert not wrong, "\n".join(wrong)


def test_every_kind_module_has_its_parts_and_every_study_file_a_kind():
    for kind, name in KINDS.items():
        module = study_module(kind)
        assert module.__name__ == name
        for attr in ("Spec", "solve", "PLOTS", "USES_STORAGE", "WORKERS"):
            assert hasattr(module, attr), f"{name} lacks {attr}"
        assert module.Spec.model_fields["kind"].annotation is str
    for path in (ROOT / "studies").glob("*.yaml"):
        assert yaml.safe_load(path.read_text())["kind"] in KINDS, path
    defined = {p.stem for p in (ROOT / "dse" / "studies").glob("*.py") if "\nclass Spec(" in p.read_text()}
    assert defined == {n.rpartition(".")[2] for n in KINDS.values()}


def test_a_block_of_another_kind_is_refused(tmp_path):
    doc = yaml.safe_load((ROOT / "studies" / "cheapest_1m_context.yaml").read_text())
    doc["pareto"] = {"max_points": 5}
    with pytest.raises(dse.InputError, match="unknown field 'pareto'"):
        dse.load_study(doc)


def test_public_api_evaluate_matches_the_frame_and_the_cli():
    one = dse.evaluate(model="llama-3.1-70b", system="h100", tp=8, batch=64, context=4096, ideal=True)
    frame = pd.DataFrame([
        {"model": "llama-3.1-70b", "system": "h100", "tp": 8, "batch": 64, "context": 4096},
        {"model": "deepseek-v3", "system": "gb200-nvl72", "ep": 72, "batch": 4096, "context": 8192,
         "weights_dtype": "fp8", "kv_dtype": "fp8", "prompt": 2000},
        {"model": "llama-3.1-8b", "system": "h100", "batch": 1, "context": 2048, "phase": "prefill"},
    ])
    ideal = dse.evaluate_frame(frame, ideal=True)
    assert len(ideal) == 3 and ideal.loc[0, "step_s"] == pytest.approx(one["step_s"], rel=1e-12)
    assert ideal.loc[0, "bound"] == one["bound"] and ideal.loc[0, "tp"] == 8
    calibrated = dse.evaluate_frame(frame)
    for i, row in frame.iterrows():
        cfg = {k: v for k, v in row.items() if pd.notna(v)}
        cfg = {k: int(v) if isinstance(v, float) and v == int(v) else v for k, v in cfg.items()}
        single = dse.evaluate(**cfg)
        for key in ("step_s", "tokens_per_s", "usd_per_mtok", "ttft_s", "hbm_bytes_per_chip"):
            assert calibrated.loc[i, key] == pytest.approx(single[key], rel=1e-12), (i, key)
    r = dse_cli("evaluate", "--model", "llama-3.1-70b", "--system", "h100", "--tp", "8", "--batch", "64", "--context",
                "4096", "--ideal", "--json")
    assert r.returncode == 0 and abs(json.loads(r.stdout)["step_s"] / one["step_s"] - 1) < 1e-12


def test_public_api_errors_carry_the_cli_message():
    with pytest.raises(dse.InputError) as api:
        dse.evaluate(model="llama-3.1-70b", system="h100", tp=3, batch=1, context=10)
    r = dse_cli("evaluate", "--model", "llama-3.1-70b", "--system", "h100", "--tp", "3", "--batch", "1", "--context",
                "10")
    assert r.returncode == 2 and str(api.value) in " ".join(r.stderr.split())
    with pytest.raises(dse.InputError, match="row 1"):
        dse.evaluate_frame(pd.DataFrame([{"model": "llama-3.1-8b", "system": "h100", "batch": 1, "context": 10},
                                         {"model": "llama-3.1-8b", "system": "h1000", "batch": 1, "context": 10}]))
    with pytest.raises(dse.InputError, match="field 'workloads'"):
        dse.load_study({"study": "x", "kind": "cheapest", "description": "d", "expect": "e", "models": ["llama-3.1-8b"]})


def test_version_imports_nothing_heavy():
    code = ("import sys; sys.argv = ['dse', '--version']; from dse.cli import main; main(); "
            "print(sorted({m.split('.')[0] for m in sys.modules} & "
            "{'numpy', 'pandas', 'matplotlib', 'ortools', 'optuna', 'pyomo', 'scipy', 'pydantic', 'yaml'}))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.splitlines() == [f"dse {dse.__version__}", "[]"], r.stdout + r.stderr
