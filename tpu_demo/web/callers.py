"""Who a caller is, for Stop and for the per-session limit: something another caller cannot claim.

Gradio's session hash is chosen by the client and travels in request bodies, so anyone who learns
another visitor's hash could name it. Ownership therefore rests on a secret the server issues:
``OwnerCookie`` gives every client without one a random ``tpu_demo_owner`` cookie (HttpOnly, so page
scripts never read it; browsers send it on every same-origin call; ``gradio_client`` keeps the cookies
of its first ``/config`` answer and sends them with every call). A run belongs to (cookie, session
hash): Stop with the same session hash and another cookie, or none, reaches nothing.

An MCP tool call reaches its handler through Gradio's HTTP loopback, where every call shares one
internal client's session and cookie; ``mcp_guard.py`` marks each such call with its own
server-issued token (``MCP_CALL_HEADER``), and that token is the call's identity here.
"""

from __future__ import annotations

import re
import secrets
from http.cookies import SimpleCookie
from typing import Any, Awaitable, Callable

#: the server-issued owner secret of a browser or API client
OWNER_COOKIE = "tpu_demo_owner"
#: set only by mcp_guard.py on the loopback join of one MCP tool call (any copy a caller sends is removed)
MCP_CALL_HEADER = "x-tpu-demo-mcp-call"

_SECRET = re.compile(r"^[A-Za-z0-9_-]{20,64}$")

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]


def header(headers: Any, name: str) -> str | None:
    """One header from Starlette ``Headers``, a plain dict, or Gradio's pickled copy of either."""
    if headers is None:
        return None
    try:
        value = headers.get(name)
    except (AttributeError, TypeError):
        value = None
    if value is None:
        try:
            value = next((v for k, v in dict(headers).items() if str(k).lower() == name), None)
        except (TypeError, ValueError):
            return None
    return value if isinstance(value, str) else None


def owner_of(headers: Any) -> str | None:
    """The caller's owner secret from its Cookie header, if it sent a well-formed one."""
    raw = header(headers, "cookie")
    if not raw:
        return None
    try:
        morsel = SimpleCookie(raw).get(OWNER_COOKIE)
    except Exception:  # noqa: BLE001 - a malformed Cookie header proves nothing
        return None
    value = morsel.value if morsel is not None else None
    return value if value and _SECRET.match(value) else None


def mcp_call_of(headers: Any) -> str | None:
    """The token of the MCP tool call this request carries (present only where mcp_guard put it)."""
    token = header(headers, MCP_CALL_HEADER)
    return token if token and _SECRET.match(token) else None


def stop_key(session_hash: Any, headers: Any) -> str | None:
    """Whose Stop reaches this request: the MCP call, or (owner secret, session); None when the caller
    proved nothing (it gets a flag nobody else holds; it can still cancel its own event by its id)."""
    token = mcp_call_of(headers)
    if token:
        return f"mcp:{token}"
    owner = owner_of(headers)
    if owner and isinstance(session_hash, str) and session_hash:
        return f"{owner}/{session_hash}"
    return None


def session_key(session_hash: Any, headers: Any) -> str:
    """What the per-session limit counts: the owned session, else the bare hash (as Gradio reports it)."""
    return stop_key(session_hash, headers) or (str(session_hash) if session_hash else "")


def request_headers(request: Any) -> Any:
    """The headers of a ``gr.Request`` / Starlette request / test stand-in (None if it has none)."""
    return getattr(request, "headers", None) if request is not None else None


class OwnerCookie:
    """ASGI middleware: issue the owner secret to every HTTP client that does not send one."""

    def __init__(self, app: Callable):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope.get("type") != "http":
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
        if owner_of(headers):
            await self.app(scope, receive, send)
            return
        secure = "; Secure" if scope.get("scheme") == "https" else ""
        cookie = f"{OWNER_COOKIE}={secrets.token_urlsafe(24)}; Path=/; HttpOnly; SameSite=Lax{secure}"

        async def send_with_cookie(message: dict[str, Any]) -> None:
            if message.get("type") == "http.response.start":
                message = dict(message, headers=[*message.get("headers", []), (b"set-cookie", cookie.encode())])
            await send(message)

        await self.app(scope, receive, send_with_cookie)
