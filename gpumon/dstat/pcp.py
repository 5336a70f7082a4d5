"""`dstat --gpu` where `dstat` is Performance Co-Pilot's pcp-dstat (Ubuntu 24.04, Fedora, RHEL,
any host with the `pcp` package), which never loads a `dstat_*.py` plugin.

pcp-dstat's plugins are INI files whose columns are PCP metrics, and PCP's pmdaopenmetrics turns
an HTTP endpoint into PCP metrics. So installing for pcp-dstat is three things:
1. `$PCP_PMDAS_DIR/openmetrics/config.d/gpumon.url`: the daemon's `/metrics/pcp` (gpumon.serve.pcp),
   with an `HEADER: Authorization: Basic ...` line when the daemon wants basic auth;
2. the openmetrics PMDA registered with pmcd, if it is not (its own `Install`; noted, so that
   uninstall removes only what install added);
3. a `gpu` plugin file in `$PCP_SYSCONF_DIR/dstat/` (or `~/.pcp/dstat/` with --user).
What was installed is written to a manifest beside the plugin, and uninstall removes exactly that.

Three things make `dstat --gpu` independent of the shell of whoever last touched PCP:
- pmcd.conf starts the PMDA as `python3 pmdaopenmetrics.python`, found in pmcd's own PATH:
  restarted from a shell with a virtualenv (or pyenv) first in PATH, the PMDA dies at start (no
  `pcp` module there). Install names PCP's interpreter by its absolute path instead (noted, and put
  back by uninstall).
- pcp-dstat itself runs `#!/usr/bin/env pmpython`, and pmpython runs the first `python3` in PATH:
  with a virtualenv active, `dstat` stops with "No module named 'pcp'". A system install writes
  /usr/local/bin/dstat (before /usr/bin in PATH), which runs pcp-dstat with PCP_PYTHON_PROG set to
  PCP's interpreter by its absolute path (pmpython reads that variable before pcp.conf).
- The PMDA keeps the instances it ever saw in a cache under $PCP_VAR_DIR/config/pmda/ (a 2-GPU
  daemon would show the 4 GPUs of an earlier one): install and uninstall clear gpumon's part of it
  and restart the PMDA; the installer's last line counts the GPUs `dstat --gpu` will show, stale
  ones apart.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import stat
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from gpumon.core import fetch
from gpumon.core.errors import OutputError
from gpumon.core.files import open_regular, read_regular
from gpumon.core.terminal import printable

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


WRAPPER_DIR = Path("/usr/local/bin")
"""Where a system install puts its `dstat` (pcp-dstat with PCP's python3): before /usr/bin in
Debian's, Ubuntu's and Fedora's default PATH, after a virtualenv's bin/."""
WRAPPER_MARK = "# gpumon-dstat-wrapper"
MAX_WRAPPER_BYTES = 64 * 1024
"""Read of a file found where the wrapper goes, to tell whether it is gpumon's (the wrapper is a
few hundred bytes, its mark on line 2)."""
WRAPPER = """\
#!/bin/sh
{mark}: written by `gpumon dstat-plugin install --system`, removed by its uninstall.
# pcp-dstat runs the first python3 in PATH (through pmpython), which in a virtualenv or under pyenv
# lacks PCP's `pcp` module: run it with PCP's own interpreter, whatever the PATH.
PCP_PYTHON_PROG={python}
export PCP_PYTHON_PROG
exec {pcp_dstat} "$@"
"""

PMDA_SCRIPT = "pmdaopenmetrics.python"
CLUSTER_INDOMS = 1024
"""pmdaopenmetrics: instance domain 4096 + cluster * 1024 + n holds the instances of a source's
metric n (indom 0 maps source names to cluster numbers)."""


def pcp_conf(path: str = "/etc/pcp.conf") -> dict[str, str]:
    conf = {
        "PCP_SYSCONF_DIR": "/etc/pcp",
        "PCP_PMDAS_DIR": "/var/lib/pcp/pmdas",
        "PCP_PMCDCONF_PATH": "/etc/pcp/pmcd/pmcd.conf",
        "PCP_VAR_DIR": "/var/lib/pcp",
        "PCP_PYTHON_PROG": "python3",
        "PCP_LOG_DIR": "/var/log/pcp",
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
    found = _program_in_path("dstat")
    if found is None:
        return None
    real = os.path.realpath(found)
    if "pcp" in Path(real).name:
        return "pcp"
    try:
        with open_regular(real) as f:  # (replaced by a FIFO since: refused, never waited on)
            head = f.read(4096)
    except OSError:
        return "dstat"
    return "pcp" if b"from pcp import" in head or b"pcp-dstat" in head else "dstat"


def _program_in_path(name: str, path: str | None = None) -> str | None:
    """The first `name` in `path` (default: PATH) that is a regular file we may execute (symlinks
    followed), as the shell runs it. shutil.which also takes a FIFO or a device with an x bit, and
    reading one to tell which dstat it is waited forever."""
    if path is None:
        path = os.environ.get("PATH") or os.defpath
    for directory in path.split(os.pathsep):
        candidate = os.path.join(directory or ".", name)
        try:
            st = os.stat(candidate)  # nothing is opened
        except (OSError, ValueError):
            continue
        if stat.S_ISREG(st.st_mode) and os.access(candidate, os.X_OK):
            return candidate
    return None


@dataclass
class Installed:
    files: list[str] = field(default_factory=list)
    registered_pmda: bool = False
    pinned_python: str | None = None
    """The interpreter name pmcd.conf had before install named it by its absolute path."""


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
    system: bool,
    url: str,
    basic_auth: str | None,
    conf: dict[str, str] | None = None,
    wrapper_dir: Path | None = None,
) -> tuple[list[Path], list[str]]:
    """Returns what was written and what the user should know (notes). Without `conf`, this
    machine's PCP, and the `dstat` wrapper goes to WRAPPER_DIR; with one (tests), the wrapper is
    written only where `wrapper_dir` says."""
    if conf is None:
        conf = pcp_conf()
        wrapper_dir = wrapper_dir or WRAPPER_DIR
    notes: list[str] = []
    done = Installed()
    pdir = plugin_dir(system, conf)
    previous = _read_manifest(pdir)
    target = pdir / "gpu"
    _write(target, PLUGIN.encode(), 0o644, "--user" if system else "--system")
    done.files.append(str(target))
    uf = url_file(conf)
    body = f"{url.rstrip('/')}/metrics/pcp\n"
    if basic_auth:  # (the bytes given, UTF-8 or not, as the daemon checks them)
        body += f"HEADER: Authorization: {fetch.basic_header(basic_auth)['Authorization']}\n"
    if system:
        _settle_ctime(uf, body.encode())
        _write(uf, body.encode(), 0o600 if basic_auth else 0o644, None)
        done.files.append(str(uf))
        was_registered = pmda_registered(conf)
        if wrapper_dir is not None:
            wrapper, note = _write_wrapper(conf, wrapper_dir, previous)
            if wrapper is not None:
                done.files.append(str(wrapper))
            if note:
                notes.append(note)
        # A PMDA started afresh knows no metric of a source it cannot read: while the daemon is
        # down, the running PMDA (which knows gpumon's metrics) is kept, so `dstat --gpu` shows
        # blank columns rather than "unknown metric"; it is restarted once the daemon answers, or
        # when it is not running at all (it died at start: nothing to keep).
        restart = was_registered and (_answers(url, basic_auth) or not _pmda_pids())
        if restart:
            _stop_pmda()  # before its cache is cleared: it saves the cache as it ends
            _clear_instances(conf)
        if not was_registered:
            _clear_instances(conf)
            _register_pmda(conf)
            done.registered_pmda = True
            notes.append("registered PCP's openmetrics PMDA with pmcd (uninstall removes it again)")
        pinned = _pin_interpreter(conf)
        if pinned is not None:
            done.pinned_python = pinned
            notes.append(
                f"pmcd now starts the openmetrics PMDA with {_pcp_python(conf)}, whatever python3 comes "
                "first in the PATH of whoever restarts pmcd"
            )
        if restart or pinned is not None:
            _stop_pmda()
            _signal_pmcd()  # pmcd starts the PMDA afresh: no stale GPUs, the new URL read
    elif not uf.exists():
        notes.append(
            f"{uf} is missing and needs root: run `sudo gpumon dstat-plugin install --system` once "
            "(it also registers PCP's openmetrics PMDA if needed)"
        )
    done.registered_pmda = done.registered_pmda or previous.registered_pmda
    done.pinned_python = done.pinned_python or previous.pinned_python
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
        _clear_instances(conf)
        notes.append("removed PCP's openmetrics PMDA from pmcd, as install had registered it")
    elif system and pmda_registered(conf):
        _stop_pmda()
        _clear_instances(conf)
        if done.pinned_python:
            _pin_interpreter(conf, done.pinned_python)
        _signal_pmcd()
        notes.append(
            "PCP's openmetrics PMDA was registered before gpumon and stays (restarted without gpumon's)"
        )
    _manifest(pdir).unlink(missing_ok=True)
    return removed, notes


def _read_manifest(pdir: Path) -> Installed:
    try:
        doc = json.loads(_manifest(pdir).read_text())
        pinned = doc.get("pinned_python")
        files = doc.get("files")
        return Installed(
            # install writes absolute paths: what else a damaged manifest holds ("files": "gpu" was
            # the files g, p and u, removed from the directory uninstall ran in) is not removed
            [f for f in files if isinstance(f, str) and os.path.isabs(f)] if isinstance(files, list) else [],
            bool(doc.get("registered_pmda")),
            pinned if isinstance(pinned, str) and pinned else None,
        )
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
        out = (p.stdout + p.stderr).splitlines()
        said = [ln for ln in out if ln.strip() and "] pmdaopenmetrics(" not in ln]
        raise OutputError(f"{script} failed (exit {p.returncode}): {' / '.join(said[-3:]) or 'no output'}")


STATE_METRIC = "openmetrics.gpumon.gpu.state"
PMCD_START = "`sudo systemctl enable --now pmcd` (without systemd: `sudo /etc/init.d/pmcd start`)"

_INSTANCES = """\
import sys
from pcp import pmapi
ctx = pmapi.pmContext()
desc = ctx.pmLookupDescs(ctx.pmLookupName([sys.argv[1]]))[0]
print("\\n".join(ctx.pmGetInDom(desc)[1]))
"""
"""Run by PCP's python3: the instance names of the metric's instance domain, which is what
pcp-dstat draws a column block for (pminfo and pmprobe show only the instances with a value)."""


def probe(url: str, wait_s: float = 15.0, conf: dict[str, str] | None = None) -> str:
    """One line on whether PCP reads gpumon now: what `dstat --gpu` will show, and if blank, why
    (in PCP's words or a log's, which quote what a server sent: no control characters)."""
    return printable(_probe(fetch.redacted(url), wait_s, conf or pcp_conf()))


def _probe(url: str, wait_s: float, conf: dict[str, str]) -> str:
    if not _pmcd_running():
        return f"pmcd is not running: start it, {PMCD_START}, then run `dstat --gpu`"
    deadline = time.monotonic() + wait_s
    no_pmda_since: float | None = None
    while True:
        p = _pcp_command(["pmprobe", "-v", STATE_METRIC])
        if isinstance(p, str):
            return p
        if p.returncode != 0:
            # pmcd restarting (the PMDA's Install restarts it) refuses connections for a while
            if time.monotonic() < deadline:
                time.sleep(0.5)
                continue
            why = (p.stderr.strip().splitlines() or ["no answer"])[-1]
            return f"pmcd does not answer ({why}): start it, {PMCD_START}, then run `dstat --gpu`"
        fields = p.stdout.split(maxsplit=2)
        if len(fields) >= 2 and fields[1].lstrip("-").isdigit() and int(fields[1]) > 0:
            return _reads(url, int(fields[1]), conf)
        now = time.monotonic()
        # pmcd starts the PMDA within a second of its SIGHUP: one missing for 3 s died at start
        no_pmda_since = (no_pmda_since or now) if not _pmda_pids() else None
        if now >= deadline or (no_pmda_since is not None and now - no_pmda_since >= 3.0):
            break
        time.sleep(0.5)
    asked = _pcp_command(["pminfo", "-f", "openmetrics.control.status"])
    if isinstance(asked, str):
        return asked
    status = asked.stdout
    if "Unknown metric name" in asked.stdout + asked.stderr or asked.returncode != 0:
        return (
            f"PCP's openmetrics PMDA is not running: {_why_pmda_died(conf)}; "
            "`sudo gpumon dstat-plugin install --system` again restarts it with PCP's own python3"
        )
    found = re.search(r'"gpumon"\] value "(.*)"', status)
    why = found.group(1) if found else "the openmetrics PMDA has not read it yet"
    errno = re.search(r"\[Errno -?\d+\] ([^'\")]+)", why)
    why = errno.group(1) if errno else re.sub(r"^failed to fetch URL or execute script \S+: ", "", why)[:200]
    return (
        f"PCP cannot read gpumon serve at {url} yet ({why}): `dstat --gpu` shows blank columns "
        "until the daemon answers there"
    )


def _pcp_command(argv: list[str]) -> subprocess.CompletedProcess[str] | str:
    """A PCP command in PCP's clean environment, or the one line saying why it could not run."""
    try:
        return subprocess.run(
            argv, env={"PATH": CLEAN_PATH, "LANG": "C"}, capture_output=True, text=True, timeout=10
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"cannot ask PCP ({argv[0]}: {e}): is the pcp package installed?"


def _reads(url: str, with_values: int, conf: dict[str, str]) -> str:
    """What `dstat --gpu` shows: the GPUs with a value, and the stale ones PCP still lists."""
    shown = instances(conf)
    stale = shown[with_values:] if len(shown) > with_values else []
    said = f"PCP reads {with_values} GPU(s) from gpumon serve at {url}: `dstat --gpu` shows them"
    if stale:
        said += (
            f"; PCP also still lists {len(stale)} GPU(s) this daemon does not have ({', '.join(stale)}), "
            "shown as blank columns until `sudo gpumon dstat-plugin install --system` runs again "
            "while the daemon answers"
        )
    return said


def instances(conf: dict[str, str]) -> list[str]:
    """The GPUs pcp-dstat draws (the state metric's instance domain), those with values first;
    [] when PCP cannot say."""
    python = _pcp_python(conf)
    if python is None:
        return []
    try:
        p = subprocess.run(
            [python, "-c", _INSTANCES, STATE_METRIC],
            env={"PATH": CLEAN_PATH, "LANG": "C"},
            capture_output=True,
            text=True,
            timeout=10,
        )
    except (OSError, subprocess.TimeoutExpired):
        return []
    names = p.stdout.split() if p.returncode == 0 else []
    valued = _pcp_command(["pminfo", "-f", STATE_METRIC])
    have = set() if isinstance(valued, str) else set(re.findall(r'inst \[\d+ or "([^"]+)"\]', valued.stdout))
    return sorted(names, key=lambda n: n not in have)


def _why_pmda_died(conf: dict[str, str]) -> str:
    """The likeliest reason, from pmcd.conf and pmcd's own environment, else from the logs."""
    interpreter = None
    try:
        for line in Path(conf["PCP_PMCDCONF_PATH"]).read_text().splitlines():
            fields = line.split()
            if fields[:1] == ["openmetrics"]:
                at = [j for j, w in enumerate(fields) if w.endswith(PMDA_SCRIPT)]
                interpreter = fields[at[0] - 1] if at and at[0] > 0 else None
    except OSError:
        pass
    pcp_python = _pcp_python(conf)
    if interpreter is not None and not os.path.isabs(interpreter):
        path = _pmcd_environ().get("PATH")
        found = shutil.which(interpreter, path=path) if path else None
        if found is not None and pcp_python is not None and not _same_file(found, pcp_python):
            return (
                f"pmcd starts it with `{interpreter}`, which in pmcd's PATH is {found}, not PCP's "
                f"{pcp_python} (pmcd was started from a shell with a virtualenv or pyenv first in PATH)"
            )
    logs = Path(conf.get("PCP_LOG_DIR", "/var/log/pcp")) / "pmcd"
    for log in (logs / "openmetrics.log", logs / "pmcd.log"):
        said = _last_words(log, "openmetrics" if log.name == "pmcd.log" else "")
        if said:
            return f"{log} says {said!r}"
    return f"it died at start, or pmcd has not started it ({logs} says no more)"


def _pmcd_environ() -> dict[str, str]:
    for pid in _pmcd_pids():
        try:
            pairs = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        return dict(p.decode(errors="replace").partition("=")[::2] for p in pairs if b"=" in p)
    return {}


def _same_file(a: str, b: str) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def _last_words(log: Path, about: str = "") -> str:
    """The last line of a log that says something (an exception, an error), about `about`."""
    try:
        with open(log, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 8192))
            lines = f.read().decode(errors="replace").splitlines()
    except OSError:
        return ""
    said = [
        ln.strip()
        for ln in lines
        if ln.strip() and not ln.startswith(("Log finished", "Log for")) and about in ln
    ]
    return said[-1][:200] if said else ""


