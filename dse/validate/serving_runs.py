"""Measured serving runs (the columns of ``shared/data/measured_serving.csv``) predicted by the request-level
physics, with errors by partition and leave-group-out cross-validation.

A row is one benchmark run: ``concurrency`` requests of ``isl`` prompt and ``osl`` output tokens kept in
flight (a closed loop: each request is replaced as it completes) against one deployment. How a row maps to
the physics (`dse.physics.serving`):

- Model and system: ``model_path`` (a Hugging Face id; quantized re-releases map to their base model) and
  ``system`` map to catalog ids (`MODEL_IDS`, `SYSTEM_IDS`); a row of another model or system is skipped
  with the reason.
- Number formats: ``gemm_quant_mode`` / ``precision`` give the weights format (``fp8`` and ``fp8_block``
  -> fp8, ``nvfp4`` / ``fp4`` -> fp4, ``int4_wo`` -> int4, none -> bf16). An int4 MoE checkpoint holds its
  routed experts in int4 and the rest in BF16 (as Kimi-K2.5's release does: W4A16 experts), computed in
  BF16 after dequantization (`INTEGER_DTYPES`). The KV format is not in the data: fp8 where the weights are
  fp8 or fp4, else bf16 (the frameworks' FP8 recipes quantize the KV cache with the weights).
- Layout (agg, and each pool of disagg): attention runs as ``tp_size`` x ``attention_dp_size`` and experts
  as ``moe_ep_size`` x ``moe_tp_size`` over the same chips (the two products must agree; a dense model has
  no expert split), ``pp_size`` stages. A missing degree is 1. Attention TP must divide the model's heads (no
  framework runs it otherwise, and `dse evaluate` refuses it): where it does not and attention DP is left
  empty, the chips run attention DP; where attention DP is stated, the row contradicts itself and is skipped.
- agg: ``batch_size`` is the configured sequences per attention-DP rank, so a replica holds
  batch_size x attention_dp_size sequences; a concurrency above that is spread over
  concurrency / (batch_size x attention_dp_size) replicas. Each replica is `aggregated` at its share of
  the requests in flight (in-flight batching with chunked prefill, closed loop by Little's law).
- disagg: ``prefill_num_workers`` prefill replicas serve one prompt per DP rank (`prefill_pool`);
  ``decode_num_workers`` decode replicas share the requests in flight that are past their prefill: of C in
  flight, lambda TTFT are queued, prefilling or handing off their KV (`decode_share_closed_loop`, Little's law
  over both stages); the closed loop gives the request rate, and with it the prefill queueing in TTFT.
  Where the file leaves the worker counts empty: one prefill worker, and as many decode workers as
  concurrency / (decode_batch_size x attention DP) (the rows that state all three satisfy it exactly).
- Rows whose concurrency is missing take the layout's batch in flight.

Errors are predicted / measured - 1 of the median TTFT and TPOT. Rows of one (model, system, framework,
mode, ISL, OSL) group are one concurrency sweep and are correlated, so the headline figure leaves whole
groups out and predicts the group left out from fits on the others:

- TPOT: two-batch overlap switched on per (framework, mode) where it lowers that framework's spread of errors
  (`_two_batch_choice`: the data, not a list of framework features, decide; on the measured runs, TRT-LLM's
  disaggregated decode), then the decode pass's nine efficiency factors (`dse.validate.decode_factors`:
  achieved shares of peak compute, HBM and link bandwidth, latency per collective inside and across domains,
  fixed time per layer and per MoE layer, a GEMM's half-performance rows and decode attention's
  half-performance context) fitted per hardware family and framework on the rows' decode passes, apart for
  the disaggregated rows whose worker counts were assumed (`factor_key`); the left-out sweep is predicted
  with the factors refitted without it. A factor set per framework is there because the data demand it: one
  per family shared by the frameworks (`family_key`, as the catalog's `dse validate --fit` has it) errs more
  out of sample (``loo_family_factors_median_abs_error``).
- TTFT: the physics' TTFT assumes Poisson arrivals (M/D/1 queueing at the prefill servers), a benchmark holds
  a fixed number of identical requests in flight instead. Measured TTFT grows linearly with the concurrency
  in nearly every sweep (R^2 > 0.9 in most of the 286 aggregated sweeps with 4 or more concurrencies), at a
  slope of a fraction of one prompt's prefill per request in flight, from an intercept of one prefill plus a
  fixed latency. `benchmark_ttft` models that: one prompt's prefill S on its server, plus the prompts of a
  share xi of the other requests in flight on that server queued ahead of it, each costing its share of a
  pass that carries a full chunk of prompts (queued prompts are prefilled together), plus the KV hand-off
  (disaggregated), plus the serving stack's fixed latency tau; (xi, tau) are fitted per (framework, mode) on
  grids (xi in [0, 1/2]: 1/2 is a synchronized wave) by least absolute log error. ``error`` (the shipped
  physics) stays the M/D/1 prediction.
"""

from __future__ import annotations

import codecs
import csv
import io
import math
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import pandas as pd

from dse.catalog.calibration import family_of
from dse.catalog.hardware import CURVES, IDEAL, Efficiency, EfficiencyCatalog, default_systems
from dse.catalog.models import default_models
from dse.catalog.units import DTYPES, INTEGER_DTYPES
from dse.errors import InputError
from dse.physics.roofline import Candidates, ModelTable, SystemTable, evaluate_at
from dse.physics.serving import (
    Request,
    aggregated,
    decode_pool,
    decode_share_closed_loop,
    disaggregated_closed_loop,
    prefill_pool,
)
from dse.validate.decode_factors import (
    FACTORS,
    FIXED_TIMES,
    FRACTIONS,
    USES,
    DecodeTerms,
    fit_factors,
    identified,
    tpot_at,
)

MODEL_IDS = {
    "deepseek-ai/DeepSeek-R1": "deepseek-v3", "deepseek-ai/DeepSeek-V3": "deepseek-v3",
    "nvidia/DeepSeek-V3.1-NVFP4": "deepseek-v3",  # V3.1 keeps the V3 architecture
    "meta-llama/Llama-3.1-70B": "llama-3.1-70b", "meta-llama/Llama-3.1-8B-Instruct": "llama-3.1-8b",
    "nvidia/Llama-3.1-8B-Instruct-FP8": "llama-3.1-8b", "openai/gpt-oss-120b": "gpt-oss-120b",
    "MiniMaxAI/MiniMax-M2.5": "minimax-m2.5", "Qwen/Qwen3-32B": "qwen3-32b", "nvidia/Qwen3-32B-NVFP4": "qwen3-32b",
    "Qwen/Qwen3.5-397B-A17B": "qwen3.5-397b-a17b", "Qwen/Qwen3-235B-A22B-FP8": "qwen3-235b-a22b",
    "Qwen/Qwen3-235B-A22B": "qwen3-235b-a22b", "moonshotai/Kimi-K2.5": "kimi-k2.5", "zhipuai/GLM-5": "glm-5",
    "meta-llama/Llama-3.3-70B-Instruct": "llama-3.3-70b", "amd/Llama-3.1-70B-Instruct-FP8-KV": "llama-3.1-70b",
    "amd/Llama-3.1-405B-Instruct-FP8-KV": "llama-3.1-405b", "Qwen/Qwen3.5-397B-A17B-FP8": "qwen3.5-397b-a17b",
}
"""Hugging Face ids of the measured models -> catalog ids (quantized re-releases keep their architecture)."""
SYSTEM_IDS = {"h100_sxm": "h100", "h200_sxm": "h200", "b200_sxm": "b200", "b300_sxm": "b300", "gb200": "gb200-nvl72",
              "mi300x": "mi300x", "mi325x": "mi325x", "mi355x": "mi355x", "tpu_v5e": "tpu-v5e", "tpu_v6e": "tpu-v6e",
              "tpu_v7": "tpu-v7"}
