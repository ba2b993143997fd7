"""The training-layout search: every layout of a model on a system inventory (DP, TP, PP with its stage partition,
CP, EP, micro-batch, interleaving, recomputation, ZeRO stage, GEMM format), evaluated by the training step
(`dse.physics.training.train_steps`), the cheapest that trains a token budget by a deadline, and the exact Pareto
front of training time against cost.

Layouts do not interact (each is a whole training run), so the optimum is an argmin over the vectorized
evaluation and the front a non-dominated filter of it: exact over the space, solver ``argmin (vectorized
enumeration)``, gap 0. Without the front, layouts are evaluated in order of a lower bound of their cost
(`dse.physics.training.step_floor`) and the rest skipped once the bound passes the cheapest found (branch and
bound: the same argmin). Each layout's stage partition is the partition program's: the least bottleneck within
memory (`dse.physics.training.greedy_partition`, exact over every contiguous partition; interleaved, the best
member of `chunk_families`). `tests/test_training_search.py` checks the search and its front against an
independent brute force, `tests/test_training_physics.py` the partition against every partition.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields

import numpy as np
import pandas as pd

from dse.catalog.hardware import System
from dse.catalog.models import Architecture
from dse.errors import InfeasibleError
from dse.physics.training import (
    RECOMPUTE,
    TRAIN_DTYPES,
    TrainCandidates,
    TrainLayout,
    chunk_families,
    gemm_rate,
    model_items,
    step_floor,
    train_steps,
)

SOLVER_NAME = "argmin (vectorized enumeration)"
CHUNK = 20_000
"""Layouts evaluated together (bounded memory: the partition program holds candidates x items arrays)."""


@dataclass(frozen=True)
class TrainingSpace:
    """What the search may choose. ``inventory`` caps each system's chips; ``dp`` empty means every divisor of the
    global batch that the inventory allows.
    """

    inventory: dict[str, int]
    tp: tuple[int, ...] = (1, 2, 4, 8)
    pp: tuple[int, ...] = (1, 2, 4, 8)
    cp: tuple[int, ...] = (1,)
    ep: tuple[int, ...] = (1,)
    dp: tuple[int, ...] = ()
    micro_batch: tuple[int, ...] = (1, 2)
    interleave: tuple[int, ...] = (1,)
    recompute: tuple[str, ...] = ("none", "selective", "full")
    zero: tuple[int, ...] = (1,)
    gemm_dtype: tuple[str, ...] = ("bf16", "fp8")
    ep_overlap: tuple[str, ...] = ("none", "two_microbatch")


@dataclass(frozen=True)
class TrainingJob:
    """What is trained: ``tokens`` tokens of sequences of ``seq`` tokens in global batches of ``global_batch``
    sequences, by ``deadline_s`` (infinite: no deadline).
    """

    tokens: float
    seq: int
    global_batch: int
    deadline_s: float = math.inf

    @property
    def steps(self) -> float:
        return self.tokens / (self.global_batch * self.seq)


def valid(model: Architecture, system: System, lay: TrainLayout, global_batch: int, seq: int,
          n_items: int | None = None) -> str:
    """Why a layout is not in the space ("" when it is): the rules every framework enforces (``n_items``: the
    model's items at ``seq``, `model_items`, when the caller has them).
    """
    a, f = model.spec.attention, model.spec.ffn
    kv = a.n_kv_heads or 1
    if a.n_heads % lay.tp or not (kv % lay.tp == 0 or lay.tp % kv == 0):
        return "TP must divide the attention heads (and divide or be a multiple of the KV heads)"
    if seq % (2 * lay.cp) and lay.cp > 1:
        return "CP needs 2 x CP to divide the sequence (load-balanced causal chunks)"
    if lay.ep > 1 and (not model.is_moe or f.n_experts % lay.ep):
        return "EP must divide the routed experts"
    group = lay.tp * lay.cp * lay.dp
    if model.is_moe and (group % (lay.ep * (lay.etp or lay.tp)) or lay.ep * (lay.etp or lay.tp) > group):
        return "EP x expert-TP must divide TP x CP x DP"
    if global_batch % (lay.dp * lay.micro_batch):
        return "DP x micro-batch must divide the global batch"
    m = global_batch // (lay.dp * lay.micro_batch)
    n = n_items if n_items is not None else len(model_items(model, seq))
    if lay.pp > n or (lay.interleave > 1 and (lay.pp == 1 or m % lay.pp or not chunk_families(
            model.spec.n_layers, lay.pp * lay.interleave))):
        return "PP and interleaving must fit the layers (interleaving needs the micro-batches to be a multiple of PP)"
    if lay.ep_overlap != "none" and (lay.ep == 1 or m < 2):
        return "two-micro-batch EP overlap needs EP and at least two micro-batches"
    if lay.zero == 3 and lay.pp > 1:
        return "ZeRO-3 / FSDP with pipeline parallelism is left out (frameworks gather every micro-batch's stage)"
    try:
        gemm_rate(system, lay.gemm_dtype)
    except Exception:  # noqa: BLE001 - a format the chip has no units for is simply not in its space
        return f"{system.id} has no {lay.gemm_dtype} tensor units"
    return ""


def enumerate_layouts(model: Architecture, system: System, space: TrainingSpace, global_batch: int, seq: int,
                      ) -> list[TrainLayout]:
    """Every valid layout of ``space`` on ``system`` within its inventory, in a fixed order."""
    limit = space.inventory.get(system.id, 0)
    dps = space.dp or tuple(d for d in range(1, global_batch + 1) if global_batch % d == 0)
    n_items = len(model_items(model, seq))
    out = []
    for tp in space.tp:
        for pp in space.pp:
            for cp in space.cp:
                for dp in dps:
                    if tp * pp * cp * dp > limit:
                        continue
                    for ep in space.ep if model.is_moe else (1,):
                        for mb in space.micro_batch:
                            for v in space.interleave:
                                for rc in space.recompute:
                                    for z in space.zero:
                                        for dt in space.gemm_dtype:
                                            for ov in space.ep_overlap if model.is_moe else ("none",):
                                                lay = TrainLayout(tp=tp, pp=pp, dp=dp, cp=cp, ep=ep, etp=1,
                                                                  micro_batch=mb, interleave=v, recompute=rc,
                                                                  zero=z, gemm_dtype=dt, ep_overlap=ov)
                                                if not valid(model, system, lay, global_batch, seq, n_items):
                                                    out.append(lay)
    return out


LAYOUT_COLUMNS = ("tp", "pp", "dp", "cp", "ep", "micro_batch", "interleave", "recompute", "zero", "gemm_dtype",
                  "ep_overlap")


def evaluate_layouts(model: Architecture, system: System, layouts: list[TrainLayout], job: TrainingJob,
                     ) -> pd.DataFrame:
    """One row per layout: its step (`train_steps`, in chunks of `CHUNK`), the job's time and cost on it."""
    frames = []
    for start in range(0, len(layouts), CHUNK):
        part = layouts[start:start + CHUNK]
        r = train_steps(model, system, TrainCandidates.from_layouts(part), job.global_batch, job.seq)
        df = pd.DataFrame({k: [getattr(lay, k) for lay in part] for k in LAYOUT_COLUMNS})
        for k in ("chips", "step_s", "tokens_per_s", "tokens_per_s_per_chip", "mfu", "hbm_bytes_per_chip", "fits",
                  "stages", "bubble_s", "dp_exposed_s", "tp_exposed_s", "cp_exposed_s", "ep_exposed_s",
                  "busiest_device_s"):
            df[k] = r[k]
        frames.append(df)
    df = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=LAYOUT_COLUMNS)
    df.insert(0, "system", system.id)
    df["chips"] = df["chips"].astype(int)
    df["time_s"] = job.steps * df["step_s"]
    df["usd"] = df["chips"] * system.price_per_s * df["time_s"]
    df["meets_deadline"] = df["time_s"] <= job.deadline_s * (1 + 1e-12)
    return df


