"""Reliability: a user's files are never destroyed, bad input is one clear exit 2, infeasible studies exit 3,
secrets are never printed; plus a fuzz suite over the study schema and the model catalog.

The fuzz cases are invalid by construction (a boolean, string, NaN, infinity or negative number where a
number goes, a number where text goes, a scalar where a list or mapping goes, an unknown key); each must
be refused with an InputError that names the file and the field. The counts of the last run are written
to fuzz_counts.json in pytest's base temporary folder (its path is printed: `pytest -s` shows it).
"""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path

import pytest
import yaml
from helpers import dse as dse_cli  # `dse` here is the package
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import dse
from dse.catalog.models import load_models
from dse.errors import InputError

ROOT = Path(__file__).resolve().parent.parent
STUDIES = {p.stem: yaml.safe_load(p.read_text()) for p in sorted((ROOT / "studies").glob("*.yaml"))}
KV = ROOT / "studies" / "kv_cache_tiers.yaml"  # a fast study (well under a second)
SMALL = ROOT / "tests" / "fixtures" / "small_sweep.yaml"
COUNTS: dict[str, int] = {}


def one_line(text: str) -> str:
    return " ".join(text.split())


# ---- output safety --------------------------------------------------------------------------------------
def test_a_folder_of_foreign_files_is_refused_and_force_keeps_them(tmp_path):
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "budget.xlsx").write_text("the user's budget")
    r = dse_cli("run", str(KV), "--out", str(docs))
    assert r.returncode == 2 and "budget.xlsx" in one_line(r.stderr) and "--force" in one_line(r.stderr)
    assert sorted(p.name for p in docs.iterdir()) == ["budget.xlsx"]
    r = dse_cli("run", str(KV), "--out", str(docs), "--force")
    assert r.returncode == 0, r.stderr
    assert (docs / "budget.xlsx").read_text() == "the user's budget" and (docs / "summary.json").exists()
    r = dse_cli("run", str(KV), "--out", str(docs), "--force")  # again: replaces only its own files
    assert r.returncode == 0 and (docs / "budget.xlsx").read_text() == "the user's budget"


@pytest.mark.parametrize("name", ["..", "../../x", "/tmp/x", ".hidden", "a/b", ""])
def test_study_names_must_be_plain(tmp_path, name):
    doc = copy.deepcopy(STUDIES["kv_cache_tiers"])
    doc["study"] = name
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(doc))
    r = dse_cli("run", str(path), cwd=tmp_path)
    assert r.returncode == 2 and "field 'study'" in one_line(r.stderr), r.stderr
    assert not (tmp_path / "results").exists()


# ---- bad input at the boundary --------------------------------------------------------------------------
@pytest.mark.parametrize(("text", "message"), [
    ("kind: cheapest\nkind: pareto\n", "key 'kind' given twice"),
    ("study: x\n" + "a: " + "[" * 1000 + "]" * 1000 + "\n", "nested too deeply"),
])
def test_yaml_problems_are_named(tmp_path, text, message):
    path = tmp_path / "s.yaml"
    path.write_text(text)
    r = dse_cli("run", str(path), cwd=tmp_path)
    assert r.returncode == 2 and message in one_line(r.stderr) and "Traceback" not in r.stderr


def test_yaml_read_for_some_keys_is_the_full_read_of_those_keys(tmp_path):
    """read_yaml(keys=...) builds the named top-level sections alone, equal to the full read's; a syntax error or a
    repeated key among the kept ones is still an InputError naming the file; the stored fit's bands read so."""
    from dse.catalog.calibration import load_fitted
    from dse.catalog.loading import read_yaml
    from dse.errors import InputError

    full = load_fitted()
    part = load_fitted(keys=("bands",))
    assert sorted(part) == ["band", "bands"] and part["band"] == full["band"] and part["bands"] == full["bands"]
    path = tmp_path / "f.yaml"
    path.write_text("a: {x: 1}\nb: [1, 2\n")
    with pytest.raises(InputError, match="not valid YAML"):
        read_yaml(path, keys=("a",))
    path.write_text("a: {x: 1, x: 2}\nb: 3\n")
    with pytest.raises(InputError, match="key 'x' given twice"):
        read_yaml(path, keys=("a",))
    assert read_yaml(path, keys=("b",)) == {"b": 3} and read_yaml(path, keys=("c",)) == {}


