"""Two-batch overlap (a decode pass split into two micro-batches, one communicating while the other computes)
and the closed loop of a disaggregated benchmark in which only the requests past their prefill are decoding."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pandas as pd
import pytest

from dse.catalog.hardware import IDEAL, get_system
from dse.catalog.models import get_model
from dse.catalog.units import DTYPES
from dse.errors import InputError
from dse.physics.evaluate import Config, evaluate_config, evaluate_frame
from dse.physics.roofline import Candidates, ModelTable, SystemTable, evaluate, evaluate_at
from dse.physics.serving import Request, decode_pool, decode_share_closed_loop, disaggregated_closed_loop, prefill_pool

FP8 = DTYPES.index("fp8")
TABLES = (ModelTable.build([get_model("deepseek-v3")]), SystemTable.build([get_system("h200")]))
BATCHES = np.array([16.0, 256.0, 1024.0, 4096.0])


def wide_ep(batch, micro=1, phase=0):
    """DeepSeek-V3 in FP8 over 16 H200 (two 8-GPU domains): attention DP16, experts EP16."""
    return Candidates(model=0, system=0, tp=1, dp=16, ep=16, etp=1, pp=1, batch=batch, context=2048, phase=phase,
                      weights_dtype=FP8, kv_dtype=FP8, micro_batches=micro)


def test_a_split_pass_is_twice_a_half_batch_pass_with_communication_hidden():
    """max(2 W_h, 2 M_h) + overhead, W_h the work of half the batch (its kernel groups' blend, k max(C, M) + (1 - k)
    (max(C - C_a, M - M_a) + max(C_a, M_a))) and M_h its communication."""
    split = evaluate(wide_ep(BATCHES, micro=2), *TABLES)
    half = evaluate(wide_ep(BATCHES / 2), *TABLES)
    c, m, c_a, m_a, k = (half[x] for x in ("compute_s", "memory_s", "attention_compute_s", "kv_memory_s",
                                           "kernel_overlap"))
    work = 2 * (k * np.maximum(c, m) + (1 - k) * (np.maximum(c - c_a, m - m_a) + np.maximum(c_a, m_a)))
    assert np.allclose(split["step_s"], np.maximum(work, 2 * half["comm_s"]) + half["overhead_s"], rtol=1e-12)
    assert np.allclose(split["memory_s"], 2 * half["memory_s"]) and np.allclose(split["comm_s"], 2 * half["comm_s"])


def test_two_batch_overlap_pays_at_large_batches_and_costs_a_weight_read_at_small_ones():
    """Each micro-batch reads the weights again: at 16 sequences (memory-bound on weights) the split is slower;
    at 4,096 the hidden all-to-all outweighs the second read."""
    one, two = evaluate(wide_ep(BATCHES), *TABLES), evaluate(wide_ep(BATCHES, micro=2), *TABLES)
    assert two["step_s"][0] > one["step_s"][0]
    assert two["step_s"][-1] < one["step_s"][-1]
    # never below the ideal roofline of the unsplit pass: both halves' work and communication still happen
    ideal = evaluate(wide_ep(BATCHES), *TABLES, eff=IDEAL)
    assert (two["step_s"] >= ideal["step_s"] * (1 - 1e-12)).all()


def test_prefill_passes_are_not_split():
    a = evaluate(wide_ep(np.array([16.0]), phase=1), *TABLES)
    b = evaluate(wide_ep(np.array([16.0]), micro=2, phase=1), *TABLES)
    assert a["step_s"] == pytest.approx(b["step_s"], rel=1e-15)


def test_the_request_level_decode_step_keeps_the_split_passes_overlap():
    """TPOT of a decode pool is its pass time: the split pass's hidden communication is not serialized again
    by the calibrated overlap when the request level recombines the pass's parts."""
    req = Request(1024, 1024)
    cand = wide_ep(BATCHES, micro=2)
    pool = decode_pool(cand, *TABLES, req)
    mean = evaluate_at(cand, *TABLES, None, [{"context": req.prompt + req.output / 2.0, "phase": 0}])[0]
    assert np.allclose(pool["tpot_s"], mean["step_s"], rtol=1e-12) and (mean["overlap"] == 1.0).all()


