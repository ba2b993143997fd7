"""Predictions against published measurements (`dse validate`), and the fit of the efficiencies.

The published cases (hw_catalog/calibration/cases.yaml, each with its source) are turned into
*points*: one measured figure, the configuration that produced it, and how to predict it with the
physics. Cases the model cannot represent are listed as skipped with the reason.

Kinds of prediction:
- ``offline``: maximum output throughput of a replica serving requests of ISL prompt and OSL output
  tokens (benchmarks at infinite request rate): the batch is as large as HBM allows with every
  request's KV reserved at ISL + OSL, decode runs at the mean context ISL + OSL / 2, and each
  request's prefill (in chunks of 8,192 tokens) shares the chips: out = 1 / (ISL / (OSL P) + 1 / D).
- ``decode`` / ``prefill``: tokens per second at a stated batch and context.
- ``dispatch``: time of one MoE dispatch (all-to-all) of one layer.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import pandas as pd

from dse.catalog import read_yaml
from dse.hardware import IDEAL, Efficiency, default_systems, efficiency_for, hw_dir
from dse.models import Architecture, ModelSpec, default_models
from dse.physics import ACT_BYTES, Candidates, ModelTable, SystemTable, evaluate
from dse.training import TrainLayout, train_step
from dse.units import DTYPE_BYTES, DTYPES

CATEGORIES = ("serving_throughput", "latency", "training_mfu")
PREFILL_CHUNK = 8192


@dataclass(frozen=True)
class Point:
    """One measured figure and the configuration behind it."""

    case: str
    category: str
    label: str
    kind: str  # offline | decode | prefill | dispatch
    model: str
    system: str
    tp: int
    dp: int
    ep: int
    pp: int
    weights_dtype: str
    kv_dtype: str
    measured: float
    unit: str
    isl: int = 0
    osl: int = 0
    batch: int = 0
    context: int = 0
    divide_by: float = 1.0  # e.g. nodes, for per-node figures
    max_batch: int = 4096
    source: str = ""


@dataclass(frozen=True)
class Skipped:
    case: str
    category: str
    reason: str


@dataclass(frozen=True)
class TrainPoint:
    """One published training measurement: the layout, and MFU or TFLOP/s per GPU."""

    case: str
    label: str
    model: Architecture
    system: str
    layout: TrainLayout
    global_batch: int
    seq: int
    measured: float
    unit: str  # "MFU" or "TFLOP/s per GPU (Megatron counting)"
    category: str = "training_mfu"
    source: str = ""


@dataclass
class Cases:
    points: list[Point] = field(default_factory=list)
    skipped: list[Skipped] = field(default_factory=list)
    training: list[TrainPoint] = field(default_factory=list)


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
    """Turn the published cases into points, and say why the others are skipped."""
    doc = read_yaml(Path(path) if path else cases_path())
    out = Cases()
    for case in doc["cases"]:
        cid, cat = case["id"], case.get("category", "")
        if cid == "trtllm_perf_overview_v1_llama33_70b":
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
        elif cid == "train_megatron_2021_table1":
            seq, vocab = case["config_common"]["seq"], case["config_common"]["vocab"]
            for params_b, heads, h, layers, tp, pp, gpus, batch, tflops, *_ in case["rows"]:
                model = gpt_model(params_b, heads, h, layers, vocab)
                lay = TrainLayout(tp=tp, pp=pp, dp=gpus // (tp * pp), micro_batch=1, interleave=2 if pp > 1 else 1,
                                  recompute="full")
                out.training.append(TrainPoint(
                    cid, f"GPT {params_b}B on {gpus} x a100 TP{tp} PP{pp} DP{lay.dp}, batch {batch} (assumed: "
                    "micro-batch 1, 2 interleaved stages, full recompute)", model, "a100", lay, batch, seq,
                    float(tflops), "TFLOP/s per GPU (Megatron counting)", source=_source(case)))
        elif cid == "train_llama3_405b_table4":
            model = default_models()["llama-3.1-405b"]
            for row in case["rows"]:
                lay = TrainLayout(tp=row["tp"], pp=row["pp"], dp=row["dp"], cp=row["cp"], micro_batch=1,
                                  interleave=2, recompute="none" if row["cp"] == 1 else "selective")
                batch = row["batch_per_dp"] * row["dp"]
                out.training.append(TrainPoint(
                    cid, f"Llama 3.1 405B on {row['gpus']} x h100 TP{row['tp']} CP{row['cp']} PP{row['pp']} "
                    f"DP{row['dp']}, seq {row['seq']} (assumed: micro-batch 1, 2 interleaved stages)", model,
                    "h100", lay, batch, row["seq"], float(row["bf16_mfu"]), "MFU", source=_source(case)))
        else:
            out.skipped.append(Skipped(cid, cat, f"a {cat.replace('_', ' ')} reference, not a measurement of "
                                       "throughput, latency or MFU"))
    return out


def gpt_model(params_b: float, heads: int, hidden: int, layers: int, vocab: int) -> Architecture:
    """A GPT-3-style dense model (MHA with biases, 4h non-gated MLP) of the Megatron-LM tables."""
    return Architecture(ModelSpec.model_validate({
        "id": f"gpt-{params_b:g}b", "name": f"GPT {params_b:g}B", "d_model": hidden, "n_layers": layers,
        "vocab": vocab, "source": {"title": "Narayanan et al. 2021, Table 1", "date": "2021-04"},
        "published_b": {"total": params_b, "active": params_b, "precision_total": 0.1, "precision_active": 0.1,
                        "source": "Megatron-LM 2021 Table 1", "active_includes_embedding": True},
        "attention": {"kind": "mha", "n_heads": heads, "n_kv_heads": heads, "head_dim": hidden // heads,
                      "bias": True},
        "ffn": {"kind": "dense", "d_ff": 4 * hidden, "gated": False, "bias": True},
    }))


def megatron_flops(tp: TrainPoint) -> float:
    """FLOPs per iteration as Megatron-LM counts them: 96 B s l h^2 (1 + s / 6h + V / 16 l h)."""
    s, h, layers, v = tp.seq, tp.model.spec.d_model, tp.model.spec.n_layers, tp.model.spec.vocab
    return 96.0 * tp.global_batch * s * layers * h * h * (1 + s / (6 * h) + v / (16 * layers * h))


def predict_training(points: list[TrainPoint], eff: Efficiency | None = None) -> np.ndarray:
    """Predicted MFU, or TFLOP/s per GPU in Megatron's counting, of each training point."""
    systems = default_systems()
    out = []
    for tp in points:
        system = systems[tp.system]
        e = IDEAL if eff is IDEAL else (eff or efficiency_for(tp.system))
        r = train_step(tp.model, system, tp.layout, tp.global_batch, tp.seq, eff=e)
        if tp.unit == "MFU":
            out.append(r["mfu"])
        else:
            out.append(megatron_flops(tp) / (r["step_s"] * tp.layout.chips) / 1e12)
    return np.array(out)


