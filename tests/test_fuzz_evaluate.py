"""`dse evaluate` fuzzed: 300 argument sets, each a valid invocation with one or two options set to a hostile
value (negative, zero, NaN, infinity, 1e308, huge integers, a float where an integer goes, text, empty).

Every case runs in-process (CliRunner, `--json`) and must either exit 2 with a message naming the option, or
exit 0 or 3 with JSON whose every number is finite or null and physically sane (costs >= 0, times > 0 where
defined, `fits` a boolean). A value outside the option's stated range (`dse.physics.evaluate.WHOLE_FIELDS` and
`check_config`; written out again here) must be refused. No case may end in a traceback. The counts of the
last run are written to fuzz_evaluate_counts.json in pytest's base temporary folder (its path is printed:
`pytest -s` shows it).
"""

from __future__ import annotations

import json
import math
import random
import re
from collections import Counter

import pytest
from typer.testing import CliRunner

import dse
from dse.catalog.hardware import PRICE_KINDS, default_systems
from dse.catalog.models import default_models
from dse.cli import app
from dse.errors import InputError

RUNNER = CliRunner()
CASES = 300

BASES = (  # valid invocations: dense and MoE, step-level and request-level, decode and prefill
    ("--model", "llama-3.1-70b", "--system", "h100", "--tp", "8", "--batch", "64", "--context", "4096"),
    ("--model", "llama-3.1-70b", "--system", "h100", "--tp", "8", "--batch", "32", "--context", "2048",
     "--prompt", "1024", "--output", "256"),
    ("--model", "llama-3.1-8b", "--system", "h200", "--batch", "1", "--context", "8192", "--phase", "prefill"),
    ("--model", "mixtral-8x22b", "--system", "h200", "--tp", "8", "--ep", "8", "--batch", "128", "--context", "4096"),
    ("--model", "deepseek-v3", "--system", "gb200-nvl72", "--ep", "72", "--batch", "2048", "--context", "4096",
     "--weights-dtype", "fp8", "--kv-dtype", "fp8", "--prompt", "2000", "--output", "500"),
    ("--model", "gpt-oss-120b", "--system", "h100", "--tp", "2", "--batch", "16", "--context", "2048",
     "--weights-dtype", "fp8", "--prompt", "1500", "--output", "300", "--cached", "0.5"),
)

# the stated range of every option: (kind, low, high); kinds: int, float (checked as [low, high], with
# "open" marking an excluded end), choice (allowed values), id (catalog names)
MAX_CHIPS = 1_048_576
RANGES: dict[str, tuple] = {
    "batch": ("int", 1, 1_000_000_000), "context": ("int", 1, 100_000_000),
    "tp": ("int", 1, MAX_CHIPS), "ep": ("int", 1, MAX_CHIPS), "pp": ("int", 1, MAX_CHIPS),
    "dp": ("int", 1, MAX_CHIPS), "etp": ("int", 1, MAX_CHIPS), "chips": ("int", 1, MAX_CHIPS),
    "prompt": ("int", 1, 100_000_000), "output": ("int", 1, 10_000_000), "chunk": ("int", 1, 1_048_576),
    "draft": ("int", 0, 16), "micro-batches": ("int", 1, 2),
    "cached": ("float", 0.0, 1.0, "high open"), "accept": ("float", 1.0, 17.0, ""),
    "moe-imbalance": ("float", 1.0, 256.0, ""), "usd-per-chip-hour": ("float", 0.0, 1e6, "low open"),
    "phase": ("choice", ("decode", "prefill")), "weights-dtype": ("choice", ("bf16", "fp8", "fp4", "int4")),
    "experts-dtype": ("choice", ("bf16", "fp8", "fp4", "int4")), "kv-dtype": ("choice", ("bf16", "fp8", "fp4", "int4")),
    "kv-tier": ("choice", ("hbm", "host")), "kv-shard": ("choice", ("heads", "batch")),
    "price-kind": ("choice", PRICE_KINDS),
    "model": ("id",), "system": ("id",),
}
HOSTILE = ("-1", "0", "-0", "nan", "NaN", "inf", "-inf", "Infinity", "1e308", "-1e308", "1e18", str(10**18),
           str(10**30), str(2**63), "2.5", "0.5", "1e-300", "abc", "", " ", "1,000", "0x10", "1_000")
EDGES = {  # values at or near the ends of each range (valid or just outside)
    "int": ("1", "2", "3", "7", "1000000", "1000000000", "1000000001", "100000001", "10000001", "1048576",
            "1048577", "17", "16"),
    "float": ("0.999", "1", "1.0", "1.5", "2", "8", "17", "72", "73", "1000000", "1000001", "0.0001"),
    "choice": ("BF16", "fp8 ", "fp8", "fp4", "host", "hbm", "batch", "prefill", "rental_3yr", "tco_neocloud", "x"),
    "id": ("nope", "llama-3.1-8b", "h100", "a100", "tpu-v5e", "../x", "LLAMA-3.1-70B", "deepseek-v3"),
}
MODELS, SYSTEMS = default_models(), default_systems()


