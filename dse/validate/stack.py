"""The serving stack's terms per framework and mode (`dse.catalog.frameworks.StackTerms`: the fixed latency of the
stack outside the forward passes and the closed loop's queue share), fitted on measured serving runs and stored in
hw_catalog/calibration/serving_stack.yaml (`dse validate --fit`), where the optimizer and `dse validate` read them.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from dse.catalog.frameworks import MODES, STACK_FILE, StackTerms
from dse.physics.serving import closed_loop_ttft
from dse.validate.fit import FIXED_LATENCIES, MIN_SWEEPS, QUEUE_SHARES, fit_stack
from dse.validate.predict import TTFT_PIECES, outside_stack, predict_runs
from dse.validate.runs import DEPLOYMENT, group_key, map_runs, read_runs_files

MODE_NAMES = {"agg": "aggregated", "disagg": "disaggregated"}

FALLING_TTFT = 2.0
"""How many times the TTFT measured on one deployment at a higher concurrency a measurement may be and still be read
by the stack fit (`falls_with_load`). A closed loop's TTFT does not fall as the load rises on one deployment (the
physics' wave and saturated-loop wait both rise with the concurrency). Repeated measurements of one deployment at one
concurrency (148 in the catalog's measured runs whose layout is stated) differ by a median 1.04x and by 1.52x at the
90th percentile (by more than 2x in 11): a fall of more than 2x, against the physics' direction, is beyond the spread
of 9 repeats in 10."""


def falls_with_load(t: pd.DataFrame) -> np.ndarray:
    """The measurements whose TTFT is more than `FALLING_TTFT` times the TTFT measured on the same deployment (its
    sweep, `group_key`, and every column of `DEPLOYMENT`) at a higher concurrency: a state of the benchmark that no
    closed loop at that load has (a first run's warm-up, a queue left by a previous run), contradicted by the same
    deployment under more load. Of the 2,050 rows of the catalog's NVIDIA measured runs that state their layout, 10
    (two disaggregated: 38.6 s on GB200 at 4 in flight, where 36 in flight measure 10.9 s); with the AMD and TPU runs,
    12 of 2,071.
    """
    out = np.zeros(len(t), dtype=bool)
    if t.empty:
        return out
    cols = [c for c in DEPLOYMENT if c in t]
    deployment = pd.concat([group_key(t).rename("sweep"), t[cols]], axis=1).groupby(
        ["sweep", *cols], sort=False, dropna=False).ngroup().to_numpy()
    conc = t["concurrency"].to_numpy(dtype=float)
    ttft = t["measured_ttft_s"].to_numpy(dtype=float)
    for rows in pd.Series(np.arange(len(t))).groupby(deployment, sort=False).indices.values():
        if len(rows) < 2:
            continue
        c, v = conc[rows], ttft[rows]
        above = c[None, :] > c[:, None]  # [i, j]: j runs at a higher concurrency than i
        out[rows] = (above & (v[:, None] > FALLING_TTFT * v[None, :])).any(axis=1)
    return out


def beyond_every_loop(t: pd.DataFrame) -> np.ndarray:
    """The measurements whose TTFT is more than `FALLING_TTFT` times the longest closed loop the stack fit can
    give them (`dse.physics.serving.closed_loop_ttft` at the top of both grids: the row's prefill, the whole wave of
    the other requests in flight ahead of it (xi = 1) or the saturated loop's wait, its hand-off and the longest
    fixed latency, `FIXED_LATENCIES`): a state of the benchmark outside the forward passes and the queue (as a
    warm-up is) that no terms reach, so read it only drags its key's terms to the edge of their grids. Of the 2,050
    rows of the catalog's NVIDIA measured runs that state their layout, 35 (none of the AMD and TPU runs), 2 of them
    also falling with load: 9 disaggregated DeepSeek runs on GB200 with TRT-LLM (25.0 s at 7 in flight for a
    1,024-token prompt whose prefill takes 0.04 s), 12 aggregated DeepSeek runs on B200 with SGLang (7.1-9.2 s at 32
    to 128 in flight, prefills of 0.02-0.04 s and waves of at most 2.1 s), 14 others on H100, H200, B200 and B300.
    """
    if t.empty:
        return np.zeros(0, dtype=bool)
    prefill, wave, floor = (t[c].to_numpy(dtype=float) for c in ("prefill_s", "wave_s", "wait_floor_s"))
    longest = closed_loop_ttft(prefill, outside_stack(t), wave,
                               StackTerms(fixed_latency_s=FIXED_LATENCIES[-1], queue_share=QUEUE_SHARES[-1]), floor)
    return t["measured_ttft_s"].to_numpy(dtype=float) > FALLING_TTFT * longest


def stack_rows(t: pd.DataFrame) -> np.ndarray:
    """The rows the stack's terms are fitted on: those whose layout the file states (a disaggregated row whose
    worker counts the file leaves empty has an unknown number of requests per prefill server, and so an unknown wave),
    less those whose TTFT falls with load (`falls_with_load`): no (xi, tau) fits a TTFT that falls as the load rises,
    and read they pull their framework's terms (on the measured runs, the leave-group-out TTFT of GB200
    disaggregated from 31.3% to 42.3%), and less those beyond every closed loop (`beyond_every_loop`: with them read,
    the disaggregated rows' leave-group-out TTFT errs 38.1%, without 35.3%). They are predicted and judged as every
    row is.
    """
    stated = (t["layout"] == "stated").to_numpy()
    out = stated.copy()
    out[stated] = ~falls_with_load(t[stated])  # a deployment compared with itself only where its layout is stated
    return out & ~beyond_every_loop(t)


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
    families: dict[tuple[str, str], dict[str, dict[str, tuple]]] = {}
    for key, f in fits.items():
        parts = key.split("|")
        if len(parts) == 2:
            per.setdefault(parts[0], {})[MODE_NAMES[parts[1]]] = (f["terms"], f["rows"], f["sweeps"])
        elif len(parts) == 3:
            models.setdefault(parts[0], {}).setdefault(parts[2], {})[MODE_NAMES[parts[1]]] = (
                f["terms"], f["rows"], f["sweeps"])
        elif len(parts) == 4:  # a model's terms in one mode on one hardware family ("": the framework's)
            families.setdefault((parts[0], parts[2]), {}).setdefault(parts[3], {})[MODE_NAMES[parts[1]]] = (
                f["terms"], f["rows"], f["sweeps"])

    def entry(terms: StackTerms, rows: int, sweeps: int) -> str:
        return (f"{{fixed_latency_s: {terms.fixed_latency_s:g}, queue_share: {terms.queue_share:g}, rows: {rows}, "
                f"sweeps: {sweeps}}}")

    lines = [
        "# The serving stack's terms per framework and deployment mode, fitted by `dse validate --fit`",
        f"# (dse.validate.stack) on the measured runs of {runs_name} whose layouts are stated (less those whose",
        f"# TTFT is over {FALLING_TTFT:g}x the TTFT of the same deployment at a higher concurrency or over "
        f"{FALLING_TTFT:g}x the",
        "# longest any terms give them, beyond every closed loop), each run",
        "# predicted by the request-level physics in a closed loop at its concurrency (dse.physics.serving): TTFT =",
        "# the prompt's prefill + queue_share x the wave (the wait behind every other request in flight at its prefill",
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
        f"# families: a model's terms in a mode on one hardware family where it has {MIN_SWEEPS} sweeps or more there",
        "# (the same framework runs other kernels and a scheduler tuned for other chips, and disaggregated, a KV",
        "# hand-off over the family's fabric with its transfer library); a deployment on another family takes the",
        "# model's. A framework's families: its terms in a mode on a family, fitted on all its models' rows there,",
        "# for a model with no terms of its own in that mode.",
        "",
        f"fitted: '{date}'",
        f"runs: {runs_name}",
        "stack:",
    ]
    def family_lines(mine: dict, indent: str) -> list[str]:
        return [f"{indent}families:"] + [f"{indent}  {fam}: {{" + ", ".join(
            f"{mode}: {entry(*mine[fam][mode])}" for mode in MODES if mode in mine[fam]) + "}" for fam in sorted(mine)]

    for fw in sorted(per):
        lines.append(f"  {fw}:")
        lines += [f"    {mode}: {entry(*per[fw][mode])}" for mode in MODES if mode in per[fw]]
        # the framework's on a family: not written again where fitted on all of the framework's rows in that mode
        mine = {fam: {mode: e for mode, e in per_mode.items() if e[1] != per[fw].get(mode, (None, -1))[1]}
                for fam, per_mode in families.get((fw, ""), {}).items()}
        mine = {fam: m for fam, m in mine.items() if m}
        if mine:
            lines += family_lines(mine, "    ")
        if models.get(fw):
            lines.append("    models:")
            for mid in sorted(models[fw]):
                lines.append(f"      {mid}:")
                lines += [f"        {mode}: {entry(*models[fw][mid][mode])}" for mode in MODES
                          if mode in models[fw][mid]]
                # a family's terms fitted on all of the model's rows in that mode are the model's: not written again
                mine = {fam: {mode: e for mode, e in per_mode.items()
                              if e[1] != models[fw][mid].get(mode, (None, -1))[1]}
                        for fam, per_mode in families.get((fw, mid), {}).items()}
                mine = {fam: m for fam, m in mine.items() if m}
                if mine:
                    lines += family_lines(mine, "        ")
    path = Path(folder) / "calibration" / STACK_FILE
    path.write_text("\n".join(lines) + "\n")
    return path
