"""gpumon's settings, each defined once (type, range, default, reason, flag, variable), and how
the daemon's configuration is loaded from the TOML file, the environment and the flags."""
