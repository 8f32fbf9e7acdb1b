"""What runs inside the denoising loop: step reports, previews, Stop, and the decode guard."""

from __future__ import annotations

import threading
import time
from typing import Any, Callable

import torch

from tpu_demo.core.buckets import Bucket
from tpu_demo.core.events import StepProgress
from tpu_demo.engine.preview_stream import PreviewStream


class StepObserver:
    """``callback_on_step_end``: reports steps and previews, keeps the final latents for the
    preview fit, and on stop sets the pipeline's interrupt flag (diffusers then skips the
    remaining steps).

    Nothing here waits for the device: the step time is the host's clock when the step was
    dispatched (what the ETA extrapolates; on TPU/CUDA the device may still be working), and
    previews come from ``PreviewStream``'s asynchronous copies.
    """

    def __init__(self, emit: Callable[[Any], None], index: int, total: int, stop: threading.Event,
                 bucket: Bucket, previews: PreviewStream):
        self.emit, self.index, self.total, self.stop = emit, index, total, stop
        self.bucket, self.previews = bucket, previews
        self.previewer = previews.previewer
        self.started = time.perf_counter()
        self.last_step_at: float | None = None
        self.steps_done = 0
        self.interrupted = False
        self.final_latents: torch.Tensor | None = None

    @classmethod
    def silent(cls, total: int, bucket: Bucket, previews: PreviewStream) -> "StepObserver":
        """An observer that reports nothing and is never stopped (warmup, follower ranks);
        ``previews`` should have ``every=0``."""
        return cls(lambda event: None, 0, total, threading.Event(), bucket, previews)

    def __call__(self, pipeline: Any, step: int, timestep: Any, callback_kwargs: dict) -> dict:
        self.steps_done = step + 1
        if self.stop.is_set():
            pipeline._interrupt = True
            self.interrupted = True
            self.previews.close()
            return {}
        latents = callback_kwargs.get("latents")
        last = self.steps_done >= self.total
        if last and latents is not None and self.previewer.wants_observation():
            # blocking copy, but only after the last step of a model's first few images (the preview
            # fit), and the decode that follows needs the same latents finished anyway
            self.final_latents = latents.detach().to("cpu", copy=True)
        preview = self.previews.step(self.steps_done, self.total, latents)
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
