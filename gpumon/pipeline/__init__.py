"""The one place that wires the pipeline: sources -> sampler -> detector -> sinks.

Every command that samples (`watch`, `serve`, `record`, `analyze`, `devices`, `demo`) and every
benchmark builds a Pipeline from a SourceSpec. Sinks subscribe: to raw ticks (a trace writer) or
to verdicts (the exporter's snapshot, `watch`'s lines, `analyze`'s report), so no sink depends on
the order in which others were added. Where the GPU source can hang (real NVML), the sampling
loop runs on a supervised, expendable thread (gpumon.guard): a hung call costs that thread, never
a tick of the other GPUs, a scrape, or the process.
"""

from gpumon.pipeline.pipeline import DEFAULT_HISTORY_S, NVML_CALL_TIMEOUT_S, Pipeline, history_window_s
from gpumon.pipeline.sources import OpenedSources, open_sources
from gpumon.pipeline.spec import AttributionSpec, SourceSpec, describe_source, is_simulated

__all__ = [
    "DEFAULT_HISTORY_S",
    "NVML_CALL_TIMEOUT_S",
    "AttributionSpec",
    "OpenedSources",
    "Pipeline",
    "SourceSpec",
    "describe_source",
    "history_window_s",
    "is_simulated",
    "open_sources",
]
