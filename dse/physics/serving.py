"""Request-level serving physics: what a user's request costs and how fast it is served, vectorized
over arrays of candidate configurations on top of the step physics of `dse.physics.roofline`.

A request has P prompt tokens (a share ``cached`` of them served from a prefix cache, so
P' = P (1 - cached) are computed) and O output tokens. Two deployments:

**Aggregated** (one pool; in-flight batching with chunked prefill, as vLLM and SGLang schedule it):
a replica runs C = batch x PP sequences in flight; every forward pass decodes the running
sequences and may carry one prefill chunk of up to K tokens per DP rank (K = ``chunk``, default
`DEFAULT_CHUNK` = 8192, vLLM's and SGLang's usual budget).

- t_d: the decode pass of C sequences with the KV read averaged over the output, context P + O/2
  (the mean of P + 1 .. P + O); memory is checked at the peak, context P + O.
- t_c: the extra time of a pass that also carries a full chunk: its compute and communication are
  those of the decode pass plus K/P' of a whole-prompt prefill pass (the prompt's attention
  averaged over its causal triangle); its memory traffic is the decode pass's (the chunk reuses
  the weights the pass streams anyway; its KV writes are neglected). Compute, memory and
  communication are then combined as the step physics does (the kernel groups' work, overlap, fixed
  overhead): the chunk's GEMM rows join the pass's weight GEMMs and its attention the attention kernels,
  and since the kernels run one after the other (`roofline.kernel_work`, share 1 - ``kernel_overlap``),
  the chunk's GEMM compute does not hide under the decode sequences' KV reads.
- Steady state with request rate x per chunk server (DP x PP of them: each DP rank prefills its
  own prompts, in each of the PP micro-batches in flight): the D = DP ranks of a stage run in
  lock-step, so a chunk on any rank stretches everyone's pass, and prefill work takes the share
  u = D x P' t_c / K of the time (coinciding chunks counted twice: an upper bound, exact while
  chunks are rare); the mean pass is t_bar = t_d / (1 - u) and TPOT = t_bar / a (every decode
  step carries its share of prefill work: the interference).
- TTFT = W + S: a prompt occupies a chunk server for S = ceil(P'/K) (t_d + t_c) (its chunks in
  consecutive passes); the wait W is the M/D/1 mean, W = rho S / (2 (1 - rho)), rho = x S
  (Pollaczek-Khinchine with deterministic service; Kleinrock, *Queueing Systems* vol. 1, 5.8).
  A TTFT target applies to this mean.
- Little's law closes the loop: C = k x (TTFT + m t_bar), k = DP x PP servers and m = (O - 1)/a
  decode passes per request (the first token comes from the last prefill chunk). The left side
  is increasing in x on [0, 1/S), and the root is found by a bracketed Newton iteration
  (`_solve_rate`). Throughput = C x O / (TTFT + (O - 1) TPOT).

**Disaggregated** (a prefill pool and a decode pool, each with its own layout): the decode pool
is the same decode pass without prefill interference (TPOT = t_d / a; C = lambda m t_d by Little's
law); a prefill replica prefills one prompt per DP rank and micro-batch (service S = the prefill
pass, DP x PP servers), or, with context parallelism, splits each prompt over its DP ranks (ring
attention: the prompt's KV passes once around the ring, overlapped with compute as the step
physics overlaps communication; service S = its pass / DP, PP servers). The KV cache then crosses
to the decode pool over the scale-out network (pools in separate racks; over scale-up where the
system has no scale-out figure), sent in parallel by the prefill replica's chips, and that time
counts in TTFT. The prefill pool runs at utilisation rho (M/D/1 wait per server as above): the
pool ratio is prefill replicas per decode replica = lambda S / (servers rho).

**Speculative decoding / MTP**: ``draft`` tokens k and mean accepted length a (tokens emitted per
decode pass, 1 <= a <= k + 1); a pass verifies k + 1 tokens per sequence (its compute and
communication x (k + 1), its weight and KV reads unchanged); draft-model cost is neglected (MTP
heads are one layer).

**Cost split**: a request's cost is the deployment's USD per second over its request rate. The
input (prompt) part is the prefill's share: aggregated, the share u of the replica's time spent
on prefill chunks; disaggregated, the prefill pool's cost. The output part is the rest. So
usd_per_mtok_input = input cost / P x 1e6, usd_per_mtok_output = output cost / O x 1e6 and
usd_per_mtok_blended = usd_per_request / (P + O) x 1e6.
"""

from __future__ import annotations

from dataclasses import KW_ONLY, dataclass, replace

import numpy as np

from dse.catalog.calibration import family_of
from dse.catalog.frameworks import Stack, StackTerms
from dse.catalog.hardware import Efficiency
from dse.physics.codes import DEFAULT_CHUNK  # re-exported: the default chunk budget (vLLM / SGLang)
from dse.physics.queueing import quantile_name, rho_for_wait_quantile, tpot_quantile, wait_quantile, wave_wait_quantile
from dse.physics.roofline import Candidates, ModelTable, SystemTable, evaluate_at, in_slices, kernel_work, memory_budget

RHO_MAX = 0.9  # highest utilisation a prefill pool is planned at (M/D/1 waits grow as 1 / (1 - rho))
NEWTON_STEPS = 200  # a cap only: bracketed Newton stops after a handful of steps
NEWTON_RTOL = 1e-13  # stop once no rate moves by more than this share of itself