@dataclass
class TrainingResult:
    """Every evaluated layout, the cheapest feasible one, the front and the space's size."""

    table: pd.DataFrame
    best: pd.Series | None
    front: pd.DataFrame
    layouts: int
    reasons: dict[str, int] = field(default_factory=dict)


def pareto(df: pd.DataFrame, x: str = "time_s", y: str = "usd") -> pd.DataFrame:
    """The non-dominated rows of ``df`` (less is better on both), sorted by ``x``: a row stays unless another is no
    worse on both and better on one; of rows equal on both the first is kept.
    """
    if df.empty:
        return df
    d = df.sort_values([x, y], kind="mergesort")
    keep, best = [], math.inf
    for i, val in zip(d.index, d[y].to_numpy(), strict=True):
        if val < best:
            keep.append(i)
            best = val
    return d.loc[keep]


PRUNE_CHUNK = 128
"""Layouts evaluated together between two checks of the bound (without the front)."""


def cost_floor(model: Architecture, system: System, layouts: list[TrainLayout], job: TrainingJob,
               ) -> tuple[np.ndarray, np.ndarray]:
    """(time, cost) the job cannot beat on each layout: `step_floor` per step."""
    t = job.steps * step_floor(model, system, TrainCandidates.from_layouts(layouts), job.global_batch, job.seq)
    return t, np.array([lay.chips for lay in layouts]) * system.price_per_s * t


