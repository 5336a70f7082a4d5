"""A GPU's processes read into one buffer on pynvml's own function pointer and struct
(gpumon.collect.sources.nvml.processes): the same answer as pynvml's wrapper, on the stand-in
driver and on drivers that grow their list, claim absurd counts or fail."""

from __future__ import annotations

import ctypes
import json
import subprocess
import sys
import textwrap
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pynvml
import pytest

from gpumon.collect.sources.nvml import processes
from gpumon.collect.sources.nvml.processes import MAX_ENTRIES, NOT_AVAILABLE, process_lister
from gpumon.core.model import GpuProcess
from tests.fakenvml import driver

from .conftest import ROOT

Entries = list[tuple[int, int]]


class Bindings:
    """pynvml's names the lister uses, over a driver function written in Python: `answer(asked)`
    gives (return code, count, entries) for a buffer of `asked` entries, as the C function does."""

    NVMLError = pynvml.NVMLError
    c_nvmlProcessInfo_v3_t = pynvml.c_nvmlProcessInfo_v3_t  # noqa: N815  (pynvml's name)

    def __init__(self, answer: Callable[[int], tuple[int, int, Entries]]) -> None:
        self.answer = answer
        self.asked: list[int] = []

    def _nvmlGetFunctionPointer(self, name: str) -> Any:
        assert name == "nvmlDeviceGetComputeRunningProcesses_v3"
        return self._fn

    def _fn(self, handle: object, count_ref: Any, buffer: Any) -> int:
        count = count_ref._obj  # the c_uint behind byref()
        self.asked.append(count.value)
        ret, n, entries = self.answer(count.value)
        if ret == 0:
            assert len(entries) <= len(buffer), "the fake never writes past the buffer"
            for k, (pid, mem) in enumerate(entries):
                buffer[k].pid, buffer[k].usedGpuMemory = pid, mem
        count.value = n
        return ret

    def nvmlDeviceGetComputeRunningProcesses(self, handle: object) -> list[Any]:
        raise AssertionError("the wrapper is not called where the function pointer is there")


def fits(entries: Entries) -> Callable[[int], tuple[int, int, Entries]]:
    """A driver with these entries: INSUFFICIENT_SIZE and the count while they do not fit."""
    return lambda asked: (0, len(entries), entries) if asked >= len(entries) else (7, len(entries), [])


def test_a_list_longer_than_the_buffer_is_read_whole_in_a_grown_buffer_kept_for_next_time() -> None:
    entries = [(1000 + k % 30, 2**20) for k in range(40)]  # 40 contexts of 30 processes
    entries[3] = (2000, NOT_AVAILABLE)
    nv = Bindings(fits(entries))
    lister = process_lister(nv)
    got = lister(object())
    assert nv.asked == [16, 85], "one call with the first buffer, one with room for the count"
    by_pid: dict[int, int | None] = {}
    for pid, mem in entries:
        if mem == NOT_AVAILABLE:
            by_pid.setdefault(pid, None)
        else:
            before = by_pid.get(pid)
            by_pid[pid] = mem + (before or 0)
    assert got == tuple(GpuProcess(pid, mem) for pid, mem in by_pid.items())
    assert GpuProcess(2000, None) in got, "memory the driver cannot tell is None, as pynvml says"
    assert lister(object()) == got and nv.asked == [16, 85, 85], "the grown buffer is kept"


def test_no_process_is_one_call_and_an_empty_answer() -> None:
    nv = Bindings(fits([]))
    assert process_lister(nv)(object()) == () and nv.asked == [16]


@pytest.mark.parametrize(
    ("answer", "code", "calls"),
    [
        (lambda asked: (7, 10**9, []), 7, 1),  # a count no GPU has: refused, no buffer of its size
        (lambda asked: (7, asked + 5, []), 7, 2),  # a list that grows at every call
        (lambda asked: (0, asked + 1, []), 999, 1),  # "written" past the buffer: not read
        (lambda asked: (15, 0, []), 15, 1),  # the GPU is lost: its code, as pynvml raises it
    ],
)
def test_a_driver_that_claims_too_much_or_fails_raises_pynvmls_error_and_reads_nothing_past_the_buffer(
    answer: Callable[[int], tuple[int, int, Entries]], code: int, calls: int
) -> None:
    nv = Bindings(answer)
    lister = process_lister(nv)
    with pytest.raises(pynvml.NVMLError) as e:
        lister(object())
    assert e.value.value == code
    assert len(nv.asked) == calls
    assert max(nv.asked) <= MAX_ENTRIES and len(lister._local.buffer.array) <= MAX_ENTRIES  # type: ignore[attr-defined]


