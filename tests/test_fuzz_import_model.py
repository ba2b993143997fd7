"""`dse catalog import-model CONFIG.json` on hostile configs: every case exits 2 with one message naming the file and
the config key (not the catalog field it fills) or the option, or gives a documented valid entry; no traceback,
nothing silently misread. Cases are built from the published configs in tests/fixtures/hf_configs, mutated one
field at a time, plus files that are not JSON objects at all.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from dse.cli import app

FIXTURES = Path(__file__).parent / "fixtures" / "hf_configs"


def base(name: str) -> dict:
    return json.loads((FIXTURES / f"{name}.json").read_text())


def edit(name: str, **changes) -> dict:
    """The fixture ``name`` with ``changes`` applied; a value of ``...`` removes the key."""
    cfg = base(name)
    for key, value in changes.items():
        if value is ...:
            cfg.pop(key, None)
        else:
            cfg[key] = value
    return cfg


def invoke(path: Path, *extra: str):
    result = CliRunner().invoke(app, ["catalog", "import-model", str(path), *extra])
    assert result.exception is None or isinstance(result.exception, SystemExit), (
        f"traceback: {result.exception!r}")
    return result


def refused(result, *words: str) -> str:
    """The one-line message of an exit 2, checked to name each of ``words``."""
    msg = " ".join(result.stderr.split())
    assert result.exit_code == 2, (result.exit_code, msg, result.stdout[-300:])
    assert "Traceback" not in result.stderr and msg.startswith("error:"), msg
    for w in words:
        assert w in msg, (w, msg)
    return msg


def entry(result) -> dict:
    assert result.exit_code == 0, result.stderr
    return yaml.safe_load(result.stdout)["models"][0]


# -- config keys mutated one at a time: (fixture, key, value, words the refusal names) ---------------------------
INTEGER_KEYS = ("hidden_size", "num_attention_heads", "num_hidden_layers", "vocab_size", "intermediate_size",
                "num_key_value_heads", "head_dim", "max_position_embeddings")
BAD_INTEGERS = (0, -8, 1.5, "32", True, [32], {"n": 32}, 1e30)
FIELD_CASES = [("llama-3.1-8b", key, bad, ()) for key in INTEGER_KEYS for bad in BAD_INTEGERS]
FIELD_CASES += [
    ("llama-3.1-8b", "num_key_value_heads", 5, ("dividing", "num_attention_heads (32)")),
    ("llama-3.1-8b", "num_key_value_heads", 64, ("num_attention_heads (32)",)),
    ("llama-3.1-8b", "vocab_size", 128256.5, ()),
    ("llama-3.1-8b", "hidden_size", float("nan"), ()),  # written by json.dumps as the literal NaN
    ("llama-3.1-8b", "tie_word_embeddings", "false", ("true or false",)),
    ("llama-3.1-8b", "tie_word_embeddings", 1, ("true or false",)),
    ("llama-3.1-8b", "attention_bias", "no", ("true or false",)),
    ("llama-3.1-8b", "model_type", 7, ("allowed",)),
    ("llama-3.1-8b", "model_type", ["llama"], ("allowed",)),
    ("llama-3.1-8b", "model_type", "gpt2", ("allowed", "llama")),
    ("llama-3.1-8b", "layer_types", "full_attention", ("list",)),
    ("llama-3.1-8b", "layer_types", [1, 2], ()),
    ("llama-3.1-8b", "layer_types", ["full_attention"] * 31, ("num_hidden_layers (32)",)),
    ("llama-3.1-8b", "text_config", "llama", ("object",)),
    ("llama-3.1-8b", "text_config", [1], ("object",)),
    ("llama-3.1-8b", "rope_scaling", "linear", ("object",)),
    ("llama-3.1-8b", "quantization_config", [1, 2], ("object",)),
    ("deepseek-v3", "kv_lora_rank", 0, ()),
    ("deepseek-v3", "kv_lora_rank", None, ("missing",)),
    ("deepseek-v3", "q_lora_rank", "1536", ()),
    ("deepseek-v3", "q_lora_rank", 0, ()),
    ("deepseek-v3", "qk_rope_head_dim", -64, ()),
    ("deepseek-v3", "v_head_dim", 128.25, ()),
    ("deepseek-v3", "n_routed_experts", True, ()),
    ("deepseek-v3", "n_shared_experts", -1, ()),
    ("deepseek-v3", "n_shared_experts", "1", ()),
    ("deepseek-v3", "num_experts_per_tok", 300, ("n_routed_experts (256)",)),
    ("deepseek-v3", "num_experts_per_tok", 0, ()),
    ("deepseek-v3", "first_k_dense_replace", 61, ("num_hidden_layers (61)",)),
    ("deepseek-v3", "first_k_dense_replace", 1.5, ()),
    ("deepseek-v3", "topk_method", 5, ("string",)),
    ("deepseek-v3", "moe_intermediate_size", "2048", ()),
    ("gpt-oss-120b", "experts_per_token", 0, ()),
    ("gpt-oss-120b", "experts_per_token", 129, ("num_local_experts (128)",)),
    ("gpt-oss-120b", "sliding_window", 0, ()),
    ("gpt-oss-120b", "sliding_window", "128", ()),
    ("gpt-oss-120b", "num_local_experts", [128], ()),
    ("gpt-oss-120b", "layer_types", ["sliding_attention"] * 40, ("num_hidden_layers (36)",)),
    ("gpt-oss-120b", "layer_types", ["sliding_attention", "chunked_attention"] * 18, ()),
    ("qwen3-235b-a22b", "mlp_only_layers", "none", ("list",)),
    ("qwen3-235b-a22b", "mlp_only_layers", [0, 1], ()),
    ("qwen3-235b-a22b", "decoder_sparse_step", 0, ()),
    ("qwen3-235b-a22b", "decoder_sparse_step", 2, ()),
    ("qwen3-235b-a22b", "num_experts", 0, ()),
    ("qwen3-235b-a22b", "shared_expert_intermediate_size", -1536, ()),
    ("qwen3-235b-a22b", "shared_expert_intermediate_size", 1000, ()),
    ("mixtral-8x22b", "num_local_experts", 1, ("num_local_experts (1)",)),
    ("mixtral-8x22b", "sliding_window", 4096, ()),
]


@pytest.mark.parametrize(("fixture", "key", "value", "words"), FIELD_CASES,
                         ids=[f"{f}-{k}-{v!r}"[:60] for f, k, v, _ in FIELD_CASES])
def test_a_bad_config_value_is_refused_naming_the_config_key(tmp_path, fixture, key, value, words):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(edit(fixture, **{key: value})))
    msg = refused(invoke(path, "--id", "m"), str(path), key, *words)
    catalog_names = ("d_model", "n_layers", "vocab", "n_heads", "n_kv_heads", "d_ff", "d_ff_expert", "n_experts",
                     "top_k", "n_shared", "dense_layers", "sliding_layers", "tokens")
    named = [c for c in catalog_names if re.search(rf"\b{c}\b", msg)]
    assert not named, msg  # the config's name, not the catalog's


def test_a_missing_required_key_is_named(tmp_path):
    path = tmp_path / "config.json"
    for key in ("hidden_size", "num_attention_heads", "num_hidden_layers", "vocab_size", "intermediate_size"):
        path.write_text(json.dumps(edit("llama-3.1-8b", **{key: ...})))
        refused(invoke(path, "--id", "m"), str(path), f"'{key}'", "missing")


def test_a_key_inside_text_config_is_named_with_its_path(tmp_path):
    inner = edit("llama-3.1-8b", num_key_value_heads=0)
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"model_type": "llava", "text_config": inner}))
    refused(invoke(path, "--id", "m"), str(path), "'text_config.num_key_value_heads'", "got 0")


# -- documented valid readings --------------------------------------------------------------------------------
def test_integral_floats_and_nulls_for_defaults_are_read_as_documented(tmp_path):
    """A whole number written as 4096.0 is 4096; num_key_value_heads and head_dim left null take the Hugging Face
    defaults (every head its own KV head; hidden_size / num_attention_heads)."""
    path = tmp_path / "config.json"
    path.write_text(json.dumps(edit("llama-3.1-8b", hidden_size=4096.0, vocab_size=128256.0)))
    e = entry(invoke(path, "--id", "m"))
    assert e["d_model"] == 4096 and e["vocab"] == 128256 and isinstance(e["vocab"], int)
    path.write_text(json.dumps(edit("llama-3.1-8b", num_key_value_heads=None, head_dim=None)))
    a = entry(invoke(path, "--id", "m"))["attention"]
    assert a["n_kv_heads"] == 32 and a["head_dim"] == 128
    path.write_text(json.dumps(edit("deepseek-v3", q_lora_rank=None, first_k_dense_replace=0)))
    e = entry(invoke(path, "--id", "m"))
    assert "q_lora_rank" not in e["attention"] or e["attention"]["q_lora_rank"] is None
    assert "dense_layers" not in e["ffn"]


def test_the_head_dim_default_needs_a_whole_division(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(edit("llama-3.1-8b", hidden_size=4100, head_dim=None)))
    refused(invoke(path, "--id", "m"), str(path), "'head_dim'", "hidden_size (4100)", "num_attention_heads (32)")


def test_a_utf8_bom_is_read_and_the_fixtures_import_unchanged(tmp_path):
    path = tmp_path / "config.json"
    path.write_bytes(b"\xef\xbb\xbf" + (FIXTURES / "llama-3.1-8b.json").read_bytes())
    assert entry(invoke(path, "--id", "m"))["attention"]["n_kv_heads"] == 8
    for name in ("deepseek-v3", "gpt-oss-120b", "mixtral-8x22b", "qwen3-235b-a22b"):
        assert entry(invoke(FIXTURES / f"{name}.json", "--id", name))["id"] == name


# -- files that are not a JSON object -------------------------------------------------------------------------
LLAMA = (FIXTURES / "llama-3.1-8b.json").read_text()
FILE_CASES = [
    ("empty", b"", ("empty",)),
    ("blank", b"  \n\t\n", ("empty",)),
    ("garbage", b"hidden_size = 4096\n", ("not valid JSON", "line 1")),
    ("truncated", LLAMA[:100].encode(), ("not valid JSON",)),
    ("array", b"[1, 2, 3]", ("JSON object",)),
    ("string", b'"llama"', ("JSON object",)),
    ("null", b"null", ("JSON object",)),
    ("nan", LLAMA.replace("4096", "NaN").encode(), ("NaN", "line 1", "'hidden_size'")),
    ("infinity", LLAMA.replace("128256", "Infinity").encode(), ("Infinity", "line 2", "'vocab_size'")),
    ("minus-infinity", LLAMA.replace("128256", "-Infinity").encode(), ("-Infinity", "line 2", "'vocab_size'")),
    ("overflow", LLAMA.replace("128256", "1e400").encode(), ("1e400", "line 2", "'vocab_size'")),
    ("many-digits", LLAMA.replace("128256", "9" * 5000).encode(), ("5,000 digits", "line 2", "'vocab_size'")),
    ("nan-nested", LLAMA.replace('"llama",', '"llama", "rope_scaling": {"factor": [1, NaN]},').encode(),
     ("'rope_scaling.factor[1]'", "NaN")),
    ("deep", b'{"a": ' + b"[" * 5000 + b"]" * 5000 + b"}", ("nested too deeply",)),
    ("duplicate-key", LLAMA.replace('"num_key_value_heads": 8', '"num_key_value_heads": 8, "num_key_value_heads": 0')
     .encode(), ("num_key_value_heads", "twice")),
    ("utf16-bom", LLAMA.encode("utf-16"), ("UTF-16", "UTF-8")),
    ("utf16-no-bom", LLAMA.encode("utf-16-le"), ("UTF-8",)),
    ("latin1", LLAMA.replace('"llama"', '"llamé"').encode("latin-1"), ("UTF-8",)),
    ("nul", LLAMA.encode()[:50] + b"\x00" + LLAMA.encode()[50:], ("NUL",)),
]


@pytest.mark.parametrize(("name", "data", "words"), FILE_CASES, ids=[c[0] for c in FILE_CASES])
def test_a_file_that_is_no_json_object_is_refused(tmp_path, name, data, words):
    path = tmp_path / "config.json"
    path.write_bytes(data)
    refused(invoke(path, "--id", "m"), str(path), *words)


def test_a_missing_file_and_a_folder_are_refused(tmp_path):
    refused(invoke(tmp_path / "nothing.json", "--id", "m"), str(tmp_path / "nothing.json"), "No such file")
    folder = tmp_path / "config.json"
    folder.mkdir()
    refused(invoke(folder, "--id", "m"), str(folder), "directory")


# -- the --id option -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("bad", ["a/b", ".hidden", "", "x y", "../up", "é", "a" * 300, "a\nb", "a.b/../c"])
def test_an_id_that_is_no_plain_name_is_refused(bad):
    refused(invoke(FIXTURES / "llama-3.1-8b.json", "--id", bad), "--id", "A-Z")


def test_a_plain_id_and_the_folder_default(tmp_path):
    assert entry(invoke(FIXTURES / "llama-3.1-8b.json", "--id", "Llama-3.1_8B.v2"))["id"] == "Llama-3.1_8B.v2"
    folder = tmp_path / "Meta-Llama-3.1-8B"
    folder.mkdir()
    (folder / "config.json").write_text(LLAMA)
    assert entry(invoke(folder / "config.json"))["id"] == "Meta-Llama-3.1-8B"
    odd = tmp_path / "my model"
    odd.mkdir()
    (odd / "config.json").write_text(LLAMA)
    refused(invoke(odd / "config.json"), "--id", "my model")


def test_a_multimodal_wrapper_is_read_from_its_text_config(tmp_path):
    path = tmp_path / "config.json"
    inner = edit("llama-3.1-8b", model_type=...)
    path.write_text(json.dumps({"model_type": "llama", "text_config": inner, "vision_config": {"hidden_size": 1}}))
    assert entry(invoke(path, "--id", "m"))["d_model"] == 4096
    path.write_text(json.dumps({"model_type": "llava", "text_config": {**inner, "model_type": "qwen3"}}))
    assert entry(invoke(path, "--id", "m"))["attention"]["qk_norm"] is True


def test_a_catalog_validation_message_names_the_config_keys():
    """Anything the key-by-key checks let through to the catalog's own validation is reported under the config
    keys the values came from (CONFIG_KEYS, FAMILY_KEYS)."""
    from pydantic import ValidationError

    from dse.catalog.hf_import import _catalog_message, entry_from_config
    from dse.catalog.models import ModelSpec

    placeholder = {"total": 1, "active": 1, "precision_total": 1, "precision_active": 1, "source": "p"}
    mixtral = {**entry_from_config(base("mixtral-8x22b"), "m", "c.json"), "published_b": placeholder}
    for changed, kind, prefix, words in [
        ({"ffn": {**mixtral["ffn"], "top_k": 9}}, "mixtral", "", "num_experts_per_tok (9) cannot exceed "
                                                                 "num_local_experts (8)"),
        ({"d_model": 0}, "mixtral", "", "field 'hidden_size': Input should be greater than 0"),
        ({"attention": {**mixtral["attention"], "n_kv_heads": 5}}, "llama", "text_config.",
         "text_config.num_attention_heads (48) must be a multiple of text_config.num_key_value_heads (5)"),
    ]:
        with pytest.raises(ValidationError) as err:
            ModelSpec.model_validate({**mixtral, **changed})
        msg = _catalog_message(err.value, kind, prefix, "c.json")
        assert msg.startswith("c.json: ") and words in msg, msg
