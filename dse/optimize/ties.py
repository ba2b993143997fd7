"""The order of candidates whose objective is equal: the lower TPOT, then the lower TTFT, then fewer chips, then the
search's own order (its tie key where it has one, else enumeration order).

Every search that picks a `best` entry ranks through `tie_order` (`dse.optimize.requests`, `dse.optimize.whole`,
`dse.optimize.serving`, the choice between modes in `dse.studies.common`), so a deployment that serves as cheaply
and faster is never passed over for one that happens to be enumerated first.
"""

from __future__ import annotations

import numpy as np

TIE = 1e-12
"""Relative difference below which two objectives are equal. One figure computed along two paths (x U + y V of
replicas, a USD/s over a request rate) differs by a few units in the last place (about 1e-16 relative each), never
by 1e-12, while two configurations that truly differ in cost differ by far more, so this tolerance joins float noise
and nothing else; exact equality alone would let rounding order equal deployments."""


def tie_order(cost: np.ndarray, *keys: np.ndarray) -> np.ndarray:
    """Indices of the finite entries of ``cost``, best first: ascending cost, a run of costs each within a relative
    `TIE` of the one before counting as one cost; within a run by ``keys`` in turn (each least first, NaN last),
    then by index. Vectorized: one sort by cost, then one lexicographic sort.
    """
    cost = np.asarray(cost, dtype=np.float64)
    finite = np.flatnonzero(np.isfinite(cost))
    if not len(finite):
        return finite
    order = finite[np.argsort(cost[finite], kind="stable")]
    c = cost[order]
    run = np.concatenate(([0], np.cumsum(np.diff(c) > TIE * np.abs(c[:-1]))))
    columns = [np.asarray(k, dtype=np.float64)[order] for k in reversed(keys)]
    return order[np.lexsort((order, *columns, run))]
