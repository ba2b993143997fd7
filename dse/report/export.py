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

A summary is data, not code: every field the export reads is checked first (``check_entry``: positive
integers, known formats and roles, plain names for the ids that name files), every value goes into a
script quoted (``shlex``) and into an option file serialized (YAML, JSON), and every file is written inside
the folder given (``write_scripts``).
"""

from __future__ import annotations

import json
import re
import shlex
import unicodedata
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from dse.catalog.units import DTYPES
from dse.errors import InputError
from dse.physics.codes import DEFAULT_CHUNK

FRAMEWORKS = ("vllm", "sglang", "trtllm")
DEFAULT_CHUNK_TOKENS = DEFAULT_CHUNK
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
"""KV-cache formats per framework; a format not listed (fp4) is left at the framework's default, with a note."""

SERVING = ("aggregated", "disaggregated")
ROLES = ("both", "prefill", "decode")
KV_DTYPES = ("bf16", "fp8", "fp4")
MAX_INT = 2**31 - 1
"""Largest count the export writes (degrees, batches, replicas, lengths): the frameworks read 32-bit integers."""
PLAIN_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
"""Ids that become parts of file and folder names: letters, digits, '.', '_', '-', not starting with '.' or '-'."""
PLAIN_RULE = "a plain name (letters, digits, '.', '_', '-'; starting with a letter or digit)"


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


@dataclass(frozen=True)
class Plan:
    """A checked ``best`` entry: every value the scripts carry, of the right type and range."""

    model: str
    workload: str
    serving: str
    max_len: int
    pools: tuple[Pool, ...]


@dataclass
class Script:
    """A launch script: its file name and lines."""

    name: str
    lines: list[str] = field(default_factory=list)

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
    own_chunk = p.get("chunk_tokens")
    return Pool(
        role=_choice(_get(p, "role", where), where / "role", ROLES) if pooled else "both",
        system=_name(_get(p, "system", where), where / "system"),
        replicas=_count(_get(p, "replicas", where), where / "replicas") if pooled else 1,
        weights_dtype=_choice(_get(p, "weights_dtype", where), where / "weights_dtype", DTYPES),
        kv_dtype=_choice(_get(p, "kv_dtype", where), where / "kv_dtype", KV_DTYPES),
        chunk_tokens=chunk if own_chunk is None else _count(own_chunk, where / "chunk_tokens"),
        context_parallel=bool(cp), **counts)


def _max_len(entry: dict, where: _Where) -> int:
    """The longest sequence served: ``context``, else ``prompt`` + ``output``."""
    if "context" in entry or not ({"prompt", "output"} & set(entry)):
        return _count(_get(entry, "context", where), where / "context")
    total = sum(_count(_get(entry, k, where), where / k, low=0) for k in ("prompt", "output"))
    return _count(total, where / "context")


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
        labelled.append(Pool(**{**p.__dict__, "label": p.role if seen[p.role] == 1 else f"{p.role}_{seen[p.role]}"}))
    return Plan(model, workload, serving, max_len, tuple(labelled))


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


def _plan(entry: Plan | dict) -> Plan:
    return entry if isinstance(entry, Plan) else check_entry(entry)


def _header(framework: str, plan: Plan, model_path: str) -> list[str]:
    return ["#!/usr/bin/env bash",
            f"# {framework} launch for {plan.model} / {plan.workload} ({plan.serving}), "
            f"written by dse export from a study result.",
            f"# Model weights: {model_path}. Flags: {DOCS[framework]}",
            "set -euo pipefail"]


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def _notes(pool: Pool, gpus_per_node: int, framework: str, kv: dict[str, str]) -> list[str]:
    """The comments above a pool's launch: weights and KV formats, nodes spanned, context parallelism."""
    cp = []
    if pool.context_parallel:
        cp = [f"# context parallel: dse planned each prompt split over this replica's {pool.dp} DP ranks (ring "
              "attention); set the framework's context-parallel size to it where the framework offers one, "
              "otherwise this replica prefills one prompt per DP rank and its TTFT is longer than planned"]
    kv_note = []
    if pool.kv_dtype not in kv:
        kv_note = [f"# note: KV cache {pool.kv_dtype}: this script knows no {framework} flag for it and leaves the "
                   "KV-cache format at the framework's default (the model's), which holds more bytes per token than "
                   "planned; set the framework's format by hand where it has one"]
    return _weights_note(pool) + kv_note + _nodes_note(pool, gpus_per_node) + cp


def _weights_note(pool: Pool) -> list[str]:
    if pool.weights_dtype == "fp8":
        return ["# weights fp8: serve an FP8 checkpoint of the model (or add the framework's fp8 quantization flag)"]
    if pool.weights_dtype == "fp4":
        return ["# weights fp4: serve an NVFP4/MXFP4 checkpoint of the model; the frameworks read the format from it"]
    if pool.weights_dtype == "int4":
        return ["# weights int4: serve an INT4 weight-only (W4A16, e.g. AWQ or GPTQ) checkpoint of the model"]
    return []


