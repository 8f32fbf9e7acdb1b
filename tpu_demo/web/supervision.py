"""Watch each running request: stop it when its client goes away, its time is up, or the server
shuts down, and write its operator log line when it ends.

The engine stops a request through the request's stop flag (checked at every denoising step),
so the watch only has to set that flag: a small thread per running request polls "is the
client still connected" (Gradio marks the queue event dead when the client's stream closes)
and the time limit. The time limit counts denoising and decoding from the first finished step:
loading a model and compiling a cold bucket (once each, minutes on TPU) come before it and are
not held against the request that happens to trigger them.
"""

from __future__ import annotations

import enum
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

from tpu_demo.core.events import StepProgress, Stopped
from tpu_demo.core.request import GenerationRequest, RequestError
from tpu_demo.web.request_log import RequestRecord


class StopReason(str, enum.Enum):
    USER = "stopped"
    DISCONNECTED = "disconnected"
    TIMEOUT = "timeout"
    SHUTDOWN = "shutdown"


@dataclass(frozen=True)
class SupervisionSettings:
    #: seconds a request may run from its first denoising step; None: no limit
    request_timeout: float | None = None
    #: put prompts in the request log lines
    log_prompts: bool = False
    poll_seconds: float = 0.1


class SupervisedRun:
    """One running request: its stop flag, why it was stopped, and its log record."""

    def __init__(self, supervisor: "RequestSupervisor", request: GenerationRequest, stop: threading.Event,
                 request_id: str | None, queue_wait_seconds: float | None, connected: Callable[[], bool]):
        self.supervisor = supervisor
        self.stop = stop
        self.connected = connected
        self.record = RequestRecord(request=request, queue_wait_seconds=queue_wait_seconds)
        if request_id:
            self.record.request_id = request_id
        self.stop_reason: StopReason | None = None
        self.deadline: float | None = None  # set at the first finished step
        self._ended = threading.Event()
        self._closed = False
        self._watch = threading.Thread(target=self._watch_loop, name="request-watch", daemon=True)
        self._watch.start()

    # ---- called by the UI as events pass ------------------------------------------------------
    def observe(self, event: Any) -> None:
        self.record.observe(event)
        limit = self.supervisor.settings.request_timeout
        if limit and self.deadline is None and isinstance(event, StepProgress):
            self.deadline = time.monotonic() + limit

    def request_stop(self, reason: StopReason) -> None:
        if self.stop_reason is None:
            self.stop_reason = reason
        self.stop.set()

    def stopped(self, event: Stopped) -> None:
        self.record.outcome = (self.stop_reason or StopReason.USER).value

    def failed(self, message: str) -> None:
        self.record.outcome, self.record.error = "failed", message

    def stop_message(self, event: Stopped, total: int) -> str:
        """What to tell the caller about a request that ended early (an error, never a success)."""
        done = f"{event.completed} of {total} images finished"
        if self.stop_reason is StopReason.TIMEOUT:
            return (f"Time limit: this request generated for longer than {self.supervisor.settings.request_timeout:g} s "
                    f"and was stopped ({done}). Try fewer steps or images.")
        if self.stop_reason is StopReason.SHUTDOWN:
            return f"The server is shutting down; this request was stopped ({done}). Try again in a minute."
        if self.stop_reason is StopReason.DISCONNECTED:
            return f"The client disconnected; this request was stopped ({done})."
        return f"Stopped ({event.reason}): {done}."

    def close(self) -> None:
        """The request's handler ended (normally, by error, or closed because its client left)."""
        if self._closed:
            return
        self._closed = True
        self._ended.set()
        record = self.record
        if record.outcome == "ok" and record.request is not None and record.images_done < record.request.num_images:
            record.outcome = (self.stop_reason or StopReason.DISCONNECTED).value
        self.stop.set()  # nothing listens any more: free the device
        self.supervisor._finished(self)
        record.emit(self.supervisor.settings.log_prompts)

    # ---- the watch thread -----------------------------------------------------------------------
    def _watch_loop(self) -> None:
        poll = self.supervisor.settings.poll_seconds
        while not self._ended.wait(poll):
            if self.stop.is_set():
                continue  # stopping already; keep watching until the handler ends
            if not self.connected():
                self.request_stop(StopReason.DISCONNECTED)
            elif self.deadline is not None and time.monotonic() > self.deadline:
                self.request_stop(StopReason.TIMEOUT)


class RequestSupervisor:
    """Creates a SupervisedRun per request and can stop them all (SIGTERM)."""

    def __init__(self, settings: SupervisionSettings = SupervisionSettings()):
        self.settings = settings
        self._runs: list[SupervisedRun] = []
        self._lock = threading.Lock()
        self.shutting_down = False

    def begin(self, request: GenerationRequest, stop: threading.Event, request_id: str | None = None,
              queue_wait_seconds: float | None = None,
              connected: Callable[[], bool] = lambda: True) -> SupervisedRun:
        run = SupervisedRun(self, request, stop, request_id, queue_wait_seconds, connected)
        with self._lock:
            self._runs.append(run)
        if self.shutting_down:
            run.request_stop(StopReason.SHUTDOWN)
        return run

    def reject(self, error: RequestError, request_id: str | None = None,
               queue_wait_seconds: float | None = None) -> None:
        """Log a request refused by validation (it never reached the device)."""
        record = RequestRecord(outcome="invalid", error=str(error), queue_wait_seconds=queue_wait_seconds)
        if request_id:
            record.request_id = request_id
        record.emit()

    def active(self) -> int:
        with self._lock:
            return len(self._runs)

    def stop_all(self, reason: StopReason = StopReason.SHUTDOWN) -> None:
        self.shutting_down = self.shutting_down or reason is StopReason.SHUTDOWN
        with self._lock:
            runs = list(self._runs)
        for run in runs:
            run.request_stop(reason)

    def cancel(self, request_id: str) -> bool:
        """The client cancelled queue event ``request_id`` (Gradio's ``/cancel``, e.g. gradio_client's
        ``job.cancel()``): stop its run at the next step. Gradio itself can only close a generator
        handler when it next yields, which with previews off is when an image is done."""
        with self._lock:
            runs = [run for run in self._runs if run.record.request_id == request_id]
        for run in runs:
            run.request_stop(StopReason.DISCONNECTED)
        return bool(runs)

    def _finished(self, run: SupervisedRun) -> None:
        with self._lock:
            if run in self._runs:
                self._runs.remove(run)
