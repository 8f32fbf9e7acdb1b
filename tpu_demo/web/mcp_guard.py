"""The MCP door under the same guard as the page and the API.

Gradio's MCP server (``/gradio_api/mcp/``, streamable HTTP) runs a tool of a queued event through an
HTTP loopback: its own ``gradio_client`` joins the queue from inside the server, forwarding the MCP
request's headers. So without this module every MCP caller would reach the admission limits as
127.0.0.1 (or as whatever ``X-Forwarded-For`` it sent, which the loopback's trusted peer would make
uvicorn believe), and all of them as one session.

``McpGuard`` sits in front of both requests of a tool call:

1. The MCP request (``POST /gradio_api/mcp/`` with JSON-RPC ``tools/call`` of a device tool): the
   caller's address is the one uvicorn resolved for this request (the TCP peer, or ``X-Forwarded-For``
   only from a trusted proxy, ``FORWARDED_ALLOW_IPS``). The limits are checked for that address and a
   session of the call's own; past one, the call gets a tool error with the reason (no loopback at
   all). Admitted, the call gets a server-issued token in ``MCP_CALL_HEADER`` (any copy the caller
   sent is replaced) and a place among the joining requests until its loopback join arrives. When the
   MCP request's connection closes early (the client cancelled or went away), its run is stopped;
   so is it when the same address sends MCP's ``notifications/cancelled`` naming the call's JSON-RPC id
   (Gradio's MCP server is stateless: each POST is a session of its own, so the SDK's own handling of
   a cancel never reaches the call).
2. The loopback join: a valid token is claimed (once) and the join's address is rewritten to the MCP
   caller's, so the admission check, Gradio's queue, the limits of later callers and the handlers all
   see the real address; the token stays as the call's session and Stop identity (web/callers.py).

A token header anywhere else, or a claimed or unknown one, is removed. Gradio's legacy SSE transport
(``/gradio_api/mcp/sse``) is closed: its POST answers before the tool runs, so neither a refusal nor
a cancel could be tied to the call.
"""

from __future__ import annotations

import json
import logging
import secrets
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Collection

from tpu_demo.web.admission import (AdmissionGate, Receive, Scope, Send, is_join, json_response, read_body,
                                    replay_body)
from tpu_demo.web.callers import MCP_CALL_HEADER
from tpu_demo.web.gradio_queue import QueuedEvent

log = logging.getLogger("tpu_demo.requests")

#: where Gradio serves streamable HTTP (``GradioMCPServer.handle_streamable_http``)
MCP_PATHS = ("/gradio_api/mcp", "/gradio_api/mcp/http")
#: Gradio's legacy SSE transport: closed here
SSE_PATHS = ("/gradio_api/mcp/sse", "/gradio_api/mcp/messages")
#: seconds an issued token may wait for its loopback join
TOKEN_SECONDS = 120.0
_HEADER = MCP_CALL_HEADER.encode()


@dataclass
class McpCall:
    """One admitted tool call: the caller's real address, and its place until its join arrives."""

    token: str
    client_host: str | None
    tool: str
    placeholder: QueuedEvent
    issued: float


class McpCalls:
    """The tokens issued to tool calls in flight; each is claimed by one loopback join at most. Also the
    running calls by (caller address, JSON-RPC id), which is what a ``notifications/cancelled`` names."""

    def __init__(self) -> None:
        self._calls: dict[str, McpCall] = {}
        self._running: dict[tuple[str | None, str], list[str]] = {}
        self._lock = threading.Lock()

    @staticmethod
    def _call_id(client_host: str | None, request_id: Any) -> tuple[str | None, str]:
        return client_host, json.dumps(request_id)  # JSON-RPC ids keep their type: 1 is not "1"

    def running(self, client_host: str | None, request_id: Any, key: str) -> None:
        with self._lock:
            self._running.setdefault(self._call_id(client_host, request_id), []).append(key)

    def finished(self, client_host: str | None, request_id: Any, key: str) -> None:
        with self._lock:
            keys = self._running.get(self._call_id(client_host, request_id), [])
            if key in keys:
                keys.remove(key)
            if not keys:
                self._running.pop(self._call_id(client_host, request_id), None)

    def running_key(self, client_host: str | None, request_id: Any) -> str | None:
        """The Stop key of the call ``request_id`` that ``client_host`` has running; None for anyone else's,
        and None when that address runs two calls with that id (clients behind one address each count
        from 0 or 1, and a stateless server cannot tell whose cancel it is: it stops neither)."""
        with self._lock:
            keys = self._running.get(self._call_id(client_host, request_id), [])
            return keys[0] if len(keys) == 1 else None

    def issue(self, client_host: str | None, tool: str) -> McpCall:
        token = secrets.token_urlsafe(24)
        call = McpCall(token, client_host, tool, QueuedEvent(f"mcp:{token}", client_host, running=False),
                       time.monotonic())
        with self._lock:
            self._calls[token] = call
        return call

    def claim(self, token: str) -> McpCall | None:
        """The call this join belongs to (then never again); None for a forged, stale or used token."""
        with self._lock:
            call = self._calls.pop(token, None)
        return call if call is not None and time.monotonic() - call.issued < TOKEN_SECONDS else None

    def drop(self, token: str) -> None:
        with self._lock:
            self._calls.pop(token, None)


