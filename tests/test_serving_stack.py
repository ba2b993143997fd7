"""The serving stack's terms per hardware family and mode: read from calibration/serving_stack.yaml, carried by each
aggregated replica and each prefill pool as the physics evaluates it, and refused where the file misplaces them."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from helpers import candidates_of

from dse.catalog.calibration import family_of
from dse.catalog.frameworks import StackTerms, load_stack_file
from dse.catalog.hardware import default_systems
from dse.catalog.models import get_model
from dse.errors import InputError
from dse.physics.roofline import ModelTable, SystemTable
from dse.physics.serving import RHO_MAX, Request, aggregated, prefill_pool, prefill_ttft, rho_for_ttft

STACK = """stack:
  trtllm:
    aggregated: {fixed_latency_s: 0.1, queue_share: 0.1}
    disaggregated: {fixed_latency_s: 0.2, queue_share: 0.2}
    models:
      deepseek-v3:
        aggregated: {fixed_latency_s: 0.25, queue_share: 0.05}
        disaggregated: {fixed_latency_s: 0.3, queue_share: 0.3}
        families:
          blackwell: {disaggregated: {fixed_latency_s: 0.45, queue_share: 0.15}}
          hopper: {aggregated: {fixed_latency_s: 0.12, queue_share: 0.2}}
"""


def _stacks(tmp_path, text: str) -> dict:
    path = tmp_path / "serving_stack.yaml"
    path.write_text(text)
    return load_stack_file(path)


def test_a_models_disaggregated_terms_on_a_family_are_its_own_there(tmp_path):
    stacks = _stacks(tmp_path, STACK)
    own = stacks["trtllm|deepseek-v3"]
    assert own.disaggregated_of("blackwell") == StackTerms(fixed_latency_s=0.45, queue_share=0.15)
    assert own.disaggregated_of("hopper") == own.disaggregated == StackTerms(fixed_latency_s=0.3, queue_share=0.3)
    assert own.disaggregated_of(None) == own.disaggregated  # a system of no family
    assert own.aggregated_of("hopper") == StackTerms(fixed_latency_s=0.12, queue_share=0.2)
    assert own.aggregated_of("blackwell") == own.aggregated == StackTerms(fixed_latency_s=0.25, queue_share=0.05)
    assert own.terms_of("aggregated", "hopper") == own.aggregated_of("hopper")
    assert stacks["trtllm"].disaggregated_of("blackwell") == StackTerms(fixed_latency_s=0.2, queue_share=0.2)
    assert stacks["trtllm"].aggregated_of("hopper") == StackTerms(fixed_latency_s=0.1, queue_share=0.1)


def test_each_prefill_pool_carries_its_familys_terms(tmp_path):
    """One evaluation over a Hopper and a Blackwell prefill replica: each TTFT adds its own family's fixed latency,
    and the utilisation a TTFT target allows follows it."""
    stack = _stacks(tmp_path, STACK)["trtllm|deepseek-v3"]
    req = Request(prompt=4000, output=500, name="chat", ttft_max=1.0, stack=stack)
    systems = [default_systems()["h200"], default_systems()["b200"]]
    assert [family_of(s.id) for s in systems] == ["hopper", "blackwell"]
    mt, st = ModelTable.build([get_model("deepseek-v3")]), SystemTable.build(systems)
    rows = [(i, 1, 8, 8, 1, 1, 1, 1, 0, 1) for i in range(2)]  # TP1 DP8 EP8, fp8 weights and KV
    pre = prefill_pool(candidates_of(rows, req.prompt), mt, st, req)
    assert pre["stack_latency_s"].tolist() == [0.3, 0.45] and pre["queue_share"].tolist() == [0.3, 0.15]
    s, x = pre["prefill_service_s"], pre["kv_transfer_s"]
    rho = rho_for_ttft(s, x, pre["stack_latency_s"], req)
    ttft = prefill_ttft(s, x, pre["stack_latency_s"], rho, req)
    assert np.all((rho > 0) & (rho < RHO_MAX))  # below the cap: the target met exactly
    assert np.allclose(ttft, 1.0, rtol=1e-9)
    empty = prefill_ttft(s, x, pre["stack_latency_s"], np.zeros(2), req)
    assert empty == pytest.approx(s + x + np.array([0.3, 0.45]), rel=1e-12)
    # the model's terms on every family: the Blackwell replica's TTFT falls by the difference
    plain = dataclasses.replace(req, stack=dataclasses.replace(stack, families=()))
    flat = prefill_pool(candidates_of(rows, req.prompt), mt, st, plain)
    assert flat["stack_latency_s"].tolist() == [0.3, 0.3]


def test_each_aggregated_replica_carries_its_familys_terms(tmp_path):
    """One evaluation over a Hopper and a Blackwell aggregated replica in a closed loop: each TTFT adds its own
    family's fixed latency and queue share of the wave; without the family's terms both take the model's."""
    stack = _stacks(tmp_path, STACK)["trtllm|deepseek-v3"]
    req = Request(prompt=4000, output=500, name="chat", stack=stack, arrival="concurrency")
    assert req.closed_loop
    systems = [default_systems()["h200"], default_systems()["b200"]]
    mt, st = ModelTable.build([get_model("deepseek-v3")]), SystemTable.build(systems)
    rows = [(i, 1, 8, 8, 1, 1, 1, 1, 0, 8) for i in range(2)]  # TP1 DP8 EP8 at 8 per rank, fp8 weights and KV
    r = aggregated(candidates_of(rows, req.prompt + req.output / 2), mt, st, req)
    assert r["stack_latency_s"].tolist() == [0.12, 0.25]
    plain = aggregated(candidates_of(rows, req.prompt + req.output / 2), mt, st,
                       dataclasses.replace(req, stack=dataclasses.replace(stack, families=())))
    assert plain["stack_latency_s"].tolist() == [0.25, 0.25]
    # Blackwell's terms are the model's either way; Hopper's own: a shorter fixed latency, a larger share of the wave
    assert r["ttft_s"][1] == plain["ttft_s"][1]
    wave = r["wave_s"][0]
    assert wave > 0 and r["queue_wait_s"][0] == pytest.approx(max(0.2 * wave, r["wait_floor_s"][0]), rel=1e-12)
    assert r["ttft_s"][0] - r["queue_wait_s"][0] == pytest.approx(
        plain["ttft_s"][0] - plain["queue_wait_s"][0] - 0.13, rel=1e-9)


