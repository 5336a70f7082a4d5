"""Kubernetes: pod attribution through a real gRPC server speaking the kubelet's pod-resources API
on a unix socket (tests/fake_kubelet.py), the kubelet's faults, and the deployment manifests
validated against Kubernetes' schemas, with the PrometheusRule's rules checked by promtool."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
import yaml

from gpumon.collect.sources.kubelet import CALL_DEADLINE_S, KubeletClient, device_key
from gpumon.config.settings import Config
from gpumon.core.clock import VirtualClock
from gpumon.core.problems import Problems
from gpumon.serve.daemon import Daemon

from .conftest import ROOT, free_port
from .fake_kubelet import FakeKubelet, Pod

DEPLOY = ROOT / "deploy/kubernetes"


@pytest.fixture
def kubelet(tmp_path: Path) -> Iterator[FakeKubelet]:
    k = FakeKubelet(str(tmp_path / "kubelet.sock"))
    k.start()
    yield k
    k.stop()


def sim_uuids(n: int) -> list[str]:
    d = Daemon(
        Config(simulate="healthy", gpus=n, listen="127.0.0.1:0", job_attribution=False), clock=VirtualClock()
    )
    d.sampler.tick(1.0)
    assert d.sampler.last_tick is not None
    return [g.uuid for g in d.sampler.last_tick.gpus]


def client(kubelet: FakeKubelet, **kw: float) -> KubeletClient:
    c = KubeletClient(Problems(logging.getLogger("test.kubelet")), kubelet.socket_path, **kw)  # type: ignore[arg-type]
    return c


@pytest.mark.parametrize(
    "device_id,key",
    [
        ("GPU-abe8fa3b-1328-050f-b45c-4518aff1be06", ("uuid", "GPU-abe8fa3b-1328-050f-b45c-4518aff1be06")),
        ("GPU-abe8fa3b-1328-050f-b45c-4518aff1be06::3", ("uuid", "GPU-abe8fa3b-1328-050f-b45c-4518aff1be06")),
        ("MIG-12345678-1234-1234-1234-123456789abc", ("uuid", "MIG-12345678-1234-1234-1234-123456789abc")),
        ("2", ("index", "2")),
    ],
)
def test_device_ids_of_each_kind_name_a_gpu(device_id: str, key: tuple[str, str]) -> None:
    assert device_key(device_id) == key


def test_the_kubelets_list_maps_pods_to_gpus(kubelet: FakeKubelet) -> None:
    uuids = sim_uuids(4)
    kubelet.behaviour.pods = [
        Pod(
            "ml",
            "trainer-0",
            {"main": [("nvidia.com/gpu", [uuids[0], uuids[1]])], "sidecar": [("cpu", ["x"])]},
        ),
        Pod("ml", "eval-1", {"eval": [("nvidia.com/gpu", ["3"])]}),  # --device-id-strategy=index
        Pod("other", "noise", {"c": [("example.com/fpga", ["fpga-0"])]}),
    ]
    c = client(kubelet)
    c.refresh()
    assert c.view.up and c.view.reason is None
    pairs = {(d.pod, d.container, d.device_id) for d in c.view.devices}
    assert pairs == {
        ("trainer-0", "main", uuids[0]),
        ("trainer-0", "main", uuids[1]),
        ("eval-1", "eval", "3"),
    }


@pytest.mark.parametrize("fault", ["absent", "slow", "unavailable", "malformed", "error"])
def test_kubelet_faults_mark_attribution_down_with_the_reason_logged_once(
    kubelet: FakeKubelet, fault: str, caplog: pytest.LogCaptureFixture
) -> None:
    if fault == "absent":
        kubelet.stop()
        os.unlink(kubelet.socket_path) if os.path.exists(kubelet.socket_path) else None
    elif fault == "slow":
        kubelet.behaviour.delay_s = 1.0
    elif fault == "unavailable":
        kubelet.stop()
        Path(kubelet.socket_path).touch()  # the socket file is there, nobody listens (restarting)
    elif fault == "malformed":
        kubelet.restart(malformed=True)
    elif fault == "error":
        kubelet.behaviour.error = grpc.StatusCode.INTERNAL
    c = client(kubelet, deadline_s=0.3)
    with caplog.at_level(logging.WARNING):  # every logger: grpcio's own too
        for _ in range(3):
            c.refresh()
    assert not c.view.up and c.view.reason
    expected = {
        "absent": "no kubelet socket",
        "slow": "did not answer within",
        "unavailable": "unavailable",
        "malformed": "cannot be read",
        "error": "INTERNAL",
    }[fault]
    assert expected in c.view.reason, c.view.reason
    assert len([r for r in caplog.records if "kubernetes:" in r.getMessage()]) == 1
    # (grpcio logged its own traceback for an answer it could not decode, at every refresh: found
    # by a hostile-input pass)
    assert not [r.getMessage() for r in caplog.records if r.name.startswith("grpc")]


# -- through gpumon serve --------------------------------------------------------------------------------


def state(url: str) -> dict:
    return json.load(urllib.request.urlopen(url + "/api/v1/state", timeout=5))


def metrics(url: str) -> str:
    return urllib.request.urlopen(url + "/metrics", timeout=5).read().decode()


def wait_for(check, timeout: float = 20.0):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while True:
        try:
            got = check()
        except (OSError, KeyError, ValueError):
            got = None
        if got:
            return got
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.2)


@pytest.fixture
def served(kubelet: FakeKubelet, tmp_path: Path) -> Iterator[tuple[str, FakeKubelet, list[str]]]:
    uuids = sim_uuids(4)
    port = free_port()
    conf = tmp_path / "gpumon.toml"
    conf.write_text(
        f'kubelet_socket = "{kubelet.socket_path}"\nkubelet_refresh_s = 1\njobs_dir = "{tmp_path}/no-jobs"\n'
    )
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gpumon",
            "serve",
            "--config",
            str(conf),
            "--simulate",
            "healthy,healthy,healthy,idle",
            "--listen",
            f"127.0.0.1:{port}",
        ],
        cwd=ROOT,
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    wait_for(lambda: state(url)["ready"])
    yield url, kubelet, uuids
    proc.terminate()
    proc.wait(10)


def pods_on(url: str) -> dict[int, list[str]]:
    return {g["index"]: [j["job_id"] for j in g["jobs"]] for g in state(url)["gpus"]}


def test_serve_names_each_gpus_pod_and_follows_pods_that_come_and_go(served) -> None:
    url, kubelet, uuids = served
    kubelet.behaviour.pods = [
        Pod("ml", "trainer-0", {"main": [("nvidia.com/gpu", [uuids[0], uuids[1]])]}),
        Pod("ml", "eval-1", {"eval": [("nvidia.com/gpu", [f"{uuids[2]}::1"])]}),  # a time-sliced replica
    ]
    wait_for(lambda: pods_on(url) == {0: ["ml/trainer-0"], 1: ["ml/trainer-0"], 2: ["ml/eval-1"], 3: []}, 10)
    text = metrics(url)
    infos = [ln for ln in text.splitlines() if ln.startswith("gpumon_gpu_job_info{")]
    assert len(infos) == 3 and all('scheduler="kubernetes"' in ln and 'namespace="ml"' in ln for ln in infos)
    assert any('pod="eval-1"' in ln and 'container="eval"' in ln and 'gpu="2"' in ln for ln in infos)
    gaps = [ln for ln in text.splitlines() if ln.startswith("gpumon_gpu_unattributed_info{")]
    assert len(gaps) == 1 and 'gpu="3"' in gaps[0] and 'reason="no-process"' in gaps[0], gaps
    assert 'gpumon_attribution_up{source="kubernetes"} 1.0' in text
    kubelet.behaviour.pods = [
        Pod("ml", "trainer-1", {"main": [("nvidia.com/gpu", [uuids[0]])]})
    ]  # one ends, one starts
    wait_for(lambda: pods_on(url) == {0: ["ml/trainer-1"], 1: [], 2: [], 3: []}, 5)


def test_a_hung_kubelet_costs_verdicts_and_scrapes_nothing(served) -> None:
    url, kubelet, uuids = served
    kubelet.behaviour.pods = [Pod("ml", "trainer-0", {"main": [("nvidia.com/gpu", [uuids[0]])]})]
    wait_for(lambda: pods_on(url)[0] == ["ml/trainer-0"], 10)
    kubelet.behaviour.delay_s = 30.0  # every List now hangs past the deadline
    wait_for(lambda: state(url)["attribution"]["kubernetes"]["up"] is False, 15)
    reason = state(url)["attribution"]["kubernetes"]["reason"]
    assert "did not answer within" in reason
    lat = []
    for _ in range(30):
        t0 = time.perf_counter()
        metrics(url)
        lat.append(time.perf_counter() - t0)
    # a scrape that waited on the kubelet would take at least its call's deadline
    assert max(lat) < CALL_DEADLINE_S, f"a scrape took {max(lat) * 1e3:.0f} ms while the kubelet hung"
    assert 'gpumon_attribution_up{source="kubernetes"} 0.0' in metrics(url)
    assert all(g["state"] != "unknown" for g in state(url)["gpus"]), "verdicts go on"
    kubelet.behaviour.delay_s = 0.0


# -- the manifests ----------------------------------------------------------------------------------------


def manifests() -> list[dict]:
    kust = yaml.safe_load((DEPLOY / "kustomization.yaml").read_text())
    docs = []
    for name in kust["resources"]:
        docs.extend(d for d in yaml.safe_load_all((DEPLOY / name).read_text()) if d)
    return docs


def test_the_kustomization_lists_every_manifest() -> None:
    kust = yaml.safe_load((DEPLOY / "kustomization.yaml").read_text())
    on_disk = {p.name for p in DEPLOY.glob("*.yaml")} - {"kustomization.yaml"}
    assert set(kust["resources"]) == on_disk


def test_core_manifests_validate_against_the_kubernetes_schemas() -> None:
    import kubernetes_validate

    core = [d for d in manifests() if d["apiVersion"] in ("v1", "apps/v1")]
    assert {d["kind"] for d in core} == {"Namespace", "DaemonSet", "Service"}
    for doc in core:
        kubernetes_validate.validate(doc, "1.31", strict=True)


def test_the_daemonset_is_locked_down_as_documented() -> None:
    (ds,) = [d for d in manifests() if d["kind"] == "DaemonSet"]
    spec = ds["spec"]["template"]["spec"]
    (c,) = spec["containers"]
    sc = c["securityContext"]
    assert spec["hostPID"] is True and spec["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert (
        sc["readOnlyRootFilesystem"]
        and not sc["allowPrivilegeEscalation"]
        and sc["capabilities"]["drop"] == ["ALL"]
    )
    mounts = {m["mountPath"]: m for m in c["volumeMounts"]}
    assert mounts["/var/lib/kubelet/pod-resources"]["readOnly"] is True
    assert (
        c["livenessProbe"]["httpGet"]["path"] == "/healthz"
        and c["readinessProbe"]["httpGet"]["path"] == "/healthz"
    )
    assert c["resources"]["requests"] and c["resources"]["limits"]
    assert not any("/dev/nvidia-uvm" in str(v) for v in spec.get("volumes", [])), "no CUDA device"


def test_the_prometheusrule_carries_the_shipped_rules_and_promtool_accepts_them(tmp_path: Path) -> None:
    (rule,) = [d for d in manifests() if d["kind"] == "PrometheusRule"]
    shipped = yaml.safe_load((ROOT / "monitoring/gpumon.rules.yml").read_text())
    assert rule["spec"]["groups"] == shipped["groups"], "run scripts/make-prometheusrule.py"
    f = tmp_path / "rules.yml"
    f.write_text(yaml.safe_dump({"groups": rule["spec"]["groups"]}))
    p = subprocess.run(["promtool", "check", "rules", str(f)], capture_output=True, text=True)
    assert p.returncode == 0, p.stdout + p.stderr
    (sm,) = [d for d in manifests() if d["kind"] == "ServiceMonitor"]
    assert sm["spec"]["endpoints"][0]["port"] == "metrics"


def test_the_containerfile_is_non_root_and_carries_no_compiler() -> None:
    text = (ROOT / "Containerfile").read_text()
    users = [ln.split()[1] for ln in text.splitlines() if ln.startswith("USER ")]
    assert users and users[-1].split(":")[0] not in ("0", "root")
    final = text.rsplit("\nFROM ", 1)[1]
    assert "gcc" not in final and "build-essential" not in final and "[k8s]" in final


def test_permission_denied_on_the_socket_is_named(
    kubelet: FakeKubelet, monkeypatch: pytest.MonkeyPatch
) -> None:
    # as root the kernel would let any process in; what a non-root gpumon meets is stood in for
    real = os.access
    monkeypatch.setattr(os, "access", lambda p, m: False if p == kubelet.socket_path else real(p, m))
    c = client(kubelet)
    c.refresh()
    assert not c.view.up and "permission denied" in (c.view.reason or "")


@pytest.mark.parametrize(
    "text,expected",
    [
        (
            "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1a2b3c4d_5e6f_7a8b_9c0d_1e2f3a4b5c6d.slice/"
            "cri-containerd-" + "ab" * 32 + ".scope\n",
            ("1a2b3c4d-5e6f-7a8b-9c0d-1e2f3a4b5c6d", "ab" * 6),
        ),
        (
            "11:memory:/kubepods/besteffort/pod1a2b3c4d-5e6f-7a8b-9c0d-1e2f3a4b5c6d/" + "cd" * 32 + "\n",
            ("1a2b3c4d-5e6f-7a8b-9c0d-1e2f3a4b5c6d", "cd" * 6),
        ),
        ("0::/system.slice/slurmstepd.scope/job_1/step_0\n", None),
    ],
)
def test_a_pods_cgroup_names_its_uid_and_container(text: str, expected: tuple[str, str] | None) -> None:
    from gpumon.collect.sources.jobs import parse_pod_cgroup

    assert parse_pod_cgroup(text) == expected


def test_a_gpu_reaching_a_pod_without_the_device_plugin_is_named_by_its_cgroup(tmp_path: Path) -> None:
    from gpumon.collect.sources.jobs import JobSource
    from gpumon.core.model import GpuProcess, GpuSample

    proc = tmp_path / "proc" / "4242"
    proc.mkdir(parents=True)
    uid = "1a2b3c4d-5e6f-7a8b-9c0d-1e2f3a4b5c6d"
    (proc / "cgroup").write_text(
        f"0::/kubepods.slice/kubepods-pod{uid.replace('-', '_')}.slice/cri-containerd-{'ef' * 32}.scope\n"
    )
    src = JobSource(Problems(logging.getLogger("t")), None, proc=str(tmp_path / "proc"))
    (g,) = src.poll(0.0, [GpuSample(0.0, 0, "GPU-x", "x", processes=(GpuProcess(4242, None),))])
    (job,) = g.jobs
    assert (job.scheduler, job.job_id, job.via, job.container) == (
        "kubernetes",
        f"pod-uid/{uid}",
        "cgroup",
        "ef" * 6,
    )


def test_a_down_kubelet_is_the_reason_a_busy_gpu_names_no_pod(kubelet: FakeKubelet) -> None:
    from gpumon.collect.sources.jobs import JobSource
    from gpumon.core.model import GpuProcess, GpuSample

    kubelet.stop()
    c = client(kubelet)
    c.refresh()
    src = JobSource(Problems(logging.getLogger("t")), None, cgroups=False, kubelet=c)
    busy, idle = src.poll(
        0.0,
        [GpuSample(0.0, 0, "GPU-a", "a", processes=(GpuProcess(1, None),)), GpuSample(0.0, 1, "GPU-b", "b")],
    )
    assert busy.unattributed == "kubelet-unavailable" and idle.unattributed == "no-process"
    assert [s.source for s in src.status if not s.up] == ["kubernetes"]
