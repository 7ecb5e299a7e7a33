"""Slim installs: TensorBoard and pyarrow come with the `formats` extra, not with `server`, and a
command that needs one of them says so in one line."""

from __future__ import annotations

import importlib.metadata
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.without_extras import lldmon_without


def _extras_of(package: str) -> set[str]:
    requires = importlib.metadata.requires("lldmon") or []
    return {
        m.group(1)
        for r in requires
        if re.match(rf"{package}\b", r) and (m := re.search(r"""extra\s*==\s*["']([^"']+)""", r))
    }


def test_server_extra_leaves_out_the_file_formats() -> None:
    """A service image (`.[server,postgres]`) no longer pulls TensorBoard (and its protobuf/grpc) or
    pyarrow; the test install (`dev`) still gets them through `formats`."""
    assert _extras_of("tensorboard") == {"formats"}
    assert _extras_of("pyarrow") == {"formats"}
    assert "lldmon[formats]" in [r.split(";")[0].strip() for r in importlib.metadata.requires("lldmon") or []]


def _lldmon(tmp_path: Path, blocked: str, *args: str) -> str:
    result = lldmon_without(blocked, *args, data_dir=tmp_path / "data", cwd=tmp_path)
    output = result.stdout + result.stderr
    assert result.returncode != 0, output
    assert "Traceback" not in output, output
    return output


@pytest.mark.parametrize("blocked", ["pyarrow", "tensorboard"])
def test_a_format_without_its_extra_names_it(tmp_path: Path, blocked: str) -> None:
    csv = tmp_path / "m.csv"
    csv.write_text("step,reward/mean\n1,0.5\n2,0.6\n")
    if blocked == "pyarrow":
        subprocess.run(
            [
                str(Path(sys.executable).parent / "lldmon"),
                "import",
                str(csv),
                "--run",
                "r",
                "--format",
                "csv",
            ],
            env={**os.environ, "LLDMON_DATA_DIR": str(tmp_path / "data")},
            check=True,
            capture_output=True,
            timeout=120,
        )
        output = _lldmon(tmp_path, blocked, "export", "r", "-o", str(tmp_path / "r.parquet"))
        assert not (tmp_path / "r.parquet").exists()
    else:
        (tmp_path / "tb").mkdir()
        (tmp_path / "tb" / "events.out.tfevents.1700000000.host").write_bytes(b"")
        output = _lldmon(
            tmp_path, blocked, "import", str(tmp_path / "tb"), "--run", "t", "--format", "tensorboard"
        )
    [line] = [line for line in output.strip().splitlines() if line.startswith("error")]
    assert "lldmon[formats]" in line or "formats extra" in line, output
    assert "server" not in line, output
