"""Published AMD Instinct and Google TPU serving measurements (a CSV with explicit columns) turned into points.

The file (hw_catalog/calibration/published/amd_tpu_serving.csv, its columns explained in the README beside it) holds
one measured run per row. Each row becomes one `Point` of `dse.validate.points`, or a `Skipped` with its reason:

- ``mlperf_offline``: every sample queued at once, each replica keeps up to ``max_num_seqs`` (``batch_size``) in
  flight: the ``offline`` kind with that batch cap, at the dataset's mean input and output lengths.
- ``mlperf_server`` / ``mlperf_interactive``: Poisson arrivals at a rate, not a fixed concurrency. By Little's law
  the mean number of requests in the system is L = samples/s x mean request latency; the replica's throughput at
  that rate is then the throughput of the closed loop with L / replicas in flight (the ``offline`` kind with that
  batch cap). Poisson fluctuations of the batch around L are neglected: throughput is concave in the batch, so this
  over-predicts slightly (Jensen).
- ``closed_loop``: a fixed client concurrency C (or C prompts sent at once): ``offline`` with the batch capped at
  min(C / replicas, max_num_seqs).
- ``static_batch`` (vLLM ``benchmark_latency``): the ``static`` kind, the end-to-end latency of one batch prefilled
  together and decoded in lock-step.

Throughputs are predicted per replica (the AMD MLPerf harness runs 8 independent TP1 replicas), so the measured
figure is the published one divided by ``replicas``. A malformed file is an InputError naming file, row and field.
"""

from __future__ import annotations

import csv
import math
from pathlib import Path

from dse.catalog.hardware import hw_dir
from dse.catalog.models import default_models
from dse.catalog.units import DTYPES
from dse.errors import InputError
from dse.validate.points import Cases, Point, Skipped

# catalog id of each system name the file uses
SYSTEMS = {"mi300x": "mi300x", "mi325x": "mi325x", "mi355x": "mi355x", "tpu_v5e": "tpu-v5e", "tpu_v6e": "tpu-v6e",
           "tpu_v7": "tpu-v7"}
# vLLM's tensor-parallel-size on TPU7x counts TensorCores; one TPU7x chip has two (tpu-recipes Ironwood READMEs:
# tensor-parallel-size=2 on tpu7x-standard-1t is one chip, TP8 on -4t is four)
CORES_PER_CHIP = {"tpu-v7": 2}
SCENARIOS = ("mlperf_offline", "mlperf_server", "mlperf_interactive", "closed_loop", "static_batch",
             "offline_batch_unstated", "sharegpt")
FORMATS = (*DTYPES, "int8")  # formats the file may name; int8 has no format in the physics (rows using it are skipped)
THROUGHPUT_TOKENS = ("output", "output_or_total", "output_assumed", "")
# a throughput that may or may not count input tokens is used only where that changes it by at most this share
MAX_TOKEN_AMBIGUITY = 0.10
REQUIRED = ("id", "system", "precision", "concurrency", "batch_size", "tp_size", "moe_ep_size", "isl", "osl",
            "catalog_model", "scenario", "num_chips", "replicas", "kv_dtype", "throughput_tok_s", "throughput_tokens",
            "samples_per_s", "mean_request_latency_s", "e2e_latency_s", "mean_isl", "mean_osl", "length_source",
            "assumed", "source", "note")
POSITIVE = ("concurrency", "batch_size", "tp_size", "moe_ep_size", "num_chips", "replicas", "throughput_tok_s",
            "samples_per_s", "mean_request_latency_s", "e2e_latency_s", "mean_isl", "mean_osl", "isl", "osl")


def published_path() -> Path:
    return hw_dir() / "calibration" / "published" / "amd_tpu_serving.csv"


