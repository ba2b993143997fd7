"""Measured serving runs (the columns of ``shared/data/measured_serving.csv``) read and mapped onto the physics:
catalog ids, number formats and layouts, and the keys that group the rows.

A row is one benchmark run: ``concurrency`` requests of ``isl`` prompt and ``osl`` output tokens kept in
flight (a closed loop: each request is replaced as it completes) against one deployment. How a row maps to
the physics (`dse.physics.serving`):

- Model and system: ``model_path`` (a Hugging Face id; quantized re-releases map to their base model) and
  ``system`` map to catalog ids (`model_id`, `system_id`); a row of another model or system is skipped
  with the reason.
- Number formats: ``gemm_quant_mode`` / ``precision`` give the weights format (``fp8`` and ``fp8_block``
  -> fp8, ``nvfp4`` / ``fp4`` -> fp4, ``int4_wo`` -> int4, none -> bf16). An int4 MoE checkpoint holds its
  routed experts in int4 and the rest in BF16 (as Kimi-K2.5's release does: W4A16 experts), computed in
  BF16 after dequantization (`INTEGER_DTYPES`). The KV format is the ``kv_dtype`` column where a file has it
  and the row fills it; else fp8 where the weights are fp8 or fp4, and bf16 otherwise (the frameworks' FP8
  recipes quantize the KV cache with the weights).
- Layout (agg, and each pool of disagg): attention runs as ``tp_size`` x ``attention_dp_size`` and experts
  as ``moe_ep_size`` x ``moe_tp_size`` over the same chips (the two products must agree; a dense model has
  no expert split), ``pp_size`` stages. A missing degree is 1. Attention TP must divide the model's heads (no
  framework documents sharding them otherwise, and `dse evaluate` refuses it): where it does not and attention
  DP is left empty, the chips ran attention DP. Where attention DP is stated as well, the row is read as
  stated with the heads padded (the busiest rank computes ceil(heads / TP) of them, its KV whole where the
  model has fewer KV heads than ranks); its ``layout`` is ``padded`` and it is reported apart with the rows
  whose layout is unknown (no fit reads it): on the measured runs these rows' TPOT rises far less with the
  concurrency than one replica of that layout allows, so the stated layout is in doubt.
- agg: ``batch_size`` is the configured sequences per attention-DP rank, so a replica holds
  batch_size x attention_dp_size sequences; a concurrency above that is spread over
  concurrency / (batch_size x attention_dp_size) replicas. Each replica is `aggregated` at its share of
  the requests in flight (in-flight batching with chunked prefill, closed loop by Little's law).
- disagg: ``prefill_num_workers`` prefill replicas serve one prompt per DP rank (`prefill_pool`);
  ``decode_num_workers`` decode replicas share the requests in flight that are past their prefill: of C in
  flight, lambda TTFT are queued, prefilling or handing off their KV (`decode_share_closed_loop`, Little's law
  over both stages); the closed loop gives the request rate, and with it the prefill queueing in TTFT.
  A disaggregated row that leaves a worker count empty states no deployment: ``layout`` is ``unknown`` and
  the row is predicted on the smallest one its pools' sizes allow (one prefill and one decode worker), apart
  from the rows that state their layout (`dse.validate.run.validate_runs`: no fit reads it and its errors are
  reported on their own). On the measured runs these are 637 rows that leave the worker counts and the
  per-worker batches empty together; the row's concurrency pins no layout without them (the rows that state
  all three satisfy concurrency = decode_batch_size x attention DP x decode workers exactly).
- A row whose concurrency is missing states no load: it is predicted at its layout's batch in flight (agg:
  ``batch_size`` x attention DP; disagg: the decode workers' batches), its ``layout`` is ``no_concurrency`` and
  it is reported apart with the rows of unknown layout (no fit reads it). A closed loop's TTFT and TPOT follow
  its concurrency, and on the measured runs the guess is contradicted: the 12 such rows (7 H100 and 1 GB200
  aggregated, 4 H100 disaggregated) erred 50% (aggregated) and 78% (disaggregated) on TPOT leave-group-out when
  read as stated; one H100 disaggregated row measures a TPOT of 0.56 s where its stated decode pool at the
  guessed batch decodes in 21 ms.
- The rows of one concurrency sweep (the unit the cross-validation leaves out) share model, system,
  framework, mode, ISL and OSL (`GROUP`), or, in a file with a ``sweep`` column, model, system, framework,
  mode and the row's ``sweep`` (a benchmark drawing each request's lengths at random has per-row means).
- Several files (`read_runs_files`) are read as one: the catalog's measured runs are `catalog_runs_files`.
"""

