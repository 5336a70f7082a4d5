"""GPM (GPU Performance Monitoring, Hopper and newer) on GPUs and MIG instances, where
nvmlGpmQueryDeviceSupport says so (docs/detector.md, "GPM and MIG").

Each tick takes a GPM sample per unit and gives the activity since the previous tick's. A unit NVML
gives no utilization samples (a MIG instance) gets its activity history from GPM instead: its
graphics activity is sampled ACTIVITY_HZ times a second, by the sampler between ticks
(`activity_period_s`, `sample_activity`), on its own clock and supervised thread, and each sample
is a point of the unit's history, as a driver sample is for a whole GPU.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from gpumon.collect.sources.nvml import codes
from gpumon.collect.sources.nvml.gpm_unit import GpmUnit
from gpumon.collect.sources.nvml.reader import NvmlReader, nvml_function
from gpumon.collect.sources.nvml.state import GpuState
from gpumon.core.model import GpmActivity, UtilPoint

ACTIVITY_HZ = 5.0
"""How often GPM activity is sampled on units without utilization samples (docs/detector.md)."""


class GpmReading(NvmlReader):
    _gpm_on: bool
    """False: never read GPM (a site whose profilers, Nsight or DCGM profiling, must have the
    counters to themselves)."""
    _activity_units: list[GpuState]

    def _gpm_activity(self, state: GpuState, t_s: float) -> GpmActivity | None:
        nv = self._nvml
        if state.gpm is None:
            if state.gpm_checked:
                return None
            state.gpm_checked = True
            if not self._gpm_on:
                return None
            support = self._field(state, "gpm", nvml_function(nv, "nvmlGpmQueryDeviceSupport"), state.handle)
            if support is None or not int(support.isSupportedDevice):
                state.unsupported.add("gpm")
                return None
            parent = state.parent
            take: Callable[[Any], Any]
            if parent is not None and state.mig is not None:
                gi = state.mig

                def take(sample: Any) -> Any:
                    assert parent is not None
                    return nv.nvmlGpmMigSampleGet(parent.handle, gi, sample)
            else:

                def take(sample: Any) -> Any:
                    return nv.nvmlGpmSampleGet(state.handle, sample)

            if state.mig is not None or "samples" in state.unsupported:  # no utilization samples
                state.activity = GpmUnit(nv, take, fast=True)  # sampled between ticks too: _drain
                self._activity_units = [*self._activity_units, state]
                return None
            state.gpm = GpmUnit(nv, take)
        try:
            return state.gpm.activity(t_s)
        except self._error_type as e:
            self._gpm_failed(state, e)
            return None

    def _gpm_failed(self, state: GpuState, e: BaseException) -> None:
        if codes.code_of(e) in codes.UNSUPPORTED:
            state.unsupported.add("gpm")
            self._forget_unit(state)
            return
        codes.raise_if_lost(e)
        state.failing.add("gpm")
        self._problems.note(f"nvml:gpu {state.tag}:gpm", f"{state.where} gpm: {codes.describe(e)}")

    def _forget_unit(self, unit: GpuState) -> None:
        if unit in self._activity_units:
            self._activity_units = [u for u in self._activity_units if u is not unit]
        for g in (unit.gpm, unit.activity):
            if g is not None:
                g.free()
        unit.gpm = unit.activity = None

    # -- activity between ticks ----------------------------------------------------------------

    @property
    def activity_period_s(self) -> float | None:
        """How often the sampler should call `sample_activity` between ticks; None: no need."""
        return 1.0 / ACTIVITY_HZ if self._activity_units else None

    def sample_activity(self, t_s: float) -> None:
        """One step of GPM activity sampling on the units NVML gives no utilization samples (MIG
        instances): ACTIVITY_HZ a second with the tick's own. Each call is guarded per GPU."""
        for unit in self._activity_units:
            parent = unit.parent or unit
            if unit.activity is None or unit.handle is None or parent.stuck_since is not None:
                continue
            self._enter(parent.index)
            try:
                self._activity_read(unit, t_s)
            finally:
                self._leave()

    def _activity_read(self, unit: GpuState, t_s: float) -> None:
        """Between ticks: a failure is left to the tick's own read to report."""
        if unit.activity is None:
            return
        try:
            value = unit.activity.step(t_s)
        except self._error_type:
            return
        if value is not None:
            unit.pending.append(UtilPoint(round(t_s, 6), value))

    def _drain(self, unit: GpuState, t_s: float) -> tuple[tuple[UtilPoint, ...], GpmActivity | None]:
        """At a tick: the activity history since the last (the steps, and one now), and the GPM
        figures over the whole second."""
        activity = None
        if unit.activity is not None:
            try:
                value, activity = unit.activity.tick(t_s)
                if value is not None:
                    unit.pending.append(UtilPoint(round(t_s, 6), value))
            except self._error_type as e:
                self._gpm_failed(unit, e)
        points = []
        while unit.pending:
            points.append(unit.pending.popleft())
        return tuple(points), activity
