"""The one door every HTTP request passes (an ASGI middleware in front of Gradio's app).

It issues the owner cookie; refuses a call, MCP message or cancel over 1 MiB (413), or one Gradio could
not read or match to a handler (422 naming why); admits device work, as the handler Gradio will run, at
every door only through ``Runs.admit`` (else HTTP 503 or an MCP tool error naming the limit), handing it
a server-issued ``RUN_HEADER`` (a caller's copy is removed); never takes a session hash as a credential;
and relays its owner's closed stream, ``/cancel`` and MCP cancels to the runs they name.
"""

from __future__ import annotations

import json
import logging
import secrets
import time
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Collection

from pydantic import TypeAdapter, ValidationError
from starlette.datastructures import QueryParams
from starlette.responses import JSONResponse

from tpu_demo.web.admission import MAX_CALL_BODY, EventInputs, arity_error
from tpu_demo.web.callers import OWNER_COOKIE, RUN_HEADER, SessionOwners, owner_of, stop_key
from tpu_demo.web.runs import Run, Runs, StopReason

log = logging.getLogger("tpu_demo.requests")

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]

_API = "/gradio_api/"
#: Gradio's legacy MCP SSE transport (answered before a tool runs, so neither a refusal nor a cancel could
#: reach the call) is closed; every other path under its MCP mount is MCP over streamable HTTP (Gradio
#: answers any that ends in /gradio_api/mcp)
SSE_ROUTES = ("mcp/sse", "mcp/messages")
_RUN_HEADER = RUN_HEADER.encode()
_FN_INDEX = TypeAdapter(int | None)


@dataclass(frozen=True)
class Route:
    """A request as Gradio's HTTP API names it: ``kind`` of route, the api name or event id it names."""

    kind: str  # join | call | call_stream | run | data | cancel | heartbeat | mcp | mcp_sse | other
    name: str = ""


def route_of(scope: Scope) -> Route:
    """Which of Gradio's public routes ``scope`` is (under any root path a proxy adds)."""
    path = scope.get("path", "").rstrip("/")
    at = path.find(_API)
    if at < 0:
        return Route("other")
    rest = path[at + len(_API):]
    parts = rest.split("/")
    if rest.startswith(SSE_ROUTES):
        return Route("mcp_sse")
    if rest == "mcp" or rest.startswith("mcp/"):
        return Route("mcp")
    if rest == "queue/join":
        return Route("join")
    if rest == "queue/data":
        return Route("data")
    if rest == "cancel":
        return Route("cancel")
    if parts[0] == "heartbeat" and len(parts) == 2:
        return Route("heartbeat", parts[1])
    if parts[0] == "call" and len(parts) >= 2:
        named = parts[2:] if parts[1] == "v2" else parts[1:]
        if len(named) == 1:
            return Route("call", named[0])
        if len(named) == 2:
            return Route("call_stream", named[1])
    if parts[0] in ("run", "api") and len(parts) == 2:
        return Route("run", parts[1])
    return Route("other")


