"""The study kinds: a study file's ``kind:`` names one module of ``dse.studies``.

Each module defines ``Spec`` (the strict study spec with the kind's own block), ``solve(spec,
progress=None, storage=None) -> Solved`` (`dse.studies.contract`: what it found, from which
`solve_study` makes the summary), ``PLOTS`` (the report's figures, `Plot`), where it has them
``CHARTS`` (the report's hover charts, `Chart`) and, where the kind has a headline beyond its
optima, ``headline(summary, tables) -> list[str]``. ``USES_STORAGE`` says whether the kind keeps
an Optuna storage, ``WORKERS`` whether `dse worker` can join it. Adding a kind adds one module
and one line here.
"""

from __future__ import annotations

import importlib
from types import ModuleType

KINDS: dict[str, str] = {
    "cheapest": "dse.studies.cheapest",
    "pareto": "dse.studies.pareto",
    "fast_slow": "dse.studies.fast_slow",
    "sweep": "dse.studies.sweep",
    "tornado": "dse.studies.tornado",
    "compute_equalization": "dse.studies.compute_equalization",
    "expert_placement": "dse.studies.expert_placement",
    "kv_tiers": "dse.studies.kv_tiers",
    "api_pricing": "dse.studies.api_pricing",
    "moe_codesign": "dse.studies.moe_codesign",
    "deployment": "dse.studies.deployment",
    "fleet": "dse.studies.fleet",
    "training": "dse.studies.training",
}


def study_module(kind: str) -> ModuleType:
    """The module of a study kind (imported on first use, so start-up stays light)."""
    return importlib.import_module(KINDS[kind])


def kinds_with(flag: str) -> str:
    """The kinds whose module sets ``flag`` (``USES_STORAGE``, ``WORKERS``) to true, as a phrase: "a, b and c"."""
    kinds = [k for k in KINDS if getattr(study_module(k), flag)]
    return ", ".join(kinds[:-1]) + " and " + kinds[-1] if len(kinds) > 1 else kinds[0]