# ---- predictions --------------------------------------------------------------------------------
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
    for kind in ("offline", "decode", "prefill", "dispatch"):
        idx = np.flatnonzero(kinds == kind)
        if len(idx) == 0:
            continue
        pts = [points[i] for i in idx]
        div = np.array([p.divide_by for p in pts])
        if kind == "offline":
            out[idx] = _offline(pts, eff)
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


# ---- errors -------------------------------------------------------------------------------------
def table(points: list[Point], predicted: np.ndarray, ideal: np.ndarray, loo: np.ndarray | None = None) -> pd.DataFrame:
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


def summarize(df: pd.DataFrame) -> pd.DataFrame:
    """Median and 90th-percentile absolute error by category (in-sample and leave-one-out)."""
    rows = []
    for cat, g in df.groupby("category"):
        row = {"category": cat, "points": len(g),
               "median_abs_error": float(g["error"].abs().median()),
               "p90_abs_error": float(g["error"].abs().quantile(0.9))}
        if "loo_error" in g:
            row["loo_median_abs_error"] = float(g["loo_error"].abs().median())
            row["loo_p90_abs_error"] = float(g["loo_error"].abs().quantile(0.9))
        rows.append(row)
    return pd.DataFrame(rows)


# ---- fitting ------------------------------------------------------------------------------------
FAMILIES = {"hopper": ("h100", "h800", "h200"), "blackwell": ("b200", "b300", "gb200-nvl72", "gb300-nvl72")}
# layer_overhead and the collective latencies stay estimates: offline-throughput cases cannot tell a
# fixed per-layer time from a lower efficiency at large batch, and a fitted overhead would then set
# the latency floor of small batches wrongly.
FITTED = ("compute_prefill", "compute_decode", "memory", "link", "overlap", "hbm_usable")
BOUNDS = {"compute_prefill": (0.05, 1.0), "compute_decode": (0.05, 1.0), "memory": (0.05, 1.0),
          "link": (0.05, 1.0), "overlap": (0.0, 1.0), "layer_overhead": (0.0, 1000e-6), "hbm_usable": (0.8, 0.98)}
