"""The terminal states a serving answer as an operator reads it, at 80 and 160 columns: the mode and each pool with
its replicas, chips, layout and batch, the whole GPUs bought, USD per request as deployed (and at the fluid pool
ratio the search minimizes), USD per input and output million tokens, TTFT and TPOT, tokens/s per GPU and per user,
the price kind, what binds, and the alternatives of each mode; never a fractional chip count, never the whole
request's cost per output million tokens as a price."""

from __future__ import annotations

import re

import pytest

from dse.report.present import latency_text


def _shown(r, monkeypatch, capsys, columns: str) -> str:
    from dse.cli import _print_study

    monkeypatch.setenv("COLUMNS", columns)
    tables = {name[:-4]: r.table(name[:-4]) for name in r.files if name.endswith(".csv")}
    _print_study(r.summary, tables, r.out, r.files)
    out = capsys.readouterr().out
    assert all(len(line) <= int(columns) for line in out.splitlines())
    return " ".join(out.replace("│", " ").split())  # wrapped lines and cells read as one line


@pytest.mark.parametrize("columns", ["80", "160"])
def test_the_answer_as_an_operator_reads_it(shipped, monkeypatch, capsys, columns):
    r = shipped("cheapest_1m_context")
    assert r.returncode == 0, r.stderr
    text = _shown(r, monkeypatch, capsys, columns)
    for e in r.summary["best"]:
        pre, dec = e["pools"]
        gpus = pre["replicas"] * pre["chips"] + dec["replicas"] * dec["chips"]
        assert e["chips"] == gpus and isinstance(e["chips"], int)
        pp = {k: f" PP{p['pp']}" if p["pp"] > 1 else "" for k, p in (("pre", pre), ("dec", dec))}
        line = (f"{e['model']} / {e['workload']}: disaggregated, {pre['replicas']} x prefill [{pre['chips']} "
                f"{pre['system']} TP{pre['tp']} DP{pre['dp']} EP{pre['ep']}{pp['pre']}"
                f"{' CP' if pre['context_parallel'] else ''}] + {dec['replicas']} x decode [{dec['chips']} "
                f"{dec['system']} TP{dec['tp']} DP{dec['dp']} EP{dec['ep']}{pp['dec']}, batch {dec['batch']}"
                f"{', serving ' + str(dec['batch_served']) if 'batch_served' in dec else ''}] = {gpus:,} GPUs")
        assert line in text, line
        assert (f"{e['usd_per_request']:.4g} USD per request as deployed ({e['usd_per_request_fluid']:.4g} at the "
                "fluid pool ratio)") in text
        assert (f"{e['usd_per_mtok_input']:.4g} USD/Mtok input, {e['usd_per_mtok_output']:.4g} USD/Mtok output; "
                "on_demand prices") in text
        assert (f"{latency_text(e, micro='u')}; "
                f"{e['tokens_per_s_per_gpu']:,.4g} output tokens/s per GPU, {e['tokens_per_s_per_user']:,.3g} per "
                "user") in text
        assert f"what binds the batch: {e['binding']}; sized for 50,000 output tokens/s" in text
        if e["decide"] == "robust":  # the replicas bought at each pool's throughput band's low end: said so
            assert "sized for 50,000 output tokens/s at the low end of each pool's throughput band" in text
        assert len(e["alternatives"]) == 10  # five of each mode
        for a in e["alternatives"]:  # lines at 80 columns; a table from 120, whose deployment cells may fold
            assert (a["layout"] in text or columns == "160") and f"{a['usd_per_request']:.4g}" in text
    assert not re.search(r"\b\d+\.\d+ x ", text)  # no fractional replica or chip count
    assert "USD/Mtok (output)" not in text and "GPUs" in text


def test_a_sweep_resumed_from_its_storage_says_so(shipped, monkeypatch, capsys, tmp_path):
    """A resumed sweep's line says how many points it solved now and how many it took from its storage."""
    r = shipped("hbm_bandwidth_sensitivity")
    summary = {**r.summary, "points_solved_here": 0}
    from dse.cli import _print_study

    _print_study(summary, {"sweep": r.table("sweep")}, r.out, r.files)
    out = " ".join(capsys.readouterr().out.split())
    n = summary["points"]
    assert f"{n} points: 0 solved now, {n} resumed from the sweep's storage" in out


def test_alternatives_ranked_at_the_fluid_pool_ratio_say_so(shipped, monkeypatch, capsys):
    """With no budget and no demand the search ranks deployments at the fluid pool ratio, and the alternatives'
    smallest whole deployments may then cost less as deployed than the answer's: the heading says how they were
    ranked and each shows its fluid figure beside the one as deployed."""
    from dse.report.present import _usd

    r = shipped("hbm_bandwidth_sensitivity")
    text = _shown(r, monkeypatch, capsys, "160")
    assert "ranked at the fluid pool ratio" in text
    for e in r.summary["best"]:
        assert not e.get("budget") and not e.get("demand_tokens_per_s")
        for a in e["alternatives"]:
            assert f"{_usd(a['usd_per_request'])} ({_usd(a['usd_per_request_fluid'])})" in text