def test_binary_and_utf16_files_are_refused(tmp_path):
    for name, data in (("u16.yaml", yaml.safe_dump(STUDIES["kv_cache_tiers"]).encode("utf-16")),
                       ("bin.yaml", bytes(range(256)))):
        path = tmp_path / name
        path.write_bytes(data)
        r = dse_cli("run", str(path), cwd=tmp_path)
        assert r.returncode == 2 and "UTF-8" in r.stderr and "Traceback" not in r.stderr


@pytest.mark.parametrize(("mutate", "field"), [
    (lambda d: d["workloads"][0].update(prompt=True), "workloads.0.prompt"),
    (lambda d: d["workloads"][0].update(prompt="2000"), "workloads.0.prompt"),
    (lambda d: d["workloads"][0].update(tpot_max_s=math.nan), "workloads.0.tpot_max_s"),
    (lambda d: d["space"].update(max_racks=10**9), "space.max_racks"),
    (lambda d: d["space"].update(tp=[]), "space.tp"),
    (lambda d: d["space"].update(pp=[100000]), "space.pp.0"),
])
def test_bad_values_name_their_field(mutate, field):
    doc = copy.deepcopy(STUDIES["cheapest_1m_context"])
    mutate(doc)
    with pytest.raises(InputError, match=f"field '{field}'"):
        dse.load_study(doc)


def test_corrupt_model_catalog_names_the_model_and_field(tmp_path):
    text = (ROOT / "model_catalog" / "models.yaml").read_text()
    for old, new, field in (("d_model: 7168", "d_model: -8192", "d_model"),
                            ("n_kv_heads: 8", "n_kv_heads: 0", "attention.n_kv_heads")):
        (tmp_path / "models.yaml").write_text(text.replace(old, new, 1))
        r = dse_cli("catalog", "models", env={"DSE_MODEL_CATALOG": str(tmp_path)})
        assert r.returncode == 2 and f"field '{field}'" in one_line(r.stderr) and "Traceback" not in r.stderr


def test_validate_refuses_a_csv_and_a_malformed_case_file(tmp_path):
    (tmp_path / "some.csv").write_text("a,b\n1,2\n")
    (tmp_path / "bad.yaml").write_text("cases:\n  - id: trtllm_perf_overview_v1_llama33_70b\n    rows: [1]\n")
    for name in ("some.csv", "bad.yaml"):
        r = dse_cli("validate", "--cases", str(tmp_path / name), "--out", str(tmp_path / "v"))
        assert r.returncode == 2 and name in r.stderr and "Traceback" not in r.stderr


# ---- infeasibility is a result ----------------------------------------------------------------------------
def test_an_empty_space_exits_3_naming_the_rule(tmp_path):
    doc = copy.deepcopy(STUDIES["cheapest_1m_context"])
    doc["space"]["tp"] = [3]
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(doc))
    r = dse_cli("run", str(path), "--out", str(tmp_path / "o"))
    assert r.returncode == 3 and "no TP degree in space.tp [3]" in one_line(r.stderr)
    assert json.loads((tmp_path / "o" / "summary.json").read_text())["status"] == "infeasible"


def test_a_sweep_with_no_feasible_point_exits_3_without_plots(tmp_path):
    doc = yaml.safe_load(SMALL.read_text())
    doc["space"]["tp"] = [3]
    doc["sweep"]["factors"] = [0.5, 1.0]
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(doc))
    r = dse_cli("run", str(path), "--out", str(tmp_path / "o"))
    assert r.returncode == 3 and "design space is empty" in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "o" / "sweep.png").exists()


def test_a_node_without_nvme_has_no_nvme_tier():
    doc = copy.deepcopy(STUDIES["kv_cache_tiers"])
    doc["kv_tiers"]["nvme_drives"] = 0
    result = dse.run(doc)
    assert "nvme" not in set(result.tables["kv_tiers"]["tier"])


