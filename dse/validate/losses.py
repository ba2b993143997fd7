"""The loss of the decode-factor fit (`dse.validate.fit.fit_factors`), sum |log(TPOT / measured)| over a fit's
rows, and what its descent (`dse.validate.descent`) reads: log TPOT with its derivatives by every factor, for many
factor sets at once.

`loss_of` gives the loss of one fit at one factor set, to the last bit `dse.validate.decode.tpot_at` summed as numpy
sums it. `log_tpot` gives log TPOT of every row at many factor sets and its Jacobian in the descent's coordinates
(`to_coords`): the reciprocal of each share of a peak (a time at the peak multiplies it) and each fixed time and
length as it is (the pass is linear in it), so that the pass is linear in every coordinate but where the compute
share and the GEMM's half-performance rows multiply, and a factor at 0 still has a slope.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from dse.validate.decode import DecodeTerms
from dse.validate.factors import FACTOR, FACTORS

PRODUCTS = ("n_layers", "n_scaleup", "gemm_rows", "attention_tokens", "n_moe_layers", "n_scaleout")
"""The terms a factor multiplies."""
TERMS = ("comm", "compute", "memory", "attention_compute", "kv_memory", *PRODUCTS, "one_minus_overlap", "rest")
"""The rows of the arrays `log_tpot` reads."""
_FACTOR_OF_TERM = {FACTOR[k].term: k for k in FACTORS}
_PRODUCT_FACTORS = np.array([FACTORS.index(_FACTOR_OF_TERM[t]) for t in PRODUCTS])
_LINK = FACTORS.index("link")
_SHARES = np.array([FACTORS.index("compute_decode"), FACTORS.index("memory")])
_KERNEL = FACTORS.index("kernel_overlap")
_COORDS = ("compute_decode", "memory", "link", "latency_scaleup", "latency_scaleout", "layer_overhead",
           "moe_layer_overhead", "gemm_half_rows", "attention_half_context", "kernel_overlap")
"""The factors in the order `log_tpot` names them (every one of `FACTORS`)."""
_AT = {k: FACTORS.index(k) for k in _COORDS}
RECIPROCAL = np.array([k in ("compute_decode", "memory", "link") for k in FACTORS])
"""The factors `to_coords` takes the reciprocal of: the shares of a peak rate (a time at the peak over the share)."""


def to_coords(x: np.ndarray) -> np.ndarray:
    """The descent's coordinates of factors given as logs (``x``, `FACTORS` on the last axis): 1 / share of a peak
    rate, every other factor itself.
    """
    return np.exp(np.where(RECIPROCAL, -x, x))


def from_coords(p: np.ndarray) -> np.ndarray:
    """The logs of the factors at coordinates ``p`` (`to_coords` undone)."""
    return np.where(RECIPROCAL, -1.0, 1.0) * np.log(p)


_TINY = 1e-150
"""Added in quadrature to the gap of `_max`, so that a tie of width 0 divides by no 0 (the times of a pass are
1e-9 s and more: their squares are far above its square)."""


def _max(a: np.ndarray, b: np.ndarray, width: np.ndarray, slope: bool = True) -> tuple:
    """max(a, b) of positive numbers, rounded over a relative ``width`` of a tie: (a + b + sqrt((a - b)^2 + (width
    (a + b))^2)) / 2 (the max itself where ``width`` is 0, within at most width (a + b) / 2 of it), and with
    ``slope`` its derivatives by a and by b (1 and 0 away from a tie; at a tie of width 0, those of a).
    """
    if not width.any():  # the max itself
        larger = np.maximum(a, b)
        if not slope:
            return larger, None, None
        by_a = (a >= b).astype(np.float64)
        return larger, by_a, 1.0 - by_a
    total, gap = a + b, a - b
    spread = width * total
    q = np.sqrt(gap * gap + spread * spread + _TINY * _TINY)
    if not slope:
        return 0.5 * (total + q), None, None
    gap /= q
    spread *= width
    spread /= q  # d q / d a = gap / q + width^2 (a + b) / q, d q / d b = -gap / q + the same
    return 0.5 * (total + q), 0.5 * (1.0 + spread + gap), 0.5 * (1.0 + spread - gap)


CHUNK = 1 << 14
"""Entries (sets x rows) `log_tpot` evaluates at once, at most: its arrays stay in the processor's cache (on the
decode fits of the measured runs, 2.5 times faster than 94,000 at once)."""


def log_tpot(t: np.ndarray, p: np.ndarray, jacobian: bool = True, width: np.ndarray | float = 0.0,
             columns: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray | None]:
    """Log TPOT of every row of ``t`` (`TERMS` x rows) at each factor set of ``p`` (sets x `FACTORS`, in the
    coordinates of `to_coords`): an array sets x rows, as `dse.validate.decode.tpot_at` computes it (to rounding),
    and with ``jacobian`` its derivatives by each coordinate (of ``columns`` only, positions in `FACTORS`, where
    given), sets x coordinates x rows. ``width`` (per set, or one
    for all): each max of the pass rounded over that relative width of its tie (`_max`; 0: the pass itself), so
    that the descent sees the slope on both sides of a tie (a row's roofline turning from compute to memory, its
    pass from work to communication) instead of a kink it stops at. Evaluated in chunks of sets (`CHUNK`).
    """
    columns = np.arange(len(FACTORS)) if columns is None else np.asarray(columns)
    width = np.broadcast_to(np.asarray(width, dtype=np.float64).reshape(-1), (len(p),))
    log = np.empty((len(p), t.shape[1]))
    jac = np.empty((len(p), len(columns), t.shape[1])) if jacobian else None
    step = max(1, CHUNK // max(t.shape[1], 1))
    for lo in range(0, len(p), step):
        hi = min(lo + step, len(p))
        _log_tpot(t, p[lo:hi], width[lo:hi, None], columns, log[lo:hi], None if jac is None else jac[lo:hi])
    return log, jac


def _log_tpot(t: np.ndarray, p: np.ndarray, width: np.ndarray, columns: np.ndarray, log: np.ndarray,
              jac: np.ndarray | None) -> None:
    """`log_tpot` of the sets ``p`` (``width``: sets x 1), into ``log`` and ``jac`` (None: no Jacobian)."""
    jacobian = jac is not None
    comm_t, compute, memory, attention, kv, n_l, n_u, g_rows, a_tokens, n_e, n_o, one_minus_overlap, rest = t
    u_c, u_m, u_l, lat_u, lat_o, o_l, o_e, half_rows, half_context, k = (p[:, _AT[name], None] for name in _COORDS)
    comm = comm_t * u_l + n_u * lat_u + n_o * lat_o  # K / f_l + n_u lat_u + n_o lat_o
    overhead = n_l * o_l + n_e * o_e  # L o_l + E o_e
    c_rows = compute + g_rows * half_rows  # C + G n_g
    m_tokens = memory + a_tokens * half_context  # M + A n_a
    kv_tokens = kv + a_tokens * half_context  # M_a + A n_a
    c, m, a_c, a_m = c_rows * u_c, m_tokens * u_m, attention * u_c, kv_tokens * u_m
    # `kernel_work`: k max(C, M) + (1 - k) (max(C - C_a, M - M_a) + max(C_a, M_a))
    whole = bool(np.any(k != 0.0))  # else max(C, M) only for the slope by k, where it is asked for
    by_k = jacobian and bool(np.any(columns == _AT["kernel_overlap"]))
    single, single_c, single_m = _max(c, m, width, jacobian and whole) if whole or by_k else (0.0, 0.0, 0.0)
    single_c, single_m = (0.0, 0.0) if single_c is None else (single_c, single_m)
    kernels, kernels_c, kernels_m = _max(c - a_c, m - a_m, width, jacobian)
    attn, attn_c, attn_m = _max(a_c, a_m, width, jacobian)
    apart = kernels + attn
    work = k * single + (1.0 - k) * apart
    # `combine`: max(W, K) + (1 - overlap) min(K, W) = overlap max(W, K) + (1 - overlap) (W + K)
    overlap = 1.0 - one_minus_overlap
    longer, longer_w, longer_k = _max(work, comm, width, jacobian)
    step = overlap * longer + one_minus_overlap * (work + comm) + overhead
    np.log(step * rest, out=log)
    if not jacobian:
        return
    by_work = (overlap * longer_w + one_minus_overlap) / step  # d log TPOT / d W, d K, d overhead
    by_comm = (overlap * longer_k + one_minus_overlap) / step
    by_overhead = 1.0 / step
    # d W / d C, d M, d C_a, d M_a
    w_c = k * single_c + (1.0 - k) * kernels_c
    w_m = k * single_m + (1.0 - k) * kernels_m
    w_a_c = (1.0 - k) * (attn_c - kernels_c)
    w_a_m = (1.0 - k) * (attn_m - kernels_m)
    slopes = {"compute_decode": lambda: by_work * (w_c * c_rows + w_a_c * attention),  # of 1 / the share
              "memory": lambda: by_work * (w_m * m_tokens + w_a_m * kv_tokens),
              "link": lambda: by_comm * comm_t,
              "latency_scaleup": lambda: by_comm * n_u,
              "latency_scaleout": lambda: by_comm * n_o,
              "layer_overhead": lambda: by_overhead * n_l,
              "moe_layer_overhead": lambda: by_overhead * n_e,
              "gemm_half_rows": lambda: by_work * w_c * g_rows * u_c,
              "attention_half_context": lambda: by_work * (w_m + w_a_m) * a_tokens * u_m,
              "kernel_overlap": lambda: by_work * (single - apart)}
    for j, i in enumerate(columns):
        jac[:, j] = slopes[FACTORS[i]]()


def term_rows(d: DecodeTerms) -> np.ndarray:
    """The rows of ``d`` as `log_tpot` reads them: `TERMS` x rows (1 - overlap for the overlap)."""
    return np.vstack([*(getattr(d, k) for k in TERMS[:-2]), 1.0 - d.overlap, d.rest])


def loss_of(d: DecodeTerms, measured: np.ndarray) -> Callable[[np.ndarray], float]:
    """The loss of one fit on all of its rows, as a function of the factors ``f`` (the `FACTORS`: an array of any
    shape, or a list of floats):
    sum |log(TPOT / measured)|, to the last bit `log_tpot` at one factor set summed as numpy sums it.

    The same operations on the same numbers, on one-dimensional arrays the function keeps (a fit's few hundred rows
    cost less than numpy's fixed cost per operation, which a two-dimensional or broadcast operation pays several
    times over): the factors as floats, each product and sum in its own array; where no row overlaps its
    communication, max(W, K) + 1 min(K, W) is W + K (the same two numbers added).
    """
    rows = [np.array(getattr(d, k), dtype=np.float64) for k in ("comm", "compute", "memory", "attention_compute",
                                                                 "kv_memory", *PRODUCTS, "rest")]
    comm_t, compute, memory, attention, kv, *products, rest = rows
    one_minus_overlap = 1.0 - d.overlap
    overlapped = bool(np.any(d.overlap))
    log_measured = np.log(measured)
    (layer, scaleup, gemm, tokens, moe, scaleout, comm, c, m, a_c, a_m, d_c, d_m, apart, single, other,
     step) = np.empty((17, len(rest)))
    at = _PRODUCT_FACTORS.tolist()

    def loss(f: np.ndarray | list[float]) -> float:
        v = f if isinstance(f, list) else np.ravel(f).tolist()
        for out, t, i in zip((layer, scaleup, gemm, tokens, moe, scaleout), products, at, strict=True):
            np.multiply(t, v[i], out=out)
        np.divide(comm_t, v[_LINK], out=comm)
        np.add(comm, scaleup, out=comm)
        np.add(comm, scaleout, out=comm)  # comm / link + n_u lat_u + n_o lat_o
        np.add(kv, tokens, out=a_m)  # M_a + A n_a
        np.add(compute, gemm, out=c)
        np.add(memory, tokens, out=m)  # C + G n_g, M + A n_a
        f_c, f_m = v[_SHARES[0]], v[_SHARES[1]]
        np.divide(c, f_c, out=c)
        np.divide(m, f_m, out=m)
        np.divide(attention, f_c, out=a_c)
        np.divide(a_m, f_m, out=a_m)
        np.add(layer, moe, out=layer)  # L o_l + E o_e
        k = v[_KERNEL]  # `kernel_work`, operation for operation
        if not k < 1.0:
            work = np.maximum(c, m, out=single)
        else:
            np.subtract(c, a_c, out=d_c)
            np.subtract(m, a_m, out=d_m)
            np.maximum(d_c, d_m, out=apart)
            np.add(apart, np.maximum(a_c, a_m, out=d_c), out=apart)
            if not k > 0.0:
                work = apart
            else:
                np.maximum(c, m, out=single)
                np.multiply(single, k, out=single)
                np.multiply(apart, 1.0 - k, out=apart)
                work = np.add(single, apart, out=step)
        if overlapped:  # `combine`: max(W, K) + (1 - overlap) min(K, W)
            np.minimum(comm, work, out=other)
            np.maximum(work, comm, out=step)
            np.multiply(one_minus_overlap, other, out=other)
            np.add(step, other, out=step)
        else:
            np.add(work, comm, out=step)
        np.add(step, layer, out=step)
        np.multiply(step, rest, out=step)  # TPOT: the pass times what the request level adds
        np.log(step, out=step)
        np.subtract(step, log_measured, out=step)
        return float(np.add.reduce(np.abs(step, out=step)))

    return loss
