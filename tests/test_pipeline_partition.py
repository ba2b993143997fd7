"""Pipeline partition: the MIP against every cut, the lecture's condition for pipelining across racks."""

from __future__ import annotations

import numpy as np
import pytest
from formulation_contract import FormulationContract

from dse.catalog.hardware import IDEAL, get_system
from dse.catalog.models import get_model
from dse.optimize.solver import solve
from dse.physics.layers import layer_times, pipelining_across_racks_pays
from formulations import pipeline_partition as fpp


def random_instance(rng):
    n = int(rng.integers(3, 11))
    s = int(rng.integers(2, min(4, n) + 1))
    handoff = np.append(rng.uniform(0, 0.3, s - 1), 0.0)
    return fpp.PartitionData(rng.uniform(0.1, 1.0, n) * rng.choice([1, 3], n), s, handoff)


class TestPipelinePartitionContract(FormulationContract):
    def make_instance(self, rng):
        return random_instance(rng)

    def solve_mip(self, data):
        pm = fpp.build(data)
        engine, res = solve(pm.model, "highs")
        a = engine.values(pm.a).to_numpy().reshape(len(data.seconds), data.stages)
        return res.objective, a, res

    def solve_exhaustive(self, data):
        return fpp.exhaustive(data)

    def recheck(self, data, a, value):
        stage = a.argmax(axis=1)
        assert stage[0] == 0 and (np.diff(stage) >= 0).all() and (np.diff(stage) <= 1).all()
        assert set(stage) == set(range(data.stages))
        times = [data.seconds[stage == k].sum() + data.handoff_s[k] for k in range(data.stages)]
        assert max(times) == pytest.approx(value, rel=1e-6)

    def build_model(self, data):
        return fpp.build(data).model


def test_lectures_condition_for_pipelining_across_racks():
    gb200 = get_system("gb200-nvl72")
    ratio = gb200.scaleup_bandwidth / gb200.scaleout_bandwidth  # 9
    assert pipelining_across_racks_pays(8, 1, gb200.scaleup_bandwidth, gb200.scaleout_bandwidth)  # 16 > 9
    assert not pipelining_across_racks_pays(2, 2, gb200.scaleup_bandwidth, gb200.scaleout_bandwidth)  # 8 < 9
    # the same condition from the costs: one token's hand-off over scale-out against its stage's
    # expert traffic over scale-up (dispatch and combine to each active expert, every layer)
    d = 7168
    for k, lps in ((8, 1), (2, 2), (1, 4), (8, 4)):
        handoff = d / gb200.scaleout_bandwidth
        stage_ep = 2 * k * lps * d / gb200.scaleup_bandwidth
        assert (handoff < stage_ep) == (k * lps * 2 > ratio)


def test_deepseek_layers_are_heterogeneous_and_partition_with_the_mtp_head():
    m, gb200 = get_model("deepseek-v3"), get_system("gb200-nvl72")
    lt = layer_times(m, gb200, chips=72, batch=2048, context=8192, mtp=True, eff=IDEAL)
    assert lt.kinds[:3] == ["dense/global"] * 3 and lt.kinds[-1] == "mtp/global" and len(lt.seconds) == 62
    assert lt.seconds[:3].max() < lt.seconds[3:].min()  # dense layers are lighter than MoE layers
    stages = 4
    handoff = np.array([lt.handoff_bytes / 72 / gb200.scaleout_bandwidth] * (stages - 1) + [0.0])
    pm = fpp.build(fpp.PartitionData(lt.seconds, stages, handoff))
    engine, res = solve(pm.model, "highs")
    assert res.status == "optimal"
    assert res.objective >= lt.seconds.sum() / stages
    assert res.objective <= lt.seconds.sum() / stages + lt.seconds.max() + handoff.max()


def test_sliding_window_layers_are_cheaper_at_long_context():
    m, h100 = get_model("gpt-oss-120b"), get_system("h100")
    lt = layer_times(m, h100, chips=8, batch=64, context=131072, eff=IDEAL)
    sliding = [t for k, t in zip(lt.kinds, lt.seconds, strict=True) if "sliding" in k]
    full = [t for k, t in zip(lt.kinds, lt.seconds, strict=True) if "global" in k]
    assert len(sliding) == len(full) == 18 and max(sliding) < min(full)