from __future__ import annotations

import codecs
import csv
import io
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from dse.catalog.calibration import family_of
from dse.catalog.hardware import default_systems, hw_dir
from dse.catalog.models import default_models
from dse.catalog.units import DTYPES, INTEGER_DTYPES
from dse.errors import InputError

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
    "deepseek-ai/DeepSeek-V3.1": "deepseek-v3",  # V3.1 keeps the V3 architecture
    "Qwen/Qwen3-Coder-480B-A35B-Instruct": "qwen3-coder-480b-a35b",
    "meta-llama/Llama-4-Maverick-17B-128E-Instruct": "llama-4-maverick",
    "MiniMaxAI/MiniMax-M2": "minimax-m2.5",  # M2, M2.1 and M2.5 share every size field of the config
}
"""Hugging Face ids of the measured models -> catalog ids (quantized re-releases keep their architecture)."""
SYSTEM_IDS = {"h100_sxm": "h100", "h200_sxm": "h200", "b200_sxm": "b200", "b300_sxm": "b300", "gb200": "gb200-nvl72",
              "mi300x": "mi300x", "mi325x": "mi325x", "mi355x": "mi355x", "tpu_v5e": "tpu-v5e", "tpu_v6e": "tpu-v6e",
              "tpu_v7": "tpu-v7"}
QUANTIZED_SUFFIX = re.compile(r"(-(nvfp4|mxfp4|fp8|fp4|kv|dynamic|block|awq|gptq|w4a16|w8a8|int4|int8))+$", re.I)
"""Name endings of quantized re-releases (``-NVFP4``, ``-FP8-KV``, ...): the architecture is the original's."""


def model_id(path: str) -> str | None:
    """The catalog id of a measured model: `MODEL_IDS`, else the model a quantized re-release of another
    publisher re-packages (``nvidia/DeepSeek-R1-NVFP4`` -> the id of ``deepseek-ai/DeepSeek-R1``); None if
    neither names a catalogued model.
    """
    if path in MODEL_IDS:
        return MODEL_IDS[path]
    if path in default_models():  # a catalog id (the plan of a dse export's benchmark names its model so)
        return path
    base = QUANTIZED_SUFFIX.sub("", path.rsplit("/", 1)[-1]).lower()
    found = {cid for known, cid in MODEL_IDS.items() if known.rsplit("/", 1)[-1].lower() == base}
    return found.pop() if len(found) == 1 else None


def system_id(name: str, catalog: dict) -> str | None:
    """The catalog id of a measured system: `SYSTEM_IDS`, else its name in catalog spelling (``_`` as ``-``, no
    ``_sxm`` form factor), as a rack-scale NVL72 system where the catalog holds it so (``gb300`` ->
    ``gb300-nvl72``); None if the catalog has no such system.
    """
    if name in SYSTEM_IDS:
        return SYSTEM_IDS[name]
    plain = name.lower().replace("_", "-").removesuffix("-sxm")
    for candidate in (plain, f"{plain}-nvl72"):
        if candidate in catalog:
            return candidate
    return None


WEIGHTS = {"fp8": "fp8", "fp8_block": "fp8", "nvfp4": "fp4", "fp4": "fp4", "bf16": "bf16", "float16": "bf16",
           "fp16": "bf16", "int4_wo": "int4", "int4": "int4"}
REQUIRED = ("id", "model_path", "system", "mode", "isl", "osl", "silicon_ttft_ms", "silicon_tpot_ms")
NUMERIC = ("concurrency", "isl", "osl", "batch_size", "tp_size", "pp_size", "attention_dp_size", "moe_tp_size",
           "moe_ep_size", "prefill_batch_size", "prefill_num_workers", "prefill_tp_size", "prefill_pp_size",
           "prefill_attention_dp_size", "prefill_moe_tp_size", "prefill_moe_ep_size", "decode_batch_size",
           "decode_num_workers", "decode_tp_size", "decode_pp_size", "decode_attention_dp_size",
           "decode_moe_tp_size", "decode_moe_ep_size", "silicon_ttft_ms", "silicon_tpot_ms")
