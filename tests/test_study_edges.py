"""Study files at their edges: a path that is not a regular file is refused before it is opened (a FIFO would
block forever, a device never end), and no list of a study names the same thing twice (a repeated tornado
parameter doubled its rows and printed NaN elasticities; two KV-tier classes of one name were both placed).
"""

from __future__ import annotations

import copy
import os
from pathlib import Path

import pytest
import yaml
from helpers import dse
from typer.testing import CliRunner

from dse.cli import app
from dse.errors import InputError
from dse.studies.base import SEQUENCE_FIELDS, load_study

ROOT = Path(__file__).resolve().parent.parent
STUDIES = {p.stem: yaml.safe_load(p.read_text()) for p in sorted((ROOT / "studies").glob("*.yaml"))}


def one_line(text: str) -> str:
    return " ".join(text.split())


# ---- paths that are not regular files ---------------------------------------------------------------------
@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs on this platform")
def test_a_fifo_is_refused_without_blocking(tmp_path):
    fifo = tmp_path / "study.yaml"
    os.mkfifo(fifo)
    with pytest.raises(InputError, match=r"study\.yaml: is a FIFO \(named pipe\), not a regular file"):
        load_study(fifo)
    # the command line too, in a process of its own (a regression would block: the timeout ends it)
    r = dse("run", str(fifo), "--out", str(tmp_path / "out"), timeout=60)
    assert r.returncode == 2 and "is a FIFO (named pipe), not a regular file" in one_line(r.stderr)
    assert "Traceback" not in r.stderr and not (tmp_path / "out").exists()


@pytest.mark.parametrize(("path", "what"), [("/dev/null", "a character device"), ("/dev/zero", "a character device"),
                                            (".", "a folder")])
def test_devices_and_folders_are_refused(path, what, tmp_path):
    if not Path(path).exists():
        pytest.skip(f"{path} does not exist here")
    target = tmp_path if path == "." else Path(path)
    with pytest.raises(InputError, match=f"is {what}, not a regular file; a study is a YAML file"):
        load_study(target)
    r = CliRunner().invoke(app, ["run", str(target), "--out", str(tmp_path / "out")])
    assert r.exit_code == 2 and isinstance(r.exception, SystemExit)
    assert f"is {what}, not a regular file" in one_line(r.stderr)


def test_a_link_to_a_study_file_is_followed(tmp_path):
    link = tmp_path / "link.yaml"
    link.symlink_to(ROOT / "studies" / "kv_cache_tiers.yaml")
    assert load_study(link).study == "kv_cache_tiers"
    with pytest.raises(InputError, match="no such study file"):
        load_study(tmp_path / "missing.yaml")
    dangling = tmp_path / "dangling.yaml"
    dangling.symlink_to(tmp_path / "gone.yaml")
    with pytest.raises(InputError, match="dangling.yaml: no such study file"):
        load_study(dangling)


# ---- a thing named twice ----------------------------------------------------------------------------------
def _with(study: str, dotted: str, value) -> dict:
    doc = copy.deepcopy(STUDIES[study])
    *parents, last = dotted.split(".")
    node = doc
    for part in parents:
        node = node[int(part)] if isinstance(node, list) else node.setdefault(part, {})
    node[last] = value
    return doc


KV_CLASS = {"name": "hot", "prefix_tokens": 4000, "prefixes_kept": 10, "lifetime_s": 86400, "hits_per_s": 100,
            "ttft_s": 0.5}
REPEATS = [  # (study, field, value, the message's field and repeated value)
    ("tornado", "tornado.parameters", ["price", "price"], "field 'tornado.parameters': 'price' is given twice"),
    ("tornado", "tornado.parameters", ["flops", "price", "flops"], "'flops' is given twice (items 0 and 2)"),
    ("kv_cache_tiers", "kv_tiers.classes", [KV_CLASS, {**KV_CLASS, "prefix_tokens": 8000}],
     "field 'kv_tiers.classes': the name 'hot' is given twice (items 0 and 1)"),
    ("kv_cache_tiers", "models", ["llama-3.1-70b", "llama-3.1-70b"], "field 'models': 'llama-3.1-70b' is given twice"),
    ("kv_cache_tiers", "workloads", [{"name": "a", "prompt": 10, "output": 5}, {"name": "a", "prompt": 20, "output": 5}],
     "field 'workloads': the name 'a' is given twice"),
    ("tornado", "space.systems", ["h100", "b200", "h100"], "field 'space.systems': 'h100' is given twice"),
    ("tornado", "space.weights_dtypes", ["fp8", "fp8"], "field 'space.weights_dtypes': 'fp8' is given twice"),
    ("tornado", "space.tp", [1, 8, 8], "field 'space.tp': 8 is given twice"),
    ("disaggregated_vs_aggregated", "deployment.groups",
     [{"name": "g", "systems": ["h200"]}, {"name": "g", "systems": ["b200"]}],
     "field 'deployment.groups': the name 'g' is given twice"),
    ("disaggregated_vs_aggregated", "deployment.groups.0.systems", ["h200", "h200"],
     "field 'deployment.groups.0.systems': 'h200' is given twice"),
    ("expert_placement", "placement.skews", [0.6, 1.0, 0.6], "field 'placement.skews': 0.6 is given twice"),
    ("hbm_bandwidth_sensitivity", "sweep.systems", ["h100", "h100"], "field 'sweep.systems': 'h100' is given twice"),
    ("fleet_day", "fleet.systems", ["h800", "h800"], "field 'fleet.systems': 'h800' is given twice"),
    ("api_pricing", "pricing.contexts", [8000, 8000], "field 'pricing.contexts': 8000 is given twice"),
]


@pytest.mark.parametrize(("study", "field", "value", "message"), REPEATS, ids=[f"{r[0]}:{r[1]}" for r in REPEATS])
def test_a_thing_listed_twice_is_refused(study, field, value, message, tmp_path):
    doc = _with(study, field, value)
    with pytest.raises(InputError) as exc:
        load_study(doc)
    assert message in str(exc.value) and str(exc.value).startswith("<study>: field ")
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(doc))
    with pytest.raises(InputError, match=f"^{path}: field "):
        load_study(path)


def test_the_cli_refuses_a_repeated_tornado_parameter_before_any_work(tmp_path):
    path = tmp_path / "tornado.yaml"
    path.write_text(yaml.safe_dump(_with("tornado", "tornado.parameters", ["price", "price"])))
    r = CliRunner().invoke(app, ["run", str(path), "--out", str(tmp_path / "out")])
    assert r.exit_code == 2 and isinstance(r.exception, SystemExit)
    assert f"{path}: field 'tornado.parameters': 'price' is given twice (items 0 and 1); each may appear once" \
        in one_line(r.stderr)
    assert not (tmp_path / "out").exists()


def test_sequences_may_repeat_a_value():
    """A demand share per slice, a price below and above a step: the same value may recur there."""
    assert {"demand_curve", "input", "output"} <= SEQUENCE_FIELDS
    curve = [0.5] * 24
    assert load_study(_with("fleet_day", "fleet.demand_curve", curve)).fleet.demand_curve == curve
    doc = copy.deepcopy(STUDIES["api_pricing"])
    doc["pricing"]["sheets"][0]["input"] = [1.25, 1.25]
    assert load_study(doc).pricing.sheets[0].input == [1.25, 1.25]
    for name, doc in STUDIES.items():  # every shipped study loads
        assert load_study(doc).study == name