class _Row:
    """One row with its numeric fields checked; ``where`` names file, line and id for messages."""

    def __init__(self, raw: dict[str, str], where: str) -> None:
        self.raw, self.where = raw, where
        for name in POSITIVE:
            value = raw[name].strip()
            if value:
                try:
                    x = float(value)
                except ValueError:
                    raise InputError(f"{where}: field '{name}': expected a positive number, got {value!r}") from None
                if not (math.isfinite(x) and x > 0):
                    raise InputError(f"{where}: field '{name}': expected a positive number, got {value!r}")
        if raw["scenario"] not in SCENARIOS:
            raise InputError(f"{where}: field 'scenario': {raw['scenario']!r} is not one of {', '.join(SCENARIOS)}")
        if raw["system"] not in SYSTEMS:
            raise InputError(f"{where}: field 'system': {raw['system']!r} is not one of {', '.join(SYSTEMS)}")
        if raw["throughput_tokens"] not in THROUGHPUT_TOKENS:
            raise InputError(f"{where}: field 'throughput_tokens': {raw['throughput_tokens']!r} is not one of "
                             f"{', '.join(t for t in THROUGHPUT_TOKENS if t)} (or empty)")
        for name in ("precision", "kv_dtype"):
            if raw[name] and raw[name] not in FORMATS:
                raise InputError(f"{where}: field '{name}': {raw[name]!r} is not one of {', '.join(FORMATS)}")
        if raw["catalog_model"] and raw["catalog_model"] not in default_models():
            raise InputError(f"{where}: field 'catalog_model': {raw['catalog_model']!r} is not a model of the catalog")
        if not raw["num_chips"]:
            raise InputError(f"{where}: field 'num_chips': required")

    def num(self, name: str) -> float | None:
        value = self.raw[name].strip()
        return float(value) if value else None

    def need(self, name: str) -> float:
        value = self.num(name)
        if value is None:
            raise InputError(f"{self.where}: field '{name}': required for scenario '{self.raw['scenario']}'")
        return value

    def integer(self, value: float, name: str) -> int:
        if abs(value - round(value)) > 1e-9:
            raise InputError(f"{self.where}: field '{name}': expected a whole number, got {value:g}")
        return int(round(value))


def load_published(path: Path | None = None) -> Cases:
    """Every row of the published AMD/TPU serving file as a point, or skipped with its reason."""
    path = Path(path) if path else published_path()
    if not path.exists():
        raise InputError(f"{path}: no such file of published serving measurements")
    with path.open(newline="") as f:
        reader = csv.DictReader(f)
        missing = [c for c in REQUIRED if c not in (reader.fieldnames or [])]
        if missing:
            raise InputError(f"{path}: missing column(s) {', '.join(missing)}")
        out, seen = Cases(), set()
        for line, raw in enumerate(reader, start=2):
            where = f"{path}: row {line} (id '{raw['id']}')"
            if raw["id"] in seen:
                raise InputError(f"{where}: field 'id': duplicate id")
            seen.add(raw["id"])
            row = _Row(raw, where)
            reason = _skip_reason(row)
            if reason:
                out.skipped.append(Skipped(raw["id"], _category(raw), reason))
            else:
                out.points.append(_point(row, path))
    return out


def _category(raw: dict[str, str]) -> str:
    return "latency" if raw["scenario"] == "static_batch" else "serving_throughput"


def _skip_reason(row: _Row) -> str:
    """Why a row cannot be predicted (empty: it can)."""
    r = row.raw
    if not r["catalog_model"]:
        return f"model '{r['model_path']}' is not in the model catalog"
    if r["scenario"] == "sharegpt":
        return "ShareGPT run: the request lengths are not stated (only caps of 1,024 input / 1,024 output tokens)"
    if r["scenario"] == "offline_batch_unstated":
        return ("the number of prompts and the engine's batch cap are not stated, so the batch the throughput was "
                "measured at is unknown")
    if not r["replicas"]:
        return "layout not read: the submission's tensor-parallel size and replica count are not recorded"
    if not (r["mean_isl"] and r["mean_osl"]):
        return "no public source for the mean input length of this data set was found"
    if not r["kv_dtype"]:
        return "KV-cache format not stated"
    for name in ("precision", "kv_dtype"):
        if r[name] not in DTYPES:
            return f"{name} {r[name]}: a format the physics does not model"
    if r["throughput_tokens"] == "output_or_total":
        share = row.need("mean_isl") / (row.need("mean_isl") + row.need("mean_osl"))
        if share > MAX_TOKEN_AMBIGUITY:
            return (f"'Throughput (tokens/s)' may or may not count input tokens, which changes it by {share:.0%} at "
                    f"{r['isl']}/{r['osl']} (more than {MAX_TOKEN_AMBIGUITY:.0%})")
    return ""


