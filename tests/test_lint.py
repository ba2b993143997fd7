"""The code base passes its linter (ruff, configured in pyproject.toml)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_ruff_passes():
    ruff = shutil.which("ruff") or str(Path(sys.executable).parent / "ruff")
    r = subprocess.run([ruff, "check", str(ROOT)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
