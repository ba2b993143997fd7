"""The command-line contract: JSON keys, exit codes and messages."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import yaml
from helpers import dse

from dse.catalog.hardware import HW_DIR

ROOT = Path(__file__).resolve().parent.parent

CONTRACT_KEYS = {
    "chips", "compute_s", "memory_s", "comm_s", "step_s", "bound", "tokens_per_s", "tpot_s", "usd_per_mtok",
    "weights_bytes_per_chip", "kv_bytes_per_chip", "fits", "params_total", "params_active", "kv_bytes_per_token",
    "balance_batch", "hbm_drain_s",
}


def test_done_when_commands_print_every_contract_key():
    r = dse("evaluate", "--model", "llama-3.1-70b", "--system", "h100", "--tp", "8", "--batch", "64", "--context",
            "4096", "--weights-dtype", "bf16", "--kv-dtype", "bf16", "--ideal", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert CONTRACT_KEYS <= set(out)
    assert out["chips"] == 8 and out["bound"] in ("compute", "memory", "comm")
    assert out["hbm_drain_s"] == pytest.approx(80e9 / 3.35e12)

    r = dse("evaluate", "--model", "deepseek-v3", "--system", "gb200-nvl72", "--ep", "72", "--batch", "2048",
            "--context", "8192", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert CONTRACT_KEYS <= set(out)
    assert (out["chips"], out["ep"], out["dp"], out["tp"]) == (72, 72, 72, 1)
    assert out["fits"] is True


def test_readable_table_by_default():
    r = dse("evaluate", "--model", "llama-3.1-8b", "--system", "h100", "--batch", "8", "--context", "1024")
    assert r.returncode == 0, r.stderr
    assert "step (TPOT)" in r.stdout and "balance batch" in r.stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--model", "llama-70b", "--system", "h100"], "unknown model 'llama-70b'; did you mean: llama-2-70b, llama-3.3-70b, llama-3.1-70b"),
        (["--model", "llama-3.1-70b", "--system", "h10"], "unknown system 'h10'; did you mean: h100"),
        (["--model", "llama-3.1-70b", "--system", "h100", "--tp", "8", "--ep", "2"], "is dense (no experts)"),
        (["--model", "mixtral-8x22b", "--system", "h100", "--ep", "16"], "exceeds the 8 experts"),
        (["--model", "deepseek-v3", "--system", "h100", "--tp", "4", "--dp", "2", "--ep", "4", "--etp", "1"],
         "attention TP x DP = 4 x 2 = 8 chips per stage, but experts EP x expert-TP = 4 x 1 = 4"),
        (["--model", "llama-3.1-70b", "--system", "h100", "--tp", "3"], "does not divide the 64 attention heads"),
        (["--model", "llama-3.1-70b", "--system", "tpu-v4", "--tp", "8", "--kv-tier", "host"], "no host memory"),
    ],
)
def test_bad_input_exits_2_with_one_clear_message(args, message):
    r = dse("evaluate", *args, "--batch", "8", "--context", "1024")
    assert r.returncode == 2
    assert message in " ".join(r.stderr.split())
    assert "Traceback" not in r.stderr
    assert r.stdout == ""


def test_bad_dtype_exits_2_listing_the_allowed_ones():
    r = dse("evaluate", "--model", "llama-3.1-8b", "--system", "h100", "--batch", "8", "--context", "8",
            "--weights-dtype", "int3")
    assert r.returncode == 2
    assert "bf16" in r.stderr and "fp8" in r.stderr and "fp4" in r.stderr


def test_catalog_hardware_and_models():
    r = dse("catalog", "hardware", "--json")
    assert r.returncode == 0
    rows = json.loads(r.stdout)
    assert len(rows) == 20 and rows[0]["flops_bf16_source"]
    r = dse("catalog", "models", "--json")
    assert r.returncode == 0
    assert {row["id"] for row in json.loads(r.stdout)} >= {"deepseek-v3", "frontier-5t"}
    assert dse("catalog", "hardware").returncode == 0
    assert dse("catalog", "models").returncode == 0


@pytest.mark.parametrize("columns", [80, 160])
def test_catalog_listings_are_readable_at_the_width_of_the_terminal(columns):
    """No cell cut short (no ellipsis) and no line wider than the terminal, at 80 and 160 columns; every model id
    whole; the sizing figures (peak FLOP/s, HBM, domain, on-demand price) at 80, every field from 150."""
    for what in ("hardware", "models"):
        r = dse("catalog", what, env={"COLUMNS": str(columns)})
        assert r.returncode == 0, r.stderr
        assert "…" not in r.stdout and all(len(line) <= columns for line in r.stdout.splitlines())
        if what == "models":
            ids = {line.split()[0] for line in r.stdout.splitlines() if line.startswith(" ") and line.split()}
            assert {"qwen3-coder-480b-a35b", "llama-4-maverick", "deepseek-v3.2"} <= ids
        else:
            assert "on-dem." in r.stdout and " 0.989 " in r.stdout  # H100's dense BF16 PF/s
            assert ("TCO hyp." in r.stdout) == (columns >= 150)


def test_catalog_json_carries_every_catalog_field():
    """`catalog models --json`: every field of models.yaml (maximum context included) and the derived counts;
    `catalog hardware --json`: every quantity of systems.yaml as written (value, unit, source, date) and in SI."""
    models = {m["id"]: m for m in yaml.safe_load((ROOT / "model_catalog" / "models.yaml").read_text())["models"]}
    rows = {row["id"]: row for row in json.loads(dse("catalog", "models", "--json").stdout)}
    assert rows.keys() == models.keys()
    for mid, m in models.items():
        assert set(m) <= set(rows[mid]), set(m) - set(rows[mid])
        assert rows[mid]["max_context_tokens"] == (m["max_context"]["tokens"] if "max_context" in m else None)
    assert rows["llama-3-8b-1048k"]["max_context_tokens"] == 1_048_576 and rows["deepseek-v3"]["params_total"] > 6e11
    systems = {s["id"]: s for s in yaml.safe_load((HW_DIR / "systems.yaml").read_text())["systems"]}
    hw = {row["id"]: row for row in json.loads(dse("catalog", "hardware", "--json").stdout)}
    for sid, sy in systems.items():
        for key, raw in sy.items():
            if isinstance(raw, dict) and "unit" in raw:
                q = hw[sid]["quantities"][key]
                assert (q["value"], q["unit"], q["source"]) == (raw["value"], raw["unit"], raw["source"]), (sid, key)
            elif key != "prices":
                assert key in hw[sid] or key == "scaleup_topology", (sid, key)


def test_bad_catalog_exits_2_naming_file_row_and_field(tmp_path: Path):
    for name in ("systems.yaml", "memory_tiers.yaml", "efficiency.yaml"):
        shutil.copy(HW_DIR / name, tmp_path / name)
    doc = yaml.safe_load((tmp_path / "systems.yaml").read_text())
    doc["systems"][3]["hbm_capacity"]["unit"] = "gigabytes"
    (tmp_path / "systems.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    r = dse("catalog", "hardware", env={"DSE_HW_CATALOG": str(tmp_path)})
    assert r.returncode == 2
    text = " ".join(r.stderr.split())
    assert "systems.yaml: systems[3] (id 'h200'): field 'hbm_capacity': unknown unit 'gigabytes'" in text


def test_configuration_that_does_not_fit_exits_3_with_its_json():
    r = dse("evaluate", "--model", "llama-3.1-405b", "--system", "h100", "--batch", "64", "--context", "100000",
            "--json")
    assert r.returncode == 3
    out = json.loads(r.stdout)
    assert out["fits"] is False and out["hbm_bytes_per_chip"] > out["hbm_capacity_per_chip"]
    assert "HBM capacity runs out" in " ".join(r.stderr.split())


def test_run_json_stdout_parses_while_native_solver_logs_go_to_stderr(shipped):
    r = shipped("pareto_latency_cost")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["kind"] == "pareto"


def test_native_writes_to_stdout_are_sent_to_stderr(capfd):
    from dse.cli import native_stdout_to_stderr

    with native_stdout_to_stderr():
        os.write(1, b"native solver log\n")
    print("own output")
    out, err = capfd.readouterr()
    assert out == "own output\n" and "native solver log" in err


def test_every_kind_prints_a_headline_that_fits_80_columns(shipped, monkeypatch, capsys):
    """What `dse run` prints after a run (`_print_study` of its summary and tables), here of the session's run of
    each study, in an 80-column terminal."""
    from dse.cli import _print_study

    monkeypatch.setenv("COLUMNS", "80")
    for study in ("kv_cache_tiers", "api_pricing", "moe_codesign"):
        r = shipped(study)
        assert r.returncode == 0, r.stderr
        tables = {name[:-4]: r.table(name[:-4]) for name in r.files if name.endswith(".csv")}
        _print_study(r.summary, tables, r.out, r.files)
        stdout = capsys.readouterr().out
        lines = stdout.splitlines()
        assert len(lines) >= 3 and all(len(ln) <= 80 for ln in lines), stdout
        assert "…" not in stdout


def test_progress_counts_move_to_the_total():
    """Long work reports how many of how many are done, and the count reaches the total (no frozen counter)."""
    import dse

    root = Path(__file__).resolve().parent.parent
    doc = yaml.safe_load((root / "studies" / "compute_equalization.yaml").read_text())
    doc["workloads"][0]["demand_tokens_per_s"] = 2e5
    doc["space"].update(systems=["h100"], kv_tiers=["hbm"], tp=[1, 2], pp=[1], max_racks=1, max_chips_per_stage=8)
    doc["equalization"].update(refine_trials=5, family={"widths": [2048, 4096], "sparsities": [1]},
                               quality={"target_loss": 2.05}, train_systems=["h100"], inventory_nodes={"h100": 64},
                               launch_by_week=8, deployment_weeks=2, rl={"output": 1000},
                               sensitivity={"assumptions": False})
    seen: list[tuple] = []
    dse.run(doc, progress=lambda what, done=None, total=None: seen.append((done, total)))
    counts = [d for d, t in seen if t == 5]
    assert counts[0] == 0 and counts[-1] == 5 and counts == sorted(counts) and len(set(counts)) >= 5
    seen.clear()
    dse.run(yaml.safe_load((root / "studies" / "kv_cache_tiers.yaml").read_text()), progress=lambda *a: seen.append(a))
    assert seen


def test_a_system_without_a_price_of_the_kind_evaluates_with_no_cost():
    for extra in ([], ["--prompt", "2000", "--output", "500"]):
        r = dse("evaluate", "--model", "deepseek-v3", "--system", "mi355x", "--ep", "8", "--batch", "8", "--context",
                "4096", "--price-kind", "on_demand", "--json", *extra)
        assert r.returncode == 0, r.stderr
        out = json.loads(r.stdout, parse_constant=lambda c: pytest.fail(f"non-standard JSON constant {c}"))
        assert out["usd_per_mtok"] is None and out["usd_per_chip_hour"] is None and out["step_s"] > 0
    r = dse("evaluate", "--model", "deepseek-v3", "--system", "mi355x", "--ep", "8", "--batch", "8", "--context",
            "4096", "--price-kind", "on_demand")
    assert r.returncode == 0 and "no on_demand price" in " ".join(r.stdout.split())


QUESTION = {
    "study": "question", "kind": "cheapest", "description": "A small chat question.", "expect": "An answer.",
    "models": ["llama-3.1-8b"],
    "workloads": [{"name": "chat", "prompt": 2000, "output": 200, "ttft_max_s": 1.0, "tpot_max_s": 0.05}],
    "space": {"systems": ["h100"], "max_chips_per_stage": 1, "pp": [1], "max_racks": 1, "max_batch_per_rank": 64},
}


def test_the_command_line_freezes_its_start_up_in_its_own_process_only(tmp_path):
    """`dse run` in a process of its own puts its start-up objects out of the collector's reach (gc.freeze); run
    inside a caller's process (CliRunner) it leaves the caller's collector as it found it; the answers are the same."""
    import gc
    import subprocess
    import sys

    from typer.testing import CliRunner

    from dse.cli import app

    study = tmp_path / "q.yaml"
    study.write_text(yaml.safe_dump(QUESTION))
    code = ("import gc, sys\nsys.argv = ['dse', 'run', sys.argv[1], '--no-plots', '--out', sys.argv[2]]\n"
            "from dse.cli import main\ntry:\n    main()\nexcept SystemExit as exc:\n    assert not exc.code\n"
            "print(gc.get_freeze_count())")
    r = subprocess.run([sys.executable, "-c", code, str(study), str(tmp_path / "own")], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    assert int(r.stdout.strip().splitlines()[-1]) > 10_000
    before = gc.get_freeze_count()
    result = CliRunner().invoke(app, ["run", str(study), "--no-plots", "--out", str(tmp_path / "caller")])
    assert result.exit_code == 0, result.output
    assert gc.get_freeze_count() == before
    for name in ("best.csv", "serving.csv", "systems.csv"):
        assert (tmp_path / "own" / name).read_bytes() == (tmp_path / "caller" / name).read_bytes()


def test_the_executable_ends_a_run_once_its_exit_handlers_ran_and_its_output_is_out(tmp_path):
    """The ``dse`` executable (`command`) ends `dse run`'s process without the interpreter's teardown: the exit
    handlers registered before it still run, everything printed arrives, the files are whole and the exit code is
    the run's (0 answered, 3 infeasible); nothing after it runs."""
    import subprocess
    import sys

    code = ("import atexit, sys\natexit.register(lambda: print('handlers ran'))\n"
            "sys.argv = ['dse', 'run', sys.argv[1], '--no-plots', '--out', sys.argv[2]]\n"
            "from dse.cli import command\ncommand()\nprint('not reached')")
    for name, tpot, rc in (("answered", 0.05, 0), ("infeasible", 1e-4, 3)):
        study = tmp_path / f"{name}.yaml"
        study.write_text(yaml.safe_dump({**QUESTION, "workloads": [{**QUESTION["workloads"][0], "tpot_max_s": tpot}]}))
        r = subprocess.run([sys.executable, "-c", code, str(study), str(tmp_path / name)], capture_output=True,
                           text=True, timeout=120)
        assert r.returncode == rc, r.stderr[-2000:]
        lines = r.stdout.splitlines()
        assert lines[-1] == "handlers ran" and "not reached" not in r.stdout
        assert any(line.startswith("wrote ") for line in lines)
        summary = json.loads((tmp_path / name / "summary.json").read_text())
        assert summary["status"] == ("optimal" if rc == 0 else "infeasible")


def test_the_progress_bar_is_drawn_on_a_terminal_alone():
    """`dse run`'s progress: a callback drawing a transient bar where stderr is a terminal; none elsewhere (where a
    bar shows nothing), so neither its library nor its refresh thread is made there."""
    import io

    from rich.console import Console

    from dse.cli import _progress_bar

    with _progress_bar(Console(file=io.StringIO()), "q") as progress:
        assert progress is None
    screen = io.StringIO()
    with _progress_bar(Console(file=screen, force_terminal=True), "q") as progress:
        progress("solving", 1, 4)
    assert "q: solving" in screen.getvalue()
