"""Issue 14: GPM, MIG instances, clock-event reasons and XIDs, through the unmodified pynvml
loading the stand-in libnvidia-ml.so.1 (tests/fakenvml), and through the daemon users run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
import urllib.request
from pathlib import Path

import pytest

from gpumon.core.model import GpmActivity, GpuSample, Tick, XidCount
from gpumon.detect.vocabulary import Cause
from gpumon.trace.reader import read_trace
from tests.fakenvml import driver

from .conftest import ROOT, free_port, promtool_rule_test, served_labels, shipped_rule, start_serve


@pytest.fixture(scope="module")
def library() -> Path:
    return driver.build()


def python(code: str, env: dict[str, str], timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        env=dict(env, PYTHONPATH=str(ROOT)),
        timeout=timeout,
        cwd=ROOT,
    )


def gpumon(*args: str, env: dict[str, str], timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gpumon", *args],
        capture_output=True,
        text=True,
        env=dict(env, PYTHONPATH=str(ROOT)),
        timeout=timeout,
        cwd=ROOT,
    )


def constant_config(folder: Path, *lines: str, util: int = 80, seconds: int = 20) -> Path:
    """One GPU busy `util`% all along: GPM figures are then known in advance."""
    folder.mkdir(parents=True, exist_ok=True)
    body = ["epoch_us 0", "loop 0", "gpu 0 85899345920 700000 GPU-00000000-0000-4000-8000-000000000000 H100"]
    body += [f"s 0 {t * 100_000} {util}" for t in range(seconds * 10)]
    body += [f"t 0 0 1073741824 400000 60 {2048 * 1024} 1024 1 4242 1073741824"]
    config = folder / "fakenvml.conf"
    config.write_text("\n".join([*body, *lines]) + "\n")
    return config


# -- the driver as pynvml sees it -------------------------------------------------------------------


def test_gpm_metrics_are_the_counters_arithmetic_and_need_samples_100ms_apart(
    library: Path, tmp_path: Path
) -> None:
    config = constant_config(tmp_path, "gpm 0 0.5 0.25 0.6 0.3 0.1 0.2 0.05", util=80)
    p = python(
        """
        import os, pynvml
        pynvml.nvmlInit()
        h = pynvml.nvmlDeviceGetHandleByIndex(0)
        print(pynvml.nvmlGpmQueryDeviceSupport(h).isSupportedDevice)
        a, b = pynvml.nvmlGpmSampleAlloc(), pynvml.nvmlGpmSampleAlloc()
        def metrics(t1, t2, ids):
            os.environ["FAKENVML_NOW_US"] = str(t1); pynvml.nvmlGpmSampleGet(h, a)
            os.environ["FAKENVML_NOW_US"] = str(t2); pynvml.nvmlGpmSampleGet(h, b)
            g = pynvml.c_nvmlGpmMetricsGet_t()
            g.version, g.numMetrics = pynvml.NVML_GPM_METRICS_GET_VERSION, len(ids)
            g.sample1, g.sample2 = a, b
            for i, m in enumerate(ids):
                g.metrics[i].metricId = m
            pynvml.nvmlGpmMetricsGet(g)
            return [(g.metrics[i].nvmlReturn, round(g.metrics[i].value, 3)) for i in range(len(ids))]
        print(metrics(2_000_000, 3_000_000, [1, 2, 3, 5, 10, 12, 21]))
        print(metrics(2_000_000, 2_050_000, [1, 2]))
    """,
        driver.environment(config),
    )
    assert p.returncode == 0, p.stderr
    support, apart, close = p.stdout.splitlines()
    assert support == "1"
    # graphics 80%, SM = 0.5 of it, occupancy 0.25, tensor 0.6, DRAM 0.3, FP32 0.2; PCIe rx 2048 MiB/s
    assert eval(apart) == [(0, 80.0), (0, 40.0), (0, 20.0), (0, 48.0), (0, 24.0), (0, 16.0), (0, 2048.0)]
    assert all(ret != 0 for ret, _ in eval(close)), "samples 50 ms apart give no metrics"


def test_a_pre_hopper_stand_in_answers_not_supported_and_gpumon_leaves_the_fields_out(
    library: Path, tmp_path: Path
) -> None:
    config = constant_config(tmp_path)  # no `gpm` line: a pre-Hopper GPU
    p = python(
        """
        import logging, os, pynvml
        from gpumon.collect.sources.nvml.source import NvmlSource
        pynvml.nvmlInit()
        h = pynvml.nvmlDeviceGetHandleByIndex(0)
        out = [pynvml.nvmlGpmQueryDeviceSupport(h).isSupportedDevice]
        for call in (lambda: pynvml.nvmlGpmSampleGet(h, pynvml.nvmlGpmSampleAlloc()),
                     lambda: pynvml.nvmlDeviceGetMigMode(h)):
            try:
                call(); out.append("answered")
            except pynvml.NVMLError_NotSupported:
                out.append("NOT_SUPPORTED")
        print(out)
        logging.basicConfig(level=logging.INFO)
        src = NvmlSource(pynvml); src.open()
        for t in (1, 2, 3):
            os.environ["FAKENVML_NOW_US"] = str(t * 1_000_000)
            (g,) = src.poll(float(t))
        print(g.gpm, g.mig, g.util_ratio)
    """,
        driver.environment(config),
    )
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    assert lines[0] == "[0, 'NOT_SUPPORTED', 'NOT_SUPPORTED']"
    assert lines[1] == "None None 0.8"
    assert "gpm" not in p.stderr and "mig" not in p.stderr, "not supported is not a problem to log"


MIG_SCRIPT = """
    import json, os, time, pynvml
    from gpumon.collect.sources.nvml.source import NvmlSource
    src = NvmlSource(pynvml); src.open()
    ticks = []
    for t in range(1, 5):
        for k in range(1, 5):  # the sampler's steps between ticks (activity_period_s: 5 a second)
            os.environ["FAKENVML_NOW_US"] = str(t * 1_000_000 + k * 200_000)
            src.sample_activity(t + k * 0.2)
        os.environ["FAKENVML_NOW_US"] = str((t + 1) * 1_000_000)
        time.sleep(0.6 if t == 3 else 0)  # the XID thread waits with a timeout: let it deliver
        ticks.append([g._asdict() for g in src.poll(t + 1.0)])
    print(json.dumps({"activity_period_s": src.activity_period_s}))
    began = time.monotonic()
    src.close()
    print(json.dumps({"ticks": ticks, "close_s": time.monotonic() - began}, default=str))
