"""The contract every formulation passes: subclass `FormulationContract` and fill in the hooks.

On many small random instances the MIP optimum must equal the exhaustive optimum, the returned
solution must pass an independent recomputation of every constraint with the physics, and the
result must carry a status and a gap. A new formulation gets the whole suite by subclassing.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from dse.errors import InfeasibleError


class FormulationContract:
    """Hooks to fill in; the tests below use them."""

    instances: int = 50  # feasible instances each test needs at least
    rel_tol: float = 1e-6

    def make_instance(self, rng: np.random.Generator):
        raise NotImplementedError

    def solve_mip(self, instance):
        """Return (objective, solution, SolveResult); raise InfeasibleError when infeasible."""
        raise NotImplementedError

    def solve_exhaustive(self, instance):
        """Return the optimal objective, or None when infeasible."""
        raise NotImplementedError

    def recheck(self, instance, solution, objective) -> None:
        """Assert every constraint of the solution, recomputed from the physics, and its objective."""
        raise NotImplementedError

    def build_model(self, instance):
        """Return a built (unsolved) model, for structural checks."""
        raise NotImplementedError

    # -- the suite ----------------------------------------------------------------------------
    @pytest.fixture(scope="class")
    @classmethod
    def cases(cls):
        rng = np.random.default_rng(20261122)
        out, infeasible = [], 0
        for _ in range(cls.instances * 4):
            inst = cls.make_instance(cls, rng)
            ref = cls.solve_exhaustive(cls, inst)
            if ref is None:
                infeasible += 1
                if infeasible <= 5:
                    out.append((inst, None))
                continue
            out.append((inst, ref))
            if sum(r is not None for _, r in out) >= cls.instances:
                break
        assert sum(r is not None for _, r in out) >= cls.instances, "too few feasible random instances"
        return out

    def test_builds_without_solving(self, cases):
        inst = next(i for i, r in cases if r is not None)
        model = self.build_model(inst)
        assert model.num_variables > 0
        assert model.num_constraints > 0

    def test_mip_equals_exhaustive(self, cases):
        for inst, ref in cases:
            if ref is None:
                with pytest.raises(InfeasibleError):
                    self.solve_mip(inst)
                continue
            value, _, result = self.solve_mip(inst)
            assert value == pytest.approx(ref, rel=self.rel_tol), inst

    def test_solution_passes_recomputation_with_the_physics(self, cases):
        for inst, ref in cases:
            if ref is None:
                continue
            value, solution, _ = self.solve_mip(inst)
            self.recheck(inst, solution, value)

    def test_status_bound_and_gap_are_reported(self, cases):
        for inst, ref in cases[:10]:
            if ref is None:
                continue
            _, _, result = self.solve_mip(inst)
            assert result.status == "optimal"
            assert result.gap <= 1e-6
            assert math.isfinite(result.bound) and result.bound <= result.objective * (1 + 1e-9)
            assert result.wall_s >= 0 and result.solver in ("highs", "scip", "sat")
