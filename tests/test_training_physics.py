"""The training step (`dse.physics.training`): closed forms of its FLOPs, memory and pipeline, the overlap rules of
each parallelism, the formats a chip trains in, and the partition program against every partition."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from dse.catalog.hardware import get_system
from dse.catalog.models import Architecture, ModelSpec, get_model
from dse.errors import InputError
from dse.physics.training import (
    ACT_BYTES,
    TrainLayout,
    chunk_families,
    greedy_partition,
    in_flight,
    model_items,
    train_step,
)


def tiny(moe: bool = False, layers: int = 6, mtp: int = 0, d: int = 2048, vocab: int = 32000, heads: int = 16,
         kv: int = 4) -> Architecture:
    """A small hypothetical model: GQA layers, dense or 16 experts (top-2, one shared, the first layer dense)."""
    ffn = ({"kind": "moe", "n_experts": 16, "top_k": 2, "d_ff_expert": d // 2, "n_shared": 1, "dense_layers": 1,
            "d_ff_dense": 4 * d} if moe else {"kind": "dense", "d_ff": 4 * d})
    spec = {"id": "tiny-moe" if moe else "tiny", "name": "tiny", "hypothetical": True, "d_model": d,
            "n_layers": layers, "vocab": vocab, "source": {"title": "test", "date": "2025-01"},
            "published_b": {"total": 1.0, "active": 1.0, "precision_total": 10.0, "precision_active": 10.0,
                            "source": "test"},
            "attention": {"kind": "gqa", "n_heads": heads, "n_kv_heads": kv, "head_dim": d // heads}, "ffn": ffn}
    if mtp:
        spec["mtp"] = {"modules": mtp, "source": "test"}
    return Architecture(ModelSpec.model_validate(spec))


def compositions(n: int, k: int):
    """Every way of cutting n items in order into k nonempty parts (item counts)."""
    for cuts in itertools.combinations(range(1, n), k - 1):
        b = (0, *cuts, n)
        yield tuple(b[i + 1] - b[i] for i in range(k))


# ---- FLOPs, parameters -------------------------------------------------------------------------------------------
def test_flops_match_megatron_closed_form():
    """GPT-3 175B: the linear layers and head take 72 l h^2 (1 + V / (12 l h)) FLOPs per token forward and
    backward (Narayanan et al. 2021, Appendix; biases add 0.006%); the causal attention core 2 h (s + 1) l forward."""
    m = get_model("gpt-3-175b")
    it = model_items(m, 2048)
    n_l, h, v, s = m.spec.n_layers, m.spec.d_model, m.spec.vocab, 2048
    assert (3 * (it.gemm + it.head)).sum() == pytest.approx(72 * n_l * h * h * (1 + v / (12 * n_l * h)), rel=1e-4)
    assert it.attn.sum() == pytest.approx(2 * h * (s + 1) * n_l, rel=1e-12)
    # hardware FLOPs per recompute mode: selective adds the attention core's forward, full every forward
    lay = dict(tp=8, pp=8, dp=8, micro_batch=1)
    hw = {rc: train_step(m, get_system("a100"), TrainLayout(**lay, recompute=rc), 512, 2048, ideal=True)[
        "hardware_flops"] for rc in ("none", "selective", "full", "reversible")}
    tokens = 512 * 2048
    assert hw["selective"] - hw["none"] == pytest.approx(tokens * it.attn.sum(), rel=1e-9)
    assert hw["full"] - hw["none"] == pytest.approx(tokens * (it.gemm + it.head + it.attn).sum(), rel=1e-9)
    assert hw["reversible"] == hw["full"]


@pytest.mark.parametrize("mid", ["llama-3.1-8b", "gpt-3-175b", "mixtral-8x7b", "deepseek-v3"])
def test_items_hold_every_parameter(mid):
    """The items' weights add up to the catalog's count, plus the head where tied (one copy per stage end) and the
    MTP modules (trained, not served)."""
    m = get_model(mid)
    it = model_items(m, 4096)
    total = (it.dense_params + it.routed_params).sum()
    expect = m.params_total + (m.spec.vocab * m.spec.d_model if m.spec.tie_embeddings else 0) + m.params_mtp
    assert total == pytest.approx(expect, rel=1e-12)
    assert it.kind.count("mtp") == (m.spec.mtp.modules if m.spec.mtp else 0)


def test_deepseek_v3_mtp_module_is_its_published_size():
    """DeepSeek-V3's checkpoint holds 685B weights: the 671B main model and the MTP module ("14B", rounded up:
    its layer, projection and norms, with its own copies of the embedding and head; model card)."""
    m = get_model("deepseek-v3")
    copies = 2 * m.spec.vocab * m.spec.d_model
    assert (m.params_total + m.params_mtp + copies) / 1e9 == pytest.approx(685.0, rel=1e-3)
    assert 13.0 < (m.params_mtp + copies) / 1e9 < 14.5


# ---- memory --------------------------------------------------------------------------------------------------------
def test_zero_stages_memory_is_exact():
    """One stage, TP1: weights, gradients and Adam's states per chip are 18N (DDP: bf16 weights, fp32 gradients,
    fp32 states), 4N + 16N/DP (ZeRO-1: the distributed optimizer), 2N + 18N/DP (ZeRO-2), 20N/DP (ZeRO-3, plus the
    two layers it holds gathered); the activations are the same for every stage."""
    m, h100, dp = get_model("llama-3.1-8b"), get_system("h100"), 16
    n = m.params_total
    hbm = {z: train_step(m, h100, TrainLayout(tp=1, pp=1, dp=dp, zero=z), 64, 4096)["hbm_bytes_per_chip"]
           for z in range(4)}
    it = model_items(m, 4096)
    gathered = 2 * ACT_BYTES * it.dense_params[1:-1].max()
    static = {0: 18 * n, 1: 4 * n + 16 * n / dp, 2: 2 * n + 18 * n / dp, 3: 20 * n / dp + gathered}
    for z in (1, 2, 3):
        assert hbm[0] - hbm[z] == pytest.approx(static[0] - static[z], rel=1e-9)


def test_recompute_trades_memory_for_compute():
    m, h100 = get_model("llama-3.1-70b"), get_system("h100")
    modes = ("none", "selective", "selective_ffn", "full", "reversible")
    r = {rc: train_step(m, h100, TrainLayout(tp=8, pp=4, dp=16, micro_batch=1, recompute=rc), 512, 8192)
         for rc in modes}
    mem = [r[k]["hbm_bytes_per_chip"] for k in modes]
    flops = [r[k]["hardware_flops"] for k in modes]
    assert mem == sorted(mem, reverse=True) and len(set(mem)) == len(mem)  # each keeps less
    assert flops[:4] == sorted(flops[:4]) and flops[3] == flops[4]  # ... and recomputes more


def test_in_flight_activations_follow_the_schedule():
    """1F1B: device d of p holds p - d micro-batches; interleaved over v chunks the first holds p + (p - 1) / v
    (Korthikanti et al. 2022); never more than the step's micro-batches."""
    assert in_flight(4, 1, np.array([16.0]))[0].tolist() == [4, 3, 2, 1]
    assert in_flight(4, 2, np.array([16.0]))[0, 0] == pytest.approx(4 + 3 / 2)
    assert in_flight(8, 1, np.array([2.0]))[0].max() == 2