def test_a_thread_abandoned_in_the_call_never_writes_into_its_successors_buffer() -> None:
    """The supervisor gives up on a thread whose call hangs and reads with another; when the hung
    call returns at last, the driver writes into the first thread's buffer, not the one the
    second thread reads."""
    release, inside = threading.Event(), threading.Event()
    buffers: dict[str, int] = {}

    class Hanging(Bindings):
        def _fn(self, handle: object, count_ref: Any, buffer: Any) -> int:
            me = threading.current_thread().name
            buffers[me] = ctypes.addressof(buffer)
            if me == "hung":
                inside.set()
                release.wait(10)
                buffer[0].pid, buffer[0].usedGpuMemory = 1, 1
            else:
                buffer[0].pid, buffer[0].usedGpuMemory = 2, 2
            count_ref._obj.value = 1
            return 0

    lister = process_lister(Hanging(fits([])))
    first: list[Any] = []
    hung = threading.Thread(target=lambda: first.append(lister(object())), name="hung")
    hung.start()
    assert inside.wait(10)
    assert lister(object()) == (GpuProcess(2, 2),)
    release.set()
    hung.join(10)
    assert first == [(GpuProcess(1, 1),)]
    assert buffers["hung"] != buffers[threading.current_thread().name]
    assert lister(object()) == (GpuProcess(2, 2),)


def test_bindings_without_the_function_pointer_or_the_struct_use_the_wrapper() -> None:
    class Plain:
        NVMLError = pynvml.NVMLError

        def nvmlDeviceGetComputeRunningProcesses(self, handle: object) -> list[Any]:
            return [pynvml.nvmlFriendlyObject({"pid": 7, "usedGpuMemory": None})]

    assert process_lister(Plain())(object()) == (GpuProcess(7, None),)

    class NoSymbol(Bindings):
        def _nvmlGetFunctionPointer(self, name: str) -> Any:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)  # a driver before R470

        def nvmlDeviceGetComputeRunningProcesses(self, handle: object) -> list[Any]:
            return []

    assert process_lister(NoSymbol(fits([])))(object()) == ()

    class OtherLayout(ctypes.Structure):
        _fields_ = [("pid", ctypes.c_ulonglong), ("usedGpuMemory", ctypes.c_ulonglong)]

    odd = Bindings(fits([]))
    odd.c_nvmlProcessInfo_v3_t = OtherLayout  # type: ignore[misc]
    assert not isinstance(process_lister(odd), processes._Direct)


def test_on_the_stand_in_the_direct_read_gives_what_pynvml_gives(tmp_path: Path) -> None:
    """The real pynvml and the stand-in libnvidia-ml.so.1 (nvml.h's struct): each GPU's processes
    read both ways at one frozen instant; a GPU whose list grows at every call (the stand-in's
    procs_grow) is read whole in a grown buffer, its new contexts the stand-in's."""
    config = driver.simulated_config(
        tmp_path, "starved-cpu,healthy,starved-io", gpus=3, seconds=60, faults=("procs_grow 2 25",)
    )
    code = textwrap.dedent(
        """
        import json, pynvml
        from gpumon.collect.sources.nvml.processes import _Direct, process_lister, processes_of
        pynvml.nvmlInit()
        lister = process_lister(pynvml)
        out = {"direct": isinstance(lister, _Direct), "gpus": []}
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            first = lister(h)
            again = lister(h)
            wrapper = [] if i == 2 else processes_of(pynvml.nvmlDeviceGetComputeRunningProcesses(h))
            out["gpus"].append([first, again, wrapper])
        print(json.dumps(out))
        """
    )
    env = driver.environment(config, PYTHONPATH=str(ROOT), FAKENVML_NOW_US=str(30_000_000))
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    assert out["direct"], "the real pynvml on a driver with the _v3 call reads it directly"
    for first, again, wrapper in out["gpus"][:2]:
        assert first == again == wrapper and first, "the same processes, and some"
    first, again, _ = out["gpus"][2]
    n = len(first)
    assert n >= 1
    assert len(again) == n + 2 * 25, "asked with room for 25 more, it had grown by 25 again: read whole"
    assert [pid for pid, _ in again[n:]] == [900_000 + k for k in range(n, n + 50)]
