"""Units of the catalogs and their conversion to SI, done once at load time.

Every catalog quantity names its unit; this table maps each allowed unit to its dimension and the
factor that turns it into the SI base used everywhere else (FLOP/s, bytes, bytes/s, W, USD/s,
USD per byte-second, seconds, counts).
"""

from __future__ import annotations

import math

from dse.errors import InputError

# unit -> (dimension, factor to SI)
UNITS: dict[str, tuple[str, float]] = {
    # compute rate
    "FLOP/s": ("flop_rate", 1.0),
    "TFLOP/s": ("flop_rate", 1e12),
    "PFLOP/s": ("flop_rate", 1e15),
    "TOP/s": ("flop_rate", 1e12),  # integer tensor operations
    # capacity
    "B": ("bytes", 1.0),
    "KB": ("bytes", 1e3),
    "MB": ("bytes", 1e6),
    "GB": ("bytes", 1e9),
    "TB": ("bytes", 1e12),
    "KiB": ("bytes", 2.0**10),
    "MiB": ("bytes", 2.0**20),
    "GiB": ("bytes", 2.0**30),
    "TiB": ("bytes", 2.0**40),
    # bandwidth (bytes or bits per second, one direction unless a field says otherwise)
    "B/s": ("byte_rate", 1.0),
    "MB/s": ("byte_rate", 1e6),
    "GB/s": ("byte_rate", 1e9),
    "TB/s": ("byte_rate", 1e12),
    "Gb/s": ("byte_rate", 1e9 / 8),
    "Tb/s": ("byte_rate", 1e12 / 8),
    # power
    "W": ("power", 1.0),
    "kW": ("power", 1e3),
    # prices
    "USD/h": ("usd_rate", 1.0 / 3600.0),
    "USD/GB-h": ("usd_per_byte_s", 1.0 / (1e9 * 3600.0)),
    "USD/TB-month": ("usd_per_byte_s", 1.0 / (1e12 * 730.0 * 3600.0)),
    # time
    "s": ("time", 1.0),
    "ms": ("time", 1e-3),
    "us": ("time", 1e-6),
    "h": ("time", 3600.0),
    # dimensionless
    "chips": ("count", 1.0),
    "count": ("count", 1.0),
    "rows": ("count", 1.0),  # rows of a GEMM (tokens)
    "tokens": ("count", 1.0),
    "fraction": ("fraction", 1.0),
}


def units_for(dimension: str) -> list[str]:
    """All units allowed for a dimension."""
    return [u for u, (d, _) in UNITS.items() if d == dimension]


def to_si(value: float, unit: str, dimension: str, where: str) -> float:
    """Convert ``value`` in ``unit`` to SI, checking the unit measures ``dimension``."""
    if unit not in UNITS:
        raise InputError(f"{where}: unknown unit '{unit}'; allowed for {dimension}: {', '.join(units_for(dimension))}")
    dim, factor = UNITS[unit]
    if dim != dimension:
        raise InputError(
            f"{where}: unit '{unit}' measures {dim}, but this field is a {dimension}; "
            f"allowed: {', '.join(units_for(dimension))}"
        )
    return float(value) * factor


# Bytes per element of the number formats the tool knows: floating point, widest first, then integer.
DTYPE_BYTES: dict[str, float] = {"bf16": 2.0, "fp8": 1.0, "fp4": 0.5, "int4": 0.5}
DTYPES: tuple[str, ...] = tuple(DTYPE_BYTES)
INTEGER_DTYPES: tuple[str, ...] = ("int4",)
"""Integer weight formats: no catalog chip computes in them; stored narrow and dequantized to BF16 in the GEMM
(W4A16, as Marlin and Machete in vLLM and TensorRT-LLM's weight-only kernels run them)."""


PREFIXES = ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k"), (1, ""), (1e-3, "m"), (1e-6, "µ"),
            (1e-9, "n"))


def si(value: float | None, unit: str, digits: int = 3, micro: str = "µ", missing: str = "–") -> str:
    """``value`` with an SI prefix and ``digits`` significant digits: 0.0123 s -> '12.3 ms'; None, NaN or
    infinity as ``missing``. A terminal passes ``micro="u"`` and ``missing="-"`` (plain ASCII).
    """
    if value is None or not math.isfinite(value):
        return missing
    if value == 0:
        return f"0 {unit}"
    for scale, prefix in PREFIXES:
        if abs(value) >= scale:
            return f"{value / scale:.{digits}g} {micro if prefix == 'µ' else prefix}{unit}"
    return f"{value:.{digits}g} {unit}"
