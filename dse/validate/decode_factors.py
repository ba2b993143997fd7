"""Decode-pass efficiency factors fitted on measured TPOTs.

A decode pass of the roofline (`dse.physics.roofline`) is, for fixed layout, batch and context, a known
function of the efficiency factors: with C, M and K its compute, memory and communication-bandwidth times at
the peaks, n_u and n_o its collectives inside and across scale-up domains, L its layers and E its MoE layers,

    step = combine(C / f_c, M / f_m, K / f_l + n_u lat_u + n_o lat_o, L o_l + E o_e, overlap)

(`dse.physics.serving.combine`: max of compute and memory, communication serialized by 1 - overlap, then
the fixed overheads), with C and M grown by the half-performance lengths (`dse.catalog.hardware.CURVES`):
C + G n_g and M + A n_a, G the compute time at the peak of one more row in every GEMM the pass multiplies
and A the memory time at the peak of one more token of KV per sequence and attention layer. `decode_terms`
in `dse.validate.serving_runs` reads C, M, K, G, A and the counts off the physics itself (one pass at the
peaks, one per latency at 1 us, one per length at 1 row or token); this module fits the nine factors of
`FACTORS` to measured TPOTs: TPOT = step x rest, where ``rest`` is what the request level adds to the pass at
the catalog's factors (prefill interference 1 / (1 - u) in an aggregated replica), held fixed.

Each factor keeps its physical meaning and range: ``compute_decode``, ``memory`` and ``link`` are achieved
shares of the peak (at most 1), ``latency_*`` seconds per collective, ``*_overhead`` seconds per layer,
``gemm_half_rows`` rows and ``attention_half_context`` tokens (at least 0). A factor no row depends on
(no collective across domains, no MoE layer) stays at its catalog value. The fit minimizes the sum of
absolute log errors (Nelder-Mead on log-transformed factors, restarted from its own optimum while that still
gains).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dse.catalog.hardware import CURVES
from dse.physics.serving import combine

FRACTIONS = ("compute_decode", "memory", "link")
"""The factors that are shares of a peak (at most 1)."""
FIXED_TIMES = ("latency_scaleup", "latency_scaleout", "layer_overhead", "moe_layer_overhead")
"""The factors that are seconds per collective or per layer (at least 0)."""
FACTORS = (*FRACTIONS, *FIXED_TIMES, *CURVES)
"""Every factor of a decode pass; the half-performance lengths (`CURVES`) are rows and tokens (at least 0)."""
USES = {"compute_decode": "compute", "memory": "memory", "link": "comm", "latency_scaleup": "n_scaleup",
        "latency_scaleout": "n_scaleout", "layer_overhead": "n_layers", "moe_layer_overhead": "n_moe_layers",
        "gemm_half_rows": "gemm_rows", "attention_half_context": "attention_tokens"}
"""The term each factor acts on: a factor is fitted only where some row has that term."""
SEEDS = {"gemm_half_rows": 16.0, "attention_half_context": 64.0}
"""Where a half-performance length starts at 0 (the ideal), the fit in logs starts it here instead."""
MAX_ITER = 4000
MAX_PASSES = 12
RESTART_GAIN = 1e-6
"""Nelder-Mead restarts from its own optimum while one lowers the loss by more than this share of it: the
shares of peak compute and the GEMM's half-performance rows trade along a narrow valley that one run's
shrunken simplex crawls along."""


@dataclass
class DecodeTerms:
    """Per row: the decode pass's times at the peaks (s), its collective and layer counts, the compute time at
    the peak of one row more in every GEMM (``gemm_rows``) and the memory time at the peak of one token more of
    KV per sequence and attention layer (``attention_tokens``), its overlap, and ``rest`` (the measured-run
    TPOT the physics predicts over its decode pass at the catalog's factors).
    """

    compute: np.ndarray
    memory: np.ndarray
    comm: np.ndarray
    n_scaleup: np.ndarray
    n_scaleout: np.ndarray
    n_layers: np.ndarray
    n_moe_layers: np.ndarray
    gemm_rows: np.ndarray
    attention_tokens: np.ndarray
    overlap: np.ndarray
    rest: np.ndarray

    def take(self, rows: np.ndarray) -> DecodeTerms:
        return DecodeTerms(**{k: getattr(self, k)[rows] for k in self.__dataclass_fields__})


def decode_step(d: DecodeTerms, f: dict) -> np.ndarray:
    """The decode pass at factors ``f`` (each a scalar or an array over the rows)."""
    comm = d.comm / f["link"] + d.n_scaleup * f["latency_scaleup"] + d.n_scaleout * f["latency_scaleout"]
    overhead = d.n_layers * f["layer_overhead"] + d.n_moe_layers * f["moe_layer_overhead"]
    compute = (d.compute + d.gemm_rows * f["gemm_half_rows"]) / f["compute_decode"]
    memory = (d.memory + d.attention_tokens * f["attention_half_context"]) / f["memory"]
    return combine(compute, memory, comm, overhead, d.overlap)


def tpot_at(d: DecodeTerms, f: dict) -> np.ndarray:
    """TPOT at factors ``f``: the decode pass times what the request level adds (``rest``)."""
    return decode_step(d, f) * d.rest


LOG_RANGE = {"fraction": (-20.0, 0.0), "latency": (-40.0, float(np.log(1e-2))),
             "gemm_half_rows": (-20.0, float(np.log(4096.0))),
             "attention_half_context": (-20.0, float(np.log(65536.0)))}
"""Bounds of the fitted logs: a share of a peak in (0, 1], a latency in (0, 10 ms], a GEMM's half-performance
rows in (0, 4096], decode attention's half-performance context in (0, 65,536] tokens."""


def _range(name: str) -> tuple[float, float]:
    return LOG_RANGE.get(name) or LOG_RANGE["fraction" if name in FRACTIONS else "latency"]


def _unpack(x: np.ndarray, free: tuple[str, ...], fixed: dict) -> dict:
    f = dict(fixed)
    for name, v in zip(free, x, strict=True):
        lo, hi = _range(name)
        f[name] = float(np.exp(np.clip(v, lo, hi)))
    return f


def _pack(f: dict, free: tuple[str, ...]) -> np.ndarray:
    return np.array([np.log(f[name] if f[name] > 0 else SEEDS.get(name, 1e-12)) for name in free])


def identified(d: DecodeTerms) -> tuple[str, ...]:
    """The factors some row depends on (the others cannot be fitted)."""
    return tuple(k for k in FACTORS if np.any(getattr(d, USES[k]) > 0))


def fit_factors(d: DecodeTerms, measured: np.ndarray, start: dict, max_iter: int = MAX_ITER,
                passes: int = MAX_PASSES) -> dict:
    """The factors minimizing sum |log(tpot / measured)|, from ``start`` (every factor of `FACTORS`); those
    no row uses keep their start value. Nelder-Mead runs again from its last optimum while a run still lowers
    the loss by more than RESTART_GAIN of it, ``passes`` runs at most.
    """
    from scipy.optimize import minimize

    free = identified(d)
    fixed = {k: start[k] for k in FACTORS if k not in free}
    log_meas = np.log(measured)

    def loss(x: np.ndarray) -> float:
        return float(np.abs(np.log(tpot_at(d, _unpack(x, free, fixed))) - log_meas).sum())

    x = _pack(start, free)
    best = loss(x)
    for _ in range(passes):  # a restart from the optimum re-spreads the simplex Nelder-Mead shrank
        res = minimize(loss, x, method="Nelder-Mead", options={"maxiter": max_iter, "xatol": 1e-4, "fatol": 1e-7})
        gain = best - res.fun
        x, best = (res.x, res.fun) if res.fun < best else (x, best)
        if gain <= RESTART_GAIN * best:
            break
    return _unpack(x, free, fixed)
