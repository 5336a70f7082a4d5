from __future__ import annotations

import ctypes
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent


def gpumon(
    *args: str, timeout: float = 60, env: dict[str, str] | None = None, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """Run the real command line in a child process, as a user would."""
    full_env = dict(os.environ, PYTHONPATH=str(ROOT))
    full_env.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "gpumon", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=full_env,
        cwd=cwd,
    )


def start_serve(
    *args: str, port: int, stderr: int | None = subprocess.DEVNULL, env: dict[str, str] | None = None
) -> subprocess.Popen[bytes]:
    """`gpumon serve ARGS --listen 127.0.0.1:PORT` as a child process, as a user would run it."""
    return subprocess.Popen(
        [sys.executable, "-m", "gpumon", "serve", *args, "--listen", f"127.0.0.1:{port}"],
        cwd=ROOT,
        env=dict(env if env is not None else os.environ, PYTHONPATH=str(ROOT)),
        stdout=subprocess.DEVNULL,
        stderr=stderr,
    )


def free_port() -> int:
    """A loopback port that was free a moment ago (for servers the tests start)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def nvidia_driver_present() -> bool:
    try:
        ctypes.CDLL("libnvidia-ml.so.1")
        return True
    except OSError:
        return False


@pytest.fixture
def run_gpumon():
    return gpumon


REAL_JOBS = "tests/test_real_jobs.py"
"""Every test that runs a real training job (CPU-heavy, the longest by far)."""


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """scripts/test.sh runs the suite on several workers, a module at a time on each
    (pytest-xdist's loadfile, in this order): the real-job module first, so the other workers
    run the rest beside it, while two training jobs never share the two cores."""
    items.sort(key=lambda item: not item.nodeid.startswith(REAL_JOBS))


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--update-golden",
        action="store_true",
        help="rewrite the golden files (tests/golden/) from what the code produces now",
    )


def shipped_rule(alert: str) -> dict[str, Any]:
    """One alert rule of monitoring/gpumon.rules.yml, by name."""
    import yaml

    rules = yaml.safe_load((ROOT / "monitoring/gpumon.rules.yml").read_text())
    return next(r for g in rules["groups"] for r in g["rules"] if r.get("alert") == alert)


def served_labels(labels: str) -> str:
    """A /metrics line's labels as Prometheus stores them: empty ones dropped."""
    return ",".join(x for x in labels.split(",") if not x.endswith('=""'))


def promtool_rule_test(folder: Path, name: str, test: dict[str, Any]) -> None:
    """Run one promtool unit test (15 s evaluation) against the shipped rules; fail with its output."""
    import yaml

    doc = {
        "rule_files": [str(ROOT / "monitoring/gpumon.rules.yml")],
        "evaluation_interval": "15s",
        "tests": [{"interval": "15s", **test}],
    }
    path = folder / f"{name}.test.yml"
    path.write_text(yaml.safe_dump(doc))
    p = subprocess.run(["promtool", "test", "rules", str(path)], capture_output=True, text=True)
    assert p.returncode == 0, p.stdout + p.stderr
