"""`dse export`: launch commands whose flags carry the chosen configuration, for each framework."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys

import pytest
from helpers import dse

from dse.report.export import DEFAULT_CHUNK_TOKENS, export

AGGREGATED = {"model": "deepseek-v3", "workload": "chat", "serving": "aggregated", "system": "h200", "chips": 16,
              "tp": 1, "ep": 8, "pp": 2, "dp": 8, "batch": 96, "weights_dtype": "fp8", "kv_dtype": "fp8",
              "context": 6000, "replicas": 7}
DISAGGREGATED = {"model": "llama-3.1-70b", "workload": "long", "serving": "disaggregated", "context": 130000,
                 "pools": [
                     {"role": "prefill", "system": "h100", "replicas": 3, "chips": 8, "tp": 8, "ep": 1, "pp": 1,
                      "dp": 1, "batch": 1, "weights_dtype": "fp8", "kv_dtype": "fp8", "chunk_tokens": 16384},
                     {"role": "decode", "system": "h100", "replicas": 2, "chips": 8, "tp": 4, "ep": 1, "pp": 1,
                      "dp": 2, "batch": 64, "weights_dtype": "fp8", "kv_dtype": "bf16"}]}


def _flags(line: str) -> dict[str, str | bool]:
    words = shlex.split(line.replace('"$1"', "PORT"))
    out: dict[str, str | bool] = {}
    for i, w in enumerate(words):
        if w.startswith("--"):
            nxt = words[i + 1] if i + 1 < len(words) else ""
            out[w] = True if nxt.startswith("--") or not nxt else nxt
    return out


def _launch_lines(text: str) -> list[str]:
    return [ln for ln in text.splitlines() if ln.startswith("  ") and ("serve" in ln or "launch_server" in ln)]


def _by_name(entry: dict) -> dict[str, str]:
    return {s.name: s.text() for s in export(entry, ("vllm", "sglang", "trtllm"), "org/model")}


def test_aggregated_flags_carry_the_layout_batch_and_formats():
    files = _by_name(AGGREGATED)
    (v,) = [_flags(ln) for ln in _launch_lines(files["launch_vllm.sh"])]
    assert (v["--tensor-parallel-size"], v["--data-parallel-size"], v["--pipeline-parallel-size"]) == ("1", "8", "2")
    assert v["--enable-expert-parallel"] is True and v["--kv-cache-dtype"] == "fp8"
    assert v["--max-num-seqs"] == str(96 * 2 // 8)  # sequences in flight per data-parallel engine
    assert v["--max-num-batched-tokens"] == str(DEFAULT_CHUNK_TOKENS) and v["--max-model-len"] == "6000"
    (sg,) = [_flags(ln) for ln in _launch_lines(files["launch_sglang.sh"])]
    assert (sg["--tp-size"], sg["--dp-size"], sg["--ep-size"], sg["--pp-size"]) == ("8", "8", "8", "2")
    assert sg["--enable-dp-attention"] is True and sg["--max-running-requests"] == "192"
    assert sg["--kv-cache-dtype"] == "fp8_e4m3" and "--disaggregation-mode" not in sg
    (t,) = [_flags(ln) for ln in _launch_lines(files["launch_trtllm.sh"])]
    assert (t["--tp_size"], t["--pp_size"], t["--ep_size"], t["--max_batch_size"]) == ("8", "2", "8", "24")
    assert "enable_attention_dp: true" in files["trtllm_both.yaml"] and "dtype: fp8" in files["trtllm_both.yaml"]
    assert "weights fp8" in files["launch_vllm.sh"] and "spans 2 nodes" in files["launch_sglang.sh"]


def test_disaggregated_pools_get_their_roles_and_a_router():
    files = _by_name(DISAGGREGATED)
    sg = [_flags(ln) for ln in _launch_lines(files["launch_sglang.sh"])]
    assert [f["--disaggregation-mode"] for f in sg] == ["prefill", "decode"]
    assert sg[0]["--chunked-prefill-size"] == "16384" and sg[1]["--kv-cache-dtype"] == "auto"
    assert "--dp-size" not in sg[0] and sg[1]["--dp-size"] == "2" and sg[1]["--tp-size"] == "8"
    assert "sglang_router.launch_router --pd-disaggregation --prefill" in files["launch_sglang.sh"]
    v = [_flags(ln) for ln in _launch_lines(files["launch_vllm.sh"])]
    assert all("NixlConnector" in f["--kv-transfer-config"] for f in v)
    assert "3 replica(s)" in files["launch_vllm.sh"] and "2 replica(s)" in files["launch_vllm.sh"]
    disagg = files["trtllm_disagg.yaml"]
    assert "context_servers:" in disagg and "generation_servers:" in disagg
    assert "cache_transceiver_config" in files["trtllm_prefill.yaml"]
    assert "not expressible" in files["launch_trtllm.sh"]  # attention TP4 x DP2 in the decode pool


def test_cli_writes_executable_scripts_and_refuses_ambiguous_choices(tmp_path):
    result = tmp_path / "result"
    result.mkdir()
    (result / "summary.json").write_text(json.dumps({"best": [AGGREGATED, dict(AGGREGATED, workload="long")]}))

    r = dse("export", str(result))
    assert r.returncode == 2 and "--model deepseek-v3 --workload long" in " ".join(r.stderr.split())
    r = dse("export", str(result), "--workload", "chat", "--framework", "sglang")
    assert r.returncode == 0, r.stderr
    script = result / "export-deepseek-v3-chat" / "launch_sglang.sh"
    assert script.stat().st_mode & 0o111 and "deepseek-ai/DeepSeek-V3" in script.read_text()
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0
    assert dse("export", str(result), "--workload", "chat", "--framework", "tgi").returncode == 2


@pytest.mark.parametrize("entry", [AGGREGATED, DISAGGREGATED])
def test_every_script_is_valid_bash(tmp_path, entry):
    for name, text in _by_name(entry).items():
        if name.endswith(".sh"):
            path = tmp_path / name
            path.write_text(text)
            assert subprocess.run(["bash", "-n", str(path)]).returncode == 0, name


def test_context_parallel_prefill_pool_is_stated():
    entry = {**DISAGGREGATED, "pools": [dict(DISAGGREGATED["pools"][0], context_parallel=True, dp=4, tp=2),
                                        DISAGGREGATED["pools"][1]]}
    for name, text in _by_name(entry).items():
        if not name.endswith(".sh"):
            continue  # the launch scripts carry the comments, not the framework's option files
        assert "context parallel: dse planned each prompt split over this replica's 4 DP ranks" in text, name
    assert not any("context parallel" in t for t in _by_name(DISAGGREGATED).values())


def test_a_layout_vllm_cannot_express_is_noted():
    entry = dict(AGGREGATED, ep=4)  # experts EP4 x expert-TP2 over the 8 chips of a stage
    text = _by_name(entry)["launch_vllm.sh"]
    assert "TP x DP = 8; this layout has EP 4: not expressible exactly" in text


def test_pools_of_one_role_get_their_own_function_and_options_file():
    second = dict(DISAGGREGATED["pools"][1], tp=8, dp=1, replicas=1)
    files = _by_name({**DISAGGREGATED, "pools": [*DISAGGREGATED["pools"], second]})
    vllm = files["launch_vllm.sh"]
    assert "launch_decode() {" in vllm and "launch_decode_2() {" in vllm and "launch_decode_2 8102 &" in vllm
    assert {"trtllm_decode.yaml", "trtllm_decode_2.yaml", "trtllm_prefill.yaml"} <= set(files)
    assert "--extra_llm_api_options trtllm_decode_2.yaml" in files["launch_trtllm.sh"]
    assert "num_instances: 2" in files["trtllm_disagg.yaml"]


def test_an_entry_is_checked_before_any_script_is_written():
    from dse.errors import InputError

    bad = {**DISAGGREGATED, "pools": [DISAGGREGATED["pools"][0], dict(DISAGGREGATED["pools"][1], replicas=-3)]}
    with pytest.raises(InputError, match=r"field 'best\[0\]\.pools\[1\]\.replicas': must be a positive integer, "
                                         r"got -3"):
        export(bad, ("vllm",), "org/model")
    with pytest.raises(InputError, match="--model-path"):
        export(AGGREGATED, ("vllm",), "org/model\nrm -rf ~")


HOSTILE = ["/srv/my weights/it's \"q\" $(touch PWNED) `touch PWNED`; touch PWNED && touch PWNED | touch PWNED",
           "'; touch PWNED; '", "\"$(touch PWNED)\"", "* ~ a\\", "x=$HOME > PWNED < /dev/null"]
STUB = """#!{python} -S
import json, os, sys
with open(os.path.join(os.environ["STUB_LOG"], str(os.getpid()) + ".json"), "w") as f:
    json.dump([os.path.basename(sys.argv[0]), *sys.argv[1:]], f)
