"""The `dse` command line: evaluate one configuration and list the catalogs.

Exit codes: 0 success, 2 bad input (one message naming the file or option, the field and what is
allowed), 3 infeasible, 1 anything else.

This module alone goes without ``from __future__ import annotations``: typer reads every command's signature at
each start, and string annotations cost it an ``eval`` (and a compile) each, some 0.01-0.02 s of a short question.
"""

import ctypes
import gc
import json
import math
import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from enum import Enum
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from dse.catalog.price_kinds import DEFAULT_PRICE_KIND, PRICE_KINDS
from dse.catalog.units import DTYPES, si
from dse.errors import InfeasibleError, InputError, SolverLimitError
from dse.physics.codes import DEFAULT_CHUNK, KV_SHARDS, KV_TIERS, PHASES

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="Find the cheapest and fastest ways to serve and train large language models.",
    pretty_exceptions_enable=False,
)
catalog_app = typer.Typer(no_args_is_help=True, help="List the hardware and model catalogs.")
app.add_typer(catalog_app, name="catalog")



def _version(value: bool) -> None:
    if value:
        from dse import __version__

        typer.echo(f"dse {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True,
                                          help="Print the version and exit.")] = False,
) -> None:
    """Find the cheapest and fastest ways to serve and train large language models."""


Phase = Enum("Phase", {p: p for p in PHASES}, type=str)
Dtype = Enum("Dtype", {d: d for d in DTYPES}, type=str)
Tier = Enum("Tier", {t: t for t in KV_TIERS}, type=str)
KvShard = Enum("KvShard", {t: t for t in KV_SHARDS}, type=str)


@contextmanager
def native_stdout_to_stderr() -> Iterator[None]:
    """Send what native libraries (solver logs) write to file descriptor 1 to stderr while the block runs,
    so that stdout carries only the command's own output (``--json`` parses).
    """
    sys.stdout.flush()
    saved = os.dup(1)
    os.dup2(2, 1)
    try:
        yield
    finally:
        sys.stdout.flush()
        try:  # flush C stdio buffers while they still point at stderr
            ctypes.CDLL(None).fflush(None)
        except (OSError, AttributeError):  # pragma: no cover - no C library to ask
            pass
        os.dup2(saved, 1)
        os.close(saved)


def _fail(exc: Exception) -> None:
    Console(stderr=True).print(f"[bold red]error:[/] {escape(str(exc))}", highlight=False, soft_wrap=True)
    raise typer.Exit(getattr(exc, "exit_code", 1))


def _si(value: float | None, unit: str) -> str:
    """A figure as the terminal shows it: 3 significant digits, an SI prefix, plain ASCII."""
    return si(value, unit, micro="u", missing="-")


@app.command()
def evaluate(
    model: Annotated[str, typer.Option(help="Model id (see `dse catalog models`).")],
    system: Annotated[str, typer.Option(help="System id (see `dse catalog hardware`).")],
    batch: Annotated[int, typer.Option(help="Sequences per forward pass (per pipeline micro-batch).")],
    context: Annotated[int, typer.Option(help="KV length in decode; prompt length in prefill (tokens).")],
    tp: Annotated[int | None, typer.Option(help="Attention tensor parallelism.")] = None,
    ep: Annotated[int | None, typer.Option(help="Expert parallelism.")] = None,
    pp: Annotated[int | None, typer.Option(help="Pipeline stages.")] = None,
    dp: Annotated[int | None, typer.Option(help="Attention data parallelism (default: fills the stage).")] = None,
    etp: Annotated[int | None, typer.Option(help="Expert tensor parallelism (default: fills the stage).")] = None,
    chips: Annotated[int | None, typer.Option(help="Total chips of the replica.")] = None,
    prompt: Annotated[int | None, typer.Option(help="Prompt length for TTFT (default: the context).")] = None,
    output: Annotated[int | None, typer.Option(
        help="Output tokens per request: adds the request-level metrics of an aggregated replica at "
             "concurrency --batch (needs --prompt).")] = None,
    chunk: Annotated[int, typer.Option(help="Chunked-prefill budget, tokens per DP rank per pass.")] = DEFAULT_CHUNK,
    cached: Annotated[float, typer.Option(help="Share of the prompt served from a prefix cache.")] = 0.0,
    draft: Annotated[int, typer.Option(help="Speculative draft tokens verified per decode pass.")] = 0,
    accept: Annotated[float, typer.Option(help="Mean tokens emitted per decode pass (speculation).")] = 1.0,
    moe_imbalance: Annotated[float, typer.Option(help="Most-loaded GPU's expert tokens over the mean.")] = 1.0,
    phase: Annotated[Phase, typer.Option(help="decode or prefill.")] = Phase.decode,
    weights_dtype: Annotated[Dtype, typer.Option("--weights-dtype", help="Weight format.")] = Dtype.bf16,
    experts_dtype: Annotated[Dtype | None, typer.Option("--experts-dtype",
                                                        help="Routed-expert format (default: the weights').")] = None,
    weight_only: Annotated[bool, typer.Option("--weight-only", help="Allow weight formats without tensor units "
                                              "(stored narrow, dequantized; costs group scales and the wider rate).")
                           ] = False,
    kv_dtype: Annotated[Dtype, typer.Option("--kv-dtype", help="KV-cache format.")] = Dtype.bf16,
    kv_tier: Annotated[Tier, typer.Option("--kv-tier", help="Where live KV is read from.")] = Tier.hbm,
    kv_shard: Annotated[KvShard, typer.Option(
        "--kv-shard", help="How TP ranks split the KV cache: by head (every serving framework), or by sequence "
                           "(Pope et al.: no copy of MQA/MLA KV per rank, two all-to-alls per layer).")
    ] = KvShard.heads,
    micro_batches: Annotated[int, typer.Option(
        "--micro-batches", help="Decode micro-batches per pass: 2 overlaps one's communication with the other's "
                                "compute (two-batch overlap; each re-reads the weights).")] = 1,
    ideal: Annotated[bool, typer.Option("--ideal", help="Every efficiency 1, communication overlapped.")] = False,
    price_kind: Annotated[str, typer.Option(
        "--price-kind", help=f"Price kind: {', '.join(PRICE_KINDS[:-1])} or {PRICE_KINDS[-1]}.")] = DEFAULT_PRICE_KIND,
    usd_per_chip_hour: Annotated[float | None, typer.Option("--usd-per-chip-hour",
                                                            help="Your own price (replaces the catalog's).")] = None,
    allow_beyond_trained_context: Annotated[bool, typer.Option(
        "--allow-beyond-trained-context", help="Accept a context beyond the model's published window (flagged).")
    ] = False,
    framework: Annotated[str | None, typer.Option(
        help="Serving framework: vllm, sglang or trtllm (NVIDIA only); its memory reservation and serving stack's "
             "latency (default: the system's vendor default, vLLM).")] = None,
    mem_fraction: Annotated[float | None, typer.Option(
        "--mem-fraction", help="The framework's memory fraction (vLLM gpu_memory_utilization, SGLang "
                               "mem_fraction_static, TensorRT-LLM free_gpu_memory_fraction; default: its own).")
    ] = None,
    arrival: Annotated[str, typer.Option(
        help="With --output: poisson (open loop, production traffic) or concurrency (a closed loop of --batch "
             "requests in flight per micro-batch, as a benchmark at that concurrency).")] = "poisson",
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
) -> None:
    """Roofline step time, throughput, cost and memory of one serving configuration."""
    from dse.physics.evaluate import Config, evaluate_config

    try:  # Config checks every option against its range (dse.physics.evaluate.check_config)
        cfg = Config(
            model=model, system=system, batch=batch, context=context, tp=tp, ep=ep, pp=pp, dp=dp, etp=etp,
            chips=chips, phase=phase.value, weights_dtype=weights_dtype.value, kv_dtype=kv_dtype.value,
            kv_tier=kv_tier.value, kv_shard=kv_shard.value, micro_batches=micro_batches, prompt=prompt,
            moe_imbalance=moe_imbalance, output=output, chunk=chunk, cached=cached, draft=draft, accept=accept,
            experts_dtype=experts_dtype.value if experts_dtype else None, weight_only=weight_only,
            price_kind=price_kind, usd_per_chip_hour=usd_per_chip_hour,
            allow_beyond_trained_context=allow_beyond_trained_context, framework=framework,
            mem_fraction=mem_fraction, arrival=arrival,
        )
        result = evaluate_config(cfg, ideal=ideal)
    except (InputError, InfeasibleError) as exc:
        _fail(exc)
    if as_json:
        typer.echo(json.dumps(_finite(result), indent=2))
    else:
        _print_evaluation(result)
    if not result["fits"]:
        need, usable = result["hbm_bytes_per_chip"], result["hbm_usable_per_chip"]
        where = f"at context {result['context']}"
        if result.get("fits_request") is False and need <= usable:  # the step fits; the request's peak does not
            need = result["hbm_bytes_per_chip_request"]
            where = f"at the request's peak context {result['prompt'] + result['output']}"
        if result["kv_tier"] == "host" and need <= usable:
            why = "host memory capacity runs out: the KV cache does not fit in the host memory of the chips"
        else:
            reserve = ("the reserve of " + result["framework"]) if result["framework"] else "nothing reserved"
            why = (f"HBM capacity runs out {where}: {_si(need, 'B')} per chip needed (weights, KV, activations) "
                   f"against {_si(usable, 'B')} usable ({_si(result['device_memory_per_chip'], 'B')} of device "
                   f"memory less {reserve}), short by {_si(need - usable, 'B')}")
        Console(stderr=True).print(f"[bold red]does not fit:[/] {escape(why)}", highlight=False, soft_wrap=True)
        raise typer.Exit(3)


