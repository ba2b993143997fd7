"""KV-cache tiering: the MIP against every assignment, and the shipped study's reading of cache pricing."""

from __future__ import annotations

import numpy as np
import pytest
from formulation_contract import FormulationContract

from dse.optimize.bridge import compile_model
from dse.optimize.kv_tiers import TIERS, TieringData, exhaustive, solve_tiering
from formulations.kv_tiering import build


def random_instance(rng):
    n, t = int(rng.integers(1, 5)), len(TIERS)
    kept = rng.uniform(1, 100, n)
    read = rng.uniform(0.1, 10, n)
    cost = rng.uniform(0.1, 10, (n, t))
    load = rng.uniform(0, 2, (n, t))
    capacity = np.append(rng.uniform(20, 200, t - 1), np.inf)
    bandwidth = np.append(rng.uniform(2, 20, t - 1), np.inf)
    return TieringData([f"c{i}" for i in range(n)], kept, read, cost, load, rng.uniform(0.5, 2.5, n),
                          capacity, bandwidth)


class TestKVTieringContract(FormulationContract):
    def make_instance(self, rng):
        return random_instance(rng)

    def solve_mip(self, data):
        res, tier = solve_tiering(data)
        if tier is None:
            from dse.errors import InfeasibleError

            raise InfeasibleError("no assignment")
        return res.objective, np.eye(len(TIERS))[tier], res

    def solve_exhaustive(self, data):
        return exhaustive(data)

    def recheck(self, data, z, value):
        t = z.argmax(axis=1)
        c = np.arange(len(data.classes))
        assert np.allclose(z.sum(axis=1), 1)
        assert (data.load_s[c, t] <= data.ttft_s).all()
        assert (np.bincount(t, weights=data.bytes_kept, minlength=len(TIERS)) <= data.capacity + 1e-9).all()
        assert (np.bincount(t, weights=data.read_rate, minlength=len(TIERS)) <= data.bandwidth + 1e-9).all()
        assert data.cost[c, t].sum() == pytest.approx(value, rel=1e-6)

    def build_model(self, data):
        return compile_model(build(data))[0]


def test_kv_cache_tiers_study_reads_cache_pricing_by_drain_time(shipped):
    run = shipped("kv_cache_tiers")
    summary = run.summary
    tiers = summary["tiers"]
    assert 180 < tiers["nvme"]["drain_s"] < 600  # flash drains in about 5 minutes
    assert tiers["hdd"]["drain_s"] > 3600  # disk in hours
    chosen = run.table("kv_tiers").set_index("class")["tier"]
    assert chosen["5-minute"] == "nvme" and chosen["1-hour"] == "hdd"
    assert chosen["hot-system-prompt"] in ("hbm", "host_dram")
    ratio = run.table("kv_tiers")["write_over_hit"]
    assert (ratio > 10).all()  # a hit costs a small fraction of the prefill a write pays for
    assert summary["status"] == "optimal"