GROUP = ("model", "system", "backend", "mode", "isl", "osl")
"""One concurrency sweep: the unit left out by the cross-validation (a row's ``sweep`` replaces ISL and OSL where
its file names it)."""
TEXT = ("kv_dtype", "sweep")
"""Optional text columns: the KV-cache format (empty: derived from the weights' format) and the sweep a row
belongs to (empty: its ISL and OSL say it)."""
KV_DTYPES = tuple(d for d in DTYPES if d not in INTEGER_DTYPES)
"""KV-cache formats a row may name."""
CATALOG_RUNS = ("measured_serving.csv", "amd_tpu_runs.csv")
"""The catalog's measured-runs files (hw_catalog/calibration/published/), read by `dse validate --fit` and
`--bands`: NVIDIA runs, and AMD Instinct and Google TPU runs."""
METRICS = ("ttft", "tpot")
"""The measured metrics of a run: time to first token and time per output token."""



@dataclass
class Runs:
    """The rows the physics can represent (one per row, mapped) and the others with their reasons."""

    table: pd.DataFrame
    skipped: list[dict] = field(default_factory=list)
    given: int = 0
    duplicates: list[dict] = field(default_factory=list)
    """Rows that repeat another row's measurement (`_one_per_measurement`): id and the id of the row kept."""


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
    for col in TEXT:
        out[col] = raw[col].str.strip() if col in raw.columns else ""
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


def read_runs_files(paths: list[Path], reader: Callable[[Path], pd.DataFrame] | None = None) -> pd.DataFrame:
    """``reader`` (default `read_runs`) of each file, as one table; an id given in two files is an InputError naming
    both.
    """
    tables, seen = [], {}
    for path in paths:
        t = (reader or read_runs)(path)
        for run in t["id"]:
            if run in seen:
                raise InputError(f"{path}: column 'id': {run!r} is already the id of a run of {seen[run]}; each run "
                                 "has its own id across the files read together")
            seen[run] = path
        tables.append(t)
    return pd.concat(tables, ignore_index=True) if len(tables) > 1 else tables[0]


def catalog_runs_files() -> list[Path]:
    """The catalog's measured-runs files (`CATALOG_RUNS`) that exist."""
    folder = hw_dir() / "calibration" / "published"
    return [folder / name for name in CATALOG_RUNS if (folder / name).exists()]


def nothing_predicted(path: Path, runs: Runs) -> str:
    """The message for a file none of whose rows the physics can represent: how many, and why."""
    from collections import Counter

    reasons = Counter(s["reason"] for s in runs.skipped).most_common()
    shown = "; ".join(f"{reason} ({n} row{'' if n == 1 else 's'})" for reason, n in reasons[:5])
    more = f"; and {len(reasons) - 5} other reason(s)" if len(reasons) > 5 else ""
    return (f"{path}: no row of the file could be predicted: {len(runs.skipped)} row"
            f"{'' if len(runs.skipped) == 1 else 's'} skipped: {shown}{more}")


def _layout(r: dict, prefix: str, moe: bool, heads: int) -> tuple[tuple[int, int, int, int, int], str] | str:
    """((tp, dp, ep, etp, pp), how the layout is read: ``stated`` or ``padded``) of one worker, or the reason it is
    not a dse layout.
    """
    def deg(name: str) -> int:
        v = r.get(prefix + name)
        return 1 if v is None or not np.isfinite(v) or v < 1 else int(v)
    tp, dp, pp = deg("tp_size"), deg("attention_dp_size"), deg("pp_size")
    ep, etp = deg("moe_ep_size"), deg("moe_tp_size")
    known = "stated"
    if heads % tp:
        # Attention TP that does not divide the heads: where attention DP is left empty the chips ran attention
        # DP (the row's only documented reading); where it is stated the row keeps its layout, the busiest rank
        # computing ceil(heads / TP) heads (`dse.physics.roofline`), and is reported apart (``padded``)
        if np.isfinite(r.get(prefix + "attention_dp_size", np.nan)):
            known = "padded"
        else:
            tp, dp = 1, tp * dp
    chips = tp * dp
    if not moe:
        return (tp, dp, 1, chips, pp), known
    if ep * etp != chips:
        return (f"expert layout EP{ep} x TP{etp} = {ep * etp} chips does not match attention TP{tp} x DP{dp} = "
                f"{chips} chips")
    return (tp, dp, ep, etp, pp), known


