"""Which models a process offers, and which one it starts on (``--models``, ``--model``, the weights present).

Imports no Gradio and loads no model: ``--check`` and the ``--chips`` launcher ask it before any engine starts.
"""

from __future__ import annotations

import logging

from tpu_demo.core.catalog import CATALOG, DEFAULT_MODEL_ID, REAL_MODEL_IDS, TINY_MODEL_IDS, Placement
from tpu_demo.launch.config import AppConfig
from tpu_demo.models.loading import hub_weights_present

log = logging.getLogger("tpu_demo")


def offered_models(config: AppConfig) -> tuple[str, ...]:
    """The operator's list, else the tiny models plus the real ones whose weights are present.

    A tensor-parallel run offers only models that can be sharded: a model the operator named that
    cannot be is refused (exit naming it), one found by default is left out with a log line.
    """
    models = config.models or TINY_MODEL_IDS + tuple(m for m in REAL_MODEL_IDS if hub_weights_present(CATALOG[m]))
    if config.model and config.model not in models:
        models = (config.model,) + models
    if config.tensor_parallel:
        unshardable = [m for m in models if Placement.TENSOR_PARALLEL not in CATALOG[m].placements]
        if unshardable and config.models:
            raise SystemExit(f"app.py: error: --models: {', '.join(unshardable)} cannot be served tensor-parallel "
                             "(no tensor-parallel plan); serve it from its own engine (docs/placements.md)")
        if unshardable:
            log.info("tensor parallel: not offering %s (no tensor-parallel plan)", ", ".join(unshardable))
        models = tuple(m for m in models if m not in unshardable)
    return models


def start_model(config: AppConfig, models: tuple[str, ...]) -> str:
    """``--model``, else the embedded default when offered, else the first offered model."""
    return config.model or (DEFAULT_MODEL_ID if DEFAULT_MODEL_ID in models else models[0])
