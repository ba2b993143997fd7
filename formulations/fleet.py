"""Fleet program (Pyomo): reserved and hourly nodes (or racks) per system, and per time slice integer replicas of
each operating point of each (model, class): aggregated replicas, and prefill and decode replicas sized separately
(their ratio free, a prefill pool and a decode pool of one numerics, on one system or on two joined by an
interconnect), under inventory, site power, budget and N+1, at least cost per day. Built from data and returned
unsolved.

Units: a *node* is the system's allocation unit (an 8-GPU server, or a 72-GPU NVL72 rack). Reserved nodes are paid
for every hour of the horizon at the committed price, hourly nodes only in the slices they are rented, at the
on-demand price. A replica whose chips are a power of two dividing the node shares nodes with others (replicas of
such sizes pack nodes exactly, first-fit decreasing); any other replica occupies its own whole nodes.

How it scales (the choices, each exact):
- Replicas of one option are interchangeable: one integer count per option and slice, never a binary per replica;
  options another option matches in no more chips (a whole multiple of it) are dropped before building
  (`FleetData.reduced`), and slices of equal demand and inventory are one slice weighted by their count
  (`FleetData.merged`), so no two columns or rows describe the same choice.
- N+1 is spare capacity per class and slice: the demand is still served with any one replica in use down. An
  aggregated replica's failure takes its rate, a prefill or decode replica's leaves its pool the rest of its rate,
  so the class's headroom (served less demand) covers its largest aggregated replica in use and, per pool, what the
  pool hands off beyond what is left of it (`add_spare`). Each largest rate in use is one of its group's distinct
  option rates: ordered level binaries (one per distinct rate; each fleet has one representation) mark the largest
  reached. For classes served by aggregated replicas the disjunction over the largest rate is also written as its
  convex hull (`add_hull`), so a relaxation buying a fraction of a large replica pays for the spare it implies.
- Reserved nodes are integers; hourly nodes are continuous on systems whose replicas all occupy whole nodes (there
  the least hourly count meeting the whole-node need is an integer, so nothing is rounded) and integers where
  replicas share nodes.
- Valid inequalities from the demand: per class and slice, each side's replica count is at least the demand over
  the side's largest rate, rounded up, plus one with N+1 (`add_covers`); the system-in-use binaries exist only where
  a system has a fixed cost, with the tightest node bound the demand allows.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import numpy as np
import pandas as pd
import pyomo.environ as pyo

ROLES = ("both", "prefill", "decode")
OPTION_COLUMNS = ("model", "cls", "system", "role", "group", "chips", "requests_per_s", "kv_bytes")
"""Per option: the class it serves, its system, its role (aggregated ``both``, ``prefill`` or ``decode``), its
numerics group (a prefill pool feeds a decode pool of the same group), its chips, its requests/s at its TTFT and
TPOT targets, and the KV bytes one request hands from prefill to decode (0 for aggregated replicas)."""


@dataclass
class FleetData:
    """Everything the fleet program needs, as plain tables."""

    systems: pd.DataFrame  # index system: node_chips, reserved_usd_per_node_h, hourly_usd_per_node_h,
    # power_per_node_w, fixed_usd_per_day, optionally interconnect_bytes_per_s (KV bytes/s each way between this
    # system's pools and other systems' pools; absent or 0: its prefill and decode pools pair only with each other)
    inventory: pd.DataFrame  # rows system, columns slice: nodes available
    options: pd.DataFrame  # OPTION_COLUMNS
    demand: pd.DataFrame  # rows (model, cls), columns slice: requests/s
    slice_h: float = 1.0
    power_cap_w: float | None = None
    budget_usd_per_day: float | None = None
    n_plus_one: bool = True
    meta: dict = field(default_factory=dict)
    weight: dict | None = None  # slices each slice stands for (`merged`); 1 each when None

    def __post_init__(self) -> None:
        o = self.options
        if "role" not in o:
            o = o.assign(role="both")
        if "group" not in o:
            o = o.assign(group=0)
        if "kv_bytes" not in o:
            o = o.assign(kv_bytes=0.0)
        bad = sorted(set(o["role"]) - set(ROLES))
        if bad:
            raise ValueError(f"option roles must be one of {ROLES}, got {bad}")
        self.options = o.reset_index(drop=True)
        if "interconnect_bytes_per_s" not in self.systems:
            self.systems = self.systems.assign(interconnect_bytes_per_s=0.0)

    @property
    def slices(self) -> list:
        return list(self.demand.columns)

    @property
    def weights(self) -> pd.Series:
        return pd.Series({t: float((self.weight or {}).get(t, 1)) for t in self.slices})

    @property
    def classes(self) -> list[tuple[str, str]]:
        return list(self.demand.index)

    def footprint(self) -> np.ndarray:
        """Chips each option's replica occupies: its chips where they are a power of two dividing the node (such
        replicas share nodes and pack them exactly), else the chips of the whole nodes it spans.
        """
        chips = self.options["chips"].to_numpy(dtype=np.int64)
        node = self.systems.loc[self.options["system"], "node_chips"].to_numpy(dtype=np.int64)
        shared = (chips & (chips - 1) == 0) & (node % np.maximum(chips, 1) == 0)
        return np.where(shared, chips, -(-chips // node) * node)

    def shares_nodes(self) -> pd.Series:
        """Per system: whether some option's replicas share nodes (then hourly nodes must be integers)."""
        node = self.systems.loc[self.options["system"], "node_chips"].to_numpy()
        part = pd.Series(self.footprint() % node != 0, index=self.options.index)
        return part.groupby(self.options["system"]).any().reindex(self.systems.index, fill_value=False)

    def interconnect(self, s: str) -> float:
        v = float(self.systems.loc[s, "interconnect_bytes_per_s"])
        return v if math.isfinite(v) and v > 0 else 0.0

    def spare_levels(self, model: str, cls: str) -> list[float]:
        """The distinct rates of a class's options, ascending: the values its largest replica in use can take."""
        o = self.options
        r = np.sort(o.loc[(o["model"] == model) & (o["cls"] == cls), "requests_per_s"].to_numpy(dtype=float))
        out: list[float] = []
        for v in r:
            if not out or v > out[-1] * (1 + 1e-9):
                out.append(float(v))
        return out

    def upper(self, inventory: bool = True) -> pd.DataFrame:
        """Most replicas of each option worth holding per slice: enough to carry its class's demand plus the largest
        spare on its own (more is never cheaper), within the inventory (unless ``inventory`` is false); 0 where the
        class has no demand.
        """
        o = self.options
        need = self.demand.loc[list(zip(o["model"], o["cls"], strict=True))].to_numpy(dtype=float)
        rate = o["requests_per_s"].astype(float)
        top = rate.groupby([o["model"], o["cls"]]).transform("max").to_numpy() * float(self.n_plus_one)
        r = rate.to_numpy()[:, None]
        by_demand = np.ceil((need + top[:, None]) / r * (1 - 1e-12))
        node = self.systems.loc[o["system"], "node_chips"].to_numpy(dtype=float)[:, None]
        inv = self.inventory.loc[o["system"]].to_numpy(dtype=float) * node
        by_inventory = np.floor(inv / self.footprint()[:, None] + 1e-9)
        u = np.where(need > 0, np.minimum(by_demand, by_inventory) if inventory else by_demand, 0.0)
        return pd.DataFrame(u.astype(np.int64), columns=self.slices)

    def reduced(self) -> FleetData:
        """The same program without options another matches: an option is dropped where another of its class, system
        and role (and numerics, for prefill and decode replicas, which pair by it) has chips dividing its own and,
        repeated to the same chips, at least its rate (those replicas carry as much in no more chips, with no larger
        spare and no more KV per request); of identical options the first is kept. Exact: every fleet using a
        dropped option has an equal or cheaper one without it.
        """
        o, foot = self.options, self.footprint()
        keep = np.ones(len(o), dtype=bool)
        numerics = o["group"].where(o["role"] != "both", -1)  # aggregated replicas pair with nothing
        for _, g in o.groupby([o["model"], o["cls"], o["system"], o["role"], numerics], sort=False):
            idx = g.index.to_numpy()
            for a in idx:
                for b in idx:
                    if a == b or not keep[b]:
                        continue
                    ca, cb = int(o.at[a, "chips"]), int(o.at[b, "chips"])
                    if ca % cb or foot[a] < foot[b] * (ca // cb) or o.at[a, "kv_bytes"] < o.at[b, "kv_bytes"]:
                        continue
                    ra, rb = float(o.at[a, "requests_per_s"]), float(o.at[b, "requests_per_s"])
                    if rb * (ca // cb) >= ra * (1 - 1e-12) and (ca > cb or rb > ra or b < a):
                        keep[a] = False
                        break
        return self._keep(keep)

    def _keep(self, keep: np.ndarray) -> FleetData:
        out = replace(self, options=self.options[keep].reset_index(drop=True), meta=dict(self.meta))
        out.meta["kept_options"] = np.flatnonzero(keep)
        return out

    def merged(self) -> tuple[FleetData, dict]:
        """The same program with slices of equal demand and inventory as one slice weighted by their count, and the
        slice each slice maps to. Exact: given the reserved nodes, slices are independent and equal ones have equal
        optima (the power cap is the same in every slice; the budget bounds their sum).
        """
        rep: dict = {}
        first: dict = {}
        for t in self.slices:
            key = tuple(self.demand[t].round(12)) + tuple(self.inventory[t])
            rep[t] = first.setdefault(key, t)
        keep = list(dict.fromkeys(rep.values()))
        weight = {t: sum(1 for v in rep.values() if v == t) * self.weights[t] for t in keep}
        return replace(self, demand=self.demand[keep], inventory=self.inventory[keep], weight=weight), rep


    def aggregated(self) -> FleetData:
        """The same program with its aggregated options alone (a restriction: no prefill or decode pools)."""
        return self._keep((self.options["role"] == "both").to_numpy())

    def shortlist(self, n: int) -> FleetData:
        """The same program with at most ``n`` options per (class, system, role): those with the fewest footprint
        chips per request/s. A restriction of the space (stated where used), not an exact reduction.
        """
        o = self.options
        score = pd.Series(self.footprint() / o["requests_per_s"].to_numpy(dtype=float), index=o.index)
        keep = score.groupby([o["model"], o["cls"], o["system"], o["role"]], sort=False).rank(method="first") <= n
        return self._keep(keep.to_numpy())


def _index(d: FleetData, elastic: bool = False) -> dict:
    """Index lists the blocks share: options per (class, role), per (class, numerics, role, system), per system;
    the prefill and decode pools that can hand off (``P``, ``Q``); the replica bounds ``up`` (0 for a pool that
    has no pool to hand off to or take from).
    """
    o = d.options
    cls_of = {c: j for j, c in enumerate(d.classes)}
    j_of = np.array([cls_of.get((a, b), -1) for a, b in zip(o["model"], o["cls"], strict=True)])
    by_role: dict = {}
    by_pool: dict = {}
    by_sys: dict = {s: [] for s in d.systems.index}
    for k, (j, role, g, s) in enumerate(zip(j_of, o["role"], o["group"], o["system"], strict=True)):
        if j < 0:
            continue
        by_role.setdefault((j, role), []).append(k)
        if role != "both":
            by_pool.setdefault((j, int(g), role, s), []).append(k)
        by_sys[s].append(k)
    flows_p, flows_q = [], []
    for (j, g, role, s) in by_pool:
        mate = "decode" if role == "prefill" else "prefill"
        if not any(kk[0] == j and kk[1] == g and kk[2] == mate for kk in by_pool):
            continue  # a prefill pool with no decode pool of its numerics anywhere (or the reverse) serves nothing
        if d.interconnect(s) <= 0 and (j, g, mate, s) not in by_pool:
            continue  # no interconnect and no mate on its own system
        (flows_p if role == "prefill" else flows_q).append((j, g, s))
    up = np.array(d.upper(inventory=not elastic).to_numpy(), dtype=np.int64)
    live = set(flows_p) | set(flows_q)
    for (j, g, _, s), ks in by_pool.items():
        if (j, g, s) not in live:
            up[ks, :] = 0
    return {"j_of": j_of, "by_role": by_role, "by_pool": by_pool, "by_sys": by_sys, "P": flows_p, "Q": flows_q,
            "up": up, "t": {t: i for i, t in enumerate(d.slices)}}


def add_nodes_variables(m: pyo.ConcreteModel, d: FleetData, elastic: bool = False) -> None:
    """Nodes: reserved integers; hourly continuous where every replica occupies whole nodes (the least hourly count
    meeting a whole-node need is then an integer), integers where replicas share nodes; the system-in-use binaries
    of systems with a fixed cost. The inventory bounds them, except in the elastic program, where the inventory is
    a soft limit (`add_nodes`' shortfall) and the nodes are unbounded above.
    """
    inv = d.inventory
    m.S = pyo.Set(initialize=list(d.systems.index))
    m.T = pyo.Set(initialize=d.slices)
    m.K = pyo.Set(initialize=range(len(d.options)))
    m.J = pyo.Set(initialize=range(len(d.classes)))
    shared = d.shares_nodes()
    m.reserved = pyo.Var(m.S, domain=pyo.NonNegativeIntegers,
                         bounds=lambda _, s: (0, None if elastic else int(inv.loc[s].min())))
    m.hourly = pyo.Var(m.S, m.T, domain=lambda _, s, t: pyo.NonNegativeIntegers if shared[s] else
                       pyo.NonNegativeReals, bounds=lambda _, s, t: (0, None if elastic else int(inv.loc[s, t])))
    fixed = [s for s in d.systems.index if float(d.systems.loc[s, "fixed_usd_per_day"]) > 0]
    m.SU = pyo.Set(initialize=fixed)
    m.used = pyo.Var(m.SU, domain=pyo.Binary)


def add_replicas(m: pyo.ConcreteModel, ix: dict) -> None:
    """Replicas per option and slice: integer counts (replicas of one option are interchangeable)."""
    up, ti = ix["up"], ix["t"]
    m.x = pyo.Var(m.K, m.T, domain=pyo.NonNegativeIntegers, bounds=lambda _, k, t: (0, int(up[k, ti[t]])))


def add_demand(m: pyo.ConcreteModel, d: FleetData, ix: dict) -> None:
    """Each (model, class) demand is served in each slice by its aggregated replicas plus the requests its prefill
    pools hand to its decode pools (each pool within its replicas' rate; a pool on a system with an interconnect may
    send to or take from other systems' pools of its numerics), with N+1 (`add_spare`).
    """
    o = d.options
    rate = o["requests_per_s"].to_numpy(dtype=float)
    m.FP = pyo.Set(initialize=ix["P"], dimen=3)
    m.FQ = pyo.Set(initialize=ix["Q"], dimen=3)
    need = d.demand.to_numpy(dtype=float)
    tix = {t: i for i, t in enumerate(d.slices)}
    top = {j: d.spare_levels(*c)[-1] + max(need[j]) if d.spare_levels(*c) else 0.0 for j, c in enumerate(d.classes)}
    m.p = pyo.Var(m.FP, m.T, domain=pyo.NonNegativeReals, bounds=lambda _, j, g, s, t: (0, top[j]))
    m.q = pyo.Var(m.FQ, m.T, domain=pyo.NonNegativeReals, bounds=lambda _, j, g, s, t: (0, top[j]))

    def pool(j, g, role, s, t):
        return sum(float(rate[k]) * m.x[k, t] for k in ix["by_pool"].get((j, g, role, s), []))

    m.prefill_pool = pyo.Constraint(m.FP, m.T, rule=lambda _, j, g, s, t: m.p[j, g, s, t]
                                    <= pool(j, g, "prefill", s, t))
    m.decode_pool = pyo.Constraint(m.FQ, m.T, rule=lambda _, j, g, s, t: m.q[j, g, s, t]
                                   <= pool(j, g, "decode", s, t))
    pairs = sorted({(j, g) for j, g, _ in ix["P"]} & {(j, g) for j, g, _ in ix["Q"]})
    m.JG = pyo.Set(initialize=pairs, dimen=2)

    def balance(_, j, g, t):
        """Requests prefilled are requests decoded, per class and numerics."""
        return (sum(m.p[j, g, s, t] for jj, gg, s in ix["P"] if (jj, gg) == (j, g))
                == sum(m.q[j, g, s, t] for jj, gg, s in ix["Q"] if (jj, gg) == (j, g)))

    m.balance = pyo.Constraint(m.JG, m.T, rule=balance)

    def same_system(_, j, g, s, t):
        """Without an interconnect a system's prefill pool hands off to its own decode pool only."""
        if d.interconnect(s) > 0 or (j, g, s) not in m.FQ:
            return pyo.Constraint.Skip
        return m.p[j, g, s, t] == m.q[j, g, s, t]

    m.same_system = pyo.Constraint(m.FP, m.T, rule=same_system)

    def headroom(j, t):
        """Requests/s served beyond the demand."""
        agg = sum(float(rate[k]) * m.x[k, t] for k in ix["by_role"].get((j, "both"), []))
        return agg + sum(m.p[j, g, s, t] for jj, g, s in ix["P"] if jj == j) - float(need[j, tix[t]])

    spare = add_spare(m, d, ix, bool(ix["hull"]))
    m.demand = pyo.Constraint(m.J, m.T, rule=lambda _, j, t: pyo.Constraint.Skip if need[j, tix[t]] <= 0
                              else headroom(j, t) >= spare(("both", j), t))
    if not d.n_plus_one:
        return

    def pool_spare(_, role, j, g, s, t):
        """A pool's largest replica fails: what the pool hands off (or takes) beyond what is left of it comes out of
        the class's headroom.
        """
        if need[j, tix[t]] <= 0:
            return pyo.Constraint.Skip
        flow = m.p[j, g, s, t] if role == "prefill" else m.q[j, g, s, t]
        return headroom(j, t) >= flow - pool(j, g, role, s, t) + spare((role, j, g, s), t)

    keys = [("prefill",) + k for k in ix["P"]] + [("decode",) + k for k in ix["Q"]] if not ix.get("lean") else []
    m.PS = pyo.Set(initialize=keys, dimen=4)
    m.pool_spare = pyo.Constraint(m.PS, m.T, rule=pool_spare)


def add_spare(m: pyo.ConcreteModel, d: FleetData, ix: dict, hull: bool):
    """N+1: served requests still cover the demand when any one replica in use fails. An aggregated replica's
    failure takes its rate from the class, so the class's headroom (served less demand) covers its largest
    aggregated replica in use. A prefill (decode) replica's failure leaves its pool with the rest of its rate, so the
    headroom covers what the pool hands off (takes) beyond that (`add_demand`): exact where pools pair on one
    system; across an interconnect a failed pool's share is not rerouted, which never overstates what is left.

    Per spare group (a class's aggregated options; each prefill or decode pool) and slice, its distinct option rates
    r_1 < r_2 < ... are its levels; binary ``level[g, l, t]`` says a replica of rate r_l or more is in use, ordered (a
    level implies the ones below it, so each fleet has one representation), an option's replicas need their level,
    and the spare is the sum of the increments r_l - r_(l-1) of the levels reached (r_0 = 0). A class served by
    aggregated replicas only has one in use whenever it has demand, so its first level is always reached: its spare
    starts at r_1. The largest level reached is the group's *mode* (level l less level l+1). Returns spare(key, t)
    as an expression, key ("both", class) or (role, class, numerics, system).
    """
    o = d.options
    rate = o["requests_per_s"].to_numpy(dtype=float)
    role = o["role"].to_numpy()
    if not d.n_plus_one:
        return lambda key, t: 0.0
    up, ti = ix["up"], ix["t"]
    need = d.demand.to_numpy(dtype=float)
    split = {int(ix["j_of"][k]) for k in m.K if role[k] != "both"}
    groups = {("both", j): ix["by_role"].get((j, "both"), []) for j in m.J}
    groups.update({(r, j, g, sy): ix["by_pool"][(j, g, r, sy)] for r, j, g, sy in
                   [("prefill",) + k for k in ix["P"]] + [("decode",) + k for k in ix["Q"]]})
    gid = {key: i for i, key in enumerate(groups)}
    rates: dict = {}  # (group id, t): [r_0, r_1, ...], r_0 = 0 unless the first level is always reached
    level_of: dict = {}  # (k, t): the level of option k in slice t
    for key, ks in groups.items():
        always = key[0] == "both" and key[1] not in split
        if ix.get("lean") and not always:
            continue
        for t in d.slices:
            live = [k for k in ks if up[k, ti[t]] > 0]
            if not live or need[int(ix["j_of"][live[0]]), ti[t]] <= 0:
                continue
            lv: list[float] = [] if always else [0.0]
            for v in sorted(rate[k] for k in live):
                if not lv or v > lv[-1] * (1 + 1e-9):
                    lv.append(float(v))
            rates[(gid[key], t)] = lv
            for k in live:
                level_of[(k, t)] = next(i for i, v in enumerate(lv) if rate[k] <= v * (1 + 1e-9))
    m.spare_rates = rates  # read back by a warm start
    m.spare_group = gid
    idx = [(g, li, t) for (g, t), lv in rates.items() for li in range(1, len(lv))]
    m.L = pyo.Set(initialize=idx, dimen=3)
    m.level = pyo.Var(m.L, domain=pyo.Binary)
    m.level_order = pyo.Constraint(m.L, rule=lambda _, g, li, t: pyo.Constraint.Skip if li == 1
                                   else m.level[g, li, t] <= m.level[g, li - 1, t])
    group_of = {k: gid[key] for key, ks in groups.items() for k in ks}
    hulled = {gid[("both", j)] for j in ix["hull"]}

    def link(_, k, t):
        """A replica of an option needs its rate's level."""
        li = level_of.get((k, t), 0)
        if li == 0 or (hull and group_of[k] in hulled):
            return pyo.Constraint.Skip
        return m.x[k, t] <= int(up[k, ti[t]]) * m.level[group_of[k], li, t]

    m.level_link = pyo.Constraint(m.K, m.T, rule=link)

    def reached(g, li, t):
        n = len(rates[(g, t)])
        return 1.0 if li == 0 else (m.level[g, li, t] if li < n else 0.0)

    def mode(j, li, t):
        g = gid[("both", j)]
        return reached(g, li, t) - reached(g, li + 1, t)

    if hull:
        add_hull(m, d, ix, {(j, t): rates[(gid[("both", j)], t)] for j in ix["hull"] for t in d.slices
                            if (gid[("both", j)], t) in rates}, level_of, mode)

    def spare(key, t):
        lv = rates.get((gid.get(key, -1), t))
        if not lv:
            return 0.0
        g = gid[key]
        return lv[0] + sum((lv[li] - lv[li - 1]) * m.level[g, li, t] for li in range(1, len(lv)))

    return spare


def add_hull(m: pyo.ConcreteModel, d: FleetData, ix: dict, rates: dict, level_of: dict, mode) -> None:
    """For the classes served by aggregated replicas only (``ix["hull"]``), the disjunction over the largest rate in
    use (the mode, `add_spare`) also written in its convex-hull form (Balas): per mode a copy of the class's replicas
    at or below its rate (continuous; they sum to the integer replicas), carrying the demand plus the mode's rate,
    at least one replica at the mode's rate and, counted, at least ceil(demand / rate) + 1 replicas. A relaxation
    that buys a fraction of a large replica then pays for the spare that replica implies. Valid for every fleet
    whose mode is its largest rate in use, and each fleet has one.
    """
    o = d.options
    rate = o["requests_per_s"].to_numpy(dtype=float)
    up, ti = ix["up"], ix["t"]
    need = d.demand.to_numpy(dtype=float)
    copies = [(k, li, t) for (k, t), lk in level_of.items() if int(ix["j_of"][k]) in ix["hull"]
              for li in range(lk, len(rates[(int(ix["j_of"][k]), t)]))]
    m.HC = pyo.Set(initialize=copies, dimen=3)
    m.y = pyo.Var(m.HC, domain=pyo.NonNegativeReals)
    of: dict = {}
    per_mode: dict = {}
    for k, li, t in copies:
        of.setdefault((k, t), []).append(li)
        per_mode.setdefault((int(ix["j_of"][k]), li, t), []).append(k)
    m.HS = pyo.Set(initialize=sorted(of), dimen=2)
    m.hull_sum = pyo.Constraint(m.HS, rule=lambda _, k, t: m.x[k, t] == sum(m.y[k, li, t] for li in of[(k, t)]))
    rows_bound, rows_side, rows_count, rows_top = [], [], [], []
    for (j, li, t), ks in per_mode.items():
        lam, r = float(need[j, ti[t]]), rates[(j, t)][li]
        w = mode(j, li, t)
        for k in ks:
            rows_bound.append((m.y[k, li, t], min(int(up[k, ti[t]]), math.ceil((lam + r) / rate[k] * (1 - 1e-12))), w))
        rows_top.append(([m.y[k, li, t] for k in ks if level_of[(k, t)] == li], w))
        rows_side.append(([(rate[k], m.y[k, li, t]) for k in ks], lam + r, w))
        rows_count.append(([m.y[k, li, t] for k in ks], math.ceil(lam / r - 1e-9) + 1, w))
    m.hull_bound = pyo.Constraint(range(len(rows_bound)), rule=lambda _, i: rows_bound[i][0]
                                  <= rows_bound[i][1] * rows_bound[i][2])
    m.hull_top = pyo.Constraint(range(len(rows_top)), rule=lambda _, i: sum(rows_top[i][0]) >= rows_top[i][1])
    m.hull_side = pyo.Constraint(range(len(rows_side)), rule=lambda _, i: sum(a * y for a, y in rows_side[i][0])
                                 >= rows_side[i][1] * rows_side[i][2])
    m.hull_count = pyo.Constraint(range(len(rows_count)), rule=lambda _, i: sum(rows_count[i][0])
                                  >= rows_count[i][1] * rows_count[i][2])


def add_covers(m: pyo.ConcreteModel, d: FleetData, ix: dict) -> None:
    """Valid inequalities from the demand: per class and slice, the prefill side (aggregated and prefill replicas)
    and the decode side (aggregated and decode replicas) each carry the demand plus the spare, which is at least the
    side's largest rate in use; so each side's replica count is at least the demand over the side's largest rate,
    rounded up, plus one with N+1 (the demand alone without).
    """
    o = d.options
    rate = o["requests_per_s"].to_numpy(dtype=float)
    up, ti = ix["up"], ix["t"]
    rows = []
    for j, c in enumerate(d.classes):
        agg = ix["by_role"].get((j, "both"), [])
        for role in ("prefill", "decode"):
            side = agg + ix["by_role"].get((j, role), [])
            if not ix["by_role"].get((j, role)) and role == "decode":
                continue  # aggregated only: one side
            for t in d.slices:
                lam = float(d.demand.loc[c, t])
                ks = [k for k in side if up[k, ti[t]] > 0]
                if lam <= 0 or not ks:
                    continue
                n = math.ceil(lam / max(rate[k] for k in ks) - 1e-9) + (1 if d.n_plus_one else 0)
                rows.append((ks, t, max(n, 1)))
    m.CV = pyo.Set(initialize=range(len(rows)))
    m.cover = pyo.Constraint(m.CV, rule=lambda _, i: sum(m.x[k, rows[i][1]] for k in rows[i][0]) >= rows[i][2])
    add_capacity_covers(m, d, ix, [(ks, t, float(d.demand.loc[d.classes[int(ix["j_of"][ks[0]])], t]))
                                   for ks, t, _ in rows if ix.get("lean") or int(ix["j_of"][ks[0]]) not in ix["hull"]])


def add_capacity_covers(m: pyo.ConcreteModel, d: FleetData, ix: dict, sides: list) -> None:
    """Valid inequalities in units of capacity, one per class, slice and side (``sides``: (the side's options, slice,
    demand)), each with the systems in use.

    A side's rate (the aggregated replicas' plus its pools') bounds what the class serves, before and after any one
    of the side's replicas fails; so with N+1 it is at least the demand plus the largest rate in use on the side:
    sum_k r_k x_k >= demand + max r_k over the options in use. Every option in use has r_k at most that maximum, so
    sum_k r_k / (demand + r_k) x_k >= 1 (without N+1, sum_k r_k / demand x_k >= 1): each replica pays for its own
    share of the spare, which the level binaries' big-M links leave a relaxation free to skip. The share a system
    contributes is counted at most once per system, and only where the system is in use (its binary, where it has a
    fixed cost): v_s <= min(share on s, used_s), sum_s v_s >= 1; a relaxation then pays at least one system's fixed
    cost per class. Measured on `scripts/bench_fleet.py`'s disaggregated 5 models x 12 slices: the linear relaxation
    rises from 11,870 to 13,688 USD/day (the best fleet known costs 15,161). Written for the classes with pools; a
    class served by aggregated replicas alone has its hull (`add_hull`), which the covers tighten little while
    slowing SCIP's search (aggregated 1 model x 6 slices: 3.3 to 11.7 CPU s), except in the lean relaxation, which
    has no search.
    """
    o = d.options
    rate = o["requests_per_s"].to_numpy(dtype=float)
    sys_of = o["system"].to_numpy()
    spare = 1.0 if d.n_plus_one else 0.0
    fixed = set(m.SU)
    share = {}
    caps: list = []
    for i, (ks, _, _) in enumerate(sides):
        by_sys: dict = {}
        for k in ks:
            by_sys.setdefault(sys_of[k] if sys_of[k] in fixed else None, []).append(k)
        share[i] = by_sys
        caps += [(i, s) for s in by_sys if s is not None]
    m.CC = pyo.Set(initialize=range(len(sides)))
    m.CCS = pyo.Set(initialize=caps, dimen=2)
    m.cover_share = pyo.Var(m.CCS, bounds=(0, 1))

    def part(i, ks):
        lam, t = sides[i][2], sides[i][1]
        return sum(float(rate[k] / (lam + spare * rate[k])) * m.x[k, t] for k in ks)

    m.cover_part = pyo.Expression(m.CCS, rule=lambda _, i, s: part(i, share[i][s]))  # read back by a warm start
    m.cover_share_rate = pyo.Constraint(m.CCS, rule=lambda _, i, s: m.cover_share[i, s] <= m.cover_part[i, s])
    m.cover_share_used = pyo.Constraint(m.CCS, rule=lambda _, i, s: m.cover_share[i, s] <= m.used[s])
    m.cover_rate = pyo.Constraint(m.CC, rule=lambda _, i: sum(m.cover_share[i, s] for s in share[i] if s is not None)
                                  + (part(i, share[i][None]) if None in share[i] else 0.0) >= 1)


def add_nodes(m: pyo.ConcreteModel, d: FleetData, ix: dict) -> None:
    """Replicas occupy nodes: per system and slice, the chips of the reserved plus hourly nodes hold the replicas'
    footprints; within inventory, and only on systems in use where a system carries a fixed cost.
    """
    foot = d.footprint()
    nc = d.systems["node_chips"]

    def hold(_, s, t):
        ks = ix["by_sys"][s]
        if not ks:
            return pyo.Constraint.Skip
        return sum(int(foot[k]) * m.x[k, t] for k in ks) <= int(nc[s]) * (m.reserved[s] + m.hourly[s, t])

    m.hold = pyo.Constraint(m.S, m.T, rule=hold)
    up = ix["up"]
    most = {s: max(1, math.ceil(float((up[ix["by_sys"][s]] * foot[ix["by_sys"][s], None]).sum(axis=0).max(initial=0))
                                / int(nc[s]))) for s in d.systems.index}

    def inventory(_, s, t):
        if s in m.SU:
            cap = float(min(d.inventory.loc[s, t], most[s]))
            return m.reserved[s] + m.hourly[s, t] <= cap * m.used[s] + _slack(m, "short_nodes", (s, t))
        return m.reserved[s] + m.hourly[s, t] <= float(d.inventory.loc[s, t]) + _slack(m, "short_nodes", (s, t))

    m.inventory = pyo.Constraint(m.S, m.T, rule=inventory)
    # a replica needs its system in use: per option the tightest link (valid; the rows above alone let a relaxation
    # pay a sliver of a fixed cost for a system it uses)
    ti = {t: i for i, t in enumerate(d.slices)}
    sys_of = d.options["system"].to_numpy()
    pairs = [(k, t) for s in m.SU for k in ix["by_sys"][s] for t in d.slices if up[k, ti[t]] > 0
             and not ix.get("lean")]
    m.in_use = pyo.Constraint(pairs, rule=lambda _, k, t: m.x[k, t] <= int(up[k, ti[t]]) * m.used[sys_of[k]])


def handoff_bytes(d: FleetData) -> dict:
    """KV bytes one request hands from a prefill to a decode pool, per (class index, numerics group): the most of
    the class's prefill and decode options of that numerics (on any system).
    """
    o = d.options
    cls = {c: j for j, c in enumerate(d.classes)}
    kv: dict = {}
    for mod, c, role, g, b in zip(o["model"], o["cls"], o["role"], o["group"], o["kv_bytes"], strict=True):
        if role != "both" and (mod, c) in cls:
            key = (cls[(mod, c)], int(g))
            kv[key] = max(kv.get(key, 0.0), float(b))
    return kv


def add_interconnect(m: pyo.ConcreteModel, d: FleetData, ix: dict) -> None:
    """KV hand-offs between systems: per system with an interconnect and slice, the KV bytes/s its prefill pools
    send to other systems' decode pools (the excess of what it prefills over what it decodes, per class and
    numerics) stays within its interconnect, and so do the bytes/s its decode pools take from other systems.
    """
    kv = handoff_bytes(d)
    sides = sorted({(j, g, s) for j, g, s in ix["P"] + ix["Q"] if d.interconnect(s) > 0})
    if not sides:
        return
    m.X = pyo.Set(initialize=sides, dimen=3)
    m.send = pyo.Var(m.X, m.T, domain=pyo.NonNegativeReals)
    m.take = pyo.Var(m.X, m.T, domain=pyo.NonNegativeReals)
    fp, fq = set(ix["P"]), set(ix["Q"])

    def p(j, g, s, t):
        return m.p[j, g, s, t] if (j, g, s) in fp else 0.0

    def q(j, g, s, t):
        return m.q[j, g, s, t] if (j, g, s) in fq else 0.0

    m.send_def = pyo.Constraint(m.X, m.T, rule=lambda _, j, g, s, t: m.send[j, g, s, t]
                                >= p(j, g, s, t) - q(j, g, s, t))
    m.take_def = pyo.Constraint(m.X, m.T, rule=lambda _, j, g, s, t: m.take[j, g, s, t]
                                >= q(j, g, s, t) - p(j, g, s, t))
    lines = sorted({s for _, _, s in sides})
    m.SX = pyo.Set(initialize=lines)

    def out(_, s, t):  # as a share of the interconnect (bytes/s over bytes/s: a well-scaled row)
        return sum(kv[(j, g)] / d.interconnect(s) * m.send[j, g, ss, t] for j, g, ss in sides if ss == s) <= 1.0

    def into(_, s, t):
        return sum(kv[(j, g)] / d.interconnect(s) * m.take[j, g, ss, t] for j, g, ss in sides if ss == s) <= 1.0

    m.kv_out = pyo.Constraint(m.SX, m.T, rule=out)
    m.kv_in = pyo.Constraint(m.SX, m.T, rule=into)


def add_power(m: pyo.ConcreteModel, d: FleetData) -> None:
    """The site's all-in power in every slice stays within its cap (nodes held draw power whether busy or not)."""
    if d.power_cap_w is None:
        return
    p = d.systems["power_per_node_w"]
    m.power = pyo.Constraint(m.T, rule=lambda _, t: sum(float(p[s]) * (m.reserved[s] + m.hourly[s, t]) for s in m.S)
                             <= d.power_cap_w + _slack(m, "short_power_w", t))


def cost_expr(m: pyo.ConcreteModel, d: FleetData):
    sy, w = d.systems, d.weights
    hours = d.slice_h * float(w.sum())
    return (sum(float(sy.loc[s, "reserved_usd_per_node_h"]) * hours * m.reserved[s] for s in m.S)
            + sum(float(sy.loc[s, "hourly_usd_per_node_h"]) * d.slice_h * float(w[t]) * m.hourly[s, t]
                  for s in m.S for t in m.T)) * (24.0 / hours) + sum(
        float(sy.loc[s, "fixed_usd_per_day"]) * m.used[s] for s in m.SU)


HULLS = ("none", "aggregated")

ELASTIC = 1e7
"""Penalty per node, per kW and per thousand USD of shortfall in the elastic program (diagnosis only)."""


def _slack(m: pyo.ConcreteModel, name: str, index):
    """A shortfall variable of the elastic program (0 in the real one)."""
    block = getattr(m, name, None)
    if block is None:
        return 0
    return block[index]


def build(d: FleetData, elastic: bool = False, hull: str = "aggregated", lean: bool = False) -> pyo.ConcreteModel:
    """The fleet program: minimize USD per day (a horizon other than 24 h is scaled to a day). With ``elastic``,
    inventory, power and budget may be exceeded at a large penalty: the shortfalls name what binds. ``hull``
    (`HULLS`): ``aggregated`` writes the N+1 modes of the classes with aggregated options only in their convex-hull
    form too (`add_hull`), ``none`` does not.

    ``lean`` builds a relaxation for its bound alone (its optimum is at most the program's): the classes with pools
    keep their capacity covers (`add_capacity_covers`) but lose their spare levels, the pools' N+1 rows and the
    options' system-in-use rows. In a linear relaxation those rows add next to nothing over the covers (big-M links
    a fraction of a replica satisfies): `scripts/bench_fleet.py`'s disaggregated 5 models x 12 slices relaxes to
    13,556 USD/day in 1.9 CPU s where the whole program's relaxation gives 13,688 in 7.2 (mixed 10 x 24: 42,141 in
    14 CPU s, against 42,170 in 48).
    """
    if hull not in HULLS:
        raise ValueError(f"hull '{hull}' is not allowed; allowed: {', '.join(HULLS)}")
    m = pyo.ConcreteModel("fleet")
    if elastic:
        m.short_nodes = pyo.Var(list(d.systems.index), d.slices, domain=pyo.NonNegativeReals)
        m.short_power_w = pyo.Var(d.slices, domain=pyo.NonNegativeReals)
        m.short_usd = pyo.Var([None], domain=pyo.NonNegativeReals)
    ix = _index(d, elastic)
    ix["lean"] = lean
    split = {int(ix["j_of"][k]) for k in range(len(d.options)) if d.options["role"].iat[k] != "both"}
    ix["hull"] = set() if hull == "none" else {j for j in range(len(d.classes)) if j not in split}
    add_nodes_variables(m, d, elastic)
    add_replicas(m, ix)
    add_demand(m, d, ix)
    add_covers(m, d, ix)
    add_nodes(m, d, ix)
    add_interconnect(m, d, ix)
    add_power(m, d)
    add_objective(m, d)
    return m


def relax_replicas(m: pyo.ConcreteModel, replicas: bool = True) -> pyo.ConcreteModel:
    """The node relaxation of a program built by `build` (the program or its lean relaxation), in place.

    Replica counts (unless ``replicas`` is false) and the N+1 level binaries become continuous within their bounds;
    reserved nodes, hourly nodes (every system's) and the system-in-use binaries are integers. Its optimum is at most
    the program's, so its proven optimum, or a solver's dual bound on it (never its incumbent), bounds the program:

    - every row is the program's, and relaxing an integer domain to an interval only adds points;
    - hourly nodes made integer where the program has them continuous (systems whose replicas all occupy whole
      nodes) remove no optimum: there, for whole replica counts, the hold row's left side is a whole number n of
      nodes, so the least hourly count meeting it, max(0, n - reserved), is whole; lowering the hourly nodes to it
      keeps every other row (inventory, power and budget bound them from above) and costs no more (no price is
      negative). So the program has an optimal fleet with whole hourly nodes, and that fleet is a point here.

    It keeps the rounding of whole nodes per system and slice and the fixed price of each system in use, which
    carry the program's gap over its linear relaxation: on `scripts/bench_fleet.py`'s aggregated 1 model x 24
    slices the program's linear relaxation gives 3,837 USD/day (the lean program's 3,874), the lean program's node
    relaxation 4,076, the program's optimum.
    """
    for v in m.x.values() if replicas else ():
        v.domain = pyo.NonNegativeReals
    for v in getattr(m, "level", {}).values():
        v.domain = pyo.UnitInterval
    for v in m.hourly.values():
        v.domain = pyo.NonNegativeIntegers
    return m


def add_objective(m: pyo.ConcreteModel, d: FleetData) -> None:
    """USD per day (within the budget), plus the elastic program's penalties."""
    m.cost_per_day = pyo.Expression(expr=cost_expr(m, d))
    if d.budget_usd_per_day is not None:
        m.budget = pyo.Constraint(expr=m.cost_per_day <= d.budget_usd_per_day + _slack(m, "short_usd", None))
    penalty = 0
    if getattr(m, "short_nodes", None) is not None:  # the elastic program
        penalty = ELASTIC * (sum(m.short_nodes.values()) + sum(v / 1e3 for v in m.short_power_w.values())
                             + sum(v / 1e3 for v in m.short_usd.values()))
    m.cost = pyo.Objective(expr=m.cost_per_day + penalty, sense=pyo.minimize)


def build_plans(d: FleetData, plans: list[tuple[int, object, dict[int, int]]], flows: list | None = None
                ) -> pyo.ConcreteModel:
    """The fleet program restricted to given plans: each class with demand in a slice takes exactly one of its
    plans there (``plans``: (class index, slice, replicas per option), each meeting the class's demand with N+1 on
    its own); nodes, inventory, power, budget and cost as in `build`. ``flows``: per plan its hand-offs, (numerics
    group, system, requests/s its prefill pool hands off, requests/s its decode pool takes); where they differ on a
    system, the difference crosses its interconnect, and per system and slice the KV bytes/s the chosen plans send
    out (and take in) stay within it (`add_interconnect`'s rows). Its optimum is a fleet of the full program, no
    cheaper than the full program's optimum.
    """
    m = pyo.ConcreteModel("fleet_plans")
    add_nodes_variables(m, d)
    m.P = pyo.Set(initialize=range(len(plans)))
    m.plan = pyo.Var(m.P, domain=pyo.Binary)
    mine: dict = {}
    uses: dict = {}
    for i, (j, t, counts) in enumerate(plans):
        mine.setdefault((j, t), []).append(i)
        for k, n in counts.items():
            uses.setdefault((k, t), []).append((n, i))
    m.JT = pyo.Set(initialize=sorted(mine, key=str), dimen=2)
    m.one_plan = pyo.Constraint(m.JT, rule=lambda _, j, t: sum(m.plan[i] for i in mine[(j, t)]) == 1)
    m.x = pyo.Expression(m.K, m.T, rule=lambda _, k, t: sum(n * m.plan[i] for n, i in uses.get((k, t), [])))
    up = np.zeros((len(d.options), len(d.slices)), dtype=np.int64)
    ti = {t: i for i, t in enumerate(d.slices)}
    for (k, t), lst in uses.items():
        up[k, ti[t]] = max(n for n, _ in lst)
    by_sys = {s: [k for k in range(len(d.options)) if d.options["system"].iat[k] == s] for s in d.systems.index}
    add_nodes(m, d, {"up": up, "by_sys": by_sys})
    kv = handoff_bytes(d)
    lines: dict = {}  # (system, slice, out or in) -> [(share of the interconnect, plan)]
    for i, ((j, t, _), flow) in enumerate(zip(plans, flows or [[] for _ in plans], strict=True)):
        for g, s, p, q in flow:
            if abs(p - q) > 1e-12 * max(1.0, p, q):
                share = kv[(j, int(g))] * abs(p - q) / d.interconnect(s)
                lines.setdefault((s, t, "out" if p > q else "in"), []).append((share, i))
    m.L = pyo.Set(initialize=sorted(lines, key=str), dimen=3)
    m.kv_line = pyo.Constraint(m.L, rule=lambda _, s, t, way: sum(v * m.plan[i] for v, i in lines[(s, t, way)]) <= 1)
    add_power(m, d)
    add_objective(m, d)
    return m
