"""Compute equalization, solved: the lifetime program (`formulations.compute_equalization`) built from a model family,
a stated scaling law and the physics of each phase, solved through the bridge, re-checked independently, compared
with a greedy, and diagnosed by its elastic form when infeasible.

The family's models (`dse.optimize.codesign.moe_model`: width x sparsity x top-k) each need the pre-training tokens
that bring their effective size (N_active x (N_total / N_active)^gamma, `codesign.effective_params`) to the target
loss (`dse.optimize.scaling`); RL generates ``rl_per_pretrain_token`` x those tokens plus ``rl_tokens`` rollout
tokens and trains on ``rl_trained_share`` of the rollouts (whole sequences: prompt and output). The lecture's
"RL overhead" of 2 to 6 FLOPs per parameter per RL token is 2 (generation) + 6 x the trained share of
(P + O) / O here, each part costed by its own physics.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import numpy as np
import pandas as pd

from dse.catalog.hardware import System
from dse.catalog.models import Architecture
from dse.errors import InfeasibleError, SolverLimitError
from dse.optimize.bridge import solve_pyomo
from dse.optimize.codesign import effective_params
from dse.optimize.phase_options import node_counts, serving_options, training_options
from dse.optimize.scaling import CHINCHILLA_TOKENS_PER_PARAM, inference_to_training_ratio, tokens_for_loss
from dse.optimize.solver import SolveResult, elastic_shortfalls
from dse.optimize.space import SpaceOptions
from dse.physics.serving import Request
from formulations.compute_equalization import PHASES, LifetimeData, build

TOL = 1e-6
WEEK_S = 7 * 86400.0


@dataclass(frozen=True)
class Quality:
    """The target a model must reach and the scaling law that says how many tokens it takes."""

    target_loss: float
    fit: str = "hoffmann"
    unique_tokens: float | None = None
    gamma: float = 1 / 3  # effective size of a routed model: N_active x sparsity^gamma


@dataclass(frozen=True)
class Life:
    """A model's life: the phases' workloads and recipes, the weeks, the systems and what they cost."""

    serve: Request  # the served workload (its TTFT and TPOT targets)
    demand_tokens_per_s: float  # output tokens/s served through the deployment
    deploy_weeks: int
    launch_by: int  # week index of the latest launch
    rollout: Request  # one RL rollout (prompt and output tokens, its TPOT target if any)
    rl_per_pretrain_token: float
    rl_tokens: float
    rl_trained_share: float
    seq: int  # pre-training sequence length
    batch_tokens: float  # pre-training global batch
    rl_batch_tokens: float
    systems: dict[str, System]  # every system of the fleet, priced at the study's kind
    train_systems: tuple[str, ...]
    inventory: dict[str, list[int]]  # nodes available per system and week
    power_cap_w: float | None = None
    budget_usd: float | None = None
    gemm_dtypes: tuple[str, ...] = ("bf16",)
    ideal: bool = False
    week_s: float = WEEK_S

    @property
    def weeks(self) -> int:
        return self.launch_by + self.deploy_weeks

    @property
    def rl_train_per_rollout_token(self) -> float:
        """Sequence tokens trained per rollout token generated: the trained share of the whole rollout."""
        return self.rl_trained_share * (self.rollout.prompt + self.rollout.output) / self.rollout.output


def node_chips(system: System) -> int:
    return int(system.scaleup_domain)


def power_per_chip(system: System) -> float:
    """All-in W per chip (host, network and cooling share), the chip's TDP where the catalog has none."""
    return system.power_all_in_w if math.isfinite(system.power_all_in_w) else system.power


@dataclass
class ModelOptions:
    """One model's options in every phase, from the physics."""

    model: Architecture
    pretrain: pd.DataFrame
    rl_train: pd.DataFrame
    serve: pd.DataFrame
    rollout: pd.DataFrame


def model_options(model: Architecture, life: Life, space: SpaceOptions) -> ModelOptions:
    """Training layouts (pre-training at ``seq``, RL training at the rollout's length) on the training systems, and
    serving and rollout operating points on the space's systems.
    """
    pre, rl = [], []
    for sid in life.train_systems:
        s = life.systems[sid]
        counts = node_counts(max(life.inventory[sid]))
        pre.append(training_options(model, s, counts, life.seq, life.batch_tokens, life.gemm_dtypes, life.ideal))
        if life.rl_trained_share > 0:
            rl.append(training_options(model, s, counts, life.rollout.prompt + life.rollout.output,
                                       life.rl_batch_tokens, life.gemm_dtypes, life.ideal))
    serve = serving_options(model, life.serve, space)
    rollout = serving_options(model, life.rollout, space) if life.rl_per_pretrain_token > 0 or life.rl_tokens > 0 \
        else serve.iloc[:0]
    cat = (lambda f: pd.concat(f, ignore_index=True) if f else pd.DataFrame())  # noqa: E731
    return ModelOptions(model, cat(pre), cat(rl), serve, rollout)


