"""Measure a machine against the roofline: matmul FLOP/s, memory copy bandwidth, real decode steps and prefills.

On a GPU (PyTorch with CUDA): bf16 and fp8 matrix multiplies against size, HBM copy bandwidth, then a whole
catalog model (default Llama 3.1 8B: embedding, every layer with RMSNorm, rotary embedding, grouped-query attention
over a KV cache and a gated MLP, final norm and LM head) with random bf16 weights on one GPU: decode steps at several
batches and KV lengths (each step captured in a CUDA graph, its attention computed two ways: batched matrix products
over the cache, `bmm`, and PyTorch's fused scaled-dot-product attention, `sdpa`) and prefills of whole prompts
(causal fused attention, the LM head on each sequence's last token). Each is compared with the prediction of
`dse.physics` for the catalog system given by --system (ideal roofline and calibrated). On a CPU (PyTorch, or NumPy
when PyTorch is absent) a small stack runs the same code in float32, and its steps are compared with a roofline built
from the matmul peak and copy bandwidth measured in the same run.

Usage: python scripts/measure_gpu.py [--device cuda|cpu] [--model ID] [--system h100] [--out FILE.csv] [--quick]
           [--stacks eager,compiled] [--decode B:T,...|none] [--prefill B:P,...|none] [--weights bf16|fp8]
       python scripts/measure_gpu.py --predict FILE.csv [--system h100]   # add dse's predictions to a measured file
Writes one CSV (a row per measurement) whose first line is a comment naming device, date and software. Where
`dse` cannot be imported (a GPU machine without the project's dependencies) the prediction columns stay empty
and --predict fills them in afterwards.
"""

from __future__ import annotations

import argparse
import datetime
import io
import math
import platform
import statistics
import subprocess
import time
from pathlib import Path

import numpy as np

try:  # PyTorch is optional: the CPU path falls back to NumPy
    import torch
except ImportError:  # pragma: no cover - depends on the machine
    torch = None

ROOT = Path(__file__).resolve().parent.parent

# A small dense GQA transformer for the CPU path (Llama-like proportions, small enough for a laptop)
TINY = {
    "id": "measure-tiny", "name": "measurement stack", "d_model": 256, "n_layers": 2, "vocab": 1000,
    "source": {"title": "scripts/measure_gpu.py", "date": "2026-11-27"},
    "published_b": {"total": 0.0025, "active": 0.0025, "precision_total": 1, "precision_active": 1, "source": "n/a"},
    "max_context": {"tokens": 4096, "source": "n/a", "date": "2026-11-27"},
    "attention": {"kind": "gqa", "n_heads": 4, "n_kv_heads": 2, "head_dim": 64},
    "ffn": {"kind": "dense", "d_ff": 704},
}
ROPE_THETA = 500000.0


def catalog_spec(model_id: str) -> dict:
    """The catalog entry of a dense grouped-query-attention model, read with PyYAML alone (no dse import)."""
    import yaml

    for entry in yaml.safe_load((ROOT / "model_catalog" / "models.yaml").read_text())["models"]:
        if entry["id"] == model_id:
            att, ffn = entry["attention"], entry["ffn"]
            if att["kind"] not in ("gqa", "mha", "mqa") or ffn["kind"] != "dense" or "sliding_window" in att:
                raise SystemExit(f"--model {model_id}: the measured stack runs dense GQA/MHA models only")
            return entry
    raise SystemExit(f"--model {model_id}: not in model_catalog/models.yaml")


