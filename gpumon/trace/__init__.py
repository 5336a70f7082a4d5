"""Traces on disk (docs/trace-format.md): the codec between samples and records, both format
versions, durable writing, the daemon's flight recorder and reading a range of its segments."""
