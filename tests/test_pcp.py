"""`dstat --gpu` where dstat is Performance Co-Pilot's pcp-dstat: the real pmcd, its openmetrics
PMDA and pcp-dstat (Debian's `pcp`, which scripts/test.sh installs) against `gpumon serve` on
simulated GPUs, installed the documented way (`gpumon dstat-plugin install --system`).

PCP's own scripts run the first python3 in PATH, which must be the system's (the `pcp` module
lives there). gpumon is installed, and `dstat` run, from a user's shell as the README's first
screen has it: a virtualenv active, and a `python3` that is not the system's first in PATH
(`user_shell`); the other PCP commands run with a plain system PATH, as PCP's tools expect."""

from __future__ import annotations

import ast
import csv
import http.server
import io
import json
import os
import re
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpumon.dstat import pcp as dstat_pcp
from gpumon.serve import pcp

from .conftest import ROOT, free_port, start_serve

GOLDEN = Path(__file__).parent / "golden"
SYSTEM_PATH = "/usr/sbin:/usr/bin:/sbin:/bin"
PCP_DSTAT = Path("/usr/lib/pcp/bin/pcp-dstat")


def pcp_env(home: Path, **extra: str) -> dict[str, str]:
    return {"PATH": SYSTEM_PATH, "HOME": str(home), "LANG": "C.UTF-8", "TERM": "dumb", **extra}


VENV_BIN = Path(sys.executable).parent


def user_shell(home: Path) -> dict[str, str]:
    """A user's shell: this test's virtualenv active, and before it a `python3` that is not the
    system's (as pyenv's shims are): neither has PCP's `pcp` module."""
    shims = home / "shims"
    shims.mkdir(parents=True, exist_ok=True)
    fake = shims / "python3"
    fake.write_text(f'#!/bin/sh\nexec {sys.executable} "$@"\n')
    fake.chmod(0o755)
    path = f"{shims}:{VENV_BIN}:/usr/local/sbin:/usr/local/bin:{SYSTEM_PATH}"
    return pcp_env(home, PATH=path, VIRTUAL_ENV=str(VENV_BIN.parent))


def pmcd_restart(env: dict[str, str]) -> None:
    """Restart pmcd the way its admin would, from the shell `env` describes."""
    p = subprocess.run(["/etc/init.d/pmcd", "restart"], env=env, capture_output=True, text=True, timeout=180)
    assert p.returncode == 0, p.stdout + p.stderr
    deadline = time.monotonic() + 60
    while not pmcd_answers():
        assert time.monotonic() < deadline, "pmcd did not come back"
        time.sleep(0.5)


def gpumon(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    base = dict(os.environ, PYTHONPATH=str(ROOT))
    base.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "gpumon", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=base,
        timeout=300,
    )


def pmcd_answers() -> bool:
    p = subprocess.run(["pmprobe", "pmcd.version"], env=pcp_env(Path("/")), capture_output=True, text=True)
    return p.returncode == 0 and " 1" in p.stdout


def states() -> dict[str, str]:
    """What PCP holds now for gpumon's state metric: {"gpu0": "STcpu", ...}."""
    p = subprocess.run(
        ["pminfo", "-f", "openmetrics.gpumon.gpu.state"],
        env=pcp_env(Path("/")),
        capture_output=True,
        text=True,
    )
    return dict(re.findall(r'inst \[\d+ or "(gpu\d+)"\] value "([^"]*)"', p.stdout))


