"""The bucket book: the state of every static shape (cold, compiling, warm, failed) and its compile record."""

from __future__ import annotations

import threading
import time
from dataclasses import replace
from typing import Callable, TypeVar

from tpu_demo.core.events import BucketState, BucketStatus, ShapeKey
from tpu_demo.engine.compile_cache import cache_counters, compile_source
from tpu_demo.engine.compile_counter import CompileCounter

T = TypeVar("T")


class BucketBook:
    """Thread-safe: the device thread writes, the UI and health threads read snapshots."""

    def __init__(self, counter: CompileCounter):
        self.counter = counter
        self._buckets: dict[ShapeKey, BucketStatus] = {}
        self._lock = threading.Lock()

    def _entry(self, key: ShapeKey) -> BucketStatus:
        with self._lock:
            if key not in self._buckets:
                self._buckets[key] = BucketStatus.cold(key)
            return self._buckets[key]

    def snapshot(self, key: ShapeKey) -> BucketStatus:
        return replace(self._entry(key))

    def is_warm(self, key: ShapeKey) -> bool:
        return self._entry(key).state is BucketState.WARM

    def all(self) -> list[BucketStatus]:
        with self._lock:
            return [replace(status) for status in self._buckets.values()]

    def matching(self, predicate: Callable[[ShapeKey], bool]) -> list[BucketStatus]:
        with self._lock:
            return [replace(status) for key, status in self._buckets.items() if predicate(key)]

    def mark_failed(self, key: ShapeKey, message: str) -> BucketStatus:
        status = self._entry(key)
        with self._lock:
            status.state, status.error = BucketState.FAILED, message
            return replace(status)

    def reset(self, predicate: Callable[[ShapeKey], bool]) -> None:
        """Every matching bucket goes back to cold (its model was unloaded, or its graphs dropped)."""
        with self._lock:
            for key in self._buckets:
                if predicate(key):
                    self._buckets[key] = BucketStatus.cold(key)

    def compile_phase(self, key: ShapeKey, call: Callable[[], T]) -> T:
        """Run the first call of a cold bucket, recording compile time, graph count and cache use."""
        status = self._entry(key)
        with self._lock:
            status.state, status.error = BucketState.COMPILING, None
        before, cache_before, started = self.counter.count, cache_counters(), time.perf_counter()
        try:
            result = call()
        except BaseException:
            with self._lock:
                status.state = BucketState.COLD
            raise
        with self._lock:
            status.compile_seconds = round(time.perf_counter() - started, 3)
            status.compiles = self.counter.count - before
            status.from_cache = compile_source(cache_before, cache_counters()) if status.compiles else None
            status.state = BucketState.WARM
        return result
