"""Study files: declarative YAML validated on load, with one clear message per mistake.

A study names the models and workloads to serve, the design space to search and what to report:
``cheapest`` (the cost optimum of every model and workload, and the best of every system),
``pareto`` (the TPOT-cost front by the epsilon-constraint method) or ``fast_slow`` (cost against
speed relative to the cost optimum).
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from dse.catalog import read_yaml, validation_message
from dse.errors import InputError, unknown_name_message
from dse.hardware import default_systems
from dse.models import default_models
from dse.solver import SOLVERS
from dse.space import SpaceOptions, Workload
from dse.units import DTYPES

KINDS = ("cheapest", "pareto", "fast_slow", "sweep", "tornado", "overtraining", "expert_placement", "kv_tiers",
         "api_pricing", "moe_codesign")
SWEEP_PARAMETERS = ("hbm_bandwidth", "hbm_capacity", "flops", "scaleup_bandwidth", "scaleout_bandwidth",
                    "scaleup_domain", "price")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class WorkloadSpec(_Strict):
    """One kind of request and its service targets."""

    name: str
    prompt: int = Field(gt=0, description="prompt tokens")
    output: int = Field(gt=0, description="output tokens")
    tpot_max_s: float | None = Field(default=None, gt=0)
    ttft_max_s: float | None = Field(default=None, gt=0)
    demand_tokens_per_s: float | None = Field(default=None, gt=0)

    def workload(self) -> Workload:
        return Workload(self.name, self.prompt, self.output, self.tpot_max_s, self.ttft_max_s, self.demand_tokens_per_s)


class SpaceSpec(_Strict):
    """The discrete choices to search."""

    systems: list[str] | Literal["all"] = "all"
    weights_dtypes: list[Literal["bf16", "fp8", "fp4"]] = ["bf16", "fp8", "fp4"]
    kv_dtypes: list[Literal["bf16", "fp8", "fp4"]] = ["bf16", "fp8"]
    kv_tiers: list[Literal["hbm", "host"]] = ["hbm", "host"]
    tp: list[int] = [1, 2, 4, 8]
    pp: list[int] = [1, 2, 4]
    max_racks: int = Field(default=4, ge=1)
    max_chips_per_stage: int = Field(default=1024, ge=1)
    min_chips_per_stage: int = Field(default=1, ge=1)
    max_batch_per_rank: int = Field(default=1024, ge=1)
    ideal: bool = False

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

    def options(self) -> SpaceOptions:
        systems = tuple(default_systems()) if self.systems == "all" else tuple(self.systems)
        return SpaceOptions(
            systems=systems, weights_dtypes=tuple(self.weights_dtypes), kv_dtypes=tuple(self.kv_dtypes),
            kv_tiers=tuple(self.kv_tiers), tp=tuple(self.tp), pp=tuple(self.pp), max_racks=self.max_racks,
            max_chips_per_stage=self.max_chips_per_stage, min_chips_per_stage=self.min_chips_per_stage,
            max_batch_per_rank=self.max_batch_per_rank,
            ideal=self.ideal,
        )


class SolverSpec(_Strict):
    name: Literal["highs", "scip", "sat"] = "highs"
    time_limit_s: float = Field(default=60.0, gt=0)


class ParetoSpec(_Strict):
    """Epsilon-constraint sweep of the TPOT target, from the cost optimum down to the fastest point."""

    min_step: float = Field(default=0.02, gt=0, lt=1, description="relative TPOT step between front points")
    max_points: int = Field(default=60, ge=2)


class FastSlowSpec(_Strict):
    """Speed multipliers (TPOT of the base point / TPOT) to price; below 1 is a slow mode."""

    speedups: list[float] = [0.25, 0.5, 1.0, 1.5, 2.0, 2.5, 3.0, 4.0]

    @field_validator("speedups")
    @classmethod
    def _positive(cls, v: list[float]) -> list[float]:
        if not v or any(x <= 0 for x in v):
            raise ValueError(f"must be a non-empty list of numbers > 0, got {v}")
        return sorted(v)


class SweepSpec(_Strict):
    """One catalog parameter scaled by each factor (1 = the catalog), for some systems or all."""

    parameter: Literal["hbm_bandwidth", "hbm_capacity", "flops", "scaleup_bandwidth", "scaleout_bandwidth",
                       "scaleup_domain", "price"] = "hbm_bandwidth"
    factors: list[float] = [0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 4.0]
    systems: list[str] | Literal["all"] = "all"
    per_system: bool = True

    @field_validator("factors")
    @classmethod
    def _factors(cls, v: list[float]) -> list[float]:
        if len(v) < 2 or any(x <= 0 for x in v):
            raise ValueError(f"must list at least two factors > 0, got {v}")
        return sorted(set(v))


class TornadoSpec(_Strict):
    """Each parameter at a low and a high factor around the catalog value."""

    parameters: list[Literal["hbm_bandwidth", "hbm_capacity", "flops", "scaleup_bandwidth", "scaleout_bandwidth",
                             "scaleup_domain", "price"]] = list(SWEEP_PARAMETERS)
    low: float = Field(default=0.5, gt=0)
    high: float = Field(default=2.0, gt=0)

    @model_validator(mode="after")
    def _range(self) -> TornadoSpec:
        if not self.parameters:
            raise ValueError("parameters: must list at least one parameter")
        if not self.low < 1.0 < self.high:
            raise ValueError(f"low < 1 < high must hold, got low={self.low}, high={self.high}")
        return self


class OvertrainingSpec(_Strict):
    """Lifetime cost at a target loss: pre-training, RL and inference, searched over model size."""

    target_loss: float = Field(default=1.82, gt=0)
    loss_fit: Literal["hoffmann", "epoch"] = "hoffmann"
    demands_tokens_per_s: list[float] = [5e6, 5e7, 5e8]
    deployment_days: float = Field(default=60, gt=0)
    rl_tokens_per_pretrain_token: float = Field(default=0.67, ge=0)
    rl_flops_factor: float = Field(default=3.0, ge=2.0, le=6.0)
    rl_inefficiency: float = Field(default=3.0, ge=1.0)
    seq: int = Field(default=8192, gt=0)
    global_batch_tokens: float = Field(default=16_000_000, gt=0)
    deadline_days: float = Field(default=120, gt=0)
    chip_budget: int = Field(default=32768, ge=1)
    train_systems: list[str] = ["h100", "b200", "gb200-nvl72"]
    params_b: list[float] = [10, 3000]
    trials: int = Field(default=40, ge=4)

    @model_validator(mode="after")
    def _check(self) -> OvertrainingSpec:
        if len(self.params_b) != 2 or not 0 < self.params_b[0] < self.params_b[1]:
            raise ValueError(f"params_b must be [low, high] with 0 < low < high, got {self.params_b}")
        if not self.demands_tokens_per_s or any(d <= 0 for d in self.demands_tokens_per_s):
            raise ValueError(f"demands_tokens_per_s must list demands > 0, got {self.demands_tokens_per_s}")
        return self


class PlacementSpec(_Strict):
    """Expert placement for one MoE model on one system: load skews and a replica budget."""

    system: str = "gb200-nvl72"
    gpus: int = Field(default=16, ge=2)
    domain_gpus: int = Field(default=8, ge=1, description="GPUs per scale-up domain in the placement")
    tokens_per_step: int = Field(default=4096, ge=1)
    skews: list[float] = [0.0, 0.6, 1.0, 1.4]
    redundant: int = Field(default=16, ge=0)
    extra_slots: int = Field(default=2, ge=0, description="slots per GPU beyond experts / GPUs")
    experts: int | None = Field(default=None, ge=2, description="experts to place (default: the model's)")
    time_limit_s: float = Field(default=10.0, gt=0)
    context: int = Field(default=4096, ge=1)

    @field_validator("skews")
    @classmethod
    def _skews(cls, v: list[float]) -> list[float]:
        if not v or any(x < 0 for x in v):
            raise ValueError(f"must list Zipf exponents >= 0, got {v}")
        return v


class PrefixClassSpec(_Strict):
    name: str
    prefix_tokens: int = Field(gt=0)
    prefixes_kept: int = Field(gt=0)
    lifetime_s: float = Field(gt=0)
    hits_per_s: float = Field(ge=0)
    ttft_s: float = Field(gt=0)


class KVTiersSpec(_Strict):
    """Cached-prefix classes on one serving node's memory tiers."""

    system: str = "h100"
    chips: int = Field(default=8, ge=1)
    tp: int = Field(default=8, ge=1)
    weights_dtype: Literal["bf16", "fp8", "fp4"] = "fp8"
    nvme_drives: int = Field(default=8, ge=0)
    hdd_drives: int = Field(default=12, ge=0)
    classes: list[PrefixClassSpec]