WEIGHTS = {"fp8": "fp8", "fp8_block": "fp8", "nvfp4": "fp4", "fp4": "fp4", "bf16": "bf16", "float16": "bf16",
           "fp16": "bf16", "int4_wo": "int4", "int4": "int4"}
REQUIRED = ("id", "model_path", "system", "mode", "isl", "osl", "silicon_ttft_ms", "silicon_tpot_ms")
NUMERIC = ("concurrency", "isl", "osl", "batch_size", "tp_size", "pp_size", "attention_dp_size", "moe_tp_size",
           "moe_ep_size", "prefill_batch_size", "prefill_num_workers", "prefill_tp_size", "prefill_pp_size",
           "prefill_attention_dp_size", "prefill_moe_tp_size", "prefill_moe_ep_size", "decode_batch_size",
           "decode_num_workers", "decode_tp_size", "decode_pp_size", "decode_attention_dp_size",
           "decode_moe_tp_size", "decode_moe_ep_size", "silicon_ttft_ms", "silicon_tpot_ms")
GROUP = ("model", "system", "backend", "mode", "isl", "osl")
"""One concurrency sweep: the unit left out by the cross-validation."""
METRICS = ("ttft", "tpot")
CONCURRENCY_BANDS = (0, 8, 32, 128, 512, math.inf)


@dataclass
class Runs:
    """The rows the physics can represent (one per row, mapped) and the others with their reasons."""

    table: pd.DataFrame
    skipped: list[dict] = field(default_factory=list)
    given: int = 0


MAX_CSV_BYTES = 256_000_000
"""Largest measured-runs file read (bytes)."""
WHOLE = tuple(c for c in NUMERIC if not c.startswith("silicon_"))
"""Columns that count (tokens, requests, chips, workers): whole numbers (8192 or 8192.0, not 8192.5)."""
_SHAPE = (f"a measured-runs file is UTF-8 CSV: a header line naming the columns (at least {', '.join(REQUIRED)}) "
          "and one line per run")


def _csv_records(path: Path) -> tuple[list[str], list[list[str]], list[int]]:
    """The header, the rows (perhaps none) and each row's line number of a CSV file (blank lines skipped); a file
    that is not UTF-8 CSV with one header of distinct names and rows as wide as it is an InputError naming the
    line.
    """
    if not path.exists():
        raise InputError(f"{path}: no such file")
    if not path.is_file():
        raise InputError(f"{path}: not a file (a folder?); {_SHAPE}")
    try:
        if path.stat().st_size > MAX_CSV_BYTES:
            raise InputError(f"{path}: file of {path.stat().st_size:,} bytes; at most {MAX_CSV_BYTES:,} are read")
        data = path.read_bytes()
    except OSError as exc:
        raise InputError(f"{path}: cannot read: {exc.strerror}") from None
    for bom, name in ((codecs.BOM_UTF32_LE, "UTF-32"), (codecs.BOM_UTF32_BE, "UTF-32"),
                      (codecs.BOM_UTF16_LE, "UTF-16"), (codecs.BOM_UTF16_BE, "UTF-16")):
        if data.startswith(bom):
            raise InputError(f"{path}: {name} text; save it as UTF-8 ({_SHAPE})")
    if b"\x00" in data:
        line = data.count(b"\n", 0, data.index(b"\x00")) + 1
        raise InputError(f"{path}: line {line}: a NUL byte; not a text file ({_SHAPE})")
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise InputError(f"{path}: line {line}: byte 0x{data[exc.start]:02x} is not UTF-8; save the file as UTF-8"
                         ) from None
    if not text.strip():
        raise InputError(f"{path}: empty file; {_SHAPE}")
    reader = csv.reader(io.StringIO(text, newline=""), strict=True)
    header: list[str] | None = None
    rows, lines = [], []
    while True:
        line = reader.line_num + 1
        try:
            record = next(reader)
        except StopIteration:
            break
        except csv.Error as exc:
            raise InputError(f"{path}: line {line}: not valid CSV ({exc})") from None
        if not record:
            continue  # a blank line
        if header is None:
            header = record
            seen: dict[str, int] = {}
            for i, name in enumerate(header, 1):
                if not name.strip():
                    raise InputError(f"{path}: line {line}: column {i} of the header has no name; {_SHAPE}")
                if name in seen:
                    raise InputError(f"{path}: line {line}: column '{name}' given twice in the header (columns "
                                     f"{seen[name]} and {i}); each column may appear once")
                seen[name] = i
            continue
        if len(record) != len(header):
            n = len(record)
            raise InputError(f"{path}: line {line}: {n} field{'' if n == 1 else 's'}, the header has "
                             f"{len(header)}; each run is one line with a value (or nothing) for every column")
        rows.append(record)
        lines.append(line)
    return header, rows, lines


def read_runs(path: Path) -> pd.DataFrame:
    """Read a CSV of measured runs: UTF-8 (a byte-order mark is skipped), a header of distinct column names with
    at least the `REQUIRED` ones, every line as wide as the header (blank lines skipped), a distinct non-empty
    ``id`` per run, and in the `NUMERIC` columns nothing or a finite number >= 0 (a whole one in the `WHOLE`
    columns). Anything else is an InputError naming the file and the line (``row N`` for a value: N is the
    line number, the header being row 1) and the column.
    """
    path = Path(path)
    header, rows, lines = _csv_records(path)
    missing = [c for c in REQUIRED if c not in header]
    if missing:
        raise InputError(f"{path}: missing column(s) {', '.join(missing)}; a measured-runs file has the columns "
                         f"of measured_serving.csv (at least {', '.join(REQUIRED)})")
    if not rows:
        raise InputError(f"{path}: a header but no rows; {_SHAPE}")
    raw = pd.DataFrame(rows, columns=header, dtype=str)
    first: dict[str, int] = {}
    for i, run in enumerate(raw["id"]):
        if not run.strip():
            raise InputError(f"{path}: line {lines[i]}: column 'id' is empty; each run needs an id")
        if run in first:
            raise InputError(f"{path}: line {lines[i]}: column 'id': {run!r} is already the id of line "
                             f"{lines[first[run]]}; each run has its own id")
        first[run] = i
    out = raw.copy()
    for col in NUMERIC:
        if col not in raw.columns:
            out[col] = np.nan
            continue
        text = raw[col].str.strip()
        values = pd.to_numeric(text.where(text != "", None), errors="coerce")
        bad = text.ne("") & values.isna()
        if bad.any():
            i = int(np.flatnonzero(bad.to_numpy())[0])
            raise InputError(f"{path}: row {lines[i]} (id {raw['id'].iloc[i]}), column '{col}': {text.iloc[i]!r} "
                             "is not a number")
        if ((values < 0) | ~np.isfinite(values.fillna(0))).any():
            i = int(np.flatnonzero(((values < 0) | ~np.isfinite(values.fillna(0))).to_numpy())[0])
            raise InputError(f"{path}: row {lines[i]} (id {raw['id'].iloc[i]}), column '{col}': must be a finite "
                             f"number >= 0, got {text.iloc[i]!r}")
        if col in WHOLE and (values.fillna(0) % 1 != 0).any():
            i = int(np.flatnonzero((values.fillna(0) % 1 != 0).to_numpy())[0])
            raise InputError(f"{path}: row {lines[i]} (id {raw['id'].iloc[i]}), column '{col}': must be a whole "
                             f"number, got {text.iloc[i]!r}")
        out[col] = values
    return out


