"""The training efficiency factors (hw_catalog/training_efficiency.yaml): achieved shares of each peak in a training
step, per hardware family and, where the published runs demand it, per software stack. Kept apart from the
serving factors of efficiency.yaml: a training step runs other kernels (large GEMMs forward and backward,
FlashAttention's backward, fused optimizers) than a decode or prefill pass.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from functools import lru_cache
from pathlib import Path

from dse.catalog.hardware import hw_dir
from dse.catalog.loading import FieldSpec, check_keys, parse_quantities, parse_sources, read_yaml
from dse.errors import InputError

TRAIN_FIELDS: dict[str, FieldSpec] = {
    "gemm": FieldSpec("fraction", True, "achieved share of the peak tensor FLOP/s of the GEMM's number format in "
                      "training GEMMs (forward, data gradient, weight gradient)"),
    "gemm_fp4": FieldSpec("fraction", False, "the same for FP4 GEMMs (NVFP4, MXFP4), where the runs tell it apart"),
    "attention": FieldSpec("fraction", True, "achieved share of the peak tensor FLOP/s in the attention core "
                           "(FlashAttention forward and backward)"),
    "memory": FieldSpec("fraction", True, "achieved share of the peak HBM bandwidth in the memory-bound kernels "
                        "(norms, activations, residuals, quantization casts, the optimizer step)"),
    "link": FieldSpec("fraction", True, "achieved share of the scale-up and scale-out bandwidth in training "
                      "collectives (bus bandwidth over line rate)"),
    "latency": FieldSpec("time", True, "fixed latency of one collective or one point-to-point transfer", False),
    "hbm_usable": FieldSpec("fraction", True, "share of the HBM capacity a training step may fill (allocator "
                            "fragmentation, workspaces, communication buffers reserved)"),
}
TRAIN_FACTORS = tuple(TRAIN_FIELDS)
TRAIN_KEYS = ("sources", "factors", "families")


@dataclass(frozen=True)
class TrainEfficiency:
    """Achieved shares of peak in a training step; `TRAIN_IDEAL` (every share 1, no latency) is the pure roofline.

    ``gemm_fp4`` NaN means FP4 GEMMs reach the same share as the others (``gemm``).
    """

    gemm: float = 1.0
    gemm_fp4: float = math.nan
    attention: float = 1.0
    memory: float = 1.0
    link: float = 1.0
    latency: float = 0.0
    hbm_usable: float = 1.0

    def gemm_share(self, dtype: str) -> float:
        """The share of peak a GEMM of ``dtype`` reaches."""
        return self.gemm_fp4 if dtype == "fp4" and not math.isnan(self.gemm_fp4) else self.gemm


TRAIN_IDEAL = TrainEfficiency()


@dataclass(frozen=True)
class TrainEfficiencyCatalog:
    """Global training factors and, per hardware family (and stack), those that replace them."""

    default: TrainEfficiency
    families: dict[str, TrainEfficiency]
    members: dict[str, str]  # system id -> family (the training families are defined here, with their basis)
    basis: dict[str, str] = field(default_factory=dict)
    stacks: dict[tuple[str, str], TrainEfficiency] = field(default_factory=dict)  # (family, stack) -> factors

    def family_of(self, system_id: str) -> str | None:
        return self.members.get(system_id)

    def for_system(self, system_id: str, stack: str = "") -> TrainEfficiency:
        """The factors of ``system_id`` run by ``stack`` (its family's stack set where fitted, else the family's,
        else the global ones).
        """
        family = self.members.get(system_id)
        if family and (family, stack) in self.stacks:
            return self.stacks[(family, stack)]
        return self.families.get(family, self.default) if family else self.default


def _factors(raw: object, sources: dict, where: str, required: bool) -> dict[str, float]:
    if not isinstance(raw, dict):
        raise InputError(f"{where}: expected a mapping of factor -> {{value, unit, source, date}}")
    check_keys(raw, TRAIN_FACTORS, where)
    specs = TRAIN_FIELDS if required else {k: replace(v, required=False) for k, v in TRAIN_FIELDS.items()}
    q = parse_quantities(raw, specs, sources, where)
    for name, quantity in q.items():
        if TRAIN_FIELDS[name].dimension == "fraction" and quantity.si > 1:
            raise InputError(f"{where}: field '{name}': a fraction must lie in (0, 1], got {quantity.value}")
    return {name: quantity.si for name, quantity in q.items()}


def load_training_efficiency(path: Path | None = None) -> TrainEfficiencyCatalog:
    """Load training_efficiency.yaml: ``factors`` (every system) and ``families`` (their systems, basis, factors
    and optional per-stack factors); every error names the file and the field.
    """
    path = Path(path) if path else hw_dir() / "training_efficiency.yaml"
    doc = read_yaml(path)
    if not isinstance(doc, dict) or not isinstance(doc.get("factors"), dict):
        raise InputError(f"{path}: expected a top-level 'factors:' mapping")
    check_keys(doc, TRAIN_KEYS, str(path))
    sources = parse_sources(doc, path)
    default = TrainEfficiency(**_factors(doc["factors"], sources, f"{path}: factors", True))
    families, members, basis, stacks = {}, {}, {}, {}
    for fam, entry in (doc.get("families") or {}).items():
        where = f"{path}: families.{fam}"
        if not isinstance(entry, dict):
            raise InputError(f"{where}: expected a mapping with systems, basis and factors")
        check_keys(entry, ("systems", "basis", "factors", "stacks"), where)
        systems = entry.get("systems")
        if not isinstance(systems, list) or not systems or not all(isinstance(s, str) for s in systems):
            raise InputError(f"{where}: field 'systems': must list at least one system id")
        for sid in systems:
            if sid in members:
                raise InputError(f"{where}: system '{sid}' is already in family '{members[sid]}'")
            members[sid] = fam
        if not isinstance(entry.get("basis", ""), str):
            raise InputError(f"{where}: field 'basis': expected a sentence saying why these systems share factors")
        basis[fam] = entry.get("basis", "")
        families[fam] = replace(default, **_factors(entry.get("factors") or {}, sources, f"{where}.factors", False))
        for stack, raw in (entry.get("stacks") or {}).items():
            stacks[(fam, str(stack))] = replace(families[fam], **_factors(raw, sources, f"{where}.stacks.{stack}",
                                                                          False))
    return TrainEfficiencyCatalog(default, families, members, basis, stacks)


@lru_cache(maxsize=1)
def default_training_efficiency() -> TrainEfficiencyCatalog:
    """The embedded training factors, loaded once."""
    return load_training_efficiency()


def training_efficiency_for(system_id: str, stack: str = "") -> TrainEfficiency:
    """The calibrated training factors of one system (and stack)."""
    return default_training_efficiency().for_system(system_id, stack)
