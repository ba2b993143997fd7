"""The fields every study file shares, and loading a study through its kind's own spec.

A study names the models and workloads to serve, the design space to search and the solver; its
``kind`` picks a module of ``dse.studies`` (see the registry) whose ``Spec`` adds and validates
the kind's own block, so every mistake gets one message naming the file and the field.
"""

from __future__ import annotations

import os
import re
import stat
from dataclasses import replace
from pathlib import Path
from typing import Annotated, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from dse.catalog.frameworks import default_frameworks, get_framework
from dse.catalog.hardware import DEFAULT_PRICE_KIND, PRICE_KINDS, default_systems, shipping_ids
from dse.catalog.loading import read_yaml, validation_message
from dse.catalog.models import default_models
from dse.errors import InputError, unknown_name_message
from dse.optimize.solver import SOLVERS
from dse.optimize.space import SpaceOptions
from dse.physics.queueing import QUANTILES, quantile_name
from dse.physics.serving import DEFAULT_CHUNK, Request


class Strict(BaseModel):
    """Strict fields: no unknown keys, no booleans or strings as numbers, no NaN or infinity. A class's validator is
    built when it first validates (``defer_build``): a nested class is validated inside its parent's validator, so
    its own is never built on the way of a question (some 0.02 s of start-up).
    """

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False, defer_build=True)


MAX_LIST = 64
"""Longest list a study field takes (so that every space stays enumerable)."""
PLAIN_NAME = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$"
"""A study or workload name: it becomes a folder name, so no separators, no leading dot, at most 100 characters."""
Degree = Annotated[int, Field(ge=1, le=4096)]
Fraction = Annotated[float, Field(gt=0, le=1000)]


def plain_name(v: str) -> str:
    """A name that can become a folder name: letters, digits, '.', '_' and '-', not starting with '.'."""
    if not re.match(PLAIN_NAME, v) or v in (".", ".."):
        raise ValueError("must be a plain name (letters, digits, '.', '_', '-'; no '/', no leading '.', at most "
                         "100 characters)")
    return v


class ClosedLoop(Strict):
    """A closed loop: ``concurrency`` requests in flight, each replaced as it completes (how benchmarks run)."""

    concurrency: int = Field(ge=1, le=10_000_000, description="requests the deployment holds in flight")


