"""Read a Hugging Face ``config.json`` into a model-catalog entry (Llama, Mistral, Qwen2/3, Qwen-MoE,
Mixtral, DeepSeek-V3 / Kimi-K2 MLA-MoE and gpt-oss families); anything the schema cannot express is
refused with the config field that names it.

Every config key the importer reads is checked under its own name (``text_config.`` before it where the
language model sits in a multimodal wrapper): counts are whole numbers (``4096.0`` reads as 4096; ``1.5``,
``true``, ``"4096"`` are refused), sizes positive, flags ``true`` or ``false``, names strings, nested configs
objects. A key left ``null`` or out takes the Hugging Face default where it has one (``num_key_value_heads``:
every head its own KV head; ``head_dim``: hidden_size / num_attention_heads). The file must be UTF-8 JSON
(RFC 8259; a UTF-8 byte-order mark is skipped, UTF-16 and UTF-32 are refused), one object, without NaN or
Infinity (Python's json module would accept them) and without a key given twice in one object. The catalog id
(``--id``, by default the config's folder name) is plain: letters, digits, '.', '_' and '-', not starting with '.'.
"""

from __future__ import annotations

import codecs
import json
import math
import os
import re
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from dse.catalog.loading import read_text, validation_message
from dse.catalog.models import Architecture, ModelSpec
from dse.errors import InputError

DENSE = ("llama", "mistral", "qwen2", "qwen3")
MOE = ("qwen2_moe", "qwen3_moe", "mixtral", "deepseek_v3", "kimi_k2", "gpt_oss")
FAMILIES = DENSE + MOE
MLA = ("deepseek_v3", "kimi_k2")
LAYER_KINDS = ("full_attention", "sliding_attention")
NESTED = ("text_config", "rope_scaling", "quantization_config")
"""Nested configs that must be JSON objects where given (``text_config`` is read, the others only checked)."""
MAX_COUNT = 10**9
"""Largest size or count read (the catalog's bound)."""
MAX_INT_DIGITS = 100
"""Longest integer literal parsed (Python refuses past 4,300 digits with a bare ValueError)."""
ID_PATTERN = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9._-]{0,99}")
"""A catalog id: letters, digits, '.', '_' and '-', not starting with '.', at most 100 characters."""

CONFIG_KEYS = {
    "d_model": "hidden_size", "n_layers": "num_hidden_layers", "vocab": "vocab_size",
    "tie_embeddings": "tie_word_embeddings", "max_context.tokens": "max_position_embeddings",
    "attention.n_heads": "num_attention_heads", "attention.n_kv_heads": "num_key_value_heads",
    "attention.head_dim": "head_dim", "attention.bias": "attention_bias", "attention.q_lora_rank": "q_lora_rank",
    "attention.kv_lora_rank": "kv_lora_rank", "attention.qk_nope_head_dim": "qk_nope_head_dim",
    "attention.qk_rope_head_dim": "qk_rope_head_dim", "attention.v_head_dim": "v_head_dim",
    "attention.sliding_window": "sliding_window", "attention.sliding_layers": "layer_types",
    "ffn.d_ff": "intermediate_size", "ffn.d_ff_dense": "intermediate_size", "ffn.d_ff_expert": "moe_intermediate_size",
    "ffn.top_k": "num_experts_per_tok", "ffn.dense_layers": "first_k_dense_replace",
    "ffn.router_bias": "topk_method",
}
"""Catalog field -> the config key its value comes from (`FAMILY_KEYS` overrides it per family): a message of the
catalog's own validation names the config key the user wrote, not the catalog field."""
FAMILY_KEYS = {
    "mixtral": {"ffn.n_experts": "num_local_experts", "ffn.d_ff_expert": "intermediate_size"},
    "gpt_oss": {"ffn.n_experts": "num_local_experts", "ffn.d_ff_expert": "intermediate_size",
                "ffn.top_k": "experts_per_token"},
    "qwen2_moe": {"ffn.n_experts": "num_experts", "ffn.n_shared": "shared_expert_intermediate_size"},
    "qwen3_moe": {"ffn.n_experts": "num_experts", "ffn.n_shared": "shared_expert_intermediate_size"},
    "deepseek_v3": {"ffn.n_experts": "n_routed_experts", "ffn.n_shared": "n_shared_experts"},
    "kimi_k2": {"ffn.n_experts": "n_routed_experts", "ffn.n_shared": "n_shared_experts"},
}


