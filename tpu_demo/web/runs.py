"""One registry of the generations admitted to the device, and one way to stop them.

The guard registers a run at admission; its handler claims it by the ticket header and ends it (one
operator log line). Every way of stopping (Stop, ``/cancel``, MCP cancel, a closed stream, the time
limit, SIGTERM) calls ``Run.stop``; the engine sees the run's flag at its next step.
"""

from __future__ import annotations

import enum
import secrets
import threading
import time
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Iterable, Iterator

import gradio as gr

from tpu_demo.core.events import StepProgress, Stopped
from tpu_demo.core.request import GenerationRequest, RequestError
from tpu_demo.web.admission import AdmissionLimits, QueuedEvent, busy_reason
from tpu_demo.web.callers import RUN_HEADER, header, stop_key
from tpu_demo.web.outputs import user_error
from tpu_demo.web.request_log import RequestRecord


#: seconds a stopped run that no handler claimed is kept (a handler starting just as it stopped finds it)
UNCLAIMED_STOPPED_SECONDS = 30.0


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


@dataclass(eq=False)
class Run:
    """One admitted request: who owns it, where it stands, its stop flag and its log record."""

    ticket: str
    #: what the per-session limit counts (``callers.session_key``) and Gradio's own session hash
    session: str
    session_hash: str | None
    #: whose Stop reaches it (``callers.stop_key``); None: nobody's but its own cancel
    owner: str | None
    client_host: str | None
    joined: float = field(default_factory=time.monotonic)
    #: Gradio's id of the queue event (what ``/cancel`` names), once the join has answered
    event_id: str | None = None
    #: (caller address, JSON-RPC id) of an MCP tool call (what ``notifications/cancelled`` names)
    mcp_call: tuple[str | None, str] | None = None
    started: float | None = None
    #: counted as on the device by the queue bound (its handler runs and its first image has begun)
    running: bool = False
    stop_flag: threading.Event = field(default_factory=threading.Event)
    stop_reason: StopReason | None = None
    stopped_at: float | None = None
    record: RequestRecord = field(default_factory=RequestRecord)
    deadline: float | None = None

    def stop(self, reason: StopReason) -> None:
        """The one way a run is stopped: the engine ends it at its next step; the first reason is kept."""
        if self.stop_reason is None:
            self.stop_reason, self.stopped_at = reason, time.monotonic()
        self.stop_flag.set()

    def stop_message(self, event: Stopped, total: int, timeout: float | None) -> str:
        """What to tell the caller about a request that ended early (an error, never a success)."""
        done = f"{event.completed} of {total} images finished"
        if self.stop_reason is StopReason.TIMEOUT:
            return (f"Time limit: this request generated for longer than {timeout:g} s "
                    f"and was stopped ({done}). Try fewer steps or images.")
        if self.stop_reason is StopReason.SHUTDOWN:
            return f"The server is shutting down; this request was stopped ({done}). Try again in a minute."
        if self.stop_reason is StopReason.DISCONNECTED:
            return f"The client disconnected; this request was stopped ({done})."
        return f"Stopped ({event.reason}): {done}."


