"""Benchmark result files read as measured runs: the JSON the benchmark scripts of ``dse export`` leave behind.

Each result carries the plan it measured (``dse-plan``: model, system, layout of every pool, formats, prompt and
output lengths, concurrency), so a run maps onto the columns of a measured-runs CSV (`dse.validate.runs`) and
flows through the same prediction and cross-validation; ``dse validate --cases RESULT.json`` also writes the rows
as ``runs.csv`` in that format, to append to one's own measured-runs file. The formats, by the field names of the
tools' sources:

- ``vllm bench serve --save-result`` (vLLM 0.33.0, vllm/benchmarks/serve.py): one JSON object with
  ``mean_ttft_ms``, ``mean_tpot_ms``, ``completed``, ``max_concurrency`` and the ``--metadata`` pairs at the top
  level (``dse_plan``: the plan as a JSON string).
- SGLang's ``sglang.benchmark.serving --output-file`` (SGLang 0.5.23, sglang/benchmark/serving.py): JSON lines,
  one per run appended, with ``mean_ttft_ms``, ``mean_tpot_ms``, ``completed``, ``max_concurrency`` and ``tag``
  (the plan).
- ``aiperf profile`` (aiperf 0.13.0, aiperf/common/models/export_models.py ``JsonExportData``):
  ``profile_export_aiperf.json`` with one object per metric (``time_to_first_token``, ``inter_token_latency``,
  ``request_count``: ``unit`` and ``avg``); aiperf has no field for the plan, so it is read from ``dse-plan.json``
  beside the file (the benchmark script writes it there).

TPOT is the tools' time per output token after the first (vLLM, SGLang: ``mean_tpot_ms``; aiperf: the mean
``inter_token_latency``, the same quotient), TTFT the mean time to first token: the figures the measured-runs
file holds as ``silicon_tpot_ms`` and ``silicon_ttft_ms``.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd

from dse.errors import InputError
from dse.validate.runs import MAX_CSV_BYTES, NUMERIC

PLAN_FILE = "dse-plan.json"
WEIGHTS_COLUMN = {"bf16": "bf16", "fp8": "fp8", "fp4": "fp4", "int4": "int4_wo"}
"""dse's weights formats in the measured-runs spelling (`dse.validate.runs.WEIGHTS`)."""
TO_MS = {"ms": 1.0, "s": 1e3, "sec": 1e3, "us": 1e-3, "ns": 1e-6}
"""aiperf metric units to milliseconds."""


def _shape(path: Path) -> str:
    return (f"{path}: not a benchmark result dse can read; expected the JSON of `vllm bench serve --save-result`, "
            "the JSON lines of SGLang's sglang.benchmark.serving, or aiperf's profile_export_aiperf.json, as the "
            "benchmark scripts of `dse export` write them")