SCALE = {"layer_overhead": 1e-6}  # fit in microseconds


def _to_eff(theta: np.ndarray, base: Efficiency) -> Efficiency:
    return replace(base, **{k: float(v) * SCALE.get(k, 1.0) for k, v in zip(FITTED, theta, strict=True)})


def _from_eff(eff: Efficiency) -> np.ndarray:
    return np.array([getattr(eff, k) / SCALE.get(k, 1.0) for k in FITTED])


def fit(points: list[Point], start: Efficiency, max_nfev: int = 400) -> tuple[Efficiency, float]:
    """Least squares on log(predicted / measured) over the points; returns factors and RMS log error."""
    from scipy.optimize import least_squares

    measured = np.array([p.measured for p in points])
    lo = np.array([BOUNDS[k][0] / SCALE.get(k, 1.0) for k in FITTED])
    hi = np.array([BOUNDS[k][1] / SCALE.get(k, 1.0) for k in FITTED])

    def residuals(theta: np.ndarray) -> np.ndarray:
        pred = predict(points, _to_eff(theta, start))
        return np.log(np.maximum(pred, 1e-30) / measured)

    x0 = np.clip(_from_eff(start), lo + 1e-9, hi - 1e-9)
    res = least_squares(residuals, x0, bounds=(lo, hi), max_nfev=max_nfev, x_scale="jac")
    return _to_eff(res.x, start), float(np.sqrt(np.mean(res.fun**2)))


def _calibrate_training(points: list[TrainPoint], default: Efficiency, families: dict[str, Efficiency], loo: bool):
    """Fit the training matmul efficiency (one value for every system) on the training points."""
    from scipy.optimize import minimize_scalar

    measured = np.array([p.measured for p in points])

    def effs(value: float, pts: list[TrainPoint]) -> list[Efficiency]:
        return [replace(families.get(family_of(p.system), default), compute_train=value) for p in pts]

    def predict_with(value: float, pts: list[TrainPoint]) -> np.ndarray:
        return np.array([predict_training([p], e)[0] for p, e in zip(pts, effs(value, pts), strict=True)])

    def best(pts: list[TrainPoint], meas: np.ndarray) -> float:
        res = minimize_scalar(lambda v: float(np.sum(np.log(predict_with(v, pts) / meas) ** 2)),
                              bounds=(0.05, 1.0), method="bounded", options={"xatol": 1e-5})
        return float(res.x)

    value = best(points, measured)
    pred = predict_with(value, points)
    ideal = predict_training(points, IDEAL)
    loo_pred = None
    if loo:
        loo_pred = np.array([
            predict_with(best([q for j, q in enumerate(points) if j != i], np.delete(measured, i)), [p])[0]
            for i, p in enumerate(points)
        ])
    df = pd.DataFrame({"case": [p.case for p in points], "category": "training_mfu",
                       "label": [p.label for p in points], "unit": [p.unit for p in points], "measured": measured,
                       "predicted": pred, "ideal": ideal})
    df["error"] = df["predicted"] / df["measured"] - 1.0
    if loo_pred is not None:
        df["loo_predicted"] = loo_pred
        df["loo_error"] = df["loo_predicted"] / df["measured"] - 1.0
    df["family"] = "training"
    default = replace(default, compute_train=value)
    families = {k: replace(v, compute_train=value) for k, v in families.items()}
    return default, families, df