def _none_predicted(path: Path, runs: Runs) -> str:
    """The message for a file none of whose rows the physics can represent: how many, and why."""
    from collections import Counter

    reasons = Counter(s["reason"] for s in runs.skipped).most_common()
    shown = "; ".join(f"{reason} ({n} row{'' if n == 1 else 's'})" for reason, n in reasons[:5])
    more = f"; and {len(reasons) - 5} other reason(s)" if len(reasons) > 5 else ""
    return (f"{path}: no row of the file could be predicted: {len(runs.skipped)} row"
            f"{'' if len(runs.skipped) == 1 else 's'} skipped: {shown}{more}")


def _layout(r: pd.Series, prefix: str, moe: bool, heads: int) -> tuple[int, int, int, int, int] | str:
    """(tp, dp, ep, etp, pp) of one worker, or the reason it is not a dse layout."""
    def deg(name: str) -> int:
        v = r.get(prefix + name)
        return 1 if v is None or not np.isfinite(v) or v < 1 else int(v)
    tp, dp, pp = deg("tp_size"), deg("attention_dp_size"), deg("pp_size")
    ep, etp = deg("moe_ep_size"), deg("moe_tp_size")
    if heads % tp:
        if np.isfinite(r.get(prefix + "attention_dp_size", np.nan)):  # stated: the row contradicts itself
            return (f"attention TP{tp} does not divide the model's {heads} heads (no framework runs it) and "
                    f"attention DP is stated as {dp}")
        tp, dp = 1, tp  # DP not stated: the run used attention DP over those chips
    chips = tp * dp
    if not moe:
        return tp, dp, 1, chips, pp
    if ep * etp != chips:
        return (f"expert layout EP{ep} x TP{etp} = {ep * etp} chips does not match attention TP{tp} x DP{dp} = "
                f"{chips} chips")
    return tp, dp, ep, etp, pp


def map_runs(raw: pd.DataFrame) -> Runs:
    """Map each row to catalog ids, formats and layouts; rows that cannot be represented are listed with why."""
    models, systems = default_models(), default_systems()
    rows, skipped = [], []
    for _, r in raw.iterrows():
        def skip(reason: str, row_id: str = r["id"]) -> None:
            skipped.append({"id": row_id, "reason": reason})
        model = MODEL_IDS.get(r["model_path"])
        system = SYSTEM_IDS.get(r["system"])
        if model is None or model not in models:
            skip(f"model {r['model_path']!r} is not in the catalog")
            continue
        if system is None or system not in systems:
            skip(f"system {r['system']!r} is not in the catalog")
            continue
        if r["mode"] not in ("agg", "disagg"):
            skip(f"mode {r['mode']!r} is neither agg nor disagg")
            continue
        if not (r["silicon_ttft_ms"] > 0 and r["silicon_tpot_ms"] > 0):
            skip("no measured TTFT and TPOT (a throughput-only row)")
            continue
        if not (r["isl"] >= 1 and r["osl"] >= 1):
            skip("ISL or OSL missing")
            continue
        quant = r.get("gemm_quant_mode") or r.get("precision") or "bf16"
        if quant not in WEIGHTS:
            skip(f"weights format {quant!r} is not a catalog number format (allowed: {', '.join(WEIGHTS)})")
            continue
        wd = ed = WEIGHTS[quant]  # a format the chip has no tensor units for runs weight-only (dequantized)
        kd = "fp8" if wd in ("fp8", "fp4") else "bf16"
        arch = models[model]
        if wd in INTEGER_DTYPES and arch.is_moe:
            wd = "bf16"  # integer MoE checkpoints quantize the routed experts only (W4A16 experts, the rest BF16)
        if r["isl"] + r["osl"] > arch.max_context:
            skip(f"ISL + OSL = {int(r['isl'] + r['osl']):,} exceeds {model}'s trained window")
            continue
        row = {"id": r["id"], "model": model, "system": system, "backend": r.get("backend", ""), "mode": r["mode"],
               "workers": "stated",
               "isl": int(r["isl"]), "osl": int(r["osl"]), "wd": wd, "ed": ed, "kd": kd,
               "measured_ttft_s": r["silicon_ttft_ms"] / 1e3, "measured_tpot_s": r["silicon_tpot_ms"] / 1e3}
        if r["mode"] == "agg":
            lay = _layout(r, "", arch.is_moe, arch.spec.attention.n_heads)
            if isinstance(lay, str):
                skip(lay)
                continue
            tp, dp, ep, etp, pp = lay
            per_rank = r["batch_size"] if np.isfinite(r["batch_size"]) and r["batch_size"] >= 1 else np.nan
            conc = r["concurrency"] if np.isfinite(r["concurrency"]) and r["concurrency"] >= 1 else per_rank * dp
            if not np.isfinite(conc):
                skip("neither concurrency nor batch_size is given")
                continue
            replicas = max(1.0, conc / (per_rank * dp)) if np.isfinite(per_rank) else 1.0
            row.update(concurrency=float(conc), tp=tp, dp=dp, ep=ep, etp=etp, pp=pp, replicas=replicas,
                       in_flight=float(conc) / replicas, chips=tp * dp * pp * replicas)
        else:
            pre = _layout(r, "prefill_", arch.is_moe, arch.spec.attention.n_heads)
            dec = _layout(r, "decode_", arch.is_moe, arch.spec.attention.n_heads)
            if isinstance(pre, str) or isinstance(dec, str):
                skip(f"{'prefill' if isinstance(pre, str) else 'decode'} pool: {pre if isinstance(pre, str) else dec}")
                continue
            pw, dw = r["prefill_num_workers"], r["decode_num_workers"]
            row["workers"] = "stated" if np.isfinite(pw) and np.isfinite(dw) else "assumed"
            pw = pw if np.isfinite(pw) and pw >= 1 else 1.0  # not stated: one prefill worker
            conc = r["concurrency"]
            per_rank = r["decode_batch_size"]
            if not (np.isfinite(dw) and dw >= 1):  # not stated: as many decode workers as hold the concurrency
                known = np.isfinite(conc) and conc >= 1 and np.isfinite(per_rank) and per_rank >= 1
                dw = max(1.0, math.ceil(conc / (per_rank * dec[1]))) if known else 1.0
            if not (np.isfinite(conc) and conc >= 1):
                per_rank = r["decode_batch_size"]
                if not (np.isfinite(per_rank) and per_rank >= 1):
                    skip("neither concurrency nor decode_batch_size is given")
                    continue
                conc = per_rank * dec[1] * dw
            row.update(concurrency=float(conc), tp=dec[0], dp=dec[1], ep=dec[2], etp=dec[3], pp=dec[4],
                       replicas=float(dw), in_flight=float(conc) / dw, p_tp=pre[0], p_dp=pre[1], p_ep=pre[2],
                       p_etp=pre[3], p_pp=pre[4], p_replicas=float(pw),
                       chips=dec[0] * dec[1] * dec[4] * dw + pre[0] * pre[1] * pre[4] * pw)
        rows.append(row)
    return Runs(pd.DataFrame(rows), skipped, len(raw))


