"""How a search judges a configuration: as predicted (``expected``), or at the unfavourable end of its system's
validated error band (``robust``: its cost per request at the band's high end, its TTFT and TPOT at theirs).

The band of a prediction is a multiplier per system (`dse.catalog.calibration.bands_of`), so a robust search is
the same exact search on metrics scaled per block: every (block, batch) pair of a block shares one multiplier for
each metric. That keeps the searches of `dse.optimize.requests` exact:

- aggregated replicas: every integer batch of every block is enumerated; a target met at the band's edge is a
  target divided by the block's multiplier, and within a block the cheapest feasible batch is the same whether
  its cost is scaled or not, so the argmin over blocks of the scaled per-block optima is the robust argmin;
- disaggregated pools: the decode term depends on the decode configuration alone and the prefill term on the
  prefill configuration alone (each scaled by its own system's multiplier), the TTFT target met at the prefill
  system's band edge is again a target divided by a constant, and the prefill cost still falls as 1 / rho, so
  per numerics group the robust optimum is the cheapest scaled decode pair plus the cheapest scaled prefill
  option, at the highest utilisation the tightened target allows;
- whole deployments for a budget or a demand (`dse.optimize.whole`): each replica serves its requests/s at the
  throughput band's low end, one figure per block, so the enumeration of replica counts is unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dse.catalog.calibration import bands_of
from dse.catalog.hardware import System

DECIDE = ("expected", "robust")
"""How an optimum is chosen: on the predictions, or on each system's predictions at the unfavourable end of its
band."""


@dataclass(frozen=True)
class Margins:
    """Per system (arrays over a space's ``systems``), the multipliers a robust search judges a configuration at:
    ``cost`` on its cost (1 / the low end of its throughput band), ``tpot`` and ``ttft`` on its times (the high
    ends of their bands); a system with no stored band is judged as predicted (1).
    """

    cost: np.ndarray
    tpot: np.ndarray
    ttft: np.ndarray

    @classmethod
    def robust(cls, systems: list[System]) -> Margins:
        bands = [bands_of(s.id) for s in systems]
        return cls(np.array([1.0 / b.throughput[0] if b else 1.0 for b in bands]),
                   np.array([b.tpot[1] if b else 1.0 for b in bands]),
                   np.array([b.ttft[1] if b else 1.0 for b in bands]))


def margins_for(systems: list[System], decide: str) -> Margins | None:
    """The margins a search of ``systems`` judges at: None (as predicted) for ``expected``."""
    if decide not in DECIDE:
        raise ValueError(f"decide must be one of {', '.join(DECIDE)}, got {decide!r}")
    return Margins.robust(systems) if decide == "robust" else None
