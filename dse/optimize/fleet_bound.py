"""A lower bound on the fleet program by column generation over whole-replica plans per class and slice.

The master linear program (`formulations.fleet_columns.master_program`, held in one HiGHS model, `WarmMaster`) prices
the nodes, the systems in use and the power; each class and slice's cheapest plan at those prices comes from a
branch and bound over its components (`cheapest_plan`; units whose pools pair across interconnects enter as their
non-dominated pairs at those prices, `priced_pool`, and the fixed prices of the systems they use are decided by
`cheapest_plan_fixed`), or, where that search passes its node limit, its cover program (HiGHS through ``milp``).
The bound reported is the Lagrangian value at the master's duals, computed from the plans' own minima (or lower
bounds: the cover program's dual bound, a search with fixed prices left out) and the node variables' bounds, so it
is valid at every iteration whatever the master's tolerance: for any prices u >= 0 of the dualized rows (hold,
inventory, link, power),

    L(u) = sum over classes and slices of min over the class cover set of (chips priced + systems priced)
           + sum over node and in-use variables of min over their bounds of (reduced cost x value) - u_power x cap,

at most the master's optimum, itself at most the program's (the master is a relaxation of it).
"""

from __future__ import annotations

import heapq
import itertools
import math
import time
from bisect import bisect_left
from dataclasses import dataclass, field, replace

import highspy
import numpy as np
import pandas as pd
import scipy.sparse as sp
from scipy.optimize import LinearConstraint, milp

from formulations.fleet import FleetData
from formulations.fleet_columns import (
    Component,
    Pooled,
    cover_components,
    cover_program,
    master_program,
    node_costs,
    pareto,
)

ARTIFICIAL_USD = 1e9
"""Cost of the artificial column each class and slice starts with (so the first master is feasible); never part of a
bound (the Lagrangian value does not read the columns)."""
BRANCH_TOL = 1e-2
"""Relative gap between a box's Lagrangian value and its master's at which `column_bound`'s branching stops that
box's column generation (the root's is ``tol``, 1e-3 by default; the larger of the two applies): the box's bound is
then its parent's where that is higher, and the time goes to more boxes. Measured with `column_bound` alone on
`scripts/bench_fleet.py`'s disaggregated 2 models x 12 slices from `solve_fleet`'s start plans (20 s, load 1.6-2):
1e-3 6,321 USD/day, 5e-3 6,327, 1e-2 6,330-6,331 (two runs), 2e-2 6,329, 5e-2 6,327."""
CUT_COEF_MIN = 1e-6
"""Least coefficient of a cut in `cut_bound`, as a share of its largest (smaller ones are raised to it)."""
BANNED_USD = 1e9
"""Price per day of a system in the pricing of a box that holds its in-use value at 0 (`column_bound`'s
branching): a plan using it costs at least this much, so a class that cannot be served without it bounds the box's
fleets (none) at no less."""


@dataclass
class ColumnBound:
    """The bound, and the plans (replicas per option) each class and slice was priced at."""

    bound: float = -math.inf
    master: float = math.inf
    iterations: int = 0
    searched: int = 0  # cheapest plans found by the branch and bound over components
    programs: int = 0  # by the cover program (HiGHS)
    wall_s: float = 0.0
    blocks: list = field(default_factory=list)  # (class index, slice)
    plans: dict = field(default_factory=dict)  # block index -> list of {option: replicas}
    x: np.ndarray = None  # the master's node variables (reserved, hourly, in use), last round
    leaf: np.ndarray = None  # the same in the open box of least bound, after branching
    near: dict = field(default_factory=dict)  # block index -> the plans within ``near_usd`` of its dual, last round
    # (block index, slice position, USD/day per chip of each system, per system used, the block's minimum at those
    # prices, systems with a fixed cost the pricing's box held out of use): one per block and round priced whole,
    # each a valid inequality on the chips and systems a plan of the block uses (`cut_bound`)
    cuts: dict = field(default_factory=dict)
    cut_value: float = -math.inf  # `cut_bound`'s over them, where it ran
    cut_at: tuple | None = None  # its reserved nodes and systems in use


def _price(d: FleetData, counts: dict, foot: np.ndarray, sys_pos: np.ndarray, price: np.ndarray, fixed: np.ndarray
           ) -> float:
    """A plan's price: its chips at ``price`` per chip of each system plus ``fixed`` per system it uses."""
    chips = np.zeros(len(d.systems))
    for k, n in counts.items():
        chips[sys_pos[k]] += foot[k] * n
    return float(chips @ price + fixed[chips > 0].sum())


@dataclass
class MasterSolution:
    """A solved master: its optimum (infinity where the box holds no fleet), the node variables' values, the row
    duals in HiGHS' sign (what a unit more of each row's right-hand side changes the optimum by: <= 0 on a binding
    <= row of a minimization), and the basis (`WarmMaster.solve` starts from it).
    """

    fun: float
    x: np.ndarray | None = None
    dual: np.ndarray | None = None
    basis: object = None


