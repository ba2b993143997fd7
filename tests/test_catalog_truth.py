"""Issue 11: prices by kind, power, native formats, announced systems, context windows, imported configs."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import yaml
from helpers import dse

from dse.catalog.hardware import HW_DIR, PRICE_KINDS, default_systems, priced
from dse.catalog.hf_import import import_config
from dse.errors import InputError
from dse.physics.evaluate import Config, evaluate_config
from dse.physics.roofline import alltoall_factor
from dse.studies.base import load_study

FIXTURES = Path(__file__).parent / "fixtures" / "hf_configs"
ROOT = Path(__file__).resolve().parents[1]


def test_no_proxy_price_remains_and_every_price_has_a_kind_source_and_date():
    doc = yaml.safe_load((HW_DIR / "systems.yaml").read_text())
    for entry in doc["systems"]:
        assert "price" not in entry, entry["id"]
        for kind, q in (entry.get("prices") or {}).items():
            assert kind in PRICE_KINDS and q["source"] != "estimate" and q["date"], (entry["id"], kind)
            assert "per unit of HBM bandwidth" not in q.get("note", "")
    od = default_systems("on_demand")
    assert od["h100"].price_per_s * 3600 == pytest.approx(2.95) and od["h100"].price_kind == "on_demand"
    assert math.isnan(od["mi355x"].price_per_s) and math.isnan(od["tpu-v7"].price_per_s)  # no quote: no price
    tco = default_systems("tco_hyperscaler")
    assert tco["mi355x"].price_per_s * 3600 == pytest.approx(1.48)
    assert tco["b300"].price_is_estimate and not tco["b200"].price_is_estimate
    assert priced(od["h800"], "on_demand", 2.0).price_per_s * 3600 == pytest.approx(2.0)


def test_power_all_in_and_energy_per_token():
    s = default_systems()
    assert s["h100"].power_all_in_w == 1730 and s["mi355x"].power_all_in_w == 2650
    assert math.isnan(s["tpu-v6e"].power_all_in_w)  # no sourced all-in figure: left NaN, not proxied
    ev = evaluate_config(Config(model="llama-3.1-70b", system="h100", tp=8, batch=64, context=4096))
    assert ev["power_w"] == pytest.approx(8 * 1730)
    assert ev["joules_per_token"] == pytest.approx(ev["power_w"] / ev["tokens_per_s"])


def test_non_native_formats_are_refused_unless_weight_only():
    with pytest.raises(InputError, match="'h100' has no fp4 tensor units; allowed: bf16, fp8"):
        evaluate_config(Config(model="llama-3.1-70b", system="h100", tp=8, batch=8, context=4096, weights_dtype="fp4"))
    with pytest.raises(InputError, match="not a KV-cache format of 'h100'"):
        evaluate_config(Config(model="llama-3.1-70b", system="h100", tp=8, batch=8, context=4096, kv_dtype="fp4"))
    native = evaluate_config(Config(model="llama-3.1-70b", system="h100", tp=8, batch=8, context=4096,
                                    weights_dtype="fp8", kv_dtype="fp8"))
    wo = evaluate_config(Config(model="llama-3.1-70b", system="h100", tp=8, batch=8, context=4096,
                                weights_dtype="fp4", kv_dtype="fp8", weight_only=True))
    assert wo["compute_dtype"] == "fp8" and wo["attention_dtype"] == "fp8"
    # stored in 4 bits plus one FP16 scale per 128 weights: 4.125 bits, not 4
    assert wo["weights_bytes_per_chip"] == pytest.approx(native["weights_bytes_per_chip"] * (0.5 + 2 / 128))
    assert wo["compute_s"] == pytest.approx(native["compute_s"])  # no FP4 math on Hopper


def test_int4_experts_are_stored_in_four_bits_and_computed_in_bf16():
    """Kimi-K2.5's release: routed experts in int4 (W4A16), the rest in BF16; weight-only on every chip."""
    base = dict(model="kimi-k2.5", system="h200", tp=8, ep=1, batch=32, context=4096, weights_dtype="bf16")
    with pytest.raises(InputError, match="no int4 tensor units"):
        evaluate_config(Config(**base, experts_dtype="int4"))
    int4 = evaluate_config(Config(**base, experts_dtype="int4", weight_only=True))
    fp4 = evaluate_config(Config(**base, experts_dtype="fp4", weight_only=True))
    bf16 = evaluate_config(Config(**base))
    assert int4["experts_compute_dtype"] == "bf16" and fp4["experts_compute_dtype"] == "fp8"
    assert int4["weights_bytes_per_chip"] == pytest.approx(fp4["weights_bytes_per_chip"])  # 4 bits + group scales
    assert int4["weights_bytes_per_chip"] < bf16["weights_bytes_per_chip"] / 3
    assert int4["compute_s"] == pytest.approx(bf16["compute_s"])  # the GEMMs run in BF16


def test_cli_refuses_fp4_on_hopper_with_exit_2():
    r = dse("evaluate", "--model", "deepseek-v3", "--system", "h100", "--ep", "8", "--batch", "8", "--context", "4096",
            "--weights-dtype", "fp4")
    assert r.returncode == 2 and "no fp4 tensor units" in r.stderr


