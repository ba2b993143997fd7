"""The files a study run writes: summary.json, one CSV per table, PNG plots and report.html, all or nothing.

Outputs are written into a fresh folder beside the target, which then replaces the target in one
rename, so an interrupted or failed run leaves nothing half-written. A run deletes or replaces only
what it can prove it wrote: a regular file (never a symbolic link) with a plain name, whose content
has the SHA-256 hash the folder's marker file (``.dse-output.json``) recorded when dse wrote it. A
file edited since, or one the marker names without its hash, is the user's: kept, and where dse
needs its name, the run stops with exit 2 naming it. A sweep's SQLite storage (``optuna.db`` and
its ``-journal``, ``-wal`` and ``-shm`` files) is dse's when the database header carries dse's
application id; it is never deleted, only kept or moved along with the folder.

One run at a time writes a folder: a lock file beside it (``.OUT.dse-lock``) is held with
``flock`` from the first check to the final rename, and records the token of the run's temporary
folders (``.OUT.dse-new-TOKEN``, ``.OUT.dse-old-TOKEN``), so that the next run puts back or
removes only those a killed run of dse left; anything else beside the folder is left alone. An
``--out`` that is a symbolic link is followed: results go into the folder it points to, the link
stays as it is.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import math
import os
import re
import secrets
import shutil
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from dse.errors import InputError
from dse.studies.base import StudySpec
from dse.studies.contract import StudyOutput
from dse.studies.sweep_storage import STORAGE, STORAGE_APP_ID


def _jsonable(obj):
    if isinstance(obj, dict):
        return {k: _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, (np.integer,)):
        return int(obj)
    if isinstance(obj, (np.floating, float)):
        f = float(obj)
        return None if math.isnan(f) or math.isinf(f) else f
    if isinstance(obj, np.bool_):
        return bool(obj)
    return obj


MARKER = ".dse-output.json"
"""The file that marks a folder as dse's output and records the SHA-256 hash of each file dse wrote there."""
EXPORT_MARKER = ".dse-export.json"
"""The same record for a folder of launch scripts (`dse export`): a study's results and an export never share a
folder, so neither command can take the other's files for its own."""
MARKER_VERSION = 2
"""Version 1 (dse before the hashes) listed names only; such a marker proves nothing."""
STORAGE_FILES = (STORAGE, f"{STORAGE}-journal", f"{STORAGE}-wal", f"{STORAGE}-shm")
"""A sweep's SQLite storage in the output folder and the files SQLite keeps beside it."""
ALWAYS = (MARKER, "summary.json", "report.html")
"""Names every run writes."""

_SHA = re.compile(r"[0-9a-f]{64}")
_IDLE = "-" * 16
_LOCK_RECORD = re.compile(rb"dse output lock; run ([0-9a-f]{16}|-{16})\n")
_HELD: dict[str, list] = {}  # lock file -> [file descriptor, depth]: this process holds it (hold() nests)


def _lock_record(token: str) -> bytes:
    return f"dse output lock; run {token}\n".encode()


def _plain(name: object) -> bool:
    """A name of an entry directly inside a folder: no separator, not '.' or '..', not absolute."""
    return (isinstance(name, str) and name not in ("", ".", "..") and not any(c in name for c in "/\\\0")
            and not os.path.isabs(name))


def _lstat(path: Path) -> os.stat_result | None:
    try:
        return os.lstat(path)
    except OSError:
        return None


def _is_folder(path: Path) -> bool:
    """A real folder (not a symbolic link to one)."""
    st = _lstat(path)
    return st is not None and stat.S_ISDIR(st.st_mode)


def _open_regular(path: Path):
    """A regular file opened for reading, never through a symbolic link, never blocking on a FIFO or a device;
    None for anything else.
    """
    st = _lstat(path)
    if st is None or not stat.S_ISREG(st.st_mode):
        return None
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    f = os.fdopen(fd, "rb")
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        f.close()
        return None
    return f


def _read_regular(path: Path, limit: int) -> bytes | None:
    f = _open_regular(path)
    if f is None:
        return None
    with f:
        return f.read(limit)