def family_of(system: str) -> str | None:
    return next((f for f, members in FAMILIES.items() if system in members), None)


@dataclass
class Calibration:
    """The fitted factors (global and per family) with their errors, in-sample and leave-one-out."""

    default: Efficiency
    families: dict[str, Efficiency]
    rms: dict[str, float]
    table: pd.DataFrame
    band: dict[str, tuple[float, float]]  # family or "default" -> (low, high) multipliers on throughput


def calibrate(cases: Cases, start: Efficiency, loo: bool = True, progress=None) -> Calibration:
    """Fit every family (and the global default on all points), then leave each point out in turn."""
    pts = cases.points
    default, rms_all = fit(pts, start)
    families, rms = {}, {"default": rms_all}
    for fam in FAMILIES:
        sub = [p for p in pts if family_of(p.system) == fam]
        if len(sub) >= 2 * len(FITTED):
            families[fam], rms[fam] = fit(sub, default)
    by_point = [families.get(family_of(p.system), default) for p in pts]
    pred = np.array([predict([p], e)[0] for p, e in zip(pts, by_point, strict=True)])
    ideal = predict(pts, IDEAL)
    loo_pred = None
    if loo:
        loo_pred = np.empty(len(pts))
        for i, p in enumerate(pts):
            if progress:
                progress(i, len(pts))
            fam = family_of(p.system)
            pool = [q for j, q in enumerate(pts) if j != i and (fam not in families or family_of(q.system) == fam)]
            e, _ = fit(pool, families.get(fam, default), max_nfev=60)
            loo_pred[i] = predict([p], e)[0]
    df = table(pts, pred, ideal, loo_pred)
    df["family"] = [family_of(p.system) if family_of(p.system) in families else "default" for p in pts]
    if cases.training:
        default, families, train_df = _calibrate_training(cases.training, default, families, loo)
        rms["training"] = float(np.sqrt(np.mean(np.log(1 + train_df["error"]) ** 2)))
        df = pd.concat([df, train_df], ignore_index=True)
    band = {}
    col = "loo_error" if loo else "error"
    for fam in ["default", *families]:
        g = df[(df["category"] == "serving_throughput") & ((df["family"] == fam) | (fam == "default"))]
        ratio = 1.0 / (1.0 + g[col])  # measured / predicted
        band[fam] = (float(ratio.quantile(0.1)), float(ratio.quantile(0.9)))
    return Calibration(default, families, rms, df, band)


# ---- storing the fit ------------------------------------------------------------------------------
UNITS = {"layer_overhead": ("us", 1e6), "latency_scaleup": ("us", 1e6), "latency_scaleout": ("us", 1e6)}


def _quantity(name: str, value: float, source: str, date: str, note: str) -> str:
    unit, factor = UNITS.get(name, ("fraction", 1.0))
    value = 0.0 if abs(value) < 1e-9 else value
    return f'{{value: {value * factor:.4g}, unit: {unit}, source: {source}, date: "{date}", note: "{note}"}}'


TRAIN_NOTE = "fitted on the training cases (Megatron-LM 2021 Table 1, Llama 3 Table 4), one value for all"
ESTIMATES = {
    "layer_overhead": "kernel boundaries and synchronization of one layer in decode with CUDA graphs; not fitted",
    "latency_scaleup": "small-message collective inside an NVLink-class domain; not fitted",
    "latency_scaleout": "a collective over RDMA scale-out, ~2.5x the scale-up latency; not fitted",
}


