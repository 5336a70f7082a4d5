"""What the real pynvml, and gpumon's NVML source, see on the stand-in: run in a process that
loads it (tests/nvml2/build.py's environment, with NVML2_NOW_US set), it prints one JSON object
for tests/test_nvml2.py to judge.

    python -m tests.nvml2.probe

Timeline time is moved by setting os.environ["NVML2_NOW_US"] (CPython calls putenv, and the
library reads it on every call), XID events are scripted the same way (NVML2_XIDS); event-wait
timeouts, and one event wait with the timeline on the real clock, run on the real clock.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable
from typing import Any

import pynvml as nv

GPM_IDS = (1, 2, 3, 5, 10, 11, 12, 13)
"""Graphics, SM activity, SM occupancy, tensor, DRAM bandwidth, FP64, FP32, FP16 (nvml.h)."""


def at(t_us: int) -> None:
    os.environ["NVML2_NOW_US"] = str(t_us)


def code(fn: Callable[..., Any], *args: Any) -> int:
    """NVML's return code of fn(*args): 0, or the error's."""
    try:
        fn(*args)
    except nv.NVMLError as e:
        return int(e.value)
    return 0


def identity(handles: list[Any]) -> dict[str, Any]:
    return {
        "count": nv.nvmlDeviceGetCount(),
        "names": [nv.nvmlDeviceGetName(h) for h in handles],
        "uuids": [nv.nvmlDeviceGetUUID(h) for h in handles],
        "indices": [nv.nvmlDeviceGetIndex(h) for h in handles],
        "capability": list(nv.nvmlDeviceGetCudaComputeCapability(handles[0])),
        "mig_mode": nv.nvmlDeviceGetMigMode(handles[0]),
    }


def samples(handles: list[Any], t0: int) -> dict[str, Any]:
    """The ring at t0, then what is newer than its newest 10 s and 1000 s later."""
    util = nv.NVML_GPU_UTILIZATION_SAMPLES
    h = handles[4]
    vtype, ring = nv.nvmlDeviceGetSamples(h, util, 0)
    last = ring[-1].timeStamp
    out: dict[str, Any] = {"type": vtype, "last": last}
    out["ring"] = [(s.timeStamp, s.sampleValue.uiVal) for s in ring]
    out["again"] = code(nv.nvmlDeviceGetSamples, h, util, last)
    at(t0 + 10_000_000)
    out["fresh"] = [(s.timeStamp, s.sampleValue.uiVal) for s in nv.nvmlDeviceGetSamples(h, util, last)[1]]
    at(t0 + 1_000_000_000)
    out["after_1000_s"] = len(nv.nvmlDeviceGetSamples(h, util, last)[1])
    at(t0)
    out["per_gpu"] = [[s.sampleValue.uiVal for s in nv.nvmlDeviceGetSamples(g, util, 0)[1]] for g in handles]
    return out


def readings(handles: list[Any]) -> dict[str, Any]:
    procs = []
    memory = []
    plain = []
    for g in handles:
        procs.append(
            [(p.pid, p.usedGpuMemory, p.gpuInstanceId) for p in nv.nvmlDeviceGetComputeRunningProcesses(g)]
        )
        m2 = nv.nvmlDeviceGetMemoryInfo(g, version=nv.nvmlMemory_v2)
        m1 = nv.nvmlDeviceGetMemoryInfo(g)
        memory.append(
            {"v2": [m2.version, m2.total, m2.reserved, m2.free, m2.used], "v1": [m1.total, m1.free, m1.used]}
        )
        u = nv.nvmlDeviceGetUtilizationRates(g)
        plain.append(
            [
                u.gpu,
                u.memory,
                nv.nvmlDeviceGetPowerUsage(g),
                nv.nvmlDeviceGetEnforcedPowerLimit(g),
                nv.nvmlDeviceGetTemperature(g, nv.NVML_TEMPERATURE_GPU),
                nv.nvmlDeviceGetPcieThroughput(g, nv.NVML_PCIE_UTIL_TX_BYTES),
                nv.nvmlDeviceGetPcieThroughput(g, nv.NVML_PCIE_UTIL_RX_BYTES),
                nv.nvmlDeviceGetCurrentClocksEventReasons(g),
            ]
        )
    return {
        "processes": procs,
        "memory": memory,
        "memory_bad_version": code(nv.nvmlDeviceGetMemoryInfo, handles[0], 1),
        "plain": plain,
    }


def gpm(handles: list[Any], t0: int) -> dict[str, Any]:
    """GPM metrics between two samples one second of timeline time apart, per GPU."""
    per_gpu = []
    for g in handles:
        a, b = nv.nvmlGpmSampleAlloc(), nv.nvmlGpmSampleAlloc()
        at(t0)
        nv.nvmlGpmSampleGet(g, a)
        at(t0 + 1_000_000)
        nv.nvmlGpmSampleGet(g, b)
        get = nv.c_nvmlGpmMetricsGet_t()
        get.version = nv.NVML_GPM_METRICS_GET_VERSION
        get.numMetrics = len(GPM_IDS)
        get.sample1, get.sample2 = a, b
        for i, metric in enumerate(GPM_IDS):
            get.metrics[i].metricId = metric
        nv.nvmlGpmMetricsGet(get)
        got = [get.metrics[i] for i in range(len(GPM_IDS))]
        per_gpu.append([(m.metricId, m.nvmlReturn, m.value) for m in got])
        nv.nvmlGpmSampleFree(a)
        nv.nvmlGpmSampleFree(b)
    at(t0)
    spare = nv.nvmlGpmSampleAlloc()
    mig = code(nv.nvmlGpmMigSampleGet, handles[0], 1, spare)
    nv.nvmlGpmSampleFree(spare)
    supported = nv.nvmlGpmQueryDeviceSupport(handles[0]).isSupportedDevice
    return {"gpm": per_gpu, "gpm_mig": mig, "gpm_supported": supported}


def timed(fn: Callable[..., Any], *args: Any) -> dict[str, Any]:
    """fn(*args) on this thread: its NVML code, what it returned, wall and this thread's CPU time."""
    c0, w0 = time.thread_time(), time.monotonic()
    try:
        got, rc = fn(*args), 0
    except nv.NVMLError as e:
        got, rc = None, int(e.value)
    return {"code": rc, "got": got, "wall_s": time.monotonic() - w0, "cpu_s": time.thread_time() - c0}


