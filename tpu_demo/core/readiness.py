"""Readiness: may a load balancer send this replica visitors yet? (``GET /ready``)

503 with the reason (loading, compiling bucket n of m, warming for ``--warm all``) until every
configured bucket of the start model in the start mode is warm, then 200 until SIGTERM ("shutting
down"); a model switch evicting the start model does not take readiness back. docs/operations.md.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Callable, Sequence

from tpu_demo.core.engine_api import EngineAPI, WarmAllProgress
from tpu_demo.core.events import BucketState, BucketStatus
from tpu_demo.core.modes import ExecutionMode



@dataclass(frozen=True)
class Readiness:
    ready: bool
    reason: str


def warm_buckets(shapes: Sequence[BucketStatus]) -> tuple[int, int, list[str]]:
    """(warm, total, failed) buckets of ``shapes``: a bucket is warm when every batch size of it is."""
    by_bucket: dict[str, list[BucketStatus]] = {}
    for shape in shapes:
        by_bucket.setdefault(shape.resolution, []).append(shape)
    warm = sum(1 for sizes in by_bucket.values() if all(s.state is BucketState.WARM for s in sizes))
    failed = [bucket for bucket, sizes in by_bucket.items() if any(s.state is BucketState.FAILED for s in sizes)]
    return warm, len(by_bucket), failed


def bucket_readiness(buckets: Sequence[BucketStatus], model_loaded: bool, model: str, mode: str) -> Readiness:
    """Ready when every configured bucket is warm at every batch size; else why not (failed, loading,
    compiling k of n)."""
    warm, total, failed = warm_buckets(buckets)
    where = f"{model} ({mode})"
    if failed:
        # a replica that cannot run a configured bucket would fail visitors' requests: keep it out
        return Readiness(False, f"failed: warmup of {where} failed for {', '.join(failed)} (see /health); "
                                "fix and restart the replica")
    if total and warm == total:
        return Readiness(True, f"ready: {total} of {total} buckets of {where} warm")
    if not model_loaded and warm == 0:
        return Readiness(False, f"loading {model}")
    return Readiness(False, f"compiling bucket {min(warm + 1, total)} of {total} of {where}; {warm} warm")


class ReadinessCheck:
    """The start model's configured buckets decide readiness once; SIGTERM takes it back."""

    def __init__(self, engine: EngineAPI, model: str, mode: ExecutionMode, warmup: bool,
                 draining: Callable[[], bool] = lambda: False, warm_all: WarmAllProgress | None = None):
        self.engine, self.model, self.mode, self.warmup, self.draining = engine, model, mode, warmup, draining
        #: ``--warm all``: not ready until every offered model has been warmed (then the start model's check)
        self.warm_all = warm_all
        self._ready: Readiness | None = None
        self._lock = threading.Lock()

    def __call__(self) -> Readiness:
        if self.draining():
            return Readiness(False, "shutting down")
        with self._lock:
            if self._ready is None:
                current = self._current()
                if not current.ready:
                    return current
                self._ready = current
            return self._ready if not self.warmup else self._ready_now()

    def _ready_now(self) -> Readiness:
        """Ready, and what is loaded now: the start model's verdict while it is loaded and warm, else the
        models loaded instead (a switch evicted it), each with its warm buckets per mode."""
        verdict = self._model_readiness(self.model, self.mode)
        if verdict.ready:
            return verdict
        loaded = [f"{model} ({self._warm_summary(model)})" for model in self.engine.status().models]
        return Readiness(True, f"ready: loaded now: {'; '.join(loaded) or 'no model'}; the start model "
                               f"{self.model} is not loaded (a request for it loads it again)")

    def _warm_summary(self, model: str) -> str:
        parts = []
        for mode in ExecutionMode:
            configured = len(self.engine.configured_shapes(model, mode))
            warm, total, _ = warm_buckets(self.engine.buckets_for(model, mode)[:configured])
            if warm:
                parts.append(f"{mode.value}: {warm} of {total} buckets warm")
        return ", ".join(parts) or "no bucket warm"

    def _current(self) -> Readiness:
        if not self.warmup:
            return Readiness(True, "ready: warmup is off (--no-warmup); buckets compile on first use")
        if self.warm_all is not None and not self.warm_all.finished.is_set():
            current = self.warm_all.current or self.model
            mode = self.warm_all.current_mode or self.mode
            return Readiness(False, f"{self.warm_all.progress()}: {self._model_readiness(current, mode).reason}")
        if self.warm_all is not None and self.warm_all.failures():
            failed = self.warm_all.failures()
            more = f" and {len(failed) - 3} more" if len(failed) > 3 else ""
            return Readiness(False, f"failed: --warm all: {'; '.join(failed[:3])}{more} (see /health); "
                                    "fix and restart the replica")
        return self._model_readiness(self.model, self.mode)

    def _model_readiness(self, model: str, mode: ExecutionMode) -> Readiness:
        configured = len(self.engine.configured_shapes(model, mode))  # every bucket x batch size
        buckets = self.engine.buckets_for(model, mode)[:configured]  # configured ones come first
        loaded = model in self.engine.status().models
        return bucket_readiness(buckets, loaded, model, mode.value)
