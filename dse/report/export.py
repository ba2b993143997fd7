"""Launch scripts and the benchmark that checks them, for a chosen deployment of a study result: vLLM, SGLang and
TensorRT-LLM.

Each pool of a deployment (one for aggregated serving; a prefill and a decode pool for disaggregated serving)
becomes a shell function that starts one replica of the pool on one node of it, with the parallel layout, the
batch, the chunked-prefill size, the KV-cache format and the memory fraction of the plan; a replica that spans
several hosts gets the framework's multi-node flags, with the host size (``chips_per_node``) from the hardware
catalog. Every export also writes the command that measures the plan (``vllm bench serve``, SGLang's
``sglang.benchmark.serving``, or ``aiperf profile`` for TensorRT-LLM) at the planned concurrency, prompt and
output lengths, with the plan embedded in its result file, so ``dse validate --cases RESULT.json`` compares what
was measured with what was predicted (`dse.validate.benchmarks`), and ``dse-plan.json``, the plan as data.

The flags are the frameworks' own at the versions named in ``VERSIONS`` (``tests/fixtures/framework_flags.json``
lists each flag with the file and line that defines it, and the tests parse every script against it). The
mapping of dse's layout (attention TP x DP = experts EP x expert-TP chips per stage, PP stages):

- vLLM: ``--tensor-parallel-size`` TP, ``--data-parallel-size`` DP, ``--pipeline-parallel-size`` PP,
  ``--enable-expert-parallel`` for MoE (vLLM's expert-parallel size is TP x DP); ``--max-num-seqs`` and
  ``--max-num-batched-tokens`` are per data-parallel engine. A context-parallel prefill pool runs its DP ranks as
  ``--prefill-context-parallel-size``. Across hosts: DP ranks that fit a host take ``--data-parallel-size-local``,
  ``--data-parallel-address`` and ``--data-parallel-start-rank`` (``--headless`` on the other hosts); a DP rank
  larger than a host takes ``--nnodes``, ``--node-rank`` and ``--master-addr``.
- SGLang: ``--tp-size`` TP x DP (the GPUs of a stage), ``--attn-dp-size`` DP, ``--ep-size`` EP, ``--pp-size`` PP;
  ``--max-running-requests`` and ``--chunked-prefill-size`` are the server's totals, which SGLang divides over its
  attention-DP ranks, so they are written as the per-rank value times DP; a context-parallel prefill pool takes
  ``--attn-cp-size``. Across hosts: ``--nnodes``, ``--node-rank``, ``--dist-init-addr``.
- TensorRT-LLM (``trtllm-serve``): ``--tp_size`` TP x DP, ``--ep_size`` EP, ``--pp_size`` PP; attention data
  parallelism (``enable_attention_dp``) makes every rank an attention DP rank, so a layout with both attention TP
  > 1 and DP > 1 is not expressible and is flagged; ``--max_batch_size`` is per attention-DP rank.

Wide expert parallelism (EP over attention-DP ranks) takes the framework's all-to-all backend: DeepEP on NVIDIA
(low-latency kernels for a decode pool, high-throughput ones otherwise), MoRI on AMD. Only frameworks that run on
the plan's hardware are written (`RUNS_ON`): AMD plans get the ROCm builds of vLLM and SGLang, TPU plans vLLM's
TPU backend (tpu-inference) for replicas within one host.

A summary is data, not code: every field the export reads is checked first (``check_entry``), every value goes
into a script quoted (``shlex``) and into an option file serialized (YAML, JSON), and the files are written by
`dse.report.output.write_export` under the rules of a study's results.
"""

from __future__ import annotations

import json
import math
import re
import shlex
import unicodedata
from dataclasses import dataclass, field, replace
from pathlib import Path

import yaml

from dse.catalog.units import DTYPES
from dse.errors import InputError
from dse.physics.codes import DEFAULT_CHUNK

FRAMEWORKS = ("vllm", "sglang", "trtllm")
DEFAULT_CHUNK_TOKENS = DEFAULT_CHUNK
"""Chunked-prefill size used when the configuration does not state one (tokens per DP rank per pass)."""

VERSIONS = {
    "vllm": "vLLM 0.33.0 (vllm serve, vllm bench serve)",
    "sglang": "SGLang 0.5.23 (sglang.launch_server, sglang.benchmark.serving) and sglang-router 0.3.2",
    "trtllm": "TensorRT-LLM trtllm-serve at commit 4c05a74 and aiperf 0.13.0",
}
"""The releases whose argument definitions the scripts follow (``tests/fixtures/framework_flags.json``)."""
DOCS = {
    "vllm": "https://docs.vllm.ai/en/latest/configuration/engine_args.html (engine arguments); "
            "https://docs.vllm.ai/en/latest/serving/data_parallel_deployment.html (multi-node data parallel); "
            "https://docs.vllm.ai/en/latest/features/nixl_connector_usage.html (disaggregated prefill)",
    "sglang": "https://docs.sglang.io/advanced_features/server_arguments.html (server arguments); "
              "https://docs.sglang.io/advanced_features/pd_disaggregation.html (PD disaggregation, router)",
    "trtllm": "https://nvidia.github.io/TensorRT-LLM/commands/trtllm-serve (trtllm-serve options, "
              "extra_llm_api_options); https://github.com/ai-dynamo/aiperf (aiperf profile)",
}
RUNS_ON = {"vllm": ("NVIDIA", "AMD", "Google"), "sglang": ("NVIDIA", "AMD"), "trtllm": ("NVIDIA",)}
"""Vendors whose chips each framework serves on (vLLM and SGLang have ROCm builds; vLLM has a TPU backend)."""
BUILDS = {("vllm", "AMD"): "the ROCm build of vLLM (the rocm/vllm image)",
          ("sglang", "AMD"): "the ROCm build of SGLang (the lmsysorg/sglang ROCm image)",
          ("vllm", "Google"): "vLLM for TPU (pip install vllm-tpu: the tpu-inference backend)"}
KV_FLAGS = {
    ("vllm", "NVIDIA"): {"bf16": "auto", "fp8": "fp8", "fp4": "nvfp4"},
    ("vllm", "AMD"): {"bf16": "auto", "fp8": "fp8"},
    ("vllm", "Google"): {"bf16": "auto", "fp8": "fp8"},
    ("sglang", "NVIDIA"): {"bf16": "auto", "fp8": "fp8_e4m3", "fp4": "nvfp4"},
    ("sglang", "AMD"): {"bf16": "auto", "fp8": "fp8_e4m3"},
    ("trtllm", "NVIDIA"): {"bf16": "auto", "fp8": "fp8"},
}
"""KV-cache format flags per framework and vendor (vLLM CacheDType, SGLang --kv-cache-dtype choices, TensorRT-LLM
kv_cache_config.dtype); a format not listed is left at the framework's default, with a note."""
A2A = {("vllm", "NVIDIA"): ("deepep_low_latency", "deepep_high_throughput"),
       ("vllm", "AMD"): ("mori_low_latency", "mori_high_throughput"),
       ("sglang", "NVIDIA"): ("deepep", "deepep"), ("sglang", "AMD"): ("mori", "mori")}