class WorkloadSpec(Strict):
    """One kind of request, how requests arrive and its service targets (means, and quantiles: ``*_p50_max_s``,
    ``*_p90_max_s``, ``*_p99_max_s``).
    """

    name: str
    prompt: int = Field(gt=0, le=100_000_000, description="prompt tokens")
    output: int = Field(gt=0, le=10_000_000, description="output tokens")
    arrival: Literal["poisson"] | ClosedLoop = Field(
        default="poisson", description="`poisson` (open loop: production traffic, the default) or {concurrency: N} "
        "(a closed loop of N requests in flight, as benchmarks run)")
    tpot_max_s: float | None = Field(default=None, gt=0, le=3600, description="target on the mean TPOT")
    ttft_max_s: float | None = Field(default=None, gt=0, le=86400, description="target on the mean TTFT")
    tpot_p50_max_s: float | None = Field(default=None, gt=0, le=3600)
    tpot_p90_max_s: float | None = Field(default=None, gt=0, le=3600)
    tpot_p99_max_s: float | None = Field(default=None, gt=0, le=3600)
    ttft_p50_max_s: float | None = Field(default=None, gt=0, le=86400)
    ttft_p90_max_s: float | None = Field(default=None, gt=0, le=86400)
    ttft_p99_max_s: float | None = Field(default=None, gt=0, le=86400)
    demand_tokens_per_s: float | None = Field(default=None, gt=0, le=1e13)
    cached_prompt_share: float = Field(default=0.0, ge=0, lt=1, description="share of the prompt served from a "
                                       "prefix cache (not recomputed)")
    chunk_tokens: int = Field(default=DEFAULT_CHUNK, ge=16, le=1_048_576,
                              description="chunked-prefill budget per DP rank per forward pass")
    draft_tokens: int = Field(default=0, ge=0, le=16, description="speculative / MTP draft tokens per decode pass")
    accept_length: float = Field(default=1.0, ge=1, le=17, description="mean tokens emitted per decode pass")

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        return plain_name(v)

    @model_validator(mode="after")
    def _speculation(self) -> WorkloadSpec:
        if self.accept_length > self.draft_tokens + 1:
            raise ValueError(f"accept_length ({self.accept_length:g}) must be at most draft_tokens + 1 "
                             f"({self.draft_tokens + 1})")
        return self

    def quantile_targets(self, metric: str) -> tuple[tuple[float, float], ...]:
        """The (quantile, seconds) targets of ``metric`` (``ttft`` or ``tpot``) this workload sets."""
        return tuple((q, v) for q in QUANTILES if (v := getattr(self, f"{metric}_{quantile_name(q)}_max_s"))
                     is not None)

    def workload(self) -> Request:
        """The request this workload describes, built by keyword and carried unchanged down to the physics (the
        space adds the serving stack its framework runs).
        """
        closed = isinstance(self.arrival, ClosedLoop)
        return Request(prompt=self.prompt, output=self.output, name=self.name, cached=self.cached_prompt_share,
                       chunk=self.chunk_tokens, draft=self.draft_tokens, accept=self.accept_length,
                       tpot_max=self.tpot_max_s, ttft_max=self.ttft_max_s, demand=self.demand_tokens_per_s,
                       arrival="concurrency" if closed else "poisson",
                       concurrency=self.arrival.concurrency if closed else None,
                       ttft_quantile_max=self.quantile_targets("ttft"), tpot_quantile_max=self.quantile_targets("tpot"))


_OPTS = SpaceOptions()
"""The defaults of the space's choices, defined once (in `SpaceOptions`)."""


class SpaceSpec(Strict):
    """The discrete choices to search."""

    systems: list[str] | Literal["all"] = Field(default="all", max_length=MAX_LIST)
    weights_dtypes: list[Literal["bf16", "fp8", "fp4"]] = Field(default=list(_OPTS.weights_dtypes), max_length=MAX_LIST)
    kv_dtypes: list[Literal["bf16", "fp8", "fp4"]] = Field(default=list(_OPTS.kv_dtypes), max_length=MAX_LIST)
    kv_tiers: list[Literal["hbm", "host"]] = Field(default=list(_OPTS.kv_tiers), max_length=MAX_LIST)
    tp: list[Degree] = Field(default=list(_OPTS.tp), max_length=MAX_LIST)
    pp: list[Annotated[int, Field(ge=1, le=256)]] = Field(default=list(_OPTS.pp), max_length=MAX_LIST)
    max_racks: int = Field(default=_OPTS.max_racks, ge=1, le=64, description="scale-up domains per replica (bounded "
                           "so the layouts stay enumerable)")
    max_chips_per_stage: int = Field(default=_OPTS.max_chips_per_stage, ge=1, le=16384)
    min_chips_per_stage: int = Field(default=_OPTS.min_chips_per_stage, ge=1, le=16384)
    max_batch_per_rank: int = Field(default=_OPTS.max_batch_per_rank, ge=1, le=65536)
    ideal: bool = _OPTS.ideal
    weight_only: bool = _OPTS.weight_only
    """Offer weight formats a chip has no tensor units for (weight-only quantization, dequantized)."""
    serving: list[Literal["aggregated", "disaggregated"]] = Field(default=["aggregated", "disaggregated"],
                                                                   min_length=1, max_length=2)
    """Deployments searched: aggregated replicas, and a prefill pool with a decode pool."""
    context_parallel: bool = True
    """Whether a prefill pool may split a prompt over its DP ranks (ring attention)."""
    mixed_vendors: bool = _OPTS.mixed_vendors
    """Whether a disaggregated deployment's prefill and decode pools may run on different vendors' hardware (AMD
    prefill handing the KV cache to NVIDIA decode). Off by default: serving frameworks hand the KV cache between
    GPUs of one vendor's stack only (mixed NVIDIA generations are supported)."""

    @field_validator("weights_dtypes", "kv_dtypes", "kv_tiers", "tp", "pp")
    @classmethod
    def _non_empty(cls, v: list) -> list:
        if not v:
            raise ValueError("must list at least one value")
        if any(isinstance(x, int) and x < 1 for x in v):
            raise ValueError(f"degrees must be >= 1, got {v}")
        return v

    @model_validator(mode="after")
    def _range(self) -> SpaceSpec:
        if self.min_chips_per_stage > self.max_chips_per_stage:
            raise ValueError(
                f"min_chips_per_stage ({self.min_chips_per_stage}) must be <= max_chips_per_stage "
                f"({self.max_chips_per_stage})"
            )
        return self

    def options(self, price_kind: str = DEFAULT_PRICE_KIND, prices: tuple[tuple[str, float], ...] = (),
                include_announced: bool = False) -> SpaceOptions:
        """The space's options; ``systems: all`` means every shipping system (and announced ones on request)."""
        systems = shipping_ids(include_announced) if self.systems == "all" else tuple(self.systems)
        return SpaceOptions(
            price_kind=price_kind, prices=prices, weight_only=self.weight_only,
            systems=systems, weights_dtypes=tuple(self.weights_dtypes), kv_dtypes=tuple(self.kv_dtypes),
            kv_tiers=tuple(self.kv_tiers), tp=tuple(self.tp), pp=tuple(self.pp), max_racks=self.max_racks,
            max_chips_per_stage=self.max_chips_per_stage, min_chips_per_stage=self.min_chips_per_stage,
            max_batch_per_rank=self.max_batch_per_rank,
            ideal=self.ideal, mixed_vendors=self.mixed_vendors,
        )


