"""What the real pynvml, and gpumon's NVML source, see on the stand-in: run in a process that
loads it (tests/nvml2/build.py's environment, with NVML2_NOW_US set), it prints one JSON object
for tests/test_nvml2.py to judge.

    python -m tests.nvml2.probe

Timeline time is moved by setting os.environ["NVML2_NOW_US"] (CPython calls putenv, and the
library reads it on every call); the event wait alone runs on the real clock.
"""

from __future__ import annotations

import json
import os
import resource
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


def event_wait(handles: list[Any]) -> dict[str, Any]:
    """A 200 ms wait: its code, wall time and CPU time."""
    events = nv.nvmlEventSetCreate()
    for g in handles:
        nv.nvmlDeviceRegisterEvents(g, nv.nvmlEventTypeXidCriticalError, events)
    r0, w0 = resource.getrusage(resource.RUSAGE_SELF), time.monotonic()
    wait_code = code(nv.nvmlEventSetWait_v2, events, 200)
    r1, w1 = resource.getrusage(resource.RUSAGE_SELF), time.monotonic()
    nv.nvmlEventSetFree(events)
    cpu_s = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
    return {"code": wait_code, "wall_s": w1 - w0, "cpu_s": cpu_s}


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


def gpumon_ticks(t0: int) -> dict[str, Any]:
    """Two ticks of gpumon's NvmlSource, one second of timeline time apart."""
    from gpumon.collect.sources.nvml.source import NvmlSource

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
        }

    at(t0)
    src = NvmlSource(nv)
    src.open()
    first = src.poll(1.0)
    at(t0 + 1_000_000)
    second = src.poll(2.0)
    src.close()
    return {"first": [view(s) for s in first], "second": [view(s) for s in second]}


def main() -> None:
    t0 = int(os.environ["NVML2_NOW_US"])
    nv.nvmlInit()
    handles = [nv.nvmlDeviceGetHandleByIndex(i) for i in range(nv.nvmlDeviceGetCount())]
    out = identity(handles)
    out["samples"] = samples(handles, t0)
    out.update(readings(handles))
    out.update(gpm(handles, t0))
    out["wait"] = event_wait(handles)
    out["thread_errors"] = threads(handles)
    out["gpumon"] = gpumon_ticks(t0 + 2_000_000_000)
    nv.nvmlShutdown()
    out["after_shutdown"] = code(nv.nvmlDeviceGetCount)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