"""All-to-all backend of wide expert parallelism: (decode pool, other pools)."""

SERVING = ("aggregated", "disaggregated")
ROLES = ("both", "prefill", "decode")
KV_DTYPES = ("bf16", "fp8", "fp4")
MAX_INT = 2**31 - 1
"""Largest count the export writes (degrees, batches, replicas, lengths): the frameworks read 32-bit integers."""
PLAIN_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
"""Ids that become parts of file and folder names: letters, digits, '.', '_', '-', not starting with '.' or '-'."""
PLAIN_RULE = "a plain name (letters, digits, '.', '_', '-'; starting with a letter or digit)"
PLAN_FILE = "dse-plan.json"
"""The plan as data, in every export and beside every aiperf result."""
MAX_PROMPTS = 100_000
"""Most prompts a benchmark sends (at least 100, and ten per request in flight)."""

CHECKPOINTS: dict[str, dict[str, str]] = {
    "deepseek-v3": {"fp8": "deepseek-ai/DeepSeek-V3", "fp4@NVIDIA": "nvidia/DeepSeek-V3-0324-FP4"},
    "llama-3.1-8b": {"bf16": "meta-llama/Llama-3.1-8B-Instruct", "fp8": "nvidia/Llama-3.1-8B-Instruct-FP8"},
    "llama-3.1-70b": {"bf16": "meta-llama/Llama-3.1-70B-Instruct", "fp8@NVIDIA": "nvidia/Llama-3.1-70B-Instruct-FP8",
                      "fp8@AMD": "amd/Llama-3.1-70B-Instruct-FP8-KV"},
    "llama-3.1-405b": {"bf16": "meta-llama/Llama-3.1-405B-Instruct", "fp8": "meta-llama/Llama-3.1-405B-Instruct-FP8",
                       "fp8@AMD": "amd/Llama-3.1-405B-Instruct-FP8-KV"},
    "llama-3.3-70b": {"bf16": "meta-llama/Llama-3.3-70B-Instruct", "fp8": "nvidia/Llama-3.3-70B-Instruct-FP8",
                      "fp4@NVIDIA": "nvidia/Llama-3.3-70B-Instruct-FP4"},
    "llama-4-maverick": {"bf16": "meta-llama/Llama-4-Maverick-17B-128E-Instruct",
                         "fp8": "meta-llama/Llama-4-Maverick-17B-128E-Instruct-FP8"},
    "llama-3-8b-1048k": {"bf16": "gradientai/Llama-3-8B-Instruct-Gradient-1048k"},
    "qwen3-32b": {"bf16": "Qwen/Qwen3-32B", "fp8": "Qwen/Qwen3-32B-FP8", "fp4@NVIDIA": "nvidia/Qwen3-32B-NVFP4"},
    "qwen3-235b-a22b": {"bf16": "Qwen/Qwen3-235B-A22B", "fp8": "Qwen/Qwen3-235B-A22B-FP8"},
    "qwen3.5-397b-a17b": {"bf16": "Qwen/Qwen3.5-397B-A17B", "fp8": "Qwen/Qwen3.5-397B-A17B-FP8"},
    "gpt-oss-120b": {"fp4": "openai/gpt-oss-120b"},
    "kimi-k2": {"fp8": "moonshotai/Kimi-K2-Instruct"},
    "minimax-m2.5": {"fp8": "MiniMaxAI/MiniMax-M2.5"},
    "llama-2-70b": {"bf16": "meta-llama/Llama-2-70b-chat-hf"},
    "mixtral-8x22b": {"bf16": "mistralai/Mixtral-8x22B-Instruct-v0.1"},
    "qwen3-coder-480b-a35b": {"bf16": "Qwen/Qwen3-Coder-480B-A35B-Instruct",
                              "fp8": "Qwen/Qwen3-Coder-480B-A35B-Instruct-FP8"},
}
"""Chat-tuned (instruct) checkpoints on Hugging Face by catalog model and weights format (``FORMAT@VENDOR`` where a
vendor needs its own: NVFP4 for NVIDIA, AMD Quark FP8): https://huggingface.co/REPO for each. A checkpoint serves
the plan's format only where it stores the weights in it (DeepSeek-V3, Kimi-K2 and MiniMax-M2.5 are released in
FP8, gpt-oss-120b with MXFP4 experts); the Qwen3 releases are the post-trained (chat) models. Where no
checkpoint is listed the script refuses to start until one is named (``--model-path`` or ``DSE_MODEL_PATH``).
Every repository id was checked on 2026-11-26 to appear in public launch commands and model cards (the model pages
themselves were not reachable); ``nvidia/DeepSeek-V3-0324-FP4`` is NVIDIA's NVFP4 quantization of DeepSeek-V3-0324,
a later post-training of the same architecture, the only NVFP4 release of it."""


@dataclass(frozen=True)
class Pool:
    """One pool of a deployment as the export needs it."""

    role: str  # both | prefill | decode
    system: str
    replicas: int
    chips: int
    tp: int
    ep: int
    pp: int
    dp: int
    batch: int
    weights_dtype: str
    kv_dtype: str
    kv_tier: str = "hbm"
    chunk_tokens: int = DEFAULT_CHUNK_TOKENS
    context_parallel: bool = False  # a prefill pool that splits each prompt over its DP ranks
    label: str = ""  # the role, with _2, _3 ... for a second and later pool of the same role

    @property
    def name(self) -> str:
        return self.label or self.role

    @property
    def stage_chips(self) -> int:
        return self.tp * self.dp

    @property
    def in_flight(self) -> int:
        """Sequences in flight per replica: a micro-batch per pipeline stage."""
        return self.batch * self.pp

    @property
    def ranks(self) -> int:
        """Schedulers a replica's requests spread over: its DP ranks (one, context parallel: they share a prompt)."""
        return 1 if self.context_parallel else self.dp

    @property
    def per_rank(self) -> int:
        """Sequences in flight per scheduler (DP rank), at least one."""
        return max(1, _ceil_div(self.in_flight, self.ranks))

    @property
    def wide_ep(self) -> bool:
        """Experts spread over attention-DP ranks: tokens cross ranks by all-to-all."""
        return self.ep > 1 and self.dp > 1 and not self.context_parallel


@dataclass(frozen=True)
class Plan:
    """A checked ``best`` entry: every value the scripts carry, of the right type and range."""

    model: str
    workload: str
    serving: str
    max_len: int
    pools: tuple[Pool, ...]
    prompt: int = 0
    output: int = 0
    predicted: dict = field(default_factory=dict, compare=False)
    framework: str | None = None  # the framework whose memory reservation the plan was solved at (None: default)
    mem_fraction: float | None = None  # its memory fraction (None: the framework's default)

    @property
    def served(self) -> tuple[Pool, ...]:
        """The pools whose replicas hold the requests in flight (aggregated or decode)."""
        return tuple(p for p in self.pools if p.role != "prefill")

    @property
    def concurrency(self) -> int:
        """Requests kept in flight by the benchmark: one aggregated replica's, or every decode replica's."""
        if self.serving == "aggregated":
            return self.pools[0].in_flight
        return sum(p.in_flight * p.replicas for p in self.served)


