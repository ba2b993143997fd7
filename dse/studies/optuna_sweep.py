"""Sensitivity sweeps on Optuna: every point scales one catalog parameter and solves the serving optimum.

Points (model x workload x parameter x factor) are enqueued as Optuna trials in a shared storage:
an embedded SQLite file in the output folder by default, or a PostgreSQL URL that several
`dse worker` processes (on several machines) draw from. A point is done once (a COMPLETE trial);
trials of a killed process stop sending heartbeats, are failed as stale and their points enqueued
again, so a sweep killed mid-way resumes with no completed point lost and none recomputed.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import optuna
import pandas as pd

from dse.catalog.models import get_model
from dse.errors import InputError, mask_in, mask_url
from dse.optimize.serving import SOLVER_NAME
from dse.optimize.space import build_space
from dse.studies.base import StudySpec
from dse.studies.common import ALTERNATIVES, mode_tables, pick_modes
from dse.studies.contract import Optimum, Solved, SolverStats
from dse.studies.sweep_storage import STORAGE, create_storage

PARAMETERS = {  # study name -> System field
    "hbm_bandwidth": "hbm_bandwidth", "hbm_capacity": "hbm_capacity", "flops": "flops",
    "scaleup_bandwidth": "scaleup_bandwidth", "scaleout_bandwidth": "scaleout_bandwidth",
    "scaleup_domain": "scaleup_domain", "price": "price_per_s",
}
ALL_PARAMETERS = tuple(PARAMETERS)
FACTOR_RANGE = (1e-3, 1e3)
"""Factors a sweep may take: the trials' fixed search space (Optuna refuses one that changes)."""
CONFIG_ATTRS = ("serving", "system", "chips", "tp", "ep", "pp", "dp", "batch", "weights_dtype", "kv_dtype", "kv_tier",
                "bound", "status", "tpot_s", "ttft_s")
SWEEP_KEYS = ("usd_per_request_fluid", "usd_per_request", "usd_per_mtok_input", "usd_per_mtok_output",
              "usd_per_mtok_blended", "tokens_per_s_per_gpu", "tokens_per_s_per_user", "prefill_share", "step_tpot_s",
              "binding", "power_w")
"""Request-level figures of each point's optimum kept in the sweep table."""
"""Fields of a point's optimum also stored as trial user attributes (what a dashboard shows)."""
HEARTBEAT_S = 2
GRACE_S = 10  # a trial whose heartbeat is older than this is from a dead process

optuna.logging.set_verbosity(optuna.logging.WARNING)
warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
logging.getLogger("optuna").setLevel(logging.WARNING)


@dataclass(frozen=True)
class Point:
    """One sweep point."""

    model: str
    workload: str
    parameter: str
    factor: float
    context: str = ""
    """A digest of everything else the point's answer depends on (space, solver, workload, scaled systems):
    an edited study reuses the points whose digest still matches and solves the others afresh."""

    @property
    def key(self) -> str:
        tail = f"|{self.context}" if self.context else ""
        return f"{self.model}|{self.workload}|{self.parameter}|{self.factor:g}{tail}"


class SweepStudy(StudySpec):
    """A study whose points scale one catalog parameter each (the sweep and tornado kinds)."""

    def pairs(self) -> list[tuple[str, float]]:
        """(parameter, factor) of every point, in a stable order."""
        raise NotImplementedError

    def scaled_systems(self) -> tuple[str, ...]:
        """The systems whose parameter is scaled (empty: every system)."""
        return ()

    def per_system(self) -> bool:
        """Whether each point also solves every system on its own."""
        return False


def _digest(spec: SweepStudy, workload, sources: str) -> str:
    """A short digest of what a point's answer depends on besides its model, parameter and factor: the study's
    space, solver and workload, and ``sources`` (`dse.catalog.cache.sources_digest`: the catalogs and dse's source,
    so a storage holding points solved before a refit or a change of the physics solves them again).
    """
    doc = {"objective": OBJECTIVE, "space": spec.space.model_dump(mode="json"),
           "solver": spec.solver.model_dump(mode="json"),
           "workload": workload.model_dump(mode="json"), "scaled": list(spec.scaled_systems()),
           "per_system": spec.per_system(), "sources": sources}
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()[:12]


