"""Measure a machine against the roofline: matmul FLOP/s, memory copy bandwidth, real decode steps.

On a GPU (PyTorch with CUDA): bf16 and fp8 matrix multiplies against size, HBM copy bandwidth,
and decode steps of a small transformer stack with a KV cache at several batches and contexts;
each decode step is compared with the prediction of `dse.physics` for the catalog system given by
--system (ideal roofline and calibrated). On a CPU (PyTorch, or NumPy when PyTorch is absent) the
same measurements run in float32, and decode steps are compared with a roofline built from the
matmul peak and copy bandwidth measured in the same run.

Usage: python scripts/measure_gpu.py [--device cuda|cpu] [--system h100] [--out FILE.csv] [--quick]
Writes one CSV (a row per measurement) whose header comment names device, date and software.
"""

from __future__ import annotations

import argparse
import datetime
import math
import platform
import time
from pathlib import Path

import numpy as np

try:  # PyTorch is optional: the CPU path falls back to NumPy
    import torch
except ImportError:  # pragma: no cover - depends on the machine
    torch = None

from dse.catalog.hardware import IDEAL, System, get_system
from dse.catalog.models import Architecture, ModelSpec
from dse.physics.roofline import Candidates, ModelTable, SystemTable, evaluate

# A small dense GQA transformer (Llama-like proportions), big enough that its matmuls are real work
SMALL = {
    "id": "measure-small", "name": "measurement stack", "d_model": 2048, "n_layers": 8, "vocab": 32000,
    "source": {"title": "scripts/measure_gpu.py", "date": "2026-11-22"},
    "published_b": {"total": 0.5, "active": 0.5, "precision_total": 1, "precision_active": 1, "source": "n/a"},
    "attention": {"kind": "gqa", "n_heads": 16, "n_kv_heads": 4, "head_dim": 128},
    "ffn": {"kind": "dense", "d_ff": 5632},
}
TINY = {**SMALL, "d_model": 256, "n_layers": 2, "vocab": 1000,
        "attention": {"kind": "gqa", "n_heads": 4, "n_kv_heads": 2, "head_dim": 64},
        "ffn": {"kind": "dense", "d_ff": 704}}


class Backend:
    """PyTorch (CPU or CUDA) or NumPy (CPU), behind the few calls the measurements need."""

    def __init__(self, device: str) -> None:
        self.device = device
        self.torch = torch is not None
        if device == "cuda" and not (self.torch and torch.cuda.is_available()):
            raise SystemExit("--device cuda needs PyTorch with a CUDA device")

    def sync(self) -> None:
        if self.torch and self.device == "cuda":
            torch.cuda.synchronize()

    def randn(self, *shape: int, dtype: str = "float32"):
        if self.torch:
            dt = {"bf16": torch.bfloat16, "float32": torch.float32}[dtype]
            return torch.randn(*shape, device=self.device, dtype=dt)
        return np.random.default_rng(0).standard_normal(shape, dtype=np.float32)

    def einsum(self, spec: str, a, b):
        return torch.einsum(spec, a, b) if self.torch else np.einsum(spec, a, b)

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

    def name(self) -> str:
        if self.torch and self.device == "cuda":
            return torch.cuda.get_device_name()
        return f"{platform.processor() or platform.machine()} CPU"

    def versions(self) -> str:
        if self.torch:
            cuda = torch.version.cuda if self.device == "cuda" else "none"
            return f"torch {torch.__version__}, cuda {cuda}, numpy {np.__version__}"
        return f"numpy {np.__version__} (no torch)"


def timeit(fn, backend: Backend, repeat: int) -> float:
    fn()
    backend.sync()
    best = math.inf
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        backend.sync()
        best = min(best, time.perf_counter() - t0)
    return best


def measure_matmul(backend: Backend, sizes: list[int], dtypes: list[str], repeat: int) -> list[dict]:
    rows = []
    for dtype in dtypes:
        for n in sizes:
            if dtype == "fp8":
                if not (backend.torch and backend.device == "cuda" and hasattr(torch, "_scaled_mm")):
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
            t = timeit(fn, backend, repeat)
            rows.append({"kind": "matmul", "dtype": dtype, "size": n, "batch": 0, "context": 0, "seconds": t,
                         "value": 2.0 * n**3 / t, "unit": "FLOP/s"})
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
        t = timeit(fn, backend, repeat)
        rows.append({"kind": "copy", "dtype": "float32", "size": size, "batch": 0, "context": 0, "seconds": t,
                     "value": 2.0 * size / t, "unit": "B/s"})  # read + write
    return rows


