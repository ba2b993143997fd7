"""``kind: compute_equalization``: the cheapest life of one model family (pre-training, RL and serving sharing one
inventory of nodes over weeks) as a mixed-integer program, with the equalization of the three phases' costs as a
finding: the optimum's split, its overtraining ratio, the marginal cost of each phase, the lifetime cost against
the overtraining ratio (the menu, refined by Optuna), the fleet over time, what binds, and how the split moves with
the demand, the deployment's length and the RL recipe.
"""

from __future__ import annotations

import hashlib
import json
import math
import time
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Literal

import pandas as pd
from pydantic import Field, model_validator

from dse.catalog.hardware import default_systems, priced
from dse.errors import InfeasibleError, InputError, mask_url
from dse.studies.base import MAX_LIST, Strict, StudySpec
from dse.studies.contract import Plot, Progress, Solved, StudyOutput
from dse.studies.plotting import save, subplots

if TYPE_CHECKING:
    from dse.optimize.equalization import ModelOptions

USES_STORAGE = True
OBJECTIVE = "lifetime_usd"
"""What the lifetime program minimizes: the USD of training, RL and serving over the model's life."""
WORKERS = False
Tokens = Annotated[float, Field(ge=0, le=1e18)]


class FamilySpec(Strict):
    """The menu of models: DeepSeek-V3-shaped, every width x sparsity (experts per active expert) x top-k."""

    widths: list[Annotated[int, Field(ge=1024, le=32768)]] = Field(min_length=1, max_length=MAX_LIST)
    sparsities: list[Annotated[int, Field(ge=1, le=256)]] = Field(default=[1, 8, 32], min_length=1,
                                                                  max_length=MAX_LIST)
    top_k: list[Annotated[int, Field(ge=1, le=16)]] = Field(default=[8], min_length=1, max_length=8)
    gamma: float = Field(default=1 / 3, gt=0, lt=1)
    """Effective size of a routed model, N_active x (N_total / N_active)^gamma (`dse.optimize.codesign`)."""

    @model_validator(mode="after")
    def _size(self) -> FamilySpec:
        n = len(self.widths) * len(self.sparsities) * len(self.top_k)
        if n > 128:
            raise ValueError(f"widths x sparsities x top_k must be at most 128 models, got {n}")
        return self


class QualitySpec(Strict):
    """The loss every model must reach, the fit that says how many tokens it takes, and the unique data."""

    target_loss: float = Field(gt=1.0, le=10.0)
    loss_fit: Literal["hoffmann", "epoch"] = "hoffmann"
    unique_tokens: float | None = Field(default=None, gt=0, le=1e18)
    """Unique pre-training tokens available (None: no limit); beyond them tokens repeat (Muennighoff et al. 2023)."""


class RLSpec(Strict):
    """The RL recipe: rollout tokens to generate (per pre-training token, and absolute), the share of rollouts
    trained on (0: none, the lecture's 2 N per token; 1: every rollout, 2 + 6 (P + O) / O), one rollout's lengths.
    """

    tokens_per_pretrain_token: float = Field(default=0.67, ge=0, le=100)
    tokens: Tokens = 0.0
    trained_share: float = Field(default=1.0, ge=0, le=1)
    prompt: int = Field(default=1000, ge=1, le=1_000_000)
    output: int = Field(default=7000, ge=1, le=1_000_000)
    tpot_max_s: float | None = Field(default=None, gt=0, le=3600)
    batch_tokens: float = Field(default=16e6, gt=0, le=1e12)


class PretrainSpec(Strict):
    seq: int = Field(default=8192, ge=128, le=1_048_576)
    batch_tokens: float = Field(default=64e6, gt=0, le=1e12)
    gemm_dtypes: list[Literal["bf16", "fp8"]] = Field(default=["bf16"], min_length=1, max_length=2)


class NextModelSpec(Strict):
    """The next model's training, overlapping this one's life: nodes it takes per system from a week on."""

    from_week: int = Field(ge=0, le=520)
    nodes: dict[str, Annotated[int, Field(ge=0, le=10_000_000)]]


class SensitivitySpec(Strict):
    """Values each dimension takes, one at a time from the study's own (every point re-solves the program)."""

    demands_tokens_per_s: list[Annotated[float, Field(gt=0, le=1e13)]] = Field(default=[], max_length=MAX_LIST)
    deployment_weeks: list[Annotated[int, Field(ge=1, le=260)]] = Field(default=[], max_length=MAX_LIST)
    trained_shares: list[Annotated[float, Field(ge=0, le=1)]] = Field(default=[], max_length=MAX_LIST)
    assumptions: bool = True
    """Also re-solve with each stated assumption switched: the other loss fit, no data limit, dense models only,
    no RL."""