def in_range(option: str, value: str) -> bool | None:
    """Whether ``value`` lies in the option's stated range (None: a catalog name, checked by the catalog)."""
    kind, *spec = RANGES[option]
    if kind == "int":  # as Python reads a whole number ("1_000" is 1000)
        try:
            return spec[0] <= int(value) <= spec[1]
        except ValueError:
            return False
    if kind == "float":
        try:
            v = float(value)
        except ValueError:
            return False
        if not math.isfinite(v):
            return False
        low, high, ends = spec
        return (v > low if "low open" in ends else v >= low) and (v < high if "high open" in ends else v <= high)
    if kind == "choice":
        return value in spec[0]
    return None


def cases() -> list[tuple[tuple[str, ...], dict[str, str]]]:
    """300 (arguments, mutated options) pairs: every option mutated in turn, a second one at random."""
    rng = random.Random(0)
    options = sorted(RANGES)
    out = []
    for i in range(CASES):
        base = list(BASES[rng.randrange(len(BASES))])
        chosen = [options[i % len(options)]]
        if rng.random() < 0.4:
            chosen.append(rng.choice([o for o in options if o != chosen[0]]))
        mutated = {}
        for option in chosen:
            kind = RANGES[option][0]
            value = rng.choice(HOSTILE) if rng.random() < 0.7 else rng.choice(EDGES[kind])
            mutated[option] = value
            flag = f"--{option}"
            if flag in base:
                base[base.index(flag) + 1] = value
            else:
                base += [flag, value]
        out.append((tuple(base), mutated))
    return out


def walk(obj, key: str = ""):
    """Every (key, number) of a JSON value, lists attributed to their key."""
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from walk(v, k)
    elif isinstance(obj, list):
        for v in obj:
            yield from walk(v, key)
    elif isinstance(obj, (int, float)) and not isinstance(obj, bool):
        yield key, obj


def insanity(out: dict) -> list[str]:
    """What is physically wrong with one `dse evaluate --json` object (empty when nothing is)."""
    bad = []
    for key, v in walk(out):
        if not math.isfinite(v):
            bad.append(f"{key} = {v}")
        elif ("usd" in key or key.endswith("_s") or key.endswith("_s_band") or "bytes" in key or "tokens" in key
              or key.endswith("_w") or key in ("chips", "racks", "batch", "context", "prompt")) and v < 0:
            bad.append(f"{key} = {v} < 0")
    for key in ("step_s", "tpot_s", "ttft_s", "compute_s", "memory_s", "hbm_drain_s", "tokens_per_s"):
        if out.get(key) is not None and not out[key] > 0:
            bad.append(f"{key} = {out[key]} (must be > 0)")
    if not isinstance(out.get("fits"), bool):
        bad.append(f"fits = {out.get('fits')!r} (must be a boolean)")
    if not (isinstance(out.get("chips"), int) and out["chips"] >= 1):
        bad.append(f"chips = {out.get('chips')!r}")
    if out.get("output") is not None and out.get("usd_per_request") is None and out.get("usd_per_chip_hour"):
        bad.append("a priced request without usd_per_request")
    return bad


def judge(args: tuple[str, ...], mutated: dict[str, str], text: bool = False) -> str:
    """'ok', or the category of the failure: traceback, accepted (out of range, yet exit 0/3), unnamed (exit 2
    without naming an option it changed), insane (exit 0/3 with a bad number), exit N. With ``text``, the
    table printed without `--json` is checked for tracebacks too."""
    if text:
        r = RUNNER.invoke(app, ["evaluate", *args])
        if r.exception is not None and not isinstance(r.exception, SystemExit):
            return "traceback"
    r = RUNNER.invoke(app, ["evaluate", *args, "--json"])
    if r.exception is not None and not isinstance(r.exception, SystemExit):
        return "traceback"
    refused = [o for o, v in mutated.items() if in_range(o, v) is False
               or (o == "model" and v not in MODELS) or (o == "system" and v not in SYSTEMS)]
    if r.exit_code == 2:
        text = " ".join((r.stdout + r.stderr).split())
        named = any(f"--{o}" in text for o in mutated)
        return "ok" if named or not refused else "unnamed"
    if r.exit_code in (0, 3):
        if refused:
            return "accepted"
        try:
            out = json.loads(r.stdout)
        except json.JSONDecodeError:
            return "insane"
        return "insane" if insanity(out) else "ok"
    return f"exit {r.exit_code}"