def _sha256(path: Path) -> str | None:
    f = _open_regular(path)
    if f is None:
        return None
    with f:
        h = hashlib.sha256()
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def is_dse_storage(path: Path) -> bool:
    """Whether ``path`` is a SQLite database dse created as a sweep's storage (its header's application id)."""
    head = _read_regular(path, 100)
    return (head is not None and len(head) == 100 and head.startswith(b"SQLite format 3\0")
            and int.from_bytes(head[68:72], "big") == STORAGE_APP_ID)


# ---- what is dse's in a folder ----------------------------------------------------------------------------
@dataclass
class Survey:
    """A folder's entries sorted by owner."""

    marker: str = "none"
    """``none`` (no marker), ``ours`` (a marker with hashes), ``old`` (an older dse's list of names without
    hashes) or ``foreign`` (a file of that name that is no marker)."""
    own: dict[str, str] = field(default_factory=dict)
    """Files dse wrote and nobody changed since: name -> SHA-256."""
    storage: list[str] = field(default_factory=list)
    """dse's sweep storage files."""
    foreign: list[str] = field(default_factory=list)
    """Everything else: the user's."""


def read_marker_doc(folder: Path, marker: str = MARKER) -> dict | None:
    """The parsed marker file of ``folder`` (None when there is none, or it is not a JSON object)."""
    data = _read_regular(folder / marker, 1 << 20)
    try:
        doc = json.loads(data) if data else None
    except (UnicodeDecodeError, ValueError, RecursionError):
        return None
    return doc if isinstance(doc, dict) else None


def _read_marker(folder: Path, marker: str = MARKER) -> tuple[str, dict[str, set[str]]]:
    """The marker's state and the hashes it records per name (only plain names with well-formed hashes)."""
    if not os.path.lexists(folder / marker):
        return "none", {}
    data = _read_regular(folder / marker, 1 << 20)
    if data == b"":  # created and killed before its first write: it holds nothing
        return "none", {}
    try:
        doc = json.loads(data) if data is not None else None
    except (UnicodeDecodeError, ValueError, RecursionError):
        doc = None
    if not isinstance(doc, dict):
        return "foreign", {}
    if doc.get("version") != MARKER_VERSION:
        return ("old", {}) if isinstance(doc.get("files"), list) else ("foreign", {})
    if not isinstance(doc.get("files"), dict) or not isinstance(doc.get("next", {}), dict):
        return "foreign", {}
    hashes: dict[str, set[str]] = {}
    for key in ("files", "next"):  # "next": the files a run replacing them one by one was putting in place
        for name, digest in doc.get(key, {}).items():
            if _plain(name) and name != marker and name not in STORAGE_FILES and isinstance(digest, str) \
                    and _SHA.fullmatch(digest):
                hashes.setdefault(name, set()).add(digest)
    return "ours", hashes


def survey(folder: Path, marker: str = MARKER) -> Survey:
    """Which entries of ``folder`` dse wrote (proven by the ``marker`` file's hashes), which are its sweep storage,
    and which are someone else's.
    """
    result = Survey()
    if not _is_folder(folder):
        return result
    result.marker, hashes = _read_marker(folder, marker)
    storage_ours = marker == MARKER and is_dse_storage(folder / STORAGE)
    for name in sorted(os.listdir(folder)):
        path = folder / name
        if name == marker and result.marker in ("ours", "none"):
            continue
        if name in STORAGE_FILES and storage_ours and stat.S_ISREG(getattr(_lstat(path), "st_mode", 0)):
            result.storage.append(name)
            continue
        if name in hashes and (digest := _sha256(path)) in hashes[name]:
            result.own[name] = digest
            continue
        result.foreign.append(name)
    return result


def _shown(names: list[str]) -> str:
    return ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")


def _check(target: Path, found: Survey, force: bool, needs, label: str = "--out") -> None:
    """Refuse a folder dse cannot write without touching a file that is not its own."""
    if found.marker == "old":
        raise InputError(f"--out {target}: written by an older dse, whose {MARKER} lists no SHA-256 hashes, so "
                         "dse cannot tell its files from yours there; keep what you need elsewhere and delete the "
                         "folder, or choose another --out")
    if found.foreign and not force:
        raise InputError(f"{label} {target}: holds files dse did not write or that changed since "
                         f"({_shown(found.foreign)}); choose a new or empty folder, or give --force to keep them and "
                         "replace only dse's own files there")
    clash = [name for name in found.foreign if name in needs]
    if clash:
        raise InputError(f"{label} {target}: {_shown(clash)} there {'is' if len(clash) == 1 else 'are'} not dse's "
                         "(written by someone else, or changed since dse wrote it) and dse needs that name for its "
                         "results; move it away or choose another --out")


