"""The shared progress display: a live bar on a terminal, plain lines in a log."""

from __future__ import annotations

import io
import time

from turboinfer.progress import ProgressDisplay


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_log_lines_count_steps_and_estimate_the_rest() -> None:
    log = io.StringIO()
    with ProgressDisplay(stream=log, log_every_s=0) as display:
        display.stage("preparing")
        display.step_done("onnxruntime batch 1", done=1, total=4)
        display.step_done("onnxruntime batch 2", done=2, total=4)
        display.stage("[4/4] torch batch 2")
    lines = log.getvalue().splitlines()
    assert lines[0].endswith("] preparing")
    assert "[1/4] onnxruntime batch 1" in lines[1]
    assert "[2/4] onnxruntime batch 2" in lines[2] and "eta" in lines[2]
    assert "[4/4] torch batch 2" in lines[3]


def test_a_quick_run_leaves_a_log_alone() -> None:
    # A command that fails at once must leave only its one-line error on stderr.
    log = io.StringIO()
    with ProgressDisplay(stream=log, log_every_s=3600) as display:
        display.stage("preparing")
        display.update("ok 10 requests")
    assert log.getvalue() == ""


def test_a_long_stage_gets_heartbeat_lines() -> None:
    log = io.StringIO()
    with ProgressDisplay(stream=log, log_every_s=0.05) as display:
        display.stage("building int8-static")
        deadline = time.monotonic() + 30
        while "still running" not in log.getvalue() and time.monotonic() < deadline:
            time.sleep(0.02)
    assert "building int8-static, still running" in log.getvalue()


def test_updates_in_a_log_are_throttled() -> None:
    log = io.StringIO()
    with ProgressDisplay(stream=log, log_every_s=0) as display:
        display.update("ok 1")
    assert "ok 1" in log.getvalue()
    log = io.StringIO()
    with ProgressDisplay(stream=log, log_every_s=3600) as display:
        display.stage("[1/2] first")
        display.update("ok 1")
    assert log.getvalue() == ""


def test_disabled_writes_nothing() -> None:
    log = Terminal()
    with ProgressDisplay(stream=log, enabled=False) as display:
        display.stage("preparing")
    assert log.getvalue() == ""


def test_terminal_gets_a_live_bar() -> None:
    screen = Terminal()
    with ProgressDisplay(stream=screen) as display:
        display.stage("[1/3] graph")
        display.step_done("graph done", done=1, total=3)
    assert "graph done" in screen.getvalue() and "1/3" in screen.getvalue()