class WarmMaster:
    """The master linear program (`formulations.fleet_columns.master_program`) held in one HiGHS model for a whole
    column generation and its branching: columns are added in place, with the ``link`` rows of the (block, system)
    pairs they bring first, both taken from `master_program` over the new columns alone (the node rows' positions do
    not depend on the columns); a box changes the node variables' bounds; each solve starts from a basis (the one
    the model holds, or a box's own), so the simplex goes on from it instead of from scratch. ``rows``: model rows
    of each kind (hold, inventory, power, convex) in `master_program`'s order; ``link``: (block, system) -> row.
    """

    def __init__(self, d: FleetData, blocks: list, mp) -> None:
        self.d, self.blocks, self.n_nodes = d, blocks, mp.n_nodes
        self.in_use = [s for s in d.systems.index if float(d.systems.loc[s, "fixed_usd_per_day"]) > 0]
        self.held: set = set()  # systems whose link rows are lifted now (`solve`)
        n_ub = mp.A_ub.shape[0]
        self.rows = {k: np.arange(mp.rows[k].start, mp.rows[k].stop) for k in ("hold", "inventory", "power")}
        self.rows["convex"] = n_ub + np.arange(len(blocks))
        self.link = {key: mp.rows["link"].start + i for i, key in enumerate(mp.keys["link"])}
        self.n_rows = n_ub + len(blocks)
        self.columns = mp.A_ub.shape[1] - mp.n_nodes - len(blocks)  # the real columns (after the artificial ones)
        A = sp.vstack([mp.A_ub, mp.A_eq]).tocsc()
        lp = highspy.HighsLp()
        lp.num_col_, lp.num_row_ = A.shape[1], A.shape[0]
        lp.col_cost_, lp.col_lower_, lp.col_upper_ = mp.c, mp.bounds[:, 0], mp.bounds[:, 1]
        lp.row_lower_ = np.r_[np.full(n_ub, -np.inf), mp.b_eq]
        lp.row_upper_ = np.r_[mp.b_ub, mp.b_eq]
        lp.a_matrix_.format_ = highspy.MatrixFormat.kColwise
        lp.a_matrix_.num_col_, lp.a_matrix_.num_row_ = A.shape[1], A.shape[0]
        lp.a_matrix_.start_, lp.a_matrix_.index_, lp.a_matrix_.value_ = A.indptr, A.indices, A.data
        # the binding itself: the `highspy.Highs` wrapper prints a banner on stdout and runs Python callbacks
        self.h = highspy._core._Highs()
        self.h.setOptionValue("output_flag", False)
        self.h.passModel(lp)

    def add(self, block_of: np.ndarray, chips: np.ndarray) -> None:
        """Columns of blocks ``block_of`` (positions in ``blocks``) with ``chips`` per system, and the link rows of
        the (block, system) pairs they are the first to bring.
        """
        mp = master_program(self.d, self.blocks, block_of, chips)
        at = np.empty(mp.A_ub.shape[0] + mp.A_eq.shape[0], dtype=np.int32)  # its rows' positions in the model
        for k in ("hold", "inventory", "power"):
            at[mp.rows[k]] = self.rows[k]
        at[mp.A_ub.shape[0]:] = self.rows["convex"]
        fresh = []
        for i, key in enumerate(mp.keys["link"]):
            if key not in self.link:
                self.link[key] = self.n_rows + len(fresh)
                fresh.append(mp.rows["link"].start + i)
            at[mp.rows["link"].start + i] = self.link[key]
        if fresh:  # the new link rows' entries on the node (in-use) variables
            R = mp.A_ub[fresh][:, :self.n_nodes].tocsr()
            self.h.addRows(len(fresh), np.full(len(fresh), -np.inf), mp.b_ub[fresh], R.nnz, R.indptr[:-1],
                           R.indices, R.data)
            self.n_rows += len(fresh)
        C = sp.vstack([mp.A_ub, mp.A_eq]).tocsc()[:, self.n_nodes:]
        self.h.addCols(C.shape[1], mp.c[self.n_nodes:], mp.bounds[self.n_nodes:, 0], mp.bounds[self.n_nodes:, 1],
                       C.nnz, C.indptr[:-1], at[C.indices], C.data)
        self.columns += len(block_of)

    def solve(self, box: tuple, basis=None) -> MasterSolution | None:
        """The master with the node variables within ``box`` (low, high), from ``basis`` where given (a basis of
        the model with fewer rows and columns: those added since enter it basic and at their lower bound), else from
        the model's own; None where HiGHS ends short of optimal.
        """
        n = self.n_nodes
        self.h.changeColsBounds(n, np.arange(n, dtype=np.int32), np.asarray(box[0], dtype=float),
                                np.asarray(box[1], dtype=float))
        # a system the box holds in use: its link rows (a block's weight on it <= its in-use value, 1) are implied by
        # the convexity rows, so they are lifted (their duals 0: the pricing bears no fixed price there, and the
        # Lagrangian value is at least as high, a plan paying at most its multiplier more)
        held = {s for s, lo in zip(self.in_use, np.asarray(box[0])[n - len(self.in_use):], strict=True) if lo >= 0.5}
        if self.link and (held or self.held):  # rows are added with their bound: none to move while none is held
            rows = np.fromiter(self.link.values(), dtype=np.int32, count=len(self.link))
            up = np.array([np.inf if s in held else 0.0 for _, s in self.link], dtype=float)
            self.h.changeRowsBounds(len(rows), rows, np.full(len(rows), -np.inf), up)
        self.held = held
        if basis is not None:
            basis.col_status = list(basis.col_status) + [highspy.HighsBasisStatus.kLower] * (
                self.h.getNumCol() - len(basis.col_status))
            basis.row_status = list(basis.row_status) + [highspy.HighsBasisStatus.kBasic] * (
                self.n_rows - len(basis.row_status))
            self.h.setBasis(basis)
        self.h.run()
        status = self.h.getModelStatus()
        if status in (highspy.HighsModelStatus.kInfeasible, highspy.HighsModelStatus.kUnboundedOrInfeasible):
            return MasterSolution(math.inf)  # costs and variables are nonnegative: never unbounded
        if status != highspy.HighsModelStatus.kOptimal:
            return None
        sol = self.h.getSolution()
        return MasterSolution(self.h.getInfo().objective_function_value, np.array(sol.col_value[:n]),
                              np.array(sol.row_dual), self.h.getBasis())


