"""NvmlSource against hand-built pynvml look-alikes: fields, units, unsupported fields, lost GPUs,
the sample buffer (NOT_FOUND, last-seen tracking) and the no-driver message."""

from __future__ import annotations

import logging
from types import SimpleNamespace
from typing import Any

import pytest

from gpumon.collect.sources.nvml.samples import SampleClockAligner
from gpumon.collect.sources.nvml.source import NvmlSource
from gpumon.core.errors import NoDriverError
from gpumon.core.model import UtilPoint
from gpumon.core.problems import Problems


class NVMLError(Exception):
    def __init__(self, value: int) -> None:
        self.value = value
        super().__init__(
            {
                3: "Not Supported",
                6: "Not Found",
                12: "NVML Shared Library Not Found",
                15: "GPU is lost",
                999: "Unknown Error",
            }.get(value, str(value))
        )


class NVMLLibraryMismatchError(Exception):
    pass


class FakePynvml:
    """Two GPUs whose answers the tests set directly, with pynvml's units and shapes."""

    NVMLError = NVMLError

    def __init__(self) -> None:
        self.init_error: int | None = None
        self.lost: set[int] = set()
        self.unsupported: set[str] = set()
        self.calls: dict[str, int] = {}
        self.util = {0: 37, 1: 100}
        self.samples: dict[int, list[tuple[int, int]]] = {0: [], 1: []}
        self.names = {0: b"NVIDIA H200", 1: "NVIDIA H200"}  # pynvml may give bytes or str

    def _call(self, fn: str, index: int | None = None) -> None:
        self.calls[fn] = self.calls.get(fn, 0) + 1
        if index is not None and index in self.lost:
            raise NVMLError(15)
        if fn in self.unsupported:
            raise NVMLError(3)

    def nvmlInit(self) -> None:
        if self.init_error is not None:
            raise NVMLError(self.init_error)

    def nvmlShutdown(self) -> None:
        pass

    def nvmlDeviceGetCount(self) -> int:
        return 2

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:
        self._call("nvmlDeviceGetHandleByIndex", i)
        return i

    def nvmlDeviceGetUUID(self, h: int) -> str:
        self._call("nvmlDeviceGetUUID", h)
        return f"GPU-0000000{h}-aaaa-bbbb-cccc-dddddddddddd"

    def nvmlDeviceGetName(self, h: int) -> str | bytes:
        self._call("nvmlDeviceGetName", h)
        return self.names[h]

    def nvmlDeviceGetUtilizationRates(self, h: int) -> SimpleNamespace:
        self._call("nvmlDeviceGetUtilizationRates", h)
        return SimpleNamespace(gpu=self.util[h], memory=12)

    def nvmlDeviceGetMemoryInfo(self, h: int) -> SimpleNamespace:
        self._call("nvmlDeviceGetMemoryInfo", h)
        return SimpleNamespace(total=141 * 2**30, used=70 * 2**30, free=71 * 2**30)

    def nvmlDeviceGetPowerUsage(self, h: int) -> int:
        self._call("nvmlDeviceGetPowerUsage", h)
        return 350_500  # mW

    def nvmlDeviceGetEnforcedPowerLimit(self, h: int) -> int:
        self._call("nvmlDeviceGetEnforcedPowerLimit", h)
        return 700_000

    def nvmlDeviceGetTemperature(self, h: int, sensor: int) -> int:
        self._call("nvmlDeviceGetTemperature", h)
        return 55

    def nvmlDeviceGetFieldValues(self, h: int, fields: tuple[int, ...]) -> list[SimpleNamespace]:
        """The PCIe byte counters, a second of 10 KB/s out and 1000 KB/s in further at each call."""
        self._call("nvmlDeviceGetFieldValues", h)
        n = self.calls["nvmlDeviceGetFieldValues"]
        per_s = {197: 10 * 1024, 198: 1000 * 1024}
        return [
            SimpleNamespace(
                fieldId=f, nvmlReturn=0, timestamp=n * 1_000_000, value=SimpleNamespace(ullVal=per_s[f] * n)
            )
            for f in fields
        ]

    def nvmlDeviceGetComputeRunningProcesses(self, h: int) -> list[SimpleNamespace]:
        self._call("nvmlDeviceGetComputeRunningProcesses", h)
        if "always-growing" in self.unsupported:
            raise NVMLError(7)  # INSUFFICIENT_SIZE: the list outgrew pynvml's buffer again
        if "mismatch" in self.unsupported:
            raise NVMLLibraryMismatchError("old driver")
        return [SimpleNamespace(pid=4242, usedGpuMemory=None if h else 5 * 2**30)]

    def nvmlDeviceGetSamples(self, h: int, kind: int, last_seen: int) -> tuple[int, list]:
        self._call("nvmlDeviceGetSamples", h)
        fresh = [(ts, v) for ts, v in self.samples[h] if ts > last_seen]
        if not fresh:
            raise NVMLError(6)
        return 1, [SimpleNamespace(timeStamp=ts, sampleValue=SimpleNamespace(uiVal=v)) for ts, v in fresh]


