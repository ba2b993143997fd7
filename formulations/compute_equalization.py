"""Lifetime program (Pyomo): one model of a family pre-trained, post-trained by RL and served, the three phases
sharing one inventory of nodes by system over a horizon of weeks, under site power and a budget, at least total
cost. Built from data and returned unsolved.

Decisions: the model (``zm``: one of the menu, each with the pre-training tokens its quality needs and the RL tokens
its recipe asks); the pre-training layout (``y``: one of the physics' layouts, on whole nodes, for the fewest whole
weeks that train the model's tokens: a longer run costs more and holds the same nodes longer, so it never helps);
the RL mode (``u``: an RL-training layout, RL lasting the weeks it needs to train the trained share of the rollouts,
or, where rollouts are not trained, a number of weeks); the integer bundles of rollout operating points that keep
pace with it (``xr``, per mode) and of serving operating points (``xs``), aggregated, prefill or decode (a prefill
and a decode pool of one numerics group carry the same requests); and the weeks (pre-training from a start week, RL
right after it, serving from the launch for the deployment's weeks; the launch by a deadline).

A node is a system's scale-up domain (an 8-GPU server, an NVL72 rack), as in the fleet program; every option
occupies whole nodes (a *bundle*: the replicas of a small configuration that one node holds, or the nodes a large one
spans), held, paid and powered by the week. Units: a training option's ``tokens_per_week`` counts the sequence
tokens it trains per week; a serving bundle's ``rate`` is requests/s, a rollout bundle's generated tokens per week.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import cached_property

import pandas as pd
import pyomo.environ as pyo

PHASES = ("pretrain", "rl", "serve")
ELASTIC = 1e9
"""Penalty per node-week, per kW-week and per thousand USD of shortfall in the elastic program (diagnosis only)."""
ELASTIC_SCALE = 100.0
"""How many times its inventory the elastic program lets a system's phases hold."""


class Columns:
    """The option tables' columns as plain lists, read once (rules index them many times)."""

    def __init__(self, d: LifetimeData) -> None:
        for prefix, table, names in (("t", d.train, ("phase", "model", "system", "nodes", "tokens_per_week")),
                                     ("s", d.serve, ("phase", "model", "system", "role", "group", "nodes", "rate"))):
            for name in names:
                setattr(self, f"{prefix}_{name}", table[name].tolist() if name in table else [])
        self.s_group = [int(g) for g in self.s_group]
        price = d.systems["usd_per_node_week"]
        self.t_week_usd = [float(n) * float(price[s]) for n, s in zip(self.t_nodes, self.t_system, strict=True)]
        self.s_week_usd = [float(n) * float(price[s]) for n, s in zip(self.s_nodes, self.s_system, strict=True)]


def untrained_weeks(launch_by: int) -> list[int]:
    """Lengths RL may take when its rollouts are not trained (no layout sets its pace): 1, 2, 4, ... weeks and the
    deadline itself. Its cost hardly depends on the length (rollout bundles scale inversely), only its nodes per week.
    """
    return sorted({2 ** k for k in range(int(math.log2(launch_by)) + 1)} | {launch_by})