def write_calibration(cal: Calibration, cases_file: str, folder: Path, date: str) -> None:
    """Write efficiency.yaml (the factors the predictions use) and calibration/fitted.yaml (the errors)."""
    n = len(cal.table)
    summary = summarize(cal.table)
    thr = summary[summary["category"] == "serving_throughput"].iloc[0]
    lines = [
        "# Efficiency factors: achieved fractions of each peak, and the fixed latencies a roofline leaves out.",
        "# `--ideal` sets every fraction to 1 and every latency to 0 (full overlap): the pure roofline.",
        "# Written by `dse validate --fit`: least squares on log(predicted / measured) over the published cases",
        "# (hw_catalog/calibration/cases.yaml); per-point and leave-one-out errors are in calibration/fitted.yaml.",
        "# `factors` apply to every system; `families` replace them for the systems they list.",
        "",
        "sources:",
        f'  dse_validate_fit: {{title: "Fit of dse validate --fit on {n} published measurements; leave-one-out '
        f'median absolute error {100 * thr["loo_median_abs_error"]:.1f}% on serving throughput", '
        f'url: "hw_catalog/calibration/fitted.yaml", date: "{date}"}}',
        f'  estimate: {{title: "Not identifiable from the cases; engineering estimate", url: "", date: "{date}"}}',
        "",
        "factors:",
    ]

    def block(eff: Efficiency, indent: str, note: str) -> list[str]:
        out = []
        for name in (*FITTED, "compute_train", "layer_overhead", "latency_scaleup", "latency_scaleout"):
            fitted = name in FITTED or name == "compute_train"
            lo, hi = BOUNDS.get(name, (0.05, 1.0))
            value = getattr(eff, name)
            at_bound = fitted and (abs(value - lo) < 1e-6 * max(hi, 1e-9) or abs(value - hi) < 1e-6 * max(hi, 1e-9))
            why = (TRAIN_NOTE if name == "compute_train" else note) + (" (at the bound of its range)" if at_bound
                                                                        else "") if fitted else ESTIMATES[name]
            out.append(f"{indent}{name}: " + _quantity(name, value, "dse_validate_fit" if fitted else "estimate",
                                                       date, why))
        return out

    lines += block(cal.default, "  ", f"fitted on all {n} points")
    lines += ["", "families:"]
    for fam, eff in cal.families.items():
        members = ", ".join(FAMILIES[fam])
        count = int((cal.table["family"] == fam).sum())
        lines += [f"  {fam}:", f"    systems: [{members}]", "    factors:"]
        lines += block(eff, "      ", f"fitted on the {count} {fam} points")
    (folder / "efficiency.yaml").write_text("\n".join(lines) + "\n")

    calib = folder / "calibration"
    calib.mkdir(exist_ok=True)
    doc = {
        "fitted": date,
        "cases": cases_file,
        "points": n,
        "rms_log_error": {k: round(v, 4) for k, v in cal.rms.items()},
        "summary": summary.round(4).to_dict(orient="records"),
        "band": {k: [round(lo, 4), round(hi, 4)] for k, (lo, hi) in cal.band.items()},
        "band_meaning": "10th and 90th percentile of measured / predicted (leave-one-out) on serving throughput: "
                        "a calibrated throughput T is read as [T x low, T x high]",
        "table": cal.table.round(6).to_dict(orient="records"),
    }
    import yaml

    (calib / "fitted.yaml").write_text(yaml.safe_dump(doc, sort_keys=False, width=120))


def load_fitted(path: Path | None = None) -> dict | None:
    """The stored fit (errors, bands), or None when there is none."""
    path = Path(path) if path else hw_dir() / "calibration" / "fitted.yaml"
    return read_yaml(path) if path.exists() else None


def error_band(system_id: str) -> tuple[float, float] | None:
    """Multipliers (low, high) on a calibrated throughput, from the leave-one-out residuals."""
    fitted = _fitted_cached()
    if not fitted:
        return None
    fam = family_of(system_id)
    lo, hi = fitted["band"].get(fam, fitted["band"]["default"]) if fam else fitted["band"]["default"]
    return float(lo), float(hi)


_CACHE: dict = {}


def _fitted_cached() -> dict | None:
    key = str(hw_dir())
    if key not in _CACHE:
        _CACHE[key] = load_fitted()
    return _CACHE[key]


# ---- the validation report -----------------------------------------------------------------------
@dataclass
class Validation:
    table: pd.DataFrame
    summary: pd.DataFrame
    skipped: list[Skipped]

    def as_dict(self) -> dict:
        clean = self.table.astype(object).where(self.table.notna(), None)
        return {
            "points": clean.to_dict(orient="records"),
            "summary": self.summary.to_dict(orient="records"),
            "skipped": [{"case": s.case, "category": s.category, "reason": s.reason} for s in self.skipped],
        }


