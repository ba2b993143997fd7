"""The stored calibration: hardware families and the error band of calibrated predictions."""

from __future__ import annotations

from pathlib import Path

from dse.catalog.hardware import hw_dir
from dse.catalog.loading import read_yaml

FAMILIES = {"hopper": ("h100", "h800", "h200"), "blackwell": ("b200", "b300", "gb200-nvl72", "gb300-nvl72")}


def family_of(system: str) -> str | None:
    return next((f for f, members in FAMILIES.items() if system in members), None)


def load_fitted(path: Path | None = None) -> dict | None:
    """The stored fit (errors, bands), or None when there is none."""
    path = Path(path) if path else hw_dir() / "calibration" / "fitted.yaml"
    return read_yaml(path) if path.exists() else None


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
