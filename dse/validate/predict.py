"""The physics' predictions of the published points (`dse.validate.points`) and of measured serving runs
(`dse.validate.runs`), and the table of the points' errors.
"""

from __future__ import annotations

from dataclasses import fields, replace

import numpy as np
import pandas as pd

from dse.catalog.frameworks import Stack, get_framework, stack_of
from dse.catalog.hardware import Efficiency, EfficiencyCatalog, default_systems
from dse.catalog.models import default_models
from dse.catalog.units import DTYPE_BYTES, DTYPES
from dse.errors import InputError
from dse.physics.codes import DEFAULT_CHUNK
from dse.physics.roofline import ACT_BYTES, Candidates, ModelTable, SystemTable, evaluate
from dse.physics.serving import (
    Request,
    aggregated,
    decode_pool,
    decode_share_closed_loop,
    disaggregated_closed_loop,
    prefill_pool,
)
from dse.validate.points import Point

PREFILL_CHUNK = DEFAULT_CHUNK
"""Prefill tokens per DP rank per pass of the offline benchmarks: the servers' default chunked-prefill budget."""


# ---- the published points --------------------------------------------------------------------------------------------
def _cands(points: list[Point], batch, context, phase: int) -> tuple[Candidates, ModelTable, SystemTable]:
    models = default_models()
    systems = default_systems()
    mids = sorted({p.model for p in points})
    sids = sorted({p.system for p in points})
    mt = ModelTable.build([models[m] for m in mids])
    st = SystemTable.build([systems[s] for s in sids])
    a = np.asarray
    cand = Candidates(
        model=a([mids.index(p.model) for p in points]), system=a([sids.index(p.system) for p in points]),
        tp=a([p.tp for p in points]), dp=a([p.dp for p in points]), ep=a([p.ep for p in points]),
        etp=a([p.tp * p.dp // p.ep for p in points]), pp=a([p.pp for p in points]), batch=batch, context=context,
        phase=phase, weights_dtype=a([DTYPES.index(p.weights_dtype) for p in points]),
        kv_dtype=a([DTYPES.index(p.kv_dtype) for p in points]), kv_tier=0,
    )
    return cand, mt, st


def predict(points: list[Point], eff: Efficiency | None = None) -> np.ndarray:
    """The physics' prediction of every point's measured figure, in the point's unit.

    ``eff`` applies one set of factors to every point; None applies each system's calibration.
    """
    out = np.full(len(points), np.nan)
    kinds = np.array([p.kind for p in points])
    for kind in ("offline", "static", "decode", "prefill", "dispatch"):
        idx = np.flatnonzero(kinds == kind)
        if len(idx) == 0:
            continue
        pts = [points[i] for i in idx]
        div = np.array([p.divide_by for p in pts])
        if kind == "offline":
            out[idx] = _offline(pts, eff)
        elif kind == "static":
            out[idx] = _static(pts, eff)
        elif kind in ("decode", "prefill"):
            cand, mt, st = _cands(pts, np.array([p.batch for p in pts]), np.array([p.context for p in pts]),
                                  0 if kind == "decode" else 1)
            out[idx] = evaluate(cand, mt, st, eff, ttft=False)["tokens_per_s"] / div
        else:
            cand, mt, st = _cands(pts, np.array([p.batch for p in pts]), np.array([p.context for p in pts]), 0)
            r = evaluate(cand, mt, st, eff, ttft=False)
            moe_layers = np.array([default_models()[p.model].moe_layers for p in pts], dtype=float)
            disp = np.where(np.array([DTYPE_BYTES[p.weights_dtype] for p in pts]) < 2, 1.0, ACT_BYTES)
            lat = (eff or st.efficiency_of(cand.system)).latency_scaleout  # EP72 over 8-GPU domains
            transfer = np.maximum(r["ep_comm_s"] / moe_layers - 2 * lat, 0.0)
            out[idx] = transfer * disp / (disp + ACT_BYTES) + lat
    return out


def _offline(pts: list[Point], eff: Efficiency | None) -> np.ndarray:
    isl = np.array([p.isl for p in pts], dtype=float)
    osl = np.array([p.osl for p in pts], dtype=float)
    dp = np.array([p.dp for p in pts], dtype=float)
    ctx_max, ctx_mean = isl + osl, isl + osl / 2
    # capacity: the HBM bytes per chip are affine in the sequences per rank
    c1, mt, st = _cands(pts, dp * 1, ctx_max, 0)
    r1 = evaluate(c1, mt, st, eff, ttft=False)
    r2 = evaluate(replace(c1, batch=dp * 2), mt, st, eff, ttft=False)
    slope = r2["hbm_bytes_per_chip"] - r1["hbm_bytes_per_chip"]
    base = r1["hbm_bytes_per_chip"] - slope
    cap = st.hbm_capacity[c1.system] * (eff or st.efficiency_of(c1.system)).hbm_usable
    n = (cap - base) / slope  # continuous: the fit needs a smooth capacity (the batch is in the thousands)
    batch = np.minimum(np.maximum(n, 0) * dp, np.array([p.max_batch for p in pts]))
    ok = batch >= 1
    batch = np.maximum(batch, 1)
    dec = evaluate(replace(c1, batch=batch, context=ctx_mean), mt, st, eff, ttft=False)["tokens_per_s"]
    per_rank = np.maximum(np.floor(PREFILL_CHUNK / isl), 1)
    pre = evaluate(replace(c1, batch=per_rank * dp, context=isl, phase=1), mt, st, eff, ttft=False)["tokens_per_s"]
    out = 1.0 / (isl / (osl * pre) + 1.0 / dec)
    return np.where(ok, out, 0.0)


STATIC_NODES = 8  # midpoint rule over the decode steps' contexts (step time is piecewise affine in the context)


def _static(pts: list[Point], eff: Efficiency | None) -> np.ndarray:
    """End-to-end latency of a static batch (vLLM ``benchmark_latency``): the B prompts of ISL tokens prefilled in
    one pass, whose last position gives the first output token, then OSL - 1 decode steps of the B sequences at
    contexts ISL + 1 .. ISL + OSL - 1.
    """
    batch = np.array([p.batch for p in pts], dtype=float)
    isl = np.array([p.isl for p in pts], dtype=float)
    steps = np.array([p.osl for p in pts], dtype=float) - 1.0
    cand, mt, st = _cands(pts, batch, isl, 1)
    prefill = evaluate(cand, mt, st, eff, ttft=False)["step_s"]
    decode = np.zeros(len(pts))
    for k in range(STATIC_NODES):
        ctx = isl + 1.0 + (k + 0.5) / STATIC_NODES * np.maximum(steps - 1.0, 0.0)
        decode += evaluate(replace(cand, context=ctx, phase=0), mt, st, eff, ttft=False)["step_s"]
    return prefill + steps * decode / STATIC_NODES


# ---- errors of the points --------------------------------------------------------------------------------------------
def table(points: list[Point], predicted: np.ndarray, ideal: np.ndarray, loo: np.ndarray | None = None,
          ) -> pd.DataFrame:
    """One row per point: measured, predicted, the ideal roofline, errors."""
    df = pd.DataFrame({
        "case": [p.case for p in points], "category": [p.category for p in points], "label": [p.label for p in points],
        "unit": [p.unit for p in points], "measured": [p.measured for p in points], "predicted": predicted,
        "ideal": ideal,
    })
    df["error"] = df["predicted"] / df["measured"] - 1.0
    if loo is not None:
        df["loo_predicted"] = loo
        df["loo_error"] = df["loo_predicted"] / df["measured"] - 1.0
    return df


# ---- measured serving runs -------------------------------------------------------------------------------------------
def run_tables(table: pd.DataFrame, factors: EfficiencyCatalog | None = None, framework: str | None = None,
               ) -> tuple[list[str], list[str], ModelTable, SystemTable]:
    """The table's model and system ids (sorted: the candidates' indices) and their catalog columns, the
    systems calibrated by ``factors`` (default: the catalog's efficiency factors) and reserving HBM as
    ``framework`` does (default: each system's default framework).
    """
    models, systems = sorted(set(table["model"])), sorted(set(table["system"]))
    catalog_m, catalog_s = default_models(), default_systems()
    effs = [factors.for_system(s) for s in systems] if factors else None
    memory = None if framework is None else [get_framework(framework).memory] * len(systems)
    return (models, systems, ModelTable.build([catalog_m[m] for m in models]),
            SystemTable.build([catalog_s[s] for s in systems], effs, memory))


def run_candidates(t: pd.DataFrame, models: list[str], systems: list[str], prefix: str, batch: np.ndarray,
                   context: float, micro_batches: np.ndarray | int = 1) -> Candidates:
    a = np.asarray
    return Candidates(
        model=a([models.index(m) for m in t["model"]]), system=a([systems.index(s) for s in t["system"]]),
        tp=t[prefix + "tp"].to_numpy(), dp=t[prefix + "dp"].to_numpy(), ep=t[prefix + "ep"].to_numpy(),
        etp=t[prefix + "etp"].to_numpy(), pp=t[prefix + "pp"].to_numpy(), batch=batch, context=context,
        weights_dtype=a([DTYPES.index(w) for w in t["wd"]]), kv_dtype=a([DTYPES.index(k) for k in t["kd"]]),
        experts_dtype=a([DTYPES.index(e) for e in t["ed"]]),
        kv_tier=0, micro_batches=micro_batches)


def run_stacks(table: pd.DataFrame, stacks: dict[str, Stack] | None = None) -> dict[str, Stack]:
    """The serving-stack terms each (framework, model) of ``table`` runs with, keyed ``framework|model``:
    ``stacks`` where it names the pair or the framework, else the catalog's fitted ones
    (`dse.catalog.frameworks.stack_of`: the model's own where the fit has them, else the framework's).
    """
    stacks = stacks or {}
    out = {}
    for fw, model in sorted(set(zip(table["backend"].astype(str), table["model"].astype(str), strict=True))):
        key = f"{fw}|{model}"
        try:
            out[key] = stacks.get(key) or stacks.get(fw) or stack_of(get_framework(fw).id, model)
        except InputError as exc:
            raise InputError(f"measured runs, column backend: {exc} (the serving framework the runs used)") from None
    return out


TTFT_PIECES = ("prefill_s", "wave_s", "wait_floor_s", "transfer_s", "admission_s")
"""The pieces of a row's closed-loop TTFT `predict_runs` returns, none of which depends on the serving stack's terms
(`dse.physics.serving.closed_loop_ttft`, with the admission queue's wait added to the hand-off)."""


def outside_stack(t: pd.DataFrame) -> np.ndarray:
    """The part of each row's TTFT added to the prefill's service and wait (``transfer`` of
    `dse.physics.serving.closed_loop_ttft`): the KV hand-off and the wait in the framework's admission queue.
    """
    admission = t["admission_s"].to_numpy(dtype=float) if "admission_s" in t else 0.0  # none where not given
    return t["transfer_s"].to_numpy(dtype=float) + admission


def _rows(cand: Candidates, rows: np.ndarray) -> Candidates:
    """The candidates of ``rows`` (a mask), each field taken where it is given per candidate."""
    c = cand.broadcast()
    return Candidates(*(np.asarray(getattr(c, f.name))[rows] for f in fields(c)))


def admitted(fits_at, stated: np.ndarray) -> np.ndarray:
    """The sequences per micro-batch a replica runs at once, for rows whose memory check fails at the peak context:
    ``stated`` where ``fits_at(batch)`` (the check at each row's batch with its sequences at the context the
    framework's admission holds them at, `dse.catalog.frameworks.ADMISSION`) passes, else the largest whole number of
    sequences it passes at (it fails at more sequences once it fails at fewer, the KV and activations growing with
    the batch), found by bisection; ``stated`` where even one sequence does not fit (the weights do not). A framework
    admits requests while its KV pool holds them: a closed loop holding more keeps the rest in its waiting queue.
    """
    stated = np.asarray(stated, dtype=np.float64)
    fits = np.asarray(fits_at(stated), dtype=bool)
    if fits.all():
        return stated
    lo = np.where(fits, stated, 1.0)
    hi = stated.copy()
    cap = fits | fits_at(lo)
    while True:
        active = cap & ~fits & (hi - lo > 1.0)
        if not active.any():
            break
        mid = np.where(active, np.floor((lo + hi) / 2.0), lo)
        ok = fits_at(mid)
        lo = np.where(active & ok, mid, lo)
        hi = np.where(active & ~ok, mid, hi)
    return np.where(cap, lo, stated)


def predict_runs(table: pd.DataFrame, eff: Efficiency | None = None, two_batch: bool | np.ndarray = False,
                 decode_batch: pd.Series | None = None, factors: EfficiencyCatalog | None = None,
                 stacks: dict[str, Stack] | None = None) -> pd.DataFrame:
    """Predicted TTFT and TPOT (seconds) and whether the configuration fits, per mapped row (same index), by the
    request-level physics the optimizer uses, in a closed loop at the row's concurrency (``arrival:
    concurrency``) through its framework's serving stack (``stacks``, default the catalog's fitted terms). With
    them the pieces TTFT is made of (`dse.physics.serving.closed_loop_ttft`): ``prefill_s`` (the prompt's
    prefill service), ``wave_s`` (the wait behind every other request in flight at its prefill server),
    ``wait_floor_s`` (the saturated loop's wait) and ``transfer_s`` (the KV hand-off), none of which depends on the
    stack's terms, so they can be refitted without re-running the physics.
    ``two_batch`` runs every row's decode passes as two overlapped micro-batches
    (`dse.physics.roofline._split_pass`), or those of the rows where it holds (an array over the rows). A
    disaggregated row's decode replicas hold the requests past their prefill (`decode_share_closed_loop`;
    their batch per replica in ``decode_batch``), or
    ``decode_batch`` where it is given (the ideal roofline at the calibrated physics' operating point); an
    aggregated row then runs the batch given (the one its framework admitted as the calibrated physics reserves
    memory) instead of admitting its own.
    ``factors``: the efficiency factors per system where ``eff`` is None (default: the catalog's).
    """
    names = ["predicted_ttft_s", "predicted_tpot_s", "fits", *TTFT_PIECES, "decode_batch"]
    if table.empty:
        return pd.DataFrame(index=table.index, columns=names, dtype=float)
    out = {k: np.full(len(table), np.nan) for k in names}  # by position, each group's rows written at once
    out["admission_s"][:] = 0.0
    models, systems, mt, _ = run_tables(table, factors)
    stack = run_stacks(table, stacks)
    # each run's HBM as its framework reserves it
    tables = {fw: run_tables(table, factors, fw)[3] for fw in set(table["backend"].astype(str))}
    micro = pd.Series(np.where(two_batch, 2, 1) * np.ones(len(table), dtype=np.int64), index=table.index)
    grouped = table.groupby(["backend", "model", "mode", "isl", "osl"], sort=False)
    for (fw, model, mode, isl, osl), g in grouped:
        at = grouped.indices[(fw, model, mode, isl, osl)]
        req = Request(int(isl), int(osl), arrival="concurrency", stack=stack[f"{fw}|{model}"])
        st = tables[str(fw)]
        per_stage = g["in_flight"].to_numpy() / g["pp"].to_numpy()  # sequences per micro-batch of a replica
        cand = run_candidates(g, models, systems, "", per_stage, isl + osl, micro[g.index].to_numpy())
        if mode == "agg":
            r = aggregated(cand, mt, st, req, eff)
            tpot, fits, transfer = r["tpot_s"], r["fits"], np.zeros(len(g))
            # the KV of b sequences at the mean context P + O / 2 is that of b (P + O / 2) / (P + O) at the peak
            held = (isl + osl / 2.0) / (isl + osl) if get_framework(str(fw)).admission == "prompt" else 1.0
            running = per_stage.astype(float)
            over = ~np.asarray(fits, dtype=bool)
            if decode_batch is not None:  # the operating point given: the batch the calibrated physics admitted
                running = np.minimum(decode_batch[g.index].to_numpy(dtype=float) / g["pp"].to_numpy(), per_stage)
            elif over.any():  # the check again on those rows alone, at each trial batch
                sub = _rows(cand, over)
                running[over] = admitted(lambda b, sub=sub, req=req, st=st, held=held: aggregated(
                    replace(sub, batch=b * held), mt, st, req, eff)["fits"], per_stage[over])
            if (running < per_stage).any():  # the framework admits what its KV pool holds, the rest queue
                r = aggregated(replace(cand, batch=running), mt, st, req, eff)
                tpot = r["tpot_s"]
                admission = (per_stage - running) * g["pp"].to_numpy() / r["requests_per_s"]
                out["admission_s"][at] = admission
                r = {**r, "ttft_s": r["ttft_s"] + admission}
            out["decode_batch"][at] = running * g["pp"].to_numpy()
        else:
            pre_t = g[["model", "system", "wd", "ed", "kd"]].assign(**{k: g[f"p_{k}"] for k in ("tp", "dp", "ep", "etp",
                                                                                          "pp")})
            pcand = run_candidates(pre_t, models, systems, "", np.ones(len(g)), isl)
            pre = prefill_pool(pcand, mt, st, req, False, eff, full_chunk=True)
            pp = g["pp"].to_numpy()

            def decode_at(n: np.ndarray, cand=cand, pp=pp, req=req, st=st) -> dict:
                return decode_pool(replace(cand, batch=n / pp), mt, st, req, eff)

            if decode_batch is None:
                r, dec = decode_share_closed_loop(decode_at, pre, req, g["concurrency"].to_numpy(),
                                                  g["p_replicas"].to_numpy(), g["replicas"].to_numpy())
            else:
                dec = decode_at(decode_batch[g.index].to_numpy())
                r = disaggregated_closed_loop(dec, pre, req, g["concurrency"].to_numpy(), g["p_replicas"].to_numpy())
                r["decode_batch"] = decode_batch[g.index].to_numpy()
            out["decode_batch"][at] = r["decode_batch"]
            tpot, fits, transfer = r["tpot_s"], dec["fits"] & pre["fits"], pre["kv_transfer_s"]
            r["prefill_service_s"] = pre["prefill_service_s"]
        out["prefill_s"][at] = r["prefill_service_s"]
        out["wave_s"][at] = r["wave_s"]
        out["wait_floor_s"][at] = r["wait_floor_s"]
        out["transfer_s"][at] = transfer
        out["predicted_ttft_s"][at] = r["ttft_s"]
        out["predicted_tpot_s"][at] = tpot
        out["fits"][at] = np.asarray(fits, dtype=float)
    return pd.DataFrame(out, index=table.index)


def predict_runs_split(table: pd.DataFrame, split: np.ndarray, factors: EfficiencyCatalog | None = None,
                       ) -> tuple[pd.DataFrame, pd.DataFrame]:
    """`predict_runs` of every row, and of the rows of ``split`` with two micro-batches, in one evaluation of
    the physics (each row's prediction is its own, whatever rows it is evaluated with).
    """
    both = pd.concat([table, table[split]], ignore_index=True)
    out = predict_runs(both, two_batch=np.arange(len(both)) >= len(table), factors=factors)
    one, two = out.iloc[:len(table)].copy(), out.iloc[len(table):].copy()
    one.index, two.index = table.index, table.index[split]
    return one, two