def run_validation(cases: Cases, use_stored_loo: bool = True) -> Validation:
    """Predict every point with the catalog's calibrated factors; attach the stored leave-one-out errors."""
    pts = cases.points
    df = table(pts, predict(pts, None), predict(pts, IDEAL))
    df["family"] = [family_of(p.system) or "default" for p in pts]
    if cases.training:
        tr = cases.training
        tdf = pd.DataFrame({"case": [p.case for p in tr], "category": "training_mfu", "label": [p.label for p in tr],
                            "unit": [p.unit for p in tr], "measured": [p.measured for p in tr],
                            "predicted": predict_training(tr, None), "ideal": predict_training(tr, IDEAL)})
        tdf["error"] = tdf["predicted"] / tdf["measured"] - 1.0
        tdf["family"] = "training"
        df = pd.concat([df, tdf], ignore_index=True)
    fitted = load_fitted() if use_stored_loo else None
    if fitted:
        loo = {row["label"]: row.get("loo_predicted") for row in fitted["table"]}
        df["loo_predicted"] = [loo.get(label, np.nan) for label in df["label"]]
        df["loo_error"] = df["loo_predicted"] / df["measured"] - 1.0
    return Validation(df, summarize(df), cases.skipped)


def write_validation_report(report: Validation, folder: Path) -> None:
    """validate.csv, summary.json, the predicted-vs-measured scatter and report.html (self-contained)."""
    import base64
    import html
    import json

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    report.table.to_csv(folder / "validate.csv", index=False)
    (folder / "summary.json").write_text(json.dumps(report.as_dict(), indent=2, default=float))
    fig, ax = plt.subplots(figsize=(7, 6))
    thr = report.table[report.table["category"] == "serving_throughput"]
    for fam, g in thr.groupby("family"):
        ax.scatter(g["measured"], g["predicted"], s=18, label=f"{fam}: calibrated")
        ax.scatter(g["measured"], g["ideal"], s=14, facecolors="none", edgecolors="grey", linewidths=0.6)
    lo, hi = thr[["measured", "predicted"]].min().min() / 1.5, thr[["measured", "ideal"]].max().max() * 1.5
    ax.plot([lo, hi], [lo, hi], "k-", lw=0.8)
    ax.plot([lo, hi], [lo * 1.15, hi * 1.15], "k:", lw=0.6)
    ax.plot([lo, hi], [lo / 1.15, hi / 1.15], "k:", lw=0.6)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("measured (tokens/s)")
    ax.set_ylabel("predicted (tokens/s); hollow: ideal roofline")
    ax.set_title("Serving throughput: predicted against measured (dotted: +-15%)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(folder / "scatter.png", dpi=110)
    plt.close(fig)
    img = base64.b64encode((folder / "scatter.png").read_bytes()).decode()
    parts = [
        "<!doctype html><html><head><meta charset='utf-8'><title>dse validate</title>",
        "<style>body{font-family:sans-serif;max-width:1100px;margin:2em auto}table{border-collapse:collapse;"
        "font-size:12px}td,th{border:1px solid #ccc;padding:2px 6px}img{max-width:100%}</style></head><body>",
        "<h1>Predictions against published measurements</h1>",
        "<p>Calibrated predictions use the factors of hw_catalog/efficiency.yaml; leave-one-out errors come from "
        "refitting without each point (hw_catalog/calibration/fitted.yaml).</p>",
        "<h2>Error by category</h2>", report.summary.to_html(index=False, float_format=lambda v: f"{v:.3f}"),
        f"<h2>Predicted against measured</h2><img src='data:image/png;base64,{img}'>",
        "<h2>Every point</h2>", report.table.to_html(index=False, float_format=lambda v: f"{v:.4g}"),
        "<h2>Skipped</h2><ul>",
        *[f"<li>{html.escape(s.case)} ({s.category}): {html.escape(s.reason)}</li>" for s in report.skipped],
        "</ul></body></html>",
    ]
    (folder / "report.html").write_text("\n".join(parts))
