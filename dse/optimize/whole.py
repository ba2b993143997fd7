"""Whole deployments: integer replicas of each pool within a budget of GPUs or nodes, or for a demand, or both,
costed as deployed.

A pool option is one replica configuration with its chips, its USD/s and its capacity, the requests/s one replica
serves while meeting the workload's targets: an aggregated replica at its batch, a prefill replica at the highest
utilisation its TTFT target allows (servers x rho / service time), a decode replica at its batch. A deployment is
x replicas of one aggregated option, or x replicas of a prefill option and y of a decode option of the same
pairing group (weights and KV formats, and the hardware vendor: `numerics_group`). It serves R = min(x a, y b)
requests/s (x a aggregated), or the demand Lambda when one is stated (R >= Lambda must then hold), and costs
x U + y V USD/s: every chip counts, busy or idle, so its USD per request as deployed is (x U + y V) / R.

The questions, each answered exactly over every option and every replica count:

- a budget (N GPUs or nodes) and no demand: the least USD per request as deployed among deployments within the
  budget; among equal costs (`dse.optimize.ties`: within a relative 1e-12) the lower TPOT, then the lower TTFT,
  then the one serving the most requests/s (copies of one deployment cost the same per request at the same TPOT
  and TTFT: the most copies fill the budget), then the fewer GPUs;
- a demand, within a budget if one is stated: the least USD/s serving the demand; among equal costs the lower
  TPOT, the lower TTFT, then the fewest GPUs (nodes).

Method: enumeration of replica counts, with two reductions that lose no optimum.

1. Dominated options. Within a pairing group (and, for a node budget, among systems of one node size), an option
   with no fewer chips, no less USD/s, no more capacity and no lower TPOT or TTFT figures (``PoolOptions.keys``)
   than another is never needed: swapping it for the other in any deployment keeps the deployment within the
   budget, serving as much for no more, no slower. Options are compared pairwise.
2. Replica counts. Aggregated: every x costs U / a per request, so within a budget the answer is each option's
   largest x; for a demand its x is ceil(Lambda / a). Disaggregated with a demand: x = ceil(Lambda / a) and
   y = ceil(Lambda / b), the fewest that serve it, and every (prefill, decode) pair of a group is enumerated.
   Disaggregated in a budget: for a fixed y the cost (x U + y V) / min(x a, y b) falls with x while the prefill
   pool binds (x a <= y b) and rises once the decode pool binds, so the best x is floor(y b / a) or one more,
   clipped to [1, the most the remaining budget holds]; every y from 1 to the most the budget holds is
   enumerated for each pair, pairs in increasing order of their fluid cost U / a + V / b, which no whole
   deployment of the pair beats, until that bound exceeds the k-th best deployment found (branch and bound with
   an exact bound).

`tests/test_whole_deployments.py` checks every question against a brute force over every decode batch, prefill
option and replica count of random small spaces, sharing no code with this module.

A node is a host of the option's system, the catalog's ``chips_per_node`` (an 8-GPU server, a GB200 compute tray
of 4); a system with no sourced host size is left out of a node budget. Replicas of one pool share nodes where
they fit (floor(node / chips) per node), a replica larger than a node takes ceil(chips / node) whole nodes, and
the two pools of a deployment do not share nodes.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from dse.errors import InfeasibleError
from dse.optimize.requests import (
    BlockOptima,
    DisaggregatedResult,
    DisaggregatedTables,
    RequestResult,
    aggregated_result,
    disaggregated_results,
    first_min_per_block,
    numerics_group,
    per_pair,
    prefill_capacity,
    ranked,
    ranked_disaggregated,
)
from dse.optimize.serving import SOLVER_NAME
from dse.optimize.solver import SolveResult
from dse.optimize.space import Space
from dse.optimize.ties import TIE, tie_order
from dse.physics.serving import prefill_ttft

PRUNE_ROWS = 512
"""Options compared at once with all others of their group by `prune` (a block of rows x options x figures)."""
EXPANDED = 1 << 21
"""(pair, y) evaluations held at once by the disaggregated budget search."""
SOLVER = f"{SOLVER_NAME} per block, then enumeration of whole replica counts (pruned by the fluid bound)"
"""How a whole deployment is found: each block's batch by the argmin over every batch, then the replica counts."""


