"""The house's rules, as tests (docs/architecture.md): which package may import which, no import
cycle, the bindings and ML frameworks kept where they belong, the pipeline built in one place."""

from __future__ import annotations

import ast
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from .conftest import ROOT

PACKAGE = ROOT / "gpumon"
ML_FRAMEWORKS = {"torch", "tensorflow", "keras", "jax", "cupy", "pycuda", "numba"}

LAYERS: dict[str, frozenset[str]] = {
    "core": frozenset(),
    "detect": frozenset({"core"}),
    "trace": frozenset({"core"}),
    "sim": frozenset({"core"}),
    "collect": frozenset({"core", "detect", "trace", "sim"}),
    "config": frozenset({"core", "detect", "collect", "sim"}),
    "analyze": frozenset({"core", "detect", "trace", "collect", "sim", "config"}),
    "serve": frozenset({"core", "detect", "trace", "collect", "config", "analyze"}),
    "dstat": frozenset({"core"}),
    "integrations": frozenset(),
    "bench": frozenset({"integrations"}),
    "cli": frozenset(
        {"core", "detect", "trace", "sim", "collect", "config", "analyze", "serve", "dstat", "bench"}
    ),
}
"""Each package of gpumon and the packages it may import (besides itself and the top-level
`gpumon`, which holds only the version). The data flows sources -> sampler -> detector -> sinks:
`detect` (pure) sees only plain values; `collect` wires the detector's stage in; the outlets
(`serve`, `analyze`) sit above both; the job side (`integrations`, `bench`) never meets the daemon."""

HEAVY = {
    "pynvml": "the NVIDIA bindings: real GPUs only (a simulated run never loads them)",
    "psutil": "real host only (a simulated run never loads it)",
    "grpc": "the kubelet's API: the k8s extra, only where a kubelet is asked",
    "gpumon.collect.sources.podresources": "generated gRPC stubs: the k8s extra",
    "bcrypt": "basic auth only",
    "yaml": "the web config file only",
    "matplotlib": "the plot extra",
    "torch": "the bench extra, inside the training job only",
    "keras": "the bench extra, inside the training job only",
    "PIL": "the bench extra, inside the training job only",
    "gpumon.bench": "imports Keras: only the command that runs it",
    "gpumon.integrations.keras": "imports Keras: only inside a Keras job",
    "gpumon.integrations.lightning": "imports Lightning: only inside a Lightning job",
    # what a daemon on real GPUs never runs: its first sample comes sooner without their imports
    "gpumon.sim": "the simulator: simulated and driven GPUs only",
    "gpumon.trace.reader": "a replayed trace only",
    "gpumon.collect.sources.replay": "a replayed trace only",
    "tomllib": "a config file only",
    "gpumon.analyze": "the range API's analysis: loaded by the first range asked",
    "gpumon.serve.recent_range": "the range API's analysis: loaded by the first range asked",
    "gpumon.serve.pcp": "PCP's dialect: loaded by the first PCP request",
    "gpumon.collect.sources.kubelet": "the kubelet's client: only where pods are attributed",
    # the standard library's, kept out of the daemon's first answer (docs/benchmarks.md, issue 29)
    "statistics": "medians of an episode's windows: fractions and decimal, ~4 ms, not at start",
    "http": "HTTPStatus's table of reasons: only for a response that is not 200",
    "html": "escaping for the landing page: only when someone opens it",
    "json": "the state API's encoder: loaded by its first request",
    "hashlib": "basic auth's credential cache: only where users are configured",
    "gpumon.serve.analysis_api": "the range API: made by its first request",
    "gpumon.trace.writer": "the recorder's encoders (json, gzip): loaded after the first sample",
    "gpumon.trace.records": "the recorder's header: made after the first sample",
}
"""Modules imported inside functions: optional or heavy, so loaded only where they are needed
(each such import says why in a comment). gpumon/cli/ is the other exception: a command's modules
are loaded when the command runs, so `gpumon --help` or `gpumon devices` loads no daemon."""


