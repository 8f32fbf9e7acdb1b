"""Measuring tools: interleaved A/B timing, compile counting and resident memory.

Wall-clock numbers on a shared machine are noisy, so comparisons are interleaved (A B, B A,
...) and reported as medians; compile counts and memory are exact.
"""

from __future__ import annotations

import os
import resource
import socket
import statistics
import time
from dataclasses import dataclass, field
from typing import Any, Callable


def free_port() -> int:
    """A free TCP port on loopback, for a server a measurement starts."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def timed(call: Callable[[], Any]) -> float:
    """Seconds one call takes."""
    started = time.perf_counter()
    call()
    return time.perf_counter() - started


@dataclass
class Pairs:
    """Timings of A and B measured in alternating order, so drift and noise hit both alike."""

    a_seconds: list[float] = field(default_factory=list)
    b_seconds: list[float] = field(default_factory=list)

    @property
    def ratio(self) -> float:
        """median(A) / median(B)."""
        return median(self.a_seconds) / median(self.b_seconds)

    @property
    def median_extra_ms(self) -> float:
        """Median over pairs of A - B, in milliseconds (what A adds per call)."""
        return 1000 * median([a - b for a, b in zip(self.a_seconds, self.b_seconds)])

    @property
    def best_ratio(self) -> float:
        """min(A) / min(B): noise on a shared machine only adds time, so the fastest runs are the cleanest."""
        return min(self.a_seconds) / min(self.b_seconds)

    def summary(self) -> dict[str, Any]:
        return {"pairs": len(self.a_seconds), "ratio": round(self.ratio, 4), "best_ratio": round(self.best_ratio, 4),
                "median_a_ms": round(1000 * median(self.a_seconds), 2),
                "median_b_ms": round(1000 * median(self.b_seconds), 2),
                "median_extra_ms": round(self.median_extra_ms, 2),
                "a_ms": [round(1000 * s, 2) for s in self.a_seconds],
                "b_ms": [round(1000 * s, 2) for s in self.b_seconds]}


def interleaved_pairs(a: Callable[[], Any], b: Callable[[], Any], pairs: int) -> Pairs:
    """Time ``pairs`` pairs of ``a`` and ``b``, alternating which runs first (A B, B A, ...)."""
    result = Pairs()
    for index in range(pairs):
        if index % 2 == 0:
            result.a_seconds.append(timed(a))
            result.b_seconds.append(timed(b))
        else:
            result.b_seconds.append(timed(b))
            result.a_seconds.append(timed(a))
    return result


class CompileWatch:
    """Counts graph compilations in a block, two independent ways.

    ``graphs``: dynamo's own count of graphs it compiled (any backend, any caller);
    ``backend_calls``: calls of a counting backend (the engine's CompileCounter) when given.
    """

    def __init__(self, counter: Any = None):
        self.counter = counter
        self.graphs = 0
        self.backend_calls = 0

    @staticmethod
    def _dynamo_graphs() -> int:
        from torch._dynamo.utils import counters

        return counters["stats"]["unique_graphs"]

    def __enter__(self) -> "CompileWatch":
        self._graphs_before = self._dynamo_graphs()
        self._calls_before = self.counter.count if self.counter is not None else 0
        return self

    def __exit__(self, *exc: Any) -> None:
        self.graphs = self._dynamo_graphs() - self._graphs_before
        self.backend_calls = (self.counter.count - self._calls_before) if self.counter is not None else 0

    @property
    def compiles(self) -> int:
        return max(self.graphs, self.backend_calls)


def _proc_status_kib(field_name: str) -> int | None:
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith(field_name + ":"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def rss_bytes() -> int:
    """Resident set size of this process now."""
    kib = _proc_status_kib("VmRSS")
    if kib is not None:
        return kib * 1024
    import psutil  # not Linux: fall back to psutil

    return psutil.Process(os.getpid()).memory_info().rss


def peak_rss_bytes() -> int:
    """Highest resident set size of this process so far (the kernel's high-water mark)."""
    kib = _proc_status_kib("VmHWM")
    if kib is not None:
        return kib * 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB
