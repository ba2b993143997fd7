"""Run every shipped study and compare its outputs with an earlier run, timing fields aside.

    python scripts/compare_outputs.py run DIR          # dse run studies/*.yaml --out DIR/<name>
    python scripts/compare_outputs.py diff DIR_A DIR_B # same summary.json and CSVs, apart from timings

Used to check that a restructuring changes no answer: run it on the old and on the new tree, then
diff. Floats are compared to a relative 1e-9; fields that measure wall time, and the list of
files a report embeds, are ignored.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parent.parent
TIMING = {"wall_s", "solve_wall_s", "per_point_s", "storage", "study_wall_s"}
TIMING_COLUMNS = {"wall_s", "solve_wall_s"}


def run(out: Path) -> None:
    for study in sorted((ROOT / "studies").glob("*.yaml")):
        target = out / study.stem
        proc = subprocess.run([sys.executable, "-m", "dse.cli", "run", str(study), "--out", str(target)],
                              capture_output=True, text=True, cwd=ROOT)
        print(f"{study.name}: exit {proc.returncode}")
        if proc.returncode not in (0, 3):
            print(proc.stderr[-2000:])


def _same(a, b, where: str, diffs: list[str]) -> None:
    if isinstance(a, dict) and isinstance(b, dict):
        for k in sorted(set(a) | set(b)):
            if k in TIMING:
                continue
            if k not in a or k not in b:
                diffs.append(f"{where}.{k}: only in {'B' if k not in a else 'A'}")
                continue
            _same(a[k], b[k], f"{where}.{k}", diffs)
    elif isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            diffs.append(f"{where}: {len(a)} items vs {len(b)}")
            return
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            _same(x, y, f"{where}[{i}]", diffs)
    elif isinstance(a, float) or isinstance(b, float):
        if a is None or b is None or not math.isclose(float(a), float(b), rel_tol=1e-9, abs_tol=1e-12):
            diffs.append(f"{where}: {a!r} vs {b!r}")
    elif a != b:
        diffs.append(f"{where}: {a!r} vs {b!r}")


def diff(a: Path, b: Path) -> int:
    failures = 0
    for da in sorted(p for p in a.iterdir() if p.is_dir()):
        db = b / da.name
        diffs: list[str] = []
        if not db.is_dir():
            diffs.append("missing in B")
        else:
            sa, sb = (json.loads((d / "summary.json").read_text()) for d in (da, db))
            _same(sa, sb, "summary", diffs)
            for csv in sorted(da.glob("*.csv")):
                ta = pd.read_csv(csv)
                cb = db / csv.name
                if not cb.exists():
                    diffs.append(f"{csv.name}: missing in B")
                    continue
                tb = pd.read_csv(cb)
                keep = [c for c in ta.columns if c not in TIMING_COLUMNS]
                if list(ta.columns) != list(tb.columns):
                    diffs.append(f"{csv.name}: columns differ")
                    continue
                try:
                    pd.testing.assert_frame_equal(ta[keep], tb[keep], rtol=1e-9, check_dtype=False)
                except AssertionError as exc:
                    diffs.append(f"{csv.name}: {str(exc).splitlines()[0]}")
        failures += bool(diffs)
        print(f"{da.name}: {'same' if not diffs else 'DIFFERENT'}")
        for d in diffs[:10]:
            print(f"  {d}")
    return failures


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "run":
        run(Path(sys.argv[2]).resolve())
    elif len(sys.argv) == 4 and sys.argv[1] == "diff":
        sys.exit(1 if diff(Path(sys.argv[2]), Path(sys.argv[3])) else 0)
    else:
        sys.exit(__doc__)