def module_name(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
    return ".".join(parts)


def modules() -> dict[str, Path]:
    """Every module of the package (dstat's plugin file is package data, run by dstat)."""
    return {
        module_name(p): p for p in sorted(PACKAGE.rglob("*.py")) if p.parent != PACKAGE / "dstat" / "plugin"
    }


def imported(path: Path, source: str | None = None, *, top_level_only: bool = False) -> set[str]:
    """The gpumon modules a file imports (a name imported from a package counts as its module)."""
    tree = ast.parse(source if source is not None else path.read_text(), str(path))
    known = modules()
    names: set[str] = set()
    nodes = tree.body if top_level_only else list(ast.walk(tree))
    for node in nodes:
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names if a.name.startswith("gpumon"))
        elif (
            isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("gpumon")
        ):
            for alias in node.names:
                sub = f"{node.module}.{alias.name}"
                names.add(sub if sub in known else str(node.module))
    return names


def all_imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


def package_of(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 2 or (len(parts) == 2 and parts[1] in LAYERS) else "gpumon"


def layer_violations(name: str, found: set[str]) -> list[str]:
    here = package_of(name)
    allowed = LAYERS.get(here)
    if allowed is None:
        return [f"{name}: package {here!r} is not in the layer table"] if here != "gpumon" else []
    bad = []
    for target in sorted(found):
        there = package_of(target)
        if there not in (here, "gpumon") and there not in allowed:
            bad.append(f"{name} imports {target}: {here} may import only {sorted(allowed) or 'nothing'}")
    return bad


def test_every_package_keeps_to_its_layer() -> None:
    problems = [bad for name, path in modules().items() for bad in layer_violations(name, imported(path))]
    assert not problems, "\n".join(problems)


def test_the_layer_table_itself_has_no_cycle() -> None:
    def reach(pkg: str, seen: tuple[str, ...]) -> None:
        assert pkg not in seen, f"layer cycle: {' -> '.join((*seen, pkg))}"
        for nxt in LAYERS[pkg]:
            reach(nxt, (*seen, pkg))

    for pkg in LAYERS:
        reach(pkg, ())
    assert set(LAYERS) == {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").exists()}


def test_the_detector_importing_the_sampler_is_caught() -> None:
    """The check that guards the pure detector really fails when it should (the issue's "try it")."""
    source = "from gpumon.collect.sampler import Sampler\n"
    found = imported(PACKAGE / "detect" / "stage.py", source)
    assert layer_violations("gpumon.detect.stage", found) == [
        "gpumon.detect.stage imports gpumon.collect.sampler: detect may import only ['core']"
    ]


def module_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    cycles = []
    state: dict[str, int] = {}

    def visit(node: str, stack: list[str]) -> None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                cycles.append([*stack[stack.index(nxt) :], nxt])
            elif nxt not in state:
                visit(nxt, stack)
        stack.pop()
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node, [])
    return cycles


def test_no_import_cycle_between_modules_or_packages() -> None:
    mods = modules()
    graph = {name: imported(path, top_level_only=True) & set(mods) - {name} for name, path in mods.items()}
    assert module_cycles(graph) == []
    packages: dict[str, set[str]] = {}
    for name, targets in graph.items():
        packages.setdefault(package_of(name), set()).update(package_of(t) for t in targets)
    packages = {k: v - {k, "gpumon"} for k, v in packages.items()}
    assert module_cycles(packages) == []


def test_the_cycle_check_finds_a_cycle() -> None:
    assert module_cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == [["a", "b", "c", "a"]]


def _says_why(lines: list[str], first: int, last: int) -> bool:
    """A comment on the import, or above it (over a block of imports, the block's comment)."""
    if any("#" in lines[i - 1] for i in range(first, last + 1)):
        return True
    i = first - 1
    while i >= 1 and lines[i - 1].strip().startswith(("import ", "from ")):
        if "#" in lines[i - 1]:
            return True
        i -= 1
    return i >= 1 and lines[i - 1].strip().startswith("#")


def test_imports_inside_functions_are_heavy_or_optional_and_say_why() -> None:
    problems = []
    for name, path in modules().items():
        if name.startswith("gpumon.cli"):
            continue  # a command loads what it runs when it runs (gpumon/cli/app.py)
        lines = path.read_text().splitlines()
        tree = ast.parse("\n".join(lines), str(path))
        for fn in ast.walk(tree):
            if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for node in ast.walk(fn):
                if not isinstance(node, (ast.Import, ast.ImportFrom)):
                    continue
                mod = node.module if isinstance(node, ast.ImportFrom) else node.names[0].name
                why = next((k for k in HEAVY if mod == k or (mod or "").startswith(k + ".")), None)
                where = f"{path.relative_to(ROOT)}:{node.lineno}"
                if why is None:
                    problems.append(f"{where}: imports {mod} inside a function: import it at the top")
                    continue
                if not _says_why(lines, node.lineno, node.end_lineno or node.lineno):
                    problems.append(f"{where}: imports {mod} inside a function without saying why")
    assert not problems, "\n".join(problems)


def test_the_daemon_never_imports_the_job_side_and_the_hooks_need_only_the_standard_library() -> None:
    for name, path in modules().items():
        if package_of(name) in ("bench", "integrations"):
            continue
        assert not any(m.startswith("gpumon.integrations") for m in imported(path)), name
    hooks = PACKAGE / "integrations" / "__init__.py"
    assert all_imports(hooks) <= set(sys.stdlib_module_names) | {"__future__"}, all_imports(hooks)
    assert imported(hooks) == set(), "importing the hooks into a training job loads no gpumon module"


def test_only_the_nvml_source_imports_pynvml_and_only_the_host_source_psutil() -> None:
    for path in modules().values():
        rel = path.relative_to(ROOT).as_posix()
        found = all_imports(path)
        if "pynvml" in found:
            assert rel == "gpumon/collect/sources/nvml/source.py", rel
        if "psutil" in found:
            assert rel == "gpumon/collect/sources/host.py", rel


def test_the_daemon_never_imports_an_ml_framework() -> None:
    for name, path in modules().items():
        if package_of(name) in ("bench", "integrations"):
            continue
        assert not all_imports(path) & ML_FRAMEWORKS, name


def test_the_top_level_holds_packages_and_a_handful_of_modules() -> None:
    loose = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert loose == ["__init__.py", "__main__.py"], loose


@pytest.mark.parametrize(
    ("statement", "never"),
    [
        ("import gpumon", ("gpumon.serve", "gpumon.bench", "gpumon.analyze", "gpumon.collect")),
        ("import gpumon.detect.tracker", ("gpumon.collect", "gpumon.serve", "gpumon.trace")),
        ("from gpumon.cli import main", ("gpumon.serve", "gpumon.analyze", "gpumon.bench")),
    ],
)
def test_importing_a_layer_loads_nothing_above_it(statement: str, never: tuple[str, ...]) -> None:
    code = textwrap.dedent(
        f"""
        import sys
        {statement}
        print(sorted(m for m in sys.modules if m.startswith({never!r})))
        """
    )
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert p.returncode == 0 and p.stdout.strip() == "[]", p.stdout + p.stderr


def test_simulated_runs_do_not_even_load_pynvml() -> None:
    code = (
        "import sys; from gpumon.cli import main; main(['devices','--simulate','healthy','--json']);"
        "print('LOADED', 'pynvml' in sys.modules, 'psutil' in sys.modules)"
    )
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert "LOADED False False" in p.stdout, p.stdout + p.stderr


NOT_AT_START = {
    # what the daemon never imports before its first sample, and an interpreter that loads it at
    # its start pays before every command: setuptools' default editable install does, with the
    # import hook its .pth file runs (scripts/setup.sh installs a plain path instead: ~10 ms)
    "pathlib": "paths as objects: nothing the first sample reads needs them",
    "urllib": "URLs: pathlib's",
    "importlib.util": "the editable install's import hook",
}


def test_a_daemon_on_gpus_has_loaded_nothing_kept_out_of_its_first_sample(tmp_path: Path) -> None:
    """What HEAVY keeps out of the start stays out of it: at the moment `gpumon serve` on GPUs (the
    stand-in driver, no config file) publishes its first sample, none of it is loaded but the
    bindings the sample is read with: not psutil either, as the first tick leaves the host out
    (Sampler.start). An import at a module's top that one of them crept back into (statistics did,
    with the advisor) is a few milliseconds of every daemon's first answer (docs/benchmarks.md,
    issue 29)."""
    from tests.fakenvml import driver

    config = driver.simulated_config(tmp_path, "starved-cpu", gpus=2, seconds=60)
    kept_out = sorted((set(HEAVY) - {"pynvml"}) | set(NOT_AT_START))
    code = textwrap.dedent(
        f"""
        import os, sys
        from gpumon.serve import daemon
        publish = daemon.Daemon._publish
        def first(self, tick, verdicts):
            loaded = [k for k in {kept_out!r} if any(m == k or m.startswith(k + ".") for m in sys.modules)]
            print("GPUS", len(tick.gpus), "LOADED", loaded, flush=True)
            os._exit(0)
        daemon.Daemon._publish = first
        from gpumon.cli import main
        main(["serve", "--listen", "127.0.0.1:0", "--record-dir", {str(tmp_path / "rec")!r}])
        """
    )
    env = driver.environment(config, PYTHONPATH=str(ROOT))
    env.pop("GPUMON_CONFIG", None)
    p = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, env=env, timeout=60
    )
    assert "GPUS 2 LOADED []" in p.stdout, p.stdout + p.stderr


