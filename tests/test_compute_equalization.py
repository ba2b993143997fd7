"""Compute equalization: the scaling laws, the lifetime program against an independent brute force (the contract),
its re-check and diagnosis, the first-order condition of the continuous relaxation, and the shipped study."""

from __future__ import annotations

import itertools
import math
from dataclasses import replace

import numpy as np
import pandas as pd
import pytest
from formulation_contract import FormulationContract

from dse.errors import InfeasibleError
from dse.optimize.bridge import compile_model
from dse.optimize.equalization import check, narrow_serving, solve_lifetime
from dse.optimize.scaling import (
    LOSS_FITS,
    REPEAT_HALF_LIFE,
    effective_tokens,
    inference_to_training_ratio,
    loss,
    tokens_for_loss,
)
from formulations.compute_equalization import LifetimeData, build

# -- the scaling laws ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("fit", sorted(LOSS_FITS))
@pytest.mark.parametrize("unique", [None, 3e12])
def test_tokens_for_loss_inverts_the_loss(fit, unique):
    for n, d in ((7e10, 1.4e12), (4e11, 1.5e13), (3e10, 2e13)):
        assert tokens_for_loss(n, loss(n, d, fit, unique), fit, unique) == pytest.approx(d, rel=1e-9)
    assert tokens_for_loss(1e9, 1.0, fit, unique) == math.inf  # below the irreducible loss


def test_chinchilla_reference_points_share_compute():
    # Chinchilla (70B, 1.4T) beats Gopher (280B, 300B) at the same compute in the Hoffmann fit
    assert loss(70e9, 1.4e12) < loss(280e9, 300e9)


def test_repeated_tokens_follow_muennighoffs_decay():
    """D' = U + U R* (1 - exp(-R / R*)): one epoch is worth itself, 4 epochs nearly 4 (Muennighoff et al. 2023:
    "up to 4 epochs ... negligible" loss change), and no number of repeats is worth more than U (1 + R*)."""
    u = 1e12
    assert effective_tokens(u, u) == u and effective_tokens(0.5 * u, u) == 0.5 * u
    assert effective_tokens(4 * u, u) == pytest.approx(u * (1 + REPEAT_HALF_LIFE * (1 - math.exp(-3 / 15.387756))))
    assert 3.7 * u < effective_tokens(4 * u, u) < 4 * u
    assert effective_tokens(100 * u, u) < u * (1 + REPEAT_HALF_LIFE)
    target = loss(7e10, u * (1 + REPEAT_HALF_LIFE) * 1.01)  # more than any repeat of U can give
    assert tokens_for_loss(7e10, target, unique=u) == math.inf


def test_first_order_split_equalizes_where_the_lecture_says():
    """alpha a = 2 beta b (no repeats) is where inference and training cost the same at the optimum."""
    c = LOSS_FITS["hoffmann"]
    n = 1e11
    b = c.alpha * c.A / n ** c.alpha / (2 * c.beta)  # B / D^beta
    d = (c.B / b) ** (1 / c.beta)
    assert inference_to_training_ratio(n, d) == pytest.approx(1.0, rel=1e-12)


# -- the lifetime program against a brute force -------------------------------------------------------------------


