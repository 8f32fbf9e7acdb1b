"""``--warm all``: every offered model compiled before the first visitor, one model at a time.

Without it only the start model is warm, and the stakeholder who picks the second model waits for
its load and for every bucket's first compile (tens of minutes for a FLUX model on TPU, by the
published figures). Here start-up loads each other offered model in turn, warms every bucket at
every batch size in the selected mode (which writes the graphs into the persistent compile cache,
``engine/compile_cache.py``), and lets the next load evict it, so only one model's weights are
held at a time; the start model comes last and stays loaded. A later switch to a model warmed
this way costs its weight load and compile-cache hits, not a compile.

A model that was evicted loses its in-memory graphs (``ModelPool.unload`` resets dynamo), so its
buckets read cold again in the bucket book: the cache on disk, not memory, is what it warmed.
``results`` keeps what each model's warmup reported, failures included, for ``/ready``.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from tpu_demo.core.events import BucketState, BucketStatus
from tpu_demo.core.modes import ExecutionMode

if TYPE_CHECKING:
    from tpu_demo.engine.engine import Engine

log = logging.getLogger("tpu_demo.engine")


def warm_order(models: tuple[str, ...], start: str) -> tuple[str, ...]:
    """Every offered model once, the start model last (so it is the one left loaded)."""
    return tuple(model for model in models if model != start) + ((start,) if start in models else ())


@dataclass
class WarmAll:
    """Warms ``models`` in ``mode`` in a background thread; readable from any thread."""

    engine: "Engine"
    models: tuple[str, ...]
    start_model: str
    mode: ExecutionMode
    #: model -> the statuses its warmup reported (failed ones included), in warm order
    results: dict[str, list[BucketStatus]] = field(default_factory=dict)
    #: model -> seconds its load and warmup took
    seconds: dict[str, float] = field(default_factory=dict)
    current: str | None = None
    finished: threading.Event = field(default_factory=threading.Event)

    @property
    def order(self) -> tuple[str, ...]:
        return warm_order(self.models, self.start_model)

    def start(self) -> threading.Thread:
        thread = threading.Thread(target=self.run, name="warm-all", daemon=True)
        thread.start()
        return thread

    def run(self) -> None:
        """Warm each model in ``order`` (blocking). A failing model is recorded; the others still warm."""
        try:
            for model in self.order:
                self.current = model
                started = time.perf_counter()
                try:
                    self.results[model] = self.engine.warmup(model, self.mode)
                except Exception as error:  # noqa: BLE001 - recorded; /ready reports it
                    log.warning("--warm all: %s failed: %s", model, error)
                    self.results[model] = []
                self.seconds[model] = round(time.perf_counter() - started, 2)
                log.info("--warm all: %s warm in %s (%.1f s; %d of %d models)", model, self.mode.value,
                         self.seconds[model], len(self.results), len(self.order))
        finally:
            self.current = None
            self.finished.set()

    def failures(self) -> list[str]:
        """"model bucket: error" for every shape that failed, and every model that warmed nothing."""
        failed = []
        for model, statuses in self.results.items():
            if not statuses:
                failed.append(f"{model}: nothing warmed (see the log)")
            failed += [f"{model} {s.resolution}: {s.error}" for s in statuses if s.state is BucketState.FAILED]
        return failed

    def progress(self) -> str:
        """Where it is, for ``/ready``: "warming tiny-sd3 (model 1 of 2)"."""
        model = self.current or (self.order[len(self.results)] if len(self.results) < len(self.order) else None)
        if model is None:
            return f"warmed {len(self.results)} of {len(self.order)} models"
        return f"warming {model} (model {self.order.index(model) + 1} of {len(self.order)})"