class Backend:
    """PyTorch (CPU or CUDA) or NumPy (CPU), behind the few calls the measurements need."""

    def __init__(self, device: str) -> None:
        self.device = device
        self.torch = torch is not None
        self.cuda = device == "cuda"
        if self.cuda and not (self.torch and torch.cuda.is_available()):
            raise SystemExit("--device cuda needs PyTorch with a CUDA device")
        self.rng = np.random.default_rng(0)
        self.flash_gqa = self.cuda and self._probe_flash_gqa()

    @staticmethod
    def _probe_flash_gqa() -> bool:
        """Whether PyTorch's flash attention takes grouped KV heads as they are (no copy of K and V per head)."""
        from torch.nn.attention import SDPBackend, sdpa_kernel

        q = torch.randn(1, 8, 4, 64, device="cuda", dtype=torch.bfloat16)
        kv = torch.randn(1, 2, 4, 64, device="cuda", dtype=torch.bfloat16)
        try:
            with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
                torch.nn.functional.scaled_dot_product_attention(q, kv, kv, is_causal=True, enable_gqa=True)
            return True
        except RuntimeError:
            return False

    def sdpa(self, q, k, v, causal: bool):
        """PyTorch's fused attention: flash with grouped KV heads where it takes them, else K and V per head."""
        F = torch.nn.functional
        if self.flash_gqa and torch.compiler.is_compiling():  # the compiler picks the kernel of its own
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)
        if self.flash_gqa:
            from torch.nn.attention import SDPBackend, sdpa_kernel

            with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
                return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)
        if self.cuda:
            g = q.shape[1] // k.shape[1]
            k, v = k.repeat_interleave(g, 1), v.repeat_interleave(g, 1)
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()

    def randn(self, *shape: int, dtype: str = "float32", scale: float = 1.0):
        if self.torch:
            dt = {"bf16": torch.bfloat16, "float32": torch.float32}[dtype]
            return torch.randn(*shape, device=self.device, dtype=dt) * scale
        return (self.rng.standard_normal(shape, dtype=np.float32) * scale).astype(np.float32)

    def tokens(self, *shape: int, vocab: int):
        if self.torch:
            return torch.randint(0, vocab, shape, device=self.device)
        return self.rng.integers(0, vocab, shape)

    def cat(self, parts, axis: int):
        return torch.cat(parts, axis) if self.torch else np.concatenate(parts, axis)

    def softmax(self, x):
        if self.torch:
            return torch.softmax(x.float(), -1).to(x.dtype)
        e = np.exp(x - x.max(-1, keepdims=True))
        return e / e.sum(-1, keepdims=True)

    def silu(self, x):
        if self.torch:
            return torch.nn.functional.silu(x)
        with np.errstate(over="ignore"):
            return x / (1 + np.exp(-x))

    def rmsnorm(self, x, w, eps: float = 1e-5):
        if self.torch:
            xf = x.float()
            return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * w
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w

    def causal_attention(self, q, k, v):
        """q (b, h, n, d), k and v (b, kvh, n, d): causal attention, the query heads grouped over the KV heads."""
        if self.torch:
            return self.sdpa(q, k, v, causal=True)
        b, h, n, d = q.shape
        g = h // k.shape[1]
        qg = q.reshape(b, k.shape[1], g, n, d)
        s = np.einsum("bkgnd,bktd->bkgnt", qg, k) / math.sqrt(d)
        s = np.where(np.tril(np.ones((n, n), bool)), s, -np.inf)
        return np.einsum("bkgnt,bktd->bkgnd", self.softmax(s), v).reshape(b, h, n, d)

    def decode_attention(self, q, k, v, variant: str):
        """q (b, h, d) of one new token per sequence over k, v (b, kvh, t, d); variant bmm or sdpa (PyTorch)."""
        b, h, d = q.shape
        kvh = k.shape[1]
        if variant == "sdpa":
            return self.sdpa(q.reshape(b, h, 1, d), k, v, causal=False).reshape(b, h * d)
        qg = q.reshape(b, kvh, h // kvh, d)
        s = (qg @ k.swapaxes(-1, -2)) * (1 / math.sqrt(d))
        return (self.softmax(s) @ v).reshape(b, h * d)

    def name(self) -> str:
        if self.cuda:
            return torch.cuda.get_device_name()
        return f"{platform.processor() or platform.machine()} CPU"

    def versions(self) -> str:
        if self.torch:
            cuda = torch.version.cuda if self.cuda else "none"
            return f"torch {torch.__version__}, cuda {cuda}, numpy {np.__version__}"
        return f"numpy {np.__version__} (no torch)"

    def free(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()
            torch.cuda.empty_cache()


def graphed(fn, backend: Backend):
    """On CUDA, the callable captured in a CUDA graph (replays launch every kernel at once); elsewhere as it is."""
    if not backend.cuda:
        return fn
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph.replay


def timeit(fn, backend: Backend, repeat: int) -> tuple[float, float]:
    """Median and minimum seconds of `repeat` calls after two warm-ups (CUDA events on a GPU)."""
    fn()
    fn()
    backend.sync()
    times = []
    for _ in range(repeat):
        if backend.cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
        else:
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
    return statistics.median(times), min(times)


def measure_matmul(backend: Backend, sizes: list[int], dtypes: list[str], repeat: int) -> list[dict]:
    rows = []
    for dtype in dtypes:
        for n in sizes:
            if dtype == "fp8":
                if not (backend.cuda and hasattr(torch, "_scaled_mm")):
                    continue
                a = backend.randn(n, n, dtype="bf16").to(torch.float8_e4m3fn)
                b = backend.randn(n, n, dtype="bf16").to(torch.float8_e4m3fn).t()
                one = torch.tensor(1.0, device="cuda")

                def fn(a=a, b=b, one=one):
                    return torch._scaled_mm(a, b, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)
            else:
                a, b = backend.randn(n, n, dtype=dtype), backend.randn(n, n, dtype=dtype)

                def fn(a=a, b=b):
                    return a @ b
            med, best = timeit(fn, backend, repeat)
            rows.append({"kind": "matmul", "dtype": dtype, "size": n, "seconds": med, "seconds_min": best,
                         "value": 2.0 * n**3 / med, "unit": "FLOP/s"})
    backend.free()
    return rows


def measure_copy(backend: Backend, sizes_bytes: list[int], repeat: int) -> list[dict]:
    rows = []
    for size in sizes_bytes:
        src = backend.randn(size // 4)
        if backend.torch:
            dst = torch.empty_like(src)

            def fn(src=src, dst=dst):
                dst.copy_(src)
        else:
            dst = np.empty_like(src)

            def fn(src=src, dst=dst):
                np.copyto(dst, src)
        med, best = timeit(fn, backend, repeat)
        rows.append({"kind": "copy", "dtype": "float32", "size": size, "seconds": med, "seconds_min": best,
                     "value": 2.0 * size / med, "unit": "B/s"})  # read + write
    backend.free()
    return rows


class Stack:
    """A whole dense GQA model with random weights: what one decode step or one prefill computes and reads.
    `dtype` is the activations' and the KV cache's format; `weights` the weight matrices' (`fp8`, on a GPU with
    FP8 tensor cores: e4m3 with a per-tensor scale, each product's input cast to e4m3 and multiplied by
    torch._scaled_mm into bf16; the embedding table stays in `dtype`, a lookup)."""

    def __init__(self, backend: Backend, spec: dict, dtype: str, weights: str | None = None) -> None:
        self.b, self.spec, self.dtype, self.weights = backend, spec, dtype, weights or dtype
        self.compiled: dict[str, tuple] = {}
        d, a, f = spec["d_model"], spec["attention"], spec["ffn"]["d_ff"]
        self.d, self.f = d, f
        self.h, self.kvh, self.hd = a["n_heads"], a.get("n_kv_heads", a["n_heads"]), a["head_dim"]
        s = 1 / math.sqrt(d)
        self.embed = backend.randn(spec["vocab"], d, dtype=dtype)
        self.head = backend.randn(d, spec["vocab"], dtype=dtype, scale=s)
        self.norm = backend.randn(d, dtype=dtype, scale=0.1) + 1
        self.layers = [{
            "n1": backend.randn(d, dtype=dtype, scale=0.1) + 1, "n2": backend.randn(d, dtype=dtype, scale=0.1) + 1,
            "wqkv": backend.randn(d, (self.h + 2 * self.kvh) * self.hd, dtype=dtype, scale=s),
            "wo": backend.randn(self.h * self.hd, d, dtype=dtype, scale=1 / math.sqrt(self.h * self.hd)),
            "w13": backend.randn(d, 2 * f, dtype=dtype, scale=s),
            "w2": backend.randn(f, d, dtype=dtype, scale=1 / math.sqrt(f)),
        } for _ in range(spec["n_layers"])]
        if self.weights == "fp8":
            self.one = torch.tensor(1.0, device=backend.device)
            self.head = self.quantized(self.head)
            for L in self.layers:
                for name in ("wqkv", "wo", "w13", "w2"):
                    L[name] = self.quantized(L[name])

    def quantized(self, w):
        """`w` (in, out) as e4m3 with its per-tensor scale, laid out column-major as torch._scaled_mm takes it."""
        scale = w.abs().amax().float() / torch.finfo(torch.float8_e4m3fn).max
        return (w.float() / scale).t().contiguous().to(torch.float8_e4m3fn).t(), scale

    def mm(self, x, w):
        """x @ w, through FP8 tensor cores where the weights are FP8."""
        if not isinstance(w, tuple):
            return x @ w
        w8, scale = w
        x8 = x.reshape(-1, x.shape[-1]).to(torch.float8_e4m3fn)
        y = torch._scaled_mm(x8, w8, scale_a=self.one, scale_b=scale, out_dtype=x.dtype)
        return y.reshape(*x.shape[:-1], w8.shape[1])

    def rope(self, positions: np.ndarray):
        """cos and sin of the rotary embedding at these positions, shape (n, head_dim / 2)."""
        inv = ROPE_THETA ** (-np.arange(0, self.hd, 2, dtype=np.float64) / self.hd)
        ang = np.outer(positions, inv)
        if self.b.torch:
            dt = {"bf16": torch.bfloat16, "float32": torch.float32}[self.dtype]
            return (torch.tensor(np.cos(ang), device=self.b.device, dtype=dt),
                    torch.tensor(np.sin(ang), device=self.b.device, dtype=dt))
        return np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)

    def rotate(self, x, cos, sin):
        half = self.hd // 2
        x1, x2 = x[..., :half], x[..., half:]
        return self.b.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1)

    def mlp(self, x, L):
        gu = self.mm(self.b.rmsnorm(x, L["n2"]), L["w13"])
        return x + self.mm(self.b.silu(gu[..., : self.f]) * gu[..., self.f:], L["w2"])

    def kv_cache(self, batch: int, tokens: int):
        return [(self.b.randn(batch, self.kvh, tokens, self.hd, dtype=self.dtype),
                 self.b.randn(batch, self.kvh, tokens, self.hd, dtype=self.dtype)) for _ in self.layers]

    def decode_layer(self, x, L, K, V, cos, sin, pos: int, variant: str):
        """One layer of a decode step: `x` (batch, d_model), its token at position `pos` written to K and V."""
        h, kvh, hd, batch = self.h, self.kvh, self.hd, x.shape[0]
        qkv = self.mm(self.b.rmsnorm(x, L["n1"]), L["wqkv"])
        q = self.rotate(qkv[:, : h * hd].reshape(batch, h, hd), cos, sin)
        K[:, :, pos] = self.rotate(qkv[:, h * hd: (h + kvh) * hd].reshape(batch, kvh, hd), cos, sin)
        V[:, :, pos] = qkv[:, (h + kvh) * hd:].reshape(batch, kvh, hd)
        return self.mlp(x + self.mm(self.b.decode_attention(q, K, V, variant), L["wo"]), L)

    def prefill_layer(self, x, L, K, V, cos, sin):
        """One layer of a prefill: `x` (batch, prompt, d_model), every position's K and V written to the cache."""
        h, kvh, hd = self.h, self.kvh, self.hd
        batch, prompt = x.shape[0], x.shape[1]
        qkv = self.mm(self.b.rmsnorm(x, L["n1"]), L["wqkv"])
        q = self.rotate(qkv[..., : h * hd].reshape(batch, prompt, h, hd).swapaxes(1, 2), cos, sin)
        K[...] = self.rotate(qkv[..., h * hd: (h + kvh) * hd].reshape(batch, prompt, kvh, hd).swapaxes(1, 2),
                             cos, sin)
        V[...] = qkv[..., (h + kvh) * hd:].reshape(batch, prompt, kvh, hd).swapaxes(1, 2)
        o = self.b.causal_attention(q, K, V).swapaxes(1, 2).reshape(batch, prompt, h * hd)
        return self.mlp(x + self.mm(o, L["wo"]), L)

    def layer_functions(self, stack: str):
        """The layer functions as written (`eager`) or compiled by torch.compile (`compiled`: elementwise work
        fused into generated kernels, dynamic shapes so one compilation serves every batch and length)."""
        if stack == "eager":
            return self.decode_layer, self.prefill_layer
        if stack not in self.compiled:
            for limit in ("recompile_limit", "cache_size_limit"):  # beyond it dynamo would fall back to eager
                if hasattr(torch._dynamo.config, limit):
                    setattr(torch._dynamo.config, limit, 64)
            self.compiled[stack] = (torch.compile(self.decode_layer, dynamic=True),
                                    torch.compile(self.prefill_layer, dynamic=True))
        return self.compiled[stack]

    def decode(self, batch: int, context: int, variant: str, stack: str = "eager"):
        """One decode step: each of `batch` sequences adds token `context` - 1 and attends over all `context`."""
        layer = self.layer_functions(stack)[0]
        cache = self.kv_cache(batch, context)
        tokens = self.b.tokens(batch, vocab=self.spec["vocab"])
        cos, sin = self.rope(np.array([context - 1]))
        out = {}

        def step():
            x = self.embed[tokens]
            for L, (K, V) in zip(self.layers, cache, strict=True):
                x = layer(x, L, K, V, cos, sin, context - 1, variant)
            out["logits"] = self.mm(self.b.rmsnorm(x, self.norm), self.head)
            return out["logits"]
        return step, out

    def prefill(self, batch: int, prompt: int, stack: str = "eager"):
        """A prefill of `batch` prompts of `prompt` tokens: KV written to the cache, the LM head on the last token."""
        layer = self.layer_functions(stack)[1]
        cache = self.kv_cache(batch, prompt)
        tokens = self.b.tokens(batch, prompt, vocab=self.spec["vocab"])
        cos, sin = self.rope(np.arange(prompt))
        out = {}

        def step():
            x = self.embed[tokens]
            for L, (K, V) in zip(self.layers, cache, strict=True):
                x = layer(x, L, K, V, cos, sin)
            out["logits"] = self.mm(self.b.rmsnorm(x[:, -1], self.norm), self.head)
            return out["logits"]
        return step, out


def relative_error(a, b) -> float:
    a = np.asarray(a.float().cpu() if torch is not None and hasattr(a, "cpu") else a, dtype=np.float64)
    b = np.asarray(b.float().cpu() if torch is not None and hasattr(b, "cpu") else b, dtype=np.float64)
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def checks(stack: Stack, backend: Backend, stacks: tuple[str, ...]) -> str:
    """The two decode attentions agree, a graph replay computes what the eager step computes, and a compiled
    layer computes what the eager one does."""
    if not backend.torch:
        return ""
    notes = []
    q = backend.randn(4, stack.h, stack.hd, dtype=stack.dtype)
    k, v = stack.kv_cache(4, 256)[0]
    if backend.flash_gqa:
        e = relative_error(backend.decode_attention(q, k, v, "sdpa"), backend.decode_attention(q, k, v, "bmm"))
        notes.append(f"sdpa vs bmm decode attention relative error {e:.1e}")
    step, out = stack.decode(4, 256, "bmm")
    ref = step().clone()
    replay = graphed(step, backend)
    replay()
    backend.sync()
    notes.append(f"graph replay vs eager logits relative error {relative_error(out['logits'], ref):.1e}")
    del step, replay
    for name in stacks:
        if name == "eager":
            continue
        x = backend.randn(4, stack.d, dtype=stack.dtype)
        cos, sin = stack.rope(np.array([255]))
        eager = stack.decode_layer(x, stack.layers[0], k.clone(), v.clone(), cos, sin, 255, "bmm")
        other = stack.layer_functions(name)[0](x, stack.layers[0], k.clone(), v.clone(), cos, sin, 255, "bmm")
        notes.append(f"{name} vs eager decode layer relative error {relative_error(other, eager):.1e}")
    backend.free()
    return ", ".join(notes)


def measure_steps(backend: Backend, stack: Stack, decode_grid, prefill_grid, variants, stacks, repeat: int,
                  progress=None):
    """Each decode step and prefill timed on its own, every stack in turn; one that fails is reported and skipped
    (after a failure other than running out of memory, the rest of that stack, kind and attention too).
    `progress(rows)` is called after each measurement."""
    rows, broken = [], set()
    for name in stacks:
        jobs = [("decode", b, t, v) for b, t in decode_grid for v in variants]
        jobs += [("prefill", b, p, "sdpa" if backend.torch else "einsum") for b, p in prefill_grid]
        for kind, batch, context, variant in jobs:
            if (name, kind, variant) in broken:
                continue
            try:
                if kind == "decode":
                    step, _ = stack.decode(batch, context, variant, name)
                    n = repeat
                else:
                    step, _ = stack.prefill(batch, context, name)
                    n = max(3, repeat // 4) if backend.cuda else repeat
                med, best = timeit(graphed(step, backend), backend, n)
            except Exception as exc:  # out of memory, a compiler failure: report it and go on
                print(f"# {name} {kind} batch {batch} context {context} {variant}: failed: "
                      f"{type(exc).__name__}: {str(exc)[:300]}", flush=True)
                if not (torch is not None and isinstance(exc, torch.OutOfMemoryError)):
                    broken.add((name, kind, variant))
                step = None
                backend.free()
                continue
            tokens = batch if kind == "decode" else batch * context
            rows.append({"kind": kind, "dtype": stack.weights, "kv_dtype": stack.dtype, "stack": name,
                         "attention": variant, "batch": batch,
                         "context": context, "seconds": med, "seconds_min": best, "value": tokens / med,
                         "unit": "tokens/s"})
            print(f"# {name} {kind} batch {batch} context {context} {variant}: {med * 1e3:.3f} ms", flush=True)
            if progress:
                progress(rows)
            del step
            backend.free()
    return rows


def predict(rows: list[dict], spec: dict, system_id: str | None, peaks: dict | None) -> list[dict]:
    """dse's ideal and calibrated step times for each decode and prefill row (calibrated on a catalog system only)."""
    from dse.catalog.hardware import IDEAL, get_system
    from dse.catalog.models import Architecture, ModelSpec
    from dse.physics.roofline import Candidates, ModelTable, SystemTable, evaluate

    model = Architecture(ModelSpec.model_validate(spec))
    if peaks is None:
        system = get_system(system_id)
    else:  # a roofline of this CPU from its measured peaks
        base = get_system("h100")
        system = base.scaled(flops=peaks["flops"] / base.flops["bf16"], hbm_bandwidth=peaks["bandwidth"]
                             / base.hbm_bandwidth)
    steps = [r for r in rows if r["kind"] in ("decode", "prefill")]
    code = {"bf16": 0, "float32": 0, "fp8": 1}
    cand = Candidates(model=0, system=0, tp=1, dp=1, ep=1, etp=1, pp=1,
                      batch=np.array([r["batch"] for r in steps]), context=np.array([r["context"] for r in steps]),
                      phase=np.array([int(r["kind"] == "prefill") for r in steps]),
                      weights_dtype=np.array([code[r["dtype"]] for r in steps]),
                      kv_dtype=np.array([code[r.get("kv_dtype") or r["dtype"]] for r in steps]), kv_tier=0)
    tables = ModelTable.build([model]), SystemTable.build([system])
    ideal = evaluate(cand, *tables, IDEAL, ttft=False)
    for i, r in enumerate(steps):
        r["predicted_ideal_s"] = float(ideal["step_s"][i])
        r["ideal_compute_s"] = float(ideal["compute_s"][i])
        r["ideal_memory_s"] = float(ideal["memory_s"][i])
    if peaks is None:
        calibrated = evaluate(cand, *tables, None, ttft=False)
        for i, r in enumerate(steps):
            r["predicted_calibrated_s"] = float(calibrated["step_s"][i])
    return rows


def write(rows: list[dict], header: str, out: Path | None) -> str:
    import pandas as pd

    text = header.rstrip("\n") + "\n" + pd.DataFrame(rows).to_csv(index=False)
    if out:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text)
    return text


def gpu_state() -> str:
    try:
        q = "name,clocks.sm,clocks.max.sm,clocks.mem,power.draw,power.limit,temperature.gpu"
        r = subprocess.run(["nvidia-smi", f"--query-gpu={q}", "--format=csv,noheader"], capture_output=True,
                           text=True, timeout=20)
        return r.stdout.strip().replace("\n", " | ")
    except (OSError, subprocess.SubprocessError):
        return "nvidia-smi not available"


def run_predict(path: Path, system: str) -> None:
    import pandas as pd

    text = path.read_text()
    header, body = text.split("\n", 1)
    table = pd.read_csv(io.StringIO(body))
    from dse.validate.measured import header_fields

    model_id = header_fields(header)["model"]
    rows = [{k: v for k, v in r.items() if not (isinstance(v, float) and math.isnan(v))}
            for r in table.to_dict("records")]
    for r in rows:
        for k in ("batch", "context", "size"):
            if k in r:
                r[k] = int(r[k])
    rows = predict(rows, catalog_spec(model_id), system, None)
    header = header.split("; predictions against:")[0] + f"; predictions against: {system}"
    print(write(rows, header, path))


def shapes(text: str) -> list[tuple[int, int]]:
    """``B:L,B:L,...`` (batch and length of each step) as pairs; ``none``: no step of that kind."""
    if text.strip().lower() == "none":
        return []
    try:
        pairs = [tuple(int(x) for x in item.split(":")) for item in text.split(",")]
    except ValueError:
        pairs = []
    if not pairs or any(len(p) != 2 or min(p) < 1 for p in pairs):
        raise argparse.ArgumentTypeError(f"expected batch:length pairs of positive integers separated by commas "
                                         f"(e.g. 1:65536,2:32768) or 'none', got {text!r}")
    return pairs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    default = "cuda" if (torch is not None and torch.cuda.is_available()) else "cpu"
    parser.add_argument("--device", choices=("cuda", "cpu"), default=default)
    parser.add_argument("--model", default=None, help="catalog model to run (default: llama-3.1-8b on a GPU, a "
                        "small stack on the CPU)")
    parser.add_argument("--system", default="h100", help="catalog system the GPU is (for predictions)")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--quick", action="store_true", help="small sizes (tests, CPU)")
    parser.add_argument("--stacks", default=None, help="comma-separated: eager, compiled (torch.compile); default "
                        "both on a GPU, eager on the CPU")
    parser.add_argument("--predict", type=Path, default=None, help="add predictions to this measured CSV and stop")
    parser.add_argument("--decode", type=shapes, default=None, metavar="B:T,...",
                        help="decode steps to time instead of the default grid: batch:KV-length pairs, or 'none'")
    parser.add_argument("--prefill", type=shapes, default=None, metavar="B:P,...",
                        help="prefills to time instead of the default grid: batch:prompt-length pairs, or 'none'")
    parser.add_argument("--weights", choices=("bf16", "fp8"), default=None,
                        help="the weight matrices' format (default: the activations'; fp8 on a GPU: e4m3 products "
                        "on the FP8 tensor cores, the KV cache in bf16)")
    args = parser.parse_args()
    if args.predict:
        run_predict(args.predict, args.system)
        return
    backend = Backend(args.device)
    if args.weights == "fp8" and not (backend.torch and hasattr(torch, "_scaled_mm")):
        parser.error("--weights fp8: needs PyTorch with torch._scaled_mm (FP8 products)")
    gpu = backend.cuda
    repeat = 3 if args.quick else (20 if gpu else 10)
    state_before = gpu_state() if gpu else ""
    if gpu:
        spec = catalog_spec(args.model or "llama-3.1-8b")
        sizes, dtypes, copy = [1024, 2048, 4096, 8192, 16384], ["bf16", "fp8"], [2**28, 2**30, 2**32]
        decode_grid = [(b, t) for t in (512, 2048, 8192, 32768) for b in (1, 8, 32, 64, 128, 256, 512)
                       if b * t <= 262144]
        prefill_grid = [(1, p) for p in (128, 512, 1024, 2048, 4096, 8192, 16384, 32768)] + [(4, 2048), (16, 1024)]
        step_dtype, variants = "bf16", ("bmm", "sdpa") if backend.flash_gqa else ("bmm",)
        stacks = tuple(args.stacks.split(",")) if args.stacks else ("eager", "compiled")
    else:
        spec = catalog_spec(args.model) if args.model else TINY
        sizes, dtypes, copy = ([64, 128, 256] if args.quick else [256, 512, 1024]), ["float32"], [2**22, 2**24]
        decode_grid, prefill_grid = [(1, 128), (4, 128), (1, 512), (4, 512)], [(1, 64), (1, 256)]
        step_dtype, variants = "float32", ("bmm",)
        stacks = tuple(args.stacks.split(",")) if args.stacks else ("eager",)
    if args.weights not in (None, "fp8", step_dtype):
        parser.error(f"--weights {args.weights}: this device's stack runs in {step_dtype} (or fp8 weights)")
    decode_grid = decode_grid if args.decode is None else args.decode
    prefill_grid = prefill_grid if args.prefill is None else args.prefill
    rows = measure_matmul(backend, sizes, dtypes, repeat) + measure_copy(backend, copy, repeat)
    stack = Stack(backend, spec, step_dtype, args.weights)
    check_note = checks(stack, backend, stacks)
    partial = f"# device: {backend.name()}; partial: written after each measurement; model: {spec['id']}"
    rows += measure_steps(backend, stack, decode_grid, prefill_grid, variants, stacks, repeat,
                          progress=(lambda done: write(rows + done, partial, args.out)) if args.out else None)
    peaks = None
    if not gpu:  # a roofline of this CPU from what was measured, its peaks taken before and after the steps
        again = measure_matmul(backend, sizes, dtypes, repeat) + measure_copy(backend, copy, repeat)
        # the better of two samples: a peak, not a busy moment
        for row, other in zip(rows[: len(again)], again, strict=True):
            if other["value"] > row["value"]:
                row.update(other)
        bw = max(r["value"] for r in rows if r["kind"] == "copy") / 2  # one direction: reads
        # the CPU path moves float32, twice the bytes of the bf16 the prediction counts
        peaks = {"flops": max(r["value"] for r in rows if r["kind"] == "matmul"), "bandwidth": bw / 2}
    try:
        rows = predict(rows, spec, args.system, peaks)
        against = args.system if gpu else "this CPU measured peaks"
    except ImportError as exc:  # the GPU machine lacks dse's dependencies: --predict adds them afterwards
        against = f"none (dse not importable here: {exc}; run --predict)"
    fp8 = " (e4m3, per-tensor scales; activations cast to e4m3 before each product)" if stack.weights == "fp8" else ""
    header = (f"# device: {backend.name()}; date: {datetime.date.today().isoformat()}; {backend.versions()}; "
              f"python {platform.python_version()}; model: {spec['id']}; weights: random {stack.weights}{fp8}; "
              f"KV cache: {step_dtype}; "
              f"checks: {check_note or 'none'}; gpu before: {state_before or 'n/a'}; "
              f"gpu after: {gpu_state() if gpu else 'n/a'}; predictions against: {against}")
    print(write(rows, header, args.out))


if __name__ == "__main__":
    main()
