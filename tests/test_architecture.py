"""The import rules that keep the monitor from disturbing what it watches (STYLE.md)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

from .conftest import ROOT

PACKAGE = ROOT / "gpumon"
ML_FRAMEWORKS = {"torch", "tensorflow", "keras", "jax", "cupy", "pycuda", "numba"}


def imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


def modules() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if "bench" not in p.relative_to(PACKAGE).parts)


def test_only_the_nvml_source_imports_pynvml_and_only_the_host_source_psutil() -> None:
    for path in modules():
        rel = path.relative_to(ROOT).as_posix()
        found = imports(path)
        if "pynvml" in found:
            assert rel == "gpumon/sources/nvml.py", rel
        if "psutil" in found:
            assert rel == "gpumon/sources/host.py", rel


def test_the_daemon_never_imports_an_ml_framework() -> None:
    for path in modules():
        assert not imports(path) & ML_FRAMEWORKS, path


def test_simulated_runs_do_not_even_load_pynvml() -> None:
    code = (
        "import sys; from gpumon.cli import main; main(['devices','--simulate','healthy','--json']);"
        "print('LOADED', 'pynvml' in sys.modules, 'psutil' in sys.modules)"
    )
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert "LOADED False False" in p.stdout, p.stdout + p.stderr
