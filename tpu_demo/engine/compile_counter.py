"""Count ``torch.compile`` graph compilations by wrapping the real backend.

Every call of a dynamo backend is one graph compiled (a new shape, or a recompile), so the
count is exact and needs no log parsing. The engine reads it per bucket to prove that, after
warmup, requests run without compiling.
"""

from __future__ import annotations

import threading
from typing import Any, Callable


class CompileCounter:
    """A dynamo backend that delegates to ``backend`` and counts its calls."""

    def __init__(self, backend: str | Callable[..., Any]):
        self.backend = backend
        self._count = 0
        self._lock = threading.Lock()
        self.__name__ = f"counting_{backend if isinstance(backend, str) else getattr(backend, '__name__', 'backend')}"

    @property
    def count(self) -> int:
        return self._count

    def __call__(self, graph_module, example_inputs, **kwargs):
        from torch._dynamo import lookup_backend

        with self._lock:
            self._count += 1
        real = lookup_backend(self.backend) if isinstance(self.backend, str) else self.backend
        return real(graph_module, example_inputs, **kwargs)


def recompile_limits(shapes: int) -> dict[str, int]:
    """Dynamo's recompile limits for an engine that serves ``shapes`` static shapes.

    ``fullgraph=True`` turns the limit into a hard failure: cover every shape (each bucket at every
    batch size, with and without a CFG-doubled batch) with room to spare; never lower a limit.
    """
    from torch._dynamo import config

    limit = max(config.recompile_limit, 2 * shapes + 8)
    return {"recompile_limit": limit, "accumulated_recompile_limit": max(config.accumulated_recompile_limit, 4 * limit)}


def apply_recompile_limits(limits: dict[str, int]) -> None:
    """Dynamo's config is per thread (ContextVars): apply on every thread that compiles."""
    from torch._dynamo import config

    for name, value in limits.items():
        setattr(config, name, value)
