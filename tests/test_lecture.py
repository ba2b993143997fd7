"""The lecture's quantitative claims, computed from the catalog under --ideal (pure roofline)."""

from __future__ import annotations

import math

import pytest
from helpers import run

from dse.physics.layout import Layout, resolve_layout
from dse.physics.roofline import balance_batch_closed_form, kv_crossover_bytes_per_token

TP8 = Layout(tp=8, dp=1, ep=1, etp=8, pp=1)


def weight_read_bytes(model, bytes_per_param=2.0):
    """Weights a decode step streams: every weight but the input-embedding table (a lookup)."""
    return (model.params_total - model.params_embedding) * bytes_per_param


def test_balance_batch_is_flops_over_bandwidth_times_sparsity(models, systems):
    h100 = systems["h100"]
    for model_id, layout in (("llama-3.1-70b", TP8), ("deepseek-v3", Layout(tp=8, dp=1, ep=8, etp=1, pp=1))):
        m = models[model_id]
        r = run(m, h100, layout, batch=1, context=1)
        closed = balance_batch_closed_form(
            h100.flops["bf16"], h100.hbm_bandwidth, 2.0, m.params_total - m.params_embedding, m.params_active
        )
        assert r["balance_batch"] == pytest.approx(closed, rel=1e-12)
        # "about 300 x sparsity": H100 has 989 TFLOP/s over 3.35 TB/s = 295 FLOP per byte; sparsity
        # here is weights streamed per step over weights multiplied per token (the embedding table
        # is a lookup, neither streamed nor multiplied)
        sparsity = (m.params_total - m.params_embedding) / m.params_active
        assert r["balance_batch"] / sparsity == pytest.approx(h100.flops["bf16"] / h100.hbm_bandwidth)
        assert r["balance_batch"] / sparsity == pytest.approx(300, rel=0.02)


def test_deepseek_balance_batch_with_the_lectures_sparsity_of_8(systems):
    # 32 of 256 experts active -> sparsity 8 -> about 2,400 at ~300 FLOP/byte
    h100 = systems["h100"]
    assert balance_batch_closed_form(h100.flops["bf16"], h100.hbm_bandwidth, 2.0, 8, 1) == pytest.approx(2400, rel=0.02)


def test_at_the_balance_batch_compute_time_equals_weight_fetch_time(models, systems):
    m, h100 = models["llama-3.1-70b"], systems["h100"]
    b = run(m, h100, TP8, batch=1, context=1)["balance_batch"]
    r = run(m, h100, TP8, batch=round(b), context=1)
    weight_time = weight_read_bytes(m) / (8 * h100.hbm_bandwidth)
    weight_compute = r["compute_s"] - r["attention_flops_per_step"] / (8 * h100.flops["bf16"])
    assert weight_compute == pytest.approx(weight_time * round(b) / b)


def test_hbm_drain_time_is_about_15_ms_for_288_gb_at_20_tb_s(systems):
    rubin = systems["vr200-nvl144"]
    assert rubin.hbm_capacity == 288e9
    assert rubin.scaled(hbm_bandwidth=20e12 / rubin.hbm_bandwidth).hbm_drain_s == pytest.approx(0.0144)
    assert 0.010 < rubin.hbm_drain_s < 0.020  # 288 GB at the catalog's 22 TB/s: 13 ms
    for s in systems.values():
        assert 0.005 < s.hbm_drain_s < 0.05, s.id  # "~20 ms" across generations


def test_latency_floor_is_weight_bytes_over_aggregate_bandwidth(models, systems):
    m, h100 = models["llama-3.1-70b"], systems["h100"]
    r = run(m, h100, TP8, batch=1, context=1)
    floor = weight_read_bytes(m) / (8 * h100.hbm_bandwidth)
    assert r["step_s"] == pytest.approx(floor, rel=1e-3)
    assert r["bound"] == 1  # memory
    assert run(m, h100, TP8, batch=64, context=1)["step_s"] >= floor