class SolverSpec(Strict):
    name: Literal[SOLVERS] = "highs"  # type: ignore[valid-type]
    time_limit_s: float = Field(default=60.0, gt=0, le=86400)


class StudySpec(Strict):
    """The fields of every study file; a kind's ``Spec`` subclasses it and adds its own block."""

    study: str = Field(description="a plain name: it names the output folder")
    kind: str
    description: str
    expect: str
    models: list[str] = Field(default=[], max_length=MAX_LIST)
    workloads: list[WorkloadSpec] = Field(max_length=MAX_LIST)
    space: SpaceSpec = SpaceSpec()
    solver: SolverSpec = SolverSpec()
    price: Literal[PRICE_KINDS] = DEFAULT_PRICE_KIND  # type: ignore[valid-type]
    """The price kind the study compares at (on_demand: the broadest sourced coverage of the catalog)."""
    prices: dict[str, float] = {}
    """USD per chip-hour the study supplies per system (replaces the catalog's price of the kind)."""
    include_announced: bool = False
    """Whether ``systems: all`` includes announced, unshipped systems."""
    allow_beyond_trained_context: bool = False
    """Whether a workload may exceed a model's published maximum context (then every table flags it)."""
    framework: Literal["vllm", "sglang", "trtllm"] | None = Field(
        default=None, description="the serving framework every deployment runs: its memory reservation "
        "(hw_catalog/frameworks.yaml) and its serving stack's fitted latency (calibration/serving_stack.yaml); "
        "default: each system's vendor default there (vLLM on every vendor); TensorRT-LLM runs on NVIDIA only")
    mem_fraction: float | None = Field(
        default=None, gt=0, le=1, description="the framework's memory fraction (vLLM gpu_memory_utilization, SGLang "
        "mem_fraction_static, TensorRT-LLM free_gpu_memory_fraction); default: the framework's own")
    decide: Literal["expected", "robust"] | None = Field(
        default=None, description="how an optimum is chosen: `expected` on the predictions; `robust` on each "
        "system's predictions at the unfavourable end of its validated error band (cost x the band's high "
        "multiplier, the TTFT and TPOT targets met at the band's edge). Default: `robust` when any candidate "
        "system of the space (one with a valid layout for the model and formats) is uncalibrated (of no family, or "
        "of a family with fewer than 10 measured sweeps or published points of its own on a metric, whose band "
        "rests on other families' data), else `expected`; with `space.ideal` (no band) always `expected`")
    """How an optimum is chosen (`dse.optimize.margins`); None: the default rule of the field's description."""

    models_required: ClassVar[bool] = True
    """Whether the study must name catalog models (kinds that build their own models do not)."""
    workloads_required: ClassVar[bool] = True
    """Whether the study must name serving workloads (a training study does not)."""
    system_fields: ClassVar[tuple[str, ...]] = ()
    """Dotted fields of the kind's block that name catalog systems (``space.systems`` always does)."""

    @field_validator("study")
    @classmethod
    def _name(cls, v: str) -> str:
        return plain_name(v)

    @model_validator(mode="after")
    def _check(self) -> StudySpec:
        if not self.models and self.models_required:
            raise ValueError("models: must list at least one model")
        if not self.workloads and self.workloads_required:
            raise ValueError("workloads: must list at least one workload")
        for sid, usd in self.prices.items():
            if not usd > 0:
                raise ValueError(f"prices.{sid}: USD per chip-hour must be > 0, got {usd}")
        repeat = first_repeat(self)
        if repeat:
            raise ValueError(repeat)
        for i, w in enumerate(self.workloads):
            if isinstance(w.arrival, ClosedLoop):
                if "disaggregated" in self.space.serving:
                    raise ValueError(f"workloads.{i}.arrival: a closed loop ({{concurrency: {w.arrival.concurrency}}}) "
                                     "is searched over aggregated deployments only (set space.serving: [aggregated]); "
                                     "it couples a disaggregated deployment's pools through the request rate")
                if w.demand_tokens_per_s is not None:
                    raise ValueError(f"workloads.{i}: a closed loop sets its own load; give arrival {{concurrency: N}} "
                                     "or demand_tokens_per_s, not both")
        return self

    def options(self) -> SpaceOptions:
        """The space options with the study's price kind, its own prices, announced systems and framework."""
        return replace(self.space.options(self.price, tuple(self.prices.items()), self.include_announced),
                       framework=self.framework, mem_fraction=self.mem_fraction)

    def check_catalog(self, path: Path, models: dict) -> None:
        """Checks against the catalogs that the kind adds; raise InputError naming the file and field."""


