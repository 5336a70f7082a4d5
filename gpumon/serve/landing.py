"""The landing page at `/`: what is sampled and where everything else is."""

from __future__ import annotations

from gpumon import __version__


def landing_page(sampling: str) -> str:
    """`sampling`: the phrase for the source (SourceDescription.phrase())."""
    import html  # when someone opens the page, not at every start

    return (
        f"<!doctype html><html><head><title>gpumon</title></head><body><h1>gpumon {__version__}</h1>"
        f"<p>Catches GPUs starved by their input pipeline. Sampling {html.escape(sampling)}.</p><ul>"
        '<li><a href="/metrics">/metrics</a>: Prometheus metrics</li>'
        '<li><a href="/api/v1/state">/api/v1/state</a>: GPUs, host, verdicts and evidence (JSON)</li>'
        '<li><a href="/api/v1/analysis?since=1h">/api/v1/analysis?since=1h</a>: the flight recorder\'s '
        "last hour analyzed, as <code>gpumon analyze --from</code> does (JSON; since, until, gpu)</li>"
        '<li><a href="/healthz">/healthz</a>: health</li></ul></body></html>'
    )
