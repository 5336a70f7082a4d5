"""`gpumon report --job ID`: a job's verdicts from the daemons that watched it, or from Prometheus."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

from gpumon.cli import flags
from gpumon.core.errors import EXIT_OK, UsageError


def add_parser(
    sub: argparse._SubParsersAction[argparse.ArgumentParser], common: argparse.ArgumentParser
) -> None:
    s = sub.add_parser(
        "report", parents=[common], help="one job's verdicts: per GPU and overall, waste, the straggler"
    )
    s.add_argument("--job", required=True, metavar="ID", help="the Slurm job id (an array task as JOB_TASK)")
    s.add_argument(
        "--url",
        action="append",
        metavar="URL",
        help="a gpumon daemon to ask (repeatable; default http://127.0.0.1:9877, this node's)",
    )
    s.add_argument(
        "--prometheus", metavar="URL", help="ask this Prometheus instead: every node of the job at once"
    )
    s.add_argument(
        "--since",
        type=flags.time_point,
        metavar="TIME",
        help="from this time: ISO 8601, or ago as 30m, 2h, 1d",
    )
    s.add_argument("--until", type=flags.time_point, metavar="TIME", help="until this time (default now)")
    s.add_argument(
        "--timeout",
        type=float,
        metavar="SECONDS",
        help="the longest wait for each server's whole answer (default 10 for daemons, 30 for Prometheus)",
    )
    s.add_argument(
        "--basic-auth",
        metavar="USER:PASSWORD",
        help="credentials for daemons or a Prometheus that ask for basic auth (default "
        "$GPUMON_BASIC_AUTH; or in the URL, http://USER:PASSWORD@host:9877); never printed",
    )
    s.add_argument("--json", action="store_true", help="machine-readable (schema gpumon-job-report/1)")
    s.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from gpumon.analyze import job_report as report

    if args.timeout is not None and not 0.1 <= args.timeout <= 3600:
        raise UsageError("--timeout: from 0.1 to 3600 seconds")
    job = args.job
    if not job or len(job) > 128 or not job.isprintable() or any(c.isspace() for c in job):
        shown = job[:40].encode("unicode_escape").decode("ascii")
        raise UsageError(f"--job: expected a job id such as 4242, 70_7 or ns/pod; got {shown!r}")
    auth = args.basic_auth or os.environ.get("GPUMON_BASIC_AUTH") or None
    if auth is not None and ":" not in auth:
        raise UsageError("--basic-auth: expected USER:PASSWORD")
    until = args.until if args.until is not None else time.time()
    if args.since is not None and args.since >= until:
        raise UsageError("--since must come before --until")
    if args.prometheus:
        if args.url:
            raise UsageError("--url and --prometheus: choose one")
        since = args.since if args.since is not None else until - 86400.0
        rep = report.from_prometheus(args.job, args.prometheus, since, until, auth, args.timeout)
    else:
        urls = args.url or ["http://127.0.0.1:9877"]
        rep = report.from_daemons(args.job, urls, args.since, args.until, auth, args.timeout)
    if args.json:
        json.dump(report.to_json(rep), sys.stdout, indent=1)
        print()
    else:
        print(report.render(rep))
    return EXIT_OK