def _tables(table: pd.DataFrame, factors: EfficiencyCatalog | None = None,
            ) -> tuple[list[str], list[str], ModelTable, SystemTable]:
    """The table's model and system ids (sorted: the candidates' indices) and their catalog columns, the
    systems calibrated by ``factors`` (default: the catalog's efficiency factors).
    """
    models, systems = sorted(set(table["model"])), sorted(set(table["system"]))
    catalog_m, catalog_s = default_models(), default_systems()
    effs = [factors.for_system(s) for s in systems] if factors else None
    return (models, systems, ModelTable.build([catalog_m[m] for m in models]),
            SystemTable.build([catalog_s[s] for s in systems], effs))


def _candidates(t: pd.DataFrame, models: list[str], systems: list[str], prefix: str, batch: np.ndarray,
                context: float, micro_batches: np.ndarray | int = 1) -> Candidates:
    a = np.asarray
    return Candidates(
        model=a([models.index(m) for m in t["model"]]), system=a([systems.index(s) for s in t["system"]]),
        tp=t[prefix + "tp"].to_numpy(), dp=t[prefix + "dp"].to_numpy(), ep=t[prefix + "ep"].to_numpy(),
        etp=t[prefix + "etp"].to_numpy(), pp=t[prefix + "pp"].to_numpy(), batch=batch, context=context,
        weights_dtype=a([DTYPES.index(w) for w in t["wd"]]), kv_dtype=a([DTYPES.index(k) for k in t["kd"]]),
        experts_dtype=a([DTYPES.index(e) for e in t["ed"]]),
        kv_tier=0, micro_batches=micro_batches)


def predict_runs(table: pd.DataFrame, eff: Efficiency | None = None, two_batch: bool = False,
                 decode_batch: pd.Series | None = None, factors: EfficiencyCatalog | None = None) -> pd.DataFrame:
    """Predicted TTFT and TPOT (seconds) and whether the configuration fits, per mapped row (same index), with
    what the benchmark's TTFT model needs: ``prefill_s`` (one prompt's prefill on one prefill server),
    ``chunk_share_s`` (a prompt's share of a pass carrying a full chunk of prompts: what each queued prompt
    costs), ``prompts_per_server`` (requests in flight per prefill server) and ``transfer_s`` (the KV
    hand-off).
    ``two_batch`` runs every row's decode passes as two overlapped micro-batches
    (`dse.physics.roofline._split_pass`). A disaggregated row's decode replicas hold the requests
    past their prefill (`decode_share_closed_loop`; their batch per replica in ``decode_batch``), or
    ``decode_batch`` where it is given (the ideal roofline at the calibrated physics' operating point).
    ``factors``: the efficiency factors per system where ``eff`` is None (default: the catalog's).
    """
    out = pd.DataFrame(index=table.index, columns=["predicted_ttft_s", "predicted_tpot_s", "fits", "prefill_s",
                                                   "chunk_share_s", "prompts_per_server", "transfer_s",
                                                   "decode_batch"], dtype=float)
    if table.empty:
        return out
    models, systems, mt, st = _tables(table, factors)
    for (mode, isl, osl), g in table.groupby(["mode", "isl", "osl"], sort=False):
        req = Request(int(isl), int(osl))
        per_stage = g["in_flight"].to_numpy() / g["pp"].to_numpy()  # sequences per micro-batch of a replica
        cand = _candidates(g, models, systems, "", per_stage, isl + osl, 2 if two_batch else 1)
        if mode == "agg":
            r = aggregated(cand, mt, st, req, eff)
            ttft = r["ttft_s"]
            tpot, fits = r["tpot_s"], r["fits"]
            pre = prefill_pool(cand, mt, st, req, False, eff, full_chunk=True)  # the replica's layout prefills
            servers = pre["servers"]
            transfer = np.zeros(len(g))
        else:
            pre_t = g[["model", "system", "wd", "ed", "kd"]].assign(**{k: g[f"p_{k}"] for k in ("tp", "dp", "ep", "etp",
                                                                                          "pp")})
            pcand = _candidates(pre_t, models, systems, "", np.ones(len(g)), isl)
            pre = prefill_pool(pcand, mt, st, req, False, eff, full_chunk=True)
            pp = g["pp"].to_numpy()

            def decode_at(n: np.ndarray, cand=cand, pp=pp, req=req) -> dict:
                return decode_pool(replace(cand, batch=n / pp), mt, st, req, eff)

            if decode_batch is None:
                r, dec = decode_share_closed_loop(decode_at, pre, req, g["concurrency"].to_numpy(),
                                                  g["p_replicas"].to_numpy(), g["replicas"].to_numpy())
            else:
                dec = decode_at(decode_batch[g.index].to_numpy())
                r = disaggregated_closed_loop(dec, pre, req, g["concurrency"].to_numpy(), g["p_replicas"].to_numpy())
                r["decode_batch"] = decode_batch[g.index].to_numpy()
            out.loc[g.index, "decode_batch"] = r["decode_batch"]
            ttft, tpot, fits = r["ttft_s"], r["tpot_s"], dec["fits"] & pre["fits"]
            servers = pre["servers"] * g["p_replicas"].to_numpy()
            transfer = pre["kv_transfer_s"]
        out.loc[g.index, "prefill_s"] = pre["prefill_service_s"]
        out.loc[g.index, "chunk_share_s"] = pre["chunk_share_s"]
        out.loc[g.index, "prompts_per_server"] = g["concurrency"].to_numpy() / g["replicas"].to_numpy() / servers \
            if mode == "agg" else g["concurrency"].to_numpy() / servers
        out.loc[g.index, "transfer_s"] = transfer
        out.loc[g.index, "predicted_ttft_s"] = ttft
        out.loc[g.index, "predicted_tpot_s"] = tpot
        out.loc[g.index, "fits"] = np.asarray(fits, dtype=float)
    return out


PROBED = {"latency_scaleup": "comm_s", "latency_scaleout": "comm_s", "layer_overhead": "overhead_s",
          "moe_layer_overhead": "overhead_s", "gemm_half_rows": "compute_s", "attention_half_context": "memory_s"}
"""The time of the pass each fixed time and half-performance length adds to."""


