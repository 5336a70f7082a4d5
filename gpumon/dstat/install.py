"""`gpumon dstat-plugin install|uninstall`: put the plugin where dstat and dool look for it."""

from __future__ import annotations

import os
import tempfile
from importlib import resources
from pathlib import Path

from gpumon.core.errors import OutputError

PLUGIN = "dstat_gpu.py"


def targets(system: bool, home: Path | None = None) -> list[Path]:
    """dstat finds ~/.dstat/ first and /usr/local/share/dstat/ last; dool has its own places."""
    if system:
        return [Path("/usr/local/share/dstat/dstat_gpu.py"), Path("/usr/local/share/dool/dool_gpu.py")]
    home = home or Path.home()
    xdg = os.environ.get("XDG_DATA_HOME") or ""
    # the XDG spec's rule: a relative path is ignored (XDG_DATA_HOME='~/.local/share', quoted so that
    # no shell expanded it, made a directory named "~" wherever install ran)
    data = Path(xdg) if os.path.isabs(xdg) else home / ".local" / "share"
    return [home / ".dstat" / "dstat_gpu.py", data / "dool" / "plugins" / "dool_gpu.py"]


def source() -> bytes:
    return resources.files("gpumon.dstat").joinpath("plugin", PLUGIN).read_bytes()


def install(system: bool) -> list[Path]:
    body = source()
    done = []
    for path in targets(system):
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            _replace(path, body)
        except OSError as e:
            hint = " (try --user, or run as root)" if system else ""
            raise OutputError(f"{path}: cannot write the plugin: {e.strerror}{hint}") from None
        done.append(path)
    return done


def _replace(path: Path, body: bytes) -> None:
    """`body` put at `path` whole: written beside it, then renamed over it. Whatever stood at the
    name is replaced, never written through: a FIFO there hung the install, and a symlink there
    (as root, with --system) would have had another file overwritten."""
    fd, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    tmp = Path(name)
    try:
        os.fchmod(fd, 0o644)  # readable by every user of dstat, whatever the umask
        with os.fdopen(fd, "wb") as f:
            f.write(body)
            f.flush()
            os.fsync(f.fileno())  # whole on disk before it takes the name
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def uninstall(system: bool) -> list[Path]:
    removed = []
    for path in targets(system):
        try:
            path.unlink()
            removed.append(path)
        except FileNotFoundError:
            continue
        except OSError as e:
            raise OutputError(f"{path}: cannot remove the plugin: {e.strerror}") from None
    return removed
