"""Clock-event reasons (why the clocks are held down: power, heat, a slowdown), read every tick,
with the seconds spent in each summed since gpumon started."""

from __future__ import annotations

from typing import Any

from gpumon.collect.sources.nvml.reader import NvmlReader, nvml_function
from gpumon.collect.sources.nvml.state import GpuState
from gpumon.core.model import clock_reasons

CLOCK_GAP_CAP_S = 5.0
"""Seconds one tick may add to a clock-event reason (a stalled sampler does not inflate them)."""


class ClockReading(NvmlReader):
    _clock_fn: Any
    """nvmlDeviceGetCurrentClocksEventReasons, looked up once (every GPU asks on every tick)."""

    def _clock_read(self, state: GpuState) -> Any:
        """The reasons' bitmask, under NVML's rules (None where not given)."""
        bits = self._field(state, "clock_events", self._clock_fn, state.handle)
        if bits is None and "clock_events" in state.unsupported:  # drivers before 535: the old name
            old = nvml_function(self._nvml, "nvmlDeviceGetCurrentClocksThrottleReasons")
            bits = self._field(state, "throttle_reasons", old, state.handle)
        return bits

    def _clock_events(self, state: GpuState, t_s: float, bits: Any) -> int | None:
        """The reasons now (`bits`, read this tick); the time since the last tick is charged to the
        reasons seen then."""
        prev_t, prev_bits = state.clock_prev_t, state.clock_bits
        state.clock_prev_t, state.clock_bits = t_s, None if bits is None else int(bits)
        if prev_t is not None and prev_bits and t_s > prev_t:
            dt = min(t_s - prev_t, CLOCK_GAP_CAP_S)
            for reason in clock_reasons(prev_bits):  # to the microsecond (an integer round: faster)
                state.clock_s[reason] = round((state.clock_s.get(reason, 0.0) + dt) * 1e6) / 1e6
        return state.clock_bits
