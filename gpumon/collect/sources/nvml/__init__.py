"""The NVML source, the only part of gpumon that loads NVIDIA's `pynvml` (source.py): NVML's codes
and the lost-GPU rule (codes.py), per-GPU state (state.py), utilization samples on the sampler's
clock (samples.py), MIG instances (mig.py), GPM activity (gpm.py, over gpm_unit.py's buffers),
clock-event reasons (clocks.py) and XID events (xid.py)."""
