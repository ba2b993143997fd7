"""Read a Hugging Face ``config.json`` into a model-catalog entry (Llama, Mistral, Qwen2/3, Qwen-MoE,
Mixtral, DeepSeek-V3 / Kimi-K2 MLA-MoE and gpt-oss families); anything the schema cannot express is
refused with the config field that names it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from dse.catalog.loading import validation_message
from dse.catalog.models import Architecture, ModelSpec
from dse.errors import InputError

DENSE = ("llama", "mistral", "qwen2", "qwen3")
MOE = ("qwen2_moe", "qwen3_moe", "mixtral", "deepseek_v3", "kimi_k2", "gpt_oss")
FAMILIES = DENSE + MOE


def _get(cfg: dict, key: str, where: str) -> Any:
    if key not in cfg or cfg[key] is None:
        raise InputError(f"{where}: missing field '{key}' that a {cfg.get('model_type')} config needs")
    return cfg[key]


def _refuse(where: str, field: str, value: object, why: str) -> None:
    raise InputError(f"{where}: field '{field}' = {value!r}: {why}; the catalog schema cannot express it")


def entry_from_config(cfg: dict, model_id: str, where: str) -> dict:
    """A catalog entry (the mapping ``models.yaml`` holds) from a config.json mapping."""
    if isinstance(cfg.get("text_config"), dict):  # multimodal wrappers keep the language model here
        cfg = {**cfg["text_config"], "model_type": cfg["text_config"].get("model_type", cfg.get("model_type"))}
    kind = cfg.get("model_type")
    if kind not in FAMILIES:
        raise InputError(f"{where}: field 'model_type': {kind!r} is not supported; allowed: {', '.join(FAMILIES)}")
    types = set(cfg.get("layer_types") or [])
    if types - {"full_attention", "sliding_attention"}:
        _refuse(where, "layer_types", sorted(types), "layer kinds other than full and sliding attention")
    d = int(_get(cfg, "hidden_size", where))
    heads = int(_get(cfg, "num_attention_heads", where))
    entry: dict = {
        "id": model_id, "name": model_id,
        "source": {"title": f"{where} (imported by dse catalog import-model)", "url": "", "date": "unknown"},
        "d_model": d, "n_layers": int(_get(cfg, "num_hidden_layers", where)),
        "vocab": int(_get(cfg, "vocab_size", where)), "tie_embeddings": bool(cfg.get("tie_word_embeddings", False)),
    }
    if kind in ("deepseek_v3", "kimi_k2"):
        entry["attention"] = {"kind": "mla", "n_heads": heads, "q_lora_rank": cfg.get("q_lora_rank"),
                              "kv_lora_rank": int(_get(cfg, "kv_lora_rank", where)),
                              "qk_nope_head_dim": int(_get(cfg, "qk_nope_head_dim", where)),
                              "qk_rope_head_dim": int(_get(cfg, "qk_rope_head_dim", where)),
                              "v_head_dim": int(_get(cfg, "v_head_dim", where))}
    else:
        attn = {"kind": "gqa", "n_heads": heads,
                "n_kv_heads": int(cfg.get("num_key_value_heads") or heads),
                "head_dim": int(cfg.get("head_dim") or d // heads)}
        if cfg.get("attention_bias") or kind == "qwen2":
            attn["bias"] = True
        if kind in ("qwen3", "qwen3_moe"):
            attn["qk_norm"] = True
        if kind == "gpt_oss":
            attn["sinks"] = True
        sliding = sum(t == "sliding_attention" for t in cfg.get("layer_types") or [])
        if sliding:
            attn["sliding_window"] = int(_get(cfg, "sliding_window", where))
            attn["sliding_layers"] = sliding
        elif kind in ("mistral", "mixtral") and cfg.get("sliding_window"):
            _refuse(where, "sliding_window", cfg["sliding_window"], "a sliding window on every layer")
        entry["attention"] = attn
    if kind in DENSE:
        entry["ffn"] = {"kind": "dense", "d_ff": int(_get(cfg, "intermediate_size", where))}
    elif kind == "mixtral":
        entry["ffn"] = {"kind": "moe", "n_experts": int(_get(cfg, "num_local_experts", where)),
                        "top_k": int(_get(cfg, "num_experts_per_tok", where)),
                        "d_ff_expert": int(_get(cfg, "intermediate_size", where))}
    elif kind == "gpt_oss":
        entry["ffn"] = {"kind": "moe", "n_experts": int(_get(cfg, "num_local_experts", where)),
                        "top_k": int(cfg.get("experts_per_token") or _get(cfg, "num_experts_per_tok", where)),
                        "d_ff_expert": int(_get(cfg, "intermediate_size", where)), "bias": True, "router_bias": True}
    elif kind in ("qwen2_moe", "qwen3_moe"):
        if cfg.get("mlp_only_layers"):
            _refuse(where, "mlp_only_layers", cfg["mlp_only_layers"], "dense layers interleaved with MoE layers")
        if int(cfg.get("decoder_sparse_step", 1)) != 1:
            _refuse(where, "decoder_sparse_step", cfg["decoder_sparse_step"], "MoE on only some layers")
        expert = int(_get(cfg, "moe_intermediate_size", where))
        shared = int(cfg.get("shared_expert_intermediate_size") or 0)
        if shared and shared % expert:
            _refuse(where, "shared_expert_intermediate_size", shared,
                    f"a shared expert that is not a whole number of routed experts of {expert}")
        entry["ffn"] = {"kind": "moe", "n_experts": int(_get(cfg, "num_experts", where)),
                        "top_k": int(_get(cfg, "num_experts_per_tok", where)), "n_shared": shared // expert,
                        "d_ff_expert": expert}
    else:  # deepseek_v3, kimi_k2
        ffn = {"kind": "moe", "n_experts": int(_get(cfg, "n_routed_experts", where)),
               "top_k": int(_get(cfg, "num_experts_per_tok", where)), "n_shared": int(cfg.get("n_shared_experts") or 0),
               "d_ff_expert": int(_get(cfg, "moe_intermediate_size", where)),
               "router_bias": cfg.get("topk_method") == "noaux_tc"}
        dense = int(cfg.get("first_k_dense_replace") or 0)
        if dense:
            ffn.update(dense_layers=dense, d_ff_dense=int(_get(cfg, "intermediate_size", where)))
        entry["ffn"] = ffn
    if cfg.get("max_position_embeddings"):
        entry["max_context"] = {"tokens": int(cfg["max_position_embeddings"]),
                                "source": f"{where}: max_position_embeddings (check the model card)", "date": "unknown"}
    return entry


def import_config(path: Path, model_id: str | None = None) -> tuple[dict, Architecture]:
    """Read, convert and validate a config.json; the entry carries placeholder published counts (the
    derived ones, marked) that the user replaces with the publisher's figures.
    """
    try:
        cfg = json.loads(Path(path).read_text())
    except OSError as exc:
        raise InputError(f"{path}: cannot read: {exc.strerror}") from None
    except json.JSONDecodeError as exc:
        raise InputError(f"{path}: not valid JSON: {exc.msg} (line {exc.lineno})") from None
    if not isinstance(cfg, dict):
        raise InputError(f"{path}: a config.json is a JSON object")
    entry = entry_from_config(cfg, model_id or Path(path).parent.name or "imported", str(path))
    probe = {**entry, "published_b": {"total": 1, "active": 1, "precision_total": 1, "precision_active": 1,
                                      "source": "placeholder"}, "hypothetical": "max_context" not in entry}
    try:
        arch = Architecture(ModelSpec.model_validate(probe))
    except ValidationError as exc:
        raise InputError(validation_message(exc, ModelSpec, str(path))) from None
    entry["published_b"] = {
        "total": round(arch.params_total / 1e9, 2), "active": round(arch.params_active / 1e9, 2),
        "precision_total": 0.01, "precision_active": 0.01,
        "source": "DERIVED at import, not published: replace with the publisher's totals before use",
    }
    return entry, arch
