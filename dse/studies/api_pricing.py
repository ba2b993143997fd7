"""``kind: api_pricing``: what price sheets reveal (KV bytes per token from a context price step) and how
to price context tiers from the serving optimum at each context.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Annotated

import numpy as np
import pandas as pd
from pydantic import Field, field_validator

from dse.catalog.models import get_model
from dse.errors import InputError
from dse.optimize.space import build_space
from dse.studies.base import MAX_LIST, Strict, StudySpec
from dse.studies.common import mode_tables, pick_modes
from dse.studies.contract import Progress, Solved, status_of

FORWARD_KEYS = ("serving", "system", "chips", "batch", "usd_per_request", "usd_per_mtok_input", "usd_per_mtok_output",
                "usd_per_mtok_blended", "prefill_share", "ttft_s", "tpot_s")
"""What the forward table gives of each context's optimum (request level: its cost split as the physics splits it,
`dse.physics.serving`)."""
USES_STORAGE = False
OBJECTIVE = "usd_per_request_fluid"
"""What the forward pricing minimizes at each context: USD per request at the fluid pool ratio (prefill counted), whose
input and output parts price the tiers."""
WORKERS = False


class SheetSpec(Strict):
    name: str
    step_context: float = Field(gt=0, le=1e9)
    input: list[float]  # [below the step, above]
    output: list[float]

    @field_validator("input", "output")
    @classmethod
    def _pair(cls, v: list[float]) -> list[float]:
        if len(v) != 2 or any(x <= 0 for x in v):
            raise ValueError(f"must be [price below the step, price above], both > 0, got {v}")
        return v


class PricingSpec(Strict):
    """Inverse: what price sheets imply; forward: tier prices for a model on the study's space."""

    sheets: list[SheetSpec] = Field(min_length=1, max_length=MAX_LIST)
    system: str = "tpu-v7"
    actives_b: list[Annotated[float, Field(gt=0, le=1e5)]] = Field(default=[25, 50, 100, 200, 400], min_length=1,
                                                                   max_length=MAX_LIST)
    contexts: list[Annotated[int, Field(gt=0, le=100_000_000)]] = Field(
        default=[8000, 32000, 128000, 200000, 400000, 1000000], min_length=1, max_length=MAX_LIST)
    tier_boundaries: list[Annotated[int, Field(gt=0, le=100_000_000)]] = Field(default=[200000, 1000000],
                                                                               min_length=1, max_length=MAX_LIST)
    margin: float = Field(default=0.5, ge=0, le=100)

    @field_validator("tier_boundaries")
    @classmethod
    def _ascending(cls, v: list[int]) -> list[int]:
        if any(b <= a for a, b in zip(v, v[1:], strict=False)):
            raise ValueError(f"must ascend strictly, got {v}")
        return v


class Spec(StudySpec):
    pricing: PricingSpec | None = None

    system_fields = ("pricing.system",)

    def check_catalog(self, path: Path, models: dict) -> None:
        if self.pricing is None:
            raise InputError(f"{path}: missing required field 'pricing' (price sheets and the forward contexts)")
        for m in self.models:  # a context served forward is a request of that many tokens
            for i, ctx in enumerate(self.pricing.contexts):
                models[m].check_context(ctx, self.allow_beyond_trained_context,
                                        f"{path}: field 'pricing.contexts.{i}' for model '{m}'")


