"""Images waiting for the device, and how each pipeline call is formed from them.

A call leaves at once with what waits: images of one shape (model, mode, bucket, steps, guidance, style
and its scale) at a warm batch size only, one image per request per round (round robin), never padded;
images that arrive while the device is busy join the next call. A request never compiles, never
starves another and never waits for a batch to fill. Its stream ends exactly once (``PendingRequest.finish``).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any, Callable, NamedTuple

from tpu_demo.core.buckets import BATCH_SIZES
from tpu_demo.core.request import GenerationRequest

#: the last event of every request's stream
END = object()


def batch_sizes(max_batch: int) -> tuple[int, ...]:
    """The static sizes up to ``max_batch`` (at least batch 1)."""
    return tuple(size for size in BATCH_SIZES if size <= max(1, max_batch)) or (1,)


class CallShape(NamedTuple):
    """What images must share to run in one pipeline call."""

    model: str
    mode: str
    resolution: str
    num_inference_steps: int
    guidance_scale: float
    #: (style, scale) the adapter slot must hold; ("", 0.0) for no style
    style: tuple[str, float] = ("", 0.0)


def call_shape(request: GenerationRequest) -> CallShape:
    return CallShape(request.model, request.mode.value, request.resolution, request.num_inference_steps,
                     request.guidance_scale, request.style_key)


@dataclass(eq=False)
class PendingRequest:
    """One request's images: how many were handed to the device and how many are done."""

    request: GenerationRequest
    emit_raw: Callable[[Any], None]
    stop: threading.Event
    shape: CallShape = field(init=False)
    next_index: int = 0
    in_flight: int = 0
    completed: int = 0
    finished: bool = False
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def __post_init__(self) -> None:
        self.shape = call_shape(self.request)

    @property
    def waiting_images(self) -> int:
        return 0 if self.finished or self.stop.is_set() else self.request.num_images - self.next_index

    def emit(self, event: Any) -> None:
        """Send ``event`` to the request's consumer unless its stream has ended."""
        with self._lock:
            if not self.finished:
                self.emit_raw(event)

    def finish(self, last: Any = None) -> bool:
        """End the stream (once) with ``last`` (Stopped, an exception, or None); False if it had ended."""
        with self._lock:
            if self.finished:
                return False
            self.finished = True
            if last is not None:
                self.emit_raw(last)
            self.emit_raw(END)
            return True


class Member(NamedTuple):
    """One image of a call: its request and its index there (seed = request.seed + index)."""

    pending: PendingRequest
    index: int


class ImageQueue:
    """The waiting images of every request, in round-robin order."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._line: list[PendingRequest] = []

    def add(self, pending: PendingRequest) -> None:
        with self._lock:
            self._line.append(pending)

    def remove(self, pending: PendingRequest) -> None:
        with self._lock:
            if pending in self._line:
                self._line.remove(pending)

    def waiting_requests(self) -> int:
        """Requests none of whose images has reached the device yet (the admission queue bound counts them)."""
        with self._lock:
            return sum(1 for p in self._line if not p.finished and p.next_index == 0)

    def take(self, max_size: int, usable: Callable[[CallShape, int], bool],
             stopped: Callable[[PendingRequest], None]) -> list[Member]:
        """Up to ``max_size`` waiting images of the oldest request's shape, round robin.

        ``usable(shape, size)`` says whether a batch size may run now (warm); ``stopped`` is called
        for every request found stopped before any of its images reached the device.
        """
        with self._lock:
            for pending in [p for p in self._line if not p.finished and p.stop.is_set() and p.in_flight == 0]:
                stopped(pending)
            self._line = [p for p in self._line if not p.finished and p.waiting_images > 0 or p.in_flight > 0]
            candidates = [p for p in self._line if p.waiting_images > 0]
            if not candidates:
                return []
            shape = candidates[0].shape
            same = [p for p in candidates if p.shape == shape]
            available = sum(p.waiting_images for p in same)
            size = max(s for s in BATCH_SIZES if s <= min(max_size, available) and (s == 1 or usable(shape, s)))
            members: list[Member] = []
            givers: list[PendingRequest] = []
            while len(members) < size:
                for pending in same:
                    if len(members) < size and pending.waiting_images > 0:
                        members.append(Member(pending, pending.next_index))
                        pending.next_index += 1
                        pending.in_flight += 1
                        if pending not in givers:
                            givers.append(pending)
            # round robin: whoever got an image goes to the back of the line
            self._line = [p for p in self._line if p not in givers] + givers
            return members
