"""Engine threads that are still running when the server has stopped.

A request whose deadline passed while the engine ran it leaves its batch running on the
instance's thread: the engine call cannot be interrupted. If such a run is still going
once the server has drained and freed its models, the interpreter's exit must not wait
for it (a hung engine would never let the process end) and must not tear the runtime
down under it either: a thread that comes back from ONNX Runtime into a finalizing
interpreter aborts the whole process. So the process ends without that teardown, with
the status the server's clean stop gives it, after saying which runs it left behind.
"""

from __future__ import annotations

import atexit
import logging
import os
import sys
import threading
import weakref

log = logging.getLogger(__name__)

_threads: weakref.WeakSet[threading.Thread] = weakref.WeakSet()


def track(thread: threading.Thread) -> None:
    """Count ``thread`` (an instance's engine thread) among those checked at exit."""
    _threads.add(thread)


def running() -> list[str]:
    """Names of the engine threads still alive (a closed instance's thread ends once its
    current run returns)."""
    return sorted(thread.name for thread in list(_threads) if thread.is_alive())


def leave_running_engines() -> None:
    """Called once the server has stopped cleanly: if an engine run is still going,
    end the process at exit without the interpreter's teardown."""
    names = running()
    if names:
        log.warning("engine still running on %s after the server stopped; exiting "
                    "without waiting for it", ", ".join(names))
        atexit.register(_exit_now)


def _exit_now() -> None:
    if not running():  # the runs ended meanwhile: a normal exit is safe
        return
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    os._exit(0)