@dataclass(frozen=True)
class Budget:
    """At most ``gpus`` GPUs, or at most ``nodes`` nodes (scale-up domains), per deployment."""

    gpus: int | None = None
    nodes: int | None = None

    def __post_init__(self) -> None:
        if (self.gpus is None) == (self.nodes is None):
            raise ValueError(f"a budget states gpus or nodes, exactly one, got gpus={self.gpus}, nodes={self.nodes}")

    @property
    def limit(self) -> int:
        return int(self.gpus if self.gpus is not None else self.nodes)

    @property
    def unit(self) -> str:
        return "GPUs" if self.gpus is not None else "nodes"

    def text(self) -> str:
        return f"{self.limit:,} {self.unit}"


@dataclass
class PoolOptions:
    """The replica configurations one pool may use, one per row: ``chips`` per replica, ``node`` (chips per node
    of its system), ``system`` (an index), ``usd_s`` per replica, ``rate`` (requests/s one replica serves at the
    targets, as the search judges it), ``group`` (pairing group: `numerics_group`) and ``ref`` (the caller's index
    of the option). For equal costs (`dse.optimize.ties`): ``tpot`` and ``ttft`` of a replica (0 where the pool
    sets neither), ``ttft_at`` (a prefill pool's TTFT at options ``ref`` run at a share of their planned
    utilisation) and ``keys`` (per option, figures that never worsen a deployment's TPOT or TTFT when lower, with
    the chips, USD/s and capacity: what `prune` must also compare; default ``tpot`` and ``ttft``).
    """

    chips: np.ndarray
    node: np.ndarray
    system: np.ndarray
    usd_s: np.ndarray
    rate: np.ndarray
    group: np.ndarray
    ref: np.ndarray
    tpot: np.ndarray | None = None
    ttft: np.ndarray | None = None
    keys: np.ndarray | None = None
    ttft_at: Callable[[np.ndarray, np.ndarray], np.ndarray] | None = None

    def __post_init__(self) -> None:
        self.chips = np.asarray(self.chips, dtype=np.int64)
        self.node = np.asarray(self.node, dtype=np.int64)
        self.system = np.asarray(self.system, dtype=np.int64)
        self.usd_s = np.asarray(self.usd_s, dtype=np.float64)
        self.rate = np.asarray(self.rate, dtype=np.float64)
        self.group = np.asarray(self.group, dtype=np.int64)
        self.ref = np.asarray(self.ref, dtype=np.int64)
        zero = np.zeros(len(self.chips))
        self.tpot = zero if self.tpot is None else np.asarray(self.tpot, dtype=np.float64)
        self.ttft = zero if self.ttft is None else np.asarray(self.ttft, dtype=np.float64)
        keys = np.stack([self.tpot, self.ttft], axis=1) if self.keys is None else self.keys
        self.keys = np.asarray(keys, dtype=np.float64)

    def __len__(self) -> int:
        return len(self.chips)

    def take(self, idx: np.ndarray) -> PoolOptions:
        return PoolOptions(*(getattr(self, k)[idx] for k in ("chips", "node", "system", "usd_s", "rate", "group",
                                                             "ref", "tpot", "ttft", "keys")), ttft_at=self.ttft_at)

    def ttft_of(self, k: np.ndarray, share: np.ndarray) -> np.ndarray:
        """TTFT of options ``k`` (positions) run at ``share`` of their planned utilisation (their ``ttft`` where the
        pool has no ``ttft_at``).
        """
        if self.ttft_at is None:
            return self.ttft[k]
        return self.ttft_at(self.ref[k], share)


