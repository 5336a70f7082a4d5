"""`gpumon serve`: the daemon's wiring and lifecycle, the snapshot it publishes after each tick,
and what it serves from it (Prometheus exposition, the state and analysis APIs, health, the
landing page, PCP's endpoint) over its HTTP server, with TLS and basic auth."""