class Runs:
    """The registry: admission counts it, handlers claim from it, every stop goes through ``Run.stop``."""

    def __init__(self, limits: AdmissionLimits = AdmissionLimits(),
                 settings: SupervisionSettings = SupervisionSettings()):
        self.limits = limits
        self.settings = settings
        self.shutting_down = False
        self._runs: dict[str, Run] = {}
        self._lock = threading.Lock()
        self._watch = threading.Thread(target=self._watch_deadlines, name="run-deadlines", daemon=True)
        self._watch.start()

    # ---- admission (the guard) -----------------------------------------------------------------
    def admit(self, session_hash: str | None, owner: str | None, client_host: str | None) -> Run | str:
        """A new run for this caller, or why it must wait its turn (the limits, checked and counted at once)."""
        session = owner or (str(session_hash) if session_hash else "")
        with self._lock:
            counted = [QueuedEvent(run.session, run.client_host, run.running) for run in self._runs.values()
                       if not (run.started is None and run.stop_flag.is_set())]  # dropped by Gradio, or soon
            reason = busy_reason(self.limits, session or None, client_host, counted)
            if reason is not None:
                return reason
            run = self._new_run(session, session_hash, owner, client_host)
        if self.shutting_down:
            run.stop(StopReason.SHUTDOWN)
        return run

    def _new_run(self, session: str, session_hash: str | None, owner: str | None, client_host: str | None) -> Run:
        """A run registered under a fresh ticket (the caller holds the lock)."""
        run = Run(ticket=secrets.token_urlsafe(18), session=session, session_hash=session_hash, owner=owner,
                  client_host=client_host)
        self._runs[run.ticket] = run
        return run

    def joined(self, ticket: str, event_id: str | None) -> None:
        """Gradio queued the run's event under ``event_id``."""
        run = self._runs.get(ticket)
        if run is not None and isinstance(event_id, str):
            run.event_id = event_id

    def drop_unclaimed(self, ticket: str) -> None:
        """The request was refused or answered without its handler running: its place is freed."""
        with self._lock:
            run = self._runs.get(ticket)
            if run is not None and run.started is None:
                del self._runs[ticket]

    # ---- the handler's side ----------------------------------------------------------------------
    def checked(self, request: Any, validate: Callable[[], GenerationRequest]) -> GenerationRequest:
        """The validated request; a refusal is logged, frees the caller's place and is raised naming the field."""
        try:
            return validate()
        except RequestError as error:
            ticket = header(getattr(request, "headers", None), RUN_HEADER)
            with self._lock:
                run = self._runs.pop(ticket, None) if ticket else None
            record = RequestRecord(outcome="invalid", error=str(error))
            if run is not None:
                record.queue_wait_seconds = round(time.monotonic() - run.joined, 4)
                if run.event_id:
                    record.request_id = run.event_id
            record.emit()
            raise user_error(str(error), "Invalid input") from None

    def supervise(self, request: Any, generation: GenerationRequest,
                  start: Callable[[GenerationRequest, threading.Event], Iterator[Any]], failure: str,
                  files: Any = None, images: int | None = None) -> Iterator[Any]:
        """The skeleton every device handler shares: claim the run, pass the engine's events on (after a
        ``Stopped`` one, raise the error telling how many images were done), end with one log line.
        ``images``: the run's count when not the request's (Compare); ``files``: logged encode time."""
        run = self.claim(request, replace(generation, num_images=images) if images else generation)
        outcome = error = None
        try:
            for event in start(generation, run.stop_flag):
                self.observe(run, event)
                yield event
                if isinstance(event, Stopped):
                    outcome = (run.stop_reason or StopReason.USER).value
                    raise user_error(run.stop_message(event, run.record.request.num_images,
                                                      self.settings.request_timeout), "Stopped")
        except gr.Error:
            raise
        except Exception as failed:  # noqa: BLE001 - EngineError carries a user-safe message
            outcome, error = "failed", str(failed)
            raise user_error(str(failed), failure) from None
        finally:
            run.record.encode_seconds = getattr(files, "encode_seconds", 0.0)
            self.finish(run, outcome, error)

    def claim(self, request: Any, generation: GenerationRequest) -> Run:
        """The run of the handler's request (by its ticket header); a run of its own for a caller that
        came in without one (a handler called directly), counted from now."""
        headers = getattr(request, "headers", None)
        ticket = header(headers, RUN_HEADER)
        with self._lock:
            run = self._runs.get(ticket) if ticket else None
            if run is None or run.started is not None:
                session_hash = getattr(request, "session_hash", None)
                owner = stop_key(session_hash, headers)
                run = self._new_run(owner or "", session_hash, owner, getattr(getattr(request, "client", None), "host", None))
            run.started = time.monotonic()
        run.record.started = time.perf_counter()
        run.record.request = generation
        run.record.queue_wait_seconds = round(run.started - run.joined, 4)
        if self.shutting_down:
            run.stop(StopReason.SHUTDOWN)
        return run

    def observe(self, run: Run, event: Any) -> None:
        run.running = True
        run.record.observe(event)
        limit = self.settings.request_timeout
        if limit and run.deadline is None and isinstance(event, StepProgress):
            run.deadline = time.monotonic() + limit

    def finish(self, run: Run, outcome: str | None = None, error: str | None = None) -> None:
        """The handler ended (normally, stopped, failed, or closed because its client left): one log line."""
        with self._lock:
            if self._runs.pop(run.ticket, None) is None:
                return
        record = run.record
        if outcome is not None:
            record.outcome, record.error = outcome, error
        elif record.request is not None and record.images_done < record.request.num_images:
            record.outcome = (run.stop_reason or StopReason.DISCONNECTED).value
        run.stop_flag.set()  # nothing listens any more: free the device
        if run.event_id:
            record.request_id = run.event_id
        record.emit(self.settings.log_prompts)

    # ---- the ways of stopping ---------------------------------------------------------------------
    def _select(self, keep: Callable[[Run], bool]) -> list[Run]:
        with self._lock:
            return [run for run in self._runs.values() if keep(run)]  # admission order: a dict keeps it

    def stop_owner(self, owner: str | None) -> None:
        """Stop: the owner's oldest run (it stops at its next step; a waiting one as soon as it starts)."""
        runs = [run for run in self._select(lambda run: run.owner == owner) if not run.stop_flag.is_set()] if owner else []
        if runs:
            runs[0].stop(StopReason.USER)

    def stop_event(self, event_id: str) -> bool:
        """``/cancel`` of a queue event (its id is known only to the client that submitted it)."""
        return self._stop(self._select(lambda run: run.event_id == event_id), StopReason.DISCONNECTED)

    def stop_ticket(self, ticket: str, reason: StopReason = StopReason.DISCONNECTED) -> bool:
        return self._stop(self._select(lambda run: run.ticket == ticket), reason)

    def stop_mcp_call(self, client_host: str | None, request_id: str,
                      reason: StopReason = StopReason.DISCONNECTED) -> bool:
        """``notifications/cancelled`` from ``client_host``: only when the id names exactly one of its calls
        (clients behind one address each count from 0 or 1; a stateless server cannot tell whose it is)."""
        runs = self._select(lambda run: run.mcp_call == (client_host, request_id))
        return self._stop(runs, reason) if len(runs) == 1 else False

    def session_gone(self, session_hash: str, owner: str | None) -> None:
        """A stream of the session closed: the runs there of ``owner`` (``callers.stop_key``) stop, and those
        of a caller that proved nothing (its cookie may have come with its join's answer)."""
        self._stop(self._select(lambda run: run.session_hash == session_hash and run.owner in (owner, None)),
                   StopReason.DISCONNECTED)

    def stop_all(self, reason: StopReason = StopReason.SHUTDOWN) -> None:
        self.shutting_down = self.shutting_down or reason is StopReason.SHUTDOWN
        self._stop(self._select(lambda run: True), reason)

    @staticmethod
    def _stop(runs: Iterable[Run], reason: StopReason) -> bool:
        runs = list(runs)
        for run in runs:
            run.stop(reason)
        return bool(runs)

    # ---- counts -------------------------------------------------------------------------------------
    def __iter__(self) -> Iterator[Run]:
        return iter(self._select(lambda run: True))

    def active(self) -> int:
        """Requests whose handler runs."""
        return len(self._select(lambda run: run.started is not None))

    def waiting(self) -> int:
        """Requests admitted and not yet on the device (in Gradio's queue or in a handler waiting for it)."""
        return len(self._select(lambda run: not run.running))

    def _watch_deadlines(self) -> None:
        """Stop runs past their time limit; forget runs Gradio dropped unclaimed (a cancel or a closed
        stream) once a handler can no longer be on its way to them. A run stopped by Stop while waiting
        stays until its handler claims it and ends at once."""
        while True:
            time.sleep(self.settings.poll_seconds)
            now = time.monotonic()
            for run in self._select(lambda run: run.deadline is not None and now > run.deadline):
                run.stop(StopReason.TIMEOUT)
            for run in self._select(lambda run: run.started is None and run.stop_reason is StopReason.DISCONNECTED
                                    and now - run.stopped_at > UNCLAIMED_STOPPED_SECONDS):
                self.drop_unclaimed(run.ticket)
