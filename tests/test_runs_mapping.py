"""Measured runs name systems and models as their publishers do; every one the catalog holds is mapped."""

from __future__ import annotations

import pytest

from dse.catalog.hardware import default_systems
from dse.validate.runs import MODEL_IDS, SYSTEM_IDS, model_id, system_id


@pytest.mark.parametrize(("path", "expected"), [
    ("nvidia/DeepSeek-R1-NVFP4", "deepseek-v3"),  # a quantized re-release keeps its architecture
    ("nvidia/DeepSeek-R1-FP4", "deepseek-v3"),
    ("nvidia/Kimi-K2.5-NVFP4", "kimi-k2.5"),
    ("amd/Llama-3.3-70B-Instruct-FP8-KV", "llama-3.3-70b"),
    ("RedHatAI/Qwen3-32B-FP8-dynamic", "qwen3-32b"),
    ("someone/Unknown-Model-FP8", None),
    ("nvidia/DeepSeek-R1-Distill-Llama-8B", None),  # a distilled model is another architecture
])
def test_model_ids(path, expected):
    assert model_id(path) == expected


def test_every_listed_id_maps_to_itself():
    assert all(model_id(k) == v for k, v in MODEL_IDS.items())
    catalog = default_systems()
    assert all(system_id(k, catalog) == v for k, v in SYSTEM_IDS.items())


@pytest.mark.parametrize(("name", "expected"), [
    ("gb300", "gb300-nvl72"), ("gb200", "gb200-nvl72"), ("b300_sxm", "b300"), ("a100_sxm", "a100"),
    ("tpu_v7", "tpu-v7"), ("gb300_nvl72", "gb300-nvl72"), ("h20", None), ("rtx_pro_6000", None),
])
def test_system_ids(name, expected):
    assert system_id(name, default_systems()) == expected
