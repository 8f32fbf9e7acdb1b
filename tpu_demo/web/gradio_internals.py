"""Every private Gradio name the app uses, in one place, checked at start-up.

``check_gradio_internals`` raises ``GradioInternalsMissing`` naming each one a Gradio upgrade removed,
so the app stops with a message instead of serving with a setting silently off. Nothing outside this
module reads or sets a private Gradio name (tests/test_architecture.py checks).
"""

from __future__ import annotations

import inspect
import os
from typing import Any, Callable

import gradio

#: the private names below, as the start-up message and docs/architecture.md name them
PRIVATE_NAMES = ("Blocks._queue", "Queue.sleep_when_free", "Queue.progress_update_sleep_when_free",
                 "fn._mcp_type", "Blocks.mcp_server_obj")

#: Gradio's queue rebuilds its monitoring summary (a pandas DataFrame of past events) after every event by
#: default; here once per 1000 events, over at most 1000 (public environment variables)
QUEUE_ANALYTICS_DEFAULTS = {"GRADIO_ANALYTICS_CACHE_FREQUENCY": "1000", "GRADIO_ANALYTICS_MAX_EVENTS": "1000"}
#: how often Gradio's queue looks for progress to send (its default polls 100 times a second)
PROGRESS_POLL_SECONDS = 0.05


class GradioInternalsMissing(RuntimeError):
    """This Gradio lacks a private name the app needs; the message names it."""


def missing_internals(blocks: Any, gradio_module: Any = None) -> list[str]:
    """The names of ``PRIVATE_NAMES`` that ``blocks`` (after ``Blocks.queue``) or ``gradio_module`` (default:
    the installed Gradio) lack."""
    gradio_module = gradio_module or gradio
    missing = []
    queue = getattr(blocks, "_queue", None)
    if queue is None:
        missing.append("Blocks._queue")
    for name in ("sleep_when_free", "progress_update_sleep_when_free"):
        if not hasattr(queue, name):
            missing.append(f"Queue.{name}")
    mcp = getattr(gradio_module, "mcp", None)
    probe: Callable = lambda: None  # noqa: E731 - what gr.mcp.tool marks
    try:
        marked = getattr(mcp.tool()(probe), "_mcp_type", None) is not None
    except Exception:  # noqa: BLE001 - any failure means the name is not there as the app uses it
        marked = False
    if not marked:
        missing.append("fn._mcp_type")
    try:
        serves_schemas = "mcp_server_obj" in inspect.getsource(gradio_module.blocks.Blocks.launch) and hasattr(
            mcp.GradioMCPServer, "get_input_schema")
    except Exception:  # noqa: BLE001
        serves_schemas = False
    if not serves_schemas:
        missing.append("Blocks.mcp_server_obj")
    return missing


def check_gradio_internals(blocks: Any, gradio_module: Any = None) -> None:
    """Stop the app, naming what is missing, if this Gradio lacks a private name the app needs."""
    gradio_module = gradio_module or gradio
    missing = missing_internals(blocks, gradio_module)
    if missing:
        version = getattr(gradio_module, "__version__", "?")
        raise GradioInternalsMissing(
            f"Gradio {version} lacks {', '.join(missing)}, which this app needs (tpu_demo/web/gradio_internals.py); "
            "install the Gradio version requirements.txt pins")


def limit_queue_analytics() -> None:
    """Rebuild the queue's monitoring summary rarely (call before ``Blocks.queue``; an operator's own
    values in the environment win)."""
    for name, value in QUEUE_ANALYTICS_DEFAULTS.items():
        os.environ.setdefault(name, value)


def set_queue_polling(blocks: Any, seconds: float) -> None:
    """Poll the queue every ``seconds`` for a free worker, progress at most every ``PROGRESS_POLL_SECONDS``
    (Gradio polls every 1 ms and 10 ms, each wake-up taking the GIL from the thread that denoises)."""
    blocks._queue.sleep_when_free = seconds
    blocks._queue.progress_update_sleep_when_free = max(seconds, PROGRESS_POLL_SECONDS)


def hide_from_mcp(*handlers: Callable) -> None:
    """Keep public API endpoints out of the MCP tool list (Gradio lists every public endpoint as a tool
    unless its function's ``_mcp_type`` says it is something else)."""
    for handler in handlers:
        getattr(handler, "__func__", handler)._mcp_type = "page"


def mcp_input_schema(blocks: Any, tool: str) -> dict | None:
    """The ``inputSchema`` Gradio's MCP server lists for ``tool`` (None without the MCP server or the tool)."""
    server = getattr(blocks, "mcp_server_obj", None)
    try:
        return server.get_input_schema(tool)[0] if server is not None else None
    except ValueError:  # a tool Gradio does not serve: its own answer stands
        return None
