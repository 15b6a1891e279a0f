"""What the scale-out tests borrow from tests/serve: its server starter, model builders
and HTTP conformance tests (one copy each, shared with the fault scenarios)."""

from __future__ import annotations

from serve_modules import serve_module

serve_fixtures = serve_module("serve_fixtures", "conftest.py")
http_conformance = serve_module("serve_http_conformance", "test_http.py")