def solve(spec: Spec, progress: Progress | None = None, storage: str | None = None) -> Solved:
    """Inverse reading of price sheets; forward tier prices from the serving optimum at each context."""
    from dse.catalog.hardware import get_system
    from dse.optimize.pricing import PriceSheet, consistent_architectures, inverse, tier_prices

    pr = spec.pricing
    system = get_system(pr.system)
    inv, consistent = [], []
    for sh in pr.sheets:
        sheet = PriceSheet(sh.name, sh.step_context, sh.input[0], sh.input[1], sh.output[0], sh.output[1])
        inv += inverse(sheet, system, np.array(pr.actives_b) * 1e9)
        consistent += consistent_architectures(sheet, system, np.array(pr.actives_b) * 1e9)
    fwd, tiers, results = [], [], []
    opts = spec.options()
    base = spec.workloads[0]
    for i, model_id in enumerate(spec.models):
        model = get_model(model_id)
        costs = []
        for j, ctx in enumerate(pr.contexts):
            if progress:
                progress(f"{model_id}: context {ctx:,}", i * len(pr.contexts) + j, len(spec.models) * len(pr.contexts))
            # a request of ctx tokens: its prompt the context less the workload's output (the whole context where
            # that leaves none), served at the request-level optimum (prefill counted, the workload's targets)
            w = replace(base.workload(), name=f"{ctx}", prompt=ctx - base.output if ctx > base.output else ctx)
            space = build_space(model, w, opts)
            row = {"model": model_id, "context": ctx,
                   "beyond_trained_context": model.check_context(w.prompt + w.output, allow_beyond=True)}
            picked, reasons = pick_modes(space, mode_tables(space, spec), opts.ideal) if not space.blocks.empty \
                else ([], [space.empty_reason])
            if not picked:
                fwd.append({**row, "status": "infeasible", "reason": "; ".join(reasons)})
                costs.append((np.inf, np.inf))
                continue
            e, r = picked[0]
            results.append(r.result)
            fwd.append({**row, "status": r.result.status, "reason": "",
                        **{k: e[k] for k in FORWARD_KEYS}})
            costs.append((e["usd_per_mtok_input"], e["usd_per_mtok_output"]))
        ctxs, cost = np.array(pr.contexts, dtype=float), np.array(costs, dtype=float).reshape(-1, 2)
        by_kind = [tier_prices(ctxs, cost[:, k], pr.tier_boundaries, pr.margin) for k in (0, 1)]
        for t_in, t_out in zip(*by_kind, strict=True):
            tiers.append({"model": model_id, "tier_from": t_in["tier_from"], "tier_to": t_in["tier_to"],
                          "max_input_cost_usd_per_mtok": t_in["max_cost_usd_per_mtok"],
                          "price_input_usd_per_mtok": t_in["price_usd_per_mtok"],
                          "max_output_cost_usd_per_mtok": t_out["max_cost_usd_per_mtok"],
                          "price_output_usd_per_mtok": t_out["price_usd_per_mtok"],
                          "beyond_trained_context": any(f["beyond_trained_context"] for f in fwd
                                                        if f["model"] == model_id
                                                        and t_in["tier_from"] < f["context"] <= t_in["tier_to"])})
    tables = {"pricing_inverse": pd.DataFrame(inv), "pricing_consistent": pd.DataFrame(consistent),
              "pricing_forward": pd.DataFrame(fwd), "pricing_tiers": pd.DataFrame(tiers)}
    return Solved(status=status_of(results, []), tables=tables, results=results)


PLOTS = ()


def headline(summary: dict, tables: dict[str, pd.DataFrame]) -> list[str]:
    """KV bytes per token each price sheet implies, and the context tiers priced from the serving optimum."""
    lines = []
    for sheet, g in tables["pricing_inverse"].groupby("sheet", sort=False):
        pairs = ", ".join(f"{b:,.0f} B/token at {a / 1e9:g}B active" for a, b in
                          zip(g["params_active"], g["kv_bytes_per_token"], strict=True))
        lines.append(f"{sheet}: the price step implies {pairs}")
    for _, r in tables["pricing_tiers"].iterrows():
        lines.append(f"{r['model']}: context {r['tier_from']:,.0f}-{r['tier_to']:,.0f} tokens priced at "
                     f"{r['price_input_usd_per_mtok']:.3g} USD/Mtok input, {r['price_output_usd_per_mtok']:.3g} "
                     f"output (worst cost {r['max_input_cost_usd_per_mtok']:.3g} and "
                     f"{r['max_output_cost_usd_per_mtok']:.3g})"
                     + (" - beyond the model's trained context" if r["beyond_trained_context"] else ""))
    return lines