def column_bound(d: FleetData, time_limit_s: float, start: dict | None = None, tol: float = 1e-3,
                 near_usd: float = 1.0, branch: bool = True, cut: bool = False, branch_tol: float = BRANCH_TOL,
                 own_first: bool = True, seed_cuts: bool = True) -> ColumnBound:
    """Column generation on ``d`` (reduced and merged as the caller solves it) within ``time_limit_s``; ``start``:
    block (class index, slice) -> plans to begin with (each a {option: replicas}). Stops when the bound is within
    ``tol`` of the master's optimum, when no plan prices below its block's dual, or at the time limit. With
    ``branch``, then branches on the node counts (`_branch`) in the time left, each box's column generation stopped
    within the larger of ``tol`` and ``branch_tol`` (`BRANCH_TOL`). With ``cut``, a round is stopped at
    the time limit (it bounds nothing then; without, every round, the first included, runs to its end). With
    ``own_first``, where pools join across systems, a round first prices every class with its pools paired on their
    own systems only (exact and fast: no pair across systems, every component on one system bearing its fixed price;
    their plans are this program's) and prices the pairs across systems only where that adds no column, so the
    rounds that bound are those (on `scripts/bench_fleet.py`'s mixed 1 x 24, alone, 40 s: 3,951 -> 3,970 USD/day).
    Every round that prices every block leaves a cut per block (`ColumnBound.cuts`, for `cut_bound`); with
    ``seed_cuts``, each block is first priced at an hourly node's price per chip in its slice, its plan a column and
    its minimum a cut (a root master's duals may price every chip at 0: on the brute-force tests' random instances the
    node program over the root's cuts then had none). Returns the best bound reached.
    """
    t0 = time.perf_counter()
    out = ColumnBound()
    up = d.upper()
    foot = d.footprint().astype(float)
    S = list(d.systems.index)
    sys_pos = pd.Index(S).get_indexer(d.options["system"])
    blocks, parts, lams = [], [], []
    for j in range(len(d.classes)):
        for t in d.slices:
            lam = float(d.demand.iloc[j][t])
            if lam > 0:
                blocks.append((j, t))
                lams.append(lam)
                parts.append(cover_components(d, j, t, up[t].to_numpy()))
    out.blocks = blocks
    pooled = [any(isinstance(c, Pooled) for c in p) for p in parts]
    own = None
    if own_first and any(pooled):
        alone = replace(d, systems=d.systems.assign(interconnect_bytes_per_s=0.0))
        own = [cover_components(alone, j, t, up[t].to_numpy()) if p else None
               for (j, t), p in zip(blocks, pooled, strict=True)]
    covers: dict = {}
    columns: list = []
    mine: list = [[] for _ in blocks]  # per block: (chips per system, systems used, replicas)
    seen: set = set()

    def add(b: int, counts: dict) -> bool:
        key = (b, frozenset(counts.items()))
        if key in seen:
            return False
        seen.add(key)
        chips = np.zeros(len(S))
        np.add.at(chips, sys_pos[list(counts)], foot[list(counts)] * np.array(list(counts.values()), dtype=float))
        used = {int(i) for i in np.flatnonzero(chips)}
        columns.append((b, chips, used))
        mine[b].append((chips, used, counts))
        out.plans.setdefault(b, []).append(counts)
        return True

    for b, key in enumerate(blocks):
        for counts in (start or {}).get(key, []):
            add(b, counts)
    res_c, hr_c, fix_c = node_costs(d)
    nS, nT = len(S), len(d.slices)
    tix = {t: i for i, t in enumerate(d.slices)}
    fixed = [i for i, s in enumerate(S) if fix_c[i] > 0]
    nc = d.systems["node_chips"].to_numpy(dtype=float)
    pw = d.systems["power_per_node_w"].to_numpy(dtype=float)
    inv = d.inventory.reindex(S).to_numpy(dtype=float)
    mp = master_program(d, blocks, np.r_[np.arange(len(blocks)), [c[0] for c in columns]].astype(np.int64),
                        np.vstack([np.zeros((len(blocks), len(S)))] + [c[1][None, :] for c in columns]))
    mp.c[mp.n_nodes:mp.n_nodes + len(blocks)] = ARTIFICIAL_USD  # the artificial columns
    master = WarmMaster(d, blocks, mp)
    # a block's cheapest plan at given prices (an exact minimum, whatever plan the search starts from): the same
    # prices recur across rounds and boxes (a branch moves some slices' prices only)
    priced: dict = {}
    kept: dict = {}  # (cover set's name, block, systems a box bans) -> its components without them (`cover_set`)
    stacked: dict = {}  # block -> (how many plans, their chips per system, the systems they use as 0/1), as matrices

    def seed_of(b: int, pi_t: np.ndarray, fx: np.ndarray, sigma_b: float) -> tuple:
        """Block ``b``'s plans so far at a round's prices: the cheapest, with its price (a plan to beat; None where
        there is none), and those within ``near_usd`` of the dual.
        """
        if not mine[b]:
            return None, []
        if stacked.get(b, (0,))[0] != len(mine[b]):
            stacked[b] = (len(mine[b]), np.array([m[0] for m in mine[b]]),
                          np.array([np.isin(np.arange(nS), list(m[1])) for m in mine[b]], dtype=float))
        _, chips_b, used_b = stacked[b]
        v = chips_b @ pi_t + used_b @ fx
        k = int(np.argmin(v))
        return (float(v[k]), mine[b][k][2]), [mine[b][i][2] for i in np.flatnonzero(v <= sigma_b + near_usd)]

    def cover_set(b: int, comps: list | None, which: str, out_of_box: frozenset) -> list | None:
        """Block ``b``'s components ``comps`` in a box whose fleets use no system of ``out_of_box``: their options
        leave (pooled units lose them, a unit left without a pool goes), where any is left (else the banned systems
        are priced at `BANNED_USD`). ``which``: the set's name, for the cache.
        """
        if comps is None or not out_of_box:
            return comps
        if (which, b, out_of_box) not in kept:
            kept[which, b, out_of_box] = [
                k for k in (_restrict(c, out_of_box) if isinstance(c, Pooled) else
                            (None if c.system in out_of_box else c) for c in comps) if k is not None] or comps
        return kept[which, b, out_of_box]

    def decide(b: int, ctx: tuple, seed, sigma_b: float) -> tuple:
        """Block ``b``'s cheapest plan at a round's prices (``ctx``: its components, prices, fixed prices, key, the
        searches' memo, the prices as arrays): (its minimum or a lower bound, and a plan; the plan's price with every
        fixed price, or None where that is the minimum). `cheapest_plan`'s minimum leaves out the fixed prices of
        systems that pooled units use alone; where it is below the dual and its plan's price is not, they may decide,
        and are decided (`cheapest_plan_fixed`; else the bound stops short of the master where the column generation
        ends). On `scripts/bench_fleet.py`'s mixed 2 x 12 (column generation alone, 25 s), deciding 4 systems first
        and all where that bound was still below the dual reached 6,288 USD/day, all at once 6,294.
        """
        comps, prices, fixed_b, at, memo, pi_t, fx = ctx
        if ("plan", *at) not in priced:
            priced["plan", *at] = cheapest_plan(comps, lams[b], prices, fixed_b, seed, spare=d.n_plus_one, memo=memo)
        found = priced["plan", *at]
        if found is None or not pooled[b] or not found[1]:
            return found, None
        price = _price(d, found[1], foot, sys_pos, pi_t, fx)  # its price with every system's fixed price
        cut_at = sigma_b - 1e-7 * max(1.0, abs(sigma_b))
        if not (price > found[0] + 1e-9 * max(1.0, price) and found[0] < cut_at <= price):
            return found, price  # a column already, or priced at its bound, or no column below the dual
        if seed is None or price < seed[0]:
            seed = (price, found[1])
        if ("fixed", *at) not in priced:
            priced["fixed", *at] = cheapest_plan_fixed(comps, lams[b], prices, fixed_b, seed, d.n_plus_one, found[0],
                                                       memo)
        found = priced["fixed", *at]
        price = None if found is None else _price(d, found[1], foot, sys_pos, pi_t, fx)
        return found, price

    def generate(box: tuple, stop: float, basis=None, tol: float = tol) -> tuple[float, dict]:
        """Column generation with the node variables within ``box`` (low, high per node variable: reserved,
        hourly by system and slice, in use): its best Lagrangian value (a bound on every fleet whose nodes are in
        the box; infinity where the box holds none) and the last master's node values and near plans. A system
        whose in-use value the box holds at 0 is priced at `BANNED_USD` and its options leave the cover sets
        (`cover_set`: the box's fleets do not use it); one it holds at 1 bears no fixed price in the pricing (its link
        rows lifted, `WarmMaster.solve`). ``basis``: where its first master starts from (its parent box's; else the
        model's own); ``tol``: the gap to the master at which it stops.
        """
        node: dict = {"bound": -math.inf, "master": math.inf, "x": None, "near": {}, "basis": None}
        while True:
            out.iterations += 1
            if len(columns) > master.columns:
                master.add(np.array([c[0] for c in columns[master.columns:]], dtype=np.int64),
                           np.vstack([c[1][None, :] for c in columns[master.columns:]]))
            lp = master.solve(box, basis)
            basis = None  # later rounds go on from the model's own basis
            if lp is None:
                return node["bound"], node
            if lp.fun == math.inf:
                return math.inf, node
            node["master"] = lp.fun
            node["x"] = lp.x
            node["basis"] = lp.basis
            dual = np.maximum(-lp.dual, 0.0)  # what a unit more of each <= row saves
            sigma = lp.dual[master.rows["convex"]]
            pi = dual[master.rows["hold"]].reshape(nS, nT)  # USD/day per chip of system and slice
            inv_u = dual[master.rows["inventory"]].reshape(len(fixed), nT) if fixed else np.zeros((0, nT))
            eta: dict = {}
            for (b, s), v in zip(master.link, dual[list(master.link.values())], strict=True):
                eta.setdefault(b, np.zeros(nS))[S.index(s)] = v  # 0 where the box holds s in use (`WarmMaster`)
            phi = dual[master.rows["power"]] if d.power_cap_w is not None else np.zeros(0)
            # the node and in-use variables, each at the bound that minimizes its reduced cost
            value = 0.0
            red_res = res_c - pi.sum(axis=1) * nc
            red_hr = hr_c - pi * nc[:, None]
            red_fix = {}
            for n_, si in enumerate(fixed):
                red_res[si] += inv_u[n_].sum()
                red_hr[si] += inv_u[n_]
                red_fix[si] = fix_c[si] - float((inv_u[n_] * inv[si]).sum()) - sum(v[si] for v in eta.values())
                value += red_fix[si] * (box[1][use0 + n_] if red_fix[si] < 0 else box[0][use0 + n_])
            if len(phi):
                red_res += pw * phi.sum()
                red_hr += np.outer(pw, phi)
                value -= float(phi.sum() * d.power_cap_w)
            value += float(np.where(red_res < 0, box[1][:nS], box[0][:nS]) @ red_res)
            value += float((np.where(red_hr.ravel() < 0, box[1][nS:use0], box[0][nS:use0]) * red_hr.ravel()).sum())
            added = 0
            banned = np.zeros(nS)
            banned[fixed] = np.where(box[1][use0:] < 0.5, BANNED_USD, 0.0)
            out_of_box = frozenset(S[i] for i in np.flatnonzero(banned))

            if own is not None:
                # pools paired on their own systems first (their plans are this program's; exact, fast): the
                # generation prices the pools joined across systems only where these add no column
                for b, (_, t) in enumerate(blocks):
                    comps = cover_set(b, own[b] if pooled[b] else parts[b], "own" if pooled[b] else "all", out_of_box)
                    if comps is None:
                        continue
                    ti = tix[t]
                    fx = eta.get(b, np.zeros(nS)) + banned
                    at = ("own" if pooled[b] else "plan", b, pi[:, ti].tobytes(), fx.tobytes())
                    if at not in priced:
                        priced[at] = cheapest_plan(comps, lams[b], dict(zip(S, pi[:, ti].tolist(), strict=True)),
                                                   dict(zip(S, fx.tolist(), strict=True)),
                                                   seed_of(b, pi[:, ti], fx, sigma[b])[0], spare=d.n_plus_one)
                    found = priced[at]
                    if found is not None and found[0] < sigma[b] - 1e-7 * max(1.0, abs(sigma[b])):
                        added += add(b, found[1])
                if added:
                    if time.perf_counter() >= stop:
                        return node["bound"], node
                    continue
            lows = np.zeros(len(blocks))
            for b, (j, t) in enumerate(blocks):
                if cut and time.perf_counter() >= stop:  # a round cut short bounds nothing: the rounds before stand
                    return node["bound"], node
                ti = tix[t]
                fx = eta.get(b, np.zeros(nS)) + banned
                seed, node["near"][b] = seed_of(b, pi[:, ti], fx, sigma[b])
                found, price = None, None
                comps = cover_set(b, parts[b], "all", out_of_box)
                if comps is not None:
                    ctx = (comps, dict(zip(S, pi[:, ti].tolist(), strict=True)), dict(zip(S, fx.tolist(), strict=True)),
                           (b, pi[:, ti].tobytes(), fx.tobytes()), {}, pi[:, ti], fx)
                    found, price = decide(b, ctx, seed, sigma[b])
                    out.searched += found is not None
                if found is None:
                    if b not in covers:
                        covers[b] = cover_program(d, j, t, up[t].to_numpy())
                    cp = covers[b]
                    r = milp(cp.cost(pi[sys_pos[cp.ks], ti] * foot[cp.ks], fx[pd.Index(S).get_indexer(cp.systems)]),
                             integrality=cp.integrality, bounds=(cp.lb, cp.ub),
                             constraints=LinearConstraint(cp.A, cp.lo, cp.hi), options={"mip_rel_gap": 1e-7})
                    out.programs += 1
                    if r.x is None:
                        value = -math.inf
                        break
                    low = float(min(getattr(r, "mip_dual_bound", r.fun), r.fun))
                    found = (float(r.fun), {int(k): int(round(v)) for k, v in zip(cp.ks, r.x[:len(cp.ks)], strict=True)
                                            if v > 0.5})
                else:
                    low = found[0]
                if not math.isfinite(low):  # no plan within the replica bounds: this round bounds nothing
                    value = -math.inf
                    break
                lows[b] = low
                if (found[0] if price is None else price) < sigma[b] - 1e-7 * max(1.0, abs(sigma[b])):
                    added += add(b, found[1])
            value += float(lows.sum())
            if math.isfinite(value):
                out_f = tuple(n_ for n_, si in enumerate(fixed) if banned[si] > 0)
                for b, (_, t) in enumerate(blocks):
                    # a minimum at the scale of the artificial or banned prices (their duals leaking into the
                    # round's) makes a cut HiGHS cannot use reliably: left out (a cut left out weakens nothing else)
                    if 0.0 < lows[b] < min(ARTIFICIAL_USD, BANNED_USD) / 2:
                        fx = eta.get(b, np.zeros(nS)).copy()
                        fx[banned > 0] = 0.0  # the box's plans use none of them
                        key = (b, pi[:, tix[t]].tobytes(), fx.tobytes(), out_f)
                        out.cuts[key] = (b, tix[t], pi[:, tix[t]].copy(), fx, float(lows[b]), out_f)
            node["bound"] = max(node["bound"], value)
            if not added or node["bound"] >= node["master"] * (1 - tol) or time.perf_counter() >= stop:
                return node["bound"], node

    use0 = nS + nS * nT  # the in-use values follow the reserved and hourly nodes
    for b, (_, t) in enumerate(blocks if seed_cuts else ()):
        # a cut per block at an hourly node's price per chip (the root master's duals may price every chip at 0),
        # no price per system used (so the minimum is the search's own): its plan a column too
        p = hr_c[:, tix[t]] / nc
        found = cheapest_plan(parts[b], lams[b], dict(zip(S, p.tolist(), strict=True)), dict.fromkeys(S, 0.0),
                              spare=d.n_plus_one)
        if found is not None and found[1] and found[0] > 0:
            out.cuts[b, "hourly"] = (b, tix[t], p, np.zeros(nS), float(found[0]), ())
            add(b, found[1])
    root = (np.zeros(use0 + len(fixed)), np.r_[inv.min(axis=1), inv.ravel(), np.ones(len(fixed))])
    out.bound, node = generate(root, t0 + time_limit_s)
    out.master, out.x, out.near = node["master"], node["x"], node["near"]
    if branch and node["x"] is not None:
        out.bound, out.leaf = _branch(generate, root, out.bound, node, d, t0 + time_limit_s, max(tol, branch_tol))
    out.wall_s = time.perf_counter() - t0
    return out


