"""`dse validate --cases FILE.csv` on malformed files: every case exits 2 with one message naming the file and the
column, line or row at fault, or gives a documented valid result; no traceback, nothing silently misread. The
cases mutate the first five runs of the shipped measured_serving.csv (a 5-row validate takes under a second
in-process; only the few valid cases run the predictions).
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

from dse.cli import app
from dse.validate.runs import REQUIRED, read_runs

ROOT = Path(__file__).resolve().parents[1]
LINES = (ROOT / "hw_catalog" / "calibration" / "published" / "measured_serving.csv").read_text().splitlines()[:6]
HEADER = LINES[0].split(",")
ROWS = [line.split(",") for line in LINES[1:]]  # the first five runs hold no quoted field


def col(name: str) -> int:
    return HEADER.index(name)


def csv_text(header: list[str] | None = None, rows: list[list[str]] | None = None, sep: str = ",",
             end: str = "\n") -> str:
    lines = [header or HEADER] + (ROWS if rows is None else rows)
    return end.join(sep.join(fields) for fields in lines) + end


def set_cell(name: str, value: str, rows: tuple[int, ...] = (1,)) -> str:
    """The five runs with column ``name`` set to ``value`` in the given rows (0-based; row 1 is on line 3)."""
    out = [list(r) for r in ROWS]
    for i in rows:
        out[i][col(name)] = value
    return csv_text(rows=out)


def drop_column(name: str) -> str:
    i = col(name)
    return csv_text(HEADER[:i] + HEADER[i + 1:], [r[:i] + r[i + 1:] for r in ROWS])


def rename_column(name: str, new: str) -> str:
    return csv_text([new if h == name else h for h in HEADER])


def invoke(path: Path, out: Path):
    result = CliRunner().invoke(app, ["validate", "--cases", str(path), "--json", "--out", str(out)])
    assert result.exception is None or isinstance(result.exception, SystemExit), f"traceback: {result.exception!r}"
    return result


def refused(result, out: Path, *words: str) -> str:
    msg = " ".join(result.stderr.split())
    assert result.exit_code == 2, (result.exit_code, msg, result.stdout[-300:])
    assert "Traceback" not in result.stderr and msg.startswith("error:") and not out.exists(), msg
    for w in words:
        assert w in msg, (w, msg)
    return msg


ALL = (0, 1, 2, 3, 4)
CASES: list[tuple[str, bytes | str, tuple[str, ...]]] = [
    # the file as a whole
    ("empty", b"", ("empty file",)),
    ("blank-lines", b"\n\n  \n", ("empty file",)),
    ("header-only", LINES[0] + "\n", ("no rows",)),
    ("header-then-blank-lines", LINES[0] + "\n\n\n", ("no rows",)),
    ("latin-1", csv_text().replace(ROWS[1][0], ROWS[1][0] + "\xe9").encode("latin-1"), ("line 3", "0xe9", "UTF-8")),
    ("utf-16", csv_text().encode("utf-16"), ("UTF-16", "UTF-8")),
    ("utf-16-no-bom", csv_text().encode("utf-16-le"), ("line 1", "NUL")),
    ("nul-byte", csv_text().replace(ROWS[2][0], ROWS[2][0] + "\x00"), ("line 4", "NUL")),
    ("binary", bytes(range(256)) * 4, ("NUL",)),
    ("json", b'{"id": 1, "isl": 8192}\n', ("missing column(s)",)),
    ("semicolons", csv_text(sep=";"), ("missing column(s)", "id")),
    # the header
    ("duplicated-required-column", rename_column("osl", "isl"), ("'isl'", "twice")),
    ("duplicated-other-column", rename_column("moe_quant_mode", "backend"), ("'backend'", "twice")),
    ("unnamed-column", rename_column("measured_date", ""), ("no name", "column 3")),
    ("blank-column-name", rename_column("measured_date", "  "), ("no name", "column 3")),
    *[(f"missing-{name}", drop_column(name), ("missing column(s)", name)) for name in REQUIRED],
    # the shape of the rows
    ("short-row", csv_text(rows=[ROWS[0], ROWS[1][:-1], *ROWS[2:]]), ("line 3", "34 fields", "35")),
    ("long-row", csv_text(rows=[*ROWS[:3], [*ROWS[3], "7"], ROWS[4]]), ("line 5", "36 fields", "35")),
    ("first-row-long", csv_text(rows=[[*ROWS[0], "7"], *ROWS[1:]]), ("line 2", "36 fields")),
    ("one-field-row", csv_text(rows=[*ROWS[:2], ["garbage"], *ROWS[2:]]), ("line 4", "1 field")),
    ("short-row-after-blank-line", csv_text(rows=[ROWS[0], [], ROWS[1][:5]]), ("line 4", "5 fields")),
    ("unterminated-quote", set_cell("id", '"abc', rows=(2,)), ("line 4",)),
    ("empty-id", set_cell("id", ""), ("line 3", "'id'")),
    ("duplicated-id", set_cell("id", ROWS[0][0], rows=(2,)), ("line 4", "line 2", "'id'")),
    # values of a numeric column
    *[(f"{name}-{bad}", set_cell(name, bad, rows=(2,)), ("row 4", f"'{name}'"))
      for name in ("isl", "osl", "silicon_ttft_ms", "silicon_tpot_ms")
      for bad in ("long", '"1,5"', "nan", "inf", "-3", "0x10")],
    ("isl-fraction", set_cell("isl", "8192.5"), ("row 3", "'isl'", "whole number")),
    ("tp_size-fraction", set_cell("tp_size", "4.5"), ("row 3", "'tp_size'", "whole number")),
    ("concurrency-fraction", set_cell("concurrency", "12.5"), ("row 3", "'concurrency'", "whole number")),
    ("tp_size-word", set_cell("tp_size", "eight"), ("row 3", "'tp_size'")),
    ("concurrency-overflow", set_cell("concurrency", "1e999"), ("row 3", "'concurrency'")),
    ("batch_size-negative", set_cell("batch_size", "-1"), ("row 3", "'batch_size'")),
    ("decode_num_workers-word", set_cell("decode_num_workers", "x"), ("row 3", "'decode_num_workers'")),
    # every row skipped
    ("all-unknown-system", set_cell("system", "tpu_v9", rows=ALL), ("no row", "5 rows skipped", "'tpu_v9'")),
    ("all-unknown-model", set_cell("model_path", "acme/X-7B", rows=ALL), ("no row", "'acme/X-7B'")),
    ("all-mode-both", set_cell("mode", "both", rows=ALL), ("no row", "'both'")),
    ("all-isl-zero", set_cell("isl", "0", rows=ALL), ("no row", "ISL or OSL missing")),
    ("all-no-ttft", set_cell("silicon_ttft_ms", "", rows=ALL), ("no row", "throughput-only")),
    ("all-empty-system", set_cell("system", "", rows=ALL), ("no row", "system ''")),
]


@pytest.mark.parametrize(("name", "data", "words"), CASES, ids=[c[0] for c in CASES])
def test_a_malformed_csv_is_refused_naming_the_file_and_where(tmp_path, name, data, words):
    path = tmp_path / "runs.csv"
    if isinstance(data, str):
        path.write_text(data, encoding="utf-8", newline="")
    else:
        path.write_bytes(data)
    refused(invoke(path, tmp_path / "out"), tmp_path / "out", str(path), *words)


def test_a_missing_file_and_a_folder_named_csv_are_refused(tmp_path):
    refused(invoke(tmp_path / "none.csv", tmp_path / "out"), tmp_path / "out", str(tmp_path / "none.csv"),
            "no such file")
    folder = tmp_path / "x.csv"
    folder.mkdir()
    refused(invoke(folder, tmp_path / "out"), tmp_path / "out", str(folder), "not a file")


# -- documented valid readings ---------------------------------------------------------------------------------
def test_the_five_runs_are_predicted(tmp_path):
    (tmp_path / "runs.csv").write_text(csv_text())
    result = invoke(tmp_path / "runs.csv", tmp_path / "out")
    assert result.exit_code == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["rows_given"] == 5 and doc["rows_predicted"] == 5 and (tmp_path / "out" / "report.html").exists()


@pytest.mark.parametrize(("name", "data"), [
    ("utf-8-bom", b"\xef\xbb\xbf" + csv_text().encode()),
    ("crlf", csv_text(end="\r\n").encode()),
    ("blank-lines-between-rows", csv_text(rows=[ROWS[0], [], *ROWS[1:], []]).encode()),
    ("quoted-and-padded", csv_text(rows=[[f'"{ROWS[0][0]}"', *ROWS[0][1:9], " 8192 ", *ROWS[0][10:]], *ROWS[1:]])
     .encode()),
])
def test_a_byte_order_mark_line_ends_blank_lines_and_quotes_read_the_same(tmp_path, name, data):
    """The same runs as the plain file, value for value (what the predictions are made from)."""
    (tmp_path / "plain.csv").write_text(csv_text())
    path = tmp_path / "runs.csv"
    path.write_bytes(data)
    pd.testing.assert_frame_equal(read_runs(path), read_runs(tmp_path / "plain.csv"))


def test_rows_skipped_beside_predicted_ones_are_reported_not_refused(tmp_path):
    out = [list(r) for r in ROWS]
    out[0][col("system")] = "tpu_v9"
    out[1][col("model_path")] = "acme/X-7B"
    path = tmp_path / "runs.csv"
    path.write_text(csv_text(rows=out))
    result = invoke(path, tmp_path / "out")
    assert result.exit_code == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["rows_given"] == 5 and doc["rows_predicted"] == 3 and doc["skipped"]["count"] == 2
