"""scripts/measure_gpu.py: its CPU path runs; the committed GPU measurements against the roofline and the catalog."""

from __future__ import annotations

import io
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from dse.catalog.hardware import IDEAL
from dse.errors import InputError
from dse.validate.cases import load_cases
from dse.validate.measured import DEFAULT_STACK, header_fields, load_measured
from dse.validate.predict import predict

ROOT = Path(__file__).resolve().parent.parent
MEASURED = sorted((ROOT / "hw_catalog" / "measured").glob("*.csv"))
CASES = ("dse_measured_h100_llama31_8b", "dse_measured_h200_llama31_8b")


def read(path_or_text) -> tuple[str, pd.DataFrame]:
    text = path_or_text.read_text() if isinstance(path_or_text, Path) else path_or_text
    header, body = text.split("\n", 1)
    return header, pd.read_csv(io.StringIO(body))


def test_cpu_path_measures_matmul_copy_decode_and_prefill(tmp_path):
    out = tmp_path / "cpu.csv"
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "measure_gpu.py"), "--device", "cpu", "--quick",
                        "--out", str(out)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    header, table = read(out)
    assert header.startswith("# device:") and "date:" in header and "numpy" in header
    assert header_fields(header)["model"] == "measure-tiny"
    assert set(table["kind"]) == {"matmul", "copy", "decode", "prefill"}
    assert (table["seconds"] > 0).all() and (table["value"] > 0).all()
    steps = table[table["kind"].isin(["decode", "prefill"])]
    assert (steps["predicted_ideal_s"] > 0).all()
    # a real step never beats the roofline built from this machine's own peaks by more than noise
    assert (steps["seconds"] >= steps["predicted_ideal_s"] * 0.5).all()


