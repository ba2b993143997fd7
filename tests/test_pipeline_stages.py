"""Pipeline stages hold whole layers: the busiest stage of the best contiguous split sets the pass and the memory
per chip (closed form ceil(L / PP), checked against every split); a model whose layers PP divides is unchanged."""

from __future__ import annotations

import itertools
import math

import pytest
from helpers import run

from dse.physics.layout import Layout
from dse.physics.roofline import busiest_stage_layers


def best_split(layers: int, stages: int) -> int:
    """The fewest layers on the busiest stage over every way to cut ``layers`` in order into ``stages``."""
    best = layers
    for cuts in itertools.combinations(range(1, layers), stages - 1):
        bounds = (0, *cuts, layers)
        best = min(best, max(b - a for a, b in itertools.pairwise(bounds)))
    return best


def test_closed_form_is_the_best_contiguous_split():
    assert busiest_stage_layers(61, 4) == 16  # DeepSeek-V3: 16 + 15 + 15 + 15
    assert busiest_stage_layers(61, 8) == 8 and busiest_stage_layers(61, 2) == 31
    assert busiest_stage_layers(80, 4) == 20 and busiest_stage_layers(61, 1) == 61
    for layers in range(1, 15):
        for stages in range(1, min(layers, 6) + 1):
            assert busiest_stage_layers(layers, stages) == best_split(layers, stages), (layers, stages)


def layout(pp: int) -> Layout:
    return Layout(tp=1, dp=8, ep=8, etp=1, pp=pp)


@pytest.mark.parametrize("pp", [2, 4, 8])
def test_the_busiest_stage_sets_the_pass_and_the_memory_per_chip(models, systems, pp):
    m, h200 = models["deepseek-v3"], systems["h200"]
    busiest = math.ceil(61 / pp)
    stretch = pp * busiest / 61  # the pass over an even split's: 64/61 on PP 4
    base = run(m, h200, layout(1), batch=64, context=4096, weights="fp8", kv="fp8")
    r = run(m, h200, layout(pp), batch=64, context=4096, weights="fp8", kv="fp8")
    # weights per chip: the busiest stage's layers (the even split's 1/PP becomes busiest / 61)
    assert r["weights_bytes_per_chip"] == pytest.approx(base["weights_bytes_per_chip"] * busiest / 61, rel=1e-12)
    # PP passes through the busiest stage: compute and memory time, and the KV of PP micro-batches of its layers
    for key in ("compute_s", "memory_s", "kv_bytes_per_chip"):
        assert r[key] == pytest.approx(base[key] * stretch, rel=1e-12), key
    assert r["tokens_per_s"] == pytest.approx(base["tokens_per_s"] * pp / stretch, rel=1e-12)  # memory-bound here
    assert r["sequences_in_flight"] == 64 * pp


def test_a_model_whose_layers_pp_divides_is_unchanged(models, systems):
    m, h100 = models["llama-3.1-70b"], systems["h100"]  # 80 layers
    tp8 = Layout(tp=8, dp=1, ep=1, etp=8, pp=1)
    base = run(m, h100, tp8, batch=32, context=8192)
    for pp in (2, 4, 8):
        r = run(m, h100, Layout(tp=8, dp=1, ep=1, etp=8, pp=pp), batch=32, context=8192)
        assert r["weights_bytes_per_chip"] == pytest.approx(base["weights_bytes_per_chip"] / pp, rel=1e-12)
        for key in ("compute_s", "memory_s", "kv_bytes_per_chip", "balance_batch"):
            assert r[key] == pytest.approx(base[key], rel=1e-12), (pp, key)
