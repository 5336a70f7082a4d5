"""What to sample and where jobs are read from, from the settings: the one place that turns a
Config into the pipeline's SourceSpec and AttributionSpec (`serve` and every other command)."""

from __future__ import annotations

import os

from gpumon.collect.pipeline.spec import AttributionSpec, SourceSpec
from gpumon.config.settings import Config


def source_spec(cfg: Config) -> SourceSpec:
    return SourceSpec.from_settings(
        simulate=cfg.simulate,
        gpus=cfg.gpus,
        seed=cfg.seed,
        sample_period_s=cfg.sample_period_s,
        replay=cfg.replay,
        drive=cfg.drive,
        gpm=cfg.gpm,
    )


def attribution_spec(cfg: Config) -> AttributionSpec | None:
    """Where jobs and pods are read from; the kubelet only where it is (auto) or when told (on)."""
    if not cfg.job_attribution:
        return None
    k8s = cfg.kubernetes == "on" or (cfg.kubernetes == "auto" and os.path.exists(cfg.kubelet_socket))
    return AttributionSpec(
        cfg.jobs_dir,
        cfg.dcgm_job_mapping_dir,
        kubelet_socket=cfg.kubelet_socket if k8s else None,
        kubelet_refresh_s=cfg.kubelet_refresh_s,
    )
