"""Launch commands for a chosen configuration of a study result: vLLM, SGLang and TensorRT-LLM.

Each pool of a deployment (one for aggregated serving; a prefill and a decode pool for
disaggregated serving) becomes one server launch per replica, with the parallel layout, the batch,
the chunked-prefill size and the KV-cache format of the configuration. Flags follow each
framework's documentation (see ``DOCS``); where a framework cannot express a layout exactly, the
script says so in a comment instead of guessing.

The mapping of dse's layout (attention TP x DP = experts EP x expert-TP chips per stage, PP stages)
to the frameworks:

- vLLM: ``--tensor-parallel-size`` TP, ``--data-parallel-size`` DP, ``--pipeline-parallel-size`` PP,
  ``--enable-expert-parallel`` for MoE (vLLM's expert-parallel size is TP x DP);
  ``--max-num-seqs`` is per data-parallel engine.
- SGLang: ``--tp-size`` TP x DP (the GPUs of a stage), ``--dp-size`` DP with
  ``--enable-dp-attention``, ``--ep-size`` EP, ``--pp-size`` PP; ``--max-running-requests`` for the
  whole server.
- TensorRT-LLM (``trtllm-serve``): ``--tp_size`` TP x DP, ``--ep_size`` EP, ``--pp_size`` PP; attention
  data parallelism (``enable_attention_dp``) makes every rank an attention DP rank, so a layout with
  both attention TP > 1 and DP > 1 is not expressible and is flagged.
"""

from __future__ import annotations

import math
import shlex
from dataclasses import dataclass, field

FRAMEWORKS = ("vllm", "sglang", "trtllm")
DEFAULT_CHUNK_TOKENS = 8192
"""Chunked-prefill size used when the configuration does not state one (tokens per step)."""

DOCS = {
    "vllm": "https://docs.vllm.ai/en/latest/serving/engine_args.html (engine arguments); "
            "https://docs.vllm.ai/en/latest/features/nixl_connector_usage.html (disaggregated prefill, NixlConnector)",
    "sglang": "https://docs.sglang.io/advanced_features/server_arguments.html (server arguments); "
              "https://docs.sglang.io/advanced_features/pd_disaggregation.html (PD disaggregation, router)",
    "trtllm": "https://nvidia.github.io/TensorRT-LLM/commands/trtllm-serve (trtllm-serve options, "
              "extra_llm_api_options); TensorRT-LLM disaggregated serving (trtllm-serve disaggregated -c)",
}
VLLM_KV = {"bf16": "auto", "fp8": "fp8"}
SGLANG_KV = {"bf16": "auto", "fp8": "fp8_e4m3"}
TRTLLM_KV = {"bf16": "auto", "fp8": "fp8"}


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
    chunk_tokens: int = DEFAULT_CHUNK_TOKENS
    context_parallel: bool = False  # a prefill pool that splits each prompt over its DP ranks

    @property
    def stage_chips(self) -> int:
        return self.tp * self.dp

    @property
    def in_flight(self) -> int:
        """Sequences in flight per replica: a micro-batch per pipeline stage."""
        return self.batch * self.pp


@dataclass
class Script:
    """A launch script: its file name and lines."""

    name: str
    lines: list[str] = field(default_factory=list)

    def text(self) -> str:
        return "\n".join(self.lines) + "\n"


def pools_of(entry: dict) -> list[Pool]:
    """The pools of a ``best`` entry of summary.json (``pools`` when present, else the entry itself as one
    aggregated replica: an entry's ``replicas`` belongs to its demand configuration, not to this one).
    """
    raw = entry.get("pools") or [dict(entry, role="both", replicas=1)]
    out = []
    for p in raw:
        out.append(Pool(role=p.get("role", "both"), system=p["system"], replicas=int(p.get("replicas") or 1),
                        chips=int(p["chips"]), tp=int(p["tp"]), ep=int(p["ep"]), pp=int(p["pp"]), dp=int(p["dp"]),
                        batch=int(p["batch"]), weights_dtype=p["weights_dtype"], kv_dtype=p["kv_dtype"],
                        chunk_tokens=int(p.get("chunk_tokens") or entry.get("chunk_tokens") or DEFAULT_CHUNK_TOKENS),
                        context_parallel=bool(p.get("context_parallel", False))))
    return out


def _header(framework: str, entry: dict, model_path: str) -> list[str]:
    return ["#!/usr/bin/env bash",
            f"# {framework} launch for {entry['model']} / {entry['workload']} ({entry.get('serving', 'aggregated')}), "
            f"written by dse export from a study result.",
            f"# Model weights: {model_path}. Flags: {DOCS[framework]}",
            "set -euo pipefail"]


