"""Facts about this server for the page's "About this server" panel: nothing secret, no paths.

Versions come from the installed distributions, the device and compile backend from the
engine, the compile cache from its folder (named, never shown as a path).
"""

from __future__ import annotations

import importlib.metadata
from pathlib import Path
from typing import Any, Callable, Mapping

import torch

from tpu_demo.core.catalog import ModelSpec
from tpu_demo.device import DeviceInfo

_PACKAGES = ("torch-tpu", "diffusers", "transformers", "gradio")


def _version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def compile_cache_state(root: Path) -> dict[str, Any]:
    """Files and megabytes under the compile cache, per compiler (inductor, torch-tpu)."""
    tiers = {}
    for tier in ("inductor", "torch-tpu"):
        files = [path for path in (root / tier).rglob("*") if path.is_file()] if (root / tier).is_dir() else []
        tiers[tier] = {"files": len(files), "mb": round(sum(path.stat().st_size for path in files) / 1e6, 1)}
    return tiers


def server_facts(device: DeviceInfo, compile_backend: str, compile_cache: Path, specs: Mapping[str, ModelSpec],
                 placement_description: Callable[[str], str]) -> dict[str, Any]:
    """Device, versions, compile backend and cache, models offered and their placement."""
    return {
        "device": device.badge,
        "device_kind": device.kind,
        "chips": device.count if device.kind == "tpu" else 0,
        "versions": {"torch": torch.__version__, **{package: _version(package) for package in _PACKAGES}},
        "compile_backend": compile_backend,
        "compile_cache": compile_cache_state(compile_cache),
        "models": {model_id: {"title": spec.title, "placement": placement_description(model_id)}
                   for model_id, spec in specs.items()},
    }
