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
    # the shipped rules, with their `for:` and the starved episode's 5 minutes shortened so the
    # test takes seconds, not minutes
    rules = re.sub(r"for: \d+m", "for: 5s", (MONITORING / "gpumon.rules.yml").read_text())
    rules = rules.replace("state_duration_seconds >= 300", "state_duration_seconds >= 5")
    assert "duration_seconds >= 5" in rules, "the starvation alerts' 5 minutes are counted so"
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


ADVISED = 'gpumon_gpu_predicted_speedup{change="recommended"}'
"""What a fix buys has a number once the starved GPU's episode has its first steady windows (the
onset, then MIN_WINDOWS windows: ~15 s after the daemon starts, docs/detector.md)."""


def empty_queries(base: str) -> list[str]:
    empty = []
    for title, expr in dashboard_queries():
        doc = api(base, "/api/v1/query", query=concrete(expr))
        assert doc["status"] == "success", (title, expr, doc)
        if not doc["data"]["result"] and title not in EVENTS_ONLY:
            empty.append(f"{title}: {expr}")
    return empty


def test_every_dashboard_query_returns_data(stack) -> None:
    base, _ = stack
    # rate() and increase() need a few samples in their window; the advice, an episode's first windows
    enough = f"count_over_time(gpumon_gpu_state[1m]) > 5 and on() count({ADVISED}) > 0"
    wait_until(lambda: api(base, "/api/v1/query", query=enough)["data"]["result"], 90, "the advice")
    empty = empty_queries(base)
    assert not empty, "panels without data:\n" + "\n".join(empty)
    dash = json.loads((MONITORING / "grafana-dashboard.json").read_text())
    names = {v["name"] for v in dash["templating"]["list"]}
    assert {"datasource", "instance", "gpu", "job"} <= names
    assert api(base, "/api/v1/label/gpu/values", **{"match[]": "gpumon_gpu_info"})["data"] == ["0", "1"]


@pytest.fixture(scope="module")
def plain_stack(tmp_path_factory: pytest.TempPathFactory):
    """The README's `gpumon serve --simulate starved-cpu,healthy` (no job, no Hopper GPU, no XID),
    scraped every second by a Prometheus of its own: a plain machine's dashboard."""
    tmp = tmp_path_factory.mktemp("plain")
    gp, pp = free_port(), free_port()
    serve = start_serve("--simulate", "starved-cpu,healthy", port=gp)
    (tmp / "prometheus.yml").write_text(
        "global:\n  scrape_interval: 1s\n"
        f"scrape_configs:\n  - job_name: gpumon\n    static_configs:\n      - targets: ['127.0.0.1:{gp}']\n"
    )
    prom = subprocess.Popen(
        [
            shutil.which("prometheus") or "prometheus",
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
            lambda: len(api(base, "/api/v1/query", query="gpumon_gpu_state")["data"]["result"]) > 0,
            60,
            "Prometheus to scrape gpumon",
        )
        yield base
    finally:
        for p in (prom, serve):
            p.terminate()
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()


def test_on_a_plain_machine_each_empty_panel_says_why(plain_stack) -> None:
    """Grafana itself cannot be installed from Debian's or PyPI's registries (docs/dashboard.md), so
    each panel's PromQL runs against a real Prometheus scraping the README's `gpumon serve`: a
    panel that has no data there says why in its description, and one that says so has none."""
    base = plain_stack
    enough = f"count_over_time(gpumon_gpu_state[1m]) > 5 and on() count({ADVISED}) > 0"
    wait_until(  # rate() and increase() need a few samples in their window; the advice, an episode's
        lambda: api(base, "/api/v1/query", query=enough)["data"]["result"],
        90,
        "a few scrapes and the advice",
    )
    dash = json.loads((MONITORING / "grafana-dashboard.json").read_text())
    empty, with_data = set(), set()
    for panel in dash["panels"]:
        for t in panel.get("targets", []):
            doc = api(base, "/api/v1/query", query=concrete(t["expr"]))
            assert doc["status"] == "success", (panel["title"], t["expr"], doc)
            (with_data if doc["data"]["result"] else empty).add(panel["title"])
    empty -= with_data  # a panel with one query that has data shows something
    for panel in dash["panels"]:
        if panel["title"] in empty:
            said = panel.get("description", "")
            assert "Empty " in said, f"{panel['title']!r} is empty on a plain machine: say why (description)"
    # the 4 job panels, the GPM and clock panels, XIDs ("SM activity" shows utilization beside GPM)
    assert sorted(empty) == sorted(PLAIN_EMPTY), sorted(empty)


PLAIN_EMPTY = [
    "Job: each GPU's state, across nodes",
    "Job: GPUs in each state",
    "Job: GPU-seconds wasted per second",
    "Job: starved GPUs (the straggler, when the rest sync-stall)",
    "Tensor cores and DRAM bandwidth (GPM)",
    "Clocks held, by reason",
    "XID errors (range)",
]
"""docs/dashboard.md lists these as the panels empty on a machine without jobs or Hopper GPUs."""


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


def test_the_landing_page_lists_every_endpoint_and_each_answers(stack) -> None:
    _, exporter = stack
    page = urllib.request.urlopen(exporter + "/", timeout=10).read().decode()
    links = re.findall(r'href="([^"]+)"', page)
    paths = [link.split("?")[0] for link in links]
    assert paths == ["/metrics", "/api/v1/state", "/api/v1/analysis", "/healthz"]
    for link in links:
        try:
            status, body = urllib.request.urlopen(exporter + link, timeout=60).status, b""
        except urllib.error.HTTPError as e:
            status, body = e.code, e.read()
        # simulated GPUs record nothing unless given a record_dir: the API says so, in JSON
        assert status != 404 or b"the recorder is off" in body, link