def cut_bound(d: FleetData, cb: ColumnBound, time_limit_s: float) -> tuple[float, tuple[pd.Series, set] | None]:
    """A lower bound on the fleet program from the node program over the column generation's cuts, by HiGHS within
    ``time_limit_s``: reserved and hourly nodes whole, systems in use 0 or 1, and per class and slice (block) the
    chips y_bs its plan holds on each system and whether it uses it (w_bs), bound by the master's rows (a slice's
    chips within its nodes, nodes within the inventory of a system in use, w_bs <= its in-use value, the power cap)
    and by every cut the pricing left (`ColumnBound.cuts`): at chip prices p >= 0 and prices q >= 0 per system used,
    a block's minimum m over its cover set bounds every plan of it, so its plan's chips and systems satisfy
    p.y_b + q.w_b >= m (a cut priced in a box that held systems O out of use holds for plans using none of them:
    p.y_b + q.w_b + m sum_O u_s >= m); and y_bs <= (the most chips its options there take) w_bs. Every fleet of the
    program is a point of it (its nodes and systems, each block's plan's chips and systems), so its optimum, or
    HiGHS's dual bound at the limit, bounds the program; it keeps what the master's linear program loses, the
    rounding of whole nodes and the fixed price of each system in use, over the plans' convex hull seen through the
    cuts (`column_bound`'s branching reaches the same only box by box). Returned with the reserved nodes and the
    systems in use of the solution HiGHS found (a start for the fleets at fixed nodes), or None where it found none;
    minus infinity where there is no cut or no bound (also where HiGHS reports no point: every fleet is one, so that
    can only be numerical, and it is not taken as a bound).

    Measured with `scripts/bench_fleet.py`'s instances (cuts of a column generation alone, load 1-2): mixed 1 model x
    24 slices, cuts of 10 s (184 distinct) prove 4,052.8 USD/day, the best fleet's cost, in 3.7 s (the generation's
    own bound 3,940, the node relaxation's 3,990 in 15 s); mixed 2 x 12, cuts of 30 s: 6,371.2 in 3.9 s (generation
    6,297; best fleet 6,395); mixed 5 x 24, cuts of 30 s (1,674): 14,021 in 21.5 s (generation 13,891; best fleet
    14,056).
    """
    end = time.perf_counter() + time_limit_s
    if not cb.cuts:
        return -math.inf, None
    S, T, blocks = list(d.systems.index), d.slices, cb.blocks
    nS, nT, nB = len(S), len(T), len(blocks)
    res_c, hr_c, fix_c = node_costs(d)
    fixed = np.flatnonzero(fix_c > 0)
    nF = len(fixed)
    fpos = np.full(nS, -1)
    fpos[fixed] = np.arange(nF)
    inv = d.inventory.reindex(S).to_numpy(dtype=float)
    nc = d.systems["node_chips"].to_numpy(dtype=float)
    tix = {t: i for i, t in enumerate(T)}
    bt = np.array([tix[t] for _, t in blocks], dtype=np.int64)
    # the most chips a block's plan holds on a system: its options there at their replica bounds
    o, up, foot = d.options, d.upper(), d.footprint().astype(float)
    sys_pos = pd.Index(S).get_indexer(o["system"])
    most = np.zeros((nB, nS))
    for b, (j, t) in enumerate(blocks):
        mod, cls = d.classes[j]
        ks = np.flatnonzero(((o["model"] == mod) & (o["cls"] == cls)).to_numpy())
        np.add.at(most[b], sys_pos[ks], foot[ks] * up[t].to_numpy()[ks])
    most = np.minimum(most, (nc * inv.max(axis=1))[None, :])
    oR, oH, oU, oY = 0, nS, nS + nS * nT, nS + nS * nT + nF
    oW = oY + nB * nS
    nv = oW + nB * nF
    c = np.zeros(nv)
    c[oR:oH], c[oH:oU], c[oU:oY] = res_c, hr_c.ravel(), fix_c[fixed]
    lb, ub = np.zeros(nv), np.ones(nv)
    ub[oR:oH], ub[oH:oU], ub[oY:oW] = inv.min(axis=1), inv.ravel(), most.ravel()
    integrality = np.r_[np.ones(oY), np.zeros(nv - oY)]
    ri, ci, val, lo, hi = [], [], [], [], []
    r = 0

    def rows(n: int, lo_: np.ndarray, hi_: np.ndarray) -> np.ndarray:
        nonlocal r
        at = r + np.arange(n)
        r += n
        lo.append(np.broadcast_to(lo_, n))
        hi.append(np.broadcast_to(hi_, n))
        return at

    def entries(at: np.ndarray, col: np.ndarray, v) -> None:
        ri.append(at)
        ci.append(col)
        val.append(np.broadcast_to(np.asarray(v, dtype=float), len(at)))

    si, ti = np.meshgrid(np.arange(nS), np.arange(nT), indexing="ij")
    si, ti = si.ravel(), ti.ravel()
    hold = rows(nS * nT, -np.inf, 0.0)  # a slice's chips within its nodes, by system
    bb, bs = np.meshgrid(np.arange(nB), np.arange(nS), indexing="ij")
    bb, bs = bb.ravel(), bs.ravel()
    entries(hold[bs * nT + bt[bb]], oY + bb * nS + bs, 1.0)
    entries(hold, oR + si, -nc[si])
    entries(hold, oH + si * nT + ti, -nc[si])
    held = rows(nS * nT, -np.inf, np.where(fpos[si] >= 0, 0.0, inv[si, ti]))  # nodes within the inventory
    entries(held, oR + si, 1.0)
    entries(held, oH + si * nT + ti, 1.0)
    on = fpos[si] >= 0
    entries(held[on], oU + fpos[si[on]], -inv[si[on], ti[on]])
    if nF:
        fb, ff = np.meshgrid(np.arange(nB), np.arange(nF), indexing="ij")
        fb, ff = fb.ravel(), ff.ravel()
        link = rows(nB * nF, -np.inf, 0.0)  # w_bs <= u_s
        entries(link, oW + fb * nF + ff, 1.0)
        entries(link, oU + ff, -1.0)
        chips = rows(nB * nF, -np.inf, 0.0)  # y_bs <= most_bs w_bs
        entries(chips, oY + fb * nS + fixed[ff], 1.0)
        entries(chips, oW + fb * nF + ff, -most[fb, fixed[ff]])
    if d.power_cap_w is not None:
        pw = d.systems["power_per_node_w"].to_numpy(dtype=float) / float(d.power_cap_w)  # the cap as 1
        power = rows(nT, -np.inf, 1.0)
        entries(power[ti], oR + si, pw[si])
        entries(power[ti], oH + si * nT + ti, pw[si])
    for b, _, p, q, m, out_f in cb.cuts.values():
        scale = max(float(p.max()), float(q.max()))
        if scale <= 0.0:
            continue  # prices all 0 and a positive minimum: cannot be (the plan costs 0); nothing to say
        # coefficients as a share of the largest, none below `CUT_COEF_MIN` (raised: a larger coefficient on a
        # nonnegative variable only weakens the cut), so HiGHS is not handed a range it cannot resolve
        p = np.where(p > 0, np.maximum(p / scale, CUT_COEF_MIN), 0.0) * scale
        q = np.where(q > 0, np.maximum(q / scale, CUT_COEF_MIN), 0.0) * scale
        at = rows(1, m / scale, np.inf)
        ys, = np.nonzero(p > 0)
        ws, = np.nonzero(q[fixed] > 0)
        entries(np.repeat(at, len(ys)), oY + b * nS + ys, p[ys] / scale)
        entries(np.repeat(at, len(ws)), oW + b * nF + ws, q[fixed[ws]] / scale)
        if out_f:
            entries(np.repeat(at, len(out_f)), oU + np.array(out_f), m / scale)
    A = sp.csr_matrix((np.concatenate(val), (np.concatenate(ri), np.concatenate(ci))), shape=(r, nv))
    left = end - time.perf_counter()
    if left < 0.5:
        return -math.inf, None
    res = milp(c, integrality=integrality, bounds=(lb, ub),
               constraints=LinearConstraint(A, np.concatenate(lo), np.concatenate(hi)),
               options={"time_limit": left, "mip_rel_gap": 1e-6})
    if res.status == 2:  # HiGHS says no point: not taken as a proof (the callers hold a fleet), so no bound
        return -math.inf, None
    bound = getattr(res, "mip_dual_bound", None)
    if bound is None or not math.isfinite(bound):
        bound = float(res.fun) if res.status == 0 else -math.inf
    if res.x is None:
        return float(bound), None
    reserved = pd.Series(np.round(res.x[oR:oH]), index=S)
    used = {S[i] for i in range(nS) if fpos[i] < 0 or res.x[oU + fpos[i]] > 0.5}
    return float(min(bound, res.fun) if res.status == 0 else bound), (reserved, used)