def test_a_frameworks_terms_on_a_family_serve_the_models_without_their_own(tmp_path):
    """The framework's terms on a family (fitted on all its models' rows there) come after a model's own: a mode the
    model has terms of takes its own (on the family where it has them), a mode it has none of the framework's on the
    family, and a family the framework has none on the framework's."""
    text = STACK.replace("    models:\n", "    families:\n      hopper: {aggregated: {fixed_latency_s: 0.07, "
                         "queue_share: 0.3}, disaggregated: {fixed_latency_s: 0.08, queue_share: 0.4}}\n    models:\n")
    text += "      llama-3.1-8b:\n        disaggregated: {fixed_latency_s: 0.5, queue_share: 0.5}\n"
    stacks = _stacks(tmp_path, text)
    assert stacks["trtllm"].aggregated_of("hopper") == StackTerms(fixed_latency_s=0.07, queue_share=0.3)
    assert stacks["trtllm"].aggregated_of("blackwell") == StackTerms(fixed_latency_s=0.1, queue_share=0.1)
    deepseek, llama = stacks["trtllm|deepseek-v3"], stacks["trtllm|llama-3.1-8b"]
    assert deepseek.aggregated_of("hopper") == StackTerms(fixed_latency_s=0.12, queue_share=0.2)  # its own there
    assert deepseek.disaggregated_of("hopper") == StackTerms(fixed_latency_s=0.3, queue_share=0.3)  # its own
    assert llama.aggregated_of("hopper") == StackTerms(fixed_latency_s=0.07, queue_share=0.3)  # the framework's there
    assert llama.disaggregated_of("hopper") == StackTerms(fixed_latency_s=0.5, queue_share=0.5)  # its own
    assert llama.aggregated_of("blackwell") == StackTerms(fixed_latency_s=0.1, queue_share=0.1)  # the framework's


@pytest.mark.parametrize(("text", "field"), [
    ("stack:\n  trtllm:\n    disaggregated: {fixed_latency_s: 0.2, queue_share: 0.2}\n    families:\n"
     "      blackwell: {prefill: {fixed_latency_s: 0.4, queue_share: 0.1}}\n", "stack.trtllm'.families.blackwell"),
    (STACK.replace("blackwell: {disaggregated:", "blackwell: {prefill:"), "models.deepseek-v3.families.blackwell"),
    (STACK.replace("hopper: {aggregated: {fixed_latency_s: 0.12, queue_share: 0.2}}", "hopper: {}"),
     "models.deepseek-v3.families.hopper"),
    (STACK.replace("fixed_latency_s: 0.45", "fixed_latency_s: -1"),
     "models.deepseek-v3.families.blackwell.disaggregated.fixed_latency_s"),
])
def test_misplaced_family_terms_are_refused_by_name(tmp_path, text, field):
    with pytest.raises(InputError) as err:
        _stacks(tmp_path, text)
    assert field in str(err.value)