class Guard:
    """ASGI middleware. ``guarded``: the api names that run the device; ``events()``: every handler's inputs
    by ``fn_index`` and api name; ``tools``: the MCP tools answered; ``input_schema(tool)``: a tool's schema."""

    def __init__(self, app: Callable, runs: Runs, guarded: Collection[str],
                 events: Callable[[], tuple[dict[int, EventInputs], dict[str, EventInputs]]],
                 tools: Collection[str] = (), input_schema: Callable[[str], dict | None] = lambda tool: None):
        self.app, self.runs, self.guarded = app, runs, frozenset(guarded)
        self.sessions = SessionOwners()
        self.events, self.tools, self.input_schema = events, tuple(tools), input_schema

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope.get("type") != "http":
            await self.app(scope, receive, send)
            return
        scope = dict(scope, headers=[(k, v) for k, v in scope.get("headers", []) if k.lower() != _RUN_HEADER])
        send = _with_owner_cookie(scope, send)
        route, method = route_of(scope), scope.get("method")
        if route.kind == "mcp_sse":
            await json_response(send, 404, {"detail": "this server's MCP transport is streamable HTTP at "
                                                      "/gradio_api/mcp/ (the SSE transport is closed)"})
        elif method == "POST" and route.kind in ("join", "call", "run", "mcp", "cancel"):
            arrived = time.perf_counter()
            body, more = await read_body(receive)
            payload = _json(body)
            if more:
                await json_response(send, 413, {"detail": f"request body over {MAX_CALL_BODY >> 20} MiB; "
                                                           "calls carry a prompt and a few values"})
            elif payload is TOO_DEEP:
                await json_response(send, 422, {"detail": "body: JSON nested too deeply"})
            elif (route.kind in ("join", "call", "cancel") and isinstance(payload, dict)
                  and not self._may_use(payload.get("session_hash"), scope)):
                await json_response(send, 403, {"detail": f"session_hash: {FOREIGN_SESSION}"})
            elif route.kind == "mcp" and not _utf8(body):  # the MCP server would answer 500
                await json_response(send, 400, {"jsonrpc": "2.0", "id": None,
                                                "error": {"code": -32700, "message": "Parse error: the body is not UTF-8"}})
            elif route.kind == "mcp":
                await self._mcp(scope, body, payload, receive, send)
            elif route.kind == "cancel":
                await self.app(scope, replay_body(self._cancel(payload, body), receive), send)
            else:
                await self._event_call(route, scope, body, payload, receive, send, arrived)
        elif method == "GET" and route.kind == "data":
            sessions = QueryParams(scope.get("query_string", b"")).getlist("session_hash")  # as Gradio reads it
            if len(sessions) > 1:
                await json_response(send, 422, {"detail": "session_hash: given more than once"})
                return
            session = sessions[0] if sessions else ""
            if not self._may_use(session, scope):
                await json_response(send, 403, {"detail": f"session_hash: {FOREIGN_SESSION}"})
                return
            owner = stop_key(session, _headers(scope))
            await _watched(self.app, scope, receive, send, lambda: self.runs.session_gone(session, owner))
        elif route.kind == "heartbeat" and not self._may_use(route.name, scope):
            await json_response(send, 403, {"detail": f"session_hash: {FOREIGN_SESSION}"})
        elif method == "GET" and route.kind == "call_stream":
            await _watched(self.app, scope, receive, send, lambda: self.runs.stop_event(route.name))
        else:
            await self.app(scope, receive, send)

    def _may_use(self, session_hash: Any, scope: Scope) -> bool:
        """Whether this caller may name ``session_hash`` at Gradio's queue (join, stream, cancel) or its
        heartbeat; its first use there with an owner cookie binds it. (``/run/`` handlers check their owner.)"""
        return self.sessions.allows(session_hash, owner_of(_headers(scope)))

    def _cancel(self, payload: Any, body: bytes) -> bytes:
        """Stop the run ``event_id`` names; Gradio's cancel then reaches only that event. (Gradio would also
        cancel the task of (session_hash, fn_index): any holder of a session hash could end another's run.)"""
        if not isinstance(payload, dict):
            return body
        if isinstance(payload.get("event_id"), str):
            self.runs.stop_event(payload["event_id"])
        return json.dumps({**payload, "fn_index": -1}).encode() if "fn_index" in payload else body

    # ---- page and API calls -------------------------------------------------------------------------
    async def _event_call(self, route: Route, scope: Scope, body: bytes, payload: Any, receive: Receive, send: Send,
                          arrived: float) -> None:
        fn_index = _fn_index(payload)
        inputs = self._inputs(route, fn_index)
        guarded = self._guarded(route, payload, inputs)
        refusal = (_session_problem(payload) or self._unknown(route, fn_index, inputs)
                   or self._arity(route, scope, payload, inputs))
        if refusal is not None:
            if guarded:
                log.info(json.dumps({"event": "request", "outcome": "invalid", "error": refusal}))
            await json_response(send, 422, {"detail": refusal})
            return
        if not guarded:
            await self.app(scope, replay_body(body, receive), send)
            return
        session_hash = json_field(body, "session_hash")
        owner = stop_key(session_hash, _headers(scope))
        run = await self._admit(session_hash if isinstance(session_hash, str) else None, owner, scope, send)
        if run is None:
            return
        run.record.admission_seconds = time.perf_counter() - arrived
        answer: dict[str, Any] = {}

        def queued() -> None:  # before the caller reads the event id, so its /cancel finds the run
            if route.kind != "run" and answer.get("status") == 200:
                self.runs.joined(run.ticket, json_field(answer.get("body", b""), "event_id"))

        inner_send = _recording(send, answer, on_complete=queued)
        replay = replay_body(body, receive)
        if route.kind == "run":  # answered when the handler ends: a closed connection stops it
            replay = _watching(replay, answer, lambda: self.runs.stop_ticket(run.ticket))
        try:
            await self.app(_with_ticket(scope, run.ticket), replay, inner_send)
        finally:
            if run.event_id is None:
                self.runs.drop_unclaimed(run.ticket)

    def _inputs(self, route: Route, fn_index: int | None) -> EventInputs | None:
        """The handler Gradio will run: a ``/call/`` names it; elsewhere the body's ``fn_index`` wins (Gradio
        reads it as pydantic does: "19" and 19.0 are 19), else ``/run/``'s name."""
        by_index, by_name = self.events()
        if route.kind == "call" or (route.kind == "run" and fn_index is None):
            return by_name.get(route.name)
        return by_index.get(fn_index) if fn_index is not None else None

    def _unknown(self, route: Route, fn_index: int | None, inputs: EventInputs | None) -> str | None:
        """A call naming no handler, or one with no Python function (Gradio would answer with a bare 500)."""
        if inputs is not None and not inputs.backend:
            return f"fn_index: event {fn_index if fn_index is not None else route.name[:40]} runs in the browser only"
        if inputs is not None:
            return None
        if fn_index is not None:
            return f"fn_index: no event {fn_index}"
        return f"api_name: no endpoint {route.name[:40]!r}" if route.kind in ("call", "run") else None

    def _guarded(self, route: Route, payload: Any, inputs: EventInputs | None) -> bool:
        """Whether the call runs the device; a join that names no handler counts, to be safe."""
        if route.kind == "join" and inputs is None:
            return True
        if route.kind == "run" and inputs is not None and inputs.queued:
            return False  # Gradio answers it: a queued event's direct route is closed (api_open=False)
        return inputs is not None and inputs.api_name in self.guarded

    @staticmethod
    def _arity(route: Route, scope: Scope, payload: Any, inputs: EventInputs | None) -> str | None:
        """A call whose ``data`` does not fit its handler (Gradio answers too few with no message, too many
        or an unknown name with a crash); ``/call/v2/`` takes the values by name, as the body itself."""
        if inputs is None or not isinstance(payload, dict):
            return None
        if "/call/v2/" in scope["path"]:
            return arity_error(inputs, payload, named=True)
        return arity_error(inputs, payload["data"], simple_format=route.kind == "call") if "data" in payload else None

    async def _admit(self, session_hash: str | None, owner: str | None, scope: Scope, send: Send,
                     mcp_id: Any = None) -> Run | None:
        client_host = (scope.get("client") or (None, None))[0]
        admitted = self.runs.admit(session_hash, owner, client_host)
        if isinstance(admitted, Run):
            return admitted
        fields = {"via": "mcp"} if mcp_id is not None else {}
        log.info(json.dumps({"event": "request", "outcome": "busy", **fields, "reason": admitted.split(";")[0]}))
        if mcp_id is not None:
            await tool_error(send, mcp_id[0], admitted)
        else:
            await json_response(send, 503, {"detail": admitted})
        return None

    # ---- MCP ----------------------------------------------------------------------------------------
    async def _mcp(self, scope: Scope, body: bytes, message: Any, receive: Receive, send: Send) -> None:
        method = message.get("method") if isinstance(message, dict) else None
        params = message.get("params") if isinstance(message, dict) else None
        params = params if isinstance(params, dict) else {}
        client_host = (scope.get("client") or (None, None))[0]
        if method == "notifications/cancelled":
            # Gradio's MCP server is stateless (each POST a session of its own): the SDK's own handling of
            # a cancel never reaches the call, so the caller's running call with that id is stopped here
            self.runs.stop_mcp_call(client_host, json.dumps(params.get("requestId")), StopReason.USER)
        tool = params.get("name") if method == "tools/call" else None
        if not isinstance(tool, str):
            await self.app(scope, replay_body(body, receive), send)
            return
        request_id = message.get("id")
        if tool not in self.tools:  # Gradio would call any public endpoint by its function's name
            await tool_error(send, request_id, f"unknown tool {tool[:40]!r}; the tools here: {', '.join(self.tools)}")
            return
        schema = self.input_schema(tool)
        problem = argument_problem(schema, params.get("arguments") or {}) if schema else None
        if problem:  # refused before the limits, as the tools' own validation is
            log.info(json.dumps({"event": "request", "outcome": "invalid", "via": "mcp", "tool": tool,
                                 "reason": problem.split(":")[0]}))
            await tool_error(send, request_id, problem)
            return
        if tool not in self.guarded:
            await self.app(scope, replay_body(body, receive), send)
            return
        run = await self._admit(None, None, scope, send, mcp_id=(request_id,))
        if run is None:
            return
        run.mcp_call = (client_host, json.dumps(request_id))  # JSON-RPC ids keep their type: 1 is not "1"
        # the client cancelled or went away: its run stops at its next step
        gone = _watching(replay_body(body, receive), {}, lambda: self.runs.stop_ticket(run.ticket, StopReason.USER))
        try:
            await self.app(_with_ticket(scope, run.ticket), gone, send)
        finally:
            self.runs.drop_unclaimed(run.ticket)


