"""`dse run --out` never touches a file dse did not create (issue 27, items 1-6).

Each case puts the user's files in and beside the output folder, runs dse (through the output layer, the
CLI in process, or a forked child killed at a chosen step) and checks that every byte of them is still
there: a marker listing the user's files, marker entries that point outside the folder, --force over
files of dse's names, look-alike temporary folders beside the folder, --out through a symbolic link, two
runs on one folder at once, a sweep's storage, a folder an older dse wrote, and runs killed at each step.
A deterministic fuzz of forged markers closes the file.
"""

from __future__ import annotations

import copy
import fcntl
import hashlib
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

import dse.report.html
import dse.report.output as output
from dse.cli import app
from dse.errors import InputError
from dse.report.output import MARKER, lock_file, recover, write_outputs
from dse.studies.base import load_study
from dse.studies.contract import solve_study
from dse.studies.optuna_sweep import STORAGE, create_storage

ROOT = Path(__file__).resolve().parent.parent
KV = ROOT / "studies" / "kv_cache_tiers.yaml"  # a fast study (well under a second), no plots
SMALL = ROOT / "tests" / "fixtures" / "small_sweep.yaml"  # a sweep: its storage lives in the output folder
KV_FILES = [MARKER, "kv_tiers.csv", "report.html", "summary.json", "tiers.csv"]


@pytest.fixture(scope="module")
def kv():
    spec = load_study(KV)
    return spec, solve_study(spec)


def write(kv, target: Path, force: bool = False, **extra_tables) -> list[str]:
    """write_outputs of the kv study (plus ``extra_tables``: name -> DataFrame) into ``target``."""
    spec, base = kv
    out = copy.deepcopy(base)
    out.tables.update(extra_tables)
    return write_outputs(out, spec, target, force)


def cli(*args: str):
    """`dse ARGS` in this process: its exit code and one-line stderr; never a traceback."""
    result = CliRunner().invoke(app, list(args))
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    return result.exit_code, " ".join(result.stderr.split())


def snapshot(*roots: Path) -> dict:
    """Every entry at and under ``roots``, links not followed: path -> bytes, ('link', target) or 'dir'."""
    found: dict = {}

    def one(p: Path) -> None:
        found[str(p)] = ("link", os.readlink(p)) if p.is_symlink() else "dir" if p.is_dir() else \
            p.read_bytes() if p.exists() else "missing"

    for root in roots:
        one(root)
        if root.is_dir() and not root.is_symlink():
            for folder, dirs, files in os.walk(root):
                for name in dirs + files:
                    one(Path(folder, name))
    return found


def names(folder: Path) -> list[str]:
    return sorted(os.listdir(folder))


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def marker_v2(**files: str) -> str:
    return json.dumps({"version": 2, "files": files})


