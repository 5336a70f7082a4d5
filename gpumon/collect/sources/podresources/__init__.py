"""Stubs for the kubelet's pod-resources API v1, generated from api.proto by grpc_tools.protoc
(the command is in api.proto and docs/kubernetes.md). Imported only by gpumon.collect.sources.kubelet,
and only with the `k8s` extra installed."""