def pretrain_tokens(model: Architecture, quality: Quality) -> float:
    """Pre-training tokens that bring the model to the target loss (infinity when none do)."""
    return tokens_for_loss(effective_params(model, quality.gamma), quality.target_loss, quality.fit,
                           quality.unique_tokens)


def menu_row(model: Architecture, quality: Quality, life: Life) -> dict:
    """A model of the menu: its sizes and the tokens of its pre-training and RL."""
    d = pretrain_tokens(model, quality)
    rollout = life.rl_per_pretrain_token * d + life.rl_tokens
    ffn = model.spec.ffn
    return {"model": model.id, "d_model": model.spec.d_model, "experts": ffn.n_experts if model.is_moe else 0,
            "top_k": ffn.top_k if model.is_moe else 0, "params_total": model.params_total,
            "params_active": model.params_active, "params_effective": effective_params(model, quality.gamma),
            "pretrain_tokens": d, "overtraining_ratio": d / (CHINCHILLA_TOKENS_PER_PARAM * model.params_active),
            "rollout_tokens": rollout, "rl_train_tokens": rollout * life.rl_train_per_rollout_token}


def lifetime_data(options: list[ModelOptions], quality: Quality, life: Life) -> tuple[LifetimeData, list[dict]]:
    """The program's data from each model's options; models that cannot reach the quality are left out and listed
    with the reason.
    """
    rows, left_out, train, serve = [], [], [], []
    for mo in options:
        row = menu_row(mo.model, quality, life)
        if not math.isfinite(row["pretrain_tokens"]):
            left_out.append({"model": mo.model.id, "reason": f"cannot reach loss {quality.target_loss:g} "
                             f"({quality.fit} fit{_unique_text(quality)}) at any number of tokens"})
            continue
        rows.append(row)
        for phase, t in (("pretrain", mo.pretrain), ("rl", mo.rl_train)):
            if not t.empty:
                train.append(t.assign(phase=phase, model=mo.model.id,
                                      tokens_per_week=t["tokens_per_s"] * life.week_s))
        # a bundle's rate is its replicas' (``per_bundle`` of them where a replica takes less than a node)
        if not mo.serve.empty:
            serve.append(mo.serve.assign(phase="serve", model=mo.model.id,
                                         rate=mo.serve["requests_per_s"] * mo.serve["per_bundle"]))
        if not mo.rollout.empty:
            serve.append(mo.rollout.assign(phase="rl", model=mo.model.id, rate=mo.rollout["requests_per_s"]
                                           * mo.rollout["per_bundle"] * life.rollout.output * life.week_s))
    systems = sorted({*life.train_systems, *(s for t in serve for s in t["system"])},
                     key=lambda s: list(life.systems).index(s))
    sy = pd.DataFrame({s: {"node_chips": node_chips(life.systems[s]),
                           "usd_per_node_week": life.systems[s].price_per_s * node_chips(life.systems[s]) * life.week_s,
                           "power_per_node_w": power_per_chip(life.systems[s]) * node_chips(life.systems[s])}
                       for s in systems}).T
    inv = pd.DataFrame([life.inventory[s][: life.weeks] for s in systems], index=systems,
                       columns=range(life.weeks), dtype=float)
    models = pd.DataFrame(rows).set_index("model") if rows else pd.DataFrame(
        columns=["pretrain_tokens", "rollout_tokens", "rl_train_tokens"])
    d = LifetimeData(models, sy, inv, _concat(train), _concat(serve), life.demand_tokens_per_s / life.serve.output,
                     life.deploy_weeks, life.launch_by, life.rl_train_per_rollout_token, life.power_cap_w,
                     life.budget_usd, meta={"week_s": life.week_s, "serve_output": life.serve.output,
                                            "rollout_output": life.rollout.output})
    return d, left_out


def _unique_text(q: Quality) -> str:
    return f", {q.unique_tokens:.3g} unique tokens" if q.unique_tokens else ""


