"""Model catalog: derived parameter counts against published figures, KV bytes per token."""

from __future__ import annotations

import math

import pytest
import yaml

from dse.catalog.models import MODEL_DIR, Architecture, ModelSpec, load_models
from dse.errors import InputError

MODEL_IDS = {
    "deepseek-v3", "deepseek-v3.2", "kimi-k2", "qwen3-235b-a22b", "gpt-oss-120b", "llama-3.1-8b",
    "llama-3.1-70b", "llama-3.1-405b", "llama-3.3-70b", "mixtral-8x22b", "frontier-5t",
    "qwen3-32b", "qwen3.5-397b-a17b", "minimax-m2.5", "kimi-k2.5", "glm-5", "llama-4-maverick", "llama-3-8b-1048k",
    "llama-2-70b", "qwen3-coder-480b-a35b", "mixtral-8x7b", "gpt-3-175b",
}


def test_every_model_id_is_present(models):
    assert set(models) == MODEL_IDS


def _tolerance(value_b: float, precision_b: float) -> float:
    """1%, or half the unit the publisher rounded to when that is coarser."""
    return max(0.01, precision_b / 2 / value_b)


@pytest.mark.parametrize("model_id", sorted(MODEL_IDS))
def test_derived_counts_match_published(models, model_id):
    m = models[model_id]
    pub = m.spec.published_b
    assert m.params_total / 1e9 == pytest.approx(pub.total, rel=_tolerance(pub.total, pub.precision_total))
    active = m.active_as_published
    assert active / 1e9 == pytest.approx(pub.active, rel=_tolerance(pub.active, pub.precision_active))


def test_deepseek_v3_is_671b_total_37b_active(models):
    m = models["deepseek-v3"]
    assert m.params_total == pytest.approx(671e9, rel=0.01)
    assert m.params_active == pytest.approx(37e9, rel=0.0136)  # "37B" is rounded to the billion
    assert m.sparsity == pytest.approx(671 / 37, rel=0.03)


def test_kv_bytes_per_token_by_attention_kind(models):
    # MLA caches the 512-wide latent plus the 64-wide RoPE key per layer
    assert models["deepseek-v3"].kv_bytes_per_token("bf16") == 61 * 576 * 2
    assert models["deepseek-v3"].kv_bytes_per_token("fp8") == 61 * 576
    # GQA caches K and V of each KV head
    assert models["llama-3.1-70b"].kv_bytes_per_token("bf16") == 80 * 2 * 8 * 128 * 2
    assert models["llama-3.1-8b"].kv_bytes_per_token("fp8") == 32 * 2 * 8 * 128
    # DeepSeek Sparse Attention adds FP8 indexer keys of 128 per layer
    assert models["deepseek-v3.2"].kv_bytes_per_token("fp8") == 61 * 576 + 61 * 128


def test_sliding_window_caps_the_stored_kv(models):
    m = models["gpt-oss-120b"]
    per_layer = 2 * 8 * 64 * 2
    assert m.kv_bytes_per_sequence(1_000_000) == 18 * per_layer * 1_000_000 + 18 * per_layer * 128
    assert m.kv_bytes_per_sequence(100) == 36 * per_layer * 100


def test_cross_layer_kv_sharing_divides_the_stored_kv(models):
    raw = models["llama-3.1-70b"].spec.model_dump()
    raw["attention"]["kv_shared_layers"] = 2
    shared = Architecture(ModelSpec.model_validate(raw))
    assert shared.kv_bytes_per_token() == models["llama-3.1-70b"].kv_bytes_per_token() / 2
    assert shared.params_total == models["llama-3.1-70b"].params_total


def test_sparse_attention_flops_stop_growing_past_top_k_except_the_indexer(models):
    dense, sparse = models["deepseek-v3"], models["deepseek-v3.2"]
    ratio_dense = dense.attention_flops_per_token(131072) / dense.attention_flops_per_token(65536)
    assert ratio_dense == pytest.approx(2.0)
    grow = sparse.attention_flops_per_token(131072) - sparse.attention_flops_per_token(65536)
    assert grow == pytest.approx(sparse.indexer_flops_per_scored_token() * 61 * 65536)
    assert sparse.attention_flops_per_token(131072) < dense.attention_flops_per_token(131072) / 4


def test_prefill_attention_is_causal(models):
    m = models["llama-3.1-8b"]
    per = m.attention_flops_per_attended_token("prefill")
    assert m.attention_flops_per_token(1000, "prefill") == pytest.approx(per * 32 * 1001 / 2)


def _load_mutated(tmp_path, mutate):
    doc = yaml.safe_load((MODEL_DIR / "models.yaml").read_text())
    mutate(doc["models"][0])
    path = tmp_path / "models.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


@pytest.mark.parametrize(
    ("mutate", "expected"),
    [
        (lambda m: m.update(n_layer=3), "unknown field 'n_layer'; did you mean n_layers"),
        (lambda m: m["attention"].update(kv_lora=1), "unknown field 'attention.kv_lora'; did you mean kv_lora_rank"),
        (lambda m: m.pop("d_model"), "missing required field 'd_model'"),
        (lambda m: m["attention"].update(kind="linear"), "field 'attention.kind'"),
        (lambda m: m["ffn"].update(top_k=300), "top_k (300) cannot exceed n_experts (256)"),
    ],
)
def test_bad_model_data_names_file_row_and_field(tmp_path, mutate, expected):
    path = _load_mutated(tmp_path, mutate)
    with pytest.raises(InputError) as err:
        load_models(path)
    assert f"{path}: models[0] (id 'deepseek-v3')" in str(err.value)
    assert expected in str(err.value)


def test_layer_groups_cover_every_layer(models):
    for m in models.values():
        assert sum(g[0] for g in m.layer_groups) == m.spec.n_layers
        assert all(math.isinf(g[2]) or g[2] > 0 or g[1] == 0 for g in m.layer_groups)  # 0: linear attention, no KV


def test_every_published_model_states_its_maximum_context(models):
    for m in models.values():
        assert m.spec.hypothetical or (m.max_context and m.spec.max_context.source), m.id
