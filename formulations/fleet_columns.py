"""The fleet program decomposed by class and slice (Dantzig-Wolfe), as matrices: the *class cover* program of one
(model, class) and slice, whose integer points are the replica vectors serving the class's demand with N+1 on
their own (the program's pricing problem), and the *master* linear program, in which each class and slice takes a
convex combination of such vectors (columns) and pays for the nodes, the systems in use and the power they need.
Built from `formulations.fleet.FleetData` and returned unsolved (scipy's ``milp`` and ``linprog`` forms).

Why: the fleet program's linear relaxation lets a class buy a fraction of a replica and of its N+1 spare; a pool of
a few large replicas then relaxes to a fraction of what whole replicas cost. In the master every class's replicas
are whole and carry their spare, so its optimum (the Dantzig-Wolfe bound) is at least that relaxation's, and at
most the program's optimum: the master is a relaxation of the program (below).

The class cover set (`cover_program`), per class j and slice t with demand lam > 0 (requests/s): integer replicas
x_k <= up_k of the class's options, where A is the aggregated replicas' rate and each *unit* u pairs a prefill pool
(rate cP_u) with a decode pool (rate cD_u): a numerics group on one system, or, where systems have an interconnect,
a numerics group over all of them (hand-offs between those systems free: a superset of what the interconnect
allows). The class serves A + sum_u min(cP_u, cD_u) >= lam, and with N+1 still serves lam when any one replica in
use fails: an aggregated replica of rate r leaves A + sum_u min(cP_u, cD_u) - r, a prefill replica of rate r in u
leaves A + sum_(v != u) min(cP_v, cD_v) + min(cP_u - r, cD_u), and a decode one symmetrically. Every fleet of the
program restricted to one class and slice is in this set (where pools pair on one system it is the program's own
condition: the demand and pool-spare rows with each pool handing off min(cP_u, cD_u), the most it can; across an
interconnect the program keeps hand-offs as planned when a pool fails, which never serves more), so the master,
which also keeps the program's nodes, inventory, power and systems in use but drops the interconnects' bytes/s and
the budget, is a relaxation of the program.

Linear forms: binary z_k marks option k in use (x_k <= up_k z_k), binary y_s marks system s in use (z_k <= y_s);
continuous m_u <= cP_u, m_u <= cD_u; per aggregated option A + sum_u m_u >= lam + r_k z_k; per pool option k of
unit u a continuous a_k <= (its pool's rate) - r_k z_k and <= (the other pool's rate), and A + sum_(v != u) m_v + a_k
>= lam.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import scipy.sparse as sp

from formulations.fleet import FleetData


@dataclass
class CoverProgram:
    """One class cover program in scipy ``milp`` form: minimize price @ x + system_price @ y over rows lo <= A v <=
    hi, bounds lb <= v <= ub, ``integrality`` per variable; the first ``len(ks)`` variables are the replicas of
    options ``ks``, the next ``len(systems)`` after the in-use binaries the systems' in-use binaries (``y_at``).
    """

    ks: np.ndarray
    systems: list
    A: sp.csr_matrix
    lo: np.ndarray
    hi: np.ndarray
    lb: np.ndarray
    ub: np.ndarray
    integrality: np.ndarray
    y_at: int

    def cost(self, price_x: np.ndarray, price_y: np.ndarray) -> np.ndarray:
        """The objective vector: ``price_x`` per replica of each option in ``ks``, ``price_y`` per system used."""
        c = np.zeros(len(self.lb))
        c[:len(self.ks)] = price_x
        c[self.y_at:self.y_at + len(self.systems)] = price_y
        return c


def units_of(d: FleetData, ks: np.ndarray) -> list[tuple[int, str | None]]:
    """The unit each prefill or decode option of ``ks`` belongs to: (numerics group, its system), or (group, None)
    where its system has an interconnect (those systems' pools of one group pair freely).
    """
    o = d.options
    joined = {s: d.interconnect(s) > 0 for s in d.systems.index}
    systems, groups = o["system"].to_numpy()[ks], o["group"].to_numpy()[ks]
    return [(int(g), None if joined[s] else s) for g, s in zip(groups, systems, strict=True)]


def cover_program(d: FleetData, j: int, t, up: np.ndarray) -> CoverProgram | None:
    """The class cover program of class ``j`` in slice ``t`` (module docstring), its replicas bounded by ``up`` (one
    per option of ``d``); None where the class has no demand in the slice.
    """
    o = d.options
    mod, cls = d.classes[j]
    lam = float(d.demand.loc[(mod, cls), t])
    if lam <= 0:
        return None
    ks = np.flatnonzero(((o["model"] == mod) & (o["cls"] == cls)).to_numpy() & (up > 0))
    rate = o["requests_per_s"].to_numpy(dtype=float)[ks]
    role = o["role"].to_numpy()[ks]
    systems = sorted(set(o["system"].iat[k] for k in ks))
    of = units_of(d, ks)
    units = sorted({u for u, r in zip(of, role, strict=True) if r != "both"}, key=str)
    uid = {u: i for i, u in enumerate(units)}
    unit = np.array([uid[u] if r != "both" else -1 for u, r in zip(of, role, strict=True)])
    n, ns, nu = len(ks), len(systems), len(units)
    spare = d.n_plus_one
    pool = np.flatnonzero(role != "both")
    agg = np.flatnonzero(role == "both")
    # variables: x (n), z (n, with N+1), y (ns), m (nu), a (one per pool option, with N+1)
    xz = n if spare else 0
    y0 = n + xz
    m0 = y0 + ns
    a0 = m0 + nu
    nv = a0 + (len(pool) if spare else 0)
    rows, lo, hi = [], [], []

    def row(coefs: dict, low: float, high: float) -> None:
        rows.append(coefs)
        lo.append(low)
        hi.append(high)

    sys_of = {s: i for i, s in enumerate(systems)}
    for i, k in enumerate(ks):
        y = y0 + sys_of[o["system"].iat[k]]
        if spare:  # in use: x <= up z, z <= y
            row({i: 1.0, n + i: -float(up[k])}, -np.inf, 0.0)
            row({n + i: 1.0, y: -1.0}, -np.inf, 0.0)
        else:
            row({i: 1.0, y: -float(up[k])}, -np.inf, 0.0)

    def pool_rate(u: int, r: str) -> dict:
        return {int(i): -float(rate[i]) for i in np.flatnonzero((unit == u) & (role == r))}

    for u in range(nu):  # m_u within each of its pools
        row({m0 + u: 1.0, **pool_rate(u, "prefill")}, -np.inf, 0.0)
        row({m0 + u: 1.0, **pool_rate(u, "decode")}, -np.inf, 0.0)
    served = {int(i): float(rate[i]) for i in agg}
    served.update({m0 + u: 1.0 for u in range(nu)})
    row(served, lam, np.inf)
    if spare:
        for i in agg:  # an aggregated replica down
            row({**served, n + int(i): -float(rate[i])}, lam, np.inf)
        for a, i in enumerate(pool):  # a prefill (decode) replica down: its pool keeps the rest of its rate
            u, mine = int(unit[i]), str(role[i])
            other = "decode" if mine == "prefill" else "prefill"
            row({a0 + a: 1.0, **pool_rate(u, mine), n + int(i): float(rate[i])}, -np.inf, 0.0)
            row({a0 + a: 1.0, **pool_rate(u, other)}, -np.inf, 0.0)
            left = {c: v for c, v in served.items() if c != m0 + u}
            row({**left, a0 + a: 1.0}, lam, np.inf)
    data, ri, ci = [], [], []
    for r_, coefs in enumerate(rows):
        for c, v in coefs.items():
            ri.append(r_)
            ci.append(c)
            data.append(v)
    A = sp.csr_matrix((data, (ri, ci)), shape=(len(rows), nv))
    lb = np.zeros(nv)
    ub = np.full(nv, np.inf)
    ub[:n] = up[ks]
    ub[n:y0 + ns] = 1.0
    integrality = np.zeros(nv, dtype=np.int64)
    integrality[:m0] = 1
    return CoverProgram(ks, systems, A, np.array(lo), np.array(hi), lb, ub, integrality, y0)


@dataclass
class Master:
    """The master linear program in scipy ``linprog`` form over given columns (module docstring): variables the
    reserved nodes per system, the hourly nodes per system and slice, the systems in use (those with a fixed cost),
    then one weight per column; rows ``hold`` (per system and slice: the columns' chips within the nodes' chips),
    ``inventory`` (per system with a fixed cost and slice: nodes only on a system in use), ``link`` (per class,
    slice and system with a fixed cost: the weight of the class's columns using the system at most its in-use
    value), ``power`` (per slice), and ``convex`` (per class and slice: its columns' weights sum to 1).
    """

    c: np.ndarray
    A_ub: sp.csr_matrix
    b_ub: np.ndarray
    A_eq: sp.csr_matrix
    b_eq: np.ndarray
    bounds: np.ndarray  # (variables, 2)
    rows: dict  # name -> slice of A_ub rows
    keys: dict  # name -> list of row keys (hold, inventory: (s, t); link: (block, s); power: t; convex: block)
    n_nodes: int  # columns start here


def node_costs(d: FleetData) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """USD per day of one reserved node per system, one hourly node per system and slice, and each system's fixed
    cost (the fleet program's objective, `formulations.fleet.cost_expr`).
    """
    sy, w = d.systems, d.weights
    hours = d.slice_h * float(w.sum())
    res = sy["reserved_usd_per_node_h"].to_numpy(dtype=float) * 24.0
    hr = np.outer(sy["hourly_usd_per_node_h"].to_numpy(dtype=float), w.to_numpy(dtype=float)) * d.slice_h * 24.0 / hours
    return res, hr, sy["fixed_usd_per_day"].to_numpy(dtype=float)


def master_program(d: FleetData, blocks: list, block_of: np.ndarray, chips: np.ndarray) -> Master:
    """The master over columns given by their block (``block_of``, positions in ``blocks``, the (class, slice) pairs
    with demand) and chips per system (``chips``: columns x ``d.systems``); a column uses the systems it has chips on.
    """
    S, T = list(d.systems.index), d.slices
    nS, nT, nP = len(S), len(T), len(block_of)
    fix_c = d.systems["fixed_usd_per_day"].to_numpy(dtype=float)
    fixed = np.flatnonzero(fix_c > 0)
    fpos = np.full(nS, -1)
    fpos[fixed] = np.arange(len(fixed))
    res_c, hr_c, _ = node_costs(d)
    n_nodes = nS + nS * nT + len(fixed)
    nv = n_nodes + nP
    c = np.concatenate([res_c, hr_c.ravel(), fix_c[fixed], np.zeros(nP)])
    inv = d.inventory.reindex(S).to_numpy(dtype=float)
    bounds = np.zeros((nv, 2))
    bounds[:, 1] = np.inf
    bounds[:nS, 1] = inv.min(axis=1)
    bounds[nS:nS + nS * nT, 1] = inv.ravel()
    bounds[nS + nS * nT:n_nodes, 1] = 1.0
    nc = d.systems["node_chips"].to_numpy(dtype=float)
    tix = {t: i for i, t in enumerate(T)}
    col_t = np.array([tix[blocks[b][1]] for b in block_of], dtype=np.int64)
    si, ti = np.meshgrid(np.arange(nS), np.arange(nT), indexing="ij")
    hold = si.ravel() * nT + ti.ravel()  # hold rows: sum of columns' chips - chips of the nodes <= 0
    ri = [hold, hold]
    ci = [si.ravel(), nS + hold]
    val = [-nc[si.ravel()], -nc[si.ravel()]]
    pn, ps = np.nonzero(chips)
    ri.append(ps * nT + col_t[pn])
    ci.append(n_nodes + pn)
    val.append(chips[pn, ps])
    r = nS * nT
    fs, ft = np.meshgrid(fixed, np.arange(nT), indexing="ij")  # inventory: reserved + hourly <= inventory x in use
    fs, ft = fs.ravel(), ft.ravel()
    inv_rows = r + np.arange(len(fs))
    ri += [inv_rows, inv_rows, inv_rows]
    ci += [fs, nS + fs * nT + ft, nS + nS * nT + fpos[fs]]
    val += [np.ones(len(fs)), np.ones(len(fs)), -inv[fs, ft]]
    r += len(fs)
    on = fpos[ps] >= 0  # link: the weight of a class's columns using a system with a fixed cost <= its in-use value
    pairs, at = np.unique(np.stack([block_of[pn[on]], ps[on]], axis=1), axis=0, return_inverse=True)
    at = np.asarray(at).ravel()
    link_rows = r + np.arange(len(pairs))
    ri += [link_rows, r + at]
    ci += [nS + nS * nT + fpos[pairs[:, 1]] if len(pairs) else np.zeros(0, dtype=np.int64), n_nodes + pn[on]]
    val += [-np.ones(len(pairs)), np.ones(int(on.sum()))]
    r += len(pairs)
    b_ub = np.zeros(r)
    keys = {"hold": [(S[i], T[k]) for i in range(nS) for k in range(nT)],
            "inventory": [(S[i], T[k]) for i, k in zip(fs, ft, strict=True)],
            "link": [(int(b), S[int(i)]) for b, i in pairs], "power": [], "convex": list(blocks)}
    if d.power_cap_w is not None:
        pw = d.systems["power_per_node_w"].to_numpy(dtype=float)
        prow = r + ti.ravel()
        ri += [prow, prow]
        ci += [si.ravel(), nS + hold]
        val += [pw[si.ravel()], pw[si.ravel()]]
        b_ub = np.r_[b_ub, np.full(nT, float(d.power_cap_w))]
        keys["power"] = list(T)
        r += nT
    A_ub = sp.csr_matrix((np.concatenate(val), (np.concatenate(ri), np.concatenate(ci))), shape=(r, nv))
    A_eq = sp.csr_matrix((np.ones(nP), (block_of, n_nodes + np.arange(nP))), shape=(len(blocks), nv))
    rows = {"hold": slice(0, nS * nT), "inventory": slice(nS * nT, nS * nT + len(fs)),
            "link": slice(nS * nT + len(fs), nS * nT + len(fs) + len(pairs)),
            "power": slice(nS * nT + len(fs) + len(pairs), r)}
    return Master(c, A_ub, b_ub, A_eq, np.ones(len(blocks)), bounds, rows, keys, n_nodes)


@dataclass
class Component:
    """Part of a class cover set whose replicas fail alone (module docstring): one aggregated option, or one unit's
    prefill and decode pools. ``configs``: per row the replicas of ``ks``; ``M`` what it serves and ``loss`` what its
    worst single failure takes, both in requests/s and counted up to the demand (`cover_components`); ``chips`` its
    chips on ``system``.
    """

    system: str | None
    ks: np.ndarray
    configs: np.ndarray
    M: np.ndarray
    loss: np.ndarray
    chips: np.ndarray
    usd: np.ndarray | None = None  # priced: USD/day per configuration, already at given prices (system None)
    # `dse.optimize.fleet_bound.cheapest_plan`'s table of its configurations by chips, built once per component
    by_chips: tuple | None = field(default=None, repr=False, compare=False)


@dataclass
class Pooled:
    """A unit whose prefill and decode pools span systems joined by interconnects (`units_of` (group, None)): its
    options, their rates, footprint chips, systems and the most replicas worth holding of each (`_most`), per role.
    Its non-dominated configurations depend on the chips' prices (replicas on different systems), so the pricing
    enumerates them at given prices (`dse.optimize.fleet_bound.priced_pool`).
    """

    ks: dict  # role -> option indices
    rate: dict  # role -> requests/s per replica
    chips: dict  # role -> footprint chips per replica
    system: dict  # role -> system per option
    most: dict  # role -> most replicas of each option


PARETO_BLOCK = 256
"""Rows `pareto` compares pairwise at once (a block of rows in ascending chips, ties kept together); rows in earlier
blocks (fewer chips) enter as the staircase of their (M, left)."""


def pareto(M: np.ndarray, left: np.ndarray, chips: np.ndarray) -> np.ndarray:
    """Rows no other row beats: serving at least as much, as much after its worst failure, in no more chips (or
    USD), one of them strictly (of identical rows the first). In blocks of about `PARETO_BLOCK` rows in ascending
    chips (equal chips in one block), each compared pairwise within itself; a row of an earlier block has fewer
    chips, so it beats a row where it serves as much and as much after a failure (within 1e-12), which the
    staircase of the earlier blocks' (M, left) answers exactly (a row there is beaten on both by one kept).
    """
    n = len(M)
    if n == 0:
        return np.zeros(0, dtype=bool)
    eps = 1e-12
    order = np.argsort(chips, kind="stable")
    sorted_chips = chips[order]
    keep = np.ones(n, dtype=bool)
    st_M, st_L = np.zeros(0), np.zeros(0)  # the staircase: M ascending, left descending
    start = 0
    while start < n:
        end = int(np.searchsorted(sorted_chips, sorted_chips[min(start + PARETO_BLOCK, n) - 1], side="right"))
        at = order[start:end]
        m, lt, ch = M[at], left[at], chips[at]
        ge = (m[None, :] >= m[:, None] - eps) & (lt[None, :] >= lt[:, None] - eps) & (ch[None, :] <= ch[:, None])
        beats = (m[None, :] > m[:, None] + eps) | (lt[None, :] > lt[:, None] + eps) | (ch[None, :] < ch[:, None])
        beaten = (ge & (beats | (at[None, :] < at[:, None]))).any(axis=1)
        if len(st_M):
            k = np.searchsorted(st_M, m - eps, side="left")
            beaten |= (k < len(st_M)) & (st_L[np.minimum(k, len(st_M) - 1)] >= lt - eps)
        keep[at] = ~beaten
        if end < n:
            allM, allL = np.concatenate((st_M, m)), np.concatenate((st_L, lt))
            by = np.lexsort((-allL, -allM))  # M descending, then left descending
            prior = np.maximum.accumulate(np.concatenate(([-np.inf], allL[by][:-1])))
            top = by[allL[by] > prior][::-1]
            st_M, st_L = allM[top], allL[top]
        start = end
    return keep


def _front(cap: np.ndarray, chips: np.ndarray) -> np.ndarray:
    """Positions of the rows no other row beats on (more capacity, fewer chips): by chips, ties largest first, those
    above every capacity before them.
    """
    order = np.lexsort((-cap, chips))
    c = cap[order]
    best = np.maximum.accumulate(np.concatenate(([-np.inf], c[:-1])))
    return order[c > best + 1e-12]


def _pool(rate: np.ndarray, chips: np.ndarray, most: np.ndarray) -> tuple[np.ndarray, ...]:
    """Every replica vector of one pool's options (at least one replica, at most ``most`` of each): (counts, rate, top
    rate, chips), without those another beats (as much rate, no larger top rate, no more chips).
    """
    grids = np.meshgrid(*[np.arange(int(u) + 1) for u in most], indexing="ij")
    n = np.stack([g.ravel() for g in grids], axis=1)[1:]
    cap, ch = n @ rate, n @ chips
    top = np.where(n > 0, rate[None, :], 0.0).max(axis=1)
    keep = np.concatenate([np.flatnonzero(top == v)[_front(cap[top == v], ch[top == v])] for v in np.unique(top)])
    keep = keep[pareto(cap[keep], -top[keep], ch[keep])]
    return n[keep], cap[keep], top[keep], ch[keep]


def _most(rate: np.ndarray, up: np.ndarray, lam: float) -> np.ndarray:
    """Most replicas of each pool option worth a configuration: up to ``up``, and no more than carry lam plus the
    pool's top rate alone (beyond, the pool serves at least lam after any failure, capped values unchanged).
    """
    return np.minimum(up, np.ceil((lam + rate.max()) / rate * (1 - 1e-12))).astype(np.int64)


def cover_components(d: FleetData, j: int, t, up: np.ndarray) -> list[Component | Pooled]:
    """The class cover set of class ``j`` in slice ``t`` as components, each with its non-dominated configurations:
    one per aggregated option (1 to up_k replicas: serves r_k n, r_k (n - 1) after a failure), one per unit pairing
    its prefill and decode pools on one system (serves min(cP, cD); after the failure of a prefill replica of the
    pool's top rate rP, min(cP - rP, cD), of a decode one min(cP, cD - rD)), and, where a unit spans systems (an
    interconnect), its options (`Pooled`): the same service rule, configurations enumerated at the pricing's prices.

    A plan of configurations, one per component used, is in the cover set exactly when, with N+1, for every
    component c used, the others' service plus c's after its worst failure is at least the demand lam (one replica
    fails, in one component), and the service is at least lam; without N+1, the service alone. Every term of those
    sums is non-negative, so a term counts the same capped at lam: ``M`` is the service and ``loss`` the service less
    what is left after the worst failure, both capped at lam, and the condition reads sum M >= lam + max loss.
    Configurations another beats (serving as much, as much after its worst failure, in no more chips) are dropped;
    so are pools more than two top replicas beyond their mate (one replica fewer serves as much, as much after a
    failure, in fewer chips).
    """
    o = d.options
    mod, cls = d.classes[j]
    lam = float(d.demand.loc[(mod, cls), t])
    ks = np.flatnonzero(((o["model"] == mod) & (o["cls"] == cls)).to_numpy() & (up > 0))
    rate = o["requests_per_s"].to_numpy(dtype=float)
    foot = d.footprint().astype(float)
    role = o["role"].to_numpy()
    spare = d.n_plus_one
    out = []
    units: dict = {}

    def add(system, kk, configs, served, left, chips):
        M, left = np.minimum(served, lam), np.minimum(left if spare else served, lam)
        keep = pareto(M, left, chips)
        out.append(Component(system, np.asarray(kk), configs[keep], M[keep], (M - left)[keep], chips[keep]))

    sys_of = o["system"].to_numpy()
    for k, unit in zip(ks, units_of(d, ks), strict=True):
        if role[k] == "both":
            n = np.arange(1, min(int(up[k]), math.ceil(lam / rate[k] * (1 - 1e-12)) + 1) + 1)
            add(sys_of[k], [k], n[:, None], rate[k] * n, rate[k] * (n - 1), foot[k] * n)
        else:
            units.setdefault(unit, {"prefill": [], "decode": []})[role[k]].append(k)
    for (_, s), pools in units.items():
        if not pools["prefill"] or not pools["decode"]:
            continue  # a pool with no mate serves nothing
        kp, kd = np.array(pools["prefill"]), np.array(pools["decode"])
        if s is None:
            out.append(Pooled({"prefill": kp, "decode": kd}, {"prefill": rate[kp], "decode": rate[kd]},
                              {"prefill": foot[kp], "decode": foot[kd]}, {"prefill": sys_of[kp], "decode": sys_of[kd]},
                              {"prefill": _most(rate[kp], up[kp], lam), "decode": _most(rate[kd], up[kd], lam)}))
            continue
        nP, cP, tP, chP = _pool(rate[kp], foot[kp], _most(rate[kp], up[kp], lam))
        nD, cD, tD, chD = _pool(rate[kd], foot[kd], _most(rate[kd], up[kd], lam))
        a, b = np.meshgrid(np.arange(len(cP)), np.arange(len(cD)), indexing="ij")
        a, b = a.ravel(), b.ravel()
        near = (cD[b] <= cP[a] + 2 * tD[b] + 1e-9) & (cP[a] <= cD[b] + 2 * tP[a] + 1e-9)
        a, b = a[near], b[near]
        served = np.minimum(cP[a], cD[b])
        left = np.minimum(np.minimum(cP[a] - tP[a], cD[b]), np.minimum(cP[a], cD[b] - tD[b]))
        add(s, np.r_[kp, kd], np.concatenate([nP[a], nD[b]], axis=1), served, left, chP[a] + chD[b])
    return out