def map_runs(raw: pd.DataFrame) -> Runs:
    """Map each row to catalog ids, formats and layouts; rows that cannot be represented are listed with why."""
    models, systems = default_models(), default_systems()
    rows, skipped = [], []
    for r in raw.to_dict("records"):  # plain dicts: a Series per row costs more than the mapping itself
        def skip(reason: str, row_id: str = r["id"]) -> None:
            skipped.append({"id": row_id, "reason": reason})
        model = model_id(r["model_path"])
        system = system_id(r["system"], systems)
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
        kd = r.get("kv_dtype") or ("fp8" if wd in ("fp8", "fp4") else "bf16")
        if kd not in KV_DTYPES:
            skip(f"KV format {kd!r} is not a catalog KV format (allowed: {', '.join(KV_DTYPES)})")
            continue
        arch = models[model]
        if wd in INTEGER_DTYPES and arch.is_moe:
            wd = "bf16"  # integer MoE checkpoints quantize the routed experts only (W4A16 experts, the rest BF16)
        if r["isl"] + r["osl"] > arch.max_context:
            skip(f"ISL + OSL = {int(r['isl'] + r['osl']):,} exceeds {model}'s trained window")
            continue
        row = {"id": r["id"], "model": model, "system": system, "backend": r.get("backend", ""), "mode": r["mode"],
               "layout": "stated", "sweep": r.get("sweep") or "",
               "isl": int(r["isl"]), "osl": int(r["osl"]), "wd": wd, "ed": ed, "kd": kd,
               "measured_ttft_s": r["silicon_ttft_ms"] / 1e3, "measured_tpot_s": r["silicon_tpot_ms"] / 1e3}
        if r["mode"] == "agg":
            lay = _layout(r, "", arch.is_moe, arch.spec.attention.n_heads)
            if isinstance(lay, str):
                skip(lay)
                continue
            (tp, dp, ep, etp, pp), row["layout"] = lay
            per_rank = r["batch_size"] if np.isfinite(r["batch_size"]) and r["batch_size"] >= 1 else np.nan
            loaded = np.isfinite(r["concurrency"]) and r["concurrency"] >= 1
            conc = r["concurrency"] if loaded else per_rank * dp
            if not loaded and row["layout"] == "stated":
                row["layout"] = "no_concurrency"
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
            (pre, pre_known), (dec, dec_known) = pre, dec
            pw, dw = r["prefill_num_workers"], r["decode_num_workers"]
            stated = np.isfinite(pw) and pw >= 1 and np.isfinite(dw) and dw >= 1
            row["layout"] = "unknown" if not stated else "stated" if pre_known == dec_known == "stated" else "padded"
            if not stated:  # no deployment stated: the smallest one of the stated worker sizes, predicted apart
                pw = dw = 1.0
            conc = r["concurrency"]
            if not (np.isfinite(conc) and conc >= 1):
                per_rank = r["decode_batch_size"]
                if not (np.isfinite(per_rank) and per_rank >= 1):
                    skip("neither concurrency nor decode_batch_size is given")
                    continue
                conc = per_rank * dec[1] * dw
                if row["layout"] == "stated":
                    row["layout"] = "no_concurrency"
            row.update(concurrency=float(conc), tp=dec[0], dp=dec[1], ep=dec[2], etp=dec[3], pp=dec[4],
                       replicas=float(dw), in_flight=float(conc) / dw, p_tp=pre[0], p_dp=pre[1], p_ep=pre[2],
                       p_etp=pre[3], p_pp=pre[4], p_replicas=float(pw),
                       chips=dec[0] * dec[1] * dec[4] * dw + pre[0] * pre[1] * pre[4] * pw)
        rows.append(row)
    table, duplicates = _one_per_measurement(pd.DataFrame(rows))
    return Runs(table, skipped, len(raw), duplicates)


MEASUREMENT = ("model", "system", "backend", "mode", "isl", "osl", "concurrency", "measured_ttft_s", "measured_tpot_s")
"""What identifies one measurement: a run of one model, system, framework, mode and lengths at one concurrency, its
TTFT and TPOT equal to the last digit."""
DEPLOYMENT = ("wd", "kd", "tp", "dp", "ep", "etp", "pp", "replicas", "p_tp", "p_dp", "p_ep", "p_etp", "p_pp",
              "p_replicas")
"""What a row states of its deployment (formats and the layout of each pool)."""


