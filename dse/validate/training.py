"""The training runs (hw_catalog/calibration/training_runs.yaml) as points, their predictions by the training step
(`dse.physics.training`), the training factors fitted per hardware family on them (kept apart from the serving
factors: hw_catalog/training_efficiency.yaml), and the leave-one-out errors by family, by dense / MoE and by stack.

A family fits the factors its runs identify (a 10% change moves at least two runs' predictions by 0.5% or more,
the fitted columns not collinear), at most one per `RUNS_PER_FACTOR` runs; the others keep the global fit's. Each
run is predicted left out: its family's procedure again on the family's other runs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import pandas as pd

from dse.catalog.hardware import default_systems, hw_dir
from dse.catalog.loading import read_yaml
from dse.catalog.models import Architecture, ModelSpec, default_models
from dse.catalog.training import (
    TRAIN_IDEAL,
    TrainEfficiency,
    TrainEfficiencyCatalog,
    default_training_efficiency,
)
from dse.errors import InputError
from dse.physics.training import TrainLayout, model_items, train_step

MEGATRON_UNIT = "TFLOP/s per GPU (Megatron counting)"
UNITS = ("tokens/s per chip", MEGATRON_UNIT)
LAYOUT_KEYS = ("tp", "pp", "dp", "cp", "ep", "etp", "micro_batch", "interleave", "recompute", "zero", "zero_group",
               "head_dtype", "gemm_dtype", "scaling", "attention_dtype", "tp_overlap", "ep_overlap", "grad_overlap",
               "stages")
RUN_KEYS = ("id", "source", "commit", "result", "config", "model", "system", "stack", "chips", "global_batch", "seq",
            "layout", "measured", "unit", "runs", "derived", "block_tokens", "eval_tokens_per_block")


def runs_path() -> Path:
    return hw_dir() / "calibration" / "training_runs.yaml"


@dataclass(frozen=True)
class TrainRun:
    """One published training run: the layout as launched, and what it measured."""

    id: str
    model: Architecture
    system: str
    stack: str
    layout: TrainLayout
    global_batch: int
    seq: int
    measured: float
    unit: str
    source: str
    derived: str
    block_tokens: float = 0.0  # tokens trained per timed block
    eval_tokens_per_block: float = 0.0  # MaxText's block timing includes an evaluation of this many tokens

    @property
    def moe(self) -> bool:
        return self.model.is_moe


def gpt_model(params_b: float, n_heads: int, d_model: int, n_layers: int, vocab: int) -> Architecture:
    """A GPT-3-style dense model (MHA with biases, 4h non-gated MLP) of the Megatron-LM tables."""
    return Architecture(ModelSpec.model_validate({
        "id": f"gpt-{params_b:g}b", "name": f"GPT {params_b:g}B", "d_model": d_model, "n_layers": n_layers,
        "vocab": vocab, "source": {"title": "Narayanan et al. 2021, Table 1", "date": "2021-04"},
        "published_b": {"total": params_b, "active": params_b, "precision_total": 0.1, "precision_active": 0.1,
                        "source": "Megatron-LM 2021 Table 1", "active_includes_embedding": True},
        "attention": {"kind": "mha", "n_heads": n_heads, "n_kv_heads": n_heads, "head_dim": d_model // n_heads,
                      "bias": True},
        "ffn": {"kind": "dense", "d_ff": 4 * d_model, "gated": False, "bias": True},
    }))


def stage_counts(model: Architecture, seq: int, pp: int, interleave: int, rule: object, where: str) -> tuple | None:
    """Items per pipeline chunk for a stated rule: ``even`` (the layers evenly over the chunks, the embedding with
    the first, the MTP modules and the head with the last: Megatron's default), ``embedding_and_loss_as_layers``
    (the embedding and the loss each counted as a layer in the even split: Megatron-Core's
    account_for_embedding/loss_in_pipeline_split) or a list of item counts.
    """
    chunks = pp * interleave
    if pp == 1:
        return None
    it = model_items(model, seq)
    layers = it.n_layers
    if isinstance(rule, list):
        counts = tuple(int(x) for x in rule)
    elif rule == "even":
        if layers % chunks:
            raise InputError(f"{where}: stages 'even': {layers} layers do not split evenly into {chunks} chunks")
        q = layers // chunks
        counts = (1 + q,) + (q,) * (chunks - 2) + (q + it.n_mtp + 1,)
    elif rule == "embedding_and_loss_as_layers":
        if (layers + 2) % chunks:
            raise InputError(f"{where}: stages '{rule}': {layers} layers + 2 do not split evenly into {chunks} chunks")
        q = (layers + 2) // chunks
        counts = (q,) * (chunks - 1) + (q + it.n_mtp,)
    else:
        raise InputError(f"{where}: field 'stages': expected even, embedding_and_loss_as_layers or a list of item "
                         f"counts, got {rule!r}")
    if len(counts) != chunks or sum(counts) != len(it) or min(counts) < 1:
        raise InputError(f"{where}: field 'stages': {list(counts)} must be {chunks} positive counts summing to "
                         f"{len(it)} items (embedding, {layers} layers, {it.n_mtp} MTP modules, head)")
    return counts


def load_training_runs(path: Path | None = None) -> list[TrainRun]:
    """The training runs of ``path`` (default the catalog's); a malformed run is an InputError naming it."""
    path = Path(path) if path else runs_path()
    doc = read_yaml(path)
    if not isinstance(doc, dict) or not isinstance(doc.get("runs"), list):
        raise InputError(f"{path}: expected a top-level 'runs:' list")
    sources = doc.get("sources") or {}
    models, systems = default_models(), default_systems()
    out = []
    for i, raw in enumerate(doc["runs"]):
        where = f"{path}: runs[{i}] (id '{raw.get('id', '?') if isinstance(raw, dict) else '?'}')"
        try:
            out.append(_run(raw, sources, models, systems, where))
        except (KeyError, TypeError, ValueError) as exc:
            detail = f"missing field {exc}" if isinstance(exc, KeyError) else str(exc)
            raise InputError(f"{where}: malformed: {detail}") from None
    return out


def _run(raw: dict, sources: dict, models: dict, systems: dict, where: str) -> TrainRun:
    unknown = [k for k in raw if k not in RUN_KEYS]
    if unknown:
        raise InputError(f"{where}: unknown field '{unknown[0]}' (allowed: {', '.join(RUN_KEYS)})")
    if raw["source"] not in sources:
        raise InputError(f"{where}: field 'source': '{raw['source']}' is not declared under 'sources:'")
    if isinstance(raw["model"], dict):
        model = gpt_model(**raw["model"]["gpt"])
    elif raw["model"] in models:
        model = models[raw["model"]]
    else:
        raise InputError(f"{where}: field 'model': '{raw['model']}' is not in the model catalog")
    if raw["system"] not in systems:
        raise InputError(f"{where}: field 'system': '{raw['system']}' is not in the hardware catalog")
    lay = dict(raw["layout"])
    bad = [k for k in lay if k not in LAYOUT_KEYS]
    if bad:
        raise InputError(f"{where}: layout field '{bad[0]}' (allowed: {', '.join(LAYOUT_KEYS)})")
    rule = lay.pop("stages", None)
    layout = TrainLayout(**lay)
    if layout.chips != raw["chips"]:
        raise InputError(f"{where}: tp x cp x dp x pp = {layout.chips}, but chips = {raw['chips']}")
    if rule is not None:
        layout = replace(layout, stages=stage_counts(model, raw["seq"], layout.pp, layout.interleave, rule, where))
    unit = raw.get("unit", UNITS[0])
    if unit not in UNITS:
        raise InputError(f"{where}: field 'unit': '{unit}' is not one of {', '.join(UNITS)}")
    return TrainRun(str(raw["id"]), model, raw["system"], str(raw.get("stack", "")), layout, int(raw["global_batch"]),
                    int(raw["seq"]), float(raw["measured"]), unit, str(raw["source"]), str(raw.get("derived", "")),
                    float(raw.get("block_tokens", 0.0)), float(raw.get("eval_tokens_per_block", 0.0)))


def megatron_flops(run: TrainRun) -> float:
    """FLOPs per iteration as Megatron-LM counts them: 96 B s l h^2 (1 + s / 6h + V / 16lh)."""
    s, h, layers, v = run.seq, run.model.spec.d_model, run.model.spec.n_layers, run.model.spec.vocab
    return 96.0 * run.global_batch * s * layers * h * h * (1 + s / (6 * h) + v / (16 * layers * h))


def predict_run(run: TrainRun, eff: TrainEfficiency) -> float:
    """The run's measured figure as the physics predicts it at ``eff``: tokens/s per chip (with MaxText's
    evaluation inside the timed block: its forward passes at a third of the step's compute per token, no
    recomputation), or TFLOP/s per GPU in Megatron's counting.
    """
    system = default_systems()[run.system]
    r = train_step(run.model, system, run.layout, run.global_batch, run.seq, eff=eff)
    tokens = run.global_batch * run.seq
    if run.unit == MEGATRON_UNIT:
        return megatron_flops(run) / (r["step_s"] * run.layout.chips) / 1e12
    if run.eval_tokens_per_block:
        fwd = train_step(run.model, system, replace(run.layout, recompute="none"), run.global_batch, run.seq,
                         eff=eff)["compute_s"] / 3.0
        per_token = (r["step_s"] + run.eval_tokens_per_block / run.block_tokens * fwd) / tokens
        return 1.0 / per_token / run.layout.chips
    return r["tokens_per_s_per_chip"]


def predict_runs(runs: list[TrainRun], eff: TrainEfficiency | TrainEfficiencyCatalog | None = None) -> np.ndarray:
    """Every run predicted with ``eff`` (one set for all), a catalog (each run's family and stack) or, by default,
    the embedded training factors.
    """
    cat = eff if isinstance(eff, TrainEfficiencyCatalog) else (default_training_efficiency() if eff is None else None)
    return np.array([predict_run(r, cat.for_system(r.system, r.stack) if cat else eff) for r in runs])


# ---- the fit -------------------------------------------------------------------------------------------------------
FAMILY_FACTORS = ("gemm", "gemm_fp4", "attention")
STACK_FACTORS = ("gemm", "link")
BOUNDS = {"gemm": (0.05, 1.0), "gemm_fp4": (0.05, 1.0), "attention": (0.05, 0.75), "link": (0.02, 1.0)}
"""Ranges of the fitted factors. The attention core reaches at most 75% of the tensor peak: FlashAttention-3's
best BF16 forward on H100 (740 of 989 TFLOP/s, Shah et al. 2024), its backward less."""
LINK_STARTS = (0.8, 0.4, 0.2, 0.1)
"""Where the link share's fit starts: at a share where the runs' collectives hide under compute the loss is flat,
so the fit starts from each and keeps the best."""
RUNS_PER_FACTOR = 3
START = TrainEfficiency(gemm=0.6, attention=0.5, memory=0.8, link=0.8, latency=20e-6, hbm_usable=0.92)
"""Where the fit starts, and the factors it does not move (estimates): the memory-bound kernels' share of HBM
bandwidth (0.8, a streaming kernel's), a collective's share of link bandwidth (0.8, NCCL's bus bandwidth over
line rate on NVLink and InfiniBand; fitted only for a stack the data set apart), its fixed latency (20 us) and the
share of HBM a step may fill (0.92)."""


def _gemm_fp4(eff: TrainEfficiency) -> TrainEfficiency:
    return eff if not math.isnan(eff.gemm_fp4) else replace(eff, gemm_fp4=eff.gemm)


def _log_errors(runs: list[TrainRun], eff: TrainEfficiency) -> np.ndarray:
    pred = np.array([predict_run(r, eff) for r in runs])
    return np.log(pred / np.array([r.measured for r in runs]))


def identified(runs: list[TrainRun], at: TrainEfficiency, candidates: tuple[str, ...]) -> tuple[str, ...]:
    """The factors among ``candidates`` these runs identify (`dse.validate.fit.identifiable`: a 10% change moves at
    least two predictions by 0.5%, most informative first, the chosen columns well conditioned), at most one per
    RUNS_PER_FACTOR runs.
    """
    from dse.validate.fit import identifiable

    at = _gemm_fp4(at)
    base = _log_errors(runs, at)
    jac = np.column_stack([(_log_errors(runs, replace(at, **{name: getattr(at, name) * 0.9})) - base) / math.log(0.9)
                           for name in candidates])
    return tuple(candidates[k] for k in identifiable(jac, RUNS_PER_FACTOR))


def fit_factors(runs: list[TrainRun], start: TrainEfficiency, names: tuple[str, ...] | None = None,
                candidates: tuple[str, ...] = FAMILY_FACTORS) -> tuple[TrainEfficiency, tuple[str, ...]]:
    """Least squares on log(predicted / measured) over ``runs``, moving the factors they identify among
    ``candidates`` (or ``names``).
    """
    from dse.validate.fit import bounded_least_squares

    start = _gemm_fp4(start)
    names = identified(runs, start, candidates) if names is None else names
    if not names:
        return start, names
    lo = np.array([BOUNDS[k][0] for k in names])
    hi = np.array([BOUNDS[k][1] for k in names])

    def at(x: np.ndarray) -> TrainEfficiency:
        return replace(start, **dict(zip(names, map(float, x), strict=True)))

    best = None
    for link in LINK_STARTS if "link" in names else (start.link,):
        x0 = np.clip([link if k == "link" else getattr(start, k) for k in names], lo + 1e-6, hi - 1e-6)
        x, cost = bounded_least_squares(lambda x: _log_errors(runs, at(x)), x0, lo, hi)
        if best is None or cost < best[1]:
            best = (x, cost)
    return at(best[0]), names


@dataclass
class TrainingFit:
    """The fitted training factors (global, per family, per family and stack), the runs' table and the fitted
    names per group.
    """

    default: TrainEfficiency
    families: dict[str, TrainEfficiency]
    stacks: dict[tuple[str, str], TrainEfficiency]
    fitted: dict[str, tuple[str, ...]]
    table: pd.DataFrame


def groups(runs: list[TrainRun], catalog: TrainEfficiencyCatalog) -> dict[tuple[str, str], list[int]]:
    """Runs by (family, stack): a family's most common stack is its own group (stack ""); another stack with at
    least RUNS_PER_FACTOR runs of the family is a group of its own (the data set it apart); fewer join the family.
    """
    fam = [catalog.family_of(r.system) or "" for r in runs]
    out: dict[tuple[str, str], list[int]] = {}
    for f in dict.fromkeys(fam):
        idx = [i for i, x in enumerate(fam) if x == f]
        stacks = pd.Series([runs[i].stack for i in idx]).value_counts()
        major = stacks.index[0]
        for st, n in stacks.items():
            key = (f, st) if f and st != major and n >= RUNS_PER_FACTOR else (f, "")
            out.setdefault(key, []).extend(i for i in idx if runs[i].stack == st)
    return out


def _procedure(pool: list[TrainRun], key: tuple[str, str], default: TrainEfficiency,
               families: dict[str, TrainEfficiency], names: tuple[str, ...] | None = None) -> TrainEfficiency:
    """A group's fit: a family from the global factors, a stack of a family from the family's."""
    fam, stack = key
    if not fam:
        return fit_factors(pool, START, names)[0] if pool else default
    if not stack:
        return fit_factors(pool, default, names)[0]
    return fit_factors(pool, families[fam], STACK_FACTORS)[0]


def calibrate_training(runs: list[TrainRun], catalog: TrainEfficiencyCatalog | None = None, loo: bool = True,
                       progress=None) -> TrainingFit:
    """Fit the global factors on every run, then each family's on its runs (from the global ones) and each stack
    the data set apart on its own (from its family's); with ``loo`` predict each run from its group's procedure
    refitted without it (the factors it identifies kept).
    """
    catalog = catalog or default_training_efficiency()
    default, names = fit_factors(runs, START)
    fitted = {"default": names}
    grouped = groups(runs, catalog)
    families: dict[str, TrainEfficiency] = {}
    stacks: dict[tuple[str, str], TrainEfficiency] = {}
    for key in sorted(grouped, key=lambda k: k[1] != ""):  # families before their stacks
        fam, stack = key
        pool = [runs[i] for i in grouped[key]]
        if not fam:
            continue
        if stack:  # a stack set apart moves its GEMM share and its collectives' share of link bandwidth
            stacks[key], fitted[f"{fam}:{stack}"] = fit_factors(pool, families[fam], STACK_FACTORS)
        else:
            families[fam], fitted[fam] = fit_factors(pool, default)
    where = {i: key for key, idx in grouped.items() for i in idx}

    def eff_of(key: tuple[str, str]) -> TrainEfficiency:
        return stacks.get(key) or families.get(key[0], default)

    pred = np.array([predict_run(r, eff_of(where[i])) for i, r in enumerate(runs)])
    ideal = np.array([predict_run(r, TRAIN_IDEAL) for r in runs])
    loo_pred = np.full(len(runs), np.nan)
    if loo:
        for i, r in enumerate(runs):
            if progress:
                progress(i, len(runs))
            key = where[i]
            pool = [runs[j] for j in grouped[key] if j != i]
            label = f"{key[0]}:{key[1]}" if key[1] else key[0]
            loo_pred[i] = predict_run(r, _procedure(pool, key, default, families, fitted.get(label)))
    table = pd.DataFrame({
        "id": [r.id for r in runs], "system": [r.system for r in runs],
        "family": [catalog.family_of(r.system) or "default" for r in runs],
        "model": [r.model.id for r in runs], "kind": ["moe" if r.moe else "dense" for r in runs],
        "stack": [r.stack for r in runs], "chips": [r.layout.chips for r in runs],
        "layout": [r.layout.describe() for r in runs], "unit": [r.unit for r in runs],
        "measured": [r.measured for r in runs], "predicted": pred, "ideal": ideal, "loo_predicted": loo_pred,
        "source": [r.source for r in runs]})
    table["error"] = table["predicted"] / table["measured"] - 1.0
    table["loo_error"] = table["loo_predicted"] / table["measured"] - 1.0
    return TrainingFit(default, families, stacks, fitted, table)


def summarize_training(table: pd.DataFrame) -> dict:
    """Median (and 90th-percentile) absolute errors, in sample and left one out: overall, by family, by dense / MoE
    and by stack.
    """
    def stats(g: pd.DataFrame) -> dict:
        out = {"runs": len(g), "median_abs_error": round(float(g["error"].abs().median()), 4)}
        if g["loo_error"].notna().any():
            out["loo_median_abs_error"] = round(float(g["loo_error"].abs().median()), 4)
            out["loo_p90_abs_error"] = round(float(g["loo_error"].abs().quantile(0.9)), 4)
        return out

    return {"all": stats(table), **{f"{col}:{k}": stats(g) for col in ("family", "kind", "stack")
                                    for k, g in table.groupby(col)}}


# ---- the stored fit and the validation table -------------------------------------------------------------------------
def fitted_path() -> Path:
    return hw_dir() / "calibration" / "training_fitted.yaml"


def validation_rows(runs: list[TrainRun], use_stored_loo: bool = True) -> pd.DataFrame:
    """The runs as rows of `dse validate`'s table (category ``training_throughput``): predicted with the
    catalog's training factors, the ideal step, and the stored leave-one-out predictions.
    """
    cat = default_training_efficiency()
    df = pd.DataFrame({
        "case": [r.id for r in runs], "category": "training_throughput",
        "label": [f"{r.model.id} on {r.layout.chips} x {r.system}, {r.layout.describe()}" for r in runs],
        "unit": [r.unit for r in runs], "measured": [r.measured for r in runs],
        "predicted": predict_runs(runs, cat), "ideal": predict_runs(runs, TRAIN_IDEAL)})
    df["error"] = df["predicted"] / df["measured"] - 1.0
    stored = _stored_loo() if use_stored_loo else {}
    if stored:
        df["loo_predicted"] = [stored.get(r.id, np.nan) for r in runs]
        df["loo_error"] = df["loo_predicted"] / df["measured"] - 1.0
    df["family"] = [cat.family_of(r.system) or "default" for r in runs]
    df["kind"] = ["moe" if r.moe else "dense" for r in runs]
    df["stack"] = [r.stack for r in runs]
    return df


def _stored_loo() -> dict[str, float]:
    path = fitted_path()
    if not path.exists():
        return {}
    doc = read_yaml(path)
    rows = doc.get("table") if isinstance(doc, dict) else None
    if not isinstance(rows, list):
        raise InputError(f"{path}: field 'table': expected the list of fitted runs")
    return {row["id"]: row.get("loo_predicted") for row in rows if isinstance(row, dict) and "id" in row}


FACTOR_NOTES = {
    "gemm": "achieved share of the peak tensor FLOP/s of the GEMMs' format in training GEMMs",
    "gemm_fp4": "achieved share of the peak FP4 tensor FLOP/s in FP4 (NVFP4, MXFP4) training GEMMs",
    "attention": "achieved share of the peak tensor FLOP/s in the attention core (FlashAttention forward and "
                 "backward)",
    "memory": "share of the peak HBM bandwidth the memory-bound kernels reach; a streaming kernel's, not fitted",
    "link": "collectives' share of link bandwidth (NCCL's bus bandwidth over line rate on NVLink and InfiniBand)",
    "latency": "fixed latency of one collective or point-to-point transfer; not fitted",
    "hbm_usable": "share of HBM a training step may fill (allocator, workspaces, communication buffers); not fitted",
}
UNITS_OF = {"latency": ("us", 1e6)}


def _factor_lines(eff: TrainEfficiency, fitted: tuple[str, ...], indent: str, note: str, date: str,
                  inherited: tuple[str, ...] = (), parent: str = "") -> list[str]:
    """One line per factor: fitted here, fitted above and inherited (``inherited``, from ``parent``), or estimated."""
    out = []
    for name in ("gemm", "gemm_fp4", "attention", "memory", "link", "latency", "hbm_usable"):
        value = getattr(eff, name)
        if name == "gemm_fp4" and (math.isnan(value) or name not in fitted + inherited):
            continue
        unit, per = UNITS_OF.get(name, ("fraction", 1.0))
        if name in fitted:
            src, why = "dse_validate_fit", f"{note}: {FACTOR_NOTES[name]}"
            if name in BOUNDS and value >= BOUNDS[name][1] * (1 - 1e-6):
                why += f"; at its upper bound {BOUNDS[name][1]:g} (the runs would take it higher)"
        elif name in inherited:
            src, why = "dse_validate_fit", f"not identified by these runs, so the {parent}: {FACTOR_NOTES[name]}"
        else:
            src, why = "estimate", FACTOR_NOTES[name]
        out.append(f'{indent}{name}: {{value: {value * per:.4g}, unit: {unit}, source: {src}, date: "{date}", '
                   f'note: "{why}"}}')
    return out


def write_training_calibration(fit: TrainingFit, folder: Path, date: str) -> None:
    """training_efficiency.yaml (the families and their basis as they were, the fitted factors) and
    calibration/training_fitted.yaml (every run's predictions and errors, the summary).
    """
    import json

    import yaml

    catalog = default_training_efficiency()
    summary = summarize_training(fit.table)
    head = summary["all"]
    lines = [
        "# Training efficiency factors: achieved shares of each peak in a training step (dse/physics/training.py),",
        "# kept apart from the serving factors of efficiency.yaml. Written by `dse validate --fit` (and",
        "# `--fit-training`): least squares on log(predicted / measured) over the published training runs of",
        "# calibration/training_runs.yaml, per hardware family (the `systems` lists are the training families, each",
        "# with its basis) and, within a family, per software stack where at least three runs of another stack set it",
        "# apart; errors and leave-one-out predictions in calibration/training_fitted.yaml.",
        "",
        "sources:",
        f'  dse_validate_fit: {{title: "Fit of dse validate --fit on {len(fit.table)} published training runs; '
        f'leave-one-out median absolute error {100 * head["loo_median_abs_error"]:.1f}% on tokens/s per chip", '
        f'url: "hw_catalog/calibration/training_fitted.yaml", date: "{date}"}}',
        f'  estimate: {{title: "Engineering estimate, not identified by the runs", url: "", date: "{date}"}}',
        "",
        "factors:",
        *_factor_lines(fit.default, fit.fitted.get("default", ()), "  ", f"fitted on all {len(fit.table)} runs",
                       date),
        "",
        "families:",
    ]
    for fam, systems in _members(catalog).items():
        n = int((fit.table["family"] == fam).sum())
        lines += [f"  {fam}:", f"    systems: [{', '.join(systems)}]", f"    basis: {json.dumps(catalog.basis[fam])}"]
        if fam not in fit.families:
            lines += ["    factors: {}  # no run of this family: the global factors apply"]
            continue
        top = fit.fitted.get("default", ())
        lines += ["    factors:", *_factor_lines(fit.families[fam], fit.fitted[fam], "      ",
                                                  f"fitted on the {n} {fam} runs", date, top,
                                                  "value fitted on all runs")]
        stacks = {st: e for (f, st), e in fit.stacks.items() if f == fam}
        if stacks:
            lines += ["    stacks:"]
            for st, eff in stacks.items():
                m = int(((fit.table["family"] == fam) & (fit.table["stack"] == st)).sum())
                lines += [f"      {st}:", *_factor_lines(eff, fit.fitted[f"{fam}:{st}"], "        ",
                                                          f"fitted on the {m} {fam} runs of {st}", date,
                                                          fit.fitted[fam] + top, f"{fam} family's value")]
    (Path(folder) / "training_efficiency.yaml").write_text("\n".join(lines) + "\n")
    doc = {"fitted": date, "runs_file": "hw_catalog/calibration/training_runs.yaml", "runs": len(fit.table),
           "fitted_factors": {k: list(v) for k, v in fit.fitted.items()}, "summary": summary,
           "table": fit.table.round(6).to_dict(orient="records")}
    calib = Path(folder) / "calibration"
    calib.mkdir(exist_ok=True)
    (calib / "training_fitted.yaml").write_text(yaml.safe_dump(doc, sort_keys=False, width=120))


def _members(catalog: TrainEfficiencyCatalog) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {fam: [] for fam in catalog.basis}
    for system, fam in catalog.members.items():
        out[fam].append(system)
    return out