def _source(fake: FakePynvml, caplog: pytest.LogCaptureFixture | None = None) -> NvmlSource:
    src = NvmlSource(fake, Problems(logging.getLogger("test.nvml")))
    src.open()
    return src


@pytest.mark.parametrize("tick", ["first", "usual"])
def test_fields_are_read_in_base_units(tick: str) -> None:
    """Every field where it belongs, on the first tick (field by field) and the usual one (the fast
    path): the sample is built positionally there, in GpuSample's field order."""
    src = _source(FakePynvml())
    g = src.poll(10.0)[0]
    if tick == "usual":
        g = src.poll(11.0)[0]
    assert g.t_s == (10.0 if tick == "first" else 11.0) and g.index == 0
    assert g.available is True and g.error is None
    assert g.jobs == () and g.unattributed is None and g.mig is None and g.gpm is None
    assert g.xids == () and g.last_xid is None
    assert isinstance(g.util_history, tuple) and all(isinstance(p, UtilPoint) for p in g.util_history)
    assert isinstance(g.clock_event_s, tuple)
    assert g.name == "NVIDIA H200" and g.uuid.startswith("GPU-00000000")
    assert g.util_ratio == pytest.approx(0.37)
    assert g.mem_util_ratio == pytest.approx(0.12)
    assert g.mem_used_bytes == 70 * 2**30 and g.mem_total_bytes == 141 * 2**30
    assert g.power_w == pytest.approx(350.5) and g.power_limit_w == pytest.approx(700.0)
    assert g.temp_c == 55.0
    if tick == "first":  # a rate needs two readings of the driver's byte counters
        assert g.pcie_rx_bytes_per_s is None and g.pcie_tx_bytes_per_s is None
    else:  # the driver's own timestamps, not the tick's: each call is a second further there
        assert g.pcie_rx_bytes_per_s == 1000 * 1024 and g.pcie_tx_bytes_per_s == 10 * 1024
    assert [(p.pid, p.gpu_mem_bytes) for p in g.processes] == [(4242, 5 * 2**30)]


def test_process_memory_the_driver_cannot_tell_is_none() -> None:
    g = _source(FakePynvml()).poll(10.0)[1]
    assert g.processes[0].gpu_mem_bytes is None


def test_unsupported_field_is_none_and_not_asked_again(caplog: pytest.LogCaptureFixture) -> None:
    fake = FakePynvml()
    fake.unsupported = {"nvmlDeviceGetPowerUsage", "nvmlDeviceGetFieldValues"}
    src = _source(fake)
    with caplog.at_level(logging.INFO):
        for t in range(5):
            g = src.poll(float(t))[0]
    assert g.power_w is None and g.pcie_rx_bytes_per_s is None and g.pcie_tx_bytes_per_s is None
    assert g.util_ratio is not None  # the rest still read
    assert fake.calls["nvmlDeviceGetPowerUsage"] == 2  # once per GPU, then remembered
    assert caplog.records == []  # NOT_SUPPORTED is a fact of the hardware, not a problem to log


def test_old_driver_without_versioned_process_call_leaves_processes_empty() -> None:
    fake = FakePynvml()
    fake.unsupported = {"mismatch"}
    g = _source(fake).poll(1.0)[0]
    assert g.processes == () and g.available


def test_lost_gpu_is_marked_down_while_the_other_keeps_its_data_and_comes_back(
    caplog: pytest.LogCaptureFixture,
) -> None:
    fake = FakePynvml()
    src = _source(fake)
    src.poll(0.0)
    fake.lost = {1}
    with caplog.at_level(logging.INFO, logger="test.nvml"):
        for t in range(1, 6):
            gpus = src.poll(float(t))
            assert gpus[0].available and gpus[0].util_ratio == pytest.approx(0.37)
            assert not gpus[1].available and gpus[1].util_ratio is None
            assert "lost" in (gpus[1].error or "")
            assert gpus[1].uuid.startswith("GPU-00000001")  # still named, so users know which
        fake.lost = set()
        back = src.poll(6.0)[1]
    assert back.available and back.util_ratio == pytest.approx(1.0)
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1, "a lost GPU is logged once, not once per tick"
    assert any("recovered" in r.getMessage() for r in caplog.records)


