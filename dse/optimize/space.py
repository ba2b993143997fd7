"""The serving design space of one model and workload: blocks, and every integer batch of each.

A *block* fixes every discrete choice but the batch: system, layout (TP/DP/EP/expert-TP/PP and so
the chips and racks), weight and KV formats and where the KV lives. Within a block the batch is
the integer number n of sequences per attention (DP) rank, B = DP x n, for every n from 1 to the
largest that fits (``n_hi``). A batch that is not a multiple of DP is dominated: the busiest rank
carries ceil(B / DP) sequences, so the step is that of DP x ceil(B / DP) with fewer tokens.

HBM bytes are affine in n (weights fixed, KV and activations per sequence), so ``n_hi`` is read
off two evaluations of the physics. The optimizers evaluate the physics itself at every batch they
consider, and `exhaustive` evaluates it at every batch of the space.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, field, replace

import numpy as np

from dse.catalog.frameworks import ENGINE_ONLY, Stack, framework_for, get_framework, stack_of
from dse.catalog.hardware import DEFAULT_PRICE_KIND, IDEAL, System, default_systems, priced
from dse.catalog.models import Architecture
from dse.catalog.units import DTYPES
from dse.errors import InputError
from dse.physics.codes import KV_TIERS
from dse.physics.layout import Layout, layouts_for
from dse.physics.roofline import Candidates, ModelTable, SystemTable, evaluate, evaluate_at, memory_budget
from dse.physics.serving import Request
from dse.table import Table

SATURATION = 1e-12  # an expert left untouched this rarely counts as always read
CHUNK_PAIRS = 1 << 17
"""(block, batch) pairs evaluated at once. Every search of a space streams its pairs in chunks of whole
blocks of about this many and reduces each chunk as it goes (per-block optima, fronts), so its memory is set
by this number and the number of blocks, never by the number of configurations: the request-level physics
holds about 1.5 kB per pair in flight, some 0.2 GB per chunk (``scripts/bench_memory.py`` measures the peak)."""


@dataclass(frozen=True)
class SpaceOptions:
    """Which discrete choices the space offers."""

    systems: tuple[str, ...] = ()
    weights_dtypes: tuple[str, ...] = ("bf16", "fp8", "fp4")
    kv_dtypes: tuple[str, ...] = ("bf16", "fp8")
    kv_tiers: tuple[str, ...] = ("hbm", "host")
    tp: tuple[int, ...] = (1, 2, 4, 8)
    pp: tuple[int, ...] = (1, 2, 4)
    max_racks: int = 4
    max_chips_per_stage: int = 1024
    min_chips_per_stage: int = 1
    max_batch_per_rank: int = 1024
    ideal: bool = False
    scale: tuple[tuple[str, float], ...] = ()  # (System field, factor) applied to scaled_systems
    scaled_systems: tuple[str, ...] = ()  # empty: every system
    price_kind: str = DEFAULT_PRICE_KIND
    prices: tuple[tuple[str, float], ...] = ()  # (system, USD per chip-hour) the study supplies
    weight_only: bool = False  # offer weight formats the chip has no tensor units for (dequantized)
    framework: str | None = None  # the serving framework (None: each system's vendor default)
    mem_fraction: float | None = None  # the framework's memory fraction (None: its default)
    mixed_vendors: bool = False  # whether a deployment's prefill and decode pools may be of different vendors


@dataclass
class Space:
    """Blocks (one row each); every integer batch per rank from 1 to ``n_hi`` belongs to each."""

    model: Architecture
    workload: Request
    systems: list[System]
    blocks: Table
    ideal: bool
    stats: dict = field(default_factory=dict)
    empty_reason: str = ""
    """Why no (system, layout, format, KV tier) combination is valid, when there is none."""
    framework: str | None = None  # the serving framework the deployments run (None: each system's default)
    mem_fraction: float | None = None  # its memory fraction (None: its default)
    mixed_vendors: bool = False
    """Whether a deployment's prefill and decode pools may run on different vendors' hardware (`numerics_group`)."""

    def served(self, req: Request) -> Request:
        """``req`` through the space's serving stack (a request derived from another, or built by a caller, is
        served as the space's workload is).
        """
        return req if req.stack == self.workload.stack else replace(req, stack=self.workload.stack)

    def tables(self) -> tuple[ModelTable, SystemTable]:
        """The model's and the systems' columns for the physics, each system reserving HBM as the space's framework
        does at its memory fraction.
        """
        return ModelTable.build([self.model]), system_table(self.systems, self.framework, self.mem_fraction)

    @property
    def size(self) -> int:
        """Configurations in the space: every (block, batch) pair."""
        if self.blocks.empty:
            return 0
        return int(np.maximum(self.blocks["n_hi"] - self.blocks["n_lo"] + 1, 0).sum())


def system_table(systems: list[System], framework: str | None = None, mem_fraction: float | None = None
                 ) -> SystemTable:
    """The systems' columns with the memory reservation of ``framework`` (each system's default where None) at
    ``mem_fraction`` (the framework's default where None).
    """
    return SystemTable.build(systems, memory=[framework_for(s, framework).with_fraction(mem_fraction)
                                              for s in systems])


def stack_for(systems: list[System], framework: str | None, model: str | None = None) -> Stack:
    """The serving stack's fitted terms (`dse.catalog.frameworks.stack_of`) of the framework the systems run
    serving ``model``: ``framework``, else their vendors' default, which must then be one framework (an InputError
    asks to name it).
    """
    names = {framework_for(s, framework).id for s in systems}
    if len(names) > 1:
        raise InputError(f"the systems of the space run different frameworks by default ({', '.join(sorted(names))}); "
                         "name one in the study's `framework` field")
    return stack_of(names.pop(), model) if names else Stack(framework or "")


def stage_sizes(system: System, opts: SpaceOptions) -> list[int]:
    """Chips per pipeline stage to consider: powers of two and whole scale-up domains."""
    limit = min(opts.max_chips_per_stage, system.scaleup_domain * opts.max_racks)
    sizes = {2**i for i in range(0, 31) if 2**i <= limit}
    sizes |= {system.scaleup_domain * r for r in range(1, opts.max_racks + 1) if system.scaleup_domain * r <= limit}
    return sorted(s for s in sizes if s >= opts.min_chips_per_stage)


def _layouts(model: Architecture, system: System, opts: SpaceOptions) -> list[Layout]:
    out = []
    for cps in stage_sizes(system, opts):
        for lay in layouts_for(model, cps, pps=opts.pp):
            if lay.tp not in opts.tp:
                continue
            if model.is_moe and lay.etp not in (1, lay.tp):  # experts fully EP, or TP'd like attention
                continue
            if not model.is_moe and lay.etp != cps:
                continue
            if lay.chips > system.scaleup_domain and math.isnan(system.scaleout_bandwidth):
                continue
            if lay.chips > system.scaleup_domain * opts.max_racks:  # the replica's racks, all its stages
                continue
            out.append(lay)
    return out


def why_empty(model: Architecture, systems: list[System], opts: SpaceOptions, no_price: list[str] = ()) -> str:
    """The first rule that leaves no valid (system, layout, format, KV tier) combination, in the study's terms."""
    heads, layers = model.spec.attention.n_heads, model.spec.n_layers
    if not systems:
        return (f"the design space is empty: no system of the space has a price of kind '{opts.price_kind}' "
                f"(no price: {', '.join(no_price)}); choose another price kind or supply prices in the study")
    if not opts.weight_only and not any(s.is_native(wd) for s in systems for wd in opts.weights_dtypes):
        return (f"the design space is empty: no system of the space computes natively in space.weights_dtypes "
                f"{list(opts.weights_dtypes)} (weight-only quantization is off)")
    if not any(kd in s.kv_dtypes for s in systems for kd in opts.kv_dtypes):
        return (f"the design space is empty: no system of the space has kernels for space.kv_dtypes "
                f"{list(opts.kv_dtypes)}")
    if not any(heads % tp == 0 for tp in opts.tp):
        return (f"the design space is empty: no TP degree in space.tp {list(opts.tp)} divides {model.id}'s "
                f"{heads} attention heads")
    if all(pp > layers for pp in opts.pp):
        return (f"the design space is empty: every PP degree in space.pp {list(opts.pp)} exceeds {model.id}'s "
                f"{layers} layers")
    if not any(_layouts(model, s, opts) for s in systems):
        return (f"the design space is empty: no layout of {model.id} with TP in {list(opts.tp)} and PP in "
                f"{list(opts.pp)} fits within space.max_chips_per_stage ({opts.max_chips_per_stage}), "
                f"space.min_chips_per_stage ({opts.min_chips_per_stage}) and space.max_racks ({opts.max_racks}) "
                f"on {', '.join(s.id for s in systems)}")
    return (f"the design space is empty: space.kv_tiers {list(opts.kv_tiers)} has no tier the catalog describes on "
            f"{', '.join(s.id for s in systems)} (host memory capacity and bandwidth unknown)")


