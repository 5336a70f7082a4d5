"""The one place that wires the pipeline: sources -> sampler -> detector -> sinks.

Every command that samples (`watch`, `serve`, `record`, `analyze`, `devices`, `demo`) and every
benchmark builds a Pipeline from a SourceSpec. Sinks subscribe: to raw ticks (a trace writer) or
to verdicts (the exporter's snapshot, `watch`'s lines, `analyze`'s report), so no sink depends on
the order in which others were added. Where the GPU source can hang (real NVML), the sampling
loop runs on a supervised, expendable thread (gpumon.core.guard): a hung call costs that thread, never
a tick of the other GPUs, a scrape, or the process.
"""

from gpumon.collect.pipeline.pipeline import (
    DEFAULT_HISTORY_S,
    NVML_CALL_TIMEOUT_S,
    Pipeline,
    history_window_s,
)
from gpumon.collect.pipeline.sources import OpenedSources, open_sources
from gpumon.collect.pipeline.spec import AttributionSpec, SourceDescription, SourceSpec

__all__ = [
    "DEFAULT_HISTORY_S",
    "NVML_CALL_TIMEOUT_S",
    "AttributionSpec",
    "OpenedSources",
    "Pipeline",
    "SourceDescription",
    "SourceSpec",
    "history_window_s",
    "open_sources",
]