def test_gpu_lost_before_its_first_handle_is_unavailable_not_fatal() -> None:
    fake = FakePynvml()
    fake.lost = {0}
    gpus = _source(fake).poll(0.0)
    assert not gpus[0].available and gpus[1].available


def test_samples_track_last_seen_and_not_found_means_no_new_samples() -> None:
    fake = FakePynvml()
    src = _source(fake)
    fake.samples[0] = [(5_000_000, 10), (5_166_666, 90)]
    first = src.poll(100.0)[0].util_history
    assert [p.util_ratio for p in first] == [0.1, 0.9]
    assert src.poll(100.5)[0].util_history == ()  # NOT_FOUND: nothing new, no error
    fake.samples[0].append((5_333_333, 40))
    again = src.poll(101.0)[0].util_history
    assert [p.util_ratio for p in again] == [0.4], "only samples newer than the last seen"
    assert again[0].t_s > first[-1].t_s


def test_sample_times_are_mapped_onto_the_sampler_clock() -> None:
    fake = FakePynvml()
    src = _source(fake)
    # The driver's clock reads 5 s when the sampler's reads 100 s.
    fake.samples[0] = [(4_500_000, 10), (5_000_000, 20)]
    pts = src.poll(100.0)[0].util_history
    assert pts[-1].t_s == pytest.approx(100.0)
    assert pts[-1].t_s - pts[0].t_s == pytest.approx(0.5)


def test_samples_older_than_a_second_before_start_are_not_replayed_as_new() -> None:
    fake = FakePynvml()
    fake.samples[0] = [(ts * 1_000_000, 50) for ts in range(1, 21)]  # 20 s of buffer
    pts = _source(fake).poll(100.0)[0].util_history
    assert len(pts) == 1


def test_aligner_converges_to_the_smallest_offset_and_follows_drift() -> None:
    a = SampleClockAligner(leak_s=0.001)
    a.observe(10.3, 10_000_000)  # read 0.3 s after the sample: offset bound 0.3
    a.observe(11.05, 11_000_000)  # a tighter bound
    assert a.to_sampler_time(11_000_000) == pytest.approx(11.05)
    for i in range(100):  # a bound that never comes back is slowly forgotten
        a.observe(12.0 + i, 11_900_000 + i * 1_000_000)
    assert a.to_sampler_time(11_900_000) == pytest.approx(12.0, abs=0.11)


@pytest.mark.parametrize("code", [12, 9])
def test_no_driver_names_the_library_and_suggests_simulate(code: int) -> None:
    fake = FakePynvml()
    fake.init_error = code
    with pytest.raises(NoDriverError) as e:
        NvmlSource(fake).open()
    msg = str(e.value)
    assert "libnvidia-ml.so.1" in msg and "--simulate" in msg and "\n" not in msg


def test_a_process_list_that_never_fits_is_left_out_once_logged(caplog: pytest.LogCaptureFixture) -> None:
    fake = FakePynvml()
    fake.unsupported = {"always-growing"}
    src = _source(fake)
    with caplog.at_level(logging.WARNING, logger="test.nvml"):
        for t in range(3):
            g = src.poll(float(t))[0]
    assert g.available and g.processes == () and g.util_ratio is not None
    assert fake.calls["nvmlDeviceGetComputeRunningProcesses"] == 3 * 2 * 3  # 3 tries, 2 GPUs, 3 ticks
    assert len([r for r in caplog.records if "kept growing" in r.getMessage()]) == 2  # once per GPU


