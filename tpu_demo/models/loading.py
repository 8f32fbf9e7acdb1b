"""Load a catalog model through diffusers' ``from_pretrained``: safetensors only, no remote code.

Sources are only what the catalog names (never a path or repo from a request). Real models are
read from the local hub cache; when their weights are missing the error says, in one sentence,
which model and how to get it.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

from tpu_demo.core.catalog import ASSETS_DIR, ModelSpec
from tpu_demo.device import DeviceInfo
from tpu_demo.models.tiny_models import ensure_tiny_pipeline
from tpu_demo.models.weights import weights_report


class ModelUnavailable(RuntimeError):
    """The model's weights are not on this machine (or not readable)."""


def model_dtype(spec: ModelSpec, device: DeviceInfo) -> torch.dtype:
    return getattr(torch, spec.accelerator_dtype if device.kind != "cpu" else spec.cpu_dtype)


def resolve_source(spec: ModelSpec, models_dir: Path) -> str:
    """A local directory (built-in or committed assets) or the hub repo id."""
    kind, _, name = spec.source.partition(":")
    if kind == "builtin":
        return str(ensure_tiny_pipeline(name, Path(models_dir) / name))
    if kind == "assets":
        return str(ASSETS_DIR / name)
    return spec.source


def hub_weights_present(spec: ModelSpec) -> bool:
    """True when the hub cache holds every weight file of this model (``models/weights.py``; no network)."""
    return spec.hub_repo is None or weights_report(spec).complete


def unavailable_message(spec: ModelSpec, missing: list[str] | None = None) -> str:
    token = " It is gated: accept its license on huggingface.co and set HF_TOKEN first." if "gated" in spec.license_note else ""
    where = "are not in the Hugging Face cache"
    if missing and missing != ["model_index.json"]:
        more = f" and {len(missing) - 3} more" if len(missing) > 3 else ""
        where = f"are incomplete in the Hugging Face cache (missing {', '.join(missing[:3])}{more})"
    return (f"Model {spec.id} is not available on this machine: its weights ({spec.hub_repo}) {where}; "
            f"run `{spec.download_command}` on the host and restart.{token}")


def ensure_available(spec: ModelSpec) -> None:
    """Raise ModelUnavailable (one clear sentence) when a hub model's weights are not all local."""
    if spec.hub_repo is None:
        return
    report = weights_report(spec)
    if not report.complete:
        raise ModelUnavailable(unavailable_message(spec, report.missing))


def load_pipeline(spec: ModelSpec, device: DeviceInfo, models_dir: Path, **components: Any) -> Any:
    """``<PipelineClass>.from_pretrained(source, dtype=...)`` with safe options; CPU-resident."""
    import diffusers

    pipeline_class = getattr(diffusers, spec.pipeline_class)
    source = resolve_source(spec, models_dir)
    local = os.path.isdir(source)
    ensure_available(spec)
    try:
        pipeline = pipeline_class.from_pretrained(
            source, dtype=model_dtype(spec, device), use_safetensors=True,
            local_files_only=True, **components)
    except (OSError, EnvironmentError) as error:
        if local:
            raise ModelUnavailable(f"Model {spec.id} could not be read from its directory: {error}") from None
        raise ModelUnavailable(unavailable_message(spec)) from None
    pipeline.set_progress_bar_config(disable=True)
    return pipeline


def loading_text(spec: ModelSpec, models_dir: Path) -> str:
    """What the page says while ``spec`` loads: "loading Stable Diffusion 3.5 Medium, 16 GB ...".

    The size is the catalog's (bf16) for real models, else the weight files on disk (the tiny
    ones); a model whose size is unknown yet (not built) is named without one."""
    size_gb = spec.total_gb
    if not size_gb:
        kind, _, name = spec.source.partition(":")
        folder = ASSETS_DIR / name if kind == "assets" else Path(models_dir) / name
        size_gb = sum(f.stat().st_size for f in folder.rglob("*.safetensors")) / 1e9 if folder.is_dir() else 0.0
    if not size_gb:
        return f"loading {spec.title} ..."
    size = f"{size_gb:.0f} GB" if size_gb >= 1 else f"{size_gb * 1000:.0f} MB" if size_gb >= 0.001 else "<1 MB"
    return f"loading {spec.title}, {size} ..."


def parameter_bytes(pipeline: Any) -> int:
    """Bytes held by the pipeline's weights (what a loaded model costs in memory)."""
    total = 0
    for component in pipeline.components.values():
        if isinstance(component, torch.nn.Module):
            total += sum(t.numel() * t.element_size() for t in component.parameters())
            total += sum(t.numel() * t.element_size() for t in component.buffers())
    return total
