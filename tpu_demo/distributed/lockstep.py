"""Lockstep serving: rank 0 talks to users, every rank runs the same pipeline calls in the same order.

Rank 0 announces every model load and pipeline call (warmup and requests) before making it; followers
make the same Engine call, so collectives line up. Every rank stops at the same denoising step. A dead
follower, a timed-out collective or a stalled step fails the group: one clear error, then every later
request is refused at once.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

import torch
import torch.distributed as dist

from tpu_demo.core.catalog import ModelSpec
from tpu_demo.core.errors import EngineError
from tpu_demo.distributed.group import TensorParallelWorld, load_tensor_parallel_pipeline

log = logging.getLogger("tpu_demo.lockstep")

_WATCHDOG_PERIOD_SECONDS = 0.25


@dataclass(frozen=True)
class LoadModel:
    """Load (and shard) this model; unloading others to make room happens the same on every rank."""

    model_id: str


@dataclass(frozen=True)
class PipelineCall:
    """One pipeline call, exactly as rank 0 makes it."""

    model_id: str
    mode: str
    prompt: str
    width: int
    height: int
    num_inference_steps: int
    guidance_scale: float
    seed: int
    negative_prompt: str = ""

    @property
    def shape_key(self) -> tuple:
        return self.model_id, self.mode, self.width, self.height, self.guidance_scale > 1.0


@dataclass(frozen=True)
class UpsamplePrompt:
    """Rewrite this prompt with the model's text encoder, sampled from this seed (the same text on every rank)."""

    model_id: str
    prompt: str
    seed: int


@dataclass(frozen=True)
class Shutdown:
    """Rank 0 is stopping: followers leave their loop."""


class TensorParallelFailure(RuntimeError):
    """The tensor-parallel group can no longer serve; the message is safe to show to users."""


@dataclass
class _Flight:
    """The pipeline call in progress on rank 0: when it last made progress."""

    key: tuple
    last_progress: float
    slowest_interval: float = 0.0


