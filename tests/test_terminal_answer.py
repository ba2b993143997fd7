"""The terminal states a serving answer as an operator reads it: each pool with its replicas and layout, the
whole GPUs bought, and USD per request (at the fluid pool ratio the search minimizes, and as deployed); never a
fractional chip count."""

from __future__ import annotations

import re

import pytest


@pytest.mark.parametrize("columns", ["80", "160"])
def test_pools_whole_gpus_and_usd_per_request(shipped, monkeypatch, capsys, columns):
    from dse.cli import _print_study

    monkeypatch.setenv("COLUMNS", columns)
    r = shipped("cheapest_1m_context")
    assert r.returncode == 0, r.stderr
    tables = {name[:-4]: r.table(name[:-4]) for name in r.files if name.endswith(".csv")}
    _print_study(r.summary, tables, r.out, r.files)
    text = " ".join(capsys.readouterr().out.split())  # the table may wrap a cell: read it as one line
    for e in r.summary["best"]:
        pre, dec = e["pools"]
        gpus = pre["replicas"] * pre["chips"] + dec["replicas"] * dec["chips"]
        assert e["deployed_chips"] == gpus
        line = (f"{pre['replicas']} x prefill [{pre['chips']} {pre['system']} TP{pre['tp']} DP{pre['dp']} "
                f"EP{pre['ep']}{' CP' if pre['context_parallel'] else ''}] + {dec['replicas']} x decode "
                f"[{dec['chips']} {dec['system']} TP{dec['tp']} DP{dec['dp']} EP{dec['ep']}"
                f"{' PP' + str(dec['pp']) if dec['pp'] > 1 else ''}, batch {dec['batch']}] "
                f"= {gpus} GPUs")
        assert line in text.replace("│ ", "").replace(" │", ""), line
        assert f"{e['usd_per_request']:.4g} USD/request at the fluid pool ratio" in text
        assert f"{e['deployed_usd_per_request']:.4g} as deployed ({gpus} GPUs)" in text
    assert not re.search(r"\b\d+\.\d+ x ", text)  # no fractional replica or chip count
