"""The hardware catalog: contents, units, provenance and validation of bad data."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from dse.catalog.hardware import HW_DIR, load_efficiency, load_efficiency_catalog, load_memory_tiers, load_systems
from dse.errors import InputError

SYSTEM_IDS = {
    "a100", "h100", "h100-nvl", "h800", "h200", "b200", "b300", "gb200-nvl72", "gb300-nvl72", "vr200-nvl144",
    "rubin-ultra-nvl576", "tpu-v4", "tpu-v5e", "tpu-v5p", "tpu-v6e", "tpu-v7", "mi300x", "mi325x",
    "mi355x", "trn2",
}


def test_every_system_id_is_present(systems):
    assert set(systems) == SYSTEM_IDS


def test_every_quantity_carries_unit_source_and_date(systems):
    for s in systems.values():
        assert s.quantities, s.id
        for name, q in s.quantities.items():
            assert q.unit and q.source and q.date, (s.id, name)


def test_units_convert_to_si_once_at_load(systems):
    h100 = systems["h100"]
    assert h100.flops["bf16"] == 989e12  # dense, not the 1,979 sparse figure
    assert h100.hbm_bandwidth == 3.35e12
    assert h100.scaleout_bandwidth == 400e9 / 8  # 400 Gb/s is 50 GB/s
    assert h100.scaleup_bandwidth == 450e9  # one direction, not the 900 GB/s bidirectional
    assert h100.price_per_s == pytest.approx(2.95 / 3600)
    assert systems["tpu-v5p"].hbm_capacity == 95 * 2**30  # GiB stays GiB


def test_dense_flops_and_one_direction_links_for_the_contested_figures(systems):
    assert systems["b200"].flops == {"bf16": 2.25e15, "fp8": 4.5e15, "fp4": 9e15}
    assert systems["gb200-nvl72"].scaleup_bandwidth == 900e9
    assert systems["gb200-nvl72"].scaleup_domain == 72
    assert systems["rubin-ultra-nvl576"].scaleup_domain == 144


def test_compute_dtype_falls_back_to_the_next_wider_format(systems):
    assert systems["a100"].compute_dtype("fp8") == "bf16"
    assert systems["h100"].compute_dtype("fp4") == "fp8"
    assert systems["b200"].compute_dtype("fp4") == "fp4"
    # an integer format is dequantized to BF16 (W4A16), even where the chip has FP4 or FP8 tensor units
    assert systems["b200"].compute_dtype("int4") == "bf16" and systems["h200"].compute_dtype("int4") == "bf16"


def test_memory_tiers_and_efficiency_load():
    tiers = load_memory_tiers()
    assert set(tiers) == {"hbm", "host_dram", "nvme", "hdd"}
    assert tiers["hdd"].device_bandwidth == 285e6
    cat = load_efficiency_catalog()
    for eff in (cat.default, *cat.families.values()):
        for value in (eff.compute_prefill, eff.compute_decode, eff.memory, eff.link, eff.hbm_usable):
            assert 0 < value <= 1
        assert 0 <= eff.overlap <= 1
        assert eff.layer_overhead >= 0 and eff.latency_scaleup >= 0 and eff.latency_scaleout >= 0
    assert cat.for_system("h100") == cat.families["hopper"]
    assert cat.for_system("tpu-v5e") == cat.default


def _write(tmp_path: Path, doc: dict) -> Path:
    path = tmp_path / "systems.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


@pytest.fixture()
def doc():
    return yaml.safe_load((HW_DIR / "systems.yaml").read_text())


@pytest.mark.parametrize(
    ("mutate", "expected"),
    [
        (lambda s: s["hbm_bandwidth"].update(unit="TB/sec"), "systems[1] (id 'h100'): field 'hbm_bandwidth': unknown unit 'TB/sec'"),
        (lambda s: s["hbm_bandwidth"].update(unit="GB"), "unit 'GB' measures bytes, but this field is a byte_rate"),
        (lambda s: s["hbm_capacity"].update(value=-80), "field 'hbm_capacity': value must be > 0, got -80"),
        (lambda s: s["prices"]["on_demand"].pop("date"), "field 'prices.on_demand': missing 'date'"),
        (lambda s: s["prices"]["on_demand"].update(source="nowhere"), "unknown source 'nowhere'"),
        (lambda s: s["prices"].update(spot=s["prices"]["on_demand"]),
         "field 'prices.spot': unknown price kind; allowed: tco_hyperscaler, tco_neocloud, rental_3yr, on_demand"),
        (lambda s: s.update(status="rumoured"), "field 'status': 'rumoured' is not one of shipping, announced"),
        (lambda s: s["kv_dtypes"].update(values=["fp8", "int4"]), "field 'kv_dtypes': ['int4']; allowed: bf16"),
        (lambda s: s.update(hbm_bandwith=s["hbm_bandwidth"]), "unknown field 'hbm_bandwith'; did you mean hbm_bandwidth"),
        (lambda s: s.update(scaleup_topology="ring"), "field 'scaleup_topology': 'ring' is not one of switch, mesh, torus2d, torus3d"),
    ],
)
def test_bad_catalog_data_names_file_row_and_field(tmp_path, doc, mutate, expected):
    mutate(doc["systems"][1])
    path = _write(tmp_path, doc)
    with pytest.raises(InputError) as err:
        load_systems(path)
    assert str(path) in str(err.value)
    assert expected in str(err.value)


def test_duplicate_id_is_rejected(tmp_path, doc):
    doc["systems"].append(dict(doc["systems"][0]))
    last = len(doc["systems"]) - 1
    with pytest.raises(InputError, match=rf"systems\[{last}\] \(id 'a100'\): duplicate id 'a100'"):
        load_systems(_write(tmp_path, doc))


def test_yaml_syntax_error_names_the_line(tmp_path):
    path = tmp_path / "systems.yaml"
    path.write_text("systems:\n  - id: x\n    name: [unclosed\n")
    with pytest.raises(InputError, match=r"systems.yaml: line \d+: not valid YAML"):
        load_systems(path)


def test_efficiency_above_one_is_rejected(tmp_path):
    doc = yaml.safe_load((HW_DIR / "efficiency.yaml").read_text())
    doc["factors"]["memory"]["value"] = 1.3
    path = tmp_path / "efficiency.yaml"
    path.write_text(yaml.safe_dump(doc))
    with pytest.raises(InputError, match="field 'memory': a fraction must lie in"):
        load_efficiency(path)