def _read_text(path: Path) -> str:
    if not path.is_file():
        raise InputError(f"{path}: {'not a file' if path.exists() else 'no such file'}")
    try:
        if path.stat().st_size > MAX_CSV_BYTES:
            raise InputError(f"{path}: file of {path.stat().st_size:,} bytes; at most {MAX_CSV_BYTES:,} are read")
        return path.read_bytes().decode("utf-8-sig")
    except OSError as exc:
        raise InputError(f"{path}: cannot read: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise InputError(f"{path}: not UTF-8 text; {_shape(path)}") from None


def _json(text: str, path: Path, what: str) -> object:
    try:
        return json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise InputError(f"{path}: {what} is not JSON ({str(exc).split(';')[0]})") from None


def _plan(value: object, path: Path, where: str) -> dict:
    """The plan a result carries (a JSON string or object written by dse export), checked for what the rows need."""
    doc = _json(value, path, where) if isinstance(value, str) else value
    if not isinstance(doc, dict) or doc.get("dse_plan") != 1:
        raise InputError(f"{path}: {where}: not a plan written by dse export (a JSON object with dse_plan 1)")
    for key in ("framework", "model", "serving", "prompt", "output", "concurrency", "pools"):
        if key not in doc:
            raise InputError(f"{path}: {where}: field '{key}' missing from the plan")
    pools = doc["pools"]
    if not isinstance(pools, list) or not pools or not all(isinstance(p, dict) for p in pools):
        raise InputError(f"{path}: {where}: field 'pools' must be a non-empty list of pools")
    for i, p in enumerate(pools):
        for key in ("role", "system", "replicas", "tp", "dp", "ep", "pp", "batch_per_rank", "weights_dtype",
                    "kv_dtype"):
            if key not in p:
                raise InputError(f"{path}: {where}: field 'pools[{i}].{key}' missing from the plan")
    return doc


def _number(value: object, path: Path, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise InputError(f"{path}: {what}: must be a finite number >= 0, got {value!r}")
    return float(value)


def _row(plan: dict, run_id: str, ttft_ms: float, tpot_ms: float, concurrency: float, path: Path) -> dict:
    """One run in the measured-runs columns (`dse.validate.runs.read_runs`), from its plan and measured means."""
    pools = plan["pools"]
    systems = {p["system"] for p in pools}
    if len(systems) != 1:
        raise InputError(f"{path}: the plan's pools run on {', '.join(sorted(systems))}; a measured run is "
                         "predicted on one system")
    if any(p.get("context_parallel") for p in pools):
        raise InputError(f"{path}: the plan prefills with context parallelism, which the measured-runs model does "
                         "not describe (its prefill pool serves one prompt per DP rank)")
    weights = WEIGHTS_COLUMN.get(pools[0]["weights_dtype"], pools[0]["weights_dtype"])
    row = {"id": run_id, "model_path": plan["model"], "system": systems.pop(), "backend": plan["framework"],
           "mode": "agg" if plan["serving"] == "aggregated" else "disagg", "gemm_quant_mode": weights,
           "kv_dtype": pools[-1]["kv_dtype"], "isl": plan["prompt"], "osl": plan["output"],
           "concurrency": concurrency, "silicon_ttft_ms": ttft_ms, "silicon_tpot_ms": tpot_ms}

    def layout(prefix: str, p: dict) -> dict:
        chips = p["tp"] * p["dp"]
        return {f"{prefix}tp_size": p["tp"], f"{prefix}attention_dp_size": p["dp"], f"{prefix}pp_size": p["pp"],
                f"{prefix}moe_ep_size": p["ep"], f"{prefix}moe_tp_size": chips // p["ep"]}

    if plan["serving"] == "aggregated":
        row.update(layout("", pools[0]), batch_size=pools[0]["batch_per_rank"])
    else:
        pre = next(p for p in pools if p["role"] == "prefill")
        dec = next(p for p in pools if p["role"] == "decode")
        row.update({**layout("prefill_", pre), **layout("decode_", dec), "prefill_num_workers": pre["replicas"],
                    "decode_num_workers": dec["replicas"], "decode_batch_size": dec["batch_per_rank"]})
    return row


def _vllm(doc: dict, path: Path) -> list[dict]:
    plan = _plan(doc["dse_plan"], path, "field 'dse_plan'")
    if _number(doc.get("completed", 0), path, "field 'completed'") < 1:
        raise InputError(f"{path}: field 'completed': no request completed in this run")
    conc = doc.get("max_concurrency") or plan["concurrency"]
    return [_row(plan, path.stem, _number(doc.get("mean_ttft_ms"), path, "field 'mean_ttft_ms'"),
                 _number(doc.get("mean_tpot_ms"), path, "field 'mean_tpot_ms'"),
                 _number(conc, path, "field 'max_concurrency'"), path)]


def _sglang(lines: list[tuple[int, dict]], path: Path) -> list[dict]:
    rows = []
    for n, doc in lines:
        where = f"line {n}"
        plan = _plan(doc.get("tag"), path, f"{where}: field 'tag'")
        if _number(doc.get("completed", 0), path, f"{where}: field 'completed'") < 1:
            raise InputError(f"{path}: {where}: field 'completed': no request completed in this run")
        conc = doc.get("max_concurrency") or plan["concurrency"]
        rows.append(_row(plan, f"{path.stem}-{n}", _number(doc.get("mean_ttft_ms"), path, f"{where}: field "
                                                                                          "'mean_ttft_ms'"),
                         _number(doc.get("mean_tpot_ms"), path, f"{where}: field 'mean_tpot_ms'"),
                         _number(conc, path, f"{where}: field 'max_concurrency'"), path))
    return rows


def _aiperf_ms(doc: dict, key: str, path: Path) -> float:
    m = doc.get(key)
    if not isinstance(m, dict) or m.get("unit") not in TO_MS:
        raise InputError(f"{path}: field '{key}': must be a metric with a time unit ({', '.join(TO_MS)}) and an "
                         f"average (run aiperf with --streaming)")
    return _number(m.get("avg"), path, f"field '{key}.avg'") * TO_MS[m["unit"]]


def _aiperf(doc: dict, path: Path) -> list[dict]:
    side = path.parent / PLAN_FILE
    if not side.is_file():
        raise InputError(f"{path}: aiperf results carry no plan and no {PLAN_FILE} lies beside the file; copy the "
                         f"{PLAN_FILE} the export's bench_trtllm.sh wrote there")
    plan = _plan(_read_text(side), side, "the file")
    count = doc.get("request_count")
    if isinstance(count, dict) and _number(count.get("avg", 0), path, "field 'request_count.avg'") < 1:
        raise InputError(f"{path}: field 'request_count': no request completed in this run")
    return [_row(plan, path.parent.name or path.stem, _aiperf_ms(doc, "time_to_first_token", path),
                 _aiperf_ms(doc, "inter_token_latency", path), float(plan["concurrency"]), path)]


def read_benchmark(path: Path) -> pd.DataFrame:
    """The runs of a benchmark result file as the raw columns `dse.validate.runs.map_runs` takes (`read_runs`'
    shape: the `NUMERIC` columns as floats, NaN where a run has none); an InputError names the file and field.
    """
    path = Path(path)
    text = _read_text(path)
    stripped = text.strip()
    if not stripped:
        raise InputError(f"{path}: empty file; {_shape(path)}")
    lines = [ln for ln in stripped.splitlines() if ln.strip()]
    if len(lines) > 1 and all(ln.lstrip().startswith("{") and ln.rstrip().endswith("}") for ln in lines):
        docs = []
        for n, ln in enumerate(stripped.splitlines(), 1):
            if ln.strip():
                doc = _json(ln, path, f"line {n}")
                if not isinstance(doc, dict):
                    raise InputError(f"{path}: line {n}: must be a JSON object")
                docs.append((n, doc))
        if all("tag" in d for _, d in docs):
            rows = _sglang(docs, path)
        else:
            raise InputError(_shape(path))
    else:
        doc = _json(stripped, path, "the file")
        if not isinstance(doc, dict):
            raise InputError(_shape(path))
        if "dse_plan" in doc:
            rows = _vllm(doc, path)
        elif "tag" in doc and "mean_ttft_ms" in doc:
            rows = _sglang([(1, doc)], path)
        elif "time_to_first_token" in doc:
            rows = _aiperf(doc, path)
        else:
            raise InputError(_shape(path) + " (no dse_plan, tag or time_to_first_token field: was it run from a "
                             "dse export's benchmark script?)")
    raw = pd.DataFrame(rows)
    for col in NUMERIC:
        raw[col] = pd.to_numeric(raw[col], errors="coerce") if col in raw else np.nan
    return raw