def user_files(folder: Path) -> list[Path]:
    """A user's files in ``folder``: a text file and a folder holding one."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "precious.txt").write_text("the user's notes")
    (folder / "data").mkdir()
    (folder / "data" / "inner.txt").write_text("the user's data")
    return [folder / "precious.txt", folder / "data"]


# ---- 1, 2: the marker is data from disk, not proof --------------------------------------------------------
def test_a_marker_listing_user_files_proves_nothing(tmp_path):
    for i, marker in enumerate(({"files": ["precious.txt", "data"]},  # an older dse's: names without hashes
                                {"version": 2, "files": {"precious.txt": "0" * 64, "data": sha(b"")}},  # no match
                                {"version": 2, "files": {"precious.txt": None, "data": "x"}})):
        out = tmp_path / str(i)
        mine = user_files(out)
        (out / MARKER).write_text(json.dumps(marker))
        before = snapshot(*mine, out / MARKER)
        code, err = cli("run", str(KV), "--out", str(out))
        assert code == 2 and f"--out {out}" in err, err
        assert ("older dse" in err and "SHA-256" in err) if i == 0 else "(data, precious.txt)" in err, err
        assert snapshot(*mine, out / MARKER) == before
        code, err = cli("run", str(KV), "--out", str(out), "--force")
        if i == 0:  # an older dse's folder is refused whole: it cannot be told apart from the user's files
            assert code == 2 and "older dse" in err and snapshot(*mine, out / MARKER) == before, err
        else:  # the user's files are kept, dse's written beside them
            assert code == 0 and snapshot(*mine) == {k: v for k, v in before.items() if not k.endswith(MARKER)}, err
            assert names(out) == sorted([*KV_FILES, "data", "precious.txt"])


def test_marker_entries_never_point_outside_the_folder(tmp_path, kv):
    out, victim, far = tmp_path / "out", tmp_path / "victim.txt", tmp_path / "far" / "victim.txt"
    far.parent.mkdir()
    victim.write_text("beside the folder")
    far.write_text("far away")
    write(kv, out)
    doc = json.loads((out / MARKER).read_text())
    (out / "link").symlink_to(victim)  # a link inside: never followed, never a dse file
    doc["files"].update({"../victim.txt": sha(victim.read_bytes()), str(far): sha(far.read_bytes()),
                         "link": sha(victim.read_bytes()), "../far/victim.txt": sha(far.read_bytes())})
    (out / MARKER).write_text(json.dumps(doc))
    before = snapshot(victim, far, out / "link")
    with pytest.raises(InputError, match="link"):  # the link is not dse's
        write(kv, out)
    write(kv, out, force=True)
    assert snapshot(victim, far, out / "link") == before
    assert names(out) == sorted([*KV_FILES, "link"])


# ---- 3: --force keeps every file dse did not write --------------------------------------------------------
def test_force_never_replaces_a_user_file_of_a_name_dse_needs(tmp_path):
    out, real = tmp_path / "out", tmp_path / "real"
    for folder in (out, real):
        folder.mkdir()
        (folder / "summary.json").write_text('{"the user": "summary"}')
        (folder / "best.csv").write_text("the user's best\n")
    (tmp_path / "link").symlink_to(real)
    for where in (out, tmp_path / "link"):
        before = snapshot(tmp_path)
        code, err = cli("run", str(KV), "--out", str(where), "--force")
        assert code == 2 and "summary.json there is not dse's" in err and "move it away" in err, err
        assert snapshot(tmp_path) == before


def test_a_file_edited_since_dse_wrote_it_is_the_users(tmp_path, kv):
    import pandas as pd

    out = tmp_path / "out"
    write(kv, out, extra=pd.DataFrame({"a": [1]}), gone=pd.DataFrame({"b": [2]}))
    (out / "extra.csv").write_text("edited by the user\n")
    (out / "tiers.csv").write_text("edited too\n")
    with pytest.raises(InputError, match=r"changed since \(extra.csv, tiers.csv\).*--force"):
        write(kv, out)
    with pytest.raises(InputError, match="tiers.csv there is not dse's"):  # dse needs that name
        write(kv, out, force=True)
    (out / "tiers.csv").unlink()
    before = snapshot(out / "extra.csv")
    write(kv, out, force=True)  # extra.csv is kept; gone.csv, dse's and unchanged, is no longer a result
    assert snapshot(out / "extra.csv") == before and names(out) == sorted([*KV_FILES, "extra.csv"])
    marker = json.loads((out / MARKER).read_text())
    assert sorted(marker["files"]) == sorted(KV_FILES[1:]) and "next" not in marker


def test_a_folder_written_by_an_older_dse_is_refused_whole(tmp_path, kv):
    out = tmp_path / "out"
    write(kv, out)
    doc = json.loads((out / MARKER).read_text())
    (out / MARKER).write_text(json.dumps({"study": doc["study"], "files": sorted(doc["files"])}))  # the old format
    create_storage(out / STORAGE)
    before = snapshot(out)
    for force in (False, True):
        with pytest.raises(InputError, match="older dse.*delete the folder, or choose another --out"):
            write(kv, out, force)
    assert snapshot(out) == before


# ---- 4: only the temporary folders this dse recorded are removed or put back -----------------------------
def test_look_alike_folders_beside_the_output_are_left_alone(tmp_path, kv):
    out = tmp_path / "kv"
    write(kv, out)
    (tmp_path / ".kv.dse-new-abc").mkdir()
    (tmp_path / ".kv.dse-new-abc" / "half.csv").write_text("x")
    (tmp_path / ".kv.dse-new-0123456789abcdef").mkdir()  # the shape of dse's own names, not recorded by it
    (tmp_path / ".kv.dse-new-0123456789abcdef" / "notes.txt").write_text("y")
    write(kv, tmp_path / "copy")
    (tmp_path / "copy").rename(tmp_path / ".kv.dse-old-0123456789abcdef")  # dse's files, not this run's folder
    (tmp_path / ".kv.dse-old-xyz").symlink_to(tmp_path / ".kv.dse-new-abc")
    keep = [tmp_path / n for n in names(tmp_path) if n != "kv"]
    before = snapshot(*keep)
    code, err = cli("run", str(KV), "--out", str(out))
    assert code == 0, err
    recover(out)
    assert snapshot(*keep) == before and names(tmp_path) == sorted(["kv", *(p.name for p in keep)])


# ---- 5: --out through a symbolic link ---------------------------------------------------------------------
def test_out_through_a_symbolic_link_writes_into_its_folder_and_keeps_the_link(tmp_path, kv):
    real, link = tmp_path / "store" / "kv", tmp_path / "kv"
    real.parent.mkdir()
    write(kv, real)
    (real / "kv_tiers.csv").unlink()  # a stale result: the run must bring it back through the link
    (real / "notes.txt").write_text("the user's")
    link.symlink_to(real)
    code, err = cli("run", str(KV), "--out", str(link), "--force")
    assert code == 0, err
    assert link.is_symlink() and os.readlink(link) == str(real)
    assert names(real) == sorted([*KV_FILES, "notes.txt"]) and (real / "notes.txt").read_text() == "the user's"
    (real / "notes.txt").unlink()
    code, err = cli("run", str(KV), "--out", str(link))  # dse's files only: the real folder is swapped
    assert code == 0, err
    assert link.is_symlink() and os.readlink(link) == str(real) and names(real) == KV_FILES
    assert names(tmp_path) == ["kv", "store"] and names(real.parent) == ["kv"]
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    (tmp_path / "file").write_text("a file")
    (tmp_path / "to-file").symlink_to(tmp_path / "file")
    before = snapshot(tmp_path)
    for where, message in (("dangling", "a symbolic link to"), ("to-file", "exists and is not a folder")):
        code, err = cli("run", str(KV), "--out", str(tmp_path / where))
        assert code == 2 and message in err, err
    assert snapshot(tmp_path) == before


# ---- 6: one run at a time per folder ---------------------------------------------------------------------
def test_a_second_run_on_a_locked_folder_exits_2_and_loses_nothing(tmp_path, kv):
    out = tmp_path / "out"
    write(kv, out)
    before = snapshot(tmp_path)
    assert names(tmp_path) == ["out"]  # the lock file goes when the run ends
    lock = lock_file(out)
    with open(lock, "w") as held:  # what a running dse holds
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        code, err = cli("run", str(KV), "--out", str(out))
        assert code == 2 and f"--out {out}: another dse run is writing this folder" in err, err
        with pytest.raises(InputError, match="another dse run"):
            write(kv, out, force=True)
    lock.unlink()
    assert snapshot(tmp_path) == before


def test_a_user_file_named_like_the_lock_file_is_not_touched(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("the user's")
    (tmp_path / ".out.dse-lock").write_text("the user's lock notes")
    (tmp_path / ".other.dse-lock").symlink_to(victim)
    before = snapshot(tmp_path)
    for where in ("out", "other"):
        code, err = cli("run", str(KV), "--out", str(tmp_path / where))
        assert code == 2 and "dse's lock file" in err and ".dse-lock" in err, err
    assert snapshot(tmp_path) == before


def test_two_runs_at_once_one_waits_for_nothing_and_the_other_finishes(tmp_path):
    """A real sweep in a subprocess holds the folder; a second run meanwhile exits 2 at once."""
    import yaml

    doc = yaml.safe_load(SMALL.read_text())
    doc["space"]["systems"], doc["sweep"]["factors"] = ["h100"], [0.5, 1.0, 2.0]  # a few seconds
    study = tmp_path / "tiny.yaml"
    study.write_text(yaml.safe_dump(doc))
    out = tmp_path / "sweep"
    proc = subprocess.Popen([sys.executable, "-m", "dse.cli", "run", str(study), "--out", str(out)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not (out / STORAGE).exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    assert proc.poll() is None, "the sweep ended before the second run could start"
    t0 = time.monotonic()
    code, err = cli("run", str(study), "--out", str(out))
    assert code == 2 and "another dse run is writing this folder" in err and time.monotonic() - t0 < 10, err
    _, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 0 and "Traceback" not in stderr, stderr
    assert {"sweep.csv", "summary.json", STORAGE, MARKER} <= set(names(out)) and names(tmp_path) == ["sweep", "tiny.yaml"]
    assert output.is_dse_storage(out / STORAGE)


# ---- the sweep's storage --------------------------------------------------------------------------------
def test_dse_storage_moves_along_and_a_forged_one_is_the_users(tmp_path, kv):
    out = tmp_path / "out"
    write(kv, out)
    create_storage(out / STORAGE)
    (out / f"{STORAGE}-journal").write_bytes(b"a journal")
    before = snapshot(out / STORAGE, out / f"{STORAGE}-journal")
    write(kv, out)  # dse's storage: the folder is swapped and the storage moves along
    assert snapshot(out / STORAGE, out / f"{STORAGE}-journal") == before
    assert names(tmp_path) == ["out"]
    # a user's database of that name, even listed with its hash in the marker, is the user's
    other = tmp_path / "other"
    write(kv, other)
    (other / STORAGE).write_bytes(b"SQLite format 3\0" + bytes(84) + b"the user's own database")
    doc = json.loads((other / MARKER).read_text())
    doc["files"][STORAGE] = sha((other / STORAGE).read_bytes())
    (other / MARKER).write_text(json.dumps(doc))
    before = snapshot(other / STORAGE)
    with pytest.raises(InputError, match=f"holds files dse did not write.*{STORAGE}"):
        write(kv, other)
    write(kv, other, force=True)  # a study without a storage keeps it
    code, err = cli("run", str(SMALL), "--out", str(other), "--force")  # a sweep needs that name
    assert code == 2 and f"{STORAGE} there is not dse's" in err, err
    assert snapshot(other / STORAGE) == before


# ---- runs killed at each step ---------------------------------------------------------------------------
def killed(kv, target: Path, where: str, force: bool = False) -> None:
    """write_outputs in a forked child that dies (os._exit, as a kill: no clean-up runs) at ``where``."""
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        try:
            die = lambda *a, **k: os._exit(9)  # noqa: E731
            rename, replace = os.rename, os.replace
            if where == "writing":
                dse.report.html.write_report = die
            elif where == "between renames":
                os.rename = lambda a, b: die() if ".dse-new-" in str(a) else rename(a, b)
            elif where == "dropping the old folder":
                output._drop_old = die
            elif where == "replacing one by one":
                os.replace = lambda a, b: die() if Path(b).name == "tiers.csv" else replace(a, b)
            write(kv, target, force)
        finally:
            os._exit(1)
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 9, f"the child did not reach {where}"


@pytest.mark.parametrize("where", ["writing", "between renames", "dropping the old folder"])
def test_a_killed_run_leaves_the_previous_results_whole_and_the_next_run_cleans_up(tmp_path, kv, where):
    out = tmp_path / "kv"
    write(kv, out)
    create_storage(out / STORAGE)
    results = snapshot(out)
    (tmp_path / ".kv.dse-new-abc").mkdir()  # a look-alike the clean-up must leave
    killed(kv, out, where)
    leftovers = [n for n in names(tmp_path) if n not in ("kv", ".kv.dse-new-abc", ".kv.dse-lock")]
    assert len(leftovers) == {"writing": 1, "between renames": 2, "dropping the old folder": 1}[where], leftovers
    recover(out)
    # killed before the new folder arrived: the previous results come back byte for byte; after: the new ones
    # are there (the same study, so the same bytes but report.html's timings) with the storage moved along
    if where == "dropping the old folder":
        assert names(out) == sorted([*KV_FILES, STORAGE])
        assert snapshot(out / STORAGE, out / "tiers.csv") == {k: results[k] for k in map(str, (out / STORAGE,
                                                                                               out / "tiers.csv"))}
    else:
        assert snapshot(out) == results
    assert names(tmp_path) == [".kv.dse-new-abc", "kv"]
    code, err = cli("run", str(KV), "--out", str(out))  # and the next run goes on from there
    assert code == 0 and names(out) == sorted([*KV_FILES, STORAGE]) and names(tmp_path) == [".kv.dse-new-abc", "kv"]


def test_a_run_killed_while_replacing_files_one_by_one_is_finished_by_the_next(tmp_path, kv):
    out = tmp_path / "kv"
    mine = user_files(out)
    write(kv, out, force=True)
    before = snapshot(*mine)
    killed(kv, out, "replacing one by one", force=True)
    assert "next" in json.loads((out / MARKER).read_text())  # the mix of old and new files is still dse's
    write(kv, out, force=True)
    assert snapshot(*mine) == before and names(out) == sorted([*KV_FILES, "data", "precious.txt"])
    assert names(tmp_path) == ["kv"]


# ---- fuzz: forged markers -------------------------------------------------------------------------------
RAW_MARKERS = [None, "{", "[]", "null", '{"files": "x"}', '{"version": 2}', '{"version": 3, "files": {}}',
               '{"version": 2, "files": []}', '{"version": 2, "files": {}, "next": 5}']
NAMES = ["precious.txt", "data", "data/inner.txt", "link", "summary.json", STORAGE, f"{STORAGE}-journal", MARKER,
         ".", "..", "", "/", "../victim.txt", "../far/victim.txt", "FAR", "nul\0x", "a\\..\\b"]
HASHES = ["zeros", "empty", "none", "int", "list", "true-upper", "true"]


def forged_markers() -> list:
    """Markers a user could leave, by accident or on purpose short of hashing their own files in the folder:
    wrong formats, an older dse's names without hashes, names that leave the folder (FAR: an absolute path),
    links, folders, dse's names, hashes that do not match or match a file outside."""
    rng = random.Random(0)
    cases: list = list(RAW_MARKERS)
    for _ in range(36):
        picked = rng.sample(NAMES, rng.randint(1, 6))
        if rng.random() < 0.3:
            cases.append({"files": picked})
        else:
            entries = [(n, rng.choice(HASHES)) for n in picked]
            cases.append({"version": 2, "entries": entries, "next": rng.random() < 0.3})
    return cases