# ---- overlap ------------------------------------------------------------------------------------------------------
def test_overlapped_communication_is_what_the_step_saves():
    """One stage: the step is the micro-batches' compute plus what each collective leaves exposed, so turning an
    overlap off costs exactly its hidden time; with overlap off exposed equals the whole collective."""
    m, h100 = get_model("llama-3.1-70b"), get_system("h100")
    on = train_step(m, h100, TrainLayout(tp=8, pp=1, dp=8, cp=2, zero=1), 64, 16384)
    off = train_step(m, h100, TrainLayout(tp=8, pp=1, dp=8, cp=2, zero=1, tp_overlap=False), 64, 16384)
    assert off["tp_exposed_s"] == pytest.approx(off["tp_s"], rel=1e-12) and on["tp_exposed_s"] < on["tp_s"]
    assert off["step_s"] - on["step_s"] == pytest.approx(off["tp_exposed_s"] - on["tp_exposed_s"], rel=1e-9)
    assert 0 <= on["cp_exposed_s"] <= on["cp_s"] and on["cp_s"] > 0


@pytest.mark.parametrize("zero", [0, 1, 2, 3])
def test_data_parallel_exposure_per_zero_stage(zero):
    """Without gradient overlap the whole ZeRO schedule is exposed; with it, no more than that, and ZeRO-3 moves
    the parameters every micro-batch (three passes a micro-batch against ZeRO-1's two a step)."""
    m, a100 = get_model("llama-3.1-8b"), get_system("a100")
    lay = dict(tp=1, pp=1, dp=64, zero=zero, micro_batch=1)
    on = train_step(m, a100, TrainLayout(**lay), 256, 4096)
    off = train_step(m, a100, TrainLayout(**lay, grad_overlap=False), 256, 4096)
    assert off["dp_exposed_s"] == pytest.approx(off["dp_s"], rel=1e-12)
    assert 0 <= on["dp_exposed_s"] <= on["dp_s"] == pytest.approx(off["dp_s"], rel=1e-12)
    if zero == 3:
        one = train_step(m, a100, TrainLayout(**{**lay, "zero": 1}), 256, 4096)
        assert on["dp_s"] > 4 * one["dp_s"]