def event_table(blocks: Any) -> tuple[dict[int, EventInputs], dict[str, EventInputs]]:
    """Every handler's inputs by ``fn_index`` and by api name, from the page's public config and API info
    (a State input is server side; a handler the API does not list names its inputs by position)."""
    config = blocks.get_config_file()
    endpoints = blocks.get_api_info(all_endpoints=True)["named_endpoints"]
    states = {component["id"] for component in config["components"] if component.get("type") == "state"}
    by_index: dict[int, EventInputs] = {}
    for dependency in config["dependencies"]:
        inputs, api_name = dependency["inputs"], dependency.get("api_name")
        listed = iter(p["parameter_name"] for p in endpoints.get(f"/{api_name}", {}).get("parameters", []))
        names = tuple("state" if block in states else next(listed, f"input {n + 1}") for n, block in enumerate(inputs))
        by_index[dependency["id"]] = EventInputs(api_name, names, sum(1 for block in inputs if block in states),
                                                 queued=bool(dependency.get("queue", True)),
                                                 backend=bool(dependency.get("backend_fn", True)))
    return by_index, {inputs.api_name: inputs for inputs in by_index.values() if inputs.api_name}


#: JSON Schema types in the words of the tools' own checks ("num_images: must be ...")
_TYPE_WORDS = {"integer": "a whole number", "number": "a number", "string": "text", "boolean": "true or false",
               "object": "an object", "array": "a list"}