@dataclass(frozen=True)
class Deployment:
    """A whole deployment: ``pools`` as (option ref, replicas), prefill first for a disaggregated one; the USD/s of
    all its chips and the requests/s it serves (its capacity, or the demand) as the search judged them (its USD per
    request as deployed is their ratio), its GPUs and nodes.
    """

    pools: tuple[tuple[int, int], ...]
    usd_s: float
    rate: float
    gpus: int
    nodes: int


def nodes_for(replicas: np.ndarray | int, chips: np.ndarray | int, node: np.ndarray | int) -> np.ndarray:
    """Nodes ``replicas`` replicas of ``chips`` chips take on nodes of ``node`` chips: floor(node / chips) per node
    where one fits in a node, else ceil(chips / node) nodes each.
    """
    x, c, g = (np.asarray(v, dtype=np.int64) for v in (replicas, chips, node))
    g = np.maximum(g, 1)
    per_node = np.maximum(g // np.maximum(c, 1), 1)
    return np.where(c <= g, -(-x // per_node), x * (-(-c // g)))


def racks_of(pools: list[dict], domain: Callable[[str], int]) -> int:
    """Scale-up domains (racks, 8-GPU nodes) a deployment's pools take: per pool, `nodes_for` its ``replicas`` of
    ``chips`` on domains of its ``system``'s size (``domain``); replicas of one pool share a domain where several fit
    in it, pools do not share one (an upper bound where two pools' replicas could fill one domain together).
    """
    return int(sum(int(nodes_for(p["replicas"], p["chips"], domain(p["system"]))) for p in pools))


def _units(budget: Budget | None, replicas: np.ndarray, chips: np.ndarray, node: np.ndarray) -> np.ndarray:
    """What ``replicas`` replicas take of the budget (GPUs, or nodes; GPUs without a budget)."""
    if budget is not None and budget.nodes is not None:
        return nodes_for(replicas, chips, node)
    return np.asarray(replicas, dtype=np.int64) * np.asarray(chips, dtype=np.int64)


def _most(budget: Budget, left: np.ndarray, chips: np.ndarray, node: np.ndarray) -> np.ndarray:
    """The most replicas of ``chips`` chips that ``left`` units of the budget hold (0 where none)."""
    left = np.maximum(np.asarray(left, dtype=np.int64), 0)
    c, g = np.asarray(chips, dtype=np.int64), np.maximum(np.asarray(node, dtype=np.int64), 1)
    if budget.nodes is not None:
        return np.where(c <= g, left * (g // np.maximum(c, 1)), left // (-(-c // g)))
    return left // c


def prune(o: PoolOptions, by_node: bool = False, ties: bool = True) -> PoolOptions:
    """The options no other option of their group dominates (`_undominated`: no more chips, no more USD/s, no less
    capacity, and less USD/s or no larger ``keys``, so no deployment with the other is costlier, slower or larger;
    of equal ones the first); with
    ``by_node`` (a node budget) only options on nodes of one size are compared, and those of a system with no node
    size (0) are left out; with ``ties`` false, the ``keys`` are not compared (what the cost alone needs).
    Pairwise, in blocks of `PRUNE_ROWS` rows.
    """
    ok = np.flatnonzero(np.isfinite(o.rate) & (o.rate > 0) & np.isfinite(o.usd_s) & ((o.node > 0) | (not by_node)))
    if not len(ok):
        return o.take(ok)
    out = []
    side = o.node if by_node else np.zeros(len(o), dtype=np.int64)
    for g in np.unique(np.stack([o.group[ok], side[ok]]), axis=1).T:
        idx = ok[(o.group[ok] == g[0]) & (side[ok] == g[1])]
        # columns where less is better: chips, USD/s, -capacity, the tie keys
        v = np.column_stack([o.chips[idx], o.usd_s[idx], -o.rate[idx], *([o.keys[idx]] if ties else [])])
        # first within each (system, chips), then across them: dominance is transitive, so no survivor is lost
        bucket = np.unique(np.stack([o.system[idx], o.chips[idx]]), axis=1, return_inverse=True)[1].ravel()
        kept = np.concatenate([k[_undominated(v[k])] for k in (np.flatnonzero(bucket == b)
                                                                for b in range(bucket.max() + 1))])
        kept = np.sort(kept)
        out.append(idx[kept[_undominated(v[kept])]])
    return o.take(np.sort(np.concatenate(out)))


def _undominated(v: np.ndarray) -> np.ndarray:
    """Rows of ``v`` (chips, USD/s, -capacity, then the tie keys: less is better) no other row dominates, compared
    in blocks of `PRUNE_ROWS` rows. A row is dominated by one with no more chips, no more USD/s and no less capacity
    that either costs less per second (beyond `TIE`: swapping it in makes every deployment strictly cheaper, so
    the row can neither win nor tie) or has no larger tie keys (smaller somewhere, or the same row earlier).
    """
    dominated = np.zeros(len(v), dtype=bool)
    for s in range(0, len(v), PRUNE_ROWS):
        rows = v[s:s + PRUNE_ROWS]
        weak = (v[None, :, :3] <= rows[:, None, :3]).all(axis=2)
        cheaper = v[None, :, 1] < rows[:, None, 1] * (1 - TIE)
        keys = (v[None, :, 3:] <= rows[:, None, 3:]).all(axis=2)
        strict = (v[None, :, :] < rows[:, None, :]).any(axis=2)
        earlier = np.arange(len(v))[None, :] < np.arange(s, s + len(rows))[:, None]
        dominated[s:s + len(rows)] = (weak & (cheaper | (keys & (strict | earlier)))).any(axis=1)
    return ~dominated


def _best_first(cost: np.ndarray, top: int, *keys: np.ndarray) -> np.ndarray:
    """Indices of the ``top`` best of ``cost`` (`tie_order`: equal costs by ``keys`` in turn, least first)."""
    return tie_order(cost, *keys)[:top]


def aggregated(o: PoolOptions, budget: Budget | None, demand: float | None, top: int = 1) -> list[Deployment]:
    """The ``top`` best whole deployments of one aggregated option each (see the module's questions)."""
    o = prune(o, budget is not None and budget.nodes is not None)
    if not len(o):
        return []
    if demand is not None:
        x = np.ceil(demand / o.rate * (1 - 1e-12)).astype(np.int64)
        units = _units(budget, x, o.chips, o.node)
        fits = np.ones(len(o), dtype=bool) if budget is None else units <= budget.limit
        usd = np.where(fits, x * o.usd_s, np.inf)
        rate = np.full(len(o), float(demand))
        picks = _best_first(usd, top, o.tpot, o.ttft, x * o.chips, units)
    else:
        if budget is None:
            raise ValueError("a whole deployment needs a budget or a demand")
        x = _most(budget, np.full(len(o), budget.limit), o.chips, o.node)
        rate = x * o.rate
        per_request = np.where(x >= 1, o.usd_s / o.rate, np.inf)
        picks = _best_first(per_request, top, o.tpot, o.ttft, -rate, x * o.chips)
    gpus = x * o.chips
    nodes = nodes_for(x, o.chips, o.node)
    return [Deployment(((int(o.ref[k]), int(x[k])),), float(x[k] * o.usd_s[k]), float(rate[k]), int(gpus[k]),
                       int(nodes[k])) for k in picks]


def disaggregated(pre: PoolOptions, dec: PoolOptions, budget: Budget | None, demand: float | None,
                  top: int = 1) -> list[Deployment]:
    """The ``top`` best whole deployments of a prefill option and a decode option of one pairing group each (see
    the module's questions), best first.

    In a budget, a first search over the options pruned on chips, USD/s and capacity alone (no tie keys: fewer
    options) sets a bar: its ``top``-th best cost is at least the ``top``-th best over all options (it searches a
    subset of them), so the search over the options the tie keys keep skips every pair whose fluid cost exceeds it.
    """
    by_node = budget is not None and budget.nodes is not None
    bar = math.inf
    if demand is None and budget is not None:
        quick = _pairs(prune(pre, by_node, ties=False), prune(dec, by_node, ties=False), budget, None, top, bar)
        if len(quick) >= top:
            bar = quick[-1][0]
    return [f[2] for f in _pairs(prune(pre, by_node), prune(dec, by_node), budget, demand, top, bar)]


def _pairs(pre: PoolOptions, dec: PoolOptions, budget: Budget | None, demand: float | None, top: int, bar: float
           ) -> list[tuple[float, tuple, Deployment]]:
    """The ``top`` best deployments of pruned options, group by group (in a budget, none whose pair's fluid cost
    exceeds ``bar``).
    """
    found: list[tuple[float, tuple, Deployment]] = []
    for g in np.intersect1d(pre.group, dec.group):
        p, d = pre.take(np.flatnonzero(pre.group == g)), dec.take(np.flatnonzero(dec.group == g))
        if demand is not None:
            found += _for_demand(p, d, budget, float(demand), top)
        else:
            if budget is None:
                raise ValueError("a whole deployment needs a budget or a demand")
            found += _in_budget(p, d, budget, top, bar=found[top - 1][0] if len(found) >= top else bar)
        found = _distinct_best(found, top)
    return found


def _distinct_best(found: list[tuple[float, tuple, Deployment]], top: int) -> list[tuple[float, tuple, Deployment]]:
    """The ``top`` best of ``found`` (cost, tie keys, deployment): `tie_order`."""
    if not found:
        return found
    cost = np.array([f[0] for f in found])
    keys = np.array([f[1] for f in found], dtype=np.float64).T
    return [found[i] for i in _best_first(cost, top, *keys)]


def _ties(p: PoolOptions, d: PoolOptions, j: np.ndarray, i: np.ndarray, x: np.ndarray, y: np.ndarray,
          rate: np.ndarray, budget: bool = False, units: np.ndarray | None = None) -> np.ndarray:
    """The tie keys (rows) of deployments of ``x`` prefill replicas of options ``j`` and ``y`` decode replicas of
    options ``i`` serving ``rate``: TPOT, TTFT at the prefill pool's utilisation, then for a demand the GPUs and
    ``units`` (GPUs or nodes), in a budget the most requests/s and then the GPUs (`disaggregated`).
    """
    ttft = p.ttft_of(j, rate / (x * p.rate[j]))
    gpus = x * p.chips[j] + y * d.chips[i]
    last = (-rate, gpus) if budget else (gpus, units)
    return np.column_stack([d.tpot[i], ttft, *last])


def _deployment(p: PoolOptions, d: PoolOptions, j: int, i: int, x: int, y: int, rate: float) -> Deployment:
    gpus = x * int(p.chips[j]) + y * int(d.chips[i])
    nodes = int(nodes_for(x, p.chips[j], p.node[j]) + nodes_for(y, d.chips[i], d.node[i]))
    return Deployment(((int(p.ref[j]), x), (int(d.ref[i]), y)), x * float(p.usd_s[j]) + y * float(d.usd_s[i]),
                      rate, gpus, nodes)


def _for_demand(p: PoolOptions, d: PoolOptions, budget: Budget | None, demand: float, top: int
                ) -> list[tuple[float, float, Deployment]]:
    """Every (prefill, decode) pair of one group at the fewest replicas serving ``demand``."""
    x = np.ceil(demand / p.rate * (1 - 1e-12)).astype(np.int64)
    y = np.ceil(demand / d.rate * (1 - 1e-12)).astype(np.int64)
    xu, yu = _units(budget, x, p.chips, p.node), _units(budget, y, d.chips, d.node)
    usd = (x * p.usd_s)[:, None] + (y * d.usd_s)[None, :]
    units = xu[:, None] + yu[None, :]
    if budget is not None:
        usd = np.where(units <= budget.limit, usd, np.inf)
    jj, ii = np.divmod(np.arange(usd.size), len(d))
    keys = _ties(p, d, jj, ii, x[jj], y[ii], np.full(usd.size, demand), units=units.ravel())
    out = []
    for k in _best_first(usd.ravel(), top, *keys.T):
        j, i = int(jj[k]), int(ii[k])
        out.append((float(usd.ravel()[k]), tuple(keys[k]), _deployment(p, d, j, i, int(x[j]), int(y[i]), demand)))
    return out


def _in_budget(p: PoolOptions, d: PoolOptions, budget: Budget, top: int, bar: float
               ) -> list[tuple[float, float, Deployment]]:
    """Each (prefill, decode) pair of one group at its best replica counts within the budget, pairs taken in
    increasing fluid cost until it exceeds the ``top``-th best found (``bar``: the best already found elsewhere).
    """
    n = budget.limit
    j, i = np.meshgrid(np.arange(len(p)), np.arange(len(d)), indexing="ij")
    j, i = j.ravel(), i.ravel()
    room = n - _units(budget, np.ones(len(j), dtype=np.int64), p.chips[j], p.node[j])
    ymax = _most(budget, room, d.chips[i], d.node[i])
    keep = ymax >= 1
    j, i, ymax = j[keep], i[keep], ymax[keep]
    fluid = p.usd_s[j] / p.rate[j] + d.usd_s[i] / d.rate[i]  # no whole deployment of the pair costs less
    order = np.argsort(fluid, kind="stable")
    j, i, ymax, fluid = j[order], i[order], ymax[order], fluid[order]
    best: list[tuple[float, float, Deployment]] = []
    start = 0
    while start < len(j):
        if fluid[start] > bar * (1 + TIE):
            break
        stop = start + max(1, int(np.searchsorted(np.cumsum(ymax[start:]), EXPANDED)))
        cj, ci, cy = j[start:stop], i[start:stop], ymax[start:stop]
        start = stop
        pair = np.repeat(np.arange(len(cj)), cy)
        y = np.arange(len(pair)) - np.repeat(np.cumsum(cy) - cy, cy) + 1
        pj, di = cj[pair], ci[pair]
        a, b = p.rate[pj], d.rate[di]
        xmax = _most(budget, n - _units(budget, y, d.chips[di], d.node[di]), p.chips[pj], p.node[pj])
        lo = np.floor(y * b / a).astype(np.int64)
        # for a fixed y the cost falls with x while the prefill pool binds and rises once the decode pool does: the
        # best x is lo or lo + 1, both kept (equal costs are decided by the tie keys)
        x = np.concatenate([np.clip(lo, 1, xmax), np.clip(lo + 1, 1, xmax)])
        pair, y, pj, di = (np.concatenate([v, v]) for v in (pair, y, pj, di))
        rate = np.minimum(x * p.rate[pj], y * d.rate[di])
        cost = (x * p.usd_s[pj] + y * d.usd_s[di]) / rate
        keys = _ties(p, d, pj, di, x, y, rate, budget=True)
        # per pair: its least cost, then among costs within TIE of it the tie keys in turn
        low = np.full(len(cj), np.inf)
        np.minimum.at(low, pair, cost)
        near = cost <= low[pair] * (1 + TIE)
        k = np.lexsort((*keys.T[::-1], ~near, pair))
        head = np.ones(len(k), dtype=bool)
        head[1:] = pair[k[1:]] != pair[k[:-1]]
        heads = k[head]
        for e in heads[tie_order(cost[heads], *keys[heads].T)[:top]]:  # the chunk's ``top`` best pairs
            best.append((float(cost[e]), tuple(keys[e]), _deployment(p, d, int(pj[e]), int(di[e]), int(x[e]),
                                                                     int(y[e]), float(rate[e]))))
        best = _distinct_best(best, top)
        if len(best) >= top:
            bar = min(bar, best[top - 1][0])
    return best


# ---- the options of a searched space, and the results of its whole deployments -------------------------------
def _node(space: Space, system_idx: np.ndarray) -> np.ndarray:
    """Chips per node (host) of each system, 0 where the catalog has no sourced figure."""
    return np.array([space.systems[int(k)].chips_per_node or 0 for k in system_idx], dtype=np.int64)


def aggregated_options(space: Space, opt: BlockOptima, mask: np.ndarray | None = None) -> PoolOptions:
    """Each feasible block of the aggregated search at its cheapest batch (also its most requests/s), its capacity
    judged at the search's margins; ``ref`` is the block's position.
    """
    ok = opt.n > 0 if mask is None else (opt.n > 0) & mask
    j = np.flatnonzero(ok)
    si = opt.blocks["system_idx"][j]
    rate = opt.metrics["requests_per_s"][j] / np.broadcast_to(per_pair(opt.margins, space, j)[0], j.shape)
    chips = opt.blocks["chips"][j]
    return PoolOptions(chips, _node(space, si), si, opt.metrics["usd_per_s"][j], rate, np.zeros(len(j)), j,
                       opt.metrics["tpot_s"][j], opt.metrics["ttft_s"][j])


def decode_options(space: Space, t: DisaggregatedTables, mask: np.ndarray | None = None) -> PoolOptions:
    """Per block, the decode pair the tables kept that fits, meets the TPOT target and serves the most requests/s
    (its cheapest per request; ``ref``: its index there). A lower batch of the block could serve a deployment whose
    prefill pool binds at the same cost and a lower TPOT: it is not offered (no whole deployment needs it).
    """
    ok = t.dok if mask is None else t.dok & mask[t.dpos]
    i = first_min_per_block(t.dpos, np.where(ok, -t.dm["requests_per_s"], np.inf))
    pos = t.dpos[i]
    si = space.blocks["system_idx"][pos]
    rate = t.dm["requests_per_s"][i] / np.broadcast_to(per_pair(t.margins, space, pos)[0], i.shape)
    return PoolOptions(space.blocks["chips"][pos], _node(space, si), si, t.dm["usd_per_s"][i], rate,
                       numerics_group(space, pos), i, tpot=t.dm["tpot_s"][i])


def prefill_options_of(space: Space, t: DisaggregatedTables, mask: np.ndarray | None = None) -> PoolOptions:
    """Every prefill option meeting the TTFT target (as the tables judge it) at its planned utilisation."""
    pre = t.searched_pre
    ok = pre.ok if mask is None else pre.ok & mask[pre.pos]
    j = np.flatnonzero(ok)
    si = space.blocks["system_idx"][pre.pos[j]]
    rate = prefill_capacity(pre, j) / np.broadcast_to(per_pair(t.margins, space, pre.pos[j])[0], j.shape)
    service, transfer, req = pre.metrics["prefill_service_s"], pre.metrics["kv_transfer_s"], space.served(t.req)
    tau = pre.metrics["stack_latency_s"]

    def ttft_at(ref: np.ndarray, share: np.ndarray) -> np.ndarray:  # at a utilisation rho x share
        return prefill_ttft(service[ref], transfer[ref], tau[ref], pre.rho[ref] * share, req)

    # TTFT at a deployment's rate R on x replicas: rho = rho_planned R / (x rate) grows with rho_planned / rate (the
    # hand-off and the stack's latency add alike)
    keys = np.column_stack([service[j], transfer[j] + tau[j], pre.rho[j] / rate])
    return PoolOptions(pre.metrics["chips"][j], _node(space, si), si, pre.metrics["usd_per_s"][j], rate,
                       numerics_group(space, pre.pos[j]), j, ttft=ttft_at(j, np.ones(len(j))), keys=keys,
                       ttft_at=ttft_at)


def _result(d: Deployment, objective: float, t0: float) -> SolveResult:
    return SolveResult("optimal", "enumeration", objective, objective, 0.0, time.perf_counter() - t0, SOLVER)


def whole_aggregated(space: Space, opt: BlockOptima, budget: Budget | None, demand: float | None,
                     mask: np.ndarray | None = None, top: int = 1) -> list[RequestResult]:
    """The ``top`` best whole aggregated deployments (``demand`` in output tokens/s), best first; InfeasibleError
    names what runs out when there is none.
    """
    t0 = time.perf_counter()
    lam = None if demand is None else demand / space.workload.output
    options = aggregated_options(space, opt, mask)
    if not len(options):
        ranked(space, opt, 1, mask)  # no feasible configuration: its diagnosis names the binding limit
    found = aggregated(options, budget, lam, top)
    if not found:
        raise InfeasibleError(_shortfall(space, "aggregated", budget, demand, options, None))
    out = []
    for d in found:
        (j, x), = d.pools
        obj = d.usd_s / d.rate
        out.append(aggregated_result(space, opt, j, _result(d, obj, t0), x, demand, whole=True))
    return out


def whole_disaggregated(space: Space, t: DisaggregatedTables, budget: Budget | None, demand: float | None,
                        mask: np.ndarray | None = None, top: int = 1) -> list[DisaggregatedResult]:
    """The ``top`` best whole disaggregated deployments (``demand`` in output tokens/s), best first;
    InfeasibleError names what runs out when there is none.
    """
    t0 = time.perf_counter()
    lam = None if demand is None else demand / space.workload.output
    pre, dec = prefill_options_of(space, t, mask), decode_options(space, t, mask)
    if not len(np.intersect1d(pre.group, dec.group)):
        ranked_disaggregated(space, t, 1, mask)  # no feasible pair of pools: its diagnosis names the binding limit
    found = disaggregated(pre, dec, budget, lam, top)
    if not found:
        raise InfeasibleError(_shortfall(space, "disaggregated", budget, demand, pre, dec))
    pools = [d.pools for d in found]  # ((j, x), (i, y)): prefill option j, x replicas; decode pair i, y replicas
    return disaggregated_results(space, t, np.array([i for _, (i, _) in pools]), np.array([j for (j, _), _ in pools]),
                                 [_result(d, d.usd_s / d.rate, t0) for d in found],
                                 [(x, y) for (_, x), (_, y) in pools], demand, whole=True)


def _shortfall(space: Space, mode: str, budget: Budget | None, demand: float | None, first: PoolOptions,
               second: PoolOptions | None) -> str:
    """Why no whole deployment of ``mode`` exists where feasible configurations do: the budget's shortfall against
    the smallest deployment (one replica of each pool; for a demand, the fewest serving it).
    """
    w = space.workload
    head = f"no whole {mode} deployment of {space.model.id} / {w.name}"
    lam = None if demand is None else demand / w.output
    need = []
    for o in (first, second):
        if o is None:
            continue
        if budget is not None and budget.nodes is not None:
            o = o.take(np.flatnonzero(o.node > 0))
            if not len(o):
                return (f"{head} within the budget of {budget.text()}: no feasible configuration is on a system with "
                        "a sourced host size (chips_per_node in the hardware catalog); state the budget in gpus")
        x = np.ones(len(o), dtype=np.int64) if lam is None else np.ceil(lam / o.rate * (1 - 1e-12)).astype(np.int64)
        need.append(int(_units(budget, x, o.chips, o.node).min()))
    smallest = sum(need)
    what = "one replica of each pool" if lam is None else f"{demand:,.0f} output tokens/s"
    if budget is None:  # pragma: no cover - a demand alone is always met by enough replicas
        return f"{head}: none serves {what}"
    return (f"{head} within the budget of {budget.text()}: {what} needs at least {smallest:,} {budget.unit}, "
            f"{smallest - budget.limit:,} more than the budget")
