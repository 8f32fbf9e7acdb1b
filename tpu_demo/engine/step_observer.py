"""What runs inside the denoising loop: step reports, previews, Stop, and the decode guard."""

from __future__ import annotations

import threading
import time
from typing import Any, Callable

import torch

from tpu_demo.core.buckets import Bucket
from tpu_demo.core.events import StepProgress
from tpu_demo.engine.previews import LatentPreviewer


class StepObserver:
    """``callback_on_step_end``: reports steps and previews, keeps the final latents for the
    preview fit, and on stop sets the pipeline's interrupt flag (diffusers then skips the
    remaining steps)."""

    def __init__(self, emit: Callable[[Any], None], index: int, total: int, stop: threading.Event,
                 bucket: Bucket, previewer: LatentPreviewer, preview_every: int):
        self.emit, self.index, self.total, self.stop = emit, index, total, stop
        self.bucket, self.previewer, self.preview_every = bucket, previewer, preview_every
        self.started = time.perf_counter()
        self.last_step_at: float | None = None
        self.steps_done = 0
        self.interrupted = False
        self.final_latents: torch.Tensor | None = None

    @classmethod
    def silent(cls, total: int, bucket: Bucket, previewer: LatentPreviewer) -> "StepObserver":
        """An observer that reports nothing and is never stopped (warmup, follower ranks)."""
        return cls(lambda event: None, 0, total, threading.Event(), bucket, previewer, 0)

    def __call__(self, pipeline: Any, step: int, timestep: Any, callback_kwargs: dict) -> dict:
        self.steps_done = step + 1
        if self.stop.is_set():
            pipeline._interrupt = True
            self.interrupted = True
            return {}
        latents = callback_kwargs.get("latents")
        last = self.steps_done >= self.total
        if last and latents is not None and self.previewer.wants_observation():
            self.final_latents = latents.detach().to("cpu", copy=True)
        preview = None
        if self.preview_every and not last and self.steps_done % self.preview_every == 0 and latents is not None:
            preview = self.previewer.capture(latents, self.bucket)
        self.last_step_at = time.perf_counter()
        self.emit(StepProgress(self.index, self.steps_done, self.total, self.last_step_at - self.started, preview))
        return {}


class DecodeSkipped(Exception):
    """Raised by the VAE decoder guard when the image was stopped: no decode for aborted images."""


class DecodeGuard:
    """A forward pre-hook on the VAE decoder that refuses to decode while ``active`` is set.

    diffusers decodes after the last step even when the loop was interrupted; a stopped image
    is thrown away, so its decode is skipped. ``active`` is per thread: only the device thread
    sets it.
    """

    def __init__(self):
        self._state = threading.local()

    @property
    def active(self) -> bool:
        return getattr(self._state, "active", False)

    @active.setter
    def active(self, value: bool) -> None:
        self._state.active = value

    def __call__(self, module: Any, args: Any) -> None:
        if self.active:
            raise DecodeSkipped()


def apply_decode_guard(pipeline: Any, guard: DecodeGuard) -> None:
    """Install ``guard`` on the pipeline's VAE decoder (pipelines without a VAE decoder are left alone)."""
    decoder = getattr(getattr(pipeline, "vae", None), "decoder", None)
    if decoder is not None:
        decoder.register_forward_pre_hook(guard)
