"""`dse export`: launch scripts whose flags are the frameworks' own, with the plan's per-worker values, on the
plan's hardware, and the benchmark that checks the plan; `dse validate` reads the benchmarks' result files.

Every flag of every script is parsed against ``fixtures/framework_flags.json``: the flags of each tool at the
release named there, with the file and line that defines each (read from the tools' own argument definitions).
"""

from __future__ import annotations

import json
import math
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import dse

from dse.errors import InputError
from dse.report.export import DEFAULT_CHUNK_TOKENS, check_entry, export, memory_budget, memory_flags

FIXTURES = Path(__file__).resolve().parent / "fixtures"
TABLE = json.loads((FIXTURES / "framework_flags.json").read_text())["tools"]

AGGREGATED = {"model": "deepseek-v3", "workload": "chat", "serving": "aggregated", "system": "h200", "chips": 16,
              "tp": 1, "ep": 8, "pp": 2, "dp": 8, "batch": 96, "weights_dtype": "fp8", "kv_dtype": "fp8",
              "context": 6000, "prompt": 5000, "output": 1000, "replicas": 7, "chunk_tokens": 4096}
DISAGGREGATED = {"model": "llama-3.1-70b", "workload": "long", "serving": "disaggregated", "context": 130000,
                 "prompt": 128000, "output": 2000, "pools": [
                     {"role": "prefill", "system": "h100", "replicas": 3, "chips": 8, "tp": 8, "ep": 1, "pp": 1,
                      "dp": 1, "batch": 1, "weights_dtype": "fp8", "kv_dtype": "fp8", "chunk_tokens": 16384},
                     {"role": "decode", "system": "h100", "replicas": 2, "chips": 8, "tp": 4, "ep": 1, "pp": 1,
                      "dp": 2, "batch": 8, "weights_dtype": "fp8", "kv_dtype": "bf16"}]}
CP_PREFILL = {**DISAGGREGATED, "model": "llama-3.1-8b", "pools": [
    dict(DISAGGREGATED["pools"][0], tp=1, dp=8, context_parallel=True), DISAGGREGATED["pools"][1]]}
MI300X = {**AGGREGATED, "system": "mi300x", "chips": 32, "tp": 8, "dp": 4, "ep": 4, "pp": 1, "batch": 220}
GB200 = {**AGGREGATED, "system": "gb200-nvl72", "chips": 16, "tp": 1, "dp": 16, "ep": 16, "pp": 1, "batch": 256,
         "weights_dtype": "fp4"}
TPU = {**AGGREGATED, "model": "llama-3.1-8b", "system": "tpu-v6e", "chips": 4, "tp": 4, "dp": 1, "ep": 1, "pp": 1,
       "batch": 64, "weights_dtype": "bf16", "kv_dtype": "bf16", "context": 3000, "prompt": 2000}

TOOLS = {("vllm", "serve"): "vllm serve", ("vllm", "bench"): "vllm bench serve",
         ("-m", "sglang.launch_server"): "python -m sglang.launch_server",
         ("-m", "sglang.benchmark.serving"): "python -m sglang.benchmark.serving",
         ("-m", "sglang_router.launch_router"): "python -m sglang_router.launch_router",
         ("trtllm-serve", "$MODEL"): "trtllm-serve", ("aiperf", "profile"): "aiperf profile"}


def _commands(text: str) -> list[tuple[str, list[str]]]:
    """(tool, words) of every framework command in a script, the words as bash would split them."""
    out = []
    for line in text.splitlines():
        if line.lstrip().startswith("#"):
            continue
        words = shlex.split(line.replace("\\", ""), comments=True)
        for i in range(len(words) - 1):
            tool = TOOLS.get((words[i], words[i + 1]))
            if tool:
                out.append((tool, words[i:]))
                break
    return out


def _parse(tool: str, words: list[str]) -> dict[str, object]:
    """The flags of one command, each checked against the tool's table: known flag, value of the right kind and in
    the allowed choices; a repeated flag collects its values."""
    spec = TABLE[tool]["flags"]
    skip = {"vllm serve": 3, "vllm bench serve": 3}.get(tool, 2)  # the command's words before its flags
    args, flags, i = words[skip:], {}, 0
    while i < len(args):
        flag = args[i]
        assert flag.startswith("--"), (tool, flag, words)
        assert flag in spec, f"{tool}: {flag} is not a flag of {TABLE[tool]['package']} {TABLE[tool]['version']}"
        kind = spec[flag]["value"]
        if kind == "none":
            flags[flag] = True
            i += 1
            continue
        values = []
        while i + 1 < len(args) and not args[i + 1].startswith("--"):
            values.append(args[i + 1])
            i += 1
        i += 1
        assert values, (tool, flag)
        for v in values:
            if "$" in v:
                continue  # a shell expansion (model, address, rank, output path): checked by running the scripts
            if kind == "int":
                assert int(v) >= 0, (flag, v)
            elif kind == "float":
                x = float(v)
                lo, hi = spec[flag].get("range", (-math.inf, math.inf))
                assert lo < x <= hi, (flag, v)
            elif kind == "json":
                json.loads(v)
            if "choices" in spec[flag]:
                assert v in spec[flag]["choices"], (tool, flag, v, spec[flag]["choices"])
        flags[flag] = values[0] if len(values) == 1 else values
    return flags