def argument_problem(schema: dict[str, Any], arguments: Any) -> str | None:
    """The first argument ``schema`` (the tool's ``inputSchema``) refuses, named as the tools name a bad
    value (``num_images: must be a whole number, got "many"``); None when the arguments fit."""
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


# ---- ASGI plumbing ------------------------------------------------------------------------------------
def _headers(scope: Scope) -> dict[str, str]:
    return {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}


def _with_ticket(scope: Scope, ticket: str) -> Scope:
    return dict(scope, headers=[*scope.get("headers", []), (_RUN_HEADER, ticket.encode())])


def _with_owner_cookie(scope: Scope, send: Send) -> Send:
    """``send`` that gives a caller without a well-formed owner cookie a new one (HttpOnly)."""
    if owner_of(_headers(scope)):
        return send
    secure = "; Secure" if scope.get("scheme") == "https" else ""
    cookie = f"{OWNER_COOKIE}={secrets.token_urlsafe(24)}; Path=/; HttpOnly; SameSite=Lax{secure}".encode()

    async def send_with_cookie(message: dict[str, Any]) -> None:
        if message.get("type") == "http.response.start":
            message = dict(message, headers=[*message.get("headers", []), (b"set-cookie", cookie)])
        await send(message)

    return send_with_cookie


def _recording(send: Send, answer: dict[str, Any], on_complete: Callable[[], Any] = lambda: None) -> Send:
    """``send`` that keeps the status, the first 4 KiB of the body and whether the answer is complete
    (``on_complete`` runs before its last part is sent)."""
    async def recording(message: dict[str, Any]) -> None:
        if message.get("type") == "http.response.start":
            answer["status"] = message.get("status")
        elif message.get("type") == "http.response.body":
            answer["body"] = (answer.get("body", b"") + message.get("body", b""))[:4096]
            answer["complete"] = not message.get("more_body", False)
            if answer["complete"]:
                on_complete()
        await send(message)

    return recording