def _path(scope: Scope) -> str:
    return scope.get("path", "").rstrip("/")


def _without_token(scope: Scope) -> Scope:
    headers = scope.get("headers", [])
    if not any(key.lower() == _HEADER for key, _ in headers):
        return scope
    return dict(scope, headers=[(key, value) for key, value in headers if key.lower() != _HEADER])


def _token(scope: Scope) -> str | None:
    return next((value.decode("latin-1") for key, value in scope.get("headers", []) if key.lower() == _HEADER), None)


def _message(body: bytes, method: str) -> dict[str, Any] | None:
    """The JSON-RPC message in ``body`` if it is one of ``method``, else None."""
    try:
        message = json.loads(body)
    except ValueError:
        return None
    return message if isinstance(message, dict) and message.get("method") == method else None


def _tool_call(body: bytes) -> tuple[Any, str, Any] | None:
    """(JSON-RPC id, tool name, arguments) of a ``tools/call`` message, else None."""
    message = _message(body, "tools/call")
    if message is None:
        return None
    params = message.get("params")
    name = params.get("name") if isinstance(params, dict) else None
    return (message.get("id"), name, params.get("arguments") or {}) if isinstance(name, str) else None


def _cancelled_id(body: bytes) -> Any:
    """The ``requestId`` of a ``notifications/cancelled`` message, else None."""
    message = _message(body, "notifications/cancelled")
    params = message.get("params") if message is not None else None
    return params.get("requestId") if isinstance(params, dict) else None


#: JSON Schema types in the words of the tools' own checks ("num_images: must be ...")
_TYPE_WORDS = {"integer": "a whole number", "number": "a number", "string": "text", "boolean": "true or false",
               "object": "an object", "array": "a list"}


def argument_problem(schema: dict[str, Any], arguments: Any) -> str | None:
    """The first argument ``schema`` (the tool's ``inputSchema``) refuses, named as the tools name a bad
    value (``num_images: must be a whole number, got "many"``); None when the arguments fit.

    The MCP server validates the same schema before a tool runs, but its message names no argument
    ("Input validation error: 'many' is not of type 'integer'").
    """
    import jsonschema

    if not isinstance(arguments, dict):
        return "arguments: must be an object of named arguments"
    validator = jsonschema.validators.validator_for(schema)(schema)
    error = min(validator.iter_errors(arguments), key=lambda e: [str(part) for part in e.path], default=None)
    if error is None:
        return None
    if error.validator == "required":
        missing = next((name for name in error.validator_value if name not in arguments), "arguments")
        return f"{missing}: required"
    name = str(error.path[0]) if error.path else "arguments"
    spec = schema.get("properties", {}).get(name, {})
    options = spec.get("anyOf") or spec.get("oneOf") or [spec]  # Gradio writes ``int | None`` as oneOf
    types = [option.get("type") for option in options]
    words = [_TYPE_WORDS[kind] for kind in types if kind in _TYPE_WORDS]
    if not words:
        return f"{name}: {error.message}"
    optional = " (or left out)" if "null" in types else ""
    return f"{name}: must be {' or '.join(words)}{optional}, got {json.dumps(error.instance)[:40]}"


