"""`dstat --gpu` where `dstat` is Performance Co-Pilot's pcp-dstat (Ubuntu 24.04, Fedora, RHEL,
any host with the `pcp` package), which never loads a `dstat_*.py` plugin.

pcp-dstat's plugins are INI files whose columns are PCP metrics, and PCP's pmdaopenmetrics turns
an HTTP endpoint into PCP metrics. So installing for pcp-dstat is three things:
1. `$PCP_PMDAS_DIR/openmetrics/config.d/gpumon.url`: the daemon's `/metrics/pcp` (gpumon.pcp),
   with an `HEADER: Authorization: Basic ...` line when the daemon wants basic auth;
2. the openmetrics PMDA registered with pmcd, if it is not (its own `Install`; noted, so that
   uninstall removes only what install added);
3. a `gpu` plugin file in `$PCP_SYSCONF_DIR/dstat/` (or `~/.pcp/dstat/` with --user).
What was installed is written to a manifest beside the plugin, and uninstall removes exactly that.
"""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from gpumon.errors import OutputError

PLUGIN = """\
#
# pcp-dstat(1) plugin for gpumon: `dstat --gpu` (written by `gpumon dstat-plugin install`)
#
# Per GPU: utilization %, memory used %, and gpumon's verdict as dstat's short codes:
#   ok healthy   STcpu STio SThst starved by CPU, storage, the host   stall stalled
#   sync sync-stall   under underutilized   small kernels too small (GPM)   idle no job
#   ? unknown   lost the GPU is lost
# The metrics come from `gpumon serve` through PCP's openmetrics PMDA (config.d/gpumon.url).
# With the daemon down the columns stay empty: `pminfo -f openmetrics.control.status` says why.
#
[gpu]
label = %I
width = 5
precision = 0
grouptype = 1
util = openmetrics.gpumon.gpu.util
mem = openmetrics.gpumon.gpu.mem
state = openmetrics.gpumon.gpu.state
"""
MANIFEST = ".gpumon-installed.json"
CLEAN_PATH = "/usr/sbin:/usr/bin:/sbin:/bin"
"""PCP's scripts run its own python3 (with the pcp module), never one a virtualenv puts first."""


def pcp_conf(path: str = "/etc/pcp.conf") -> dict[str, str]:
    conf = {
        "PCP_SYSCONF_DIR": "/etc/pcp",
        "PCP_PMDAS_DIR": "/var/lib/pcp/pmdas",
        "PCP_PMCDCONF_PATH": "/etc/pcp/pmcd/pmcd.conf",
    }
    try:
        with open(path) as f:
            for line in f:
                key, sep, value = line.strip().partition("=")
                if sep and key in conf:
                    conf[key] = value
    except OSError:
        pass
    return conf


def which_dstat() -> str | None:
    """`pcp` when `dstat` is pcp-dstat, `dstat` for the original (0.7.4), None when neither."""
    found = shutil.which("dstat")
    if found is None:
        return None
    real = os.path.realpath(found)
    if "pcp" in Path(real).name:
        return "pcp"
    try:
        with open(real, "rb") as f:
            head = f.read(4096)
    except OSError:
        return "dstat"
    return "pcp" if b"from pcp import" in head or b"pcp-dstat" in head else "dstat"


@dataclass
class Installed:
    files: list[str] = field(default_factory=list)
    registered_pmda: bool = False


def _manifest(plugin_dir: Path) -> Path:
    return plugin_dir / MANIFEST


def plugin_dir(system: bool, conf: dict[str, str], home: Path | None = None) -> Path:
    return Path(conf["PCP_SYSCONF_DIR"]) / "dstat" if system else (home or Path.home()) / ".pcp" / "dstat"


def url_file(conf: dict[str, str]) -> Path:
    return Path(conf["PCP_PMDAS_DIR"]) / "openmetrics" / "config.d" / "gpumon.url"


def pmda_registered(conf: dict[str, str]) -> bool:
    try:
        text = Path(conf["PCP_PMCDCONF_PATH"]).read_text()
    except OSError:
        return False
    return any(ln.split()[:1] == ["openmetrics"] for ln in text.splitlines() if not ln.startswith("#"))


def install(
    system: bool, url: str, basic_auth: str | None, conf: dict[str, str] | None = None
) -> tuple[list[Path], list[str]]:
    """Returns what was written and what the user should know (notes)."""
    conf = conf or pcp_conf()
    notes: list[str] = []
    done = Installed()
    pdir = plugin_dir(system, conf)
    previous = _read_manifest(pdir)
    target = pdir / "gpu"
    _write(target, PLUGIN.encode(), 0o644, "--user" if system else "--system")
    done.files.append(str(target))
    uf = url_file(conf)
    body = f"{url.rstrip('/')}/metrics/pcp\n"
    if basic_auth:
        token = base64.b64encode(basic_auth.encode()).decode()
        body += f"HEADER: Authorization: Basic {token}\n"
    if system:
        _settle_ctime(uf, body.encode())
        _write(uf, body.encode(), 0o600 if basic_auth else 0o644, None)
        done.files.append(str(uf))
        if not pmda_registered(conf):
            _register_pmda(conf)
            done.registered_pmda = True
            notes.append("registered PCP's openmetrics PMDA with pmcd (uninstall removes it again)")
    elif not uf.exists():
        notes.append(
            f"{uf} is missing and needs root: run `sudo gpumon dstat-plugin install --system` once "
            "(it also registers PCP's openmetrics PMDA if needed)"
        )
    done.registered_pmda = done.registered_pmda or previous.registered_pmda
    _write(_manifest(pdir), json.dumps(done.__dict__, indent=1).encode(), 0o644, None)
    return [Path(p) for p in done.files], notes


