"""The published cases (hw_catalog/calibration/cases.yaml, each with its source) read into points
(`dse.validate.points`): one measured figure, the configuration that produced it, and how to predict it with the
physics. Cases the model cannot represent are listed as skipped with the reason.
"""

from __future__ import annotations

from pathlib import Path

from dse.catalog.hardware import hw_dir
from dse.catalog.loading import read_yaml
from dse.errors import InputError
from dse.validate.measured import load_measured
from dse.validate.points import Cases, Point, Skipped
from dse.validate.published import load_published


def cases_path() -> Path:
    return hw_dir() / "calibration" / "cases.yaml"


def _source(case: dict) -> str:
    s = case.get("source", {})
    return s.get("url") or s.get("citation") or f"{s.get('repo', '')}/{s.get('path', '')}"


def _trt_v1(case: dict, model: str, layouts: list[tuple[str, int, str]]) -> list[Point]:
    pts = []
    for pair, values in case["measured_total_output_tok_s"].items():
        isl, osl = (int(x) for x in str(pair).split("/"))
        for (system, tp, wd), value in zip(layouts, values, strict=True):
            pts.append(Point(
                case["id"], "serving_throughput", f"{model} {system} TP{tp} {wd} {pair}", "offline", model, system,
                tp, 1, 1, 1, wd, "fp8", float(value), "output tokens/s", isl=isl, osl=osl, source=_source(case),
            ))
    return pts


def load_cases(path: Path | None = None) -> Cases:
    """Turn the published cases into points, and say why the others are skipped.

    A malformed file or case is an InputError naming the file and the case.
    """
    path = Path(path) if path else cases_path()
    if path.suffix.lower() == ".csv":
        raise InputError(f"{path}: a CSV of measured serving runs is read by dse.validate.runs, not as YAML "
                         "cases")
    if not path.exists():
        raise InputError(f"{path}: no such cases file")
    doc = read_yaml(path)
    if not isinstance(doc, dict) or not isinstance(doc.get("cases"), list):
        raise InputError(f"{path}: expected a top-level 'cases:' list of published cases")
    out = Cases()
    for i, case in enumerate(doc["cases"]):
        if not isinstance(case, dict) or not isinstance(case.get("id"), str):
            raise InputError(f"{path}: cases[{i}]: expected a mapping with at least an 'id' string")
        try:
            _load_case(case, out, path.parent)
        except (KeyError, TypeError, ValueError, AttributeError, IndexError) as exc:
            detail = f"missing field {exc}" if isinstance(exc, KeyError) else str(exc)
            raise InputError(f"{path}: cases[{i}] (id '{case['id']}'): malformed: {detail}") from None
    seen: dict[str, str] = {}
    for p in out.points:  # a label keys its stored leave-one-out prediction (calibration/fitted.yaml): one per point
        if p.label in seen:
            raise InputError(f"{path}: cases '{seen[p.label]}' and '{p.case}': two points labelled {p.label!r}; "
                             "a point's label must name what sets it apart (system, layout, formats, lengths)")
        seen[p.label] = p.case
    return out