def _field_value(spec: StudySpec, dotted: str):
    value = spec
    for part in dotted.split("."):
        value = getattr(value, part)
    return value


def _system_fields(spec: StudySpec) -> list[tuple[str, list[str]]]:
    """Every field of the study that names systems, with the ids it names."""
    out = []
    for field in ("space.systems", *spec.system_fields):
        value = _field_value(spec, field)
        if value == "all":
            continue
        out.append((field, [value] if isinstance(value, str) else list(value)))
    return out


SEQUENCE_FIELDS = frozenset({"demand_curve", "input", "output", "params_b"})
"""List fields whose items form a sequence (a share per time slice, a price below and above a step, a
[low, high] range), where a value may recur. Every other list of a study is a set of names or of
alternatives (models, systems, workloads and classes by name, tornado parameters, formats, degrees,
factors, skews): a repeat would run the same thing twice and double its rows, so it is refused."""

_FILE_KINDS = ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISCHR, "a character device"),
               (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


def _check_regular_file(path: Path) -> None:
    """Refuse a study path that is not a regular file before opening it (a FIFO or a device would block or
    never end); symbolic links are followed.
    """
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        raise InputError(f"{path}: no such study file") from None
    except OSError as exc:
        raise InputError(f"{path}: cannot read: {exc.strerror}") from None
    if not stat.S_ISREG(mode):
        what = next((name for test, name in _FILE_KINDS if test(mode)), "not a regular file")
        raise InputError(f"{path}: is {what}, not a regular file; a study is a YAML file")


def _shown(value: object) -> str:
    return repr(value) if isinstance(value, str) else f"{value:g}" if isinstance(value, float) else str(value)


def first_repeat(model: BaseModel, at: str = "") -> str | None:
    """The first value listed twice in any list of a study (a name twice among named items), outside
    ``SEQUENCE_FIELDS``, as a message naming the field and the value; None when nothing repeats.
    """
    for name in type(model).model_fields:
        value = getattr(model, name)
        field = f"{at}{name}"
        if isinstance(value, BaseModel):
            found = first_repeat(value, field + ".")
            if found:
                return found
            continue
        if not isinstance(value, list):
            continue
        seen: dict = {}
        for i, item in enumerate(value):
            if isinstance(item, BaseModel):
                found = first_repeat(item, f"{field}.{i}.")
                if found:
                    return found
                if "name" not in type(item).model_fields:
                    continue
                key, what = item.name, "the name "
            elif name in SEQUENCE_FIELDS:
                continue
            else:
                key, what = item, ""
            if key in seen:
                return (f"field '{field}': {what}{_shown(key)} is given twice (items {seen[key]} and {i}); each may "
                        "appear once")
            seen[key] = i
    return None


def load_study(study: str | Path | dict) -> StudySpec:
    """Read and validate a study (a file, or the mapping a file would hold); errors are InputErrors.

    Each message names the file (``<study>`` for a mapping) and the field. A path must be a regular file
    (checked before it is opened); no list names a thing twice (`first_repeat`, checked as the spec is).
    """
    from dse.studies.registry import KINDS, study_module

    if isinstance(study, dict):
        where, doc = "<study>", study
    else:
        path = Path(study)
        _check_regular_file(path)
        where, doc = str(path), read_yaml(path)
    if not isinstance(doc, dict):
        raise InputError(f"{where}: a study file is a mapping with study, kind, models, workloads, ...")
    kind = doc.get("kind")
    if not isinstance(kind, str) or kind not in KINDS:
        shown = "missing" if kind is None else repr(kind)
        raise InputError(f"{where}: field 'kind': {shown}; allowed: {', '.join(KINDS)}")
    spec_type = study_module(kind).Spec
    try:
        spec = spec_type.model_validate(doc)
    except ValidationError as exc:
        raise InputError(validation_message(exc, spec_type, where)) from None
    models = default_models()
    for i, m in enumerate(spec.models):
        if m not in models:
            raise InputError(f"{where}: field 'models.{i}': " + unknown_name_message("model", m, models))
    spec.check_catalog(Path(where), models)
    for m in spec.models:
        for j, w in enumerate(spec.workloads):
            models[m].check_context(w.prompt + w.output, spec.allow_beyond_trained_context,
                                    f"{where}: field 'workloads.{j}' (prompt + output) for model '{m}'")
    systems = default_systems()
    for s in spec.prices:
        if s not in systems:
            raise InputError(f"{where}: field 'prices.{s}': " + unknown_name_message("system", s, systems))
    for field, ids in _system_fields(spec):
        if not ids:
            raise InputError(f"{where}: field '{field}': must list at least one system, or be 'all'")
        for i, s in enumerate(ids):
            if s not in systems:
                at = field if isinstance(_field_value(spec, field), str) else f"{field}.{i}"
                raise InputError(f"{where}: field '{at}': " + unknown_name_message("system", s, systems))
            if spec.framework is not None and not get_framework(spec.framework).runs_on(systems[s]):
                fw = get_framework(spec.framework)
                raise InputError(f"{where}: field 'framework': {spec.framework} ({fw.name}) runs on "
                                 f"{', '.join(fw.vendors)} hardware only, and {field} lists {s} "
                                 f"({systems[s].vendor}); allowed on {s}: "
                                 + ", ".join(f for f, x in default_frameworks().items() if x.runs_on(systems[s])))
    return spec