def _finite(obj):
    """NaN and infinity as null, so that `--json` output is standard JSON."""
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_finite(v) for v in obj]
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    return obj


def _print_evaluation(r: dict) -> None:
    console = Console()
    title = (
        f"{r['model']} on {r['chips']} x {r['system']} ({r['racks']} domain{'s' if r['racks'] > 1 else ''}), "
        f"TP{r['tp']} DP{r['dp']} EP{r['ep']} ETP{r['etp']} PP{r['pp']}, {r['phase']}, batch {r['batch']}, "
        f"context {r['context']}, weights {r['weights_dtype']} (compute {r['compute_dtype']}), experts "
        f"{r['experts_dtype']} (compute {r['experts_compute_dtype']}), attention {r['attention_dtype']}, "
        f"KV {r['kv_dtype']} in {r['kv_tier']}{', split by sequence over TP' if r['kv_shard'] == 'batch' else ''}"
        f"{', two-batch overlap' if r['micro_batches'] == 2 else ''}"
        f"{', ideal' if r['ideal'] else ''}"
        f"{', BEYOND THE TRAINED CONTEXT' if r['beyond_trained_context'] else ''}"
    )
    t = Table(title=title, title_justify="left", show_header=True, header_style="bold")
    t.add_column("quantity")
    t.add_column("value", justify="right")
    t.add_column("note")
    comm = f"TP {_si(r['tp_comm_s'], 's')}, EP {_si(r['ep_comm_s'], 's')}, PP {_si(r['pp_comm_s'], 's')}"
    fits = "fits" if r["fits"] else "DOES NOT FIT"
    cap = _si(r["device_memory_per_chip"], "B")  # as the device reports it
    usable = (f"{_si(r['hbm_usable_per_chip'], 'B')} usable of {cap}" if r["hbm_usable_per_chip"] < r[
        "device_memory_per_chip"] else f"of {cap}") + (f" as {r['framework']} reserves it" if r["framework"] else "")
    crossover = "-" if r["kv_crossover_context"] is None else f"{r['kv_crossover_context']:.0f}"
    band_t = band_c = ""
    if r.get("tokens_per_s_band"):
        lo, hi = r["tokens_per_s_band"]
        band_t = f"; 80% band {_si(lo, 'tok/s')} - {_si(hi, 'tok/s')}"
        if r.get("usd_per_mtok_band"):
            lo, hi = r["usd_per_mtok_band"]
            band_c = f"; 80% band {lo:.3g} - {hi:.3g}"
    rows = [
        ("compute", _si(r["compute_s"], "s"), "weights 2 x active params + attention FLOPs"),
        ("memory", _si(r["memory_s"], "s"), "weight + KV bytes over HBM bandwidth"),
        ("communication", _si(r["comm_s"], "s"), comm),
        ("step (TPOT)" if r["phase"] == "decode" else "step (TTFT)", _si(r["step_s"], "s"), f"bound: {r['bound']}"),
        ("TTFT", _si(r["ttft_s"], "s"), f"prefill of one {r['prompt']}-token prompt"),
        ("throughput", _si(r["tokens_per_s"], "tok/s"), f"{r['sequences_in_flight']} sequences in flight{band_t}"),
        ("cost", "no price" if r["usd_per_mtok"] is None else f"{r['usd_per_mtok']:.4g} USD/Mtok",
         (f"no {r['price_kind']} price for {r['system']}" if r["usd_per_chip_hour"] is None else
          f"{r['chips']} chips at {r['usd_per_chip_hour']:.2f} USD/chip-h ({r['price_kind']}"
          f"{', ESTIMATE' if r['price_is_estimate'] else ''}){band_c}")),
        ("power", _si(r["power_w"], "W"), "chips x all-in power per chip" if r["power_w"] is not None
         else "no all-in power figure in the catalog"),
        ("energy", "-" if r["joules_per_token"] is None else f"{r['joules_per_token']:.3g} J/token", ""),
        ("weights per chip", _si(r["weights_bytes_per_chip"], "B"), ""),
        ("KV per chip", _si(r["kv_bytes_per_chip"], "B"), f"{_si(r['kv_bytes_per_token'], 'B')} per token of context"),
        ("HBM used per chip", _si(r["hbm_bytes_per_chip"], "B"), f"at context {r['context']}; {usable}: {fits}"),
        ("balance batch", f"{r['balance_batch']:.0f}", "compute time = weight-fetch time"),
        ("HBM drain time", _si(r["hbm_drain_s"], "s"), "HBM capacity / bandwidth"),
        ("KV crossover context", crossover, "KV fetch time = compute time"),
        ("params", f"{r['params_total'] / 1e9:.1f}B total, {r['params_active'] / 1e9:.1f}B active", ""),
    ]
    if r.get("serving"):
        def band(key: str, unit: str) -> str:
            b = r.get(f"{key}_band")
            return f"; 80% band {_si(b[0], unit)} - {_si(b[1], unit)}" if b else ""

        rows[3] = ("step (decode)", _si(r["step_s"], "s"), f"bound: {r['bound']}; decode step alone")
        queue = "M/D/1, Poisson arrivals" if r["arrival"] == "poisson" else "closed loop's wave"
        stack = f" + {_si(r['stack_latency_s'], 's')} {r['framework']} stack" if r["framework"] else ""
        rows[4] = ("TTFT", _si(r["ttft_s"], "s"), f"wait {_si(r['queue_wait_s'], 's')} ({queue}) + "
                   f"{_si(r['prefill_service_s'], 's')} chunked prefill of {r['prompt']} tokens{stack}"
                   f"{band('ttft_s', 's')}")
        rows[5:5] = [
            ("TTFT p50 / p90 / p99", " / ".join(_si(r[f"ttft_{p}_s"], "s") for p in ("p50", "p90", "p99")),
             "quantiles over requests"),
            ("TPOT", _si(r["tpot_s"], "s"), f"with prefill interference ({_si(r['chunk_extra_s'], 's')} per chunk)"
             f"{band('tpot_s', 's')}"),
            ("TPOT p50 / p90 / p99", " / ".join(_si(r[f"tpot_{p}_s"], "s") for p in ("p50", "p90", "p99")),
             "quantiles over requests (the chunks a request's decode meets)"),
            ("request throughput", _si(r["requests_per_s"], "req/s"),
             f"{r['tokens_per_s_per_gpu']:.4g} output tok/s per GPU, {r['tokens_per_s_per_user']:.4g} per user"),
            ("cost per request", f"{r['usd_per_request']:.4g} USD",
             f"input {r['usd_per_mtok_input']:.4g}, output {r['usd_per_mtok_output']:.4g}, blended "
             f"{r['usd_per_mtok_blended']:.4g} USD/Mtok; prefill {r['prefill_share']:.0%} of cost"
             + (f"; 80% band {r['usd_per_request_band'][0]:.4g} - {r['usd_per_request_band'][1]:.4g}"
                if r.get("usd_per_request_band") else "")),
        ]
        # the step's own throughput and cost per output token: the decode step alone, at the batch in flight
        for i, (name, value, note) in enumerate(rows):
            if name in ("throughput", "cost"):
                rows[i] = (f"decode step {name}", value, note)
        peak = r["prompt"] + r["output"]
        rows.insert(next(i for i, row in enumerate(rows) if row[0] == "HBM used per chip") + 1,
                    ("HBM at the request's peak", _si(r["hbm_bytes_per_chip_request"], "B"),
                     f"at context {peak} (prompt + output); {usable}: "
                     f"{'fits' if r['fits_request'] else 'DOES NOT FIT'}"))
    for row in rows:
        t.add_row(*row)
    console.print(t)


