"""Parse the command line, run the command, map errors to exit codes.

Every error a user can cause ends in one line on stderr and a documented exit code (README,
"Exit codes"); tracebacks are only shown with --debug.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
from collections.abc import Sequence
from typing import Any, NoReturn

from gpumon import __version__
from gpumon.cli import caused_by_terminated, flags, terminated_early
from gpumon.core.errors import (
    EXIT_INTERNAL,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_USAGE,
    GpumonError,
    OutputError,
    UsageError,
)
from gpumon.core.terminal import printable

COMMANDS = {
    "devices": "devices",
    "scenarios": "scenarios",
    "record": "record",
    "analyze": "analyze",
    "watch": "watch",
    "serve": "serve",
    "report": "report",
    "demo": "demo",
    "bench": "bench",
    "dstat-plugin": "dstat_plugin",
    "trace": "trace_cmd",
}
"""Each command's name and its module in gpumon.cli, in `gpumon --help`'s order. A command line
that names one imports only that one's module (`gpumon serve` starts without the others'
imports: its first sample comes sooner)."""


class _Parser(argparse.ArgumentParser):
    """argparse's own usage errors ("unrecognized arguments: ...", an ambiguous option) quote what
    was typed as it is: a file name from a glob (`gpumon analyze *`) could carry a terminal escape
    or a newline that forges a line. Said through one_line, as every other error line is. The
    subcommands' parsers are of this class too (add_subparsers makes them of the parser's).

    One line, as every other error is: argparse's usage block before it (6-9 lines of every flag)
    buried the line that names what to fix; `--help` lists the flags."""

    help_hint: str | None = None
    """Where the flags are listed, where it is not this parser's --help: the top parser reports a
    subcommand's unknown flags (`gpumon serve --bogus`), whose list is `gpumon serve --help`."""

    def error(self, message: str) -> NoReturn:
        hint = self.help_hint or f"{self.prog} --help"
        self.exit(2, f"{self.prog}: error: {one_line(message)} (see: {hint})\n")


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    p = _Parser(prog="gpumon", description="Catch GPUs starved by their input pipeline (CPU or storage).")
    p.add_argument("--version", action="version", version=f"gpumon {__version__}")
    flags.add_common(p, top=True)
    common = _Parser(add_help=False)
    flags.add_common(common, top=False)
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    for name, module in COMMANDS.items():
        if only is None or only not in COMMANDS or name == only:
            importlib.import_module(f"gpumon.cli.{module}").add_parser(sub, common)
    return p


_SYSLOG_PRIORITY = {
    logging.CRITICAL: 2,
    logging.ERROR: 3,
    logging.WARNING: 4,
    logging.INFO: 6,
    logging.DEBUG: 7,
}


class _JournalFormatter(logging.Formatter):
    """Under systemd, stderr goes to journald: a "<N>" prefix carries the priority, and journald
    already adds the time and the unit's name."""

    def format(self, record: logging.LogRecord) -> str:
        return f"<{_SYSLOG_PRIORITY.get(record.levelno, 6)}>{record.getMessage()}"


def _stderr_is_journal() -> bool:
    stream = os.environ.get("JOURNAL_STREAM", "")
    if ":" not in stream:
        return False
    try:
        st = os.fstat(sys.stderr.fileno())
    except (OSError, ValueError):
        return False
    return stream == f"{st.st_dev}:{st.st_ino}"


def _setup_logging(level: str) -> None:
    handler = logging.StreamHandler(sys.stderr)
    if _stderr_is_journal():
        handler.setFormatter(_JournalFormatter())
    else:
        handler.setFormatter(logging.Formatter("gpumon: %(levelname)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())


def main(argv: Sequence[str] | None = None) -> int:
    stdout = sys.stdout
    sys.stdout = _GuardedStdout(stdout)
    try:
        return _main(argv)
    finally:
        sys.stdout = stdout


def _main(argv: Sequence[str] | None) -> int:
    from gpumon.cli import command_of

    command = command_of(sys.argv[1:] if argv is None else argv)
    parser = build_parser(command)
    if isinstance(parser, _Parser) and command in COMMANDS:
        parser.help_hint = f"gpumon {command} --help"
    try:
        args = parser.parse_args(argv)  # usage errors exit 2 here, as argparse does
    except OutputError as e:  # --help or --version to a full disk (argparse knows only OSError)
        _silence_stdout()
        print(f"gpumon: error: {one_line(e)}", file=sys.stderr)
        return e.exit_code
    except BrokenPipeError:  # `gpumon --help | head -3`
        _silence_stdout()
        return EXIT_OK
    except SystemExit:  # --help, --version: what they wrote must reach stdout now, not at exit
        try:
            sys.stdout.flush()
        except OutputError as e:
            _silence_stdout()
            print(f"gpumon: error: {one_line(e)}", file=sys.stderr)
            return e.exit_code
        except BrokenPipeError:
            _silence_stdout()
            return EXIT_OK
        raise
    _setup_logging(args.log_level or "warning")
    if args.command is None:
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    try:
        code = int(args.func(args))
        sys.stdout.flush()  # a full disk or a closed pipe shows here, not at exit
        return code
    except UsageError as e:
        parser.exit(e.exit_code, f"gpumon {args.command}: error: {one_line(e)}\n")
    except GpumonError as e:
        if isinstance(e, OutputError) and "standard output" in str(e):
            _silence_stdout()
        print(f"gpumon: error: {one_line(e)}", file=sys.stderr)
        return e.exit_code
    except (KeyboardInterrupt, flags.Interrupted):
        print("gpumon: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        _silence_stdout()
        return EXIT_OK
    except Exception as e:
        if caused_by_terminated(e) or terminated_early():  # a SIGTERM at start-up, wrapped on its way
            print("gpumon: interrupted", file=sys.stderr)
            return EXIT_INTERRUPTED
        if args.debug:
            raise
        print(
            f"gpumon: internal error: {type(e).__name__}: {one_line(e)} (run with --debug for details)",
            file=sys.stderr,
        )
        return EXIT_INTERNAL


def one_line(e: BaseException | str) -> str:
    """An error as its line shows it: a value in it (a file name, a server's answer, a trace's
    field) may hold a terminal escape or a newline, shown as '?' (gpumon.core.terminal), so that
    it can neither drive the terminal nor forge a line of its own."""
    return printable(str(e)).replace("\n", "?")


class _GuardedStdout:
    """sys.stdout whose failures (a full disk, a dead terminal) are OutputErrors, exit 5; a closed
    pipe (`| head`) stays a BrokenPipeError, which ends quietly."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        try:
            return int(self._stream.write(text))
        except BrokenPipeError:
            raise
        except OSError as e:
            raise OutputError(f"cannot write to standard output: {e.strerror}") from None

    def flush(self) -> None:
        try:
            self._stream.flush()
        except BrokenPipeError:
            raise
        except OSError as e:
            raise OutputError(f"cannot write to standard output: {e.strerror}") from None

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def _silence_stdout() -> None:
    """Point stdout at /dev/null so that the interpreter's last flush cannot fail again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.__stdout__.fileno() if sys.__stdout__ else 1)
    except (OSError, ValueError):
        pass
