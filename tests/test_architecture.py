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


JOB_SIDE = ("bench", "integrations")
"""What runs in the training job, never in the daemon: the Keras bench and the training-log hooks."""


def modules() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if not set(JOB_SIDE) & set(p.relative_to(PACKAGE).parts))


def test_the_daemon_never_imports_the_job_side_and_the_hooks_need_only_the_standard_library() -> None:
    for path in modules():
        assert not any(m.startswith("gpumon.integrations") for m in gpumon_imports(path)), path
    core = PACKAGE / "integrations" / "__init__.py"
    assert imports(core) <= set(sys.stdlib_module_names) | {"__future__"}, imports(core)
    assert gpumon_imports(core) == set(), "importing the hooks into a training job loads no gpumon module"


def test_only_the_nvml_source_imports_pynvml_and_only_the_host_source_psutil() -> None:
    for path in modules():
        rel = path.relative_to(ROOT).as_posix()
        found = imports(path)
        if "pynvml" in found:
            assert rel == "gpumon/collect/sources/nvml/", rel
        if "psutil" in found:
            assert rel == "gpumon/collect/sources/host.py", rel


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


def gpumon_imports(path: Path) -> set[str]:
    """Every gpumon module this file imports, at the top or inside a function."""
    tree = ast.parse(path.read_text(), str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names if a.name.startswith("gpumon"))
        elif (
            isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("gpumon")
        ):
            names.add(str(node.module))
    return names


def module_name(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
    return ".".join(parts)


def test_imports_point_one_way() -> None:
    """sources never import the simulator or the wiring; the simulator imports nothing above it;
    the detector only itself and the model; the sampler nothing above it (STYLE.md)."""
    allowed_below = {
        "gpumon.collect.sources": (
            "gpumon.collect.sources",
            "gpumon.core.model",
            "gpumon.core.problems",
            "gpumon.core.errors",
            "gpumon.core.guard",
            "gpumon.trace.reader",
            "gpumon.core.clock",
        ),
        "gpumon.sim": ("gpumon.sim", "gpumon.core.clock", "gpumon.core.errors", "gpumon.core.model"),
        "gpumon.detect": ("gpumon.detect", "gpumon.core.model"),
        "gpumon.collect.sampler": (
            "gpumon.core.model",
            "gpumon.core.problems",
            "gpumon.core.clock",
            "gpumon.core.errors",
        ),
        "gpumon.core.guard": (),
        "gpumon.core.problems": (),
    }
    for path in sorted(PACKAGE.rglob("*.py")):
        name = module_name(path)
        for layer, allowed in allowed_below.items():
            if name == layer or name.startswith(layer + "."):
                bad = {m for m in gpumon_imports(path) if not m.startswith(allowed) or m == "gpumon"}
                assert not bad, (
                    f"{name} imports {sorted(bad)}: imports point sources -> sampler -> detector -> sinks"
                )


def test_the_simulator_has_no_import_cycle() -> None:
    graph = {
        module_name(p): {m for m in gpumon_imports(p) if m.startswith("gpumon.sim")}
        for p in (PACKAGE / "sim").glob("*.py")
    }
    seen: set[str] = set()

    def visit(node: str, path: tuple[str, ...]) -> None:
        assert node not in path, f"import cycle: {' -> '.join((*path, node))}"
        if node in seen:
            return
        for nxt in graph.get(node, ()):
            visit(nxt, (*path, node))
        seen.add(node)

    for node in graph:
        visit(node, ())


def test_the_pipeline_is_built_in_one_place() -> None:
    """Sampler, detector stage and sources are put together by gpumon.collect.pipeline alone; commands,
    the daemon, the demo and the benchmarks ask it for a Pipeline."""
    builders = {"Sampler", "DetectorSink", "open_sources", "Fleet"}
    allowed = {
        "gpumon/collect/pipeline/pipeline.py",
        "gpumon/collect/pipeline/sources.py",
        "gpumon/cli/serve.py",
        "gpumon/analyze/corpus.py",
        "gpumon/sim/driven.py",
    }
    for path in sorted([*PACKAGE.rglob("*.py"), *(ROOT / "benchmarks").glob("*.py")]):
        rel = path.relative_to(ROOT).as_posix()
        if rel in allowed:
            continue
        tree = ast.parse(path.read_text(), rel)
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in builders:
                raise AssertionError(
                    f"{rel}:{node.lineno} builds a {node.func.id} itself: use gpumon.collect.pipeline"
                )