def config_key(kind: str | None, field: str) -> str | None:
    """The config key a catalog field (``attention.n_kv_heads``) is read from for a family, or None."""
    return FAMILY_KEYS.get(kind or "", {}).get(field) or CONFIG_KEYS.get(field)


def _show(value: object) -> str:
    """A value as the config wrote it (JSON), shortened."""
    try:
        text = json.dumps(value)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


class _Config:
    """One config mapping read key by key; every refusal names the file and the key as the config spells it."""

    def __init__(self, cfg: dict, where: str, prefix: str = "", kind: str | None = None) -> None:
        self.cfg, self.where, self.prefix, self.kind = cfg, where, prefix, kind

    def name(self, key: str) -> str:
        return self.prefix + key

    def fail(self, key: str, must: str, value: object) -> None:
        raise InputError(f"{self.where}: field '{self.name(key)}': must be {must}, got {_show(value)}")

    def refuse(self, key: str, value: object, why: str) -> None:
        raise InputError(f"{self.where}: field '{self.name(key)}' = {_show(value)}: {why}; the catalog schema "
                         "cannot express it")

    def given(self, key: str) -> bool:
        return self.cfg.get(key) is not None

    def missing(self, key: str) -> None:
        raise InputError(f"{self.where}: missing field '{self.name(key)}' that a {self.kind} config needs")

    def count(self, key: str, *, required: bool = True, default: int | None = None, minimum: int = 1,
            at_most: tuple[str, int] | None = None, below: tuple[str, int] | None = None,
            dividing: tuple[str, int] | None = None) -> int | None:
        """A whole number (an integral float such as 4096.0 reads as 4096): at least ``minimum``, at most
        ``at_most``, below ``below`` and dividing ``dividing`` (each a (config key, value) the message names).
        """
        value = self.cfg.get(key)
        if value is None:
            if required:
                self.missing(key)
            return default
        must = "a positive integer" if minimum == 1 else f"an integer >= {minimum}"
        hi = MAX_COUNT
        if at_most is not None:
            must += f" of at most {at_most[0]} ({at_most[1]})"
            hi = min(hi, at_most[1])
        if below is not None:
            must += f" below {below[0]} ({below[1]})"
            hi = min(hi, below[1] - 1)
        if dividing is not None:
            must += f" dividing {dividing[0]} ({dividing[1]})"
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            self.fail(key, must, value)
        if isinstance(value, float) and not (math.isfinite(value) and value.is_integer()):
            self.fail(key, must, value)
        whole = int(value)
        if whole < minimum or whole > hi or (dividing is not None and (whole == 0 or dividing[1] % whole)):
            if whole > MAX_COUNT:
                must += f" (at most {MAX_COUNT:,})"
            self.fail(key, must, value)
        return whole

    def flag(self, key: str) -> bool:
        """A flag: true or false; null or left out is false."""
        value = self.cfg.get(key)
        if value is None:
            return False
        if not isinstance(value, bool):
            self.fail(key, "true or false", value)
        return value

    def text(self, key: str) -> str | None:
        value = self.cfg.get(key)
        if value is not None and not isinstance(value, str):
            self.fail(key, "a string", value)
        return value

    def objects(self) -> None:
        """The nested configs, where given, are objects."""
        for key in NESTED:
            if key in self.cfg and self.cfg[key] is not None and not isinstance(self.cfg[key], dict):
                self.fail(key, "an object (a JSON mapping)", self.cfg[key])

    def strings(self, key: str) -> list[str] | None:
        value = self.cfg.get(key)
        if value is None:
            return None
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            self.fail(key, "a list of strings", value)
        return value


def _language_model(cfg: dict, where: str) -> _Config:
    """The config of the language model: the file's own, or its ``text_config`` (multimodal wrappers)."""
    outer = _Config(cfg, where)
    outer.objects()
    inner = cfg.get("text_config")
    if inner is None:
        r = outer
    else:
        r = _Config(inner, where, "text_config.")
        r.objects()
    named = r if r.given("model_type") else outer  # a wrapper may name the family outside text_config
    kind = named.cfg.get("model_type")
    if kind is None:
        raise InputError(f"{where}: missing field '{r.name('model_type')}' (allowed: {', '.join(FAMILIES)})")
    if not isinstance(kind, str) or kind not in FAMILIES:
        raise InputError(f"{where}: field '{named.name('model_type')}': {_show(kind)} is not supported; allowed: "
                         f"{', '.join(FAMILIES)}")
    r.kind = kind
    return r