def _load_case(case: dict, out: Cases, folder: Path) -> None:
    """Append the points of one case to ``out`` (or record why it is skipped)."""
    cid, cat = case["id"], case.get("category", "")
    if "file" in case:  # a table of published runs, one point (or skipped row) per row
        rows = load_published(folder / case["file"])
        out.points += rows.points
        out.skipped += rows.skipped
    elif "measured_file" in case:  # steps measured on a GPU by scripts/measure_gpu.py
        out.points += load_measured(folder / case["measured_file"], cid, case["system"], case["stack"],
                                    case["attention"], _source(case)).points
    elif cid == "trtllm_perf_overview_v1_llama33_70b":
        out.points += _trt_v1(case, "llama-3.3-70b", [("b200", 1, "fp4"), ("gb200-nvl72", 1, "fp4"),
                                                       ("h200", 1, "fp8"), ("h100", 2, "fp8")])
    elif cid == "trtllm_perf_overview_v1_llama31_405b":
        out.points += _trt_v1(case, "llama-3.1-405b", [("b200", 4, "fp4"), ("gb200-nvl72", 4, "fp4"),
                                                        ("h200", 8, "fp8"), ("h100", 8, "fp8")])
    elif cid == "trtllm_perf_overview_v017_llama31_70b_tp_sweep":
        for tpk, table in case["measured_total_tok_s"].items():
            tp = int(tpk.removeprefix("tp"))
            for pair, values in table.items():
                isl, osl = (int(x) for x in str(pair).split("/"))
                for system, value in zip(("h200", "h100"), values, strict=True):
                    if value == "unknown":
                        continue
                    out.points.append(Point(
                        cid, "serving_throughput", f"llama-3.1-70b {system} TP{tp} fp8 {pair} (v0.17)", "offline",
                        "llama-3.1-70b", system, tp, 1, 1, 1, "fp8", "fp8", float(value), "output tokens/s",
                        isl=isl, osl=osl, source=_source(case),
                    ))
        for pair, value in case["also"]["llama31_405b_h200_tp8_fp8"].items():
            isl, osl = (int(x) for x in str(pair).split("/"))
            out.points.append(Point(
                cid, "serving_throughput", f"llama-3.1-405b h200 TP8 fp8 {pair} (v0.17)", "offline",
                "llama-3.1-405b", "h200", 8, 1, 1, 1, "fp8", "fp8", float(value), "output tokens/s",
                isl=isl, osl=osl, source=_source(case),
            ))
        out.skipped.append(Skipped(cid, "serving_throughput",
                                   "the Mixtral 8x7B rows: the model is not in the catalog"))
    elif cid == "sglang_h100_decode_ep72":
        m = case["measured"]
        src = _source(case)
        out.points.append(Point(
            cid, "serving_throughput", "deepseek-v3 72 x h100 EP72 DP72 decode, 256/GPU, KV 2000", "decode",
            "deepseek-v3", "h100", 1, 72, 72, 1, "fp8", "bf16", float(m["tok_s_per_node"]["bs256_kv2000"]),
            "output tokens/s per node", batch=256 * 72, context=2000, divide_by=9, source=src,
        ))
        for key, nodes_key in (("deepseek_profile", "deepseek_profile"), ("deepseek_blog", "deepseek_blog")):
            row = m["comparison_rows"][nodes_key]
            gpus = 8 * int(row["nodes"])
            out.points.append(Point(
                cid, "serving_throughput",
                f"deepseek-v3 {gpus} x h800 EP{gpus} decode, {row['batch']}/GPU, KV {row['kv']} ({key})", "decode",
                "deepseek-v3", "h800", 1, gpus, gpus, 1, "fp8", "bf16", float(row["tok_s_node"]),
                "output tokens/s per node", batch=int(row["batch"]) * gpus, context=int(row["kv"]),
                divide_by=int(row["nodes"]), source=src,
            ))
        out.points.append(Point(
            cid, "latency", "deepseek-v3 72 x h100 EP72: dispatch time of one layer, 256/GPU", "dispatch",
            "deepseek-v3", "h100", 1, 72, 72, 1, "fp8", "bf16", float(m["dispatch_time_per_layer_ms"]) * 1e-3, "s",
            batch=256 * 72, context=2000, source=src,
        ))
        out.skipped.append(Skipped(cid, "serving_throughput",
                                   "the simulated-MTP row: speculative decoding is not modelled"))
    elif cid == "sglang_h100_prefill_ep32":
        value = case["measured"]["tok_s_per_node_by_prompt_len"][4096]
        out.points.append(Point(
            cid, "serving_throughput", "deepseek-v3 32 x h100 EP32 prefill, 4096-token prompts, 16384 tokens/GPU",
            "prefill", "deepseek-v3", "h100", 1, 32, 32, 1, "fp8", "bf16", float(value), "input tokens/s per node",
            batch=32 * 4, context=4096, divide_by=4, source=_source(case),
        ))
        out.skipped.append(Skipped(cid, "serving_throughput",
                                   "the 1K and 2K prompt rows: tokens per device not stated"))
    elif cid == "sglang_h100_96gpu_headline":
        out.skipped.append(Skipped(cid, "serving_throughput",
                                   "prefill/decode disaggregated headline: batch and output length not stated"))
    elif cid == "mlperf_v50_offline_nvidia":
        out.skipped.append(Skipped(cid, "serving_throughput", "input-length distributions not stated in the case, "
                                   "and llama2-70b / mixtral-8x7b are not in the model catalog"))
    else:
        out.skipped.append(Skipped(cid, cat, f"a {cat.replace('_', ' ')} reference, not a measurement of "
                                   "throughput, latency or MFU"))
