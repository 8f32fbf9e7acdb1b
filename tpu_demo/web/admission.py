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

The address is the connecting peer as uvicorn reports it; behind a reverse proxy uvicorn takes it
from ``X-Forwarded-For`` when the proxy's address is in ``FORWARDED_ALLOW_IPS`` (default
127.0.0.1), so a proxy on the same host works as is.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections import Counter
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Collection, Iterable

from tpu_demo.web.gradio_queue import QueuedEvent

log = logging.getLogger("tpu_demo.requests")

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]

#: a request that just ended can still be listed for a moment (Gradio clears it after telling the
#: client), so a refusal is re-checked for this long before it is sent
_RECHECK_SECONDS = 0.5

#: request bodies larger than this are not inspected for a session hash (the address still counts)
_MAX_JOIN_BODY = 1 << 20


@dataclass(frozen=True)
class AdmissionLimits:
    """0 turns a limit off."""

    max_waiting: int = 32
    max_per_session: int = 1
    max_per_ip: int = 4


def busy_reason(limits: AdmissionLimits, session_hash: str | None, client_host: str | None,
                current: Iterable[QueuedEvent]) -> str | None:
    """Why a new request from this client must wait its turn, or None to admit it."""
    sessions: Counter[str] = Counter()
    hosts: Counter[str] = Counter()
    waiting = 0
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


def _is_join(scope: Scope) -> bool:
    if scope.get("type") != "http" or scope.get("method") != "POST":
        return False
    path = scope.get("path", "")
    return path.endswith("/gradio_api/queue/join") or "/gradio_api/call/" in path


class AdmissionMiddleware:
    """ASGI middleware in front of Gradio's ``/queue/join`` and ``/call/<api>`` routes.

    ``current_events`` returns the limited endpoint's requests the queue holds now; ``fn_ids``
    its handler ids (the ``fn_index`` of a join). Joins that are being handed to Gradio but not
    queued yet count too, so two joins that arrive together cannot both slip past.
    """

    def __init__(self, app: Callable, limits: AdmissionLimits, api_names: str | Collection[str],
                 current_events: Callable[[], Iterable[QueuedEvent]], fn_ids: Callable[[], set[int]]):
        self.app = app
        self.limits = limits
        #: every generation endpoint (generate, compare_modes): they share the device and one client's share
        self.api_names = frozenset({api_names} if isinstance(api_names, str) else api_names)
        self.current_events = current_events
        self.fn_ids = fn_ids
        self._joining: list[QueuedEvent] = []

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if not _is_join(scope):
            await self.app(scope, receive, send)
            return
        body, more = await _read_body(receive)
        if not self._limited(scope, body, more):
            await self.app(scope, _replay(body, more, receive), send)
            return
        session_hash = _json_field(body, "session_hash") if not more else None
        client_host = (scope.get("client") or (None, None))[0]
        reason = self._busy(session_hash, client_host)
        for _ in range(int(_RECHECK_SECONDS / 0.05)):
            if reason is None:
                break
            await asyncio.sleep(0.05)
            reason = self._busy(session_hash, client_host)
        if reason is not None:
            log.info(json.dumps({"event": "request", "outcome": "busy", "reason": reason.split(";")[0]}))
            await _json_response(send, 503, {"detail": reason})
            return
        joining = QueuedEvent(session_hash=session_hash or "", client_host=client_host, running=False)
        self._joining.append(joining)
        try:
            await self.app(scope, _replay(body, more, receive), send)
        finally:
            self._joining.remove(joining)


    def _limited(self, scope: Scope, body: bytes, more: bool) -> bool:
        path = scope.get("path", "")
        if "/gradio_api/call/" in path:
            return path.rstrip("/").rsplit("/", 1)[-1] in self.api_names
        fn_index = _json_field(body, "fn_index") if not more else None
        # only a join that names another handler passes unchecked; unreadable ones count, to be safe
        return not isinstance(fn_index, int) or fn_index in self.fn_ids()

    def _busy(self, session_hash: str | None, client_host: str | None) -> str | None:
        return busy_reason(self.limits, session_hash, client_host, [*self.current_events(), *self._joining])


async def _read_body(receive: Receive) -> tuple[bytes, bool]:
    """The request body up to _MAX_JOIN_BODY; ``more`` is True if it goes on past that."""
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
        if size > _MAX_JOIN_BODY:
            return b"".join(chunks), True


def _replay(body: bytes, more: bool, receive: Receive) -> Receive:
    sent = False

    async def replay() -> dict[str, Any]:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": more}
        return await receive()

    return replay


def _json_field(body: bytes, name: str) -> Any:
    try:
        value = json.loads(body).get(name)
    except (ValueError, AttributeError):
        return None
    return value if value not in ("", None) and not isinstance(value, (dict, list)) else None


async def _json_response(send: Send, status: int, payload: dict[str, Any]) -> None:
    content = json.dumps(payload).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(content)).encode()),
                            (b"retry-after", b"10")]})
    await send({"type": "http.response.body", "body": content})
