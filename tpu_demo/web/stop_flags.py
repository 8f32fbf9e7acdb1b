"""Each browser session's Stop flags: which running request the Stop button reaches.

The page arms a flag at the click (before the queue), the generate handler takes it for its
request, and Stop sets the session's current flag. Several generate handlers run at once
(overlap under load), so with ``--max-per-session`` above 1 a session's second request runs beside its
first: its flag waits in line and becomes the session's Stop flag when the first request ends,
which is what Stop reached when requests ran one after another. Session hashes are chosen by
the caller, so the number of sessions kept is bounded.
"""

from __future__ import annotations

import threading

#: Stop flags kept for sessions that clicked Generate; past this the oldest is forgotten (its run
#: can then only be stopped by its time limit or disconnect), so a flood of invented sessions
#: calling the unqueued click handler cannot grow memory without bound
MAX_ARMED_SESSIONS = 10_000

#: flags of one session's later requests kept in line (more only with a high --max-per-session)
MAX_LATER_PER_SESSION = 8


class SessionStops:
    """Per session: the flag Stop sets, and the flags of its later requests in line."""

    def __init__(self, max_sessions: int = MAX_ARMED_SESSIONS):
        self.max_sessions = max_sessions
        self._current: dict[str, threading.Event] = {}
        self._later: dict[str, list[threading.Event]] = {}
        self._taken: set[int] = set()  # ids of flags a running handler holds
        self._lock = threading.Lock()

    def __len__(self) -> int:
        """Sessions with an armed flag."""
        with self._lock:
            return len(self._current)

    def arm(self, session: str | None) -> threading.Event:
        """A new flag for the session's next request (the click); None: a flag nobody else holds."""
        event = threading.Event()
        if session is None:
            return event
        with self._lock:
            current = self._current.get(session)
            if current is not None and id(current) in self._taken:
                # a request of this session runs: Stop keeps reaching it; this flag waits its turn
                later = self._later.setdefault(session, [])
                later[:] = [flag for flag in later if id(flag) in self._taken][-(MAX_LATER_PER_SESSION - 1):] + [event]
                return event
            self._current.pop(session, None)
            self._current[session] = event
            while len(self._current) > self.max_sessions:
                oldest = next(iter(self._current))  # the oldest armed flag
                del self._current[oldest]
                self._later.pop(oldest, None)
        return event

    def take(self, session: str | None) -> threading.Event:
        """The flag armed for this request (else a fresh one: API calls arm none); held until ``release``."""
        with self._lock:
            candidates = [self._current.get(session), *self._later.get(session, [])] if session is not None else []
            event = next((flag for flag in candidates if flag is not None and id(flag) not in self._taken), None)
            if event is not None:
                self._taken.add(id(event))
                return event
        event = self.arm(session)
        with self._lock:
            self._taken.add(id(event))
        return event

    def release(self, session: str | None, event: threading.Event) -> None:
        """The request holding ``event`` ended; the session's next request (if any) becomes Stop's target."""
        with self._lock:
            self._taken.discard(id(event))
            if session is None:
                return
            later = self._later.get(session, [])
            if event in later:
                later.remove(event)
            elif self._current.get(session) is event:
                del self._current[session]
                if later:
                    self._current[session] = later.pop(0)
            if not later:
                self._later.pop(session, None)

    def stop(self, session: str | None) -> None:
        """Set the session's current flag (its oldest running request stops at its next step)."""
        with self._lock:
            event = self._current.get(session) if session is not None else None
        if event is not None:
            event.set()