@dataclass
class Script:
    """A file of the export: its name, lines, whether it is run, and the framework it belongs to."""

    name: str
    lines: list[str] = field(default_factory=list)
    framework: str = ""

    @property
    def executable(self) -> bool:
        return self.name.endswith(".sh")

    def text(self) -> str:
        return "\n".join(self.lines) + "\n"


class _Where:
    """Names a field of the summary in a message: ``FILE: field 'best[0].pools[1].replicas': ...``."""

    def __init__(self, source: str, path: str) -> None:
        self.source, self.path = source, path

    def __truediv__(self, key: str | int) -> _Where:
        return _Where(self.source, f"{self.path}[{key}]" if isinstance(key, int) else f"{self.path}.{key}")

    def error(self, what: str) -> InputError:
        return InputError(f"{self.source}: field '{self.path}': {what}")


def _show(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _get(doc: dict, key: str, where: _Where) -> object:
    if key not in doc:
        raise (where / key).error("missing (dse export reads it)")
    return doc[key]


def _count(value: object, where: _Where, low: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise where.error(f"must be a {'positive' if low == 1 else 'non-negative'} integer, got {_show(value)}")
    if value > MAX_INT:
        raise where.error(f"must be at most {MAX_INT}, got {_show(value)}")
    return value


def _name(value: object, where: _Where) -> str:
    if not isinstance(value, str) or not PLAIN_NAME.fullmatch(value):
        raise where.error(f"must be {PLAIN_RULE}, got {_show(value)}")
    return value


def _choice(value: object, where: _Where, allowed: tuple[str, ...]) -> str:
    if not isinstance(value, str) or value not in allowed:
        raise where.error(f"must be one of {', '.join(allowed)}, got {_show(value)}")
    return value


def _pool(p: object, where: _Where, pooled: bool, chunk: int) -> Pool:
    """One pool; ``pooled`` when it comes from ``pools`` (which names its role and replicas)."""
    if not isinstance(p, dict):
        raise where.error(f"must be a mapping of one pool's configuration, got {_show(p)}")
    counts = {k: _count(_get(p, k, where), where / k) for k in ("chips", "tp", "ep", "pp", "dp", "batch")}
    if counts["chips"] != counts["tp"] * counts["dp"] * counts["pp"]:
        raise (where / "chips").error(f"must equal tp x dp x pp = {counts['tp'] * counts['dp'] * counts['pp']}, "
                                      f"got {counts['chips']}")
    if (counts["tp"] * counts["dp"]) % counts["ep"]:
        raise (where / "ep").error(f"must divide tp x dp = {counts['tp'] * counts['dp']} (the experts of a stage "
                                   f"spread over its chips), got {counts['ep']}")
    cp = p.get("context_parallel")
    if cp is not None and not isinstance(cp, bool):
        raise (where / "context_parallel").error(f"must be true or false, got {_show(cp)}")
    tier = p.get("kv_tier", "hbm")
    own_chunk = p.get("chunk_tokens")
    return Pool(
        role=_choice(_get(p, "role", where), where / "role", ROLES) if pooled else "both",
        system=_name(_get(p, "system", where), where / "system"),
        replicas=_count(_get(p, "replicas", where), where / "replicas") if pooled else 1,
        weights_dtype=_choice(_get(p, "weights_dtype", where), where / "weights_dtype", DTYPES),
        kv_dtype=_choice(_get(p, "kv_dtype", where), where / "kv_dtype", KV_DTYPES),
        kv_tier=_choice(tier, where / "kv_tier", ("hbm", "host")),
        chunk_tokens=chunk if own_chunk is None else _count(own_chunk, where / "chunk_tokens"),
        context_parallel=bool(cp), **counts)


def _max_len(entry: dict, where: _Where) -> int:
    """The longest sequence served: ``context``, else ``prompt`` + ``output``."""
    if "context" in entry or not ({"prompt", "output"} & set(entry)):
        return _count(_get(entry, "context", where), where / "context")
    total = sum(_count(_get(entry, k, where), where / k, low=0) for k in ("prompt", "output"))
    return _count(total, where / "context")


def _predicted(entry: dict) -> dict:
    """The plan's request-level predictions the benchmark checks (finite numbers only)."""
    out = {}
    for key in ("ttft_s", "tpot_s", "tokens_per_s_per_gpu", "tokens_per_s_per_user", "usd_per_request"):
        v = entry.get(key)
        if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
            out[key] = float(v)
    return out


def check_entry(entry: object, source: str = "summary.json", path: str = "best[0]") -> Plan:
    """A ``best`` entry of summary.json checked field by field; an InputError names ``source`` and the field.

    The pools are ``pools`` when present, else the entry itself as one aggregated replica (an entry's
    ``replicas`` belongs to its demand configuration, not to this one).
    """
    where = _Where(source, path)
    if not isinstance(entry, dict):
        raise where.error(f"must be a mapping of one optimum, got {_show(entry)}")
    model = _name(_get(entry, "model", where), where / "model")
    workload = _name(_get(entry, "workload", where), where / "workload")
    serving = _choice(_get(entry, "serving", where), where / "serving", SERVING)
    max_len = _max_len(entry, where)
    lengths = {}
    for key in ("prompt", "output"):
        if key not in entry:
            raise (where / key).error("missing (the benchmark that checks the plan sends requests of the planned "
                                      "prompt and output lengths)")
        lengths[key] = _count(entry[key], where / key)
    chunk = entry.get("chunk_tokens")
    chunk = DEFAULT_CHUNK_TOKENS if chunk is None else _count(chunk, where / "chunk_tokens")
    raw = entry.get("pools")
    if raw is None:
        if serving == "disaggregated":
            raise (where / "pools").error("missing (a disaggregated entry lists its prefill and decode pools)")
        pools = [_pool(entry, where, pooled=False, chunk=chunk)]
    elif not isinstance(raw, list) or not raw:
        raise (where / "pools").error(f"must be a non-empty list of pools, got {_show(raw)}")
    else:
        pools = [_pool(p, where / "pools" / i, pooled=True, chunk=chunk) for i, p in enumerate(raw)]
    roles = ("both",) if serving == "aggregated" else ("prefill", "decode")
    article = "an" if serving == "aggregated" else "a"
    for i, p in enumerate(pools):
        if p.role not in roles:
            raise (where / "pools" / i / "role").error(f"must be {' or '.join(map(repr, roles))} in {article} "
                                                        f"{serving} entry, got {p.role!r}")
    missing = [r for r in roles if r not in {p.role for p in pools}]
    if missing:
        raise (where / "pools").error(f"{article} {serving} entry needs a prefill and a decode pool; "
                                      f"no {missing[0]} pool here")
    seen: dict[str, int] = {}
    labelled = []
    for p in pools:
        seen[p.role] = seen.get(p.role, 0) + 1
        labelled.append(replace(p, label=p.role if seen[p.role] == 1 else f"{p.role}_{seen[p.role]}"))
    framework = entry.get("framework") or None  # "" where the plan is the ideal roofline's
    if framework is not None:
        from dse.catalog.frameworks import default_frameworks

        framework = _choice(framework, where / "framework", tuple(sorted(default_frameworks())))
    fraction = entry.get("mem_fraction")
    if fraction is not None and not (isinstance(fraction, (int, float)) and not isinstance(fraction, bool)
                                     and 0 < fraction <= 1):
        raise (where / "mem_fraction").error(f"must be a share in (0, 1], got {_show(fraction)}")
    return Plan(model, workload, serving, max_len, tuple(labelled), lengths["prompt"], lengths["output"],
                _predicted(entry), framework, None if fraction is None else float(fraction))


def read_summary(path: Path) -> dict:
    """A summary.json read and parsed; an InputError names the file and what is wrong with it."""
    if not path.is_file():
        what = "not a file" if path.exists() else "no such file"
        raise InputError(f"{path}: {what} (dse export reads the summary.json a study run writes)")
    try:
        text = path.read_bytes().decode("utf-8")
        summary = json.loads(text)
    except OSError as exc:
        raise InputError(f"{path}: cannot read it ({exc.strerror or exc})") from None
    except UnicodeDecodeError as exc:
        raise InputError(f"{path}: not UTF-8 text ({exc})") from None
    except json.JSONDecodeError as exc:
        raise InputError(f"{path}: not JSON ({exc})") from None
    except RecursionError:
        raise InputError(f"{path}: not a summary.json written by dse run (JSON nested too deep)") from None
    except ValueError as exc:  # an integer literal past Python's digit limit
        raise InputError(f"{path}: not a summary.json written by dse run ({str(exc).split(';')[0]})") from None
    if not isinstance(summary, dict):
        raise InputError(f"{path}: must be a JSON object (the summary.json of a study run), got {_show(summary)}")
    return summary


def choose_entry(summary: dict, source: str, model: str | None, workload: str | None) -> tuple[Plan, int]:
    """The one checked ``best`` entry of ``model`` and ``workload`` (either may be None when only one matches)."""
    best = summary.get("best")
    if best is None or best == []:
        raise InputError(f"{source}: field 'best': the study chose no configuration to export")
    if not isinstance(best, list):
        raise InputError(f"{source}: field 'best': must be a list of optima, got {_show(best)}")
    ids = []
    for i, e in enumerate(best):
        where = _Where(source, f"best[{i}]")
        if not isinstance(e, dict):
            raise where.error(f"must be a mapping of one optimum, got {_show(e)}")
        ids.append((_name(_get(e, "model", where), where / "model"),
                    _name(_get(e, "workload", where), where / "workload")))
    chosen = [i for i, (m, w) in enumerate(ids) if (model is None or m == model)
              and (workload is None or w == workload)]
    if len(chosen) != 1:
        options = ", ".join(f"--model {m} --workload {w}" for m, w in ids)
        raise InputError(f"{source}: {len(chosen)} optima match; choose one of: {options}")
    return check_entry(best[chosen[0]], source, f"best[{chosen[0]}]"), chosen[0]


def check_model_path(path: str, label: str = "--model-path") -> str:
    """``path`` when it can go into a script as one quoted word: not empty, no control or invisible
    character (a newline would end the command), not starting with '-' (it would read as a flag).
    """
    bad = next((c for c in path if unicodedata.category(c) in ("Cc", "Cf", "Cs", "Zl", "Zp")), None)
    if bad is not None:
        raise InputError(f"{label} {_show(path)}: holds the control character {bad!r}; allowed: a path or "
                         "repository name without control characters")
    if not path.strip():
        raise InputError(f"{label}: must name the weights to serve (a path or a repository), got {_show(path)}")
    if path.startswith("-"):
        raise InputError(f"{label} {_show(path)}: must not start with '-' (the framework would read it as a "
                         f"flag); write ./{path} for a folder of that name")
    return path


# ---- the plan on its hardware -------------------------------------------------------------------------------
@dataclass(frozen=True)
class Memory:
    """A pool's HBM per chip as the plan's memory model counts it (bytes)."""

    capacity: float  # as the device reports it
    usable: float  # what the plan lets the engine fill: as its framework reserves HBM
    weights: float
    kv: float
    activations: float
    vllm_reserve: float = 0.0  # what vLLM holds besides, for the plan's model (part of vLLM's fraction)

    @property
    def planned(self) -> float:
        return self.weights + self.kv + self.activations


def memory_budget(plan: Plan, pool: Pool) -> Memory:
    """The one place the export reads the plan's memory model: per chip, the HBM capacity, what the engine may fill
    as the plan's framework reserves HBM (its memory fraction and reserve; `dse.physics.roofline.memory_budget`),
    and the weights, KV cache and activations the plan
    holds at its batch and context (`dse.physics.evaluate`, calibrated). The frameworks' memory flags are derived
    from it (`memory_flags`).
    """
    from dse.catalog.frameworks import default_frameworks
    from dse.catalog.models import get_model
    from dse.physics.evaluate import Config, evaluate_config

    context = plan.prompt if pool.role == "prefill" else plan.max_len
    try:
        ev = evaluate_config(Config(model=plan.model, system=pool.system, tp=pool.tp, ep=pool.ep, pp=pool.pp,
                                    dp=pool.dp, batch=pool.batch, context=context, weights_dtype=pool.weights_dtype,
                                    kv_dtype=pool.kv_dtype, kv_tier=pool.kv_tier, weight_only=True,
                                    allow_beyond_trained_context=True, framework=plan.framework,
                                    mem_fraction=plan.mem_fraction))
    except InputError as exc:
        raise InputError(f"pool {pool.name} ({pool.system}, {plan.model}): {exc}") from None
    hbm_kv = ev["kv_bytes_per_chip"] if pool.kv_tier == "hbm" else 0.0
    vllm = default_frameworks()["vllm"].memory
    return Memory(ev["device_memory_per_chip"], ev["hbm_usable_per_chip"], ev["weights_bytes_per_chip"], hbm_kv,
                  ev["activation_bytes_per_chip"], vllm.reserve_moe if get_model(plan.model).is_moe else vllm.reserve)


def _floor3(x: float) -> float:
    return math.floor(max(x, 0.0) * 1000) / 1000


def memory_flags(mem: Memory) -> dict[str, float]:
    """Each framework's memory fraction for the plan's budget, of the memory the device reports: vLLM's
    ``--gpu-memory-utilization`` covers weights, activations, KV cache and what vLLM holds besides (its profile run's
    peak and non-torch memory for the plan's model: (usable + that reserve) / capacity); SGLang's
    ``--mem-fraction-static`` weights and KV cache (usable less the activations); TensorRT-LLM's
    ``--kv_cache_free_gpu_memory_fraction`` the share of the memory left after weights and activations that the KV
    cache takes. Rounded down to 0.001.
    """
    free = mem.capacity - mem.weights - mem.activations
    return {"vllm": _floor3(min(mem.usable + mem.vllm_reserve, mem.capacity) / mem.capacity),
            "sglang": _floor3((mem.usable - mem.activations) / mem.capacity),
            "trtllm": _floor3((mem.usable - mem.weights - mem.activations) / free) if free > 0 else 0.0}


@dataclass(frozen=True)
class Placed:
    """A pool on its hardware: the system's vendor, the host size, the hosts one replica spans, its memory."""

    pool: Pool
    vendor: str
    system_name: str
    per_node: int  # GPUs of one replica on each of its hosts
    node_size: int
    memory: Memory
    kv_dtypes: tuple[str, ...] = ("bf16",)  # KV formats the chip's serving kernels support (catalog)

    def kv_flag(self, framework: str) -> str | None:
        """The framework's KV-cache format flag for the pool, or None where the chip or the framework has none."""
        if self.pool.kv_dtype not in self.kv_dtypes:
            return None
        return KV_FLAGS[framework, self.vendor].get(self.pool.kv_dtype)

    @property
    def nodes(self) -> int:
        return _ceil_div(self.pool.chips, self.per_node)


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def _place(plan: Plan, pool: Pool, gpus_per_node: int | None) -> Placed:
    from dse.catalog.hardware import default_systems

    systems = default_systems()
    if pool.system not in systems:
        raise InputError(f"pool {pool.name}: system {pool.system!r} is not in the hardware catalog")
    system = systems[pool.system]
    node = gpus_per_node or system.chips_per_node
    if node is None:
        raise InputError(f"pool {pool.name}: the hardware catalog has no host size (chips_per_node) for "
                         f"{pool.system}; give --gpus-per-node")
    nodes = _ceil_div(pool.chips, node)
    if pool.chips % nodes:
        raise InputError(f"pool {pool.name}: {pool.chips} GPUs per replica do not split evenly over hosts of {node} "
                         f"({nodes} hosts); the frameworks start the same number of GPUs on every host")
    return Placed(pool, system.vendor, system.name, pool.chips // nodes, node, memory_budget(plan, pool),
                  system.kv_dtypes)


def frameworks_for(placed: list[Placed]) -> tuple[str, ...]:
    """The frameworks that run on every pool's hardware (and, on TPU, only replicas within one host)."""
    vendors = {p.vendor for p in placed}
    ok = [f for f in FRAMEWORKS if all(v in RUNS_ON[f] for v in vendors)]
    if "Google" in vendors and any(p.nodes > 1 for p in placed):
        ok = []
    return tuple(ok)


def _refusal(placed: list[Placed], framework: str | None) -> str:
    vendors = ", ".join(sorted({f"{p.vendor} ({p.pool.system})" for p in placed}))
    if any(p.vendor == "Google" and p.nodes > 1 for p in placed):
        big = next(p for p in placed if p.vendor == "Google" and p.nodes > 1)
        return (f"pool {big.pool.name} spans {big.nodes} TPU hosts of {big.node_size} chips; dse exports TPU plans "
                "only for replicas within one host (vLLM's TPU backend starts multi-host slices through Ray, which "
                "the scripts do not set up)")
    if framework is None:
        return f"no framework dse exports runs on {vendors}"
    allowed = ", ".join(frameworks_for(placed)) or "none"
    return f"--framework {framework}: does not run on {vendors}; allowed for this plan: {allowed}"


# ---- the model weights ------------------------------------------------------------------------------------
def checkpoint(model: str, weights_dtype: str, vendor: str) -> str | None:
    """The chat-tuned checkpoint of ``model`` that stores its weights in ``weights_dtype`` for ``vendor``
    (`CHECKPOINTS`), or None where none is known.
    """
    known = CHECKPOINTS.get(model, {})
    return known.get(f"{weights_dtype}@{vendor}") or known.get(weights_dtype)


def _model_lines(plan: Plan, placed: list[Placed], model_path: str | None) -> list[str]:
    """Shell lines that set MODEL: the path given, else the known checkpoint for the plan's formats (DSE_MODEL_PATH
    overrides either), else a placeholder that stops the script with the reason.
    """
    dtypes = sorted({p.pool.weights_dtype for p in placed})
    vendors = sorted({p.vendor for p in placed})
    if model_path is not None:
        return [f"DEFAULT_MODEL={shlex.quote(model_path)}  # given with --model-path",
                'MODEL="${DSE_MODEL_PATH:-$DEFAULT_MODEL}"']
    repo = _default_checkpoint(plan, placed)
    if repo is None:
        why = (f"dse knows no chat-tuned {'/'.join(dtypes)} checkpoint of {plan.model} for {'/'.join(vendors)}: set "
               "DSE_MODEL_PATH to one (a folder or a Hugging Face repository) or export with --model-path")
        return [f'MODEL="${{DSE_MODEL_PATH:?{why}}}"']
    return [f"DEFAULT_MODEL={shlex.quote(repo)}  # https://huggingface.co/{repo} (weights {dtypes[0]}, instruct)",
            'MODEL="${DSE_MODEL_PATH:-$DEFAULT_MODEL}"']


# ---- the scripts --------------------------------------------------------------------------------------------
def _header(framework: str, plan: Plan, what: str) -> list[str]:
    return ["#!/usr/bin/env bash",
            f"# {what} for {plan.model} / {plan.workload} ({plan.serving}), written by dse export from a study result.",
            f"# Flags of {VERSIONS[framework]}; see {DOCS[framework]}",
            "set -euo pipefail"]


def _notes(pl: Placed, framework: str) -> list[str]:
    """The comments above a pool's launch: build, formats, memory, hosts, context parallelism."""
    pool, mem = pl.pool, pl.memory
    out = [f"# pool {pool.name}: {pool.replicas} replica(s) of {pool.chips} x {pool.system} ({pl.system_name}), "
           f"TP{pool.tp} DP{pool.dp} EP{pool.ep} PP{pool.pp}, {pool.in_flight} sequences in flight per replica"]
    if (framework, pl.vendor) in BUILDS:
        out.append(f"# runs on {BUILDS[framework, pl.vendor]}")
    gb = 1e9
    out.append(f"# memory per GPU as planned: weights {mem.weights / gb:.1f} GB + KV {mem.kv / gb:.1f} GB + "
               f"activations {mem.activations / gb:.2f} GB = {mem.planned / gb:.1f} GB of {mem.usable / gb:.1f} GB "
               f"usable ({mem.capacity / gb:.0f} GB HBM); the memory flag below gives the framework that budget")
    if mem.planned > mem.usable:
        out.append("# note: the plan's memory exceeds the usable HBM: this configuration does not fit as planned")
    if pl.kv_flag(framework) is None and pool.kv_dtype != "bf16":
        out.append(f"# note: KV cache {pool.kv_dtype}: no {framework} flag for it on {pl.system_name}; the KV cache "
                   "stays at the model's format and holds more bytes per token than planned")
    if pool.kv_tier == "host":
        out.append("# note: the plan keeps the KV cache in host memory; configure the framework's KV offloading")
    if pl.nodes > 1:
        out.append(f"# one replica spans {pl.nodes} hosts of {pl.per_node} GPUs: run `$0 {pool.name} NODE_RANK` on "
                   "each (0 first), with DSE_HEAD_ADDR set to the address of the host of rank 0")
    elif pl.node_size > pool.chips:
        out.append(f"# one replica takes {pool.chips} of a host's {pl.node_size} GPUs: to run several replicas on a "
                   "host give each its own GPUs (CUDA_VISIBLE_DEVICES / HIP_VISIBLE_DEVICES) and DSE_PORT")
    if pool.context_parallel:
        out.append(f"# context parallel: each prompt is split over the replica's {pool.dp} ranks, as planned")
    return out


def _function(pl: Placed, first: list[str], others: list[str] | None, port: int) -> list[str]:
    """A shell function that starts one replica's share on one host: ``first`` on rank 0, ``others`` elsewhere."""
    q = shlex.join
    lines = [f"launch_{pl.pool.name}() {{", '  local rank="${1:-0}"']
    if others is None:
        lines += [f"  {q(first)} \\", f'    --port "${{DSE_PORT:-{port}}}"']
    else:
        lines += ['  if [ "$rank" = 0 ]; then', f"    {q(first)} \\", f'      --port "${{DSE_PORT:-{port}}}"',
                  "  else", f"    {q(others)}", "  fi"]
    lines.append("}")
    return [_unquoted(ln) for ln in lines]


def _dispatch(names: list[str], extra: dict[str, str] | None = None) -> list[str]:
    extra = extra or {}
    usage = " | ".join([*names, *extra])
    lines = ['case "${1:-}" in']
    for n in names:
        lines.append(f'  {n}) shift; launch_{n} "$@" ;;')
    for n, body in extra.items():
        lines.append(f"  {n}) {body} ;;")
    lines += [f'  *) echo "usage: $0 {{{usage}}} [NODE_RANK]" >&2; exit 2 ;;', "esac"]
    return lines


HEAD = '"$DSE_HEAD_ADDR"'
RANK = '"$rank"'
MODEL = '"$MODEL"'


def _vllm(plan: Plan, placed: list[Placed], model_lines: list[str], record: str) -> list[Script]:
    s = Script("launch_vllm.sh", _header("vllm", plan, "vLLM launch"), "vllm")
    s.lines += model_lines
    names = []
    for i, pl in enumerate(placed):
        pool = pl.pool
        s.lines += _notes(pl, "vllm")
        if pool.ep > 1 and pool.ep != pool.stage_chips:
            s.lines.append(f"# note: vLLM's expert-parallel size is TP x DP = {pool.stage_chips}; this layout has EP "
                           f"{pool.ep}: not expressible exactly")
        dp, pcp = (1, pool.dp) if pool.context_parallel else (pool.dp, 1)
        args = ["vllm", "serve", MODEL, "--tensor-parallel-size", str(pool.tp), "--pipeline-parallel-size",
                str(pool.pp), "--data-parallel-size", str(dp)]
        if pcp > 1:
            args += ["--prefill-context-parallel-size", str(pcp)]
        if pool.ep > 1:
            args.append("--enable-expert-parallel")
            if pool.wide_ep and ("vllm", pl.vendor) in A2A:
                low, high = A2A["vllm", pl.vendor]
                args += ["--all2all-backend", low if pool.role == "decode" else high]
        args += ["--max-num-seqs", str(pool.per_rank), "--max-num-batched-tokens", str(pool.chunk_tokens),
                 "--enable-chunked-prefill", "--max-model-len", str(plan.max_len),
                 "--gpu-memory-utilization", f"{memory_flags(pl.memory)['vllm']:g}"]
        if pl.kv_flag("vllm"):
            args += ["--kv-cache-dtype", pl.kv_flag("vllm")]
        if pool.role != "both":
            args += ["--kv-transfer-config",
                     json.dumps({"kv_connector": "NixlConnector", "kv_role": "kv_both"}, separators=(",", ":"))]
        others = None
        if pl.nodes > 1:
            within = pool.tp * pool.pp * pcp
            if within <= pl.per_node:  # whole DP ranks on each host
                local = pl.per_node // within
                common = ["--data-parallel-size-local", str(local), "--data-parallel-address", HEAD,
                          "--data-parallel-rpc-port", "13345"]
                first = [*args, *common]
                others = [*args, *common, "--headless", "--data-parallel-start-rank", f'"$((rank * {local}))"']
            else:  # one DP rank spans hosts
                common = ["--nnodes", str(pl.nodes), "--node-rank", RANK, "--master-addr", HEAD,
                          "--master-port", "29501"]
                first, others = [*args, *common], [*args, *common, "--headless"]
        else:
            first = args
        s.lines += _function(pl, first, others, 8100 + i)
        names.append(pool.name)
    if plan.serving == "disaggregated":
        s.lines.append("# a disaggregated pair needs a proxy in front that sends each request to a prefill, then a "
                       "decode server (the NixlConnector guide); the benchmark's DSE_URL points at it")
    s.lines += _dispatch(names)
    return [s, _bench_vllm(plan, model_lines, record)]


def _sglang(plan: Plan, placed: list[Placed], model_lines: list[str], record: str) -> list[Script]:
    s = Script("launch_sglang.sh", _header("sglang", plan, "SGLang launch"), "sglang")
    s.lines += model_lines
    names, urls = [], {"prefill": [], "decode": []}
    for i, pl in enumerate(placed):
        pool = pl.pool
        s.lines += _notes(pl, "sglang")
        args = ["python", "-m", "sglang.launch_server", "--model-path", MODEL, "--tp-size", str(pool.stage_chips)]
        if pool.context_parallel and pool.dp > 1:
            args += ["--attn-cp-size", str(pool.dp)]
            s.lines.append("# SGLang's attention context parallelism (--attn-cp-size) covers fewer models than its "
                           "TP; where the server refuses it, run the ranks as attention DP (--attn-dp-size) and "
                           "expect a longer TTFT than planned")
        elif pool.dp > 1:
            args += ["--attn-dp-size", str(pool.dp)]
        if pool.ep > 1:
            args += ["--ep-size", str(pool.ep)]
            if pool.wide_ep and ("sglang", pl.vendor) in A2A:
                args += ["--moe-a2a-backend", A2A["sglang", pl.vendor][0]]
                if pl.vendor == "NVIDIA":
                    args += ["--deepep-mode", {"decode": "low_latency", "prefill": "normal"}.get(pool.role, "auto")]
        if pool.pp > 1:
            args += ["--pp-size", str(pool.pp)]
        args += ["--max-running-requests", str(pool.per_rank * pool.ranks),
                 "--chunked-prefill-size", str(pool.chunk_tokens * pool.ranks), "--context-length", str(plan.max_len),
                 "--mem-fraction-static", f"{memory_flags(pl.memory)['sglang']:g}"]
        if pl.kv_flag("sglang"):
            args += ["--kv-cache-dtype", pl.kv_flag("sglang")]
        if pool.role != "both":
            args += ["--disaggregation-mode", pool.role, "--disaggregation-transfer-backend",
                     "mori" if pl.vendor == "AMD" else "nixl"]
            urls[pool.role].append(f"http://HOST_OF_{pool.name.upper()}:{30000 + i}")
        if pl.nodes > 1:
            args += ["--nnodes", str(pl.nodes), "--node-rank", RANK, "--dist-init-addr", '"$DSE_HEAD_ADDR:5000"']
        s.lines += _function(pl, args, None, 30000 + i)
        names.append(pool.name)
    extra = {}
    if urls["prefill"]:
        router = ["python", "-m", "sglang_router.launch_router", "--pd-disaggregation"]
        for u in urls["prefill"]:
            router += ["--prefill", u]
        for u in urls["decode"]:
            router += ["--decode", u]
        router += ["--host", "0.0.0.0", "--port", "8000"]
        s.lines += ["# the router in front of the pools: list every replica's URL (rank-0 host, its DSE_PORT)",
                    "launch_router() {", f"  {shlex.join(router)}", "}"]
        extra["router"] = "launch_router"
    s.lines += _dispatch(names, extra)
    return [s, _bench_sglang(plan, model_lines, record)]


def _trtllm_options(pl: Placed) -> Script:
    pool = pl.pool
    doc: dict = {"enable_attention_dp": pool.dp > 1, "enable_chunked_prefill": True}
    if pl.kv_flag("trtllm"):
        doc["kv_cache_config"] = {"dtype": pl.kv_flag("trtllm")}
    if pool.role != "both":
        doc["cache_transceiver_config"] = {"backend": "DEFAULT"}
    return Script(f"trtllm_{pool.name}.yaml",
                  yaml.safe_dump(doc, sort_keys=False, default_flow_style=False).splitlines(), "trtllm")


def _trtllm(plan: Plan, placed: list[Placed], model_lines: list[str], record: str) -> list[Script]:
    s = Script("launch_trtllm.sh", _header("trtllm", plan, "TensorRT-LLM launch"), "trtllm")
    s.lines += model_lines
    files, names = [], []
    servers: dict[str, list[str]] = {"prefill": [], "decode": []}
    for i, pl in enumerate(placed):
        pool = pl.pool
        s.lines += _notes(pl, "trtllm")
        if pool.tp > 1 and pool.dp > 1:
            s.lines.append(f"# note: attention TP{pool.tp} x DP{pool.dp} is not expressible: enable_attention_dp "
                           "makes every rank a DP rank")
        if pool.wide_ep:
            s.lines.append("# note: wide expert parallelism: set the MoE all-to-all of your TensorRT-LLM release "
                           "(moe_config) in the options file")
        if pool.context_parallel:
            s.lines.append("# note: trtllm-serve has no context-parallel flag here: this replica prefills one prompt "
                           "per rank and its TTFT is longer than planned")
        if pl.nodes > 1:
            s.lines.append(f"# multi-host: start this command under MPI or Slurm with one rank per GPU over the "
                           f"{pl.nodes} hosts, through trtllm-llmapi-launch (TensorRT-LLM's multi-node launcher)")
        options = _trtllm_options(pl)
        files.append(options)
        args = ["trtllm-serve", MODEL, "--tp_size", str(pool.stage_chips), "--pp_size", str(pool.pp)]
        if pool.ep > 1:
            args += ["--ep_size", str(pool.ep)]
        args += ["--max_batch_size", str(pool.per_rank), "--max_num_tokens", str(pool.chunk_tokens),
                 "--max_seq_len", str(plan.max_len), "--gpus_per_node", str(pl.per_node),
                 "--kv_cache_free_gpu_memory_fraction", f"{memory_flags(pl.memory)['trtllm']:g}",
                 "--extra_llm_api_options", options.name]
        if pool.role != "both":
            servers[pool.role].append(f"HOST_OF_{pool.name.upper()}:{8001 + i}")
        s.lines += _function(pl, args, None, 8001 + i)
        names.append(pool.name)
    extra = {}
    if servers["prefill"]:
        doc: dict = {"hostname": "0.0.0.0", "port": 8000}
        for role, key in (("prefill", "context_servers"), ("decode", "generation_servers")):
            doc[key] = {"num_instances": len(servers[role]), "urls": servers[role]}
        files.append(Script("trtllm_disagg.yaml", yaml.safe_dump(doc, sort_keys=False).splitlines(), "trtllm"))
        s.lines += ["# the disaggregated front end: list every replica in trtllm_disagg.yaml",
                    "launch_router() {", "  " + shlex.join(["trtllm-serve", "disaggregated", "-c",
                                                            "trtllm_disagg.yaml"]), "}"]
        extra["router"] = "launch_router"
    s.lines += _dispatch(names, extra)
    return [s, *files, _bench_aiperf(plan, model_lines, record)]


# ---- the benchmark that checks the plan ---------------------------------------------------------------------
def plan_record(plan: Plan, framework: str, placed: list[Placed], model_path: str | None) -> dict:
    """The plan as the benchmark's result carries it and `dse.validate.benchmarks` reads it."""
    return {
        "dse_plan": 1, "framework": framework, "model": plan.model, "checkpoint": model_path,
        "workload": plan.workload, "serving": plan.serving, "prompt": plan.prompt, "output": plan.output,
        "concurrency": plan.concurrency, "predicted": plan.predicted,
        "pools": [{"role": p.pool.role, "system": p.pool.system, "replicas": 1 if plan.serving == "aggregated"
                   else p.pool.replicas, "tp": p.pool.tp, "dp": p.pool.dp, "ep": p.pool.ep, "pp": p.pool.pp,
                   "batch_per_rank": p.pool.per_rank, "weights_dtype": p.pool.weights_dtype,
                   "kv_dtype": p.pool.kv_dtype, "context_parallel": p.pool.context_parallel,
                   "chunk_tokens": p.pool.chunk_tokens} for p in placed],
    }


def _bench_header(plan: Plan, framework: str, tool: str) -> list[str]:
    pred = plan.predicted
    said = ", ".join(f"{k} {pred[k] * 1e3:.4g} ms" for k in ("ttft_s", "tpot_s") if k in pred) or "no figures"
    scope = ("one replica" if plan.serving == "aggregated" else
             "the whole deployment through its router or proxy")
    return [*_header(framework, plan, f"Benchmark ({tool}) of the plan")[:3],
            f"# Sends prompts of {plan.prompt} tokens for {plan.output} output tokens, {plan.concurrency} in flight, "
            f"to {scope} (DSE_URL); dse predicted {said}.",
            "# Compare: dse validate --cases RESULT (the result file carries the plan).", "set -euo pipefail"]


def _num_prompts(plan: Plan) -> int:
    return min(MAX_PROMPTS, max(100, 10 * plan.concurrency))


def _bench_vllm(plan: Plan, model_lines: list[str], record: str) -> Script:
    s = Script("bench_vllm.sh", _bench_header(plan, "vllm", "vllm bench serve"), "vllm")
    out = f"bench-vllm-{plan.model}-{plan.workload}.json"
    s.lines += [*model_lines, f'OUT="${{1:-{out}}}"', f"PLAN={shlex.quote(record)}"]
    args = ["vllm", "bench", "serve", "--backend", "vllm", "--base-url", '"${DSE_URL:-http://127.0.0.1:8100}"',
            "--model", MODEL, "--dataset-name", "random", "--random-input-len", str(plan.prompt),
            "--random-output-len", str(plan.output), "--random-range-ratio", "0", "--ignore-eos",
            "--max-concurrency", str(plan.concurrency), "--num-prompts", str(_num_prompts(plan)),
            "--request-rate", "inf", "--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles", "50,90,99",
            "--save-result", "--result-dir", '"$(dirname "$OUT")"', "--result-filename", '"$(basename "$OUT")"',
            "--metadata", '"dse_plan=$PLAN"']
    s.lines.append(_unquoted(shlex.join(args)))
    return s


def _bench_sglang(plan: Plan, model_lines: list[str], record: str) -> Script:
    s = Script("bench_sglang.sh", _bench_header(plan, "sglang", "sglang.benchmark.serving"), "sglang")
    out = f"bench-sglang-{plan.model}-{plan.workload}.jsonl"
    s.lines += [*model_lines, f'OUT="${{1:-{out}}}"', f"PLAN={shlex.quote(record)}"]
    port = 8000 if plan.serving == "disaggregated" else 30000
    args = ["python", "-m", "sglang.benchmark.serving", "--backend", "sglang", "--base-url",
            f'"${{DSE_URL:-http://127.0.0.1:{port}}}"', "--model", MODEL, "--dataset-name", "random",
            "--random-input-len", str(plan.prompt), "--random-output-len", str(plan.output), "--random-range-ratio",
            "1", "--max-concurrency", str(plan.concurrency), "--num-prompts", str(_num_prompts(plan)),
            "--request-rate", "inf", "--output-file", '"$OUT"', "--tag", '"$PLAN"']
    s.lines.append(_unquoted(shlex.join(args)))
    return s


def _bench_aiperf(plan: Plan, model_lines: list[str], record: str) -> Script:
    s = Script("bench_trtllm.sh", _bench_header(plan, "trtllm", "aiperf profile"), "trtllm")
    out = f"bench-trtllm-{plan.model}-{plan.workload}"
    port = 8000 if plan.serving == "disaggregated" else 8001
    s.lines += [*model_lines, f'OUT="${{1:-{out}}}"', f"PLAN={shlex.quote(record)}",
                'mkdir -p "$OUT"', f"printf '%s\\n' \"$PLAN\" > \"$OUT/{PLAN_FILE}\"  # the plan beside the result"]
    args = ["aiperf", "profile", "--model", MODEL, "--tokenizer", MODEL, "--url",
            f'"${{DSE_URL:-http://127.0.0.1:{port}}}"', "--endpoint-type", "completions", "--streaming",
            "--synthetic-input-tokens-mean", str(plan.prompt), "--synthetic-input-tokens-stddev", "0",
            "--output-tokens-mean", str(plan.output), "--output-tokens-stddev", "0", "--extra-inputs",
            "ignore_eos:true", "--concurrency", str(plan.concurrency), "--request-count", str(_num_prompts(plan)),
            "--artifact-dir", '"$OUT"']
    s.lines += [_unquoted(shlex.join(args)), "# result: $OUT/profile_export_aiperf.json"]
    return s


def _unquoted(line: str) -> str:
    """``shlex.join`` output with the shell expansions the scripts mean (words written as ``"$..."``) unquoted."""
    return re.sub(r"""'("[^'"]*(?:"[^'"]*"[^'"]*)*")'""", r"\1", line)


WRITERS = {"vllm": _vllm, "sglang": _sglang, "trtllm": _trtllm}


def export(entry: Plan | dict, frameworks: tuple[str, ...] | None = None, model_path: str | None = None,
           gpus_per_node: int | None = None) -> list[Script]:
    """The launch scripts, option files, benchmark scripts and ``dse-plan.json`` of every framework asked for
    (None: every framework that runs on the plan's hardware). A dict entry is checked first (``check_entry``);
    every value goes into the scripts quoted (``shlex``) and into the option files serialized (YAML, JSON).
    """
    plan = entry if isinstance(entry, Plan) else check_entry(entry)
    if model_path is not None:
        check_model_path(model_path)
    bad = [f for f in (frameworks or ()) if f not in WRITERS]
    if bad:
        raise InputError(f"--framework {bad[0]}: not allowed; allowed: {', '.join(FRAMEWORKS)}")
    if gpus_per_node is not None and (isinstance(gpus_per_node, bool) or not isinstance(gpus_per_node, int)
                                      or gpus_per_node < 1):
        raise InputError(f"--gpus-per-node must be >= 1, got {gpus_per_node}")
    placed = [_place(plan, p, gpus_per_node) for p in plan.pools]
    runs = frameworks_for(placed)
    if not runs:
        raise InputError(_refusal(placed, None))
    chosen = tuple(frameworks) if frameworks else runs
    for f in chosen:
        if f not in runs:
            raise InputError(_refusal(placed, f))
    model_lines = _model_lines(plan, placed, model_path)
    out: list[Script] = []
    records = {}
    for f in chosen:
        records[f] = plan_record(plan, f, placed, model_path or _default_checkpoint(plan, placed))
        out += WRITERS[f](plan, placed, model_lines, json.dumps(records[f], separators=(",", ":"), sort_keys=True))
    doc = {"model": plan.model, "workload": plan.workload, "serving": plan.serving, "frameworks": records}
    out.append(Script(PLAN_FILE, json.dumps(doc, indent=1, sort_keys=True).splitlines(), ""))
    return out


def _default_checkpoint(plan: Plan, placed: list[Placed]) -> str | None:
    dtypes = {p.pool.weights_dtype for p in placed}
    vendors = {p.vendor for p in placed}
    if len(dtypes) == 1 and len(vendors) == 1:
        return checkpoint(plan.model, dtypes.pop(), vendors.pop())
    return None


def plan_key(plan: Plan) -> str:
    """What an export folder holds the scripts of: the plan's model, workload and every pool's configuration."""
    return json.dumps([plan.model, plan.workload, plan.serving, plan.prompt, plan.output,
                       [p.__dict__ for p in plan.pools]], sort_keys=True)


def write_scripts(scripts: list[Script], target: Path, plan: Plan, force: bool = False) -> list[str]:
    """Write an export into the folder ``target`` (`dse.report.output.write_export`): a folder of its own, never
    one holding (or inside) a study's results; the files of another framework's export of the same plan stay,
    those of an export of another plan are replaced. Returns the names the folder holds.
    """
    from dse.report.output import write_export

    key = plan_key(plan)
    written = {sc.framework for sc in scripts if sc.framework}

    def keep(previous: dict, name: str) -> bool:
        if previous.get("plan") != key or name == PLAN_FILE:
            return False
        return previous.get("from", {}).get(name) not in written

    files = {sc.name: sc.text() for sc in scripts}
    files[PLAN_FILE] = _merged_plan(target, key, scripts)
    return write_export(files, {sc.name for sc in scripts if sc.executable}, target,
                        {"plan": key, "writer": ",".join(sorted(written))}, keep, force)


def _merged_plan(target: Path, key: str, scripts: list[Script]) -> str:
    """``dse-plan.json`` of this export, with the frameworks of an earlier export of the same plan kept."""
    from dse.report.output import EXPORT_MARKER, read_marker_doc

    doc = json.loads(next(sc for sc in scripts if sc.name == PLAN_FILE).text())
    previous = read_marker_doc(Path(target), EXPORT_MARKER) or {}
    if previous.get("plan") == key:
        try:
            old = json.loads((Path(target) / PLAN_FILE).read_text(encoding="utf-8"))
            doc["frameworks"] = {**old.get("frameworks", {}), **doc["frameworks"]}
        except (OSError, ValueError, AttributeError):
            pass
    return json.dumps(doc, indent=1, sort_keys=True) + "\n"