def test_xid_events_are_counted_per_code_and_a_failing_wait_is_a_problem_until_it_works() -> None:
    """The XID thread's loop, driven: a failing wait, an XID 79 twice, a timeout; then stop."""
    import types as _types

    from gpumon.collect.sources.nvml.xid import XidWatcher
    from gpumon.core.problems import Problems

    class Error(Exception):
        def __init__(self, value: int) -> None:
            self.value = value

    handle = object()
    event = _types.SimpleNamespace(device=handle, eventType=0x8, eventData=79, gpuInstanceId=0xFFFFFFFF)
    script: list[object] = [Error(999), event, event, Error(10)]
    problems = Problems(logging.getLogger("t"))
    seen: list[tuple[str, ...]] = []

    class Nvml:
        NVMLError = Error

        def nvmlEventSetCreate(self) -> object:
            return "set"

        def nvmlDeviceRegisterEvents(self, h: object, types: int, s: object) -> None:
            assert types == 0x8 and s == "set"

        def nvmlEventSetWait_v2(self, s: object, timeout_ms: int) -> object:
            seen.append(problems.active())
            step = script.pop(0)
            if not script:
                watcher._stop.set()
            if isinstance(step, Exception):
                raise step
            return step

    watcher = XidWatcher(Nvml(), problems, wall_clock=lambda: 1234.5, retry_s=0.0)
    assert watcher.register(3, handle)
    watcher._run()
    assert watcher.seen(3, None) == (((79, 2),), (79, 1234.5))
    assert seen[1] and "waiting for XID events failed" in seen[1][0], "the failing wait is a problem"
    assert not problems.active(), "and over once waiting works again"


@pytest.mark.parametrize(
    ("value_type", "field", "value"),
    [
        (0, "dVal", 42.5),
        (1, "uiVal", 97),
        (2, "ulVal", 2**40),
        (3, "ullVal", 2**62),
        (4, "sllVal", -5),
        (5, "siVal", -7),
        (6, "usVal", 65535),
    ],
)
def test_driver_samples_read_from_pynvml_s_array_equal_the_field_by_field_reading(
    value_type: int, field: str, value: float
) -> None:
    """The samples are read from the ctypes array's memory at once (pynvml's per-attribute reads
    cost about half the source's time per GPU): every member of the value union, in any order the
    driver gives them, only those newer than the last seen."""
    import pynvml

    from gpumon.collect.sources.nvml.samples import fresh_pairs

    array = (pynvml.c_nvmlSample_t * 4)()
    for k, ts in enumerate((300, 100, 400, 200)):  # a driver that answers out of order
        array[k].timeStamp = ts
        setattr(array[k].sampleValue, field, value)
    raw = array[0:4]  # what pynvml.nvmlDeviceGetSamples hands back: a slice of its array
    by_field = sorted((s.timeStamp, getattr(s.sampleValue, field)) for s in raw if s.timeStamp > 150)
    assert fresh_pairs(value_type, raw, 150) == by_field == [(200, value), (300, value), (400, value)]
    assert fresh_pairs(value_type, raw, 400) == [] and fresh_pairs(value_type, [], 0) == []
    # the simulator's look-alike samples (plain objects) are read field by field
    fake = [SimpleNamespace(timeStamp=t, sampleValue=SimpleNamespace(**{field: value})) for t in (5, 6)]
    assert fresh_pairs(value_type, fake, 5) == [(6, value)]


def test_samples_are_one_driver_call_and_a_full_buffer_is_read_again_whole() -> None:
    """DirectSamples calls the driver once into its buffer; a reading that fills the buffer may
    have left samples out, and is read again through the wrapper, which sizes its array."""
    import ctypes

    from gpumon.collect.sources.nvml.samples import SAMPLES_ROOM, DirectSamples

    class Sample(ctypes.Structure):
        _fields_ = [("timeStamp", ctypes.c_ulonglong), ("sampleValue", ctypes.c_ulonglong)]

    calls: list[int] = []
    waiting = [3]

    def fn(handle: Any, kind: Any, last: Any, value_type: Any, count: Any, array: Any) -> int:
        calls.append(last.value)
        n = min(waiting[0], ctypes.cast(count, ctypes.POINTER(ctypes.c_uint)).contents.value)
        for k in range(n):
            array[k].timeStamp, array[k].sampleValue = last.value + k + 1, 40
        ctypes.cast(count, ctypes.POINTER(ctypes.c_uint)).contents.value = n
        ctypes.cast(value_type, ctypes.POINTER(ctypes.c_uint)).contents.value = 1
        return 0 if n else 6

    wrapped: list[int] = []
    bindings = SimpleNamespace(
        _nvmlGetFunctionPointer=lambda name: fn,
        c_nvmlSample_t=Sample,
        NVMLError=NVMLError,
        nvmlDeviceGetSamples=lambda h, kind, last: wrapped.append(last) or (1, ["whole"]),
    )
    read = DirectSamples.of(bindings)
    assert read is not None
    kind, raw = read(0, 1, 100)
    assert kind == 1 and [s.timeStamp for s in raw] == [101, 102, 103] and calls == [100] and not wrapped
    waiting[0] = 0
    with pytest.raises(NVMLError) as e:
        read(0, 1, 103)
    assert e.value.value == 6  # NOT_FOUND, as pynvml raises it
    waiting[0] = SAMPLES_ROOM + 50
    assert read(0, 1, 0) == (1, ["whole"]) and wrapped == [0]


