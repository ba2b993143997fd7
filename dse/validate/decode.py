"""The decode pass of a measured run as a function of the efficiency factors: its terms read off the physics,
and TPOT from them.

A decode pass of the roofline (`dse.physics.roofline`) is, for fixed layout, batch and context, a known
function of the efficiency factors: with C, M and K its compute, memory and communication-bandwidth times at
the peaks, n_u and n_o its collectives inside and across scale-up domains, L its layers and E its MoE layers,

    step = combine(C / f_c, M / f_m, K / f_l + n_u lat_u + n_o lat_o, L o_l + E o_e, overlap,
                   C_a / f_c, M_a / f_m, k)

(`dse.physics.serving.combine`: the kernel groups' work, k max(C, M) + (1 - k) (max(C - C_a, M - M_a) +
max(C_a, M_a)) with C_a and M_a the attention kernels' share of C and M, communication serialized by
1 - overlap, then the fixed overheads), with C and M (and M_a) grown by the half-performance lengths
(`dse.catalog.hardware.CURVES`): C + G n_g and M + A n_a (M_a + A n_a), G the compute time at the peak of
one more row in every GEMM the pass multiplies and A the memory time at the peak of one more token of KV per
sequence and attention layer. `decode_terms` reads C, M, C_a, M_a, K, G, A and the counts off the physics
itself (one pass at the peaks, one per latency at 1 us, one per length at 1 row or token); TPOT = step x
rest, where ``rest`` is what the request level adds to the pass at the catalog's factors (prefill interference
1 / (1 - u) in an aggregated replica), held fixed while `dse.validate.fit` fits the factors of
`dse.validate.factors.FACTORS`.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace

import numpy as np
import pandas as pd

from dse.catalog.hardware import Efficiency, EfficiencyCatalog
from dse.physics.roofline import Candidates, evaluate_at
from dse.physics.serving import combine
from dse.validate.factors import FACTOR, FACTORS, FIXED_TIMES, RUN_FITTED
from dse.validate.predict import predict_runs, predict_runs_split, run_candidates, run_tables
from dse.validate.runs import group_key


@dataclass
class DecodeTerms:
    """Per row: the decode pass's times at the peaks (s; the attention kernels' compute and KV reads among them),
    its collective and layer counts, the compute time at
    the peak of one row more in every GEMM (``gemm_rows``) and the memory time at the peak of one token more of
    KV per sequence and attention layer (``attention_tokens``), its overlap, and ``rest`` (the measured-run
    TPOT the physics predicts over its decode pass at the catalog's factors).
    """

    compute: np.ndarray
    memory: np.ndarray
    attention_compute: np.ndarray
    kv_memory: np.ndarray
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
    attention = d.attention_compute / f["compute_decode"]
    kv = (d.kv_memory + d.attention_tokens * f["attention_half_context"]) / f["memory"]
    return combine(compute, memory, comm, overhead, d.overlap, attention, kv, f["kernel_overlap"])


def tpot_at(d: DecodeTerms, f: dict) -> np.ndarray:
    """TPOT at factors ``f``: the decode pass times what the request level adds (``rest``)."""
    return decode_step(d, f) * d.rest


@dataclass
class ServingRows:
    """Measured serving runs as the joint fit sees them (`dse.validate.calibration.load_serving_rows`): each
    row's decode pass as `DecodeTerms`, whether it runs as two micro-batches (its overlap is then the split's,
    else the catalog's ``overlap``), its measured TPOT (s) and the family whose factors it calibrates (""
    where it calibrates none: a layout with assumed worker counts, a system of no family).
    """

    terms: DecodeTerms
    split: np.ndarray
    measured: np.ndarray
    family: np.ndarray

    def of(self, family: str) -> ServingRows | None:
        """The rows of ``family``; None where there are none."""
        rows = np.flatnonzero(self.family == family)
        if not len(rows):
            return None
        return ServingRows(self.terms.take(rows), self.split[rows], self.measured[rows], self.family[rows])

    def log_errors(self, eff: Efficiency) -> np.ndarray:
        """log(predicted / measured) TPOT at the factors ``eff``."""
        d = replace(self.terms, overlap=np.where(self.split, self.terms.overlap, eff.overlap))
        return np.log(tpot_at(d, {k: getattr(eff, k) for k in FACTORS}) / self.measured)


# ---- the terms read off the physics ----------------------------------------------------------------------------------
def decode_terms(table: pd.DataFrame, predicted_tpot: np.ndarray, decode_batch: pd.Series,
                 split: np.ndarray, factors: EfficiencyCatalog | None = None,
                 ) -> tuple[DecodeTerms, dict[str, np.ndarray]]:
    """The decode pass of every row (at its mean context, with its batch: the replica's share of the
    concurrency in an aggregated row, or the sequences its KV pool admits where fewer (`dse.validate.predict.
    admitted`), the closed loop's decode batch in a disaggregated one; two micro-batches
    where ``split``) as `DecodeTerms`: times at the peaks, collective and layer counts and the times per
    row and per token of the half-performance lengths, read off the physics with every fraction at 1, each
    latency probed at 1 us and each length at 1 row or token, and ``rest`` = the row's predicted TPOT
    over its pass at the catalog's factors (``factors``, default: the catalog's). Returns the terms and the
    catalog's factors per row.
    """
    n = len(table)
    models, systems, mt, st = run_tables(table, factors)
    peak = {**{k: 1.0 for k in ("compute_prefill", "compute_decode", "memory", "link", "hbm_usable")}, "overlap": 0.0}
    probe = {k: FACTOR[k].scale for k in RUN_FITTED if FACTOR[k].probe}  # 1 us; one row, one token
    held = decode_batch[table.index].to_numpy(dtype=float)  # the sequences a replica runs at once
    in_flight = np.where(np.isnan(held), table["in_flight"].to_numpy(), held)
    context = table["isl"].to_numpy() + table["osl"].to_numpy() / 2.0
    cand = run_candidates(table, models, systems, "", in_flight / table["pp"].to_numpy(), context,
                          np.where(split, 2, 1)).broadcast()
    catalog_eff = st.efficiency_of(np.asarray(cand.system))
    # one evaluation of every row at the peaks, at the catalog's factors and at each probe, stacked
    effs = [Efficiency(**peak), catalog_eff, *(Efficiency(**peak, **{k: v}) for k, v in probe.items())]
    stacked = Efficiency(**{f: np.concatenate([np.broadcast_to(getattr(e, f), n) for e in effs])
                            for f in Efficiency.__dataclass_fields__})
    tiled = Candidates(*(np.tile(np.asarray(getattr(cand, f.name)), len(effs)) for f in fields(cand)))
    r = evaluate_at(tiled, mt, st, stacked, [{"context": np.tile(context, len(effs)), "phase": 0}])[0]
    at_peak, cat, *probed = ({k: v[i * n:(i + 1) * n] for k, v in r.items()} for i in range(len(effs)))
    out = {"compute": at_peak["compute_s"], "memory": at_peak["memory_s"], "comm": at_peak["comm_s"],
           "attention_compute": at_peak["attention_compute_s"], "kv_memory": at_peak["kv_memory_s"]}
    for (k, v), moved_pass in zip(probe.items(), probed, strict=True):  # each probe moves one time of the pass
        time = FACTOR[k].probe
        moved = (moved_pass[time] - at_peak[time]) / v
        out[FACTOR[k].term] = np.rint(moved) if k in FIXED_TIMES else moved  # counts of collectives, layers
    out["overlap"] = cat["overlap"]
    out["rest"] = predicted_tpot / cat["step_s"]
    return DecodeTerms(**{k: np.array(out[k], dtype=np.float64) for k in DecodeTerms.__dataclass_fields__}), \
        {k: np.array(getattr(catalog_eff, k), dtype=np.float64) for k in FACTORS}


def _pick(a: DecodeTerms, b: DecodeTerms, use_b: np.ndarray) -> DecodeTerms:
    """Row by row, the terms of ``b`` where ``use_b``, else those of ``a``."""
    return DecodeTerms(**{k: np.where(use_b, getattr(b, k), getattr(a, k)) for k in DecodeTerms.__dataclass_fields__})


@dataclass
class TpotPasses:
    """The decode passes of every row: TPOT predicted at the catalog's factors unsplit and with two
    micro-batches (their log errors ``log_error`` and ``split_log_error``), the rows an expert all-to-all makes
    eligible for the split, the catalog's factors per row, `DecodeTerms` unsplit and split, and the decode batch
    of each (split: the two-batch closed loop's, which holds another batch in a disaggregated row).
    """

    unsplit_tpot: np.ndarray
    split_tpot: np.ndarray
    log_error: np.ndarray
    split_log_error: np.ndarray
    eligible: np.ndarray
    fw_mode: np.ndarray
    groups: np.ndarray
    catalog: dict[str, np.ndarray]
    unsplit: DecodeTerms
    split: DecodeTerms
    batch: pd.Series
    split_batch: pd.Series

    def take(self, rows: np.ndarray) -> TpotPasses:
        """The passes of the rows ``rows`` (positions)."""
        return TpotPasses(*(getattr(self, k)[rows] for k in ("unsplit_tpot", "split_tpot", "log_error",
                                                              "split_log_error", "eligible", "fw_mode", "groups")),
                          {k: v[rows] for k, v in self.catalog.items()}, self.unsplit.take(rows),
                          self.split.take(rows), self.batch.iloc[rows], self.split_batch.iloc[rows])

    def terms_for(self, split: np.ndarray) -> DecodeTerms:
        """The terms with the rows of ``split`` (among the eligible) run as two micro-batches."""
        return _pick(self.unsplit, self.split, split & self.eligible)

    def decode_batch(self, split: np.ndarray) -> pd.Series:
        """Per row, the decode batch of its pass with the rows of ``split`` run as two micro-batches."""
        return self.split_batch.where(split & self.eligible, self.batch)


def two_batch_eligible(t: pd.DataFrame) -> np.ndarray:
    """The rows with an expert all-to-all for two micro-batches to hide."""
    return t["ep"].to_numpy() > 1


def predicted_passes(t: pd.DataFrame, factors: EfficiencyCatalog | None = None) -> tuple[pd.DataFrame, TpotPasses]:
    """`predict_runs` of ``t`` and its `tpot_passes`, the rows' predictions unsplit and split in one evaluation
    (`dse.validate.predict.predict_runs_split`).
    """
    pred, two = predict_runs_split(t, two_batch_eligible(t), factors)
    return pred, tpot_passes(t, pred, factors, two)


def tpot_passes(t: pd.DataFrame, pred: pd.DataFrame, factors: EfficiencyCatalog | None = None,
                two: pd.DataFrame | None = None) -> TpotPasses:
    """Every row's decode pass as `DecodeTerms` (`decode_terms`), unsplit and, where an expert all-to-all could
    hide behind the other micro-batch (`two_batch_eligible`), split in two; ``pred`` is `predict_runs` of ``t``
    at the catalog's factors (``factors``, default: the catalog's), ``two`` that of the eligible rows with two
    micro-batches (computed where not given).
    """
    meas = t["measured_tpot_s"].to_numpy()
    eligible = two_batch_eligible(t)
    p1 = pred["predicted_tpot_s"].astype(float).to_numpy()
    p2 = p1.copy()
    batch2 = pred["decode_batch"].copy()  # a disaggregated row's closed loop holds another decode batch when split
    if eligible.any():
        if two is None:
            two = predict_runs(t[eligible], two_batch=True, factors=factors)
        p2[eligible] = two["predicted_tpot_s"].astype(float).to_numpy()
        batch2[two.index] = two["decode_batch"]
    unsplit, catalog = decode_terms(t, p1, pred["decode_batch"], np.zeros(len(t), dtype=bool), factors)
    split = decode_terms(t, p2, batch2, eligible, factors)[0] if eligible.any() else unsplit
    return TpotPasses(p1, p2, np.log(p1 / meas), np.log(p2 / meas), eligible,
                      (t["backend"].astype(str) + "|" + t["mode"]).to_numpy(), group_key(t).to_numpy(), catalog,
                      unsplit, split, pred["decode_batch"], batch2)
