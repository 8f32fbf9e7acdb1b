"""The few facts about Gradio's queue that hardening and throughput need, read and set in one place.

Gradio 6.31 has no public API for "which requests does this client have waiting or running",
"is the client of this running event still connected" or "when was this event queued". The
queue holds all three (``Blocks._queue``: waiting events per concurrency id, ``active_jobs``,
``Event.alive`` cleared when the client's stream closes, ``Event.enqueue_time``), so they are
read here and nowhere else. Every accessor degrades to "unknown" (never raises) if a Gradio
upgrade renames them, and tests/test_limits.py and tests/test_routes.py exercise each one against the real queue.
"""

from __future__ import annotations

import inspect
import os
import time
from dataclasses import dataclass
from typing import Any, Collection, Iterator

import gradio as gr

from tpu_demo.web.callers import session_key


#: Gradio's queue rebuilds its monitoring summary (a pandas DataFrame of up to 10 000 past events,
#: grouped, with percentiles) after every event by default: O(events) of CPU per request on the
#: cores that denoise, growing all day on a public demo, for a dashboard this app never enables.
QUEUE_ANALYTICS_DEFAULTS = {"GRADIO_ANALYTICS_CACHE_FREQUENCY": "1000", "GRADIO_ANALYTICS_MAX_EVENTS": "1000"}


def limit_queue_analytics() -> None:
    """Rebuild that summary once per 1000 events, over at most 1000 (call before ``Blocks.queue``;
    an operator's own values in the environment win)."""
    for name, value in QUEUE_ANALYTICS_DEFAULTS.items():
        os.environ.setdefault(name, value)


#: how often Gradio's queue looks for progress to send (its default polls 100 times a second)
PROGRESS_POLL_SECONDS = 0.05


def set_queue_polling(blocks: gr.Blocks, seconds: float) -> bool:
    """Poll the queue every ``seconds`` for a free worker (call after ``Blocks.queue``).

    Gradio's queue has no wake-up: ``Queue.start_processing`` sleeps ``sleep_when_free`` (1 ms)
    and looks again, a thousand event-loop wake-ups a second even when idle, each taking the GIL
    from the thread that denoises (see docs/generation.md, "Queue polling"); progress updates
    are polled every 10 ms the same way (here: at most 20 a second). False if a Gradio upgrade
    renamed them.
    """
    queue = _queue(blocks)
    if queue is None or not hasattr(queue, "sleep_when_free") or not hasattr(
            queue, "progress_update_sleep_when_free"):
        return False
    queue.sleep_when_free = seconds
    queue.progress_update_sleep_when_free = max(seconds, PROGRESS_POLL_SECONDS)
    return True


@dataclass(frozen=True)
class QueuedEvent:
    """One generation a client has waiting or running."""

    #: the caller's session as the limits count it (``callers.session_key``)
    session_hash: str
    client_host: str | None
    running: bool
    #: Gradio's id of the event (``CurrentEvent.event_id`` inside its handler)
    event_id: str | None = None
    api_name: str | None = None


def _queue(blocks: gr.Blocks | None) -> Any:
    return getattr(blocks, "_queue", None)


def _names(api_names: str | Collection[str]) -> frozenset[str]:
    return frozenset({api_names} if isinstance(api_names, str) else api_names)


def fn_ids(blocks: gr.Blocks, api_names: str | Collection[str]) -> set[int]:
    """The ids (``fn_index`` in queue joins) of the event handlers behind ``api_names``."""
    names = _names(api_names)
    return {fn_id for fn_id, fn in blocks.fns.items() if getattr(fn, "api_name", None) in names}


@dataclass(frozen=True)
class EventInputs:
    """What an event handler takes: its api name and the names of its input values, in order."""

    api_name: str | None
    names: tuple[str, ...]
    #: inputs the simple ``/call/`` format leaves out (gr.State): their values live on the server
    server_side: int = 0


def event_inputs(blocks: gr.Blocks, fn_index: Any = None, api_name: str | None = None) -> EventInputs | None:
    """The handler a call names (by ``fn_index``, else by ``api_name``), or None if it names none."""
    fns = getattr(blocks, "fns", {})
    if isinstance(fn_index, int) and not isinstance(fn_index, bool):
        fn = fns.get(fn_index)
    else:
        fn = next((f for f in fns.values() if api_name is not None and getattr(f, "api_name", None) == api_name), None)
    if fn is None:
        return None
    inputs = list(getattr(fn, "inputs", []))
    # the parameter each input fills (named inputs by their name); positional handlers take their inputs
    # first, then Gradio's injected request / progress / event data
    named = list(getattr(fn, "input_parameter_names", None) or [])
    try:
        parameters = [name for name in inspect.signature(fn.fn).parameters if name != "self"]
    except (TypeError, ValueError):
        parameters = []
    if len(named) == len(inputs) and all(named):
        names = tuple(named)
    else:
        names = tuple(parameters[:len(inputs)]) if len(parameters) >= len(inputs) else tuple(
            f"input {i + 1}" for i in range(len(inputs)))
    return EventInputs(getattr(fn, "api_name", None), names,
                       sum(1 for block in inputs if getattr(block, "skip_api", False)))


def pending_events(blocks: gr.Blocks, api_names: str | Collection[str]) -> Iterator[QueuedEvent]:
    """Every event of ``api_names`` waiting in the queue or running, with its session and client address."""
    names = _names(api_names)
    queue = _queue(blocks)
    if queue is None:
        return
    try:
        waiting = [event for event_queue in queue.event_queue_per_concurrency_id.values()
                   for event in list(event_queue.queue)]
        running = [event for job in list(queue.active_jobs) if job for event in job]
    except AttributeError:
        return
    for event, is_running in [(e, False) for e in waiting] + [(e, True) for e in running]:
        if getattr(getattr(event, "fn", None), "api_name", None) not in names:
            continue
        request = getattr(event, "request", None)
        client = getattr(request, "client", None)
        # the owned session (web/callers.py): another caller naming the same hash is counted apart
        yield QueuedEvent(session_hash=session_key(getattr(event, "session_hash", ""), getattr(request, "headers", None)),
                          client_host=getattr(client, "host", None), running=is_running,
                          event_id=getattr(event, "_id", None), api_name=getattr(getattr(event, "fn", None), "api_name", None))


def queue_length(blocks: gr.Blocks) -> int:
    """Requests waiting (not yet running) in the queue."""
    try:
        return len(_queue(blocks))
    except TypeError:
        return 0


def _current_event() -> Any:
    from gradio.context import LocalContext

    blocks, event_id = LocalContext.blocks.get(None), LocalContext.event_id.get(None)
    queue = _queue(blocks)
    if queue is None or event_id is None:
        return None
    return getattr(queue, "event_ids_to_events", {}).get(event_id)


@dataclass
class CurrentEvent:
    """The queue event of the handler that is running now (call inside a Gradio handler)."""

    event_id: str | None
    queue_wait_seconds: float | None
    _event: Any = None

    @classmethod
    def capture(cls) -> "CurrentEvent":
        from gradio.context import LocalContext

        event = _current_event()
        enqueued = getattr(event, "enqueue_time", None)
        wait = round(time.monotonic() - enqueued, 4) if isinstance(enqueued, float) else None
        return cls(event_id=LocalContext.event_id.get(None), queue_wait_seconds=wait, _event=event)

    def connected(self) -> bool:
        """False once Gradio saw the client's stream close (unknown counts as connected)."""
        return bool(getattr(self._event, "alive", True))
