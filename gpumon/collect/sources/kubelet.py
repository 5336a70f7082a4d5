"""Which pod holds which GPU, from the kubelet's pod-resources API (gRPC over a unix socket).

`PodResourcesLister.List` (v1) answers, for every pod on the node, the devices each container was
given by a device plugin. For the NVIDIA device plugin the device ids are GPU UUIDs (`GPU-...`),
MIG device UUIDs (`MIG-...`), replicas of a time-sliced GPU (`GPU-...::2`), or GPU indices with
`--device-id-strategy=index`; each is matched to a GPU by UUID or index.

The kubelet is asked by a thread of its own every `refresh_s`, with a deadline per call, never on
a tick and never on a scrape: a slow or restarting kubelet costs the sampler nothing. Its faults
(no socket, permission denied, a deadline passed, a restart, an answer that does not parse) leave
the GPUs' verdicts alone; attribution is marked down with the reason, logged once per cause.

Needs the `k8s` extra (grpcio, protobuf); `gpumon-datastall` without it never imports them.
"""

from __future__ import annotations

import logging
import os
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass

from gpumon.core.model import JobRef
from gpumon.core.problems import Problems
from gpumon.core.threads import named_thread

log = logging.getLogger("gpumon.kubelet")

DEFAULT_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"
DEFAULT_REFRESH_S = 10.0
CALL_DEADLINE_S = 2.0
GPU_RESOURCES = re.compile(r"^(nvidia\.com/(gpu|mig-[^/]+)|gpu\.nvidia\.com/.+)$")
"""Resource names that carry NVIDIA GPUs (whole GPUs, MIG profiles, shared ones)."""


@dataclass(frozen=True)
class PodDevice:
    namespace: str
    pod: str
    container: str
    resource: str
    device_id: str


@dataclass(frozen=True)
class KubeletView:
    """The pods' GPU devices as last listed, and how that went."""

    devices: tuple[PodDevice, ...] = ()
    up: bool = False
    reason: str | None = "not asked yet"


def parse_list_response(response: object) -> tuple[PodDevice, ...]:
    """A ListPodResourcesResponse -> the GPU devices each pod's containers hold."""
    out = []
    for pod in getattr(response, "pod_resources", ()):
        for container in pod.containers:
            for dev in container.devices:
                if not GPU_RESOURCES.match(dev.resource_name):
                    continue
                for device_id in dev.device_ids:
                    out.append(
                        PodDevice(pod.namespace, pod.name, container.name, dev.resource_name, device_id)
                    )
    return tuple(out)


def device_key(device_id: str) -> tuple[str, str]:
    """How a device id names a GPU: ("uuid", "GPU-..."/"MIG-...") or ("index", "3")."""
    base = device_id.split("::", 1)[0]  # time-slicing replicas: GPU-xxxx::0, GPU-xxxx::1
    if base.isascii() and base.isdigit():  # ("²" is a digit to isdigit, and no GPU's index)
        return "index", base
    return "uuid", base


def pod_ref(d: PodDevice) -> JobRef:
    return JobRef(
        "kubernetes", f"{d.namespace}/{d.pod}", None, None, "pod-resources", d.namespace, d.pod, d.container
    )


class KubeletClient:
    """Lists pod resources on a timer, in its own thread; `view` is the latest result."""

    def __init__(
        self,
        problems: Problems,
        socket_path: str = DEFAULT_SOCKET,
        refresh_s: float = DEFAULT_REFRESH_S,
        deadline_s: float = CALL_DEADLINE_S,
        lister: Callable[[float], object] | None = None,
    ) -> None:
        self.problems = problems
        self.socket_path = socket_path
        self.refresh_s = refresh_s
        self.deadline_s = deadline_s
        self.view = KubeletView()
        self._lister = lister
        self._channel: object | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._refreshed = threading.Event()

    def start(self) -> None:
        if self._thread is None:
            self._thread = named_thread(self._loop, "gpumon-kubelet")
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        channel = self._channel
        if channel is not None:
            channel.close()  # type: ignore[attr-defined]

    def wait_refreshed(self, timeout: float) -> bool:
        """For tests and start-up: wait for the next finished refresh."""
        self._refreshed.clear()
        return self._refreshed.wait(timeout)

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.refresh()
            self._refreshed.set()
            self._stop.wait(self.refresh_s)

    def refresh(self) -> None:
        try:
            devices = parse_list_response(self._list())
        except _KubeletDown as e:
            self.view = KubeletView(self.view.devices if self.view.up else (), False, str(e))
            self.problems.note(f"kubernetes:{e.cause}", f"kubernetes: {e}")
            return
        self.view = KubeletView(devices, True, None)
        self.problems.clear_prefix("kubernetes:")

    def _list(self) -> object:
        if self._lister is not None:
            return self._lister(self.deadline_s)
        if not os.path.exists(self.socket_path):
            raise _KubeletDown(
                "socket", f"no kubelet socket at {self.socket_path} (is it mounted into the pod?)"
            )
        if not os.access(self.socket_path, os.R_OK | os.W_OK):
            raise _KubeletDown(
                "permission", f"permission denied on {self.socket_path} (run as root, or mount it read-write)"
            )
        try:
            # here, not at the top: the kubelet's gRPC API (extra k8s): only where a kubelet is asked
            import grpc

            # here, not at the top: generated gRPC stubs (extra k8s): only where a kubelet is asked
            from gpumon.collect.sources.podresources import api_pb2, api_pb2_grpc
        except ImportError as e:
            raise _KubeletDown(
                "extra", f"the k8s extra is not installed ({e.name}): pip install 'gpumon-datastall[k8s]'"
            ) from None
        if self._channel is None:
            # grpcio logs its own traceback for an answer it cannot decode, at every refresh; gpumon
            # says what is wrong once (_KubeletDown), so its log is gpumon's lines only
            logging.getLogger("grpc._common").setLevel(logging.CRITICAL)
            self._channel = grpc.insecure_channel(f"unix://{self.socket_path}")
        stub = api_pb2_grpc.PodResourcesListerStub(self._channel)  # type: ignore[no-untyped-call]
        request = api_pb2.ListPodResourcesRequest()  # type: ignore[attr-defined]
        try:
            return stub.List(request, timeout=self.deadline_s)
        except grpc.RpcError as e:
            code = e.code() if hasattr(e, "code") else None
            name = getattr(code, "name", "UNKNOWN")
            detail = e.details() if hasattr(e, "details") else str(e)
            if name == "DEADLINE_EXCEEDED":
                raise _KubeletDown(
                    "slow", f"the kubelet did not answer within {self.deadline_s:g} s"
                ) from None
            if name == "UNAVAILABLE":
                raise _KubeletDown(
                    "unavailable",
                    f"the kubelet is unavailable (restarting?): {detail}",
                ) from None
            if name == "INTERNAL" and ("pars" in str(detail).lower() or "deserializ" in str(detail).lower()):
                raise _KubeletDown(
                    "malformed", "the kubelet's answer cannot be read as a pod-resources list"
                ) from None
            raise _KubeletDown(name.lower(), f"the kubelet answered {name}: {detail}") from None
        except Exception as e:  # a malformed answer fails in the deserializer, outside grpc's errors
            raise _KubeletDown(
                "malformed", f"the kubelet's answer cannot be read: {type(e).__name__}: {e}"
            ) from None


class _KubeletDown(Exception):
    def __init__(self, cause: str, message: str) -> None:
        self.cause = cause
        super().__init__(message)
