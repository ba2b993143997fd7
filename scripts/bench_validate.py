"""Time `dse validate --cases FILE --json` (the measured serving runs predicted and cross-validated): wall and CPU
seconds of each of ``--repeat`` runs of the command and their medians, cold (``--no-cache``: every fit made) and
warm (the same inputs' result read back from a cache folder the first warm run fills, `dse.validate.cache`), and
(one run in this process, not timed) how many decode-factor fits a cold run makes and how many loss evaluations of
how many rows they take.

    python scripts/bench_validate.py [--cases shared/data/measured_serving.csv] [--repeat 3] [--json]
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_CASES = ROOT.parent / "shared" / "data" / "measured_serving.csv"


def timed_run(cases: Path, cache: Path | None) -> tuple[float, float, bytes]:
    """One run of the command in a child process, with ``cache`` as its cache folder (None: ``--no-cache``): wall
    seconds, CPU seconds (user + system), its stdout."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    flags = ["--no-cache"] if cache is None else []
    env = {**os.environ, "PYTHONPATH": str(ROOT), "DSE_CACHE_DIR": str(cache or "")}
    out = subprocess.run([sys.executable, "-m", "dse.cli", "validate", "--cases", str(cases), "--json", *flags],
                         cwd=ROOT, capture_output=True, check=True, env=env)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, out.stdout


def count_fits(cases: Path) -> dict:
    """The fits `validate_file` makes and the loss evaluations (and rows evaluated) they take, counted by
    wrapping the loss functions of `dse.validate.fit` for one run."""
    sys.path.insert(0, str(ROOT))
    fit = importlib.import_module("dse.validate.fit")  # the module (the package re-exports a function `fit`)
    losses = importlib.import_module("dse.validate.losses")
    from dse.validate.run import validate_file

    counts = {"fits_one_at_a_time": 0, "fits_together": 0, "loss_evaluations": 0, "rows_evaluated": 0}
    one_at_a_time, together, loss_of, plan_losses = (fit.fit_factors, fit.fit_factors_many, fit.loss_of,
                                                     losses.Plan.losses)

    def counted_loss_of(d, measured):
        loss = loss_of(d, measured)

        def counted(f):
            counts["loss_evaluations"] += 1
            counts["rows_evaluated"] += len(measured)
            return loss(f)
        return counted

    def counted_plan_losses(self, f):
        counts["loss_evaluations"] += self.size
        counts["rows_evaluated"] += sum(int(n) * (hi - lo) for *_, runs in self.chunks for lo, hi, n in runs)
        return plan_losses(self, f)

    def counted_one(*args, **kwargs):
        counts["fits_one_at_a_time"] += 1
        return one_at_a_time(*args, **kwargs)

    def counted_many(fits, *args, **kwargs):
        counts["fits_together"] += len(fits)
        return together(fits, *args, **kwargs)

    fit.fit_factors, fit.fit_factors_many, fit.loss_of = counted_one, counted_many, counted_loss_of
    losses.Plan.losses = counted_plan_losses
    try:
        validate_file(cases, cache=False)
    finally:
        fit.fit_factors, fit.fit_factors_many, fit.loss_of = one_at_a_time, together, loss_of
        losses.Plan.losses = plan_losses
    return counts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=Path, default=DEFAULT_CASES)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--no-count", action="store_true", help="skip counting the fits and loss evaluations")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        cold = [timed_run(args.cases, None) for _ in range(args.repeat)]
        timed_run(args.cases, Path(folder))  # fills the cache
        warm = [timed_run(args.cases, Path(folder)) for _ in range(args.repeat)]
    doc = {"command": f"dse validate --cases {args.cases} --json", "repeat": args.repeat}
    for name, runs in (("cold", cold), ("warm", warm)):
        doc.update({f"{name}_wall_s": [round(w, 3) for w, _, _ in runs],
                    f"{name}_cpu_s": [round(c, 3) for _, c, _ in runs],
                    f"{name}_median_wall_s": round(statistics.median(w for w, _, _ in runs), 3),
                    f"{name}_median_cpu_s": round(statistics.median(c for _, c, _ in runs), 3)})
    doc["outputs_identical"] = len({out for _, _, out in cold + warm}) == 1
    if not args.no_count:
        doc.update(count_fits(args.cases))
    if args.json:
        print(json.dumps(doc, indent=2, default=int))
        return
    for key, value in doc.items():
        print(f"{key}: {value}")


if __name__ == "__main__":
    main()
