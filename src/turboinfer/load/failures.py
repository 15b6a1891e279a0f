"""How a load test names what went wrong, shared by the HTTP and gRPC clients.

A request's failure is a short kind ("timeout", "connection", "http_503",
"grpc_UNAVAILABLE"); ``ErrorLog`` keeps the first message of each kind for the report.
``ServerError`` is the one-line error for a server that cannot be used at all.
"""

from __future__ import annotations

from turboinfer.errors import TurboinferError

TIMEOUT = "timeout"
CONNECTION = "connection"


class ServerError(TurboinferError):
    """The server cannot be reached or does not answer as an OIP server should."""

    exit_code = 1
    http_status = 502
    grpc_code = "UNAVAILABLE"
    error_type = "server_error"


class ErrorLog:
    """The first message of each error kind: enough to explain, bounded in memory."""

    def __init__(self) -> None:
        self.first: dict[str, str] = {}

    def note(self, kind: str, message: str) -> str:
        if kind not in self.first:
            self.first[kind] = message
        return kind