def event(data: Any) -> list[int] | None:
    if data is None:
        return None
    return [nv.nvmlDeviceGetIndex(data.device), data.eventType, data.eventData, data.gpuInstanceId]


def event_wait(handles: list[Any], t0: int) -> dict[str, Any]:
    """Scripted XID events through nvmlEventSetWait_v2: with time held (moved by hand), and with
    the timeline on the real clock (an event 300 ms ahead)."""
    xid = nv.nvmlEventTypeXidCriticalError
    at(t0)
    events = nv.nvmlEventSetCreate()
    for k in (2, 5, 6):  # GPU 1 is not registered
        nv.nvmlDeviceRegisterEvents(handles[k], xid, events)
    os.environ["NVML2_XIDS"] = (
        f"2:31@{t0},1:79@{t0 + 500},6:13@{t0 + 5000},5:48@{t0 + 1000},2:79@{t0 + 1000},bad,9:1@{t0 + 1}"
    )
    out: dict[str, Any] = {"timeout": timed(nv.nvmlEventSetWait_v2, events, 200)}
    at(t0 + 2000)
    due = [timed(nv.nvmlEventSetWait_v2, events, 5000) for _ in range(2)]
    out["due"] = [event(w["got"]) for w in due]
    out["not_yet"] = timed(nv.nvmlEventSetWait_v2, events, 0)["code"]
    at(t0 + 5000)
    out["later"] = event(nv.nvmlEventSetWait_v2(events, 0))
    out["drained"] = timed(nv.nvmlEventSetWait_v2, events, 0)["code"]
    nv.nvmlEventSetFree(events)

    del os.environ["NVML2_NOW_US"]  # the real clock
    live = nv.nvmlEventSetCreate()
    nv.nvmlDeviceRegisterEvents(handles[3], xid, live)
    due_us = int(time.time() * 1e6) + 300_000
    os.environ["NVML2_XIDS"] = f"3:79@{due_us}"
    wait = timed(nv.nvmlEventSetWait_v2, live, 10_000)
    returned_us = int(time.time() * 1e6)
    nv.nvmlEventSetFree(live)
    at(t0)
    del os.environ["NVML2_XIDS"]
    out["live"] = {
        "event": event(wait["got"]),
        "early_us": due_us - returned_us,
        "cpu_s": wait["cpu_s"],
    }
    out["timeout"]["got"] = None
    return out


def threads(handles: list[Any]) -> list[str]:
    """Readers on three threads while a fourth waits for events, as gpumon's poller and event
    thread do: every call must answer whole."""
    errors: list[str] = []
    waiter = nv.nvmlEventSetCreate()
    stop = time.monotonic() + 0.3

    def read() -> None:
        try:
            for _ in range(300):
                for g in handles:
                    nv.nvmlDeviceGetUtilizationRates(g)
                    nv.nvmlDeviceGetComputeRunningProcesses(g)
        except Exception as e:
            errors.append(repr(e))

    def wait() -> None:
        while time.monotonic() < stop:
            if code(nv.nvmlEventSetWait_v2, waiter, 50) != nv.NVML_ERROR_TIMEOUT:
                errors.append("event wait: not TIMEOUT")

    running = [threading.Thread(target=read) for _ in range(3)] + [threading.Thread(target=wait)]
    for t in running:
        t.start()
    for t in running:
        t.join()
    nv.nvmlEventSetFree(waiter)
    return errors


