"""The daemon's pipeline, built apart from the daemon (gpumon.serve.daemon) and importing none of
it: `gpumon serve` builds it first, so a real driver opens (nvmlInit, on its own thread) while the
rest of the daemon (HTTP server, exposition, recorder) is imported, and the first sample comes
sooner."""

from __future__ import annotations

from gpumon.collect.pipeline import Pipeline
from gpumon.collect.pipeline.sources import OpenedSources
from gpumon.config.settings import Config
from gpumon.config.sources import attribution_spec, source_spec
from gpumon.core.clock import Clock
from gpumon.core.problems import Problems

EPISODES_KEPT = 20
"""Closed episodes per GPU in the state API, and all the daemon's detector remembers (the detector's
own default is 200, for `analyze`; each episode holds its worst window's evidence, ~4.5 KB: 200
per GPU was ~1 MB per GPU once a long-running daemon had seen them, and nothing read past these)."""


def daemon_pipeline(
    cfg: Config,
    clock: Clock,
    *,
    sources: OpenedSources | None = None,
    problems: Problems | None = None,
    open_in_background: bool = False,
) -> Pipeline:
    """Sources, sampler and detector as the daemon runs them: a missing driver is retried, never
    fatal, and every NVML call is bounded by `nvml_call_timeout_s`."""
    return Pipeline(
        source_spec(cfg),
        clock,
        interval_s=cfg.interval_s,
        thresholds=cfg.thresholds,
        history_s=cfg.window_s,
        retry_nvml=True,
        nvml_call_timeout_s=cfg.nvml_call_timeout_s,
        sources=sources,
        problems=problems,
        attribution=attribution_spec(cfg),
        open_in_background=open_in_background,
        episodes_kept=EPISODES_KEPT,
    )
