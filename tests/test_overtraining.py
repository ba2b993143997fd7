"""The training step's memory and compute options (`dse.physics.training`); compute equalization and the lifetime
program are tested in test_compute_equalization.py."""

from __future__ import annotations

import pytest


def test_training_memory_options_trade_memory_for_compute():
    from dse.catalog.hardware import get_system
    from dse.catalog.models import get_model
    from dse.physics.training import TrainLayout, train_step

    m, h100 = get_model("llama-3.1-70b"), get_system("h100")
    r = {rc: train_step(m, h100, TrainLayout(tp=8, pp=4, dp=16, micro_batch=1, recompute=rc), 512, 8192)
         for rc in ("none", "selective", "full", "reversible")}
    act = [r[k]["activation_bytes_per_chip"] for k in ("none", "selective", "full", "reversible")]
    assert act == sorted(act, reverse=True)  # each option keeps less
    assert r["full"]["hardware_flops"] == r["reversible"]["hardware_flops"] > r["none"]["hardware_flops"]
    assert r["none"]["mfu"] >= r["full"]["mfu"]
    zero0 = train_step(m, h100, TrainLayout(tp=8, pp=4, dp=16, zero=0), 512, 8192)
    assert zero0["optimizer_bytes_per_chip"] == 16 * r["full"]["optimizer_bytes_per_chip"]  # ZeRO-1 shards over DP


def test_moe_training_shards_experts_over_ep():
    from dse.catalog.hardware import get_system
    from dse.catalog.models import get_model
    from dse.physics.training import TrainLayout, train_step

    m, gb200 = get_model("deepseek-v3"), get_system("gb200-nvl72")
    one = train_step(m, gb200, TrainLayout(tp=1, pp=8, dp=64, ep=1), 1024, 4096)
    wide = train_step(m, gb200, TrainLayout(tp=1, pp=8, dp=64, ep=64), 1024, 4096)
    assert wide["weights_bytes_per_chip"] < one["weights_bytes_per_chip"] / 10
    assert wide["ep_s"] > 0 and one["ep_s"] == 0


def test_fp8_training_runs_the_linear_layers_at_the_fp8_rate():
    """DeepSeek-V3's FP8 recipe: linear-layer GEMMs at the FP8 peak, attention products at BF16. Compute time is
    (hardware FLOPs - attention FLOPs) / FP8 peak + attention FLOPs / BF16 peak; MFU stays against BF16; a chip
    without FP8 tensor units refuses it."""
    from dse.catalog.hardware import get_system
    from dse.catalog.models import get_model
    from dse.errors import InputError
    from dse.physics.training import TrainLayout, train_step

    m, h800 = get_model("deepseek-v3"), get_system("h800")
    lay = dict(tp=1, pp=16, dp=128, ep=64, micro_batch=1, recompute="full")
    bf16 = train_step(m, h800, TrainLayout(**lay), 15360, 4096, ideal=True)
    fp8 = train_step(m, h800, TrainLayout(**lay, gemm_dtype="fp8"), 15360, 4096, ideal=True)
    tokens = 15360 * 4096
    attn = tokens * 4.0 * m.attention_flops_per_token(4096, "prefill")  # 3 x forward, + 1 recomputed
    chips = 16 * 128
    expected = ((bf16["hardware_flops"] - attn) / h800.flops["fp8"] + attn / h800.flops["bf16"]) / chips
    assert fp8["compute_s"] == pytest.approx(expected, rel=1e-12)
    assert bf16["compute_s"] == pytest.approx(bf16["hardware_flops"] / (chips * h800.flops["bf16"]), rel=1e-12)
    assert 1.6 < bf16["compute_s"] / fp8["compute_s"] < 2.0  # FP8 doubles the GEMM rate; attention stays
    assert fp8["mfu"] > bf16["mfu"]
    with pytest.raises(InputError, match="no FP8 tensor units"):
        train_step(m, get_system("a100"), TrainLayout(**lay, gemm_dtype="fp8"), 15360, 4096)