@dataclass(frozen=True)
class Request:
    """One kind of request and what is asked of its serving: prompt and output tokens, the prefix-cache
    share, the chunked-prefill budget, speculation, the TTFT and TPOT targets and the demand (seconds,
    output tokens per second), how requests arrive and the serving stack they go through. Built once, by
    keyword, from a study's workload or `dse evaluate`'s options, and carried unchanged from the space down to
    the physics.

    Arrivals: ``arrival`` ``poisson`` is the open loop of production traffic (Poisson arrivals: M/D/1 queueing at
    the prefill servers); ``concurrency`` a closed loop, each request replaced as it completes, as benchmarks run
    (queueing in synchronized waves, `dse.physics.queueing`): the physics holds a replica's candidate batch (or
    a disaggregated deployment's given concurrency) in flight, and ``concurrency``, when set, is the number a
    whole deployment holds (what a study sizes its replicas for). Targets: ``ttft_max`` and ``tpot_max`` bound the
    means, ``ttft_quantile_max`` and ``tpot_quantile_max`` bound quantiles ((q, seconds) pairs, q in
    `dse.physics.queueing.QUANTILES`); ``report_quantiles`` are computed besides the targets' own.
    """

    prompt: int
    output: int
    _: KW_ONLY
    name: str = ""
    cached: float = 0.0  # share of the prompt served from a prefix cache (not recomputed by the prefill)
    chunk: int = DEFAULT_CHUNK  # chunked-prefill budget per DP rank per forward pass (aggregated serving)
    draft: int = 0  # speculative / MTP draft tokens verified per decode pass
    accept: float = 1.0  # mean tokens emitted per decode pass (1 <= accept <= draft + 1)
    tpot_max: float | None = None  # TPOT target on the mean, seconds
    ttft_max: float | None = None  # TTFT target on the mean, seconds
    demand: float | None = None  # output tokens per second the deployment must serve
    arrival: str = "poisson"  # "poisson" (open loop) or "concurrency" (closed loop)
    concurrency: int | None = None  # with arrival "concurrency": the requests a whole deployment holds in flight
    stack: Stack = Stack()
    ttft_quantile_max: tuple[tuple[float, float], ...] = ()  # (q, seconds): TTFT targets on quantiles
    tpot_quantile_max: tuple[tuple[float, float], ...] = ()  # (q, seconds): TPOT targets on quantiles
    report_quantiles: tuple[float, ...] = ()

    @property
    def context(self) -> int:
        """KV length at the last output token: the context the decode cost is quoted at."""
        return self.prompt + self.output

    @property
    def computed_prompt(self) -> float:
        """Prompt tokens the prefill computes: P (1 - cached), at least one."""
        return max(self.prompt * (1.0 - self.cached), 1.0)

    @property
    def decode_passes(self) -> float:
        """Decode passes per request, m = (O - 1) / a (the first token comes from the prefill)."""
        return max(self.output - 1, 0) / self.accept

    @property
    def closed_loop(self) -> bool:
        """Whether requests arrive in a closed loop (``arrival: concurrency``) rather than as a Poisson stream."""
        return self.arrival == "concurrency"

    @property
    def quantiles(self) -> tuple[float, ...]:
        """The quantiles the physics computes: the targets' and ``report_quantiles``, ascending."""
        qs = {q for q, _ in (*self.ttft_quantile_max, *self.tpot_quantile_max)} | set(self.report_quantiles)
        return tuple(sorted(qs))


def power_w(chips: np.ndarray | float, power_per_chip: np.ndarray | float) -> np.ndarray:
    """Power of a deployment: chips x the catalog's all-in power per chip (its share of host, network and
    cooling included; NaN where the catalog has no all-in figure).
    """
    return np.asarray(chips, dtype=np.float64) * np.asarray(power_per_chip, dtype=np.float64)


def combine(compute: np.ndarray, memory: np.ndarray, comm: np.ndarray, overhead: np.ndarray,
            overlap: np.ndarray | float, attention_compute: np.ndarray | float = 0.0,
            kv_memory: np.ndarray | float = 0.0, kernel_overlap: np.ndarray | float = 1.0) -> np.ndarray:
    """Step time from its parts, as `roofline._pass` combines them: the work of the kernel groups
    (`roofline.kernel_work`: ``attention_compute`` and ``kv_memory`` are the attention kernels' share of
    ``compute`` and ``memory``), partial overlap of the communication, overhead.
    """
    work = kernel_work(compute, memory, attention_compute, kv_memory, kernel_overlap)
    return np.maximum(work, comm) + (1.0 - overlap) * np.minimum(comm, work) + overhead


def _eff(c: Candidates, systems: SystemTable, eff: Efficiency | None) -> Efficiency:
    return eff if eff is not None else systems.factors_of(np.asarray(c.system))


def _solve_rate(k: np.ndarray, c: np.ndarray, s: np.ndarray, m_td: np.ndarray, v: np.ndarray) -> np.ndarray:
    """The per-server request rate x solving C = k x R(x), R = S + x S^2 / (2 (1 - x S)) + m t_d / (1 - v x).

    R has a pole at x = 1/S (the queue of a saturated server grows without bound) and one at x = 1/v (prefill
    chunks fill every pass). Multiplying by q = 1 - x S removes the first:
    h(x) = k x (S q + x S^2 / 2 + m t_d q / w) - C q, w = 1 - v x, is smooth on [0, min(1/S, 1/v)) with
    h(0) = -C < 0, and at the upper end h(1/S) = k / 2 > 0 or h -> +inf as w -> 0; it shares its sign
    with k x R(x) - C there, so the root is bracketed, and it is the only root there (k x R(x) rises with x).

    Multiplied by w too, h is a cubic, and so is its equation in y = 1/x (`_cubic_rate`): the root is that cubic's
    largest root, in closed form (trigonometric: the cubic has three real roots). One Newton step on h polishes it
    to round-off; a rate whose step moves it by more than ``NEWTON_RTOL`` of itself, or out of the bracket (where
    the closed form cancels: nearly coincident roots), is solved again by `_bracketed_newton` from the start
    C / (k (S + m t_d)). Every rate is computed from its own inputs alone, so it does not depend on which other
    rates it is solved with.
    """
    shape = np.broadcast_shapes(*(np.shape(a) for a in (k, c, s, m_td, v)))
    k, c, s, m_td, v = (np.array(np.broadcast_to(a, shape), dtype=np.float64).ravel() for a in (k, c, s, m_td, v))
    with np.errstate(divide="ignore", invalid="ignore"):
        hi = np.minimum(1.0 / s, 1.0 / v)  # whichever pole comes first: the queue's or the interference's
        x = _cubic_rate(k, c, s, m_td, v)
        h, dh = _rate_residual(k, c, s, m_td, v, x)
        out = x - h / dh
        done = (np.abs(out - x) <= NEWTON_RTOL * x) & (out >= 0.0) & (out <= hi)
    rest = np.flatnonzero(~done)
    if rest.size:
        out[rest] = _bracketed_newton(k[rest], c[rest], s[rest], m_td[rest], v[rest], hi[rest])
    return out.reshape(shape)


