"""This server's recent warm runs, as plain data: what the speed chart draws.

The engine adds one record per finished warm image (requests and comparisons alike); the page
reads snapshots. Bounded, so a server that runs for weeks keeps only the latest figures.
"""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass


@dataclass(frozen=True)
class TimedRun:
    """One warm image: how long its denoising loop took, in which mode and bucket."""

    model: str
    mode: str
    resolution: str
    num_inference_steps: int
    denoise_seconds: float
    steps_per_second: float


class RecentRuns:
    """The last ``max_runs`` warm images; ``version`` grows by one per record (cheap change check)."""

    def __init__(self, max_runs: int = 200):
        self._runs: deque[TimedRun] = deque(maxlen=max_runs)
        self._lock = threading.Lock()
        self.version = 0

    def add(self, run: TimedRun) -> None:
        with self._lock:
            self._runs.append(run)
            self.version += 1

    def snapshot(self) -> list[TimedRun]:
        with self._lock:
            return list(self._runs)
