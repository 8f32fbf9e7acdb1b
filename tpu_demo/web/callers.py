"""Who a caller is, for Stop and for the per-session limit: something another caller cannot claim.

A run belongs to (owner cookie, session hash): the cookie is a secret the server issues (web/guard.py),
HttpOnly, so Stop naming the same session hash with another cookie, or none, reaches nothing; a session
first used with a cookie is that cookie's (``SessionOwners``). A caller that proved nothing owns nothing.
``RUN_HEADER`` carries the server-issued ticket of an admitted run.
"""

from __future__ import annotations

import re
import threading
from collections import OrderedDict
from http.cookies import SimpleCookie
from typing import Any

#: the server-issued owner secret of a browser or API client
OWNER_COOKIE = "tpu_demo_owner"
#: set only by the guard on an admitted request: the ticket of its run (any copy a caller sends is removed)
RUN_HEADER = "x-tpu-demo-run"

_SECRET = re.compile(r"^[A-Za-z0-9_-]{20,64}$")


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


def stop_key(session_hash: Any, headers: Any) -> str | None:
    """Whose Stop reaches this request: (owner secret, session); None when the caller proved nothing
    (nobody's Stop reaches it; it can still cancel its own event by its id)."""
    owner = owner_of(headers)
    if owner and isinstance(session_hash, str) and session_hash:
        return f"{owner}/{session_hash}"
    return None


class SessionOwners:
    """Which owner secret first used each session hash: a session bound to one is another caller's for
    everyone else (its stream, joins, heartbeat and cancels). A caller that proved nothing binds nothing.
    Keeps the last ``capacity`` sessions (Gradio keeps its last 2,000 sessions' messages)."""

    def __init__(self, capacity: int = 20_000):
        self.capacity = capacity
        self._owners: OrderedDict[str, str] = OrderedDict()
        self._lock = threading.Lock()

    def allows(self, session_hash: Any, owner: str | None) -> bool:
        """Whether ``owner`` (``owner_of``) may use ``session_hash``; its first use by an owner binds it."""
        if not isinstance(session_hash, str) or not session_hash:
            return True
        with self._lock:
            bound = self._owners.get(session_hash)
            if bound is None and owner is not None:
                self._owners[session_hash] = bound = owner
                if len(self._owners) > self.capacity:
                    self._owners.popitem(last=False)
            if bound is not None:
                self._owners.move_to_end(session_hash)
            return bound is None or bound == owner
