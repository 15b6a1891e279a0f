"""Domain errors. Each carries the CLI exit code and the HTTP status it maps to.

The CLI prints ``error: <message>`` on one line and exits with ``exit_code``; the server
answers ``{"error": "<message>"}`` with ``http_status``. Messages name the problem and
the thing that caused it (file, model, input, key), never a traceback.
"""

from __future__ import annotations


class TurboinferError(Exception):
    """Base of every error turboinfer raises on purpose."""

    exit_code: int = 2
    http_status: int = 400

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def __str__(self) -> str:
        return self.message


class UnknownModelError(TurboinferError):
    """A model reference names nothing: an unknown builtin, a missing file or folder."""

    http_status = 404


class ModelLoadError(TurboinferError):
    """A model file exists but cannot be read or compiled (corrupt, unsupported op...)."""

    http_status = 422


class InvalidInputError(TurboinferError):
    """An input tensor of the wrong name, shape, dtype or size."""

    http_status = 400


class MissingDependencyError(TurboinferError):
    """An optional engine or package is not installed; the message names the extra."""

    http_status = 501


class ConfigError(TurboinferError):
    """A settings value or configuration file that cannot be used."""

    http_status = 400


class UnavailableError(TurboinferError):
    """Temporarily cannot serve: queue full, draining, model not ready."""

    http_status = 503


class PayloadTooLargeError(TurboinferError):
    """A request body over the server's configured size limit."""

    http_status = 413


class InferenceError(TurboinferError):
    """The engine failed while running a batch for reasons other than the inputs."""

    http_status = 500