def _concat(frames: list[pd.DataFrame]) -> pd.DataFrame:
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(
        columns=["phase", "model", "system", "nodes", "tokens_per_week", "role", "group", "rate"])


@dataclass
class Plan:
    """A plan in the program's terms: the model, the pre-training layout (a row position of ``train``), the RL mode
    (an item of `LifetimeData.rl_modes`), the bundles of serving and rollout options (row positions of ``serve``)
    and the first pre-training week.
    """

    model: str
    pretrain: int
    mode: dict
    bundles: dict[int, int]
    start: int = 0

    def weeks(self, d: LifetimeData) -> tuple[int, int, int]:
        """Pre-training weeks, RL weeks and the launch week."""
        pre = d.train_weeks(self.pretrain)
        return pre, self.mode["weeks"], self.start + pre + self.mode["weeks"]


def held(d: LifetimeData, p: Plan) -> np.ndarray:
    """Whole nodes a plan holds per phase, system and week (phases x systems x weeks)."""
    c = d.columns
    systems = list(d.systems.index)
    occ = np.zeros((len(PHASES), len(systems)))
    occ[0, systems.index(c.t_system[p.pretrain])] += float(c.t_nodes[p.pretrain])
    if p.mode["train"] is not None:
        occ[1, systems.index(c.t_system[p.mode["train"]])] += float(c.t_nodes[p.mode["train"]])
    for k, n in p.bundles.items():
        occ[PHASES.index(c.s_phase[k]), systems.index(c.s_system[k])] += n * float(c.s_nodes[k])
    pre, rl, launch = p.weeks(d)
    weeks = np.array(d.weeks)
    active = np.array([(weeks >= a) & (weeks < b) for a, b in ((p.start, p.start + pre), (p.start + pre, launch),
                                                             (launch, launch + d.deploy_weeks))], dtype=float)
    return occ[:, :, None] * active[:, None, :]


def nodes_table(d: LifetimeData, nodes: np.ndarray) -> pd.DataFrame:
    """Nodes per phase, system and week as a table (one row each)."""
    return pd.DataFrame([{"phase": ph, "system": s, "week": t, "nodes": int(round(nodes[i, j, t]))}
                         for i, ph in enumerate(PHASES) for j, s in enumerate(d.systems.index) for t in d.weeks])


def cost_of(d: LifetimeData, nodes: np.ndarray) -> dict[str, float]:
    """USD per phase and in total, from the nodes held (phases x systems x weeks): node-weeks at each system's price."""
    usd = (nodes.sum(axis=2) * d.systems["usd_per_node_week"].to_numpy()[None, :]).sum(axis=1)
    out = {p: float(usd[i]) for i, p in enumerate(PHASES)}
    out["total"] = float(usd.sum())
    return out


def violations(d: LifetimeData, nodes: np.ndarray) -> list[str]:
    """The weeks where nodes held (phases x systems x weeks) break the inventory or the power cap, and the budget."""
    bad = []
    per = nodes.sum(axis=0)
    inv = d.inventory.to_numpy(dtype=float)
    for j, t in zip(*np.nonzero(per > inv + TOL), strict=True):
        bad.append(f"{d.systems.index[j]} in week {t}: {per[j, t]:g} nodes held, inventory {inv[j, t]:g}")
    if d.power_cap_w is not None:
        watts = (per * d.systems["power_per_node_w"].to_numpy()[:, None]).sum(axis=0)
        bad += [f"week {t}: power {watts[t]:.6g} W over the cap {d.power_cap_w:.6g} W"
                for t in np.flatnonzero(watts > d.power_cap_w * (1 + TOL))]
    usd = cost_of(d, nodes)["total"]
    if d.budget_usd is not None and usd > d.budget_usd * (1 + TOL):
        bad.append(f"cost {usd:.6g} over the budget {d.budget_usd:.6g}")
    return bad


def capacity(options: pd.DataFrame, bundles: np.ndarray) -> float:
    """Rate of bundles of options: aggregated points plus, per numerics group, the lesser of the prefill and the
    decode pools.
    """
    rate = options["rate"].to_numpy(dtype=float) * bundles
    role, group = options["role"].to_numpy(), options["group"].to_numpy()
    total = float(rate[role == "both"].sum())
    for g in set(group[role != "both"]):
        total += min(float(rate[(role == "prefill") & (group == g)].sum()),
                     float(rate[(role == "decode") & (group == g)].sum()))
    return total


