"""The engine's one way to call a pipeline, rewrite a prompt, or stream previews (device thread only).

Every call runs inside ``device.execution_mode`` and under ``torch.inference_mode``; a compiled call
compiles the loaded model's transformer once, counted by the engine's ``CompileCounter``. Under tensor
parallelism rank 0 announces each call (``distributed.lockstep``) so every rank makes it; a batched
call carries one prompt and seed, so tensor parallel runs batch 1.
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch

from tpu_demo.core.buckets import Bucket
from tpu_demo.core.errors import EngineError
from tpu_demo.core.modes import ExecutionMode
from tpu_demo.core.request import GenerationRequest
from tpu_demo.core.upsampling import DrawnPrompt
from tpu_demo.device import DeviceInfo, execution_mode, release_cached_memory, synchronize
from tpu_demo.distributed.lockstep import LoadModel, Lockstep, PipelineCall, UpsamplePrompt
from tpu_demo.engine.compile_counter import CompileCounter
from tpu_demo.engine.model_pool import LoadedModel
from tpu_demo.engine.preview_stream import PreviewStream
from tpu_demo.engine.step_observer import DecodeSkipped
from tpu_demo.models.placement import compile_for_placement


class PipelineCalls:
    """Pipeline calls, prompt rewrites and preview streams of one engine (device thread only)."""

    def __init__(self, device: DeviceInfo, counter: CompileCounter, lockstep: Lockstep | None,
                 preview_seconds: float):
        self.device, self.counter, self.lockstep = device, counter, lockstep
        self.preview_seconds = preview_seconds

    def call(self, loaded: LoadedModel, mode: ExecutionMode, prompts: list[str], bucket: Bucket, steps: int,
             guidance: float, seeds: list[int], observer: Any, negative_prompts: list[str] | None = None) -> Any:
        """One pipeline call of ``len(prompts)`` images, image i from its own generator seeded ``seeds[i]``."""
        if mode.traits.compiled and not loaded.compiled:
            compile_for_placement(loaded.pipeline, loaded.placement, self.counter, loaded.spec)
            loaded.compiled = True
        callback = observer if self.lockstep is None else self.lockstep.step_callback(observer)
        generators = [torch.Generator("cpu").manual_seed(seed) for seed in seeds]
        negatives = negative_prompts or [""] * len(prompts)
        # tensor parallel carries one prompt and seed per call (batch 1)
        message = PipelineCall(loaded.spec.id, mode.value, prompts[0], bucket.width, bucket.height, steps, guidance,
                               seeds[0], negatives[0])
        with self.in_lockstep(message), execution_mode(mode, self.device), torch.inference_mode(), \
                loaded.slot_bypass(mode):
            output = loaded.pipeline(
                height=bucket.height, width=bucket.width, num_inference_steps=steps,
                generator=generators if len(generators) > 1 else generators[0],
                callback_on_step_end=callback, callback_on_step_end_tensor_inputs=["latents"],
                **loaded.batch_call_inputs(prompts, guidance, negatives))
            synchronize(self.device)
        if observer.final_latents is not None and not observer.interrupted:
            loaded.previewer.observe(observer.final_latents[:1], output.images[0], bucket)
        return output

    def draw_prompt(self, loaded: LoadedModel, request: GenerationRequest, seed: int) -> DrawnPrompt | None:
        """The prompt image ``seed`` of ``request`` is drawn from, when its upsampler rewrites it (else None)."""
        if not request.upsample_prompt or loaded.upsampler is None:
            return None
        lockstep = self.in_lockstep(UpsamplePrompt(loaded.spec.id, request.prompt, seed))
        with lockstep if loaded.upsampler.uses_text_encoder else contextlib.nullcontext():
            return loaded.upsampler.rewrite(request.prompt, seed)

    def previews(self, loaded: LoadedModel, bucket: Bucket, every: int) -> PreviewStream:
        return PreviewStream(loaded.previewer, bucket, self.device, every, self.preview_seconds)

    def in_lockstep(self, message: LoadModel | PipelineCall | UpsamplePrompt) -> Any:
        """Tensor parallel: rank 0 announces ``message`` so every rank makes the same call."""
        if self.lockstep is None:
            return contextlib.nullcontext()
        return self.lockstep.leading(message, passthrough=(DecodeSkipped, EngineError))

    def release_after_failure(self) -> None:
        """After a failed call: the next one starts from the loaded weights' memory, not the failed peak."""
        release_cached_memory(self.device)