def test_the_pipeline_is_built_in_one_place() -> None:
    """Sampler, detector stage and sources are put together by gpumon.collect.pipeline alone;
    commands, the daemon, the demo and the benchmarks ask it for a Pipeline."""
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
        if rel in allowed or "/plugin/" in rel:
            continue
        tree = ast.parse(path.read_text(), rel)
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in builders:
                raise AssertionError(
                    f"{rel}:{node.lineno} builds a {node.func.id} itself: use gpumon.collect.pipeline"
                )


# what each distribution in setup.cfg is imported as, where the two names differ
IMPORT_NAMES = {
    "nvidia-ml-py": "pynvml",
    "PyYAML": "yaml",
    "Pillow": "PIL",
    "grpcio": "grpc",
    "protobuf": "google",
}


THE_JOBS_OWN = {
    "torch": "Keras's backend: the user's own build (a GPU machine keeps its CUDA one; docs/install.md)",
    "numpy": "Keras brings it (the bench extra)",
    "lightning": "the user's framework: the callback runs inside their Trainer",
    "pytorch_lightning": "the user's framework: the callback runs inside their Trainer",
}
"""Imported only inside a training job, from what that job already has installed."""


def declared_imports() -> tuple[set[str], set[str]]:
    """(the base dependencies' import names, the optional extras' but dev's) from setup.cfg."""
    import configparser
    import re

    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg")

    def names(text: str) -> set[str]:
        out = set()
        for line in text.splitlines():
            line = line.split("#", 1)[0].strip()
            if line:
                dist = re.split(r"[<>=!~\[; ]", line, maxsplit=1)[0]
                out.add(IMPORT_NAMES.get(dist, dist.replace("-", "_").lower()))
        return out

    base = names(cfg["options"]["install_requires"])
    extras = set().union(*(names(v) for k, v in cfg["options.extras_require"].items() if k != "dev"))
    return base, extras | set(THE_JOBS_OWN)


def test_every_third_party_import_is_a_declared_dependency_and_the_top_level_ones_are_base() -> None:
    """A module the package imports must be one its installation brings: at the top of a module
    (loaded by every command that loads it), a base dependency; inside a function, an extra's at
    least. prometheus_client, for one, is the tests' oracle only (dev): the daemon must not need it."""
    base, extras = declared_imports()
    stdlib = set(sys.stdlib_module_names) | {"__future__"}
    problems = []
    for name, path in modules().items():
        tree = ast.parse(path.read_text(), str(path))
        top = {n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))}
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                found = [a.name.split(".")[0] for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                found = [node.module.split(".")[0]]
            else:
                continue
            for mod in found:
                if mod in stdlib or mod == "gpumon":
                    continue
                if mod not in base | extras:
                    problems.append(f"{name}: imports {mod}, which setup.cfg does not install")
                elif node in top and mod not in base and not any(name.startswith(k) for k in HEAVY):
                    problems.append(f"{name}: imports {mod} (an extra's) at the top")
    assert not problems, "\n".join(problems)
