"""Per-session history: this visit's earlier results under the gallery, newest first.

Each session's copied PNGs (keyed by the session and its owner cookie: a session hash alone reaches
nothing) are bounded (images and megabytes per session, sessions kept, oldest dropped first) and freed
when its tab closes (``Blocks.unload``) or the server stops. The view shows earlier runs only, never
the run on show in the gallery or the comparison.
"""

from __future__ import annotations

import shutil
import tempfile
import threading
import weakref
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path

import gradio as gr

from tpu_demo.web.callers import stop_key


@dataclass
class _Session:
    directory: Path
    #: (path, caption), newest first
    items: list[tuple[str, str]] = field(default_factory=list)
    count: int = 0
    #: the copies of what the page shows elsewhere now, by place ("gallery", "compare")
    showing: dict[str, set[str]] = field(default_factory=dict)


def _owner(request: gr.Request | None) -> str:
    """Whose history: the session with its owner cookie (a session hash alone reaches nothing, as for Stop)."""
    session_hash = getattr(request, "session_hash", None)
    return stop_key(session_hash, getattr(request, "headers", None)) or f"hash:{session_hash or 'anonymous'}"


class SessionHistory:
    """Thread-safe store of every live session's history files."""

    def __init__(self, max_images: int = 24, max_mb: float = 16.0, max_sessions: int = 200):
        self.max_images, self.max_bytes, self.max_sessions = max_images, int(max_mb * 1e6), max_sessions
        self.root = Path(tempfile.mkdtemp(prefix="tpu-demo-history-"))
        weakref.finalize(self, shutil.rmtree, str(self.root), True)  # at exit at the latest
        self._sessions: OrderedDict[str, _Session] = OrderedDict()
        self._lock = threading.Lock()

    def add(self, gallery: list | None, request: gr.Request = None, shown_in: str = "") -> list[tuple[str, str]]:
        """Copy the finished images of ``gallery`` (previews skipped) in front of this session's history.

        Returns every kept item, newest first; with ``shown_in``, those copies are what that place of the
        page shows now (``earlier`` leaves them out).
        """
        key = _owner(request)
        with self._lock:
            session = self._session(key)
            added: set[str] = set()
            for item in gallery or []:
                path, caption = (item[0], item[1] or "") if isinstance(item, (list, tuple)) else (item, "")
                if not path or caption.startswith("preview") or not Path(path).is_file():
                    continue
                session.count += 1
                copy = session.directory / f"{session.count:05d}.png"
                shutil.copyfile(path, copy)
                session.items.insert(0, (str(copy), caption))
                added.add(str(copy))
            if shown_in:
                session.showing[shown_in] = added
            self._trim(session)
            return list(session.items)

    def earlier(self, request: gr.Request = None) -> list[tuple[str, str]]:
        """This session's kept items that no other place of the page shows now, newest first."""
        key = _owner(request)
        with self._lock:
            session = self._sessions.get(key)
            if session is None:
                return []
            shown = set().union(*session.showing.values())
            return [item for item in session.items if item[0] not in shown]

    def after_generate(self, gallery: list | None, request: gr.Request = None) -> list[tuple[str, str]]:
        """The page's history view once a generation succeeded (its images stay in the gallery, not here)."""
        self.add(gallery, request, shown_in="gallery")
        return self.earlier(request)

    def after_compare(self, gallery: list | None, request: gr.Request = None) -> list[tuple[str, str]]:
        """The page's history view once a comparison succeeded (its images stay in the comparison)."""
        self.add(gallery, request, shown_in="compare")
        return self.earlier(request)

    def drop(self, request: gr.Request = None) -> None:
        """The session ended: free its files."""
        key = _owner(request)
        with self._lock:  # the files go before the lock is released: no one sees a dropped session's folder
            session = self._sessions.pop(key, None)
            if session is not None:
                shutil.rmtree(session.directory, ignore_errors=True)

    def close(self) -> None:
        with self._lock:
            self._sessions.clear()
        shutil.rmtree(self.root, ignore_errors=True)

    def sessions(self) -> int:
        with self._lock:
            return len(self._sessions)

    def _session(self, key: str) -> _Session:
        if key in self._sessions:
            self._sessions.move_to_end(key)
            return self._sessions[key]
        while len(self._sessions) >= self.max_sessions:
            _, oldest = self._sessions.popitem(last=False)
            shutil.rmtree(oldest.directory, ignore_errors=True)
        directory = self.root / f"s{len(self._sessions)}-{abs(hash(key)) % 10**12}"
        directory.mkdir(parents=True, exist_ok=True)
        self._sessions[key] = session = _Session(directory)
        return session

    def _trim(self, session: _Session) -> None:
        size = 0
        for index, (path, _) in enumerate(session.items):
            size += Path(path).stat().st_size
            if index >= self.max_images or size > self.max_bytes:
                for old, _ in session.items[index:]:
                    Path(old).unlink(missing_ok=True)
                del session.items[index:]
                return