def decode_terms(table: pd.DataFrame, predicted_tpot: np.ndarray, decode_batch: pd.Series,
                 split: np.ndarray, factors: EfficiencyCatalog | None = None,
                 ) -> tuple[DecodeTerms, dict[str, np.ndarray]]:
    """The decode pass of every row (at its mean context, with its batch: the replica's share of the
    concurrency in an aggregated row, the closed loop's decode batch in a disaggregated one; two micro-batches
    where ``split``) as `DecodeTerms`: times at the peaks, collective and layer counts and the times per
    row and per token of the half-performance lengths, read off the physics with every fraction at 1, each
    latency probed at 1 us and each length at 1 row or token, and ``rest`` = the row's predicted TPOT
    over its pass at the catalog's factors (``factors``, default: the catalog's). Returns the terms and the
    catalog's factors per row.
    """
    n = len(table)
    out = {k: np.zeros(n) for k in DecodeTerms.__dataclass_fields__}
    catalog = {k: np.zeros(n) for k in FACTORS}
    models, systems, mt, st = _tables(table, factors)
    peak = {**{k: 1.0 for k in ("compute_prefill", "compute_decode", "compute_train", "memory", "link",
                                "hbm_usable")}, "overlap": 0.0}
    probe = {**dict.fromkeys(FIXED_TIMES, 1e-6), **dict.fromkeys(CURVES, 1.0)}  # 1 us; one row, one token
    probes = {k: Efficiency(**peak, **{k: v}) for k, v in probe.items()}
    pos = pd.Series(np.arange(n), index=table.index)
    for (mode, isl, osl), g in table.groupby(["mode", "isl", "osl"], sort=False):
        rows = pos[g.index].to_numpy()
        in_flight = g["in_flight"] if mode == "agg" else decode_batch[g.index]
        context = isl + osl / 2.0
        cand = _candidates(g, models, systems, "", in_flight.to_numpy() / g["pp"].to_numpy(), context,
                           np.where(split[rows], 2, 1))
        inputs = [{"context": context, "phase": 0}]
        at_peak = evaluate_at(cand, mt, st, Efficiency(**peak), inputs)[0]
        cat = evaluate_at(cand, mt, st, None, inputs)[0]
        out["compute"][rows], out["memory"][rows] = at_peak["compute_s"], at_peak["memory_s"]
        out["comm"][rows] = at_peak["comm_s"]
        for k, e in probes.items():  # each probe moves one time of the pass by its term x the probe
            time = PROBED[k]
            moved = (evaluate_at(cand, mt, st, e, inputs)[0][time] - at_peak[time]) / probe[k]
            out[USES[k]][rows] = np.rint(moved) if k in FIXED_TIMES else moved  # counts of collectives, layers
        out["overlap"][rows] = cat["overlap"]
        out["rest"][rows] = predicted_tpot[rows] / cat["step_s"]
        e = st.efficiency_of(np.asarray(cand.broadcast().system))
        for k in FACTORS:
            catalog[k][rows] = getattr(e, k)
    return DecodeTerms(**out), catalog


# ---- errors, leave-group-out scales, summary ------------------------------------------------------------
def family_key(table: pd.DataFrame) -> pd.Series:
    """What the catalog's decode factors are shared by (`dse validate --fit`): the hardware family (the system
    where it has none), whichever the mode (a decode pass runs the same kernels whether or not prefill runs
    elsewhere; the request level adds the interference), and apart from it the rows whose worker counts were
    assumed (``|assumed``): a layout guessed for want of data does not calibrate the layouts a run states (on
    the measured runs a third of the assumed rows are faster than the ideal roofline of the assumed layout).
    """
    fam = pd.Series([family_of(s) or s for s in table["system"]], index=table.index)
    return fam.where(table["workers"] != "assumed", fam + "|assumed")


def factor_key(table: pd.DataFrame) -> pd.Series:
    """What a set of decode factors refitted by `validate_runs` is shared by: the `family_key` and the
    framework (``hopper|sglang``, ``blackwell|assumed|trtllm``). Each framework runs its own kernels (GEMM,
    attention, all-to-all) and its own scheduler, so the shares of peak, the fixed times and the
    half-performance lengths it reaches are its own; the data demand it: leave-group-out TPOT errs less with
    a factor set per family and framework than with one per family shared by the frameworks (the summary's
    ``loo_family_factors_median_abs_error``; 14.2% against 16.0% on the measured runs).
    """
    return family_key(table) + "|" + table["backend"].astype(str)


def group_key(table: pd.DataFrame) -> pd.Series:
    return table[list(GROUP)].astype(str).agg("|".join, axis=1)


QUEUE_SHARES = np.linspace(0.0, 0.5, 51)
"""Grid of xi, the share of the other requests in flight on a prefill server whose prompts a new prompt waits
behind in a closed-loop benchmark: 0 when arrivals are staggered (each prompt finds its server free), 1/2 when
they come in synchronized waves (identical requests started together finish together; the median request of a
wave waits for half of it)."""
FIXED_LATENCIES = np.linspace(0.0, 0.6, 61)
"""Grid of tau (seconds), the serving stack's fixed latency per request outside the forward passes (HTTP,
tokenization, scheduling, the first token's detokenization and streaming)."""


def benchmark_ttft(prefill_s, chunk_share_s, prompts_per_server, transfer_s, share, fixed_s):
    """TTFT of a closed-loop benchmark: S + xi max(n - 1, 0) S_b + transfer + tau, with S one prompt's prefill
    on its server, n the requests in flight per prefill server, xi the share of them queued ahead
    (`QUEUE_SHARES`), S_b what each queued prompt costs (its share of a pass carrying a full chunk of
    prompts: queued prompts are prefilled together, sharing the weight reads and fixed latencies of a pass)
    and tau the stack's fixed latency (`FIXED_LATENCIES`).
    """
    return prefill_s + share * np.maximum(prompts_per_server - 1.0, 0.0) * chunk_share_s + transfer_s + fixed_s


def _closed_loop_fits(t: pd.DataFrame, keys: pd.Series, groups: pd.Series) -> tuple[dict, pd.Series, pd.Series]:
    """Per key, (xi, tau) minimizing the mean |log(predicted / measured)| TTFT on the grids, fitted on all rows
    (in sample) and with each row's concurrency sweep left out; returns the in-sample fits and both predictions.
    """
    fits, in_sample, loo = {}, pd.Series(np.nan, index=t.index), pd.Series(np.nan, index=t.index)
    xi, tau = QUEUE_SHARES[:, None, None], FIXED_LATENCIES[None, :, None]
    for key, idx in keys.groupby(keys).groups.items():
        g = t.loc[idx]
        pred = benchmark_ttft(*(g[c].to_numpy()[None, None, :] for c in ("prefill_s", "chunk_share_s",
                                                                          "prompts_per_server", "transfer_s")),
                              xi, tau)
        err = np.abs(np.log(pred / g["measured_ttft_s"].to_numpy()[None, None, :]))
        total = err.sum(axis=-1)
        i, j = np.unravel_index(np.argmin(total), total.shape)
        fits[key] = {"queue_share": float(QUEUE_SHARES[i]), "fixed_latency_s": float(FIXED_LATENCIES[j])}
        in_sample[idx] = pred[i, j]
        gk = groups[idx].to_numpy()
        for name in np.unique(gk):
            mine = gk == name
            rest = total - err[:, :, mine].sum(axis=-1)
            i, j = np.unravel_index(np.argmin(rest), rest.shape) if (~mine).any() else (0, 0)  # nothing else: physics
            loo[idx[mine]] = pred[i, j, mine]
    return fits, in_sample, loo


LOO_MAX_ITER = 600
"""Nelder-Mead iterations of a leave-group-out refit (it starts from the in-sample factors, a few percent of
the rows away)."""


def _pick(a: DecodeTerms, b: DecodeTerms, use_b: np.ndarray) -> DecodeTerms:
    """Row by row, the terms of ``b`` where ``use_b``, else those of ``a``."""
    return DecodeTerms(**{k: np.where(use_b, getattr(b, k), getattr(a, k)) for k in DecodeTerms.__dataclass_fields__})


@dataclass
class TwoBatch:
    """The data's two-batch choice for one set of factor keys (`_two_batch_choice`): per (framework, mode) in
    ``choice``, per row in ``per_row``, per left-out sweep in ``without``.
    """

    choice: dict
    per_row: np.ndarray
    without: dict