def test_moe_at_batch_one_reads_only_the_routed_experts_but_waits_for_the_busiest_gpu(models, systems):
    """Each GPU holds 4 experts (ceil(256 / 72)); one reads those of its experts a token landed on. The step
    waits for the GPU that reads the most: the expected maximum over the 72 GPUs of Binomial(4, p)."""
    m, gb200 = models["deepseek-v3"], systems["gb200-nvl72"]
    layout = resolve_layout(m, ep=72)
    bw = gb200.hbm_bandwidth
    dense = (m.params_dense - m.params_embedding) * 2 / bw  # replicated on every DP rank, always read
    expert = m.moe_layers * m.expert_params * 2 / bw
    for batch in (1, 16, 4096):
        p = 1 - (1 - 8 / 256) ** batch  # chance a given expert receives a token
        cdf = [sum(math.comb(4, i) * p**i * (1 - p) ** (4 - i) for i in range(j + 1)) for j in range(5)]
        busiest = sum(1 - cdf[j] ** 72 for j in range(4))  # E[max] = sum_j P(max > j)
        r = run(m, gb200, layout, batch=batch, context=1)
        kv = math.ceil(batch / 72)  # sequences on the busiest DP rank
        kv_time = kv * m.kv_bytes_per_token() / bw
        assert r["memory_s"] == pytest.approx(dense + expert * busiest + kv_time, rel=1e-9)
        if batch == 1:  # a whole expert or more, against 4 x 8/256 = 1/8 of one on the mean GPU
            assert 1.0 < busiest < 1.5


def test_cost_per_token_flattens_past_the_balance_batch(models, systems):
    m, h100 = models["llama-3.1-70b"], systems["h100"]
    b = run(m, h100, TP8, batch=1, context=1)["balance_batch"]
    cost = {k: run(m, h100, TP8, batch=k * b, context=1)["usd_per_mtok"] for k in (1 / 64, 1, 4, 16)}
    floor = h100.price_per_s * 2 * m.params_active / h100.flops["bf16"] * 1e6
    assert cost[4] == pytest.approx(floor, rel=1e-3)
    assert cost[16] == pytest.approx(cost[4], rel=1e-3)  # flat: compute-bound, nothing left to amortize
    assert cost[1 / 64] / cost[1] == pytest.approx(64, rel=0.01)  # below balance: weight fetch amortized 1/B


def test_kv_bound_crossover_is_about_1_7_kb_per_token_for_100b_active_at_200k(systems):
    h100 = systems["h100"]
    per_token = kv_crossover_bytes_per_token(h100.flops["fp8"], h100.hbm_bandwidth, 100e9, 200e3)
    assert per_token == pytest.approx(1.7e3, rel=0.02)


def test_at_the_crossover_context_kv_fetch_time_equals_compute_time(models, systems):
    m, h100 = models["llama-3.1-70b"], systems["h100"]
    crossover = run(m, h100, TP8, batch=64, context=1)["kv_crossover_context"]
    r = run(m, h100, TP8, batch=64, context=crossover)
    kv_time = 64 * crossover * m.kv_bytes_per_token() / 8 / h100.hbm_bandwidth
    assert r["compute_s"] == pytest.approx(kv_time, rel=1e-9)


def test_weight_compute_per_token_does_not_depend_on_context(models, systems):
    m, h100 = models["llama-3.1-70b"], systems["h100"]
    weight_flops = set()
    for context in (1_000, 100_000, 1_000_000):
        r = run(m, h100, TP8, batch=8, context=context)
        weight_flops.add(round(r["flops_per_step"] - r["attention_flops_per_step"]))
        assert r["attention_flops_per_step"] > 0
    assert len(weight_flops) == 1
    assert weight_flops.pop() == pytest.approx(8 * 2 * m.params_active)


def test_pipeline_parallelism_leaves_kv_per_stage_unchanged(models, systems):
    m, h100 = models["llama-3.1-405b"], systems["h100"]
    base = run(m, h100, TP8, batch=16, context=8192)
    for pp in (2, 3, 6):  # degrees that divide its 126 layers (whole layers per stage: tests/test_pipeline_stages.py)
        r = run(m, h100, Layout(tp=8, dp=1, ep=1, etp=8, pp=pp), batch=16, context=8192)
        assert r["kv_bytes_per_chip"] == pytest.approx(base["kv_bytes_per_chip"])
        assert r["weights_bytes_per_chip"] == pytest.approx(base["weights_bytes_per_chip"] / pp)
        assert r["compute_s"] == pytest.approx(base["compute_s"])  # latency unchanged
        assert r["memory_s"] == pytest.approx(base["memory_s"])
        assert r["sequences_in_flight"] == 16 * pp
        assert r["usd_per_mtok"] == pytest.approx(base["usd_per_mtok"], rel=1e-3)  # PP x chips, PP x tokens


