"""One log line for each HTTP request the server refuses as the client's fault, or
answers with its timeout: status, method, path and the error the client got. Never a
traceback (that is for the server's own failures), never more than one line: the path
and message can carry the client's bytes, so control characters are escaped and the
line is cut at ``MAX_CHARS``. Overload rejections (429/503) are counted in the metrics
instead: a burst would otherwise write a line per refused request.
"""

from __future__ import annotations

import logging
import re

from turboinfer.errors import TurboinferError, reply_for

log = logging.getLogger("turboinfer.serve.requests")

MAX_CHARS = 300
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def logged(status: int) -> bool:
    """Client errors but overload (429), and timeouts (504)."""
    return (400 <= status < 500 and status != 429) or status == 504


def refused(method: str, path: str, status: int, message: str) -> None:
    """Log the one line for a request answered ``status`` with ``message``, if its
    status is one that is logged."""
    if logged(status):
        log.warning("%s", one_line(f"{status} {method} {path}: {message}"))


def refused_with(method: str, path: str, exc: BaseException) -> None:
    """``refused`` for a request answered with ``exc``: a domain error only; any other
    exception is the server's own failure, logged with its traceback where caught."""
    if isinstance(exc, TurboinferError):
        reply = reply_for(exc)
        refused(method, path, reply.http_status, reply.message)


def one_line(text: str) -> str:
    """``text`` with control characters escaped, at most ``MAX_CHARS`` long."""
    text = _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", text)
    return text if len(text) <= MAX_CHARS else text[:MAX_CHARS - 3] + "..."