@dataclass
class TpotPasses:
    """The decode passes of every row: TPOT predicted at the catalog's factors unsplit and with two
    micro-batches (their log errors ``log_error`` and ``split_log_error``), the rows an expert all-to-all makes
    eligible for the split, the catalog's factors per row, `DecodeTerms` unsplit and split, and the decode batch
    of each (split: the two-batch closed loop's, which holds another batch in a disaggregated row).
    """

    unsplit_tpot: np.ndarray
    split_tpot: np.ndarray
    log_error: np.ndarray
    split_log_error: np.ndarray
    eligible: np.ndarray
    fw_mode: np.ndarray
    groups: np.ndarray
    catalog: dict[str, np.ndarray]
    unsplit: DecodeTerms
    split: DecodeTerms
    batch: pd.Series
    split_batch: pd.Series

    def choose(self, keys: np.ndarray) -> TwoBatch:
        """Two-batch overlap per (framework, mode) as the data choose it with one factor set per ``keys``."""
        return TwoBatch(*_two_batch_choice(self.log_error, self.split_log_error, self.fw_mode, keys, self.groups,
                                           self.eligible))

    def terms_for(self, split: np.ndarray) -> DecodeTerms:
        """The terms with the rows of ``split`` (among the eligible) run as two micro-batches."""
        return _pick(self.unsplit, self.split, split & self.eligible)

    def decode_batch(self, split: np.ndarray) -> pd.Series:
        """Per row, the decode batch of its pass with the rows of ``split`` run as two micro-batches."""
        return self.split_batch.where(split & self.eligible, self.batch)


def tpot_passes(t: pd.DataFrame, pred: pd.DataFrame, factors: EfficiencyCatalog | None = None) -> TpotPasses:
    """Every row's decode pass as `DecodeTerms` (`decode_terms`), unsplit and, where an expert all-to-all could
    hide behind the other micro-batch, split in two; ``pred`` is `predict_runs` of ``t`` at the catalog's
    factors (``factors``, default: the catalog's).
    """
    meas = t["measured_tpot_s"].to_numpy()
    eligible = t["ep"].to_numpy() > 1  # rows with an expert all-to-all for two micro-batches to hide
    p1 = pred["predicted_tpot_s"].astype(float).to_numpy()
    p2 = p1.copy()
    batch2 = pred["decode_batch"].copy()  # a disaggregated row's closed loop holds another decode batch when split
    if eligible.any():
        two = predict_runs(t[eligible], two_batch=True, factors=factors)
        p2[eligible] = two["predicted_tpot_s"].astype(float).to_numpy()
        batch2[two.index] = two["decode_batch"]
    unsplit, catalog = decode_terms(t, p1, pred["decode_batch"], np.zeros(len(t), dtype=bool), factors)
    split = decode_terms(t, p2, batch2, eligible, factors)[0] if eligible.any() else unsplit
    return TpotPasses(p1, p2, np.log(p1 / meas), np.log(p2 / meas), eligible,
                      (t["backend"].astype(str) + "|" + t["mode"]).to_numpy(), group_key(t).to_numpy(), catalog,
                      unsplit, split, pred["decode_batch"], batch2)


def serving_tpot_terms(path: Path, factors: EfficiencyCatalog | None = None,
                       ) -> tuple[DecodeTerms, np.ndarray, np.ndarray, np.ndarray]:
    """The decode passes of a CSV of measured runs as the catalog fit uses them (`dse validate --fit`): the
    terms of every mapped row with two-batch overlap as the data chooses it with one factor set per family,
    which rows it splits, the measured TPOTs (s), and each row's `family_key`; what the request level adds to
    the pass (``rest``) at the efficiency factors ``factors`` (default: the catalog's).
    """
    t = map_runs(read_runs(path)).table
    if t.empty:
        empty = np.zeros(0)
        return DecodeTerms(*[empty] * len(DecodeTerms.__dataclass_fields__)), empty.astype(bool), empty, empty
    keys = family_key(t).to_numpy().astype(object)
    tp = tpot_passes(t, predict_runs(t, factors=factors), factors)
    split = tp.choose(keys).per_row
    return tp.terms_for(split), split, t["measured_tpot_s"].to_numpy(), keys


@dataclass
class RunsValidation:
    """Every mapped row with its predictions and errors; the fitted scales; what was skipped."""

    table: pd.DataFrame
    scales: dict[str, dict[str, float]]
    skipped: list[dict]
    given: int

    @property
    def coverage(self) -> float:
        return len(self.table) / self.given if self.given else 0.0


def _two_batch_choice(lr1: np.ndarray, lr2: np.ndarray, keys: np.ndarray, scale_keys: np.ndarray,
                      groups: np.ndarray, eligible: np.ndarray) -> tuple[dict, np.ndarray, dict]:
    """Whether each (framework, mode) runs two-batch overlap, decided from the data: on where splitting the
    decode passes of its rows with an expert all-to-all lowers the sum of its rows' absolute log errors around
    the median of their key's rows (what remains once one scale per key is fitted; the other frameworks'
    rows as predicted without the split).

    Returns the in-sample choice per key, the in-sample choice per row, and per left-out group the choice for
    its key made without that group's rows (no eligible rows left: off, the physics' default).
    """
    def spread(rows: np.ndarray, use: np.ndarray, split: bool) -> float:
        lr = np.where(rows & eligible, lr2, lr1) if split else lr1
        return float(sum(np.abs(lr[rows & (scale_keys == sk)] - np.median(lr[use & (scale_keys == sk)])).sum()
                         for sk in np.unique(scale_keys[rows])))

    def on(k: str, use: np.ndarray) -> bool:
        rows = (keys == k) & use
        return bool((rows & eligible).any()) and spread(rows, use, True) < spread(rows, use, False)

    everything = np.ones(len(keys), dtype=bool)
    choice = {k: on(k, everything) for k in np.unique(keys)}
    per_row = eligible & np.array([choice[k] for k in keys], dtype=bool)
    without = {}
    for name in np.unique(groups):
        mine = groups == name
        k = keys[mine][0]
        without[name] = on(k, ~mine) if (eligible & mine).any() else choice[k]
    return choice, per_row, without


def _refit_tpot(tp: TpotPasses, keys: np.ndarray, meas: np.ndarray,
                ) -> tuple[dict, TwoBatch, np.ndarray, np.ndarray, np.ndarray]:
    """The decode factors fitted per key on its rows' decode passes, with two-batch overlap as the data choose
    it for those keys: per key the factors the rows identify and those kept from the catalog (no row depends
    on them), the two-batch choice, TPOT in sample and with each row's sweep left out (factors and two-batch
    choice re-made without it), and per row whether that left-out prediction split its pass.
    """
    gk = tp.groups
    tb = tp.choose(keys)
    scales, fitted = {}, {}
    in_sample = np.full(len(keys), np.nan)
    chosen = tp.terms_for(tb.per_row)
    for key in np.unique(keys):
        rows = np.flatnonzero(keys == key)
        d = chosen.take(rows)
        fitted[key] = fit_factors(d, meas[rows], {k: float(np.median(tp.catalog[k][rows])) for k in FACTORS})
        free = identified(d)
        scales[key] = {"fitted": {k: v for k, v in fitted[key].items() if k in free},
                       "kept_from_catalog": {k: v for k, v in fitted[key].items() if k not in free}}
        in_sample[rows] = tpot_at(d, fitted[key])
    loo, loo_split = np.full(len(keys), np.nan), np.zeros(len(keys), dtype=bool)
    for g, idx in pd.Series(np.arange(len(keys))).groupby(gk).groups.items():
        idx = np.asarray(idx)
        mine = tp.fw_mode == tp.fw_mode[idx[0]]  # the rows whose choice was re-made without this sweep
        split = np.where(mine, tp.eligible & tb.without[g], tb.per_row)
        view = tp.terms_for(split)
        loo_split[idx] = split[idx]
        train = np.flatnonzero((gk != g) & (keys == keys[idx[0]]))
        f = fit_factors(view.take(train), meas[train], fitted[keys[idx[0]]], max_iter=LOO_MAX_ITER, passes=1) \
            if len(train) else {k: tp.catalog[k][idx] for k in FACTORS}  # a key in no other sweep: the catalog's
        loo[idx] = tpot_at(view.take(idx), f)
    return scales, tb, in_sample, loo, loo_split


