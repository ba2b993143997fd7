"""Fuzz `dse export` and the storage-URL masks (issue 27): damaged summaries, hostile names and paths, secrets.

Every damaged summary starts from a real one (a small deployment study solved once per module, with an
aggregated and a disaggregated optimum). Each case must exit 2 with one message naming the summary file and
the field, or exit 0 with scripts in which every value is quoted; never a traceback, and never a file outside
the folder the export was given.
"""

from __future__ import annotations

import copy
import json
import math
import shlex
import subprocess
from pathlib import Path

import pytest
from helpers import dse
from typer.testing import CliRunner

from dse.cli import app
from dse.errors import mask_in, mask_url

# A deployment study that solves in about two seconds: short chat prompts serve aggregated, 32k-token prompts
# under a tight TPOT serve from split prefill and decode pools.
STUDY = {
    "study": "export_fixture", "kind": "deployment", "description": "fixture of the export tests",
    "expect": "one aggregated and one disaggregated optimum", "models": ["llama-3.1-8b"],
    "workloads": [
        {"name": "chat", "prompt": 200, "output": 1000, "tpot_max_s": 0.05, "ttft_max_s": 2.0,
         "demand_tokens_per_s": 20000},
        {"name": "rag", "prompt": 32000, "output": 100, "tpot_max_s": 0.02, "ttft_max_s": 3.0,
         "demand_tokens_per_s": 20000}],
    "space": {"systems": ["h100"], "weights_dtypes": ["fp8"], "kv_dtypes": ["fp8"], "kv_tiers": ["hbm"],
              "tp": [1, 2], "pp": [1], "max_racks": 1, "max_batch_per_rank": 256},
    "deployment": {"groups": [{"name": "nodes", "systems": ["h100"]}]},
    "price": "on_demand",
}
HUGE = "9" * 5000  # an integer literal past Python's 4300-digit conversion limit


@pytest.fixture(scope="module")
def summary(tmp_path_factory) -> dict:
    import dse

    out = tmp_path_factory.mktemp("study") / "out"
    dse.run(STUDY, out=out)
    doc = json.loads((out / "summary.json").read_text())
    assert sorted(e["serving"] for e in doc["best"]) == ["aggregated", "disaggregated"]
    pools = next(e for e in doc["best"] if e["serving"] == "disaggregated")["pools"]
    while len(pools) < 3:  # the cases damage pools[0..2]: repeat a decode pool (two pools of one role are real)
        pools.insert(0, copy.deepcopy(next(p for p in pools if p["role"] == "decode")))
    return doc


def _only(doc: dict, serving: str) -> dict:
    """The summary with its one optimum of the given serving mode (so no --model/--workload is needed)."""
    doc = copy.deepcopy(doc)
    doc["best"] = [next(e for e in doc["best"] if e["serving"] == serving)]
    return doc


DELETE = object()


def _edit(serving: str, *edits: tuple) -> callable:
    """A case: the summary with its ``serving`` optimum, each (path in best[0], value) set, or deleted."""

    def make(doc: dict) -> dict:
        doc = _only(doc, serving)
        for path, value in edits:
            node = doc["best"][0]
            for key in path[:-1]:
                node = node[key]
            if value is DELETE:
                del node[path[-1]]
            else:
                node[path[-1]] = value
        return doc

    return make


def _whole(fn: callable) -> callable:
    """A case that rewrites the whole summary document."""
    return lambda doc: fn(copy.deepcopy(doc))


def _raw(fn: callable) -> callable:
    """A case that writes bytes (not JSON) as summary.json."""
    return lambda doc: fn(doc)


