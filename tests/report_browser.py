"""Open an HTML report in headless Chromium with the network cut off, and say what
happened: console errors, requests that left the file, charts drawn, a screenshot.

Chromium comes from the system (Debian's ``chromium`` package, installed by
``scripts/install-browser.sh``); playwright drives it without downloading a browser of
its own. A missing browser fails the test: the reports are only tested if it runs.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass, field
from pathlib import Path

from playwright.sync_api import ConsoleMessage, Page, Route, sync_playwright
from playwright.sync_api import TimeoutError as PlaywrightTimeout

# Plotly draws each chart into an <svg class="main-svg"> inside .plot-container.
CHART_SVG = ".js-plotly-plot .plot-container .main-svg"
# Generous: the page inlines ~5 MB of plotly.js and shares two cores with other tests.
LOAD_TIMEOUT_MS = 120_000


@dataclass
class Rendered:
    console_errors: list[str] = field(default_factory=list)
    outside_requests: list[str] = field(default_factory=list)
    failed_requests: list[str] = field(default_factory=list)
    charts: int = 0
    traces: list[int] = field(default_factory=list)   # scatter traces drawn, per chart
    tables: int = 0
    hover_text: str = ""


def chromium() -> str:
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    assert path, "chromium is not installed: run scripts/install-browser.sh"
    return path


def render(report: Path, screenshot: Path, *, charts: int) -> Rendered:
    """Load ``report`` from disk, wait for ``charts`` Plotly charts, save a full-page
    screenshot, then hover the first point of the first chart."""
    seen = Rendered()
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium())
        try:
            context = browser.new_context(offline=True, viewport={"width": 1280, "height": 900})
            page = context.new_page()
            _watch(page, seen)
            page.goto(report.as_uri(), wait_until="load", timeout=LOAD_TIMEOUT_MS)
            page.wait_for_function(f"document.querySelectorAll({CHART_SVG!r}).length >= {charts}",
                                   timeout=LOAD_TIMEOUT_MS)
            seen.charts = page.locator(".js-plotly-plot").count()
            seen.traces = page.eval_on_selector_all(
                ".js-plotly-plot",
                "plots => plots.map(p => p.querySelectorAll('.scatterlayer .trace').length)")
            seen.tables = page.locator("table").count()
            page.screenshot(path=str(screenshot), full_page=True)
            seen.hover_text = _hover_first_point(page)
        finally:
            browser.close()
    return seen


def _watch(page: Page, seen: Rendered) -> None:
    def on_console(message: ConsoleMessage) -> None:
        if message.type == "error":
            seen.console_errors.append(message.text)

    def on_route(route: Route) -> None:
        # Anything but the report file itself would need a network: refuse and record it.
        if route.request.url.startswith("file://"):
            route.continue_()
        else:
            seen.outside_requests.append(route.request.url)
            route.abort()

    page.on("console", on_console)
    page.on("pageerror", lambda error: seen.console_errors.append(str(error)))
    page.on("requestfailed", lambda request: seen.failed_requests.append(request.url))
    page.route("**/*", on_route)


def _hover_first_point(page: Page) -> str:
    """Move the mouse onto the first marker of the first chart; Plotly's hover label
    text, or "" when none appeared."""
    point = page.locator(".js-plotly-plot").first.locator(".scatterlayer .points path").first
    point.scroll_into_view_if_needed()
    box = point.bounding_box()
    if box is None:
        return ""
    page.mouse.move(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
    label = page.locator(".hoverlayer .hovertext").first
    try:
        label.wait_for(timeout=10_000)
    except PlaywrightTimeout:  # no hover label: the caller's assertion reports it
        return ""
    return label.text_content() or ""