@dataclass
class LifetimeData:
    """Everything the lifetime program needs, as plain tables."""

    models: pd.DataFrame  # index model: pretrain_tokens, rollout_tokens (generated), rl_train_tokens (sequence tokens)
    systems: pd.DataFrame  # index system: usd_per_node_week, power_per_node_w
    inventory: pd.DataFrame  # rows system, columns week: nodes available
    train: pd.DataFrame  # phase (pretrain|rl), model, system, nodes (int), tokens_per_week
    serve: pd.DataFrame  # phase (rl|serve), model, system, role (both|prefill|decode), group, nodes (int), rate
    demand: float  # requests/s served every week of the deployment
    deploy_weeks: int
    launch_by: int  # the launch (first serving week) is at most this week
    rl_train_per_rollout_token: float = 0.0  # sequence tokens trained per token generated (0: rollouts not trained)
    power_cap_w: float | None = None
    budget_usd: float | None = None
    meta: dict = field(default_factory=dict)

    @property
    def weeks(self) -> list[int]:
        return list(range(self.launch_by + self.deploy_weeks))

    @cached_property
    def columns(self) -> Columns:
        """The option tables' columns as lists (the tables are not to change once the program is built)."""
        return Columns(self)

    @cached_property
    def _train_weeks(self) -> list[int]:
        c = self.columns
        return [math.ceil(float(self.models.loc[i, "pretrain_tokens" if p == "pretrain" else "rl_train_tokens"])
                          / float(r) - 1e-9) for p, i, r in zip(c.t_phase, c.t_model, c.t_tokens_per_week, strict=True)]

    def train_weeks(self, o: int) -> int:
        """The fewest whole weeks training option o (a row position of ``train``) needs for its model's tokens."""
        return self._train_weeks[o]

    def rl_modes(self) -> list[dict]:
        """Every way RL can run for each model: ``train`` (a row position of ``train``, or None) and ``weeks``. With
        rollouts trained, each RL-training layout for the weeks it needs; without, `untrained_weeks`; without RL, no
        weeks.
        """
        modes = []
        c = self.columns
        for i, row in self.models.iterrows():
            if row["rl_train_tokens"] > 0:
                modes += [{"model": i, "train": o, "weeks": self.train_weeks(o)} for o in range(len(self.train))
                          if c.t_phase[o] == "rl" and c.t_model[o] == i]
            elif row["rollout_tokens"] > 0:
                modes += [{"model": i, "train": None, "weeks": n} for n in untrained_weeks(self.launch_by)]
            else:
                modes.append({"model": i, "train": None, "weeks": 0})
        return [m for m in modes if m["weeks"] <= self.launch_by]

    def rollout_need(self, mode: dict) -> float:
        """Rollout tokens per week an RL mode must generate: its model's rollouts over its weeks, and enough to feed
        its training layout every week.
        """
        row = self.models.loc[mode["model"]]
        if not mode["weeks"]:
            return 0.0
        fed = row["rl_train_tokens"] / self.rl_train_per_rollout_token if row["rl_train_tokens"] > 0 else 0.0
        return float(max(row["rollout_tokens"], fed)) / mode["weeks"]

    @cached_property
    def _most_nodes(self) -> dict[str, float]:
        return {s: float(n) for s, n in self.inventory.max(axis=1).items()}

    def bound(self, k: int, scale: float = 1.0) -> int:
        """Most bundles of serving or rollout option k worth considering: what ``scale`` times the largest inventory
        of its system holds, and for serving no more than the whole demand needs.
        """
        c = self.columns
        fit = int(scale * self._most_nodes[c.s_system[k]] // float(c.s_nodes[k]))
        if c.s_phase[k] == "serve":
            return min(fit, math.ceil(self.demand / float(c.s_rate[k]) - 1e-9))
        return fit


def add_choice(m: pyo.ConcreteModel, d: LifetimeData) -> None:
    """One model of the menu, one pre-training layout and one RL mode of it; bundles only of the chosen model (of
    rollout points, only with the chosen RL mode).
    """
    c = m.columns
    modes = m.modes = d.rl_modes()
    scale = ELASTIC_SCALE if hasattr(m, "short_nodes") else 1.0
    m.M = pyo.Set(initialize=list(d.models.index))
    m.O = pyo.Set(initialize=[o for o, p in enumerate(c.t_phase) if p == "pretrain"])
    m.R = pyo.Set(initialize=range(len(modes)))
    m.KS = pyo.Set(initialize=[k for k, p in enumerate(c.s_phase) if p == "serve"])
    rollouts = {i: [k for k, p in enumerate(c.s_phase) if p == "rl" and c.s_model[k] == i] for i in m.M}
    m.rk = {r: rollouts[modes[r]["model"]] for r in m.R}
    m.RK = pyo.Set(initialize=[(r, k) for r in m.R for k in m.rk[r]], dimen=2)
    m.zm = pyo.Var(m.M, domain=pyo.Binary)
    m.y = pyo.Var(m.O, domain=pyo.Binary)
    m.u = pyo.Var(m.R, domain=pyo.Binary)
    m.xs = pyo.Var(m.KS, domain=pyo.NonNegativeIntegers, bounds=lambda _, k: (0, d.bound(k, scale)))
    m.xr = pyo.Var(m.RK, domain=pyo.NonNegativeIntegers, bounds=lambda _, r, k: (0, d.bound(k, scale)))
    m.one_model = pyo.Constraint(expr=sum(m.zm[i] for i in m.M) == 1)
    m.one_layout = pyo.Constraint(m.M, rule=lambda _, i: sum(m.y[o] for o in m.O if c.t_model[o] == i) == m.zm[i])
    m.one_mode = pyo.Constraint(m.M, rule=lambda _, i: sum(m.u[r] for r in m.R if modes[r]["model"] == i) == m.zm[i])
    m.serve_chosen = pyo.Constraint(m.KS, rule=lambda _, k: m.xs[k] <= m.xs[k].ub * m.zm[c.s_model[k]])
    m.rollout_chosen = pyo.Constraint(m.RK, rule=lambda _, r, k: m.xr[r, k] <= m.xr[r, k].ub * m.u[r])


def add_timeline(m: pyo.ConcreteModel, d: LifetimeData) -> None:
    """The phases run back to back: pre-training from its start week for its layout's weeks, RL right after it for
    its mode's weeks, serving from the launch for the deployment's weeks; the launch is at most ``launch_by``.
    ``started``, ``trained`` and ``launched`` say whether each event has happened by the start of a week.
    """
    m.T = pyo.Set(initialize=d.weeks)
    m.started = pyo.Var(m.T, domain=pyo.Binary)
    m.trained = pyo.Var(m.T, domain=pyo.Binary)
    m.launched = pyo.Var(m.T, domain=pyo.Binary)
    later = [t for t in m.T if t > 0]
    for name in ("started", "trained", "launched"):
        v = getattr(m, name)
        setattr(m, f"{name}_stays", pyo.Constraint(later, rule=lambda _, t, v=v: v[t] >= v[t - 1]))
    m.order_pre = pyo.Constraint(m.T, rule=lambda _, t: m.trained[t] <= m.started[t])
    m.order_rl = pyo.Constraint(m.T, rule=lambda _, t: m.launched[t] <= m.trained[t])
    m.deadline = pyo.Constraint(expr=m.launched[d.launch_by] == 1)
    m.pre = pyo.Expression(m.T, rule=lambda _, t: m.started[t] - m.trained[t])
    m.rl = pyo.Expression(m.T, rule=lambda _, t: m.trained[t] - m.launched[t])
    m.serving = pyo.Expression(m.T, rule=lambda _, t: m.launched[t] - (m.launched[t - d.deploy_weeks]
                                                                       if t >= d.deploy_weeks else 0))
    m.pre_weeks = pyo.Constraint(expr=sum(m.pre[t] for t in m.T) == sum(d.train_weeks(o) * m.y[o] for o in m.O))
    m.rl_weeks = pyo.Constraint(expr=sum(m.rl[t] for t in m.T) == sum(m.modes[r]["weeks"] * m.u[r] for r in m.R))


def _capacity(m: pyo.ConcreteModel, x, keys: list, name: str, unit: float):
    """Capacity of bundles ``x[key]`` (``keys`` pairs each variable index with its row of ``serve``), in ``unit`` of
    their rate: aggregated points plus, per numerics group, what a prefill pool and a decode pool both carry (a
    variable at most each pool's capacity).
    """
    c = m.columns
    groups = sorted({c.s_group[k] for _, k in keys if c.s_role[k] != "both"})
    pair = pyo.Var(groups, domain=pyo.NonNegativeReals)
    setattr(m, f"{name}_pair", pair)

    def pool(g, role):
        return sum(float(c.s_rate[k]) / unit * x[i] for i, k in keys if c.s_role[k] == role and c.s_group[k] == g)

    setattr(m, f"{name}_prefill", pyo.Constraint(groups, rule=lambda _, g: pair[g] <= pool(g, "prefill")))
    setattr(m, f"{name}_decode", pyo.Constraint(groups, rule=lambda _, g: pair[g] <= pool(g, "decode")))
    return sum(float(c.s_rate[k]) / unit * x[i] for i, k in keys if c.s_role[k] == "both") + sum(
        pair[g] for g in groups)


def token_unit(d: LifetimeData) -> float:
    """The unit token rates enter the program in (a power of ten near a millionth of the largest weekly need), so
    that its coefficients stay within the solver's tolerances.
    """
    need = d.models[["pretrain_tokens", "rollout_tokens"]].to_numpy(dtype=float)
    top = float(need.max()) if need.size else 1.0
    return 10.0 ** math.floor(math.log10(top / 1e6)) if top > 1e6 else 1.0


def add_work(m: pyo.ConcreteModel, d: LifetimeData) -> None:
    """Each phase does its work: the pre-training layout trains its model's tokens in its weeks (by the choice of its
    weeks); in every week of an RL mode the rollout bundles generate the mode's share of the rollouts and feed its
    training layout; the serving bundles serve the demand.
    """
    u = m.token_unit = token_unit(d)
    for r in m.R:
        need = d.rollout_need(m.modes[r]) / u
        if need > 0:
            cap = _capacity(m, m.xr, [((r, k), k) for k in m.rk[r]], f"rollout{r}", u)
            setattr(m, f"rollouts{r}", pyo.Constraint(expr=cap >= need * m.u[r]))
    m.served = pyo.Constraint(expr=_capacity(m, m.xs, [(k, k) for k in m.KS], "serving", 1.0) >= d.demand)


def phase_nodes(m: pyo.ConcreteModel, phase: str, s: str):
    """Nodes of system s a phase's configurations occupy while it runs."""
    c = m.columns
    if phase == "pretrain":
        return sum(float(c.t_nodes[o]) * m.y[o] for o in m.O if c.t_system[o] == s)
    if phase == "serve":
        return sum(float(c.s_nodes[k]) * m.xs[k] for k in m.KS if c.s_system[k] == s)
    trains = [(r, m.modes[r]["train"]) for r in m.R if m.modes[r]["train"] is not None]
    return (sum(float(c.t_nodes[o]) * m.u[r] for r, o in trains if c.t_system[o] == s)
            + sum(float(c.s_nodes[k]) * m.xr[r, k] for r, k in m.RK if c.s_system[k] == s))


def add_nodes(m: pyo.ConcreteModel, d: LifetimeData) -> None:
    """In each week, each phase running holds the nodes its configurations occupy (``held``, none outside its weeks);
    the phases' nodes together stay within the week's inventory of each system.
    """
    m.S = pyo.Set(initialize=list(d.systems.index))
    m.P = pyo.Set(initialize=PHASES)
    inv = d.inventory
    cap = {s: float(inv.loc[s].max()) * (ELASTIC_SCALE if hasattr(m, "short_nodes") else 1.0) for s in m.S}
    active = {"pretrain": m.pre, "rl": m.rl, "serve": m.serving}
    m.held = pyo.Var(m.P, m.S, m.T, domain=pyo.NonNegativeReals)
    m.nodes = pyo.Expression(m.P, m.S, rule=lambda _, p, s: phase_nodes(m, p, s))
    m.occupy = pyo.Constraint(m.P, m.S, rule=lambda _, p, s: m.nodes[p, s] <= cap[s])
    m.hold = pyo.Constraint(m.P, m.S, m.T, rule=lambda _, p, s, t: m.held[p, s, t]
                            >= m.nodes[p, s] - cap[s] * (1 - active[p][t]))
    m.inventory = pyo.Constraint(m.S, m.T, rule=lambda _, s, t: sum(m.held[p, s, t] for p in m.P)
                                 <= float(inv.loc[s, t]) + _slack(m, "short_nodes", (s, t)))


def add_power(m: pyo.ConcreteModel, d: LifetimeData) -> None:
    """The site's all-in power in every week stays within its cap (nodes held draw power)."""
    if d.power_cap_w is None:
        return
    pw = d.systems["power_per_node_w"]
    m.power = pyo.Constraint(m.T, rule=lambda _, t: sum(float(pw[s]) * m.held[p, s, t] for p in m.P for s in m.S)
                             <= d.power_cap_w + _slack(m, "short_power_w", t))


def phase_cost(m: pyo.ConcreteModel, d: LifetimeData, phase: str):
    """USD of a phase: the node-weeks of its configurations at each system's price per node-week."""
    c = m.columns
    if phase == "pretrain":
        return sum(d.train_weeks(o) * c.t_week_usd[o] * m.y[o] for o in m.O)
    if phase == "serve":
        return d.deploy_weeks * sum(c.s_week_usd[k] * m.xs[k] for k in m.KS)
    return (sum(m.modes[r]["weeks"] * c.t_week_usd[m.modes[r]["train"]] * m.u[r] for r in m.R
                if m.modes[r]["train"] is not None)
            + sum(m.modes[r]["weeks"] * c.s_week_usd[k] * m.xr[r, k] for r, k in m.RK))


def _slack(m: pyo.ConcreteModel, name: str, index):
    """A shortfall variable of the elastic program (0 in the real one)."""
    block = getattr(m, name, None)
    return 0 if block is None else block[index]


def build(d: LifetimeData, elastic: bool = False) -> pyo.ConcreteModel:
    """The lifetime program: minimize the USD of pre-training, RL and serving. With ``elastic``, inventory, power
    and budget may be exceeded at a large penalty: the shortfalls name what binds.
    """
    m = pyo.ConcreteModel("lifetime")
    if elastic:
        m.short_nodes = pyo.Var(list(d.systems.index), d.weeks, domain=pyo.NonNegativeReals)
        m.short_power_w = pyo.Var(d.weeks, domain=pyo.NonNegativeReals)
        m.short_usd = pyo.Var([None], domain=pyo.NonNegativeReals)
    m.columns = d.columns
    add_choice(m, d)
    add_timeline(m, d)
    add_work(m, d)
    add_nodes(m, d)
    add_power(m, d)
    m.phase_usd = pyo.Expression(m.P, rule=lambda _, p: phase_cost(m, d, p))
    m.total_usd = pyo.Expression(expr=sum(m.phase_usd[p] for p in m.P))
    if d.budget_usd is not None:
        m.budget = pyo.Constraint(expr=m.total_usd <= d.budget_usd + _slack(m, "short_usd", None))
    penalty = 0
    if elastic:
        penalty = ELASTIC * (sum(m.short_nodes.values()) + sum(v / 1e3 for v in m.short_power_w.values())
                             + sum(v / 1e3 for v in m.short_usd.values()))
    m.cost = pyo.Objective(expr=m.total_usd + penalty, sense=pyo.minimize)
    return m