def _answers(url: str, basic_auth: str | None, timeout_s: float = 3.0) -> bool:
    """Whether the daemon serves /metrics/pcp at `url` now (what the PMDA will read): within
    `timeout_s` in all (a daemon that trickles its answer held the install for good), a redirect
    not followed (urllib carried the Authorization header to wherever it pointed)."""
    try:
        status, _ = fetch.get(
            f"{url.rstrip('/')}/metrics/pcp",
            timeout_s,
            1 << 20,
            fetch.basic_header(basic_auth) if basic_auth else None,
        )
    except fetch.FetchError:
        return False
    return status == 200


def _pcp_python(conf: dict[str, str]) -> str | None:
    """PCP's interpreter (pcp.conf's PCP_PYTHON_PROG) by its absolute path in PCP's clean PATH."""
    prog = conf.get("PCP_PYTHON_PROG") or "python3"
    if os.path.isabs(prog):
        return prog
    return shutil.which(prog, path=CLEAN_PATH)


def _pin_interpreter(conf: dict[str, str], to: str | None = None) -> str | None:
    """Make pmcd.conf's openmetrics line start the PMDA with `to` (default PCP's interpreter by its
    absolute path); returns the interpreter it named before, when it changed it."""
    target = to or _pcp_python(conf)
    path = Path(conf["PCP_PMCDCONF_PATH"])
    try:
        lines = path.read_text().splitlines(keepends=True)
    except OSError:
        return None
    for i, line in enumerate(lines):
        fields = line.split()
        if fields[:1] != ["openmetrics"] or target is None:
            continue
        for j, word in enumerate(fields):
            if word.endswith(PMDA_SCRIPT) and j > 0 and fields[j - 1] != target:
                before = fields[j - 1]
                lines[i] = line.replace(f"{before} {word}", f"{target} {word}", 1)
                _write(path, "".join(lines).encode(), path.stat().st_mode & 0o777, None)
                return before
    return None