def _files(entry: dict, frameworks=None, **kw) -> dict[str, str]:
    return {s.name: s.text() for s in export(entry, frameworks, **kw)}


def _all(entry: dict, name: str, tool: str, frameworks=None) -> list[dict]:
    return [_parse(t, w) for t, w in _commands(_files(entry, frameworks)[name]) if t == tool]


@pytest.mark.parametrize("entry", [AGGREGATED, DISAGGREGATED, CP_PREFILL, MI300X, GB200, TPU],
                         ids=["aggregated", "disaggregated", "cp-prefill", "mi300x", "gb200", "tpu"])
def test_every_flag_of_every_script_is_the_frameworks_own(entry):
    files = _files(entry)
    seen = set()
    for name, text in files.items():
        if name.endswith(".sh"):
            for tool, words in _commands(text):
                _parse(tool, words)
                seen.add(tool)
            assert subprocess.run(["bash", "-n"], input=text, text=True).returncode == 0, name
    assert {"vllm serve", "vllm bench serve"} <= seen


def test_per_worker_values_are_the_plans():
    """vLLM takes per-engine values; SGLang divides its totals over the attention-DP ranks (server_args:
    chunked_prefill_size // attn_dp_size; kv_cache_configurator: max_running_requests // attn_dp_size)."""
    (v,) = _all(AGGREGATED, "launch_vllm.sh", "vllm serve")[:1]
    assert (v["--tensor-parallel-size"], v["--data-parallel-size"], v["--pipeline-parallel-size"]) == ("1", "8", "2")
    assert v["--max-num-seqs"] == str(96 * 2 // 8) and v["--max-num-batched-tokens"] == "4096"  # the plan's chunk
    (sg,) = _all(AGGREGATED, "launch_sglang.sh", "python -m sglang.launch_server")
    assert (sg["--tp-size"], sg["--attn-dp-size"], sg["--ep-size"], sg["--pp-size"]) == ("8", "8", "8", "2")
    assert int(sg["--max-running-requests"]) // 8 == 24 and int(sg["--chunked-prefill-size"]) // 8 == 4096
    # the case: a context-parallel prefill replica of batch 1 over 8 ranks holds one request, not 0 per rank
    pre = _all(CP_PREFILL, "launch_sglang.sh", "python -m sglang.launch_server")[0]
    assert pre["--attn-cp-size"] == "8" and "--attn-dp-size" not in pre and pre["--max-running-requests"] == "1"
    vpre = _all(CP_PREFILL, "launch_vllm.sh", "vllm serve")[0]
    assert vpre["--prefill-context-parallel-size"] == "8" and vpre["--data-parallel-size"] == "1"
    assert vpre["--max-num-batched-tokens"] == "16384"
    (t,) = _all(AGGREGATED, "launch_trtllm.sh", "trtllm-serve")
    assert (t["--tp_size"], t["--pp_size"], t["--ep_size"], t["--max_batch_size"]) == ("8", "2", "8", "24")


def test_hosts_come_from_the_catalog():
    """GB200 NVL72 compute trays hold 4 GPUs: a 16-GPU replica spans 4 hosts (not 2 of 8)."""
    text = _files(GB200, ("vllm",))["launch_vllm.sh"]
    assert "spans 4 hosts of 4 GPUs" in text
    first, other = _all(GB200, "launch_vllm.sh", "vllm serve", ("vllm",))
    assert first["--data-parallel-size-local"] == "4" and first["--data-parallel-address"] == "$DSE_HEAD_ADDR"
    assert other["--headless"] is True and other["--data-parallel-start-rank"] == "$((rank * 4))"
    (sg,) = _all(GB200, "launch_sglang.sh", "python -m sglang.launch_server", ("sglang",))
    assert (sg["--nnodes"], sg["--node-rank"], sg["--dist-init-addr"]) == ("4", "$rank", "$DSE_HEAD_ADDR:5000")
    big = {**GB200, "tp": 8, "dp": 2, "ep": 16}  # one DP rank of 8 GPUs spans 2 trays
    first, other = _all(big, "launch_vllm.sh", "vllm serve", ("vllm",))
    assert (first["--nnodes"], first["--node-rank"], first["--master-addr"]) == ("4", "$rank", "$DSE_HEAD_ADDR")
    assert other["--headless"] is True and "--headless" not in first
    assert "--gpus_per_node" in _all(GB200, "launch_trtllm.sh", "trtllm-serve", ("trtllm",))[0]


def test_only_frameworks_that_run_on_the_hardware():
    files = _files(MI300X)
    assert not any("trtllm" in n for n in files) and "launch_vllm.sh" in files and "launch_sglang.sh" in files
    assert "ROCm build of vLLM" in files["launch_vllm.sh"]
    with pytest.raises(InputError, match=r"--framework trtllm: does not run on AMD \(mi300x\); allowed for this "
                                         r"plan: vllm, sglang"):
        export(MI300X, ("trtllm",))
    assert set(_files(TPU)) == {"launch_vllm.sh", "bench_vllm.sh", "dse-plan.json"}
    with pytest.raises(InputError, match="spans 2 TPU hosts"):
        export({**TPU, "chips": 16, "tp": 16})


def test_wide_expert_parallelism_gets_an_all_to_all_backend():
    assert _all(AGGREGATED, "launch_vllm.sh", "vllm serve")[0]["--all2all-backend"] == "deepep_high_throughput"
    sg = _all(AGGREGATED, "launch_sglang.sh", "python -m sglang.launch_server")[0]
    assert sg["--moe-a2a-backend"] == "deepep"
    assert _all(MI300X, "launch_vllm.sh", "vllm serve")[0]["--all2all-backend"] == "mori_high_throughput"
    assert _all(MI300X, "launch_sglang.sh", "python -m sglang.launch_server")[0]["--moe-a2a-backend"] == "mori"
    decode = {**DISAGGREGATED, "model": "deepseek-v3", "pools": [
        DISAGGREGATED["pools"][0], dict(DISAGGREGATED["pools"][1], tp=1, dp=8, ep=8, batch=64)]}
    flags = _all(decode, "launch_vllm.sh", "vllm serve")
    assert "--all2all-backend" not in flags[0] and flags[1]["--all2all-backend"] == "deepep_low_latency"


def test_memory_fractions_hold_the_plans_budget():
    plan = check_entry(AGGREGATED)
    mem = memory_budget(plan, plan.pools[0])
    # no framework in the entry: H200's default, vLLM, fills 0.92 of the device less what it holds besides, 7.9 GiB
    # (hw_catalog/frameworks.yaml), and is told 0.92
    assert mem.capacity == 141 * 2**30 and mem.usable == pytest.approx(mem.capacity * 0.92 - 7.9 * 2**30)
    tight = memory_budget(check_entry({**AGGREGATED, "framework": "vllm", "mem_fraction": 0.8}), plan.pools[0])
    assert tight.usable == pytest.approx(tight.capacity * 0.8 - 7.9 * 2**30)  # the plan's own fraction
    assert memory_flags(tight)["vllm"] == 0.8
    want = memory_flags(mem)
    assert want["vllm"] == 0.92
    assert _all(AGGREGATED, "launch_vllm.sh", "vllm serve")[0]["--gpu-memory-utilization"] == f"{want['vllm']:g}"
    sg = _all(AGGREGATED, "launch_sglang.sh", "python -m sglang.launch_server")[0]
    assert float(sg["--mem-fraction-static"]) * mem.capacity <= mem.usable - mem.activations
    t = _all(AGGREGATED, "launch_trtllm.sh", "trtllm-serve")[0]
    free = mem.capacity - mem.weights - mem.activations
    assert float(t["--kv_cache_free_gpu_memory_fraction"]) * free == pytest.approx(
        mem.usable - mem.weights - mem.activations, rel=2e-3)


def test_checkpoints_follow_the_weights_format_and_are_chat_models():
    assert "DEFAULT_MODEL=deepseek-ai/DeepSeek-V3 " in _files(AGGREGATED)["launch_vllm.sh"]
    assert "DEFAULT_MODEL=nvidia/Llama-3.1-70B-Instruct-FP8 " in _files(DISAGGREGATED)["launch_vllm.sh"]
    assert "DEFAULT_MODEL=amd/Llama-3.1-70B-Instruct-FP8-KV " in _files({**DISAGGREGATED, "pools": [
        dict(p, system="mi300x") for p in DISAGGREGATED["pools"]]})["launch_vllm.sh"]
    bf16 = _files({**AGGREGATED, "model": "llama-3.1-8b", "weights_dtype": "bf16", "ep": 1})["launch_vllm.sh"]
    assert "DEFAULT_MODEL=meta-llama/Llama-3.1-8B-Instruct " in bf16


def test_an_unknown_checkpoint_stops_the_script_until_one_is_named(tmp_path):
    text = _files({**AGGREGATED, "weights_dtype": "bf16"}, ("vllm",))["launch_vllm.sh"]  # no BF16 DeepSeek-V3
    script = tmp_path / "launch_vllm.sh"
    script.write_text(text)
    r = subprocess.run(["bash", str(script), "both"], capture_output=True, text=True, env={"PATH": os.defpath})
    assert r.returncode != 0 and "no chat-tuned bf16 checkpoint of deepseek-v3" in r.stderr, r.stderr


def test_the_benchmark_measures_the_plan():
    for name, tool in (("bench_vllm.sh", "vllm bench serve"), ("bench_sglang.sh", "python -m sglang.benchmark.serving"),
                       ("bench_trtllm.sh", "aiperf profile")):
        (b,) = _all(DISAGGREGATED, name, tool)
        conc = "--max-concurrency" if tool != "aiperf profile" else "--concurrency"
        assert b[conc] == str(2 * 8)  # two decode replicas of 8 in flight
        prompt = b.get("--random-input-len") or b["--synthetic-input-tokens-mean"]
        output = b.get("--random-output-len") or b["--output-tokens-mean"]
        assert (prompt, output) == ("128000", "2000")
    plan = json.loads(_files(DISAGGREGATED)["dse-plan.json"])["frameworks"]["vllm"]
    assert plan["concurrency"] == 16 and [p["replicas"] for p in plan["pools"]] == [3, 2]


def test_scripts_run_with_hostile_model_paths_pass_each_as_one_argument(tmp_path):
    """Each script run for real with the framework binaries replaced by a stub that records its argv: the model
    path arrives as one argument, and no command hidden in it runs."""
    stub = f"#!{sys.executable} -S\nimport json, os, sys\n" \
           "open(os.path.join(os.environ['STUB_LOG'], str(os.getpid())), 'w').write(json.dumps(sys.argv[1:]))\n"
    bins, log = tmp_path / "bin", tmp_path / "log"
    bins.mkdir()
    log.mkdir()
    for name in ("vllm", "python", "trtllm-serve", "aiperf"):
        (bins / name).write_text(stub)
        (bins / name).chmod(0o755)
    env = {**os.environ, "PATH": f"{bins}{os.pathsep}{os.environ['PATH']}", "STUB_LOG": str(log),
           "DSE_HEAD_ADDR": "10.0.0.1"}
    env.pop("DSE_MODEL_PATH", None)
    hostile = "/srv/my weights/it's \"q\" $(touch PWNED) `touch PWNED`; touch PWNED | x=$HOME > PWNED"
    run = tmp_path / "run"
    run.mkdir()
    for sc in export(DISAGGREGATED, model_path=hostile):
        (run / sc.name).write_text(sc.text())
    for script, pools in (("launch_vllm.sh", ["prefill", "decode"]), ("launch_sglang.sh", ["prefill", "decode",
                                                                                           "router"]),
                          ("launch_trtllm.sh", ["prefill", "decode"]), ("bench_vllm.sh", [""]),
                          ("bench_sglang.sh", [""]), ("bench_trtllm.sh", [""])):
        for pool in pools:
            r = subprocess.run(["bash", script, *([pool] if pool else [])], cwd=run, env=env, capture_output=True,
                               text=True, timeout=60)
            assert r.returncode == 0, (script, pool, r.stderr)
    calls = [json.loads(p.read_text()) for p in log.iterdir()]
    with_model = [c for c in calls if hostile in c]
    assert len(with_model) == 3 * 2 + 3 and all(c.count(hostile) in (1, 2) for c in with_model)
    assert not list(tmp_path.rglob("PWNED"))


def test_an_entry_is_checked_before_any_script_is_written():
    bad = {**DISAGGREGATED, "pools": [DISAGGREGATED["pools"][0], dict(DISAGGREGATED["pools"][1], replicas=-3)]}
    with pytest.raises(InputError, match=r"field 'best\[0\]\.pools\[1\]\.replicas': must be a positive integer, "
                                         r"got -3"):
        export(bad, ("vllm",))
    with pytest.raises(InputError, match="--model-path"):
        export(AGGREGATED, ("vllm",), "org/model\nrm -rf ~")
    with pytest.raises(InputError, match=r"field 'best\[0\]\.output': missing"):
        export({k: v for k, v in AGGREGATED.items() if k != "output"})
    assert check_entry({k: v for k, v in AGGREGATED.items() if k != "chunk_tokens"}).pools[0].chunk_tokens \
        == DEFAULT_CHUNK_TOKENS


def test_cli_exports_to_a_folder_of_its_own_and_frameworks_coexist(tmp_path):
    result = tmp_path / "result"
    result.mkdir()
    (result / "summary.json").write_text(json.dumps({"study": "s", "best": [AGGREGATED, dict(AGGREGATED,
                                                                                            workload="long")]}))
    (result / ".dse-output.json").write_text(json.dumps({"version": 2, "files": {}}))  # a study's result folder
    r = dse("export", str(result), cwd=tmp_path)
    assert r.returncode == 2 and "--model deepseek-v3 --workload long" in " ".join(r.stderr.split())
    r = dse("export", str(result), "--workload", "chat", "--framework", "sglang", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    folder = tmp_path / "exports" / "s" / "deepseek-v3-chat"
    assert (folder / "launch_sglang.sh").stat().st_mode & 0o111 and not list(result.glob("export*"))
    r = dse("export", str(result), "--workload", "chat", "--framework", "vllm", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert {"launch_sglang.sh", "launch_vllm.sh", "bench_sglang.sh", "bench_vllm.sh"} <= {p.name for p in
                                                                                           folder.iterdir()}
    assert set(json.loads((folder / "dse-plan.json").read_text())["frameworks"]) == {"sglang", "vllm"}
    r = dse("export", str(result), "--workload", "chat", "--out", str(result / "scripts"), cwd=tmp_path)
    assert r.returncode == 2 and "inside the study results" in r.stderr and not (result / "scripts").exists()
    (folder / "notes.txt").write_text("mine")
    r = dse("export", str(result), "--workload", "chat", "--framework", "vllm", cwd=tmp_path)
    assert r.returncode == 2 and "notes.txt" in r.stderr
    r = dse("export", str(result), "--workload", "chat", "--framework", "vllm", "--force", cwd=tmp_path)
    assert r.returncode == 0 and (folder / "notes.txt").read_text() == "mine"
    assert dse("export", str(result), "--workload", "chat", "--framework", "tgi", cwd=tmp_path).returncode == 2


# ---- the benchmarks' result files, read by dse validate ------------------------------------------------------
@pytest.mark.parametrize(("path", "framework", "ttft_ms", "tpot_ms", "mode"), [
    ("bench/vllm_bench_serve.json", "vllm", 95.2, 13.4, "agg"),
    ("bench/sglang_bench_serving.jsonl", "sglang", 1210.0, 45.6, "disagg"),
    ("bench/aiperf/profile_export_aiperf.json", "trtllm", 91.5, 13.1, "agg"),
])
def test_validate_reads_each_benchmark_result(path, framework, ttft_ms, tpot_ms, mode):
    from dse.validate.benchmarks import read_benchmark
    from dse.validate.runs import map_runs

    raw = read_benchmark(FIXTURES / path)
    (row,) = raw.to_dict("records")
    assert (row["backend"], row["mode"], row["silicon_ttft_ms"], row["silicon_tpot_ms"]) == (framework, mode, ttft_ms,
                                                                                            tpot_ms)
    runs = map_runs(raw)
    assert len(runs.table) == 1 and not runs.skipped, runs.skipped
    t = runs.table.iloc[0]
    if mode == "agg":
        assert (t["model"], t["system"], t["tp"], t["dp"], t["concurrency"], t["kd"]) == ("llama-3.1-8b", "h100", 1, 1,
                                                                                          32.0, "fp8")
    else:
        assert (t["p_tp"], t["tp"], t["dp"], t["replicas"], t["p_replicas"], t["concurrency"]) == (8, 4, 2, 1.0, 2.0,
                                                                                                   64.0)


def test_validate_cli_compares_a_benchmark_with_the_prediction(tmp_path):
    r = dse("validate", "--cases", str(FIXTURES / "bench" / "vllm_bench_serve.json"), "--out", str(tmp_path / "v"),
            "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["rows_given"] == 1 and doc["rows_predicted"] == 1
    runs = (tmp_path / "v" / "runs.csv").read_text().splitlines()
    assert runs[0].startswith("id,model_path,system,backend,mode") and ",llama-3.1-8b,h100,vllm,agg," in runs[1]
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"mean_ttft_ms": 1.0}))
    r = dse("validate", "--cases", str(bad))
    assert r.returncode == 2 and "no dse_plan" in r.stderr