A, D = "aggregated", "disaggregated"
P = "pools"
# (case id, make(summary) -> document | bytes | "DIR", exit code, text the message names besides the file)
CASES = [
    # ---- deleted keys
    ("del-model", _edit(A, (("model",), DELETE)), 2, "best[0].model"),
    ("del-workload", _edit(D, (("workload",), DELETE)), 2, "best[0].workload"),
    ("del-serving", _edit(A, (("serving",), DELETE)), 2, "best[0].serving"),
    ("del-system", _edit(D, ((P, 1, "system"), DELETE)), 2, "best[0].pools[1].system"),
    ("del-tp", _edit(A, ((P, 0, "tp"), DELETE)), 2, "best[0].pools[0].tp"),
    ("del-batch", _edit(D, ((P, 2, "batch"), DELETE)), 2, "best[0].pools[2].batch"),
    ("del-replicas", _edit(D, ((P, 0, "replicas"), DELETE)), 2, "best[0].pools[0].replicas"),
    ("del-role", _edit(D, ((P, 1, "role"), DELETE)), 2, "best[0].pools[1].role"),
    ("del-kv-dtype", _edit(A, ((P, 0, "kv_dtype"), DELETE)), 2, "best[0].pools[0].kv_dtype"),
    ("del-weights-dtype", _edit(D, ((P, 2, "weights_dtype"), DELETE)), 2, "best[0].pools[2].weights_dtype"),
    ("del-chips", _edit(A, ((P, 0, "chips"), DELETE)), 2, "best[0].pools[0].chips"),
    ("del-context", _edit(A, (("context",), DELETE), (("prompt",), DELETE), (("output",), DELETE)), 2,
     "best[0].context"),
    # ---- wrong types
    ("tp-string", _edit(A, ((P, 0, "tp"), "8")), 2, "best[0].pools[0].tp"),
    ("batch-float", _edit(D, ((P, 1, "batch"), 3.5)), 2, "best[0].pools[1].batch"),
    ("chips-bool", _edit(A, ((P, 0, "chips"), True)), 2, "best[0].pools[0].chips"),
    ("replicas-list", _edit(D, ((P, 2, "replicas"), [3])), 2, "best[0].pools[2].replicas"),
    ("pools-string", _edit(D, ((P,), "x")), 2, "best[0].pools"),
    ("pools-dict", _edit(D, ((P,), {"role": "both"})), 2, "best[0].pools"),
    ("pools-empty", _edit(A, ((P,), [])), 2, "best[0].pools"),
    ("pool-string", _edit(D, ((P,), ["x"])), 2, "best[0].pools[0]"),
    ("serving-number", _edit(A, (("serving",), 5)), 2, "best[0].serving"),
    ("model-number", _edit(A, (("model",), 5)), 2, "best[0].model"),
    ("workload-null", _edit(D, (("workload",), None)), 2, "best[0].workload"),
    ("system-number", _edit(D, ((P, 0, "system"), 7)), 2, "best[0].pools[0].system"),
    ("context-parallel-string", _edit(D, ((P, 2, "context_parallel"), "yes")), 2,
     "best[0].pools[2].context_parallel"),
    ("chunk-tokens-string", _edit(A, (("chunk_tokens",), "big")), 2, "best[0].chunk_tokens"),
    # ---- numbers out of range
    ("replicas-negative", _edit(D, ((P, 1, "replicas"), -3)), 2, "best[0].pools[1].replicas"),
    ("batch-zero", _edit(A, ((P, 0, "batch"), 0)), 2, "best[0].pools[0].batch"),
    ("tp-zero", _edit(D, ((P, 2, "tp"), 0)), 2, "best[0].pools[2].tp"),
    ("dp-negative", _edit(A, ((P, 0, "dp"), -1)), 2, "best[0].pools[0].dp"),
    ("pp-huge", _edit(A, ((P, 0, "pp"), 10**30)), 2, "best[0].pools[0].pp"),
    ("chips-2-64", _edit(D, ((P, 0, "chips"), 2**64)), 2, "best[0].pools[0].chips"),
    ("context-negative", _edit(D, (("context",), -5)), 2, "best[0].context"),
    ("chunk-tokens-zero", _edit(D, ((P, 2, "chunk_tokens"), 0)), 2, "best[0].pools[2].chunk_tokens"),
    ("batch-1e308", _edit(D, ((P, 0, "batch"), 1e308)), 2, "best[0].pools[0].batch"),
    ("chips-not-the-layout", _edit(A, ((P, 0, "chips"), 3)), 2, "best[0].pools[0].chips"),
    ("ep-not-a-divisor", _edit(A, ((P, 0, "ep"), 7)), 2, "best[0].pools[0].ep"),
    ("batch-nan", _edit(A, ((P, 0, "batch"), math.nan)), 2, "best[0].pools[0].batch"),
    ("replicas-infinity", _edit(D, ((P, 1, "replicas"), math.inf)), 2, "best[0].pools[1].replicas"),
    ("chips-minus-infinity", _edit(A, ((P, 0, "chips"), -math.inf)), 2, "best[0].pools[0].chips"),
    ("context-nan", _edit(D, (("context",), math.nan)), 2, "best[0].context"),
    ("batch-5000-digits", _edit(A, ((P, 0, "batch"), "__HUGE__")), 2, "5000 digits"),
    # ---- names and enumerations
    ("weights-dtype-unknown", _edit(A, ((P, 0, "weights_dtype"), "fp3")), 2, "best[0].pools[0].weights_dtype"),
    ("kv-dtype-int4", _edit(D, ((P, 1, "kv_dtype"), "int4")), 2, "best[0].pools[1].kv_dtype"),
    ("role-unknown", _edit(D, ((P, 0, "role"), "router")), 2, "best[0].pools[0].role"),
    ("serving-unknown", _edit(A, (("serving",), "hybrid")), 2, "best[0].serving"),
    ("serving-disagrees-with-roles", _edit(D, (("serving",), "aggregated")), 2, "best[0].pools[0].role"),
    ("disaggregated-without-pools", _edit(D, ((P,), DELETE)), 2, "best[0].pools"),
    ("disaggregated-without-decode", _whole(lambda d: {**d, "best": [
        {**e, P: [p for p in e[P] if p["role"] == "prefill"]} for e in d["best"] if e["serving"] == D]}), 2,
     "no decode pool"),
    ("role-both-in-disaggregated", _edit(D, ((P, 2, "role"), "both")), 2, "best[0].pools[2].role"),
    # ---- hostile strings
    ("model-dotdot", _edit(A, (("model",), "../../x")), 2, "best[0].model"),
    ("model-newline", _edit(A, (("model",), "a\nb")), 2, "best[0].model"),
    ("model-command", _edit(D, (("model",), "$(touch PWNED)")), 2, "best[0].model"),
    ("model-hidden", _edit(A, (("model",), ".hidden")), 2, "best[0].model"),
    ("model-empty", _edit(A, (("model",), "")), 2, "best[0].model"),
    ("model-dash", _edit(A, (("model",), "-rf")), 2, "best[0].model"),
    ("workload-escape", _edit(A, (("workload",), "/../../../escaped")), 2, "best[0].workload"),
    ("workload-command", _edit(D, (("workload",), "x; touch PWNED")), 2, "best[0].workload"),
    ("workload-dotdot", _edit(A, (("workload",), "..")), 2, "best[0].workload"),
    ("system-newline", _edit(D, ((P, 0, "system"), "h100\ntouch PWNED")), 2, "best[0].pools[0].system"),
    ("system-backticks", _edit(A, ((P, 0, "system"), "`touch PWNED`")), 2, "best[0].pools[0].system"),
    ("role-command", _edit(D, ((P, 2, "role"), "prefill; touch PWNED")), 2, "best[0].pools[2].role"),
    ("kv-dtype-command", _edit(A, ((P, 0, "kv_dtype"), "$(touch PWNED)")), 2, "best[0].pools[0].kv_dtype"),
    ("serving-newline", _edit(A, (("serving",), "aggregated\ntouch PWNED")), 2, "best[0].serving"),
    ("weights-dtype-newline", _edit(D, ((P, 1, "weights_dtype"), "fp8\ntouch PWNED")), 2,
     "best[0].pools[1].weights_dtype"),
    # ---- structure
    ("summary-list", _whole(lambda d: [d]), 2, "JSON object"),
    ("summary-string", _whole(lambda d: "summary"), 2, "JSON object"),
    ("summary-null", _whole(lambda d: None), 2, "JSON object"),
    ("best-dict", _whole(lambda d: {**d, "best": d["best"][0]}), 2, "field 'best'"),
    ("best-string", _whole(lambda d: {**d, "best": "x"}), 2, "field 'best'"),
    ("best-missing", _whole(lambda d: {k: v for k, v in d.items() if k != "best"}), 2, "field 'best'"),
    ("best-empty", _whole(lambda d: {**d, "best": []}), 2, "field 'best'"),
    ("best-entry-string", _whole(lambda d: {**d, "best": ["x"]}), 2, "best[0]"),
    ("best-entry-null", _whole(lambda d: {**d, "best": [None]}), 2, "best[0]"),
    ("best-second-entry-number", _whole(lambda d: {**d, "best": [d["best"][0], 5]}), 2, "best[1]"),
    ("invalid-utf8", _raw(lambda d: b'{"best": ["\xff\xfe"]}'), 2, "UTF-8"),
    ("truncated", _raw(lambda d: json.dumps(d).encode()[:1000]), 2, "not JSON"),
    ("empty-file", _raw(lambda d: b""), 2, "not JSON"),
    ("deep-nesting", _raw(lambda d: b"[" * 200_000 + b"]" * 200_000), 2, "nested"),
    ("directory", _raw(lambda d: "DIR"), 2, "summary.json"),
    # ---- documented valid results: fields the export does not read
    ("unread-metric-nan", _edit(A, (("ttft_s",), math.nan)), 0, ""),
    ("unknown-extra-key", _edit(D, (("extra",), {"x": [1, 2]})), 0, ""),
    ("no-context-parallel-key", _edit(D, ((P, 2, "context_parallel"), DELETE)), 0, ""),
    ("kv-dtype-fp4-on-hopper", _edit(A, ((P, 0, "kv_dtype"), "fp4")), 2, "not a KV-cache format of 'h100'"),
]