def points_of(spec: SweepStudy) -> list[Point]:
    """Every point of a sweep or tornado study, in a stable order."""
    from dse.catalog.cache import sources_digest

    sources = sources_digest()
    return [Point(m, w.name, p, float(f), _digest(spec, w, sources))
            for m in spec.models for w in spec.workloads for p, f in spec.pairs()]


WORKER_WAIT_S = 300.0  # how long a worker waits for `dse run` to create the sweep
def open_storage(url: str, create_tables: bool = True, wait_s: float = WORKER_WAIT_S) -> optuna.storages.RDBStorage:
    """An Optuna RDB storage with heartbeats; a bad URL or an unreachable server is an InputError.

    Workers pass ``create_tables=False`` and wait for the coordinator to create the tables, so that
    several processes never race to create them.
    """
    if not (url.startswith("sqlite:///") or url.startswith("postgresql://") or url.startswith("postgresql+")):
        raise InputError(f"--storage '{mask_url(url)}': unsupported URL; allowed: sqlite:///PATH or "
                         "postgresql://USER@HOST:PORT/DB")
    engine_url = url
    if url.startswith("postgresql://"):  # SQLAlchemy 2.1 defaults to psycopg 3; the project ships psycopg2
        engine_url = "postgresql+psycopg2://" + url.removeprefix("postgresql://")
    kwargs = {"pool_pre_ping": True} if url.startswith("postgresql") else {"connect_args": {"timeout": 60}}
    try:
        import sqlalchemy

        path = url.removeprefix("sqlite:///")
        if create_tables and url.startswith("sqlite:///") and "?" not in path and path != ":memory:":
            create_storage(Path(path))  # a new file is marked as dse's: an output folder holding it keeps it
        engine = sqlalchemy.create_engine(engine_url, **kwargs)
        engine.connect().close()
        engine.dispose()
    except Exception as exc:  # sqlalchemy raises many kinds; each means the storage cannot be reached
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise InputError(f"--storage '{mask_url(url)}': cannot open the storage: {mask_in(reason, url)}") from None
    # Processes that open a fresh database together race to create its tables and version row: the
    # losers see an integrity error once, then find everything in place.
    deadline = time.monotonic() + (wait_s if not create_tables else 30.0)
    while True:
        try:
            return optuna.storages.RDBStorage(
                engine_url, engine_kwargs=kwargs, heartbeat_interval=HEARTBEAT_S, grace_period=GRACE_S,
                skip_table_creation=not create_tables,
            )
        except Exception as exc:
            if time.monotonic() > deadline:
                reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
                raise InputError(f"--storage '{mask_url(url)}': cannot use the storage: {mask_in(reason, url)}"
                                 ) from None
            time.sleep(0.5)  # tables being created by another process, or not yet


Studies = dict[tuple[str, str], optuna.Study]
"""A sweep's Optuna studies: one per (model, workload), so a dashboard shows one search space each."""
OBJECTIVE = "usd_per_request_fluid"
"""What each point minimizes and a sweep compares: USD per request at the fluid pool ratio (the whole deployment's
figures, ``usd_per_request`` and ``chips``, round it to whole replicas)."""


def study_name(spec: StudySpec, model: str, workload: str) -> str:
    """The Optuna study of one (model, workload) of a sweep: ``<study>/<model>/<workload>``."""
    return f"{spec.study}/{model}/{workload}"


def _pairs(spec: SweepStudy) -> list[tuple[str, str]]:
    return [(m, w.name) for m in spec.models for w in spec.workloads]