@dataclass
class LifetimeResult:
    """The optimum: its plan, the weeks of each phase, the chosen layouts and bundles, the nodes held per phase,
    system and week, and the cost and work of each phase.
    """

    result: SolveResult
    plan: Plan
    model: str
    start: int
    pretrain_weeks: int
    rl_weeks: int
    launch: int
    train: pd.DataFrame  # the chosen training layouts (pre-training, and RL training where rollouts are trained)
    bundles: pd.DataFrame  # serving and rollout options with bundles > 0 (columns ``bundles``, ``replicas``)
    nodes: pd.DataFrame  # phase, system, week, nodes
    cost: dict[str, float]  # USD per phase and ``total``
    work: dict[str, float] = field(default_factory=dict)


def result_of(d: LifetimeData, p: Plan, res: SolveResult) -> LifetimeResult:
    """A plan as the tables a study reports."""
    pre, rl, launch = p.weeks(d)
    rows = [p.pretrain] + ([p.mode["train"]] if p.mode["train"] is not None else [])
    per = d.serve["per_bundle"] if "per_bundle" in d.serve else pd.Series(1, index=d.serve.index)
    ks = sorted(p.bundles)
    bundles = d.serve.iloc[ks].assign(bundles=[p.bundles[k] for k in ks],
                                      replicas=[p.bundles[k] * int(per.iat[k]) for k in ks])
    nodes = held(d, p)
    row = d.models.loc[p.model]
    roll = bundles[bundles["phase"] == "rl"]
    gen = capacity(roll, roll["bundles"].to_numpy()) * rl
    rl_rate = float(d.train["tokens_per_week"].iat[p.mode["train"]]) if p.mode["train"] is not None else 0.0
    week_s = d.meta.get("week_s", 7 * 86400.0)
    work = {"pretrain_tokens": float(d.train["tokens_per_week"].iat[p.pretrain]) * pre,
            "rollout_tokens": gen, "rl_train_tokens": min(rl_rate * rl, d.rl_train_per_rollout_token * gen),
            "served_tokens": d.demand * d.meta.get("serve_output", 1.0) * week_s * d.deploy_weeks,
            "pretrain_tokens_needed": float(row["pretrain_tokens"]), "rollout_tokens_needed": float(
                row["rollout_tokens"]), "rl_train_tokens_needed": float(row["rl_train_tokens"])}
    return LifetimeResult(res, p, p.model, p.start, pre, rl, launch, d.train.iloc[rows], bundles,
                          nodes_table(d, nodes), cost_of(d, nodes), work)


def read_plan(m, d: LifetimeData) -> Plan:
    """The plan a solved program holds."""
    model = max(m.M, key=lambda i: m.zm[i].value or 0)
    o = max(m.O, key=lambda o: m.y[o].value or 0)
    r = max(m.R, key=lambda r: m.u[r].value or 0)
    started = [round(m.started[t].value or 0) for t in m.T]
    bundles = {k: round(m.xs[k].value or 0) for k in m.KS}
    bundles.update({k: round(m.xr[rr, k].value or 0) for rr, k in m.RK if rr == r})
    return Plan(model, o, m.modes[r], {k: n for k, n in bundles.items() if n > 0},
                started.index(1) if 1 in started else 0)


def diagnose(d: LifetimeData, solver: str = "highs", time_limit_s: float = 30.0) -> str:
    """Why no plan exists: a model menu left empty, the deadline, or the elastic program's shortfalls of
    inventory, power and budget.
    """
    if d.models.empty:
        return "infeasible lifetime: no model of the menu reaches the target loss"
    c = d.columns
    missing = [(i, what) for i in d.models.index for what, has in (
        ("pre-training layout that fits in HBM on the nodes of the inventory",
         any(p == "pretrain" and m == i for p, m in zip(c.t_phase, c.t_model, strict=True))),
        ("serving configuration that meets the workload's targets on the inventory",
         any(p == "serve" and m == i for p, m in zip(c.s_phase, c.s_model, strict=True)))) if not has]
    if len({i for i, _ in missing}) == len(d.models):
        return "infeasible lifetime: " + "; ".join(f"{i} has no {what}" for i, what in missing[:6])
    m = build(d, elastic=True)
    res = solve_pyomo(m, solver, time_limit_s)
    if not res.ok:
        fastest = _fastest_weeks(d)
        return (f"infeasible lifetime: no model of the menu finishes pre-training and RL by week {d.launch_by} on "
                f"any layout offered (the fastest needs {fastest} weeks: the deadline is short by "
                f"{max(fastest - d.launch_by, 0)} weeks)")
    return elastic_shortfalls(m, "lifetime", "week", d.inventory, d.power_cap_w, d.budget_usd, "USD",
                              "no resource shortfall found")


