"""The stored calibration: hardware families and the error band of calibrated predictions."""

from __future__ import annotations

import math
from pathlib import Path

from dse.catalog.hardware import default_efficiency_catalog, hw_dir
from dse.catalog.loading import read_yaml
from dse.errors import InputError


def families() -> dict[str, tuple[str, ...]]:
    """Hardware families, family -> its systems, in the order hw_catalog/efficiency.yaml lists them (the one
    place they are defined, each with the basis for grouping its systems). A family shares one set of fitted
    efficiency factors (achieved fractions of peak), so it groups chips whose fractions of peak are set by the same
    compute units and software stack; the peaks themselves come from the systems catalog.
    """
    out: dict[str, list[str]] = {}
    for system, fam in default_efficiency_catalog().members.items():
        out.setdefault(fam, []).append(system)
    return {fam: tuple(systems) for fam, systems in out.items()}


def family_of(system: str) -> str | None:
    return default_efficiency_catalog().members.get(system)


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
