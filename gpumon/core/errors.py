"""User-facing errors and the exit codes they map to.

Each error carries one line that names the thing to fix; the CLI prints it without a traceback.
The codes are documented in README.md ("Exit codes"); keep the two in step.
"""

from __future__ import annotations

EXIT_OK = 0
EXIT_INTERNAL = 1
EXIT_USAGE = 2
EXIT_NO_DRIVER = 3
EXIT_BAD_TRACE = 4
EXIT_OUTPUT = 5
EXIT_MISSING_DEPENDENCY = 6
EXIT_CONFIG = 7
EXIT_UNREACHABLE = 9
"""`report`: a daemon or Prometheus that cannot be read, or that does not know the job. (8 is
what dstat exits with when a plugin fails.)"""
EXIT_INTERRUPTED = 130


class GpumonError(Exception):
    """An error a user can act on; `str()` is the one line they see."""

    exit_code = EXIT_INTERNAL


class UsageError(GpumonError):
    exit_code = EXIT_USAGE


class NoDriverError(GpumonError):
    """NVML could not be loaded or initialised."""

    exit_code = EXIT_NO_DRIVER


class TraceError(GpumonError):
    """A trace file that cannot be read: names the file, the line and what is wrong."""

    exit_code = EXIT_BAD_TRACE

    def __init__(self, path: str, line: int | None, reason: str) -> None:
        self.path = path
        self.line = line
        self.reason = reason
        where = f"{path}:{line}" if line is not None else path
        super().__init__(f"{where}: {reason}")

    def __reduce__(self) -> tuple[type, tuple[str, int | None, str]]:
        return (type(self), (self.path, self.line, self.reason))  # crosses a process pool whole


class OutputError(GpumonError):
    """An output file that cannot be written (exists, no permission, disk full)."""

    exit_code = EXIT_OUTPUT


class MissingDependency(GpumonError):
    """An optional package a flag needs is not installed."""

    exit_code = EXIT_MISSING_DEPENDENCY
