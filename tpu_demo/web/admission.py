"""Admission rules: how many generations may wait, how many one caller may hold, how often one address may
warm a model, and whether an event call's ``data`` fits its handler. Pure decisions; the guard
(web/guard.py) applies them at the door and the run registry (web/runs.py) is what they count.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any, Iterable

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
                current: Iterable[QueuedEvent]) -> str | None:
    """Why a new request from this client must wait its turn (``current``: the runs admitted), or None."""
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


@dataclass(frozen=True)
class QueuedEvent:
    """One generation as the limits count it: its caller's session and address, on the device or waiting."""

    session_hash: str
    client_host: str | None
    running: bool


@dataclass(frozen=True)
class EventInputs:
    """What an event handler takes: its api name and the names of its input values, in order."""

    api_name: str | None
    names: tuple[str, ...]
    #: inputs the simple ``/call/`` format leaves out (gr.State): their values live on the server
    server_side: int = 0
    #: runs through Gradio's queue (then its ``/run/`` route is closed: ``api_open=False``)
    queued: bool = True
    #: has a Python function (an event of JavaScript alone runs in the browser)
    backend: bool = True


def arity_error(inputs: EventInputs, data: Any, simple_format: bool = False, named: bool = False) -> str | None:
    """Why ``data`` is not one value per input of the handler (``named``: a dict of values by name, as
    ``/call/v2/`` takes them), naming the input; None if it is."""
    names = inputs.names
    takes = (f"{inputs.api_name or 'this event'} takes {len(names)} value(s): {', '.join(names)}" if names
             else f"{inputs.api_name or 'this event'} takes no values")
    if named and isinstance(data, dict):
        unknown = next((str(name) for name in data if name not in names and name != "oauth_token"), None)
        return f"{unknown[:40]}: no such input; {takes}" if unknown is not None else None
    if not isinstance(data, list):
        return f"data: must be a list of values; {takes}"
    expected = len(names) - inputs.server_side if simple_format and len(data) != len(names) else len(names)
    if len(data) < expected:
        return f"{names[len(data)]}: missing; {takes}"
    if len(data) > expected:
        return f"data: {len(data)} value(s), {len(data) - expected} too many; {takes}"
    return None
