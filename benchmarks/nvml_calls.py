"""What each NVML call gpumon may make costs on this machine's driver: CPU and wall time per call.

    python -m benchmarks.nvml_calls [--calls 15] [--gpu 0]     (on a machine with NVIDIA GPUs)

For each call, one warm-up and then --calls calls one after the other, on GPU --gpu: the median
of the process's CPU time (time.process_time: every thread, the driver's too, user and kernel)
and of the wall time per call. A call the driver refuses prints its error instead. The stand-in
driver answers every call in microseconds; a real driver does not (benchmarks/gpu_check.sh runs
this on a lent GPU; docs/gpu-check.md has what it printed): `nvmlDeviceGetPcieThroughput`, for
one, measures the link over 20 ms inside the driver, which is why gpumon no longer calls it
(docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

from gpumon.collect.sources.nvml.samples import DirectSamples


def timed(call: Callable[[], object], n: int) -> tuple[float, float]:
    """The median CPU and wall seconds of `n` calls, after one not counted."""
    call()
    cpu, wall = [], []
    for _ in range(n):
        c0, w0 = time.process_time(), time.perf_counter()
        call()
        cpu.append(time.process_time() - c0)
        wall.append(time.perf_counter() - w0)
    return statistics.median(cpu), statistics.median(wall)


def calls(nv: Any, h: Any) -> dict[str, Callable[[], object]]:
    """Every call gpumon's NVML source may make on a tick, and the one it no longer makes."""
    fields = (nv.NVML_FI_DEV_PCIE_COUNT_TX_BYTES, nv.NVML_FI_DEV_PCIE_COUNT_RX_BYTES)
    last = [0]

    def samples() -> object:
        try:
            _, got = nv.nvmlDeviceGetSamples(h, nv.NVML_GPU_UTILIZATION_SAMPLES, last[0])
        except nv.NVMLError_NotFound:
            return None
        last[0] = got[-1].timeStamp
        return got

    direct = DirectSamples.of(nv)
    one_last = [0]

    def one_call() -> object:
        assert direct is not None
        try:
            _, got = direct(h, nv.NVML_GPU_UTILIZATION_SAMPLES, one_last[0])
        except nv.NVMLError_NotFound:
            return None
        if got:
            one_last[0] = got[-1].timeStamp
        return got

    out: dict[str, Callable[[], object]] = {
        "nvmlDeviceGetUtilizationRates": lambda: nv.nvmlDeviceGetUtilizationRates(h),
        "nvmlDeviceGetPowerUsage": lambda: nv.nvmlDeviceGetPowerUsage(h),
        "nvmlDeviceGetEnforcedPowerLimit": lambda: nv.nvmlDeviceGetEnforcedPowerLimit(h),
        "nvmlDeviceGetTemperature": lambda: nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU),
        "nvmlDeviceGetMemoryInfo (v2)": lambda: nv.nvmlDeviceGetMemoryInfo(h, version=nv.nvmlMemory_v2),
        "nvmlDeviceGetComputeRunningProcesses": lambda: nv.nvmlDeviceGetComputeRunningProcesses(h),
        "nvmlDeviceGetCurrentClocksEventReasons": lambda: nv.nvmlDeviceGetCurrentClocksEventReasons(h),
        "nvmlDeviceGetSamples (GPU utilization)": samples,
    }
    if direct is not None:  # gpumon's way: one driver call into a kept buffer (pynvml's makes two)
        out["nvmlDeviceGetSamples (one call, as gpumon)"] = one_call
    out |= {
        "nvmlDeviceGetMigMode": lambda: nv.nvmlDeviceGetMigMode(h),
        "nvmlDeviceGetFieldValues (PCIe TX+RX bytes)": lambda: nv.nvmlDeviceGetFieldValues(h, fields),
        "nvmlDeviceGetPcieThroughput (RX)": lambda: nv.nvmlDeviceGetPcieThroughput(
            h, nv.NVML_PCIE_UTIL_RX_BYTES
        ),
        "nvmlDeviceGetPcieThroughput (TX)": lambda: nv.nvmlDeviceGetPcieThroughput(
            h, nv.NVML_PCIE_UTIL_TX_BYTES
        ),
    }
    try:
        supported = nv.nvmlGpmQueryDeviceSupport(h).isSupportedDevice
    except nv.NVMLError:
        supported = 0
    if supported:
        a, b = nv.nvmlGpmSampleAlloc(), nv.nvmlGpmSampleAlloc()
        nv.nvmlGpmSampleGet(h, a)
        time.sleep(0.11)
        nv.nvmlGpmSampleGet(h, b)

        def metrics() -> object:
            m = nv.c_nvmlGpmMetricsGet_t()
            m.version = nv.NVML_GPM_METRICS_GET_VERSION
            m.sample1, m.sample2 = a, b
            ids = (
                nv.NVML_GPM_METRIC_SM_UTIL,
                nv.NVML_GPM_METRIC_SM_OCCUPANCY,
                nv.NVML_GPM_METRIC_PCIE_TX_PER_SEC,
            )
            m.numMetrics = len(ids)
            for i, metric in enumerate(ids):
                m.metrics[i].metricId = metric
            return nv.nvmlGpmMetricsGet(m)

        out["nvmlGpmSampleGet"] = lambda: nv.nvmlGpmSampleGet(h, b)
        out["nvmlGpmMetricsGet (3 metrics)"] = metrics
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=15, help="calls of each, after one warm-up (default 15)")
    ap.add_argument("--gpu", type=int, default=0, help="the GPU's index (default 0)")
    args = ap.parse_args()
    if args.calls < 1:
        ap.error(f"--calls: at least 1, got {args.calls}")
    import pynvml as nv

    try:
        nv.nvmlInit()
        h = nv.nvmlDeviceGetHandleByIndex(args.gpu)
    except nv.NVMLError as e:
        raise SystemExit(f"nvml_calls: NVML: {e}") from None
    print(
        f"GPU {args.gpu} {nv.nvmlDeviceGetName(h)}, driver {nv.nvmlSystemGetDriverVersion()}, "
        f"median of {args.calls} calls each"
    )
    print(f"{'call':<46} {'CPU ms':>9} {'wall ms':>9}")
    for name, call in calls(nv, h).items():
        try:
            cpu, wall = timed(call, args.calls)
        except nv.NVMLError as e:
            print(f"{name:<46} {type(e).__name__}: {e}")
            continue
        print(f"{name:<46} {cpu * 1e3:>9.3f} {wall * 1e3:>9.3f}")
    try:  # the cumulative PCIe byte counters, where the driver has them: each field's own return
        for v in nv.nvmlDeviceGetFieldValues(
            h, (nv.NVML_FI_DEV_PCIE_COUNT_TX_BYTES, nv.NVML_FI_DEV_PCIE_COUNT_RX_BYTES)
        ):
            print(f"field {v.fieldId}: return {v.nvmlReturn}, value {v.value.ullVal}, {v.latencyUsec} us")
    except nv.NVMLError as e:
        print(f"PCIe byte counter fields: {type(e).__name__}: {e}")


if __name__ == "__main__":
    main()
