"""The serving stack's terms per framework and mode (`dse.catalog.frameworks.StackTerms`: the fixed latency of the
stack outside the forward passes and the closed loop's queue share), fitted on measured serving runs and stored in
hw_catalog/calibration/serving_stack.yaml (`dse validate --fit`), where the optimizer and `dse validate` read them.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from dse.catalog.frameworks import MODES, STACK_FILE, StackTerms
from dse.validate.fit import FIXED_LATENCIES, MIN_SWEEPS, QUEUE_SHARES, fit_stack
from dse.validate.predict import TTFT_PIECES, predict_runs
from dse.validate.runs import group_key, map_runs, read_runs_files

MODE_NAMES = {"agg": "aggregated", "disagg": "disaggregated"}


def stack_rows(t: pd.DataFrame) -> np.ndarray:
    """The rows the stack's terms are fitted on: those whose layout the file states (a disaggregated row whose
    worker counts the file leaves empty has an unknown number of requests per prefill server, and so an unknown wave).
    """
    return (t["layout"] == "stated").to_numpy()


def fit_stack_files(paths: list[Path], factors=None) -> tuple[dict, pd.DataFrame]:
    """The terms per (framework, mode) fitted on the measured runs of ``paths`` (read as one) at ``factors`` (an
    `EfficiencyCatalog`; default the catalog's), and the rows with their closed-loop TTFT pieces
    (`dse.validate.predict.predict_runs`).
    """
    t = map_runs(read_runs_files(paths)).table
    pred = predict_runs(t, factors=factors)
    for col in TTFT_PIECES:
        t[col] = pred[col].astype(float)
    fits, _, _ = fit_stack(t, group_key(t), stack_rows(t))
    return fits, t


def write_stack(fits: dict, folder: Path, date: str, runs_name: str) -> Path:
    """Write calibration/serving_stack.yaml: per framework and mode, and per framework, model and mode where a
    model has terms of its own, the fitted terms and the rows they rest on.
    """
    per: dict[str, dict[str, tuple]] = {}
    models: dict[str, dict[str, dict[str, tuple]]] = {}
    for key, f in fits.items():
        parts = key.split("|")
        if len(parts) == 2:
            per.setdefault(parts[0], {})[MODE_NAMES[parts[1]]] = (f["terms"], f["rows"], f["sweeps"])
        elif len(parts) == 3:
            models.setdefault(parts[0], {}).setdefault(parts[2], {})[MODE_NAMES[parts[1]]] = (
                f["terms"], f["rows"], f["sweeps"])

    def entry(terms: StackTerms, rows: int, sweeps: int) -> str:
        return (f"{{fixed_latency_s: {terms.fixed_latency_s:g}, queue_share: {terms.queue_share:g}, rows: {rows}, "
                f"sweeps: {sweeps}}}")

    lines = [
        "# The serving stack's terms per framework and deployment mode, fitted by `dse validate --fit`",
        f"# (dse.validate.stack) on the measured runs of {runs_name} whose layouts are stated, each run predicted",
        "# by the request-level physics in a closed loop at its concurrency (dse.physics.serving): TTFT = the",
        "# prompt's prefill + queue_share x the wave (the wait behind every other request in flight at its prefill",
        "# server) + the KV transfer + fixed_latency_s, minimizing the mean |log(predicted / measured)| TTFT on grids",
        f"# (queue_share {QUEUE_SHARES[0]:g} to {QUEUE_SHARES[-1]:g}, fixed_latency_s {FIXED_LATENCIES[0]:g} to "
        f"{FIXED_LATENCIES[-1]:g} s).",
        "# fixed_latency_s: the stack's latency outside the forward passes (HTTP, tokenization, scheduling, the first",
        "# token's detokenization and streaming), in every TTFT the optimizer predicts (Poisson arrivals too).",
        "# queue_share: the closed loop's mean wait over the wave (1/2: requests move in synchronized waves; 0: they",
        "# are staggered), used under `arrival: concurrency` only. rows, sweeps: the runs the terms rest on; a mode",
        f"# with fewer than {MIN_SWEEPS} sweeps of its own takes the terms fitted on all of its framework's runs.",
        f"# models: a model's own terms on the framework and mode where it has {MIN_SWEEPS} sweeps or more there (the",
        "# stack's latency and queue share differ by model: tokenizer and chat template, the kernels and scheduling",
        "# paths its prefill takes); another model, or a mode the model has no terms of, takes the framework's.",
        "",
        f"fitted: '{date}'",
        f"runs: {runs_name}",
        "stack:",
    ]
    for fw in sorted(per):
        lines.append(f"  {fw}:")
        lines += [f"    {mode}: {entry(*per[fw][mode])}" for mode in MODES if mode in per[fw]]
        if models.get(fw):
            lines.append("    models:")
            for mid in sorted(models[fw]):
                lines.append(f"      {mid}:")
                lines += [f"        {mode}: {entry(*models[fw][mid][mode])}" for mode in MODES
                          if mode in models[fw][mid]]
    path = Path(folder) / "calibration" / STACK_FILE
    path.write_text("\n".join(lines) + "\n")
    return path