def random_instance(rng: np.random.Generator) -> LifetimeData:
    systems = [f"s{i}" for i in range(int(rng.integers(1, 3)))]
    launch_by, deploy = int(rng.integers(2, 6)), int(rng.integers(1, 3))
    weeks = range(launch_by + deploy)
    sy = pd.DataFrame({"usd_per_node_week": rng.uniform(1, 4, len(systems)),
                       "power_per_node_w": rng.uniform(5e3, 1e4, len(systems))}, index=systems)
    inv = pd.DataFrame(rng.integers(2, 6, (len(systems), len(weeks))), index=systems, columns=list(weeks),
                       dtype=float)
    f = float(rng.choice([0.0, 0.5, 1.5]))
    models, train, serve = [], [], []
    for i in range(int(rng.integers(1, 4))):
        name = f"m{i}"
        rollout = float(rng.choice([0.0, rng.uniform(0.5, 3)]))
        models.append({"model": name, "pretrain_tokens": float(rng.uniform(1, 4)), "rollout_tokens": rollout,
                       "rl_train_tokens": f * rollout})
        for phase in ("pretrain", "rl"):
            for _ in range(int(rng.integers(1, 3))):
                train.append({"phase": phase, "model": name, "system": str(rng.choice(systems)),
                              "nodes": int(rng.integers(1, 4)), "tokens_per_week": float(rng.uniform(0.5, 2.5))})
        for phase in ("serve", "rl"):
            roles = ["both"] if rng.uniform() < 0.5 else ["prefill", "decode"]
            if rng.uniform() < 0.3:
                roles = ["both", "prefill", "decode"]
            for role in roles:
                serve.append({"phase": phase, "model": name, "system": str(rng.choice(systems)), "role": role,
                              "group": 0, "nodes": int(rng.integers(1, 3)), "rate": float(rng.uniform(0.6, 2.0)),
                              "kv_tier": "host" if rng.uniform() < 0.3 else "hbm",
                              "placement": "scale_out" if rng.uniform() < 0.3 else "scale_up"})
                if rng.uniform() < 0.25:  # a rival of the same system and role, of another tier or placement
                    rival = dict(serve[-1])
                    rival.update(nodes=int(rng.integers(1, 3)), rate=float(rng.uniform(0.6, 2.0)),
                                 kv_tier=str(rng.choice(["hbm", "host"])),
                                 placement=str(rng.choice(["scale_up", "scale_out"])))
                    serve.append(rival)
    only = {}  # serving and rollouts held to some KV tiers or expert placements (a study's assumption)
    if rng.uniform() < 0.6:
        only = {"kv_tiers": ("hbm",)} if rng.uniform() < 0.5 else {"placements": ("scale_up",)}
    return LifetimeData(pd.DataFrame(models).set_index("model"), sy, inv, pd.DataFrame(train), pd.DataFrame(serve),
                        demand=float(rng.uniform(0.5, 3)), deploy_weeks=deploy, launch_by=launch_by,
                        rl_train_per_rollout_token=f,
                        power_cap_w=float(rng.uniform(2e4, 6e4)) if rng.uniform() < 0.4 else None,
                        budget_usd=float(rng.uniform(20, 80)) if rng.uniform() < 0.3 else None, meta={"only": only})


def _allowed(d: LifetimeData, row: dict) -> bool:
    """Whether a serving or rollout option is within the instance's KV tiers and expert placements."""
    only = d.meta.get("only", {})
    return row["kv_tier"] in only.get("kv_tiers", (row["kv_tier"],)) and row["placement"] in only.get(
        "placements", (row["placement"],))


def _capacity(opts: list[dict], x: np.ndarray) -> np.ndarray:
    """Capacity of every bundle vector (rows of x): aggregated bundles plus min(prefill, decode)."""
    rate = np.array([o["rate"] for o in opts]) * x
    role = np.array([o["role"] for o in opts])
    both = rate[:, role == "both"].sum(axis=1)
    if (role == "prefill").any() and (role == "decode").any():
        both = both + np.minimum(rate[:, role == "prefill"].sum(axis=1), rate[:, role == "decode"].sum(axis=1))
    return both


