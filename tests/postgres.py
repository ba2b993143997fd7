"""Start a throwaway PostgreSQL server for the tests (initdb in a temporary folder, loopback only)."""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path


def find_bin(name: str) -> str | None:
    found = shutil.which(name)
    if found:
        return found
    candidates = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"))
    return candidates[-1] if candidates else None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def postgres_server(tmp: Path):
    """Yield a postgresql:// URL to a fresh database; stop the server afterwards."""
    initdb, pg_ctl = find_bin("initdb"), find_bin("pg_ctl")
    if not initdb or not pg_ctl:
        raise RuntimeError("PostgreSQL server binaries not found (.ci/run installs Debian's postgresql)")
    run_as: list[str] = []
    if os.geteuid() == 0:  # initdb refuses root: run the server as the postgres user, in a folder it can reach
        tmp = Path(tempfile.mkdtemp(prefix="dse-pg-"))
        user = pwd.getpwnam("postgres")
        os.chown(tmp, user.pw_uid, user.pw_gid)
        run_as = ["runuser", "-u", "postgres", "--"]
    data = tmp / "pgdata"
    if run_as:
        subprocess.run([*run_as, "mkdir", str(data)], check=True)
    else:
        data.mkdir(parents=True)
    port = free_port()
    subprocess.run([*run_as, initdb, "-D", str(data), "-A", "trust", "-U", "postgres"], check=True,
                   capture_output=True, timeout=120)
    log = data / "server.log"
    subprocess.run([*run_as, pg_ctl, "-D", str(data), "-l", str(log), "-w", "-t", "60", "-o",
                    f"-p {port} -k {data} -c listen_addresses=127.0.0.1 -c max_connections=100", "start"],
                   check=True, capture_output=True, timeout=120)
    try:
        createdb = find_bin("createdb")
        for _ in range(50):
            r = subprocess.run([*run_as, createdb, "-h", "127.0.0.1", "-p", str(port), "-U", "postgres", "dse"],
                               capture_output=True, timeout=30)
            if r.returncode == 0:
                break
            time.sleep(0.2)
        yield f"postgresql://postgres@127.0.0.1:{port}/dse"
    finally:
        subprocess.run([*run_as, pg_ctl, "-D", str(data), "-m", "immediate", "stop"], capture_output=True, timeout=60)
        if run_as:
            shutil.rmtree(tmp, ignore_errors=True)
