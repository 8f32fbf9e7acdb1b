"""The one way tests (and scripts/screenshot.py) run the real app in-process: a free loopback port,
``build_app`` from flags, Gradio's own ``launch``; ``stop_app`` closes the server and the engine."""

from __future__ import annotations

import contextlib
import random
import socket
from typing import Any


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def free_ports(count: int) -> int:
    """The first of ``count`` consecutive loopback ports free now (``--chips`` serves on the first and
    its engines on the next), below Linux's ephemeral range (32768 up): the kernel never hands one of
    them to another test's ``free_port()`` or an outgoing connection before the app binds it."""
    for _ in range(100):
        base = random.randrange(20000, 32000 - count)
        with contextlib.ExitStack() as stack:
            try:
                for port in range(base, base + count):
                    stack.enter_context(socket.socket()).bind(("127.0.0.1", port))
            except OSError:
                continue
        return base
    raise RuntimeError(f"no {count} consecutive free loopback ports between 20000 and 32000")


def start_app(*flags: str) -> tuple[Any, str]:
    """Build and launch the real app on a free loopback port from flags; returns (app, url)."""
    from tpu_demo.launch.config import parse_config
    from tpu_demo.launch.serve import build_app, launch

    port = free_port()
    app = build_app(parse_config(["--port", str(port), *flags], environ={}))
    launch(app, prevent_thread_lock=True)
    return app, f"http://127.0.0.1:{port}/"


def stop_app(app: Any) -> None:
    app.demo.close()
    app.engine.close()
