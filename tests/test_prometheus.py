"""A real Prometheus (Debian's package) scraping `gpumon serve` every second on loopback: the
dashboard's every query returns data, and the starvation alert fires for the starved GPU only."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
import urllib.parse
import urllib.request

import pytest

from .conftest import ROOT, free_port, start_serve

MONITORING = ROOT / "monitoring"


def api(base: str, path: str, **params: str) -> dict:
    url = f"{base}{path}?{urllib.parse.urlencode(params)}" if params else f"{base}{path}"
    with urllib.request.urlopen(url, timeout=10) as r:
        return json.loads(r.read())


def wait_until(check, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        try:
            last = check()
            if last:
                return last
        except OSError:
            pass
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what} (last: {last!r})")


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory):
    prometheus = shutil.which("prometheus")
    if prometheus is None:
        pytest.fail("prometheus is missing: scripts/test.sh installs Debian's prometheus package")
    tmp = tmp_path_factory.mktemp("prom")
    gp, pp = free_port(), free_port()
    jobs = tmp / "jobs"  # a job on both GPUs, as the Slurm prolog writes it: the job panels have data
    subprocess.run(
        [str(ROOT / "contrib/slurm/gpumon-prolog")],
        env={
            "PATH": os.environ["PATH"],
            "GPUMON_JOBS_DIR": str(jobs),
            "GPUMON_NVIDIA_SMI": "/nonexistent",
            "SLURM_JOB_ID": "7",
            "SLURM_JOB_USER": "alice",
            "SLURM_JOB_GPUS": "0,1",
        },
        check=True,
    )
    (tmp / "gpumon.toml").write_text(f'jobs_dir = "{jobs}"\n')
    serve = start_serve(
        "--config",
        str(tmp / "gpumon.toml"),
        "--simulate",
        "starved-cpu,healthy-power-capped",  # GPU 1 with GPM and its clocks held by the power cap
        port=gp,
        stderr=subprocess.PIPE,
    )
    # the shipped rules, with their `for:` shortened so the test takes seconds, not minutes
    rules = re.sub(r"for: \d+m", "for: 5s", (MONITORING / "gpumon.rules.yml").read_text())
    (tmp / "rules.yml").write_text(rules)
    (tmp / "prometheus.yml").write_text(
        "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
        f"rule_files: [{tmp / 'rules.yml'}]\n"
        f"scrape_configs:\n  - job_name: gpumon\n    static_configs:\n      - targets: ['127.0.0.1:{gp}']\n"
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
        stderr=subprocess.PIPE,
    )
    base = f"http://127.0.0.1:{pp}"
    try:
        wait_until(
            lambda: api(base, "/api/v1/query", query="gpumon_gpu_state")["data"]["result"],
            60,
            "Prometheus to scrape gpumon",
        )
        yield base, f"http://127.0.0.1:{gp}"
    finally:
        for p in (prom, serve):
            p.terminate()
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()


def test_promtool_check_metrics_finds_nothing(stack) -> None:
    _, exporter = stack
    body = urllib.request.urlopen(exporter + "/metrics", timeout=10).read()
    p = subprocess.run(["promtool", "check", "metrics"], input=body, capture_output=True)
    assert p.returncode == 0 and not (p.stdout + p.stderr).strip(), (p.stdout + p.stderr).decode()


def dashboard_queries() -> list[tuple[str, str]]:
    dash = json.loads((MONITORING / "grafana-dashboard.json").read_text())
    return [(p["title"], t["expr"]) for p in dash["panels"] for t in p.get("targets", [])]


def concrete(expr: str) -> str:
    """Grafana's variables, as Grafana would fill them with "All" selected."""
    return (
        expr.replace("$instance", ".*")
        .replace("$gpu", ".*")
        .replace("$job", ".*")
        .replace("$__range", "1m")
        .replace("$__rate_interval", "15s")
    )


EVENTS_ONLY = {"XID errors (range)"}
"""Panels with data only after an event no simulated GPU has (an XID): their queries must still
be valid PromQL; tests/test_hopper.py serves a scripted XID through the stand-in driver."""


def test_every_dashboard_query_returns_data(stack) -> None:
    base, _ = stack
    time.sleep(6)  # rate() and increase() need a few samples in their window
    empty = []
    for title, expr in dashboard_queries():
        doc = api(base, "/api/v1/query", query=concrete(expr))
        assert doc["status"] == "success", (title, expr, doc)
        if not doc["data"]["result"] and title not in EVENTS_ONLY:
            empty.append(f"{title}: {expr}")
    assert not empty, "panels without data:\n" + "\n".join(empty)
    dash = json.loads((MONITORING / "grafana-dashboard.json").read_text())
    names = {v["name"] for v in dash["templating"]["list"]}
    assert {"datasource", "instance", "gpu", "job"} <= names
    assert api(base, "/api/v1/label/gpu/values", **{"match[]": "gpumon_gpu_info"})["data"] == ["0", "1"]


def test_the_starvation_alert_fires_for_the_starved_gpu_only(stack) -> None:
    base, _ = stack

    def firing() -> list[dict]:
        alerts = api(base, "/api/v1/alerts")["data"]["alerts"]
        return [
            a for a in alerts if a["labels"]["alertname"] == "GpumonGpuStarved" and a["state"] == "firing"
        ]

    alerts = wait_until(firing, 60, "GpumonGpuStarved to fire")
    assert [(a["labels"]["gpu"], a["labels"]["cause"]) for a in alerts] == [("0", "cpu")]
    assert "starved by cpu" in alerts[0]["annotations"]["summary"]
    others = {a["labels"]["alertname"] for a in api(base, "/api/v1/alerts")["data"]["alerts"]}
    # the job holding the starved GPU is starved too; it has no straggler (no GPU waits in sync-stall)
    assert others <= {"GpumonGpuStarved", "GpumonJobStarved"}, "nothing else fires for a working exporter"


def test_promtool_rule_tests_pass() -> None:
    p = subprocess.run(
        ["promtool", "test", "rules", "gpumon.rules.test.yml"], cwd=MONITORING, capture_output=True, text=True
    )
    assert p.returncode == 0 and "SUCCESS" in p.stdout, p.stdout + p.stderr
    p = subprocess.run(
        ["promtool", "check", "rules", "gpumon.rules.yml"], cwd=MONITORING, capture_output=True, text=True
    )
    assert p.returncode == 0, p.stdout + p.stderr