def _point(row: _Row, path: Path) -> Point:
    r, where = row.raw, row.where
    system = SYSTEMS[r["system"]]
    cores = CORES_PER_CHIP.get(system, 1)
    replicas = row.integer(row.need("replicas"), "replicas")
    chips = row.need("num_chips") / replicas
    chips = row.integer(chips, "num_chips")
    tp = row.need("tp_size") / cores
    tp = row.integer(tp, "tp_size")
    ep = row.integer((row.num("moe_ep_size") or cores) / cores, "moe_ep_size")
    if chips % tp:
        raise InputError(f"{where}: field 'tp_size': {tp} chips of tensor parallelism do not divide the {chips} chips "
                         "of a replica")
    dp = chips // tp
    if chips % ep:
        raise InputError(f"{where}: field 'moe_ep_size': EP {ep} does not divide the {chips} chips of a replica")
    isl, osl = round(row.need("mean_isl")), round(row.need("mean_osl"))
    model, scenario = r["catalog_model"], r["scenario"]
    layout = f"TP{tp}" + (f" EP{ep}" if ep > 1 else "") + (f" DP{dp}" if dp > 1 else "")
    per = f" x {replicas} replicas" if replicas > 1 else ""
    source = r["source"] + (f"; assumed: {r['assumed']}" if r["assumed"] else "")
    common = dict(case=r["id"], model=model, system=system, tp=tp, dp=dp, ep=ep, pp=1, weights_dtype=r["precision"],
                  kv_dtype=r["kv_dtype"], isl=isl, osl=osl, source=source)
    if scenario == "static_batch":
        batch = row.integer(row.need("batch_size"), "batch_size")
        label = (f"{model} {system}{per} {layout} {r['precision']}/{r['kv_dtype']} static batch {batch}, "
                 f"{isl}/{osl}: end-to-end latency ({r['id']})")
        return Point(category="latency", label=label, kind="static", measured=row.need("e2e_latency_s"),
                     unit="s (end-to-end, whole batch)", batch=batch, **common)
    cap = row.integer(row.need("batch_size"), "batch_size")
    if scenario == "mlperf_offline":
        in_flight, how = cap, "max_num_seqs"
    elif scenario in ("mlperf_server", "mlperf_interactive"):
        little = row.need("samples_per_s") * row.need("mean_request_latency_s") / replicas
        in_flight, how = (little, "Little's-law mean in flight") if little <= cap else (cap, "max_num_seqs")
    else:
        clients = row.need("concurrency") / replicas
        in_flight, how = (clients, "client concurrency") if clients <= cap else (cap, "max_num_seqs")
    max_batch = max(round(in_flight), 1)
    tokens = r["throughput_tokens"]
    caveats = {"output": "", "output_or_total": " (published figure may include input tokens)",
               "output_assumed": " (unit assumed output)"}
    caveat = caveats[tokens]
    label = (f"{model} {system}{per} {layout} {r['precision']}/{r['kv_dtype']} {scenario}, mean {isl}/{osl}, "
             f"{max_batch} in flight ({how}){caveat} ({r['id']})")
    return Point(category="serving_throughput", label=label, kind="offline",
                 measured=row.need("throughput_tok_s") / replicas, unit="output tokens/s per replica",
                 max_batch=max_batch, **common)
