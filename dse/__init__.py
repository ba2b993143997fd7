"""dse: a design-space optimizer for the economics of training and serving large language models.

The public Python API (each function imports what it needs when called, so ``import dse`` is light):

- ``evaluate(model=..., system=..., batch=..., context=..., ...) -> dict``: one configuration, the
  keys of `dse evaluate --json`;
- ``evaluate_frame(df) -> DataFrame``: every row of a DataFrame of configurations, vectorized;
- ``load_study(path_or_dict) -> StudySpec``: a validated study;
- ``run(study, out=None, storage=None, plots=True) -> Result``: solve a study (``.summary``,
  ``.tables``), and write its files into ``out`` when given (PNG plots only with ``plots``).

Bad input raises ``InputError`` with the message the command line prints; an infeasible
configuration or study raises ``InfeasibleError`` where `dse` exits 3; a solver stopped at its time
limit without a solution raises ``SolverLimitError`` where `dse` exits 1.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Mapping
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dse.errors import InfeasibleError, InputError, SolverLimitError

if TYPE_CHECKING:
    import pandas as pd

    from dse.studies.base import StudySpec

__version__ = "0.1.0"
__all__ = ["InfeasibleError", "InputError", "Result", "SolverLimitError", "__version__", "evaluate", "evaluate_frame",
           "load_study", "run"]


def evaluate(model: str, system: str, batch: int, context: int, *, ideal: bool = False, **config: Any) -> dict:
    """Metrics of one configuration, as `dse evaluate --json` prints them.

    ``config`` takes the other fields of `dse evaluate`: ``tp``, ``ep``, ``pp``, ``dp``, ``etp``,
    ``chips``, ``phase``, ``weights_dtype``, ``kv_dtype``, ``kv_tier``, ``kv_shard``, ``micro_batches``,
    ``prompt``, ``moe_imbalance``, ``output`` (request-level keys), ``framework``, ``mem_fraction``, ``arrival``.
    """
    from dse.physics.evaluate import Config, evaluate_config

    allowed = set(Config.__dataclass_fields__) - {"model", "system", "batch", "context"}
    unknown = sorted(set(config) - allowed)
    if unknown:
        raise InputError(f"evaluate: unknown argument(s) {', '.join(unknown)}; allowed: {', '.join(sorted(allowed))}")
    return evaluate_config(Config(model=model, system=system, batch=batch, context=context, **config), ideal=ideal)


def evaluate_frame(frame: pd.DataFrame, ideal: bool = False) -> pd.DataFrame:
    """Metrics of every row of a DataFrame of configurations (columns: the arguments of ``evaluate``)."""
    from dse.physics.evaluate import evaluate_frame as _evaluate_frame

    return _evaluate_frame(frame, ideal=ideal)


def load_study(study: str | Path | dict) -> StudySpec:
    """A validated study from a YAML file or from the mapping such a file holds."""
    from dse.studies.base import load_study as _load_study

    return _load_study(study)


@dataclass
class Result:
    """What a study run gives: the summary (the contents of summary.json) and its tables."""

    summary: dict
    tables: Mapping[str, pd.DataFrame] = field(default_factory=dict)
    """Each table as a pandas DataFrame (made when first read: pandas is imported then)."""
    files: list[str] = field(default_factory=list)
    """The files written into ``out`` (empty when nothing was written)."""
    out: Path | None = None


def run(study: str | Path | dict | StudySpec, out: str | Path | None = None, storage: str | None = None,
        progress: Callable[[str], None] | None = None, force: bool = False, plots: bool = True) -> Result:
    """Solve a study; with ``out``, write summary.json, the CSVs, the plots and report.html there.

    ``storage`` is the Optuna storage URL of a sweep, tornado or compute_equalization study (default: a
    SQLite file in ``out``, or in a temporary folder when nothing is written). ``out`` must be new, or a
    folder dse wrote; ``force`` lets it hold other files too (dse replaces only its own there). ``plots``
    false writes no PNG figures (the report says they were skipped; summary.json and the CSVs give the same
    answers), and matplotlib is then never imported.
    """
    return run_study(study, out=out, storage=storage, progress=progress, force=force, plots=plots)


def run_study(study: str | Path | dict | StudySpec, out: str | Path | None = None, storage: str | None = None,
              progress: Callable[[str], None] | None = None, where: str | None = None,
              force: bool = False, plots: bool = True) -> Result:
    """``run`` with the place the study came from (``where``) for messages; used by `dse run`."""
    from dse.studies.base import StudySpec
    from dse.studies.base import load_study as _load_study
    from dse.studies.contract import solve_study
    from dse.studies.registry import kinds_with, study_module

    spec = study if isinstance(study, StudySpec) else _load_study(study)
    where = where or (str(study) if isinstance(study, (str, Path)) else spec.study)
    module = study_module(spec.kind)
    target = Path(out) if out is not None else None
    if storage is not None and not module.USES_STORAGE:
        raise InputError(f"--storage: only {kinds_with('USES_STORAGE')} studies use a storage; {where} "
                         f"is a {spec.kind} study")
    use_storage = module.USES_STORAGE and storage is None  # embedded SQLite in the output (or a scratch) folder
    files: list[str] = []
    with ExitStack() as stack:
        if target is not None:  # one run at a time per folder; refuse someone else's files before any work
            from dse.report.output import hold, prepare

            stack.enter_context(hold(target))
            prepare(target, force, storage=use_storage)
        if use_storage:
            from dse.studies.optuna_sweep import default_storage

            scratch = None if target is not None else stack.enter_context(
                tempfile.TemporaryDirectory(prefix="dse-storage-"))
            storage = default_storage(target if target is not None else Path(scratch))
        output = solve_study(spec, progress, storage)
        if target is not None:
            from dse.report.output import write_outputs

            files = write_outputs(output, spec, target, force, plots=plots)
    return Result(summary=output.summary, tables=output.frames, files=files, out=target)