def wait_for_states(want: dict[str, str], timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while (got := states()) != want:
        assert time.monotonic() < deadline, f"PCP never showed {want} (last {got})"
        time.sleep(0.5)


@pytest.fixture(scope="module")
def pmcd() -> Iterator[None]:
    """pmcd, started once for the module when it is not already running (a container has no
    systemd to start it at install)."""
    if not PCP_DSTAT.exists():
        pytest.fail("PCP is missing: scripts/test.sh installs it (apt-get install pcp python3-pcp)")
    started = False
    if not pmcd_answers():
        subprocess.run(
            ["/etc/init.d/pmcd", "start"], env=pcp_env(Path("/root")), capture_output=True, timeout=120
        )
        started = True
        deadline = time.monotonic() + 60
        while not pmcd_answers():
            assert time.monotonic() < deadline, "pmcd did not start"
            time.sleep(0.5)
    yield
    if started:
        subprocess.run(
            ["/etc/init.d/pmcd", "stop"], env=pcp_env(Path("/root")), capture_output=True, timeout=120
        )


@pytest.fixture(scope="module")
def daemon() -> Iterator[str]:
    """`gpumon serve --simulate starved-cpu,healthy`, once its detector has settled."""
    port = free_port()
    proc = start_serve("--simulate", "starved-cpu,healthy", port=port)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        try:
            state = json.loads(urllib.request.urlopen(url + "/api/v1/state", timeout=2).read())
            if [g["label"] for g in state.get("gpus", [])] == ["starved-cpu", "healthy"]:
                break
        except OSError:
            pass
        assert time.monotonic() < deadline, "gpumon serve never settled"
        time.sleep(0.5)
    yield url
    proc.terminate()
    proc.wait(timeout=10)


@pytest.fixture(scope="module")
def installed(
    pmcd: None, daemon: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, object]]:
    """`gpumon dstat-plugin install --system` (the `dstat` on PATH is pcp-dstat: auto-detected),
    then at the end `uninstall --system`, checked to put back exactly what was there."""
    conf = dstat_pcp.pcp_conf()
    plugin_dir = Path(conf["PCP_SYSCONF_DIR"]) / "dstat"
    gpumon("dstat-plugin", "uninstall", "--system", "--for", "pcp")  # a former install's, if any
    before = {
        "registered": dstat_pcp.pmda_registered(conf),
        "plugins": sorted(p.name for p in plugin_dir.iterdir()),
        "sources": sorted(p.name for p in dstat_pcp.url_file(conf).parent.iterdir()),
    }
    home = tmp_path_factory.mktemp("home")
    shell = user_shell(home)
    p = gpumon("dstat-plugin", "install", "--system", "--url", daemon, env=shell)
    assert p.returncode == 0, p.stderr
    assert f"installed {plugin_dir / 'gpu'}" in p.stdout
    assert "PCP reads 2 GPU(s)" in p.stdout, p.stdout
    wait_for_states({"gpu0": "STcpu", "gpu1": "ok"})
    yield {"home": home, "shell": shell, "conf": conf, "before": before, "install": p.stdout}
    p = gpumon("dstat-plugin", "uninstall", "--system", "--for", "pcp")
    assert p.returncode == 0, p.stderr
    after = {
        "registered": dstat_pcp.pmda_registered(conf),
        "plugins": sorted(p.name for p in plugin_dir.iterdir()),
        "sources": sorted(p.name for p in dstat_pcp.url_file(conf).parent.iterdir()),
    }
    assert after == before, "uninstall must remove exactly what install added"


def point_at(url: str) -> None:
    p = gpumon("dstat-plugin", "install", "--system", "--for", "pcp", "--url", url)
    assert p.returncode == 0, p.stderr