def block_candidates(blocks: Table, n: np.ndarray, context: int, phase: int = 0,
                pos: np.ndarray | None = None) -> Candidates:
    """The candidates of ``blocks`` (of the rows at positions ``pos``, when given) at n sequences per DP rank."""

    def col(name: str) -> np.ndarray:
        a = blocks[name]
        return a if pos is None else a[pos]

    dp = col("dp")
    return Candidates(
        model=np.zeros(len(dp), dtype=np.int64), system=col("system_idx"), tp=col("tp"), dp=dp, ep=col("ep"),
        etp=col("etp"), pp=col("pp"), batch=dp * n, context=context, phase=phase, weights_dtype=col("wd"),
        kv_dtype=col("kd"), kv_tier=col("tier"),
    )


def build_space(model: Architecture, workload: Request, opts: SpaceOptions) -> Space:
    """Enumerate the blocks of the space and read their batch-affine physics off the engine."""
    catalog = default_systems(opts.price_kind)
    ids = opts.systems or tuple(catalog)
    supplied = dict(opts.prices)
    systems = [priced(catalog[s], opts.price_kind, supplied[s]) if s in supplied else catalog[s] for s in ids]
    # a system without a price of the study's kind is left out of the cost comparison, never proxied
    no_price = [s.id for s in systems if math.isnan(s.price_per_s)]
    systems = [s for s in systems if not math.isnan(s.price_per_s)]
    if opts.framework is not None:  # a framework runs on its vendors' hardware only
        fw = get_framework(opts.framework)
        systems = [s for s in systems if fw.runs_on(s)]
    # the request goes through the framework's serving stack (the pure roofline: the engine alone)
    workload = replace(workload, stack=ENGINE_ONLY if opts.ideal else stack_for(systems, opts.framework, model.id))
    if opts.scale:
        targets = set(opts.scaled_systems or ids)
        systems = [s.scaled(**dict(opts.scale)) if s.id in targets else s for s in systems]
    eff = IDEAL if opts.ideal else None  # None: each system's calibrated factors
    rows = []
    for si, system in enumerate(systems):
        for lay in _layouts(model, system, opts):
            for wd in opts.weights_dtypes:
                if not (system.is_native(wd) or opts.weight_only):  # computes only in native formats
                    continue
                for kd in opts.kv_dtypes:
                    if kd not in system.kv_dtypes:
                        continue
                    for tier in opts.kv_tiers:
                        if tier == "host" and (math.isnan(system.host_memory_capacity)
                                               or math.isnan(system.host_offload_bandwidth)):
                            continue
                        rows.append((si, lay.tp, lay.dp, lay.ep, lay.etp, lay.pp, DTYPES.index(wd),
                                     DTYPES.index(kd), KV_TIERS.index(tier)))
    cols = ["system_idx", "tp", "dp", "ep", "etp", "pp", "wd", "kd", "tier"]
    blocks = Table(dict(zip(cols, np.array(rows, dtype=np.int64).reshape(-1, len(cols)).T, strict=True)),
                   length=len(rows))
    mt, st = ModelTable.build([model]), system_table(systems, opts.framework, opts.mem_fraction)
    if blocks.empty:  # no valid combination (or no system with a price of the study's kind): no rows
        blocks = Table({c: np.zeros(0, dtype=np.int64) for c in (*cols, "n_sat", "n_hi", "n_lo", "chips", "racks")}
                       | {c: np.zeros(0) for c in ("hbm_base", "hbm_per_seq", "overlap", "hbm_budget", "ttft", "a")}
                       | {"system": np.zeros(0, dtype=object)})
        space = Space(model, workload, systems, blocks, opts.ideal,
                      empty_reason=why_empty(model, systems, opts, no_price), framework=opts.framework,
                      mem_fraction=opts.mem_fraction, mixed_vendors=opts.mixed_vendors)
        space.stats = {"blocks": 0, "configurations": 0, "no_price": no_price}
        return space

    # expert saturation: the smallest n at which every routed expert is read with certainty 1 - 1e-12
    dp = blocks["dp"].astype(float)
    if model.is_moe:
        p = model.spec.ffn.top_k / model.spec.ffn.n_experts
        n_sat = np.ceil(math.log(SATURATION) / math.log1p(-p) / dp) if p < 1 else np.ones_like(dp)
    else:
        n_sat = np.ones_like(dp)
    blocks["n_sat"] = n_sat.astype(np.int64)

    # the framework's memory check is affine in n (weights fixed, KV and activations per sequence): read it off
    # two evaluations (`dse.physics.roofline.memory_budget`); and the TTFT: a prefill of one prompt on the block's
    # layout. One gathering of the catalog columns for the three (`evaluate_at`).
    dp_rank = blocks["dp"]
    r1, r2, pre = evaluate_at(block_candidates(blocks, n_sat, workload.context), mt, st, eff,
                              [{}, {"batch": dp_rank * (n_sat + 1)},
                               {"batch": dp_rank * (np.ones_like(dp) / dp), "context": workload.prompt, "phase": 1}])
    block_eff = eff or st.efficiency_of(blocks["system_idx"])
    on_host = blocks["tier"] == 1
    a_act, a_kv, budget = memory_budget(st.device_memory[blocks["system_idx"]], block_eff, float(workload.chunk),
                                        blocks["tp"].astype(float), blocks["pp"].astype(float), model.is_moe)

    def need(r: dict) -> np.ndarray:
        kv_hbm = np.where(on_host, 0.0, r["kv_bytes_per_chip"])
        return r["weights_bytes_per_chip"] + a_act * r["activation_bytes_per_chip"] + a_kv * kv_hbm

    hbm_slope = need(r2) - need(r1)
    hbm_base = need(r1) - hbm_slope * n_sat
    kv_slope = r2["kv_bytes_per_chip"] - r1["kv_bytes_per_chip"]
    held = r2["hbm_bytes_per_chip"] - r1["hbm_bytes_per_chip"]  # and what it holds never exceeds the device
    host_cap = st.host_capacity[blocks["system_idx"]]
    with np.errstate(divide="ignore", invalid="ignore"):  # a block whose HBM does not grow with n (KV on the host)
        n_cap = np.floor((budget - hbm_base) / hbm_slope * (1 + 1e-12))
        n_cap = np.minimum(n_cap, np.floor((st.device_memory[blocks["system_idx"]] - (r1["hbm_bytes_per_chip"] - held
                                                                                     * n_sat)) / held * (1 + 1e-12)))
        n_host = np.where(on_host, np.floor(host_cap / kv_slope * (1 + 1e-12)), np.inf)
    n_hi = np.minimum(np.minimum(n_cap, n_host), opts.max_batch_per_rank)
    blocks["n_hi"] = np.maximum(n_hi, 0).astype(np.int64)
    blocks["n_lo"] = 1
    blocks["hbm_base"] = hbm_base
    blocks["hbm_per_seq"] = hbm_slope
    blocks["overlap"] = block_eff.overlap
    blocks["hbm_budget"] = budget

    blocks["ttft"] = pre["step_s"]
    blocks["chips"] = (blocks["tp"] * blocks["dp"] * blocks["pp"]).astype(np.int64)
    domain = st.domain[blocks["system_idx"]]
    blocks["racks"] = np.ceil(blocks["chips"] / domain).astype(np.int64)
    price = st.price_per_s[blocks["system_idx"]]
    blocks["a"] = blocks["tp"] * price * 1e6  # USD per Mtok = a x step / n
    blocks["system"] = np.array([systems[i].id for i in blocks["system_idx"]], dtype=object)

    space = Space(model, workload, systems, blocks, opts.ideal, framework=opts.framework,
                  mem_fraction=opts.mem_fraction, mixed_vendors=opts.mixed_vendors)
    space.stats = {"blocks": len(blocks), "configurations": space.size, "max_batch_per_rank": opts.max_batch_per_rank,
                   "no_price": no_price}
    return space


