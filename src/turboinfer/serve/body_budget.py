"""A cap on the request-body bytes held at once, all connections together.

Each body limit bounds one request; this bounds their sum, so a burst of large requests
is refused at once (503 with Retry-After) instead of taking the machine's memory. A
request reserves its declared Content-Length before its body is read (the limit when the
length is not declared) and returns it once answered.
"""

from __future__ import annotations

from turboinfer.errors import UnavailableError


class BodyBudget:
    __slots__ = ("limit", "used")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0

    def take(self, size: int) -> int:
        """Reserve ``size`` bytes or refuse the request; returns what to give back."""
        if self.used and self.used + size > self.limit:  # one alone always passes
            raise UnavailableError(f"too many request bytes in flight ({self.used} of "
                                   f"{self.limit}); retry later")
        self.used += size
        return size

    def give(self, size: int) -> None:
        self.used -= size