class SheetSpec(_Strict):
    name: str
    step_context: float = Field(gt=0)
    input: list[float]  # [below the step, above]
    output: list[float]

    @field_validator("input", "output")
    @classmethod
    def _pair(cls, v: list[float]) -> list[float]:
        if len(v) != 2 or any(x <= 0 for x in v):
            raise ValueError(f"must be [price below the step, price above], both > 0, got {v}")
        return v


class PricingSpec(_Strict):
    """Inverse: what price sheets imply; forward: tier prices for a model on the study's space."""

    sheets: list[SheetSpec]
    system: str = "tpu-v7"
    actives_b: list[float] = [25, 50, 100, 200, 400]
    contexts: list[int] = [8000, 32000, 128000, 200000, 400000, 1000000]
    tier_boundaries: list[int] = [200000, 1000000]
    margin: float = Field(default=0.5, ge=0)


class CodesignSpec(_Strict):
    """Fixed quality (effective dense size), the sparsities to weigh, the scale-up domains to serve on."""

    effective_params_b: float = Field(default=700, gt=0)
    gamma: float = Field(default=1 / 3, gt=0, lt=1)
    sparsities: list[int] = [1, 2, 4, 8, 16, 32, 64]
    systems: list[str] = ["h200", "gb200-nvl72", "rubin-ultra-nvl576"]