def _fastest_weeks(d: LifetimeData) -> int:
    """The fewest weeks any model needs for pre-training and RL on its fastest layouts."""
    modes = d.rl_modes()
    best = math.inf
    for i in d.models.index:
        pre = [d.train_weeks(o) for o in range(len(d.train)) if d.train["phase"].iat[o] == "pretrain"
               and d.train["model"].iat[o] == i]
        rl = [m["weeks"] for m in modes if m["model"] == i]
        if pre and rl:
            best = min(best, min(pre) + min(rl))
    return int(best) if math.isfinite(best) else -1


def solve_lifetime(d: LifetimeData, solver: str = "highs", time_limit_s: float = 60.0,
                   warm_start: bool = True) -> LifetimeResult:
    """Solve the lifetime program warm-started from the greedy plan (SCIP takes it as a hint; HiGHS, which cannot,
    starts cold); InfeasibleError names the binding resource and its shortfall.
    """
    if d.models.empty or "serve" not in d.columns.s_phase:  # nothing to choose from
        raise InfeasibleError(diagnose(d, solver))
    m = build(d)
    start = greedy(d) if warm_start else None
    if start is not None:
        hint(m, d, start)
    res = solve_pyomo(m, solver, time_limit_s, warm_start=start is not None)
    if res.status == "infeasible":
        raise InfeasibleError(diagnose(d, solver))
    if not res.ok:
        raise SolverLimitError(f"no lifetime plan found within {time_limit_s:g} s by {solver} (status "
                               f"{res.status}); raise solver.time_limit_s or try solver.name: scip")
    return result_of(d, read_plan(m, d), res)


def check(d: LifetimeData, r: LifetimeResult) -> list[str]:
    """Independent re-check of a plan: each phase's work done in its weeks by its configurations, the weeks in
    order and by the deadline, the nodes within inventory and power, the budget, the cost equal to the objective.
    """
    bad = []
    p = r.plan
    row = d.models.loc[p.model]
    tr = d.train
    if r.launch > d.launch_by:
        bad.append(f"launch in week {r.launch}, after the deadline {d.launch_by}")
    if tr["model"].iat[p.pretrain] != p.model or (r.bundles["model"] != p.model).any() or p.mode["model"] != p.model:
        bad.append("a configuration of another model is used")
    if float(tr["tokens_per_week"].iat[p.pretrain]) * r.pretrain_weeks < row["pretrain_tokens"] * (1 - TOL):
        bad.append(f"pre-training: {r.work['pretrain_tokens']:.6g} tokens < {row['pretrain_tokens']:.6g}")
    if r.work["rollout_tokens"] < row["rollout_tokens"] * (1 - TOL):
        bad.append(f"RL: {r.work['rollout_tokens']:.6g} rollout tokens < {row['rollout_tokens']:.6g}")
    if r.work["rl_train_tokens"] < row["rl_train_tokens"] * (1 - TOL):
        bad.append(f"RL: {r.work['rl_train_tokens']:.6g} tokens trained < {row['rl_train_tokens']:.6g}")
    srv = r.bundles[r.bundles["phase"] == "serve"]
    if capacity(srv, srv["bundles"].to_numpy()) < d.demand * (1 - TOL):
        bad.append(f"serving: capacity {capacity(srv, srv['bundles'].to_numpy()):.6g} < {d.demand:.6g}")
    nodes = held(d, p)
    bad += violations(d, nodes)
    if r.result.status == "optimal" and not math.isclose(r.cost["total"], r.result.objective, rel_tol=1e-6,
                                                         abs_tol=1e-6):
        bad.append(f"recomputed cost {r.cost['total']:.8g} differs from the objective {r.result.objective:.8g}")
    return bad


