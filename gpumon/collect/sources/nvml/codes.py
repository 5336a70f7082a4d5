"""NVML's return codes (nvml.h) and the rules gpumon applies to them, in one place.

A field the GPU does not support (NOT_SUPPORTED, or a function the bindings or driver lack) is
left out and not asked again. A GPU that is lost (GPU_IS_LOST, or UNKNOWN, which a dying GPU also
answers) ends that GPU's reading for the tick: it is marked unavailable and read afresh next tick.
The bindings' own constants are not used: the simulator's look-alike has none, and the numbers
are NVML's ABI.
"""

from __future__ import annotations

SUCCESS = 0
UNINITIALIZED = 1
INVALID_ARGUMENT = 2
NOT_SUPPORTED = 3
NO_PERMISSION = 4
NOT_FOUND = 6
INSUFFICIENT_SIZE = 7
DRIVER_NOT_LOADED = 9
TIMEOUT = 10
LIBRARY_NOT_FOUND = 12
FUNCTION_NOT_FOUND = 13
GPU_IS_LOST = 15
ARGUMENT_VERSION_MISMATCH = 25
UNKNOWN = 999

UNSUPPORTED = frozenset({NOT_SUPPORTED, FUNCTION_NOT_FOUND})
LOST = frozenset({GPU_IS_LOST, UNKNOWN})

NO_DRIVER_HINT = (
    "cannot load NVIDIA's NVML library libnvidia-ml.so.1 ({why}); install the NVIDIA driver, "
    "or try gpumon with simulated GPUs: --simulate healthy"
)


class GpuLost(Exception):
    """This GPU answered GPU_IS_LOST or UNKNOWN: nothing more is read from it this tick."""


def code_of(e: BaseException) -> int | None:
    """The NVML return code an exception carries (pynvml's NVMLError.value), if any."""
    value = getattr(e, "value", None)
    return value if isinstance(value, int) else None


def describe(e: BaseException) -> str:
    text = str(e) or type(e).__name__
    code = code_of(e)
    return f"{text} (NVML error {code})" if code is not None else text


def raise_if_lost(e: BaseException) -> None:
    """The lost-GPU rule: a GPU_IS_LOST or UNKNOWN error becomes GpuLost (the GPU is unavailable
    for this tick); anything else is left to the caller."""
    if code_of(e) in LOST:
        raise GpuLost(describe(e)) from None


def init_failure(e: BaseException) -> str:
    """What nvmlInit's failure means to the user: only a missing library calls for a driver."""
    code = code_of(e)
    if code == NO_PERMISSION:
        return (
            f"NVML refused access ({describe(e)}): the driver is there, but this user may not "
            "open /dev/nvidiactl and /dev/nvidia*; run gpumon as a user who may (as the systemd unit "
            "does), not as a user without access"
        )
    if code == DRIVER_NOT_LOADED:
        return (
            f"libnvidia-ml.so.1 is there but the NVIDIA kernel driver is not loaded ({describe(e)}): "
            "check `nvidia-smi` and `lsmod | grep nvidia`; or try gpumon with simulated GPUs: "
            "--simulate healthy"
        )
    return NO_DRIVER_HINT.format(why=describe(e))
