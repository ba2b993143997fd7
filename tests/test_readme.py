"""The README's examples run as written and print what the README says they print: `dse evaluate`'s table, the
answer lines of a budgeted study, and the Python example, whose `assert` states its study's expectation."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from helpers import dse

ROOT = Path(__file__).resolve().parent.parent
BOX = re.compile("[│┃┏┓┗┛━┡┩╇┳┻┴─└┘┌┐╭╮╯╰┼]")


def _block(after: str) -> list[str]:
    """The lines of the README's code block that starts with the line ``after``, without it."""
    text = (ROOT / "README.md").read_text()
    body = text.split(after + "\n", 1)[1].split("```", 1)[0]
    return [line for line in body.splitlines() if line.strip()]


def _plain(text: str) -> list[str]:
    """Printed lines with the table rules dropped and the spacing collapsed."""
    return [" ".join(BOX.sub(" ", line).split()) for line in text.splitlines() if BOX.sub(" ", line).strip()]


def test_the_evaluate_example_prints_what_the_readme_shows():
    command = "$ dse evaluate --model llama-3.1-70b --system h100 --tp 8 --batch 64 --context 4096 --ideal"
    r = dse(*command.split()[2:], env={"COLUMNS": "100"})
    assert r.returncode == 0, r.stderr
    assert _plain(r.stdout) == [" ".join(line.split()) for line in _block(command)]


def test_the_budget_example_prints_what_the_readme_shows(shipped, monkeypatch, capsys):
    """`dse run studies/budget_16_gpus.yaml`: the answer lines the README shows, and the study's `expect`."""
    from dse.cli import _print_study

    r = shipped("budget_16_gpus")
    assert r.returncode == 0, r.stderr
    monkeypatch.setenv("COLUMNS", "400")
    _print_study(r.summary, {}, r.out, r.files)
    printed = capsys.readouterr().out.splitlines()
    shown = _block("$ dse run studies/budget_16_gpus.yaml")
    assert printed[1:1 + len(shown)] == shown
    # the study's expectation: xPyD within the 16 GPUs (11: eight prefill GPUs and three single-H200 decode
    # replicas whose HBM-bound batch the prefill rate fills), 16% below aggregated; with a fifth prefill pair
    # (14 GPUs, 1% dearer) the prefill pool sets the rate and the decode layouts that keep up with it tie: single
    # H200s bound by HBM capacity or TP2 at the TPOT target; equal costs go to the lower TPOT (`dse.optimize.ties`)
    (e,) = r.summary["best"]
    assert e["serving"] == "disaggregated" and e["chips"] == 11 and e["tpot_s"] <= 0.05 * (1 + 1e-9)
    assert e["pools"][1]["tp"] == 1 and e["binding"] == "HBM capacity"
    assert e["pools"][1].get("batch_served", e["pools"][1]["batch"]) == e["pools"][1]["batch"]
    fifth = [a for a in e["alternatives"] if a["serving"] == "disaggregated" and a["chips"] == 14]
    assert fifth and all(a["usd_per_request"] == pytest.approx(fifth[0]["usd_per_request"], rel=1e-12) for a in fifth)
    assert 1.0 < fifth[0]["usd_per_request"] / e["usd_per_request"] < 1.02
    assert any(a["pools"][1]["tp"] == 2 and a["binding"].startswith("the TPOT target")
               and a["tpot_s"] > 1.02 * fifth[0]["tpot_s"] for a in fifth)
    assert all(a["tpot_s"] >= fifth[0]["tpot_s"] for a in fifth)
    assert all(a["pools"][1]["batch_served"] < a["pools"][1]["batch"] for a in fifth)
    agg = min(a["usd_per_request"] for a in e["alternatives"] if a["serving"] == "aggregated")
    assert 0.80 <= e["usd_per_request"] / agg <= 0.85
    assert e["usd_per_request_fluid"] <= e["usd_per_request"] <= 1.05 * e["usd_per_request_fluid"]
    assert all(a["chips"] <= 16 for a in e["alternatives"])


def test_the_python_example_runs_and_meets_its_expectation(tmp_path, monkeypatch):
    """The notebook-style example, run as written in a scratch folder: its `assert` is its study's expectation."""
    text = (ROOT / "README.md").read_text()
    block = text.split("```python\n", 1)[1].split("```", 1)[0]
    assert "assert " in block
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(ROOT))
    namespace: dict = {}
    exec(compile(block.replace("studies/", f"{ROOT}/studies/"), "README.md", "exec"), namespace)
    result = namespace["result"]
    assert result.summary["status"] == "optimal" and not result.tables["best"].empty
    assert (tmp_path / "results" / "readme-example" / "summary.json").exists()