def _fill(d: LifetimeData, ks: list[int], need: float, room: dict[str, float]) -> dict[int, int]:
    """Greedy bundles of options ``ks`` (row positions of ``serve``) carrying ``need`` (in their rate unit) within
    ``room`` nodes per system: configurations (one aggregated option, or one prefill and one decode option of a
    numerics group) cheapest per unit first, each taking whole bundles until the need is met or its systems are
    full. Empty when the need cannot be met.
    """
    if need <= 0:
        return {}
    c = d.columns
    unit = {k: c.s_week_usd[k] / float(c.s_rate[k]) for k in ks}
    configs = [((k,), unit[k]) for k in ks if c.s_role[k] == "both"]
    for g in {c.s_group[k] for k in ks if c.s_role[k] != "both"}:
        pre = [k for k in ks if c.s_role[k] == "prefill" and c.s_group[k] == g]
        dec = [k for k in ks if c.s_role[k] == "decode" and c.s_group[k] == g]
        configs += [((a, b), unit[a] + unit[b]) for a in pre for b in dec]
    left, room, reps = need, dict(room), {}
    for pair, _ in sorted(configs, key=lambda x: x[1]):
        rate = {k: float(c.s_rate[k]) for k in pair}
        carried = left
        while carried > 0:  # the most of what is left that the room holds
            n = {k: math.ceil(carried / rate[k] - 1e-9) for k in pair}
            per: dict[str, float] = {}
            for k in pair:
                per[c.s_system[k]] = per.get(c.s_system[k], 0.0) + n[k] * float(c.s_nodes[k])
            over = max(v / room[s] if room[s] > 0 else math.inf for s, v in per.items())
            if over <= 1 + 1e-12:
                break
            carried = min(carried / over, carried - min(rate.values()))
        if carried <= 0:
            continue
        for k in pair:
            reps[k] = reps.get(k, 0) + n[k]
        for s, v in per.items():
            room[s] -= v
        left -= min(n[k] * rate[k] for k in pair)
        if left <= 1e-9 * need:
            return reps
    return {}


def greedy(d: LifetimeData) -> Plan | None:
    """A greedy plan: per model, each pre-training layout and RL mode back to back from the earliest start that fits;
    rollouts and serving on the cheapest configurations per unit of work first, in whole bundles, within the nodes
    every week offers (less the RL-training layout's); the cheapest such plan (None if none fits).
    """
    c = d.columns
    floor = d.inventory.min(axis=1).to_dict()
    modes = d.rl_modes()
    best: tuple[float, Plan] | None = None
    for i in d.models.index:
        serve = _fill(d, [k for k, (p, m) in enumerate(zip(c.s_phase, c.s_model, strict=True))
                          if p == "serve" and m == i], d.demand, floor)
        if not serve:
            continue
        roll = [k for k, (p, m) in enumerate(zip(c.s_phase, c.s_model, strict=True)) if p == "rl" and m == i]
        pres = [o for o, (p, m) in enumerate(zip(c.t_phase, c.t_model, strict=True)) if p == "pretrain" and m == i]
        for mode in (m for m in modes if m["model"] == i):
            room = dict(floor)
            if mode["train"] is not None:
                room[c.t_system[mode["train"]]] -= float(c.t_nodes[mode["train"]])
            need = d.rollout_need(mode)
            reps = _fill(d, roll, need, room) if need > 0 else {}
            if need > 0 and not reps:
                continue
            for o in pres:
                for start in range(d.launch_by - d.train_weeks(o) - mode["weeks"] + 1):
                    p = Plan(i, o, mode, {**serve, **reps}, start)
                    nodes = held(d, p)
                    if not violations(d, nodes):
                        usd = cost_of(d, nodes)["total"]
                        if best is None or usd < best[0]:
                            best = (usd, p)
                        break
    return None if best is None else best[1]


def hint(m, d: LifetimeData, p: Plan) -> None:
    """Set every variable of the built program to the plan's values (a warm start for the solver)."""
    pre, rl, launch = p.weeks(d)
    for i in m.M:
        m.zm[i].set_value(float(i == p.model))
    for o in m.O:
        m.y[o].set_value(float(o == p.pretrain))
    chosen = next(r for r in m.R if m.modes[r] == p.mode)
    for r in m.R:
        m.u[r].set_value(float(r == chosen))
    for k in m.KS:
        m.xs[k].set_value(float(p.bundles.get(k, 0)))
    for r, k in m.RK:
        m.xr[r, k].set_value(float(p.bundles.get(k, 0) if r == chosen else 0))
    for t in m.T:
        m.started[t].set_value(float(t >= p.start))
        m.trained[t].set_value(float(t >= p.start + pre))
        m.launched[t].set_value(float(t >= launch))
    sv = d.serve
    for name, phase, unit in ((f"rollout{chosen}_pair", "rl", m.token_unit), ("serving_pair", "serve", 1.0)):
        var = getattr(m, name, None)
        for g in var if var is not None else ():
            cap = {r: sum(float(sv["rate"].iat[k]) * n for k, n in p.bundles.items() if sv["phase"].iat[k] == phase
                          and sv["role"].iat[k] == r and int(sv["group"].iat[k]) == g) for r in ("prefill", "decode")}
            var[g].set_value(min(cap.values()) / unit)
    for name in [f"rollout{r}_pair" for r in m.R if r != chosen]:
        for v in getattr(m, name, {}).values():
            v.set_value(0.0)
    nodes = held(d, p)
    for i, ph in enumerate(PHASES):
        for j, s in enumerate(d.systems.index):
            for t in m.T:
                m.held[ph, s, t].set_value(float(nodes[i, j, t]))