@app.command()
def run(
    study: Annotated[Path, typer.Argument(help="Study file (YAML).")],
    out: Annotated[Path | None, typer.Option(help="Output folder (default: results/<study>/).")] = None,
    storage: Annotated[str | None, typer.Option(help="Optuna storage URL of a sweep (default: SQLite in out).")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print summary.json instead of the table.")] = False,
    force: Annotated[bool, typer.Option("--force", help="Write into a folder holding other files (dse replaces "
                                        "only its own files there).")] = False,
    no_plots: Annotated[bool, typer.Option("--no-plots", help="Draw no PNG figures (scripted use: faster, no "
                                           "matplotlib); the same answers in summary.json and the CSVs, and "
                                           "report.html says the figures were skipped.")] = False,
) -> None:
    """Run a study: solve it, then write summary.json, CSVs, PNG plots (unless --no-plots) and report.html."""
    from dse import run_study
    from dse.studies.base import load_study

    err = Console(stderr=True)
    try:
        spec = load_study(study)
        _started()
        target = out or Path("results") / spec.study
        with native_stdout_to_stderr(), _progress_bar(err, spec.study) as progress:
            result = run_study(spec, out=target, storage=storage, progress=progress, where=str(study), force=force,
                               plots=not no_plots)
    except (InputError, SolverLimitError) as exc:
        _fail(exc)
    summary = result.summary
    if as_json:
        typer.echo((target / "summary.json").read_text())
    else:
        _print_study(summary, result.tables, target, result.files)
    if summary["status"] == "infeasible":
        for item in summary["infeasible"]:
            err.print(f"[bold red]infeasible:[/] {escape(item['reason'])}", highlight=False, soft_wrap=True)
        raise typer.Exit(3)


@contextmanager
def _progress_bar(err: Console, name: str) -> Iterator[Callable[..., None] | None]:
    """The progress callback of a run, drawn as a transient bar on ``err`` where it is a terminal; None elsewhere
    (a bar on a file or a pipe shows nothing: the bar, its library and its refresh thread are not made).
    """
    if not err.is_terminal:
        yield None
        return
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        SpinnerColumn,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    bar = Progress(SpinnerColumn(), TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                   TimeElapsedColumn(), TextColumn("left"), TimeRemainingColumn(), console=err, transient=True)
    with bar:
        task = bar.add_task(f"{name}: building and solving", total=None)

        def progress(what: str, done: int | None = None, total: int | None = None) -> None:
            bar.update(task, description=f"{name}: {what}", total=total,
                       **({"completed": done} if done is not None else {}))

        yield progress


@app.command()
def worker(
    study: Annotated[Path, typer.Argument(help="Study file (YAML) of a sweep or tornado study.")],
    storage: Annotated[str, typer.Option(help="Optuna storage URL shared with `dse run`.")],
) -> None:
    """Join a distributed sweep: solve its waiting points until none are left."""
    from dse.studies.base import load_study
    from dse.studies.optuna_sweep import run_sweep
    from dse.studies.registry import kinds_with, study_module

    err = Console(stderr=True)
    try:
        spec = load_study(study)
        if not study_module(spec.kind).WORKERS:
            raise InputError(f"{study}: `dse worker` joins {kinds_with('WORKERS')} studies; this is a "
                             f"{spec.kind} study")
        with native_stdout_to_stderr():
            _, _, solved = run_sweep(spec, storage, create=False)
    except InputError as exc:
        _fail(exc)
    err.print(f"worker solved {solved} points")


def _solver_line(summary: dict) -> str:
    """What was solved: the status, the solves done now (a resumed sweep says how many points it took from its
    storage), their time, the run's wall time and the gap.
    """
    solver = summary["solver"]
    if "points_solved_here" in summary:
        here, total = summary["points_solved_here"], summary["points"]
        done = (f"{total:,} points: {here:,} solved now, {total - here:,} resumed from the sweep's storage; "
                f"the points' solves took {solver['solve_wall_s']:.3f} s")
    else:
        done = f"{solver['solves']} solves in {solver['solve_wall_s']:.3f} s"
    return (f"[bold]{escape(summary['study'])}[/] ({summary['kind']}): {summary['status']}, {done} (this run "
            f"{solver['wall_s']:.2f} s), gap {solver['gap']:.2g}"
            + (", TIME-LIMITED: the answer depends on this machine's speed (not reproducible)"
               if solver.get("time_limited") else ""))


SUMMARY_COLUMNS = ("model / workload", "mode", "GPUs", "USD/request", "USD/Mtok in", "USD/Mtok out", "TTFT", "TPOT",
                   "tok/s/GPU", "tok/s/user")


def _print_study(summary: dict, tables: dict, target: Path, files: list[str]) -> None:
    """The answer first: the kind's headline lines, then each deployment as an operator reads it
    (`dse.report.present.answer_lines`), whether it is decided and its alternatives; fits the terminal width (a
    table of the answers and of the alternatives from 120 columns, lines below). Text is printed as it is: no
    ``:name:`` in it is read as an emoji code (nor is rich's table of them loaded).
    """
    from dse.report.present import (
        ALTERNATIVE_COLUMNS,
        alternative_rows,
        alternatives_title,
        answer_lines,
        decision_text,
    )
    from dse.studies.contract import Frames
    from dse.studies.registry import study_module

    console = Console(emoji=False)
    console.print(_solver_line(summary), highlight=False)
    headline = getattr(study_module(summary["kind"]), "headline", None)
    for line in headline(summary, Frames(tables)) if headline else []:
        console.print(escape(line), highlight=False)
    wide = console.width >= 120
    best = summary["best"]
    if best and wide and len(best) > 1:
        t = Table(header_style="bold")
        for col in SUMMARY_COLUMNS:
            t.add_column(col, justify="left" if col in ("model / workload", "mode") else "right")
        for e in best:
            gpus = sum(p["replicas"] * p["chips"] for p in e["pools"])  # what the answer line adds up
            t.add_row(f"{e['model']} / {e['workload']}", e["serving"], f"{gpus:,}",
                      f"{e['usd_per_request']:.4g}", f"{e['usd_per_mtok_input']:.4g}",
                      f"{e['usd_per_mtok_output']:.4g}", _si(e["ttft_s"], "s"), _si(e["tpot_s"], "s"),
                      f"{e['tokens_per_s_per_gpu']:,.4g}", f"{e['tokens_per_s_per_user']:,.3g}")
        console.print(t)
    for e in best:
        first, *rest = answer_lines(e, micro="u")
        console.print(f"[bold]{escape(first)}[/]", highlight=False)
        for line in rest:
            console.print(f"  {escape(line)}", highlight=False)
        decided = decision_text(e)
        if decided:
            console.print(f"  {escape(decided)}", highlight=False)
        alts = alternative_rows(e, micro="u")
        if not alts:
            continue
        if wide:
            t = Table(title=f"  {alternatives_title(e)}", title_justify="left",
                      header_style="bold", box=None, padding=(0, 1))
            for col in ALTERNATIVE_COLUMNS:
                t.add_column(col, justify="left" if col in ("mode", "deployment") else "right",
                             overflow="fold")
            for a in alts:
                t.add_row(*(a[c] for c in ALTERNATIVE_COLUMNS))
            console.print(t)
        else:
            console.print(f"  {alternatives_title(e)}", highlight=False)
            for a in alts:
                console.print(f"  - {a['mode']}, {escape(a['deployment'])}", highlight=False)
                console.print(f"    {a['USD/request']} USD/request, TTFT {a['TTFT']}, TPOT {a['TPOT']}, "
                              f"{a['tok/s/GPU']} tok/s/GPU", highlight=False)
    if "price_kind" in summary:
        estimates = sorted({e["system"] for e in best if e.get("price_is_estimate")})
        console.print(f"prices: {_price_kinds(summary['price_kind'])}"
                      + (f"; ESTIMATED price for {', '.join(estimates)}" if estimates else "")
                      + f"; no price (left out): {', '.join(summary.get('no_price') or []) or 'none'}",
                      highlight=False)
    console.print(f"wrote {', '.join(files)} to {target}/", highlight=False)


def _price_kinds(kind: str | dict) -> str:
    """A study's price kind, or its kinds by role (``reserved: rental_3yr, hourly: on_demand``)."""
    return kind if isinstance(kind, str) else ", ".join(f"{role}: {k}" for role, k in kind.items())


RUNS_SUFFIXES = (".csv", ".json", ".jsonl")
"""Files `dse validate --cases` reads as measured runs: CSVs in the measured-runs columns, benchmark results."""


@app.command()
def validate(
    cases: Annotated[list[Path] | None, typer.Option(
        help="Cases file (default: hw_catalog/calibration/cases.yaml); or measured runs: CSVs in the measured-runs "
        "columns and JSON results of a dse export benchmark script, each option one file, several read as one."
        )] = None,
    fit: Annotated[bool, typer.Option("--fit", help="Refit the efficiencies (leave-one-out too) and the serving "
                                      "stacks' terms; store them, then the error bands.")] = False,
    bands: Annotated[bool, typer.Option("--bands", help="Recompute the error bands of the predictions from the stored "
                                        "fit and the measured serving runs; store them (calibration/fitted.yaml)."
                                        )] = False,
    fit_training: Annotated[bool, typer.Option("--fit-training", help="Refit the training factors alone on the "
                                               "training runs (leave-one-out too); store them "
                                               "(training_efficiency.yaml, calibration/training_fitted.yaml)."
                                               )] = False,
    out: Annotated[Path | None, typer.Option(help="Report folder (default: results/validate/).")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
    no_cache: Annotated[bool, typer.Option("--no-cache", help="Cross-validate measured runs anew, neither reading "
                                           "nor keeping a result (nor a parsed file) in the cache "
                                           "($DSE_CACHE_DIR, else ~/.cache/dse; keyed by the runs, catalogs and "
                                           "dse's source).")] = False,
    no_plots: Annotated[bool, typer.Option("--no-plots", help="Measured runs: draw no scatter PNGs (scripted use: "
                                           "faster, no matplotlib).")] = False,
) -> None:
    """Predictions against published measurements: error per case and by category."""
    import datetime

    from dse import validate as v
    from dse.catalog.calibration import clear_cache as clear_calibration_cache
    from dse.catalog.hardware import default_efficiency, default_efficiency_catalog, hw_dir
    from dse.validate.runs import catalog_runs_files

    err = Console(stderr=True)
    runs_files = [c for c in cases or [] if c.suffix.lower() in RUNS_SUFFIXES]
    if runs_files:
        if len(runs_files) < len(cases):
            _fail(InputError(f"{', '.join(str(c) for c in cases)}: --cases takes one YAML cases file, or files of "
                             f"measured runs ({', '.join(RUNS_SUFFIXES)}; several read as one), not both"))
        if bands:
            _fail(InputError(f"{cases[0]}: --bands recomputes the bands from the catalog's cases and its measured "
                             "runs (hw_catalog/calibration/published/*.csv); drop --cases"))
        from dse.catalog.cache import disabled

        with disabled() if no_cache else nullcontext():  # nothing read from or kept in the cache, parsed files too
            _validate_runs(runs_files, fit, out, as_json, not no_cache, not no_plots)
        return
    if cases and len(cases) > 1:
        _fail(InputError(f"{', '.join(str(c) for c in cases)}: --cases takes one YAML cases file"))
    cases = cases[0] if cases else None
    try:
        loaded = v.load_cases(cases)
        if fit:
            runs_files = catalog_runs_files()
            if runs_files:  # the stack's terms first: the runs' request level (and so the joint fit) uses them
                _store_stack(runs_files, err)
            with err.status("fitting the efficiencies, then leaving each point out") as status:
                cal = v.calibrate(loaded, default_efficiency(), loo=True,
                                  progress=lambda i, n: status.update(f"leave-one-out {i + 1}/{n}"),
                                  stored=default_efficiency_catalog().families,
                                  serving_file=runs_files or None,
                                  serving_name=", ".join(str(f.relative_to(hw_dir())) for f in runs_files),
                                  refit_stack=lambda factors: _store_stack(runs_files, err, factors))
            v.write_calibration(cal, str(cases or v.cases_path()), hw_dir(), datetime.date.today().isoformat())
            for fam, r in cal.runs.items():
                if r["fixed_point_largest_move"] > v.FIXED_POINT_TOL:
                    err.print(f"[bold yellow]warning:[/] the joint fit of {fam} stopped after "
                              f"{r['fixed_point_rounds']} rounds with a factor still moving by "
                              f"{r['fixed_point_largest_move']:.2%} per round", highlight=False)
            default_efficiency_catalog.cache_clear()
            clear_calibration_cache()
        if fit or bands:
            _store_bands(loaded, err)
            clear_calibration_cache()
        if fit or fit_training:
            _store_training_fit(err, datetime.date.today().isoformat())
        # a cases file of one's own is validated alone; the catalog's cases come with the catalog's training runs
        report = v.run_validation(loaded, use_stored_loo=cases is None or fit or fit_training,
                                  training=None if cases is None else [])
        if report.table.empty:
            raise InputError(f"{cases or v.cases_path()}: no case can be predicted ({len(loaded.skipped)} skipped)")
        target = out or Path("results") / "validate"
        v.write_validation_report(report, target)
    except InputError as exc:
        _fail(exc)
    if as_json:
        typer.echo(json.dumps(report.as_dict(), indent=2))
        return
    _print_validation(report, target)


def _store_stack(runs_files: list[Path], err: Console, factors=None) -> None:
    """The serving stack's terms per framework, mode and model fitted on the measured runs at ``factors`` (default:
    the catalog's), written into calibration/serving_stack.yaml (`dse.validate.stack`).
    """
    import datetime

    from dse.catalog.frameworks import clear_cache
    from dse.catalog.hardware import hw_dir
    from dse.validate.stack import fit_stack_files, write_stack

    if factors is None:
        with err.status("the serving stacks' latency and queue share, fitted on the measured runs' TTFT"):
            fits, _ = fit_stack_files(runs_files)
    else:  # inside the joint fit's fixed point, under its own status line
        fits, _ = fit_stack_files(runs_files, factors)
    write_stack(fits, hw_dir(), datetime.date.today().isoformat(),
                ", ".join(str(f.relative_to(hw_dir())) for f in runs_files))
    clear_cache()


def _store_training_fit(err: Console, date: str) -> None:
    """`dse validate --fit-training` (and `--fit`): the training factors fitted per family and stack on the training
    runs, each run left out in turn; stored apart from the serving factors.
    """
    from dse.catalog.hardware import hw_dir
    from dse.catalog.training import default_training_efficiency
    from dse.validate.training import calibrate_training, load_training_runs, write_training_calibration

    runs = load_training_runs()
    with err.status("fitting the training factors, then leaving each run out") as status:
        fit = calibrate_training(runs, loo=True, progress=lambda i, n: status.update(f"training run {i + 1}/{n}"))
    write_training_calibration(fit, hw_dir(), date)
    default_training_efficiency.cache_clear()


def _store_bands(loaded, err: Console) -> None:
    """`dse validate --bands`: the error bands from the stored fit, written into calibration/fitted.yaml."""
    from dse.catalog.calibration import load_fitted
    from dse.catalog.hardware import default_efficiency, hw_dir
    from dse.validate.bands import compute_bands
    from dse.validate.report import write_bands
    from dse.validate.runs import catalog_runs_files

    runs_files = catalog_runs_files()
    fitted = load_fitted()
    if fitted is None or not runs_files:
        raise InputError(f"{hw_dir() / 'calibration'}: --bands needs the stored fit (fitted.yaml, `dse validate "
                         "--fit`) and the measured runs (published/measured_serving.csv)")
    with err.status("error bands: the measured runs left out by sweep and by family, the families left out"):
        section = compute_bands(loaded, fitted, default_efficiency(), runs_files,
                                ", ".join(str(f.relative_to(hw_dir())) for f in runs_files))
    write_bands(section, hw_dir())


def _validate_runs(cases: list[Path], fit: bool, out: Path | None, as_json: bool, cache: bool = True,
                   plots: bool = True) -> None:
    """`dse validate --cases FILE [--cases FILE ...]`: measured serving runs (CSVs, or the JSON results of a dse
    export's benchmark script) predicted at request level, cross-validated.
    """
    from dse.validate.report import write_runs_report
    from dse.validate.run import validate_file

    try:
        if fit:
            raise InputError(f"{cases[0]}: --fit refits the YAML cases' efficiencies; a CSV of measured runs is "
                             "always cross-validated by leaving whole concurrency sweeps out (drop --fit)")
        v = validate_file(cases, cache=cache)
        doc = v.as_dict()
        target = out or Path("results") / "validate_runs"
        files = write_runs_report(v, target, doc, plots)
        results = [c for c in cases if c.suffix.lower() != ".csv"]
        if results:  # benchmarks' results: their runs in the measured-runs columns, to keep
            from dse.validate.run import read_measured
            from dse.validate.runs import read_runs_files

            read_runs_files(results, read_measured).to_csv(target / "runs.csv", index=False)
            files.append("runs.csv")
    except InputError as exc:
        _fail(exc)
    if as_json:
        typer.echo(json.dumps(_finite(doc), indent=2, default=float))
        return
    console = Console()
    copies = doc.get("rows_duplicate", 0)
    t = Table(title=f"{doc['rows_predicted']:,} of {doc['rows_given'] - copies:,} measurements predicted (coverage "
                    f"{doc['coverage']:.1%}; {doc['rows_given']:,} rows, {copies:,} of them copies of another row's "
                    "measurement, read once); median absolute error", header_style="bold")
    for col in ("category", "metric", "n", "shipped physics", "leave-group-out", "same, factors per family only",
                "within sweep", "in-sample", "ideal roofline", "signed median"):
        t.add_column(col, justify="left" if col in ("category", "metric") else "right")
    for e in doc["summary"]:
        family = e.get("loo_family_factors_median_abs_error")
        t.add_row(e["category"], e["metric"], str(e["n"]), f"{e['median_abs_error']:.1%}",
                  f"{e['loo_median_abs_error']:.1%}", "-" if family is None else f"{family:.1%}",
                  f"{e['within_sweep_median_abs_error']:.1%}",
                  f"{e['in_sample_median_abs_error']:.1%}", f"{e['ideal_median_abs_error']:.1%}",
                  f"{e['signed_median']:+.1%}")
    console.print(t)
    if doc["rows_layout_unknown"]:
        console.print(f"{doc['rows_layout_unknown']:,} row(s) state no layout dse can read as given "
                      f"(layout_unknown): {doc.get('rows_layout_padded', 0):,} state an attention TP that does not "
                      "divide the heads beside an attention DP (read with the heads padded); "
                      f"{doc.get('rows_layout_conflicting', 0):,} are measurements listed again with another layout "
                      f"(predicted on the one with the fewest chips); {doc.get('rows_no_concurrency', 0):,} state no "
                      "concurrency (predicted at their layout's batch in flight); the others "
                      "state no worker counts and are predicted on the smallest deployment of their worker sizes. "
                      "Read by no fit, reported apart", highlight=False)
    f = Table(title="By hardware family: median absolute error, leave-group-out and leave-family-out (the family's "
                    "rows predicted by the fits on the other families' rows)", header_style="bold")
    for col in ("family", "n", "frameworks", "TPOT group-out", "TPOT family-out", "TTFT group-out",
                "TTFT family-out"):
        f.add_column(col, justify="left" if col in ("family", "frameworks") else "right")
    def pct(x: float | None) -> str:
        return "-" if x is None or x != x else f"{x:.1%}"

    for r in doc["families"]:
        f.add_row(r["family"], str(r["n"]), r["frameworks"], pct(r["tpot_loo_median_abs_error"]),
                  pct(r["tpot_lfo_median_abs_error"]), pct(r["ttft_loo_median_abs_error"]),
                  pct(r["ttft_lfo_median_abs_error"]))
    console.print(f)
    for reason, n in doc["skipped"]["by_reason"].items():
        console.print(f"[dim]skipped[/] {n} row(s): {escape(reason)}", highlight=False)
    console.print(f"wrote {', '.join(files)} to {target}/", highlight=False)


def _print_validation(report, target: Path) -> None:
    console = Console()
    t = Table(title="Predicted against measured (calibrated physics)", header_style="bold")
    for col in ("case", "configuration", "measured", "predicted", "error", "leave-one-out", "ideal"):
        t.add_column(col, justify="left" if col in ("case", "configuration") else "right")
    df = report.table
    for _, r in df.iterrows():
        loo = "-" if "loo_error" not in df or r.get("loo_error") != r.get("loo_error") else f"{r['loo_error']:+.1%}"
        t.add_row(r["case"][:28], r["label"], f"{r['measured']:.4g}", f"{r['predicted']:.4g}", f"{r['error']:+.1%}",
                  loo, f"{r['ideal']:.4g}")
    console.print(t)
    s = Table(title="Absolute error by category", header_style="bold")
    for col in report.summary.columns:
        s.add_column(col, justify="left" if col == "category" else "right")
    for _, r in report.summary.iterrows():
        s.add_row(*[f"{x:.1%}" if isinstance(x, float) else str(x) for x in r])
    console.print(s)
    if report.families:
        f = Table(title="By hardware family (the stored bands): median absolute error out of sample and with the "
                        "family left out (fitted on the other families alone)", header_style="bold")
        for col in ("family", "metric", "n", "out of sample", "family left out", "band", "basis"):
            f.add_column(col, justify="left" if col in ("family", "metric", "basis") else "right")
        for r in report.families:
            own, lfo = r["median_abs_error"], r["leave_family_out_median_abs_error"]
            f.add_row(r["family"], r["metric"], str(r["n"]), "-" if own is None else f"{own:.1%}",
                      "-" if lfo is None else f"{lfo:.1%}",
                      "-" if not r["band"] else f"[{r['band'][0]:.2f}, {r['band'][1]:.2f}]", r["basis"])
        console.print(f)
    train = df[df["category"] == "training_throughput"]
    if not train.empty:
        from dse.validate.training import summarize_training

        g = Table(title="Training runs: absolute error on tokens/s per chip by family, kind and stack",
                  header_style="bold")
        for col in ("group", "runs", "median", "leave-one-out median", "leave-one-out p90"):
            g.add_column(col, justify="left" if col == "group" else "right")
        for key, st in summarize_training(train).items():
            g.add_row(key, str(st["runs"]), f"{st['median_abs_error']:.1%}",
                      *(f"{st[k]:.1%}" if k in st else "-" for k in ("loo_median_abs_error", "loo_p90_abs_error")))
        console.print(g)
    for sk in report.skipped:
        console.print(f"[dim]skipped[/] {sk.case} ({sk.category}): {sk.reason}", highlight=False)
    console.print(f"wrote validate.csv, summary.json, scatter.png, report.html to {target}/")


@app.command()
def export(
    result: Annotated[Path, typer.Argument(help="A study's output folder (or its summary.json).")],
    model: Annotated[str | None, typer.Option(help="Model of the chosen optimum (when the study has several).")] = None,
    workload: Annotated[str | None, typer.Option(help="Workload of the chosen optimum.")] = None,
    framework: Annotated[list[str] | None, typer.Option(
        help="vllm, sglang or trtllm (repeat; default: every one that runs on the plan's hardware).")] = None,
    model_path: Annotated[str | None, typer.Option(
        help="Weights to serve (default: the known chat checkpoint of the plan's weights format).")] = None,
    gpus_per_node: Annotated[int | None, typer.Option(
        help="GPUs per host (default: the hardware catalog's chips_per_node).")] = None,
    out: Annotated[Path | None, typer.Option(
        help="Folder for the scripts, never inside a result folder (default: exports/STUDY/MODEL-WORKLOAD).")] = None,
    force: Annotated[bool, typer.Option("--force", help="Keep files dse did not write in --out.")] = False,
) -> None:
    """Launch scripts (vLLM, SGLang, TensorRT-LLM) for an optimum of a study result, and its benchmark."""
    from dse.report.export import PLAIN_NAME, choose_entry, read_summary, write_scripts
    from dse.report.export import export as make_scripts

    try:
        summary_path = result / "summary.json" if result.is_dir() else result
        if not summary_path.exists():
            raise InputError(f"{result}: no summary.json of a study run there (run `dse run STUDY --out DIR` first)")
        summary = read_summary(summary_path)
        plan, index = choose_entry(summary, str(summary_path), model, workload)
        try:
            scripts = make_scripts(plan, tuple(framework) if framework else None, model_path, gpus_per_node)
        except InputError as exc:
            raise InputError(f"{summary_path}: best[{index}]: {exc}") from None
        study = summary.get("study")
        study = study if isinstance(study, str) and PLAIN_NAME.fullmatch(study) else summary_path.parent.name
        target = out or Path("exports") / study / f"{plan.model}-{plan.workload}"
        names = write_scripts(scripts, target, plan, force)
    except InputError as exc:
        _fail(exc)
    Console().print(f"wrote {', '.join(sc.name for sc in scripts)} to {target}/ (it holds {len(names)} files)",
                    highlight=False, markup=False)


def _hardware_rows() -> list[dict]:
    """Every system with every catalog field: the SI value of each quantity with its source and date (flat), the
    quantities as written (``quantities``: value, unit, SI value, source, date, note, estimate) and the prices by kind.
    """
    from dataclasses import asdict

    from dse.catalog.hardware import PRICE_KINDS, SYSTEM_FIELDS, default_systems

    rows = []
    for s in default_systems().values():
        row: dict = {"id": s.id, "name": s.name, "vendor": s.vendor, "scaleup_topology": s.topology,
                     "status": s.status, "native_dtypes": list(s.native_dtypes), "kv_dtypes": list(s.kv_dtypes),
                     "power_all_in_w": None if s.power_all_in_w != s.power_all_in_w else s.power_all_in_w,
                     "power_all_in_is_estimate": bool(s.quantities.get("power_all_in") and
                                                      s.quantities["power_all_in"].estimate)}
        row["prices"] = {k: {"usd_per_hour": q.value, "source": q.source, "date": q.date, "estimate": q.estimate,
                             "note": q.note} for k, q in s.prices.items() if k in PRICE_KINDS}
        for name in SYSTEM_FIELDS:
            q = s.quantities.get(name)
            row[name] = None if q is None else q.si
            if q is not None:
                row[f"{name}_source"] = q.source
                row[f"{name}_date"] = q.date
        row["quantities"] = {name: asdict(q) for name, q in s.quantities.items()}
        rows.append(row)
    return rows


HARDWARE_COLUMNS = (  # (header, wide only, cell of a row)
    ("id", False, lambda r: r["id"]),
    ("status", True, lambda r: r["status"]),
    ("BF16\nPF/s", False, lambda r: _scaled(r["flops_bf16"], 1e15)),
    ("FP8\nPF/s", False, lambda r: _scaled(r["flops_fp8"], 1e15)),
    ("FP4\nPF/s", False, lambda r: _scaled(r["flops_fp4"], 1e15)),
    ("INT8\nPOP/s", True, lambda r: _scaled(r["flops_int8"], 1e15)),
    ("KV\nformats", True, lambda r: ",".join(r["kv_dtypes"])),
    ("HBM\nGB", False, lambda r: _scaled(r["hbm_capacity"], 1e9)),
    ("HBM\nTB/s", False, lambda r: _scaled(r["hbm_bandwidth"], 1e12)),
    ("domain\nchips", False, lambda r: f"{r['scaleup_domain']:,.0f}"),
    ("scale-up\nGB/s", False, lambda r: _scaled(r["scaleup_bandwidth"], 1e9)),
    ("topology", True, lambda r: r["scaleup_topology"]),
    ("scale-out\nGB/s", True, lambda r: _scaled(r["scaleout_bandwidth"], 1e9)),
    ("all-in\nkW", True, lambda r: _scaled(r["power_all_in_w"], 1e3) + ("*" if r["power_all_in_is_estimate"] else "")),
    ("TCO hyp.\nUSD/h", True, lambda r: _price(r, "tco_hyperscaler")),
    ("TCO neo.\nUSD/h", True, lambda r: _price(r, "tco_neocloud")),
    ("rent 3y\nUSD/h", True, lambda r: _price(r, "rental_3yr")),
    ("on-dem.\nUSD/h", False, lambda r: _price(r, "on_demand")),
)
"""The columns of `dse catalog hardware`: every one from 150 columns; below, the ones a deployment is sized with
(peak FLOP/s, HBM, scale-up domain and links, the default price kind)."""


def _scaled(v: float | None, unit: float) -> str:
    """A figure in a column's unit with 3 significant digits; '-' where the catalog has none."""
    if v is None or v != v:
        return "-"
    x = v / unit
    return f"{x:,.0f}" if abs(x) >= 100 else f"{x:.3g}"


def _price(r: dict, kind: str) -> str:
    p = r["prices"].get(kind)
    return "-" if p is None else f"{p['usd_per_hour']:.2f}{'*' if p['estimate'] else ''}"


@catalog_app.command("hardware")
def catalog_hardware(as_json: Annotated[bool, typer.Option("--json", help="Print JSON (SI units).")] = False) -> None:
    """The accelerator systems with their dense FLOP/s, HBM, links and prices."""
    from rich import box

    try:
        rows = _hardware_rows()
    except InputError as exc:
        _fail(exc)
    if as_json:
        typer.echo(json.dumps(rows, indent=2))
        return
    console = Console()
    wide = console.width >= 150
    t = Table(title="Hardware catalog: dense FLOP/s and one-direction link bandwidth per chip; USD per chip-hour by "
              "price kind; * estimate, - none" + ("" if wide else " (150 columns show every field, --json every "
                                                    "field with its source)"),
              title_justify="left", header_style="bold", box=box.SIMPLE_HEAD, padding=0, pad_edge=False)
    columns = [c for c in HARDWARE_COLUMNS if wide or not c[1]]
    for header, _, _ in columns:
        t.add_column(header, justify="left" if header in ("id", "status", "topology") or header.startswith("KV")
                     else "right", no_wrap=True)
    for r in rows:
        t.add_row(*(cell(r) for _, _, cell in columns))
    console.print(t)


def _model_rows() -> list[dict]:
    """Every model with every catalog field (as ``models.yaml`` writes it) and its derived counts."""
    from dse.catalog.models import default_models

    rows = []
    for m in default_models().values():
        a = m.spec.attention
        rows.append({
            **m.spec.model_dump(mode="json"),
            "attention_kind": a.kind + (" + sliding window" if a.sliding_layers else "") + (
                " + sparse" if a.sparse else ""),
            "max_context_tokens": m.spec.max_context.tokens if m.spec.max_context else None,
            "params_total": m.params_total,
            "params_active": m.params_active,
            "published_total": m.spec.published_b.total * 1e9,
            "published_active": m.spec.published_b.active * 1e9,
            "kv_bytes_per_token_bf16": m.kv_bytes_per_token("bf16"),
        })
    return rows


@catalog_app.command("models")
def catalog_models(as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False) -> None:
    """The model architectures with derived parameter counts, KV bytes per token and maximum context."""
    from rich import box

    try:
        rows = _model_rows()
    except InputError as exc:
        _fail(exc)
    if as_json:
        typer.echo(json.dumps(rows, indent=2))
        return
    console = Console()
    wide = console.width >= 110
    t = Table(title="Model catalog: derived parameter counts (active excludes the input-embedding lookup), KV bytes "
              "per token in bf16, published maximum context; * hypothetical", title_justify="left",
              header_style="bold", box=box.SIMPLE_HEAD, padding=0, pad_edge=False)
    columns = [("id", "left"), ("attention", "left"), ("ffn", "left"), ("layers", "right"), ("params\ntotal", "right"),
               ("params\nactive", "right"), ("published\ntotal / active", "right"), ("KV per\ntoken", "right"),
               ("max\ncontext", "right")]
    if not wide:
        columns = [c for c in columns if c[0] not in ("layers", "published\ntotal / active")]
    for name, justify in columns:
        t.add_column(name, justify=justify, no_wrap=True)
    for r in rows:
        ctx = r["max_context_tokens"]
        cells = {"id": r["id"] + (" *" if r["hypothetical"] else ""),
                 "attention": r["attention_kind"].replace(" + sliding window", " + SWA"), "ffn": r["ffn"]["kind"],
                 "layers": str(r["n_layers"]), "params\ntotal": f"{r['params_total'] / 1e9:,.1f}B",
                 "params\nactive": f"{r['params_active'] / 1e9:,.1f}B",
                 "published\ntotal / active": f"{r['published_total'] / 1e9:g}B / {r['published_active'] / 1e9:g}B",
                 "KV per\ntoken": _si(r["kv_bytes_per_token_bf16"], "B"),
                 "max\ncontext": "-" if ctx is None else f"{ctx / 1e3:,.0f}k" if ctx < 1_000_000 else
                 f"{ctx / 1e6:.3g}M"}
        t.add_row(*(cells[name] for name, _ in columns))
    console.print(t)


@catalog_app.command("import-model")
def catalog_import_model(
    config: Annotated[Path, typer.Argument(help="A Hugging Face config.json.")],
    model_id: Annotated[str | None, typer.Option("--id", help="Catalog id (default: the folder name).")] = None,
) -> None:
    """Read a config.json into a model-catalog entry (YAML), validate it and print its derived totals."""
    import yaml

    from dse.catalog.hf_import import import_config

    try:
        entry, arch = import_config(config, model_id)
    except InputError as exc:
        _fail(exc)
    typer.echo(yaml.safe_dump({"models": [entry]}, sort_keys=False, width=120).rstrip())
    typer.echo(f"# derived: {arch.params_total / 1e9:.3f}B total, {arch.params_active / 1e9:.3f}B active "
               f"(without the input embedding), {arch.kv_bytes_per_token('bf16'):,.0f} KV bytes per token in bf16")


_OWN_PROCESS = False
"""Whether the command line runs in a process of its own (`main`), not inside a caller's (the tests' CliRunner)."""


def _starting() -> None:
    """A command's start-up begins (the parse of its options, its imports, the catalogs, the study): in a process of
    the command line's own, the cyclic garbage collector pauses until `_started`. What start-up makes lives to the
    end of the process, so the collections it would run find nothing to free.
    """
    if _OWN_PROCESS:
        gc.disable()


def _started() -> None:
    """A command's start-up is over: in a process of the command line's own, every object made so far (the modules,
    the catalogs, the study) is put out of the cyclic garbage collector's reach (``gc.freeze``), and the collector
    runs again. They live to the end of the process, and each full collection would otherwise walk them all again:
    some 0.15 s of a short question's 0.8 s of CPU. What the command makes afterwards is collected as usual; a
    caller's process keeps its own collector as it is.
    """
    if _OWN_PROCESS:
        gc.freeze()
        gc.enable()


def _leave(code: int) -> None:
    """End the command line's own process with ``code`` without the interpreter's teardown (freeing every module and
    object one by one: some 0.02-0.04 s of a short question, which changes nothing it wrote or printed): the exit
    handlers run, the output streams are flushed (Python's and the C library's), then the process ends. Where another
    thread still runs, the process ends as usual (returns).
    """
    import atexit
    import threading

    if threading.active_count() > 1:
        return
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed or broken stream: nothing more can reach it
            pass
    try:
        ctypes.CDLL(None).fflush(None)
    except (OSError, AttributeError):  # pragma: no cover - no C library to ask
        pass
    os._exit(code)


def main() -> None:
    """Console-script entry point (``dse --version`` answers before anything heavy is imported)."""
    global _OWN_PROCESS
    if sys.argv[1:] == ["--version"]:
        from dse import __version__

        print(f"dse {__version__}")
        return
    from dse.physics import keep_freed_memory

    keep_freed_memory()  # the evaluator's temporaries stay in the process instead of page-faulting back each call
    _OWN_PROCESS = True
    if sys.argv[1:2] == ["run"]:
        _starting()  # from here: the parse of its options imports pydantic (typer's coercion) too
    try:
        app()
    except (InputError, InfeasibleError, SolverLimitError) as exc:  # pragma: no cover - commands catch their own
        Console(stderr=True).print(f"error: {exc}")
        sys.exit(exc.exit_code)
    except MemoryError:  # pragma: no cover - the searches stream in bounded chunks; a catalog or model may not
        Console(stderr=True).print("error: out of memory: the machine's memory ran out before the command finished "
                                   "(nothing was written)")
        sys.exit(1)


def command() -> None:
    """The ``dse`` executable (its console script, and ``python -m dse.cli``): `main`; then, `dse run` having
    written and printed everything, the process ends without the interpreter's teardown (`_leave`). A caller of
    `main` in its own process (a test, a script) gets `main` alone, which returns or raises SystemExit as it did.
    """
    try:
        main()
    except SystemExit as exc:
        if sys.argv[1:2] == ["run"] and (exc.code is None or isinstance(exc.code, int)):
            _leave(exc.code or 0)
        raise


if __name__ == "__main__":  # pragma: no cover
    command()
