"""A lower bound on the fleet program by column generation over whole-replica plans per class and slice.

The master linear program (`formulations.fleet_columns.master_program`, HiGHS through scipy's ``linprog``) prices
the nodes, the systems in use and the power; each class and slice's cheapest plan at those prices comes from a
branch and bound over its components (`cheapest_plan`) or, where pools pair across an interconnect, its cover
program (HiGHS through ``milp``). The bound reported is the Lagrangian value at the master's duals, computed from
the plans' own minima (or the cover program's dual bound) and the node variables' bounds, so it is valid at every
iteration whatever the master's tolerance: for any prices u >= 0 of the dualized rows (hold, inventory, link,
power),

    L(u) = sum over classes and slices of min over the class cover set of (chips priced + systems priced)
           + sum over node and in-use variables of min over their bounds of (reduced cost x value) - u_power x cap,

at most the master's optimum, itself at most the program's (the master is a relaxation of it).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
from scipy.optimize import LinearConstraint, linprog, milp

from formulations.fleet import FleetData
from formulations.fleet_columns import cover_components, cover_program, master_program, node_costs

MAX_PROGRAMS = 10
"""Most classes and slices priced by their cover program (HiGHS, ~50 ms each) rather than the branch and bound over
components (~1 ms; a class whose pools pair across an interconnect has none): above, `column_bound` computes no
bound (minus infinity) and the caller falls back on a linear relaxation. Pricing pooled pairs by a search over
per-system halves was tried: exact against the cover program on the bench's mixed 5 models x 12 slices, but 47 of
its 220 classes and slices passed 20,000 nodes, too slow for the time limit."""

ARTIFICIAL_USD = 1e9
"""Cost of the artificial column each class and slice starts with (so the first master is feasible); never part of a
bound (the Lagrangian value does not read the columns)."""


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


def _chips(d: FleetData, counts: dict, foot: np.ndarray, sys_pos: np.ndarray) -> tuple[np.ndarray, set]:
    chips = np.zeros(len(d.systems))
    for k, n in counts.items():
        chips[sys_pos[k]] += foot[k] * n
    return chips, {int(i) for i in np.flatnonzero(chips)}


def column_bound(d: FleetData, time_limit_s: float, start: dict | None = None, tol: float = 1e-3,
                 near_usd: float = 1.0, branch: bool = True) -> ColumnBound:
    """Column generation on ``d`` (reduced and merged as the caller solves it) within ``time_limit_s``; ``start``:
    block (class index, slice) -> plans to begin with (each a {option: replicas}). Stops when the bound is within
    ``tol`` of the master's optimum, when no plan prices below its block's dual, or at the time limit. With
    ``branch``, then branches on the node counts (`_branch`) in the time left. Returns the best bound reached.
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
    if sum(p is None for p in parts) > MAX_PROGRAMS:
        return out
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
    def generate(box: tuple, stop: float) -> tuple[float, dict]:
        """Column generation with the node variables within ``box`` (reserved low, high; hourly low, high): its
        best Lagrangian value (a bound on every fleet whose nodes are in the box; infinity where the box holds
        none) and the last master's node values and near plans.
        """
        node: dict = {"bound": -math.inf, "master": math.inf, "x": None, "near": {}}
        while True:
            out.iterations += 1
            mp = master_program(d, blocks, np.r_[np.arange(len(blocks)), [c[0] for c in columns]].astype(np.int64),
                                np.vstack([np.zeros((len(blocks), len(S)))] + [c[1][None, :] for c in columns]))
            mp.c[mp.n_nodes:mp.n_nodes + len(blocks)] = ARTIFICIAL_USD
            mp.bounds[:nS, 0], mp.bounds[:nS, 1] = box[0], box[1]
            mp.bounds[nS:nS + nS * nT, 0], mp.bounds[nS:nS + nS * nT, 1] = box[2].ravel(), box[3].ravel()
            lp = linprog(mp.c, A_ub=mp.A_ub, b_ub=mp.b_ub, A_eq=mp.A_eq, b_eq=mp.b_eq, bounds=mp.bounds,
                         method="highs")
            if lp.status != 0:
                return math.inf if lp.status == 2 else node["bound"], node
            node["master"] = float(lp.fun)
            node["x"] = lp.x[:mp.n_nodes]
            dual = np.maximum(-np.asarray(lp.ineqlin.marginals), 0.0)  # what a unit more of each <= row saves
            sigma = np.asarray(lp.eqlin.marginals)
            pi = dual[mp.rows["hold"]].reshape(nS, nT)  # USD/day per chip of system and slice
            inv_u = dual[mp.rows["inventory"]].reshape(len(fixed), nT) if fixed else np.zeros((0, nT))
            eta: dict = {}
            for (b, s), v in zip(mp.keys["link"], dual[mp.rows["link"]], strict=True):
                eta.setdefault(b, np.zeros(nS))[S.index(s)] = v
            phi = dual[mp.rows["power"]] if d.power_cap_w is not None else np.zeros(0)
            # the node and in-use variables, each at the bound that minimizes its reduced cost
            value = 0.0
            red_res = res_c - pi.sum(axis=1) * nc
            red_hr = hr_c - pi * nc[:, None]
            red_fix = {}
            for n_, si in enumerate(fixed):
                red_res[si] += inv_u[n_].sum()
                red_hr[si] += inv_u[n_]
                red_fix[si] = fix_c[si] - float((inv_u[n_] * inv[si]).sum()) - sum(v[si] for v in eta.values())
                value += min(red_fix[si], 0.0)
            if len(phi):
                red_res += pw * phi.sum()
                red_hr += np.outer(pw, phi)
                value -= float(phi.sum() * d.power_cap_w)
            value += float(np.where(red_res < 0, box[1], box[0]) @ red_res)
            value += float((np.where(red_hr < 0, box[3], box[2]) * red_hr).sum())
            added = 0
            for b, (j, t) in enumerate(blocks):
                ti = tix[t]
                fx = eta.get(b, np.zeros(nS))
                seed = None
                near = []
                for chips, used, counts in mine[b]:  # the block's plans so far at these prices: a plan to beat
                    v = float(chips @ pi[:, ti]) + sum(fx[i] for i in used)
                    if seed is None or v < seed[0]:
                        seed = (v, counts)
                    if v <= sigma[b] + near_usd:
                        near.append(counts)
                node["near"][b] = near
                found = None
                if parts[b] is not None:
                    found = cheapest_plan(parts[b], lams[b], dict(zip(S, pi[:, ti].tolist(), strict=True)),
                                          dict(zip(S, fx.tolist(), strict=True)), seed)
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
                value += low
                if found[0] < sigma[b] - 1e-7 * max(1.0, abs(sigma[b])):
                    added += add(b, found[1])
            node["bound"] = max(node["bound"], value)
            if not added or node["bound"] >= node["master"] * (1 - tol) or time.perf_counter() >= stop:
                return node["bound"], node

    root = (np.zeros(nS), inv.min(axis=1), np.zeros((nS, nT)), inv.copy())
    out.bound, node = generate(root, t0 + time_limit_s)
    out.master, out.x, out.near = node["master"], node["x"], node["near"]
    if branch and node["x"] is not None:
        out.bound, out.leaf = _branch(generate, root, out.bound, node, d, t0 + time_limit_s)
    out.wall_s = time.perf_counter() - t0
    return out


