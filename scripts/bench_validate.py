"""Time `dse validate --cases FILE --json` (the measured serving runs predicted and cross-validated): wall and CPU
seconds of each of ``--repeat`` runs of the command and their medians, cold (``--no-cache``: every fit made) and
warm (the same inputs' result read back from a cache folder the first warm run fills, `dse.validate.cache`),
(one run in this process, not timed) how many decode-factor fits a cold run makes and how many loss evaluations of
how many rows they take, and (``--split``, one more run in this process) the CPU seconds of `validate_file`'s
stages.

    python scripts/bench_validate.py [--cases shared/data/measured_serving.csv] [--repeat 3] [--split] [--json]
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
    """The decode-factor fits `validate_file` makes, the rounds of their descents and the loss evaluations (and rows
    evaluated) they take, counted by wrapping `dse.validate.fit`'s descent and the loss it evaluates for one run."""
    sys.path.insert(0, str(ROOT))
    fit = importlib.import_module("dse.validate.fit")  # the module (the package re-exports a function `fit`)
    descent = importlib.import_module("dse.validate.descent")
    from dse.validate.run import validate_file

    counts = {"fits": 0, "descents": 0, "rounds": 0, "loss_evaluations": 0, "rows_evaluated": 0}
    descend, log_tpot = fit.descend, descent.log_tpot

    def counted_descend(t, log_measured, use, x0, free, *args, **kwargs):
        counts["fits"] += len(x0)
        counts["descents"] += 1
        counts["rounds"] -= 1  # its first evaluation is no round
        return descend(t, log_measured, use, x0, free, *args, **kwargs)

    def counted_log_tpot(t, p, *args, **kwargs):
        counts["rounds"] += 1
        counts["loss_evaluations"] += len(p)
        counts["rows_evaluated"] += len(p) * t.shape[1]
        return log_tpot(t, p, *args, **kwargs)

    fit.descend, descent.log_tpot = counted_descend, counted_log_tpot
    try:
        validate_file(cases, cache=False)
    finally:
        fit.descend, descent.log_tpot = descend, log_tpot
    return counts


STAGES = (("predicted_passes", "run", "predicted_passes"), ("decode_fits_in_sample", "fit", "fit_key"),
          ("decode_fits_left_out", "fit", "fit_factors_many"), ("decode_fits_other", "run", "refit_tpot_sets"),
          ("ideal_roofline", "run", "predict_runs"), ("stack_fits", "run", "fit_stack_sets"))
"""`validate_file`'s stages, each timed where it is called (module `dse.validate.<module>`, function): the decode
fits' time less the fits per key (in sample) and the left-out fits is the two-batch choice and the terms they
read."""


def stage_split(cases: Path) -> dict:
    """CPU seconds of one `validate_file` run in this process (no cache) and of each of its `STAGES` (the rest:
    reading and mapping the runs, the TPOT and TTFT columns, the rows of unknown layout).
    """
    sys.path.insert(0, str(ROOT))
    modules = {m: importlib.import_module(f"dse.validate.{m}") for m in ("run", "fit")}
    from dse.validate.run import validate_file

    spent = {name: 0.0 for name, _, _ in STAGES}
    inner = {"decode_fits_other": ("decode_fits_in_sample", "decode_fits_left_out")}
    originals = [(modules[m], f, getattr(modules[m], f)) for _, m, f in STAGES]
    running: set[str] = set()

    def timed(name, func):
        def call(*args, **kwargs):
            if name in running:
                return func(*args, **kwargs)  # counted by the call it is made in
            running.add(name)
            start = time.process_time()
            try:
                return func(*args, **kwargs)
            finally:
                spent[name] += time.process_time() - start
                running.discard(name)
        return call

    for (name, _, _), (module, f, func) in zip(STAGES, originals, strict=True):
        setattr(module, f, timed(name, func))
    try:
        start = time.process_time()
        validate_file(cases, cache=False)
        total = time.process_time() - start
    finally:
        for module, f, func in originals:
            setattr(module, f, func)
    for outer, parts in inner.items():  # the fits are timed inside the decode-fit functions too
        spent[outer] -= sum(spent[p] for p in parts)
    out = {f"cpu_s_{k}": round(v, 3) for k, v in spent.items()}
    out["cpu_s_rest"] = round(total - sum(spent.values()), 3)
    out["cpu_s_validate_file"] = round(total, 3)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=Path, default=DEFAULT_CASES)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--no-count", action="store_true", help="skip counting the fits and loss evaluations")
    parser.add_argument("--split", action="store_true", help="also time validate_file's stages (one more run)")
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
    if args.split:
        doc.update(stage_split(args.cases))
    if args.json:
        print(json.dumps(doc, indent=2, default=int))
        return
    for key, value in doc.items():
        print(f"{key}: {value}")


if __name__ == "__main__":
    main()