def validate_runs(runs: Runs) -> RunsValidation:
    """Predict every row with the catalog's calibrated factors (``error``), with factors fitted on all rows
    (``in_sample_error``) and fitted with the row's whole concurrency sweep left out (``loo_error``, the
    headline), and with the ideal roofline (``ideal_error``).

    For TPOT, the decode pass's efficiency factors are fitted per `factor_key` (family and framework) on the
    rows' decode passes (`decode_terms`, `dse.validate.decode_factors.fit_factors`; the request level's
    interference held at the catalog's), after two-batch overlap is chosen per (framework, mode) from the data
    (`_two_batch_choice`; ``scales["two_batch_overlap"]``, the row's choice in ``two_batch``, and in
    ``two_batch_loo`` the choice made without its sweep, with ``ideal_tpot_loo_s`` the roofline of that pass):
    ``scales["tpot"]`` holds, per key, the factors the rows identify and those kept from the catalog (no row
    depends on them). ``tpot_loo_family_error`` is the
    leave-group-out error with one factor set per `family_key` instead, shared by the frameworks (the test of
    whether the data demand a factor set per framework). For TTFT the closed-loop benchmark model
    (`benchmark_ttft`) is fitted per (framework, mode); ``scales["ttft"]`` holds its queue share and fixed
    latency, and ``benchmark_ttft_s`` / ``benchmark_ttft_loo_s`` its in-sample and leave-group-out predictions.
    """
    t = runs.table.copy()
    if t.empty:
        return RunsValidation(t, {}, runs.skipped, runs.given)
    pred = predict_runs(t)
    tp = tpot_passes(t, pred)
    meas = t["measured_tpot_s"].to_numpy()
    scales = {}
    scales["tpot"], tb, tpot_in_sample, tpot_loo, loo_split = _refit_tpot(tp, factor_key(t).to_numpy(), meas)
    tpot_loo_family = _refit_tpot(tp, family_key(t).to_numpy(), meas)[3]
    ideal = predict_runs(t, IDEAL, decode_batch=tp.decode_batch(tb.per_row))  # the roofline at the same point
    ideal_loo = ideal["predicted_tpot_s"].to_numpy(dtype=float, copy=True)  # of the left-out prediction's pass
    flipped = loo_split != tb.per_row  # its sweep left out, the data choose the other pass
    if flipped.any():
        ideal_loo[flipped] = predict_runs(t[flipped], IDEAL, decode_batch=tp.decode_batch(loo_split)[flipped]
                                          )["predicted_tpot_s"].astype(float).to_numpy()
    groups = group_key(t)
    for col in ("prefill_s", "chunk_share_s", "prompts_per_server", "transfer_s"):
        t[col] = pred[col].astype(float)
    for m in METRICS:
        t[f"ideal_{m}_s"] = ideal[f"predicted_{m}_s"].astype(float)
        t[f"{m}_ideal_error"] = t[f"ideal_{m}_s"] / t[f"measured_{m}_s"] - 1.0

    # TTFT: the benchmark's closed loop, fitted per framework and mode
    ttft = t["measured_ttft_s"]
    t["predicted_ttft_s"] = pred["predicted_ttft_s"].astype(float)
    t["ttft_error"] = t["predicted_ttft_s"] / ttft - 1.0
    scales["ttft"], in_sample, loo = _closed_loop_fits(t, pd.Series(tp.fw_mode, index=t.index), groups)
    t["benchmark_ttft_s"], t["benchmark_ttft_loo_s"] = in_sample, loo
    t["ttft_in_sample_error"] = in_sample / ttft - 1.0
    t["ttft_loo_error"] = loo / ttft - 1.0

    # TPOT: two-batch overlap where the data chooses it, the decode factors refitted per key
    scales["two_batch_overlap"] = tb.choice
    t["two_batch"], t["two_batch_loo"], t["ideal_tpot_loo_s"] = tb.per_row, loo_split, ideal_loo
    t["predicted_tpot_s"] = np.where(tb.per_row, tp.split_tpot, tp.unsplit_tpot)
    t["tpot_error"] = t["predicted_tpot_s"] / meas - 1.0
    t["tpot_in_sample_error"] = tpot_in_sample / meas - 1.0
    t["tpot_loo_error"] = tpot_loo / meas - 1.0
    t["tpot_loo_family_error"] = tpot_loo_family / meas - 1.0
    for m in METRICS:  # each sweep's own level removed: what is left is the physics' shape across concurrency
        lr = np.log1p(t[f"{m}_loo_error"])
        t[f"{m}_within_sweep_error"] = np.expm1(lr - lr.groupby(groups).transform("median"))
    t["fits"] = pred["fits"].astype(bool)  # the memory check; a measured run that "does not fit" is a finding
    return RunsValidation(t, scales, runs.skipped, runs.given)


def _stats(err: pd.Series) -> dict:
    a = err.dropna().abs()
    return {"n": int(len(a)), "median_abs_error": float(a.median()) if len(a) else math.nan,
            "mape": float(a.mean()) if len(a) else math.nan,
            "p90_abs_error": float(a.quantile(0.9)) if len(a) else math.nan,
            "signed_median": float(err.dropna().median()) if len(a) else math.nan}


def summary(v: RunsValidation) -> list[dict]:
    """Per category (all, agg, disagg) and metric: the shipped physics' errors, the leave-group-out one, and
    ``within_sweep_median_abs_error``, the leave-group-out error once each sweep's own median level is removed
    (the error of the shape across concurrency alone: the floor a better level for each sweep could reach),
    and for TPOT ``loo_family_factors_median_abs_error``, the leave-group-out error with one decode factor set
    per hardware family shared by the frameworks (`family_key`) instead of one per family and framework.
    """
    out = []
    t = v.table
    for cat in ("all", "agg", "disagg"):
        sub = t if cat == "all" else t[t["mode"] == cat]
        for m in METRICS:
            if sub.empty:
                continue
            e = {"category": cat, "metric": m, **_stats(sub[f"{m}_error"]),
                 "loo_median_abs_error": float(sub[f"{m}_loo_error"].abs().median()),
                 "in_sample_median_abs_error": float(sub[f"{m}_in_sample_error"].abs().median()),
                 "ideal_median_abs_error": float(sub[f"{m}_ideal_error"].abs().median()),
                 "within_sweep_median_abs_error": float(sub[f"{m}_within_sweep_error"].abs().median())}
            if m == "tpot":
                e["loo_family_factors_median_abs_error"] = float(sub["tpot_loo_family_error"].abs().median())
            out.append(e)
    return out


def _band(c: float) -> str:
    for lo, hi in zip(CONCURRENCY_BANDS[:-1], CONCURRENCY_BANDS[1:], strict=True):
        if lo < c <= hi:
            return f"{lo + 1}-{hi:g}" if math.isfinite(hi) else f">{lo}"
    return "?"