"""


def test_mig_instances_are_units_with_gpm_and_xids_count_once_even_on_a_lost_gpu(
    library: Path, tmp_path: Path
) -> None:
    config = driver.mig_config(
        tmp_path,
        "healthy,idle",
        "starved-cpu,healthy,idle",
        seconds=30,
        extra=(
            "xid 1 2500000 79",  # on the MIG-enabled GPU, while it is fine
            "xid 1 2500000 94 2 0",  # attributed to its GPU instance 2
            "xid 0 2500000 79 ",
            "xid 0 2600000 48",
            "fault lost 0 2500000 100000000",  # GPU 0 falls off the bus at 2.5 s
            "clocks 1 0 100000000 4",  # GPU 1 held by its power cap all along
        ),
    )
    p = python(MIG_SCRIPT, driver.environment(config))
    assert p.returncode == 0, p.stderr
    period, rest = p.stdout.split("\n", 1)
    assert json.loads(period) == {"activity_period_s": 0.2}
    out = json.loads(rest)
    ticks = out["ticks"]
    units = [(g["index"], g["mig"], g["uuid"][:4]) for g in ticks[0]]
    assert units == [(0, None, "GPU-"), (1, None, "GPU-"), (1, 1, "MIG-"), (1, 2, "MIG-"), (1, 3, "MIG-")]
    last = {(g["index"], g["mig"]): g for g in ticks[-1]}
    migs = [last[(1, gi)] for gi in (1, 2, 3)]
    # NVML has no utilization on MIG: the history is GPM activity, 5 points a tick
    assert all(g["util_ratio"] is None for g in migs)
    assert all(len(g["util_history"]) == 5 for g in migs)
    starved, fed, idle = ([p[1] for p in g["util_history"]] for g in migs)
    assert max(starved) - min(starved) > 0.2 and min(fed) > 0.8 and max(idle) == 0
    assert all(g["gpm"] is not None for g in migs)
    sm = {gi: g["gpm"][1] for gi, g in zip((1, 2, 3), migs, strict=True)}  # sm_active_ratio
    assert sm[2] > 0.6 and sm[3] == 0 and 0 < sm[1] < sm[2]
    # the parent carries power and clocks; its instances do not
    assert last[(1, None)]["power_w"] is not None and all(g["power_w"] is None for g in migs)
    assert last[(1, None)]["clock_events"] == 4
    held = dict(last[(1, None)]["clock_event_s"])
    assert held["sw_power_cap"] == pytest.approx(3.0, abs=0.01)
    # XIDs: GPU 1's 79 counted once (the tick after too); GPU 0's counted while it is lost
    assert [g["xids"] for g in ticks[2] if g["index"] == 1 and g["mig"] is None] == [[[79, 1]]]
    assert last[(1, None)]["xids"] == [[79, 1]] and last[(1, None)]["last_xid"][0] == 79
    assert last[(1, 2)]["xids"] == [[94, 1]] and last[(1, 1)]["xids"] == [], "MIG ids carried through"
    lost = last[(0, None)]
    assert lost["available"] is False and sorted(map(tuple, lost["xids"])) == [(48, 1), (79, 1)]
    assert out["close_s"] < 2.0, "the XID thread's wait must not hold up shutdown"


def test_clock_events_fall_back_to_the_deprecated_throttle_reasons_call(
    library: Path, tmp_path: Path
) -> None:
    config = constant_config(
        tmp_path, "clocks 0 0 100000000 64", "fault unsupported nvmlDeviceGetCurrentClocksEventReasons"
    )
    p = python(
        """
        import os, pynvml
        from gpumon.collect.sources.nvml.source import NvmlSource
        src = NvmlSource(pynvml); src.open()
        for t in (1, 2, 3):
            os.environ["FAKENVML_NOW_US"] = str(t * 1_000_000)
            (g,) = src.poll(float(t))
        print(g.clock_events, dict(g.clock_event_s))
    """,
        driver.environment(config),
    )
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == "64 {'hw_thermal': 2.0}"


def test_gpumon_devices_json_lists_the_parent_and_its_mig_instances(library: Path, tmp_path: Path) -> None:
    config = driver.mig_config(tmp_path, "healthy,idle", "starved-cpu,healthy,idle", seconds=30)
    p = gpumon("devices", "--json", env=driver.environment(config))
    assert p.returncode == 0, p.stderr
    rows = json.loads(p.stdout)["gpus"]
    assert [(r["index"], r["mig"]) for r in rows] == [(0, None), (1, None), (1, 1), (1, 2), (1, 3)]
    assert all(r["uuid"].startswith("MIG-") for r in rows[2:]) and "MIG 1g.10gb" in rows[2]["name"]
    table = gpumon("devices", env=driver.environment(config))
    assert "  1/3  " in table.stdout, table.stdout
    # nvitop's MIG view of the same driver: the same instances, ids, UUIDs and memory
    nvitop = python(
        """
        import json
        from nvitop import Device
        print(json.dumps([[d.index, None, d.uuid(), d.memory_total()] for d in Device.all()] + [
            [m.index[0], m.gpu_instance_id(), m.uuid(), m.memory_total()]
            for d in Device.all() for m in d.mig_devices()]))
    """,
        driver.environment(config),
    )
    assert nvitop.returncode == 0, nvitop.stderr
    ours = [[r["index"], r["mig"], r["uuid"], r["mem_total_bytes"]] for r in rows]
    assert ours == json.loads(nvitop.stdout)


# -- through the daemon -------------------------------------------------------------------------


def scrape(port: int) -> list[str]:
    try:
        return (
            urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode().splitlines()
        )
    except OSError:
        return []


def test_serve_on_a_mig_gpu_flags_the_starved_instance_and_an_xid_79_fires_its_alert(
    library: Path, tmp_path: Path
) -> None:
    """The issue's check: 2 GPUs, one in MIG mode with 3 instances; SM activity for each unit; a
    starved job on a MIG instance flagged starved; one scripted XID 79 counted exactly once, and
    the shipped alert fires on the series the daemon served."""
    config = driver.mig_config(
        tmp_path, "healthy,idle", "starved-cpu,healthy,idle", seconds=60, extra=("xid 1 6000000 79",)
    )
    port = free_port()
    serve = start_serve(
        "--interval", "1", "--record-dir", str(tmp_path / "rec"), port=port, env=driver.environment(config)
    )
    before: list[str] = []
    after: list[str] = []
    try:
        deadline = time.monotonic() + 40
        while time.monotonic() < deadline:
            lines = scrape(port)
            xid = [x for x in lines if x.startswith("gpumon_gpu_xid_errors_total{")]
            starved = any(
                x.startswith("gpumon_gpu_state{")
                and 'mig="1"' in x
                and 'state="starved"' in x
                and x.endswith(" 1.0")
                for x in lines
            )
            if lines and not xid and not before:
                before = lines
            if xid and starved:
                time.sleep(2.5)  # two more ticks: the count must not move
                after = scrape(port)
                break
            time.sleep(0.5)
    finally:
        serve.terminate()
        serve.wait(timeout=30)
    assert before, "the XID came before the first scrape"
    assert after, "no starved MIG instance with an XID counted within 40 s"
    sm = [x for x in after if x.startswith("gpumon_gpu_sm_active_ratio{")]
    assert len(sm) == 5 and sum('uuid="MIG-' in x for x in sm) == 3
    # the MIG-enabled parent has no verdict of its own: `mig`, not `unknown` forever (issue 25)
    parent = [x for x in after if x.startswith('gpumon_gpu_state{gpu="1",mig=""') and x.endswith(" 1.0")]
    assert len(parent) == 1 and 'state="mig"' in parent[0], parent
    xid = [x for x in after if x.startswith("gpumon_gpu_xid_errors_total{")]
    assert xid == [x for x in xid if 'gpu="1"' in x and 'xid="79"' in x and 'mig=""' in x] and len(xid) == 1
    assert xid[0].endswith(" 1.0"), xid
    labels = served_labels(xid[0][len("gpumon_gpu_xid_errors_total{") : xid[0].index("}")])
    uuid = labels.split('uuid="')[1].split('"')[0]
    description = shipped_rule("GpumonGpuXidCritical")["annotations"]["description"]
    alert = {
        "exp_labels": {
            **dict(x.replace('"', "").split("=", 1) for x in labels.split(",")),
            "instance": "node1:9877",
            "job": "gpumon",
            "severity": "critical",
        },
        "exp_annotations": {
            "summary": f"GPU 1 ({uuid}) on node1:9877 reported XID 79",
            "description": description.replace("{{ $labels.xid }}", "79"),
        },
    }
    test = {
        # absent while `before` was served, then the value `after` had
        "input_series": [
            {
                "series": f'gpumon_gpu_xid_errors_total{{{labels},instance="node1:9877",job="gpumon"}}',
                "values": "_ _ 1x8",
            }
        ],
        "alert_rule_test": [
            {"eval_time": "15s", "alertname": "GpumonGpuXidCritical", "exp_alerts": []},
            {"eval_time": "30s", "alertname": "GpumonGpuXidCritical", "exp_alerts": [alert]},
        ],
    }
    promtool_rule_test(tmp_path, "xid", test)


# -- detector and traces ------------------------------------------------------------------------


def test_pcie_traffic_comes_from_gpm_where_it_gives_it_and_from_the_counters_where_not(
    library: Path, tmp_path: Path
) -> None:
    """A GPU with GPM is not asked its PCIe byte counters for what GPM gives over the whole tick; a
    tick GPM answers nothing (too soon after the last) reads the counters again, and their rate
    needs the reading after it. The driver's 20 ms PCIe window (nvmlDeviceGetPcieThroughput) is
    never asked: on an H200 each call cost ~47 ms of CPU."""
    config = constant_config(tmp_path, "gpm 0 0.5 0.25 0.6 0.3 0.1 0.2 0.05", util=80)
    p = python(
        """
        import os, pynvml
        from gpumon.collect.sources.nvml.source import NvmlSource
        asked = []
        class Counting:
            def __getattr__(self, name):
                fn = getattr(pynvml, name)
                if name not in ("nvmlDeviceGetFieldValues", "nvmlDeviceGetPcieThroughput"):
                    return fn
                return lambda *a: asked.append(name) or fn(*a)
        src = NvmlSource(Counting()); src.open()
        for t in (1.0, 2.0, 3.0, 3.05, 3.5, 4.0, 5.0):
            os.environ["FAKENVML_NOW_US"] = str(int(t * 1_000_000))
            (g,) = src.poll(t)
            gpm_rx = None if g.gpm is None else g.gpm.pcie_rx_bytes_per_s
            print(",".join(asked) or "-", g.pcie_rx_bytes_per_s, gpm_rx); asked.clear()
    """,
        driver.environment(config),
    )
    assert p.returncode == 0, p.stderr
    rows = [line.split() for line in p.stdout.splitlines()]
    two_gib, fields = str(2048 * 1024 * 1024.0), "nvmlDeviceGetFieldValues"
    assert rows[0] == [fields, "None", "None"], "the first tick: no GPM pair yet, the counters' first reading"
    assert rows[1] == ["-", two_gib, two_gib], "GPM's figure as soon as it gives one"
    assert rows[2] == ["-", two_gib, two_gib], "and from then on the counters are not asked"
    assert rows[3] == [fields, "None", "None"], "50 ms after the last tick GPM gives nothing: the counters"
    assert rows[4] == ["-", two_gib, two_gib]
    assert rows[5:] == [["-", two_gib, two_gib]] * 2


def test_small_kernels_are_called_out_only_where_gpm_is_read(tmp_path: Path) -> None:
    out = tmp_path / "t.jsonl"
    env = dict(os.environ)
    p = gpumon(
        "record", "--simulate", "small-kernels,healthy-hopper,healthy-power-capped,healthy",
        "--duration", "30", "--speed", "max", "-o", str(out), env=env,
    )  # fmt: skip
    assert p.returncode == 0, p.stderr
    a = gpumon("analyze", str(out), "--json", env=env)
    assert a.returncode == 0, a.stderr
    gpus = json.loads(a.stdout)["gpus"]
    names = read_trace(str(out)).header["source"]["scenarios"]
    verdicts = {names[g["index"]]: g["verdict"] for g in gpus}
    assert verdicts == {
        "small-kernels": f"underutilized-{Cause.SMALL_KERNELS}",
        "healthy-hopper": "healthy",
        "healthy-power-capped": "healthy",
        "healthy": "healthy",
    }
    capped = next(g for g in gpus if names[g["index"]] == "healthy-power-capped")
    assert "clocks held down: power" in json.dumps(capped)


@pytest.mark.parametrize("version", [1, 2])
def test_traces_keep_mig_units_gpm_clock_events_and_xids(tmp_path: Path, version: int) -> None:
    from gpumon.trace.records import make_header
    from gpumon.trace.writer import TraceWriter, TraceWriterV2

    gpm = GpmActivity(graphics_ratio=0.9, sm_active_ratio=0.3, nvlink_rx_bytes_per_s=1e9)

    def tick(t: float) -> Tick:
        parent = GpuSample(t, 1, "GPU-1", "H100", clock_events=4, clock_event_s=(("sw_power_cap", t),))
        units = tuple(
            GpuSample(t, 1, f"MIG-{gi}", "H100 MIG", mem_used_bytes=gi, mig=gi, gpm=gpm) for gi in (1, 2)
        )
        xid = GpuSample(
            t,
            0,
            "GPU-0",
            "H100",
            available=False,
            error="lost",
            xids=(XidCount(79, 1),),
            last_xid=(79, 1.7e9),
        )
        return Tick(t, (xid, parent, *units), None)

    path = tmp_path / f"t.v{version}"
    writer = (TraceWriter if version == 1 else TraceWriterV2)(
        str(path), make_header({"kind": "nvml"}, 1.0, version)
    )
    for t in (1.0, 2.0, 3.0):
        writer.write_tick(tick(t))
    writer.close(3.0, "duration")
    ticks = read_trace(str(path)).ticks
    assert [g._replace(t_s=0) for g in ticks[-1].gpus] == [g._replace(t_s=0) for g in tick(3.0).gpus]


def test_gpm_off_in_the_configuration_leaves_gpm_out(library: Path, tmp_path: Path) -> None:
    """`gpm = false` (docs/configuration.md): no GPM series, while the rest is served."""
    config = driver.mig_config(tmp_path, "healthy", "healthy", mig_parent=0, seconds=30)
    conf = tmp_path / "gpumon.toml"
    conf.write_text(f'gpm = false\nrecord_dir = "{tmp_path / "rec"}"\n')
    port = free_port()
    serve = start_serve("--config", str(conf), port=port, env=driver.environment(config))
    lines: list[str] = []
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and not any(
            x.startswith("gpumon_gpu_memory_used_bytes") for x in lines
        ):
            time.sleep(0.5)
            lines = scrape(port)
        time.sleep(1.5)
        lines = scrape(port)
    finally:
        serve.terminate()
        serve.wait(timeout=30)
    assert any(x.startswith("gpumon_gpu_memory_used_bytes{") and 'mig="1"' in x for x in lines), lines[:5]
    assert not [
        x for x in lines if x.startswith(("gpumon_gpu_sm_active_ratio{", "gpumon_gpu_graphics_active"))
    ]