def uninstall(system: bool, conf: dict[str, str] | None = None) -> tuple[list[Path], list[str]]:
    conf = conf or pcp_conf()
    pdir = plugin_dir(system, conf)
    done = _read_manifest(pdir)
    notes = []
    removed = []
    for name in done.files:
        try:
            Path(name).unlink()
            removed.append(Path(name))
        except FileNotFoundError:
            continue
        except OSError as e:
            raise OutputError(f"{name}: cannot remove: {e.strerror}") from None
    if done.registered_pmda:
        _unregister_pmda(conf)
        notes.append("removed PCP's openmetrics PMDA from pmcd, as install had registered it")
    elif system and pmda_registered(conf):
        notes.append("PCP's openmetrics PMDA was registered before gpumon and stays; nothing was restarted")
    _manifest(pdir).unlink(missing_ok=True)
    return removed, notes


def _read_manifest(pdir: Path) -> Installed:
    try:
        doc = json.loads(_manifest(pdir).read_text())
        return Installed([str(f) for f in doc.get("files", [])], bool(doc.get("registered_pmda")))
    except (OSError, ValueError, AttributeError):
        return Installed()


def _settle_ctime(path: Path, data: bytes) -> None:
    """pmdaopenmetrics re-reads a .url file when its ctime, in whole seconds, grows: a new URL
    written within the same second as the old one would go unseen. Wait out that second."""
    try:
        st = path.stat()
        if path.read_bytes() != data and int(st.st_ctime) >= int(time.time()):
            time.sleep(1.0 - time.time() % 1.0 + 0.01)
    except OSError:
        pass


def _write(path: Path, data: bytes, mode: int, hint: str | None) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_bytes(data)
        tmp.chmod(mode)
        tmp.replace(path)
    except OSError as e:
        extra = f" (try {hint}, or run as root)" if hint else " (run as root)"
        raise OutputError(f"{path}: cannot write: {e.strerror}{extra}") from None


def _pmda_script(conf: dict[str, str], name: str) -> None:
    d = Path(conf["PCP_PMDAS_DIR"]) / "openmetrics"
    script = d / name
    if not script.exists():
        raise OutputError(f"{script}: missing: install PCP's openmetrics PMDA (package pcp, and python3-pcp)")
    p = subprocess.run(
        [str(script)],
        cwd=d,
        env={"PATH": CLEAN_PATH, "HOME": "/root", "LANG": "C"},
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=180,
    )
    if p.returncode != 0:
        last = (p.stdout + p.stderr).strip().splitlines()[-1:] or ["no output"]
        raise OutputError(f"{script} failed: {last[0]}")


def probe(url: str, wait_s: float = 5.0) -> str:
    """One line on whether PCP reads gpumon now: what `dstat --gpu` will show, and if blank, why."""
    env = {"PATH": CLEAN_PATH, "LANG": "C"}
    deadline = time.monotonic() + wait_s
    while True:
        try:
            p = subprocess.run(
                ["pmprobe", "-v", "openmetrics.gpumon.gpu.state"],
                env=env,
                capture_output=True,
                text=True,
                timeout=10,
            )
        except (OSError, subprocess.TimeoutExpired) as e:
            return f"cannot ask PCP (pmprobe: {e}): is the pcp package installed?"
        if p.returncode != 0:
            why = (p.stderr.strip().splitlines() or ["no answer"])[-1]
            return f"pmcd does not answer ({why}): start it (`systemctl start pmcd`), then run `dstat --gpu`"
        fields = p.stdout.split(maxsplit=2)
        if len(fields) >= 2 and fields[1].lstrip("-").isdigit() and int(fields[1]) > 0:
            return f"PCP reads {fields[1]} GPU(s) from gpumon serve at {url}: `dstat --gpu` shows them"
        if time.monotonic() >= deadline:
            break
        time.sleep(0.5)
    status = subprocess.run(
        ["pminfo", "-f", "openmetrics.control.status"], env=env, capture_output=True, text=True, timeout=10
    ).stdout
    found = re.search(r'"gpumon"\] value "(.*)"', status)
    why = found.group(1) if found else "the openmetrics PMDA has not read it yet"
    errno = re.search(r"\[Errno -?\d+\] ([^'\")]+)", why)
    why = errno.group(1) if errno else re.sub(r"^failed to fetch URL or execute script \S+: ", "", why)[:200]
    return (
        f"PCP cannot read gpumon serve at {url} yet ({why}): `dstat --gpu` shows blank columns "
        "until the daemon answers there"
    )


def _register_pmda(conf: dict[str, str]) -> None:
    _pmda_script(conf, "Install")


def _unregister_pmda(conf: dict[str, str]) -> None:
    _pmda_script(conf, "Remove")