def _branch(generate, root: tuple, bound: float, node: dict, d: FleetData, stop: float, tol: float
            ) -> tuple[float, np.ndarray | None]:
    """Branch and price on the node counts and the systems in use, best bound first, within ``stop``: reserved
    nodes are whole, and so are hourly nodes at an optimum (where replicas take whole nodes the least hourly count
    meeting a whole-node need is whole; elsewhere the program makes them integers), and a system is in use or not,
    so a box's fleets are those of its two halves, below and above a fractional value: the one rounding most USD/day
    (fraction times the node's cost per day, or the system's fixed cost). The bound is the least over the boxes left
    open (each box's own bound valid for the fleets in it); returned with the node values of the master of the box
    that has it. A box's master starts from its parent's basis (the parent's optimum with one bound moved: a few dual
    simplex steps) and its column generation stops within ``tol`` of its master.
    """
    res_c, hr_c, fix_c = node_costs(d)
    cost = np.r_[res_c, hr_c.ravel(), fix_c[fix_c > 0]]
    open_: list = [(bound, root, node["x"], node["basis"])]
    while time.perf_counter() < stop:
        open_.sort(key=lambda o: o[0])
        b0, box, x, basis = open_[0]
        v = x[:len(cost)]
        frac = np.minimum(v - np.floor(v + 1e-9), np.ceil(v - 1e-9) - v)
        score = np.where(frac > 1e-6, frac * cost, 0.0)
        if not score.any():
            break  # the least open box has whole node counts and systems in use: branching cannot raise it
        i = int(np.argmax(score))
        kids = []
        for side in (0, 1):
            lo, hi = box[0].copy(), box[1].copy()
            if side == 0:
                hi[i] = math.floor(v[i] + 1e-9)
            else:
                lo[i] = math.ceil(v[i] - 1e-9)
            if lo[i] > hi[i]:
                continue
            kid = (lo, hi)
            kb, kn = generate(kid, stop, basis, tol)  # from the parent's basis: its dual simplex goes on from it
            if kb == math.inf:
                continue  # no fleet has its nodes in this box
            kids.append((max(kb, b0), kid, kn["x"], kn["basis"]))  # the parent's bound holds in the box too
        open_ = open_[1:] + kids
        if not open_:
            return b0, None
        if any(o[2] is None for o in open_):
            break
    least = min(open_, key=lambda o: o[0])
    return least[0], least[2]


