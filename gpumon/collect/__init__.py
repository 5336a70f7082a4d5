"""Collection: the sources (NVML, the host, job attribution, replay), the sampler that ticks them
on an injected clock into bounded history, and the pipeline that wires sources, sampler, the
detector's stage and sinks in one place."""
