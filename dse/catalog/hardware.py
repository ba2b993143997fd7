"""The hardware catalog: accelerator systems, memory tiers and efficiency factors, in SI units."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field, replace
from functools import lru_cache
from pathlib import Path

from dse.catalog.loading import (
    FieldSpec,
    Quantity,
    check_keys,
    parse_quantities,
    parse_quantity,
    parse_sources,
    read_yaml,
)
from dse.catalog.price_kinds import DEFAULT_PRICE_KIND, PRICE_KINDS  # re-exported
from dse.catalog.units import DTYPES, INTEGER_DTYPES
from dse.errors import InputError, unknown_name_message

HW_DIR = Path(__file__).resolve().parents[2] / "hw_catalog"


def hw_dir() -> Path:
    """The hardware catalog folder: ``$DSE_HW_CATALOG`` if set, else the embedded one."""
    return Path(os.environ.get("DSE_HW_CATALOG") or HW_DIR)

SYSTEM_FIELDS: dict[str, FieldSpec] = {
    "flops_bf16": FieldSpec("flop_rate", True, "dense BF16 tensor FLOP/s per chip"),
    "flops_fp8": FieldSpec("flop_rate", False, "dense FP8 tensor FLOP/s per chip"),
    "flops_fp4": FieldSpec("flop_rate", False, "dense FP4 tensor FLOP/s per chip"),
    "flops_int8": FieldSpec("flop_rate", False, "dense INT8 tensor operations per second per chip"),
    "hbm_capacity": FieldSpec("bytes", True, "HBM capacity per chip"),
    "device_memory": FieldSpec("bytes", False, "memory the device reports to CUDA per chip (nvidia-smi's total, what "
                               "a serving framework's memory fraction is of); the HBM capacity where not given"),
    "hbm_bandwidth": FieldSpec("byte_rate", True, "HBM bandwidth per chip"),
    "scaleup_domain": FieldSpec("count", True, "chips in one scale-up (NVLink/ICI) domain"),
    "chips_per_node": FieldSpec("count", False, "chips in one host (a server, or a compute tray of a rack-scale "
                                "system): the unit a serving framework starts its processes on"),
    "scaleup_bandwidth": FieldSpec("byte_rate", True, "scale-up bandwidth per chip, one direction"),
    "scaleout_bandwidth": FieldSpec("byte_rate", False, "scale-out bandwidth per chip, one direction"),
    "host_memory_capacity": FieldSpec("bytes", False, "host DRAM/LPDDR per chip"),
    "host_memory_bandwidth": FieldSpec("byte_rate", False, "host DRAM bandwidth per chip"),
    "host_link_bandwidth": FieldSpec("byte_rate", False, "chip-to-host link bandwidth per chip, one direction"),
    "nvme_capacity": FieldSpec("bytes", False, "local NVMe flash per chip"),
    "power": FieldSpec("power", False, "chip power (TDP)"),
    "power_all_in": FieldSpec("power", False, "facility power per chip incl. its share of host, network, cooling"),
}
PRICE_SPEC = FieldSpec("usd_rate", True, "price per chip-hour")
STATUSES = ("shipping", "announced")
SYSTEM_KEYS = ("id", "name", "vendor", "scaleup_topology", "status", "kv_dtypes", "prices", *SYSTEM_FIELDS)
TOPOLOGIES = ("switch", "mesh", "torus2d", "torus3d")

TIER_FIELDS: dict[str, FieldSpec] = {
    "device_capacity": FieldSpec("bytes", False, "capacity of one device"),
    "device_bandwidth": FieldSpec("byte_rate", False, "read bandwidth of one device"),
    "price": FieldSpec("usd_per_byte_s", True, "storage price per byte-second", positive=False),
}
TIER_IDS = ("hbm", "host_dram", "nvme", "hdd")

EFFICIENCY_FIELDS: dict[str, FieldSpec] = {
    "compute_prefill": FieldSpec("fraction", True, "achieved fraction of peak FLOP/s in prefill"),
    "compute_decode": FieldSpec("fraction", True, "achieved fraction of peak FLOP/s in decode"),
    "memory": FieldSpec("fraction", True, "achieved fraction of HBM (and host link) bandwidth"),
    "link": FieldSpec("fraction", True, "achieved fraction of scale-up and scale-out bandwidth"),
    "overlap": FieldSpec("fraction", True, "share of the shorter of compute/memory and communication hidden", False),
    "hbm_usable": FieldSpec("fraction", True, "share of HBM the batch of a published offline benchmark fills (its "
                            "memory settings unstated); a deployment reserves HBM as its framework does"),
    "latency_scaleup": FieldSpec("time", True, "fixed latency of one collective inside a scale-up domain", False),
    "latency_scaleout": FieldSpec("time", True, "fixed latency of one collective over the scale-out network", False),
    "layer_overhead": FieldSpec("time", True, "fixed time per layer per forward pass (kernels, syncs)", False),
    "moe_layer_overhead": FieldSpec("time", False, "fixed time an MoE layer adds per forward pass (router top-k, "
                                    "token permutation and un-permutation, grouped-GEMM launch)", False),
    "gemm_half_rows": FieldSpec("count", False, "rows at which a GEMM reaches half its asymptotic FLOP rate (each "
                                "weight matrix multiplied costs this many rows of compute beyond its own)", False),
    "attention_half_context": FieldSpec("count", False, "KV tokens at which decode attention reaches half its "
                                        "asymptotic bandwidth (each sequence's attention per layer reads this "
                                        "many tokens of KV beyond its own)", False),
    "kernel_overlap": FieldSpec("fraction", False, "share of a pass costed as one roofline, max(compute, memory) "
                                "over the whole pass (1); the rest as the sum of its kernel groups' rooflines, "
                                "the weight GEMMs' and attention's, which run one after the other (0)", False),
}
FRACTIONS = tuple(k for k, v in EFFICIENCY_FIELDS.items() if v.dimension == "fraction")
CURVES = ("gemm_half_rows", "attention_half_context")
"""Half-performance lengths (Hockney's n_1/2): a kernel doing n units of work at asymptotic rate r takes
(n + n_1/2) / r, so it reaches half of r at n = n_1/2. They turn one efficiency factor into a curve over the
kernel's size: a GEMM's rows (tokens, or tokens per expert), decode attention's context."""


@dataclass(frozen=True)
class System:
    """One accelerator system in SI units; optional figures that are not known are NaN."""

    id: str
    name: str
    vendor: str
    topology: str
    flops: dict[str, float]
    hbm_capacity: float
    hbm_bandwidth: float
    scaleup_domain: int
    scaleup_bandwidth: float
    scaleout_bandwidth: float
    host_memory_capacity: float
    host_offload_bandwidth: float
    nvme_capacity: float
    power: float
    price_per_s: float
    quantities: dict[str, Quantity] = field(repr=False, compare=False)
    prices: dict[str, Quantity] = field(default_factory=dict, repr=False, compare=False)
    price_kind: str = ""
    price_is_estimate: bool = False
    power_all_in_w: float = math.nan
    status: str = "shipping"
    kv_dtypes: tuple[str, ...] = ("bf16",)
    kv_fp8: str = "e4m3fn"
    """The encoding of its FP8 KV cache (`FP8_ENCODINGS`): a KV cache crosses between two pools without conversion
    only where both hold it in the same one."""
    device_memory: float = math.nan
    """Memory the device reports (`SYSTEM_FIELDS`): what memory checks hold weights, KV and activations within (as
    frameworks reserve it); the nominal ``hbm_capacity`` (of the lecture's drain time) where the catalog has none."""

    def __post_init__(self) -> None:
        if math.isnan(self.device_memory):
            object.__setattr__(self, "device_memory", self.hbm_capacity)

    @property
    def native_dtypes(self) -> tuple[str, ...]:
        """Formats the chip has tensor units for (those with a FLOP/s figure), narrowest last."""
        return tuple(d for d in DTYPES if d in self.flops)

    def is_native(self, dtype: str) -> bool:
        """Whether the chip computes in ``dtype`` (has tensor units for it)."""
        return dtype in self.flops

    def compute_dtype(self, dtype: str) -> str:
        """The narrowest format the chip computes in that is at least as wide as ``dtype``: ``dtype``
        itself when native, else the format weight-only quantization dequantizes to (BF16 for an integer
        format, `INTEGER_DTYPES`).
        """
        if dtype in self.flops:
            return dtype
        if dtype in INTEGER_DTYPES:
            return "bf16"
        order = DTYPES[DTYPES.index(dtype):: -1]  # e.g. fp4 -> (fp4, fp8, bf16)
        for d in order:
            if d in self.flops:
                return d
        return "bf16"

    @property
    def announced(self) -> bool:
        return self.status == "announced"

    @property
    def chips_per_node(self) -> int | None:
        """Chips in one host (server or compute tray), or None where the catalog has no sourced figure."""
        q = self.quantities.get("chips_per_node")
        return None if q is None else int(q.si)

    @property
    def hbm_drain_s(self) -> float:
        """Time to read the whole HBM once: capacity / bandwidth."""
        return self.hbm_capacity / self.hbm_bandwidth

    def scaled(self, **factors: float) -> System:
        """A copy with named SI fields multiplied (for sensitivity sweeps and property tests)."""
        changes = {}
        for name, f in factors.items():
            if name == "flops":
                changes["flops"] = {d: v * f for d, v in self.flops.items()}
            elif name == "scaleup_domain":  # a whole number of chips
                changes[name] = max(1, int(round(self.scaleup_domain * f)))
            elif name == "hbm_capacity":  # the HBM and the memory the device reports of it, together
                changes[name], changes["device_memory"] = self.hbm_capacity * f, self.device_memory * f
            else:
                changes[name] = getattr(self, name) * f
        return replace(self, **changes)


@dataclass(frozen=True)
class MemoryTier:
    """A tier where cached KV can live, with per-device figures and price per byte-second."""

    id: str
    name: str
    device_capacity: float
    device_bandwidth: float
    price_per_byte_s: float
    quantities: dict[str, Quantity] = field(repr=False, compare=False)


@dataclass(frozen=True)
class Efficiency:
    """Achieved fractions of peak, fixed latencies and half-performance lengths (`CURVES`); under ``--ideal``
    every fraction is 1 (full overlap, no HBM reserve, a pass as one roofline: ``kernel_overlap`` 1), every latency
    and length 0: the pure roofline.

    ``mem_rule``, ``mem_fraction``, ``mem_reserve`` and ``mem_reserve_moe`` are the serving framework's memory
    reservation (`dse.catalog.frameworks.Memory`: its rule's code in `MEMORY_RULES`, its fraction, NaN for SGLang's
    computed default, and the bytes it holds besides weights, KV cache and activations, for a dense model and for
    one that routes experts), which the memory check applies
    (`dse.physics.roofline.memory_budget`); not fitted, set from the deployment's framework (the defaults: every
    byte of HBM, as ``--ideal`` has it).
    """

    compute_prefill: float = 1.0
    compute_decode: float = 1.0
    memory: float = 1.0
    link: float = 1.0
    overlap: float = 1.0
    hbm_usable: float = 1.0
    mem_rule: float = 0.0
    mem_fraction: float = 1.0
    mem_reserve: float = 0.0
    mem_reserve_moe: float = 0.0
    latency_scaleup: float = 0.0
    latency_scaleout: float = 0.0
    layer_overhead: float = 0.0
    moe_layer_overhead: float = 0.0
    gemm_half_rows: float = 0.0
    attention_half_context: float = 0.0
    kernel_overlap: float = 1.0


IDEAL = Efficiency()
MEMORY_FIELDS = ("mem_rule", "mem_fraction", "mem_reserve", "mem_reserve_moe")
"""The fields of `Efficiency` a deployment's serving framework sets (its memory reservation): not fitted."""


def _nan(q: dict[str, Quantity], name: str) -> float:
    return q[name].si if name in q else math.nan


def _prices(raw: object, sources: dict, where: str) -> dict[str, Quantity]:
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise InputError(f"{where}: field 'prices': expected a mapping of kind -> {{value, unit, source, date}}; "
                         f"kinds: {', '.join(PRICE_KINDS)}")
    out = {}
    for kind, q in raw.items():
        if kind not in PRICE_KINDS:
            raise InputError(f"{where}: field 'prices.{kind}': unknown price kind; allowed: {', '.join(PRICE_KINDS)}")
        out[kind] = parse_quantity(q, PRICE_SPEC, sources, f"{where}: field 'prices.{kind}'")
    return out


KV_FORMATS = tuple(d for d in DTYPES if d not in INTEGER_DTYPES)
"""Formats a KV cache can be held in: the floating-point ones (attention reads it at a floating-point rate)."""


FP8_ENCODINGS = ("e4m3fn", "e4m3fnuz")
"""FP8 encodings of a KV cache: the OCP E4M3 (NVIDIA Hopper and later, AMD CDNA4) and the FNUZ variant of AMD CDNA3,
whose bit patterns differ (no negative zero, another exponent bias)."""


def _kv_fp8(raw: object, where: str) -> str:
    """The ``fp8`` key of a system's ``kv_dtypes`` (default the OCP encoding)."""
    enc = raw.get("fp8", FP8_ENCODINGS[0]) if isinstance(raw, dict) else FP8_ENCODINGS[0]
    if enc not in FP8_ENCODINGS:
        raise InputError(f"{where}: field 'kv_dtypes.fp8': '{enc}' is not one of {', '.join(FP8_ENCODINGS)}")
    return enc


def _kv_dtypes(raw: object, sources: dict, where: str) -> tuple[str, ...]:
    at = f"{where}: field 'kv_dtypes'"
    if not isinstance(raw, dict) or not isinstance(raw.get("values"), list):
        raise InputError(f"{at}: expected {{values: [{', '.join(KV_FORMATS)}...], source, date}}")
    check_keys(raw, ("values", "fp8", "source", "date", "note", "estimate"), at)
    if raw.get("source") not in sources or not raw.get("date"):
        raise InputError(f"{at}: needs a declared source and a date")
    bad = [v for v in raw["values"] if v not in KV_FORMATS]
    if bad or not raw["values"]:
        raise InputError(f"{at}: {bad or 'empty'}; allowed: {', '.join(KV_FORMATS)}")
    return tuple(d for d in KV_FORMATS if d in raw["values"])


def _system_from(entry: dict, sources: dict, where: str) -> System:
    check_keys(entry, SYSTEM_KEYS, where)
    status = entry.get("status", "shipping")
    if status not in STATUSES:
        raise InputError(f"{where}: field 'status': '{status}' is not one of {', '.join(STATUSES)}")
    for key in ("id", "name", "vendor", "scaleup_topology"):
        if not entry.get(key):
            raise InputError(f"{where}: missing required field '{key}'")
    topo = entry["scaleup_topology"]
    if topo not in TOPOLOGIES:
        raise InputError(f"{where}: field 'scaleup_topology': '{topo}' is not one of {', '.join(TOPOLOGIES)}")
    q = parse_quantities(entry, SYSTEM_FIELDS, sources, where)
    domain = q["scaleup_domain"].si
    if domain != int(domain):
        raise InputError(f"{where}: field 'scaleup_domain': must be a whole number of chips, got {domain}")
    host_bw = min(_nan(q, "host_link_bandwidth"), _nan(q, "host_memory_bandwidth"), key=lambda v: (math.isnan(v), v))
    return System(
        id=str(entry["id"]),
        name=str(entry["name"]),
        vendor=str(entry["vendor"]),
        topology=topo,
        flops={d: q[f"flops_{d}"].si for d in DTYPES if f"flops_{d}" in q},
        hbm_capacity=q["hbm_capacity"].si,
        device_memory=_nan(q, "device_memory"),
        hbm_bandwidth=q["hbm_bandwidth"].si,
        scaleup_domain=int(domain),
        scaleup_bandwidth=q["scaleup_bandwidth"].si,
        scaleout_bandwidth=_nan(q, "scaleout_bandwidth"),
        host_memory_capacity=_nan(q, "host_memory_capacity"),
        host_offload_bandwidth=host_bw,
        nvme_capacity=_nan(q, "nvme_capacity"),
        power=_nan(q, "power"),
        price_per_s=math.nan,
        quantities=q,
        prices=_prices(entry.get("prices"), sources, where),
        power_all_in_w=_nan(q, "power_all_in"),
        status=status,
        kv_dtypes=_kv_dtypes(entry.get("kv_dtypes"), sources, where),
        kv_fp8=_kv_fp8(entry.get("kv_dtypes"), where),
    )


def _entries(doc: object, key: str, path: Path) -> list:
    if not isinstance(doc, dict) or not isinstance(doc.get(key), list):
        raise InputError(f"{path}: expected a top-level '{key}:' list")
    return doc[key]


def load_systems(path: Path | None = None) -> dict[str, System]:
    """Load and validate ``systems.yaml``; every error names the file, the row and the field."""
    path = Path(path) if path else hw_dir() / "systems.yaml"
    doc = read_yaml(path)
    entries = _entries(doc, "systems", path)
    check_keys(doc, ("sources", "systems"), str(path))
    sources = parse_sources(doc, path)
    systems: dict[str, System] = {}
    for i, entry in enumerate(entries):
        ident = entry.get("id", "?") if isinstance(entry, dict) else "?"
        where = f"{path}: systems[{i}] (id '{ident}')"
        if not isinstance(entry, dict):
            raise InputError(f"{where}: expected a mapping")
        system = _system_from(entry, sources, where)
        if system.id in systems:
            raise InputError(f"{where}: duplicate id '{system.id}'")
        systems[system.id] = system
    return systems


def load_memory_tiers(path: Path | None = None) -> dict[str, MemoryTier]:
    """Load ``memory_tiers.yaml``: HBM, host DRAM, NVMe flash and HDD."""
    path = Path(path) if path else hw_dir() / "memory_tiers.yaml"
    doc = read_yaml(path)
    entries = _entries(doc, "tiers", path)
    sources = parse_sources(doc, path)
    tiers: dict[str, MemoryTier] = {}
    for i, entry in enumerate(entries):
        where = f"{path}: tiers[{i}] (id '{entry.get('id', '?')}')"
        check_keys(entry, ("id", "name", *TIER_FIELDS), where)
        if entry.get("id") not in TIER_IDS:
            raise InputError(f"{where}: field 'id': must be one of {', '.join(TIER_IDS)}")
        if entry["id"] in tiers:
            raise InputError(f"{where}: duplicate id '{entry['id']}'")
        q = parse_quantities(entry, TIER_FIELDS, sources, where)
        tiers[entry["id"]] = MemoryTier(
            id=entry["id"],
            name=str(entry.get("name", "")),
            device_capacity=_nan(q, "device_capacity"),
            device_bandwidth=_nan(q, "device_bandwidth"),
            price_per_byte_s=q["price"].si,
            quantities=q,
        )
    return tiers


@dataclass(frozen=True)
class EfficiencyCatalog:
    """Global efficiency factors and, per hardware family, the fitted ones that replace them."""

    default: Efficiency
    families: dict[str, Efficiency]
    members: dict[str, str]  # system id -> family (the one place families are defined: efficiency.yaml)
    basis: dict[str, str] = field(default_factory=dict)  # family -> why its systems share one set of factors

    def for_system(self, system_id: str) -> Efficiency:
        family = self.members.get(system_id)
        return self.families[family] if family else self.default


def _factors(raw: object, sources: dict, where: str, base: dict | None = None) -> dict[str, Quantity]:
    if not isinstance(raw, dict):
        raise InputError(f"{where}: expected a mapping of factor -> {{value, unit, source, date}}")
    check_keys(raw, tuple(EFFICIENCY_FIELDS), where)
    specs = EFFICIENCY_FIELDS if base is None else {
        k: FieldSpec(v.dimension, False, v.description, v.positive) for k, v in EFFICIENCY_FIELDS.items()
    }
    q = parse_quantities(raw, specs, sources, where)
    for name, quantity in q.items():
        if name in FRACTIONS and quantity.si > 1:
            raise InputError(f"{where}: field '{name}': a fraction must lie in (0, 1], got {quantity.value}")
    return q


def load_efficiency_catalog(path: Path | None = None) -> EfficiencyCatalog:
    """Load the efficiency factors: ``factors`` (every system) and ``families`` (fitted per family)."""
    path = Path(path) if path else hw_dir() / "efficiency.yaml"
    doc = read_yaml(path)
    sources = parse_sources(doc, path)
    if not isinstance(doc, dict) or not isinstance(doc.get("factors"), dict):
        raise InputError(f"{path}: expected a top-level 'factors:' mapping")
    check_keys(doc, ("sources", "factors", "families"), str(path))
    base = _factors(doc["factors"], sources, f"{path}: factors")
    default = Efficiency(**{name: quantity.si for name, quantity in base.items()})
    families: dict[str, Efficiency] = {}
    members: dict[str, str] = {}
    basis: dict[str, str] = {}
    for fam, entry in (doc.get("families") or {}).items():
        where = f"{path}: families.{fam}"
        if not isinstance(entry, dict):
            raise InputError(f"{where}: expected a mapping with systems and factors")
        check_keys(entry, ("systems", "basis", "factors"), where)
        if not isinstance(entry.get("basis", ""), str):
            raise InputError(f"{where}: field 'basis': expected a sentence saying why these systems share factors")
        basis[fam] = entry.get("basis", "")
        systems = entry.get("systems") or []
        if not isinstance(systems, list) or not systems:
            raise InputError(f"{where}: field 'systems': must list at least one system id")
        for sid in systems:
            if sid in members:
                raise InputError(f"{where}: system '{sid}' is already in family '{members[sid]}'")
            members[sid] = fam
        q = _factors(entry.get("factors") or {}, sources, f"{where}.factors", base=base)
        families[fam] = replace(default, **{name: quantity.si for name, quantity in q.items()})
    return EfficiencyCatalog(default, families, members, basis)


def load_efficiency(path: Path | None = None) -> Efficiency:
    """The global efficiency factors; each fraction must lie in (0, 1]."""
    return load_efficiency_catalog(path).default


def check_price_kind(kind: str, where: str = "price kind") -> str:
    """``kind`` if it is a known price kind; else an InputError naming the allowed ones."""
    if kind not in PRICE_KINDS:
        raise InputError(f"{where}: '{kind}' is not a price kind; allowed: {', '.join(PRICE_KINDS)}")
    return kind


def priced(system: System, kind: str = DEFAULT_PRICE_KIND, usd_per_hour: float | None = None) -> System:
    """The system with ``price_per_s`` set to its price of ``kind`` (NaN when it has none), or to
    ``usd_per_hour`` when a study supplies its own price (then not an estimate).
    """
    check_price_kind(kind)
    if usd_per_hour is not None:
        return replace(system, price_per_s=usd_per_hour / 3600.0, price_kind=kind, price_is_estimate=False)
    q = system.prices.get(kind)
    if q is None:
        return replace(system, price_per_s=math.nan, price_kind=kind, price_is_estimate=False)
    return replace(system, price_per_s=q.si, price_kind=kind, price_is_estimate=q.estimate)


@lru_cache(maxsize=1)
def _catalog() -> dict[str, System]:
    return load_systems()


@lru_cache(maxsize=len(PRICE_KINDS))
def default_systems(price_kind: str = DEFAULT_PRICE_KIND) -> dict[str, System]:
    """The embedded catalog, loaded once, each system priced at ``price_kind`` (NaN where it has no
    price of that kind).
    """
    return {sid: priced(s, price_kind) for sid, s in _catalog().items()}



def shipping_ids(include_announced: bool = False) -> tuple[str, ...]:
    """The ids ``systems: all`` means: every shipping system, and the announced ones on request."""
    return tuple(sid for sid, s in _catalog().items() if include_announced or not s.announced)


@lru_cache(maxsize=1)
def default_efficiency_catalog() -> EfficiencyCatalog:
    """The embedded efficiency factors, loaded once."""
    return load_efficiency_catalog()


def default_efficiency() -> Efficiency:
    """The global calibrated factors (systems outside every fitted family use these)."""
    return default_efficiency_catalog().default


def efficiency_for(system_id: str) -> Efficiency:
    """The calibrated factors of one system: its family's fit, else the global ones."""
    return default_efficiency_catalog().for_system(system_id)


def get_system(system_id: str, systems: dict[str, System] | None = None) -> System:
    """Look up a system by id; an unknown id names the close ones."""
    systems = systems if systems is not None else default_systems()
    if system_id not in systems:
        raise InputError(unknown_name_message("system", system_id, systems))
    return systems[system_id]