class CountersDriver(FakePynvml):
    """GPU 0's PCIe byte counters as the test scripts them: (return, tx, rx, timestamp µs) per call."""

    def __init__(self, script: list[tuple[int, int, int, int]]) -> None:
        super().__init__()
        self.script = script

    def nvmlDeviceGetFieldValues(self, h: int, fields: tuple[int, ...]) -> list[SimpleNamespace]:
        self._call("nvmlDeviceGetFieldValues", h)
        ret, tx, rx, ts = self.script.pop(0) if h == 0 else (3, 0, 0, 0)
        return [
            SimpleNamespace(fieldId=f, nvmlReturn=ret, timestamp=ts, value=SimpleNamespace(ullVal=v))
            for f, v in zip(fields, (tx, rx))
        ]


def test_pcie_counters_that_go_back_jump_or_stand_still_give_no_rate() -> None:
    """The driver's cumulative byte counters, as a GPU reset, a wrap or a glitching driver leave
    them: a rate only from two readings that make one, never a negative or absurd figure."""
    second = 1_000_000
    script = [
        (0, 0, 0, 1 * second),
        (0, 1000, 4000, 2 * second),  # 1000 B/s out, 4000 in
        (0, 500, 100, 3 * second),  # went back (a reset): no rate, and the next is from here
        (0, 1500, 2100, 4 * second),
        (0, 1500 + 10**15, 2100, 5 * second),  # 1 PB in a second: no link moves that
        (0, 1500 + 10**15, 2100, 5 * second),  # the same timestamp again: no time passed
        (0, 1500 + 10**15 + 8, 2100 + 16, 7 * second),
    ]
    src = _source(CountersDriver(script))
    got = [(g.pcie_rx_bytes_per_s, g.pcie_tx_bytes_per_s) for g in (src.poll(float(t))[0] for t in range(7))]
    assert got == [(None, None), (4000.0, 1000.0), (None, None), (2000.0, 1000.0), (None, None),
                   (None, None), (8.0, 4.0)]  # fmt: skip


def test_pcie_counters_a_driver_refuses_are_not_asked_again() -> None:
    """A field the driver does not have answers NOT_SUPPORTED in its own return, with the call's
    return SUCCESS (nvml.h): no figure, no log line, and the call is not made again."""
    fake = CountersDriver([(3, 0, 0, 0)] * 5)
    src = _source(fake)
    for t in range(5):
        g = src.poll(float(t))[0]
    assert g.pcie_rx_bytes_per_s is None and g.util_ratio is not None
    assert fake.calls["nvmlDeviceGetFieldValues"] == 2  # once per GPU


class RestingDriver(FakePynvml):
    """GPU 0 with no process and a driver ring that gains 6 samples a second (the stand-in's and an
    H200's period), their value and GPU 0's process list set by the test; calls counted per GPU."""

    def __init__(self) -> None:
        super().__init__()
        self.util[0] = 0
        self.procs: list[SimpleNamespace] = []
        self.value = 0
        self.used = 0
        """GPU 0's memory in use (an idle H200 reads 0 MiB; any CUDA context holds hundreds)."""
        self.per_gpu: dict[tuple[str, int], int] = {}

    def tick(self, t: int) -> None:
        self.samples[0] += [((t - 1) * 1_000_000 + k * 166_666, self.value) for k in range(1, 7)]
        self.samples[1] += [((t - 1) * 1_000_000 + k * 166_666, 100) for k in range(1, 7)]

    def _call(self, fn: str, index: int | None = None) -> None:
        super()._call(fn, index)
        if index is not None:
            self.per_gpu[fn, index] = self.per_gpu.get((fn, index), 0) + 1

    def nvmlDeviceGetComputeRunningProcesses(self, h: int) -> list[SimpleNamespace]:
        return self.procs if h == 0 else super().nvmlDeviceGetComputeRunningProcesses(h)

    def nvmlDeviceGetMemoryInfo(self, h: int) -> SimpleNamespace:
        got = super().nvmlDeviceGetMemoryInfo(h)
        return SimpleNamespace(total=got.total, used=self.used, free=got.total - self.used) if h == 0 else got


