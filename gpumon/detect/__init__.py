"""The detector: one GPU's window of samples in, a state, a cause, evidence and the GPU-seconds
wasted out. Pure (no clock, no I/O): `evidence` measures a window, `classify` names its state,
`tracker` adds hysteresis and episodes, `stage` cuts the windows after each tick. Imports only
gpumon.core."""