class EqualizationSpec(Strict):
    """The family, the quality, the phases' recipes, the weeks, the fleet and the sweeps."""

    family: FamilySpec
    quality: QualitySpec
    rl: RLSpec = RLSpec()
    pretrain: PretrainSpec = PretrainSpec()
    deployment_weeks: int = Field(default=9, ge=1, le=260)
    launch_by_week: int = Field(default=26, ge=1, le=260)
    week_days: float = Field(default=7.0, gt=0, le=31)
    train_systems: list[str] = Field(min_length=1, max_length=MAX_LIST)
    inventory_nodes: dict[str, Annotated[int, Field(ge=0, le=10_000_000)]]
    """Nodes (an 8-GPU server, an NVL72 rack: the system's scale-up domain) of each system the phases share."""
    next_model: NextModelSpec | None = None
    power_cap_kw: float | None = Field(default=None, gt=0, le=1e9)
    budget_usd: float | None = Field(default=None, gt=0, le=1e15)
    refine_trials: int = Field(default=6, ge=0, le=200)
    """Optuna trials refining the optimum's width between its menu neighbours."""
    sensitivity: SensitivitySpec = SensitivitySpec()


class Spec(StudySpec):
    equalization: EqualizationSpec | None = None

    models_required = False
    system_fields = ("equalization.train_systems",)

    def check_catalog(self, path: Path, models: dict) -> None:
        e = self.equalization
        if e is None:
            raise InputError(f"{path}: missing required field 'equalization' (family, quality, train_systems, "
                             "inventory_nodes)")
        if self.space.systems == "all":
            raise InputError(f"{path}: field 'space.systems': list the systems the fleet serves on (not 'all')")
        if self.workloads[0].demand_tokens_per_s is None:
            raise InputError(f"{path}: field 'workloads.0.demand_tokens_per_s': the served demand is required")
        fleet = [*self.space.systems, *e.train_systems]
        for s in fleet:
            if s not in e.inventory_nodes:
                raise InputError(f"{path}: field 'equalization.inventory_nodes': no inventory for system '{s}'; "
                                 f"allowed: one entry per system of space.systems and equalization.train_systems")
        for s in e.inventory_nodes:
            if s not in fleet:
                raise InputError(f"{path}: field 'equalization.inventory_nodes.{s}': not a system of space.systems "
                                 f"or equalization.train_systems; allowed: {', '.join(dict.fromkeys(fleet))}")
        if e.next_model is not None:
            for s, n in e.next_model.nodes.items():
                if s not in e.inventory_nodes or n > e.inventory_nodes[s]:
                    raise InputError(f"{path}: field 'equalization.next_model.nodes.{s}': {n} nodes; allowed: a "
                                     "system of the inventory, at most its nodes")
        catalog = default_systems(self.price)
        for s in dict.fromkeys(fleet):
            if s not in self.prices and math.isnan(catalog[s].price_per_s):
                raise InputError(f"{path}: field 'equalization.inventory_nodes.{s}': '{s}' has no price of kind "
                                 f"'{self.price}'; supply one in prices.{s} (USD per chip-hour) or choose another kind")
            if e.power_cap_kw is not None and math.isnan(catalog[s].power_all_in_w) and math.isnan(catalog[s].power):
                raise InputError(f"{path}: field 'equalization.power_cap_kw': '{s}' has no power figure in the "
                                 "catalog; drop the cap or the system")