def _watching(receive: Receive, answer: dict[str, Any], on_gone: Callable[[], Any]) -> Receive:
    """``receive`` that calls ``on_gone`` when the client closes the connection before the answer is complete."""
    async def watching() -> dict[str, Any]:
        message = await receive()
        if message.get("type") == "http.disconnect" and not answer.get("complete"):
            on_gone()
        return message

    return watching


async def _watched(app: Callable, scope: Scope, receive: Receive, send: Send, on_gone: Callable[[], Any]) -> None:
    """A stream whose early close by the client calls ``on_gone``."""
    answer: dict[str, Any] = {}
    await app(scope, _watching(receive, answer, on_gone), _recording(send, answer))


#: what ``_json`` returns for a body nested past the parser's recursion limit (Gradio would answer 500)
TOO_DEEP = object()
#: why a caller holding only another client's session hash is refused its stream and its joins
FOREIGN_SESSION = "this session belongs to another client (a session is its owner's)"


def _json(body: bytes) -> Any:
    try:
        return json.loads(body)
    except ValueError:
        return None
    except RecursionError:
        return TOO_DEEP


def _utf8(body: bytes) -> bool:
    try:
        body.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def _session_problem(payload: Any) -> str | None:
    """An empty or non-text ``session_hash`` (Gradio's queue loses an event it cannot address, and its
    processing task dies with it: the queue stops for everyone)."""
    if isinstance(payload, dict) and "session_hash" in payload and payload["session_hash"] is not None:
        if not isinstance(payload["session_hash"], str) or not payload["session_hash"]:
            return "session_hash: must be a non-empty string, or left out"
    return None


def _fn_index(payload: Any) -> int | None:
    """The body's ``fn_index`` as Gradio's ``PredictBody`` reads it (None when absent or not a whole number)."""
    value = payload.get("fn_index") if isinstance(payload, dict) else None
    try:
        return _FN_INDEX.validate_python(value)
    except ValidationError:
        return None


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
        if size > MAX_CALL_BODY:
            return b"".join(chunks), True
        if not message.get("more_body", False):
            return b"".join(chunks), False


def replay_body(body: bytes, receive: Receive) -> Receive:
    """``receive`` that hands the app the whole body the guard read, then the connection's messages."""
    sent = False

    async def replay() -> dict[str, Any]:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay


def json_field(body: bytes, name: str) -> Any:
    value = _json(body)
    value = value.get(name) if isinstance(value, dict) else None
    return value if value not in ("", None) and not isinstance(value, (dict, list)) else None


async def json_response(send: Send, status: int, payload: dict[str, Any]) -> None:
    await JSONResponse(payload, status, headers={"retry-after": "10"})({"type": "http"}, _no_body, send)


async def tool_error(send: Send, request_id: Any, text: str) -> None:
    """A JSON-RPC answer to ``tools/call``: a tool error with ``text`` (what Gradio's tools return)."""
    answer = {"jsonrpc": "2.0", "id": request_id, "result": {"content": [{"type": "text", "text": text}], "isError": True}}
    await JSONResponse(answer)({"type": "http"}, _no_body, send)


async def _no_body() -> dict[str, Any]:
    return {"type": "http.disconnect"}