def test_two_microbatch_overlap_hides_expert_all_to_all():
    m, gb200 = get_model("deepseek-v3"), get_system("gb200-nvl72")
    lay = dict(tp=1, pp=8, dp=64, ep=64, micro_batch=1, gemm_dtype="fp8")
    plain = train_step(m, gb200, TrainLayout(**lay), 1024, 4096)
    dual = train_step(m, gb200, TrainLayout(**lay, ep_overlap="two_microbatch"), 1024, 4096)
    assert plain["ep_exposed_s"] == pytest.approx(plain["ep_s"], rel=1e-12) and plain["ep_s"] > 0
    assert dual["ep_exposed_s"] < 0.5 * dual["ep_s"]
    assert dual["step_s"] < plain["step_s"]
    wide = train_step(m, gb200, TrainLayout(**{**lay, "ep": 1}), 1024, 4096)
    assert plain["weights_bytes_per_chip"] < wide["weights_bytes_per_chip"] / 10 and wide["ep_s"] == 0


# ---- pipeline -------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("v", [1, 2])
def test_even_pipeline_bubble_is_the_closed_form(v):
    """Even chunks: the pipeline takes (m + (p - 1) / v) t (Narayanan et al. 2021); a tiny vocabulary makes the
    embedding and head negligible. More micro-batches add m x the busiest device's time."""
    m, h100 = tiny(layers=16, vocab=64, d=4096, heads=32, kv=8), get_system("h100")
    p = 4
    stages = tuple([2 + 1] + [2] * (p * v - 2) + [2 + 1]) if v == 2 else (4 + 1, 4, 4, 4 + 1)
    r8 = train_step(m, h100, TrainLayout(tp=1, pp=p, dp=1, interleave=v, stages=stages), 8, 4096, ideal=True)
    r16 = train_step(m, h100, TrainLayout(tp=1, pp=p, dp=1, interleave=v, stages=stages), 16, 4096, ideal=True)
    t = r8["busiest_device_s"]
    assert r8["pipeline_s"] / t == pytest.approx(8 + (p - 1) / v, rel=2e-3)
    assert r16["pipeline_s"] - r8["pipeline_s"] == pytest.approx(8 * t, rel=1e-12)