class McpGuard:
    """ASGI middleware: MCP tool calls under the admission limits by the caller's real address.

    ``gate`` is the admission middleware's (one share per client, whichever door); ``tools`` every
    tool answered (calls to other endpoints are refused); ``guarded_tools`` those that run the device;
    ``on_gone`` stops the run of a caller key (``mcp:<token>``).
    """

    def __init__(self, app: Callable, gate: AdmissionGate, tools: Collection[str], guarded_tools: Collection[str],
                 on_gone: Callable[[str], Any], calls: McpCalls | None = None,
                 input_schema: Callable[[str], dict[str, Any] | None] | None = None):
        self.app = app
        #: a tool's ``inputSchema`` as the MCP server lists it (None: not known; the server checks alone)
        self.input_schema = input_schema or (lambda tool: None)
        self.gate = gate
        self.tools = tuple(tools)
        self.guarded_tools = frozenset(guarded_tools)
        self.on_gone = on_gone
        self.calls = calls or McpCalls()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope.get("type") != "http":
            await self.app(scope, receive, send)
            return
        path = _path(scope)
        if path.endswith(SSE_PATHS) or any(part in path for part in (s + "/" for s in SSE_PATHS)):
            await json_response(send, 404, {"detail": "this server's MCP transport is streamable HTTP at "
                                                      "/gradio_api/mcp/ (the SSE transport is closed)"})
            return
        token = _token(scope)
        scope = _without_token(scope)
        if scope.get("method") == "POST" and path.endswith(MCP_PATHS):
            await self._mcp_request(scope, receive, send)
        elif token and scope.get("method") == "POST" and is_join(scope):
            await self._loopback_join(token, scope, receive, send)
        else:
            await self.app(scope, receive, send)

    async def _mcp_request(self, scope: Scope, receive: Receive, send: Send) -> None:
        body, more = await read_body(receive)
        client_host = (scope.get("client") or (None, None))[0]
        cancelled = None if more else _cancelled_id(body)
        if cancelled is not None:
            key = self.calls.running_key(client_host, cancelled)
            if key is not None:
                self.on_gone(key)  # the client cancelled its own call: the run stops at its next step
            # answered by the MCP server as any notification (202); a cancel of no call of this caller's does nothing
            await self.app(scope, replay_body(body, more, receive), send)
            return
        call = None if more else _tool_call(body)
        if call is not None and call[1] not in self.tools:
            # Gradio would call any public endpoint by its function's name, the page's own ones too
            await _tool_error(send, call[0], f"unknown tool {call[1][:40]!r}; the tools here: {', '.join(self.tools)}")
            return
        schema = self.input_schema(call[1]) if call is not None else None
        problem = argument_problem(schema, call[2]) if schema else None
        if problem:  # refused before the admission limits, as the tools' own validation is
            log.info(json.dumps({"event": "request", "outcome": "invalid", "via": "mcp", "tool": call[1],
                                 "reason": problem.split(":")[0]}))
            await _tool_error(send, call[0], problem)
            return
        if call is None or call[1] not in self.guarded_tools:
            await self.app(scope, replay_body(body, more, receive), send)
            return
        request_id, tool, _ = call
        issued = self.calls.issue(client_host, tool)
        reason = await self.gate.admit(issued.placeholder.session_hash, client_host)
        if reason is not None:
            self.calls.drop(issued.token)
            log.info(json.dumps({"event": "request", "outcome": "busy", "via": "mcp", "tool": tool,
                                 "reason": reason.split(";")[0]}))
            await _tool_error(send, request_id, reason)
            return
        self.gate.joining.append(issued.placeholder)
        key = f"mcp:{issued.token}"
        scope = dict(scope, headers=[*scope.get("headers", []), (_HEADER, issued.token.encode())])
        replay = replay_body(body, False, receive)

        async def watch() -> dict[str, Any]:
            message = await replay()
            if message.get("type") == "http.disconnect":
                self.on_gone(key)  # the client cancelled or went away: its run stops at its next step
            return message

        self.calls.running(client_host, request_id, key)
        try:
            await self.app(scope, watch, send)
        finally:
            self.calls.finished(client_host, request_id, key)
            self._release(issued)
            self.on_gone(key)  # the call is over; a run still going for it has nobody to answer

    async def _loopback_join(self, token: str, scope: Scope, receive: Receive, send: Send) -> None:
        call = self.calls.claim(token)
        if call is None:
            await self.app(scope, receive, send)  # not a live call's: joins as what it is
            return
        # hand the call's place to the join with no await in between: the admission check that follows
        # counts the join instead of the placeholder, and no other call can slip into the gap
        self._release(call)
        scope = dict(scope, client=(call.client_host, 0),
                     headers=[*scope.get("headers", []), (_HEADER, token.encode())])
        await self.app(scope, receive, send)

    def _release(self, call: McpCall) -> None:
        if call.placeholder in self.gate.joining:
            self.gate.joining.remove(call.placeholder)
        self.calls.drop(call.token)


async def _tool_error(send: Send, request_id: Any, text: str) -> None:
    """A JSON-RPC answer to ``tools/call``: a tool error with ``text`` (what Gradio's tools return)."""
    content = json.dumps({"jsonrpc": "2.0", "id": request_id,
                          "result": {"content": [{"type": "text", "text": text}], "isError": True}}).encode()
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(content)).encode())]})
    await send({"type": "http.response.body", "body": content})
