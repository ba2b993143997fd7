"""Start-up cost of the command line: `dse --version`, `dse --help`, and the small questions of a chat workload
answered by `dse run --no-plots` (Llama-3.1-70B on 8 H200 and DeepSeek-V3 on 16 H200, 4,000-token prompts and 500
output tokens, TTFT <= 1 s, TPOT <= 50 ms, aggregated and disaggregated).

    python scripts/bench_startup.py [--repeat N] [--source] [--no-cache]

Per command: import time, the sum of `python -X importtime` self times of everything the command imports (the
interpreter's own start-up excluded; the median of N); wall time and CPU time (user + system) of the whole process,
the median and the best of N. CPU time is what the command costs when other processes share the machine, wall time
what a user waits. The package's own modules run from their bytecode, as an installed package does: the commands run
with a bytecode cache in a scratch folder (``PYTHONPYCACHEPREFIX``), filled by one run first, whatever
``PYTHONDONTWRITEBYTECODE`` says; ``--source`` runs them as the environment says instead. Likewise the documents dse
parses (catalogs, the study) are read back from a cache folder of the benchmark's own (``DSE_CACHE_DIR``), filled by
that first run, as a user's second question finds them; ``--no-cache`` runs every command without that cache (each
file parsed each time, as on the first question after an install or an edit of a catalog). Goal: each question
answered in at most 0.5 s of wall time.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

COMMANDS = {"dse --version": ["--version"], "dse --help": ["--help"]}
QUESTION = """study: question
kind: cheapest
description: {model} on {chips} H200, 4000/500, TTFT <= 1 s, TPOT <= 50 ms, both modes
expect: the cheapest deployment of the two modes
models: [{model}]
workloads:
  - {{name: chat, prompt: 4000, output: 500, ttft_max_s: 1.0, tpot_max_s: 0.05}}
space: {{systems: [h200], min_chips_per_stage: {chips}, max_chips_per_stage: {chips}, pp: [1],
         serving: [aggregated, disaggregated]}}
"""
QUESTIONS = {"llama-3.1-70b on 8 h200": ("llama-3.1-70b", 8), "deepseek-v3 on 16 h200": ("deepseek-v3", 16)}
GOAL_QUESTION_S = 0.5


def import_seconds(args: list[str], env: dict[str, str]) -> float:
    code = (f"import sys; sys.argv = ['dse', *{args!r}]\nfrom dse.cli import main\n"
            "try:\n    main()\nexcept SystemExit:\n    pass")
    r = subprocess.run([sys.executable, "-X", "importtime", "-c", code], capture_output=True, text=True, env=env)
    base = subprocess.run([sys.executable, "-X", "importtime", "-c", "pass"], capture_output=True, text=True, env=env)

    def total(stderr: str) -> float:
        return sum(int(line.split("|")[0].split(":")[1]) for line in stderr.splitlines()
                   if line.startswith("import time:") and line.split("|")[0].split(":")[1].strip().isdigit()) / 1e6

    return total(r.stderr) - total(base.stderr)


def timed(argv: list[str], env: dict[str, str]) -> tuple[float, float]:
    """Wall and CPU (user + system) seconds of one run of ``python argv``."""
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, *argv], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    _, _, usage = os.wait4(proc.pid, 0)
    proc.returncode = 0  # reaped above
    return time.perf_counter() - t0, usage.ru_utime + usage.ru_stime


def line(name: str, args: list[str], repeat: int, env: dict[str, str], goal: bool) -> str:
    subprocess.run([sys.executable, "-m", "dse.cli", *args], capture_output=True, env=env)  # fills the cache
    imports = statistics.median(import_seconds(args, env) for _ in range(repeat))
    runs = [timed(["-m", "dse.cli", *args], env) for _ in range(repeat)]
    wall, cpu = (statistics.median(r[i] for r in runs) for i in (0, 1))
    best_wall, best_cpu = (min(r[i] for r in runs) for i in (0, 1))
    met = f" (goal <= {GOAL_QUESTION_S} s: {'met' if wall <= GOAL_QUESTION_S else 'NOT met'})" if goal else ""
    return (f"{name}: imports {imports:.3f} s; wall {wall:.3f} s (best {best_wall:.3f}); "
            f"CPU {cpu:.3f} s (best {best_cpu:.3f}){met}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--source", action="store_true", help="no bytecode cache forced (the environment's own)")
    parser.add_argument("--no-cache", action="store_true", help="no cache of parsed documents (DSE_CACHE_DIR empty)")
    a = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        env = dict(os.environ)
        if not a.source:
            env.pop("PYTHONDONTWRITEBYTECODE", None)
            env["PYTHONPYCACHEPREFIX"] = str(Path(tmp) / "bytecode")
        env["DSE_CACHE_DIR"] = "" if a.no_cache else str(Path(tmp) / "cache")
        wall, cpu = (statistics.median(r[i] for r in [timed(["-c", "pass"], env) for _ in range(a.repeat)])
                     for i in (0, 1))
        print(f"python -c pass: wall {wall:.3f} s, CPU {cpu:.3f} s")
        for name, args in COMMANDS.items():
            print(line(name, args, a.repeat, env, goal=False))
        for name, (model, chips) in QUESTIONS.items():
            study = Path(tmp) / f"{model}.yaml"
            study.write_text(QUESTION.format(model=model, chips=chips))
            args = ["run", str(study), "--no-plots", "--out", str(Path(tmp) / "out" / model)]
            print(line(f"dse run --no-plots ({name})", args, a.repeat, env, goal=True))


if __name__ == "__main__":
    main()