def _max_len(entry: dict) -> int:
    return int(entry.get("context") or (entry.get("prompt", 0) + entry.get("output", 0)))


def _notes(pool: Pool, gpus_per_node: int) -> list[str]:
    """The comments above a pool's launch: weights format, nodes spanned, context parallelism."""
    cp = []
    if pool.context_parallel:
        cp = [f"# context parallel: dse planned each prompt split over this replica's {pool.dp} DP ranks (ring "
              "attention); set the framework's context-parallel size to it where the framework offers one, "
              "otherwise this replica prefills one prompt per DP rank and its TTFT is longer than planned"]
    return _weights_note(pool) + _nodes_note(pool, gpus_per_node) + cp


def _weights_note(pool: Pool) -> list[str]:
    if pool.weights_dtype == "fp8":
        return ["# weights fp8: serve an FP8 checkpoint of the model (or add the framework's fp8 quantization flag)"]
    if pool.weights_dtype == "fp4":
        return ["# weights fp4: serve an NVFP4/MXFP4 checkpoint of the model; the frameworks read the format from it"]
    return []


def _nodes_note(pool: Pool, gpus_per_node: int) -> list[str]:
    nodes = math.ceil(pool.chips / gpus_per_node)
    if nodes <= 1:
        return []
    return [f"# this replica spans {nodes} nodes of {gpus_per_node} GPUs: run the command on each node with its "
            "node rank (multi-node launch of the framework)"]


def _pool_function(script: Script, pool: Pool, args: list[str], port_flag: str) -> str:
    """A shell function that starts one replica of the pool on the port given as its argument."""
    name = f"launch_{pool.role}"
    script.lines += [f"# {pool.replicas} replica(s): run `{name} PORT` once per replica, each on its own "
                     f"{pool.chips} GPUs", f"{name}() {{", "  " + shlex.join(args) + f" {port_flag} \"$1\"", "}"]
    return name


def vllm(entry: dict, model_path: str, gpus_per_node: int = 8) -> list[Script]:
    """`vllm serve` per pool; disaggregated pools exchange KV through the NixlConnector."""
    s = Script("launch_vllm.sh", _header("vllm", entry, model_path))
    port, starts = 8100, []
    for pool in pools_of(entry):
        s.lines += [f"# pool {pool.role}: {pool.replicas} replica(s) of {pool.chips} x {pool.system}"]
        s.lines += _notes(pool, gpus_per_node)
        if pool.ep > 1 and pool.ep != pool.stage_chips:
            s.lines.append(f"# note: vLLM's expert-parallel size is TP x DP = {pool.stage_chips}; this layout has EP "
                           f"{pool.ep}: not expressible exactly")
        args = ["vllm", "serve", model_path, "--tensor-parallel-size", str(pool.tp), "--data-parallel-size",
                str(pool.dp), "--pipeline-parallel-size", str(pool.pp)]
        if pool.ep > 1:
            args.append("--enable-expert-parallel")
        args += ["--max-num-seqs", str(math.ceil(pool.in_flight / pool.dp)), "--max-num-batched-tokens",
                 str(pool.chunk_tokens), "--enable-chunked-prefill", "--kv-cache-dtype", VLLM_KV[pool.kv_dtype],
                 "--max-model-len", str(_max_len(entry))]
        if pool.role != "both":
            args += ["--kv-transfer-config", '{"kv_connector":"NixlConnector","kv_role":"kv_both"}']
        starts.append(f"{_pool_function(s, pool, args, '--port')} {port} &")
        port += 1
    s.lines += ["# first replica of each pool on this host (a disaggregated pair also needs a proxy that sends "
                "each request to a prefill then a decode server, see the NixlConnector guide)", *starts, "wait"]
    return [s]


