"""gRPC's standard health service, ``grpc.health.v1.Health``, as vLLM's ``--grpc`` server
registers it beside VllmEngine for Kubernetes probes
(``vllm/entrypoints/launchers/grpc_server.py:111-113``; smg-grpc-servicer 0.14.1,
``smg_grpc_servicer/vllm/health_servicer.py``, ``health_frame.py``).

``Check`` answers SERVING for the server (``""``) and for VllmEngine, NOT_SERVING for
VllmEngine while the start-up duration runs (``/health/ready``'s 503), and NOT_FOUND for
any other service.  ``Watch`` sends the current status once and ends, as smg's frame
does (an unknown service is SERVICE_UNKNOWN there, not a status code).

The two messages (grpc/grpc ``src/proto/grpc/health/v1/health.proto``) are built here
from their descriptor, in a pool of llmsim's own, rather than taken from
``grpcio-health-checking``: one string field and one enum do not justify a dependency.
"""

from __future__ import annotations

from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

from llmsim.api.context import ApiContext
from llmsim.api.grpc.wire import GrpcError, StatusCode

__all__ = ["HEALTH_SERVICE", "HealthCheckRequest", "HealthCheckResponse", "check", "watch"]

HEALTH_SERVICE = "grpc.health.v1.Health"
ENGINE_SERVICE = "vllm.grpc.engine.VllmEngine"
SERVING, NOT_SERVING, SERVICE_UNKNOWN = 1, 2, 3


def _message_classes() -> tuple[Any, Any]:
    Field = descriptor_pb2.FieldDescriptorProto
    proto = descriptor_pb2.FileDescriptorProto(name="llmsim/grpc_health_v1.proto", package="grpc.health.v1")
    proto.syntax = "proto3"
    request = proto.message_type.add(name="HealthCheckRequest")
    request.field.add(name="service", number=1, type=Field.TYPE_STRING, label=Field.LABEL_OPTIONAL)
    response = proto.message_type.add(name="HealthCheckResponse")
    statuses = response.enum_type.add(name="ServingStatus")
    for number, name in enumerate(("UNKNOWN", "SERVING", "NOT_SERVING", "SERVICE_UNKNOWN")):
        statuses.value.add(name=name, number=number)
    response.field.add(
        name="status",
        number=1,
        type=Field.TYPE_ENUM,
        label=Field.LABEL_OPTIONAL,
        type_name=".grpc.health.v1.HealthCheckResponse.ServingStatus",
    )
    pool = descriptor_pool.DescriptorPool()
    pool.Add(proto)
    return tuple(
        message_factory.GetMessageClass(pool.FindMessageTypeByName(f"grpc.health.v1.{name}"))
        for name in ("HealthCheckRequest", "HealthCheckResponse")
    )


HealthCheckRequest, HealthCheckResponse = _message_classes()


def _status(ctx: ApiContext, service: str) -> int | None:
    """The status of ``service``; None for a service this server does not have."""
    if service == "":
        return SERVING
    if service != ENGINE_SERVICE:
        return None
    starting = ctx.clock() < ctx.started_at + ctx.startup_duration
    return NOT_SERVING if starting else SERVING


def check(ctx: ApiContext, request: Any) -> Any:
    status = _status(ctx, request.service)
    if status is None:
        raise GrpcError(StatusCode.NOT_FOUND, f"Unknown service: {request.service}")
    return HealthCheckResponse(status=status)


def watch(ctx: ApiContext, request: Any) -> Any:
    status = _status(ctx, request.service)
    return HealthCheckResponse(status=SERVICE_UNKNOWN if status is None else status)