# ---- the lock and the temporary folders beside the target -------------------------------------------------
def _real(target: Path) -> Path:
    """``target`` with symbolic links resolved (results go into the folder a link points to)."""
    try:
        real = target.resolve(strict=False)
    except (OSError, RuntimeError):  # a loop of symbolic links
        raise InputError(f"--out {target}: a symbolic link that cannot be resolved (a loop?)") from None
    if os.path.islink(target) and not os.path.exists(real):
        raise InputError(f"--out {target}: a symbolic link to {real}, which does not exist; create that folder or "
                         "choose another --out")
    if os.path.exists(real) and not real.is_dir():
        raise InputError(f"--out {target}: exists and is not a folder")
    if real.parent == real:
        raise InputError(f"--out {target}: the root folder cannot hold a study's results; choose a folder in it")
    return real


def lock_file(target: Path) -> Path:
    """The lock file of the output folder ``target``: ``.NAME.dse-lock`` beside the folder a link points to."""
    real = _real(Path(target))
    return real.parent / f".{real.name}.dse-lock"


def _lock_fd(real: Path) -> int:
    return _HELD[str(real.parent / f".{real.name}.dse-lock")][0]


def _sibling(real: Path, tag: str, token: str) -> Path:
    return real.parent / f".{real.name}.dse-{tag}-{token}"


def _acquire(lock: Path, target: Path) -> int:
    for _ in range(100):
        try:
            fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK, 0o644)
        except OSError as exc:  # a symbolic link, a folder, no permission
            raise InputError(f"--out {target}: cannot use {lock} as dse's lock file ({exc.strerror}); "
                             "move it away") from None
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise InputError(f"--out {target}: {lock} is not dse's lock file; move it away")
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise InputError(f"--out {target}: another dse run is writing this folder (it holds {lock}); "
                                 "wait for it to end or choose another --out") from None
            except OSError as exc:  # a file system without locks
                raise InputError(f"--out {target}: cannot lock {lock} ({exc.strerror})") from None
            now, held = _lstat(lock), os.fstat(fd)
            if now is None or (now.st_dev, now.st_ino) != (held.st_dev, held.st_ino):
                os.close(fd)  # the run before this one removed the file on its way out: lock the new one
                continue
            data = os.pread(fd, 256, 0)
            if data == b"":  # just created, here or by a run that lost the race for the lock
                os.pwrite(fd, _lock_record(_IDLE), 0)
            elif not _LOCK_RECORD.fullmatch(data):
                raise InputError(f"--out {target}: {lock} is not dse's lock file; move it away")
            return fd
        except BaseException:
            os.close(fd)
            raise
    raise InputError(f"--out {target}: cannot lock {lock}: it keeps being replaced")


def _token(fd: int) -> str:
    match = _LOCK_RECORD.fullmatch(os.pread(fd, 256, 0))
    return match.group(1).decode() if match else _IDLE


@contextmanager
def hold(target: Path) -> Iterator[Path]:
    """Hold the lock of the output folder ``target`` for the block (nested holds in one process share it); a
    second dse run on the same folder meanwhile stops with exit 2. Yields the folder, links resolved.
    """
    target = Path(target)
    real = _real(target)
    try:
        real.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InputError(f"--out {target}: cannot create {real.parent} ({exc.strerror})") from None
    lock = real.parent / f".{real.name}.dse-lock"
    key = str(lock)
    if key in _HELD:
        _HELD[key][1] += 1
        try:
            yield real
        finally:
            _HELD[key][1] -= 1
        return
    fd = _acquire(lock, target)
    _HELD[key] = [fd, 1]
    try:
        yield real
    finally:
        del _HELD[key]
        try:
            if _token(fd) == _IDLE and (now := _lstat(lock)) is not None \
                    and (now.st_dev, now.st_ino) == (os.fstat(fd).st_dev, os.fstat(fd).st_ino):
                os.unlink(lock)  # nothing left to recover: the next run starts a fresh one
        finally:
            os.close(fd)


