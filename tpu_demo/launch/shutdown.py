"""Graceful shutdown on SIGTERM (what container runtimes and systemd send before killing).

The running request is stopped at its next denoising step (its user is told the server is
shutting down; finished images were already streamed), the HTTP server closes the way Gradio
closes it on Ctrl-C, and the process exits with status 0 once the device is idle, or after
``grace_seconds`` at the latest.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import threading
import time
from typing import Iterator

from tpu_demo.core.engine_api import EngineAPI
from tpu_demo.web.runs import Runs, StopReason


log = logging.getLogger("tpu_demo")


@contextlib.contextmanager
def stop_on_sigterm(runs: Runs, engine: EngineAPI, grace_seconds: float = 30.0) -> Iterator[None]:
    """Run the body (the blocking ``launch``) so that SIGTERM ends it cleanly."""
    if threading.current_thread() is not threading.main_thread():
        yield  # signal handlers can only be set from the main thread
        return
    received = threading.Event()

    def on_sigterm(signum: int, frame: object) -> None:
        if received.is_set():
            return
        received.set()
        log.info("SIGTERM: stopping the running request and closing the server")
        runs.stop_all(StopReason.SHUTDOWN)
        raise KeyboardInterrupt  # Gradio's launch() closes its server on this

    previous = signal.signal(signal.SIGTERM, on_sigterm)
    try:
        yield
    except KeyboardInterrupt:
        if not received.is_set():
            raise
    finally:
        signal.signal(signal.SIGTERM, previous)
        if received.is_set():
            idle = _wait_for_device(runs, engine, grace_seconds)
            engine.close()
            log.info("shut down %s", "cleanly" if idle else f"with a request still running after {grace_seconds:g} s")


def _wait_for_device(runs: Runs, engine: EngineAPI, grace_seconds: float) -> bool:
    """Until every request has ended, or the device has been idle for a second (a handler whose
    server already stopped is never resumed to end its run), or ``grace_seconds`` pass."""
    deadline = time.monotonic() + grace_seconds
    idle_since: float | None = None
    while runs.active() and time.monotonic() < deadline:
        if engine.status().busy:
            idle_since = None
        elif idle_since is None:
            idle_since = time.monotonic()
        elif time.monotonic() - idle_since > 1.0:
            return True
        time.sleep(0.05)
    return not engine.status().busy