def dstat(
    home: Path, *args: str, program: str = "dstat", env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """`dstat ARGS` (or `pcp dstat ARGS`) from a plain system shell, or from the shell `env`."""
    cmd = ["pcp", "dstat", *args] if program == "pcp" else ["dstat", *args]
    return subprocess.run(cmd, capture_output=True, text=True, env=env or pcp_env(home), cwd=home, timeout=60)


def rows(stdout: str) -> list[str]:
    return [ln for ln in stdout.splitlines() if re.match(r"\s*\d", ln)]


@pytest.mark.parametrize("program", ["dstat", "pcp", "dstat in a venv"])
def test_a_starved_gpu_shows_stcpu_beside_the_cpu(installed: dict[str, object], program: str) -> None:
    """The issue's check: `dstat -c --gpu 1 3` shows two GPU blocks, STcpu on gpu0, ok on gpu1;
    also typed in the user's shell, a virtualenv active (the installer's /usr/local/bin/dstat)."""
    shell = installed["shell"] if program == "dstat in a venv" else None
    p = dstat(
        installed["home"],  # type: ignore[arg-type]
        "-c",
        "--gpu",
        "1",
        "3",
        program=program.split()[0],
        env=shell,  # type: ignore[arg-type]
    )
    assert p.returncode == 0, p.stderr
    assert "usr" in p.stdout, p.stdout
    body = rows(p.stdout)
    assert len(body) >= 3, p.stdout
    for line in body:
        gpus = blocks(p.stdout.splitlines()[0], line)
        util0, mem0, state0 = gpus.pop("gpu0").split()
        util1, mem1, state1 = gpus.pop("gpu1").split()
        assert (state0, state1) == ("STcpu", "ok"), line
        assert 0 <= int(util0) <= 60 and int(util1) >= 80 and int(mem0) == int(mem1) == 60, line
        # pmdaopenmetrics keeps every instance it has seen (the golden test's gpu2, gpu3 when it ran
        # first on this pmcd): such a block stays blank
        assert all(not v.strip() for v in gpus.values()), line


def blocks(title: str, line: str) -> dict[str, str]:
    """{"gpu0": " 31    60  STcpu", ...}: the row cut at the title line's block boundaries."""
    found = {}
    for m in re.finditer(r"-*(gpu\d+)-*", title):
        found[m.group(1)] = line[m.start() : m.end()]
    return found


def test_csv_output_carries_the_state_as_text(installed: dict[str, object], tmp_path: Path) -> None:
    out = tmp_path / "gpu.csv"
    p = dstat(installed["home"], "-c", "--gpu", "--output", str(out), "1", "3")  # type: ignore[arg-type]
    assert p.returncode == 0, p.stderr
    table = list(csv.reader(io.StringIO(out.read_text())))
    header = next(i for i, r in enumerate(table) if "gpu0:state" in r)
    # pcp-dstat's first row has one empty field for the CPU's five (it has no rate yet): skip it
    data = [dict(zip(table[header], r)) for r in table[header + 1 :] if len(r) == len(table[header])]
    assert len(data) >= 2, out.read_text()
    for r in data:
        assert r["gpu0:state"] == "STcpu" and r["gpu1:state"] == "ok", r
        assert 0 <= float(r["gpu0:util"]) <= 100 and float(r["gpu1:mem"]) == 60


def test_a_user_install_goes_under_dot_pcp_and_says_what_needs_root(
    installed: dict[str, object], tmp_path: Path
) -> None:
    home = tmp_path / "user"
    home.mkdir()
    p = gpumon("dstat-plugin", "install", "--user", "--for", "pcp", env={"HOME": str(home)})
    assert p.returncode == 0, p.stderr
    assert (home / ".pcp/dstat/gpu").is_file()
    # the openmetrics source is system-wide; installed already by the fixture, so nothing to ask
    assert "needs root" not in p.stdout
    shown = dstat(home, "--gpu", "1", "2")
    assert shown.returncode == 0 and all("STcpu" in r for r in rows(shown.stdout)), (
        shown.stdout + shown.stderr
    )
    p = gpumon("dstat-plugin", "uninstall", "--user", "--for", "pcp", env={"HOME": str(home)})
    assert p.returncode == 0 and f"removed {home / '.pcp/dstat/gpu'}" in p.stdout
    assert list((home / ".pcp/dstat").iterdir()) == [], "uninstall leaves nothing of its own behind"


# -- golden screen: a fixed fleet from a stub daemon ---------------------------------------------------

FIXED = [
    pcp.Row(0, "GPU-0", 31, 60, "STcpu"),
    pcp.Row(1, "GPU-1", 97, 75, "ok"),
    pcp.Row(2, "GPU-2", 18, 50, "STio"),
    pcp.Row(3, "GPU-3", None, None, "lost"),
]


class StubDaemon:
    """Serves a fixed /metrics/pcp for the rows it is given (changeable while it runs)."""

    def __init__(self, rows: list[pcp.Row]) -> None:
        self.body = pcp.render_rows(rows)
        stub = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                body = stub.body
                self.send_response(200 if self.path == "/metrics/pcp" else 404)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"


@pytest.fixture
def stub(installed: dict[str, object], daemon: str) -> Iterator[str]:
    """PCP pointed at a stub serving a fixed /metrics/pcp, then back at the daemon."""
    server = StubDaemon(FIXED)
    point_at(server.url)
    wait_for_states({"gpu0": "STcpu", "gpu1": "ok", "gpu2": "STio", "gpu3": "lost"})
    yield server.url
    point_at(daemon)
    server.server.shutdown()
    wait_for_states({"gpu0": "STcpu", "gpu1": "ok"})


def test_screen_matches_the_golden_file(
    installed: dict[str, object], stub: str, request: pytest.FixtureRequest
) -> None:
    p = dstat(installed["home"], "--gpu", "1", "3")  # type: ignore[arg-type]
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    screen = "\n".join(lines[:2] + rows(p.stdout)[:3]) + "\n"
    golden = GOLDEN / "pcp_dstat_screen.txt"
    if request.config.getoption("--update-golden"):
        golden.write_text(screen)
    assert screen == golden.read_text(), (
        "the pcp-dstat --gpu screen changed: review, then pytest --update-golden"
    )


def test_with_the_daemon_down_the_columns_go_blank_and_install_says_why(
    installed: dict[str, object], daemon: str
) -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    p = gpumon("dstat-plugin", "install", "--system", "--for", "pcp", "--url", dead)
    try:
        assert p.returncode == 0, p.stderr
        said = [ln for ln in p.stdout.splitlines() if "cannot read gpumon serve" in ln]
        assert len(said) == 1 and dead in said[0] and "Connection refused" in said[0], p.stdout
        wait_for_states({})
        shown = dstat(installed["home"], "-c", "--gpu", "1", "2")  # type: ignore[arg-type]
        assert "Traceback" not in shown.stderr and len(shown.stderr.splitlines()) <= 1
        assert shown.returncode == 0
        for line in rows(shown.stdout):
            cpu, gpus = line.split("|", 1)
            assert cpu.split() and not gpus.replace(":", "").strip(), line
    finally:
        point_at(daemon)
        wait_for_states({"gpu0": "STcpu", "gpu1": "ok"})


def test_basic_auth_goes_to_the_daemon_as_a_header(
    installed: dict[str, object], daemon: str, tmp_path: Path
) -> None:
    import bcrypt

    web = tmp_path / "web.yml"
    hashed = bcrypt.hashpw(b"s3cret", bcrypt.gensalt(rounds=4)).decode()
    web.write_text(f"basic_auth_users:\n  pcp: '{hashed}'\n")
    port = free_port()
    proc = start_serve("--simulate", "starved-io", "--web-config-file", str(web), port=port)
    try:
        url = f"http://127.0.0.1:{port}"
        p = gpumon(
            "dstat-plugin", "install", "--system", "--for", "pcp", "--url", url, "--basic-auth", "pcp:s3cret"
        )
        assert p.returncode == 0, p.stderr
        url_file = dstat_pcp.url_file(installed["conf"])  # type: ignore[arg-type]
        assert url_file.stat().st_mode & 0o077 == 0, "credentials are for root's eyes only"
        wait_for_states({"gpu0": "STio"}, timeout_s=90)
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        point_at(daemon)
        wait_for_states({"gpu0": "STcpu", "gpu1": "ok"})


# -- independent of the shell that last touched PCP ----------------------------------------------------


def title_gpus(stdout: str) -> list[str]:
    return re.findall(r"gpu\d+", stdout.splitlines()[0]) if stdout else []


def test_a_daemon_with_fewer_gpus_leaves_no_stale_columns(installed: dict[str, object], daemon: str) -> None:
    """PCP's openmetrics PMDA caches every instance it saw: 4 GPUs, then 2, would draw 4 blocks.
    The installer says so while it is so, and clears them when it points PCP at the daemon."""
    conf = installed["conf"]
    server = StubDaemon(FIXED)
    try:
        point_at(server.url)
        wait_for_states({"gpu0": "STcpu", "gpu1": "ok", "gpu2": "STio", "gpu3": "lost"})
        server.body = pcp.render_rows(FIXED[:2])  # the same daemon, restarted with 2 GPUs
        wait_for_states({"gpu0": "STcpu", "gpu1": "ok"})
        said = dstat_pcp.probe(server.url, wait_s=5)
        assert "PCP reads 2 GPU(s)" in said and "also still lists 2 GPU(s)" in said, said
        assert "(gpu2, gpu3)" in said, said
        shown = dstat(installed["home"], "--gpu", "1", "1")  # type: ignore[arg-type]
        assert title_gpus(shown.stdout) == ["gpu0", "gpu1", "gpu2", "gpu3"], shown.stdout
    finally:
        p = gpumon("dstat-plugin", "install", "--system", "--for", "pcp", "--url", daemon)
        server.server.shutdown()
    assert p.returncode == 0, p.stderr
    assert "PCP reads 2 GPU(s)" in p.stdout and "still lists" not in p.stdout, p.stdout
    assert dstat_pcp.instances(conf) == ["gpu0", "gpu1"]  # type: ignore[arg-type]
    shown = dstat(installed["home"], "-c", "--gpu", "1", "1")  # type: ignore[arg-type]
    assert title_gpus(shown.stdout) == ["gpu0", "gpu1"], shown.stdout


def test_pmcd_restarted_from_a_venv_shell_runs_the_pmda_with_pcps_python(
    installed: dict[str, object], daemon: str
) -> None:
    """pmcd restarted by an admin whose virtualenv is active, with another python3 first in PATH:
    the PMDA pinned by the installer keeps running. Unpinned (as PCP's own Install writes
    pmcd.conf), it dies at start, the installer says so and why, and installing again fixes it."""
    conf: dict[str, str] = installed["conf"]  # type: ignore[assignment]
    shell: dict[str, str] = installed["shell"]  # type: ignore[assignment]
    pmcd_conf = Path(conf["PCP_PMCDCONF_PATH"])
    manifest = Path(conf["PCP_SYSCONF_DIR"]) / "dstat" / dstat_pcp.MANIFEST
    saved = {f: f.read_text() for f in (pmcd_conf, manifest)}
    python = dstat_pcp._pcp_python(conf)
    assert python is not None and f"{python} " in pmcd_conf.read_text(), "the install pinned PCP's python3"
    try:
        pmcd_restart(shell)
        wait_for_states({"gpu0": "STcpu", "gpu1": "ok"})
        shown = dstat(installed["home"], "-c", "--gpu", "1", "2", env=shell)  # type: ignore[arg-type]
        assert shown.returncode == 0 and all("STcpu" in r for r in rows(shown.stdout)), shown.stderr

        dstat_pcp._pin_interpreter(conf, "python3")  # what PCP's Install writes
        pmcd_restart(shell)
        said = dstat_pcp.probe(daemon, wait_s=20)
        shims = Path(shell["PATH"].split(":")[0])
        assert "openmetrics PMDA is not running" in said and f"{shims / 'python3'}, not PCP's" in said, said
        assert "sudo gpumon dstat-plugin install --system" in said, said

        p = gpumon("dstat-plugin", "install", "--system", "--url", daemon, env=shell)
        assert p.returncode == 0, p.stderr
        assert "PCP reads 2 GPU(s)" in p.stdout and f"with {python}" in p.stdout, p.stdout
        wait_for_states({"gpu0": "STcpu", "gpu1": "ok"})
    finally:
        for f, text in saved.items():
            f.write_text(text)
        pmcd_restart(pcp_env(Path("/root")))
    wait_for_states({"gpu0": "STcpu", "gpu1": "ok"})


def test_with_pmcd_stopped_install_says_how_to_start_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(dstat_pcp, "_pmcd_running", lambda: False)
    said = dstat_pcp.probe("http://127.0.0.1:9877", wait_s=0)
    assert said.startswith("pmcd is not running") and "systemctl enable --now pmcd" in said
    assert "/etc/init.d/pmcd start" in said


def test_the_dstat_wrapper_runs_pcp_dstat_with_pcps_python_from_a_venv(tmp_path: Path) -> None:
    """What a system install puts first in PATH for pcp-dstat (its pmpython runs the first python3
    in PATH); someone else's `dstat` there is left alone; uninstall removes only its own."""
    conf = {
        "PCP_SYSCONF_DIR": str(tmp_path / "etc"),
        "PCP_PMDAS_DIR": str(tmp_path / "pmdas"),
        "PCP_PMCDCONF_PATH": str(tmp_path / "pmcd.conf"),
        "PCP_PYTHON_PROG": "python3",
    }
    Path(conf["PCP_PMCDCONF_PATH"]).write_text("openmetrics 144 pipe binary python pmda\n")
    bin_ = tmp_path / "bin"
    written, notes = dstat_pcp.install(True, "http://127.0.0.1:9877", None, conf, wrapper_dir=bin_)
    assert bin_ / "dstat" in written and notes == []
    plain = user_shell(tmp_path / "home")
    plain["PATH"] = plain["PATH"].replace("/usr/local/sbin:/usr/local/bin:", "")  # no installed wrapper
    env = dict(plain, PATH=f"{bin_}:{plain['PATH']}")
    p = subprocess.run(["dstat", "-c", "1", "1"], capture_output=True, text=True, env=plain, timeout=60)
    assert "No module named 'pcp'" in p.stderr, "without it, the venv's python3 runs pcp-dstat"
    p = subprocess.run(["dstat", "-c", "1", "1"], capture_output=True, text=True, env=env, timeout=60)
    assert p.returncode == 0 and "usr" in p.stdout, p.stderr
    dstat_pcp.uninstall(True, conf)
    assert not (bin_ / "dstat").exists()
    (bin_ / "dstat").write_text("#!/bin/sh\n# someone's own dstat\n")
    written, notes = dstat_pcp.install(True, "http://127.0.0.1:9877", None, conf, wrapper_dir=bin_)
    assert bin_ / "dstat" not in written and "not gpumon's: left alone" in notes[0], notes
    dstat_pcp.uninstall(True, conf)
    assert (bin_ / "dstat").read_text().startswith("#!/bin/sh\n# someone's own")


# -- without PCP: the pieces ---------------------------------------------------------------------------


def test_the_state_codes_are_those_of_the_dstat_074_plugin() -> None:
    tree = ast.parse((ROOT / "gpumon" / "dstat" / "plugin" / "dstat_gpu.py").read_text())
    codes = next(
        ast.literal_eval(node.value)
        for node in tree.body
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "_gpumon_state_codes"
    )
    assert codes == pcp.STATE_CODES


def test_which_dstat_tells_pcp_dstat_from_the_original(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    monkeypatch.setenv("PATH", str(bin_))
    assert dstat_pcp.which_dstat() is None
    original = bin_ / "dstat"
    original.write_text("#!/usr/bin/python3\n### dstat: versatile resource statistics tool\nimport six\n")
    original.chmod(0o755)
    assert dstat_pcp.which_dstat() == "dstat"
    original.unlink()
    real = tmp_path / "lib" / "pcp-dstat"
    real.parent.mkdir()
    real.write_text("#!/usr/bin/env pmpython\nfrom pcp import pmapi, pmconfig\n")
    real.chmod(0o755)
    original.symlink_to(real)
    assert dstat_pcp.which_dstat() == "pcp"


def test_install_writes_the_source_with_credentials_and_uninstall_only_what_it_wrote(tmp_path: Path) -> None:
    conf = {
        "PCP_SYSCONF_DIR": str(tmp_path / "etc"),
        "PCP_PMDAS_DIR": str(tmp_path / "pmdas"),
        "PCP_PMCDCONF_PATH": str(tmp_path / "pmcd.conf"),
    }
    Path(conf["PCP_PMCDCONF_PATH"]).write_text("# comment\nopenmetrics 144 pipe binary python pmda\n")
    theirs = tmp_path / "etc" / "dstat" / "vllm"
    theirs.parent.mkdir(parents=True)
    theirs.write_text("[vllm]\n")
    written, notes = dstat_pcp.install(True, "http://gpu-node:9877/", "ops:pa:ss", conf)
    url_file = tmp_path / "pmdas/openmetrics/config.d/gpumon.url"
    assert set(written) == {tmp_path / "etc/dstat/gpu", url_file}
    lines = url_file.read_text().splitlines()
    assert lines[0] == "http://gpu-node:9877/metrics/pcp"
    assert lines[1] == "HEADER: Authorization: Basic b3BzOnBhOnNz"  # base64 of ops:pa:ss
    assert url_file.stat().st_mode & 0o777 == 0o600
    assert notes == [], "the PMDA was registered already: nothing to register, nothing to note"
    removed, notes = dstat_pcp.uninstall(True, conf)
    assert set(removed) == set(written)
    assert theirs.exists() and not url_file.exists()
    assert any("stays" in n for n in notes), notes
    assert Path(conf["PCP_PMCDCONF_PATH"]).read_text().count("openmetrics") == 1


def test_a_user_install_without_the_system_source_says_what_needs_root(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    conf = {
        "PCP_SYSCONF_DIR": str(tmp_path / "etc"),
        "PCP_PMDAS_DIR": str(tmp_path / "pmdas"),
        "PCP_PMCDCONF_PATH": str(tmp_path / "pmcd.conf"),
    }
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    written, notes = dstat_pcp.install(False, "http://127.0.0.1:9877", None, conf)
    assert written == [tmp_path / "home/.pcp/dstat/gpu"]
    assert len(notes) == 1 and "sudo gpumon dstat-plugin install --system" in notes[0]


def test_the_pcp_endpoint_is_served_beside_metrics(daemon: str) -> None:
    text = urllib.request.urlopen(daemon + "/metrics/pcp", timeout=5).read().decode()
    assert "# PCP5 gpu.state" in text
    assert re.search(r'^gpu_state\{instname="gpu0",.*\} STcpu$', text, re.M), text
    assert re.search(r'^gpu_state\{instname="gpu1",.*\} ok$', text, re.M), text


def test_a_mig_instance_is_a_pcp_instance_of_its_own() -> None:
    """Two units share GPU 1's index (its parent and a MIG instance): PCP's instance names differ,
    and the instance shows GPM's activity (NVML gives it no utilization)."""
    from gpumon.collect.pipeline.spec import SourceDescription
    from gpumon.core.model import GpmActivity, GpuSample, Tick
    from gpumon.serve.pcp import render, rows
    from gpumon.serve.snapshot import Snapshot

    parent = GpuSample(1.0, 1, "GPU-1", "H100", mem_used_bytes=1, mem_total_bytes=2)
    mig = GpuSample(1.0, 1, "MIG-1", "H100 MIG 1g.10gb", mig=2, gpm=GpmActivity(graphics_ratio=0.4))
    snap = Snapshot(1.0, Tick(1.0, (parent, mig), None), (), {}, {}, 1, 0, SourceDescription.nvml())
    text = render(snap).decode()
    names = re.findall(r'instname="([^"]+)"', text)
    assert set(names) == {"gpu1", "gpu1mig2"}
    assert [r.util_pct for r in rows(snap)] == [None, 40.0]


def test_the_state_metrics_help_names_every_code_it_can_hold() -> None:
    """pmdaopenmetrics shows the HELP line as the metric's help text: a code missing there (small,
    start, mig once were) is a value a user cannot look up."""
    text = pcp.render_rows([]).decode()
    help_line = next(line for line in text.splitlines() if line.startswith("# HELP gpu_state "))
    named = set(help_line.split(": ", 1)[1].split())
    assert set(pcp.STATE_CODES.values()) | {"lost", "-"} <= named