def _write_summary(folder: Path, content) -> Path:
    folder.mkdir(parents=True)
    path = folder / "summary.json"
    if content == "DIR":
        path.mkdir()
    elif isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(json.dumps(content).replace('"__HUGE__"', HUGE))
    return path


def _listing(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


def _outcome(summary: dict, tmp_path: Path, make, code: int, names: str, args=(), names_file: bool = True) -> str:
    """'ok', or what went wrong: traceback, accepted (exit 0 where 2 was due), refused (2 where 0 was due),
    vague (a message that names no file or field), outside (a file written outside the export folder), bash.
    """
    result = tmp_path / "a" / "b" / "c" / "result"  # deep, so that '../../..' lands inside tmp_path
    path = _write_summary(result, make(summary))
    exports = tmp_path / "exports"
    before = _listing(tmp_path)
    r = CliRunner().invoke(app, ["export", str(result), "--out", str(exports), *args])
    after = _listing(tmp_path)
    if r.exception is not None and not isinstance(r.exception, SystemExit):
        return f"traceback: {type(r.exception).__name__}: {r.exception}"
    text = " ".join(r.output.split())
    if r.exit_code != code:
        return f"{'accepted' if r.exit_code == 0 else 'refused' if code == 0 else 'exit'} {r.exit_code}: {text}"
    if code == 2:
        if after - before - {"exports"}:
            return f"outside: {sorted(after - before)}"
        if (names_file and str(path) not in text) or names not in text:
            return f"vague: {text}"
        return "ok"
    if any(not p.startswith("exports") for p in after - before):
        return f"outside: {sorted(after - before)}"
    for script in exports.glob("*.sh"):
        if subprocess.run(["bash", "-n", str(script)]).returncode != 0:
            return f"bash: {script.name}"
    return "ok"


@pytest.mark.parametrize(("case", "make", "code", "names"), CASES, ids=[c[0] for c in CASES])
def test_damaged_summary_is_refused_naming_the_file_and_field(summary, tmp_path, case, make, code, names):
    assert _outcome(summary, tmp_path, make, code, names) == "ok"


def test_the_fuzz_has_enough_cases():
    assert len([c for c in CASES if c[2] == 2]) >= 43


HOSTILE_PATH = "/srv/weights dir/it's \"q\" $(touch PWNED) `touch PWNED`; touch PWNED & | > x *"


@pytest.mark.parametrize(("model_path", "code"), [
    ("a\nb", 2), ("a\x00b", 2), ("a\rb", 2), ("a\x1b[31mb", 2), ("tab\there", 2), ("a\u2028b", 2), ("", 2),
    ("-rf", 2), ("--trust-remote-code", 2), (HOSTILE_PATH, 0), ("./-weights", 0), ("模型/权重", 0),
])
def test_model_path_is_quoted_or_refused(summary, tmp_path, model_path, code):
    make = _edit(D)
    outcome = _outcome(summary, tmp_path, make, code, "--model-path", ("--model-path", model_path), names_file=False)
    assert outcome == "ok"
    if code == 0:
        for script in (tmp_path / "exports").glob("*.sh"):
            (line,) = [ln for ln in script.read_text().splitlines() if ln.startswith("DEFAULT_MODEL=")]
            assert shlex.split(line, comments=True) == [f"DEFAULT_MODEL={model_path}"], script.name


def test_a_symlinked_script_is_not_followed_outside_the_folder(summary, tmp_path):
    target = tmp_path / "elsewhere.sh"
    target.write_text("keep me\n")
    out = tmp_path / "out"
    out.mkdir()
    (out / "launch_vllm.sh").symlink_to(target)
    result = tmp_path / "result"
    _write_summary(result, _only(summary, A))
    for force in ((), ("--force",)):  # not dse's: refused, and with --force its name is one dse needs
        r = CliRunner().invoke(app, ["export", str(result), "--out", str(out), "--framework", "vllm", *force])
        assert r.exit_code == 2 and "launch_vllm.sh" in r.output, r.output
        assert target.read_text() == "keep me\n" and (out / "launch_vllm.sh").is_symlink()


def test_out_that_is_a_file_is_refused(summary, tmp_path):
    result = tmp_path / "result"
    _write_summary(result, _only(summary, A))
    (tmp_path / "plain").write_text("x")
    r = CliRunner().invoke(app, ["export", str(result), "--out", str(tmp_path / "plain")])
    assert r.exception is None or isinstance(r.exception, SystemExit)
    assert r.exit_code == 2 and "--out" in r.output, r.output
    assert (tmp_path / "plain").read_text() == "x"


# ---- storage URLs: no secret is ever shown ----------------------------------------------------------------
SPECIALS = ["p@ss", "p:ss", "p/ss", "p?ss", "p#ss", "p%ss", "p&ss", "p=ss", "p ss", "@:/?#%&= x", "pa@ss@word"]


def _secret_forms(secret: str) -> set[str]:
    from urllib.parse import quote, quote_plus

    return {secret, quote(secret, safe=""), quote_plus(secret)}


@pytest.mark.parametrize("secret", SPECIALS)
def test_raw_passwords_with_special_characters_are_masked(secret):
    url = f"postgresql://bob:{secret}@db.example:5432/sweeps"
    shown = mask_url(url)
    assert shown.startswith("postgresql://bob:***@") and shown.endswith("db.example:5432/sweeps"), shown
    host = secret.split("@", 1)[1] + "@db.example" if "@" in secret else "db.example"  # SQLAlchemy's host
    masked = mask_in(f'failed for {secret!r} at {url}; could not translate host name "{host}"', url)
    assert secret not in masked and secret not in shown, masked
    for piece in secret.split("@"):
        if len(piece) >= 3:
            assert piece not in masked and piece not in shown, (piece, masked)


@pytest.mark.parametrize("secret", SPECIALS)
def test_percent_encoded_and_query_passwords_are_masked(secret):
    from urllib.parse import quote

    enc = quote(secret, safe="")
    for url in (f"postgresql://bob:{enc}@h/db", f"postgresql://bob@h/db?password={enc}",
                f"postgresql://bob:{enc}@h/db?sslmode=require&PassWord={enc}&application_name=dse"):
        shown = mask_url(url)
        masked = mask_in(f"{url} said {secret} / {enc}", url)
        for form in _secret_forms(secret):
            assert form not in shown and form not in masked, (url, form, shown, masked)
        assert "bob" in shown and "/db" in shown


def test_every_password_like_query_parameter_is_masked():
    keys = ["password", "PASSWORD", "passwd", "pwd", "secret", "token", "sslpassword", "api_key", "ApiKey",
            "access_token", "client_secret", "auth_token"]
    for i, key in enumerate(keys):
        url = f"postgresql://u@h:5432/db?sslmode=require&{key}=val{i}xyz&application_name=dse"
        shown = mask_url(url)
        assert f"val{i}xyz" not in shown and f"{key}=***" in shown and "sslmode=require" in shown, shown
        assert mask_in(f"error val{i}xyz", url) == "error ***"


def test_both_secrets_at_once_and_urls_with_nothing_to_mask():
    url = "postgresql://u:p%40ss@ssw0rd@127.0.0.1:1/db?password=s3cret"
    shown = mask_url(url)
    assert shown == "postgresql://u:***@127.0.0.1:1/db?password=***", shown
    said = 'could not translate host name "ssw0rd@127.0.0.1" to address; password p@ss@ssw0rd; s3cret'
    masked = mask_in(said, url)
    assert not any(s in masked for s in ("ssw0rd", "p@ss", "p%40ss", "s3cret")), masked
    for plain in ("sqlite:////tmp/x.db", "sqlite:///rel/a@b.db", "postgresql://nobody@127.0.0.1:1/nodb",
                  "postgresql://h/db?sslmode=require"):
        assert mask_url(plain) == plain and mask_in(f"no {plain}", plain) == f"no {plain}"


def test_urls_that_do_not_parse_show_no_secret():
    for url in ("postgresql:/u:pw1234@h/db", "u:pw1234@h", "postgresql://u:pw1234@[::1/db", "::::@@@pw1234",
                "postgresql://u:pw1234@", "postgresql://:pw1234@h"):
        assert "pw1234" not in mask_url(url), url
        assert "pw1234" not in mask_in(f"error pw1234 in {url}", url), url
    assert mask_url("") == "" and mask_in("text", "") == "text"


def test_an_unreachable_postgresql_url_shows_neither_secret(tmp_path):
    """Through the real command: the driver fails to connect, and echoes what it parsed as the host."""
    study = Path(__file__).resolve().parent / "fixtures" / "small_sweep.yaml"
    url = "postgresql://u:p%40ss@ssw0rd@127.0.0.1:1/db?password=s3cret"
    r = dse("run", str(study), "--out", str(tmp_path / "o"), "--storage", url, cwd=tmp_path)
    assert r.returncode == 2 and "cannot open the storage" in r.stderr, r.stderr
    written = "".join(p.read_text(errors="replace") for p in tmp_path.rglob("*") if p.is_file())
    for secret in ("ssw0rd", "p%40ss", "p@ss", "s3cret"):
        assert secret not in r.stdout + r.stderr + written, (secret, r.stderr)


def test_an_export_leaves_the_study_rerunnable_and_carries_its_chunk(tmp_path, monkeypatch):
    """The real study: its best entries carry the workload's chunk_tokens, the scripts use it, the export goes to a
    folder of its own, and `dse run` on the same study still writes its results afterwards."""
    import dse as api

    study = copy.deepcopy(STUDY)
    study["workloads"][0]["chunk_tokens"] = 2048
    out = tmp_path / "results"
    api.run(study, out=out, plots=False)
    best = {e["workload"]: e for e in json.loads((out / "summary.json").read_text())["best"]}
    assert best["chat"]["chunk_tokens"] == 2048 and best["rag"]["chunk_tokens"] == 8192
    monkeypatch.chdir(tmp_path)
    r = CliRunner().invoke(app, ["export", str(out), "--workload", "chat", "--framework", "vllm"])
    assert r.exit_code == 0, r.output
    folder = tmp_path / "exports" / "export_fixture" / "llama-3.1-8b-chat"
    assert "--max-num-batched-tokens 2048" in (folder / "launch_vllm.sh").read_text()
    api.run(study, out=out, plots=False)  # the result folder holds only dse's files still
    assert (out / "summary.json").exists() and (folder / "launch_vllm.sh").exists()