def _load_studies(spec: SweepStudy, storage, create: bool, wait_s: float = WORKER_WAIT_S) -> Studies:
    deadline = time.monotonic() + wait_s
    studies: Studies = {}
    for model, workload in _pairs(spec):
        name = study_name(spec, model, workload)
        while (model, workload) not in studies:
            try:
                if create:
                    study = optuna.create_study(study_name=name, storage=storage, direction="minimize",
                                                load_if_exists=True)
                    if study.metric_names != [OBJECTIVE]:
                        study.set_metric_names([OBJECTIVE])
                        study.set_user_attr("sweep", spec.study)
                else:
                    study = optuna.load_study(study_name=name, storage=storage)
                studies[(model, workload)] = study
            except KeyError:
                if time.monotonic() > deadline:
                    raise InputError(f"no sweep '{name}' in the storage after {wait_s:.0f} s: start `dse run` "
                                     "with the same study and storage first") from None
                time.sleep(0.5)
    return studies


def _state_by_point(studies: Studies) -> dict[str, set[str]]:
    states: dict[str, set[str]] = {}
    for study in studies.values():
        for t in study.get_trials(deepcopy=False):
            key = t.user_attrs.get("point_key")
            if key:
                states.setdefault(key, set()).add(t.state.name)
    return states


def fail_dead_trials(study: optuna.Study) -> None:
    """Fail the RUNNING trials of dead processes: stale heartbeats (Optuna), and trials a process was
    killed with before its first heartbeat (none recorded, started more than the grace period ago).
    """
    import datetime

    import sqlalchemy

    optuna.storages.fail_stale_trials(study)
    storage = study._storage
    backend = getattr(storage, "_backend", storage)  # Optuna wraps the RDB storage in a cache
    running = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,))
    if not running or not hasattr(backend, "engine"):
        return
    with backend.engine.connect() as conn:
        beating = {row[0] for row in conn.execute(sqlalchemy.text("SELECT trial_id FROM trial_heartbeats"))}
    now = datetime.datetime.now()
    for t in running:
        started = t.datetime_start or now
        if t._trial_id not in beating and (now - started).total_seconds() > GRACE_S:
            storage.set_trial_state_values(t._trial_id, optuna.trial.TrialState.FAIL)


def enqueue_missing(studies: Studies, points: list[Point], progress: Callable[..., None] | None = None) -> int:
    """Enqueue every point with no COMPLETE, RUNNING or WAITING trial in its study; return how many."""
    for study in studies.values():
        fail_dead_trials(study)
    states = _state_by_point(studies)
    n = 0
    for i, p in enumerate(points):
        if progress and i % 256 == 0:
            progress(f"queuing the sweep's {len(points):,} points", i, len(points))
        if not states.get(p.key, set()) & {"COMPLETE", "RUNNING", "WAITING"}:
            studies[(p.model, p.workload)].enqueue_trial(
                {"parameter": p.parameter, "factor": p.factor},
                user_attrs={"point_key": p.key, "queued_at": time.time()})
            n += 1
    return n


def solve_point(spec: SweepStudy, p: Point) -> dict:
    """The request-level optimum (USD per request over the study's deployment modes, prefill counted) with the
    parameter scaled, overall and per system.
    """
    w = next(ws.workload() for ws in spec.workloads if ws.name == p.workload)
    opts = replace(spec.options(), scale=((PARAMETERS[p.parameter], p.factor),),
                   scaled_systems=spec.scaled_systems())
    t0 = time.perf_counter()
    space = build_space(get_model(p.model), w, opts)
    out: dict = {"point": p.key, "model": p.model, "workload": p.workload, "parameter": p.parameter,
                 "factor": p.factor}
    if space.blocks.empty:
        found, reasons = [], [f"{p.model} / {w.name}: {space.empty_reason}"]
        tables = None
    else:
        tables = mode_tables(space, spec)  # every (block, batch) pair, evaluated once per mode
        found, reasons = pick_modes(space, tables, spec.space.ideal,
                                    alternatives=ALTERNATIVES if p.factor == 1.0 else 0)
    if not found:
        out.update(status="infeasible", reason="; ".join(reasons), **{OBJECTIVE: math.inf})
    else:
        e, res = found[0]
        out.update({k: e[k] for k in (*SWEEP_KEYS, *CONFIG_ATTRS) if k in e})
        out.update(status=res.result.status, reason="", gap=res.result.gap)
        if p.factor == 1.0:
            out["entry"] = e  # the catalog itself: the optimum as a study reports it
    per_system = {}
    if spec.per_system() and tables is not None:
        sys_idx = space.blocks["system_idx"]
        for si, system in enumerate(space.systems):
            got, _ = pick_modes(space, tables, spec.space.ideal, mask=sys_idx == si, entries=False)
            per_system[system.id] = got[0][0]["usd_per_request"] if got else None  # as compared: fluid
    out["per_system"] = per_system
    out["solve_wall_s"] = time.perf_counter() - t0
    return out