def _rate_residual(k: np.ndarray, c: np.ndarray, s: np.ndarray, m_td: np.ndarray, v: np.ndarray, x: np.ndarray,
                   ) -> tuple[np.ndarray, np.ndarray]:
    """`_solve_rate`'s h(x) and its derivative."""
    xs = x * s
    q = 1.0 - xs
    vx = v * x
    w = 1.0 - vx
    h = k * x * (s * q + 0.5 * x * s * s + m_td * q / w) - c * q
    dh = k * s * q + k * m_td * ((q - xs) * w + vx * q) / (w * w) + c * s
    return h, dh


def _cubic_rate(k: np.ndarray, c: np.ndarray, s: np.ndarray, m_td: np.ndarray, v: np.ndarray) -> np.ndarray:
    """`_solve_rate`'s root in closed form. P(x) = h(x) w is a cubic with P(0) = -C < 0 and a leading
    coefficient k S^2 v / 2 >= 0; with m t_d, v > 0 it changes sign at each pole in turn (P(1/S) = k (1 - v / S) / 2,
    P(1/v) = k m t_d (1 - S / v) / v), so its three roots are real and positive: the rate, the smallest, below both
    poles, one between them, one beyond (v = 0 or m t_d = 0 leave real roots too: one at infinity, or at 1/v and
    those of a quadratic of positive discriminant). In y = 1/x, C y^3 - c1 y^2 + b y - a = 0 with
    c1 = k (S + m t_d) + C (S + v), b = k S (S / 2 + v + m t_d) + C S v, a = k S^2 v / 2, and the rate is its largest
    root: y = c1 / (3 C) + 2 r cos(arccos(z) / 3), r^2 = (c1 / (3 C))^2 - b / (3 C), z = -q / (2 r^3) with q the
    depressed cubic's constant term (Cardano's casus irreducibilis, in Viete's trigonometric form). NaN where
    r = 0 (a triple root, or its rounding).
    """
    a3 = (k * (s + m_td) + c * (s + v)) / (3.0 * c)  # c1 / (3 C)
    b3 = (k * s * (0.5 * s + v + m_td) + c * s * v) / (3.0 * c)
    r2 = a3 * a3 - b3
    q = (3.0 * b3 - 2.0 * a3 * a3) * a3 - 0.5 * k * s * s * v / c
    r = np.sqrt(r2)
    z = np.minimum(np.maximum(-0.5 * q / (r * r2), -1.0), 1.0)
    return 1.0 / (2.0 * r * np.cos(np.arccos(z) / 3.0) + a3)


def _bracketed_newton(k: np.ndarray, c: np.ndarray, s: np.ndarray, m_td: np.ndarray, v: np.ndarray,
                      hi: np.ndarray) -> np.ndarray:
    """`_solve_rate`'s root by Newton's method on h from C / (k (S + m t_d)) in the bracket [0, ``hi``), replaced
    by bisection whenever its step leaves the bracket: it converges quadratically near the root and never diverges;
    each rate stops when it moves by no more than ``NEWTON_RTOL`` of itself (stopped ones leave the arrays once an
    eighth has stopped; until then their further steps are computed and discarded). Newton on the unmultiplied
    equation from a start clipped at the pole would only halve its distance to the pole per step.
    """
    lo = np.zeros_like(s)
    x = np.minimum(c / (k * (s + m_td)), 0.5 * hi)
    out = x.copy()
    rows = np.stack([k, c, s, m_td, v, np.arange(x.size, dtype=np.float64)])  # per rate: its inputs, its place
    live = None  # the rates still moving among the rows (None: all); stopped ones leave in batches
    for _ in range(NEWTON_STEPS):
        k, c, s, m_td, v, at = rows
        h, dh = _rate_residual(k, c, s, m_td, v, x)
        lo = np.where(h < 0, x, lo)
        hi = np.where(h > 0, x, hi)
        x_new = x - h / dh
        outside = np.flatnonzero(~((x_new >= lo) & (x_new <= hi)))  # a step that rounds to nothing stays
        if outside.size:
            x_new[outside] = 0.5 * (lo[outside] + hi[outside])
        moving = np.abs(x_new - x) > NEWTON_RTOL * x
        stopped = ~moving
        if live is not None:
            moving &= live
            stopped &= live
        if stopped.any():
            out[at[stopped].astype(np.int64)] = x_new[stopped]
            if not moving.any():
                break
            if 8 * np.count_nonzero(moving) < 7 * moving.size or moving.size < 4096:  # drop them once an eighth
                keep = np.flatnonzero(moving)
                rows, x_new, lo, hi = rows.take(keep, axis=1), x_new.take(keep), lo.take(keep), hi.take(keep)
                live = None
            else:
                live = moving
        x = x_new
    else:
        sel = slice(None) if live is None else live
        out[rows[5][sel].astype(np.int64)] = x[sel]
    return out


