"""The loss of the decode-factor fit (`dse.validate.fit.fit_factors`), sum |log(TPOT / measured)| over a fit's
rows, for many fits at many factor sets at once, to the last bit as `dse.validate.decode.tpot_at` and numpy's
sum give it one fit and one factor set at a time.

Three things make it cheap. A fit's rows are a selection of the rows of a `DecodeTerms` that other fits may
share (the leave-group-out fits of a key each leave one sweep of the key's rows out): TPOT is computed once per
distinct row of the shared terms and factor set, then read into each fit's rows. The arithmetic runs on whole
arrays, a fit per array row, in the same operations in the same order as `tpot_at` (so the same values). And a
`Plan` of a request (which fits, in which order, in which chunks) is made once and reused while the same fits
ask again.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from dse.validate.decode import DecodeTerms
from dse.validate.factors import FACTOR, FACTORS

PRODUCTS = ("n_layers", "n_scaleup", "gemm_rows", "attention_tokens", "n_moe_layers", "n_scaleout")
"""The terms a factor multiplies, in the order `log_tpot` keeps their products: the layer overhead first and the
scale-out latency last, the four between added in one operation to what each joins."""
TERMS = ("comm", "compute", "memory", "attention_compute", "kv_memory", *PRODUCTS, "one_minus_overlap", "rest")
"""The rows of the arrays `log_tpot` reads."""
_FACTOR_OF_TERM = {FACTOR[k].term: k for k in FACTORS}
_PRODUCT_FACTORS = np.array([FACTORS.index(_FACTOR_OF_TERM[t]) for t in PRODUCTS])
_LINK = FACTORS.index("link")
_SHARES = np.array([FACTORS.index("compute_decode"), FACTORS.index("memory")])
_KERNEL = FACTORS.index("kernel_overlap")
CHUNK = 1 << 14
"""Entries an operation of `Plan.losses` covers at most (its arrays stay in the processor's cache)."""


def log_tpot(t: np.ndarray, f: np.ndarray, overlapped: bool = True) -> np.ndarray:
    """The log TPOT of every row of ``t`` (`TERMS` x 1 x rows) at each factor set of ``f`` (`FACTORS` x sets): an
    array sets x rows, each entry as `dse.validate.decode.tpot_at` computes it (the same operations in the same
    order). ``overlapped``: whether some row overlaps its communication (1 - overlap below 1); where none does,
    max(W, K) + 1 min(K, W) is computed as W + K (the same two numbers added).
    """
    m, w = f.shape[1], t.shape[2]
    work = np.empty((len(PRODUCTS), m, w))
    comm = np.empty((m, w))
    np.divide(t[0], f[_LINK][:, None], out=comm)
    np.multiply(t[5:11], f[_PRODUCT_FACTORS][:, :, None], out=work)
    layer, scaleup, curves, moe, scaleout = work[0], work[1], work[2:4], work[4], work[5]
    np.add(comm, scaleup, out=comm)
    np.add(comm, scaleout, out=comm)  # comm / link + n_u lat_u + n_o lat_o
    attn = np.empty((2, m, w))
    f_c, f_m = f[_SHARES][:, :, None]
    np.add(t[4], curves[1], out=attn[1])  # M_a + A n_a
    np.add(t[1:3], curves, out=curves)  # C + G n_g, M + A n_a
    c, mem = curves
    np.divide(c, f_c, out=c)  # compute, memory
    np.divide(mem, f_m, out=mem)
    a_c, a_m = attn
    np.divide(t[3], f_c, out=a_c)  # the attention kernels' compute and memory
    np.divide(a_m, f_m, out=a_m)
    np.add(layer, moe, out=layer)  # L o_l + E o_e
    k = f[_KERNEL][:, None]  # `kernel_work`, operation for operation
    step = scaleup  # free: its products are added
    if not (k < 1.0).any():
        np.maximum(c, mem, out=step)
    else:
        with np.errstate(invalid="ignore"):
            np.subtract(c, a_c, out=scaleout)
            np.subtract(mem, a_m, out=step)
            np.maximum(scaleout, step, out=step)
            np.add(step, np.maximum(a_c, a_m, out=a_c), out=step)  # apart
            if (k > 0.0).any():
                single = np.maximum(c, mem, out=a_m)
                below = k < 1.0
                np.multiply(k, single, out=c)
                np.multiply(1.0 - k, step, out=moe)
                np.add(c, moe, out=moe)
                if below.all():
                    step = moe
                else:
                    np.copyto(step, np.where(below, moe, single))
    if overlapped:  # `combine`: max(W, K) + (1 - overlap) min(K, W)
        other = curves[1]
        np.minimum(comm, step, out=other)
        np.maximum(step, comm, out=step)
        np.multiply(t[11], other, out=other)
        np.add(step, other, out=step)
    else:
        np.add(step, comm, out=step)
    np.add(step, layer, out=step)
    np.multiply(step, t[12], out=step)  # TPOT: the pass times what the request level adds
    return np.log(step, out=step)


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


@dataclass
class _Shared:
    """The distinct rows of one `DecodeTerms` (`TERMS` x 1 x distinct), and for each fit reading it (longest
    first) its rows' places among them and their log measured TPOTs (fits x longest, padded), and its length.
    """

    terms: np.ndarray
    index: np.ndarray | None  # None: one fit, reading the terms' rows in place
    log_measured: np.ndarray
    length: np.ndarray
    overlapped: bool  # some row overlaps its communication (`log_tpot`)


@dataclass
class Plan:
    """A request to `FitRows` (its fits in order) ordered and chunked, reusable at other factors: per chunk the
    shared terms, the places in the request of its fits, their rows' places among the distinct rows (flat,
    into the chunk's fits x distinct rows; None: the fit reads the terms in place), their log measured TPOTs,
    and runs (first, end, length) of fits of one length.
    """

    size: int
    chunks: list[tuple[np.ndarray, bool, np.ndarray, np.ndarray, np.ndarray, list[tuple[int, int, int]]]]

    def losses(self, f: np.ndarray) -> np.ndarray:
        """Per fit of the request, its loss at the factors of its column of ``f`` (`FACTORS` x request)."""
        out = np.empty(self.size)
        for terms, overlapped, asked, index, log_measured, runs in self.chunks:
            err = log_tpot(terms, f[:, asked], overlapped)
            if index is not None:  # each fit's rows, read off the distinct ones
                err = np.take(err.ravel(), index)
            np.subtract(err, log_measured, out=err)
            np.abs(err, out=err)
            for lo, hi, n in runs:  # numpy's pairwise sum of each fit's rows, in their order
                out[asked[lo:hi]] = np.add.reduce(err[lo:hi, :n], axis=1)
        return out


@dataclass
class FitRows:
    """The rows of many fits: fit i reads the rows ``rows`` (all where None) of ``terms`` with the measured
    TPOTs ``measured`` (aligned with ``terms``); fits given the same ``terms`` object share its rows.
    """

    shared: list[_Shared]
    of: np.ndarray  # per fit: the `_Shared` it reads, and its place there
    place: np.ndarray

    @classmethod
    def build(cls, fits: list[tuple[DecodeTerms, np.ndarray, np.ndarray | None]]) -> FitRows:
        groups: dict[int, list[int]] = {}
        for i, (terms, _, _) in enumerate(fits):
            groups.setdefault(id(terms), []).append(i)
        shared, of, place = [], np.zeros(len(fits), dtype=np.int64), np.zeros(len(fits), dtype=np.int64)
        for s, members in enumerate(groups.values()):
            d = fits[members[0]][0]
            rows = term_rows(d).T
            picks = [np.arange(len(d.rest)) if fits[i][2] is None else np.asarray(fits[i][2]) for i in members]
            if len(members) > 1:  # the rows distinct bit for bit: TPOT once each
                bits = np.ascontiguousarray(rows).view(np.dtype((np.void, rows.shape[1] * rows.itemsize))).ravel()
                _, first, inverse = np.unique(bits, return_index=True, return_inverse=True)
            else:  # one fit: its own rows, read in place
                first, inverse = picks[0], None
            lengths = np.array([len(p) for p in picks], dtype=np.int64)
            order = np.argsort(-lengths, kind="stable")
            index = np.zeros((len(members), max(int(lengths.max()), 1)), dtype=np.int64)
            log_measured = np.zeros(index.shape)
            for j, k in enumerate(order):
                p = picks[k]
                if inverse is not None:
                    index[j, :len(p)] = inverse.ravel()[p]
                log_measured[j, :len(p)] = np.log(fits[members[k]][1][p])
                of[members[k]], place[members[k]] = s, j
            index = index if inverse is not None else None
            terms = np.ascontiguousarray(rows[first].T)[:, None, :]
            shared.append(_Shared(terms, index, log_measured, lengths[order], bool((terms[11] != 1.0).any())))
        return cls(shared, of, place)

    def plan(self, fits: np.ndarray) -> Plan:
        """How `Plan.losses` evaluates the fits ``fits`` (in that order): by shared terms, in chunks of fits of
        similar length (longest first).
        """
        key = self.of[fits] * len(self.of) + self.place[fits]
        order = np.argsort(key, kind="stable")
        of = self.of[fits[order]]
        cuts = [0, *(np.flatnonzero(of[1:] != of[:-1]) + 1), len(order)]
        chunks = []
        for lo, hi in zip(cuts[:-1], cuts[1:], strict=True):
            s = self.shared[of[lo]]
            place = self.place[fits[order[lo:hi]]]
            lengths = s.length[place]
            step = max(1, CHUNK // max(s.terms.shape[2], int(lengths[0])))
            for a in range(lo, hi, step):
                b = min(a + step, hi)
                p, n = place[a - lo:b - lo], lengths[a - lo:b - lo]
                width = int(n[0])
                if n[-1] == width:
                    runs = [(0, b - a, width)]
                else:
                    ends = [*(np.flatnonzero(n[1:] != n[:-1]) + 1), len(n)]
                    runs = [(int(x), int(y), int(n[x])) for x, y in zip([0, *ends[:-1]], ends, strict=True)]
                index = None if s.index is None else (  # into the chunk's TPOTs, fits x distinct rows, flat
                    s.index[p, :width] + s.terms.shape[2] * np.arange(b - a)[:, None])
                chunks.append((s.terms, s.overlapped, order[a:b], index, s.log_measured[p, :width], runs))
        return Plan(len(fits), chunks)

    def losses(self, fits: np.ndarray, f: np.ndarray) -> np.ndarray:
        """Per entry of ``fits``, sum |log(TPOT / measured)| over the fit's rows at the factors of its column of
        ``f`` (`FACTORS` x entries), summed as numpy sums one fit's rows (pairwise, in row order).
        """
        return self.plan(fits).losses(f)
