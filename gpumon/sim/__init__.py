"""Simulated GPUs and hosts: seeded scenarios behind pynvml- and psutil-shaped look-alikes.

Nothing here imports a source, the sampler or the detector: the pipeline (gpumon.collect.pipeline) puts
the look-alikes behind the real NvmlSource and HostSource, so simulated runs take the same paths.
"""