class Lockstep:
    """Keeps every rank on the same pipeline calls; the rank-0 side also watches for failures."""

    def __init__(self, world: TensorParallelWorld):
        self.world = world
        self.timeout_seconds = world.timeout_seconds
        self._failure: str | None = None
        self._lock = threading.Lock()
        self._flight: _Flight | None = None
        #: slowest gap between progress points (start, steps, end) seen per shape, from finished calls
        self._expected_interval: dict[tuple, float] = {}
        if world.is_leader:
            threading.Thread(target=self._watch, name="lockstep-watchdog", daemon=True).start()

    # ---- shared by every rank ---------------------------------------------------------------
    @property
    def failure(self) -> str | None:
        """Why the group cannot serve any more (rank 0), else None."""
        return self._failure

    def load_pipeline(self, spec: ModelSpec, models_dir: Path) -> Any:
        return load_tensor_parallel_pipeline(spec, self.world, models_dir)

    def step_callback(self, observer: Callable | None) -> Callable:
        """A ``callback_on_step_end`` that runs ``observer`` then agrees on the stop flag with every rank."""

        def callback(pipeline: Any, step: int, timestep: Any, callback_kwargs: dict) -> dict:
            result = observer(pipeline, step, timestep, callback_kwargs) if observer is not None else {}
            stop = torch.tensor([1 if getattr(pipeline, "_interrupt", False) else 0], dtype=torch.int32)
            dist.all_reduce(stop, op=dist.ReduceOp.MAX, group=self.world.control_group)
            if stop.item():
                pipeline._interrupt = True  # every rank skips the same remaining steps
            self._progress()
            return result or {}

        return callback

    @contextlib.contextmanager
    def leading(self, message: LoadModel | PipelineCall | UpsamplePrompt,
                passthrough: tuple[type[BaseException], ...] = ()) -> Iterator[None]:
        """On rank 0: refuse if failed, broadcast ``message``, and turn any error into a group failure.

        On followers it does nothing: they are already executing ``message``.
        """
        if not self.world.is_leader:
            yield
            return
        self.raise_if_failed()
        try:
            self._broadcast(message)
            if isinstance(message, PipelineCall):
                with self._in_flight(message.shape_key):
                    yield
            else:
                yield
        except passthrough:
            raise
        except Exception as error:  # noqa: BLE001 - any error leaves the ranks out of step
            raise TensorParallelFailure(self.fail(_describe(error))) from error
        self.raise_if_failed()  # the watchdog fired while the call was finishing

    def raise_if_failed(self) -> None:
        if self._failure is not None:
            raise TensorParallelFailure(self._failure)

    def fail(self, reason: str) -> str:
        """Mark the group failed (first reason wins) and return the message users see."""
        with self._lock:
            if self._failure is None:
                self._failure = (f"Tensor-parallel serving stopped: {reason}. This app no longer accepts "
                                 "requests; restart it (scripts/serve_tp.sh).")
                log.error(self._failure)
        return self._failure

    # ---- rank 0 -----------------------------------------------------------------------------
    def shutdown_followers(self) -> None:
        """Tell followers to leave their loop (best effort: a failed group cannot be told anything)."""
        if self.world.is_leader and self._failure is None:
            with contextlib.suppress(Exception):
                self._broadcast(Shutdown())

    def _broadcast(self, message: Any) -> None:
        dist.broadcast_object_list([message], src=0, group=self.world.control_group)

    @contextlib.contextmanager
    def _in_flight(self, key: tuple) -> Iterator[None]:
        flight = _Flight(key, time.monotonic())
        with self._lock:
            self._flight = flight
        try:
            yield
        finally:
            with self._lock:
                self._flight = None
        self._progress(flight)
        with self._lock:
            self._expected_interval[key] = max(self._expected_interval.get(key, 0.0), flight.slowest_interval)

    def _progress(self, flight: _Flight | None = None) -> None:
        flight = flight or self._flight
        if flight is None:
            return
        now = time.monotonic()
        flight.slowest_interval = max(flight.slowest_interval, now - flight.last_progress)
        flight.last_progress = now

    def _watch(self) -> None:
        """Fail the group when a call makes no progress for the expected step time plus the timeout.

        A shape's first call (which may compile for minutes) has no expected time yet; it is
        bounded by the process group's own timeout.
        """
        while self._failure is None:
            time.sleep(_WATCHDOG_PERIOD_SECONDS)
            with self._lock:
                flight = self._flight
                expected = self._expected_interval.get(flight.key) if flight else None
            if flight is None or expected is None:
                continue
            silent = time.monotonic() - flight.last_progress
            if silent > expected + self.timeout_seconds:
                self.fail(f"no rank progress for {silent:.0f} s (expected step time {expected:.1f} s + "
                          f"timeout {self.timeout_seconds:g} s): a rank is stuck or gone")

    # ---- followers --------------------------------------------------------------------------
    def follow(self, engine: Any) -> int:
        """Follower loop: receive each message from rank 0 and make the same Engine call; 0 on Shutdown.

        Any error other than a model that cannot be loaded (which fails the same way on rank
        0) ends the loop: the ranks are out of step, and torchrun then stops the group.
        """
        while True:
            box: list[Any] = [None]
            dist.broadcast_object_list(box, src=0, group=self.world.control_group)
            message = box[0]
            if isinstance(message, Shutdown):
                log.info("rank %d: shutdown from rank 0", self.world.rank)
                return 0
            if isinstance(message, LoadModel):
                try:
                    engine.load(message.model_id)  # the same Engine path as rank 0
                except EngineError as error:
                    log.warning("rank %d: %s", self.world.rank, error)
            elif isinstance(message, PipelineCall):
                engine.submit(lambda call=message: engine.run_followed_call(call)).result()
            elif isinstance(message, UpsamplePrompt):
                engine.submit(lambda call=message: engine.run_followed_upsample(call)).result()
            else:
                raise TypeError(f"unknown lockstep message {message!r}")


def _describe(error: BaseException) -> str:
    text = str(error).strip().splitlines()[0][:200] if str(error).strip() else type(error).__name__
    return f"a rank failed or stopped answering ({type(error).__name__}: {text})"