def test_300_hostile_argument_sets(tmp_path_factory):
    """Each of 300 mutated invocations exits 2 naming the option, or gives sane JSON; 0 tracebacks (every
    fourth is also printed as a table)."""
    counts: Counter = Counter()
    failures = []
    for i, (args, mutated) in enumerate(cases()):
        verdict = judge(args, mutated, text=i % 4 == 0)
        counts[verdict] += 1
        if verdict != "ok":
            failures.append(f"{verdict}: {' '.join(repr(a) if not a or ' ' in a else a for a in args)}")
    path = tmp_path_factory.getbasetemp() / "fuzz_evaluate_counts.json"
    path.write_text(json.dumps(dict(counts), indent=1) + "\n")
    print(f"fuzz counts: {path}")
    assert sum(counts.values()) == CASES
    assert not failures, f"{len(failures)} of {CASES} cases failed:\n" + "\n".join(failures[:40])


@pytest.mark.parametrize(("option", "value", "message"), [
    ("--usd-per-chip-hour", "-1", "--usd-per-chip-hour: must be a positive finite number (USD per chip-hour)"),
    ("--usd-per-chip-hour", "nan", "--usd-per-chip-hour: must be a positive finite number"),
    ("--usd-per-chip-hour", "inf", "--usd-per-chip-hour: must be a positive finite number"),
    ("--output", "0", "--output: must be a whole number from 1 to 10,000,000"),
    ("--output", "-1", "--output: must be a whole number from 1"),
    ("--moe-imbalance", "1e308", "--moe-imbalance: llama-3.1-70b is dense (no experts), so it must be 1"),
    ("--batch", str(10**18), "--batch: must be a whole number from 1 to 1,000,000,000"),
    ("--context", str(10**18), "--context: must be a whole number from 1 to 100,000,000"),
    ("--chips", str(10**18), "--chips: must be a whole number from 1 to 1,048,576"),
    ("--cached", "1", "--cached: must be a share in [0, 1)"),
    ("--accept", "2", "--accept: must be a number from 1 to draft + 1 = 1"),
    ("--draft", "-1", "--draft: must be a whole number from 0 to 16"),
    ("--micro-batches", "3", "--micro-batches must be 1 (no overlap) or 2"),
    ("--price-kind", "cheap", "--price-kind: 'cheap' is not a price kind"),
])
def test_the_reported_holes_are_refused_naming_the_option(option, value, message):
    """The cases of the report (issue 27, item 12): each exits 2 with one line naming the option and its range."""
    args = ["evaluate", *BASES[1], "--json"]
    if option in args:
        args[args.index(option) + 1] = value
    else:
        args += [option, value]
    r = RUNNER.invoke(app, args)
    assert r.exit_code == 2 and isinstance(r.exception, SystemExit)
    assert message in " ".join(r.stderr.split()) and r.stdout == ""


ENDS = [  # (base, options): the highest and lowest allowed values, and combinations of them
    (0, {"batch": 10**9}), (0, {"context": 10**8, "allow-beyond-trained-context": True}),
    (1, {"prompt": 10**8, "output": 10**7, "allow-beyond-trained-context": True}),
    (1, {"prompt": 10**8, "output": 10**7, "context": 10**8, "allow-beyond-trained-context": True}),
    (1, {"chunk": 1}), (1, {"chunk": 1048576}), (1, {"draft": 16, "accept": 17}), (1, {"usd-per-chip-hour": 1e6}),
    (1, {"usd-per-chip-hour": 1e-9}), (0, {"dp": 131072}), (3, {"moe-imbalance": 8}), (1, {"cached": 0.999}),
    (1, {"batch": 10**9}), (1, {"batch": 1, "prompt": 1, "output": 1, "context": 1}),
    (0, {"phase": "prefill", "batch": 10**9, "context": 10**8, "allow-beyond-trained-context": True}),
    (3, {"batch": 10**9, "moe-imbalance": 8, "micro-batches": 2}), (1, {"price-kind": "tco_hyperscaler"}),
    (1, {"kv-tier": "host", "batch": 4096, "context": 100000}), (0, {"pp": 80, "batch": 1}),
]


@pytest.mark.parametrize(("base", "options"), ENDS)
def test_the_ends_of_every_range_give_sane_numbers(base, options):
    """At the ends of the allowed ranges nothing overflows: exit 0, or 3 where it does not fit, with sane JSON."""
    args = list(BASES[base])
    for option, value in options.items():
        if value is True:
            args.append(f"--{option}")
        elif f"--{option}" in args:
            args[args.index(f"--{option}") + 1] = str(value)
        else:
            args += [f"--{option}", str(value)]
    r = RUNNER.invoke(app, ["evaluate", *args, "--json"])
    assert r.exit_code in (0, 3) and (r.exception is None or isinstance(r.exception, SystemExit)), r.output
    assert not insanity(json.loads(r.stdout))