def test_a_gpu_at_rest_is_not_asked_for_samples_and_wakes_when_a_job_or_a_kernel_comes() -> None:
    """On an H200 nvmlDeviceGetSamples cost 1.4 ms of CPU a call, the PCIe counters 0.3 ms: most
    of an idle daemon's second. After REST_AFTER_S with no process and 0% at every tick, neither is
    read; the tick's 0% stands for the second. A job's process, or utilization with no process
    listed, and the samples are read again that tick, without the seconds already stood for."""
    fake = RestingDriver()
    src = _source(fake)

    def poll(t: int) -> Any:
        fake.tick(t)
        return src.poll(float(t))[0]

    def asked(t0: int, t1: int) -> int:
        before = fake.per_gpu.get(("nvmlDeviceGetSamples", 0), 0)
        for t in range(t0, t1):
            poll(t)
        return fake.per_gpu.get(("nvmlDeviceGetSamples", 0), 0) - before

    assert asked(1, 31) == 30, "read every tick until it has rested long enough"
    assert asked(31, 61) == 0
    g = poll(61)
    assert [p.util_ratio for p in g.util_history] == [0.0] and g.util_history[0].t_s == 61.0
    assert g.pcie_rx_bytes_per_s is None and g.util_ratio == 0.0
    assert fake.per_gpu.get(("nvmlDeviceGetSamples", 1), 0) == 61, "a busy GPU beside it is read"
    # a job comes: read at once, from the last tick at rest on
    fake.procs = [SimpleNamespace(pid=4242, usedGpuMemory=2**30)]
    fake.value, fake.used = 50, 2**30
    g = poll(62)
    assert [p.util_ratio for p in g.util_history] == [0.5] * 6
    assert all(61.0 < p.t_s <= 62.0 + 1e-6 for p in g.util_history), g.util_history
    assert poll(63).pcie_rx_bytes_per_s is not None, "the counters again, from a new baseline"
    # it leaves; kernels run with no process listed (the driver hides them): read that very tick
    fake.procs, fake.value, fake.used = [], 0, 0
    assert asked(64, 100) == 30
    fake.util[0], fake.value = 20, 20
    g = poll(100)
    assert [p.util_ratio for p in g.util_history] == [0.2] * 6


def test_a_job_the_driver_does_not_list_keeps_its_gpu_awake() -> None:
    """A second reader's cases: no process listed and the tick reading 0% while kernels ran within
    the second (NVML's tick reading is its last sample period's, not the second's), or a CUDA
    context's memory in use: the samples are read every tick, never left for a reading of 0%."""
    fake = RestingDriver()
    src = _source(fake)
    fake.value = 0
    for t in range(1, 120):
        fake.value = 45 if t % 3 == 0 else 0  # bursts between ticks; the tick's own reading is 0
        fake.tick(t)
        src.poll(float(t))
    assert fake.per_gpu[("nvmlDeviceGetSamples", 0)] == 119
    fake2 = RestingDriver()
    fake2.used = 700 * 2**20  # a context, its process unlisted, nothing running now
    src2 = _source(fake2)
    for t in range(1, 120):
        fake2.tick(t)
        src2.poll(float(t))
    assert fake2.per_gpu[("nvmlDeviceGetSamples", 0)] == 119


def test_a_driver_clock_stepped_back_while_at_rest_loses_no_second_of_the_next_job() -> None:
    """A GPU reset needs an idle GPU: its driver clock can go back while gpumon leaves it at rest.
    Waking, the reading that finds nothing newer than the last seen looks at the whole ring at
    once, and follows the new clock from the job's first tick."""
    fake = RestingDriver()
    src = _source(fake)
    for t in range(1, 50):
        fake.tick(t)
        src.poll(float(t))
    assert fake.per_gpu[("nvmlDeviceGetSamples", 0)] < 40, "at rest"
    fake.samples[0] = []  # reset: the ring emptied, its clock 40 s back
    fake.procs, fake.value, fake.used = [SimpleNamespace(pid=7, usedGpuMemory=2**30)], 60, 2**30
    back = -40
    for t in range(50, 53):
        fake.samples[0] += [((t + back - 1) * 1_000_000 + k * 166_666, 60) for k in range(1, 7)]
        fake.samples[1] += [((t - 1) * 1_000_000 + k * 166_666, 100) for k in range(1, 7)]
        g = src.poll(float(t))[0]
        assert g.util_history and all(p.util_ratio == 0.6 for p in g.util_history), (t, g.util_history)