# ---- sweeps: edited factors resume; secrets stay secret ------------------------------------------------------
def test_an_edited_sweep_resumes_the_points_that_still_match(tmp_path):
    doc = yaml.safe_load(SMALL.read_text())
    doc["sweep"]["factors"] = [0.5, 1.0]
    first, second = tmp_path / "a.yaml", tmp_path / "b.yaml"
    first.write_text(yaml.safe_dump(doc))
    doc["sweep"]["factors"] = [0.5, 1.0, 2.0]
    second.write_text(yaml.safe_dump(doc))
    out = tmp_path / "o"
    assert dse_cli("run", str(first), "--out", str(out)).returncode == 0
    before = {row["factor"]: row["trial"] for row in json.loads(json.dumps(
        __import__("pandas").read_csv(out / "sweep.csv").to_dict(orient="records")))}
    r = dse_cli("run", str(second), "--out", str(out))
    assert r.returncode == 0, r.stderr
    after = __import__("pandas").read_csv(out / "sweep.csv").set_index("factor")["trial"].to_dict()
    assert set(after) == {0.5, 1.0, 2.0} and all(after[f] == t for f, t in before.items())


def test_storage_passwords_are_masked(tmp_path):
    r = dse_cli("run", str(SMALL), "--out", str(tmp_path / "o"), "--storage",
                "postgresql://bob:s3cr3t-pw@127.0.0.1:1/db")
    assert r.returncode == 2 and "s3cr3t-pw" not in r.stderr + r.stdout and "bob:***@" in r.stderr


def test_mask_url():
    from dse.errors import mask_in, mask_url

    assert mask_url("postgresql://u:p%40ss@h:5432/db") == "postgresql://u:***@h:5432/db"
    assert mask_url("sqlite:////tmp/x.db") == "sqlite:////tmp/x.db"
    assert mask_in("failed for u:pw@h (pw)", "postgresql://u:pw@h/db") == "failed for u:***@h (***)"


# ---- fuzz -----------------------------------------------------------------------------------------------
def _leaves(doc, path=()):
    if isinstance(doc, dict):
        yield path, doc
        for k, v in doc.items():
            yield from _leaves(v, (*path, k))
    elif isinstance(doc, list):
        yield path, doc
        for i, v in enumerate(doc):
            yield from _leaves(v, (*path, i))
    else:
        yield path, doc


def _invalid_for(value) -> list:
    """Values invalid by construction in place of ``value`` (whatever field holds it)."""
    if isinstance(value, bool):
        return [3, "yes", [True]]
    if isinstance(value, (int, float)):
        return [True, "12", math.nan, math.inf, -abs(value) - 1, [value]]
    if isinstance(value, str):
        return [12345, [value], {"x": 1}] + ([True] if value != "all" else [])
    if isinstance(value, list):
        return [{"x": 1}, 7]
    if isinstance(value, dict):
        return [[1, 2], 7]
    return []


def _set(doc, path, value):
    target = doc
    for part in path[:-1]:
        target = target[part]
    target[path[-1]] = value


@st.composite
def broken_studies(draw):
    name = draw(st.sampled_from(sorted(STUDIES)))
    doc = copy.deepcopy(STUDIES[name])
    leaves = [(p, v) for p, v in _leaves(doc) if p and p[0] not in ("description", "expect")]
    path, value = draw(st.sampled_from(leaves))
    if draw(st.booleans()) and isinstance(value, dict):
        value[draw(st.sampled_from(["zz_unknown", "Systems", "fooo"]))] = 1
        return name, doc, path, "unknown field"
    options = _invalid_for(value)
    if not options:
        return name, doc, path, None
    _set(doc, path, draw(st.sampled_from(options)))
    return name, doc, path, "field"


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(broken_studies())
def test_fuzzed_study_files_are_refused_with_a_named_field(case):
    name, doc, path, expected = case
    COUNTS["study_tried"] = COUNTS.get("study_tried", 0) + 1
    if expected is None:
        COUNTS["study_skipped"] = COUNTS.get("study_skipped", 0) + 1
        return
    try:
        dse.load_study(doc)
    except InputError as exc:
        message = str(exc)
        if path and isinstance(path[-1], str) and path[-1] not in message and expected != "unknown field":
            # the message may name the enclosing field (e.g. a list) rather than the leaf
            assert any(str(p) in message for p in path if isinstance(p, str)), (path, message)
        COUNTS["study_exit2"] = COUNTS.get("study_exit2", 0) + 1
    except Exception as exc:  # a traceback for the user
        COUNTS["study_traceback"] = COUNTS.get("study_traceback", 0) + 1
        raise AssertionError(f"{name} {path}: {type(exc).__name__}: {exc}") from None
    else:
        COUNTS["study_accepted_invalid"] = COUNTS.get("study_accepted_invalid", 0) + 1
        raise AssertionError(f"{name}: {path} accepted an invalid value")