def prompts_per_chunk(req: Request) -> int:
    """Whole prompts one chunk of ``req.chunk`` tokens carries: floor(K / P'), at least one."""
    return max(1, int(req.chunk // req.computed_prompt))


def _passes(cand: Candidates, models: ModelTable, systems: SystemTable, eff: Efficiency, req: Request,
            prefill: bool = False, decode: bool = True, full_chunk: bool = False,
            prefill_memory: bool = False) -> dict[str, dict]:
    """The passes a request-level metric needs, evaluated over one gathering of the catalog columns:
    ``mean`` and ``peak``, the decode pass at the mean context P + O/2 (its times) and at the peak P + O
    (its memory check alone); ``prefill``, one prompt per DP rank (batch = DP) prefilled in one pass with its KV in HBM,
    its work scaled to the computed (uncached) share of the prompt (its times, and with ``prefill_memory`` its
    memory check); ``full_chunk``, the same with as many whole prompts per DP rank as one chunk carries
    (`prompts_per_chunk`; its times).
    """
    names, inputs = [], []
    if decode:
        names += ["mean", "peak"]
        inputs += [{"context": req.prompt + req.output / 2.0, "phase": 0, "memory": False},
                   {"context": req.prompt + req.output, "phase": 0, "times": False}]
    dp = np.asarray(cand.dp, dtype=np.float64)
    if prefill:
        names.append("prefill")
        inputs.append({"batch": dp, "context": req.prompt, "phase": 1, "kv_tier": 0, "memory": prefill_memory})
    if full_chunk:
        names.append("full_chunk")
        inputs.append({"batch": dp * prompts_per_chunk(req), "context": req.prompt, "phase": 1, "kv_tier": 0,
                       "memory": False})
    out = dict(zip(names, evaluate_at(replace(cand, chunk=float(req.chunk)), models, systems, eff, inputs),
                   strict=True))
    share = req.computed_prompt / req.prompt
    for name in ("prefill", "full_chunk"):
        if name in out:
            o = out[name]
            o["compute_s"] = _scaled_rows(o, share)
            o["attention_compute_s"] = o["attention_compute_s"] * share
            for k in ("comm_s", "step_s"):
                o[k] = o[k] * share
    return out


def _scaled_rows(p: dict, k: float) -> np.ndarray:
    """A pass's compute with ``k`` times its rows: what scales is all but the GEMMs' half-performance share
    (``gemm_fixed_s``, paid once per weight matrix multiplied, however many rows it carries).
    """
    return (p["compute_s"] - p["gemm_fixed_s"]) * k + p["gemm_fixed_s"]


def _decode_step(mean: dict, req: Request) -> np.ndarray:
    """The decode pass time t_d: its compute and communication verify draft + 1 tokens per sequence (the
    pass's own overlap: the calibrated one, or full where two micro-batches hide each other's communication).
    """
    verify = float(req.draft + 1)
    return combine(_scaled_rows(mean, verify), mean["memory_s"], mean["comm_s"] * verify, mean["overhead_s"],
                   mean["overlap"], mean["attention_compute_s"] * verify, mean["kv_memory_s"], mean["kernel_overlap"])


def _closed_rate(k: np.ndarray, c: np.ndarray, a: np.ndarray, m_td: np.ndarray, v: np.ndarray) -> np.ndarray:
    """The per-server request rate x of a closed loop: C = k x (A + m t_d / (1 - v x)), A = S + W the time to the
    first token in the engine (W, the wave's wait, does not depend on x). Multiplied by 1 - v x it is the quadratic
    k A v x^2 - (k A + k m t_d + C v) x + C = 0, whose smaller root lies in (0, 1/v) (the left side rises from 0 to
    infinity there): x = 2C / (b + sqrt(b^2 - 4 k A v C)), b = k A + k m t_d + C v (b^2 >= 4 k A v C always).
    """
    b = k * a + k * m_td + c * v
    return 2.0 * c / (b + np.sqrt(np.maximum(b * b - 4.0 * k * a * v * c, 0.0)))


def closed_loop_ttft(service: np.ndarray, transfer: np.ndarray, wave: np.ndarray, terms: StackTerms,
                     floor: np.ndarray | float = 0.0) -> np.ndarray:
    """TTFT in a closed loop as the request sees it: the prefill service S, the wait, the KV transfer
    (disaggregated) and the stack's fixed latency tau. The wait is the wave's, xi (n - 1) S_b (``wave`` = (n - 1)
    S_b), but never below ``floor``, the saturated loop's: with its prefill servers busy all the time, C requests
    cycle at the servers' rate, so each waits C S / servers less the rest of its cycle (the machine-repairman
    asymptote; Kleinrock vol. 1, 4.8). Neither the wave nor the floor depends on (xi, tau), which is how `dse
    validate` refits the stack's terms without re-running the physics.
    """
    return service + np.maximum(terms.queue_share * wave, floor) + transfer + terms.fixed_latency_s


@in_slices(3)
def aggregated(cand: Candidates, models: ModelTable, systems: SystemTable, req: Request,
               eff: Efficiency | None = None) -> dict[str, np.ndarray]:
    """Request-level metrics of aggregated replicas: ``cand.batch`` sequences per micro-batch in flight.

    Returns arrays keyed as the request-level contract (`ttft_s`, `tpot_s`, `tokens_per_s_per_gpu`,
    `tokens_per_s_per_user`, `usd_per_request`, `usd_per_mtok_input|output|blended`, `chips`,
    `power_w`), plus `fits` (memory at the peak context), `stable` (the prefill keeps up:
    rho < 1), `prefill_share` (u, the input share of cost), the pieces (`decode_step_s`,
    `chunk_extra_s`, `prefill_service_s`, `queue_wait_s`, `wave_s`, `stack_latency_s`, `requests_per_s`) and
    ``ttft_<pXX>_s``, ``tpot_<pXX>_s`` for each of ``req.quantiles``.
    """
    c = cand.broadcast()
    e = _eff(c, systems, eff)
    passes = _passes(c, models, systems, e, req, prefill=True)
    mean, peak, pre = passes["mean"], passes["peak"], passes["prefill"]
    t_d = _decode_step(mean, req)
    p_c = req.computed_prompt
    frac = min(req.chunk, p_c) / p_c  # a full chunk's share of one prompt's prefill
    # the chunk's rows join the decode pass's GEMMs: its half-performance share is not paid again
    chunk_rows = frac * (pre["compute_s"] - pre["gemm_fixed_s"])

    def carrying(prompts: float) -> np.ndarray:  # a pass carrying this many chunks' worth of prompt work per rank
        # the chunk's GEMM rows join the pass's weight GEMMs and its attention the attention kernels: each group
        # is costed by its own roofline as far as the kernels do not overlap (`roofline.kernel_work`)
        return combine(_scaled_rows(mean, req.draft + 1) + prompts * chunk_rows, mean["memory_s"],
                       mean["comm_s"] * (req.draft + 1) + prompts * frac * pre["comm_s"], mean["overhead_s"],
                       mean["overlap"], mean["attention_compute_s"] * (req.draft + 1)
                       + prompts * frac * pre["attention_compute_s"], mean["kv_memory_s"], mean["kernel_overlap"])

    mixed = carrying(1.0)
    t_c = mixed - t_d
    chunks = np.ceil(p_c / req.chunk)
    s = chunks * mixed
    pp = np.asarray(c.pp, dtype=np.float64)
    dp = np.asarray(c.dp, dtype=np.float64)
    k = dp * pp
    conc = np.asarray(c.batch, dtype=np.float64) * pp  # sequences in flight
    # prefill seconds a request adds to the replica's passes: P' t_c / K on its own rank, and the DP ranks of a
    # stage run in lock-step (expert all-to-all and TP collectives every layer), so a chunk on any rank
    # stretches the pass of all D ranks: D P' t_c / K (chunks coinciding on two ranks are counted twice, an
    # upper bound, exact while chunks are rare)
    v = dp * t_c * p_c / min(req.chunk, p_c)
    m = req.decode_passes
    # each candidate's own hardware family's terms (`dse.catalog.frameworks.Stack.aggregated_of`)
    own = [req.stack.aggregated_of(family_of(sid)) for sid in systems.ids]
    sys_idx = np.asarray(c.system)
    terms = StackTerms(queue_share=np.array([t.queue_share for t in own], dtype=np.float64)[sys_idx],
                       fixed_latency_s=np.array([t.fixed_latency_s for t in own], dtype=np.float64)[sys_idx])
    if not req.closed_loop:  # open loop: M/D/1 at each chunk server
        wave = floor = np.zeros_like(s)
        x = _solve_rate(k, conc, s, m * t_d, v)
        wait = mdl_wait(x * s, s)
    else:  # closed loop: the wave behind the other sequences of the rank, each at its share of a full-chunk pass
        per = prompts_per_chunk(req)
        share = np.minimum(carrying(float(per)) / per, s) if per > 1 else s
        wave = np.maximum(np.asarray(c.batch, dtype=np.float64) / dp - 1.0, 0.0) * share
        # the saturated loop: a chunk server busy all the time (x = 1/S, where it comes before the interference's
        # pole) serves C / k requests per cycle of C S / k
        with np.errstate(divide="ignore", invalid="ignore"):
            floor = np.where(s > v, conc * s / k - s - m * t_d / (1.0 - v / s), 0.0)
        wait = np.maximum(terms.queue_share * wave, np.maximum(floor, 0.0))
        x = _closed_rate(k, conc, s + wait, m * t_d, v)
    u = v * x
    rho = x * s
    t_bar = t_d / (1.0 - u)
    ttft = s + wait + terms.fixed_latency_s  # closed: `closed_loop_ttft` (S + max(xi wave, floor) + tau)
    tpot = t_bar / req.accept
    lam = k * x
    chips = mean["chips"]
    usd_per_s = chips * systems.price_per_s[np.asarray(c.system)]
    quant = {}
    for q in req.quantiles:
        w_q = (np.maximum(wave_wait_quantile(q, terms.queue_share, wave), floor) if req.closed_loop
               else s * wait_quantile(q, rho))
        quant[f"ttft_{quantile_name(q)}_s"] = s + w_q + terms.fixed_latency_s
        quant[f"tpot_{quantile_name(q)}_s"] = tpot_quantile(q, t_d, t_c, u, m, chunks, req.accept)
    return _metrics(
        "aggregated", req, lam, ttft, tpot, chips, usd_per_s, u, systems.power_all_in[np.asarray(c.system)],
        fits=peak["fits"], stable=(rho < 1.0) & (u < 1.0), decode_step_s=t_d, chunk_extra_s=t_c, prefill_service_s=s,
        queue_wait_s=wait, wave_s=wave, wait_floor_s=np.maximum(floor, 0.0),
        stack_latency_s=terms.fixed_latency_s * np.ones_like(s),
        hbm_bytes_per_chip=peak["hbm_bytes_per_chip"], step_s=t_bar, bound=mean["bound"], **quant,
    )


def cost_keys(usd_per_s, rate, input_share, prompt: float, output: float) -> dict:
    """A request's cost as the module's "Cost split" has it: the deployment's USD/s over the requests/s it serves
    (``usd_per_request``), its input part the prefill's share ``input_share`` of it over the prompt's tokens, the rest
    over the output's, and the whole over all of them (``usd_per_mtok_blended``); arrays or floats.
    """
    usd_req = usd_per_s / rate
    return {"usd_per_request": usd_req,
            "usd_per_mtok_input": usd_req * input_share / prompt * 1e6,
            "usd_per_mtok_output": usd_req * (1.0 - input_share) / output * 1e6,
            "usd_per_mtok_blended": usd_req / (prompt + output) * 1e6,
            "prefill_share": input_share}


def _metrics(serving: str, req: Request, lam: np.ndarray, ttft: np.ndarray, tpot: np.ndarray, chips: np.ndarray,
             usd_per_s: np.ndarray, input_share: np.ndarray, power_per_chip: np.ndarray, **extra) -> dict:
    with np.errstate(divide="ignore", invalid="ignore"):
        out = {
            "ttft_s": ttft,
            "tpot_s": tpot,
            "tokens_per_s_per_gpu": lam * req.output / chips,
            "tokens_per_s_per_user": 1.0 / tpot,
            **cost_keys(usd_per_s, lam, input_share, req.prompt, req.output),
            "chips": chips,
            "power_w": power_w(chips, power_per_chip),
            "requests_per_s": lam,
            "usd_per_s": usd_per_s,
        }
    out.update(extra)
    return out


@in_slices(3)
def decode_pool(cand: Candidates, models: ModelTable, systems: SystemTable, req: Request,
                eff: Efficiency | None = None) -> dict[str, np.ndarray]:
    """A decode replica of a disaggregated deployment: TPOT, request rate, USD per request, memory."""
    c = cand.broadcast()
    e = _eff(c, systems, eff)
    passes = _passes(c, models, systems, e, req)
    mean, peak = passes["mean"], passes["peak"]
    t_d = _decode_step(mean, req)
    pp = np.asarray(c.pp, dtype=np.float64)
    conc = np.asarray(c.batch, dtype=np.float64) * pp
    lam = conc / (max(req.decode_passes, 1.0 / req.accept) * t_d)  # Little's law over the decode passes
    chips = mean["chips"]
    usd_per_s = chips * systems.price_per_s[np.asarray(c.system)]
    return {"tpot_s": t_d / req.accept, "requests_per_s": lam, "usd_per_request": usd_per_s / lam,
            "chips": chips, "usd_per_s": usd_per_s, "fits": peak["fits"], "decode_step_s": t_d,
            "hbm_bytes_per_chip": peak["hbm_bytes_per_chip"], "bound": mean["bound"],
            "power_per_chip": systems.power_all_in[np.asarray(c.system)]}


@in_slices(3)
def prefill_pool(cand: Candidates, models: ModelTable, systems: SystemTable, req: Request,
                 context_parallel: np.ndarray | bool = False, eff: Efficiency | None = None,
                 full_chunk: bool = False) -> dict[str, np.ndarray]:
    """A prefill replica of a disaggregated deployment: its service time per prompt, its servers,
    the KV hand-off time, and its USD per prompt at full utilisation (divide by rho for a pool); its serving stack's
    disaggregated terms (``stack_latency_s``, ``queue_share``: `dse.catalog.frameworks.Stack.disaggregated_of` its
    system's hardware family).

    ``cand.batch`` is ignored (one prompt per DP rank, or one per replica with context parallelism).
    Memory is checked for one prompt's KV (1/DP of it per chip with context parallelism) and the
    chunk's activations per DP rank. With ``full_chunk``, also ``chunk_share_s``: a prompt's share of a
    pass carrying a full chunk of whole prompts per DP rank (`prompts_per_chunk`; the pass / that count),
    what each prompt of a backlog costs once queued prompts are prefilled together (the weight reads, fixed
    latencies and per-pass overhead shared); equal to the service where one prompt fills the chunk.
    """
    c = cand.broadcast()
    e = _eff(c, systems, eff)
    passes = _passes(c, models, systems, e, req, prefill=True, decode=False, full_chunk=full_chunk,
                     prefill_memory=True)
    pre = passes["prefill"]
    sys_idx = np.asarray(c.system)
    dp = np.asarray(c.dp, dtype=np.float64)
    pp = np.asarray(c.pp, dtype=np.float64)
    tp = np.asarray(c.tp, dtype=np.float64)
    cp = np.where(np.asarray(context_parallel, dtype=bool), dp, 1.0)
    kv_chip = pre["kv_bytes_per_chip"]  # one prompt's KV share held by each chip of its DP rank
    domain = systems.domain[sys_idx]
    su = systems.scaleup_bw[sys_idx] * e.link
    so = systems.scaleout_bw[sys_idx] * e.link
    ring_bw = np.where(cp * tp <= domain, su, np.where(so > 0, so, su))
    ring = np.where(cp > 1, kv_chip * (cp - 1.0) / cp / ring_bw, 0.0)
    work = pre["step_s"] / cp
    service = np.maximum(work, ring) + (1.0 - e.overlap) * np.minimum(work, ring)
    servers = np.where(cp > 1, pp, dp * pp)
    xfer_bw = np.where(so > 0, so, su)
    transfer = kv_chip / cp / xfer_bw  # every chip sends its share of the prompt's KV in parallel
    chips = pre["chips"]
    usd_per_s = chips * systems.price_per_s[sys_idx]
    # memory: with context parallelism each chip holds 1/cp of its prompt's KV; checked as the framework reserves it
    hbm = pre["hbm_bytes_per_chip"] - kv_chip * (1.0 - 1.0 / cp)
    a_act, a_kv, budget = memory_budget(systems.device_memory[sys_idx], e, float(req.chunk), tp, pp,
                                        models.n_experts[np.asarray(cand.model)] > 0)
    fits = ((pre["weights_bytes_per_chip"] + a_act * pre["activation_bytes_per_chip"] + a_kv * kv_chip / cp <= budget)
            & (hbm <= systems.device_memory[sys_idx]))
    own = [req.stack.disaggregated_of(family_of(sid)) for sid in systems.ids]  # each system's family's terms
    tau = np.array([t.fixed_latency_s for t in own], dtype=np.float64)[sys_idx]
    xi = np.array([t.queue_share for t in own], dtype=np.float64)[sys_idx]
    out = {"prefill_service_s": service, "servers": servers, "kv_transfer_s": transfer, "stack_latency_s": tau,
           "queue_share": xi,
           "usd_per_prompt": usd_per_s * service / servers, "chips": chips, "usd_per_s": usd_per_s,
           "chip_s_per_prompt": chips * service / servers, "fits": fits, "hbm_bytes_per_chip": hbm,
           "ring_s": ring, "context_parallel": cp > 1, "power_per_chip": systems.power_all_in[sys_idx]}
    if full_chunk:
        out["chunk_share_s"] = np.minimum(passes["full_chunk"]["step_s"] / prompts_per_chunk(req), service)
    return out


def mdl_wait(rho: np.ndarray, service: np.ndarray) -> np.ndarray:
    """Mean M/D/1 wait (Pollaczek-Khinchine, deterministic service): rho S / (2 (1 - rho))."""
    return rho * service / (2.0 * (1.0 - rho))


def prefill_ttft(service: np.ndarray, transfer: np.ndarray, tau: np.ndarray, rho: np.ndarray, req: Request,
                 q: float | None = None) -> np.ndarray:
    """TTFT through a disaggregated prefill pool at utilisation rho under Poisson arrivals, as the request sees it:
    service S + the M/D/1 wait (its mean, or its q-quantile) + the KV transfer + the stack's fixed latency tau
    (`prefill_pool`'s ``stack_latency_s``: the disaggregated mode's, of the pool's hardware family where the stack
    has terms of its own there).
    """
    wait = mdl_wait(rho, service) if q is None else service * wait_quantile(q, rho)
    return service + wait + transfer + tau


def rho_for_ttft(service: np.ndarray, transfer: np.ndarray, tau: np.ndarray, req: Request,
                 margin: np.ndarray | float = 1.0, rho_max: float = RHO_MAX) -> np.ndarray:
    """The highest prefill-pool utilisation whose TTFT (`prefill_ttft`) times ``margin`` meets every TTFT target
    of ``req``: on the mean (``ttft_max``) and on quantiles (``ttft_quantile_max``).

    Mean: W / S = rho / (2 (1 - rho)) <= D with D = (T / margin - S - transfer - tau) / S gives
    rho <= 2D / (1 + 2D). Quantile q: the inverse of the M/D/1 wait's quantile at D
    (`dse.physics.queueing.rho_for_wait_quantile`). Capped at ``rho_max``; NaN where even an empty queue misses
    a target.
    """
    fixed = transfer + tau
    shape = np.broadcast_shapes(np.shape(service), np.shape(transfer), np.shape(tau), np.shape(margin))
    rho = np.full(shape, rho_max, dtype=np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        if req.ttft_max is not None:
            d = (req.ttft_max / margin - service - fixed) / service
            rho = np.where(d >= 0, np.minimum(2.0 * d / (1.0 + 2.0 * d), rho), np.nan)
        for q, target in req.ttft_quantile_max:
            d = (target / margin - service - fixed) / service
            rho = np.minimum(rho, rho_for_wait_quantile(q, d))
    return rho


def disaggregated(dec: dict, pre: dict, req: Request, rho: np.ndarray) -> dict[str, np.ndarray]:
    """Combine a decode replica and prefill replicas (at utilisation rho) into request-level metrics.

    ``dec`` and ``pre`` are (broadcastable) outputs of `decode_pool` and `prefill_pool`. The
    deployment unit is one decode replica with ``prefill_replicas`` = lambda S / (servers rho)
    prefill replicas (a fluid ratio; a fleet rounds whole replicas). TTFT under Poisson arrivals (`prefill_ttft`);
    TPOT is the decode pass's, the same for every request (its quantiles equal its mean).
    """
    lam = dec["requests_per_s"]
    ratio = lam * pre["prefill_service_s"] / (pre["servers"] * rho)
    tau = pre["stack_latency_s"]
    ttft = prefill_ttft(pre["prefill_service_s"], pre["kv_transfer_s"], tau, rho, req)
    usd_pre = pre["usd_per_prompt"] / rho
    usd_req = dec["usd_per_request"] + usd_pre
    chips = dec["chips"] + ratio * pre["chips"]
    power = power_w(dec["chips"], dec["power_per_chip"]) + power_w(ratio * pre["chips"], pre["power_per_chip"])
    quant = {}
    for q in req.quantiles:
        quant[f"ttft_{quantile_name(q)}_s"] = prefill_ttft(pre["prefill_service_s"], pre["kv_transfer_s"], tau, rho,
                                                           req, q)
        quant[f"tpot_{quantile_name(q)}_s"] = dec["tpot_s"] * np.ones_like(ttft)
    out = _metrics("disaggregated", req, lam, ttft, dec["tpot_s"], chips, usd_req * lam, usd_pre / usd_req,
                   np.ones_like(chips), prefill_replicas=ratio, prefill_rho=rho,
                   kv_transfer_s=pre["kv_transfer_s"] * np.ones_like(ttft),
                   prefill_service_s=pre["prefill_service_s"] * np.ones_like(ttft),
                   stack_latency_s=tau * np.ones_like(ttft), **quant)
    out["power_w"] = power
    return out


def disaggregated_closed_loop(dec: dict, pre: dict, req: Request, concurrency: np.ndarray,
                             prefill_replicas: np.ndarray) -> dict[str, np.ndarray]:
    """A disaggregated deployment holding a fixed number of requests in flight (a benchmark's closed loop):
    ``concurrency`` requests cycle through ``prefill_replicas`` prefill replicas and the decode replicas
    among which ``dec`` was evaluated, each new request sent as one completes.

    ``dec`` is `decode_pool` evaluated at each decode replica's share of the requests in flight, ``pre``
    `prefill_pool` (with ``full_chunk``: ``chunk_share_s``, what each queued prompt costs). A prompt waits in the
    closed loop's wave (`dse.physics.queueing`): W = xi (n - 1) S_b, n = C / (servers x prefill replicas) the
    requests in flight per prefill server, xi the stack's queue share, never below the saturated loop's wait
    (`closed_loop_ttft`; its servers, busy all the time, prefill the queued prompts together, each at S_b, its
    share of a full-chunk pass, so C requests cycle in C S_b / servers); TTFT = S + W + transfer + tau. W does not
    depend on the rate, so Little's law over the engine's stages, lambda (S + W + transfer + (O - 1) TPOT) = C,
    gives it in closed form (the few requests inside the stack's fixed latency are counted with the engine's), and
    the prefill servers' utilisation at S_b stays at most 1.
    Returns ``requests_per_s``, ``ttft_s`` (and its quantiles), ``tpot_s``, ``prefill_rho``, ``queue_wait_s``,
    ``wave_s`` and ``stack_latency_s``.
    """
    c = np.asarray(concurrency, dtype=np.float64)
    s = np.asarray(pre["prefill_service_s"], dtype=np.float64)
    servers = np.asarray(pre["servers"], dtype=np.float64) * np.asarray(prefill_replicas, dtype=np.float64)
    transfer = np.asarray(pre["kv_transfer_s"], dtype=np.float64)
    tpot = np.asarray(dec["tpot_s"], dtype=np.float64)
    share = np.asarray(pre.get("chunk_share_s", s), dtype=np.float64)
    terms = StackTerms(queue_share=np.asarray(pre["queue_share"], dtype=np.float64),
                       fixed_latency_s=np.asarray(pre["stack_latency_s"], dtype=np.float64))
    wave = np.maximum(c / servers - 1.0, 0.0) * share
    tail = max(req.output - 1, 0) * tpot
    floor = np.maximum(c * share / servers - s - transfer - tail, 0.0)  # the saturated loop's, at S_b per prompt
    wait = np.maximum(terms.queue_share * wave, floor)
    engine = s + wait + transfer
    lam = c / (engine + tail)
    tau = terms.fixed_latency_s * np.ones(np.shape(engine))
    out = {"requests_per_s": lam, "ttft_s": closed_loop_ttft(s, transfer, wave, terms, floor) * np.ones_like(engine),
           "tpot_s": tpot, "prefill_rho": lam * share / servers,
           "queue_wait_s": wait, "wave_s": wave, "wait_floor_s": floor, "stack_latency_s": tau}
    for q in req.quantiles:
        w_q = np.maximum(wave_wait_quantile(q, terms.queue_share, wave), floor)
        out[f"ttft_{quantile_name(q)}_s"] = s + w_q + transfer + tau
        out[f"tpot_{quantile_name(q)}_s"] = tpot * np.ones_like(engine)
    return out


def decode_share_closed_loop(decode_at, pre: dict, req: Request, concurrency: np.ndarray,
                             prefill_replicas: np.ndarray, decode_replicas: np.ndarray,
                             steps: int = 24) -> tuple[dict, dict]:
    """`disaggregated_closed_loop` with the decode pool holding only the requests past their prefill.

    Of C requests in flight, lambda TTFT are queued, prefilling or handing off their KV, and by Little's
    law the decode replicas hold the others, lambda (O - 1) TPOT = C - lambda TTFT (TTFT in the engine, the
    stack's fixed latency outside it): a decode replica's
    batch is n = (C - lambda TTFT) / replicas, not C / replicas. ``decode_at(n)`` evaluates `decode_pool` at
    a batch of n per replica. g(n) = (C - lambda(n) TTFT(lambda(n))) / replicas rises with n (a slower
    decode lowers the rate, and with it the prefill queue) and lies in (0, C / replicas], so the fixed
    point n = g(n) is bracketed by [0, C / replicas]; bisection on log n (``steps`` halvings, batches held
    at one sequence or more) finds it. Returns the closed loop's metrics (with ``decode_batch``, the batch
    per decode replica) and the decode pool's.
    """
    c = np.asarray(concurrency, dtype=np.float64)
    reps = np.asarray(decode_replicas, dtype=np.float64)
    hi = np.maximum(c / reps, 1.0)
    lo = np.minimum(np.ones_like(hi), hi)

    def loop(n: np.ndarray) -> tuple[dict, dict]:
        dec = decode_at(n)
        return dec, disaggregated_closed_loop(dec, pre, req, c, prefill_replicas)

    for _ in range(steps):
        mid = np.sqrt(lo * hi)
        _, r = loop(mid)
        held = (c - r["requests_per_s"] * (r["ttft_s"] - r["stack_latency_s"])) / reps  # g(mid)
        above = held >= mid
        lo = np.where(above, mid, lo)
        hi = np.where(above, hi, mid)
    dec, r = loop(lo)
    r["decode_batch"] = lo
    return r, dec
