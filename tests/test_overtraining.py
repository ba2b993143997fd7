"""Compute equalization and overtraining: loss fits, the training-cluster MIP, the shipped study."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from dse.optimize.equalization import LOSS_FITS, dense_model, loss, tokens_for_loss, training_options
from dse.studies.base import load_study

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("fit", sorted(LOSS_FITS))
def test_tokens_for_loss_inverts_the_loss(fit):
    for n, d in ((7e10, 1.4e12), (4e11, 1.5e13)):
        assert tokens_for_loss(n, loss(n, d, fit), fit) == pytest.approx(d, rel=1e-9)
    assert tokens_for_loss(1e9, 1.0, fit) == float("inf")  # below the irreducible loss


def test_chinchilla_reference_points_share_compute():
    # Chinchilla (70B, 1.4T) beats Gopher (280B, 300B) at the same compute in the Hoffmann fit
    assert loss(70e9, 1.4e12) < loss(280e9, 300e9)


def test_dense_family_hits_requested_sizes():
    for n in (3e10, 1e11, 4e11):
        assert dense_model(n).params_total == pytest.approx(n, rel=0.25)  # widths in steps of 1,024


def test_training_cluster_mip_equals_the_best_feasible_row():
    from dse.optimize.equalization import Lifetime, train_cluster
    from dse.optimize.space import SpaceOptions
    from dse.physics.serving import Request

    life = Lifetime(1.82, "hoffmann", 5e7, 60, 0.67, 3, 3, 8192, 16e6, 120, 32768, ("h100", "gb200-nvl72"),
                    Request(name="chat", prompt=2000, output=500, tpot_max=0.05), SpaceOptions())
    model = dense_model(1e11)
    tokens = tokens_for_loss(model.params_total, 1.82)
    opts = training_options(model, life)
    ok = opts[tokens / opts["tokens_per_s"] <= 120 * 86400]
    best = train_cluster(model, life, tokens)
    assert best["usd_per_token"] == pytest.approx(ok["usd_per_token"].min(), rel=1e-9)
    assert best["chips"] <= 32768


def test_overtraining_study_reproduces_the_lecture(shipped):
    r = shipped("overtraining")
    out = r.out
    assert r.returncode == 0, r.stderr
    summary = json.loads(r.stdout)
    assert summary["lecture"]["inference_tokens_at_50M_per_s_for_60_days"] == pytest.approx(2.592e14)
    best = pd.DataFrame(summary["optimum"]).sort_values("demand_tokens_per_s")
    assert best["overtraining_ratio"].is_monotonic_increasing  # more demand: train further past Chinchilla
    assert best["params"].is_monotonic_decreasing  # ... a smaller model
    mid = best[best["demand_tokens_per_s"] == 5e7].iloc[0]
    assert mid["overtraining_ratio"] > 10
    assert 0.1 < mid["pretrain_tokens"] / mid["inference_tokens"] < 10
    terms = mid[["pretrain_usd", "rl_usd", "inference_usd"]].astype(float)
    assert terms.max() / terms.min() < 5  # equalization: the three costs are of one order
    spec = load_study(ROOT / "studies" / "overtraining.yaml")
    for _, b in best.iterrows():
        assert loss(b["params"], b["pretrain_tokens"]) == pytest.approx(spec.overtraining.target_loss, rel=1e-9)
        assert b["train_chips"] <= spec.overtraining.chip_budget and b["train_days"] <= spec.overtraining.deadline_days
    table = pd.read_csv(out / "overtraining.csv")
    assert len(table) == 3 * spec.overtraining.trials
    assert (out / "overtraining.png").exists()


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