def _life(spec: Spec):
    """The program's inputs from the study: the model family, the quality, and the life of the phases."""
    from dse.optimize.equalization import Life, Quality
    from dse.physics.serving import Request

    e = spec.equalization
    w = spec.workloads[0]
    horizon = e.launch_by_week + max([e.deployment_weeks, *e.sensitivity.deployment_weeks])
    inventory = {}
    for s, n in e.inventory_nodes.items():
        lent = e.next_model.nodes.get(s, 0) if e.next_model else 0
        inventory[s] = [n - (lent if e.next_model and t >= e.next_model.from_week else 0) for t in range(horizon)]
    catalog = default_systems(spec.price)
    systems = {s: priced(catalog[s], spec.price, spec.prices.get(s)) if s in spec.prices else catalog[s]
               for s in inventory}
    life = Life(serve=w.workload(), demand_tokens_per_s=float(w.demand_tokens_per_s),
                deploy_weeks=e.deployment_weeks, launch_by=e.launch_by_week,
                rollout=Request(prompt=e.rl.prompt, output=e.rl.output, name="rollout", tpot_max=e.rl.tpot_max_s),
                rl_per_pretrain_token=e.rl.tokens_per_pretrain_token, rl_tokens=e.rl.tokens,
                rl_trained_share=e.rl.trained_share, seq=e.pretrain.seq, batch_tokens=e.pretrain.batch_tokens,
                rl_batch_tokens=e.rl.batch_tokens, systems=systems, train_systems=tuple(e.train_systems),
                inventory=inventory, power_cap_w=None if e.power_cap_kw is None else e.power_cap_kw * 1e3,
                budget_usd=e.budget_usd, gemm_dtypes=tuple(e.pretrain.gemm_dtypes), ideal=spec.space.ideal,
                week_s=e.week_days * 86400.0)
    quality = Quality(e.quality.target_loss, e.quality.loss_fit, e.quality.unique_tokens, e.family.gamma)
    return life, quality


def menu_of(spec: Spec) -> list[tuple[int, int, int]]:
    """The menu's models as (width, sparsity, top-k): every width of every sparsity and top-k, dense ones once."""
    f = spec.equalization.family
    out = []
    for s in f.sparsities:
        for k in ([f.top_k[0]] if s == 1 else f.top_k):
            out += [(w, s, k) for w in sorted(f.widths)]
    return out


class LifeSolver:
    """Solves the program for the study, keeping each model's options (the physics is computed once per model)."""

    def __init__(self, spec: Spec) -> None:
        self.spec = spec
        self.life, self.quality = _life(spec)
        self.options: dict[tuple[int, int, int], ModelOptions] = {}
        self.results: list = []

    def options_of(self, key: tuple[int, int, int]) -> ModelOptions:
        """The model's options in every phase (computed on first use)."""
        from dse.optimize.codesign import moe_model
        from dse.optimize.equalization import model_options

        if key not in self.options:
            e = self.spec.equalization
            shares = [e.rl.trained_share, *e.sensitivity.trained_shares]
            life = replace(self.life, rl_trained_share=max(shares))  # RL layouts wherever a variant trains rollouts
            self.options[key] = model_options(moe_model(*key), life, self.spec.options())
        return self.options[key]

    def solve(self, keys: list[tuple[int, int, int]], life=None, quality=None, only: dict | None = None):
        """The program over the models ``keys``: (data, result, models left out); InfeasibleError when none fits.
        ``only`` holds serving and rollouts to some KV tiers and expert placements (`narrow_serving`).
        """
        from dse.optimize.equalization import lifetime_data, narrow_serving, solve_lifetime

        life, quality = life or self.life, quality or self.quality
        if life.rl_trained_share == 0:
            opts = [replace(self.options_of(k), rl_train=self.options_of(k).rl_train.iloc[:0]) for k in keys]
        else:
            opts = [self.options_of(k) for k in keys]
        d, left = lifetime_data(opts, quality, life)
        d = narrow_serving(d, **(only or {}))
        r = solve_lifetime(d, self.spec.solver.name, self.spec.solver.time_limit_s)
        self.results.append(r.result)
        return d, r, left


def _row(d, r, quality, **extra) -> dict:
    from dse.optimize.equalization import figures

    return {**extra, **figures(d, r, quality)}


def _failed(exc: Exception, **extra) -> dict:
    return {**extra, "status": "infeasible", "reason": str(exc)}


def _curve(sv: LifeSolver, menu: list, progress: Progress | None) -> list[dict]:
    """Each menu model alone in the program: the lifetime cost curve against the overtraining ratio."""
    from dse.optimize.equalization import menu_row

    rows = []
    for j, key in enumerate(menu):
        if progress:
            progress(f"model {key[0]} wide, sparsity {key[1]}: its best life", j, len(menu))
        base = {"source": "menu", "width": key[0], "sparsity": key[1], "top_k_menu": key[2]}
        try:
            d, r, left = sv.solve([key])
            rows.append(_row(d, r, sv.quality, **base))
        except InfeasibleError as exc:
            rows.append({**base, **menu_row(sv.options_of(key).model, sv.quality, sv.life), **_failed(exc)})
    if progress:
        progress("each model's best life", len(menu), len(menu))
    return rows


