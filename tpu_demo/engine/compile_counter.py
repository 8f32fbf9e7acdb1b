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