def partitions(v: RunsValidation) -> dict[str, list[dict]]:
    """Median absolute errors (shipped physics and leave-group-out) by system x mode, model, framework, mode,
    ISL/OSL, concurrency band and whether the run stated its worker counts (``workers``: a disaggregated row
    without them is predicted with the assumption the module docstring states).
    """
    t = v.table.assign(isl_osl=v.table["isl"].astype(str) + "/" + v.table["osl"].astype(str),
                       concurrency_band=v.table["concurrency"].map(_band),
                       system_mode=v.table["system"] + " " + v.table["mode"])
    out = {}
    for by in ("system_mode", "model", "backend", "mode", "isl_osl", "concurrency_band", "workers"):
        rows = []
        for key, g in t.groupby(by, sort=True):
            row = {by: key, "n": len(g)}
            for m in METRICS:
                row[f"{m}_median_abs_error"] = float(g[f"{m}_error"].abs().median())
                row[f"{m}_loo_median_abs_error"] = float(g[f"{m}_loo_error"].abs().median())
            rows.append(row)
        out[by] = rows
    return out


def as_dict(v: RunsValidation, worst: int = 20) -> dict:
    from collections import Counter

    t = v.table
    reasons = Counter(s["reason"] for s in v.skipped)
    worst_rows = {}
    for m in METRICS:
        if t.empty:
            continue
        w = t.reindex(t[f"{m}_loo_error"].abs().sort_values(ascending=False).index[:worst])
        worst_rows[m] = w[["id", "model", "system", "backend", "mode", "isl", "osl", "concurrency",
                           f"measured_{m}_s", f"predicted_{m}_s", f"{m}_error", f"{m}_loo_error"]].to_dict("records")
    return {"rows_given": v.given, "rows_predicted": len(t), "coverage": v.coverage, "summary": summary(v),
            "rows_failing_the_memory_check": int((~t["fits"]).sum()) if "fits" in t else 0,
            "partitions": partitions(v) if not t.empty else {}, "scales": v.scales, "worst": worst_rows,
            "skipped": {"count": len(v.skipped), "by_reason": dict(reasons.most_common()), "rows": v.skipped}}


def _factor_rows(fits: dict) -> list[dict]:
    """The fitted decode factors as report rows: shares of a peak as fractions, latencies in us, half-performance
    lengths in rows and tokens, and those no row identifies marked as the catalog's.
    """
    def cell(name: str, value: float, fitted: bool) -> str:
        text = (f"{value:.3f}" if name in FRACTIONS else f"{value * 1e6:.1f} us" if name in FIXED_TIMES
                else f"{value:,.0f} {'rows' if name == 'gemm_half_rows' else 'tokens'}")
        return text if fitted else f"{text} (catalog)"

    rows = []
    for key, f in fits.items():
        every = {**f["fitted"], **f["kept_from_catalog"]}
        rows.append({"key": key, **{n: cell(n, every[n], n in f["fitted"]) for n in FACTORS}})
    return rows


def write_runs_report(v: RunsValidation, folder: Path) -> list[str]:
    """validate_runs.csv, summary.json, predicted-vs-measured scatters (log-log) and report.html."""
    import base64
    import html
    import json

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    doc = as_dict(v)
    v.table.to_csv(folder / "validate_runs.csv", index=False)
    (folder / "summary.json").write_text(json.dumps(doc, indent=2, default=float))
    files = ["validate_runs.csv", "summary.json"]
    imgs = []
    for m in METRICS:
        if v.table.empty:
            continue
        fig, ax = plt.subplots(figsize=(7, 6))
        for mode, g in v.table.groupby("mode"):
            pred = g[f"measured_{m}_s"] * (1 + g[f"{m}_loo_error"])
            ax.scatter(g[f"measured_{m}_s"] * 1e3, pred * 1e3, s=6, alpha=0.6, label=f"{mode} (leave-group-out)")
        lo = float(v.table[f"measured_{m}_s"].min() * 1e3 / 2)
        hi = float(v.table[f"measured_{m}_s"].max() * 1e3 * 2)
        ax.plot([lo, hi], [lo, hi], "k-", lw=0.8)
        for f in (1.25, 1 / 1.25):
            ax.plot([lo, hi], [lo * f, hi * f], "k:", lw=0.6)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel(f"measured {m.upper()} (ms)")
        ax.set_ylabel(f"predicted {m.upper()} (ms)")
        ax.set_title(f"{m.upper()}: predicted against measured (dotted: +-25%)")
        ax.legend(fontsize=8)
        fig.tight_layout()
        name = f"scatter_{m}.png"
        fig.savefig(folder / name, dpi=110)
        plt.close(fig)
        files.append(name)
        imgs.append((m, base64.b64encode((folder / name).read_bytes()).decode()))

    def table_html(rows: list[dict]) -> str:
        return pd.DataFrame(rows).to_html(index=False, float_format=lambda x: f"{x:.3f}") if rows else "<p>none</p>"

    parts = ["<!doctype html><html><head><meta charset='utf-8'><title>dse validate: measured serving runs</title>",
             "<style>body{font-family:sans-serif;max-width:1100px;margin:2em auto}table{border-collapse:collapse;"
             "font-size:12px}td,th{border:1px solid #ccc;padding:2px 6px}img{max-width:100%}</style></head><body>",
             "<h1>Measured serving runs: predicted TTFT and TPOT</h1>",
             f"<p>{len(v.table):,} of {v.given:,} rows predicted (coverage {v.coverage:.1%}). Errors are predicted / "
             "measured - 1 with the catalog's calibrated physics; leave-group-out errors (the headline figure) "
             "leave the row's whole concurrency sweep out: TPOT refits the decode pass's efficiency factors per "
             "hardware family and framework on the other sweeps (rows with assumed worker counts apart; the summary's "
             "loo_family_factors_median_abs_error shares one set per family among the frameworks); TTFT is the "
             "closed-loop benchmark model (one prompt's prefill, plus a share of the other requests in flight "
             "queued ahead of it, plus the KV hand-off, plus a fixed latency of the serving stack), its share and "
             "latency fitted per (framework, mode) on the other sweeps.</p>",
             "<h2>Decode factors fitted on TPOT (in sample)</h2>",
             table_html(_factor_rows(v.scales.get("tpot", {}))),
             "<h2>Closed-loop TTFT fits (in sample)</h2>",
             table_html([{"framework_mode": k, **f} for k, f in v.scales.get("ttft", {}).items()]),
             f"<p>{doc['rows_failing_the_memory_check']:,} measured runs fail dse's memory check (the physics says "
             "their layout does not hold the weights, KV and activations in HBM, yet they ran): the memory model is "
             "conservative there, or the run's KV format was narrower than assumed.</p>",
             "<h2>Summary</h2>", table_html(doc["summary"])]
    parts += [f"<h2>{m.upper()}</h2><img src='data:image/png;base64,{img}'>" for m, img in imgs]
    for by, rows in doc["partitions"].items():
        parts += [f"<h2>Error by {html.escape(by.replace('_', ' '))}</h2>", table_html(rows)]
    for m, rows in doc["worst"].items():
        parts += [f"<h2>Worst rows: {m.upper()} (leave-group-out)</h2>", table_html(rows)]
    parts += ["<h2>Skipped rows</h2><ul>",
              *[f"<li>{html.escape(r)}: {n}</li>" for r, n in doc["skipped"]["by_reason"].items()], "</ul>",
              "</body></html>"]
    (folder / "report.html").write_text("\n".join(parts))
    files.append("report.html")
    return files


def validate_file(path: Path) -> RunsValidation:
    """Read, map, predict and cross-validate a CSV of measured serving runs; a file none of whose rows can be
    predicted is an InputError saying why each was skipped.
    """
    runs = map_runs(read_runs(path))
    if runs.table.empty:
        raise InputError(_none_predicted(Path(path), runs))
    return validate_runs(runs)
