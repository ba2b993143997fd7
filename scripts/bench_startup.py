"""Start-up cost of the command line: import time of `dse --version` and `dse --help`, and wall time.

    python scripts/bench_startup.py [--repeat N]

Import time is the sum of `python -X importtime` self times of everything the command imports
(the interpreter's own start-up excluded); wall time is the whole process, best of N.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time

COMMANDS = {"dse --version": ["--version"], "dse --help": ["--help"]}


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
    for name, args in COMMANDS.items():
        imports = min(import_seconds(args) for _ in range(a.repeat))
        print(f"{name}: imports {imports:.3f} s, wall {wall_seconds(['-m', 'dse.cli', *args], a.repeat):.3f} s")


if __name__ == "__main__":
    main()
