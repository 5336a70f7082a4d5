"""Build the stand-in libnvidia-ml.so.1 and give tests an environment that loads it."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from gpumon.analyze.corpus import Case, record
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
            "-pthread",
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
    pid_map: dict[int, int] | None = None,
) -> Path:
    """Record `scenarios` with gpumon's simulator and write the stand-in's config for it.
    `pid_map`: the simulated processes as these (e.g. real processes of this host)."""
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
    config.write_text(
        config_from_trace(str(trace), loop=loop, faults=faults, epoch_us=epoch_us, pid_map=pid_map)
    )
    return config


def environment(config: Path | None, **extra: str) -> dict[str, str]:
    """os.environ plus what makes the real pynvml load the stand-in."""
    env = dict(os.environ)
    env["LD_LIBRARY_PATH"] = os.pathsep.join(filter(None, [str(build().parent), env.get("LD_LIBRARY_PATH")]))
    if config is not None:
        env["FAKENVML_CONFIG"] = str(config)
    env.update(extra)
    return env


MIG_BASE = 32
"""Where the stand-in's MIG units start in its unit table (never counted as GPUs)."""
# GPM shares of a fed training step on an H100-like part: SM, occupancy, tensor, DRAM, FP16, FP32, FP64
GPM_SHARES = (0.85, 0.45, 0.6, 0.5, 0.1, 0.2, 0.0)
MIG_PROFILES = ("1g.10gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb")


def mig_config(
    folder: Path,
    gpus: str,
    instances: str,
    *,
    mig_parent: int = 1,
    gpm: dict[int, tuple[float, ...]] | None = None,
    extra: tuple[str, ...] = (),
    **kwargs: object,
) -> Path:
    """GPUs playing `gpus` (one scenario each), GPU `mig_parent` in MIG mode with one instance per
    scenario of `instances` (GPU instance ids 1, 2, ...). Every GPU and instance has GPM unless
    `gpm` gives shares per unit (an empty tuple: no GPM there: a pre-Hopper GPU).
    Units are numbered as in the recording: GPUs first, then the instances."""
    whole = parse_scenarios(gpus)
    migs = parse_scenarios(instances)
    config = simulated_config(folder, f"{gpus},{instances}", **kwargs)  # type: ignore[arg-type]
    out = []
    n = len(whole)
    for line in config.read_text().splitlines():
        word, _, rest = line.partition(" ")
        if word in ("gpu", "s", "t") and rest:
            unit = int(rest.split()[0])
            if unit >= n:
                k = unit - n
                if word == "gpu":
                    _, mem, _limit, _uuid, *_ = rest.split()
                    gi = k + 1
                    uuid = f"MIG-{gi:08x}-0000-4000-8000-{mig_parent:012x}"
                    line = (
                        f"mig {MIG_BASE + k} {mig_parent} {gi} 0 {int(mem) // 8} {uuid} {MIG_PROFILES[k % 5]}"
                    )
                else:
                    fields = rest.split()[1:]
                    if word == "t":  # an eighth of the GPU: memory used scaled to the slice
                        fields[1] = str(int(fields[1]) // 8)
                        nproc = int(fields[6])
                        for j in range(nproc):
                            fields[8 + 2 * j] = str(int(fields[8 + 2 * j]) // 8)
                    line = f"{word} {MIG_BASE + k} {' '.join(fields)}"
        out.append(line)
    units = list(range(n)) + [MIG_BASE + k for k in range(len(migs))]
    for unit in units:
        shares = (gpm or {}).get(unit if unit < n else unit - MIG_BASE + n, GPM_SHARES)
        if shares:
            out.append(f"gpm {unit} {' '.join(str(x) for x in shares)}")
    out.extend(extra)
    config.write_text("\n".join(out) + "\n")
    return config
