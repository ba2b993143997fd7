"""Benchmark: wall time of the HBM-bandwidth sweep with 1 and 2 workers, and the time per point.

Runs studies/hbm_bandwidth_sensitivity.yaml on a fresh SQLite storage: once with `dse run` alone,
once with `dse run` plus one `dse worker` sharing the storage. Usage: python scripts/bench_sweep.py
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
STUDY = ROOT / "studies" / "hbm_bandwidth_sensitivity.yaml"


def run(workers: int) -> tuple[float, dict]:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "out"
        url = f"sqlite:///{out / 'optuna.db'}"
        out.mkdir()
        t0 = time.perf_counter()
        procs = [subprocess.Popen([sys.executable, "-m", "dse.cli", "run", str(STUDY), "--out", str(out),
                                   "--storage", url, "--json"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)]
        time.sleep(0.5)
        procs += [subprocess.Popen([sys.executable, "-m", "dse.cli", "worker", str(STUDY), "--storage", url],
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for _ in range(workers - 1)]
        stdout, _ = procs[0].communicate()
        for p in procs[1:]:
            p.wait()
        wall = time.perf_counter() - t0
        return wall, json.loads(stdout)


def main() -> None:
    for workers in (1, 2):
        wall, summary = run(workers)
        s = summary["solver"]
        print(f"{workers} worker(s): {summary['points']} points in {wall:.2f} s wall (process start included); "
              f"{s['per_point_s']:.3f} s per point (space build + overall and per-system solves); "
              f"{summary['points_solved_here']} solved by `dse run`")


if __name__ == "__main__":
    main()