def test_cpu_path_times_the_shapes_it_is_given(tmp_path):
    """--decode and --prefill replace the default grids (batch:length pairs, or none); a malformed list exits 2
    naming the option."""
    out = tmp_path / "cpu.csv"
    script = [sys.executable, str(ROOT / "scripts" / "measure_gpu.py"), "--device", "cpu", "--quick"]
    r = subprocess.run([*script, "--decode", "2:96", "--prefill", "none", "--out", str(out)], capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    steps = read(out)[1].query("kind in ['decode', 'prefill']")
    assert list(zip(steps["kind"], steps["batch"], steps["context"], strict=True)) == [("decode", 2, 96)]
    r = subprocess.run([*script, "--prefill", "1:x"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "--prefill" in r.stderr and "batch:length" in r.stderr
    try:
        import torch  # noqa: F401  (the FP8 path runs where PyTorch has FP8 products)
    except ImportError:
        r = subprocess.run([*script, "--weights", "fp8"], capture_output=True, text=True, timeout=60)
        assert r.returncode == 2 and "--weights fp8" in r.stderr and "_scaled_mm" in r.stderr


def stacks_of(path: Path) -> list[tuple[str, str]]:
    table = read(path)[1]
    if "stack" not in table:  # a run of the eager stack alone, before the script timed a compiled one
        table = table.assign(stack=DEFAULT_STACK)
    steps = table[table["kind"].isin(["decode", "prefill"])]
    return sorted(set(zip(steps["stack"], steps["attention"], strict=True)))


@pytest.mark.skipif(not MEASURED, reason="no GPU measurement committed (hw_catalog/measured/ is empty)")
@pytest.mark.parametrize("path", MEASURED, ids=[p.name for p in MEASURED])
def test_no_measured_step_beats_the_ideal_roofline_of_the_catalog_system(path):
    """Every decode step and prefill, of every stack and attention kernel, takes at least the ideal roofline's
    time on the catalog system the file is named after (datasheet peaks: 989 TFLOP/s bf16 on both, 3.35 TB/s on
    the H100, 4.8 TB/s on the H200), predicted with today's catalog."""
    system = path.name.split("-")[0]
    assert system in ("h100", "h200") and system.upper() in read(path)[0]
    for stack, attention in stacks_of(path):
        points = load_measured(path, "check", system, stack, attention).points
        measured = np.array([p.measured for p in points])
        ideal = predict(points, IDEAL)
        assert (measured <= ideal).all(), (stack, attention, measured / ideal)


@pytest.mark.parametrize("case", CASES)
def test_the_catalog_predicts_the_measured_steps_it_calibrates_on(case):
    """The compiled stack with flash attention (what serving frameworks run) on H100 and on H200 is a calibration
    case each; the catalog's Hopper factors predict the 17 decode steps and 10 prefills of each within 10% at the
    median and 35% at worst, and order
    their step times as measured (rank correlation; prefill throughputs sit within a few percent of each other from
    1k to 8k tokens, so their order is noise, while the step times span 7 ms to 1.3 s)."""
    points = [p for p in load_cases().points if p.case == case]
    assert sorted({p.kind for p in points}) == ["decode", "prefill"] and len(points) == 27
    measured = np.array([p.measured for p in points])
    error = predict(points) / measured - 1
    assert np.median(np.abs(error)) <= 0.10
    assert np.abs(error).max() <= 0.35
    tokens = np.array([p.batch * (p.context if p.kind == "prefill" else 1) for p in points])
    for kind in ("decode", "prefill"):
        mine = np.array([p.kind == kind for p in points])
        predicted_s, measured_s = tokens[mine] / predict(points)[mine], tokens[mine] / measured[mine]
        rank = np.corrcoef(pd.Series(predicted_s).rank(), pd.Series(measured_s).rank())[0, 1]
        assert rank >= 0.95, (kind, rank)


def test_the_catalog_predicts_steps_four_times_longer_than_those_it_calibrates_on():
    """Out of sample in length: the calibration cases reach 32,768 tokens (decode KV and prompt); on a third H100
    lease the same compiled stack with flash attention ran prefills of 64k-128k tokens, where the causal attention's
    FLOPs outgrow the weights' (2.1e15 against 4.5e15 at 131,072), and decode steps reading 64k-128k tokens of KV per
    sequence. The catalog predicts every one within 8% (prefills within 4%, decode 5-7% slow) and none faster
    than the ideal roofline allows; the three shapes the H100 case has too agree with it within 2%."""
    path = ROOT / "hw_catalog" / "measured" / "h100-2026-11-27-long.csv"
    points = load_measured(path, "long", "h100", "compiled", "sdpa").points
    assert max(p.context for p in points) == 131072 and len(points) == 10
    measured = np.array([p.measured for p in points])
    error = predict(points) / measured - 1
    assert np.abs(error).max() <= 0.08, error
    prefill = np.array([p.kind == "prefill" for p in points])
    assert np.abs(error[prefill]).max() <= 0.04 and (error[~prefill] < 0).all()
    assert (predict(points, IDEAL) >= measured).all()
    calibrated = {(p.kind, p.batch, p.context): p.measured for p in load_cases().points
                  if p.case == "dse_measured_h100_llama31_8b"}
    shared = [(p.measured, calibrated[(p.kind, p.batch, p.context)]) for p in points
              if (p.kind, p.batch, p.context) in calibrated]
    assert len(shared) == 3 and all(abs(a / b - 1) <= 0.02 for a, b in shared)


def test_fp8_weights_decode_as_predicted_and_prefill_slower_than_one_share_for_every_format_gives():
    """Out of sample in format: the H100 grid again with FP8 weight matrices (e4m3 products on the FP8 tensor cores,
    KV cache and attention in bf16), in no fit. Decode, bound by reading the weights, comes within 12% (median 3.5%).
    Prefill is compute-bound, and there the catalog's one compute share per family for every format overstates FP8:
    the tensor cores ran these prefills 1.28-1.53x as fast as bf16 (their FP8 GEMM at 8,192 cubed reached 67% of its
    peak, bf16's 77%) where the shared share gives 1.47-1.96x, so every FP8 prefill is predicted 13-35% fast. Adding these
    steps to the fit moved Hopper's shares toward a compromise that erred more on the published points (leave one
    out 5.7% -> 6.1%) and still predicted these prefills 18% fast: the gap wants a share per format, not a refit.
    Their labels name the formats, apart from the bf16 case's."""
    path = ROOT / "hw_catalog" / "measured" / "h100-2026-11-27-fp8.csv"
    points = load_measured(path, "fp8", "h100", "compiled", "sdpa").points
    assert len(points) == 27 and {(p.weights_dtype, p.kv_dtype) for p in points} == {("fp8", "bf16")}
    bf16 = {p.label for p in load_cases().points if p.case == "dse_measured_h100_llama31_8b"}
    assert not bf16 & {p.label for p in points}
    measured = np.array([p.measured for p in points])
    error = predict(points) / measured - 1
    prefill = np.array([p.kind == "prefill" for p in points])
    assert np.abs(error[~prefill]).max() <= 0.12 and np.median(np.abs(error[~prefill])) <= 0.05
    assert 0.10 <= error[prefill].min() and error[prefill].max() <= 0.35
    assert (predict(points, IDEAL) >= measured).all()


def test_the_eager_stack_is_slower_than_the_compiled_one_at_every_shape():
    """The same model, chip and kernels for the matrix products: fusing the elementwise work saves time at every
    measured shape, so the eager rows are no calibration of what a serving framework reaches."""
    table = read(ROOT / "hw_catalog" / "measured" / "h100-2026-11-27-run2.csv")[1]
    steps = table[table["kind"].isin(["decode", "prefill"])]
    wide = steps.pivot_table(index=["kind", "attention", "batch", "context"], columns="stack", values="seconds")
    assert len(wide) == 44 and (wide["eager"] > wide["compiled"]).all()


def measured_file(tmp_path: Path, header: str, rows: str) -> Path:
    path = tmp_path / "m.csv"
    path.write_text(header + "\nkind,dtype,stack,attention,batch,context,seconds,value,unit\n" + rows)
    return path


def test_a_malformed_measured_file_names_the_file_row_and_field(tmp_path):
    good = "decode,bf16,compiled,sdpa,8,512,0.01,800,tokens/s\n"
    assert len(load_measured(measured_file(tmp_path, "# model: llama-3.1-8b", good), "c", "h100", "compiled",
                             "sdpa").points) == 1
    cases = [
        ("# model: no-such-model", good, "line 1"),
        ("# model: llama-3.1-8b", "decode,bf16,compiled,sdpa,8,512,0.01,900,tokens/s\n", "field 'value'"),
        ("# model: llama-3.1-8b", "decode,bf16,compiled,sdpa,-8,512,0.01,800,tokens/s\n", "field 'batch'"),
        ("# model: llama-3.1-8b", "decode,int3,compiled,sdpa,8,512,0.01,800,tokens/s\n", "field 'dtype'"),
        ("# model: llama-3.1-8b", "training,bf16,compiled,sdpa,8,512,0.01,800,tokens/s\n", "field 'kind'"),
        ("# model: llama-3.1-8b", "decode,bf16,eager,sdpa,8,512,0.01,800,tokens/s\n", "no decode or prefill row"),
    ]
    for header, rows, needle in cases:
        path = measured_file(tmp_path, header, rows)
        with pytest.raises(InputError) as exc:
            load_measured(path, "c", "h100", "compiled", "sdpa")
        assert str(path) in str(exc.value) and needle in str(exc.value), str(exc.value)
    fp8 = "decode,fp8,bf16,compiled,sdpa,8,512,0.01,800,tokens/s\n"
    path = tmp_path / "kv.csv"
    path.write_text("# model: llama-3.1-8b\nkind,dtype,kv_dtype,stack,attention,batch,context,seconds,value,unit\n" + fp8)
    (point,) = load_measured(path, "c", "h100", "compiled", "sdpa").points
    assert (point.weights_dtype, point.kv_dtype) == ("fp8", "bf16")  # the KV cache's own format where stated
    path.write_text(path.read_text().replace(",fp8,bf16,", ",fp8,int4,"))
    with pytest.raises(InputError, match="field 'kv_dtype'"):
        load_measured(path, "c", "h100", "compiled", "sdpa")
    with pytest.raises(InputError, match="field 'system'"):
        load_measured(measured_file(tmp_path, "# model: llama-3.1-8b", good), "c", "h999", "compiled", "sdpa")
