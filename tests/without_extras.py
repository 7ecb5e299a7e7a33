"""Run the `lldmon` CLI in a child process where some top-level modules cannot be imported, as in an
install without the extra that provides them."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

BLOCKER = """
import importlib.abc, sys
BLOCKED = set(sys.argv[1].split(","))

class NotInstalled(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

sys.meta_path.insert(0, NotInstalled())
sys.argv = ["lldmon", *sys.argv[2:]]
from monitor.cli import main
main()
"""


def lldmon_without(
    blocked: str, *args: str, data_dir: Path | None = None, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """`lldmon ARGS` with the comma-separated modules `blocked`; `data_dir` becomes LLDMON_DATA_DIR and
    a database URL from the environment is dropped."""
    env = {**os.environ, "COLUMNS": "300"}
    if data_dir is not None:
        env["LLDMON_DATA_DIR"] = str(data_dir)
    env.pop("LLDMON_DATABASE_URL", None)
    return subprocess.run(
        [sys.executable, "-c", BLOCKER, blocked, *args],
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
    )
