"""Domain errors. Each carries the CLI exit code and the HTTP status it maps to.

The CLI prints ``error: <message>`` on one line and exits with ``exit_code``; the server
answers ``{"error": "<message>"}`` with ``http_status``. Messages name the problem and
the thing that caused it (file, model, input, key), never a traceback.

``reply_for(exc)`` is the one mapping from any exception to what a front door sends: the
OIP HTTP and gRPC doors and the OpenAI-compatible LLM door each shape its body their own
way, from the same status, gRPC code, type and message.
"""

from __future__ import annotations

from dataclasses import dataclass


class TurboinferError(Exception):
    """Base of every error turboinfer raises on purpose."""

    exit_code: int = 2
    http_status: int = 400
    grpc_code: str = "INVALID_ARGUMENT"  # a grpc.StatusCode name
    error_type: str = "invalid_request_error"  # OpenAI's error "type"
    retry_after_s: float | None = None  # sent as Retry-After with 429/503
    param: str | None = None  # the request field at fault, when known (OpenAI's "param")

    def __init__(self, message: str, *, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        if param is not None:
            self.param = param

    def __str__(self) -> str:
        return self.message


class UnknownModelError(TurboinferError):
    """A model reference names nothing: an unknown builtin, a missing file or folder."""

    http_status = 404
    grpc_code = "NOT_FOUND"
    error_type = "not_found_error"


class ModelLoadError(TurboinferError):
    """A model file exists but cannot be read or compiled (corrupt, unsupported op...)."""

    http_status = 422


class InvalidInputError(TurboinferError):
    """An input tensor of the wrong name, shape, dtype or size."""

    http_status = 400


class MissingDependencyError(TurboinferError):
    """An optional engine or package is not installed; the message names the extra."""

    http_status = 501
    grpc_code = "UNIMPLEMENTED"
    error_type = "not_implemented_error"


class ConfigError(TurboinferError):
    """A settings value or configuration file that cannot be used."""

    http_status = 400


class UnavailableError(TurboinferError):
    """Temporarily cannot serve: queue full, draining, model not ready."""

    http_status = 503
    grpc_code = "UNAVAILABLE"
    error_type = "service_unavailable_error"
    retry_after_s: float | None = 1.0


class RequestTimeoutError(UnavailableError):
    """A request's deadline (its ``timeout``, or the model's ``default_timeout_ms``) passed
    before its answer, in the queue or while the engine ran it. 504, not 503: the server
    took too long, and retrying at once would wait behind the same work."""

    http_status = 504
    grpc_code = "DEADLINE_EXCEEDED"
    error_type = "timeout_error"
    retry_after_s = None


class TooManyRequestsError(TurboinferError):
    """The waiting queue is full: try again after ``retry_after_s``."""

    http_status = 429
    grpc_code = "RESOURCE_EXHAUSTED"
    error_type = "rate_limit_error"
    retry_after_s = 1.0


class UnauthorizedError(TurboinferError):
    """A missing or wrong API key."""

    http_status = 401
    grpc_code = "UNAUTHENTICATED"
    error_type = "authentication_error"


class PayloadTooLargeError(TurboinferError):
    """A request body over the server's configured size limit."""

    http_status = 413
    grpc_code = "RESOURCE_EXHAUSTED"
    error_type = "invalid_request_error"


class InferenceError(TurboinferError):
    """The engine failed while running a batch for reasons other than the inputs."""

    http_status = 500
    grpc_code = "INTERNAL"
    error_type = "server_error"


@dataclass(frozen=True)
class ErrorReply:
    """What a front door sends for a failed request, before it shapes the body."""

    http_status: int
    grpc_code: str
    error_type: str
    message: str
    retry_after_s: float | None = None

    def headers(self) -> dict[str, str]:
        """Extra HTTP headers: Retry-After on 429 and 503."""
        if self.retry_after_s is None:
            return {}
        return {"Retry-After": str(max(1, round(self.retry_after_s)))}


def reply_for(exc: BaseException) -> ErrorReply:
    """The one mapping from an exception to a reply. A domain error keeps its message;
    anything else is an internal error whose message names the exception's type."""
    if isinstance(exc, TurboinferError):
        return ErrorReply(exc.http_status, exc.grpc_code, exc.error_type, exc.message,
                          exc.retry_after_s)
    return ErrorReply(500, "INTERNAL", "server_error",
                      f"internal error: {type(exc).__name__}: {exc}")