def _staircase(cost: np.ndarray, cap: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(costs ascending, the most capacity reached at or below each): the 2-D front of (cost, capacity) rows."""
    order = np.lexsort((-cap, cost))
    return cost[order], np.maximum.accumulate(cap[order])


def _pool_states(rate: np.ndarray, usd: np.ndarray, most: np.ndarray, lam: float, below: float = math.inf
                 ) -> tuple[np.ndarray, ...]:
    """The replica vectors of one pool worth holding at given prices (USD/day per replica ``usd``): (counts, rate
    capped at lam + top rate, top rate, USD/day), at least one replica, without those another beats (as much capped
    rate, no larger top rate, no more USD). Built option by option in ascending rate: the vectors that add the
    option's replicas have its rate as their top, so one held before (no larger top) beats one of them when it has
    as much capped rate for no more USD, and among themselves the same test decides; a completion adds replicas no
    slower than those held, so it keeps a dominance (the new top is common to both, and a capped rate plus a
    replica of the new top reaches lam + that top whenever the uncapped one does). Only those priced below
    ``below``: exactly those of them without it (a vector is beaten by cheaper ones only, and its completions cost
    more).
    """
    counts = np.zeros((1, len(rate)), dtype=np.int64)
    cap, top, cost = np.zeros(1), np.zeros(1), np.zeros(1)
    for k in np.argsort(rate, kind="stable"):
        n = np.arange(1, int(most[k]) + 1)
        if not len(n):
            continue
        c_new = np.minimum((cap[:, None] + n[None, :] * rate[k]).ravel(), lam + rate[k])  # held vector, then n
        u_new = (cost[:, None] + n[None, :] * usd[k]).ravel()
        at, most_cap = _staircase(cost, cap)  # the vectors held so far (tops no larger)
        pos = np.searchsorted(at, u_new, side="right") - 1
        fresh = np.flatnonzero((c_new > np.where(pos >= 0, most_cap[np.maximum(pos, 0)], -np.inf) + 1e-12)
                               & (u_new < below))
        order = fresh[np.lexsort((-c_new[fresh], u_new[fresh]))]
        prior = np.maximum.accumulate(np.concatenate(([-np.inf], c_new[order][:-1])))
        order = order[c_new[order] > prior + 1e-12]
        add = counts[order // len(n)]
        add[:, k] += n[order % len(n)]
        counts = np.vstack([counts, add])
        cap, top = np.concatenate((cap, c_new[order])), np.concatenate((top, np.full(len(order), rate[k])))
        cost = np.concatenate((cost, u_new[order]))
    return counts[1:], cap[1:], top[1:], cost[1:]


REACH_CHUNK = 32
"""Vectors `_first_reaching` compares with each query at once; the rest of a query's vectors come from a table per
multiple of this many."""


def _first_reaching(a: np.ndarray, b: np.ndarray, c: np.ndarray, qa: np.ndarray, qb: np.ndarray) -> np.ndarray:
    """Per query the position of the cheapest vector with a >= qa and b >= qb (of equal costs the first; every query
    is reached by one). The vectors reaching a query's qa are a prefix of them in descending a: its whole multiples
    of `REACH_CHUNK` are read from a table (per such prefix and value of b, the least rank in the cheapest-first order
    among its vectors at or above that value), the rest (fewer than `REACH_CHUNK`) compared one by one.
    """
    n = len(c)
    by_c = np.argsort(c, kind="stable")
    rank = np.empty(n, dtype=np.int64)
    rank[by_c] = np.arange(n)
    by_a = np.argsort(-a, kind="stable")
    reach = n - np.searchsorted(np.sort(a), qa, side="left")  # vectors with a >= qa
    vb = np.unique(b)
    full = n // REACH_CHUNK
    table = np.full((full + 1, len(vb) + 1), n, dtype=np.int64)
    if full:
        np.minimum.at(table, (1 + np.arange(full * REACH_CHUNK) // REACH_CHUNK,
                              np.searchsorted(vb, b[by_a[:full * REACH_CHUNK]])), rank[by_a[:full * REACH_CHUNK]])
        table = np.minimum.accumulate(np.minimum.accumulate(table[:, ::-1], axis=1)[:, ::-1], axis=0)
    k = reach // REACH_CHUNK
    best = table[k, np.searchsorted(vb, qb, side="left")]
    pos = k[:, None] * REACH_CHUNK + np.arange(REACH_CHUNK)[None, :]
    rows = by_a[np.minimum(pos, n - 1)]
    ok = (pos < reach[:, None]) & (b[rows] >= qb[:, None])
    best = np.minimum(best, np.where(ok, rank[rows], n).min(axis=1))
    return by_c[best]


def priced_pool(u: Pooled, lam: float, price: dict, spare: bool = True, memo: dict | None = None,
                below: float = math.inf) -> Component:
    """A unit whose pools span systems as a component at given prices (USD/day per chip of each system): the pairs
    of its pools' non-dominated vectors (`_pool_states`) that no other pair beats (serving as much, as much after
    its worst failure, for no more USD), each serving min(cP, cD) and after the failure of a top prefill (decode)
    replica min(cP - rP, cD) (min(cP, cD - rD)), both counted up to lam. Every pair is beaten by the pair of the
    cheapest prefill and the cheapest decode vectors reaching its (served, left after a failure), so only those are
    formed. USD/day per configuration in ``usd``; fixed prices of the systems it uses are not in it. ``below``:
    only the pairs priced below it (a search with a plan at that price never visits the others: the same minimum;
    each pool's vectors below it less the other pool's cheapest replica, exactly the vectors formed without it, so
    the pairs are the same points). ``memo``: a dict holding each pool's vectors and each unit's component by their
    options and USD per replica, with the ``below`` they were formed under (a unit restricted to some systems,
    `cheapest_plan_fixed`, keeps a pool none of them holds, and often both).
    """
    memo = {} if memo is None else memo
    usd = {r: np.array([price.get(s, 0.0) for s in u.system[r]]) * u.chips[r] for r in ("prefill", "decode")}
    side, keys = {}, []
    for r, o in (("prefill", "decode"), ("decode", "prefill")):
        key = (r, u.ks[r].tobytes(), u.most[r].tobytes(), usd[r].tobytes(), lam, spare)
        keys.append(key)
        cap = below - (usd[o].min() if len(usd[o]) else 0.0)
        if key not in memo or memo[key][0] < cap:
            n, c, top, cost = _pool_states(u.rate[r], usd[r], u.most[r], lam, cap)
            a = np.minimum(c, lam)
            b = np.minimum(c - top, lam) if spare else a
            keep = pareto(a, b, cost)
            memo[key] = (cap, (n[keep], a[keep], b[keep], cost[keep]))
        held, v = memo[key]
        side[r] = v if held == cap else tuple(x[v[3] < cap] for x in v)
    key = tuple(keys)
    if key not in memo or memo[key][0] < below:
        memo[key] = (below, _paired(u, side))
    held, c = memo[key]
    if held == below:
        return c
    at = c.usd < below
    return Component(None, c.ks, c.configs[at], c.M[at], c.loss[at], c.chips[at], c.usd[at])


def _paired(u: Pooled, side: dict) -> Component:
    """`priced_pool`'s component from its pools' non-dominated vectors ``side`` (role -> counts, served, left after
    a failure, USD/day).
    """
    nP, aP, bP, cP = side["prefill"]
    nD, aD, bD, cD = side["decode"]
    if not len(cP) or not len(cD):
        return Component(None, np.concatenate((u.ks["prefill"], u.ks["decode"])), np.zeros((0, len(u.ks["prefill"])
                         + len(u.ks["decode"])), dtype=np.int64), np.zeros(0), np.zeros(0), np.zeros(0), np.zeros(0))
    # the distinct (served, left) targets of every pair, sorted: each value is one of the sides' own, so the pairs
    # are coded by their ranks and deduplicated as integers (what np.unique over rows gives, several times faster)
    va, ra = np.unique(np.concatenate((aP, aD)), return_inverse=True)
    vb, rb = np.unique(np.concatenate((bP, bD)), return_inverse=True)
    code = np.unique(np.minimum.outer(ra[:len(aP)], ra[len(aP):]) * len(vb)
                     + np.minimum.outer(rb[:len(bP)], rb[len(bP):]))
    qa, qb = (va - 1e-12)[code // len(vb)], (vb - 1e-12)[code % len(vb)]  # a vector reaching a target has these
    i, j = _first_reaching(aP, bP, cP, qa, qb), _first_reaching(aD, bD, cD, qa, qb)
    pair = np.unique(i * len(cD) + j)
    i, j = pair // len(cD), pair % len(cD)
    M, left, usd = np.minimum(aP[i], aD[j]), np.minimum(bP[i], bD[j]), cP[i] + cD[j]
    keep = pareto(M, left, usd)
    configs = np.concatenate([nP[i[keep]], nD[j[keep]]], axis=1)
    return Component(None, np.concatenate((u.ks["prefill"], u.ks["decode"])), configs, M[keep], (M - left)[keep],
                     np.zeros(int(keep.sum())), usd[keep])


def _restrict(u: Pooled, banned: set) -> Pooled | None:
    """The unit without its options on ``banned`` systems; None where a pool is left with none."""
    keep = {r: np.array([s not in banned for s in u.system[r]], dtype=bool) for r in u.ks}
    if not all(k.any() for k in keep.values()):
        return None
    return Pooled(*({r: getattr(u, f)[r][keep[r]] for r in u.ks} for f in ("ks", "rate", "chips", "system", "most")))


def cheapest_plan_fixed(comps: list, lam: float, price: dict, fixed: dict, start: tuple[float, dict] | None = None,
                        spare: bool = True, low: float = -math.inf, memo: dict | None = None,
                        subsets: int | None = None) -> tuple[float, dict] | None:
    """`cheapest_plan` with the fixed prices of systems that units spanning systems (`Pooled`) use decided: branch
    and bound over those systems, best bound first. A node holds the plans whose pooled units use every system of
    its set IN and none of its set OUT; its search (`cheapest_plan` with the pooled units off OUT and IN's fixed
    prices paid up front) prices each of them at no more than its price (IN's it pays; the systems only its pooled
    units use outside IN are left out), so its minimum bounds the node. The plan it returns is a plan: its price
    (every system it uses paying once) is an upper bound; where that is the node's minimum the node is solved, else
    it branches on the dearest system that plan's pooled units use alone outside IN (in IN, or in OUT). Nodes with
    ``subsets`` systems decided (None: no limit) are not branched: the least of their bounds and the best price is
    then returned, a lower bound. ``start``: a plan and its price, to beat; ``low``: `cheapest_plan`'s minimum (the
    root's bound). None where a search passes its node limit. ``memo``: `priced_pool`'s, shared by the searches.
    Where the sets of prepaid systems were enumerated instead (up to 2^4, the dearest four), a call took 37 ms in the
    column generation of `scripts/bench_fleet.py`'s mixed 1 x 24, this search 12 ms with every system decided.
    """
    memo = {} if memo is None else memo
    sys_of, pooled_opts = {}, set()
    for c in comps:
        if isinstance(c, Pooled):
            for r in c.ks:
                sys_of.update(zip(c.ks[r].tolist(), c.system[r].tolist(), strict=True))
                pooled_opts.update(c.ks[r].tolist())
        else:
            sys_of.update(dict.fromkeys(np.asarray(c.ks).tolist(), c.system))
    tol = 1e-9 * max(1.0, lam)
    best = start
    bounds: list = []  # of the nodes left unbranched at the depth limit
    heap = [(low, 0, frozenset(), frozenset())]
    count = itertools.count(1)
    while heap:
        bound, _, inn, out_ = heapq.heappop(heap)
        if best is not None and bound >= best[0] - tol:
            continue
        parts = [k for k in (_restrict(c, out_) if isinstance(c, Pooled) and out_ else c for c in comps)
                 if k is not None]
        up_front = sum(fixed.get(s, 0.0) for s in inn)
        r = cheapest_plan(parts, lam, price, fixed, None if best is None else (best[0] - up_front, best[1]),
                          spare=spare, prepaid=inn, memo=memo)
        if r is None:
            return None
        value = r[0] + up_front
        if best is not None and value >= best[0] - tol or not math.isfinite(value):
            continue  # nothing in the node beats the best so far
        # its price: IN's systems it does not use are not paid, those only its pooled units use outside IN are
        used = {sys_of[k] for k in r[1]}
        alone = {s for s in used - {sys_of[k] for k in r[1] if k not in pooled_opts} - inn if fixed.get(s, 0.0) > 0}
        true = value - sum(fixed.get(s, 0.0) for s in inn - used) + sum(fixed[s] for s in alone)
        if best is None or true < best[0]:
            best = (true, r[1])
        if not alone or value >= best[0] - tol:
            continue  # the node's minimum is its plan's price (or the best so far)
        if subsets is not None and len(inn) + len(out_) >= subsets:
            bounds.append(value)
            continue
        s = max(alone, key=lambda x: fixed[x])
        heapq.heappush(heap, (value, next(count), inn | {s}, out_))
        heapq.heappush(heap, (value, next(count), inn, out_ | {s}))
    if best is None:
        return None
    return min([best[0], *bounds]), best[1]


def _by_cost(cost: np.ndarray, M: np.ndarray, loss: np.ndarray) -> tuple:
    """A component's configurations in ascending ``cost`` (so those within a budget are a prefix): their order, then
    M, loss and cost in that order as lists, and the least cost per request/s served.
    """
    order = np.argsort(cost, kind="stable")
    cost, M = cost[order], M[order]
    return order, M.tolist(), loss[order].tolist(), cost.tolist(), float((cost / M).min())


def cheapest_plan(comps: list, lam: float, price: dict, fixed: dict, start: tuple[float, dict] | None = None,
                  node_limit: int = 20000, spare: bool = True, prepaid: frozenset = frozenset(),
                  memo: dict | None = None) -> tuple[float, dict] | None:
    """The exact minimum over a class cover set given as components (`formulations.fleet_columns.cover_components`) of
    chips priced per system (``price``) plus a fixed price per system used (``fixed``): depth-first branch and bound
    over the components (each unused or one of its configurations, the dearest within the budget first), the components
    in order of their best price per request/s, a node's bound its cost plus what it still has to serve at the best
    price per request/s of the components left (fixed prices left out: a lower bound). ``start``: a plan's (cost,
    replicas) to beat (any plan: the minimum returned is then at most the cover set's). Units whose pools span systems
    (`Pooled`, priced by `priced_pool`; ``spare``: with N+1) bear no fixed price: where one is in the plan returned and
    a system only it uses has a fixed price, the minimum is a lower bound, not a plan's price (`cheapest_plan_fixed`
    decides those). ``prepaid``: systems whose fixed price is not counted; ``memo``: `priced_pool`'s. Returns
    (minimum, replicas per option), or None when the search passes ``node_limit`` nodes (the caller then solves the
    cover program).
    """
    tables = []
    for c in comps:
        if isinstance(c, Pooled):
            c = priced_pool(c, lam, price, spare, memo, math.inf if start is None else start[0])
        if not len(c.M):
            continue
        if c.usd is not None:  # priced: its own table
            scale, (order, M, L, units, ratio) = 1.0, _by_cost(c.usd, c.M, c.loss)
        else:  # chips at one system's price: ordered by chips, once per component
            if c.by_chips is None:
                c.by_chips = _by_cost(c.chips, c.M, c.loss)
            scale, (order, M, L, units, ratio) = price.get(c.system, 0.0), c.by_chips
        tables.append((c, M, L, units, scale, ratio * scale, order))
    tables.sort(key=lambda x: x[5])
    suffix = [math.inf] * (len(tables) + 1)
    for i in range(len(tables) - 1, -1, -1):
        suffix[i] = min(suffix[i + 1], tables[i][5])
    best: list = [math.inf, None] if start is None else [start[0], start[1]]
    nodes = [0]
    tol = 1e-9 * max(1.0, lam)

    def search(i: int, served: float, loss: float, paid: float, used: frozenset, chosen: tuple) -> bool:
        nodes[0] += 1
        if nodes[0] > node_limit:
            return False
        if i == len(tables):
            return True
        c, M, L, units, scale, _, _ = tables[i]
        base = paid + (0.0 if c.system is None or c.system in used else fixed.get(c.system, 0.0))
        nxt = suffix[i + 1]
        inner = used if c.system is None else used | {c.system}
        need = lam - served

        def within() -> int:  # configurations priced below the best so far less what the node has paid: a prefix
            room = best[0] - tol - base
            if scale > 0:
                return bisect_left(units, room / scale)
            return len(units) if room > 0 else 0

        # the dearest configuration within the budget first (the largest, mostly: a plan complete early bounds the
        # rest); those at or above the best so far are never visited
        n = within() - 1
        while n >= 0:
            p = base + scale * units[n]
            if p >= best[0] - tol:
                n -= 1
                continue
            w = loss if loss > L[n] else L[n]
            short = need + w - M[n]  # what is still to serve, the worst failure's included
            if short <= tol:
                best[0], best[1] = p, chosen + ((i, n),)
                n = min(n, within()) - 1
                continue
            if p + short * nxt < best[0] - tol and not search(i + 1, served + M[n], w, p, inner, chosen + ((i, n),)):
                return False
            n -= 1
        if paid + (need + loss) * nxt < best[0] - tol:
            return search(i + 1, served, loss, paid, used, chosen)
        return True

    if not search(0, 0.0, 0.0, 0.0, prepaid, ()):
        return None
    if not isinstance(best[1], tuple):  # the start was not beaten (or no plan at all: infinity)
        return best[0], best[1] or {}
    counts: dict = {}
    for i, n in best[1]:
        c, order = tables[i][0], tables[i][6]
        for k, v in zip(c.ks, c.configs[order[n]], strict=True):
            counts[int(k)] = counts.get(int(k), 0) + int(v)
    return best[0], counts
