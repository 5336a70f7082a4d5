"""A kubelet's pod-resources API for the tests: a real gRPC server (grpcio) on a unix socket,
serving `v1.PodResourcesLister/List` from the same api.proto gpumon's client is generated from.
What it answers is set by the test: pods and their devices, a delay (a slow kubelet), an error,
or bytes that do not parse (a malformed answer); it can be stopped and started again on the same
socket (a kubelet restarting)."""

from __future__ import annotations

import os
import threading
import time
from concurrent import futures
from dataclasses import dataclass, field

import grpc

from gpumon.collect.sources.podresources import api_pb2, api_pb2_grpc


@dataclass
class Pod:
    namespace: str
    name: str
    containers: dict[str, list[tuple[str, list[str]]]]
    """container -> [(resource name, device ids)]"""


@dataclass
class Behaviour:
    pods: list[Pod] = field(default_factory=list)
    delay_s: float = 0.0
    error: grpc.StatusCode | None = None
    malformed: bool = False
    calls: int = 0


class _Lister(api_pb2_grpc.PodResourcesListerServicer):
    def __init__(self, b: Behaviour) -> None:
        self.b = b

    def List(self, request, context):
        self.b.calls += 1
        if self.b.delay_s:
            time.sleep(self.b.delay_s)
        if self.b.error is not None:
            context.abort(self.b.error, "injected")
        resp = api_pb2.ListPodResourcesResponse()
        for pod in self.b.pods:
            pr = resp.pod_resources.add(name=pod.name, namespace=pod.namespace)
            for cname, devices in pod.containers.items():
                c = pr.containers.add(name=cname)
                for resource, ids in devices:
                    c.devices.add(resource_name=resource, device_ids=ids)
        return resp


def _malformed_handler(b: Behaviour) -> grpc.GenericRpcHandler:
    """Answers List with bytes that are not a ListPodResourcesResponse."""

    def raw(request: bytes, context) -> bytes:  # type: ignore[no-untyped-def]
        b.calls += 1
        return b"\xff\xff\xff\xff\x0fnot a protobuf"

    handler = grpc.unary_unary_rpc_method_handler(raw, request_deserializer=None, response_serializer=None)

    class Generic(grpc.GenericRpcHandler):
        def service(self, handler_call_details):  # type: ignore[no-untyped-def]
            if handler_call_details.method == "/v1.PodResourcesLister/List":
                return handler
            return None

    return Generic()


class FakeKubelet:
    def __init__(self, socket_path: str) -> None:
        self.socket_path = socket_path
        self.behaviour = Behaviour()
        self._server: grpc.Server | None = None
        self._lock = threading.Lock()

    def start(self) -> None:
        with self._lock:
            if os.path.exists(self.socket_path):
                os.unlink(self.socket_path)
            server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
            if self.behaviour.malformed:
                server.add_generic_rpc_handlers((_malformed_handler(self.behaviour),))
            else:
                api_pb2_grpc.add_PodResourcesListerServicer_to_server(_Lister(self.behaviour), server)
            server.add_insecure_port(f"unix://{self.socket_path}")
            server.start()
            self._server = server

    def stop(self) -> None:
        with self._lock:
            if self._server is not None:
                self._server.stop(grace=None)
                self._server = None

    def restart(self, malformed: bool | None = None) -> None:
        self.stop()
        if malformed is not None:
            self.behaviour.malformed = malformed
        self.start()
