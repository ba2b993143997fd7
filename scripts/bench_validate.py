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

    inside = []  # the calls of fit_factors_many under way (it calls itself, and fit_factors for a fit alone)

    def counted_one(*args, **kwargs):
        counts["fits_one_at_a_time"] += 1
        counts["fits_together"] -= bool(inside)  # made alone after all
        return one_at_a_time(*args, **kwargs)

    def counted_many(fits, *args, **kwargs):
        counts["fits_together"] += 0 if inside else len(fits)
        inside.append(True)
        try:
            return together(fits, *args, **kwargs)
        finally:
            inside.pop()

    fit.fit_factors, fit.fit_factors_many, fit.loss_of = counted_one, counted_many, counted_loss_of
    losses.Plan.losses = counted_plan_losses
    max_workers, fit.MAX_WORKERS = fit.MAX_WORKERS, 1  # the fits in this process, where the counters are
    try:
        validate_file(cases, cache=False)
    finally:
        fit.fit_factors, fit.fit_factors_many, fit.loss_of = one_at_a_time, together, loss_of
        losses.Plan.losses = plan_losses
        fit.MAX_WORKERS = max_workers
    return counts


STAGES = (("predicted_passes", "run", "predicted_passes"), ("decode_fits_in_sample", "fit", "fit_factors"),
          ("decode_fits_left_out", "fit", "fit_factors_many"), ("decode_fits_other", "run", "refit_tpot_sets"),
          ("ideal_roofline", "run", "predict_runs"), ("stack_fits", "run", "fit_stack_sets"))
"""`validate_file`'s stages, each timed where it is called (module `dse.validate.<module>`, function): the decode
fits' time less the fits per key (in sample, one at a time) and the left-out fits (together; a left-out fit that
`fit_factors_many` makes alone counts among them) is the two-batch choice and the terms they read."""


def stage_split(cases: Path) -> dict:
    """CPU seconds of one `validate_file` run in this process (no cache; the fits in this process too, not in
    worker processes) and of each of its `STAGES` (the rest: reading and mapping the runs, the TPOT and TTFT
    columns, the rows of unknown layout).
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
            if name in running or (name == "decode_fits_in_sample" and "decode_fits_left_out" in running):
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
    max_workers, modules["fit"].MAX_WORKERS = modules["fit"].MAX_WORKERS, 1
    try:
        start = time.process_time()
        validate_file(cases, cache=False)
        total = time.process_time() - start
    finally:
        for module, f, func in originals:
            setattr(module, f, func)
        modules["fit"].MAX_WORKERS = max_workers
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
