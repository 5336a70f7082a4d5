"""A multi-node job seen by a real Prometheus: four `gpumon serve` processes stand for four nodes
of one Slurm job (5 simulated GPUs each: four for the job, one for another job beside it). On
node 1, GPU 0's input is CPU-starved; the job's other 15 GPUs wait for it in sync-stall. Each
node's mapping directory is written by the shipped prolog. With the shipped recording and alert
rules, the straggler alert must name node 1's GPU 0, nothing may fire for the healthy job, and
`gpumon report --job` against that Prometheus must name the same straggler."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from .conftest import ROOT, free_port, start_serve
from .test_prometheus import api, wait_until

PROLOG = ROOT / "contrib/slurm/gpumon-prolog"
NODES = 4


def prolog(jobs_dir: Path, job: str, user: str, gpus: str) -> None:
    env = {
        "PATH": os.environ["PATH"],
        "GPUMON_JOBS_DIR": str(jobs_dir),
        "GPUMON_NVIDIA_SMI": "/nonexistent",
        "SLURM_JOB_ID": job,
        "SLURM_JOB_USER": user,
        "SLURM_JOB_GPUS": gpus,
    }
    subprocess.run([str(PROLOG)], env=env, check=True, timeout=30)


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, list[str]]]:
    prometheus = shutil.which("prometheus")
    if prometheus is None:
        pytest.fail("prometheus is missing: scripts/test.sh installs Debian's prometheus package")
    tmp = tmp_path_factory.mktemp("fleet")
    procs = []
    targets = []
    for node in range(1, NODES + 1):
        jobs = tmp / f"node{node}-jobs"
        prolog(jobs, "7", "alice", "0,1,2,3")  # the training job: 4 GPUs on every node
        prolog(jobs, "8", "bob", "4")  # a healthy job beside it
        first = "starved-cpu" if node == 1 else "sync-stall"
        port = free_port()
        conf = tmp / f"node{node}.toml"
        conf.write_text(f'jobs_dir = "{jobs}"\n')
        procs.append(
            start_serve(
                "--config",
                str(conf),
                "--simulate",
                f"{first},sync-stall,sync-stall,sync-stall,healthy",
                port=port,
            )
        )
        targets.append(f"127.0.0.1:{port}")
    pp = free_port()
    (tmp / "prometheus.yml").write_text(
        "global:\n  scrape_interval: 2s\n  evaluation_interval: 2s\n"
        f"rule_files: [{ROOT / 'monitoring/gpumon.rules.yml'}]\n"
        "scrape_configs:\n  - job_name: gpumon\n    static_configs:\n"
        f"      - targets: [{', '.join(repr(t) for t in targets)}]\n"
    )
    prom = subprocess.Popen(
        [
            prometheus,
            f"--config.file={tmp / 'prometheus.yml'}",
            f"--storage.tsdb.path={tmp / 'data'}",
            f"--web.listen-address=127.0.0.1:{pp}",
            "--log.level=warn",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    base = f"http://127.0.0.1:{pp}"
    try:
        wait_until(
            lambda: (
                len(api(base, "/api/v1/query", query="gpumon_gpu_job_info")["data"]["result"]) == 5 * NODES
            ),
            60,
            "Prometheus to scrape the four nodes' job info",
        )
        yield base, targets
    finally:
        for p in (prom, *procs):
            p.terminate()
        for p in (prom, *procs):
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()


def test_the_straggler_alert_names_the_starved_rank_and_nothing_fires_for_the_healthy_job(fleet) -> None:
    base, targets = fleet

    def straggler() -> list[dict]:
        alerts = api(base, "/api/v1/alerts")["data"]["alerts"]
        return [
            a for a in alerts if a["labels"]["alertname"] == "GpumonJobStraggler" and a["state"] == "firing"
        ]

    firing = wait_until(straggler, 150, "GpumonJobStraggler to fire")
    assert [
        (a["labels"]["instance"], a["labels"]["gpu"], a["labels"]["cause"], a["labels"]["job_id"])
        for a in firing
    ] == [(targets[0], "0", "cpu", "7")]
    assert (
        "waits for" in firing[0]["annotations"]["summary"] and "alice" in firing[0]["annotations"]["summary"]
    )
    everything = api(base, "/api/v1/alerts")["data"]["alerts"]
    assert not [a for a in everything if a["labels"].get("job_id") == "8"], "the healthy job stays quiet"
    counts = api(base, "/api/v1/query", query='gpumon_job:gpus:count{job_id="7"}')["data"]["result"]
    by_state = {r["metric"]["state"]: float(r["value"][1]) for r in counts}
    assert by_state == {"starved": 1.0, "sync-stall": 15.0}, by_state


def test_report_against_prometheus_names_the_same_straggler(fleet) -> None:
    base, targets = fleet
    wait_until(
        lambda: api(
            base, "/api/v1/query", query="ALERTS{alertname='GpumonJobStraggler',alertstate='firing'}"
        )["data"]["result"],
        150,
        "the straggler alert",
    )
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "gpumon",
            "report",
            "--job",
            "7",
            "--prometheus",
            base,
            "--since",
            "2m",
            "--json",
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
        timeout=60,
    )
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    assert doc["stragglers"] == [{"node": targets[0], "gpu": 0, "label": "starved-cpu"}], doc["stragglers"]
    assert len(doc["gpus"]) == 4 * NODES and doc["user"] == "alice" and doc["verdict"].startswith("STRAGGLER")
    text = subprocess.run(
        [sys.executable, "-m", "gpumon", "report", "--job", "7", "--prometheus", base, "--since", "2m"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
        timeout=60,
    ).stdout
    assert re.search(rf"{re.escape(targets[0])}\s+GPU 0 .*<- the straggler", text), text