def _refine(sv: LifeSolver, spec: Spec, best: dict, storage: str | None, progress: Progress | None) -> list[dict]:
    """Optuna (TPE) over the width between the optimum's menu neighbours, at its sparsity and top-k; each trial
    solves the program for that model alone. Trials live in the study's storage (a re-run reuses them).
    """
    import optuna

    from dse.catalog.cache import sources_digest
    from dse.studies.optuna_sweep import open_storage

    e = spec.equalization
    widths = sorted(e.family.widths)
    w0 = int(best["width"])
    i = widths.index(w0)
    lo, hi = widths[max(i - 1, 0)], widths[min(i + 1, len(widths) - 1)]
    if e.refine_trials == 0 or hi - lo < 128 or storage is None:
        return []
    doc = {"equalization": e.model_dump(mode="json"), "space": spec.space.model_dump(mode="json"),
           "workload": spec.workloads[0].model_dump(mode="json"), "price": spec.price, "prices": spec.prices,
           "solver": spec.solver.model_dump(mode="json"), "around": [best["sparsity"], best["top_k_menu"], lo, hi],
           "sources": sources_digest()}  # a refitted catalog or changed physics: the trials are solved again
    digest = hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()[:12]
    study = optuna.create_study(study_name=f"{spec.study}/refine/{digest}", storage=open_storage(storage),
                                direction="minimize", load_if_exists=True,
                                sampler=optuna.samplers.TPESampler(seed=0, n_startup_trials=min(3, e.refine_trials)))
    if study.metric_names != ["lifetime_usd"]:
        study.set_metric_names(["lifetime_usd"])
    key0 = (int(best["sparsity"]), int(best["top_k_menu"]))

    def objective(trial: optuna.Trial) -> float:
        width = trial.suggest_int("width", lo, hi, step=64)
        key = (width, *key0)
        base = {"source": "optuna", "trial": trial.number, "width": width, "sparsity": key[1], "top_k_menu": key[2]}
        try:
            d, r, _ = sv.solve([key])
            row = _row(d, r, sv.quality, **base)
        except InfeasibleError as exc:
            row = _failed(exc, **base)
        trial.set_user_attr("result", json.dumps(row, default=float))
        return row.get("lifetime_usd", 1e30)

    done = len(study.get_trials(states=(optuna.trial.TrialState.COMPLETE,)))
    for n in range(done, e.refine_trials + 1):
        if progress:
            progress(f"refining the width between {lo} and {hi} (Optuna)", n, e.refine_trials)
        if n < e.refine_trials:
            study.optimize(objective, n_trials=1)
    return [json.loads(t.user_attrs["result"]) for t in study.get_trials(states=(optuna.trial.TrialState.COMPLETE,))]


def _variants(sv: LifeSolver, spec: Spec, menu: list, optimum: dict, progress: Progress | None) -> list[dict]:
    """The program re-solved with one dimension moved at a time: demand, deployment weeks, trained share; and with
    each stated assumption switched (the other loss fit at the loss the optimum reaches in it, so that both ask for
    the same quality).
    """
    e = spec.equalization
    s = e.sensitivity
    points = [("demand_tokens_per_s", v, {"demand_tokens_per_s": v}, None, menu) for v in s.demands_tokens_per_s]
    points += [("deployment_weeks", v, {"deploy_weeks": v}, None, menu) for v in s.deployment_weeks]
    points += [("trained_share", v, {"rl_trained_share": v}, None, menu) for v in s.trained_shares]
    if s.assumptions:
        from dse.optimize.scaling import loss

        other = "epoch" if e.quality.loss_fit == "hoffmann" else "hoffmann"
        same = loss(optimum["params_effective"], optimum["pretrain_tokens"], other, e.quality.unique_tokens)
        points.append(("assumption", f"loss fit {other} (target {same:.4f}: the optimum's quality in that fit)", {},
                       {"fit": other, "target_loss": same}, menu))
        if e.quality.unique_tokens is not None:
            points.append(("assumption", "no data limit", {}, {"unique_tokens": None}, menu))
        dense = [k for k in menu if k[1] == 1]
        if dense and len(dense) < len(menu):
            points.append(("assumption", "dense models only", {}, None, dense))
        if e.rl.tokens_per_pretrain_token > 0 or e.rl.tokens > 0:
            points.append(("assumption", "no RL", {"rl_per_pretrain_token": 0.0, "rl_tokens": 0.0}, None, menu))
        tiers, places = (set(pd.concat([sv.options_of(k).serve[c] for k in menu] + [sv.options_of(k).rollout[c]
                                                                                    for k in menu]))
                         for c in ("kv_tier", "placement"))
        if len(tiers) > 1 and "hbm" in tiers:
            points.append(("assumption", "KV cache in HBM only", {}, None, menu, {"kv_tiers": ("hbm",)}))
        if len(places) > 1:
            points.append(("assumption", "experts within one scale-up domain", {}, None, menu,
                           {"placements": ("scale_up",)}))
    rows = [{"dimension": dim, "value": value, **optimum, "source": "study"} for dim, value, present in (
        ("demand_tokens_per_s", sv.life.demand_tokens_per_s, s.demands_tokens_per_s),
        ("deployment_weeks", e.deployment_weeks, s.deployment_weeks),
        ("trained_share", e.rl.trained_share, s.trained_shares)) if present and value not in present]
    for j, (dim, value, life_change, quality_change, keys, *only) in enumerate(points):
        if progress:
            progress(f"sensitivity: {dim} = {value}", j, len(points))
        base = {"dimension": dim, "value": value}
        try:
            d, r, _ = sv.solve(keys, replace(sv.life, **life_change),
                               replace(sv.quality, **quality_change) if quality_change else None,
                               only[0] if only else None)
            rows.append(_row(d, r, replace(sv.quality, **quality_change) if quality_change else sv.quality,
                             **base, source="solved"))
        except InfeasibleError as exc:
            rows.append(_failed(exc, **base))
    if progress and points:
        progress("sensitivity", len(points), len(points))
    return rows