def _pmda_domain(conf: dict[str, str]) -> str:
    try:
        for line in Path(conf["PCP_PMCDCONF_PATH"]).read_text().splitlines():
            fields = line.split()
            if fields[:1] == ["openmetrics"] and len(fields) > 1 and fields[1].isdigit():
                return fields[1]
    except OSError:
        pass
    return "144"


def _clear_instances(conf: dict[str, str]) -> None:
    """Forget the GPUs PCP's openmetrics PMDA has cached for gpumon's source (its cluster's
    instance domains), so that a daemon with fewer GPUs than an earlier one shows only its own."""
    cache = Path(conf.get("PCP_VAR_DIR", "/var/lib/pcp")) / "config" / "pmda"
    domain = _pmda_domain(conf)
    try:  # indom 0: a pickled list of source names, written by the PMDA in protocol 0 (text)
        lines = (cache / f"{domain}.0.py").read_text().splitlines()
    except OSError:
        return
    names = [ln.removeprefix("a")[1:] for ln in lines if ln.removeprefix("a").startswith("V")]
    if "gpumon" not in names:
        return
    cluster = names.index("gpumon")
    first = 4096 + cluster * CLUSTER_INDOMS
    for serial in range(first, first + CLUSTER_INDOMS):
        (cache / f"{domain}.{serial}.py").unlink(missing_ok=True)