# ---- every (block, batch) pair, streamed in chunks ----------------------------------------------
def pairs(blocks: Table) -> tuple[np.ndarray, np.ndarray]:
    """Every (block position, n) with 1 <= n_lo <= n <= n_hi: positions into ``blocks`` and n, block by block
    and n ascending within a block.
    """
    lo, hi = blocks["n_lo"], blocks["n_hi"]
    counts = np.maximum(hi - lo + 1, 0)
    pos = np.repeat(np.arange(len(blocks)), counts)
    n = np.repeat(lo, counts) + np.arange(len(pos)) - np.repeat(np.cumsum(counts) - counts, counts)
    return pos, n.astype(np.int64)


def chunk_size(max_pairs: int | None = None) -> int:
    """Pairs per chunk: ``max_pairs``, or `CHUNK_PAIRS` as it is set when the search runs."""
    return int(max_pairs or CHUNK_PAIRS)


def pair_chunks(blocks: Table, max_pairs: int | None = None, only: np.ndarray | None = None
                ) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """The pairs of ``blocks`` (`pairs`; of the blocks at positions ``only``, when given) in chunks of consecutive
    whole blocks, each of at most ``max_pairs`` pairs (a block with more is a chunk alone): positions into
    ``blocks`` and n. A block's batches are never split between chunks, so per-block reductions finish within
    one chunk.
    """
    max_pairs = chunk_size(max_pairs)
    sub = blocks if only is None else blocks.take(only)
    counts = np.maximum(sub["n_hi"] - sub["n_lo"] + 1, 0).astype(np.int64)
    ends = np.cumsum(counts)
    start = 0
    while start < len(sub):
        before = int(ends[start - 1]) if start else 0
        end = max(int(np.searchsorted(ends, before + max_pairs, side="right")), start + 1)
        pos, n = pairs(sub.take(slice(start, end)))
        pos += start
        if len(pos):
            yield (pos if only is None else np.asarray(only)[pos]), n
        start = end