def solve(spec: Spec, progress: Progress | None = None, storage: str | None = None) -> Solved:
    """The program over the whole menu, each model alone (the curve), the Optuna refinement, the sensitivities."""
    from dse.optimize.equalization import binds, check, cost_of, greedy, held, menu_row

    t0 = time.perf_counter()
    e = spec.equalization
    sv = LifeSolver(spec)
    menu = menu_of(spec)
    for j, key in enumerate(menu):
        if progress:
            progress(f"physics of each phase: model {key[0]} wide, sparsity {key[1]}", j, len(menu))
        sv.options_of(key)
    if progress:
        progress("the lifetime program over the whole menu", len(menu), len(menu))
    w = spec.workloads[0]
    try:
        d, r, left = sv.solve(menu)
    except InfeasibleError as exc:
        return Solved(status="infeasible", infeasible=[{"model": "family", "workload": w.name, "reason": str(exc)}],
                      tables={"menu": pd.DataFrame([menu_row(sv.options_of(k).model, sv.quality, sv.life)
                                                    for k in menu])},
                      results=sv.results, solver_name=f"pyomo -> ortools {spec.solver.name}")
    bad = check(d, r)
    if bad:
        raise RuntimeError(f"re-check of the lifetime plan failed: {bad}")
    key = next(k for k in menu if sv.options_of(k).model.id == r.model)
    optimum = _row(d, r, sv.quality, source="program", width=key[0], sparsity=key[1], top_k_menu=key[2])
    g = greedy(d)
    greedy_usd = cost_of(d, held(d, g))["total"] if g is not None else math.inf
    curve = _curve(sv, menu, progress)
    trials = _refine(sv, spec, optimum, storage, progress)
    refined = min((t for t in trials if "lifetime_usd" in t), key=lambda t: t["lifetime_usd"], default=None)
    best_d, best_r, best = d, r, optimum
    if refined is not None and refined["lifetime_usd"] < optimum["lifetime_usd"] * (1 - 1e-9):
        best_d, best_r, _ = sv.solve([(int(refined["width"]), int(refined["sparsity"]), int(refined["top_k_menu"]))])
        best = _row(best_d, best_r, sv.quality, source="optuna", width=refined["width"],
                    sparsity=refined["sparsity"], top_k_menu=refined["top_k_menu"])
    widths = sorted(e.family.widths)
    edge = best["width"] in (widths[0], widths[-1]) and len(widths) > 1
    sens = _variants(sv, spec, menu, optimum, progress)
    fleet = best_r.nodes.assign(chips=lambda t: t["nodes"] * t["system"].map(
        {s: int(sv.life.systems[s].scaleup_domain) for s in best_d.systems.index}),
        inventory_nodes=lambda t: [best_d.inventory.loc[s, wk] for s, wk in zip(t["system"], t["week"], strict=True)])
    served = best["served_tokens"]
    lecture = {"inference_tokens": served, "lecture_pretrain_tokens": served,
               "lecture_ratio_at_100b_active": served / (20 * 100e9),
               "lecture_ratio_at_optimum_active": served / best["chinchilla_tokens"],
               "program_ratio": best["overtraining_ratio"], "program_pretrain_tokens": best["pretrain_tokens"],
               "program_pretrain_to_inference_tokens": best["pretrain_to_served_tokens"],
               "inference_inefficiency": best["inference_inefficiency"], "lecture_inference_inefficiency": 3.0,
               "serve_to_training_cost": best["serve_to_training"],
               "foc_serve_to_training": best["foc_serve_to_training"]}
    curve_table = pd.DataFrame(curve + [{**t, "source": "optuna"} for t in trials])
    lecture["first_order"] = _first_order(curve_table, best)
    sens_table = pd.DataFrame(sens)
    if not sens_table.empty and "d_model" in sens_table:
        sens_table["menu_edge"] = sens_table["d_model"].isin([widths[0], widths[-1]]) & (len(widths) > 1)
    tables = {"lifetime": curve_table,
              "phases": _phases(best_d, best_r), "fleet": fleet, "sensitivity": sens_table,
              "menu": pd.DataFrame([menu_row(sv.options_of(k).model, sv.quality, sv.life) for k in menu])}
    statuses = {x.status for x in sv.results}
    return Solved(
        status="optimal" if statuses == {"optimal"} else "feasible", tables=tables, results=sv.results,
        solver_name=f"pyomo -> ortools {spec.solver.name} (Optuna TPE refines the width)",
        facts={"objective": OBJECTIVE, "optimum": best, "menu_optimum": optimum, "lecture": lecture,
               "binds": binds(best_d, best_r, sv.quality, edge), "left_out": left,
               "greedy_usd": greedy_usd, "gain_over_greedy": 1 - optimum["lifetime_usd"] / greedy_usd
               if math.isfinite(greedy_usd) else None,
               "storage": mask_url(storage) if storage else None, "study_wall_s": time.perf_counter() - t0})


