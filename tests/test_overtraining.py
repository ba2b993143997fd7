"""Compute equalization and overtraining: loss fits, the training cluster (the layout search), the shipped study."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from dse.optimize.equalization import LOSS_FITS, dense_model, loss, tokens_for_loss
from dse.studies.base import load_study

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("fit", sorted(LOSS_FITS))
def test_tokens_for_loss_inverts_the_loss(fit):
    for n, d in ((7e10, 1.4e12), (4e11, 1.5e13)):
        assert tokens_for_loss(n, loss(n, d, fit), fit) == pytest.approx(d, rel=1e-9)
    assert tokens_for_loss(1e9, 1.0, fit) == float("inf")  # below the irreducible loss


def test_chinchilla_reference_points_share_compute():
    # Chinchilla (70B, 1.4T) beats Gopher (280B, 300B) at the same compute in the Hoffmann fit
    assert loss(70e9, 1.4e12) < loss(280e9, 300e9)


def test_dense_family_hits_requested_sizes():
    for n in (3e10, 1e11, 4e11):
        assert dense_model(n).params_total == pytest.approx(n, rel=0.25)  # widths in steps of 1,024


def test_training_cluster_is_the_cheapest_layout_of_the_whole_space():
    """The overtraining study's training cluster: the search without the bound that skips layouts too slow even at
    peak finds the same cheapest layout, within the chip budget and the deadline."""
    from dse.catalog.hardware import default_systems
    from dse.optimize.equalization import Lifetime, train_cluster, training_job, training_space
    from dse.optimize.space import SpaceOptions
    from dse.optimize.training import search
    from dse.physics.serving import Request

    life = Lifetime(1.82, "hoffmann", 5e7, 60, 0.67, 3, 3, 8192, 16e6, 120, 32768, ("h100", "gb200-nvl72"),
                    Request(name="chat", prompt=2000, output=500, tpot_max=0.05), SpaceOptions())
    model = dense_model(1e11)
    tokens = tokens_for_loss(model.params_total, 1.82)
    best = train_cluster(model, life, tokens)
    job = training_job(life, tokens)
    whole = search(model, [default_systems()[s] for s in life.train_systems], training_space(life), job)
    assert best["usd"] == pytest.approx(whole.best["usd"], rel=1e-12)
    assert best["usd_per_token"] == pytest.approx(best["usd"] / tokens, rel=1e-12)
    assert best["chips"] <= 32768 and best["time_s"] <= 120 * 86400
    assert whole.layouts > 5_000


def test_overtraining_study_reproduces_the_lecture(shipped):
    r = shipped("overtraining")
    out = r.out
    assert r.returncode == 0, r.stderr
    summary = json.loads(r.stdout)
    assert summary["lecture"]["inference_tokens_at_50M_per_s_for_60_days"] == pytest.approx(2.592e14)
    best = pd.DataFrame(summary["optimum"]).sort_values("demand_tokens_per_s")
    assert best["overtraining_ratio"].is_monotonic_increasing  # more demand: train further past Chinchilla
    assert best["params"].is_monotonic_decreasing  # ... a smaller model
    mid = best[best["demand_tokens_per_s"] == 5e7].iloc[0]
    assert mid["overtraining_ratio"] > 10
    assert 0.1 < mid["pretrain_tokens"] / mid["inference_tokens"] < 10
    terms = mid[["pretrain_usd", "rl_usd", "inference_usd"]].astype(float)
    assert terms.max() / terms.min() < 5  # equalization: the three costs are of one order
    spec = load_study(ROOT / "studies" / "overtraining.yaml")
    for _, b in best.iterrows():
        assert loss(b["params"], b["pretrain_tokens"]) == pytest.approx(spec.overtraining.target_loss, rel=1e-9)
        assert b["train_chips"] <= spec.overtraining.chip_budget and b["train_days"] <= spec.overtraining.deadline_days
    table = pd.read_csv(out / "overtraining.csv")
    assert len(table) == 3 * spec.overtraining.trials
    assert (out / "overtraining.png").exists()
