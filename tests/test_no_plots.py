"""`dse run --no-plots` and where the plotting library is imported: a run without plots gives the same answers
and a report that says its figures were skipped, and no command imports matplotlib unless it draws a figure (nor,
answering a serving question, pandas, Optuna, Pyomo, OR-Tools, SciPy or SQLite)."""

from __future__ import annotations

import json
import subprocess
import sys

import yaml
from typer.testing import CliRunner

from dse.cli import app

STUDY = {
    "study": "no-plots", "kind": "cheapest", "description": "A small chat question.", "expect": "An answer.",
    "models": ["llama-3.1-8b"],
    "workloads": [{"name": "chat", "prompt": 2000, "output": 200, "ttft_max_s": 1.0, "tpot_max_s": 0.05}],
    "space": {"systems": ["h100", "h200"], "max_chips_per_stage": 2, "pp": [1], "max_racks": 1,
              "max_batch_per_rank": 256},
}
TIMING = {"wall_s", "solve_wall_s"}


def _study(tmp_path):
    path = tmp_path / "study.yaml"
    path.write_text(yaml.safe_dump(STUDY))
    return path


def _answers(summary: dict) -> dict:
    """summary.json less the list of files written and the wall times."""
    return {k: ({kk: vv for kk, vv in v.items() if kk not in TIMING} if k == "solver" else v)
            for k, v in summary.items() if k != "outputs"}


def test_no_plots_same_answers_and_report_says_so(tmp_path):
    study, out = _study(tmp_path), tmp_path / "out"
    runner = CliRunner()
    r = runner.invoke(app, ["run", str(study), "--out", str(out)])
    assert r.exit_code == 0, r.output
    with_plots = {p.name: p.read_bytes() for p in out.iterdir()}
    pngs = sorted(n for n in with_plots if n.endswith(".png"))
    assert pngs == ["cost_by_system.png", "time_breakdown.png"]

    r = runner.invoke(app, ["run", str(study), "--out", str(out), "--no-plots"])  # the earlier figures are dse's
    assert r.exit_code == 0, r.output
    files = sorted(p.name for p in out.iterdir())
    assert files == sorted(n for n in with_plots if not n.endswith(".png"))
    for name in files:
        if name.endswith(".csv"):
            assert (out / name).read_bytes() == with_plots[name], name
    before, after = json.loads(with_plots["summary.json"]), json.loads((out / "summary.json").read_text())
    assert _answers(after) == _answers(before)
    assert after["outputs"] == [n for n in before["outputs"] if not n.endswith(".png")]
    assert sorted(json.loads((out / ".dse-output.json").read_text())["files"]) == after["outputs"]

    report = (out / "report.html").read_text()
    assert "Figures skipped" in report and all(name in report for name in pngs)
    assert "<img" not in report and "src=" not in report  # self-contained: nothing to load, nothing broken
    assert "Figures skipped" not in with_plots["report.html"].decode()


def test_help_names_no_plots():
    r = CliRunner().invoke(app, ["run", "--help"], terminal_width=200)
    assert r.exit_code == 0 and "--no-plots" in r.output


HEAVY = ("matplotlib", "pandas", "optuna", "pyomo", "ortools", "scipy", "sqlite3")
PROBE = """
import json, sys
import dse
from dse.cli import main

def heavy():
    return sorted({m.split('.')[0] for m in sys.modules} & set(HEAVY))

seen = {}
for name, argv in STEPS:
    sys.argv = ['dse', *argv]
    try:
        main()
    except SystemExit as exc:
        assert not exc.code, (name, exc.code)
    seen[name] = heavy()
dse.run(STUDY_PATH)
seen['api'] = heavy()
dse.run(STUDY_PATH, out=OUT + '-api', plots=False)
seen['api --no-plots'] = heavy()
print(json.dumps(seen))
"""


def test_commands_import_no_plotting_library(tmp_path):
    """In one fresh process, in order: `dse evaluate --json`, `dse run --no-plots --json`, then `dse.run` without
    and with an output folder (no plots); what each step has imported by its end."""
    study, out = _study(tmp_path), str(tmp_path / "out")
    steps = [("evaluate", ["evaluate", "--model", "llama-3.1-8b", "--system", "h100", "--batch", "32", "--context",
                           "2200", "--prompt", "2000", "--output", "200", "--json"]),
             ("run --no-plots", ["run", str(study), "--out", out, "--no-plots", "--json"])]
    code = (f"HEAVY = {HEAVY!r}\nSTEPS = {steps!r}\nSTUDY_PATH = {str(study)!r}\nOUT = {out!r}\n" + PROBE)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    seen = json.loads(r.stdout.strip().splitlines()[-1])
    assert seen["evaluate"] == []  # one configuration: numpy only, no tables, solvers or figures
    for step in ("run --no-plots", "api", "api --no-plots"):  # nor pandas: a Result's DataFrames are made when read
        assert not set(HEAVY) & set(seen[step]), (step, seen[step])


def test_validate_no_plots_same_figures_no_matplotlib(tmp_path):
    """`dse validate --cases RUNS.csv --no-plots`: the same summary and table as with the scatters, no PNG, a report
    that says they were skipped, and matplotlib never imported (in a fresh process)."""
    from pathlib import Path

    import pandas as pd

    root = Path(__file__).resolve().parent.parent
    runs = pd.read_csv(root / "hw_catalog" / "calibration" / "published" / "measured_serving.csv")
    runs = runs[(runs["backend"] == "vllm") & (runs["mode"] == "agg") & runs["system"].str.startswith("h")]
    path = tmp_path / "runs.csv"
    runs.head(60).to_csv(path, index=False)
    env_code = ("import json, sys\nfrom dse.cli import main\nsys.argv = ['dse', 'validate', '--cases', sys.argv[1], "
                "'--no-cache', '--out', sys.argv[2]] + sys.argv[3:]\ntry:\n    main()\nexcept SystemExit as exc:\n"
                "    assert not exc.code, exc.code\nprint(json.dumps('matplotlib' in sys.modules))\n")
    seen = {}
    for name, extra in (("plots", []), ("no-plots", ["--no-plots"])):
        r = subprocess.run([sys.executable, "-c", env_code, str(path), str(tmp_path / name), *extra],
                           capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr[-2000:]
        seen[name] = json.loads(r.stdout.strip().splitlines()[-1])
    assert seen == {"plots": True, "no-plots": False}
    a, b = tmp_path / "plots", tmp_path / "no-plots"
    assert sorted(p.name for p in b.iterdir()) == sorted(p.name for p in a.iterdir() if p.suffix != ".png")
    assert (a / "validate_runs.csv").read_bytes() == (b / "validate_runs.csv").read_bytes()
    assert json.loads((a / "summary.json").read_text()) == json.loads((b / "summary.json").read_text())
    report = (b / "report.html").read_text()
    assert "Figures skipped" in report and "<img" not in report and "<img" in (a / "report.html").read_text()
