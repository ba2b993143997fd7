"""Serving frameworks (vLLM, SGLang, TensorRT-LLM): the hardware each runs on, how each reserves HBM
(hw_catalog/frameworks.yaml), and what its serving stack adds to a request: a fixed latency and, under a closed
loop, a queue share, per deployment mode, fitted from measured runs (hw_catalog/calibration/serving_stack.yaml,
written by `dse validate --fit`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from functools import lru_cache
from pathlib import Path

from dse.catalog.hardware import System, hw_dir
from dse.catalog.loading import FieldSpec, Quantity, check_keys, parse_quantities, parse_sources, read_yaml
from dse.errors import InputError, unknown_name_message

MEMORY_RULES = ("total", "static", "free")
"""How a framework's memory fraction applies (the index is the code the physics uses): of the device's memory for
everything it holds (vLLM), of the device's memory for weights and KV cache (SGLang), of the memory left after
weights, activations and buffers for the KV cache (TensorRT-LLM)."""
MEMORY_FIELDS = {
    "fraction": FieldSpec("fraction", False, "the framework's memory fraction (its rule says of what)"),
    "reserve": FieldSpec("bytes", True, "memory the framework holds besides weights, KV cache and activations",
                         positive=False),
    "reserve_moe": FieldSpec("bytes", False, "the reserve when the model routes experts (a larger profile-run "
                             "peak); the reserve where not given", positive=False),
}
MODES = ("aggregated", "disaggregated")


@dataclass(frozen=True)
class StackTerms:
    """What a serving stack adds to a request in one deployment mode: its fixed latency outside the forward passes
    (HTTP, tokenization, scheduling, the first token's detokenization and streaming: tau, seconds, in every TTFT)
    and, under a closed loop, its queue share xi (the mean wait of a new prompt over the wait behind every other
    request in flight at its prefill server: `dse.physics.queueing`).
    """

    fixed_latency_s: float = 0.0
    queue_share: float = 0.0


@dataclass(frozen=True)
class Stack:
    """The serving framework a deployment runs and its terms per mode; the default, no framework, adds nothing
    (the engine alone).
    """

    framework: str = ""
    aggregated: StackTerms = StackTerms()
    disaggregated: StackTerms = StackTerms()
    families: tuple[tuple[str, str, StackTerms], ...] = ()
    """Terms per hardware family and mode where the fit has them (the same framework runs other kernels, a
    scheduler tuned for other chips and, disaggregated, a KV hand-off over the family's fabric with its transfer
    library): (family, mode, terms) triples."""

    def terms(self, mode: str) -> StackTerms:
        return self.aggregated if mode == "aggregated" else self.disaggregated

    def terms_of(self, mode: str, family: str | None) -> StackTerms:
        """The terms of a deployment in ``mode`` on ``family``: the family's own where the fit has them, else the
        mode's.
        """
        return next((t for f, m, t in self.families if f == family and m == mode), self.terms(mode))

    def aggregated_of(self, family: str | None) -> StackTerms:
        return self.terms_of("aggregated", family)

    def disaggregated_of(self, family: str | None) -> StackTerms:
        return self.terms_of("disaggregated", family)


ENGINE_ONLY = Stack()
"""No serving stack: the engine alone (the pure roofline's request, and a request no study framework serves)."""


ADMISSION = ("prompt", "completion")
"""What a framework's scheduler reserves KV for when it admits a request: ``prompt`` (the tokens the sequence holds
now; running sequences grow into the pool and are preempted when it runs out: vLLM, SGLang), so the pool holds the
sequences at their mean context, P + O / 2; ``completion`` (the prompt and every output token up front, never
evicting: TensorRT-LLM's GUARANTEED_NO_EVICT), so it holds them at P + O."""


@dataclass(frozen=True)
class Memory:
    """How a framework reserves HBM: its rule (`MEMORY_RULES`), its fraction (NaN: SGLang's default, computed
    from the deployment) and the bytes it holds besides weights, KV cache and activations.
    """

    rule: str = "total"
    fraction: float = 1.0
    reserve: float = 0.0
    reserve_moe: float = math.nan  # the reserve of a mixture-of-experts model (``reserve`` where NaN)

    def __post_init__(self) -> None:
        if math.isnan(self.reserve_moe):
            object.__setattr__(self, "reserve_moe", self.reserve)

    @property
    def rule_code(self) -> int:
        return MEMORY_RULES.index(self.rule)


WHOLE_HBM = Memory()
"""Every byte of HBM for weights, KV cache and activations: the pure roofline's memory (`--ideal`)."""


@dataclass(frozen=True)
class Framework:
    id: str
    name: str
    version: str
    vendors: tuple[str, ...]
    memory: Memory
    quantities: dict[str, Quantity] = field(repr=False, compare=False, default_factory=dict)
    admission: str = "prompt"
    """What its scheduler holds KV for when it admits a request (`ADMISSION`)."""

    def runs_on(self, system: System) -> bool:
        return system.vendor in self.vendors

    def with_fraction(self, fraction: float | None) -> Memory:
        """The framework's memory at ``fraction`` (its default when None)."""
        if fraction is None:
            return self.memory
        return replace(self.memory, fraction=float(fraction))


def _framework_from(fid: str, entry: object, sources: dict, where: str) -> Framework:
    if not isinstance(entry, dict):
        raise InputError(f"{where}: expected a mapping with name, version, vendors and memory")
    check_keys(entry, ("name", "version", "vendors", "memory", "admission"), where)
    for key in ("name", "version", "vendors", "memory"):
        if not entry.get(key):
            raise InputError(f"{where}: missing required field '{key}'")
    vendors = entry["vendors"]
    if not isinstance(vendors, list) or not all(isinstance(v, str) for v in vendors):
        raise InputError(f"{where}: field 'vendors': expected a list of vendor names")
    mem = entry["memory"]
    if not isinstance(mem, dict):
        raise InputError(f"{where}: field 'memory': expected a mapping with rule, fraction and reserve")
    check_keys(mem, ("rule", *MEMORY_FIELDS), f"{where}: field 'memory'")
    if mem.get("rule") not in MEMORY_RULES:
        raise InputError(f"{where}: field 'memory.rule': {mem.get('rule')!r}; allowed: {', '.join(MEMORY_RULES)}")
    q = parse_quantities(mem, MEMORY_FIELDS, sources, f"{where}: field 'memory'")
    if mem["rule"] != "static" and "fraction" not in q:
        raise InputError(f"{where}: field 'memory.fraction': required for rule '{mem['rule']}'")
    fraction = q["fraction"].si if "fraction" in q else math.nan
    if not (math.isnan(fraction) or 0 < fraction <= 1):
        raise InputError(f"{where}: field 'memory.fraction': must be in (0, 1], got {fraction}")
    adm = entry.get("admission")
    if not isinstance(adm, dict) or adm.get("value") not in ADMISSION:
        raise InputError(f"{where}: field 'admission': expected a mapping with value ({', '.join(ADMISSION)}), "
                         f"source and date; got {adm!r}")
    if adm.get("source") not in sources or not adm.get("date"):
        raise InputError(f"{where}: field 'admission': needs a source of the file's sources and a date")
    admission = str(adm["value"])
    return Framework(fid, str(entry["name"]), str(entry["version"]), tuple(vendors),
                     Memory(mem["rule"], fraction, q["reserve"].si,
                            q["reserve_moe"].si if "reserve_moe" in q else math.nan), q, admission)


def load_frameworks(path: Path | None = None) -> tuple[dict[str, Framework], dict[str, str]]:
    """The frameworks of hw_catalog/frameworks.yaml and the default framework per hardware vendor."""
    path = Path(path) if path else hw_dir() / "frameworks.yaml"
    doc = read_yaml(path)
    if not isinstance(doc, dict) or not isinstance(doc.get("frameworks"), dict):
        raise InputError(f"{path}: expected a mapping with 'sources', 'frameworks' and 'defaults'")
    check_keys(doc, ("sources", "frameworks", "defaults"), str(path))
    sources = parse_sources(doc, path)
    out = {fid: _framework_from(str(fid), e, sources, f"{path}: frameworks.{fid}")
           for fid, e in doc["frameworks"].items()}
    defaults = doc.get("defaults") or {}
    if not isinstance(defaults, dict):
        raise InputError(f"{path}: field 'defaults': expected a mapping of vendor -> framework")
    for vendor, fid in defaults.items():
        if fid not in out:
            raise InputError(f"{path}: field 'defaults.{vendor}': " + unknown_name_message("framework", fid, out))
        if vendor not in out[fid].vendors:
            raise InputError(f"{path}: field 'defaults.{vendor}': {fid} does not run on {vendor} hardware")
    return out, {str(k): str(v) for k, v in defaults.items()}


@lru_cache(maxsize=4)
def _frameworks(folder: str) -> tuple[dict[str, Framework], dict[str, str]]:
    return load_frameworks(Path(folder) / "frameworks.yaml")


def default_frameworks() -> dict[str, Framework]:
    """The catalog's frameworks, loaded once per catalog folder."""
    return _frameworks(str(hw_dir()))[0]


def get_framework(fid: str) -> Framework:
    """A framework by id; an unknown id names the close ones."""
    fws = default_frameworks()
    if fid not in fws:
        raise InputError(unknown_name_message("framework", fid, fws))
    return fws[fid]


def framework_for(system: System, framework: str | None = None) -> Framework:
    """The framework a deployment on ``system`` runs: ``framework``, else the catalog's default for the system's
    vendor (vLLM where the catalog names none). InputError where the framework does not run on the system.
    """
    fws, defaults = _frameworks(str(hw_dir()))
    fid = framework or defaults.get(system.vendor, "vllm")
    fw = get_framework(fid)
    if not fw.runs_on(system):
        raise InputError(f"framework {fid} ({fw.name}) does not run on {system.id} ({system.vendor} hardware); it runs "
                         f"on {', '.join(fw.vendors)} hardware")
    return fw


# ---- the serving stack's fitted terms ---------------------------------------------------------------------------
STACK_FILE = "serving_stack.yaml"


def stack_path() -> Path:
    return hw_dir() / "calibration" / STACK_FILE


def _stack_terms(modes: object, at: str) -> dict[str, StackTerms]:
    """The terms per mode of one mapping ``mode -> {fixed_latency_s, queue_share, ...}`` (``models`` aside)."""
    if not isinstance(modes, dict):
        raise InputError(f"{at}: expected a mapping of mode -> terms")
    check_keys(modes, (*MODES, "models", "families"), at)
    terms = {}
    for mode, t in modes.items():
        if mode in ("models", "families"):
            continue
        where = f"{at}.{mode}"
        if not isinstance(t, dict):
            raise InputError(f"{where}: expected a mapping with fixed_latency_s and queue_share")
        vals = {}
        for key in ("fixed_latency_s", "queue_share"):
            v = t.get(key)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
                raise InputError(f"{where}.{key}: expected a number >= 0, got {v!r}")
            vals[key] = float(v)
        terms[mode] = StackTerms(**vals)
    return terms


def load_stack_file(path: Path | None = None) -> dict[str, Stack]:
    """The fitted terms per framework and mode, keyed by framework, and per framework, model and mode where the
    file has a model's own (``models``), keyed ``framework|model`` (a mode the model has no terms of takes the
    framework's); an empty mapping where no fit is stored. A malformed file is an InputError naming the field.
    """
    path = Path(path) if path else stack_path()
    if not path.exists():
        return {}
    doc = read_yaml(path)
    if not isinstance(doc, dict) or not isinstance(doc.get("stack"), dict):
        raise InputError(f"{path}: expected a mapping with 'stack': framework -> mode -> "
                         "{fixed_latency_s, queue_share}")
    out = {}
    for fid, modes in doc["stack"].items():
        at = f"{path}: field 'stack.{fid}'"
        terms = _stack_terms(modes, at)
        agg = terms.get("aggregated") or terms.get("disaggregated") or StackTerms()
        on_family = _family_terms(modes.get("families"), at)  # the framework's on a family, all its models
        out[str(fid)] = own = Stack(str(fid), agg, terms.get("disaggregated", agg), tuple(sorted(on_family)))
        models = modes.get("models") or {}
        if not isinstance(models, dict):
            raise InputError(f"{at}.models: expected a mapping of model id -> mode -> terms")
        for mid, m_modes in models.items():
            m_at = f"{at}.models.{mid}"
            m_terms = _stack_terms(m_modes, m_at)
            # a mode the model has terms of takes its own on a family, else its own; a mode it has none of takes
            # the framework's on the family, else the framework's
            per_family = _family_terms(m_modes.get("families"), m_at)
            per_family += [f for f in on_family if f[1] not in m_terms]
            out[f"{fid}|{mid}"] = Stack(str(fid), m_terms.get("aggregated", own.aggregated),
                                        m_terms.get("disaggregated", own.disaggregated), tuple(sorted(per_family)))
    return out


def _family_terms(fams: object, at: str) -> list[tuple[str, str, StackTerms]]:
    """(family, mode, terms) of a ``families`` mapping (hardware family -> mode -> terms) at ``at``."""
    if fams is None:
        return []
    if not isinstance(fams, dict):
        raise InputError(f"{at}.families: expected a mapping of hardware family -> mode -> terms")
    out = []
    for fam, f_modes in fams.items():
        f_at = f"{at}.families.{fam}"
        if not isinstance(f_modes, dict) or not f_modes or not set(f_modes) <= set(MODES):
            got = ", ".join(map(str, f_modes)) if isinstance(f_modes, dict) and f_modes else repr(f_modes)
            raise InputError(f"{f_at}: expected a mapping of {' and/or '.join(MODES)} -> terms (a family's own "
                             f"terms are a mode's), got {got}")
        out += [(str(fam), mode, t) for mode, t in _stack_terms(f_modes, f_at).items()]
    return out


@lru_cache(maxsize=4)
def _stacks(folder: str) -> dict[str, Stack]:
    return load_stack_file(Path(folder) / "calibration" / STACK_FILE)


def stack_of(framework: str, model: str | None = None) -> Stack:
    """The fitted serving-stack terms of a framework serving ``model``: the model's own where the fit has them (a
    model measured in enough sweeps on that framework), else the framework's (a mode the fit has no runs of takes
    the other mode's); the framework with nothing added where no fit is stored for it.
    """
    stacks = _stacks(str(hw_dir()))
    own = stacks.get(f"{framework}|{model}") if model else None
    return own or stacks.get(framework, Stack(framework))


def clear_cache() -> None:
    """Forget the frameworks and the stored stack fit read so far (after `dse validate --fit` writes a new one)."""
    _frameworks.cache_clear()
    _stacks.cache_clear()