def gpumon_ticks(handles: list[Any], t0: int) -> dict[str, Any]:
    """Two ticks of gpumon's NvmlSource one second of timeline time apart, with an XID scripted
    between them; what the stand-in says at the second tick, read directly, to compare; and two
    ticks with GPM off."""
    from gpumon.collect.sources.nvml.source import NvmlSource
    from gpumon.collect.sources.nvml.xid import XidWatcher

    def view(sample: Any) -> dict[str, Any]:
        return {
            "index": sample.index,
            "uuid": sample.uuid,
            "available": sample.available,
            "error": sample.error,
            "util": sample.util_ratio,
            "history": [tuple(p) for p in sample.util_history],
            "procs": [tuple(p) for p in sample.processes],
            "mem_used": sample.mem_used_bytes,
            "power_w": sample.power_w,
            "gpm": None if sample.gpm is None else sample.gpm._asdict(),
            "xids": [tuple(x) for x in sample.xids],
            "last_xid": None if sample.last_xid is None else sample.last_xid[0],
        }

    # gpumon's XID thread records the event on its own time: know when, rather than sleep
    recorded = threading.Event()
    record = XidWatcher.record

    def record_and_tell(self: XidWatcher, *args: Any, **kwargs: Any) -> None:
        record(self, *args, **kwargs)
        recorded.set()

    XidWatcher.record = record_and_tell  # type: ignore[method-assign]
    os.environ["NVML2_XIDS"] = f"3:79@{t0 + 500_000}"
    at(t0)
    src = NvmlSource(nv)
    src.open()
    first = src.poll(1.0)
    at(t0 + 1_000_000)
    xid_recorded = recorded.wait(30.0)  # the watcher's wait notices the moved time at its timeout
    second = src.poll(2.0)
    src.close()
    XidWatcher.record = record  # type: ignore[method-assign]
    del os.environ["NVML2_XIDS"]

    util = nv.NVML_GPU_UTILIZATION_SAMPLES
    direct = []
    for k, g in enumerate(handles):
        a, b = nv.nvmlGpmSampleAlloc(), nv.nvmlGpmSampleAlloc()
        at(t0)
        nv.nvmlGpmSampleGet(g, a)
        at(t0 + 1_000_000)
        nv.nvmlGpmSampleGet(g, b)
        get = nv.c_nvmlGpmMetricsGet_t()
        get.version, get.numMetrics, get.sample1, get.sample2 = nv.NVML_GPM_METRICS_GET_VERSION, 1, a, b
        get.metrics[0].metricId = 1  # graphics activity
        nv.nvmlGpmMetricsGet(get)
        nv.nvmlGpmSampleFree(a)
        nv.nvmlGpmSampleFree(b)
        ring = nv.nvmlDeviceGetSamples(g, util, 0)[1]
        direct.append(
            {
                "newest": [s.sampleValue.uiVal for s in ring[-len(second[k].util_history) :]],
                "procs": [(p.pid, p.usedGpuMemory) for p in nv.nvmlDeviceGetComputeRunningProcesses(g)],
                "mem_used": nv.nvmlDeviceGetMemoryInfo(g, version=nv.nvmlMemory_v2).used,
                "power_mw": nv.nvmlDeviceGetPowerUsage(g),
                "graphics_pct": get.metrics[0].value,
            }
        )

    at(t0 + 10_000_000)
    off = NvmlSource(nv, gpm=False)
    off.open()
    off_ticks = [off.poll(11.0)]
    at(t0 + 11_000_000)
    off_ticks.append(off.poll(12.0))
    off.close()
    return {
        "first": [view(s) for s in first],
        "second": [view(s) for s in second],
        "xid_recorded": xid_recorded,
        "direct": direct,
        "gpm_off": [[view(s) for s in tick] for tick in off_ticks],
    }


def main() -> None:
    t0 = int(os.environ["NVML2_NOW_US"])
    nv.nvmlInit()
    handles = [nv.nvmlDeviceGetHandleByIndex(i) for i in range(nv.nvmlDeviceGetCount())]
    out = identity(handles)
    out["samples"] = samples(handles, t0)
    out.update(readings(handles))
    out.update(gpm(handles, t0))
    out["events"] = event_wait(handles, t0)
    out["thread_errors"] = threads(handles)
    out["gpumon"] = gpumon_ticks(handles, t0 + 2_000_000_000)
    nv.nvmlShutdown()
    out["after_shutdown"] = code(nv.nvmlDeviceGetCount)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