def _first_order(curve: pd.DataFrame, best: dict) -> dict:
    """The first-order condition along the optimum's family: at each solved width, serving / (pre-training + RL)
    against the condition's ratio (`dse.optimize.scaling.inference_to_training_ratio`); where the difference changes
    sign lies the continuous optimum.
    """
    if "serve_to_training" not in curve:
        return {}
    fam = curve[(curve["sparsity"] == best["sparsity"]) & (curve["top_k_menu"] == best["top_k_menu"])
                & curve["serve_to_training"].notna()].drop_duplicates("width").sort_values("width")
    points = [{"width": int(r["width"]), "overtraining_ratio": float(r["overtraining_ratio"]),
               "lifetime_usd": float(r["lifetime_usd"]), "serve_to_training": float(r["serve_to_training"]),
               "condition": float(r["foc_serve_to_training"]),
               "residual": float(r["serve_to_training"] - r["foc_serve_to_training"])} for _, r in fam.iterrows()]
    crossing = [(a["width"], b["width"]) for a, b in zip(points, points[1:], strict=False)
                if a["residual"] < 0 <= b["residual"] or a["residual"] > 0 >= b["residual"]]
    return {"points": points, "sign_change_between_widths": crossing}


def _phases(d, r) -> pd.DataFrame:
    """The optimum's phases: weeks, configurations, nodes and USD."""
    rows = []
    price = d.systems["usd_per_node_week"]
    for _, t in r.train.iterrows():
        weeks = r.pretrain_weeks if t["phase"] == "pretrain" else r.rl_weeks
        rows.append({"phase": t["phase"], "part": "training", "system": t["system"], "nodes": t["nodes"],
                     "chips": t["chips"], "weeks": weeks,
                     "layout": f"TP{t['tp']} PP{t['pp']}{_chunks(t)} DP{t['dp']} EP{t['ep']}, "
                               f"{t['recompute']} recomputation, {t['gemm_dtype']} GEMMs, "
                               f"batch {t['global_batch']} x {t['seq']}",
                     "stages": t.get("stages", ""),
                     "tokens_per_s": t["tokens_per_s"], "mfu": t["mfu"],
                     "usd": weeks * t["nodes"] * float(price[t["system"]])})
    for _, b in r.bundles.iterrows():
        weeks = r.rl_weeks if b["phase"] == "rl" else d.deploy_weeks
        rows.append({"phase": b["phase"], "part": "rollouts" if b["phase"] == "rl" else "serving",
                     "system": b["system"], "role": b["role"], "nodes": b["nodes"] * b["bundles"],
                     "chips": b["chips"] * b["replicas"], "replicas": b["replicas"], "weeks": weeks,
                     "layout": f"TP{b['tp']} EP{b['ep']} PP{b['pp']} DP{b['dp']}, batch {b['batch']}, KV in "
                               f"{b['kv_tier']}, experts {b['placement'].replace('_', '-')}, {b['numerics']}",
                     "kv_tier": b["kv_tier"], "placement": b["placement"],
                     "requests_per_s": b["requests_per_s"] * b["replicas"],
                     "usd": weeks * b["nodes"] * b["bundles"] * float(price[b["system"]])})
    return pd.DataFrame(rows)


