"""Which denoising steps get a live preview, and the preview copies in flight.

A preview never makes the device wait: it is projected on the device, its host copy is started without
waiting and picked up at a later step, and at most one copy is in flight. Previews come at most once per
``min_seconds`` (and every ``every`` steps); none is made for an image due within ``min_seconds``,
estimated from the host's step times without a device sync.
"""

from __future__ import annotations

import time
from typing import Callable

import numpy as np
import torch

from tpu_demo.core.buckets import Bucket
from tpu_demo.device import DeviceInfo, HostCopy, start_host_copy
from tpu_demo.engine.previews import LatentPreviewer, PreviewFrame


class PreviewStream:
    """One image's previews: asked once per step, returns a frame when one is ready."""

    def __init__(self, previewer: LatentPreviewer, bucket: Bucket, device: DeviceInfo, every: int,
                 min_seconds: float, clock: Callable[[], float] = time.monotonic):
        self.previewer, self.bucket, self.device = previewer, bucket, device
        self.every, self.min_seconds, self.clock = every, min_seconds, clock
        self._in_flight: tuple[int, HostCopy] | None = None
        self._created = clock()
        self._last_started = self._created  # the first preview comes min_seconds into the image
        self._first_step_at: float | None = None
        self.started = 0
        self.dropped = 0

    def step(self, step: int, total: int, latents: torch.Tensor | None) -> PreviewFrame | None:
        """After denoising step ``step`` (1-based) of ``total``: a frame whose copy has landed, if any."""
        if not self.every:
            return None
        if step >= total:  # the final image follows: a preview now would only delay it
            self.close()
            return None
        now = self.clock()
        if self._first_step_at is None:
            self._first_step_at = now
        frame = self._collect()
        if self._in_flight is None and latents is not None and self._due(step, total, now):
            self._start(step, latents)
            frame = frame or self._collect()  # CPU: the "copy" is already there
        return frame

    def close(self) -> None:
        """The image is finished or stopped: a copy still in flight is dropped, never waited for."""
        if self._in_flight is not None:
            self.dropped += 1
            self._in_flight = None

    def _due(self, step: int, total: int, now: float) -> bool:
        if step % self.every:
            return False
        if now - self._last_started < self.min_seconds:
            return False
        return self._seconds_left(step, total, now) >= self.min_seconds

    def _seconds_left(self, step: int, total: int, now: float) -> float:
        """The image's remaining denoising time at the host's pace so far (step 1: from the call's start)."""
        if step <= 1:
            per_step = now - self._created
        else:
            per_step = (now - self._first_step_at) / (step - 1)
        return per_step * (total - step)

    def _start(self, step: int, latents: torch.Tensor) -> None:
        self._last_started = self.clock()
        self._in_flight = (step, start_host_copy(self.previewer.project(latents, self.bucket), self.device))
        self.started += 1

    def _collect(self) -> PreviewFrame | None:
        if self._in_flight is None or not self._in_flight[1].ready():
            return None
        step, copy = self._in_flight
        self._in_flight = None
        return PreviewFrame(np.array(copy.tensor.numpy(), copy=True), step)