def _one_per_measurement(t: pd.DataFrame) -> tuple[pd.DataFrame, list[dict]]:
    """One row per measurement (`MEASUREMENT`), the other rows returned as duplicates (their id, the kept id).

    A file may list one benchmark run several times (512 of the catalog's 3,113 measured runs repeat another's
    measurement under other ids, from other exports): a copy is not another observation, and counted again it weighs its
    sweep twice in the fits and the medians. Where the copies state one deployment the first is kept. Where they
    state different ones, a copy that states the whole layout (``layout`` ``stated``: every pool's degrees and, where
    disaggregated, its worker counts) is the measurement's deployment where the stated copies agree: the others state
    less of it (an export that leaves the worker counts empty and writes a pool's attention DP 8 as "tp8", or
    multiplies the attention TP by the expert TP: "tp8_ep8" as TP64 x expert TP8); on the catalog's file, 53
    measurements (41 disaggregated, 12 aggregated). Where no copy states it all, or the stated ones differ, one
    measurement cannot confirm them all, so it is kept once, on the deployment with the fewest chips (as a row
    stating no layout is predicted on the smallest one), with ``layout`` ``conflicting``: predicted apart, read by no
    fit.
    """
    if t.empty:
        return t, []
    key = t.groupby(list(MEASUREMENT), sort=False, dropna=False).ngroup().to_numpy()
    if len(np.unique(key)) == len(t):
        return t, []
    shown = [c for c in DEPLOYMENT if c in t]  # each row's deployment, numbered (equal NaNs equal, as
    deployment = t.groupby(shown, sort=False, dropna=False).ngroup().to_numpy() if shown else np.zeros(len(t), int)
    # drop_duplicates has them)
    chips = t["chips"].to_numpy()
    keep, duplicates = np.ones(len(t), dtype=bool), []
    layout = t["layout"].to_numpy(dtype=object).copy()
    for idx in pd.Series(np.arange(len(t))).groupby(key, sort=False).indices.values():
        if len(idx) == 1:
            continue
        stated = idx[layout[idx] == "stated"]
        if len(stated) and len(np.unique(deployment[stated])) == 1:
            idx = np.concatenate([stated, idx[layout[idx] != "stated"]])  # a copy stating the whole layout first
            conflicting = False
        else:
            conflicting = len(np.unique(deployment[idx])) > 1
        kept = idx[int(np.argmin(chips[idx]))] if conflicting else idx[0]
        if conflicting:
            layout[kept] = "conflicting"
        for i in idx:
            if i != kept:
                keep[i] = False
                duplicates.append({"id": t["id"].iat[i], "copy_of": t["id"].iat[kept]})
    out = t.assign(layout=layout)[keep].reset_index(drop=True)
    return out, duplicates



def family_key(table: pd.DataFrame) -> pd.Series:
    """What the catalog's decode factors are shared by (`dse validate --fit`): the hardware family (the system
    where it has none), whichever the mode (a decode pass runs the same kernels whether or not prefill runs
    elsewhere; the request level adds the interference). Rows whose layout is not stated (``layout``) calibrate
    nothing: the fits never read them.
    """
    return pd.Series([family_of(s) or s for s in table["system"]], index=table.index)


def factor_key(table: pd.DataFrame) -> pd.Series:
    """What a set of decode factors refitted by `validate_runs` is shared by: the `family_key` and the
    framework (``hopper|sglang``, ``cdna3|sglang``). Each framework runs its own kernels (GEMM, attention,
    all-to-all) and its own scheduler, so the shares of peak, the fixed times and the half-performance lengths
    it reaches are its own. Whether the data bear it out is measured, not assumed: the summary's
    ``loo_family_factors_median_abs_error`` (one set per family shared by the frameworks) beside
    ``loo_median_abs_error``, which `dse validate --cases` prints.
    """
    return family_key(table) + "|" + table["backend"].astype(str)


def group_key(table: pd.DataFrame) -> pd.Series:
    """The concurrency sweep of each row (`GROUP`, with the row's ``sweep`` for ISL and OSL where given)."""
    def joined(columns: list[str]) -> pd.Series:  # the columns' text joined by "|", column by column
        out = table[columns[0]].astype(str)
        for c in columns[1:]:
            out = out + "|" + table[c].astype(str)
        return out

    by_lengths = joined(list(GROUP))
    if "sweep" not in table or not table["sweep"].astype(bool).any():
        return by_lengths
    named = joined([*GROUP[:4], "sweep"])
    return named.where(table["sweep"].astype(bool), by_lengths)

