"""The efficiency factors the validation fits: one row per factor with its unit, ranges and meaning.

Every fit (`dse.validate.fit`), the decode pass's terms (`dse.validate.decode`) and the stored calibration
(`dse.validate.report.write_calibration`) read the factors from this table; the views below it (`FITTED`,
`FACTORS`, ...) are the table filtered by what a fit moves.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Factor:
    """One fitted field of `dse.catalog.hardware.Efficiency`.

    ``bounds`` is the range (SI) of the least-squares fit of the catalog (`dse.validate.fit.fit`), which moves
    the factor in units of ``scale`` (a fixed time in microseconds). ``log_range`` is the range of log(value)
    the decode-factor fit of the measured runs (`dse.validate.fit.fit_factors`) searches (a factor whose value is 0
    starts at its bottom); the two ranges differ for the per-layer fixed times (the catalog
    fit stops at 1 ms, the decode fit at 10 ms). ``term`` is the field of `dse.validate.decode.DecodeTerms`
    the factor acts on in a decode pass (empty: not a factor of the decode pass; for ``kernel_overlap``, the
    attention kernels' compute, which every pass has) and ``probe`` the time of the pass a probe of a fixed time
    or length moves (empty: not probed). ``estimate`` is the note stored with a fixed time or length
    no fit frees.
    """

    name: str
    kind: str  # share (of a peak, a capacity or a time), time (s per collective or layer), length (rows, tokens)
    fitted_on: str  # cases (the published points), runs (measured serving runs), none (the catalog's, never fitted)
    unit: str  # as efficiency.yaml stores it
    per_si: float  # stored value per SI value
    bounds: tuple[float, float]
    meaning: str
    scale: float = 1.0
    log_range: tuple[float, float] | None = None
    term: str = ""
    probe: str = ""
    estimate: str = ""


SHARE_LOG_RANGE = (-20.0, 0.0)
TIME_LOG_RANGE = (-40.0, float(np.log(1e-2)))
"""The decode fit's ranges of log(value): a share of a peak in (0, 1], a fixed time in (0, 10 ms]."""

COMPUTE_CEILING = 0.85
"""The highest share of a chip's peak dense tensor FLOP/s a family's fit may place its compute shares at: the top
of what the vendors' own GEMM benchmarks reach (70-85% of the dense peak), which no whole pass sustains beyond.
A fit at this ceiling asks for more than the hardware delivers and so has not measured the share (it compensates
what other factors miss): `dse.validate.fit.fit_family` leaves the share at the global value. With a pass costed
by its kernel groups CDNA3's fit put both compute shares at 0.97-1.0 with a ceiling of 1, and at 0.897 and 0.769
with a ceiling of 0.9 (the MLPerf v5.1 partner rows added), its fixed attention length traded against them."""

TABLE = (
    Factor("compute_prefill", "share", "cases", "fraction", 1.0, (0.05, COMPUTE_CEILING),
           "achieved share of the peak dense tensor FLOP/s in prefill passes"),
    Factor("compute_decode", "share", "cases", "fraction", 1.0, (0.05, COMPUTE_CEILING),
           "achieved share of the peak dense tensor FLOP/s in decode passes",
           log_range=SHARE_LOG_RANGE, term="compute"),
    Factor("memory", "share", "cases", "fraction", 1.0, (0.05, 1.0),
           "achieved share of the peak HBM bandwidth streaming weights and KV cache",
           log_range=SHARE_LOG_RANGE, term="memory"),
    Factor("link", "share", "cases", "fraction", 1.0, (0.05, 1.0),
           "achieved share of the scale-up link bandwidth in collectives (TP all-reduce, EP all-to-all)",
           log_range=SHARE_LOG_RANGE, term="comm"),
    Factor("overlap", "share", "cases", "fraction", 1.0, (0.0, 1.0),
           "share of the communication time hidden under compute (0: serialized, 1: fully overlapped)"),
    Factor("hbm_usable", "share", "cases", "fraction", 1.0, (0.8, 0.98),
           "share of the HBM capacity an offline benchmark's batch fills with weights, KV cache and "
           "activations (the published points state no memory settings; a deployment reserves HBM as its serving "
           "framework does)"),
    Factor("latency_scaleup", "time", "runs", "us", 1e6, (0.0, 10e-3),
           "fixed latency of one collective inside a scale-up domain (launch and synchronization of a small "
           "message)",
           scale=1e-6, log_range=TIME_LOG_RANGE, term="n_scaleup", probe="comm_s",
           estimate="small-message collective inside an NVLink-class domain; not fitted"),
    Factor("latency_scaleout", "time", "runs", "us", 1e6, (0.0, 10e-3),
           "fixed latency of one collective over the scale-out network",
           scale=1e-6, log_range=TIME_LOG_RANGE, term="n_scaleout", probe="comm_s",
           estimate="a collective over RDMA scale-out, ~2.5x the scale-up latency; not fitted"),
    Factor("layer_overhead", "time", "runs", "us", 1e6, (0.0, 1000e-6),
           "fixed time per layer of a forward pass (kernel boundaries and synchronization, CUDA graphs)",
           scale=1e-6, log_range=TIME_LOG_RANGE, term="n_layers", probe="overhead_s",
           estimate="kernel boundaries and synchronization of one layer in decode with CUDA graphs; not fitted"),
    Factor("moe_layer_overhead", "time", "runs", "us", 1e6, (0.0, 1000e-6),
           "fixed time an MoE layer adds per forward pass (router top-k, token permutation and un-permutation, "
           "the grouped-GEMM launch)",
           scale=1e-6, log_range=TIME_LOG_RANGE, term="n_moe_layers", probe="overhead_s",
           estimate="router top-k, token permutation and un-permutation and the grouped-GEMM launch an MoE layer "
                    "adds, about two kernel boundaries; not fitted"),
    Factor("gemm_half_rows", "length", "runs", "rows", 1.0, (0.0, 4096.0),
           "rows at which a GEMM reaches half its asymptotic FLOP rate (tile padding, wave quantization, pipeline "
           "fill): each weight matrix multiplied, dense or routed expert, costs this many rows of compute beyond "
           "its own",
           log_range=(-20.0, float(np.log(4096.0))), term="gemm_rows", probe="compute_s",
           estimate="a GEMM at its asymptotic rate at any row count, as the roofline takes it; not fitted"),
    Factor("attention_half_context", "length", "runs", "tokens", 1.0, (0.0, 65536.0),
           "KV tokens at which decode attention reaches half its asymptotic bandwidth (split-KV reduction, "
           "launch, occupancy at short sequences): each sequence's attention per layer reads this many tokens of "
           "KV beyond its own",
           log_range=(-20.0, float(np.log(65536.0))), term="attention_tokens", probe="memory_s",
           estimate="decode attention at its asymptotic bandwidth at any context, as the roofline takes it; not "
                    "fitted"),
    Factor("kernel_overlap", "share", "none", "fraction", 1.0, (0.0, 1.0),
           "share of a pass costed as one roofline of the whole pass, max(compute, memory); the rest is the sum of "
           "its kernel groups' rooflines (the weight GEMMs': FLOPs against weight bytes; attention's: FLOPs against "
           "KV bytes), which run one after the other",
           log_range=SHARE_LOG_RANGE, term="attention_compute",
           estimate="0: a layer's kernels run one after the other on a GPU (the weight GEMMs, then attention), so "
                    "a prefill chunk's GEMM compute does not hide under the decode sequences' KV reads; not fitted "
                    "(fitted on the measured TPOTs it traded off against the attention's half-performance context, "
                    "which every pass has too); 1 (one roofline of the whole pass) only under --ideal"),
)
"""Every fitted factor, in the order efficiency.yaml stores them."""
FACTOR = {f.name: f for f in TABLE}


def stored_value(name: str, value: float) -> float:
    """A factor's value as the calibration files hold it, in its unit: four significant digits, and 0 where the
    SI value is below 1e-9 (what every reader of the catalog computes with).
    """
    value = 0.0 if abs(value) < 1e-9 else value
    return float(f"{value * FACTOR[name].per_si:.4g}")


FITTED = tuple(f.name for f in TABLE if f.fitted_on == "cases")
"""What the published cases fit."""
RUN_FITTED = tuple(f.name for f in TABLE if f.fitted_on == "runs")
"""What only measured serving runs identify: the fixed times, then the half-performance lengths (`CURVES` of
`dse.catalog.hardware`)."""
FIXED_TIMES = tuple(f.name for f in TABLE if f.kind == "time")
"""The factors that are seconds per collective or per layer (at least 0)."""
FACTORS = tuple(f.name for f in TABLE if f.term)
"""Every factor of a decode pass: shares of a peak, fixed times and half-performance lengths."""
FRACTIONS = tuple(f for f in FACTORS if FACTOR[f].kind == "share")
"""The factors of a decode pass that are shares of a peak (at most 1)."""