MODELS_DOC = yaml.safe_load((ROOT / "model_catalog" / "models.yaml").read_text())


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                     HealthCheck.function_scoped_fixture])
@given(st.data())
def test_fuzzed_model_catalogs_are_refused_with_a_named_field(tmp_path, data):
    doc = copy.deepcopy(MODELS_DOC)
    i = data.draw(st.integers(0, len(doc["models"]) - 1))
    leaves = [(p, v) for p, v in _leaves(doc["models"][i]) if p and p[0] not in ("name", "source", "published_b")
              and not isinstance(v, (dict, list))]
    path, value = data.draw(st.sampled_from(leaves))
    options = _invalid_for(value)
    if isinstance(value, str):  # free text in a model is any string; its kind or a number field is not
        options = [12345]
    _set(doc["models"][i], path, data.draw(st.sampled_from(options)))
    COUNTS["models_tried"] = COUNTS.get("models_tried", 0) + 1
    folder = tmp_path / f"m{COUNTS['models_tried']}"
    folder.mkdir()
    (folder / "models.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    try:
        load_models(folder / "models.yaml")
    except InputError as exc:
        assert "models.yaml" in str(exc)
        COUNTS["models_exit2"] = COUNTS.get("models_exit2", 0) + 1
    except Exception as exc:
        COUNTS["models_traceback"] = COUNTS.get("models_traceback", 0) + 1
        raise AssertionError(f"{path}: {type(exc).__name__}: {exc}") from None
    else:
        COUNTS["models_accepted_invalid"] = COUNTS.get("models_accepted_invalid", 0) + 1
        raise AssertionError(f"model {i} {path} = {value!r} -> accepted an invalid value")


def test_zz_write_fuzz_counts(tmp_path_factory):
    path = tmp_path_factory.getbasetemp() / "fuzz_counts.json"
    path.write_text(json.dumps(COUNTS, indent=2, sort_keys=True))
    print(f"fuzz counts: {path}")


def test_an_edited_space_does_not_reuse_stale_sweep_answers():
    from dse.studies.optuna_sweep import points_of

    doc = yaml.safe_load(SMALL.read_text())
    before = {p.key for p in points_of(dse.load_study(doc))}
    doc["space"]["max_batch_per_rank"] = 128
    after = {p.key for p in points_of(dse.load_study(doc))}
    assert not before & after
    doc["space"]["max_batch_per_rank"] = 256
    doc["sweep"]["factors"] = [0.5, 4.0]
    edited = {p.factor: p.key for p in points_of(dse.load_study(doc))}
    assert edited[0.5] in before and edited[4.0] not in before  # same space: the old point is reused


def test_a_refitted_catalog_does_not_reuse_stale_sweep_answers(tmp_path, monkeypatch):
    """A sweep's storage keys each point by the catalogs and dse's source too (`sources_digest`): after `dse validate
    --fit` rewrites a factor, a rerun into the same folder solves every point again instead of returning the answers
    of the catalog it replaced."""
    import shutil

    from dse.catalog.hardware import hw_dir
    from dse.studies.optuna_sweep import points_of

    doc = yaml.safe_load(SMALL.read_text())
    before = {p.key for p in points_of(dse.load_study(doc))}
    copy = tmp_path / "hw"
    shutil.copytree(hw_dir(), copy)
    efficiency = copy / "efficiency.yaml"
    text = efficiency.read_text()
    assert "  compute_prefill: {value: 0.5892," in text
    efficiency.write_text(text.replace("  compute_prefill: {value: 0.5892,", "  compute_prefill: {value: 0.5,", 1))
    monkeypatch.setenv("DSE_HW_CATALOG", str(copy))
    after = {p.key for p in points_of(dse.load_study(doc))}
    assert before and len(after) == len(before) and not before & after
