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


def test_a_measurement_listed_again_is_read_once():
    """Rows of one measurement (same model, system, framework, mode, lengths, concurrency, TTFT and TPOT) are one
    observation: copies stating the same deployment leave the first; copies stating different deployments leave
    one, on the fewest chips, marked ``conflicting`` (predicted apart, read by no fit), unless one layout is stated
    whole (a disaggregated copy with its worker counts beside one without): that copy is the measurement's; coverage
    counts measurements. On the catalog's file: 512 copies; 53 measurements read on the copy stating the whole
    layout, 43 listed with conflicting layouts."""
    import numpy as np
    import pandas as pd

    from dse.catalog.hardware import hw_dir
    from dse.validate.runs import map_runs, read_runs

    raw = read_runs(hw_dir() / "calibration" / "published" / "measured_serving.csv")
    llama = raw[(raw["mode"] == "agg") & (raw["model_path"] == "meta-llama/Llama-3.1-8B-Instruct")]
    agg = llama.drop_duplicates(["silicon_ttft_ms", "silicon_tpot_ms"]).head(3)
    one, two, three = (agg.iloc[[i]].copy() for i in range(3))
    copy = one.assign(id="copy-of-first")  # the same measurement under another id and the same deployment
    other = two.assign(id="other-layout", tp_size=two["tp_size"] * 2)  # the same measurement on twice the chips
    runs = map_runs(pd.concat([one, copy, two, other, three], ignore_index=True))
    t = runs.table.set_index("id")
    assert len(t) == 3 and runs.given == 5
    assert {(d["id"], d["copy_of"]) for d in runs.duplicates} == {("copy-of-first", one["id"].iat[0]),
                                                                   ("other-layout", two["id"].iat[0])}
    assert t.loc[one["id"].iat[0], "layout"] == "stated" and t.loc[three["id"].iat[0], "layout"] == "stated"
    assert t.loc[two["id"].iat[0], "layout"] == "conflicting"
    # a disaggregated measurement listed by one export with its worker counts and by another without them (and its
    # prefill pool's attention DP 8 written as TP 8): the copy that states the whole layout is kept, as stated
    dis = raw[(raw["mode"] == "disagg") & (raw["prefill_num_workers"] >= 1) & (raw["decode_num_workers"] >= 2)
              & (raw["prefill_attention_dp_size"] > 1)].drop_duplicates(["silicon_ttft_ms", "silicon_tpot_ms"]).head(1)
    bare = dis.assign(id="no-workers", prefill_num_workers=np.nan, decode_num_workers=np.nan,
                      prefill_tp_size=dis["prefill_attention_dp_size"], prefill_attention_dp_size=1.0)
    for rows in ([bare, dis], [dis, bare]):
        runs = map_runs(pd.concat(rows, ignore_index=True))
        t = runs.table.set_index("id")
        assert len(t) == 1 and t.index[0] == dis["id"].iat[0] and t["layout"].iat[0] == "stated"
        assert t["replicas"].iat[0] == dis["decode_num_workers"].iat[0] >= 2
        assert runs.duplicates == [{"id": "no-workers", "copy_of": dis["id"].iat[0]}]
    catalog = map_runs(raw)
    assert len(catalog.duplicates) == 512 and (catalog.table["layout"] == "conflicting").sum() == 43