"""


@pytest.mark.parametrize("entry", [AGGREGATED, DISAGGREGATED], ids=["aggregated", "disaggregated"])
def test_scripts_run_with_hostile_model_paths_pass_each_as_one_argument(tmp_path, entry):
    """Each generated script, run for real with the framework binaries replaced by a stub that records its
    argv: the model path arrives as one argument, and no command hidden in it runs.
    """
    stubs, log = tmp_path / "bin", tmp_path / "log"
    stubs.mkdir()
    for name in ("vllm", "python", "trtllm-serve"):
        (stubs / name).write_text(STUB.format(python=sys.executable))
        (stubs / name).chmod(0o755)
    env = {**os.environ, "PATH": f"{stubs}{os.pathsep}{os.environ['PATH']}", "STUB_LOG": str(log)}
    for i, model_path in enumerate(HOSTILE):
        run = tmp_path / f"run{i}"
        run.mkdir()
        log.mkdir(exist_ok=True)
        for old in log.iterdir():
            old.unlink()
        scripts = export(entry, ("vllm", "sglang", "trtllm"), model_path)
        for sc in scripts:
            (run / sc.name).write_text(sc.text())
        for sc in scripts:
            if not sc.name.endswith(".sh"):
                continue
            assert subprocess.run(["bash", "-n", sc.name], cwd=run).returncode == 0, (sc.name, model_path)
            r = subprocess.run(["bash", sc.name], cwd=run, env=env, capture_output=True, text=True, timeout=60)
            assert r.returncode == 0, (sc.name, model_path, r.stderr)
        calls = [json.loads(p.read_text()) for p in log.iterdir()]
        servers = [c for c in calls if "sglang.launch_server" in c or c[0] == "vllm" or
                   (c[0] == "trtllm-serve" and c[1] != "disaggregated")]
        pools = len(entry.get("pools", [entry]))
        assert len(servers) == 3 * pools, (model_path, calls)
        for argv in servers:
            assert argv.count(model_path) == 1, (model_path, argv)
        assert not list(tmp_path.rglob("PWNED")), model_path