def test_experts_and_attention_formats_differ_from_the_weights():
    base = dict(model="deepseek-v3", system="b200", ep=8, batch=256, context=4096, kv_dtype="fp8")
    fp8 = evaluate_config(Config(**base, weights_dtype="fp8"))
    mixed = evaluate_config(Config(**base, weights_dtype="fp8", experts_dtype="fp4"))
    assert mixed["experts_dtype"] == "fp4" and mixed["weights_dtype"] == "fp8"
    assert mixed["weights_bytes_per_chip"] < fp8["weights_bytes_per_chip"]
    assert mixed["compute_s"] < fp8["compute_s"]
    bf16_kv = evaluate_config(Config(**{**base, "kv_dtype": "bf16"}, weights_dtype="fp4"))
    assert bf16_kv["attention_dtype"] == "bf16"  # attention never at the weights' fp4 rate


def test_mesh_all_to_all_gives_each_peer_a_seventh():
    assert alltoall_factor(8.0, -1.0, 8.0) == pytest.approx(1.0)
    assert alltoall_factor(2.0, -1.0, 8.0) == pytest.approx(1 / 7)
    assert alltoall_factor(2.0, 0.0, 8.0) == 1.0
    assert default_systems()["mi300x"].topology == "mesh"


def test_announced_systems_are_left_out_of_all_unless_included():
    doc = yaml.safe_load((ROOT / "studies" / "fast_slow_mode.yaml").read_text())
    assert "rubin-ultra-nvl576" not in load_study(doc).options().systems
    doc["include_announced"] = True
    assert "rubin-ultra-nvl576" in load_study(doc).options().systems
    ru = default_systems()["rubin-ultra-nvl576"]
    assert ru.announced and ru.flops["fp4"] == 104e15 and ru.quantities["flops_fp4"].estimate


def test_context_beyond_the_window_is_refused_naming_the_limit():
    with pytest.raises(InputError, match="published maximum context of 'deepseek-v3' \\(131,072 tokens"):
        evaluate_config(Config(model="deepseek-v3", system="h100", ep=8, batch=1, context=1_000_000))
    ev = evaluate_config(Config(model="deepseek-v3", system="b200", ep=8, batch=1, context=200_000,
                                allow_beyond_trained_context=True))
    assert ev["beyond_trained_context"] is True
    doc = yaml.safe_load((ROOT / "studies" / "cheapest_1m_context.yaml").read_text())
    doc["models"] = ["deepseek-v3"]
    with pytest.raises(InputError, match="131,072"):
        load_study(doc)
    doc["allow_beyond_trained_context"] = True
    assert load_study(doc).allow_beyond_trained_context


def test_study_price_kind_and_supplied_prices():
    doc = yaml.safe_load((ROOT / "studies" / "fast_slow_mode.yaml").read_text())
    doc.update(price="tco_neocloud", prices={"trn2": 2.0})
    spec = load_study(doc)
    opts = spec.options()
    assert opts.price_kind == "tco_neocloud" and dict(opts.prices) == {"trn2": 2.0}
    doc["price"] = "spot"
    with pytest.raises(InputError, match="field 'price'"):
        load_study(doc)


@pytest.mark.parametrize(("name", "total", "active"), [
    ("llama-3.1-8b", 8.03e9, 7.50e9), ("deepseek-v3", 671e9, 36.6e9), ("qwen3-235b-a22b", 235.1e9, 21.6e9),
    ("mixtral-8x22b", 140.6e9, 39.0e9), ("gpt-oss-120b", 116.8e9, 5.13e9),
])
def test_import_model_reads_published_configs(name, total, active):
    entry, arch = import_config(FIXTURES / f"{name}.json", name)
    assert arch.params_total == pytest.approx(total, rel=0.005)
    assert arch.params_active == pytest.approx(active, rel=0.01)
    assert entry["max_context"]["tokens"] > 0 and "DERIVED" in entry["published_b"]["source"]


def test_import_model_cli_and_unsupported_architecture():
    r = dse("catalog", "import-model", str(FIXTURES / "deepseek-v3.json"), "--id", "dsv3")
    assert r.returncode == 0 and "671.0" in r.stdout and yaml.safe_load(r.stdout)["models"][0]["id"] == "dsv3"
    r = dse("catalog", "import-model", str(FIXTURES / "qwen3-next.json"))
    assert r.returncode == 2 and "field 'model_type'" in r.stderr and "qwen3_next" in r.stderr


def test_catalog_hardware_json_shows_kinds_power_formats_status():
    rows = {r["id"]: r for r in json.loads(dse("catalog", "hardware", "--json").stdout)}
    assert rows["h100"]["prices"]["tco_hyperscaler"]["usd_per_hour"] == 1.30
    assert rows["h100"]["native_dtypes"] == ["bf16", "fp8"] and rows["b200"]["kv_dtypes"] == ["bf16", "fp8", "fp4"]
    assert rows["vr200-nvl144"]["status"] == "announced" and rows["h100"]["power_all_in_w"] == 1730
