"""Gradio's private names in one room, loudly: the adapter's start-up check passes against the pinned
Gradio, names each name a stand-in Gradio lacks, and stops a real app build that meets one; no other
module of the app reads a private Gradio name."""

from __future__ import annotations

import ast
import types
from pathlib import Path

import gradio as gr
import pytest

from tpu_demo.web import gradio_internals
from tpu_demo.web.gradio_internals import (PRIVATE_NAMES, GradioInternalsMissing, check_gradio_internals,
                                           missing_internals)

REPO = Path(__file__).resolve().parents[1]


def _queued_blocks() -> gr.Blocks:
    with gr.Blocks() as demo:
        gr.Textbox()
    demo.queue()
    return demo


def _stand_in_gradio(**leave_out: bool) -> types.SimpleNamespace:
    """A Gradio-shaped module: ``mcp.tool`` marks a function, ``Blocks.launch`` builds the MCP server object,
    the server lists input schemas; ``leave_out`` drops one of them."""
    def tool():
        def mark(fn):
            if not leave_out.get("mcp_type"):
                fn._mcp_type = "tool"
            return fn
        return mark

    class Blocks:
        def launch(self):
            self.mcp_server_obj = None

    class Server:
        def get_input_schema(self, tool):
            return {}, None

    if leave_out.get("mcp_server_obj"):
        Blocks.launch = lambda self: None
    return types.SimpleNamespace(__version__="99.0-stand-in", mcp=types.SimpleNamespace(tool=tool, GradioMCPServer=Server),
                                 blocks=types.SimpleNamespace(Blocks=Blocks))


def test_the_pinned_gradio_has_every_private_name_the_app_uses():
    assert len(PRIVATE_NAMES) <= 5
    assert missing_internals(_queued_blocks()) == []
    check_gradio_internals(_queued_blocks())
    assert missing_internals(_queued_blocks(), _stand_in_gradio()) == []  # the stand-in itself is complete


@pytest.mark.parametrize("gone, name", [
    ("queue", "Blocks._queue"), ("sleep_when_free", "Queue.sleep_when_free"),
    ("progress_update_sleep_when_free", "Queue.progress_update_sleep_when_free"),
    ("mcp_type", "fn._mcp_type"), ("mcp_server_obj", "Blocks.mcp_server_obj"),
])
def test_a_gradio_without_one_of_them_stops_the_app_naming_it(gone, name):
    blocks = types.SimpleNamespace(_queue=types.SimpleNamespace(sleep_when_free=0.001,
                                                                progress_update_sleep_when_free=0.01))
    if gone == "queue":
        del blocks._queue
    elif gone in ("sleep_when_free", "progress_update_sleep_when_free"):
        delattr(blocks._queue, gone)
    module = _stand_in_gradio(**{gone: True})
    assert name in missing_internals(blocks, module)
    with pytest.raises(GradioInternalsMissing, match=name.replace(".", r"\.")) as refused:
        check_gradio_internals(blocks, module)
    assert "99.0-stand-in" in str(refused.value) and "requirements.txt" in str(refused.value)


def test_building_the_app_stops_when_a_private_name_is_gone(monkeypatch):
    """The real start-up path: build_app checks right after ``Blocks.queue`` and never serves without it."""
    from tpu_demo.launch.config import parse_config
    from tpu_demo.launch.serve import build_app

    monkeypatch.setattr(gradio_internals, "gradio", _stand_in_gradio(mcp_type=True))
    with pytest.raises(GradioInternalsMissing, match=r"fn\._mcp_type"):
        build_app(parse_config(["--no-warmup", "--model", "tiny-flux", "--models", "tiny-flux"], environ={}))


def test_no_other_module_reads_a_private_gradio_name():
    """Outside the adapter, no attribute of a Gradio object whose name starts with an underscore
    (``_queue``, ``_mcp_type``, ``_id``, ...) appears in the app's source."""
    offenders = []
    for path in sorted((REPO / "tpu_demo").rglob("*.py")):
        if path.name == "gradio_internals.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr in {"_queue", "_mcp_type", "_id", "_client_instance",
                                                                 "event_ids_to_events", "active_jobs",
                                                                 "event_queue_per_concurrency_id", "sleep_when_free",
                                                                 "mcp_server_obj", "input_parameter_names", "fns"}:
                offenders.append(f"{path.relative_to(REPO)}:{node.lineno} .{node.attr}")
            if isinstance(node, ast.ImportFrom) and node.module == "gradio.context":
                offenders.append(f"{path.relative_to(REPO)}:{node.lineno} gradio.context")
    assert offenders == []