def test_greedy_partition_is_the_least_bottleneck_of_every_partition():
    """300 random item sequences (integer loads: many ties): the partition program's bottleneck equals the least
    over every contiguous partition that fits memory, and it finds one whenever one exists."""
    rng = np.random.default_rng(7)
    for n, p in ((3, 2), (6, 2), (7, 3), (9, 3), (8, 4), (9, 4)):
        k = 50
        load = rng.integers(1, 6, (k, n)).astype(float)
        static = rng.integers(0, 4, (k, n)).astype(float)
        act = rng.integers(0, 3, (k, n)).astype(float)
        held = np.sort(rng.integers(1, 4, (k, p)), axis=1)[:, ::-1].astype(float)
        floor = rng.choice([0.0, 2.0], k)
        cap = rng.integers(3, 20, k).astype(float)
        ok, counts = greedy_partition(load, static, act, held, cap, floor, p)
        for i in range(k):
            best = np.inf
            for c in compositions(n, p):
                ends = np.cumsum(c)
                parts = [slice(e - j, e) for e, j in zip(ends, c, strict=True)]
                if all(static[i, s].sum() + held[i, d] * act[i, s].sum() <= cap[i] for d, s in enumerate(parts)):
                    best = min(best, max(max(load[i, s].sum(), floor[i]) for s in parts))
            assert bool(ok[i]) == np.isfinite(best)
            if ok[i]:
                ends = np.cumsum(counts[i])
                got = max(max(load[i, e - j:e].sum(), floor[i]) for e, j in zip(ends, counts[i], strict=True))
                assert got == pytest.approx(best, rel=1e-9) and counts[i].min() >= 1


def _exhaustive(model, system, lay: dict, batch: int, seq: int) -> tuple[float, float]:
    """(least busiest-device time, least step) over every partition of the model's items that fits."""
    n = len(model_items(model, seq))
    best_b = best_s = np.inf
    for st in compositions(n, lay["pp"]):
        r = train_step(model, system, TrainLayout(**lay, stages=st), batch, seq)
        if r["fits"]:
            best_b, best_s = min(best_b, r["busiest_device_s"]), min(best_s, r["step_s"])
    return best_b, best_s


def test_partition_of_real_layouts_against_every_partition():
    """Small models (MoE with a dense first layer and an MTP module among them) on real chips: the chosen
    partition's bottleneck is the least of every partition that fits; the step, whose data-parallel exposure,
    optimizer and P2P floor the program does not minimize, is within 1% of the best partition's at two or more
    micro-batches per stage."""
    rng = np.random.default_rng(3)
    models = [tiny(layers=8, d=4096, vocab=128000, heads=32, kv=8), tiny(True, layers=7, mtp=1, d=4096, vocab=128000,
                                                                         heads=32, kv=8)]
    for k in range(12):
        m = models[k % 2]
        system = get_system(["h100", "gb200-nvl72", "a100"][k % 3])
        p = int(rng.choice([2, 3, 4]))
        dp = int(rng.choice([1, 8, 64]))
        lay = dict(tp=int(rng.choice([1, 2, 8])), pp=p, dp=dp, zero=int(rng.choice([0, 1, 2])),
                   recompute=str(rng.choice(["none", "selective", "full"])),
                   ep=int(rng.choice([1, 2, 4])) if m.is_moe else 1)
        batch = dp * p * int(rng.choice([2, 4]))
        chosen = train_step(m, system, TrainLayout(**lay), batch, 4096)
        best_b, best_s = _exhaustive(m, system, lay, batch, 4096)
        assert chosen["fits"] == np.isfinite(best_b)
        if chosen["fits"]:
            assert chosen["busiest_device_s"] == pytest.approx(best_b, rel=1e-9)
            assert best_s <= chosen["step_s"] <= best_s * 1.01