def decode_step_fn(backend: Backend, spec: dict, batch: int, context: int, dtype: str):
    """One decode step of the stack: per layer QKV, attention over the KV cache, output, gated MLP."""
    d, a, f = spec["d_model"], spec["attention"], spec["ffn"]["d_ff"]
    h, kvh, hd = a["n_heads"], a["n_kv_heads"], a["head_dim"]
    layers = []
    for _ in range(spec["n_layers"]):
        layers.append({
            "wqkv": backend.randn(d, (h + 2 * kvh) * hd, dtype=dtype), "wo": backend.randn(h * hd, d, dtype=dtype),
            "w13": backend.randn(d, 2 * f, dtype=dtype), "w2": backend.randn(f, d, dtype=dtype),
            "k": backend.randn(batch, kvh, context, hd, dtype=dtype),
            "v": backend.randn(batch, kvh, context, hd, dtype=dtype),
        })
    x0 = backend.randn(batch, d, dtype=dtype)
    group = h // kvh

    def step():
        x = x0
        for L in layers:
            qkv = x @ L["wqkv"]
            q = qkv[:, : h * hd].reshape(batch, kvh, group, hd)
            scores = backend.einsum("bkgd,bktd->bkgt", q, L["k"]) / math.sqrt(hd)
            o = backend.einsum("bkgt,bktd->bkgd", backend.softmax(scores), L["v"])
            x = x + o.reshape(batch, h * hd) @ L["wo"]
            gu = x @ L["w13"]
            x = x + (backend.silu(gu[:, :f]) * gu[:, f:]) @ L["w2"]
        return x
    return step


def predict_decode(spec: dict, system: System, batch: int, context: int, ideal: bool, weights: str) -> float:
    model = Architecture(ModelSpec.model_validate(spec))
    wd = {"bf16": 0, "float32": 0, "fp8": 1}[weights]
    cand = Candidates(model=0, system=0, tp=1, dp=1, ep=1, etp=1, pp=1, batch=batch, context=context, phase=0,
                      weights_dtype=wd, kv_dtype=wd, kv_tier=0)
    r = evaluate(cand, ModelTable.build([model]), SystemTable.build([system]), IDEAL if ideal else None, ttft=False)
    return float(r["step_s"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    default = "cuda" if (torch is not None and torch.cuda.is_available()) else "cpu"
    parser.add_argument("--device", choices=("cuda", "cpu"), default=default)
    parser.add_argument("--system", default="h100", help="catalog system the GPU is (for predictions)")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--quick", action="store_true", help="small sizes (tests, CPU)")
    args = parser.parse_args()
    backend = Backend(args.device)
    gpu = args.device == "cuda"
    repeat = 3 if args.quick else 10
    if gpu:
        sizes, dtypes, copy = [1024, 2048, 4096, 8192, 16384], ["bf16", "fp8"], [2**28, 2**30, 2**32]
        spec, batches, contexts, step_dtype = SMALL, [1, 8, 32, 128], [512, 2048, 8192], "bf16"
    else:
        sizes, dtypes, copy = ([64, 128, 256] if args.quick else [256, 512, 1024]), ["float32"], [2**22, 2**24]
        spec, batches, contexts, step_dtype = TINY, [1, 4], [128, 512], "float32"
    rows = measure_matmul(backend, sizes, dtypes, repeat) + measure_copy(backend, copy, repeat)
    steps = [(batch, context, timeit(decode_step_fn(backend, spec, batch, context, step_dtype), backend, repeat))
             for batch in batches for context in contexts]
    if gpu:
        system = get_system(args.system)
    else:  # a roofline of this CPU from what was measured, its peaks taken before and after the decode steps
        again = measure_matmul(backend, sizes, dtypes, repeat) + measure_copy(backend, copy, repeat)
        for row, other in zip(rows, again, strict=True):  # the better of two samples: a peak, not a busy moment
            if other["value"] > row["value"]:
                row.update(other)
        peak = max(r["value"] for r in rows if r["kind"] == "matmul")
        bw = max(r["value"] for r in rows if r["kind"] == "copy") / 2  # one direction: reads
        bw /= 2  # the CPU path moves float32, twice the bytes of the bf16 the prediction counts
        base = get_system("h100")
        system = base.scaled(flops=peak / base.flops["bf16"], hbm_bandwidth=bw / base.hbm_bandwidth)
    for batch, context, t in steps:
        row = {"kind": "decode", "dtype": step_dtype, "size": spec["d_model"], "batch": batch, "context": context,
               "seconds": t, "value": batch / t, "unit": "tokens/s",
               "predicted_ideal_s": predict_decode(spec, system, batch, context, True, step_dtype)}
        if gpu:
            row["predicted_calibrated_s"] = predict_decode(spec, system, batch, context, False, step_dtype)
        rows.append(row)
    header = (f"# device: {backend.name()}; date: {datetime.date.today().isoformat()}; {backend.versions()}; "
              f"python {platform.python_version()}; predictions against: "
              f"{args.system if gpu else 'this CPU measured peaks'}\n")
    import pandas as pd

    table = pd.DataFrame(rows)
    text = header + table.to_csv(index=False)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
