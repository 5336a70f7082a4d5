"""The real NVML path: the unmodified pynvml loading a stand-in libnvidia-ml.so.1. Peers (gpustat,
nvitop) as an outside check, and gpumon under the faults real fleets see."""

from __future__ import annotations

import json
import random
import re
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from gpumon.trace.reader import read_trace
from tests.fakenvml import driver

from .conftest import ROOT

EPOCH_US = 1_700_000_000_000_000  # a fixed timeline start shared by every process of a test


@pytest.fixture(scope="session")
def library() -> Path:
    return driver.build()


def run(args: list[str], env: dict[str, str], timeout: float = 60) -> subprocess.CompletedProcess[str]:
    env = dict(env, PYTHONPATH=str(ROOT))
    return subprocess.run(args, capture_output=True, text=True, env=env, timeout=timeout, cwd=ROOT)


def gpumon(*args: str, env: dict[str, str], timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return run([sys.executable, "-m", "gpumon", *args], env, timeout)


def bin_of(tool: str) -> str:
    path = Path(sys.executable).parent / tool
    if not path.exists():
        pytest.fail(f"{tool} is not installed in the test environment (the dev extra brings it)")
    return str(path)


# -- the stand-in as pynvml sees it ---------------------------------------------------------------


def test_the_real_pynvml_loads_the_stand_in(library: Path, tmp_path: Path) -> None:
    config = driver.simulated_config(tmp_path, "healthy,starved-cpu")
    code = textwrap.dedent("""
        import pynvml
        pynvml.nvmlInit()
        h = pynvml.nvmlDeviceGetHandleByIndex(1)
        print(pynvml.nvmlDeviceGetCount(), pynvml.nvmlDeviceGetName(h), pynvml.nvmlSystemGetDriverVersion())
        t, s = pynvml.nvmlDeviceGetSamples(h, pynvml.NVML_GPU_UTILIZATION_SAMPLES, 0)
        print(t, len(s), all(a.timeStamp < b.timeStamp for a, b in zip(s, s[1:])))
        try:
            pynvml.nvmlDeviceGetSamples(h, pynvml.NVML_GPU_UTILIZATION_SAMPLES, s[-1].timeStamp)
        except pynvml.NVMLError_NotFound:
            print("NOT_FOUND")
        m = pynvml.nvmlDeviceGetMemoryInfo(h, version=pynvml.nvmlMemory_v2)
        m1 = pynvml.nvmlDeviceGetMemoryInfo(h)
        print(m1.used - m.used == m.reserved, [p.pid for p in pynvml.nvmlDeviceGetComputeRunningProcesses(h)])
    """)
    p = run([sys.executable, "-c", code], driver.environment(config, FAKENVML_NOW_US="30000000"))
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    assert lines[0] == "2 NVIDIA H100 80GB HBM3 (simulated) 560.35.03"
    assert lines[1] == "1 120 True"  # unsigned ints, a full buffer of 120, oldest first
    assert lines[2] == "NOT_FOUND"
    assert lines[3] == "True [40100]"


def test_one_driver_call_reads_what_pynvml_s_two_do(library: Path, tmp_path: Path) -> None:
    """gpumon reads a GPU's samples in one nvmlDeviceGetSamples call into a buffer it keeps
    (pynvml's wrapper calls twice: the count, then the samples); on an H200 a call cost 2.6 ms.
    The same samples either way: a whole ring, the tick's few after a last seen, none (NOT_FOUND)."""
    config = driver.simulated_config(tmp_path, "healthy,starved-cpu")
    code = textwrap.dedent("""
        import pynvml
        from gpumon.collect.sources.nvml.samples import DirectSamples, fresh_pairs
        pynvml.nvmlInit()
        direct = DirectSamples.of(pynvml)
        for i in (0, 1):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            _, ring = pynvml.nvmlDeviceGetSamples(h, 1, 0)
            for last in (0, ring[-7].timeStamp, ring[-1].timeStamp):
                got = []
                for read in (pynvml.nvmlDeviceGetSamples, direct):
                    try:
                        kind, raw = read(h, 1, last)
                        got.append((kind, fresh_pairs(kind, raw, last)))
                    except pynvml.NVMLError_NotFound:
                        got.append("NOT_FOUND")
                print(got[0] == got[1], len(got[1][1]) if got[1] != "NOT_FOUND" else got[1])
    """)
    p = run([sys.executable, "-c", code], driver.environment(config, FAKENVML_NOW_US="30000000"))
    assert p.returncode == 0, p.stderr
    assert p.stdout.split() == ["True", "120", "True", "6", "True", "NOT_FOUND"] * 2


def test_the_stand_ins_pcie_counters_are_stamped_on_its_timeline(library: Path, tmp_path: Path) -> None:
    """A driver stamps its byte counters with when it read them: the stand-in's counts follow its
    timeline, so their stamps must too. Stamped on the real clock, two readings of a frozen (or
    stepped) timeline read bytes over the wrong time: back to back, no rate at all."""
    config = driver.simulated_config(tmp_path, "starved-io", seconds=60)
    code = textwrap.dedent("""
        import os, pynvml
        pynvml.nvmlInit()
        h = pynvml.nvmlDeviceGetHandleByIndex(0)
        FIELDS = [pynvml.NVML_FI_DEV_PCIE_COUNT_TX_BYTES, pynvml.NVML_FI_DEV_PCIE_COUNT_RX_BYTES]
        def read():
            tx, rx = pynvml.nvmlDeviceGetFieldValues(h, FIELDS)
            return tx.timestamp, rx.value.ullVal
        a, b = read(), read()
        os.environ["FAKENVML_NOW_US"] = "31000000"
        c = read()
        print(b[0] - a[0], b[1] - a[1], c[0] - b[0], c[1] - b[1] > 0)
    """)
    env = driver.environment(config, FAKENVML_NOW_US="30000000")
    p = run([sys.executable, "-c", code], env)
    assert p.returncode == 0, p.stderr
    assert p.stdout.split() == ["0", "0", "1000000", "True"], "stamped when the timeline read them"


def test_the_stand_ins_samples_cross_its_timelines_loop_without_a_gap(library: Path, tmp_path: Path) -> None:
    """The looping timeline's ring, read as a driver's: the samples since the last seen one, across
    the loop's end, every one once, in order, none missing (each lap's range is found by binary
    search; a scan of the whole timeline made a call cost what two laps hold)."""
    config = driver.simulated_config(tmp_path, "starved-cpu", seconds=60)
    code = textwrap.dedent("""
        import os, pynvml
        pynvml.nvmlInit()
        h = pynvml.nvmlDeviceGetHandleByIndex(0)
        _, before = pynvml.nvmlDeviceGetSamples(h, pynvml.NVML_GPU_UTILIZATION_SAMPLES, 0)
        last = before[-1].timeStamp
        os.environ["FAKENVML_NOW_US"] = "61500000"  # 2.5 s later, 1.5 s into the next lap
        _, after = pynvml.nvmlDeviceGetSamples(h, pynvml.NVML_GPU_UTILIZATION_SAMPLES, last)
        ts = [last] + [s.timeStamp for s in after]
        print(len(after), max(b - a for a, b in zip(ts, ts[1:])), min(b - a for a, b in zip(ts, ts[1:])))
    """)
    p = run([sys.executable, "-c", code], driver.environment(config, FAKENVML_NOW_US="59000000"))
    assert p.returncode == 0, p.stderr
    count, widest, narrowest = (int(v) for v in p.stdout.split())
    assert 14 <= count <= 16, "2.5 s of samples at 1/6 s: the old lap's last and the new lap's first"
    assert widest <= 200_000 and narrowest > 0, "none missing across the loop, none twice"


def test_a_config_written_out_of_order_answers_as_the_same_config_in_order(
    library: Path, tmp_path: Path
) -> None:
    """The stand-in reads its timelines by binary search: it puts each unit's samples and states in
    time order when it loads them, so the order of the lines does not matter."""
    config = driver.simulated_config(tmp_path / "in-order", "starved-cpu", seconds=20)
    lines = config.read_text().splitlines()
    timeline = [line for line in lines if line.startswith(("s ", "t "))]
    mixed = list(timeline)
    random.Random(7).shuffle(mixed)
    assert mixed != timeline and sorted(mixed) == sorted(timeline)
    shuffled = tmp_path / "shuffled.conf"
    shuffled.write_text("\n".join([line for line in lines if line not in set(timeline)] + mixed) + "\n")
    code = textwrap.dedent("""
        import pynvml
        pynvml.nvmlInit()
        h = pynvml.nvmlDeviceGetHandleByIndex(0)
        _, got = pynvml.nvmlDeviceGetSamples(h, pynvml.NVML_GPU_UTILIZATION_SAMPLES, 0)
        m = pynvml.nvmlDeviceGetMemoryInfo(h)
        print([(s.timeStamp, s.sampleValue.uiVal) for s in got], pynvml.nvmlDeviceGetPowerUsage(h), m.used)
    """)
    answers = []
    for conf in (config, shuffled):
        p = run([sys.executable, "-c", code], driver.environment(conf, FAKENVML_NOW_US="12500000"))
        assert p.returncode == 0, p.stderr
        answers.append(p.stdout)
    assert "[(" in answers[0], "samples were read"
    assert answers[1] == answers[0]


# -- peers: gpustat and nvitop see what gpumon sees ---------------------------------------------------


def test_gpustat_and_nvitop_agree_with_gpumon_at_the_same_instant(library: Path, tmp_path: Path) -> None:
    config = driver.simulated_config(tmp_path, "starved-cpu,healthy,starved-io,idle", epoch_us=EPOCH_US)
    env = driver.environment(config, FAKENVML_NOW_US="41500000")  # one instant for every process
    ours = json.loads(gpumon("devices", "--json", env=env).stdout)["gpus"]
    p = run([bin_of("gpustat"), "--json"], env)
    assert p.returncode == 0, p.stderr
    theirs = json.loads(p.stdout)["gpus"]
    assert [g["uuid"] for g in ours] == [g["uuid"] for g in theirs]
    assert [g["name"] for g in ours] == [g["name"] for g in theirs]
    assert [g["mem_used_bytes"] // 2**20 for g in ours] == [g["memory.used"] for g in theirs]
    assert [g["mem_total_bytes"] // 2**20 for g in ours] == [g["memory.total"] for g in theirs]
    assert [round(g["util_ratio"] * 100) for g in ours] == [g["utilization.gpu"] for g in theirs]
    assert len({g["utilization.gpu"] for g in theirs}) > 1, "the instant should show different loads"

    p = run([bin_of("nvitop"), "-1"], env)
    assert p.returncode == 0 and "Traceback" not in p.stderr, p.stderr
    unit = {"B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30}  # an idle GPU's memory in use: "0B"
    rows = re.findall(r"(\d+(?:\.\d+)?)(B|[KMG]iB) / (\d+(?:\.\d+)?)([KMG]iB) │\s+(\d+)%", p.stdout)
    assert len(rows) == len(ours), p.stdout
    for g, (used, used_unit, total, total_unit, util) in zip(ours, rows):
        assert float(used) * unit[used_unit] == pytest.approx(g["mem_used_bytes"], rel=0.001)
        assert float(total) * unit[total_unit] == pytest.approx(g["mem_total_bytes"], rel=0.001)
        assert int(util) == round(g["util_ratio"] * 100)
    code = (
        "import json; from nvitop import Device;"
        "print(json.dumps([[d.index, d.name(), d.uuid()] for d in Device.all()]))"
    )
    api = json.loads(run([sys.executable, "-c", code], env).stdout)
    assert api == [[g["index"], g["name"], g["uuid"]] for g in ours]


# -- gpumon through the real NVML path ---------------------------------------------------------------


def record_standin(
    tmp_path: Path, config: Path, seconds: int, *extra: str
) -> tuple[subprocess.CompletedProcess[str], Path]:
    out = tmp_path / "t.jsonl"
    p = gpumon(
        "record",
        "--duration",
        str(seconds),
        "-o",
        str(out),
        *extra,
        env=driver.environment(config),
        timeout=seconds + 60,
    )
    return p, out


def test_record_through_pynvml_keeps_the_sub_second_history(library: Path, tmp_path: Path) -> None:
    config = driver.simulated_config(tmp_path, "starved-cpu,healthy")
    p, out = record_standin(tmp_path, config, 3)
    assert p.returncode == 0, p.stderr
    trace = read_trace(str(out))
    assert trace.header["source"]["kind"] == "nvml"
    later = trace.ticks[1:]
    assert all(5 <= len(g.util_history) <= 7 for t in later for g in t.gpus)  # 1/6 s samples
    starved = [p.util_ratio for t in later for p in t.gpus[0].util_history]
    fed = [p.util_ratio for t in later for p in t.gpus[1].util_history]
    assert max(starved) - min(starved) > 0.2 and min(fed) > 0.85
    assert all(g.power_w and g.mem_used_bytes for t in trace.ticks for g in t.gpus)


def test_a_lost_gpu_is_marked_down_and_comes_back_while_the_other_keeps_its_data(
    library: Path, tmp_path: Path
) -> None:
    config = driver.simulated_config(tmp_path, "healthy,healthy", faults=("lost 1 1500000 3500000",))
    p, out = record_standin(tmp_path, config, 6, "--log-level", "info")
    assert p.returncode == 0, p.stderr
    ticks = read_trace(str(out)).ticks
    assert all(t.gpus[0].available and t.gpus[0].util_ratio is not None for t in ticks)
    down = [t.t_s for t in ticks if not t.gpus[1].available]
    assert down and all("lost" in t.gpus[1].error for t in ticks if not t.gpus[1].available)
    assert ticks[-1].gpus[1].available, "it came back"
    assert ticks[-1].gpus[1].uuid == ticks[0].gpus[1].uuid
    assert p.stderr.count("WARNING: gpu 1: unavailable") == 1, "logged once, not once per tick"
    assert "recovered" in p.stderr


def test_a_hanging_call_does_not_freeze_the_sampler(library: Path, tmp_path: Path) -> None:
    # GPU 1's utilization call hangs for 120 s once the timeline passes 2 s
    config = driver.simulated_config(
        tmp_path, "healthy,healthy", faults=("block nvmlDeviceGetUtilizationRates 1 120 2000000",)
    )
    p, out = record_standin(tmp_path, config, 7)  # (its timeout, 67 s, is shorter than the hang)
    assert p.returncode == 0, p.stderr
    ticks = read_trace(str(out)).ticks
    # the recorder ended on time, with the call still hung: not after the hung call returned
    assert not ticks[-1].gpus[1].available, "the last tick still has GPU 1 hung"
    assert len(ticks) >= 5
    assert all(t.gpus[0].available for t in ticks), "the other GPU kept its data"
    hung = [t for t in ticks if not t.gpus[1].available]
    assert hung and all("does not return" in t.gpus[1].error for t in hung)


def test_stuck_threads_are_bounded(library: Path, tmp_path: Path) -> None:
    config = driver.simulated_config(
        tmp_path, "healthy,healthy,healthy", faults=("block nvmlDeviceGetPowerUsage -1 60 0",)
    )
    code = textwrap.dedent("""
        import threading, time, pynvml
        from gpumon.core.guard import CallGuard
        from gpumon.collect.pipeline.supervisor import Supervisor
        from gpumon.collect.sources.nvml.source import NvmlSource
        guard = CallGuard()
        src = NvmlSource(pynvml, guard=guard)
        src.open()
        supervisor = Supervisor(guard, 0.2)
        start = time.monotonic()
        for t in range(30):
            gpus = supervisor.call(lambda: src.poll(float(t)))
        print(round(time.monotonic() - start, 1), guard.stuck_threads, threading.active_count(),
              [g.available for g in gpus])
    """)
    p = run([sys.executable, "-c", code], driver.environment(config), timeout=120)
    assert p.returncode == 0, p.stderr
    seconds, stuck, threads, available = p.stdout.split(maxsplit=3)
    # every GPU hangs: three threads left stuck, one each; later polls skip the stuck GPUs at once
    assert int(stuck) == 3 and int(threads) <= 5
    assert float(seconds) < 3.0
    assert available.strip() == "[False, False, False]"


def test_a_driver_absent_at_start_is_picked_up_when_it_appears(library: Path, tmp_path: Path) -> None:
    config = driver.simulated_config(tmp_path, "healthy")
    later = tmp_path / "appears-later.conf"
    code = textwrap.dedent(f"""
        import logging, pathlib, shutil, pynvml
        from gpumon.core.errors import NoDriverError
        from gpumon.core.problems import Problems
        from gpumon.collect.sources.nvml.source import NvmlSource
        logging.basicConfig()
        problems = Problems(logging.getLogger("t"))
        src = NvmlSource(pynvml, problems, retry_init=True)
        src.open()  # no driver yet: not an error in this mode
        seen = []
        for t in range(40):
            if t == 5:
                shutil.copy({str(config)!r}, {str(later)!r})  # the driver is installed
            try:
                seen.append(len(src.poll(float(t))))
            except NoDriverError as e:  # the source is down meanwhile, and says why
                problems.note("nvml:failed", str(e))
                seen.append(-1)
        print(seen)
    """)
    p = run([sys.executable, "-c", code], driver.environment(later))
    assert p.returncode == 0, p.stderr
    seen = json.loads(p.stdout)
    first = seen.index(1)
    assert seen[:5] == [-1] * 5 and 5 < first <= 5 + 8, seen  # backoff 1, 2, 4, 8 s
    assert all(n == -1 for n in seen[:first]) and all(n == 1 for n in seen[first:])
    assert p.stderr.count("retrying with backoff") == 1


def test_unsupported_functions_leave_fields_out_without_log_spam(library: Path, tmp_path: Path) -> None:
    config = driver.simulated_config(
        tmp_path,
        "healthy",
        faults=(
            "unsupported nvmlDeviceGetPowerUsage",
            "unsupported nvmlDeviceGetSamples",
            "unsupported nvmlDeviceGetFieldValues",
        ),
    )
    p, out = record_standin(tmp_path, config, 3, "--log-level", "info")
    assert p.returncode == 0 and "WARNING" not in p.stderr and "unavailable" not in p.stderr, p.stderr
    ticks = read_trace(str(out)).ticks
    g = ticks[-1].gpus[0]
    assert g.power_w is None and g.pcie_rx_bytes_per_s is None and g.util_history == ()
    assert g.util_ratio is not None and g.mem_used_bytes is not None and g.available


@pytest.mark.parametrize("growth", [1, 1000])
def test_process_lists_that_grow_between_calls(library: Path, tmp_path: Path, growth: int) -> None:
    """pynvml sizes its buffer from a first call; a list that outgrows it (1000 new processes)
    makes pynvml raise INSUFFICIENT_SIZE, and gpumon asks again rather than lose the list."""
    config = driver.simulated_config(tmp_path, "healthy", faults=(f"procs_grow 0 {growth}",))
    p, out = record_standin(tmp_path, config, 2)
    # no warning about the list (a loaded machine may still log that the sampler fell behind)
    assert p.returncode == 0 and "processes" not in p.stderr and "ERROR" not in p.stderr, p.stderr
    g = read_trace(str(out)).ticks[-1].gpus[0]
    assert g.available and g.util_ratio is not None
    assert g.processes[0].pid == 40000 and len(g.processes) > growth


def test_no_driver_through_the_real_path_fails_cleanly(library: Path, tmp_path: Path) -> None:
    config = driver.simulated_config(tmp_path, "healthy", faults=("no_driver",))
    p = gpumon("devices", env=driver.environment(config))
    assert p.returncode == 3 and "Traceback" not in p.stderr
    assert "libnvidia-ml.so.1" in p.stderr and "Driver Not Loaded" in p.stderr and "--simulate" in p.stderr


def test_gpumon_creates_no_cuda_context(library: Path, tmp_path: Path) -> None:
    """It talks to NVML only: no CUDA library is ever mapped, no ML framework imported, and the
    stand-in's process list (which lists the jobs) never shows gpumon."""
    config = driver.simulated_config(tmp_path, "healthy,starved-cpu")
    env = driver.environment(config, PYTHONPATH=str(ROOT))
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpumon", "watch", "--duration", "4", "--no-color"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )
    try:
        time.sleep(2.5)  # a real process watched from outside: it must be mid-run
        maps = Path(f"/proc/{proc.pid}/maps").read_text()
    finally:
        out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    libs = {Path(line.split()[-1]).name for line in maps.splitlines() if ".so" in line}
    assert "libnvidia-ml.so.1" in libs
    assert not {lib for lib in libs if lib.startswith(("libcuda", "libcudart", "libnvrtc", "libtorch"))}
    assert str(proc.pid) not in out.split()


def serve_on_a_slow_driver(
    tmp_path: Path, scenarios: str, init_s: float
) -> tuple[subprocess.Popen[str], int]:
    """`gpumon serve` (recorder off) on the stand-in, whose first nvmlInit takes `init_s`."""
    import socket

    config = driver.simulated_config(tmp_path, scenarios, faults=(f"init_delay_us {round(init_s * 1e6)}",))
    env = driver.environment(config, PYTHONPATH=str(ROOT))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    cmd = [sys.executable, "-m", "gpumon", "serve", "--listen", f"127.0.0.1:{port}", "--record", "off"]
    return subprocess.Popen(cmd, env=env, cwd=tmp_path, stderr=subprocess.PIPE, text=True), port


def test_serve_answers_while_a_slow_driver_opens_and_serves_its_gpus_once_it_has(
    library: Path, tmp_path: Path
) -> None:
    """A driver without persistence mode can take seconds in nvmlInit: the daemon opens it on a
    thread of its own, so its port answers meanwhile (not ready yet: 503), then the GPUs come."""
    import urllib.error
    import urllib.request

    proc, port = serve_on_a_slow_driver(tmp_path, "healthy,healthy", init_s=3)
    seen: list[str] = []
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and "gpus" not in seen:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
                    body = r.read().decode()
                health = urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5)
                health.close()
                seen.append("gpus" if "gpumon_gpu_utilization_ratio{" in body else "healthy, no gpus")
            except urllib.error.HTTPError as e:
                seen.append(f"{e.code}")
            except OSError:
                seen.append("closed")
            time.sleep(0.05)
    finally:
        proc.terminate()
        err = proc.communicate(timeout=30)[1]
    assert seen and seen[-1] == "gpus", (seen[-5:], err[-2000:])
    answered = [s for s in seen if s != "closed"]
    assert answered[0] == "503", f"the port answered only once the driver had opened: {answered[:5]}"


def test_a_sigterm_while_a_slow_driver_opens_stops_the_daemon_without_waiting_for_it(
    library: Path, tmp_path: Path
) -> None:
    """The daemon's signals were taken only once a first sample had come (or 30 s had passed):
    a SIGTERM while nvmlInit ran (it may take a minute) waited for it, past systemd's stop timeout."""
    import signal
    import urllib.error
    import urllib.request

    proc, port = serve_on_a_slow_driver(tmp_path, "healthy", init_s=90)
    try:
        status = None
        deadline = time.monotonic() + 60
        while status is None and time.monotonic() < deadline:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5).close()
                status = 200
            except urllib.error.HTTPError as e:
                status = e.code
            except OSError:
                time.sleep(0.05)
        assert status == 503, "serving, the driver still opening"
        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(timeout=30)  # the driver's open would take 90 s
    finally:
        if proc.poll() is None:
            proc.kill()
        err = proc.communicate()[1]
    assert rc == 0, err[-2000:]
    assert "stopped in" in err


def test_systemd_hears_ready_with_the_first_sample_however_late_it_comes() -> None:
    """READY=1 came only from the start-up wait, which gave up after 30 s: a driver that took longer
    to open never made the service ready (systemd killed it at TimeoutStartSec)."""
    from gpumon.config.settings import Config
    from gpumon.core.clock import VirtualClock
    from gpumon.serve.daemon import Daemon
    from gpumon.serve.sdnotify import Notifier

    sent: list[str] = []

    class Recording(Notifier):
        def send(self, *lines: str) -> None:
            sent.append("\n".join(lines))

    d = Daemon(Config(simulate="healthy", listen="127.0.0.1:0"), clock=VirtualClock(), notifier=Recording())
    assert not d.ready and not any("READY=1" in m for m in sent)
    d.sampler.tick(45.0)  # the first sample, whenever it comes, with nobody waiting for it
    assert d.ready and sum("READY=1" in m for m in sent) == 1
    d.sampler.tick(46.0)
    assert sum("READY=1" in m for m in sent) == 1, "once"
