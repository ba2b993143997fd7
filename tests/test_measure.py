"""scripts/measure_gpu.py: its CPU path runs; committed GPU measurements agree with the prediction."""

from __future__ import annotations

import io
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

ROOT = Path(__file__).resolve().parent.parent
MEASURED = sorted((ROOT / "hw_catalog" / "measured").glob("*.csv"))


def read(path_or_text) -> tuple[str, pd.DataFrame]:
    text = path_or_text.read_text() if isinstance(path_or_text, Path) else path_or_text
    header, body = text.split("\n", 1)
    return header, pd.read_csv(io.StringIO(body))


def test_cpu_path_measures_matmul_copy_and_decode(tmp_path):
    out = tmp_path / "cpu.csv"
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "measure_gpu.py"), "--device", "cpu", "--quick",
                        "--out", str(out)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    header, table = read(out)
    assert header.startswith("# device:") and "date:" in header and "numpy" in header
    assert set(table["kind"]) == {"matmul", "copy", "decode"}
    assert (table["seconds"] > 0).all() and (table["value"] > 0).all()
    decode = table[table["kind"] == "decode"]
    assert (decode["predicted_ideal_s"] > 0).all()
    # a real step never beats the roofline built from this machine's own peaks by more than noise
    assert (decode["seconds"] >= decode["predicted_ideal_s"] * 0.5).all()


@pytest.mark.skipif(not MEASURED, reason="no GPU measurement committed yet (hw_catalog/measured/ is empty)")
@pytest.mark.parametrize("path", MEASURED, ids=[p.name for p in MEASURED])
def test_committed_gpu_decode_steps_are_within_20_percent_of_prediction(path):
    header, table = read(path)
    decode = table[table["kind"] == "decode"]
    assert not decode.empty
    error = decode["predicted_calibrated_s"] / decode["seconds"] - 1
    assert error.abs().median() <= 0.20, header
    assert (decode["seconds"] >= decode["predicted_ideal_s"] * 0.95).all()
