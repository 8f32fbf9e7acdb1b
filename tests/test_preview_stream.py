"""Preview scheduling and the on-device projection: which steps get a preview, and its pixels."""

import itertools

import numpy as np
import torch
from PIL import Image

from tpu_demo.core.buckets import Bucket
from tpu_demo.device import detect_device, start_host_copy
from tpu_demo.engine.preview_stream import PreviewStream
from tpu_demo.engine.previews import LatentPreviewer

BUCKET = Bucket(64, 64)


def stepped_clock(seconds_per_step: float):
    """A clock that advances ``seconds_per_step`` on each reading after the first (creation)."""
    ticks = itertools.count()
    return lambda: next(ticks) * seconds_per_step


def preview_steps(stream: PreviewStream, total: int, latents: torch.Tensor) -> list[int]:
    frames = [stream.step(step, total, latents) for step in range(1, total + 1)]
    stream.close()
    return [frame.step for frame in frames if frame is not None]


def test_previews_are_throttled_by_wall_time_and_skip_the_image_s_last_stretch():
    latents = torch.randn(1, 16, 8, 8)
    stream = PreviewStream(LatentPreviewer(), BUCKET, detect_device("cpu"), every=1, min_seconds=0.25,
                           clock=stepped_clock(0.1))
    steps = preview_steps(stream, 19, latents)
    # 0.1 s a step: every third step (0.3 s >= 0.25 s apart, counting from the image's start), but not
    # step 18, due by spacing, since the image is due within 0.25 s of it
    assert steps == [3, 6, 9, 12, 15]
    assert stream.started == len(steps) and stream.dropped == 0  # CPU: every copy has landed at once


def test_a_fast_image_gets_no_preview_and_a_slow_one_gets_one_per_interval():
    latents = torch.randn(1, 16, 8, 8)
    fast = PreviewStream(LatentPreviewer(), BUCKET, detect_device("cpu"), 1, 0.25, clock=stepped_clock(0.01))
    assert preview_steps(fast, 8, latents) == []  # done in 80 ms: the final image comes before a preview could be seen
    short = PreviewStream(LatentPreviewer(), BUCKET, detect_device("cpu"), 1, 0.25, clock=stepped_clock(0.05))
    assert preview_steps(short, 6, latents) == []  # 0.3 s: no preview in its first 0.25 s, and then the image is due
    slow = PreviewStream(LatentPreviewer(), BUCKET, detect_device("cpu"), 1, 0.25, clock=stepped_clock(1.0))
    assert preview_steps(slow, 5, latents) == [1, 2, 3, 4]  # 1 s a step: every step but the last


def test_every_n_steps_without_a_time_limit_never_previews_the_last_step():
    latents = torch.randn(1, 16, 8, 8)
    stream = PreviewStream(LatentPreviewer(), BUCKET, detect_device("cpu"), every=3, min_seconds=0.0,
                           clock=stepped_clock(0.001))
    assert preview_steps(stream, 10, latents) == [3, 6, 9]
    assert preview_steps(PreviewStream(LatentPreviewer(), BUCKET, detect_device("cpu"), 0, 0.0), 10, latents) == []


def test_projection_reproduces_the_fitted_linear_map_from_a_few_bytes():
    generator = torch.Generator().manual_seed(0)
    weights = torch.randn(17, 3, generator=generator) * 0.05  # mostly inside [0, 1]: little clipping
    weights[-1] = 0.5  # bias: mid grey
    previewer = LatentPreviewer(ridge=1e-6)
    for _ in range(3):  # final latents and the "decoded" image they map to, as the engine observes them
        latents = torch.randn(1, 16, 8, 8, generator=generator)
        grid = latents[0].permute(1, 2, 0).reshape(-1, 16)
        rgb = (grid @ weights[:-1] + weights[-1]).clamp(0, 1).reshape(8, 8, 3)
        image = Image.fromarray((rgb * 255).round().to(torch.uint8).numpy(), "RGB")
        previewer.observe(latents, image, BUCKET)
    latents = torch.randn(1, 16, 8, 8, generator=generator)
    expected = ((latents[0].permute(1, 2, 0) @ weights[:-1] + weights[-1]).clamp(0, 1) * 255).numpy()
    pixels = previewer.project(latents, BUCKET)
    assert pixels.dtype == torch.uint8 and tuple(pixels.shape) == (8, 8, 3)
    # clipped pixels constrain the fit less; the bulk must match to a few levels
    assert np.median(np.abs(pixels.numpy().astype(np.float32) - expected)) <= 3.0


def test_packed_latents_are_unpacked_to_their_grid_and_the_frame_is_the_projection_of_its_step():
    previewer = LatentPreviewer()
    packed = torch.randn(1, 16, 64)  # FLUX at 64x64: 4x4 tokens of 64 channels
    stream = PreviewStream(previewer, BUCKET, detect_device("cpu"), 1, 0.0)
    frame = stream.step(1, 4, packed)
    assert frame is not None and frame.step == 1
    assert np.array_equal(frame.pixels, previewer.project(packed, BUCKET).numpy())
    assert frame.render().size == (4, 4)


def test_host_copy_of_a_host_tensor_is_ready_at_once_and_shares_its_memory():
    tensor = torch.arange(12, dtype=torch.uint8).reshape(2, 2, 3)
    copy = start_host_copy(tensor, detect_device("cpu"))
    assert copy.ready() and copy.tensor is tensor and copy.wait() is tensor