def search(model: Architecture, systems: list[System], space: TrainingSpace, job: TrainingJob,
           progress=None, front: bool = True) -> TrainingResult:
    """The cheapest layout that fits and meets the deadline, and (``front``) the time-cost front of those that fit.
    Without the front, only the layouts whose cost floor (`cost_floor`) is within the deadline and no more than the
    cheapest found are evaluated, cheapest floor first (where none meets the deadline, the fastest that fits is
    found the same way, for `shortfall`); ``table`` then holds those evaluated.
    """
    listed, count = [], 0
    for k, system in enumerate(systems):
        if progress:
            progress(f"{system.id}: enumerating layouts", k, len(systems))
        layouts = enumerate_layouts(model, system, space, job.global_batch, job.seq)
        count += len(layouts)
        if layouts:
            listed.append((system, layouts))
    if not listed:
        return TrainingResult(pd.DataFrame(), None, pd.DataFrame(), 0)
    if not front:
        bounded = _best(_bounded(model, listed, job, "usd"), False, count)
        if bounded.best is not None:
            return bounded
        # nothing within the deadline: the fastest layout that fits (its own bound), for the shortfall's figures
        return _best(_bounded(model, listed, job, "time_s"), False, count)
    return _best(pd.concat([evaluate_layouts(model, system, layouts, job) for system, layouts in listed],
                           ignore_index=True), front, count)


def _best(table: pd.DataFrame, front: bool, count: int) -> TrainingResult:
    """The cheapest feasible row of ``table`` (then the fastest), and its front when ``front``."""
    if table.empty:
        return TrainingResult(table, None, table, count)
    priced = table[np.isfinite(table["usd"])]
    ok = priced[priced["fits"]]
    feasible = ok[ok["meets_deadline"]]
    best = feasible.loc[feasible.sort_values(["usd", "time_s"], kind="mergesort").index[0]] if not feasible.empty \
        else None
    return TrainingResult(table, best, pareto(ok) if front else ok.iloc[:0], count)


def _bounded(model: Architecture, listed: list[tuple[System, list[TrainLayout]]], job: TrainingJob,
             objective: str) -> pd.DataFrame:
    """Branch and bound over the layouts of every system on ``objective`` (``usd``: the cheapest that fits and
    meets the deadline; ``time_s``: the fastest that fits): in order of its floor (`cost_floor`), chunk by chunk,
    until the next floor exceeds the best found (a layout whose floor equals it may tie: it is evaluated).
    """
    order = []
    for si, (system, layouts) in enumerate(listed):
        t, usd = cost_floor(model, system, layouts, job)
        floor = usd if objective == "usd" else t
        keep = (t <= job.deadline_s * (1 + 1e-12)) if objective == "usd" else np.ones(len(t), dtype=bool)
        order += [(f, si, i) for i, f in enumerate(floor) if keep[i] and np.isfinite(usd[i])]
    order.sort()
    frames, best = [], math.inf
    for start in range(0, len(order), PRUNE_CHUNK):
        part = order[start:start + PRUNE_CHUNK]
        if part[0][0] > best * (1 + 1e-12):
            break
        for si in sorted({si for _, si, _ in part}):
            system, layouts = listed[si]
            df = evaluate_layouts(model, system, [layouts[i] for _, s_, i in part if s_ == si], job)
            frames.append(df)
            ok = df[df["fits"] & np.isfinite(df["usd"]) & (df["meets_deadline"] | (objective != "usd"))]
            if not ok.empty:
                best = min(best, float(ok[objective].min()))
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def shortfall(model: Architecture, result: TrainingResult, job: TrainingJob) -> InfeasibleError:
    """What stops the job: no layout fits in HBM, or the fastest that fits misses the deadline by how much."""
    t = result.table
    if t.empty:
        return InfeasibleError(f"{model.id}: no layout of the space is valid on the inventory")
    fit = t[t["fits"]]
    if fit.empty:
        need = float(t["hbm_bytes_per_chip"].min())
        return InfeasibleError(f"{model.id}: no layout fits in HBM: the leanest needs {need / 1e9:.1f} GB per chip")
    fastest = fit.loc[fit["time_s"].idxmin()]
    return InfeasibleError(f"{model.id}: training {job.tokens:.3g} tokens takes {fastest['time_s'] / 86400:.1f} days "
                           f"on the fastest layout ({int(fastest['chips'])} x {fastest['system']}), "
                           f"{(fastest['time_s'] - job.deadline_s) / 86400:.1f} days over the deadline")


def layout_of(row: pd.Series) -> TrainLayout:
    """The layout of a row of `evaluate_layouts`, with its chosen stages."""
    kw = {k: (row[k].item() if hasattr(row[k], "item") else row[k]) for k in LAYOUT_COLUMNS}
    stages = tuple(int(x) for x in str(row["stages"]).split(","))
    return TrainLayout(**kw, etp=1, stages=stages if len(stages) > 1 else None)


def space_size(space: TrainingSpace) -> int:
    """Layouts before validity: the product of the choices."""
    return int(np.prod([max(len(getattr(space, f.name)), 1) for f in fields(space) if f.name != "inventory"]))


__all__ = ["RECOMPUTE", "SOLVER_NAME", "TRAIN_DTYPES", "TrainingJob", "TrainingResult", "TrainingSpace",
           "enumerate_layouts", "evaluate_layouts", "layout_of", "pareto", "search", "shortfall", "valid"]
