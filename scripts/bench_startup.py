"""Start-up cost of the command line: import time of `dse --version`, `dse --help` and of a small question
answered by `dse run --no-plots` (Llama-3.1-70B on 8 H200, 4,000-token prompts and 500 output tokens, TTFT <= 1 s,
TPOT <= 50 ms, aggregated and disaggregated), and wall time.

    python scripts/bench_startup.py [--repeat N]

Import time is the sum of `python -X importtime` self times of everything the command imports
(the interpreter's own start-up excluded); wall time is the whole process, best of N. Goal: the question
answered in at most 0.5 s of wall time.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

COMMANDS = {"dse --version": ["--version"], "dse --help": ["--help"]}
QUESTION = """study: question_8_h200
kind: cheapest
description: Llama-3.1-70B on 8 H200, 4000/500, TTFT <= 1 s, TPOT <= 50 ms, both modes
expect: the cheapest deployment of the two modes
models: [llama-3.1-70b]
workloads:
  - {name: chat, prompt: 4000, output: 500, ttft_max_s: 1.0, tpot_max_s: 0.05}
space: {systems: [h200], min_chips_per_stage: 8, max_chips_per_stage: 8, pp: [1], serving: [aggregated, disaggregated]}
"""
GOAL_QUESTION_S = 0.5


def import_seconds(args: list[str]) -> float:
    code = (f"import sys; sys.argv = ['dse', *{args!r}]\nfrom dse.cli import main\n"
            "try:\n    main()\nexcept SystemExit:\n    pass")
    r = subprocess.run([sys.executable, "-X", "importtime", "-c", code], capture_output=True, text=True)
    base = subprocess.run([sys.executable, "-X", "importtime", "-c", "pass"], capture_output=True, text=True)

    def total(stderr: str) -> float:
        return sum(int(line.split("|")[0].split(":")[1]) for line in stderr.splitlines()
                   if line.startswith("import time:") and line.split("|")[0].split(":")[1].strip().isdigit()) / 1e6

    return total(r.stderr) - total(base.stderr)


def wall_seconds(argv: list[str], repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        subprocess.run([sys.executable, *argv], capture_output=True, check=False)
        best = min(best, time.perf_counter() - t0)
    return best


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=5)
    a = parser.parse_args()
    print(f"python -c pass: wall {wall_seconds(['-c', 'pass'], a.repeat):.3f} s")
    with tempfile.TemporaryDirectory() as tmp:
        study = Path(tmp) / "question.yaml"
        study.write_text(QUESTION)
        commands = {**COMMANDS, "dse run QUESTION --no-plots": ["run", str(study), "--no-plots", "--out",
                                                                str(Path(tmp) / "out")]}
        for name, args in commands.items():
            imports = min(import_seconds(args) for _ in range(a.repeat))
            wall = wall_seconds(['-m', 'dse.cli', *args], a.repeat)
            met = "met" if wall <= GOAL_QUESTION_S else "NOT met"
            goal = f" (goal <= {GOAL_QUESTION_S} s: {met})" if "run" in args else ""
            print(f"{name}: imports {imports:.3f} s, wall {wall:.3f} s{goal}")


if __name__ == "__main__":
    main()