def _drop_old(old: Path, real: Path, marker: str = MARKER) -> None:
    """Remove the previous folder a swap moved aside: its storage moves into the new folder, the files dse
    wrote are deleted; anything else stays (and with it the folder).
    """
    found = survey(old, marker)
    for name in found.storage:
        if not os.path.lexists(real / name):
            os.rename(old / name, real / name)
    for name in found.own:
        os.unlink(old / name)
    if found.marker == "ours":
        os.unlink(old / marker)
    try:
        old.rmdir()
    except OSError:
        pass  # it holds something dse cannot prove it wrote: left for the user


def _finish(real: Path, fd: int, marker: str = MARKER) -> None:
    """Put back or remove the temporary folders of the run the lock file names, then mark it idle."""
    token = _token(fd)
    if token == _IDLE:
        return
    new, old = _sibling(real, "new", token), _sibling(real, "old", token)
    if _is_folder(new):
        shutil.rmtree(new)
    if _is_folder(old):
        if not os.path.lexists(real):
            os.rename(old, real)  # killed between the two renames: the previous results go back
        elif survey(real, marker).marker == "ours":  # the new results arrived: the previous ones go
            _drop_old(old, real, marker)
        # else something else took the folder's name meanwhile: both are left as they are
    os.pwrite(fd, _lock_record(_IDLE), 0)


def recover(target: Path) -> None:
    """Finish or undo what a killed run of dse left beside ``target``, as the lock file records it: its
    half-written new folder is removed; the previous folder it moved aside is put back when the new one never
    arrived, else emptied of dse's files and removed. Folders of similar names that dse did not record are
    left alone.
    """
    with hold(target) as real:
        _finish(real, _lock_fd(real))


def prepare(target: Path, force: bool = False, storage: bool = False) -> None:
    """Check ``target`` before a run: a new folder, or one holding only dse's files, or (with ``force``) any
    folder whose files dse did not write are then kept, unless dse needs one's name. ``storage``: a sweep keeps
    its SQLite storage there. Creates the folder with its marker, so a sweep can keep its storage there.
    """
    target = Path(target)
    with hold(target) as real:
        recover(target)
        found = survey(real)
        _check(target, found, force, (*ALWAYS, *(STORAGE_FILES if storage else ())))
        real.mkdir(parents=True, exist_ok=True)
        if found.marker == "none":
            (real / MARKER).write_text(json.dumps({"version": MARKER_VERSION, "files": {}}))


def _put_marker(real: Path, scratch: Path, doc: dict, marker: str = MARKER) -> None:
    """Replace ``real``'s marker in one rename."""
    (scratch / ".dse-output.next").write_text(json.dumps(doc, indent=1))
    os.replace(scratch / ".dse-output.next", real / marker)


def write_outputs(out: StudyOutput, spec: StudySpec, target: Path, force: bool = False,
                  plots: bool = True) -> list[str]:
    """Write summary.json, one CSV per table, PNG plots (unless ``plots`` is false) and report.html; all or
    nothing.

    The files are written into a sibling folder, which then replaces ``target`` in one rename (a sweep's
    Optuna storage moves along); a file dse did not write is never deleted or overwritten. With ``force``
    and such files in ``target``, dse's own files are replaced there one by one and the others kept.
    Without ``plots`` the report names the figures it would have embedded; the rest is the same.
    """
    from dse.report.html import plot_files, write_plots, write_report

    target = Path(target)
    with hold(target) as real:
        prepare(target, force)
        fd = _lock_fd(real)
        token = secrets.token_hex(8)
        new = _sibling(real, "new", token)
        os.pwrite(fd, _lock_record(token), 0)  # recorded first: a killed run's folders are known by it
        try:
            new.mkdir()
            files = []
            for name, table in out.tables.items():
                table.to_csv(new / f"{name}.csv")
                files.append(f"{name}.csv")
            drawn = write_plots(out, spec, new) if plots else []
            files += drawn
            files.append("report.html")
            files.append("summary.json")
            out.summary["outputs"] = sorted(files)
            (new / "summary.json").write_text(json.dumps(_jsonable(out.summary), indent=2))
            write_report(out, spec, new, drawn, skipped=None if plots else plot_files(out, spec))
            digests = {name: _sha256(new / name) for name in sorted(files)}
            doc = {"version": MARKER_VERSION, "study": spec.study, "files": digests}
            _publish(real, new, target, token, doc, force)
        finally:
            _finish(real, fd)
    return sorted(files)