def _branch(generate, root: tuple, bound: float, node: dict, d: FleetData, stop: float
            ) -> tuple[float, np.ndarray | None]:
    """Branch and price on the node counts, best bound first, within ``stop``: reserved nodes are whole, and so are
    hourly nodes at an optimum (where replicas take whole nodes the least hourly count meeting a whole-node need is
    whole; elsewhere the program makes them integers), so a box's fleets are those of its two halves, below and
    above a fractional node count: the one rounding most USD/day (fraction times the node's cost per day). The bound
    is the least over the boxes left open (each box's own bound valid for the fleets in it); returned with the node
    values of the master of the box that has it.
    """
    nS, nT = len(d.systems), len(d.slices)
    res_c, hr_c, _ = node_costs(d)
    cost = np.r_[res_c, hr_c.ravel()]
    open_: list = [(bound, root, node["x"])]
    while time.perf_counter() < stop:
        open_.sort(key=lambda o: o[0])
        b0, box, x = open_[0]
        v = x[:nS + nS * nT]
        frac = np.minimum(v - np.floor(v + 1e-9), np.ceil(v - 1e-9) - v)
        score = np.where(frac > 1e-6, frac * cost, 0.0)
        if not score.any():
            break  # the least open box has whole node counts: branching on nodes cannot raise it
        i = int(np.argmax(score))
        kids = []
        for side in (0, 1):
            lo_r, hi_r, lo_h, hi_h = (a.copy() for a in box)
            lo, hi = (lo_r, hi_r) if i < nS else (lo_h.ravel(), hi_h.ravel())
            at = i if i < nS else i - nS
            if side == 0:
                hi[at] = math.floor(v[i] + 1e-9)
            else:
                lo[at] = math.ceil(v[i] - 1e-9)
            if lo[at] > hi[at]:
                continue
            kid = (lo_r, hi_r, lo_h, hi_h)
            kb, kn = generate(kid, stop)
            if kb == math.inf:
                continue  # no fleet has its nodes in this box
            kids.append((max(kb, b0), kid, kn["x"]))  # the parent's bound holds in the box too
        open_ = open_[1:] + kids
        if not open_:
            return b0, None
        if any(o[2] is None for o in open_):
            break
    least = min(open_, key=lambda o: o[0])
    return least[0], least[2]