def entry_from_config(cfg: dict, model_id: str, where: str) -> dict:
    """A catalog entry (the mapping ``models.yaml`` holds) from a config.json mapping; every key read is checked
    (an InputError names the file and the key as the config spells it).
    """
    r = _language_model(cfg, where)
    kind = r.kind
    d = r.count("hidden_size")
    heads = r.count("num_attention_heads")
    layers = r.count("num_hidden_layers")
    layer_types = r.strings("layer_types") or []
    if set(layer_types) - set(LAYER_KINDS):
        r.refuse("layer_types", sorted(set(layer_types) - set(LAYER_KINDS)),
                 "layer kinds other than full and sliding attention")
    if layer_types and len(layer_types) != layers:
        raise InputError(f"{where}: field '{r.name('layer_types')}': must name one kind per layer, "
                         f"num_hidden_layers ({layers}) entries, got {len(layer_types)}")
    entry: dict = {
        "id": model_id, "name": model_id,
        "source": {"title": f"{where} (imported by dse catalog import-model)", "url": "", "date": "unknown"},
        "d_model": d, "n_layers": layers, "vocab": r.count("vocab_size"),
        "tie_embeddings": r.flag("tie_word_embeddings"),
    }
    if kind in MLA:
        entry["attention"] = {"kind": "mla", "n_heads": heads, "q_lora_rank": r.count("q_lora_rank", required=False),
                              "kv_lora_rank": r.count("kv_lora_rank"),
                              "qk_nope_head_dim": r.count("qk_nope_head_dim"),
                              "qk_rope_head_dim": r.count("qk_rope_head_dim"), "v_head_dim": r.count("v_head_dim")}
    else:
        kv_heads = r.count("num_key_value_heads", required=False, default=heads,
                           dividing=("num_attention_heads", heads))
        if not r.given("head_dim") and d % heads:
            raise InputError(f"{where}: field '{r.name('head_dim')}' is not given and hidden_size ({d}) is not a "
                             f"multiple of num_attention_heads ({heads}): state head_dim")
        attn = {"kind": "gqa", "n_heads": heads, "n_kv_heads": kv_heads,
                "head_dim": r.count("head_dim", required=False, default=d // heads)}
        if r.flag("attention_bias") or kind == "qwen2":
            attn["bias"] = True
        if kind in ("qwen3", "qwen3_moe"):
            attn["qk_norm"] = True
        if kind == "gpt_oss":
            attn["sinks"] = True
        sliding = sum(t == "sliding_attention" for t in layer_types)
        if sliding:
            attn["sliding_window"] = r.count("sliding_window")
            attn["sliding_layers"] = sliding
        elif kind in ("mistral", "mixtral") and r.given("sliding_window"):
            r.refuse("sliding_window", r.count("sliding_window"), "a sliding window on every layer")
        entry["attention"] = attn
    if kind in DENSE:
        entry["ffn"] = {"kind": "dense", "d_ff": r.count("intermediate_size")}
    elif kind in ("mixtral", "gpt_oss"):
        experts = r.count("num_local_experts")
        top = ("experts_per_token" if kind == "gpt_oss" and r.given("experts_per_token")
               else "num_experts_per_tok")
        entry["ffn"] = {"kind": "moe", "n_experts": experts,
                        "top_k": r.count(top, at_most=("num_local_experts", experts)),
                        "d_ff_expert": r.count("intermediate_size")}
        if kind == "gpt_oss":
            entry["ffn"].update(bias=True, router_bias=True)
    elif kind in ("qwen2_moe", "qwen3_moe"):
        only = r.cfg.get("mlp_only_layers")
        if only is not None and not isinstance(only, list):
            r.fail("mlp_only_layers", "a list of layer indices", only)
        if only:
            r.refuse("mlp_only_layers", only, "dense layers interleaved with MoE layers")
        step = r.count("decoder_sparse_step", required=False, default=1)
        if step != 1:
            r.refuse("decoder_sparse_step", step, "MoE on only some layers")
        expert = r.count("moe_intermediate_size")
        shared = r.count("shared_expert_intermediate_size", required=False, default=0, minimum=0)
        if shared % expert:
            r.refuse("shared_expert_intermediate_size", shared,
                     f"a shared expert that is not a whole number of routed experts of {expert}")
        experts = r.count("num_experts")
        entry["ffn"] = {"kind": "moe", "n_experts": experts,
                        "top_k": r.count("num_experts_per_tok", at_most=("num_experts", experts)),
                        "n_shared": shared // expert, "d_ff_expert": expert}
    else:  # deepseek_v3, kimi_k2
        experts = r.count("n_routed_experts")
        ffn = {"kind": "moe", "n_experts": experts,
               "top_k": r.count("num_experts_per_tok", at_most=("n_routed_experts", experts)),
               "n_shared": r.count("n_shared_experts", required=False, default=0, minimum=0),
               "d_ff_expert": r.count("moe_intermediate_size"), "router_bias": r.text("topk_method") == "noaux_tc"}
        dense = r.count("first_k_dense_replace", required=False, default=0, minimum=0,
                        below=("num_hidden_layers", layers))
        if dense:
            ffn.update(dense_layers=dense, d_ff_dense=r.count("intermediate_size"))
        entry["ffn"] = ffn
    window = r.count("max_position_embeddings", required=False)
    if window:
        entry["max_context"] = {"tokens": window, "source": f"{where}: max_position_embeddings (check the model card)",
                                "date": "unknown"}
    return entry


class _Refused:
    """A JSON literal the importer refuses, kept in the parsed document where it stood (so that the message
    can name its key): ``literal`` as written, ``why`` it is refused.
    """

    def __init__(self, literal: str, why: str) -> None:
        self.literal, self.why = literal, why


class _DuplicateKey(Exception):
    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key


def _constant(name: str) -> _Refused:
    return _Refused(name, f"{name} is not a JSON number (JSON has no NaN or Infinity)")


def _float(text: str) -> float | _Refused:
    value = float(text)
    return value if math.isfinite(value) else _Refused(text, f"the number {text} is beyond the range of a double")


def _int(text: str) -> int | _Refused:
    digits = len(text.lstrip("-"))
    if digits > MAX_INT_DIGITS:
        return _Refused(text, f"an integer of {digits:,} digits (at most {MAX_INT_DIGITS} are read)")
    return int(text)


def _object(pairs: list[tuple[str, Any]]) -> dict:
    out: dict = {}
    for key, value in pairs:
        if key in out:
            raise _DuplicateKey(key)
        out[key] = value
    return out


def _first_refused(doc: Any) -> tuple[str, _Refused] | None:
    """The key path (``rope_scaling.factor``, ``layer_types[3]``) and value of the first refused literal, in
    document order (iterative: a deep document does not exhaust the stack).
    """
    stack: list[tuple[str, Any]] = [("", doc)]
    while stack:
        where, node = stack.pop()
        if isinstance(node, _Refused):
            return where, node
        if isinstance(node, dict):
            stack += [(f"{where}.{k}" if where else str(k), v) for k, v in reversed(node.items())]
        elif isinstance(node, list):
            stack += [(f"{where}[{i}]", v) for i, v in reversed(list(enumerate(node)))]
    return None


def _line_of(text: str, literal: str, last: bool = False) -> str:
    """'line N: ' of a literal where it stands as a JSON value or key (the last one if ``last``), or ''."""
    found = list(re.finditer(r"(?<![\w.+-])" + re.escape(literal) + r"(?![\w.])", text))
    if not found:
        return ""
    m = found[-1] if last else found[0]
    return f"line {text.count(chr(10), 0, m.start()) + 1}: "


def read_config(path: Path) -> dict:
    """A config.json as a mapping; a file that is not one UTF-8 JSON object is an InputError naming it."""
    path = Path(path)
    if path.exists() and not path.is_file():
        raise InputError(f"{path}: is a directory or a device, not a file; give the path of a config.json")
    try:
        with path.open("rb") as f:
            head = f.read(4)
    except OSError:
        head = b""  # read_text says why
    for bom, name in ((codecs.BOM_UTF32_LE, "UTF-32"), (codecs.BOM_UTF32_BE, "UTF-32"),
                      (codecs.BOM_UTF16_LE, "UTF-16"), (codecs.BOM_UTF16_BE, "UTF-16")):
        if head.startswith(bom):
            raise InputError(f"{path}: {name} text; a config.json is UTF-8 (RFC 8259): save it as UTF-8")
    text = read_text(path)
    if not text.strip():
        raise InputError(f"{path}: empty file; a config.json is one JSON object")
    try:
        cfg = json.loads(text, parse_constant=_constant, parse_float=_float, parse_int=_int,
                         object_pairs_hook=_object)
    except _DuplicateKey as exc:
        line = _line_of(text, json.dumps(exc.key), last=True)
        raise InputError(f"{path}: {line}key '{exc.key}' given twice in one object; each key may appear once"
                         ) from None
    except RecursionError:
        raise InputError(f"{path}: nested too deeply to read; a config.json nests objects a few levels deep"
                         ) from None
    except json.JSONDecodeError as exc:
        raise InputError(f"{path}: line {exc.lineno}: not valid JSON: {exc.msg} (column {exc.colno})") from None
    except ValueError as exc:
        raise InputError(f"{path}: not valid JSON: {exc}") from None
    refused = _first_refused(cfg)
    if refused is not None:
        key, bad = refused
        field = f"field '{key}': " if key else ""
        raise InputError(f"{path}: {_line_of(text, bad.literal)}{field}not valid JSON: {bad.why}")
    if not isinstance(cfg, dict):
        got = "an array" if isinstance(cfg, list) else "null" if cfg is None else _show(cfg)
        raise InputError(f"{path}: a config.json is a JSON object ({{...}}), got {got}")
    return cfg


def check_id(model_id: str, what: str = "option '--id'") -> str:
    """``model_id`` if it is a plain id (letters, digits, '.', '_', '-'; not starting with '.'), else an
    InputError naming ``what``.
    """
    if not ID_PATTERN.fullmatch(model_id):
        raise InputError(f"{what}: {model_id!r} is not a plain id: 1 to 100 of A-Z a-z 0-9 . _ -, not starting "
                         "with '.'")
    return model_id


def _catalog_message(exc: ValidationError, kind: str | None, prefix: str, where: str) -> str:
    """The catalog's validation message with each catalog field replaced by the config key it was read from."""
    msg = validation_message(exc, ModelSpec, where)
    for field in sorted({*CONFIG_KEYS, *FAMILY_KEYS.get(kind or "", {})}, key=len, reverse=True):
        key = prefix + config_key(kind, field)
        msg = msg.replace(f"'{field}'", f"'{key}'")
        leaf = field.rsplit(".", 1)[-1]
        if leaf != config_key(kind, field):
            msg = re.sub(rf"(?<![\w.']){re.escape(leaf)}(?![\w'])", key, msg)
    return msg.replace("field 'attention': ", "").replace("field 'ffn': ", "")


def import_config(path: Path, model_id: str | None = None) -> tuple[dict, Architecture]:
    """Read, convert and validate a config.json; the entry carries placeholder published counts (the
    derived ones, marked) that the user replaces with the publisher's figures.
    """
    if model_id is not None:
        check_id(model_id)
    else:
        folder = Path(os.path.abspath(path)).parent.name
        model_id = check_id(folder, f"{path}: the folder name (the default for --id)") if folder else "imported"
    cfg = read_config(path)
    entry = entry_from_config(cfg, model_id, str(path))
    probe = {**entry, "published_b": {"total": 1, "active": 1, "precision_total": 1, "precision_active": 1,
                                      "source": "placeholder"}, "hypothetical": "max_context" not in entry}
    try:
        arch = Architecture(ModelSpec.model_validate(probe))
    except ValidationError as exc:
        inner = isinstance(cfg.get("text_config"), dict)
        kind = (cfg["text_config"] if inner else cfg).get("model_type") or cfg.get("model_type")
        raise InputError(_catalog_message(exc, kind, "text_config." if inner else "", str(path))) from None
    entry["published_b"] = {
        "total": round(arch.params_total / 1e9, 2), "active": round(arch.params_active / 1e9, 2),
        "precision_total": 0.01, "precision_active": 0.01,
        "source": "DERIVED at import, not published: replace with the publisher's totals before use",
    }
    return entry, arch