def work(spec: SweepStudy, studies: Studies, points: list[Point], progress: Callable[[str], None] | None = None,
         max_points: int | None = None) -> int:
    """Solve enqueued points until none wait in any study; return how many this process solved."""
    by_key = {p.key: p for p in points}
    done = 0
    shown = {"complete": 0, "waiting": 0}

    def objective(trial: optuna.Trial) -> float:
        nonlocal done
        key = trial.user_attrs.get("point_key")
        # the distributions never change, so a sweep whose factors were edited resumes in the same storage
        trial.suggest_categorical("parameter", ALL_PARAMETERS)
        trial.suggest_float("factor", FACTOR_RANGE[0], FACTOR_RANGE[1], log=True)
        if key not in by_key:  # nothing was waiting, or a point an earlier version of the study enqueued
            raise optuna.TrialPruned()
        if progress:
            progress(f"{shown['waiting'] - done:,} of {len(points):,} points waiting",
                     min(shown["complete"] + done, len(points)), len(points))
        attrs = solve_point(spec, by_key[key])
        trial.set_user_attr("result", json.dumps(attrs, default=float))
        for name in CONFIG_ATTRS:  # the configuration, readable in a dashboard
            if name in attrs:
                trial.set_user_attr(name, attrs[name])
        done += 1
        cost = attrs[OBJECTIVE]
        return cost if math.isfinite(cost) else 1e300

    while max_points is None or done < max_points:
        # one count of the storage per round (not per point: that grows as points^2 on a large sweep); a study
        # then runs as many trials as it had waiting, and one that another worker took meanwhile is pruned
        waiting = {pair: len(s.get_trials(deepcopy=False, states=(optuna.trial.TrialState.WAITING,)))
                   for pair, s in studies.items()}
        if not any(waiting.values()):
            break
        if progress:
            shown["complete"] = sum(len(s.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,)))
                                    for s in studies.values()) - done
            shown["waiting"] = sum(waiting.values()) + done
        for pair, n in waiting.items():
            if not n or (max_points is not None and done >= max_points):
                continue
            try:
                studies[pair].optimize(objective, n_trials=n if max_points is None else min(n, max_points - done))
            except RuntimeError as exc:  # a trial was failed as stale meanwhile: its point is enqueued again
                if progress:
                    progress(f"a point was taken back ({exc}); continuing")
    return done


def run_sweep(spec: SweepStudy, storage_url: str, progress: Callable[[str], None] | None = None,
              create: bool = True, max_points: int | None = None) -> tuple[Studies, list[Point], int]:
    """Coordinator (create=True): enqueue, work, wait for stragglers until every point is complete.
    Worker (create=False): work while points wait.
    """
    storage = open_storage(storage_url, create_tables=create)
    studies = _load_studies(spec, storage, create)
    points = points_of(spec)
    solved = 0
    while True:
        if create:
            enqueue_missing(studies, points, progress)
        else:
            for study in studies.values():
                fail_dead_trials(study)
        solved += work(spec, studies, points, progress, None if max_points is None else max_points - solved)
        if not create or (max_points is not None and solved >= max_points):
            return studies, points, solved
        states = _state_by_point(studies)
        missing = [p for p in points if "COMPLETE" not in states.get(p.key, set())]
        if not missing:
            return studies, points, solved
        if progress:
            progress(f"waiting for {len(missing)} points solved elsewhere")
        time.sleep(HEARTBEAT_S)


