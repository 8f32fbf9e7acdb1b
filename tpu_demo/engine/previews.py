"""Cheap step previews: a linear latent -> RGB projection, fitted per model from its own outputs.

The map is fitted (ridge regression) on the final latents and decoded images a model makes anyway, never
hard-coded per architecture; warmup gives the first pairs, so the first request's previews look right.
It runs on the device, so only the preview's bytes reach the host. Packed latents (FLUX) are unpacked to
their grid first. A preview never changes the final pixels.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from PIL import Image

from tpu_demo.core.buckets import Bucket

#: enough pairs for a stable fit; later images add no cost
_MAX_OBSERVATIONS = 16


def latent_grid(latents: torch.Tensor, bucket: Bucket) -> torch.Tensor:
    """The first sample's latents as an (h, w, channels) float32 grid on the latents' own device
    (a view where possible), unpacking token sequences."""
    sample = latents[0].detach().to(torch.float32)
    if sample.ndim == 2:  # packed: (tokens, channels) in row-major order over the patch grid
        tokens = sample.shape[0]
        height = max(1, round(math.sqrt(tokens * bucket.height / bucket.width)))
        width = tokens // height
        return sample[: height * width].reshape(height, width, -1)
    return sample.permute(1, 2, 0)  # spatial: (channels, h, w)


class LatentPreviewer:
    """Projects latents to preview pixels for one loaded model and learns the projection from final images."""

    def __init__(self, ridge: float = 1e-2):
        self.ridge = ridge
        self.observations = 0
        self._gram: torch.Tensor | None = None
        self._cross: torch.Tensor | None = None
        self._weights: torch.Tensor | None = None
        #: the weights as last moved to a device: refitting replaces them
        self._placed: dict[torch.device, torch.Tensor] = {}

    @property
    def fitted(self) -> bool:
        return self._weights is not None

    def wants_observation(self) -> bool:
        return self.observations < _MAX_OBSERVATIONS

    def observe(self, final_latents: torch.Tensor, image: Image.Image, bucket: Bucket) -> None:
        """Add (latents, decoded image) pixels to the fit and re-solve the projection."""
        grid = latent_grid(final_latents, bucket).cpu()
        height, width, channels = grid.shape
        target = np.asarray(image.convert("RGB").resize((width, height), Image.Resampling.BOX), dtype=np.float32)
        features = torch.cat([grid.reshape(-1, channels), torch.ones(height * width, 1)], dim=1)
        targets = torch.from_numpy(target.reshape(-1, 3) / 255.0)
        if self._gram is None or self._gram.shape[0] != channels + 1:
            self._gram = torch.zeros(channels + 1, channels + 1)
            self._cross = torch.zeros(channels + 1, 3)
        self._gram += features.T @ features
        self._cross += features.T @ targets
        self.observations += 1
        regulariser = self.ridge * torch.eye(channels + 1)
        self._weights = torch.linalg.solve(self._gram + regulariser, self._cross)
        self._placed = {}

    def project(self, latents: torch.Tensor, bucket: Bucket) -> torch.Tensor:
        """This step's preview pixels, (h, w, 3) uint8 at the latent grid's resolution, computed where
        the latents are: only these few bytes (12 KB for a 1024x1024 FLUX image) leave the device."""
        grid = latent_grid(latents, bucket)
        height, width, channels = grid.shape
        weights = self._weights_on(grid.device, channels)
        if weights is not None:
            rgb = grid.reshape(-1, channels) @ weights[:-1] + weights[-1]
        else:  # not fitted yet: the first three channels, normalised
            rgb = grid[..., :3].reshape(-1, 3)
            rgb = (rgb - rgb.min()) / (rgb.max() - rgb.min() + 1e-6)
        return (rgb.clamp(0.0, 1.0) * 255).to(torch.uint8).reshape(height, width, 3)

    def _weights_on(self, device: torch.device, channels: int) -> torch.Tensor | None:
        weights = self._weights
        if weights is None or weights.shape[0] != channels + 1:
            return None
        if device not in self._placed:  # once per fit: a host -> device copy of (channels + 1) x 3 floats
            self._placed = {device: weights.to(device)}
        return self._placed[device]


class PreviewFrame:
    """One step's preview pixels, already in host memory; ``render()`` makes the image where it is shown."""

    def __init__(self, pixels: np.ndarray, step: int):
        self.pixels, self.step = pixels, step

    def render(self) -> Image.Image:
        return Image.fromarray(self.pixels, "RGB")
