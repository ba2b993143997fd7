"""The parsed-YAML cache of `read_yaml`: a document read again comes back equal without parsing, any change of the
text is another key, a file that fails to parse is never kept, and files dse did not write are left alone."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from dse.catalog import cache, loading
from dse.catalog.hardware import hw_dir
from dse.errors import InputError

DOC = "a: 1\nb: {when: 2024-05-01, list: [1.5, x, null]}\n"


@pytest.fixture
def folder(tmp_path, monkeypatch):
    f = tmp_path / "cache"
    monkeypatch.setenv(cache.CACHE_ENV, str(f))
    return f


@pytest.fixture
def parses(monkeypatch):
    """The parses `read_yaml` makes (the cache's misses)."""
    calls = []
    parse = loading._parse

    def counted(path, text, keys):
        calls.append(path)
        return parse(path, text, keys)

    monkeypatch.setattr(loading, "_parse", counted)
    return calls


def test_a_document_read_again_comes_back_equal_without_parsing(tmp_path, folder, parses):
    path = tmp_path / "doc.yaml"
    path.write_text(DOC)
    first = loading.read_yaml(path)
    second = loading.read_yaml(path)
    assert second == first and second is not first and len(parses) == 1
    assert len(list(folder.glob("yaml-*.pkl"))) == 1
    # another selection of keys, another text: other keys, parsed again
    assert loading.read_yaml(path, keys=("a",)) == {"a": 1}
    path.write_text(DOC.replace("1.5", "2.5"))
    assert loading.read_yaml(path)["b"]["list"][0] == 2.5
    assert len(parses) == 3 and len(list(folder.glob("yaml-*.pkl"))) == 3


def test_the_catalogs_read_back_equal_what_they_parse(folder):
    for name in ("systems.yaml", "efficiency.yaml", "frameworks.yaml"):
        parsed = loading.read_yaml(hw_dir() / name)
        assert loading.read_yaml(hw_dir() / name) == parsed


def test_a_file_that_fails_to_parse_is_never_kept(tmp_path, folder):
    path = tmp_path / "bad.yaml"
    path.write_text("a: 1\na: 2\n")
    for _ in range(2):
        with pytest.raises(InputError, match="line 2: key 'a' given twice"):
            loading.read_yaml(path)
    assert not folder.exists() or not any(folder.iterdir())


def test_a_damaged_or_foreign_file_under_the_key_is_ignored_and_left_alone(tmp_path, folder, parses):
    path = tmp_path / "doc.yaml"
    path.write_text(DOC)
    expected = loading.read_yaml(path)
    (kept,) = folder.glob("yaml-*.pkl")
    kept.write_bytes(b"not a pickle")
    assert loading.read_yaml(path) == expected and len(parses) == 2
    assert kept.read_bytes() == b"not a pickle"  # never overwritten
    assert [p.name for p in folder.iterdir()] == [kept.name]  # no temporary file left behind


def test_no_cache_keeps_nothing(tmp_path, monkeypatch, parses):
    monkeypatch.setenv(cache.CACHE_ENV, "")
    path = tmp_path / "doc.yaml"
    path.write_text(DOC)
    loading.read_yaml(path)
    loading.read_yaml(path)
    assert len(parses) == 2
    monkeypatch.setenv(cache.CACHE_ENV, str(tmp_path / "cache"))
    with cache.disabled():
        loading.read_yaml(path)
    assert len(parses) == 3 and not (tmp_path / "cache").exists()


def test_a_question_asked_again_imports_no_yaml_library(tmp_path):
    """`dse run` in a fresh process twice on one study: the second reads every document back from the cache."""
    study = tmp_path / "study.yaml"
    study.write_text(json.dumps({
        "study": "again", "kind": "cheapest", "description": "d", "expect": "e", "models": ["llama-3.1-8b"],
        "workloads": [{"name": "chat", "prompt": 2000, "output": 200, "ttft_max_s": 1.0, "tpot_max_s": 0.05}],
        "space": {"systems": ["h100"], "max_chips_per_stage": 1, "pp": [1], "max_racks": 1}}))
    code = ("import sys\nfrom dse.cli import main\nsys.argv = ['dse', 'run', sys.argv[1], '--no-plots', '--force', "
            "'--out', sys.argv[2]]\ntry:\n    main()\nexcept SystemExit as exc:\n    assert not exc.code, exc.code\n"
            "print('yaml' in sys.modules)\n")
    env = {**__import__("os").environ, cache.CACHE_ENV: str(tmp_path / "cache")}
    seen, outputs = [], []
    for i in range(2):
        r = subprocess.run([sys.executable, "-c", code, str(study), str(tmp_path / f"out{i}")], capture_output=True,
                           text=True, timeout=120, env=env)
        assert r.returncode == 0, r.stderr[-2000:]
        seen.append(r.stdout.strip().splitlines()[-1])
        outputs.append({p.name: p.read_bytes() for p in (tmp_path / f"out{i}").glob("*.csv")})
    assert seen == ["True", "False"]
    assert outputs[0] == outputs[1] and outputs[0]

