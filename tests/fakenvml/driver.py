"""Build the stand-in libnvidia-ml.so.1 and give tests an environment that loads it."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from gpumon.corpus import Case, record
from gpumon.sim.scenarios import parse_scenarios
from tests.fakenvml.timeline import config_from_trace

HERE = Path(__file__).resolve().parent
SOURCE = HERE / "fakenvml.c"
BUILD = HERE / "build"
LIBRARY = BUILD / "libnvidia-ml.so.1"


def build() -> Path:
    """Compile the stand-in (once, and again when its source changes)."""
    if LIBRARY.exists() and LIBRARY.stat().st_mtime >= SOURCE.stat().st_mtime:
        return LIBRARY
    gcc = shutil.which("gcc") or shutil.which("cc")
    if gcc is None:
        raise RuntimeError(
            "the stand-in libnvidia-ml.so.1 needs gcc: apt-get install gcc (scripts/test.sh does)"
        )
    BUILD.mkdir(exist_ok=True)
    tmp = LIBRARY.with_suffix(".tmp")
    subprocess.run(
        [
            gcc,
            "-shared",
            "-fPIC",
            "-O2",
            "-Wall",
            "-Wextra",
            "-Werror",
            "-Wl,-soname,libnvidia-ml.so.1",
            "-o",
            str(tmp),
            str(SOURCE),
        ],
        check=True,
    )
    tmp.replace(LIBRARY)
    return LIBRARY


def simulated_config(
    folder: Path,
    scenarios: str,
    *,
    gpus: int | None = None,
    seconds: int = 120,
    seed: int = 0,
    faults: tuple[str, ...] = (),
    loop: bool = True,
    epoch_us: int = 0,
    period_s: float = 1 / 6,
) -> Path:
    """Record `scenarios` with gpumon's simulator and write the stand-in's config for it."""
    folder.mkdir(parents=True, exist_ok=True)
    names = parse_scenarios(scenarios)
    n = gpus or len(names)
    case = Case(
        name="standin",
        seed=seed,
        period_s=period_s,
        duration_s=seconds,
        noise=0.05,
        scenarios=tuple(names[i % len(names)] for i in range(n)),
    )
    trace = folder / "standin-trace.jsonl"
    record(case, str(trace))
    config = folder / "fakenvml.conf"
    config.write_text(config_from_trace(str(trace), loop=loop, faults=faults, epoch_us=epoch_us))
    return config


def environment(config: Path | None, **extra: str) -> dict[str, str]:
    """os.environ plus what makes the real pynvml load the stand-in."""
    env = dict(os.environ)
    env["LD_LIBRARY_PATH"] = os.pathsep.join(filter(None, [str(build().parent), env.get("LD_LIBRARY_PATH")]))
    if config is not None:
        env["FAKENVML_CONFIG"] = str(config)
    env.update(extra)
    return env
