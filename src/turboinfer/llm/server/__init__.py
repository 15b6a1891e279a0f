"""The OpenAI-compatible HTTP server over the LLM engine (``turboinfer llm serve``)."""

from turboinfer.llm.server.server import Bound, run, serve
from turboinfer.llm.server.settings import ServerSettings

__all__ = ["Bound", "ServerSettings", "run", "serve"]