def sglang(entry: dict, model_path: str, gpus_per_node: int = 8) -> list[Script]:
    """`python -m sglang.launch_server` per pool; disaggregated pools behind the SGLang router."""
    s = Script("launch_sglang.sh", _header("sglang", entry, model_path))
    port, urls, starts = 30000, {"prefill": [], "decode": []}, []
    for pool in pools_of(entry):
        s.lines += [f"# pool {pool.role}: {pool.replicas} replica(s) of {pool.chips} x {pool.system}"]
        s.lines += _notes(pool, gpus_per_node)
        args = ["python", "-m", "sglang.launch_server", "--model-path", model_path, "--tp-size", str(pool.stage_chips)]
        if pool.dp > 1:
            args += ["--dp-size", str(pool.dp), "--enable-dp-attention"]
        if pool.ep > 1:
            args += ["--ep-size", str(pool.ep)]
        if pool.pp > 1:
            args += ["--pp-size", str(pool.pp)]
        args += ["--max-running-requests", str(pool.in_flight), "--chunked-prefill-size", str(pool.chunk_tokens),
                 "--kv-cache-dtype", SGLANG_KV[pool.kv_dtype], "--context-length", str(_max_len(entry))]
        if pool.role != "both":
            args += ["--disaggregation-mode", pool.role, "--disaggregation-transfer-backend", "nixl"]
            urls[pool.role].append(f"http://127.0.0.1:{port}")
        starts.append(f"{_pool_function(s, pool, args, '--port')} {port} &")
        port += 1
    if urls["prefill"]:
        router = ["python", "-m", "sglang_router.launch_router", "--pd-disaggregation"]
        for u in urls["prefill"]:
            router += ["--prefill", u]
        for u in urls["decode"]:
            router += ["--decode", u]
        starts.append(shlex.join([*router, "--port", "8000"]) + " &")
    s.lines += ["# first replica of each pool on this host; list every replica's URL with the router", *starts, "wait"]
    return [s]


def _trtllm_yaml(pool: Pool) -> list[str]:
    lines = [f"enable_attention_dp: {'true' if pool.dp > 1 else 'false'}", "enable_chunked_prefill: true",
             "kv_cache_config:", f"  dtype: {TRTLLM_KV[pool.kv_dtype]}"]
    if pool.role != "both":
        lines += ["cache_transceiver_config:", "  backend: DEFAULT"]
    return lines


def trtllm(entry: dict, model_path: str, gpus_per_node: int = 8) -> list[Script]:
    """`trtllm-serve` per pool with its extra_llm_api_options file; `trtllm-serve disaggregated` in front."""
    s = Script("launch_trtllm.sh", _header("trtllm", entry, model_path))
    files, port, starts = [], 8001, []
    servers: dict[str, list[str]] = {"prefill": [], "decode": []}
    for pool in pools_of(entry):
        s.lines += [f"# pool {pool.role}: {pool.replicas} replica(s) of {pool.chips} x {pool.system}"]
        s.lines += _notes(pool, gpus_per_node)
        if pool.tp > 1 and pool.dp > 1:
            s.lines.append(f"# note: attention TP{pool.tp} x DP{pool.dp} is not expressible: enable_attention_dp "
                           "makes every rank a DP rank")
        options = Script(f"trtllm_{pool.role}.yaml", _trtllm_yaml(pool))
        files.append(options)
        per_rank = math.ceil(pool.in_flight / pool.dp)
        args = ["trtllm-serve", model_path, "--tp_size", str(pool.stage_chips), "--pp_size", str(pool.pp)]
        if pool.ep > 1:
            args += ["--ep_size", str(pool.ep)]
        args += ["--max_batch_size", str(per_rank), "--max_num_tokens", str(pool.chunk_tokens), "--max_seq_len",
                 str(_max_len(entry)), "--extra_llm_api_options", options.name]
        if pool.role != "both":
            servers[pool.role].append(f"localhost:{port}")
        starts.append(f"{_pool_function(s, pool, args, '--port')} {port} &")
        port += 1
    if servers["prefill"]:
        disagg = Script("trtllm_disagg.yaml", ["hostname: localhost", "port: 8000"])
        for role, key in (("prefill", "context_servers"), ("decode", "generation_servers")):
            disagg.lines += [f"{key}:", f"  num_instances: {len(servers[role])}", "  urls:"]
            disagg.lines += [f"    - \"{u}\"" for u in servers[role]]
        files.append(disagg)
        starts.append(shlex.join(["trtllm-serve", "disaggregated", "-c", disagg.name]) + " &")
    s.lines += ["# first replica of each pool on this host; list every replica in trtllm_disagg.yaml", *starts, "wait"]
    return [s, *files]


WRITERS = {"vllm": vllm, "sglang": sglang, "trtllm": trtllm}


def export(entry: dict, frameworks: tuple[str, ...], model_path: str, gpus_per_node: int = 8) -> list[Script]:
    """The launch scripts (and option files) of every framework asked for."""
    return [s for f in frameworks for s in WRITERS[f](entry, model_path, gpus_per_node)]
