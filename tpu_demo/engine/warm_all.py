"""``--warm all``: every offered model in every offered mode, warmed before the first visitor.

Every bucket at every batch size, in each mode the page offers, goes into the persistent compile cache.
One model's weights are held at a time; the start model and the start mode come last, so they stay
loaded. An evicted model's buckets read cold again: ``summary()`` says what was warmed, ``/health``
what is loaded now.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Protocol

from tpu_demo.core.events import BucketState, BucketStatus, ShapeKey
from tpu_demo.core.modes import ExecutionMode

log = logging.getLogger("tpu_demo.engine")


def warm_order(models: tuple[str, ...], start: str) -> tuple[str, ...]:
    """Every offered model once, the start model last (so it is the one left loaded)."""
    return tuple(model for model in models if model != start) + ((start,) if start in models else ())


def mode_order(modes: tuple[ExecutionMode, ...], start: ExecutionMode) -> tuple[ExecutionMode, ...]:
    """Every offered mode once, the start mode last."""
    return tuple(mode for mode in modes if mode is not start) + ((start,) if start in modes else ())


class Warmable(Protocol):
    """What ``WarmAll`` uses of the engine."""

    def configured_shapes(self, model_id: str, mode: ExecutionMode) -> list[ShapeKey]: ...

    def warmup(self, model_id: str, mode: ExecutionMode) -> list[BucketStatus]: ...


@dataclass
class WarmAll:
    """Warms ``models`` in every one of ``modes`` in a background thread; readable from any thread."""

    engine: Warmable
    models: tuple[str, ...]
    start_model: str
    #: the start mode (warmed last, so the page's first request finds it warm)
    mode: ExecutionMode
    modes: tuple[ExecutionMode, ...] = tuple(ExecutionMode)
    #: model -> the statuses its warmup reported in every mode (failed ones included), in warm order
    results: dict[str, list[BucketStatus]] = field(default_factory=dict)
    #: model -> seconds its load and warmup took, all modes
    seconds: dict[str, float] = field(default_factory=dict)
    current: str | None = None
    current_mode: ExecutionMode | None = None
    finished: threading.Event = field(default_factory=threading.Event)

    @property
    def order(self) -> tuple[str, ...]:
        return warm_order(self.models, self.start_model)

    @property
    def mode_order(self) -> tuple[ExecutionMode, ...]:
        return mode_order(self.modes, self.mode)

    def describe(self) -> str:
        """Exactly what it warms, for the start-up log."""
        shapes = sum(len(self.engine.configured_shapes(model, mode)) for model in self.order for mode in self.mode_order)
        return (f"--warm all: {', '.join(self.order)} (one at a time, {self.start_model} last), each in "
                f"{', '.join(m.value for m in self.mode_order)}: {shapes} shapes (every bucket x batch size)")

    def start(self) -> threading.Thread:
        log.info("%s", self.describe())
        thread = threading.Thread(target=self.run, name="warm-all", daemon=True)
        thread.start()
        return thread

    def run(self) -> None:
        """Warm each model in ``order``, each mode in ``mode_order`` (blocking). A failing model is recorded;
        the others still warm."""
        try:
            for model in self.order:
                self.current = model
                started = time.perf_counter()
                statuses: list[BucketStatus] = []
                for mode in self.mode_order:
                    self.current_mode = mode
                    mode_started = time.perf_counter()
                    try:
                        statuses += self.engine.warmup(model, mode)
                    except Exception as error:  # noqa: BLE001 - recorded; /ready reports it
                        log.warning("--warm all: %s in %s failed: %s", model, mode.value, error)
                    log.info("--warm all: %s warm in %s (%.1f s; model %d of %d)", model, mode.value,
                             time.perf_counter() - mode_started, self.order.index(model) + 1, len(self.order))
                self.results[model] = statuses
                self.seconds[model] = round(time.perf_counter() - started, 2)
        finally:
            self.current = self.current_mode = None
            self.finished.set()

    def failures(self) -> list[str]:
        """"model bucket: error" for every shape that failed, and every model that warmed nothing."""
        failed = []
        for model, statuses in self.results.items():
            if not statuses:
                failed.append(f"{model}: nothing warmed (see the log)")
            failed += [f"{model} {s.mode} {s.resolution}: {s.error}" for s in statuses if s.state is BucketState.FAILED]
        return failed

    def progress(self) -> str:
        """Where it is, for ``/ready``: "warming tiny-sd3 (model 1 of 2, compiled: mode 3 of 3)"."""
        model = self.current or (self.order[len(self.results)] if len(self.results) < len(self.order) else None)
        if model is None:
            return f"warmed {len(self.results)} of {len(self.order)} models"
        mode = self.current_mode or self.mode_order[0]
        return (f"warming {model} (model {self.order.index(model) + 1} of {len(self.order)}, {mode.value}: "
                f"mode {self.mode_order.index(mode) + 1} of {len(self.mode_order)})")

    def summary(self) -> dict[str, dict[str, dict[str, object]]]:
        """What was warmed (not what is loaded now): model -> mode -> shapes warm, compile seconds, and
        whether every compile of the mode was a compile-cache hit (None: no counter says)."""
        out: dict[str, dict[str, dict[str, object]]] = {}
        for model, statuses in self.results.items():
            for mode in self.mode_order:
                mine = [s for s in statuses if s.mode == mode.value]
                hits = [s.from_cache for s in mine if s.from_cache is not None]
                out.setdefault(model, {})[mode.value] = {
                    "shapes": len(mine), "warm": sum(1 for s in mine if s.state is BucketState.WARM),
                    "compile_seconds": round(sum(s.compile_seconds or 0.0 for s in mine), 2),
                    "graphs": sum(s.compiles or 0 for s in mine),
                    "from_cache": all(hits) if hits else None}
        return out