def results(studies: Studies, points: list[Point]) -> pd.DataFrame:
    """One row per point (the first COMPLETE trial of each), with elasticities."""
    first: dict[str, dict] = {}
    for study in studies.values():
        for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,)):
            key = t.user_attrs.get("point_key")
            if key and key not in first:
                first[key] = {**json.loads(t.user_attrs["result"]), "trial": t.number}
    rows = [first[p.key] for p in points if p.key in first]
    df = pd.DataFrame(rows)
    if df.empty:
        return df
    df["elasticity"] = np.nan
    for _, g in df.groupby(["model", "workload", "parameter"], sort=False):
        g = g.sort_values("factor")
        ok = np.isfinite(g[OBJECTIVE].to_numpy(dtype=float)) & (g["factor"].to_numpy() > 0)
        if ok.sum() >= 2:
            x = np.log(g["factor"].to_numpy()[ok])
            y = np.log(g[OBJECTIVE].to_numpy(dtype=float)[ok])
            df.loc[g.index[ok], "elasticity"] = np.gradient(y, x)
        if "bound" in g:
            changed = g["bound"].ne(g["bound"].shift()) & g["bound"].shift().notna()
            df.loc[g.index, "bound_changes_here"] = changed.to_numpy()
    return df


def count_complete(studies: Studies) -> dict[str, int]:
    """Completed trials per point (for tests: exactly one each)."""
    counts: dict[str, int] = {}
    for study in studies.values():
        for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,)):
            key = t.user_attrs["point_key"]
            counts[key] = counts.get(key, 0) + 1
    return counts


def default_storage(out: Path) -> str:
    out.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{(out / STORAGE).resolve()}"


def run_sweep_study(spec: SweepStudy, storage_url: str, progress: Callable[[str], None] | None = None) -> Solved:
    """A sweep or tornado study on Optuna: every point, solved here or by workers sharing the storage."""
    studies, points, solved = run_sweep(spec, storage_url, progress, create=True)
    df = results(studies, points)
    best: list[Optimum] = []
    infeasible: list[dict] = []
    per_system = []
    for _, r in df.iterrows():
        for system, cost in (r.get("per_system") or {}).items():
            per_system.append({"model": r["model"], "workload": r["workload"], "parameter": r["parameter"],
                               "factor": r["factor"], "system": system, OBJECTIVE: cost})
        if r["status"] == "infeasible":
            infeasible.append({"model": r["model"], "workload": r["workload"],
                               "reason": f"{r['parameter']} x {r['factor']:g}: {r['reason']}"})
        elif isinstance(r.get("entry"), dict):  # the catalog itself (factor 1): the optimum as a study reports it
            best.append(Optimum(r["entry"], request_level=True))  # `solve_point` keeps `pick_modes`' optimum
    table = df.drop(columns=[c for c in ("per_system", "entry") if c in df])
    tables = {spec.kind: table}
    if per_system:
        tables["sweep_systems"] = pd.DataFrame(per_system)
    statuses = set(table["status"])
    status = "infeasible" if "infeasible" in statuses and statuses == {"infeasible"} else (
        "optimal" if statuses <= {"optimal", "infeasible"} else "feasible")
    stats = SolverStats(f"{SOLVER_NAME} per point, on Optuna's storage", solves=len(table),
                        solve_wall_s=float(table["solve_wall_s"].sum()),
                        gap=float(table["gap"].fillna(0).max()) if "gap" in table else 0.0,
                        more={"per_point_s": float(table["solve_wall_s"].mean())})
    return Solved(status=status, best=best, infeasible=infeasible, tables=tables, stats=stats,
                  facts={"storage": mask_url(storage_url), "points": len(points), "points_solved_here": solved})