def materialize(case, far: Path) -> str | None:
    """The marker text of a fuzz case; "true" hashes are the true hashes of the victims outside the folder, of a
    link's target, of a file inside a subfolder, and of a user's file named like the storage."""
    if not isinstance(case, dict):
        return case
    if "entries" not in case:
        return json.dumps({"files": [str(far) if n == "FAR" else n for n in case["files"]]})
    content = {"../victim.txt": b"beside", "FAR": b"far away", "../far/victim.txt": b"far away", "link": b"beside",
               "data/inner.txt": b"the user's data", STORAGE: b"the user's database"}
    files = {}
    for name, kind in case["entries"]:
        true = sha(content.get(name, b"not this"))
        files[str(far) if name == "FAR" else name] = {
            "zeros": "0" * 64, "empty": "", "none": None, "int": 7, "list": [true], "true-upper": true.upper(),
            "true": true}[kind]
    return json.dumps({"version": 2, "files": files, **({"next": files} if case["next"] else {})})


def dse_format(text: str | None) -> bool:
    """Whether ``text`` is in dse's own marker format (dse's to replace; anything else is the user's file)."""
    try:
        doc = json.loads(text) if text else None
    except ValueError:
        return False
    return (isinstance(doc, dict) and doc.get("version") == 2 and isinstance(doc.get("files"), dict)
            and isinstance(doc.get("next", {}), dict))