def _vectors(opts: list[dict], inv_max: dict) -> np.ndarray:
    """Every bundle vector whose bundles each fit the largest inventory of their system."""
    if not opts:
        return np.zeros((1, 0))
    ranges = [range(int(inv_max[o["system"]] // o["nodes"]) + 1) for o in opts]
    return np.array(list(itertools.product(*ranges)), dtype=float).reshape(-1, len(opts))


def _per_system(opts: list[dict], x: np.ndarray, systems: list[str]) -> np.ndarray:
    """Nodes each bundle vector occupies per system (vectors x systems)."""
    return np.stack([(x * np.array([o["nodes"] * (o["system"] == s) for o in opts])).sum(axis=1) if opts
                     else np.zeros(len(x)) for s in systems], axis=1)


def brute_force(d: LifetimeData) -> float | None:
    """Every model, pre-training layout and length (any number of weeks that trains its tokens), RL layout, start
    week, rollout and serving bundle vector (of the options within the instance's KV tiers and expert placements,
    each option a class of its own): no code shared with the program. RL lasts the weeks its training
    layout needs (where rollouts are not trained, a power of two or the deadline; none without RL); rollouts
    generate the model's rollout tokens over those weeks and feed the training every week."""
    systems = list(d.systems.index)
    weeks = list(range(d.launch_by + d.deploy_weeks))
    inv = d.inventory.to_numpy()
    inv_max = {s: float(d.inventory.loc[s].max()) for s in systems}
    price = d.systems["usd_per_node_week"].to_numpy()
    power = d.systems["power_per_node_w"].to_numpy()
    best = math.inf
    for name, row in d.models.iterrows():
        tr = d.train[d.train["model"] == name].to_dict("records")
        srv = [o for o in d.serve[(d.serve["model"] == name) & (d.serve["phase"] == "serve")].to_dict("records")
               if _allowed(d, o)]
        rol = [o for o in d.serve[(d.serve["model"] == name) & (d.serve["phase"] == "rl")].to_dict("records")
               if _allowed(d, o)]
        xs = _vectors(srv, inv_max)
        xs = xs[_capacity(srv, xs) >= d.demand - 1e-9]
        if not len(xs):
            continue
        s_nodes = _per_system(srv, xs, systems)  # serving vectors x systems
        xr = _vectors(rol, inv_max) if rol else np.zeros((1, 0))
        gen = _capacity(rol, xr) if rol else np.zeros(1)
        r_nodes = _per_system(rol, xr, systems)
        if row["rl_train_tokens"] > 0:
            modes = [(o, math.ceil(row["rl_train_tokens"] / o["tokens_per_week"] - 1e-9)) for o in tr
                     if o["phase"] == "rl"]
        else:
            lengths = sorted({1, 2, 4, 8, 16, 32, 64, d.launch_by} & set(range(1, d.launch_by + 1)))
            modes = [(None, n) for n in (lengths if row["rollout_tokens"] > 0 else [0])]
        for pre in (o for o in tr if o["phase"] == "pretrain"):
            for (rl, n_rl), start, n_pre in itertools.product(modes, weeks, weeks):
                launch = start + n_pre + n_rl
                if launch > d.launch_by or n_pre * pre["tokens_per_week"] < row["pretrain_tokens"] - 1e-9:
                    continue
                rl_rate = rl["tokens_per_week"] if rl else 0.0
                ok = (n_rl * gen >= row["rollout_tokens"] - 1e-9) & (
                    n_rl * np.minimum(rl_rate, d.rl_train_per_rollout_token * gen) >= row["rl_train_tokens"] - 1e-9)
                if not ok.any():
                    continue
                pre_held = np.zeros((len(systems), len(weeks)))
                pre_held[systems.index(pre["system"]), start:start + n_pre] = pre["nodes"]
                rl_held = r_nodes[ok].copy()  # rollout vectors x systems
                if rl:
                    rl_held[:, systems.index(rl["system"])] += rl["nodes"]
                total = (float((pre_held * price[:, None]).sum()) + n_rl * (rl_held * price).sum(axis=1))[:, None] \
                    + d.deploy_weeks * (s_nodes * price).sum(axis=1)[None, :]  # rollout x serving vectors
                feasible = np.ones(total.shape, dtype=bool)
                for t in weeks:
                    use = pre_held[:, t][None, None, :] + rl_held[:, None, :] * (start + n_pre <= t < launch) \
                        + s_nodes[None, :, :] * (launch <= t < launch + d.deploy_weeks)
                    feasible &= (use <= inv[:, t] + 1e-9).all(axis=2)
                    if d.power_cap_w is not None:
                        feasible &= (use * power).sum(axis=2) <= d.power_cap_w + 1e-6
                if d.budget_usd is not None:
                    feasible &= total <= d.budget_usd + 1e-9
                if feasible.any():
                    best = min(best, float(total[feasible].min()))
    return best if math.isfinite(best) else None


class TestLifetimeContract(FormulationContract):
    instances = 30

    def make_instance(self, rng):
        return random_instance(rng)

    def solve_mip(self, d):
        r = solve_lifetime(narrow_serving(d, **d.meta["only"]))
        return r.result.objective, r, r.result

    def solve_exhaustive(self, d):
        return brute_force(d)

    def recheck(self, d, r, value):
        assert check(narrow_serving(d, **d.meta["only"]), r) == []
        assert all(_allowed(d, o) for o in r.bundles.to_dict("records"))
        assert r.cost["total"] == pytest.approx(value, rel=1e-6)

    def build_model(self, d):
        return compile_model(build(d))[0]


# -- the first-order condition of the continuous relaxation ---------------------------------------------------------


def _linear_case(sizes: np.ndarray, target: float, k_train: float, k_rl: float, k_inf: float, rho: float,
                 served: float) -> LifetimeData:
    """Dense models of N parameters whose every phase costs k N per token, to one part in a million: pre-training
    on nodes that train the model's tokens in one week, rollouts (rho tokens per pre-training token, untrained)
    in one week, serving ``served`` tokens in one week. Each cost is a whole number of nodes at 1 USD per week,
    near a million of them, so the rounding is a millionth.
    """
    models, train, serve = [], [], []
    for n in sizes:
        name = f"n{n:.6g}"
        d = tokens_for_loss(n, target)
        if not math.isfinite(d):
            continue
        models.append({"model": name, "pretrain_tokens": d, "rollout_tokens": rho * d, "rl_train_tokens": 0.0})
        train.append({"phase": "pretrain", "model": name, "system": "s", "nodes": round(k_train * n * d),
                      "tokens_per_week": d})
        if rho > 0:
            bundles = round(k_rl * n * rho * d)
            serve.append({"phase": "rl", "model": name, "system": "s", "role": "both", "group": 0, "nodes": 1,
                          "rate": rho * d / bundles * (1 + 1e-12)})
        bundles = round(k_inf * n * served)
        serve.append({"phase": "serve", "model": name, "system": "s", "role": "both", "group": 0, "nodes": 1,
                      "rate": 1.0 / bundles * (1 + 1e-12)})
    sy = pd.DataFrame({"usd_per_node_week": [1.0], "power_per_node_w": [1.0]}, index=["s"])
    inv = pd.DataFrame([[1e12] * 3], index=["s"], columns=[0, 1, 2])
    return LifetimeData(pd.DataFrame(models).set_index("model"), sy, inv, pd.DataFrame(train), pd.DataFrame(serve),
                        demand=1.0, deploy_weeks=1, launch_by=2)


@pytest.mark.parametrize("served, rho", [(2e14, 0.0), (2e14, 0.67), (2e13, 0.67), (2e15, 0.0)])
def test_the_optimum_meets_the_first_order_condition(served, rho):
    """The continuous relaxation: N continuous, D(N) the tokens that reach the target loss, every cost k N per token.
    d/dN [k' N D(N) + k_inf N D_inf] = 0 with k' = k_train + rho k_rl gives C_inf / C_train = alpha a / (beta b) - 1
    (`inference_to_training_ratio`; a = A / N^alpha, b = B / D^beta). On a fine menu of sizes the program's optimum
    is a neighbour of the continuous optimum N_c, its split C_serve / (C_pretrain + C_rl) brackets the condition's
    with its neighbours', and its cost is the continuous minimum to within the menu's step."""
    from scipy.optimize import brentq

    usd_per_flop = 1e-18
    k_train, k_rl, k_inf = 6 * usd_per_flop, 2 * 3 * usd_per_flop, 2 * 3 * usd_per_flop  # the lecture's factors
    target = 1.9
    sizes = np.geomspace(3e9, 3e12, 121)
    d = _linear_case(sizes, target, k_train, k_rl, k_inf, rho, served)
    r = solve_lifetime(d)
    assert r.result.status == "optimal" and check(d, r) == []

    def cost(n):
        return (k_train + rho * k_rl) * n * tokens_for_loss(n, target) + k_inf * n * served

    def residual(n):  # C_inf / C_train - the first-order condition's ratio: zero at the continuous optimum
        c_train = (k_train + rho * k_rl) * n * tokens_for_loss(n, target)
        return k_inf * n * served / c_train - inference_to_training_ratio(n, tokens_for_loss(n, target))

    lo = next(n for n in sizes if math.isfinite(tokens_for_loss(n, target)))
    n_c = brentq(residual, lo * 1.001, sizes[-1])
    i = [f"n{n:.6g}" for n in sizes].index(r.model)
    assert sizes[i - 1] <= n_c <= sizes[i + 1]  # the menu point next to the continuous optimum
    assert residual(sizes[i - 1]) < 0 < residual(sizes[i + 1])  # the condition changes sign across the optimum
    split = r.cost["serve"] / (r.cost["pretrain"] + r.cost["rl"])
    assert split == pytest.approx(k_inf * sizes[i] * served / ((k_train + rho * k_rl) * sizes[i]
                                                                * tokens_for_loss(sizes[i], target)), rel=1e-5)
    assert r.cost["total"] == pytest.approx(cost(n_c), rel=2e-3)  # the menu steps 6% in N; the cost is flat there


# -- diagnosis, the greedy, the study -------------------------------------------------------------------------------


def _one_model(inventory: float = 10.0, launch_by: int = 4, power: float | None = None,
               budget: float | None = None) -> LifetimeData:
    """One model: 4 tokens of pre-training on a 2-node layout (2 a week), 2 rollout tokens trained at 1 a week on a
    1-node layout, rollouts of 1 token a week per node, serving 3 requests/s at 1 per node."""
    models = pd.DataFrame([{"model": "m", "pretrain_tokens": 4.0, "rollout_tokens": 2.0, "rl_train_tokens": 2.0}]
                          ).set_index("model")
    train = pd.DataFrame([{"phase": "pretrain", "model": "m", "system": "s", "nodes": 2, "tokens_per_week": 2.0},
                          {"phase": "rl", "model": "m", "system": "s", "nodes": 1, "tokens_per_week": 1.0}])
    serve = pd.DataFrame([{"phase": "rl", "model": "m", "system": "s", "role": "both", "group": 0, "nodes": 1,
                           "rate": 1.0},
                          {"phase": "serve", "model": "m", "system": "s", "role": "both", "group": 0, "nodes": 1,
                           "rate": 1.0}])
    sy = pd.DataFrame({"usd_per_node_week": [1.0], "power_per_node_w": [1e3]}, index=["s"])
    weeks = launch_by + 2
    inv = pd.DataFrame([[inventory] * weeks], index=["s"], columns=range(weeks))
    return LifetimeData(models, sy, inv, train, serve, demand=3.0, deploy_weeks=2, launch_by=launch_by,
                        rl_train_per_rollout_token=1.0, power_cap_w=power, budget_usd=budget)


def test_a_small_life_is_solved_as_the_arithmetic_says():
    """2 weeks of 2 nodes, 2 weeks of 1 + 1 nodes, 2 weeks of 3 nodes: 4 + 4 + 6 = 14 USD, launch in week 4."""
    d = _one_model()
    r = solve_lifetime(d)
    assert r.cost == {"pretrain": 4.0, "rl": 4.0, "serve": 6.0, "total": 14.0}
    assert (r.pretrain_weeks, r.rl_weeks, r.launch) == (2, 2, 4) and check(d, r) == []


def test_the_deadline_binds_only_where_no_earlier_start_fits():
    """The same plan launched on the deadline: from week 2 it could have started in week 0 at the same cost (the
    deadline holds nothing); from week 0, with the deadline right after RL, it does."""
    from dse.optimize.equalization import Quality, binds, result_of

    d = _one_model(launch_by=6)
    r = solve_lifetime(d)
    late = result_of(d, replace(r.plan, start=6 - r.launch + r.start), r.result)
    assert late.launch == 6 and late.cost == r.cost
    assert not any(b.startswith("deadline") for b in binds(d, late, Quality(2.0), False))
    tight = solve_lifetime(_one_model(launch_by=4))
    assert tight.launch == 4 and any(b.startswith("deadline") for b in binds(_one_model(launch_by=4), tight,
                                                                                Quality(2.0), False))


def test_infeasible_life_names_the_binding_resource_and_shortfall():
    with pytest.raises(InfeasibleError, match=r"inventory of s in week \d: short by 1 nodes"):
        solve_lifetime(_one_model(inventory=2.0))  # serving needs 3 nodes
    with pytest.raises(InfeasibleError, match="the deadline is short by 1 weeks"):
        solve_lifetime(_one_model(launch_by=3))  # 2 weeks of pre-training and 2 of RL
    with pytest.raises(InfeasibleError, match="site power in week .*: short by 1 kW"):
        solve_lifetime(_one_model(power=2e3))
    with pytest.raises(InfeasibleError, match="budget: short by 4 USD"):
        solve_lifetime(_one_model(budget=10.0))


def test_a_bundle_carries_every_replica_a_node_holds():
    """A 4-chip replica on an 8-chip node: its bundle (one node) carries two replicas' rate; a 16-chip one spans two
    nodes and carries its own."""
    from dse.optimize.codesign import moe_model
    from dse.optimize.equalization import ModelOptions, Quality, lifetime_data

    model = moe_model(2048, 1, 8)
    life = _life_of_h100()
    serve = pd.DataFrame([{"system": "h100", "role": "both", "group": 0, "chips": c, "kv_tier": "hbm",
                           "placement": "scale_up", "requests_per_s": 3.0, "usd_per_s": 1.0, "nodes": n,
                           "per_bundle": p} for c, n, p in ((4, 1, 2), (16, 2, 1))])
    mo = ModelOptions(model, pd.DataFrame(), pd.DataFrame(), serve, serve.iloc[:0])
    d, _ = lifetime_data([mo], Quality(target_loss=3.0), life)
    assert d.serve["rate"].tolist() == [6.0, 3.0]


def _life_of_h100():
    from dse.catalog.hardware import default_systems
    from dse.optimize.equalization import Life
    from dse.physics.serving import Request

    return Life(serve=Request(prompt=100, output=10), demand_tokens_per_s=100.0, deploy_weeks=1, launch_by=2,
                rollout=Request(prompt=10, output=10), rl_per_pretrain_token=0.0, rl_tokens=0.0,
                rl_trained_share=0.0, seq=1024, batch_tokens=1e6, rl_batch_tokens=1e6,
                systems={"h100": default_systems("rental_3yr")["h100"]}, train_systems=("h100",),
                inventory={"h100": [4, 4, 4]})


def test_highs_presolve_is_not_trusted_with_infeasible():
    """OR-Tools 9.15's HiGHS presolve calls this life infeasible (a model without RL that has rollout options): 2 weeks
    of pre-training on 2 nodes, then a node serving for 2 weeks, 6 USD. The bridge confirms HiGHS's "infeasible"
    without presolve and finds it."""
    models = pd.DataFrame([{"model": "m", "pretrain_tokens": 1.75, "rollout_tokens": 0.0, "rl_train_tokens": 0.0}]
                          ).set_index("model")
    train = pd.DataFrame([{"phase": "pretrain", "model": "m", "system": "s", "nodes": 2, "tokens_per_week": 1.2},
                          {"phase": "rl", "model": "m", "system": "s", "nodes": 1, "tokens_per_week": 2.3}])
    serve = pd.DataFrame([{"phase": p, "model": "m", "system": "s", "role": r, "group": 0, "nodes": n, "rate": x}
                          for p, r, n, x in (("serve", "both", 1, 0.75), ("rl", "prefill", 1, 1.6),
                                             ("rl", "decode", 2, 1.9))])
    sy = pd.DataFrame({"usd_per_node_week": [1.0], "power_per_node_w": [1e4]}, index=["s"])
    inv = pd.DataFrame([[2.0, 5, 5, 5, 5, 5, 4]], index=["s"], columns=range(7))
    d = LifetimeData(models, sy, inv, train, serve, demand=0.66, deploy_weeks=2, launch_by=5)
    for warm in (True, False):
        r = solve_lifetime(d, "highs", warm_start=warm)
        assert r.result.status == "optimal" and r.cost["total"] == pytest.approx(6.0) and check(d, r) == []


def test_the_program_is_never_worse_than_the_greedy():
    from dse.optimize.equalization import cost_of, greedy, held

    rng = np.random.default_rng(11)
    seen = 0
    for _ in range(40):
        d = random_instance(rng)
        g = greedy(d)
        if g is None:
            continue
        assert solve_lifetime(d).cost["total"] <= cost_of(d, held(d, g))["total"] * (1 + 1e-9)
        seen += 1
    assert seen >= 10


def test_compute_equalization_study_finds_the_split_and_what_moves_it(shipped):
    import json

    run = shipped("compute_equalization")
    assert run.returncode == 0, run.stderr[-2000:]
    s = json.loads(run.stdout)
    assert s["kind"] == "compute_equalization" and s["status"] == "optimal" and s["solver"]["gap"] <= 1e-6
    assert s["objective"] == "lifetime_usd" and s["solver"]["name"].startswith("pyomo -> ortools scip")
    b = s["optimum"]
    # the optimum reaches the target loss with its tokens (the scaling law, recomputed)
    assert loss(b["params_effective"], b["pretrain_tokens"], "hoffmann", 3e14) == pytest.approx(1.82, abs=1e-9)
    assert b["lifetime_usd"] == pytest.approx(b["pretrain_usd"] + b["rl_usd"] + b["serve_usd"], rel=1e-12)
    assert b["pretrain_share"] + b["rl_share"] + b["serve_share"] == pytest.approx(1.0)
    assert b["launch_week"] <= 26 and b["pretrain_weeks"] + b["rl_weeks"] + b["start_week"] == b["launch_week"]
    lec = s["lecture"]
    assert lec["inference_tokens"] == pytest.approx(50e6 * 9 * 7 * 86400)  # the lecture's ~200T: 50M/s x 9 weeks
    assert lec["lecture_ratio_at_100b_active"] == pytest.approx(50e6 * 9 * 7 * 86400 / 2e12)
    curve = run.table("lifetime")
    menu = curve[(curve["source"] == "menu") & (curve["status"] == "optimal")]
    # exactness: the whole menu's program equals the least of the programs of each model alone (separate solves)
    assert s["menu_optimum"]["lifetime_usd"] == pytest.approx(menu["lifetime_usd"].min(), rel=1e-9)
    assert b["lifetime_usd"] <= s["menu_optimum"]["lifetime_usd"] * (1 + 1e-12)
    assert (curve["source"] == "optuna").any()
    fleet = run.table("fleet")
    per_week = fleet.groupby(["system", "week"]).agg(nodes=("nodes", "sum"), inventory=("inventory_nodes", "first"))
    assert (per_week["nodes"] <= per_week["inventory"]).all()
    assert set(fleet.loc[fleet["nodes"] > 0, "phase"]) == {"pretrain", "rl", "serve"}
    sens = run.table("sensitivity")
    demand = sens[sens["dimension"] == "demand_tokens_per_s"].astype({"value": float}).sort_values("value")
    assert len(demand) == 4  # three solved and the study's own
    assert demand["overtraining_ratio"].is_monotonic_increasing  # more demand: train a smaller model longer
    assert demand["serve_share"].is_monotonic_increasing
    assert {"no RL", "dense models only", "no data limit", "KV cache in HBM only",
            "experts within one scale-up domain"} <= set(sens.loc[sens["dimension"] == "assumption", "value"])
    # the KV tier and the expert placement are the program's choices: holding them to fewer never costs less
    held = sens[sens["value"].isin(["KV cache in HBM only", "experts within one scale-up domain"])]
    assert (held["lifetime_usd"] >= s["menu_optimum"]["lifetime_usd"] * (1 - 1e-9)).all()
    assert (held.loc[held["value"] == "experts within one scale-up domain", "serve_scale_out_share"] == 0).all()
    for key in ("serve", "rollout"):
        assert 0 <= b[f"{key}_host_kv_share"] <= 1 and 0 <= b[f"{key}_scale_out_share"] <= 1
    assert {"kv_tier", "placement"} <= set(run.table("phases").columns)
    for name in ("lifetime.png", "fleet.png", "sensitivity.png", "phases.csv", "menu.csv"):
        assert (run.out / name).exists(), name
    assert s["gain_over_greedy"] >= 0


def _tiny_study(tmp_path, **equalization) -> str:
    import yaml

    doc = {"study": "tiny-life", "kind": "compute_equalization", "description": "a tiny life", "expect": "an answer",
           "workloads": [{"name": "chat", "prompt": 2000, "output": 500, "tpot_max_s": 0.05,
                          "demand_tokens_per_s": 2e5}],
           "space": {"systems": ["h100"], "weights_dtypes": ["fp8"], "kv_dtypes": ["fp8"], "kv_tiers": ["hbm"],
                     "tp": [1, 2], "pp": [1], "max_racks": 1, "max_chips_per_stage": 8},
           "equalization": {"family": {"widths": [2048, 4096], "sparsities": [1]}, "quality": {"target_loss": 2.05},
                            "train_systems": ["h100"], "inventory_nodes": {"h100": 64}, "launch_by_week": 8,
                            "deployment_weeks": 2, "rl": {"output": 1000}, "refine_trials": 0,
                            "sensitivity": {"assumptions": False}, **equalization}}
    path = tmp_path / "life.yaml"
    path.write_text(yaml.safe_dump(doc))
    return str(path)


def test_bad_study_exits_2_and_an_infeasible_one_3_naming_the_shortfall(tmp_path):
    from pathlib import Path

    import yaml
    from helpers import dse

    r = dse("run", _tiny_study(tmp_path, inventory_nodes={"b200": 4}), "--out", str(tmp_path / "o"))
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "equalization.inventory_nodes" in " ".join(r.stderr.split())
    path = _tiny_study(tmp_path, inventory_nodes={"h100": 8})
    doc = yaml.safe_load(Path(path).read_text())
    doc["workloads"][0]["demand_tokens_per_s"] = 2e7  # a few hundred nodes of serving
    Path(path).write_text(yaml.safe_dump(doc))
    r = dse("run", path, "--out", str(tmp_path / "o"))
    assert r.returncode == 3, r.stderr
    assert "inventory of h100 in week" in " ".join(r.stderr.split()) and "short by" in r.stderr


def test_training_options_are_the_fastest_layout_of_each_node_count():
    """Per node count, the training option is the fastest fitting layout of every TP x PP x chunks per device x EP x
    recomputation (each evaluated alone by the scalar step, its stage partition the step's own), and each option
    trains faster than every option on fewer nodes (a slower one on more nodes costs more and finishes no sooner)."""
    from dse.catalog.hardware import default_systems
    from dse.errors import InputError
    from dse.optimize.codesign import moe_model
    from dse.optimize.phase_options import training_options
    from dse.physics.training import TrainLayout, train_step

    model, system = moe_model(1024, 8, 2), default_systems("rental_3yr")["h100"]
    seq, tokens = 2048, 2 ** 21
    got = training_options(model, system, [1, 2], seq, tokens)
    best = {}
    for nodes in (1, 2):
        chips = 8 * nodes
        for tp, pp, v, ep, rec in itertools.product((1, 2, 4, 8), (1, 2, 4, 8, 16), (1, 2, 4), (1, 8, 16, 32, 64),
                                                    ("selective", "full")):
            if chips % (tp * pp) or (pp == 1 and v > 1) or pp * v > model.spec.n_layers:
                continue
            dp = chips // (tp * pp)
            if model.spec.attention.n_heads % tp or (ep > 1 and (model.spec.ffn.n_experts % ep or (dp * tp) % ep)):
                continue
            batch = max(1, round(tokens / seq / dp)) * dp
            try:
                r = train_step(model, system, TrainLayout(tp=tp, pp=pp, dp=dp, ep=ep, interleave=v, recompute=rec),
                               batch, seq)
            except InputError:  # more chunks than the model places
                continue
            if r["fits"] and r["tokens_per_s"] > best.get(nodes, (0.0,))[0]:
                best[nodes] = (r["tokens_per_s"], r["stages"])
    front = [n for n in (1, 2) if n in best and all(best[n][0] > best[m][0] for m in (1, 2) if m < n and m in best)]
    assert got["nodes"].tolist() == front
    for _, row in got.iterrows():
        assert row["tokens_per_s"] == pytest.approx(best[row["nodes"]][0], rel=1e-9)
        assert tuple(int(x) for x in row["stages"].split(",")) == best[row["nodes"]][1]
