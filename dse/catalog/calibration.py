"""The stored calibration: hardware families and the error bands of calibrated predictions."""

from __future__ import annotations

import math
from dataclasses import dataclass
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


def load_fitted(path: Path | None = None, keys: tuple[str, ...] | None = None) -> dict | None:
    """The stored fit (errors, bands), or None when there is none; a malformed file is an InputError. With
    ``keys``, its top-level sections of those names alone (`read_yaml`; ``band`` is always read).
    """
    path = Path(path) if path else hw_dir() / "calibration" / "fitted.yaml"
    if not path.exists():
        return None
    doc = read_yaml(path, keys=None if keys is None else ("band", *keys))
    band = doc.get("band") if isinstance(doc, dict) else None
    if not isinstance(band, dict) or "default" not in band:
        raise InputError(f"{path}: field 'band': expected a mapping of hardware family -> [low, high] with a "
                         "'default' entry")
    for family, pair in band.items():
        if not _check_pair(pair):
            raise InputError(f"{path}: field 'band.{family}': expected [low, high] with 0 < low <= high, got {pair!r}")
    if not isinstance(doc.get("table", []), list):
        raise InputError(f"{path}: field 'table': expected a list of fitted points")
    if "bands" in doc:
        _check_bands(doc["bands"], path)
    return doc


def _check_pair(pair: object) -> bool:
    return (isinstance(pair, list) and len(pair) == 2 and all(isinstance(x, (int, float)) and not isinstance(x, bool)
            and math.isfinite(x) and x > 0 for x in pair) and pair[0] <= pair[1])


def _check_bands(bands: object, path: Path) -> None:
    """The ``bands`` section: per metric of BAND_METRICS, family (and ``default``) -> a mapping with ``band``."""
    if not isinstance(bands, dict):
        raise InputError(f"{path}: field 'bands': expected a mapping of metric -> family -> {{band: [low, high]}}")
    for metric in BAND_METRICS:
        per = bands.get(metric)
        if not isinstance(per, dict) or "default" not in per:
            raise InputError(f"{path}: field 'bands.{metric}': expected a mapping of hardware family -> "
                             "{band: [low, high], ...} with a 'default' entry")
        for family, entry in per.items():
            pair = entry.get("band") if isinstance(entry, dict) else None
            if not _check_pair(pair):
                raise InputError(f"{path}: field 'bands.{metric}.{family}.band': expected [low, high] with "
                                 f"0 < low <= high, got {pair!r}")


BAND_METRICS = ("throughput", "tpot", "ttft")
"""The metrics a band is stored for: throughput (and every cost, its inverse), time per output token and time to
first token."""
MIN_POINTS = 10
"""A family with fewer independent units of a metric (configurations of published points; concurrency sweeps of
runs) has no band of its own for it: it takes the envelope of its few units' band, its leave-family-out band and 1
(`dse.validate.bands`), and is not calibrated (`calibrated`)."""


@dataclass(frozen=True)
class Bands:
    """Multipliers (low, high) on a calibrated prediction, the 10th and 90th percentile of measured / predicted out
    of sample: a throughput T reads [T x low, T x high] and a cost C, its inverse, [C / high, C / low]; a TPOT
    or TTFT t reads [t x low, t x high].
    """

    throughput: tuple[float, float]
    tpot: tuple[float, float]
    ttft: tuple[float, float]

    @property
    def cost(self) -> tuple[float, float]:
        """Multipliers (low, high) on a cost (per token, per request, per second of a deployment sized to a rate)."""
        lo, hi = self.throughput
        return 1.0 / hi, 1.0 / lo


def bands_of(system_id: str) -> Bands | None:
    """The bands of a system's calibrated predictions (hw_catalog/calibration/fitted.yaml's ``bands``): its
    family's, or for a system of no family (or of a family the section does not list) the ``default``, the band
    of an unseen family. None where no band is stored.
    """
    fitted = _fitted_cached()
    if not fitted or "bands" not in fitted:
        return None
    fam = family_of(system_id)

    def pick(metric: str) -> tuple[float, float]:
        per = fitted["bands"][metric]
        lo, hi = per.get(fam, per["default"])["band"] if fam else per["default"]["band"]
        return float(lo), float(hi)

    return Bands(*(pick(m) for m in BAND_METRICS))


def calibrated(system_id: str) -> bool:
    """Whether a system's predictions rest on data of its own family: it has a family, and for every metric of
    BAND_METRICS the stored bands count at least MIN_POINTS independent units of it (concurrency sweeps for TPOT
    and TTFT, configurations of published points for throughput) predicted out of sample. A family short of that
    on any metric (its band there is its leave-family-out band, widened) is judged at the edge of its band by
    default (`dse.studies.common.decide_of`). False where no band is stored.
    """
    fitted = _fitted_cached()
    fam = family_of(system_id)
    if not fitted or "bands" not in fitted or fam is None:
        return False
    for metric in BAND_METRICS:
        entry = fitted["bands"][metric].get(fam, {})
        if entry.get("sweeps", entry.get("configurations", 0)) < MIN_POINTS:
            return False
    return True


def error_band(system_id: str) -> tuple[float, float] | None:
    """Multipliers (low, high) on a calibrated throughput (`bands_of`)."""
    bands = bands_of(system_id)
    return None if bands is None else bands.throughput


BANDED = {"tokens_per_s": "throughput", "tokens_per_s_per_gpu": "throughput", "usd_per_mtok": "cost",
          "usd_per_request": "cost", "usd_per_mtok_input": "cost", "usd_per_mtok_output": "cost",
          "usd_per_mtok_blended": "cost", "usd_per_s": "cost", "tpot_s": "tpot", "ttft_s": "ttft"}
"""The predicted keys that carry a band (``<key>_band``), and the band each takes."""


def band_keys(values: dict, bands: Bands | None) -> dict:
    """``<key>_band`` = [low, high] in the key's own unit for every key of BANDED that ``values`` has; None where
    the value or the bands are missing.
    """
    out = {}
    for key, metric in BANDED.items():
        if key not in values:
            continue
        v = values[key]
        if bands is None or v is None or (isinstance(v, float) and not math.isfinite(v)):
            out[f"{key}_band"] = None
            continue
        lo, hi = getattr(bands, metric)
        out[f"{key}_band"] = [float(v) * lo, float(v) * hi]
    return out


_CACHE: dict = {}


def _fitted_cached() -> dict | None:
    """The stored fit's bands (its fitted points, most of the file, are left unread)."""
    key = str(hw_dir())
    if key not in _CACHE:
        _CACHE[key] = load_fitted(keys=("bands",))
    return _CACHE[key]


def clear_cache() -> None:
    """Forget the stored fit read so far (after `dse validate --fit` writes a new one)."""
    _CACHE.clear()
