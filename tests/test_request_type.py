"""One request type from the study file down to the physics, the space's defaults defined once, and the
chunked-prefill budget of the request setting the prefill activations held in HBM."""

from __future__ import annotations

import dataclasses

import pytest

import dse
from dse.catalog.frameworks import stack_of
from dse.catalog.models import get_model
from dse.optimize.space import SpaceOptions, build_space
from dse.physics.serving import Request
from dse.studies.base import SpaceSpec, WorkloadSpec


def test_workload_spec_builds_the_request_with_every_field():
    spec = WorkloadSpec(name="rag", prompt=8000, output=300, tpot_max_s=0.05, ttft_max_s=3.0,
                        demand_tokens_per_s=2e4, cached_prompt_share=0.25, chunk_tokens=2048, draft_tokens=3,
                        accept_length=2.5, ttft_p90_max_s=6.0, tpot_p99_max_s=0.08)
    assert spec.workload() == Request(prompt=8000, output=300, name="rag", cached=0.25, chunk=2048, draft=3,
                                      accept=2.5, tpot_max=0.05, ttft_max=3.0, demand=2e4,
                                      ttft_quantile_max=((0.9, 6.0),), tpot_quantile_max=((0.99, 0.08),))
    closed = WorkloadSpec(name="bench", prompt=1000, output=1000, arrival={"concurrency": 64}).workload()
    assert (closed.arrival, closed.concurrency, closed.closed_loop) == ("concurrency", 64, True)
    # every field of the request comes from the study file (none left at a default the spec cannot set), but the
    # serving stack (the space adds the study's framework's) and the quantiles an answer reports
    assert {f.name for f in dataclasses.fields(Request) if f.name != "_"} - {"stack", "report_quantiles"} == {
        "prompt", "output", "name", "cached", "chunk", "draft", "accept", "tpot_max", "ttft_max", "demand",
        "arrival", "concurrency", "ttft_quantile_max", "tpot_quantile_max"}


def test_the_space_carries_the_request_through_its_frameworks_stack():
    req = Request(prompt=2000, output=300, name="chat", chunk=1024, tpot_max=0.06)
    space = build_space(get_model("llama-3.1-8b"), req, SpaceOptions(systems=("h100",), tp=(1,), pp=(1,)))
    # the only change: vLLM's stack as it serves the model (its own terms where the fit has them)
    assert space.workload == dataclasses.replace(req, stack=stack_of("vllm", "llama-3.1-8b"))
    assert stack_of("vllm", "llama-3.1-8b") != stack_of("vllm")  # measured on vLLM: terms of its own
    assert stack_of("vllm", "llama-3.1-405b") == stack_of("vllm")  # not measured: the framework's
    sglang = build_space(get_model("llama-3.1-8b"), req, SpaceOptions(systems=("h100",), tp=(1,), pp=(1,),
                                                                      framework="sglang"))
    assert sglang.workload.stack == stack_of("sglang", "llama-3.1-8b")
    ideal = build_space(get_model("llama-3.1-8b"), req, SpaceOptions(systems=("h100",), tp=(1,), pp=(1,), ideal=True))
    assert ideal.workload == req  # the pure roofline: the engine alone


def test_request_fields_after_the_lengths_are_keywords():
    with pytest.raises(TypeError):
        Request(2000, 300, 0.5)  # a positional prefix-cache share would be read as something else


def test_space_spec_defaults_are_the_space_options_defaults():
    spec, opts = SpaceSpec(), SpaceOptions()
    for name in ("weights_dtypes", "kv_dtypes", "kv_tiers", "tp", "pp", "max_racks", "max_chips_per_stage",
                 "min_chips_per_stage", "max_batch_per_rank", "ideal", "weight_only"):
        got = getattr(spec, name)
        assert (tuple(got) if isinstance(got, list) else got) == getattr(opts, name), name
    built = spec.options()
    assert dataclasses.replace(built, systems=()) == SpaceOptions()


def test_prefill_activations_follow_the_chunk_budget():
    """A prefill pass holds at most `chunk` prompt tokens' activations per DP rank: 8 d bf16 values per token,
    plus one sequence's fp32 logits over the vocabulary (Llama 3.1 8B: d 4096, vocabulary 128,256)."""
    d, vocab = 4096, 128_256
    for chunk in (512, 2048, 8192, 65536):
        ev = dse.evaluate("llama-3.1-8b", "h100", batch=1, context=32768, phase="prefill", chunk=chunk)
        tokens = min(chunk, 32768)
        assert ev["activation_bytes_per_chip"] == pytest.approx(tokens * 8 * d * 2 + vocab * 4, rel=1e-12)
    # the default is the engines' default budget
    assert dse.evaluate("llama-3.1-8b", "h100", batch=1, context=32768, phase="prefill")[
        "activation_bytes_per_chip"] == pytest.approx(8192 * 8 * d * 2 + vocab * 4, rel=1e-12)


def test_a_closed_loop_is_held_by_the_replicas_it_fills(tmp_path):
    """A closed loop of N requests in flight is deployed as exactly N / (batch x DP x PP) replicas; with a budget
    (which would choose the replicas itself) the study is refused, naming the workload."""
    study = {"study": "closed", "kind": "cheapest", "description": "d", "expect": "e", "models": ["llama-3.1-8b"],
             "workloads": [{"name": "bench", "prompt": 2000, "output": 500, "tpot_max_s": 0.05,
                            "arrival": {"concurrency": 64}}],
             "space": {"systems": ["h100"], "serving": ["aggregated"], "tp": [1], "pp": [1]}}
    (e,) = dse.run(study).summary["best"]
    p = e["pools"][0]
    assert p["replicas"] * p["batch"] * p["pp"] == 64 and e["concurrency"] == 64
    assert e["chips"] == p["replicas"] * p["chips"]
    from dse.errors import InputError

    with pytest.raises((InputError, ValueError), match="workloads.0.arrival: a closed loop"):
        dse.run({**study, "budget": {"gpus": 8}})