def cheapest_plan(comps: list, lam: float, price: dict, fixed: dict, start: tuple[float, dict] | None = None,
                  node_limit: int = 20000) -> tuple[float, dict] | None:
    """The exact minimum over a class cover set given as components (`formulations.fleet_columns.cover_components`)
    of chips priced per system (``price``) plus a fixed price per system used (``fixed``): depth-first branch and
    bound over the components (each unused or one of its configurations, the largest first), the components in
    order of their best price per request/s, a node's bound its cost plus what it still has to serve at the best
    price per request/s of the components left (fixed prices left out: a lower bound). ``start``: a plan's (cost,
    replicas) to beat (any plan: the minimum returned is then at most the cover set's). Returns (minimum, replicas
    per option), or None when the search passes ``node_limit`` nodes (the caller then solves the cover program).
    """
    tables = []
    for c in comps:
        p = price.get(c.system, 0.0)
        cost, M = (p * c.chips).tolist(), c.M.tolist()
        tables.append((c, M, c.loss.tolist(), cost, min(x / m for x, m in zip(cost, M, strict=True))))
    tables.sort(key=lambda x: x[4])
    suffix = [math.inf] * (len(tables) + 1)
    for i in range(len(tables) - 1, -1, -1):
        suffix[i] = min(suffix[i + 1], tables[i][4])
    best: list = [math.inf, None] if start is None else [start[0], start[1]]
    nodes = [0]
    tol = 1e-9 * max(1.0, lam)

    def search(i: int, served: float, loss: float, paid: float, used: frozenset, chosen: tuple) -> bool:
        nodes[0] += 1
        if nodes[0] > node_limit:
            return False
        if i == len(tables):
            return True
        c, M, L, cost, _ = tables[i]
        extra = 0.0 if c.system in used else fixed.get(c.system, 0.0)
        nxt = suffix[i + 1]
        inner = used | {c.system}
        for n in range(len(M) - 1, -1, -1):  # the largest first: a plan complete early bounds the rest
            p = paid + cost[n] + extra
            if p >= best[0] - tol:
                continue
            s = served + M[n]
            w = loss if loss > L[n] else L[n]
            if s >= lam + w - tol:
                best[0], best[1] = p, chosen + ((i, n),)
            elif p + (lam + w - s) * nxt < best[0] - tol and not search(i + 1, s, w, p, inner, chosen + ((i, n),)):
                return False
        if paid + (lam + loss - served) * nxt < best[0] - tol:
            return search(i + 1, served, loss, paid, used, chosen)
        return True

    if not search(0, 0.0, 0.0, 0.0, frozenset(), ()):
        return None
    if not isinstance(best[1], tuple):  # the start was not beaten (or no plan at all: infinity)
        return best[0], best[1] or {}
    counts: dict = {}
    for i, n in best[1]:
        c = tables[i][0]
        for k, v in zip(c.ks, c.configs[n], strict=True):
            counts[int(k)] = counts.get(int(k), 0) + int(v)
    return best[0], counts
