"""Background warmups, coalesced: at most one pending per (model, mode), one running at a time.

Switching model or mode on the page starts a warmup of every bucket. Without this a visitor
could queue warmups faster than the device compiles them (minutes per bucket on TPU); here a
repeated ask returns the warmup already pending, and warmups wait for each other, so a request
waits for at most one bucket's warmup job on the device thread.
"""

from __future__ import annotations

import logging
import threading
from typing import Callable

from tpu_demo.core.modes import ExecutionMode

log = logging.getLogger("tpu_demo.engine")


class WarmupLane:
    def __init__(self):
        self._pending: dict[tuple[str, ExecutionMode], threading.Thread] = {}
        self._lock = threading.Lock()
        self._lane = threading.Lock()

    def start(self, model_id: str, mode: ExecutionMode, warm: Callable[[], object]) -> threading.Thread:
        """Run ``warm`` in the background, unless a warmup of (model, mode) is already pending."""
        key = (model_id, mode)
        with self._lock:
            pending = self._pending.get(key)
            if pending is not None and pending.is_alive():
                return pending

            def run() -> None:
                try:
                    with self._lane:
                        warm()
                except Exception:  # noqa: BLE001 - bucket states already say what failed
                    log.exception("background warmup of %s failed", model_id)
                finally:
                    with self._lock:
                        if self._pending.get(key) is threading.current_thread():
                            del self._pending[key]

            thread = threading.Thread(target=run, name=f"warmup-{model_id}-{mode.value}", daemon=True)
            self._pending[key] = thread
            thread.start()
        return thread

    def pending(self) -> list[tuple[str, str]]:
        """(model, mode) of every warmup pending or running."""
        with self._lock:
            return [(model, mode.value) for (model, mode), thread in self._pending.items() if thread.is_alive()]