def test_expert_parallelism_across_two_domains_is_slower_by_the_scale_out_ratio(models, systems):
    m, gb200 = models["deepseek-v3"], systems["gb200-nvl72"]
    su, so = gb200.scaleup_bandwidth, gb200.scaleout_bandwidth
    k = m.spec.ffn.top_k
    one = run(m, gb200, resolve_layout(m, ep=72), batch=72 * 64, context=4096)
    two = run(m, gb200, resolve_layout(m, ep=144), batch=144 * 64, context=4096)  # same tokens per chip

    def chips_hit(ep: int) -> float:  # distinct chips a token's k distinct experts land on (one copy per chip)
        return ep * (1 - math.prod((256 - 256 / ep - i) / (256 - i) for i in range(k)))

    from dse.physics.roofline import routed_straggler

    # the busiest chip receives a little more than the mean (routing statistics, the same 64 tokens per chip)
    busiest = {ep: float(routed_straggler(ep * 64, 256, k, ep)[2]) for ep in (72, 144)}

    # inside one domain a chip sends each token to the 71/72 of its destination chips that are not itself,
    # over scale-up; across two domains one copy per token crosses scale-out to the other domain (forwarded
    # inside it), unless all its destination chips sit at home: 1 - (1/2)^copies, which sets the time
    scaleup_one = chips_hit(72) * 71 / 72 / su
    scaleout_two = (1 - 0.5 ** chips_hit(144)) / so
    assert scaleout_two > chips_hit(144) * 71 / 144 / su  # scale-out binds
    assert two["ep_comm_s"] / one["ep_comm_s"] == pytest.approx(busiest[144] * scaleout_two / (busiest[72] * scaleup_one))
    assert two["ep_comm_s"] / one["ep_comm_s"] > su / so / 8
    big = run(m, gb200.scaled(scaleup_domain=2), resolve_layout(m, ep=144), batch=144 * 64, context=4096)
    # the same 144 chips in one domain twice the size: every copy stays on scale-up
    assert two["ep_comm_s"] / big["ep_comm_s"] == pytest.approx(scaleout_two / (chips_hit(144) * 143 / 144 / su))


def test_the_dispatch_sends_one_copy_per_destination_chip_not_per_expert(models, systems):
    """Experts sharded over the attention TP group (EP 1, DP 1): every chip already holds every token, no
    dispatch. Attention DP 8 with experts TP-sharded over the 8 chips: each token goes once to the 7 other
    chips. EP 8: a token's 8 distinct experts land on 8 (1 - C(224, 8) / C(256, 8)) = 5.29 distinct chips on
    average, not 8; the busiest chip receives more than that mean (`routed_straggler`)."""
    from dse.physics.roofline import routed_straggler

    m, h200 = models["deepseek-v3"], systems["h200"]
    su, k, d = h200.scaleup_bandwidth, m.spec.ffn.top_k, m.spec.d_model
    batch = 64
    tp8 = run(m, h200, resolve_layout(m, tp=8), batch=batch, context=4096, weights="fp8")
    assert tp8["ep_comm_s"] == 0 and tp8["tp_comm_s"] > 0
    per_layer = m.moe_layers * d * (1 + 2) / su  # FP8 dispatch, 16-bit combine, per token sent
    dp8 = run(m, h200, resolve_layout(m, tp=1, dp=8, etp=8), batch=batch, context=4096, weights="fp8")
    assert dp8["ep_comm_s"] == pytest.approx(batch / 8 * 7 * per_layer)
    ep8 = run(m, h200, resolve_layout(m, tp=1, dp=8, ep=8), batch=batch, context=4096, weights="fp8")
    hit = 1 - math.comb(256 - 32, k) / math.comb(256, k)
    busiest = float(routed_straggler(batch, 256, k, 8)[2])
    assert 1.0 < busiest < 1.2
    assert ep8["ep_comm_s"] == pytest.approx(busiest * batch / 8 * 8 * hit * 7 / 8 * per_layer)