def _chunks(t: pd.Series) -> str:
    """A pipeline's chunks per device where interleaved."""
    v = int(t.get("interleave", 1) or 1)
    return f" ({v} chunks per device)" if v > 1 else ""


def _lifetime_plot(out: StudyOutput, path: Path) -> None:
    t = out.frames["lifetime"]
    ok = t[pd.to_numeric(t.get("lifetime_usd"), errors="coerce").notna()] if "lifetime_usd" in t else t
    fig, axes = subplots(1, 2, figsize=(12, 4.5))
    best = out.summary["optimum"]
    for (s, k), g in ok[ok["source"] == "menu"].groupby(["sparsity", "top_k_menu"]):
        g = g.sort_values("overtraining_ratio")
        label = "dense" if s == 1 else f"sparsity {s}, top-{k}"
        axes[0].plot(g["overtraining_ratio"], g["lifetime_usd"], "o-", ms=4, label=label)
    opt = ok[ok["source"] == "optuna"]
    if len(opt):
        axes[0].plot(opt["overtraining_ratio"], opt["lifetime_usd"], "x", color="grey", label="Optuna trials")
    axes[0].plot([best["overtraining_ratio"]], [best["lifetime_usd"]], "k*", ms=14, label="optimum")
    fam = ok[(ok["sparsity"] == best["sparsity"]) & (ok["top_k_menu"] == best["top_k_menu"])].sort_values(
        "overtraining_ratio")
    for col, label in (("pretrain_usd", "pre-training"), ("rl_usd", "RL"), ("serve_usd", "serving")):
        axes[1].plot(fam["overtraining_ratio"], fam[col], "o-", ms=4, label=label)
    axes[1].axvline(best["overtraining_ratio"], color="k", ls=":", lw=1)
    for ax in axes:
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("overtraining ratio: pre-training tokens / (20 x active parameters)")
        ax.legend(fontsize=8)
    axes[0].set_ylabel("lifetime USD (pre-training + RL + serving)")
    axes[1].set_ylabel("USD per phase")
    axes[0].set_title("Lifetime cost against the overtraining ratio (star: optimum)", fontsize=10)
    axes[1].set_title("The phases' costs along the optimum's family", fontsize=10)
    save(fig, path)


def _fleet_plot(out: StudyOutput, path: Path) -> None:
    t = out.frames["fleet"]
    fig, ax = subplots(figsize=(10, 4))
    weeks = sorted(t["week"].unique())
    bottom = pd.Series(0.0, index=weeks)
    for (phase, system), g in t.groupby(["phase", "system"], sort=False):
        y = g.set_index("week")["chips"].reindex(weeks, fill_value=0)
        if y.sum() == 0:
            continue
        ax.bar(weeks, y, bottom=bottom, label=f"{phase} on {system}", width=0.9)
        bottom += y
    ax.set_xlabel("week")
    ax.set_ylabel("GPUs held")
    ax.set_title("The fleet over the model's life", fontsize=10)
    ax.legend(fontsize=8)
    save(fig, path)


def _sensitivity_plot(out: StudyOutput, path: Path) -> None:
    t = out.frames["sensitivity"]
    t = t[t["dimension"] != "assumption"] if "dimension" in t else t
    dims = [d for d in ("demand_tokens_per_s", "deployment_weeks", "trained_share") if d in set(t["dimension"])]
    fig, axes = subplots(1, max(len(dims), 1), figsize=(4.5 * max(len(dims), 1), 4), squeeze=False)
    for ax, dim in zip(axes[0], dims, strict=False):
        g = t[(t["dimension"] == dim) & t["lifetime_usd"].notna()].astype({"value": float}).sort_values("value")
        x = g["value"]
        ax.stackplot(x, g["pretrain_share"], g["rl_share"], g["serve_share"],
                     labels=["pre-training", "RL", "serving"], alpha=0.8)
        ax2 = ax.twinx()
        ax2.plot(x, g["overtraining_ratio"], "k.-", label="overtraining ratio")
        ax2.set_ylabel("overtraining ratio")
        ax2.set_yscale("log")
        if dim == "demand_tokens_per_s":
            ax.set_xscale("log")
        ax.set_xlabel(dim.replace("_", " "))
        ax.set_ylabel("share of lifetime USD")
        ax.legend(fontsize=7, loc="lower left")
    save(fig, path)