# ---- the exhaustive reference ----------------------------------------------------------------
@dataclass(frozen=True)
class Choice:
    """One configuration of the space: a block and a batch per rank."""

    block: int
    n: int
    step: float
    cost: float


def exhaustive(
    space: Space, tpot_max: float | None, objective: str = "cost", chunk: int | None = None,
    cost_max: float | None = None,
) -> Choice | None:
    """Evaluate the physics at every (block, batch) of the space; return the best feasible one.

    ``objective`` is "cost" (USD per million output tokens) or "latency" (step time); ``cost_max``
    caps the cost per token.
    """
    b, w = space.blocks, space.workload
    if b.empty:
        return None
    mt, st = space.tables()
    ok_block = np.ones(len(b), dtype=bool)
    if w.ttft_max is not None:
        ok_block &= b["ttft"] <= w.ttft_max
    best: Choice | None = None

    def consider(idx: np.ndarray, n: np.ndarray) -> None:
        nonlocal best
        if len(idx) == 0:
            return
        r = evaluate(block_candidates(b, n, w.context, pos=idx), mt, st, IDEAL if space.ideal else None, ttft=False)
        feasible = r["fits"].copy()
        if tpot_max is not None:
            feasible &= r["step_s"] <= tpot_max
        cost = b["a"][idx] * r["step_s"] / n
        if cost_max is not None:
            feasible &= cost <= cost_max
        if not feasible.any():
            return
        score = np.where(feasible, cost if objective == "cost" else r["step_s"], np.inf)
        i = int(np.argmin(score))
        current = None if best is None else (best.cost if objective == "cost" else best.step)
        if current is None or score[i] < current:
            best = Choice(int(b.index[idx[i]]), int(n[i]), float(r["step_s"][i]), float(cost[i]))

    # every integer batch of every block whose prefill meets the TTFT target, in chunks of whole blocks
    for pos, n in pair_chunks(b, chunk, only=np.flatnonzero(ok_block)):
        consider(pos, n)
    return best


def subset(space: Space, mask: np.ndarray) -> Space:
    """The space restricted to the blocks where ``mask`` holds (block labels are kept)."""
    blocks = space.blocks.take(mask)
    sub = Space(space.model, space.workload, space.systems, blocks, space.ideal, framework=space.framework,
                mem_fraction=space.mem_fraction, mixed_vendors=space.mixed_vendors)
    sub.stats = {"blocks": len(blocks), "configurations": sub.size}
    return sub


def describe_choice(space: Space, choice: Choice) -> dict:
    """The configuration of a choice, keyed as in the command-line contract."""
    row = space.blocks.loc(choice.block)
    system = space.systems[int(row["system_idx"])]
    return {
        "system": system.id,
        "chips": int(row["chips"]),
        "racks": int(row["racks"]),
        "tp": int(row["tp"]),
        "ep": int(row["ep"]),
        "pp": int(row["pp"]),
        "dp": int(row["dp"]),
        "etp": int(row["etp"]),
        "batch": int(row["dp"]) * choice.n,
        "context": space.workload.context,
        "weights_dtype": DTYPES[int(row["wd"])],
        "kv_dtype": DTYPES[int(row["kd"])],
        "kv_tier": KV_TIERS[int(row["tier"])],
    }