def test_a_layout_beyond_the_largest_replica_is_refused():
    r = RUNNER.invoke(app, ["evaluate", *BASES[0], "--dp", "131073", "--json"])  # 8 x 131,073 chips
    assert r.exit_code == 2 and "allowed: at most 1,048,576 chips per replica" in " ".join(r.stderr.split())


def test_moe_imbalance_is_bounded_by_the_expert_parallel_groups():
    """The most-loaded of EP groups carries at most every routed token: imbalance in [1, EP]."""
    base = ["evaluate", *BASES[3], "--json"]
    ok = RUNNER.invoke(app, [*base, "--moe-imbalance", "8"])
    assert ok.exit_code == 0, ok.stderr
    more = RUNNER.invoke(app, [*base, "--moe-imbalance", "1.25"])
    assert json.loads(more.stdout)["compute_s"] > json.loads(RUNNER.invoke(app, base).stdout)["compute_s"]
    r = RUNNER.invoke(app, [*base, "--moe-imbalance", "8.5"])
    assert r.exit_code == 2 and "--moe-imbalance: must be from 1 to EP = 8" in " ".join(r.stderr.split())


def test_the_python_api_checks_as_the_command_line_does():
    """`dse.evaluate` and `evaluate_frame` refuse what `dse evaluate` refuses, with the same message."""
    import pandas as pd

    base = dict(model="llama-3.1-70b", system="h100", batch=64, context=4096, tp=8)
    for extra, message in (({"usd_per_chip_hour": -1.0}, "--usd-per-chip-hour: must be a positive finite"),
                           ({"usd_per_chip_hour": float("nan")}, "--usd-per-chip-hour: must be a positive finite"),
                           ({"batch": 64.0}, "--batch: must be a whole number"),
                           ({"batch": True}, "--batch: must be a whole number"),
                           ({"context": "4096"}, "--context: must be a whole number"),
                           ({"cached": float("inf")}, "--cached: must be a share"),
                           ({"weight_only": "yes"}, "--weight-only: must be true or false"),
                           ({"phase": 1}, "--phase: must be a name (text)"),
                           ({"prompt": 100, "output": 0}, "--output: must be a whole number")):
        with pytest.raises(InputError, match=re.escape(message)):
            dse.evaluate(**{**base, **extra})
    frame = pd.DataFrame([{**base, "usd_per_chip_hour": 2.0}, {**base, "usd_per_chip_hour": -2.0}])
    with pytest.raises(InputError, match=re.escape("row 1: --usd-per-chip-hour: must be a positive finite")):
        dse.evaluate_frame(frame)
    frame = pd.DataFrame([{**base, "prompt": 1000, "output": 100}, {**base, "prompt": None, "output": None}])
    assert dse.evaluate_frame(frame)["step_s"].notna().all()  # output read back as a whole number


def test_documented_results_still_hold():
    """The README's example and the layout rule of DESIGN.md give their documented numbers."""
    r = RUNNER.invoke(app, ["evaluate", "--model", "llama-3.1-70b", "--system", "h100", "--tp", "8", "--batch", "64",
                            "--context", "4096", "--ideal", "--json"])
    out = json.loads(r.stdout)
    assert r.exit_code == 0 and out["bound"] == "memory" and out["chips"] == 8
    assert f"{out['step_s'] * 1e3:.2f}" == "8.39" and f"{out['compute_s'] * 1e3:.2f}" == "1.21"
    assert f"{out['comm_s'] * 1e6:.0f}" == "652"
    text = RUNNER.invoke(app, ["evaluate", "--model", "llama-3.1-70b", "--system", "h100", "--tp", "8", "--batch",
                               "64", "--context", "4096", "--ideal"])
    assert text.exit_code == 0 and "8.39 ms" in text.stdout
    wide = json.loads(RUNNER.invoke(app, ["evaluate", "--model", "deepseek-v3", "--system", "gb200-nvl72", "--ep",
                                          "72", "--batch", "2048", "--context", "4096", "--json"]).stdout)
    assert (wide["chips"], wide["ep"], wide["dp"], wide["tp"]) == (72, 72, 72, 1)
    req = RUNNER.invoke(app, ["evaluate", *BASES[1], "--json"])
    out = json.loads(req.stdout)
    assert req.exit_code == 0 and out["serving"] == "aggregated" and out["usd_per_request"] > 0
    assert out["ttft_s"] > 0 and out["tpot_s"] > 0 and not insanity(out)
    priced = json.loads(RUNNER.invoke(app, ["evaluate", *BASES[0], "--usd-per-chip-hour", "2", "--json"]).stdout)
    assert priced["usd_per_chip_hour"] == pytest.approx(2.0) and priced["usd_per_mtok"] > 0
    no = RUNNER.invoke(app, ["evaluate", *BASES[0], "--output", "10", "--json"])
    assert no.exit_code == 2 and "--output needs --prompt" in no.stderr