class StudySpec(_Strict):
    """A study file."""

    study: str
    kind: Literal["cheapest", "pareto", "fast_slow", "sweep", "tornado", "overtraining", "expert_placement",
                  "kv_tiers", "api_pricing", "moe_codesign"]
    description: str
    expect: str
    models: list[str] = []
    workloads: list[WorkloadSpec]
    space: SpaceSpec = SpaceSpec()
    solver: SolverSpec = SolverSpec()
    pareto: ParetoSpec = ParetoSpec()
    fast_slow: FastSlowSpec = FastSlowSpec()
    sweep: SweepSpec = SweepSpec()
    tornado: TornadoSpec = TornadoSpec()
    overtraining: OvertrainingSpec = OvertrainingSpec()
    placement: PlacementSpec = PlacementSpec()
    kv_tiers: KVTiersSpec | None = None
    pricing: PricingSpec | None = None
    codesign: CodesignSpec = CodesignSpec()

    @model_validator(mode="after")
    def _check(self) -> StudySpec:
        if not self.models and self.kind not in ("overtraining", "moe_codesign"):
            raise ValueError("models: must list at least one model")
        if not self.workloads:
            raise ValueError("workloads: must list at least one workload")
        names = [w.name for w in self.workloads]
        if len(set(names)) != len(names):
            raise ValueError(f"workloads: names must be unique, got {names}")
        return self


def _field_value(spec: StudySpec, dotted: str):
    value = spec
    for part in dotted.split("."):
        value = getattr(value, part)
    return value


def _system_fields(spec: StudySpec) -> list[tuple[str, list[str]]]:
    """Every field of the study that names systems, with the ids it names."""
    fields = ["space.systems"]
    fields += {"sweep": ["sweep.systems"], "overtraining": ["overtraining.train_systems"],
               "expert_placement": ["placement.system"], "kv_tiers": ["kv_tiers.system"],
               "api_pricing": ["pricing.system"], "moe_codesign": ["codesign.systems"]}.get(spec.kind, [])
    out = []
    for field in fields:
        value = _field_value(spec, field)
        if value == "all":
            continue
        out.append((field, [value] if isinstance(value, str) else list(value)))
    return out


def load_study(path: str | Path) -> StudySpec:
    """Read and validate a study file; every error is an InputError naming file and field."""
    path = Path(path)
    if not path.exists():
        raise InputError(f"{path}: no such study file")
    doc = read_yaml(path)
    if not isinstance(doc, dict):
        raise InputError(f"{path}: a study file is a mapping with study, kind, models, workloads, ...")
    try:
        spec = StudySpec.model_validate(doc)
    except ValidationError as exc:
        raise InputError(validation_message(exc, StudySpec, str(path))) from None
    models = default_models()
    for i, m in enumerate(spec.models):
        if m not in models:
            raise InputError(f"{path}: field 'models.{i}': " + unknown_name_message("model", m, models))
    required = {"api_pricing": ("pricing", "price sheets and the forward contexts"),
                "kv_tiers": ("kv_tiers", "classes of cached prefixes and the node")}
    if spec.kind in required and getattr(spec, required[spec.kind][0]) is None:
        name, what = required[spec.kind]
        raise InputError(f"{path}: missing required field '{name}' ({what})")
    if spec.kind == "expert_placement" and not all(models[m].is_moe for m in spec.models):
        raise InputError(f"{path}: field 'models': expert placement needs MoE models")
    systems = default_systems()
    for field, ids in _system_fields(spec):
        if not ids:
            raise InputError(f"{path}: field '{field}': must list at least one system, or be 'all'")
        for i, s in enumerate(ids):
            if s not in systems:
                where = field if isinstance(_field_value(spec, field), str) else f"{field}.{i}"
                raise InputError(f"{path}: field '{where}': " + unknown_name_message("system", s, systems))
    assert spec.solver.name in SOLVERS and all(d in DTYPES for d in spec.space.weights_dtypes)
    return spec
