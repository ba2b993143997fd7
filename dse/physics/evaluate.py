"""Evaluate one serving configuration: resolve names and layout, run the vectorized physics on a
single candidate, and return plain numbers keyed as in the command-line contract.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, replace

import numpy as np

from dse.catalog.calibration import band_keys, bands_of
from dse.catalog.frameworks import ENGINE_ONLY, Stack, framework_for, stack_of
from dse.catalog.hardware import (
    DEFAULT_PRICE_KIND,
    IDEAL,
    Efficiency,
    System,
    check_price_kind,
    efficiency_for,
    get_system,
    priced,
)
from dse.catalog.models import Architecture, get_model
from dse.catalog.units import DTYPES
from dse.errors import InputError
from dse.physics.codes import BOUNDS, KV_SHARDS, KV_TIERS, PHASES
from dse.physics.layout import Layout, resolve_layout
from dse.physics.queueing import QUANTILES, quantile_name
from dse.physics.roofline import (
    Candidates,
    ModelTable,
    SystemTable,
    evaluate,
    evaluate_at,
    memory_budget,
    with_memory,
)
from dse.physics.serving import DEFAULT_CHUNK, Request, aggregated


@dataclass(frozen=True)
class Config:
    """One serving configuration as a user states it."""

    model: str
    system: str
    batch: int
    context: int
    tp: int | None = None
    ep: int | None = None
    pp: int | None = None
    dp: int | None = None
    etp: int | None = None
    chips: int | None = None
    phase: str = "decode"
    weights_dtype: str = "bf16"
    kv_dtype: str = "bf16"
    kv_tier: str = "hbm"
    kv_shard: str = "heads"  # how TP ranks split the KV cache (KV_SHARDS)
    micro_batches: int = 1  # decode micro-batches overlapping each other's communication (2: two-batch overlap)
    prompt: int | None = None  # prompt length for TTFT; default: the context
    moe_imbalance: float = 1.0  # most-loaded GPU's routed tokens over the mean (from expert placement)
    output: int | None = None  # output tokens per request: adds the request-level metrics (aggregated)
    chunk: int = DEFAULT_CHUNK  # chunked-prefill budget, tokens per DP rank per forward pass
    cached: float = 0.0  # share of the prompt served from a prefix cache
    draft: int = 0  # speculative draft tokens per decode pass
    accept: float = 1.0  # mean tokens emitted per decode pass
    experts_dtype: str | None = None  # routed-expert format; None: as weights_dtype
    weight_only: bool = False  # allow formats the chip has no tensor units for (stored narrow, dequantized)
    price_kind: str = DEFAULT_PRICE_KIND
    usd_per_chip_hour: float | None = None  # a price the caller supplies (replaces the catalog's)
    allow_beyond_trained_context: bool = False
    framework: str | None = None  # the serving framework (None: the system's vendor default)
    mem_fraction: float | None = None  # the framework's memory fraction (None: its default)
    arrival: str = "poisson"  # "poisson" (open loop) or "concurrency" (a closed loop of the batch in flight)

    def __post_init__(self) -> None:
        check_config(self)

    def request(self, stack: Stack = ENGINE_ONLY) -> Request:
        """The request these options describe (``prompt`` and ``output`` given), through ``stack``, with every
        quantile of `dse.physics.queueing.QUANTILES` computed.
        """
        assert self.prompt is not None and self.output is not None
        return Request(prompt=self.prompt, output=self.output, cached=self.cached, chunk=self.chunk,
                       draft=self.draft, accept=self.accept, arrival=self.arrival, stack=stack,
                       report_quantiles=QUANTILES)


MAX_BATCH = 1_000_000_000
"""Most sequences one forward pass of a replica may carry (what a study's space reaches: 65,536 per rank on
16,384 chips)."""
MAX_TOKENS = 100_000_000
"""Longest context or prompt, in tokens (a study's longest prompt; a model's published window binds first)."""
MAX_OUTPUT = 10_000_000
"""Most output tokens per request (a study's largest)."""
MAX_CHIPS = 1_048_576
"""Most chips of one replica, and the largest parallel degree (2**20; a study reaches 64 domains of 9,216)."""
MAX_CHUNK = 1_048_576
"""Largest chunked-prefill budget, tokens per DP rank per pass (a study's largest)."""
MAX_DRAFT = 16
"""Most speculative draft tokens per decode pass (a study's largest)."""
MAX_USD_PER_CHIP_HOUR = 1_000_000.0
"""Highest price per chip-hour accepted (far above any chip's; keeps every cost finite)."""

WHOLE_FIELDS: tuple[tuple[str, int, int, str], ...] = (
    ("batch", 1, MAX_BATCH, "sequences per forward pass"),
    ("context", 1, MAX_TOKENS, "tokens"),
    ("tp", 1, MAX_CHIPS, "attention tensor-parallel degree"),
    ("ep", 1, MAX_CHIPS, "expert-parallel degree"),
    ("pp", 1, MAX_CHIPS, "pipeline stages"),
    ("dp", 1, MAX_CHIPS, "attention data-parallel degree"),
    ("etp", 1, MAX_CHIPS, "expert tensor-parallel degree"),
    ("chips", 1, MAX_CHIPS, "chips of the replica"),
    ("prompt", 1, MAX_TOKENS, "prompt tokens"),
    ("output", 1, MAX_OUTPUT, "output tokens per request"),
    ("chunk", 1, MAX_CHUNK, "chunked-prefill tokens per DP rank per pass"),
    ("draft", 0, MAX_DRAFT, "speculative draft tokens per decode pass"),
)
"""Whole-number fields of ``Config``: name, lowest and highest allowed value, what it counts."""
TEXT_FIELDS = ("model", "system", "phase", "weights_dtype", "kv_dtype", "kv_tier", "kv_shard", "experts_dtype",
               "price_kind", "framework", "arrival")
OPTIONAL_TEXT = ("experts_dtype", "framework")
ARRIVALS = ("poisson", "concurrency")
FLAG_FIELDS = ("weight_only", "allow_beyond_trained_context")


def _option(name: str) -> str:
    return "--" + name.replace("_", "-")


def _shown(value: object) -> str:
    """A value as a message shows it: numbers plainly (-1, nan, 1e+308), anything else quoted."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        return repr(value)
    return str(int(value)) if isinstance(value, numbers.Integral) else f"{float(value):g}"


def _real(value: object) -> float | None:
    """``value`` as a float when it is a finite real number (not a boolean), else None."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        return None
    v = float(value)
    return v if math.isfinite(v) else None


def check_config(cfg: Config) -> None:
    """Check every field of a configuration against its stated range (one InputError naming the option).

    Whole numbers lie in the ranges of ``WHOLE_FIELDS``; ``cached`` in [0, 1); ``accept`` in [1, draft + 1];
    ``moe_imbalance`` finite and >= 1 (its upper bound, the EP degree, is checked with the layout in
    `resolve`); ``micro_batches`` 1 or 2; ``usd_per_chip_hour`` positive and finite, at most
    ``MAX_USD_PER_CHIP_HOUR``; the names are text and the flags booleans. NaN and infinity are refused
    everywhere. `dse evaluate`, ``dse.evaluate`` and ``evaluate_frame`` all check through here.
    """
    for name in TEXT_FIELDS:
        value = getattr(cfg, name)
        if not isinstance(value, str) and not (name in OPTIONAL_TEXT and value is None):
            raise InputError(f"{_option(name)}: must be a name (text), got {_shown(value)}")
    for name in FLAG_FIELDS:
        if not isinstance(getattr(cfg, name), bool):
            raise InputError(f"{_option(name)}: must be true or false, got {_shown(getattr(cfg, name))}")
    for name, low, high, what in WHOLE_FIELDS:
        value = getattr(cfg, name)
        if value is None and name in ("tp", "ep", "pp", "dp", "etp", "chips", "prompt", "output"):
            continue
        if isinstance(value, bool) or not isinstance(value, numbers.Integral) or not low <= value <= high:
            raise InputError(f"{_option(name)}: must be a whole number from {low:,} to {high:,} ({what}), "
                             f"got {_shown(value)}")
    if isinstance(cfg.micro_batches, bool) or cfg.micro_batches not in (1, 2):
        raise InputError(f"--micro-batches must be 1 (no overlap) or 2 (two-batch overlap), got "
                         f"{_shown(cfg.micro_batches)}")
    cached = _real(cfg.cached)
    if cached is None or not 0.0 <= cached < 1.0:
        raise InputError(f"--cached: must be a share in [0, 1) (of the prompt served from a prefix cache), "
                         f"got {_shown(cfg.cached)}")
    accept = _real(cfg.accept)
    if accept is None or not 1.0 <= accept <= cfg.draft + 1:
        raise InputError(f"--accept: must be a number from 1 to draft + 1 = {cfg.draft + 1} (mean tokens emitted "
                         f"per decode pass), got {_shown(cfg.accept)}")
    imbalance = _real(cfg.moe_imbalance)
    if imbalance is None or imbalance < 1.0:
        raise InputError(f"--moe-imbalance: must be a finite number >= 1 (the most-loaded expert-parallel group's "
                         f"routed tokens over the mean), got {_shown(cfg.moe_imbalance)}")
    if cfg.usd_per_chip_hour is not None:
        usd = _real(cfg.usd_per_chip_hour)
        if usd is None or not 0.0 < usd <= MAX_USD_PER_CHIP_HOUR:
            raise InputError(f"--usd-per-chip-hour: must be a positive finite number (USD per chip-hour) up to "
                             f"{MAX_USD_PER_CHIP_HOUR:,.0f}, got {_shown(cfg.usd_per_chip_hour)}")
    if cfg.output is not None and cfg.prompt is None:
        raise InputError("--output needs --prompt (the request's prompt tokens)")
    if cfg.arrival not in ARRIVALS:
        raise InputError(f"--arrival '{cfg.arrival}' is not allowed; allowed: {', '.join(ARRIVALS)}")
    if cfg.mem_fraction is not None:
        fraction = _real(cfg.mem_fraction)
        if fraction is None or not 0.0 < fraction <= 1.0:
            raise InputError(f"--mem-fraction: must be a share in (0, 1] (the framework's memory fraction), got "
                             f"{_shown(cfg.mem_fraction)}")


def _choice(name: str, value: str, allowed: tuple[str, ...]) -> int:
    if value not in allowed:
        raise InputError(f"--{name} '{value}' is not allowed; allowed: {', '.join(allowed)}")
    return allowed.index(value)


@dataclass(frozen=True)
class Resolved:
    """A configuration checked against the catalogs: its model, system, layout and codes."""

    model: Architecture
    system: System
    layout: Layout
    phase: int
    weights_dtype: int
    kv_dtype: int
    kv_tier: int
    experts_dtype: int
    beyond_trained_context: bool = False


def check_formats(system: System, weights: str, experts: str, kv: str, weight_only: bool) -> None:
    """A configuration computes only in formats the chip has tensor units for, unless weight-only
    quantization is chosen; its KV format must be one the chip's mainstream kernels support.
    """
    native = ", ".join(system.native_dtypes)
    for option, dtype in (("weights-dtype", weights), ("experts-dtype", experts)):
        if not system.is_native(dtype) and not weight_only:
            raise InputError(
                f"--{option} '{dtype}': '{system.id}' has no {dtype} tensor units; allowed: {native} "
                f"(or --weight-only to store {dtype} and compute in {system.compute_dtype(dtype)} with a "
                "dequantization cost)"
            )
    if kv not in system.kv_dtypes:
        raise InputError(f"--kv-dtype '{kv}': not a KV-cache format of '{system.id}' in mainstream kernels; "
                         f"allowed: {', '.join(system.kv_dtypes)}")


def resolve(cfg: Config) -> Resolved:
    """Check a configuration against the catalogs; raises InputError on bad names, layouts or values."""
    try:
        model = get_model(cfg.model)
    except InputError as exc:
        raise InputError(f"--model: {exc}") from None
    try:
        system = get_system(cfg.system)
    except InputError as exc:
        raise InputError(f"--system: {exc}") from None
    system = priced(system, check_price_kind(cfg.price_kind, "--price-kind"), cfg.usd_per_chip_hour)
    phase = _choice("phase", cfg.phase, PHASES)
    wd = _choice("weights-dtype", cfg.weights_dtype, DTYPES)
    experts = cfg.experts_dtype or cfg.weights_dtype
    ed = _choice("experts-dtype", experts, DTYPES)
    kd = _choice("kv-dtype", cfg.kv_dtype, DTYPES)
    check_formats(system, cfg.weights_dtype, experts, cfg.kv_dtype, cfg.weight_only)
    tier = _choice("kv-tier", cfg.kv_tier, KV_TIERS)
    _choice("kv-shard", cfg.kv_shard, KV_SHARDS)
    beyond = model.check_context(cfg.context, cfg.allow_beyond_trained_context, "--context")
    if cfg.prompt is not None:
        beyond |= model.check_context(cfg.prompt, cfg.allow_beyond_trained_context, "--prompt")
    layout: Layout = resolve_layout(model, cfg.tp, cfg.ep, cfg.pp, cfg.dp, cfg.etp, cfg.chips)
    if layout.chips > MAX_CHIPS:
        raise InputError(f"--tp, --dp, --ep, --etp, --pp, --chips: layout {layout.describe()} needs {layout.chips:,} "
                         f"chips; allowed: at most {MAX_CHIPS:,} chips per replica")
    if not model.is_moe and cfg.moe_imbalance != 1.0:
        raise InputError(f"--moe-imbalance: {model.id} is dense (no experts), so it must be 1, got "
                         f"{_shown(cfg.moe_imbalance)}")
    if cfg.moe_imbalance > layout.ep * (1 + 1e-9):  # the most-loaded group carries at most every routed token
        raise InputError(f"--moe-imbalance: must be from 1 to EP = {layout.ep} (the most-loaded of {layout.ep} "
                         f"expert-parallel groups carries at most every routed token), got {_shown(cfg.moe_imbalance)}")
    if tier == 1 and (math.isnan(system.host_memory_capacity) or math.isnan(system.host_offload_bandwidth)):
        raise InputError(
            f"--kv-tier host: the catalog has no host memory capacity and bandwidth for system '{system.id}'; "
            "use --kv-tier hbm"
        )
    if math.isnan(system.scaleout_bandwidth) and layout.chips > system.scaleup_domain:
        raise InputError(
            f"layout {layout.describe()} needs {layout.chips} chips, more than one {system.scaleup_domain}-chip "
            f"domain of '{system.id}', whose scale-out bandwidth the catalog does not know"
        )
    return Resolved(model, system, layout, phase, wd, kd, tier, ed, beyond)


def evaluate_config(cfg: Config, ideal: bool = False, efficiency: Efficiency | None = None) -> dict:
    """All metrics of one configuration; raises InputError on bad names, layouts or values."""
    step, request = evaluate_levels(cfg, ideal, efficiency)
    return step if request is None else request


def evaluate_levels(cfg: Config, ideal: bool = False, efficiency: Efficiency | None = None
                    ) -> tuple[dict, dict | None]:
    """`evaluate_config` of ``cfg`` as it is without ``output`` (the step level) and, where ``cfg`` has a prompt and
    an output, as it is with them (the request level; None otherwise): both from one evaluation of the step.
    """
    r = resolve(cfg)
    model, system, layout, phase = r.model, r.system, r.layout, r.phase
    wd, kd, tier = r.weights_dtype, r.kv_dtype, r.kv_tier
    try:
        fw = framework_for(system, cfg.framework)
    except InputError as exc:
        raise InputError(f"--framework: {exc}") from None
    memory = fw.with_fraction(cfg.mem_fraction)
    eff = IDEAL if ideal else with_memory(efficiency or efficiency_for(system.id), memory)
    cand = Candidates(
        model=0, system=0, tp=layout.tp, dp=layout.dp, ep=layout.ep, etp=layout.etp, pp=layout.pp,
        batch=cfg.batch, context=cfg.context, phase=phase, weights_dtype=wd, kv_dtype=kd, kv_tier=tier,
        imbalance=cfg.moe_imbalance, experts_dtype=r.experts_dtype, kv_shard=KV_SHARDS.index(cfg.kv_shard),
        micro_batches=cfg.micro_batches, chunk=cfg.chunk,
    )
    tables = ModelTable.build([model]), SystemTable.build([system], memory=[memory])
    # one gathering of the catalog columns: the step (its TTFT at a prefill of --context), the inputs of
    # `_kv_capacity`, and a prefill of the prompt where there is one
    first = cfg.prompt is not None and phase == 0
    raw, *kv_inputs = evaluate_at(cand, *tables, eff, [{"brief": False, "ttft": True}, *_kv_capacity_inputs(cfg),
                                                        *([{"batch": 1, "context": cfg.prompt, "phase": 1}] * first)])
    if first:
        raw["ttft_s"] = kv_inputs.pop()["step_s"]
    out: dict = {
        "model": model.id,
        "system": system.id,
        "phase": cfg.phase,
        "ideal": ideal,
        "tp": layout.tp,
        "dp": layout.dp,
        "ep": layout.ep,
        "etp": layout.etp,
        "pp": layout.pp,
        "racks": math.ceil(layout.chips / system.scaleup_domain),
        "batch": cfg.batch,
        "context": cfg.context,
        "prompt": cfg.prompt or cfg.context,
        "weights_dtype": cfg.weights_dtype,
        "kv_dtype": cfg.kv_dtype,
        "kv_tier": cfg.kv_tier,
        "kv_shard": cfg.kv_shard,
        "micro_batches": cfg.micro_batches,
        "compute_dtype": system.compute_dtype(cfg.weights_dtype),
        "experts_dtype": DTYPES[r.experts_dtype],
        "experts_compute_dtype": system.compute_dtype(DTYPES[r.experts_dtype]),
        "weight_only": cfg.weight_only,
        "attention_dtype": "fp8" if cfg.kv_dtype != "bf16" and system.is_native("fp8") else "bf16",
        "max_context": model.max_context,
        "beyond_trained_context": r.beyond_trained_context,
    }
    for key, value in raw.items():
        v = value.item()
        if key == "bound":
            out[key] = BOUNDS[int(v)]
        elif key == "fits":
            out[key] = bool(v)
        elif key in ("chips", "sequences_in_flight"):
            out[key] = int(v)
        else:
            out[key] = None if (isinstance(v, float) and math.isnan(v)) else (None if v == math.inf else float(v))
    # what weights, activations and KV may fill as the framework reserves HBM (never above the device)
    a_act, a_kv, budget = (float(x) for x in memory_budget(system.device_memory, eff, cfg.chunk, layout.tp, layout.pp,
                                                            model.is_moe))
    w, act = out["weights_bytes_per_chip"], out["activation_bytes_per_chip"]
    out["hbm_usable_per_chip"] = min(w + act + (budget - w - a_act * act) / a_kv, system.device_memory)
    out["kv_capacity_tokens"] = _kv_capacity(kv_inputs, w, (a_act, a_kv, budget))
    out["framework"] = "" if ideal else fw.id
    out["mem_fraction"] = None if ideal else (memory.fraction if not math.isnan(memory.fraction)
                                              else budget / system.device_memory)
    request = None
    if cfg.output is not None and cfg.prompt is not None:
        request = {**out, **request_metrics(cand, tables, eff, cfg, ENGINE_ONLY if ideal else stack_of(fw.id,
                                                                                                       model.id))}
        request["fits"] = request["fits"] and request["fits_request"]  # the step at --context and the request's peak
    return _completed(out, model, system, cfg, ideal), (None if request is None else
                                                        _completed(request, model, system, cfg, ideal))


def _completed(out: dict, model: Architecture, system: System, cfg: Config, ideal: bool) -> dict:
    """``out`` with the model's parameters, the chip's price and power, and every prediction's band."""
    out["params_total"] = model.params_total
    out["params_active"] = model.params_active
    out["params_embedding"] = model.params_embedding
    out["kv_bytes_per_token"] = model.kv_bytes_per_token(cfg.kv_dtype)
    out["hbm_capacity_per_chip"] = system.hbm_capacity
    out["device_memory_per_chip"] = system.device_memory
    out["usd_per_chip_hour"] = None if math.isnan(system.price_per_s) else system.price_per_s * 3600
    out["price_kind"] = system.price_kind
    out["price_is_estimate"] = system.price_is_estimate
    out["power_all_in_w_per_chip"] = None if math.isnan(system.power_all_in_w) else system.power_all_in_w
    # every prediction's band (`<key>_band`, None with --ideal or no stored fit): the out-of-sample errors of
    # `dse validate` for the system's family (`dse.catalog.calibration.bands_of`)
    out.update(band_keys(out, None if ideal else bands_of(system.id)))
    return out


KV_PROBE = (1024, 2048)
"""Contexts whose KV difference gives a sequence's KV bytes per token per chip (`_kv_capacity`)."""


def _kv_capacity_inputs(cfg: Config) -> list[dict]:
    """The inputs (`dse.physics.roofline.evaluate_at`) `_kv_capacity` reads: the profile run (a prefill of one
    chunk) and one sequence decoding at each of `KV_PROBE`'s contexts, its KV in HBM.
    """
    return [{"batch": 1, "context": cfg.chunk, "phase": 1, "kv_tier": 0},
            *({"batch": 1, "context": c, "phase": 0, "kv_tier": 0} for c in KV_PROBE)]


def _kv_capacity(evaluated: list[dict], weights: float, check: tuple[float, float, float]) -> int:
    """Tokens of KV one attention-DP rank's chips hold as the framework reserves HBM (what a framework logs as its
    KV cache size): the room its memory check (``check``: `memory_budget`'s a_act, a_kv and budget for the
    configuration) leaves beside the weights and the activations of its profile run (a prefill of one chunk), over a
    sequence's KV bytes per token per chip (read off two contexts). ``evaluated``: the configuration at
    `_kv_capacity_inputs`.
    """
    prof, *probes = evaluated
    kv = [p["kv_bytes_per_chip"].item() for p in probes]
    per_token = (kv[1] - kv[0]) / (KV_PROBE[1] - KV_PROBE[0])
    a_act, a_kv, budget = check
    room = (budget - weights - a_act * prof["activation_bytes_per_chip"].item()) / a_kv
    return max(int(room // per_token), 0) if per_token > 0 else 0


REQUEST_KEYS = (
    "serving", "ttft_s", "tpot_s", "tokens_per_s_per_gpu", "tokens_per_s_per_user", "usd_per_request",
    "usd_per_mtok_input", "usd_per_mtok_output", "usd_per_mtok_blended", "chips", "power_w", "price_kind",
)


def request_metrics(cand: Candidates, tables: tuple[ModelTable, SystemTable], eff: Efficiency, cfg: Config,
                    stack: Stack = ENGINE_ONLY) -> dict:
    """The request-level keys of an aggregated replica at concurrency ``cfg.batch`` (per micro-batch), through the
    serving ``stack``, under ``cfg.arrival``, with the quantiles of TTFT and TPOT (``ttft_p90_s``, ...).

    They replace the step-level ``tpot_s`` and ``ttft_s`` (the decode step alone stays in ``step_s``).
    """
    req = cfg.request(stack)
    r = aggregated(replace(cand, phase=0), *tables, req, eff)
    out: dict = {"serving": "aggregated", "price_kind": cfg.price_kind, "output": cfg.output, "chunk": cfg.chunk,
                 "arrival": req.arrival}
    quantiles = [f"{m}_{quantile_name(q)}_s" for q in req.quantiles for m in ("ttft", "tpot")]
    for key in (*REQUEST_KEYS[1:-1], "requests_per_s", "prefill_share", "decode_step_s", "chunk_extra_s",
                "prefill_service_s", "queue_wait_s", "stack_latency_s", *quantiles):
        out[key] = float(np.asarray(r[key]))
    out["chips"] = int(out["chips"])
    out["fits_request"] = bool(np.asarray(r["fits"]))  # memory at the request's peak context P + O
    out["hbm_bytes_per_chip_request"] = float(np.asarray(r["hbm_bytes_per_chip"]))
    out["prefill_keeps_up"] = bool(np.asarray(r["stable"]))
    return out


FRAME_COLUMNS = ("model", "system", "batch", "context")
"""Columns `evaluate_frame` needs; the other fields of ``Config`` are optional columns."""
INT_FIELDS = ("batch", "context", "tp", "ep", "pp", "dp", "etp", "chips", "prompt", "output", "chunk", "draft",
              "micro_batches")
"""Whole-number fields: a column pandas turned to floats (because of empty cells) is read back as integers."""


def evaluate_frame(frame, ideal: bool = False):
    """Metrics of every row of a DataFrame of configurations, in one vectorized evaluation.

    Columns are the fields of ``Config`` (``model``, ``system``, ``batch`` and ``context`` required);
    each row is checked as `dse evaluate` checks its options (an InputError names the row). The
    result has the input columns, the resolved layout (``tp``, ``dp``, ``ep``, ``etp``, ``pp``) and
    the physics' arrays (SI units; ``bound`` as a name, ``ttft_s`` from a prefill of ``prompt``).
    """
    import pandas as pd

    missing = [c for c in FRAME_COLUMNS if c not in frame.columns]
    if missing:
        raise InputError(f"evaluate_frame: missing column(s) {', '.join(missing)}; required: "
                         f"{', '.join(FRAME_COLUMNS)}, optional: the other fields of Config")
    fields = set(Config.__dataclass_fields__)
    extra = [c for c in frame.columns if c not in fields]
    if extra:
        raise InputError(f"evaluate_frame: unknown column(s) {', '.join(map(str, extra))}; allowed: "
                         f"{', '.join(Config.__dataclass_fields__)}")
    per_config = [c for c in ("framework", "mem_fraction", "arrival") if c in frame.columns]
    if per_config:
        raise InputError(f"evaluate_frame: column(s) {', '.join(per_config)} are evaluated one configuration at a "
                         "time (dse.evaluate); a frame reserves memory as each system's default framework does")
    rows, configs = [], []
    for i, rec in enumerate(frame.to_dict(orient="records")):
        clean = {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in rec.items()}
        clean = {k: (int(v) if k in INT_FIELDS and isinstance(v, (int, float, np.number)) and not isinstance(v, bool)
                     and float(v).is_integer() else v) for k, v in clean.items()}
        try:
            configs.append(Config(**{k: v for k, v in clean.items() if v is not None}))
            rows.append(resolve(configs[-1]))
        except InputError as exc:
            raise InputError(f"evaluate_frame: row {i}: {exc}") from None
    models = list(dict.fromkeys(r.model.id for r in rows))
    systems = list(dict.fromkeys(r.system.id for r in rows))
    by_id = {r.system.id: r.system for r in rows}  # priced as each row asked
    tables = (ModelTable.build([get_model(m) for m in models]), SystemTable.build([by_id[s] for s in systems]))
    batch = frame["batch"].to_numpy(dtype=float)
    cand = Candidates(
        model=np.array([models.index(r.model.id) for r in rows]),
        system=np.array([systems.index(r.system.id) for r in rows]),
        tp=np.array([r.layout.tp for r in rows]), dp=np.array([r.layout.dp for r in rows]),
        ep=np.array([r.layout.ep for r in rows]), etp=np.array([r.layout.etp for r in rows]),
        pp=np.array([r.layout.pp for r in rows]), batch=batch, context=frame["context"].to_numpy(dtype=float),
        phase=np.array([r.phase for r in rows]), weights_dtype=np.array([r.weights_dtype for r in rows]),
        kv_dtype=np.array([r.kv_dtype for r in rows]), kv_tier=np.array([r.kv_tier for r in rows]),
        experts_dtype=np.array([r.experts_dtype for r in rows]),
        kv_shard=np.array([KV_SHARDS.index(c.kv_shard) for c in configs]),
        micro_batches=np.array([c.micro_batches for c in configs]),
        chunk=np.array([c.chunk for c in configs], dtype=np.float64),
        imbalance=(frame["moe_imbalance"].fillna(1.0).to_numpy(dtype=float) if "moe_imbalance" in frame
                   else 1.0),
    )
    eff = IDEAL if ideal else None
    raw = evaluate(cand, *tables, eff)
    if "prompt" in frame:
        prompt = frame["prompt"].to_numpy(dtype=float)
        has = np.isfinite(prompt) & (cand.phase == 0)
        if has.any():
            first = replace(cand, batch=np.ones_like(batch), context=np.where(has, prompt, cand.context),
                            phase=np.ones_like(cand.phase))
            ttft = evaluate(first, *tables, eff, ttft=False)["step_s"]
            raw["ttft_s"] = np.where(has, ttft, raw["ttft_s"])
    out = frame.reset_index(drop=True).copy()
    for k in ("tp", "dp", "ep", "etp", "pp"):
        out[k] = [getattr(r.layout, k) for r in rows]
    out["price_kind"] = [r.system.price_kind for r in rows]
    out["price_is_estimate"] = [r.system.price_is_estimate for r in rows]
    out["beyond_trained_context"] = [r.beyond_trained_context for r in rows]
    for key, value in raw.items():
        out[key] = [BOUNDS[int(v)] for v in value] if key == "bound" else value
    return pd.DataFrame(out)
