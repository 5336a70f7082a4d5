"""MIG: a GPU in MIG mode is read as its parent (power, temperature, clocks: what only the parent
reports) plus one unit per MIG instance (memory, processes, GPM), each a GpuSample with `mig` set
to its GPU instance id and `uuid` to its MIG-... UUID. NVML gives an instance no utilization: its
activity history comes from GPM (gpumon.collect.sources.nvml.gpm)."""

from __future__ import annotations

from gpumon.collect.sources.nvml import codes
from gpumon.collect.sources.nvml.gpm import GpmReading
from gpumon.collect.sources.nvml.reader import device_text, nvml_function
from gpumon.collect.sources.nvml.state import GpuState
from gpumon.core.model import GpmActivity, GpuSample, UtilPoint

MIG_RESCAN_S = 30.0
"""How often a MIG-enabled GPU's instances are listed again (they change only when reconfigured)."""


class MigReading(GpmReading):
    def _scan_migs(self, parent: GpuState, t_s: float) -> None:
        """List a MIG-enabled GPU's instances (again every MIG_RESCAN_S, or after a failure)."""
        if parent.mig_checked_t is not None and t_s - parent.mig_checked_t < MIG_RESCAN_S:
            return
        parent.mig_checked_t = t_s
        nv = self._nvml
        mode = self._field(parent, "mig", nvml_function(nv, "nvmlDeviceGetMigMode"), parent.handle)
        found: dict[int, GpuState] = {}
        if mode is not None and int(mode[0]) == 1:
            count = nvml_function(nv, "nvmlDeviceGetMaxMigDeviceCount")
            slots = self._field(parent, "mig", count, parent.handle) or 0
            for slot in range(int(slots)):
                try:
                    handle = nv.nvmlDeviceGetMigDeviceHandleByIndex(parent.handle, slot)
                except self._error_type as e:
                    if codes.code_of(e) in (codes.NOT_FOUND, codes.INVALID_ARGUMENT):  # an empty slot
                        continue
                    codes.raise_if_lost(e)
                    raise
                gi = int(nv.nvmlDeviceGetGpuInstanceId(handle))
                uuid = device_text(nv.nvmlDeviceGetUUID, handle)
                unit = parent.migs.get(gi)
                if unit is None or unit.uuid != uuid:
                    name = device_text(nv.nvmlDeviceGetName, handle)
                    unit = GpuState(parent.index, handle, uuid, name, mig=gi, parent=parent)
                unit.handle = handle
                found[gi] = unit
        for gi, gone in parent.migs.items():
            if found.get(gi) is not gone:
                self._forget_unit(gone)
        parent.migs = found

    def _poll_migs(self, parent: GpuState, t_s: float) -> list[GpuSample]:
        out = []
        for _, unit in sorted(parent.migs.items()):
            try:
                out.append(self._poll_mig(parent, unit, t_s))
            except self._error_type as e:  # this instance only (destroyed under us): list again
                parent.mig_checked_t = None
                out.append(self._unavailable_unit(unit, t_s, codes.describe(e)))
        return out

    def _poll_mig(self, parent: GpuState, unit: GpuState, t_s: float) -> GpuSample:
        if unit.failing:
            unit.failing.clear()
        mem = self._memory(unit)
        procs = self._processes(unit)
        if not unit.gpm_checked:
            self._gpm_activity(unit, t_s)  # where supported, sets up its activity sampling
        history: tuple[UtilPoint, ...] = ()
        gpm: GpmActivity | None = None
        if unit.activity is not None:
            history, gpm = self._drain(unit, t_s)
        xids, last_xid = self._xid.seen(parent.index, unit.mig)
        if self._problems.any_active:
            self._problems.clear_prefix(
                f"nvml:gpu {unit.tag}:", keep={f"nvml:gpu {unit.tag}:{f}" for f in unit.failing}
            )
        return GpuSample(
            t_s=t_s,
            index=parent.index,
            uuid=unit.uuid,
            name=unit.name,
            mem_used_bytes=None if mem is None else int(mem.used),
            mem_total_bytes=None if mem is None else int(mem.total),
            processes=procs or (),
            util_history=history,
            mig=unit.mig,
            gpm=gpm,
            xids=xids,
            last_xid=last_xid,
        )

    def _unavailable_unit(self, m: GpuState, t_s: float, why: str) -> GpuSample:
        xids, last_xid = self._xid.seen(m.index, m.mig)
        return GpuSample(
            t_s=t_s,
            index=m.index,
            uuid=m.uuid,
            name=m.name,
            available=False,
            error=why,
            mig=m.mig,
            xids=xids,
            last_xid=last_xid,
        )
