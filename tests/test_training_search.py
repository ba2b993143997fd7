"""The training-layout search (`dse.optimize.training`) against an independent brute force.

The brute force shares no code with the search: it lists every combination of the space's choices itself, applies
the frameworks' rules written out again here (heads divisible by TP, the batch by DP x micro-batch, experts by EP,
...), calls the scalar step `train_step` on each layout one at a time, and takes the cheapest within the deadline
and the non-dominated (time, cost) pairs with loops of its own.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from dse.catalog.hardware import get_system
from dse.catalog.models import get_model
from dse.errors import InputError
from dse.optimize.training import TrainingJob, TrainingSpace, search
from dse.physics.training import TrainLayout, model_items, train_step

SYSTEMS = ("h100", "a100", "b200", "gb200-nvl72", "tpu-v5p")
MODELS = ("llama-3.1-8b", "mixtral-8x7b", "qwen3-32b")


def random_case(rng: np.random.Generator):
    model = get_model(str(rng.choice(MODELS)))
    systems = [str(s) for s in rng.choice(SYSTEMS, size=int(rng.integers(1, 3)), replace=False)]

    def some(options, most=2, first=False):
        picked = {options[int(i)] for i in rng.integers(0, len(options), int(rng.integers(1, most + 1)))}
        return tuple(sorted(picked | ({options[0]} if first else set()), key=options.index))

    space = TrainingSpace(
        inventory={s: int(rng.choice([64, 256, 1024])) for s in systems}, tp=some((1, 2, 4, 8), 3, True),
        pp=some((1, 2, 4), 2, True), cp=some((1, 2)), ep=some((1, 2, 4, 8), 3, True), dp=some((1, 2, 4, 8, 16, 32, 64), 4),
        micro_batch=some((1, 2)), interleave=some((1, 2), 2, True), recompute=some(("none", "selective", "full")),
        zero=some((0, 1, 2, 3), 3), gemm_dtype=some(("bf16", "fp8", "fp4")), ep_overlap=some(("none", "two_microbatch")))
    seq = int(rng.choice([2048, 4096]))
    batch = int(rng.choice([64, 128, 256]))
    tokens = float(rng.choice([1e10, 1e11]))
    deadline = float(rng.choice([math.inf, 2 * 86400.0, 30 * 86400.0]))
    return model, [get_system(s) for s in systems], space, TrainingJob(tokens, seq, batch, deadline)


def allowed(model, lay: TrainLayout, batch: int, seq: int) -> bool:
    """The frameworks' rules, restated: Megatron-Core's divisibility checks and the schedules' preconditions."""
    a, f = model.spec.attention, model.spec.ffn
    if a.n_heads % lay.tp or (a.n_kv_heads % lay.tp and lay.tp % a.n_kv_heads):
        return False
    if lay.cp > 1 and seq % (2 * lay.cp):
        return False
    if model.is_moe and (f.n_experts % lay.ep or (lay.tp * lay.cp * lay.dp) % lay.ep):
        return False
    if batch % (lay.dp * lay.micro_batch):
        return False
    m = batch // (lay.dp * lay.micro_batch)
    if lay.pp > len(model_items(model, seq)):
        return False
    if lay.interleave > 1 and (lay.pp == 1 or m % lay.pp):
        return False
    if lay.ep_overlap == "two_microbatch" and (lay.ep == 1 or m < 2):
        return False
    return not (lay.zero == 3 and lay.pp > 1)


def brute_force(model, systems, space: TrainingSpace, job: TrainingJob):
    """((usd, time) of the cheapest layout meeting the deadline or None, sorted front of (time, usd))."""
    rows = []
    eps, overlaps = (space.ep, space.ep_overlap) if model.is_moe else ((1,), ("none",))  # experts: MoE models only
    for system in systems:
        for tp, pp, cp, dp, ep, mb, v, rc, z, dt, ov in itertools.product(
                space.tp, space.pp, space.cp, space.dp, eps, space.micro_batch, space.interleave,
                space.recompute, space.zero, space.gemm_dtype, overlaps):
            if tp * pp * cp * dp > space.inventory[system.id]:
                continue
            lay = TrainLayout(tp=tp, pp=pp, dp=dp, cp=cp, ep=ep, etp=1, micro_batch=mb, interleave=v, recompute=rc,
                              zero=z, gemm_dtype=dt, ep_overlap=ov)
            if not allowed(model, lay, job.global_batch, job.seq):
                continue
            try:
                r = train_step(model, system, lay, job.global_batch, job.seq)
            except InputError:  # a format the chip lacks, or no interleaved partition family
                continue
            if not r["fits"]:
                continue
            time = job.tokens / (job.global_batch * job.seq) * r["step_s"]
            rows.append((time, lay.chips * system.price_per_s * time))
    rows = [r for r in rows if math.isfinite(r[1])]
    ok = [r for r in rows if r[0] <= job.deadline_s * (1 + 1e-12)]
    best = min(ok, key=lambda r: (r[1], r[0])) if ok else None
    front = [r for r in rows if not any(o[0] <= r[0] and o[1] <= r[1] and o != r for o in rows)]
    return best, sorted(set(front))


@pytest.mark.parametrize("seed", range(4))
def test_search_equals_brute_force(seed):
    """Random spaces of dense and MoE models on one or two systems: the search's cheapest layout and its time-cost
    front equal the brute force's (and, without the front, the pruned search's cheapest too)."""
    rng = np.random.default_rng(1000 + seed)
    checked = 0
    for _ in range(3):
        model, systems, space, job = random_case(rng)
        best, front = brute_force(model, systems, space, job)
        result = search(model, systems, space, job)
        pruned = search(model, systems, space, job, front=False)
        if best is None:
            assert result.best is None and pruned.best is None
        else:
            checked += 1
            for r in (result.best, pruned.best):
                assert r["usd"] == pytest.approx(best[1], rel=1e-9)
                assert r["time_s"] == pytest.approx(best[0], rel=1e-9)
        got = [] if result.front.empty else sorted(zip(result.front["time_s"], result.front["usd"], strict=True))
        assert len(got) == len(front)
        for (t, u), (bt, bu) in zip(got, front, strict=True):
            assert t == pytest.approx(bt, rel=1e-9) and u == pytest.approx(bu, rel=1e-9)
    assert checked >= 1