def restrict(d: LifetimeData, models: list[str]) -> LifetimeData:
    """The same program with only some models of the menu."""
    return replace(d, models=d.models.loc[models], train=d.train[d.train["model"].isin(models)].reset_index(drop=True),
                   serve=d.serve[d.serve["model"].isin(models)].reset_index(drop=True))


def narrow_serving(d: LifetimeData, kv_tiers: tuple[str, ...] | None = None,
                   placements: tuple[str, ...] | None = None) -> LifetimeData:
    """The same program with serving and rollouts held to some KV tiers and expert placements (None: all), less the
    bundles another of the same phase, model, system, role and numerics group beats: no more nodes and no less rate.
    Exact: such a bundle in a plan can be swapped for the other, which holds no more nodes (so no more cost, power or
    inventory) and carries no less of its pool; the KV tier and the placement enter the program through nothing else.
    """
    t = d.serve
    ok = pd.Series(True, index=t.index)
    if kv_tiers is not None:
        ok &= t["kv_tier"].isin(kv_tiers)
    if placements is not None:
        ok &= t["placement"].isin(placements)
    t = t[ok]
    keep = []
    for _, g in t.groupby(["phase", "model", "system", "role", "group"], sort=False):
        g = g.sort_values(["nodes", "rate"], ascending=[True, False], kind="stable")
        best = -math.inf
        for i, rate in zip(g.index, g["rate"], strict=True):
            if rate > best * (1 + 1e-12):
                keep.append(i)
                best = rate
    return replace(d, serve=t.loc[sorted(keep)].reset_index(drop=True))


def figures(d: LifetimeData, r: LifetimeResult, quality: Quality) -> dict:
    """The optimum's figures: the model and its tokens, the phases' USD, weeks and shares, the marginal USD per token
    of each phase at its chosen configurations, the first-order condition's split and the lecture's units.
    """
    row = d.models.loc[r.model]
    c = r.cost
    train_usd = c["pretrain"] + c["rl"]
    served = r.work["served_tokens"]
    c_cols = d.columns
    pre_o = r.plan.pretrain
    week_usd = {k: c_cols.s_week_usd[k] * n for k, n in r.plan.bundles.items()}
    roll_usd = sum(v for k, v in week_usd.items() if c_cols.s_phase[k] == "rl")
    serve_usd = sum(v for k, v in week_usd.items() if c_cols.s_phase[k] == "serve")
    rl_train_usd = c_cols.t_week_usd[r.plan.mode["train"]] if r.plan.mode["train"] is not None else 0.0
    gen_week = r.work["rollout_tokens"] / r.rl_weeks if r.rl_weeks else 0.0
    usd_pre = c_cols.t_week_usd[pre_o] / float(c_cols.t_tokens_per_week[pre_o])
    usd_serve = serve_usd / (served / d.deploy_weeks) if served else math.nan
    active = float(row["params_active"]) if "params_active" in row else math.nan
    foc = inference_to_training_ratio(float(row.get("params_effective", math.nan)), float(row["pretrain_tokens"]),
                                      quality.fit, quality.unique_tokens) if "params_effective" in row else math.nan
    out = {key: (float(v) if isinstance(v, (int, float, np.floating, np.integer)) else v) for key, v in row.items()}
    out.update({
        "model": r.model, "lifetime_usd": c["total"], "pretrain_usd": c["pretrain"], "rl_usd": c["rl"],
        "serve_usd": c["serve"], "pretrain_share": c["pretrain"] / c["total"], "rl_share": c["rl"] / c["total"],
        "serve_share": c["serve"] / c["total"], "serve_to_training": c["serve"] / train_usd if train_usd else math.nan,
        "foc_serve_to_training": foc, "start_week": r.start, "pretrain_weeks": r.pretrain_weeks,
        "rl_weeks": r.rl_weeks, "launch_week": r.launch, "served_tokens": served,
        "pretrain_to_served_tokens": float(row["pretrain_tokens"]) / served if served else math.nan,
        "usd_per_pretrain_token": usd_pre,
        "usd_per_rollout_token": (roll_usd + rl_train_usd) / gen_week if gen_week else math.nan,
        "usd_per_served_token": usd_serve,
        # the lecture's units: USD per FLOP of inference (2 N per token) over USD per FLOP of pre-training (6 N)
        "inference_inefficiency": (usd_serve / 2) / (usd_pre / 6) if served else math.nan,
        # the lecture's "2 to 6" FLOPs per parameter per RL token: generation, and training on the trained share
        "rl_flops_per_param_token": 2 + 6 * d.rl_train_per_rollout_token,
        "status": r.result.status, "gap": r.result.gap, "solve_wall_s": r.result.wall_s,
    })
    out["chinchilla_tokens"] = CHINCHILLA_TOKENS_PER_PARAM * active
    out.update(class_shares(r.bundles))
    return out