def test_interleaved_partition_is_the_best_of_its_families():
    """Interleaved chunks: the chosen partition is the least bottleneck among every member of the stated family
    (first chunk: embedding + a layers, middle chunks q layers each, last: b layers, the MTP modules and the head;
    q within one of layers / chunks, a and b at most 2q + 2), listed here from that rule."""
    m, h100 = tiny(True, layers=11, mtp=1, d=4096, vocab=128000, heads=32, kv=8), get_system("h100")
    for p, v in ((2, 2), (2, 3), (3, 2)):
        chunks, n_l = p * v, m.spec.n_layers
        members = []
        for q in range(1, n_l + 1):
            if not (n_l // chunks - 1 <= q <= -(-n_l // chunks) + 1):
                continue
            rest = n_l - (chunks - 2) * q
            members += [(1 + a, *[q] * (chunks - 2), rest - a + 2) for a in range(rest + 1)
                        if a <= 2 * q + 2 and rest - a <= 2 * q + 2 and rest - a >= 0]
        assert len(members) == len(chunk_families(n_l, chunks))
        lay = dict(tp=1, pp=p, dp=8, ep=2, interleave=v)
        best = min(r["busiest_device_s"] for st in members
                   if (r := train_step(m, h100, TrainLayout(**lay, stages=st), 8 * p * 2, 4096))["fits"])
        assert train_step(m, h100, TrainLayout(**lay), 8 * p * 2, 4096)["busiest_device_s"] == pytest.approx(
            best, rel=1e-9)


# ---- formats ------------------------------------------------------------------------------------------------------
def test_training_formats_are_the_chips_own():
    """FP8 GEMMs need FP8 tensor units (not A100), FP4 needs FP4 units (Blackwell, not H100), INT8 training
    (MLPerf's TPU v5p GPT-3) needs INT8 units; a narrower format shortens the step and keeps the MFU below 1."""
    m = get_model("llama-3.1-8b")
    lay = dict(tp=1, pp=1, dp=8)
    with pytest.raises(InputError, match="no FP8"):
        train_step(m, get_system("a100"), TrainLayout(**lay, gemm_dtype="fp8"), 64, 4096)
    with pytest.raises(InputError, match="no FP4"):
        train_step(m, get_system("h100"), TrainLayout(**lay, gemm_dtype="fp4"), 64, 4096)
    b200 = get_system("b200")
    steps = [train_step(m, b200, TrainLayout(**lay, gemm_dtype=d), 64, 4096)["step_s"] for d in ("bf16", "fp8",
                                                                                                  "fp4")]
    assert steps == sorted(steps, reverse=True)
    v5p = train_step(m, get_system("tpu-v5p"), TrainLayout(**lay, gemm_dtype="int8"), 64, 4096)
    assert 0 < v5p["mfu"] < 1 and v5p["mfu_bf16"] > v5p["mfu"]
    with pytest.raises(InputError, match="'recompute'"):
        train_step(m, b200, TrainLayout(**lay, recompute="some"), 64, 4096)


def test_fp8_runs_linear_layers_at_the_fp8_rate():
    """Ideal factors: FP8 GEMMs take half the BF16 GEMM time; the attention core stays at BF16."""
    m, h100 = get_model("llama-3.1-70b"), get_system("h100")
    lay = dict(tp=8, pp=1, dp=1, recompute="none")
    bf16 = train_step(m, h100, TrainLayout(**lay), 8, 8192, ideal=True)
    fp8 = train_step(m, h100, TrainLayout(**lay, gemm_dtype="fp8"), 8, 8192, ideal=True)
    assert bf16["hardware_flops"] == fp8["hardware_flops"]
    assert 1.5 < bf16["compute_s"] / fp8["compute_s"] < 2.0


# ---- catalog entries the training work added ------------------------------------------------------------------------
def test_new_catalog_entries_match_their_sources():
    mix = get_model("mixtral-8x7b")  # 46.7B total, 12.9B active (Mistral AI, Mixtral of Experts, 2024)
    assert mix.params_total / 1e9 == pytest.approx(46.7, rel=0.01)
    assert mix.active_as_published / 1e9 == pytest.approx(12.9, rel=0.01)  # with the input embedding
    assert get_model("gpt-3-175b").params_total / 1e9 == pytest.approx(175.0, rel=0.01)
    nvl = get_system("h100-nvl")
    assert nvl.hbm_capacity == pytest.approx(94e9) and nvl.flops["fp8"] == pytest.approx(2 * nvl.flops["bf16"], rel=1e-3)