def test_an_moe_layer_adds_its_fixed_kernel_time_to_every_pass(models, systems):
    from dataclasses import replace

    from dse.catalog.hardware import efficiency_for

    m, h200 = models["deepseek-v3"], systems["h200"]
    eff = efficiency_for("h200")
    assert eff.moe_layer_overhead > 0
    base = run(m, h200, TP8, batch=8, context=2048, weights="fp8", eff=replace(eff, moe_layer_overhead=0.0))
    with_moe = run(m, h200, TP8, batch=8, context=2048, weights="fp8", eff=eff)
    assert with_moe["step_s"] - base["step_s"] == pytest.approx(m.moe_layers * eff.moe_layer_overhead, rel=1e-9)
    dense = models["llama-3.1-70b"]
    assert run(dense, h200, TP8, 8, 2048, eff=eff)["step_s"] == pytest.approx(
        run(dense, h200, TP8, 8, 2048, eff=replace(eff, moe_layer_overhead=0.0))["step_s"], rel=1e-12)


def test_long_context_decode_is_memory_bound(models, systems):
    m, gb200 = models["llama-3.1-70b"], systems["gb200-nvl72"]
    r = run(m, gb200, TP8, batch=256, context=200_000)
    assert r["bound"] == 1
    assert r["kv_bytes_per_chip"] > r["weights_bytes_per_chip"]


def test_mla_kv_split_by_sequence_holds_one_tp_th_of_it_per_chip_for_two_all_to_alls(models, systems):
    """Pope et al. (2022), sec. 3.3: with one KV head (MQA; MLA's latent) a split by head keeps a whole copy
    of every sequence's KV on each TP rank; split by sequence, each rank holds all heads of 1/TP of the
    sequences and the queries and attention outputs cross the TP group by two all-to-alls per layer."""
    m, h200 = models["deepseek-v3"], systems["h200"]
    a = m.spec.attention
    batch, context = 64, 32768
    heads = run(m, h200, TP8, batch, context, weights="fp8", kv="fp8")
    seqs = run(m, h200, TP8, batch, context, weights="fp8", kv="fp8", kv_shard="batch")
    whole = batch * context * m.kv_bytes_per_token("fp8")
    assert heads["kv_bytes_per_chip"] == pytest.approx(whole)  # every rank a copy
    assert seqs["kv_bytes_per_chip"] == pytest.approx(whole / 8)
    kv_read = (whole - whole / 8) / h200.hbm_bandwidth  # decode reads what the chip holds
    assert heads["memory_s"] - seqs["memory_s"] == pytest.approx(kv_read, rel=1e-9)
    assert seqs["compute_s"] == pytest.approx(heads["compute_s"], rel=1e-12)  # 8 sequences' attention per chip
    # absorbed MLA decode: a query of heads x (kv_lora + rope) in, an output of heads x kv_lora back, bf16
    io = batch * a.n_heads * (2 * a.kv_lora_rank + a.qk_rope_head_dim) * 2
    reshard = m.spec.n_layers * io / 8 * 7 / 8 / h200.scaleup_bandwidth
    assert seqs["tp_comm_s"] - heads["tp_comm_s"] == pytest.approx(reshard, rel=1e-9)
    assert seqs["step_s"] < 0.7 * heads["step_s"]  # KV-bound at 32k: the split pays for its all-to-alls
    # three sequences on 8 ranks: the busiest rank holds one whole sequence's KV
    three = run(m, h200, TP8, 3, context, weights="fp8", kv="fp8", kv_shard="batch")
    assert three["kv_bytes_per_chip"] == pytest.approx(context * m.kv_bytes_per_token("fp8"))


def test_gqa_with_a_kv_head_per_rank_gains_nothing_from_a_split_by_sequence(models, systems):
    m, h100 = models["llama-3.1-70b"], systems["h100"]  # 8 KV heads over TP 8: one each, no copy
    heads = run(m, h100, TP8, 64, 8192)
    seqs = run(m, h100, TP8, 64, 8192, kv_shard="batch")
    assert seqs["kv_bytes_per_chip"] == pytest.approx(heads["kv_bytes_per_chip"])
    assert seqs["memory_s"] == pytest.approx(heads["memory_s"])
    assert seqs["tp_comm_s"] > heads["tp_comm_s"] and seqs["step_s"] >= heads["step_s"]
