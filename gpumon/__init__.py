"""gpumon: catch GPUs starved by their input pipeline.

The flow is one direction: sources -> sampler -> detector -> sinks (see README).
"""

__version__ = "0.1.0"
