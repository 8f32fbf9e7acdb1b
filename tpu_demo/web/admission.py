"""Admission of generation requests: how many may wait, and how many one client may hold.

Gradio's queue has a total bound (``max_size``) but no per-client one, so one script could fill
the whole queue; and its bound counts every event, so with a full queue even the Stop button of
the user whose image is running was refused. This ASGI middleware therefore checks each queue
join for the generate endpoint before Gradio sees it (other events, like Stop, always pass):
at most ``max_waiting`` generations wait, and each browser session / API client and each
address holds at most so many waiting or running. Past a limit it answers what Gradio's full
queue answers, HTTP 503, so the browser shows "This application is currently busy. Please try
again." and gradio_client raises ``QueueError("Queue is full! Please try again.")``; the JSON
``detail`` says which limit was hit. Nothing is counted by hand: current requests are read from
Gradio's queue itself (gradio_queue.py), so a request that ends, is cancelled or loses its
client frees its place without bookkeeping here.

Every other call of an event handler (``/run/...``, ``/api/...``, the queue join of any handler)
passes through here too, for one check: its ``data`` must be a JSON list with one value per input
(a missing or extra value gets HTTP 422 naming the input), and the body at most 1 MiB.
``/run/`` and ``/api/`` of queued events (Generate) are closed by Gradio (``api_open=False``).

The address is the connecting peer as uvicorn reports it; behind a reverse proxy uvicorn takes it
from ``X-Forwarded-For`` when the proxy's address is in ``FORWARDED_ALLOW_IPS`` (default
127.0.0.1), so a proxy on the same host works as is.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Collection, Iterable

from tpu_demo.web.callers import session_key
from tpu_demo.web.gradio_queue import EventInputs, QueuedEvent

log = logging.getLogger("tpu_demo.requests")

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]

#: a request that just ended can still be listed for a moment (Gradio clears it after telling the
#: client), so a refusal is re-checked for this long before it is sent
_RECHECK_SECONDS = 0.5

#: event calls carry a prompt and a few numbers (files go through /upload): larger bodies are refused
MAX_CALL_BODY = 1 << 20

#: seconds between two warmups one address may trigger by switching model or mode
WARMUP_INTERVAL_SECONDS = 10.0


class WarmupThrottle:
    """At most one visitor-triggered warmup per address every ``interval`` seconds.

    Keyed by address, not session: a session hash is whatever the caller sends.
    """

    def __init__(self, interval: float = WARMUP_INTERVAL_SECONDS):
        self.interval = interval
        self._last: dict[str, float] = {}
        self._lock = threading.Lock()

    def allow(self, client_host: str | None) -> bool:
        now = time.monotonic()
        key = client_host or "unknown"
        with self._lock:
            if len(self._last) > 4096:  # forget addresses whose interval is over
                self._last = {host: at for host, at in self._last.items() if now - at < self.interval}
            if now - self._last.get(key, -self.interval) < self.interval:
                return False
            self._last[key] = now
            return True


@dataclass(frozen=True)
class AdmissionLimits:
    """0 turns a limit off."""

    max_waiting: int = 32
    max_per_session: int = 1
    max_per_ip: int = 4


def busy_reason(limits: AdmissionLimits, session_hash: str | None, client_host: str | None,
                current: Iterable[QueuedEvent], device_waiting: int = 0) -> str | None:
    """Why a new request from this client must wait its turn, or None to admit it.

    ``device_waiting``: requests whose handler runs (Gradio counts them running) but none of
    whose images has reached the device yet; they wait too.
    """
    sessions: Counter[str] = Counter()
    hosts: Counter[str] = Counter()
    waiting = device_waiting
    for event in current:
        waiting += not event.running
        sessions[event.session_hash] += 1
        if event.client_host:
            hosts[event.client_host] += 1
    if limits.max_waiting and waiting >= limits.max_waiting:
        return f"busy: the queue is full ({waiting} requests waiting); try again in a minute"
    if limits.max_per_session and session_hash and sessions[session_hash] >= limits.max_per_session:
        return (f"busy: this session already has {sessions[session_hash]} request(s) waiting or running "
                f"(limit {limits.max_per_session}); try again when it has finished")
    if limits.max_per_ip and client_host and hosts[client_host] >= limits.max_per_ip:
        return (f"busy: your address already has {hosts[client_host]} request(s) waiting or running "
                f"(limit {limits.max_per_ip}); try again when one has finished")
    return None


def is_join(scope: Scope) -> bool:
    path = scope.get("path", "")
    return path.endswith("/gradio_api/queue/join") or "/gradio_api/call/" in path


def _is_event_call(scope: Scope) -> bool:
    """A POST that runs an event handler: a queue join, /call/, /run/ or /api/."""
    if scope.get("type") != "http" or scope.get("method") != "POST":
        return False
    path = scope.get("path", "")
    return is_join(scope) or "/gradio_api/run/" in path or "/gradio_api/api/" in path


def arity_error(inputs: EventInputs, data: Any, simple_format: bool = False) -> str | None:
    """Why ``data`` is not one value per input of the handler, naming the input; None if it is."""
    names = inputs.names
    takes = (f"{inputs.api_name or 'this event'} takes {len(names)} value(s): {', '.join(names)}" if names
             else f"{inputs.api_name or 'this event'} takes no values")
    if not isinstance(data, list):
        return f"data: must be a list of values; {takes}"
    expected = len(names) - inputs.server_side if simple_format and len(data) != len(names) else len(names)
    if len(data) < expected:
        return f"{names[len(data)]}: missing; {takes}"
    if len(data) > expected:
        return f"data: {len(data)} value(s), {len(data) - expected} too many; {takes}"
    return None


class AdmissionGate:
    """The limits and what they count, shared by every door that admits device work (this middleware
    and the MCP guard, web/mcp_guard.py), so one client's share is one share whichever door it uses.

    ``current_events`` returns the limited endpoints' requests the queue holds now; ``device_waiting``
    how many of the running ones still wait for the device (several generate handlers run at once;
    the device thread serialises their pipeline calls), so the queue bound keeps meaning "not yet on
    the device". ``joining`` holds requests admitted but not queued yet, so two that arrive together
    cannot both slip past.
    """

    def __init__(self, limits: AdmissionLimits, current_events: Callable[[], Iterable[QueuedEvent]],
                 device_waiting: Callable[[], int] = lambda: 0):
        self.limits = limits
        self.current_events = current_events
        self.device_waiting = device_waiting
        self.joining: list[QueuedEvent] = []

    def busy(self, session: str | None, client_host: str | None) -> str | None:
        """Why a new request of this session and address must wait its turn, or None."""
        return busy_reason(self.limits, session, client_host, [*self.current_events(), *self.joining],
                           self.device_waiting())

    async def admit(self, session: str | None, client_host: str | None) -> str | None:
        """``busy``, re-checked for a moment: a request that just ended can still be listed."""
        reason = self.busy(session, client_host)
        for _ in range(int(_RECHECK_SECONDS / 0.05)):
            if reason is None:
                break
            await asyncio.sleep(0.05)
            reason = self.busy(session, client_host)
        return reason


class AdmissionMiddleware:
    """ASGI middleware in front of Gradio's ``/queue/join`` and ``/call/<api>`` routes.

    ``gate`` holds the limits and counts; ``fn_ids`` returns the limited handlers' ids (the
    ``fn_index`` of a join). The session a join counts under is the owned one (web/callers.py).
    """

    def __init__(self, app: Callable, gate: AdmissionGate, api_names: str | Collection[str],
                 fn_ids: Callable[[], set[int]],
                 event_inputs: Callable[[Any, str | None], EventInputs | None] = lambda fn_index, api_name: None):
        self.app = app
        self.gate = gate
        #: every generation endpoint (generate, compare_modes, the MCP tools): one client's share covers them
        self.api_names = frozenset({api_names} if isinstance(api_names, str) else api_names)
        self.fn_ids = fn_ids
        self.event_inputs = event_inputs

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if not _is_event_call(scope):
            await self.app(scope, receive, send)
            return
        body, more = await read_body(receive)
        if more:
            await json_response(send, 413, {"detail": f"request body over {MAX_CALL_BODY >> 20} MiB; "
                                                       "event calls carry a prompt and a few values"})
            return
        refusal = self._arity(scope, body)
        if refusal is not None:
            if self._limited(scope, body):
                log.info(json.dumps({"event": "request", "outcome": "invalid", "error": refusal}))
            await json_response(send, 422, {"detail": refusal})
            return
        if not self._limited(scope, body):
            await self.app(scope, replay_body(body, False, receive), send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
        session = session_key(json_field(body, "session_hash"), headers)
        client_host = (scope.get("client") or (None, None))[0]
        reason = await self.gate.admit(session, client_host)
        if reason is not None:
            log.info(json.dumps({"event": "request", "outcome": "busy", "reason": reason.split(";")[0]}))
            await json_response(send, 503, {"detail": reason})
            return
        joining = QueuedEvent(session_hash=session, client_host=client_host, running=False)
        self.gate.joining.append(joining)
        try:
            await self.app(scope, replay_body(body, False, receive), send)
        finally:
            self.gate.joining.remove(joining)

    def _arity(self, scope: Scope, body: bytes) -> str | None:
        """A call whose ``data`` does not fit the handler it names; Gradio would answer it with no
        message (too few) or a crash (too many)."""
        try:
            payload = json.loads(body)
        except ValueError:
            return None  # Gradio answers malformed JSON with 422 itself
        if not isinstance(payload, dict) or "data" not in payload:
            return None
        path = scope.get("path", "").rstrip("/")
        api_name = path.rsplit("/", 1)[-1]
        if "/gradio_api/call/v2/" in path:
            return None  # named arguments: Gradio matches them to the inputs by name
        if "/gradio_api/call/" in path:
            inputs = self.event_inputs(None, api_name)
            return arity_error(inputs, payload["data"], simple_format=True) if inputs else None
        inputs = self.event_inputs(payload.get("fn_index"), None if path.endswith("/queue/join") else api_name)
        return arity_error(inputs, payload["data"]) if inputs else None

    def _limited(self, scope: Scope, body: bytes) -> bool:
        """Whether this call joins the queue for the limited endpoint (Generate)."""
        path = scope.get("path", "")
        if not is_join(scope):
            return False
        if "/gradio_api/call/" in path:
            return path.rstrip("/").rsplit("/", 1)[-1] in self.api_names
        fn_index = json_field(body, "fn_index")
        # only a join that names another handler passes unchecked; unreadable ones count, to be safe
        return not isinstance(fn_index, int) or fn_index in self.fn_ids()


class CancelRelay:
    """ASGI middleware that tells ``on_cancel`` the ``event_id`` of each ``POST /gradio_api/cancel``
    before Gradio handles it (Gradio can close a running generator only when it next yields).
    Event ids are random and known only to the client that submitted the event."""

    def __init__(self, app: Callable, on_cancel: Callable[[str], Any]):
        self.app = app
        self.on_cancel = on_cancel

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (scope.get("type") != "http" or scope.get("method") != "POST"
                or not scope.get("path", "").rstrip("/").endswith("/gradio_api/cancel")):
            await self.app(scope, receive, send)
            return
        body, more = await read_body(receive)
        event_id = None if more else json_field(body, "event_id")
        if isinstance(event_id, str):
            self.on_cancel(event_id)
        await self.app(scope, replay_body(body, more, receive), send)


async def read_body(receive: Receive) -> tuple[bytes, bool]:
    """The request body up to MAX_CALL_BODY; ``more`` is True if it goes on past that."""
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return b"".join(chunks), False
        chunk = message.get("body", b"")
        chunks.append(chunk)
        size += len(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks), False
        if size > MAX_CALL_BODY:
            return b"".join(chunks), True


def replay_body(body: bytes, more: bool, receive: Receive) -> Receive:
    sent = False

    async def replay() -> dict[str, Any]:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": more}
        return await receive()

    return replay


def json_field(body: bytes, name: str) -> Any:
    try:
        value = json.loads(body).get(name)
    except (ValueError, AttributeError):
        return None
    return value if value not in ("", None) and not isinstance(value, (dict, list)) else None


async def json_response(send: Send, status: int, payload: dict[str, Any]) -> None:
    content = json.dumps(payload).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(content)).encode()),
                            (b"retry-after", b"10")]})
    await send({"type": "http.response.body", "body": content})
