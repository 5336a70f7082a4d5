"""Sources: the only code that touches drivers, the OS or files.

Each yields plain samples from `gpumon.core.model`. `nvml` is the only module importing `pynvml`,
`host` the only one importing `psutil`; the simulator feeds both through look-alike modules.
"""
