"""`gpumon scenarios`: the simulated workloads, one line each."""

from __future__ import annotations

import argparse

from gpumon.core.errors import EXIT_OK


def add_parser(
    sub: argparse._SubParsersAction[argparse.ArgumentParser], common: argparse.ArgumentParser
) -> None:
    s = sub.add_parser("scenarios", parents=[common], help="list the simulated workload scenarios")
    s.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from gpumon.sim.scenarios import SCENARIOS

    width = max(len(n) for n in SCENARIOS)
    for name, scenario in SCENARIOS.items():
        print(f"{name:<{width}}  {scenario.summary}")
    return EXIT_OK