def _nodes_note(pool: Pool, gpus_per_node: int) -> list[str]:
    nodes = _ceil_div(pool.chips, gpus_per_node)
    if nodes <= 1:
        return []
    return [f"# this replica spans {nodes} nodes of {gpus_per_node} GPUs: run the command on each node with its "
            "node rank (multi-node launch of the framework)"]


def _pool_function(script: Script, pool: Pool, args: list[str], port_flag: str) -> str:
    """A shell function that starts one replica of the pool on the port given as its argument."""
    name = f"launch_{pool.name}"
    script.lines += [f"# {pool.replicas} replica(s): run `{name} PORT` once per replica, each on its own "
                     f"{pool.chips} GPUs", f"{name}() {{", "  " + shlex.join([*args, port_flag]) + ' "$1"', "}"]
    return name


def vllm(entry: Plan | dict, model_path: str, gpus_per_node: int = 8) -> list[Script]:
    """`vllm serve` per pool; disaggregated pools exchange KV through the NixlConnector."""
    plan = _plan(entry)
    s = Script("launch_vllm.sh", _header("vllm", plan, model_path))
    port, starts = 8100, []
    for pool in plan.pools:
        s.lines += [f"# pool {pool.name}: {pool.replicas} replica(s) of {pool.chips} x {pool.system}"]
        s.lines += _notes(pool, gpus_per_node, "vLLM", VLLM_KV)
        if pool.ep > 1 and pool.ep != pool.stage_chips:
            s.lines.append(f"# note: vLLM's expert-parallel size is TP x DP = {pool.stage_chips}; this layout has EP "
                           f"{pool.ep}: not expressible exactly")
        args = ["vllm", "serve", model_path, "--tensor-parallel-size", str(pool.tp), "--data-parallel-size",
                str(pool.dp), "--pipeline-parallel-size", str(pool.pp)]
        if pool.ep > 1:
            args.append("--enable-expert-parallel")
        args += ["--max-num-seqs", str(_ceil_div(pool.in_flight, pool.dp)), "--max-num-batched-tokens",
                 str(pool.chunk_tokens), "--enable-chunked-prefill", "--kv-cache-dtype",
                 VLLM_KV.get(pool.kv_dtype, "auto"), "--max-model-len", str(plan.max_len)]
        if pool.role != "both":
            args += ["--kv-transfer-config",
                     json.dumps({"kv_connector": "NixlConnector", "kv_role": "kv_both"}, separators=(",", ":"))]
        starts.append(f"{_pool_function(s, pool, args, '--port')} {port} &")
        port += 1
    s.lines += ["# first replica of each pool on this host (a disaggregated pair also needs a proxy that sends "
                "each request to a prefill then a decode server, see the NixlConnector guide)", *starts, "wait"]
    return [s]


def sglang(entry: Plan | dict, model_path: str, gpus_per_node: int = 8) -> list[Script]:
    """`python -m sglang.launch_server` per pool; disaggregated pools behind the SGLang router."""
    plan = _plan(entry)
    s = Script("launch_sglang.sh", _header("sglang", plan, model_path))
    port, urls, starts = 30000, {"prefill": [], "decode": []}, []
    for pool in plan.pools:
        s.lines += [f"# pool {pool.name}: {pool.replicas} replica(s) of {pool.chips} x {pool.system}"]
        s.lines += _notes(pool, gpus_per_node, "SGLang", SGLANG_KV)
        args = ["python", "-m", "sglang.launch_server", "--model-path", model_path, "--tp-size", str(pool.stage_chips)]
        if pool.dp > 1:
            args += ["--dp-size", str(pool.dp), "--enable-dp-attention"]
        if pool.ep > 1:
            args += ["--ep-size", str(pool.ep)]
        if pool.pp > 1:
            args += ["--pp-size", str(pool.pp)]
        args += ["--max-running-requests", str(pool.in_flight), "--chunked-prefill-size", str(pool.chunk_tokens),
                 "--kv-cache-dtype", SGLANG_KV.get(pool.kv_dtype, "auto"), "--context-length", str(plan.max_len)]
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


def _yaml(name: str, doc: dict) -> Script:
    return Script(name, yaml.safe_dump(doc, sort_keys=False, default_flow_style=False).splitlines())


def _trtllm_options(pool: Pool) -> Script:
    doc: dict = {"enable_attention_dp": pool.dp > 1, "enable_chunked_prefill": True,
                 "kv_cache_config": {"dtype": TRTLLM_KV.get(pool.kv_dtype, "auto")}}
    if pool.role != "both":
        doc["cache_transceiver_config"] = {"backend": "DEFAULT"}
    return _yaml(f"trtllm_{pool.name}.yaml", doc)