PLOTS = (Plot("lifetime", "lifetime.png", _lifetime_plot, needs="lifetime_usd"),
         Plot("fleet", "fleet.png", _fleet_plot, needs="chips"),
         Plot("sensitivity", "sensitivity.png", _sensitivity_plot, needs="lifetime_usd"))


def headline(summary: dict, tables: dict[str, pd.DataFrame]) -> list[str]:
    """The optimum, its split and ratio against the lecture's, what binds."""
    if "optimum" not in summary:  # infeasible: the reasons are printed beside
        return []
    b, lec = summary["optimum"], summary["lecture"]
    return [
        f"{b['model']}: {b['params_active'] / 1e9:.0f}B active of {b['params_total'] / 1e9:.0f}B, trained on "
        f"{b['pretrain_tokens']:.3g} tokens = {b['overtraining_ratio']:.0f}x Chinchilla (the lecture: "
        f"{lec['lecture_ratio_at_optimum_active']:.0f}x at this size, {lec['lecture_ratio_at_100b_active']:.0f}x at "
        "100B active)",
        f"lifetime {b['lifetime_usd']:,.0f} USD = pre-training {b['pretrain_share']:.0%} : RL {b['rl_share']:.0%} : "
        f"serving {b['serve_share']:.0%}; serving / (pre-training + RL) {b['serve_to_training']:.2f}; inference "
        f"costs {b['inference_inefficiency']:.1f}x pre-training per FLOP (the lecture: 3)",
        *_condition(lec.get("first_order", {})),
        f"weeks: pre-training {b['pretrain_weeks']}, RL {b['rl_weeks']}, launch in week {b['launch_week']}",
        *_classes(b),
        *[f"binds: {x}" for x in summary["binds"]],
        *_moves(summary, tables),
    ]


def _classes(b: dict) -> list[str]:
    """The serving KV tier and expert placement the optimum picks, as shares of each phase's nodes."""
    parts = [f"{label}: KV in host memory on {b[f'{key}_host_kv_share']:.0%} of its nodes, experts across scale-up "
             f"domains on {b[f'{key}_scale_out_share']:.0%}" for key, label in (("serve", "serving"),
                                                                               ("rollout", "rollouts"))
             if isinstance(b.get(f"{key}_host_kv_share"), float) and not math.isnan(b[f"{key}_host_kv_share"])]
    return ["; ".join(parts)] if parts else []


def _condition(first: dict) -> list[str]:
    """Where the first-order condition is met along the optimum's family."""
    points = {p["width"]: p for p in first.get("points", [])}
    lines = []
    for lo, hi in first.get("sign_change_between_widths", []):
        a, b = points[lo], points[hi]
        lines.append(f"first-order condition (serving / training = alpha a / (beta b) - 1) met between widths {lo} "
                     f"and {hi} (ratios {a['overtraining_ratio']:.0f}x-{b['overtraining_ratio']:.0f}x, lifetime "
                     f"{a['lifetime_usd']:,.0f} and {b['lifetime_usd']:,.0f} USD)")
    return lines


def _moves(summary: dict, tables: dict[str, pd.DataFrame]) -> list[str]:
    """How far each sensitivity and assumption moves the overtraining ratio and the lifetime cost."""
    t = tables.get("sensitivity")
    if t is None or t.empty or "overtraining_ratio" not in t:
        return []
    b = summary["menu_optimum"]
    parts = []
    for _, r in t[t["source"] != "study"].iterrows() if "source" in t else t.iterrows():
        if pd.isna(r.get("overtraining_ratio")) or pd.isna(r.get("lifetime_usd")):
            parts.append(f"{r['dimension']} {r['value']}: infeasible")
            continue
        name = r["value"] if r["dimension"] == "assumption" else f"{r['dimension']} {float(r['value']):g}"
        parts.append(f"{str(name).split(' (')[0]}: {r['overtraining_ratio']:.0f}x, "
                     f"{r['lifetime_usd'] / b['lifetime_usd']:.2f} of the cost")
    return [f"moves (menu optimum {b['overtraining_ratio']:.0f}x): " + "; ".join(parts)]
