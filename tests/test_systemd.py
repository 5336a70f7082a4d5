"""The systemd unit: systemd's own tools verify it and rate its exposure."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import ROOT

UNIT = ROOT / "systemd" / "gpumon.service"


def settings() -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for line in UNIT.read_text().splitlines():
        if "=" in line and not line.startswith(("#", "[")):
            key, _, value = line.partition("=")
            out.setdefault(key.strip(), []).append(value.strip())
    return out


@pytest.fixture
def installed_copy(tmp_path: Path) -> Path:
    """The unit with ExecStart pointing at this checkout's gpumon (verify checks it exists)."""
    gpumon = Path(sys.executable).parent / "gpumon"
    assert gpumon.exists(), "gpumon is not installed in the test environment"
    unit = tmp_path / "gpumon.service"
    unit.write_text(UNIT.read_text().replace("/usr/local/bin/gpumon", str(gpumon)))
    return unit


def analyze() -> str:
    tool = shutil.which("systemd-analyze")
    if tool is None:
        pytest.fail("systemd-analyze is missing: scripts/test.sh installs Debian's systemd package")
    return tool


def test_systemd_analyze_verify_finds_nothing(installed_copy: Path) -> None:
    p = subprocess.run([analyze(), "verify", str(installed_copy)], capture_output=True, text=True)
    problems = [ln for ln in (p.stdout + p.stderr).splitlines() if "gpumon.service" in ln]
    assert p.returncode == 0 and not problems, p.stdout + p.stderr


def test_exposure_is_rated_2_or_lower(installed_copy: Path) -> None:
    p = subprocess.run(
        [analyze(), "security", "--offline=yes", str(installed_copy)], capture_output=True, text=True
    )
    m = re.search(r"Overall exposure level for gpumon\.service: (\d+\.\d+)", p.stdout + p.stderr)
    assert m, p.stdout + p.stderr
    assert float(m.group(1)) <= 2.0


def test_the_unit_is_what_the_daemon_expects() -> None:
    s = settings()
    assert s["Type"] == ["notify"] and s["Restart"] == ["on-failure"] and s["DynamicUser"] == ["yes"]
    assert s["WatchdogSec"] and s["ProtectSystem"] == ["strict"] and s["DevicePolicy"] == ["closed"]
    assert s["ExecReload"] == ["/bin/kill -HUP $MAINPID"]  # SIGHUP reloads the configuration
    allowed = " ".join(s["DeviceAllow"])
    assert "/dev/nvidiactl" in allowed and "char-nvidia-frontend" in allowed
    assert "nvidia-uvm" not in allowed, "CUDA's device: gpumon never needs it"
    assert "User" not in s or s["User"] != ["root"]