def trtllm(entry: Plan | dict, model_path: str, gpus_per_node: int = 8) -> list[Script]:
    """`trtllm-serve` per pool with its extra_llm_api_options file; `trtllm-serve disaggregated` in front."""
    plan = _plan(entry)
    s = Script("launch_trtllm.sh", _header("trtllm", plan, model_path))
    files, port, starts = [], 8001, []
    servers: dict[str, list[str]] = {"prefill": [], "decode": []}
    for pool in plan.pools:
        s.lines += [f"# pool {pool.name}: {pool.replicas} replica(s) of {pool.chips} x {pool.system}"]
        s.lines += _notes(pool, gpus_per_node, "TensorRT-LLM", TRTLLM_KV)
        if pool.tp > 1 and pool.dp > 1:
            s.lines.append(f"# note: attention TP{pool.tp} x DP{pool.dp} is not expressible: enable_attention_dp "
                           "makes every rank a DP rank")
        options = _trtllm_options(pool)
        files.append(options)
        args = ["trtllm-serve", model_path, "--tp_size", str(pool.stage_chips), "--pp_size", str(pool.pp)]
        if pool.ep > 1:
            args += ["--ep_size", str(pool.ep)]
        args += ["--max_batch_size", str(_ceil_div(pool.in_flight, pool.dp)), "--max_num_tokens",
                 str(pool.chunk_tokens), "--max_seq_len", str(plan.max_len), "--extra_llm_api_options", options.name]
        if pool.role != "both":
            servers[pool.role].append(f"localhost:{port}")
        starts.append(f"{_pool_function(s, pool, args, '--port')} {port} &")
        port += 1
    if servers["prefill"]:
        doc: dict = {"hostname": "localhost", "port": 8000}
        for role, key in (("prefill", "context_servers"), ("decode", "generation_servers")):
            doc[key] = {"num_instances": len(servers[role]), "urls": servers[role]}
        files.append(_yaml("trtllm_disagg.yaml", doc))
        starts.append(shlex.join(["trtllm-serve", "disaggregated", "-c", "trtllm_disagg.yaml"]) + " &")
    s.lines += ["# first replica of each pool on this host; list every replica in trtllm_disagg.yaml", *starts, "wait"]
    return [s, *files]


WRITERS = {"vllm": vllm, "sglang": sglang, "trtllm": trtllm}


def export(entry: Plan | dict, frameworks: tuple[str, ...], model_path: str, gpus_per_node: int = 8) -> list[Script]:
    """The launch scripts (and option files) of every framework asked for. A dict entry is checked first
    (``check_entry``); every value goes into the scripts quoted (``shlex``) and into the option files
    serialized (YAML, JSON).
    """
    plan = _plan(entry)
    check_model_path(model_path)
    bad = [f for f in frameworks if f not in WRITERS]
    if bad:
        raise InputError(f"--framework {bad[0]}: not allowed; allowed: {', '.join(FRAMEWORKS)}")
    if isinstance(gpus_per_node, bool) or not isinstance(gpus_per_node, int) or gpus_per_node < 1:
        raise InputError(f"--gpus-per-node must be >= 1, got {gpus_per_node}")
    return [s for f in frameworks for s in WRITERS[f](plan, model_path, gpus_per_node)]


def write_scripts(scripts: list[Script], target: Path, label: str, inside: Path | None = None) -> None:
    """Write ``scripts`` into the folder ``target`` (``label`` names it in messages), the .sh executable.

    Every file must resolve inside ``target`` (a link to elsewhere is refused, not followed), and ``target``
    inside ``inside`` when given; the folder may hold only files this export writes.
    """
    names = {sc.name for sc in scripts}
    real = target.resolve()
    if inside is not None and not real.is_relative_to(inside.resolve()):
        raise InputError(f"{label}: resolves to {real}, outside {inside}; choose a folder with --out")
    if target.exists() and not target.is_dir():
        raise InputError(f"{label}: exists and is not a folder; choose an empty or new folder")
    try:
        if target.exists():
            foreign = sorted(p.name for p in target.iterdir() if p.name not in names)
            if foreign:
                raise InputError(f"{label}: holds files dse export did not write ({', '.join(foreign[:3])}); "
                                 "choose an empty or new folder")
        for name in sorted(names):
            dest = target / name
            if dest.is_symlink() or (dest.exists() and dest.resolve().parent != real):
                raise InputError(f"{label}: {name} is a link that leads outside the folder; remove it or choose "
                                 "another folder")
        target.mkdir(parents=True, exist_ok=True)
        for sc in scripts:
            dest = target / sc.name
            dest.write_text(sc.text(), encoding="utf-8")
            if sc.name.endswith(".sh"):
                dest.chmod(0o755)
    except OSError as exc:
        raise InputError(f"{label}: cannot write there ({exc.strerror or exc})") from None
