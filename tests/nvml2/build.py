"""Build the second stand-in libnvidia-ml.so.1 (standin2.c) and the environment that loads it.

    from tests.nvml2.build import environment
    subprocess.run([sys.executable, "-m", "benchmarks.nvml_cost", ...], env=environment(gpus=8))

The variables the library reads (tests/nvml2/README.md has the whole story):
  NVML2_GPUS     GPUs to simulate, 0..64 (default 8), fixed at the first nvmlInit
  NVML2_NOW_US   timeline time in us, read on every call; unset or empty: the real clock
  NVML2_XIDS     scripted XID critical errors, "GPU:XID@T_US,...", read on every event wait

`build()` compiles once into tests/nvml2/build/ and again only when standin2.c is newer than the
library; the new library replaces the old one atomically (os.replace), so a process that has the
old one loaded keeps it and concurrent builds cannot leave a half-written file.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterable
from pathlib import Path

HERE = Path(__file__).resolve().parent
SOURCE = HERE / "standin2.c"
BUILD_DIR = HERE / "build"
LIBRARY = BUILD_DIR / "libnvidia-ml.so.1"
CFLAGS = ("-shared", "-fPIC", "-O2", "-Wall", "-Wextra", "-Werror", "-pthread")
MAX_GPUS = 64


class BuildError(RuntimeError):
    """The stand-in could not be compiled (no gcc, or the compiler refused the source)."""


def build() -> Path:
    """The path of the compiled stand-in, compiling it first if it is missing or older than
    standin2.c."""
    if LIBRARY.exists() and LIBRARY.stat().st_mtime >= SOURCE.stat().st_mtime:
        return LIBRARY
    gcc = shutil.which("gcc")
    if gcc is None:
        raise BuildError(
            "gcc not found on PATH: it is needed to build the NVML stand-in "
            f"{LIBRARY} from {SOURCE} (install gcc, e.g. apt-get install gcc)"
        )
    BUILD_DIR.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=".libnvidia-ml.", suffix=".tmp", dir=BUILD_DIR)
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        done = subprocess.run(
            [gcc, *CFLAGS, "-Wl,-soname,libnvidia-ml.so.1", "-o", str(tmp), str(SOURCE)],
            capture_output=True,
            text=True,
            check=False,
        )
        if done.returncode != 0:
            raise BuildError(f"gcc failed to build {SOURCE.name} (exit {done.returncode}):\n{done.stderr}")
        tmp.chmod(0o755)  # mkstemp made it 0600
        os.replace(tmp, LIBRARY)
    finally:
        tmp.unlink(missing_ok=True)
    return LIBRARY


def xids_spec(events: Iterable[tuple[int, int, int]]) -> str:
    """NVML2_XIDS for (gpu index, xid, timeline time in us) events, e.g. [(3, 79, t)] -> "3:79@t"."""
    return ",".join(f"{gpu}:{xid}@{t_us}" for gpu, xid, t_us in events)


def environment(
    gpus: int = 8,
    *,
    now_us: int | None = None,
    xids: Iterable[tuple[int, int, int]] = (),
    **extra: str,
) -> dict[str, str]:
    """The environment for a subprocess that loads the stand-in for `gpus` GPUs through the real
    pynvml: os.environ with the library's directory first on LD_LIBRARY_PATH (built if needed)
    and NVML2_GPUS set.

    `now_us`: hold timeline time there (NVML2_NOW_US; the child may move it by setting
    os.environ["NVML2_NOW_US"]); None, the default, runs the timeline on the real clock, even if
    this process has NVML2_NOW_US set. `xids`: XID critical errors to script, as (gpu index, xid,
    timeline time in us) (NVML2_XIDS). `extra` adds or overrides variables last."""
    if not 0 <= gpus <= MAX_GPUS:
        raise ValueError(f"gpus must be 0..{MAX_GPUS}, not {gpus}")
    library_dir = str(build().parent)
    env = dict(os.environ)
    before = env.get("LD_LIBRARY_PATH")
    env["LD_LIBRARY_PATH"] = f"{library_dir}{os.pathsep}{before}" if before else library_dir
    env["NVML2_GPUS"] = str(gpus)
    env.pop("NVML2_NOW_US", None)
    env.pop("NVML2_XIDS", None)
    if now_us is not None:
        env["NVML2_NOW_US"] = str(now_us)
    spec = xids_spec(xids)
    if spec:
        env["NVML2_XIDS"] = spec
    env.update(extra)
    return env