def _publish(real: Path, new: Path, target: Path, token: str, doc: dict, force: bool, marker: str = MARKER,
             label: str = "--out") -> None:
    """Put the files of ``new`` (their hashes in ``doc["files"]``) in place of ``real``'s, all or nothing: the
    folder swapped in one rename, or with ``force`` and files there that dse did not write, dse's own files
    replaced one by one and the others kept.
    """
    digests = doc["files"]
    (new / marker).write_text(json.dumps(doc, indent=1))
    found = survey(real, marker)
    _check(target, found, force, {*digests, marker}, label)
    if found.foreign:  # --force: replace dse's own files one by one, keep the others
        _put_marker(real, new, {**doc, "files": found.own, "next": digests}, marker)
        for name in digests:
            os.replace(new / name, real / name)
        for name, digest in found.own.items():
            if name not in digests and _sha256(real / name) == digest:
                os.unlink(real / name)
        _put_marker(real, new, doc, marker)
    else:
        old = _sibling(real, "old", token)
        os.chmod(new, stat.S_IMODE(os.stat(real).st_mode))  # the folder keeps its permissions
        os.rename(real, old)
        os.rename(new, real)
        _drop_old(old, real, marker)


def result_folder_above(path: Path) -> Path | None:
    """The nearest folder at or above ``path`` (links resolved) that holds a study's results (a `MARKER` of dse's,
    of this version or an older one), or None.
    """
    real = Path(path).resolve()
    for folder in (real, *real.parents):
        if _read_marker(folder)[0] in ("ours", "old"):
            return folder
    return None


def write_export(files: dict[str, str], executable: set[str], target: Path, record: dict, keep,
                 force: bool = False) -> list[str]:
    """Write the files of an export (name -> text; the names in ``executable`` made executable) into the folder
    ``target``, all or nothing, under the ownership rules of a study's results: a file dse did not write is never
    deleted or overwritten (refused unless ``force``, then kept), the export's own files are recorded by hash in
    `EXPORT_MARKER` with ``record`` (what the export was of), and the files of an earlier export that
    ``keep(previous_record, name)`` says to keep are carried over (another framework's scripts of the same
    plan). A folder holding a study's results, or inside one, is refused. Returns the names the folder holds.
    """
    target = Path(target)
    label = "--out"
    results = result_folder_above(target)
    if results is not None:
        raise InputError(f"{label} {target}: inside the study results in {results} (dse run replaces that folder); "
                         "write the export to a folder of its own")
    if os.path.exists(target) and not os.path.isdir(target):
        raise InputError(f"{label} {target}: exists and is not a folder; choose a new or empty folder")
    with hold(target) as real:
        _finish(real, _lock_fd(real), EXPORT_MARKER)
        fd = _lock_fd(real)
        token = secrets.token_hex(8)
        new = _sibling(real, "new", token)
        os.pwrite(fd, _lock_record(token), 0)
        try:
            real.mkdir(parents=True, exist_ok=True)
            found = survey(real, EXPORT_MARKER)
            previous = read_marker_doc(real, EXPORT_MARKER) or {}
            new.mkdir()
            carried = [name for name in found.own if name not in files and keep(previous, name)]
            for name in carried:
                shutil.copy2(real / name, new / name)
            for name, text in files.items():
                (new / name).write_text(text, encoding="utf-8")
                if name in executable:
                    (new / name).chmod(0o755)
            names = sorted({*files, *carried})
            doc = {"version": MARKER_VERSION, "kind": "export", **record,
                   "files": {name: _sha256(new / name) for name in names},
                   "from": {**{n: previous.get("from", {}).get(n) for n in carried}, **{n: record.get("writer")
                                                                                         for n in files}}}
            _publish(real, new, target, token, doc, force, EXPORT_MARKER, label)
        finally:
            _finish(real, fd, EXPORT_MARKER)
    return names