def class_shares(bundles: pd.DataFrame) -> dict[str, float]:
    """What the optimum picks for the serving KV cache's tier and the experts' placement: the share of serving's and
    of the rollouts' nodes whose replicas keep the KV in host memory, and whose expert-parallel groups span more than
    one scale-up domain (NaN where a phase holds no bundle).
    """
    out = {}
    for phase, name in (("serve", "serve"), ("rl", "rollout")):
        b = bundles[bundles["phase"] == phase] if "phase" in bundles else bundles.iloc[:0]
        nodes = (b["nodes"] * b["bundles"]).astype(float) if len(b) else pd.Series(dtype=float)
        total = float(nodes.sum())
        for key, column, value in (("host_kv", "kv_tier", "host"), ("scale_out", "placement", "scale_out")):
            share = float(nodes[b[column] == value].sum()) / total if total and column in b else math.nan
            out[f"{name}_{key}_share"] = share
    return out


def binds(d: LifetimeData, r: LifetimeResult, quality: Quality, menu_edge: bool) -> list[str]:
    """What holds the optimum where it is: the deadline, inventory, power and budget it meets with equality, the
    unique data it repeats, whole weeks, and the edge of the model menu. The deadline binds where the launch falls
    on it and the same plan started any earlier breaks the inventory or power (an earlier start costs the same: the
    solver may pick either, and only then is the deadline what holds it).
    """
    out = []
    if r.launch == d.launch_by and all(violations(d, held(d, replace(r.plan, start=s))) for s in range(r.start)):
        out.append(f"deadline: the launch falls in week {r.launch}, the latest allowed")
    nodes = held(d, r.plan)
    per = nodes.sum(axis=0)
    inv = d.inventory.to_numpy(dtype=float)
    for j, s in enumerate(d.systems.index):
        full = [t for t in d.weeks if per[j, t] >= inv[j, t] - TOL and per[j, t] > 0]
        if full:
            phases = sorted({PHASES[i] for i in range(len(PHASES)) for t in full if nodes[i, j, t] > 0})
            out.append(f"inventory of {s}: all {inv[j, full[0]]:g} nodes held in {len(full)} weeks "
                       f"({', '.join(phases)})")
    if d.power_cap_w is not None:
        watts = (per * d.systems["power_per_node_w"].to_numpy()[:, None]).sum(axis=0)
        tight = np.flatnonzero(watts >= d.power_cap_w * (1 - 1e-3))
        if len(tight):
            out.append(f"site power: within 0.1% of the {d.power_cap_w / 1e3:g} kW cap in {len(tight)} weeks")
    if d.budget_usd is not None and r.cost["total"] >= d.budget_usd * (1 - 1e-3):
        out.append(f"budget: {r.cost['total']:,.0f} of {d.budget_usd:,.0f} USD")
    need = float(d.models.loc[r.model, "pretrain_tokens"])
    if quality.unique_tokens and need > quality.unique_tokens:
        out.append(f"data: {need / quality.unique_tokens:.2f} epochs of the {quality.unique_tokens:.3g} unique "
                   "tokens (repeats count less)")
    over = r.work["pretrain_tokens"] / need - 1
    if over > 0.01:
        out.append(f"whole weeks: pre-training runs {over:.1%} more tokens than the target needs")
    if menu_edge:
        out.append("model menu: the optimum is the menu's smallest or largest width of its sparsity (widen it)")
    return out