def test_fuzzed_markers_never_cost_a_user_byte(tmp_path, kv):
    counts = {"cases": 0, "written": 0, "refused": 0, "traceback": 0, "user bytes lost": 0}
    for i, case in enumerate(forged_markers()):
        for with_dse_names in (False, True):
            for force in (False, True):
                base = tmp_path / f"{i}-{with_dse_names:d}{force:d}"
                out, far = base / "out", base / "far" / "victim.txt"
                far.parent.mkdir(parents=True)
                far.write_bytes(b"far away")
                (base / "victim.txt").write_bytes(b"beside")
                mine = user_files(out)
                (out / "link").symlink_to(base / "victim.txt")
                mine.append(out / "link")
                if with_dse_names:
                    (out / "summary.json").write_text("the user's summary")
                    (out / STORAGE).write_bytes(b"the user's database")
                    mine += [out / "summary.json", out / STORAGE]
                text = materialize(case, far)
                if text is not None:
                    (out / MARKER).write_text(text)
                    if not dse_format(text):
                        mine.append(out / MARKER)
                before = snapshot(*mine, base / "victim.txt", far)
                counts["cases"] += 1
                try:
                    write(kv, out, force)
                    counts["written"] += 1
                except InputError:
                    counts["refused"] += 1
                except Exception:  # noqa: BLE001 - counted, then reported
                    counts["traceback"] += 1
                if snapshot(*mine, base / "victim.txt", far) != before:
                    counts["user bytes lost"] += 1
    print("forged-marker fuzz:", counts)
    assert counts["cases"] == 180 and counts["traceback"] == 0 and counts["user bytes lost"] == 0, counts
    assert counts["written"] > 0 and counts["refused"] > 0, counts
