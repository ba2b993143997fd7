"""The stored calibration: hardware families and the error band of calibrated predictions."""

from __future__ import annotations

import math
from pathlib import Path

from dse.catalog.hardware import hw_dir
from dse.catalog.loading import read_yaml
from dse.errors import InputError

# Hardware families share one set of fitted efficiency factors (achieved fractions of peak), so a family groups
# chips whose fractions of peak are set by the same compute units and software stack; the peaks themselves come
# from the catalog.
# - hopper, blackwell: NVIDIA generations (same SM architecture and kernel libraries within each).
# - cdna3: MI300X and MI325X carry the same CDNA3 compute dies (304 CUs, the same dense peaks) in the same 8-GPU
#   Infinity Fabric mesh, served by the same ROCm kernels; the MI325X differs only in HBM3E capacity and bandwidth,
#   which the catalog holds.
# - cdna4: MI355X, a new compute unit (doubled matrix rate per CU, FP4/FP6 units): its fractions need not be CDNA3's.
# - tpu: TPU v6e (Trillium) and TPU7x (Ironwood), both 256x256-MXU TensorCores compiled by XLA and served by the same
#   vLLM TPU backend (JAX, Pallas ragged paged attention); TPU v5e/v5p/v4 have no calibration point and stay out.
FAMILIES = {"hopper": ("h100", "h800", "h200"), "blackwell": ("b200", "b300", "gb200-nvl72", "gb300-nvl72"),
            "cdna3": ("mi300x", "mi325x"), "cdna4": ("mi355x",), "tpu": ("tpu-v6e", "tpu-v7")}


MEMBERS = {system: fam for fam, systems in FAMILIES.items() for system in systems}
"""System id -> its family (the inverse of FAMILIES)."""


def family_of(system: str) -> str | None:
    return MEMBERS.get(system)


def load_fitted(path: Path | None = None) -> dict | None:
    """The stored fit (errors, bands), or None when there is none; a malformed file is an InputError."""
    path = Path(path) if path else hw_dir() / "calibration" / "fitted.yaml"
    if not path.exists():
        return None
    doc = read_yaml(path)
    band = doc.get("band") if isinstance(doc, dict) else None
    if not isinstance(band, dict) or "default" not in band:
        raise InputError(f"{path}: field 'band': expected a mapping of hardware family -> [low, high] with a "
                         "'default' entry")
    for family, pair in band.items():
        ok = (isinstance(pair, list) and len(pair) == 2 and all(isinstance(x, (int, float))
              and not isinstance(x, bool) and math.isfinite(x) and x > 0 for x in pair) and pair[0] <= pair[1])
        if not ok:
            raise InputError(f"{path}: field 'band.{family}': expected [low, high] with 0 < low <= high, got {pair!r}")
    if not isinstance(doc.get("table", []), list):
        raise InputError(f"{path}: field 'table': expected a list of fitted points")
    return doc


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


def clear_cache() -> None:
    """Forget the stored fit read so far (after `dse validate --fit` writes a new one)."""
    _CACHE.clear()
