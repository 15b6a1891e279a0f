"""Where a server listens: parsed once from the user's URL."""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import urlsplit

from turboinfer.errors import ConfigError

DEFAULT_PORTS = {"http": 8000, "grpc": 8001}


@dataclass(frozen=True)
class Endpoint:
    """``http://host:port/prefix`` or ``host:port`` (gRPC)."""

    scheme: str
    host: str
    port: int
    base_path: str = ""

    @classmethod
    def parse(cls, url: str, *, protocol: str = "http") -> Endpoint:
        text = url if "://" in url else f"{protocol}://{url}"
        parts = urlsplit(text)
        if parts.scheme not in DEFAULT_PORTS:
            raise ConfigError(f"unsupported URL scheme in {url!r}: use http:// or grpc://")
        if not parts.hostname:
            raise ConfigError(f"no host in URL {url!r}")
        try:
            port = parts.port or DEFAULT_PORTS[parts.scheme]
        except ValueError:
            raise ConfigError(f"bad port in URL {url!r}") from None
        return cls(parts.scheme, parts.hostname, port, parts.path.rstrip("/"))

    @property
    def host_header(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def url(self) -> str:
        return f"{self.scheme}://{self.host}:{self.port}{self.base_path}"