def _pmda_pids() -> list[int]:
    """The openmetrics PMDA's processes (pmcd starts one; none when it died at start)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmd = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if PMDA_SCRIPT.encode() in cmd and not _zombie(int(entry.name)):
            pids.append(int(entry.name))
    return pids


def _pmcd_pids() -> list[int]:
    """pmcd's processes: the daemon itself, by its executable (the rc script /etc/init.d/pmcd,
    run by a shell, has the comm "pmcd" too, and a SIGHUP makes it abandon its PMDA setup)."""
    pids = []
    for entry in Path("/proc").iterdir():
        try:
            if (
                entry.name.isdigit()
                and (entry / "comm").read_text().strip() == "pmcd"
                and Path(os.readlink(entry / "exe")).name == "pmcd"
                and not _zombie(int(entry.name))
            ):
                pids.append(int(entry.name))
        except OSError:
            continue
    return pids


def _pmcd_running() -> bool:
    return bool(_pmcd_pids())


def _stop_pmda(wait_s: float = 10.0) -> None:
    """End the running openmetrics PMDA (it saves its cache as it goes); pmcd starts it again on
    its next SIGHUP (_signal_pmcd)."""

    pids = _pmda_pids()
    for pid in pids:
        try:
            os.kill(pid, signal.SIGTERM)
        except OSError:
            pass
    deadline = time.monotonic() + wait_s
    while pids and time.monotonic() < deadline:
        pids = [pid for pid in pids if Path(f"/proc/{pid}").exists() and not _zombie(pid)]
        time.sleep(0.1)


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return True


def _signal_pmcd() -> None:
    """SIGHUP to pmcd: it re-reads pmcd.conf and starts the PMDAs that are not running (what PCP's
    pmsignal does; that lives outside PATH, in $PCP_BINADM_DIR)."""

    for pid in _pmcd_pids():
        try:
            os.kill(pid, signal.SIGHUP)
        except OSError:
            continue


def _write_wrapper(conf: dict[str, str], wrapper_dir: Path, previous: Installed) -> tuple[Path | None, str]:
    """/usr/local/bin/dstat running pcp-dstat with PCP's interpreter, when `dstat` is pcp-dstat.
    Returns the file written (None if none) and a note for the user ("" if none)."""
    found = _program_in_path("dstat", CLEAN_PATH)
    python = _pcp_python(conf)
    if found is None or python is None:
        return None, ""
    pcp_dstat = os.path.realpath(found)
    if "pcp" not in Path(pcp_dstat).name:
        return None, ""  # the original dstat 0.7.4 names /usr/bin/python3 in its #! line
    target = wrapper_dir / "dstat"
    ours = str(target) in previous.files
    if (target.exists() or target.is_symlink()) and not ours:
        try:  # (a FIFO there is not ours, and is never waited on)
            ours = WRAPPER_MARK.encode() in read_regular(str(target), MAX_WRAPPER_BYTES)
        except OSError:
            ours = False
        if not ours:
            return None, (
                f"{target} exists and is not gpumon's: left alone; with a virtualenv active, run "
                f"`PCP_PYTHON_PROG={python} dstat --gpu` (pcp-dstat runs the first python3 in PATH)"
            )
    body = WRAPPER.format(mark=WRAPPER_MARK, python=python, pcp_dstat=pcp_dstat)
    _write(target, body.encode(), 0o755, None)
    return target, ""


def _register_pmda(conf: dict[str, str]) -> None:
    _pmda_script(conf, "Install")


def _unregister_pmda(conf: dict[str, str]) -> None:
    _pmda_script(conf, "Remove")
