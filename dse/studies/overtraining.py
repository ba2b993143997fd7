"""``kind: overtraining``: how far past Chinchilla to train given the inference demand: the lifetime cost
of pre-training, RL and inference at a target loss, searched over model size by Optuna (TPE).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Literal

import numpy as np
import pandas as pd
from pydantic import Field, model_validator

from dse.errors import InfeasibleError, mask_url
from dse.optimize.training import SOLVER_NAME
from dse.studies.base import MAX_LIST, Strict, StudySpec
from dse.studies.contract import Plot, Progress, Solved, SolverStats, StudyOutput
from dse.studies.plotting import save, subplots

USES_STORAGE = True
WORKERS = False


class OvertrainingSpec(Strict):
    """Lifetime cost at a target loss: pre-training, RL and inference, searched over model size."""

    target_loss: float = Field(default=1.82, gt=0)
    loss_fit: Literal["hoffmann", "epoch"] = "hoffmann"
    demands_tokens_per_s: list[Annotated[float, Field(gt=0, le=1e13)]] = Field(default=[5e6, 5e7, 5e8], min_length=1,
                                                                                max_length=MAX_LIST)
    deployment_days: float = Field(default=60, gt=0, le=36500)
    rl_tokens_per_pretrain_token: float = Field(default=0.67, ge=0)
    rl_flops_factor: float = Field(default=3.0, ge=2.0, le=6.0)
    rl_inefficiency: float = Field(default=3.0, ge=1.0)
    seq: int = Field(default=8192, gt=0, le=10_000_000)
    global_batch_tokens: float = Field(default=16_000_000, gt=0, le=1e12)
    deadline_days: float = Field(default=120, gt=0, le=3650)
    chip_budget: int = Field(default=32768, ge=1, le=10_000_000)
    train_systems: list[str] = Field(default=["h100", "b200", "gb200-nvl72"], max_length=MAX_LIST)
    params_b: list[Annotated[float, Field(gt=0, le=1e6)]] = [10, 3000]
    trials: int = Field(default=40, ge=4, le=2000)

    @model_validator(mode="after")
    def _check(self) -> OvertrainingSpec:
        if len(self.params_b) != 2 or not 0 < self.params_b[0] < self.params_b[1]:
            raise ValueError(f"params_b must be [low, high] with 0 < low < high, got {self.params_b}")
        if not self.demands_tokens_per_s or any(d <= 0 for d in self.demands_tokens_per_s):
            raise ValueError(f"demands_tokens_per_s must list demands > 0, got {self.demands_tokens_per_s}")
        return self


class Spec(StudySpec):
    overtraining: OvertrainingSpec = OvertrainingSpec()

    models_required = False
    system_fields = ("overtraining.train_systems",)


def solve(spec: Spec, progress: Progress | None = None, storage: str | None = None) -> Solved:
    """Optuna over model size (TPE, seeded), one study per inference demand, in the given storage."""
    import math as _math

    import optuna

    from dse.optimize.equalization import Lifetime, equalization_heuristic, lifetime_cost
    from dse.studies.optuna_sweep import open_storage

    o = spec.overtraining
    rdb = open_storage(storage)
    workload = spec.workloads[0].workload()
    rows, best, infeasible = [], [], []
    lo, hi = _math.log10(o.params_b[0] * 1e9), _math.log10(o.params_b[1] * 1e9)
    for k, demand in enumerate(o.demands_tokens_per_s):
        life = Lifetime(o.target_loss, o.loss_fit, demand, o.deployment_days, o.rl_tokens_per_pretrain_token,
                        o.rl_flops_factor, o.rl_inefficiency, o.seq, o.global_batch_tokens, o.deadline_days,
                        o.chip_budget, tuple(o.train_systems), workload, spec.options())
        study = optuna.create_study(study_name=f"{spec.study}-{demand:g}", storage=rdb, direction="minimize",
                                    load_if_exists=True, sampler=optuna.samplers.TPESampler(seed=0, n_startup_trials=8))
        if study.metric_names != ["lifetime_usd"]:
            study.set_metric_names(["lifetime_usd"])

        def objective(trial: optuna.Trial, life: Lifetime = life) -> float:
            n = 10 ** trial.suggest_float("log10_params", lo, hi)
            try:
                r = lifetime_cost(n, life)
            except InfeasibleError as exc:
                trial.set_user_attr("result", json.dumps({"params": n, "reason": str(exc)}))
                return 1e30
            trial.set_user_attr("result", json.dumps(r, default=float))
            return r["lifetime_usd"]

        done = len(study.get_trials(states=(optuna.trial.TrialState.COMPLETE,)))
        label = f"demand {demand:g} tokens/s"

        def report(study: optuna.Study, _trial: optuna.trial.FrozenTrial, label: str = label, k: int = k) -> None:
            n = len(study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,)))
            progress(f"{label}: trial {min(n, o.trials)}/{o.trials}", k * o.trials + min(n, o.trials),
                     len(o.demands_tokens_per_s) * o.trials)

        if progress:
            progress(f"{label}: trial {done}/{o.trials}", k * o.trials + min(done, o.trials),
                     len(o.demands_tokens_per_s) * o.trials)
        if done < o.trials:
            study.optimize(objective, n_trials=o.trials - done, callbacks=[report] if progress else None)
        trials = [t for t in study.get_trials(states=(optuna.trial.TrialState.COMPLETE,))]
        for t in trials:
            rows.append({"demand_tokens_per_s": demand, "trial": t.number, **json.loads(t.user_attrs["result"])})
        b = json.loads(study.best_trial.user_attrs["result"])
        if "lifetime_usd" not in b:  # every trial was infeasible: say why, for the best-known size
            infeasible.append({"model": "dense", "workload": workload.name,
                               "reason": f"demand {demand:g} tokens/s: no model size in {o.params_b[0]:g}B-"
                                         f"{o.params_b[1]:g}B is feasible in {len(trials)} trials: {b['reason']}"})
            continue
        heuristic = equalization_heuristic(life, b["params"])
        best.append({"model": f"dense {b['params'] / 1e9:.0f}B", "workload": workload.name,
                     "demand_tokens_per_s": demand, **b,
                     "heuristic_overtraining_ratio": heuristic["overtraining_ratio"]})
    return Solved(status="feasible" if best else "infeasible", infeasible=infeasible,
                  tables={"overtraining": pd.DataFrame(rows), "overtraining_best": pd.DataFrame(best)},
                  stats=SolverStats(f"optuna TPE + {SOLVER_NAME}", solves=len(rows),
                                    solve_wall_s=float(sum(r.get("solve_wall_s", 0.0) for r in rows))),
                  facts={"optimum": best, "storage": mask_url(storage),
                         "lecture": {"inference_tokens_at_50M_per_s_for_60_days": 50e6 * 60 * 86400}})


def _overtraining(out: StudyOutput, path: Path) -> None:
    table = out.tables['overtraining']
    fig, axes = subplots(1, 2, figsize=(12, 4.5))
    ok = table[np.isfinite(table["lifetime_usd"].astype(float))] if "lifetime_usd" in table else table
    for demand, g in ok.groupby("demand_tokens_per_s"):
        g = g.sort_values("overtraining_ratio")
        axes[0].plot(g["overtraining_ratio"], g["lifetime_usd"], "o", ms=3, label=f"{demand:.3g} tokens/s")
        b = g.loc[g["lifetime_usd"].idxmin()]
        axes[0].plot([b["overtraining_ratio"]], [b["lifetime_usd"]], "k*", ms=12)
        g = g.sort_values("params")
        axes[1].plot(g["params"] / 1e9, g["lifetime_usd"], "o", ms=3, label=f"{demand:.3g} tokens/s")
    for ax in axes:
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_ylabel("lifetime cost (USD): pre-training + RL + inference")
        ax.legend(fontsize=8, title="inference demand")
    axes[0].set_xlabel("pre-training tokens / Chinchilla-optimal (20 per parameter)")
    axes[1].set_xlabel("parameters (billions)")
    axes[0].set_title("Optimum (star) moves past Chinchilla as inference demand grows", fontsize=10)
    save(fig, path)


PLOTS = (Plot("overtraining", "overtraining.png", _overtraining, needs="lifetime_usd"),)


def headline(summary: dict, tables: dict[str, pd.DataFrame]) -> list[str]:
    """One line per inference demand: the optimal model size and what the lifetime costs."""
    return [f"demand {e['demand_tokens_per_s']:.3g} tokens/s: {e['params'] / 1e9:.0f}B params trained on "
            f"{e['pretrain_tokens']:.3g} tokens = {e['overtraining_ratio']:.1f}x Chinchilla; lifetime "
            f"{e['lifetime_usd']:.3g} USD (pre-training {e['pretrain_usd']:.3g}, RL {e['rl_usd']:.3g}, inference "
            f"{e['inference_usd']:.3g}); inference tokens {e['inference_tokens']:.3g}" for e in summary["optimum"]]
