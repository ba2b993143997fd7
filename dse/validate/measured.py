"""Steps measured on a GPU by `scripts/measure_gpu.py` (hw_catalog/measured/) as points of `dse.validate.points`.

A measured file holds one row per timed piece of work: matrix products and copies (the chip's ceilings), and decode
steps and prefills of a whole catalog model on one chip, each under a software stack (`eager`: PyTorch operators one
by one; `compiled`: torch.compile's fused kernels) and an attention kernel (`bmm`: batched matrix products over the
cache; `sdpa`: PyTorch's fused flash attention), every step replayed from a CUDA graph. A case of cases.yaml names
the file, the catalog system it ran on and the stack and attention it calibrates on; those rows become ``decode``
points (output tokens per second at a batch and KV length) and ``prefill`` points (input tokens per second of a
batch of prompts), tensor-parallel 1 on one chip, predicted by the same roofline as every other point. They
calibrate their system's hardware family only (`Point.family_only`): the pooled default that families without data
inherit is fitted on the published measurements of deployments. The first line of the file is a comment naming
device, date, software and `model: <catalog id>`; a row's `dtype` is its weights' format and its optional `kv_dtype`
the KV cache's (the weights' where absent).
"""

from __future__ import annotations

import csv
import io
from pathlib import Path

from dse.catalog.hardware import default_systems
from dse.catalog.models import default_models
from dse.errors import InputError
from dse.validate.points import Cases, Point

REQUIRED = ("kind", "dtype", "attention", "batch", "context", "seconds", "value", "unit")
# a file without a `stack` column comes from the script before it timed a compiled stack: its steps are eager
DEFAULT_STACK = "eager"
KINDS = ("matmul", "copy", "decode", "prefill")
UNITS = {"decode": "output tokens/s", "prefill": "input tokens/s"}
STEP_DTYPES = ("bf16", "fp8")  # formats a calibrating step may run in (float32 is the CPU path's)


def header_fields(header: str) -> dict[str, str]:
    """The `name: value` parts of a measured file's first line."""
    out = {}
    for part in header.lstrip("#").split(";"):
        name, sep, value = part.partition(":")
        if sep:
            out[name.strip()] = value.strip()
    return out


def load_measured(path: Path, case: str, system: str, stack: str, attention: str, source: str = "") -> Cases:
    """The decode steps and prefills of one measured file run under `stack` with `attention`, as points."""
    if not path.exists():
        raise InputError(f"{path}: no such file of GPU measurements (case '{case}')")
    header, _, body = path.read_text().partition("\n")
    model = header_fields(header).get("model", "")
    if not header.startswith("#") or model not in default_models():
        raise InputError(f"{path}: line 1: expected a comment naming 'model: <catalog model id>', got "
                         f"{model or header[:80]!r}")
    if system not in default_systems():
        raise InputError(f"{path}: case '{case}': field 'system': {system!r} is not a catalog system")
    reader = csv.DictReader(io.StringIO(body))
    missing = [c for c in REQUIRED if c not in (reader.fieldnames or [])]
    if missing:
        raise InputError(f"{path}: missing column(s) {', '.join(missing)}")
    out = Cases()
    for line, raw in enumerate(reader, start=3):
        where = f"{path}: row {line}"
        if raw["kind"] not in KINDS:
            raise InputError(f"{where}: field 'kind': {raw['kind']!r} is not one of {', '.join(KINDS)}")
        if raw["kind"] not in UNITS or (raw.get("stack") or DEFAULT_STACK) != stack or raw["attention"] != attention:
            continue
        if raw["dtype"] not in STEP_DTYPES:
            raise InputError(f"{where}: field 'dtype': {raw['dtype']!r} is not one of {', '.join(STEP_DTYPES)}")
        values = {}
        for name in ("batch", "context", "seconds", "value"):
            try:
                values[name] = float(raw[name])
            except ValueError:
                raise InputError(f"{where}: field '{name}': expected a positive number, got {raw[name]!r}") from None
            if not values[name] > 0:
                raise InputError(f"{where}: field '{name}': expected a positive number, got {raw[name]!r}")
        batch, context = int(values["batch"]), int(values["context"])
        tokens = batch * (context if raw["kind"] == "prefill" else 1)
        if abs(values["value"] * values["seconds"] / tokens - 1) > 1e-6:
            raise InputError(f"{where}: field 'value': {values['value']:g} tokens/s is not the {tokens} tokens of "
                             f"the row over its {values['seconds']:g} s")
        dtype, kv = raw["dtype"], raw.get("kv_dtype") or raw["dtype"]  # KV in the weights' format unless stated
        if kv not in STEP_DTYPES:
            raise InputError(f"{where}: field 'kv_dtype': {kv!r} is not one of {', '.join(STEP_DTYPES)}")
        length = "prompt" if raw["kind"] == "prefill" else "KV"
        out.points.append(Point(
            case, "serving_throughput",
            f"{model} 1 x {system} {stack} {raw['kind']}, batch {batch}, {length} {context} ({attention} attention"
            + "".join(f", {d} {what}" for d, what in ((dtype, "weights"), (kv, "KV")) if d != "bf16") + ")",
            raw["kind"], model, system, 1, 1, 1, 1, dtype, kv,
            values["value"], UNITS[raw["kind"]], batch=batch, context=context, source=source or str(path),
            family_only=True,
        ))
    if not out.points:
        raise InputError(f"{path}: case '{case}': no decode or prefill row under stack {stack!r} with attention "
                         f"{attention!r}")
    return out
