"""What users install is the wheel, not the source tree: build it (and the sdist) as pip would,
install it into a clean virtual environment, and run the commands a new user runs first, from a
directory outside the tree. The editable install the other tests use cannot see a package that
the wheel leaves out; this test can."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
import venv
import zipfile
from pathlib import Path

import pytest

from gpumon import __version__

from .conftest import ROOT

PACKAGED = ("gpumon",)


def _run(cmd: list[str], **kw: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600, **kw)  # type: ignore[call-overload,no-any-return]


@pytest.fixture(scope="module")
def dists(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The wheel and sdist built from the tree, and a wheel rebuilt from that sdist."""
    out = tmp_path_factory.mktemp("dist")
    tree = clean_copy(tmp_path_factory.mktemp("clone") / "gpumon")
    p = _run([sys.executable, "-m", "build", "--sdist", "--wheel", "--outdir", str(out), str(tree)])
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    wheel = next(out.glob("gpumon_datastall-*.whl"))
    sdist = next(out.glob("gpumon_datastall-*.tar.gz"))
    again = tmp_path_factory.mktemp("from-sdist")
    p = _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-w", str(again), str(sdist)])
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    return {"wheel": wheel, "sdist": sdist, "wheel_from_sdist": next(again.glob("*.whl"))}


def clean_copy(dest: Path) -> Path:
    """The files a fresh clone would have (tracked, and new ones not ignored), without the build/
    and egg-info leftovers of earlier builds here, which setuptools would ship again."""
    p = _run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT)
    assert p.returncode == 0, p.stderr
    for rel in filter(None, p.stdout.split("\0")):
        src = ROOT / rel
        if src.is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)
    return dest


def tracked_files() -> set[str]:
    p = _run(["git", "ls-files", "--cached", "--others", "--exclude-standard", *PACKAGED], cwd=ROOT)
    assert p.returncode == 0, p.stderr
    return {f for f in p.stdout.split() if not f.endswith((".pyc", ".md")) and (ROOT / f).is_file()}


def wheel_files(wheel: Path) -> set[str]:
    names = zipfile.ZipFile(wheel).namelist()
    return {n for n in names if n.split("/", 1)[0] in PACKAGED}


def test_the_wheel_holds_exactly_the_tracked_package_files(dists: dict[str, Path]) -> None:
    tracked = tracked_files()
    got = wheel_files(dists["wheel"])
    assert not tracked - got, f"tracked but not in the wheel: {sorted(tracked - got)}"
    assert not got - tracked, f"in the wheel but not tracked: {sorted(got - tracked)}"


def test_a_wheel_built_from_the_sdist_is_the_same(dists: dict[str, Path]) -> None:
    assert wheel_files(dists["wheel_from_sdist"]) == wheel_files(dists["wheel"])
    with tarfile.open(dists["sdist"]) as tar:
        names = {n.split("/", 1)[1] for n in tar.getnames() if "/" in n}
    for needed in (
        "setup.cfg",
        "pyproject.toml",
        "README.md",
        "gpumon/__init__.py",
        "gpumon/sim/__init__.py",
    ):
        assert needed in names, needed


@pytest.fixture(scope="module")
def installed(dists: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A clean virtual environment (no system site-packages, not the test venv) with the wheel."""
    where = tmp_path_factory.mktemp("venv") / "v"
    venv.create(where, with_pip=True, clear=True)
    p = _run(
        [
            str(where / "bin/python"),
            "-m",
            "pip",
            "install",
            "--disable-pip-version-check",
            "-q",
            str(dists["wheel"]),
        ]
    )
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    return where


def _user_env(venv_dir: Path, home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "GPUMON", "VIRTUAL_ENV"))}
    env["PATH"] = f"{venv_dir / 'bin'}:/usr/bin:/bin"
    env["HOME"] = str(home)
    return env


def test_the_installed_commands_work_outside_the_tree(installed: Path, tmp_path: Path) -> None:
    env = _user_env(installed, tmp_path)
    gpumon = str(installed / "bin/gpumon")
    python = str(installed / "bin/python")

    def run(*cmd: str) -> subprocess.CompletedProcess[str]:
        p = _run(list(cmd), cwd=tmp_path, env=env)
        assert "Traceback" not in p.stderr, p.stderr
        return p

    p = run(gpumon, "--version")
    assert p.returncode == 0 and p.stdout.strip() == f"gpumon {__version__}", p.stderr
    p = run(gpumon, "devices", "--simulate", "healthy", "--gpus", "2", "--json")
    assert p.returncode == 0, p.stderr
    import json

    doc = json.loads(p.stdout)
    assert [g["index"] for g in doc["gpus"]] == [0, 1]
    p = run(gpumon, "serve", "--check-config")
    assert p.returncode == 0 and "configuration ok" in p.stdout, p.stdout + p.stderr
    p = run(python, "-m", "gpumon", "--version")
    assert p.returncode == 0 and p.stdout.strip() == f"gpumon {__version__}"
    p = run(python, "-m", "gpumon")
    assert p.returncode == 2 and "usage: gpumon" in p.stderr
    # the module really comes from the installed wheel, not from a tree on the path
    p = run(python, "-c", "import gpumon, sys; print(gpumon.__file__)")
    assert str(installed) in p.stdout and str(ROOT) not in p.stdout
