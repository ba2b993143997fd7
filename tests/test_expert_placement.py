"""Expert placement: the MIP against exhaustive placements, and against the EPLB greedy."""

from __future__ import annotations

import numpy as np
import pytest
from formulation_contract import FormulationContract

from dse.optimize.bridge import compile_model
from dse.optimize.placement import PlacementData, exhaustive, greedy, solve_placement, zipf_loads
from formulations.expert_placement import build


def random_instance(rng: np.random.Generator) -> PlacementData:
    experts = int(rng.integers(2, 4))
    gpus = int(rng.integers(2, 4))
    slots = int(rng.integers(1, 3))
    while experts > gpus * slots:
        slots += 1
    loads = zipf_loads(experts, float(rng.integers(50, 500)), float(rng.uniform(0.0, 1.5)), int(rng.integers(1e6)))
    return PlacementData(loads, gpus=gpus, domain=int(rng.integers(1, gpus + 1)), slots=slots,
                            redundant=int(rng.integers(0, 3)))


class TestExpertPlacementContract(FormulationContract):
    instances = 50

    def make_instance(self, rng):
        return random_instance(rng)

    def solve_mip(self, data):
        p = solve_placement(data, 30)
        return p.peak, p, p.result

    def solve_exhaustive(self, data):
        best = exhaustive(data)
        return None if not np.isfinite(best) else best

    def recheck(self, data, p, value):
        x, y = p.x.round(), p.y
        assert (x.sum(axis=1) >= 1).all()  # every expert placed
        assert (x.sum(axis=0) <= data.slots).all()  # slots per GPU
        assert x.sum() <= data.experts + data.redundant  # replica budget
        assert (y <= x + 1e-6).all() and np.allclose(y.sum(axis=1), 1.0, atol=1e-6)  # solver tolerance
        assert (data.loads[:, None] * y).sum(axis=0).max() == pytest.approx(value, rel=1e-6, abs=1e-6)

    def build_model(self, data):
        return compile_model(build(data), columns="declared")[0]


def test_mip_never_loses_to_the_eplb_greedy():
    rng = np.random.default_rng(3)
    wins = 0
    for _ in range(30):
        data = random_instance(rng)
        try:
            g = greedy(data)
        except ValueError:
            continue
        p = solve_placement(data, 30)
        assert p.peak <= g.peak * (1 + 1e-9)
        assert p.peak < g.peak * (1 - 1e-6) or p.crossing <= g.crossing * (1 + 1e-9)
        wins += p.peak < g.peak * (1 - 1e-6)
    assert wins >= 1


def test_skewed_loads_on_two_domains():
    data = PlacementData(zipf_loads(32, 32000, 0.8), gpus=8, domain=4, slots=5, redundant=8)
    p, g = solve_placement(data, 60), greedy(data)
    assert p.status == "optimal"
    assert p.peak <= g.peak and p.crossing < g.crossing
    assert p.imbalance(data) >= 1.0


def test_expert_placement_study(shipped):
    run = shipped("expert_placement")
    summary = run.summary
    t = run.table("placement")
    assert summary["mip_never_worse"]
    assert (t["imbalance_mip"] <= t["imbalance_greedy"] + 1e-9).all()
    # stage 2 (crossing tokens) runs under the study's time limit: never worse than its greedy start
    assert (t["crossing_tokens_mip"] <= t["crossing_tokens_greedy"] * (1 + 1e-9)).all()
    assert (t["crossing_tokens_mip"] < t["crossing_tokens_greedy"]).any()
    assert (t["tpot_s_mip"] <= t["tpot_s_greedy"] * (1 + 1e-12)).all()
    assert (run.out / "placement.png").exists()
    # its stages stop on node limits, not seconds: the same answer on every run on one machine (two runs under a
    # time limit once crossed 10,602 and 6,339 tokens at the strongest skew). Across CPUs the node-limited answers
    # differ (the LP's floating-point path: at skew 0.6 a perfect balance and 14,930 crossing tokens on one
    # machine, 2,048.37 and the greedy's 15,895 on an AMD EPYC), so what is asserted is what the stages prove: the
    # mean load per GPU (2,048) bounds the peak, each peak is within its reported gap of it, and the unskewed
    # instance's crossing tokens are proved optimal
    assert summary["reproducible"] and not t["time_limited"].any()
    peak = t["peak_tokens_mip"].to_numpy()
    assert (peak >= 2048 * (1 - 1e-9)).all() and ((peak - 2048) / peak <= t["gap"] + 1e-9).all()
    assert (t["gap"] <= 1e-3).all()
    unskewed = t[t["skew"] == 0].iloc[0]
    assert unskewed["status"] == "optimal" and unskewed["crossing_gap"] <= 1e-9
    assert unskewed["crossing_tokens_mip"] == pytest.approx(15360, abs=0.01)
    assert unskewed["peak_tokens_mip"] == pytest.approx(2048, rel=1e-9)



def test_rows_reach_the_solver_expert_by_expert_and_columns_as_declared():
    """The order the study's node-limited answers were found in (test_expert_placement_study): each
    expert's rows together, then the GPUs' capacity, then the domains' locality; columns x, y, h, peak."""
    data = PlacementData(np.array([3.0, 1.0]), gpus=2, domain=1, slots=2, redundant=1)
    model, columns, rows = compile_model(build(data, peak_max=2.0), columns="declared")
    assert [c.name for c in rows][:5] == ["expert[0].placed", "expert[0].served", "expert[0].only_where_placed[0]",
                                          "expert[0].only_where_placed[1]", "expert[1].placed"]
    assert [c.name for c in rows][8:] == ["capacity.slots[0]", "capacity.slots[1]", "capacity.replicas",
                                          "capacity.peak_load[0]", "capacity.peak_load[1]", "locality.held[0,0]",
                                          "locality.held[0,1]", "locality.held[1,0]", "locality.held[1,1]",
                                          "locality.peak_cap"]
    names = [v.parent_component().name for v, _ in columns.values()]
    assert names == ["x"] * 4 + ["y"] * 4 + ["h"] * 4 + ["peak"]
    assert model.num_constraints == len(rows)
