"""The contract between a study kind and the rest of dse: what a kind's ``solve`` returns (`Solved`), the summary
made from it in one place (`summary_of`), the output the report writes (`StudyOutput`), and the figures a kind
declares (`Plot`, `Chart`).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Literal

import numpy as np

from dse.catalog.hardware import default_systems
from dse.optimize.solver import SolveResult
from dse.optimize.space import Space
from dse.studies.base import StudySpec
from dse.table import Table, as_table

Progress = Callable[..., None]
"""``progress(what, done=None, total=None)``: what is being solved, and how many of how many are done."""
Status = Literal["optimal", "feasible", "infeasible"]


@dataclass
class Optimum:
    """A chosen configuration: its entry in summary.json's ``best`` (model, workload, serving, pools, figures) and
    the level its figures are at.
    """

    entry: dict
    request_level: bool
    """True: ``ttft_s``, ``tpot_s``, ``usd_per_mtok`` and ``tokens_per_s`` are the whole request's (prefill counted)
    and the decode step's are ``step_*`` (`config_entry` with ``request_level``); false: they are the decode step's."""


@dataclass(frozen=True)
class SolverStats:
    """The ``solver`` block of a kind whose solves are not SolveResults (Optuna trials, expert placement's stages)."""

    name: str
    solves: int
    solve_wall_s: float
    gap: float = 0.0
    more: dict = field(default_factory=dict)
    """Further keys of the block (limits, time per point), after the others."""


@dataclass
class Solved:
    """What a kind's ``solve`` found: everything its summary.json, CSVs, plots and report are made from."""

    status: Status
    best: list[Optimum] = field(default_factory=list)
    """The chosen configurations (summary.json's ``best``)."""
    infeasible: list[dict] = field(default_factory=list)
    """``model``, ``workload`` and ``reason`` of each question without an answer."""
    tables: dict[str, Table] = field(default_factory=dict)
    """One CSV each, in this order (a kind may give pandas DataFrames: they are held as Tables)."""
    results: list[SolveResult] = field(default_factory=list)
    """Every solve's result: the ``solver`` block is made from them, unless ``stats`` gives it."""
    solver_name: str | None = None
    """The ``solver.name`` (default: the solvers of ``results``, else the study's solver)."""
    stats: SolverStats | None = None
    """The ``solver`` block of a kind whose solves are not SolveResults."""
    spaces: dict[tuple[str, str], Space] = field(default_factory=dict)
    """The searched space of each (model, workload), what the report explains the optima from."""
    space_stats: list[dict] = field(default_factory=list)
    """summary.json's ``spaces``: the size of each space searched."""
    facts: dict = field(default_factory=dict)
    """The kind's own summary keys (fronts, optimum, cost, ...); ``price_kind`` here restates the study's."""

    def __post_init__(self) -> None:
        framed = {name: type(t).__name__ for name, t in self.tables.items()
                  if not (isinstance(t, Table) or type(t).__name__ == "DataFrame")}
        if framed:
            raise TypeError(f"Solved.tables must hold Tables or DataFrames, got {framed}")
        self.tables = {name: as_table(t) for name, t in self.tables.items()}


def status_of(results: list[SolveResult], infeasible: list[dict]) -> Status:
    """``infeasible`` where a question has no answer, else ``optimal`` where every solve proved it, else
    ``feasible``.
    """
    if infeasible:
        return "infeasible"
    return "optimal" if all(r.status == "optimal" for r in results) else "feasible"


def no_price(spec: StudySpec) -> list[str]:
    """Systems of the study's space without a price of its kind (and none supplied): left out of costs."""
    opts = spec.options()
    catalog = default_systems(spec.price)
    return [s for s in opts.systems if s in catalog and math.isnan(catalog[s].price_per_s) and s not in spec.prices]


def _solver_block(spec: StudySpec, solved: Solved, wall_s: float) -> dict:
    st = solved.stats
    if st is not None:
        return {"name": st.name, "wall_s": wall_s, "solve_wall_s": st.solve_wall_s, "solves": st.solves,
                "gap": st.gap, **st.more}
    results = solved.results
    names = sorted({r.solver for r in results})
    limited = any(r.time_limited for r in results)
    return {"name": solved.solver_name or (", ".join(names) if names else spec.solver.name), "wall_s": wall_s,
            "solve_wall_s": float(sum(r.wall_s for r in results)), "solves": len(results),
            "gap": float(max((r.gap for r in results), default=0.0)), "time_limited": limited,
            "reproducible": not limited}


def summary_of(spec: StudySpec, solved: Solved, wall_s: float) -> dict:
    """summary.json (less ``outputs``, which names the files written): the study, what was solved, the kind's own
    keys, the status and the solver statistics.
    """
    summary = {"study": spec.study, "kind": spec.kind, "description": spec.description.strip(),
               "expect": spec.expect.strip(), "price_kind": spec.price, "no_price": no_price(spec),
               "best": [o.entry for o in solved.best], "infeasible": solved.infeasible, "spaces": solved.space_stats}
    summary.update(solved.facts)
    if "objective" not in summary:  # the metric the kind minimizes (its module's OBJECTIVE, or what the study makes it)
        from dse.studies.registry import study_module

        objective = study_module(spec.kind).OBJECTIVE
        summary["objective"] = objective(spec) if callable(objective) else objective
    summary["status"] = solved.status
    summary["solver"] = _solver_block(spec, solved, wall_s)
    return summary


class Frames(Mapping):
    """Tables read as pandas DataFrames: a `Table` is converted when first read (pandas is imported then, not
    before); a DataFrame is given as it is.
    """

    def __init__(self, tables: Mapping):
        self._tables, self._frames = tables, {}

    def __getitem__(self, name: str):
        if name not in self._frames:
            t = self._tables[name]
            self._frames[name] = t.to_frame() if isinstance(t, Table) else t
        return self._frames[name]

    def __iter__(self):
        return iter(self._tables)

    def __len__(self) -> int:
        return len(self._tables)


@dataclass
class StudyOutput:
    """A solved study and its summary: what `dse run` writes."""

    summary: dict
    solved: Solved

    @property
    def tables(self) -> dict[str, Table]:
        return self.solved.tables

    @cached_property
    def frames(self) -> Frames:
        """The tables as pandas DataFrames, each made once, when first read (for the figures and headlines drawn
        with pandas).
        """
        return Frames(self.solved.tables)

    @property
    def spaces(self) -> dict[tuple[str, str], Space]:
        return self.solved.spaces


def solve_study(spec: StudySpec, progress: Progress | None = None, storage: str | None = None) -> StudyOutput:
    """Solve a study with its kind's ``solve`` and make its summary."""
    from dse.studies.registry import study_module

    t0 = time.perf_counter()
    solved = study_module(spec.kind).solve(spec, progress, storage)
    return StudyOutput(summary_of(spec, solved, time.perf_counter() - t0), solved)


@dataclass(frozen=True)
class Plot:
    """One figure of a study's report: drawn from the output into ``file`` when ``table`` has a row whose
    ``needs`` column holds a finite value above 0 (a figure of infeasible points only is not drawn).
    """

    table: str
    file: str
    draw: Callable[[StudyOutput, Path], None]
    needs: str = "usd_per_mtok"

    def has_data(self, out: StudyOutput) -> bool:
        table = out.tables.get(self.table)
        if table is None or table.empty or self.needs not in table:
            return False
        values = numeric(table[self.needs])
        return bool((np.isfinite(values) & (values > 0)).any())


def numeric(values: np.ndarray) -> np.ndarray:
    """A column as floats, a value that is not a number as NaN."""
    if values.dtype.kind in "biuf":
        return values.astype(float)

    def num(v) -> float:
        try:
            return float(v)
        except (TypeError, ValueError):
            return math.nan

    return np.array([num(v) for v in values], dtype=float)


def label_column(table: Table) -> np.ndarray:
    """A table's own ``label`` column."""
    return table["label"]


def model_workload(table: Table) -> np.ndarray:
    """``model / workload`` of each row: one panel per model and workload."""
    return table["model"] + " / " + table["workload"]


def serving_mode(table: Table) -> np.ndarray:
    """The deployment mode of each row (aggregated or disaggregated)."""
    return table["serving"]


@dataclass(frozen=True)
class Chart:
    """One hover chart of a study's report (log-log, a point per row of ``table``), drawn where the table has rows
    and both columns: one panel per value of ``panel`` (one model and workload), points coloured by ``series``
    (with a legend); ``label`` names each point.
    """

    table: str
    x: str
    y: str
    title: str
    label: Callable[[Table], np.ndarray] = label_column
    panel: Callable[[Table], np.ndarray] = model_workload
    series: Callable[[Table], np.ndarray] = serving_mode