def test_evaluate_and_evaluate_frame_take_the_micro_batches_and_kv_split():
    cfg = Config(model="deepseek-v3", system="h200", batch=4096, context=2048, tp=1, dp=16, ep=16,
                 weights_dtype="fp8", kv_dtype="fp8", micro_batches=2)
    one = evaluate_config(replace(cfg, micro_batches=1))
    two = evaluate_config(cfg)
    assert two["micro_batches"] == 2 and two["step_s"] < one["step_s"]
    frame = pd.DataFrame([{"model": "deepseek-v3", "system": "h200", "batch": 4096, "context": 2048, "tp": 1,
                           "dp": 16, "ep": 16, "weights_dtype": "fp8", "kv_dtype": "fp8", "micro_batches": m}
                          for m in (1, 2)] + [{"model": "deepseek-v3", "system": "h200", "batch": 64,
                                               "context": 8192, "tp": 8, "weights_dtype": "fp8", "kv_dtype": "fp8",
                                               "kv_shard": k} for k in ("heads", "batch")])
    out = evaluate_frame(frame)
    assert out["step_s"].iloc[:2].tolist() == pytest.approx([one["step_s"], two["step_s"]], rel=1e-12)
    by_seq = evaluate_config(Config(model="deepseek-v3", system="h200", batch=64, context=8192, tp=8,
                                    weights_dtype="fp8", kv_dtype="fp8", kv_shard="batch"))
    assert out["step_s"].iloc[3] == pytest.approx(by_seq["step_s"], rel=1e-12)
    # MLA's one latent head: split by head every TP rank keeps all of it, split by sequence 1/8
    assert out["kv_bytes_per_chip"].iloc[3] == pytest.approx(out["kv_bytes_per_chip"].iloc[2] / 8, rel=1e-12)
    with pytest.raises(InputError, match="--micro-batches must be 1 .* or 2"):
        evaluate_config(replace(cfg, micro_batches=3))


def test_only_the_requests_past_their_prefill_are_in_the_decode_batch():
    """Little's law over the two stages of a closed-loop benchmark: C = lambda TTFT + replicas n, n the batch
    per decode replica, n = lambda (O - 1) TPOT(n) / replicas, and the decode pool holds fewer than C."""
    req = Request(8192, 1024)
    conc, reps = np.array([8.0, 256.0, 2048.0]), np.array([1.0, 2.0, 4.0])
    pcand = Candidates(model=0, system=0, tp=8, dp=1, ep=8, etp=1, pp=1, batch=1.0, context=8192, weights_dtype=FP8,
                       kv_dtype=FP8)
    pre = prefill_pool(pcand, *TABLES, req)
    cand = Candidates(model=0, system=0, tp=1, dp=8, ep=8, etp=1, pp=1, batch=conc / reps, context=9216,
                      weights_dtype=FP8, kv_dtype=FP8)

    def at(n):
        return decode_pool(replace(cand, batch=n), *TABLES, req)

    r, dec = decode_share_closed_loop(at, pre, req, conc, 1.0, reps)
    n, lam = r["decode_batch"], r["requests_per_s"]
    assert np.allclose(lam * r["ttft_s"] + reps * n, conc, rtol=1e-4)
    assert np.allclose(n * reps, lam * (req.output - 1) * r["tpot_s"], rtol=1e-4)
    assert (n < conc / reps).all() and np.allclose(r["tpot_s"], dec["tpot_s"])
    # everything decoding (the old mapping) gives a slower decode: TPOT rises with the batch
    full = disaggregated_closed_loop(at(conc / reps), pre, req, conc, 1.0)
    assert (full["tpot_s"] > r["tpot_s"]).all()
